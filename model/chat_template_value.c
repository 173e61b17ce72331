/* Values of the chat-template evaluator (chat_template_internal.h): constructors, Python's
 * truthiness, equality, str() and json.dumps over json-c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat_template_internal.h"

bool ct_buf_add(ct_buf *b, const char *s, size_t n)
{
    if (b->over) return false;
    if (n > CT_MAX_OUTPUT - b->n) {
        b->over = true;
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->over = true;
            return false;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

cv cv_undef(void) { return (cv){.k = CV_UNDEF}; }
cv cv_none(void) { return (cv){.k = CV_NONE}; }
cv cv_bool(bool b) { return (cv){.k = CV_BOOL, .u.b = b}; }
cv cv_int(int64_t i) { return (cv){.k = CV_INT, .u.i = i}; }
cv cv_float(double d) { return (cv){.k = CV_FLOAT, .u.d = d}; }

cv cv_str(const char *s, size_t n)
{
    json_object *j = json_object_new_string_len(s, (int)n);
    if (!j) return cv_none();
    return (cv){.k = CV_STR, .u.j = j};
}

cv cv_from_json(json_object *j)
{
    switch (json_object_get_type(j)) {
    case json_type_null: return cv_none();
    case json_type_boolean: return cv_bool(json_object_get_boolean(j));
    case json_type_int: return cv_int(json_object_get_int64(j));
    case json_type_double: return cv_float(json_object_get_double(j));
    case json_type_string: return (cv){.k = CV_STR, .u.j = json_object_get(j)};
    case json_type_array: return (cv){.k = CV_LIST, .u.j = json_object_get(j)};
    case json_type_object: return (cv){.k = CV_DICT, .u.j = json_object_get(j)};
    }
    return cv_none();
}

json_object *cv_to_json(const cv *v)
{
    switch (v->k) {
    case CV_BOOL: return json_object_new_boolean(v->u.b);
    case CV_INT: return json_object_new_int64(v->u.i);
    case CV_FLOAT: return json_object_new_double(v->u.d);
    case CV_STR: case CV_LIST: case CV_DICT: case CV_NS: return json_object_get(v->u.j);
    default: return NULL;
    }
}

cv cv_dup(const cv *v)
{
    cv r = *v;
    if (v->k == CV_STR || v->k == CV_LIST || v->k == CV_DICT || v->k == CV_NS)
        json_object_get(v->u.j);
    return r;
}

void cv_drop(cv *v)
{
    if (v->k == CV_STR || v->k == CV_LIST || v->k == CV_DICT || v->k == CV_NS)
        json_object_put(v->u.j);
    v->k = CV_UNDEF;
}

bool cv_truthy(const cv *v)
{
    switch (v->k) {
    case CV_UNDEF: case CV_NONE: return false;
    case CV_BOOL: return v->u.b;
    case CV_INT: return v->u.i != 0;
    case CV_FLOAT: return v->u.d != 0;
    case CV_STR: return json_object_get_string_len(v->u.j) > 0;
    case CV_LIST: return json_object_array_length(v->u.j) > 0;
    case CV_DICT: return json_object_object_length(v->u.j) > 0;
    default: return true;
    }
}

const char *cv_kind_name(cv_kind k)
{
    static const char *const names[] = {"undefined", "none", "bool", "int", "float",
                                        "string", "list", "dict", "namespace", "macro"};
    return names[k];
}

size_t ct_space_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (!n) return 0;
    if (u[0] < 0x80) return (u[0] == ' ' || (u[0] >= 0x09 && u[0] <= 0x0D) ||
                             (u[0] >= 0x1C && u[0] <= 0x1F)) ? 1 : 0;
    if (n >= 2 && u[0] == 0xC2 && (u[1] == 0x85 || u[1] == 0xA0)) return 2;
    if (n >= 3 && u[0] == 0xE1 && u[1] == 0x9A && u[2] == 0x80) return 3;  /* U+1680 */
    if (n >= 3 && u[0] == 0xE2 && u[1] == 0x80 &&
        (u[2] <= 0x8A || u[2] == 0xA8 || u[2] == 0xA9 || u[2] == 0xAF)) return 3;
    if (n >= 3 && u[0] == 0xE2 && u[1] == 0x81 && u[2] == 0x9F) return 3;  /* U+205F */
    if (n >= 3 && u[0] == 0xE3 && u[1] == 0x80 && u[2] == 0x80) return 3;  /* U+3000 */
    return 0;
}

size_t ct_utf8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t ct_utf8_offset(const char *s, size_t n, size_t cp)
{
    size_t i = 0;
    while (i < n && cp) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        cp--;
    }
    return i;
}

/* Python's repr(float): the shortest text that reads back the same. */
static void float_repr(double d, char *o, size_t n)
{
    if (isnan(d)) {
        snprintf(o, n, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(o, n, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
    /* tmp: [-]D[.DDD]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t k = 0;
    if (neg) o[k++] = '-';
    if (exp < -4 || exp >= 16) {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            for (size_t i = 1; i < nd; i++) o[k++] = digits[i];
        }
        snprintf(o + k, n - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        o[k++] = '0';
        o[k++] = '.';
        for (int i = 0; i < -exp - 1; i++) o[k++] = '0';
        for (size_t i = 0; i < nd; i++) o[k++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) o[k++] = (size_t)i < nd ? digits[i] : '0';
        o[k++] = '.';
        if ((size_t)exp + 1 < nd)
            for (size_t i = (size_t)exp + 1; i < nd; i++) o[k++] = digits[i];
        else
            o[k++] = '0';
    }
    o[k] = 0;
}

/* Python's repr(str). */
static bool str_repr(ct_buf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    bool ok = ct_buf_add(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == (unsigned char)q || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            ok = ok && ct_buf_add(b, e, 2);
        } else if (c == '\n') {
            ok = ok && ct_buf_add(b, "\\n", 2);
        } else if (c == '\r') {
            ok = ok && ct_buf_add(b, "\\r", 2);
        } else if (c == '\t') {
            ok = ok && ct_buf_add(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(e, sizeof e, "\\x%02x", c);
            ok = ok && ct_buf_add(b, e, 4);
        } else {
            ok = ok && ct_buf_add(b, s + i, 1);
        }
    }
    return ok && ct_buf_add(b, &q, 1);
}

static bool repr(ct_buf *b, const cv *v, int depth);

static bool json_repr(ct_buf *b, json_object *j, int depth)
{
    cv v = cv_from_json(j);
    bool ok = repr(b, &v, depth);
    cv_drop(&v);
    return ok;
}

/* Python's repr(v), as str() of a container prints its items. */
static bool repr(ct_buf *b, const cv *v, int depth)
{
    if (depth > CT_MAX_NEST) return b->over = true, false;
    switch (v->k) {
    case CV_STR: return str_repr(b, json_object_get_string(v->u.j),
                                 (size_t)json_object_get_string_len(v->u.j));
    case CV_LIST: {
        bool ok = ct_buf_add(b, "[", 1);
        size_t n = json_object_array_length(v->u.j);
        for (size_t i = 0; i < n && ok; i++) {
            if (i) ok = ct_buf_add(b, ", ", 2);
            ok = ok && json_repr(b, json_object_array_get_idx(v->u.j, i), depth + 1);
        }
        return ok && ct_buf_add(b, "]", 1);
    }
    case CV_DICT: case CV_NS: {
        bool ok = ct_buf_adds(b, v->k == CV_NS ? "<Namespace {" : "{");
        bool first = true;
        json_object_object_foreach(v->u.j, key, val) {
            if (!first) ok = ok && ct_buf_add(b, ", ", 2);
            first = false;
            ok = ok && str_repr(b, key, strlen(key)) && ct_buf_add(b, ": ", 2) &&
                 json_repr(b, val, depth + 1);
        }
        return ok && ct_buf_adds(b, v->k == CV_NS ? "}>" : "}");
    }
    default: return cv_append_str(b, v);
    }
}

bool cv_append_str(ct_buf *b, const cv *v)
{
    char tmp[48];
    switch (v->k) {
    case CV_UNDEF: return true;
    case CV_NONE: return ct_buf_add(b, "None", 4);
    case CV_BOOL: return v->u.b ? ct_buf_add(b, "True", 4) : ct_buf_add(b, "False", 5);
    case CV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
        return ct_buf_adds(b, tmp);
    case CV_FLOAT:
        float_repr(v->u.d, tmp, sizeof tmp);
        return ct_buf_adds(b, tmp);
    case CV_STR:
        return ct_buf_add(b, json_object_get_string(v->u.j),
                          (size_t)json_object_get_string_len(v->u.j));
    case CV_MACRO: return ct_buf_adds(b, "<Macro>");
    default: return repr(b, v, 0);
    }
}

/* json.dumps of a string with ensure_ascii=False. */
static bool json_str(ct_buf *b, const char *s, size_t n)
{
    bool ok = ct_buf_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char tmp[8];
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            e = tmp;
        }
        if (!e) continue;
        ok = ok && ct_buf_add(b, s + run, i - run) && ct_buf_adds(b, e);
        run = i + 1;
    }
    ok = ok && ct_buf_add(b, s + run, n - run);
    return ok && ct_buf_add(b, "\"", 1);
}

static bool json_dump(ct_buf *b, json_object *j, int indent, bool sort_keys, int level);

static bool newline_indent(ct_buf *b, int indent, int level)
{
    bool ok = ct_buf_add(b, "\n", 1);
    for (int i = 0; i < indent * level && ok; i++) ok = ct_buf_add(b, " ", 1);
    return ok;
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool json_dump(ct_buf *b, json_object *j, int indent, bool sort_keys, int level)
{
    if (level > CT_MAX_NEST) return b->over = true, false;
    const char *item_sep = indent >= 0 ? "," : ", ";
    switch (json_object_get_type(j)) {
    case json_type_null: return ct_buf_add(b, "null", 4);
    case json_type_boolean:
        return json_object_get_boolean(j) ? ct_buf_add(b, "true", 4) : ct_buf_add(b, "false", 5);
    case json_type_int: case json_type_double: {
        char tmp[48];
        if (json_object_get_type(j) == json_type_int) {
            snprintf(tmp, sizeof tmp, "%lld", (long long)json_object_get_int64(j));
        } else {
            double d = json_object_get_double(j);
            if (isnan(d)) snprintf(tmp, sizeof tmp, "NaN");
            else if (isinf(d)) snprintf(tmp, sizeof tmp, d < 0 ? "-Infinity" : "Infinity");
            else float_repr(d, tmp, sizeof tmp);
        }
        return ct_buf_adds(b, tmp);
    }
    case json_type_string:
        return json_str(b, json_object_get_string(j), (size_t)json_object_get_string_len(j));
    case json_type_array: {
        size_t n = json_object_array_length(j);
        if (!n) return ct_buf_add(b, "[]", 2);
        bool ok = ct_buf_add(b, "[", 1);
        for (size_t i = 0; i < n && ok; i++) {
            if (i) ok = ct_buf_adds(b, item_sep);
            if (indent >= 0) ok = ok && newline_indent(b, indent, level + 1);
            ok = ok && json_dump(b, json_object_array_get_idx(j, i), indent, sort_keys,
                                 level + 1);
        }
        if (indent >= 0) ok = ok && newline_indent(b, indent, level);
        return ok && ct_buf_add(b, "]", 1);
    }
    case json_type_object: {
        size_t n = (size_t)json_object_object_length(j);
        if (!n) return ct_buf_add(b, "{}", 2);
        const char **keys = malloc(n * sizeof *keys);
        if (!keys) return b->over = true, false;
        size_t k = 0;
        json_object_object_foreach(j, key, val) {
            (void)val;
            keys[k++] = key;
        }
        if (sort_keys) qsort(keys, n, sizeof *keys, key_cmp);
        bool ok = ct_buf_add(b, "{", 1);
        for (size_t i = 0; i < n && ok; i++) {
            if (i) ok = ct_buf_adds(b, item_sep);
            if (indent >= 0) ok = ok && newline_indent(b, indent, level + 1);
            ok = ok && json_str(b, keys[i], strlen(keys[i])) && ct_buf_add(b, ": ", 2) &&
                 json_dump(b, json_object_object_get(j, keys[i]), indent, sort_keys,
                           level + 1);
        }
        free(keys);
        if (indent >= 0) ok = ok && newline_indent(b, indent, level);
        return ok && ct_buf_add(b, "}", 1);
    }
    }
    return false;
}

bool cv_append_json(ct_buf *b, const cv *v, int indent, bool sort_keys)
{
    if (v->k == CV_UNDEF || v->k == CV_MACRO) return false;
    json_object *j = cv_to_json(v);
    bool ok = json_dump(b, j, indent, sort_keys, 0);
    json_object_put(j);
    return ok;
}

static bool json_equal(json_object *a, json_object *b);

bool cv_equal(const cv *a, const cv *b)
{
    bool an = a->k == CV_INT || a->k == CV_FLOAT || a->k == CV_BOOL;
    bool bn = b->k == CV_INT || b->k == CV_FLOAT || b->k == CV_BOOL;
    if (an && bn) {
        if (a->k != CV_FLOAT && b->k != CV_FLOAT) {
            int64_t x = a->k == CV_BOOL ? a->u.b : a->u.i, y = b->k == CV_BOOL ? b->u.b : b->u.i;
            return x == y;
        }
        double x = a->k == CV_FLOAT ? a->u.d : a->k == CV_BOOL ? a->u.b : (double)a->u.i;
        double y = b->k == CV_FLOAT ? b->u.d : b->k == CV_BOOL ? b->u.b : (double)b->u.i;
        return x == y;
    }
    if (a->k != b->k) return false;
    switch (a->k) {
    case CV_UNDEF: case CV_NONE: return true;
    case CV_STR: case CV_LIST: case CV_DICT: return json_equal(a->u.j, b->u.j);
    case CV_NS: return a->u.j == b->u.j;
    case CV_MACRO: return a->u.m == b->u.m;
    default: return false;
    }
}

static bool json_equal(json_object *a, json_object *b)
{
    cv x = cv_from_json(a), y = cv_from_json(b);
    bool r;
    if (x.k != y.k || (x.k != CV_STR && x.k != CV_LIST && x.k != CV_DICT)) {
        r = cv_equal(&x, &y);
    } else if (x.k == CV_STR) {
        size_t n = (size_t)json_object_get_string_len(a);
        r = n == (size_t)json_object_get_string_len(b) &&
            memcmp(json_object_get_string(a), json_object_get_string(b), n) == 0;
    } else if (x.k == CV_LIST) {
        size_t n = json_object_array_length(a);
        r = n == json_object_array_length(b);
        for (size_t i = 0; i < n && r; i++)
            r = json_equal(json_object_array_get_idx(a, i), json_object_array_get_idx(b, i));
    } else {
        r = json_object_object_length(a) == json_object_object_length(b);
        json_object_object_foreach(a, key, val) {
            json_object *o;
            if (!r) break;
            r = json_object_object_get_ex(b, key, &o) && json_equal(val, o);
        }
    }
    cv_drop(&x);
    cv_drop(&y);
    return r;
}
