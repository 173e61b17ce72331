/* The chat-template evaluator (chat_template.h): walks the AST with Python's semantics for
 * the values (chat_template_value.c) and jinja2's for scopes: a for loop and a macro call
 * open a frame; `set` binds in the innermost frame; a macro sees the template's top frame. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat_template_internal.h"

typedef struct var {
    const char *name; /* the template's arena */
    cv val;           /* owned */
} var;

typedef struct frame {
    struct frame *parent;
    var *v;           /* owned, [n] */
    size_t n, cap;
} frame;

enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

typedef struct ctx {
    json_object *vars; /* borrowed: the render's variables */
    frame *top;        /* the template's frame */
    frame *cur;
    ct_buf *out;
    char *err;
    size_t errlen;
    bool failed;
    int flow;
    int call_depth;
    long iterations;
    size_t string_bytes; /* bytes of every string made so far (CT_MAX_STRING_BYTES) */
} ctx;

static int fail(ctx *C, const ct_node *at, const char *fmt, ...)
{
    if (C->failed) return -1;
    C->failed = true;
    int k = at ? snprintf(C->err, C->errlen, "line %d:%d: ", at->line, at->col) : 0;
    if (k < 0) k = 0;
    if ((size_t)k < C->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(C->err + k, C->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int fail_nomem(ctx *C, const ct_node *at)
{
    return fail(C, at, "out of memory or output past %zu bytes", CT_MAX_OUTPUT);
}

/* ---- frames ---- */

static void frame_clear(frame *f)
{
    for (size_t i = 0; i < f->n; i++) cv_drop(&f->v[i].val);
    free(f->v);
    f->v = NULL;
    f->n = f->cap = 0;
}

/* Binds name in f, taking ownership of *val. */
static int frame_set(ctx *C, const ct_node *at, frame *f, const char *name, cv *val)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->v[i].name, name)) {
            cv_drop(&f->v[i].val);
            f->v[i].val = *val;
            *val = cv_undef();
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        var *v = realloc(f->v, cap * sizeof *v);
        if (!v) {
            cv_drop(val);
            return fail_nomem(C, at);
        }
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n].name = name;
    f->v[f->n++].val = *val;
    *val = cv_undef();
    return 0;
}

static bool lookup(ctx *C, const char *name, cv *out)
{
    for (frame *f = C->cur; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (!strcmp(f->v[i].name, name)) {
                *out = cv_dup(&f->v[i].val);
                return true;
            }
    json_object *j;
    if (C->vars && json_object_object_get_ex(C->vars, name, &j)) {
        *out = cv_from_json(j);
        return true;
    }
    *out = cv_undef();
    return false;
}

/* ---- helpers ---- */

static const char *sptr(const cv *v) { return json_object_get_string(v->u.j); }
static size_t slen(const cv *v) { return (size_t)json_object_get_string_len(v->u.j); }

static int make_str(ctx *C, const ct_node *at, const char *s, size_t n, cv *out)
{
    *out = cv_undef();
    if (n > CT_MAX_STRING_BYTES - C->string_bytes)
        return fail(C, at, "strings made past %zu bytes", CT_MAX_STRING_BYTES);
    C->string_bytes += n;
    *out = cv_str(s, n);
    return out->k == CV_STR ? 0 : fail_nomem(C, at);
}

/* str(v) as a new string value. */
static int to_str(ctx *C, const ct_node *at, const cv *v, cv *out)
{
    if (v->k == CV_STR) {
        *out = cv_dup(v);
        return 0;
    }
    ct_buf b = {0};
    if (!cv_append_str(&b, v)) {
        free(b.p);
        return fail_nomem(C, at);
    }
    int rc = make_str(C, at, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int new_list(ctx *C, const ct_node *at, cv *out)
{
    json_object *j = json_object_new_array();
    if (!j) return fail_nomem(C, at);
    *out = (cv){.k = CV_LIST, .u.j = j};
    return 0;
}

/* Appends v (a new reference) to the list value l. */
static int list_add(ctx *C, const ct_node *at, cv *l, const cv *v)
{
    if (v->k == CV_MACRO) return fail(C, at, "a macro cannot be stored in a list");
    if (json_object_array_add(l->u.j, cv_to_json(v))) return fail_nomem(C, at);
    return 0;
}

static size_t cp_len(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return k > n ? n : k;
}

static bool in_chars(const char *c, size_t k, const char *chars, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t m = cp_len(chars + i, n - i);
        if (m == k && !memcmp(chars + i, c, k)) return true;
        i += m;
    }
    return false;
}

/* Python str.strip/lstrip/rstrip: chars NULL strips whitespace. */
static void strip(const char *s, size_t n, const char *chars, size_t nchars, bool left,
                  bool right, size_t *b, size_t *e)
{
    size_t i = 0, j = n;
    while (left && i < j) {
        size_t k = chars ? cp_len(s + i, j - i) : ct_space_len(s + i, j - i);
        if (!k || (chars && !in_chars(s + i, k, chars, nchars))) break;
        i += k;
    }
    while (right && j > i) {
        size_t st = j - 1;
        while (st > i && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t k = j - st;
        if (chars ? !in_chars(s + st, k, chars, nchars) : ct_space_len(s + st, k) != k) break;
        j = st;
    }
    *b = i;
    *e = j;
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static int case_map(ctx *C, const ct_node *at, const cv *v, int mode, cv *out)
{
    /* mode 0 lower, 1 upper, 2 capitalize, 3 title (ASCII letters) */
    cv s;
    if (to_str(C, at, v, &s)) return -1;
    size_t n = slen(&s);
    char *p = malloc(n + 1);
    if (!p) {
        cv_drop(&s);
        return fail_nomem(C, at);
    }
    memcpy(p, sptr(&s), n);
    bool word_start = true;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && word_start);
        if (up && c >= 'a' && c <= 'z') p[i] = (char)(c - 32);
        if (!up && c >= 'A' && c <= 'Z') p[i] = (char)(c + 32);
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        word_start = !alpha && !((unsigned char)c >= 0x80) && !(c >= '0' && c <= '9');
    }
    int rc = make_str(C, at, p, n, out);
    free(p);
    cv_drop(&s);
    return rc;
}

static int replace(ctx *C, const ct_node *at, const cv *v, const cv *old, const cv *new_,
                   int64_t count, cv *out)
{
    if (old->k != CV_STR || new_->k != CV_STR)
        return fail(C, at, "replace: the old and new values must be strings");
    cv s;
    if (to_str(C, at, v, &s)) return -1;
    ct_buf b = {0};
    const char *p = sptr(&s), *end = p + slen(&s);
    size_t on = slen(old);
    bool ok = true;
    int64_t done = 0;
    if (on == 0) {
        /* Python inserts new before every character and at the end */
        while (ok && (count < 0 || done < count)) {
            ok = ct_buf_add(&b, sptr(new_), slen(new_));
            done++;
            if (p >= end) break;
            size_t k = cp_len(p, (size_t)(end - p));
            ok = ok && ct_buf_add(&b, p, k);
            p += k;
        }
    } else {
        const char *f;
        while (ok && (count < 0 || done < count) &&
               (f = memfind(p, (size_t)(end - p), sptr(old), on))) {
            ok = ct_buf_add(&b, p, (size_t)(f - p)) && ct_buf_add(&b, sptr(new_), slen(new_));
            p = f + on;
            done++;
        }
    }
    ok = ok && ct_buf_add(&b, p, (size_t)(end - p));
    int rc = ok ? make_str(C, at, b.p ? b.p : "", b.n, out) : fail_nomem(C, at);
    free(b.p);
    cv_drop(&s);
    return rc;
}

/* ---- expressions ---- */

static int eval(ctx *C, const ct_node *x, cv *out);
static int exec_body(ctx *C, const ct_node *body);

/* Arguments of a call or filter: positional into pos[], keywords matched against names[]
 * (positional slot i is also keyword names[i]). Unfilled slots are undefined. */
static int eval_args(ctx *C, const ct_node *call, const char *const *names, size_t n_slots,
                     cv *slots, const char *what)
{
    for (size_t i = 0; i < n_slots; i++) slots[i] = cv_undef();
    size_t p = 0;
    for (size_t i = 0; i < call->n_kids; i++) {
        size_t slot = n_slots;
        const char *kw = call->kw ? call->kw[i] : NULL;
        if (kw) {
            for (size_t k = 0; k < n_slots; k++)
                if (names[k] && !strcmp(names[k], kw)) slot = k;
            if (slot == n_slots)
                return fail(C, call->kids[i], "%s: unexpected keyword argument '%s'", what, kw);
        } else {
            slot = p++;
            if (slot >= n_slots) return fail(C, call->kids[i], "%s: too many arguments", what);
        }
        cv_drop(&slots[slot]);
        if (eval(C, call->kids[i], &slots[slot])) return -1;
    }
    return 0;
}

static void drop_all(cv *v, size_t n)
{
    for (size_t i = 0; i < n; i++) cv_drop(&v[i]);
}

static int call_macro(ctx *C, const ct_node *at, const ct_node *m, const ct_node *call,
                      cv *out)
{
    if (C->call_depth >= CT_MAX_CALL_DEPTH)
        return fail(C, at, "macro '%s': calls nested deeper than %d", m->str, CT_MAX_CALL_DEPTH);
    size_t n = m->n_kids;
    const char *names[64] = {NULL};
    cv args[64];
    if (n > 64) return fail(C, at, "macro '%s': more than 64 parameters", m->str);
    for (size_t i = 0; i < n; i++) names[i] = m->kids[i]->str;
    char what[96];
    snprintf(what, sizeof what, "macro '%s'", m->str);
    if (eval_args(C, call, names, n, args, what)) {
        drop_all(args, n);
        return -1;
    }
    frame f = {.parent = C->top};
    frame *saved = C->cur;
    ct_buf *saved_out = C->out;
    ct_buf b = {0};
    int rc = 0;
    C->cur = &f;
    for (size_t i = 0; i < n && !rc; i++) {
        /* filled arguments are bound first; defaults see the frame being built */
        if (args[i].k == CV_UNDEF && m->kids[i]->a) rc = eval(C, m->kids[i]->a, &args[i]);
        if (!rc) rc = frame_set(C, at, &f, names[i], &args[i]);
    }
    C->out = &b;
    C->call_depth++;
    if (!rc) rc = exec_body(C, m->d);
    C->call_depth--;
    C->out = saved_out;
    C->cur = saved;
    C->flow = FLOW_NONE;
    frame_clear(&f);
    drop_all(args, n);
    if (!rc && b.over) rc = fail_nomem(C, at);
    if (!rc) rc = make_str(C, at, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int call_builtin(ctx *C, const ct_node *x, const char *name, cv *out, bool *handled)
{
    *handled = true;
    if (!strcmp(name, "raise_exception")) {
        cv a[1];
        static const char *const names[] = {"message"};
        if (eval_args(C, x, names, 1, a, "raise_exception")) {
            drop_all(a, 1);
            return -1;
        }
        ct_buf b = {0};
        cv_append_str(&b, &a[0]);
        C->failed = false;
        fail(C, NULL, "%s", b.p ? b.p : "");
        free(b.p);
        drop_all(a, 1);
        return -1;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_object *j = json_object_new_object();
        if (!j) return fail_nomem(C, x);
        *out = (cv){.k = !strcmp(name, "dict") ? CV_DICT : CV_NS, .u.j = j};
        for (size_t i = 0; i < x->n_kids; i++) {
            cv v;
            if (eval(C, x->kids[i], &v)) return -1;
            if (!x->kw || !x->kw[i]) {
                /* namespace(mapping): its items */
                if (v.k != CV_DICT) {
                    cv_drop(&v);
                    return fail(C, x->kids[i], "%s: a positional argument must be a dict",
                                name);
                }
                json_object_object_foreach(v.u.j, key, val)
                    json_object_object_add(j, key, json_object_get(val));
            } else {
                if (v.k == CV_MACRO) return fail(C, x, "%s: a macro cannot be stored", name);
                json_object_object_add(j, x->kw[i], cv_to_json(&v));
            }
            cv_drop(&v);
        }
        return 0;
    }
    if (!strcmp(name, "range")) {
        cv a[3];
        static const char *const names[] = {NULL, NULL, NULL};
        if (eval_args(C, x, names, 3, a, "range")) {
            drop_all(a, 3);
            return -1;
        }
        int64_t lo = 0, hi, step = 1;
        int n_given = a[2].k != CV_UNDEF ? 3 : a[1].k != CV_UNDEF ? 2 : 1;
        for (int i = 0; i < n_given; i++)
            if (a[i].k != CV_INT) {
                drop_all(a, 3);
                return fail(C, x, "range: arguments must be integers");
            }
        if (n_given == 1) {
            hi = a[0].u.i;
        } else {
            lo = a[0].u.i;
            hi = a[1].u.i;
            if (n_given == 3) step = a[2].u.i;
        }
        if (step == 0) return fail(C, x, "range: step must not be zero");
        if (new_list(C, x, out)) return -1;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
            cv v = cv_int(i);
            if (++C->iterations > CT_MAX_ITERATIONS) {
                cv_drop(out);
                return fail(C, x, "more than %d loop iterations", CT_MAX_ITERATIONS);
            }
            if (list_add(C, x, out, &v)) {
                cv_drop(out);
                return -1;
            }
        }
        return 0;
    }
    *handled = false;
    return 0;
}

static int str_split(ctx *C, const ct_node *at, const cv *s, const cv *sep, int64_t maxsplit,
                     cv *out)
{
    if (new_list(C, at, out)) return -1;
    const char *p = sptr(s), *end = p + slen(s);
    int64_t done = 0;
    if (sep->k == CV_UNDEF || sep->k == CV_NONE) {
        for (;;) {
            size_t k;
            while (p < end && (k = ct_space_len(p, (size_t)(end - p)))) p += k;
            if (p >= end) return 0;
            const char *q = p;
            if (maxsplit >= 0 && done >= maxsplit) {
                q = end; /* the tail as it is: Python strips only its leading whitespace */
            } else {
                while (q < end && !ct_space_len(q, (size_t)(end - q))) q += cp_len(q, (size_t)(end - q));
            }
            cv piece;
            if (make_str(C, at, p, (size_t)(q - p), &piece)) return -1;
            int rc = list_add(C, at, out, &piece);
            cv_drop(&piece);
            if (rc) return -1;
            done++;
            p = q;
        }
    }
    if (sep->k != CV_STR) return fail(C, at, "split: the separator must be a string");
    if (slen(sep) == 0) return fail(C, at, "split: empty separator");
    for (;;) {
        const char *f = (maxsplit >= 0 && done >= maxsplit)
                            ? NULL : memfind(p, (size_t)(end - p), sptr(sep), slen(sep));
        const char *q = f ? f : end;
        cv piece;
        if (make_str(C, at, p, (size_t)(q - p), &piece)) return -1;
        int rc = list_add(C, at, out, &piece);
        cv_drop(&piece);
        if (rc) return -1;
        if (!f) return 0;
        p = f + slen(sep);
        done++;
    }
}

static int str_affix(ctx *C, const ct_node *at, const cv *s, const cv *a, bool start, cv *out)
{
    size_t n = slen(s);
    const char *p = sptr(s);
    if (a->k == CV_STR) {
        size_t k = slen(a);
        bool r = k <= n && !memcmp(start ? p : p + n - k, sptr(a), k);
        *out = cv_bool(r);
        return 0;
    }
    if (a->k == CV_LIST) {
        size_t m = json_object_array_length(a->u.j);
        for (size_t i = 0; i < m; i++) {
            cv e = cv_from_json(json_object_array_get_idx(a->u.j, i));
            cv r;
            int rc = e.k == CV_STR ? str_affix(C, at, s, &e, start, &r)
                                   : fail(C, at, "%s: a tuple of strings expected",
                                          start ? "startswith" : "endswith");
            cv_drop(&e);
            if (rc) return -1;
            if (r.u.b) {
                *out = r;
                return 0;
            }
        }
        *out = cv_bool(false);
        return 0;
    }
    return fail(C, at, "%s: the argument must be a string", start ? "startswith" : "endswith");
}

/* obj.name(args) where obj is a string or a dict and name one of its methods. */
static int call_method(ctx *C, const ct_node *x, const cv *obj, const char *name, cv *out,
                       bool *handled)
{
    *handled = true;
    cv a[3];
    static const char *const no_names[] = {NULL, NULL, NULL};
    int rc;
    if (obj->k == CV_STR) {
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            if (eval_args(C, x, no_names, 1, a, name)) goto fail1;
            rc = str_affix(C, x, obj, &a[0], name[0] == 's', out);
            drop_all(a, 1);
            return rc;
        }
        if (!strcmp(name, "split")) {
            static const char *const names[] = {"sep", "maxsplit"};
            if (eval_args(C, x, names, 2, a, name)) goto fail2;
            int64_t maxsplit = a[1].k == CV_INT ? a[1].u.i : -1;
            rc = str_split(C, x, obj, &a[0], maxsplit, out);
            drop_all(a, 2);
            return rc;
        }
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
            if (eval_args(C, x, no_names, 1, a, name)) goto fail1;
            if (a[0].k != CV_UNDEF && a[0].k != CV_NONE && a[0].k != CV_STR) {
                drop_all(a, 1);
                return fail(C, x, "%s: the argument must be a string", name);
            }
            bool has = a[0].k == CV_STR;
            size_t b, e;
            strip(sptr(obj), slen(obj), has ? sptr(&a[0]) : NULL, has ? slen(&a[0]) : 0,
                  name[0] != 'r', name[0] != 'l', &b, &e);
            rc = make_str(C, x, sptr(obj) + b, e - b, out);
            drop_all(a, 1);
            return rc;
        }
        int mode = !strcmp(name, "lower") ? 0 : !strcmp(name, "upper") ? 1
                 : !strcmp(name, "capitalize") ? 2 : !strcmp(name, "title") ? 3 : -1;
        if (mode >= 0) {
            if (x->n_kids) return fail(C, x, "%s: takes no arguments", name);
            return case_map(C, x, obj, mode, out);
        }
        if (!strcmp(name, "replace")) {
            if (eval_args(C, x, no_names, 3, a, name)) goto fail3;
            rc = replace(C, x, obj, &a[0], &a[1], a[2].k == CV_INT ? a[2].u.i : -1, out);
            drop_all(a, 3);
            return rc;
        }
    } else if (obj->k == CV_DICT) {
        bool items = !strcmp(name, "items"), keys = !strcmp(name, "keys"),
             values = !strcmp(name, "values");
        if (items || keys || values) {
            if (x->n_kids) return fail(C, x, "%s: takes no arguments", name);
            if (new_list(C, x, out)) return -1;
            json_object_object_foreach(obj->u.j, key, val) {
                json_object *e;
                if (items) {
                    e = json_object_new_array();
                    if (!e) return fail_nomem(C, x);
                    json_object_array_add(e, json_object_new_string(key));
                    json_object_array_add(e, json_object_get(val));
                } else {
                    e = keys ? json_object_new_string(key) : json_object_get(val);
                }
                json_object_array_add(out->u.j, e);
            }
            return 0;
        }
        if (!strcmp(name, "get")) {
            if (eval_args(C, x, no_names, 2, a, name)) goto fail2;
            json_object *j;
            if (a[0].k == CV_STR && json_object_object_get_ex(obj->u.j, sptr(&a[0]), &j)) {
                *out = cv_from_json(j);
            } else {
                *out = a[1].k == CV_UNDEF ? cv_none() : cv_dup(&a[1]);
            }
            drop_all(a, 2);
            return 0;
        }
    }
    *handled = false;
    return 0;
fail1:
    drop_all(a, 1);
    return -1;
fail2:
    drop_all(a, 2);
    return -1;
fail3:
    drop_all(a, 3);
    return -1;
}

static int eval_call(ctx *C, const ct_node *x, cv *out)
{
    const ct_node *f = x->a;
    bool handled;
    if (f->kind == CT_NAME) {
        cv v;
        if (!lookup(C, f->str, &v)) {
            if (call_builtin(C, x, f->str, out, &handled)) return -1;
            if (handled) return 0;
            return fail(C, f, "'%s' is undefined", f->str);
        }
        if (v.k != CV_MACRO) {
            cv_drop(&v);
            return fail(C, f, "'%s' is not callable", f->str);
        }
        return call_macro(C, x, v.u.m, x, out);
    }
    if (f->kind == CT_ATTR) {
        cv obj;
        if (eval(C, f->a, &obj)) return -1;
        if (obj.k == CV_UNDEF) return fail(C, f, "'%s' of an undefined value", f->str);
        int rc = call_method(C, x, &obj, f->str, out, &handled);
        if (rc || handled) {
            cv_drop(&obj);
            if (!rc) return 0;
            return -1;
        }
        cv_kind k = obj.k;
        cv_drop(&obj);
        if (k == CV_STR || k == CV_DICT || k == CV_LIST)
            return fail(C, f, "unsupported method '%s' of a %s", f->str, cv_kind_name(k));
    }
    cv v;
    if (eval(C, f, &v)) return -1;
    if (v.k != CV_MACRO) {
        cv_drop(&v);
        return fail(C, x, "a %s is not callable", cv_kind_name(v.k));
    }
    return call_macro(C, x, v.u.m, x, out);
}

static int64_t py_floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static int binop(ctx *C, const ct_node *x, const cv *a, const cv *b, cv *out)
{
    int op = x->op;
    if (op == CT_OP_CONCAT) {
        ct_buf buf = {0};
        bool ok = cv_append_str(&buf, a) && cv_append_str(&buf, b);
        int rc = ok ? make_str(C, x, buf.p ? buf.p : "", buf.n, out) : fail_nomem(C, x);
        free(buf.p);
        return rc;
    }
    if (op == CT_OP_EQ || op == CT_OP_NE) {
        bool e = cv_equal(a, b);
        *out = cv_bool(op == CT_OP_EQ ? e : !e);
        return 0;
    }
    if (op == CT_OP_IN || op == CT_OP_NOTIN) {
        bool r = false;
        if (b->k == CV_STR) {
            if (a->k != CV_STR)
                return fail(C, x, "'in <string>' requires a string, not a %s",
                            cv_kind_name(a->k));
            r = memfind(sptr(b), slen(b), sptr(a), slen(a)) != NULL;
        } else if (b->k == CV_LIST) {
            size_t n = json_object_array_length(b->u.j);
            for (size_t i = 0; i < n && !r; i++) {
                cv e = cv_from_json(json_object_array_get_idx(b->u.j, i));
                r = cv_equal(a, &e);
                cv_drop(&e);
            }
        } else if (b->k == CV_DICT) {
            r = a->k == CV_STR && json_object_object_get_ex(b->u.j, sptr(a), NULL);
        } else if (b->k != CV_UNDEF) {
            return fail(C, x, "'in': a %s is not a container", cv_kind_name(b->k));
        }
        *out = cv_bool(op == CT_OP_IN ? r : !r);
        return 0;
    }
    bool an = a->k == CV_INT || a->k == CV_FLOAT || a->k == CV_BOOL;
    bool bn = b->k == CV_INT || b->k == CV_FLOAT || b->k == CV_BOOL;
    if (op >= CT_OP_LT && op <= CT_OP_GE) {
        int c;
        if (an && bn) {
            double p = a->k == CV_FLOAT ? a->u.d : a->k == CV_BOOL ? a->u.b : (double)a->u.i;
            double q = b->k == CV_FLOAT ? b->u.d : b->k == CV_BOOL ? b->u.b : (double)b->u.i;
            if (a->k == CV_INT && b->k == CV_INT) c = (a->u.i > b->u.i) - (a->u.i < b->u.i);
            else c = (p > q) - (p < q);
        } else if (a->k == CV_STR && b->k == CV_STR) {
            size_t n = slen(a) < slen(b) ? slen(a) : slen(b);
            c = memcmp(sptr(a), sptr(b), n);
            if (!c) c = (slen(a) > slen(b)) - (slen(a) < slen(b));
        } else {
            return fail(C, x, "cannot compare a %s with a %s", cv_kind_name(a->k),
                        cv_kind_name(b->k));
        }
        bool r = op == CT_OP_LT ? c < 0 : op == CT_OP_GT ? c > 0 : op == CT_OP_LE ? c <= 0 : c >= 0;
        *out = cv_bool(r);
        return 0;
    }
    if (op == CT_OP_ADD && a->k == CV_STR && b->k == CV_STR) {
        ct_buf buf = {0};
        bool ok = ct_buf_add(&buf, sptr(a), slen(a)) && ct_buf_add(&buf, sptr(b), slen(b));
        int rc = ok ? make_str(C, x, buf.p ? buf.p : "", buf.n, out) : fail_nomem(C, x);
        free(buf.p);
        return rc;
    }
    if (op == CT_OP_ADD && a->k == CV_LIST && b->k == CV_LIST) {
        if (new_list(C, x, out)) return -1;
        for (int k = 0; k < 2; k++) {
            json_object *l = k ? b->u.j : a->u.j;
            for (size_t i = 0; i < json_object_array_length(l); i++)
                json_object_array_add(out->u.j, json_object_get(json_object_array_get_idx(l, i)));
        }
        return 0;
    }
    if (op == CT_OP_MUL && ((a->k == CV_STR && b->k == CV_INT) ||
                            (a->k == CV_INT && b->k == CV_STR))) {
        const cv *s = a->k == CV_STR ? a : b;
        int64_t n = a->k == CV_INT ? a->u.i : b->u.i;
        ct_buf buf = {0};
        bool ok = true;
        for (int64_t i = 0; i < n && ok; i++) ok = ct_buf_add(&buf, sptr(s), slen(s));
        int rc = ok ? make_str(C, x, buf.p ? buf.p : "", buf.n, out) : fail_nomem(C, x);
        free(buf.p);
        return rc;
    }
    if (!an || !bn)
        return fail(C, x, "unsupported operand types: a %s and a %s", cv_kind_name(a->k),
                    cv_kind_name(b->k));
    bool ints = a->k != CV_FLOAT && b->k != CV_FLOAT;
    int64_t i = a->k == CV_BOOL ? a->u.b : a->u.i, j = b->k == CV_BOOL ? b->u.b : b->u.i;
    double p = a->k == CV_FLOAT ? a->u.d : (double)i, q = b->k == CV_FLOAT ? b->u.d : (double)j;
    switch (op) {
    case CT_OP_ADD: *out = ints ? cv_int(i + j) : cv_float(p + q); return 0;
    case CT_OP_SUB: *out = ints ? cv_int(i - j) : cv_float(p - q); return 0;
    case CT_OP_MUL: *out = ints ? cv_int(i * j) : cv_float(p * q); return 0;
    case CT_OP_DIV:
        if (q == 0) return fail(C, x, "division by zero");
        *out = cv_float(p / q);
        return 0;
    case CT_OP_FLOORDIV:
        if (q == 0) return fail(C, x, "division by zero");
        *out = ints ? cv_int(py_floordiv(i, j)) : cv_float(floor(p / q));
        return 0;
    case CT_OP_MOD:
        if (q == 0) return fail(C, x, "modulo by zero");
        if (ints) {
            int64_t r = i % j;
            if (r != 0 && ((r < 0) != (j < 0))) r += j;
            *out = cv_int(r);
        } else {
            double r = fmod(p, q);
            if (r != 0 && ((r < 0) != (q < 0))) r += q;
            *out = cv_float(r);
        }
        return 0;
    case CT_OP_POW:
        if (ints && j >= 0) {
            int64_t r = 1;
            for (int64_t k = 0; k < j && k < 64; k++) r *= i;
            *out = cv_int(r);
        } else {
            *out = cv_float(pow(p, q));
        }
        return 0;
    }
    return fail(C, x, "unsupported operator");
}

/* Python's index semantics: negative counts from the end; false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (size_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static int eval_index(ctx *C, const ct_node *x, const cv *a, const cv *b, cv *out)
{
    *out = cv_undef();
    if (a->k == CV_UNDEF) return fail(C, x, "subscript of an undefined value");
    if ((a->k == CV_DICT || a->k == CV_NS) && b->k == CV_STR) {
        json_object *j;
        if (json_object_object_get_ex(a->u.j, sptr(b), &j)) *out = cv_from_json(j);
        return 0;
    }
    if ((b->k == CV_INT || b->k == CV_BOOL) && (a->k == CV_LIST || a->k == CV_STR)) {
        int64_t i = b->k == CV_BOOL ? b->u.b : b->u.i;
        size_t k;
        if (a->k == CV_LIST) {
            if (norm_index(i, json_object_array_length(a->u.j), &k))
                *out = cv_from_json(json_object_array_get_idx(a->u.j, k));
            return 0;
        }
        if (norm_index(i, ct_utf8_count(sptr(a), slen(a)), &k)) {
            size_t off = ct_utf8_offset(sptr(a), slen(a), k);
            return make_str(C, x, sptr(a) + off, cp_len(sptr(a) + off, slen(a) - off), out);
        }
    }
    return 0;
}

static int eval_slice(ctx *C, const ct_node *x, cv *out)
{
    cv a, bounds[3] = {cv_undef(), cv_undef(), cv_undef()};
    if (eval(C, x->a, &a)) return -1;
    const ct_node *parts[3] = {x->b, x->c, x->d};
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        if (parts[i] && !(rc = eval(C, parts[i], &bounds[i])) && bounds[i].k != CV_INT &&
            bounds[i].k != CV_NONE)
            rc = fail(C, parts[i], "slice bounds must be integers");
    }
    if (!rc && a.k != CV_LIST && a.k != CV_STR)
        rc = fail(C, x, "slice of a %s", cv_kind_name(a.k));
    if (rc) {
        cv_drop(&a);
        return -1;
    }
    int64_t n = a.k == CV_LIST ? (int64_t)json_object_array_length(a.u.j)
                               : (int64_t)ct_utf8_count(sptr(&a), slen(&a));
    int64_t step = bounds[2].k == CV_INT ? bounds[2].u.i : 1;
    if (step == 0) {
        cv_drop(&a);
        return fail(C, x, "slice step cannot be zero");
    }
    int64_t lo, hi;
    for (int k = 0; k < 2; k++) {
        bool given = bounds[k].k == CV_INT;
        int64_t v = given ? bounds[k].u.i : 0;
        if (given) {
            if (v < 0) v += n;
            if (step > 0) v = v < 0 ? 0 : v > n ? n : v;
            else v = v < 0 ? -1 : v >= n ? n - 1 : v;
        } else {
            v = step > 0 ? (k ? n : 0) : (k ? -1 : n - 1);
        }
        if (k) hi = v;
        else lo = v;
    }
    ct_buf b = {0};
    if (a.k == CV_LIST) {
        rc = new_list(C, x, out);
        for (int64_t i = lo; !rc && (step > 0 ? i < hi : i > hi); i += step)
            json_object_array_add(out->u.j,
                                  json_object_get(json_object_array_get_idx(a.u.j, (size_t)i)));
    } else {
        const char *s = sptr(&a);
        size_t sn = slen(&a);
        bool ok = true;
        for (int64_t i = lo; ok && (step > 0 ? i < hi : i > hi); i += step) {
            size_t off = ct_utf8_offset(s, sn, (size_t)i);
            ok = ct_buf_add(&b, s + off, cp_len(s + off, sn - off));
        }
        rc = ok ? make_str(C, x, b.p ? b.p : "", b.n, out) : fail_nomem(C, x);
    }
    free(b.p);
    cv_drop(&a);
    return rc;
}

static int apply_filter(ctx *C, const ct_node *x, cv *v, cv *out);
static int apply_test(ctx *C, const ct_node *x, const cv *v, bool *r);

static int eval_collection(ctx *C, const ct_node *x, cv *out)
{
    json_object *j = x->kind == CT_DICT ? json_object_new_object() : json_object_new_array();
    if (!j) return fail_nomem(C, x);
    *out = (cv){.k = x->kind == CT_DICT ? CV_DICT : CV_LIST, .u.j = j};
    for (size_t i = 0; i < x->n_kids; i++) {
        cv v;
        if (eval(C, x->kids[i], &v)) return -1;
        if (v.k == CV_MACRO) return fail(C, x->kids[i], "a macro cannot be stored");
        if (x->kind == CT_DICT) {
            cv val;
            if (v.k != CV_STR) {
                cv_drop(&v);
                return fail(C, x->kids[i], "dict keys must be strings");
            }
            if (eval(C, x->kids[++i], &val)) {
                cv_drop(&v);
                return -1;
            }
            json_object_object_add(j, sptr(&v), cv_to_json(&val));
            cv_drop(&val);
        } else {
            json_object_array_add(j, cv_to_json(&v));
        }
        cv_drop(&v);
    }
    return 0;
}

static int eval_inner(ctx *C, const ct_node *x, cv *out);

/* Evaluates x into *out (owned by the caller); on failure *out is left undefined. */
static int eval(ctx *C, const ct_node *x, cv *out)
{
    int rc = eval_inner(C, x, out);
    if (rc) cv_drop(out);
    return rc;
}

static int eval_inner(ctx *C, const ct_node *x, cv *out)
{
    *out = cv_undef();
    cv a, b;
    int rc;
    switch (x->kind) {
    case CT_LIT_STR: return make_str(C, x, x->str, x->len, out);
    case CT_LIT_INT: *out = cv_int(x->ival); return 0;
    case CT_LIT_FLOAT: *out = cv_float(x->dval); return 0;
    case CT_LIT_BOOL: *out = cv_bool(x->ival != 0); return 0;
    case CT_LIT_NONE: *out = cv_none(); return 0;
    case CT_NAME: lookup(C, x->str, out); return 0;
    case CT_ATTR:
        if (eval(C, x->a, &a)) return -1;
        if (a.k == CV_UNDEF) return fail(C, x, "attribute '%s' of an undefined value", x->str);
        if (a.k == CV_DICT || a.k == CV_NS) {
            json_object *j;
            if (json_object_object_get_ex(a.u.j, x->str, &j)) *out = cv_from_json(j);
        }
        cv_drop(&a);
        return 0;
    case CT_INDEX:
        if (eval(C, x->a, &a)) return -1;
        if (eval(C, x->b, &b)) {
            cv_drop(&a);
            return -1;
        }
        rc = eval_index(C, x, &a, &b, out);
        cv_drop(&a);
        cv_drop(&b);
        return rc;
    case CT_SLICE: return eval_slice(C, x, out);
    case CT_CALL: return eval_call(C, x, out);
    case CT_FILTER:
        if (eval(C, x->a, &a)) return -1;
        rc = apply_filter(C, x, &a, out);
        cv_drop(&a);
        return rc;
    case CT_TEST: {
        bool r = false;
        if (eval(C, x->a, &a)) return -1;
        rc = apply_test(C, x, &a, &r);
        cv_drop(&a);
        *out = cv_bool(x->ival ? !r : r);
        return rc;
    }
    case CT_NOT:
        if (eval(C, x->a, &a)) return -1;
        *out = cv_bool(!cv_truthy(&a));
        cv_drop(&a);
        return 0;
    case CT_NEG:
        if (eval(C, x->a, &a)) return -1;
        if (a.k == CV_INT || a.k == CV_BOOL) {
            int64_t i = a.k == CV_BOOL ? a.u.b : a.u.i;
            *out = cv_int(x->op == '-' ? -i : i);
        } else if (a.k == CV_FLOAT) {
            *out = cv_float(x->op == '-' ? -a.u.d : a.u.d);
        } else {
            rc = fail(C, x, "unary %c of a %s", x->op, cv_kind_name(a.k));
            cv_drop(&a);
            return rc;
        }
        return 0;
    case CT_BINOP:
        if (eval(C, x->a, &a)) return -1;
        if (eval(C, x->b, &b)) {
            cv_drop(&a);
            return -1;
        }
        if ((a.k == CV_UNDEF || b.k == CV_UNDEF) && x->op != CT_OP_CONCAT &&
            x->op != CT_OP_EQ && x->op != CT_OP_NE && x->op != CT_OP_IN &&
            x->op != CT_OP_NOTIN) {
            rc = fail(C, x, "an undefined value in an operation");
        } else {
            rc = binop(C, x, &a, &b, out);
        }
        cv_drop(&a);
        cv_drop(&b);
        return rc;
    case CT_AND: case CT_OR:
        if (eval(C, x->a, &a)) return -1;
        if (cv_truthy(&a) == (x->kind == CT_OR)) {
            *out = a;
            return 0;
        }
        cv_drop(&a);
        return eval(C, x->b, out);
    case CT_COND:
        if (eval(C, x->a, &a)) return -1;
        rc = cv_truthy(&a);
        cv_drop(&a);
        if (rc) return eval(C, x->b, out);
        return x->c ? eval(C, x->c, out) : 0;
    case CT_LIST: case CT_TUPLE: case CT_DICT: return eval_collection(C, x, out);
    default: return fail(C, x, "not an expression");
    }
}

/* ---- filters and tests ---- */

static int filter_length(ctx *C, const ct_node *x, const cv *v, cv *out)
{
    switch (v->k) {
    case CV_UNDEF: *out = cv_int(0); return 0;
    case CV_STR: *out = cv_int((int64_t)ct_utf8_count(sptr(v), slen(v))); return 0;
    case CV_LIST: *out = cv_int((int64_t)json_object_array_length(v->u.j)); return 0;
    case CV_DICT: *out = cv_int(json_object_object_length(v->u.j)); return 0;
    default: return fail(C, x, "length of a %s", cv_kind_name(v->k));
    }
}

/* list(v): a list's items, a string's characters, a dict's keys. */
static int to_list(ctx *C, const ct_node *x, const cv *v, cv *out)
{
    if (v->k == CV_LIST) {
        *out = cv_dup(v);
        return 0;
    }
    if (new_list(C, x, out)) return -1;
    if (v->k == CV_UNDEF) return 0;
    if (v->k == CV_STR) {
        const char *s = sptr(v);
        size_t n = slen(v);
        for (size_t i = 0; i < n;) {
            size_t k = cp_len(s + i, n - i);
            json_object_array_add(out->u.j, json_object_new_string_len(s + i, (int)k));
            i += k;
        }
        return 0;
    }
    if (v->k == CV_DICT) {
        json_object_object_foreach(v->u.j, key, val) {
            (void)val;
            json_object_array_add(out->u.j, json_object_new_string(key));
        }
        return 0;
    }
    cv_drop(out);
    return fail(C, x, "a %s is not iterable", cv_kind_name(v->k));
}

static int apply_filter(ctx *C, const ct_node *x, cv *v, cv *out)
{
    cv a[3];
    const char *const *names;
    static const char *const none3[] = {NULL, NULL, NULL};
    static const char *const tojson_names[] = {"indent", "sort_keys", "ensure_ascii"};
    static const char *const default_names[] = {"default_value", "boolean", NULL};
    static const char *const join_names[] = {"d", "attribute", NULL};
    static const char *const trim_names[] = {"chars", NULL, NULL};
    static const char *const int_names[] = {"default", "base", NULL};
    names = x->op == CT_F_TOJSON ? tojson_names : x->op == CT_F_DEFAULT ? default_names
          : x->op == CT_F_JOIN ? join_names : x->op == CT_F_TRIM ? trim_names
          : (x->op == CT_F_INT || x->op == CT_F_FLOAT) ? int_names : none3;
    if (eval_args(C, x, names, 3, a, x->str)) {
        drop_all(a, 3);
        return -1;
    }
    int rc = 0;
    switch ((ct_filter)x->op) {
    case CT_F_TRIM: {
        cv s;
        if (a[0].k != CV_UNDEF && a[0].k != CV_NONE && a[0].k != CV_STR) {
            rc = fail(C, x, "trim: chars must be a string");
            break;
        }
        if ((rc = to_str(C, x, v, &s))) break;
        size_t b, e;
        bool has = a[0].k == CV_STR;
        strip(sptr(&s), slen(&s), has ? sptr(&a[0]) : NULL, has ? slen(&a[0]) : 0, true, true,
              &b, &e);
        rc = make_str(C, x, sptr(&s) + b, e - b, out);
        cv_drop(&s);
        break;
    }
    case CT_F_LENGTH: rc = filter_length(C, x, v, out); break;
    case CT_F_ITEMS:
        if (v->k == CV_UNDEF) {
            rc = new_list(C, x, out);
        } else if (v->k != CV_DICT) {
            rc = fail(C, x, "items: a %s is not a mapping", cv_kind_name(v->k));
        } else {
            bool h;
            const ct_node fake = {.kind = CT_CALL, .line = x->line, .col = x->col};
            rc = call_method(C, &fake, v, "items", out, &h);
        }
        break;
    case CT_F_STRING: case CT_F_SAFE: rc = to_str(C, x, v, out); break;
    case CT_F_TOJSON: {
        if (a[0].k != CV_UNDEF && a[0].k != CV_NONE && a[0].k != CV_INT) {
            rc = fail(C, x, "tojson: indent must be an integer");
            break;
        }
        ct_buf b = {0};
        if (v->k == CV_UNDEF || v->k == CV_MACRO) {
            rc = fail(C, x, "tojson: a %s is not JSON serializable", cv_kind_name(v->k));
            break;
        }
        bool ok = cv_append_json(&b, v, a[0].k == CV_INT ? (int)a[0].u.i : -1, cv_truthy(&a[1]));
        rc = ok ? make_str(C, x, b.p ? b.p : "", b.n, out) : fail_nomem(C, x);
        free(b.p);
        break;
    }
    case CT_F_DEFAULT: {
        bool use = v->k == CV_UNDEF || (cv_truthy(&a[1]) && !cv_truthy(v));
        if (use && a[0].k == CV_UNDEF) rc = make_str(C, x, "", 0, out);
        else *out = cv_dup(use ? &a[0] : v);
        break;
    }
    case CT_F_JOIN: {
        cv l;
        if ((rc = to_list(C, x, v, &l))) break;
        ct_buf b = {0};
        bool ok = true;
        size_t n = json_object_array_length(l.u.j);
        for (size_t i = 0; i < n && ok; i++) {
            if (i && a[0].k != CV_UNDEF) ok = cv_append_str(&b, &a[0]);
            cv e = cv_from_json(json_object_array_get_idx(l.u.j, i));
            ok = ok && cv_append_str(&b, &e);
            cv_drop(&e);
        }
        rc = ok ? make_str(C, x, b.p ? b.p : "", b.n, out) : fail_nomem(C, x);
        free(b.p);
        cv_drop(&l);
        break;
    }
    case CT_F_FIRST: case CT_F_LAST: {
        cv l;
        if ((rc = to_list(C, x, v, &l))) break;
        size_t n = json_object_array_length(l.u.j);
        if (n) *out = cv_from_json(json_object_array_get_idx(l.u.j, x->op == CT_F_FIRST ? 0 : n - 1));
        cv_drop(&l);
        break;
    }
    case CT_F_LIST: rc = to_list(C, x, v, out); break;
    case CT_F_LOWER: rc = case_map(C, x, v, 0, out); break;
    case CT_F_UPPER: rc = case_map(C, x, v, 1, out); break;
    case CT_F_CAPITALIZE: rc = case_map(C, x, v, 2, out); break;
    case CT_F_TITLE: rc = case_map(C, x, v, 3, out); break;
    case CT_F_REPLACE:
        rc = replace(C, x, v, &a[0], &a[1], a[2].k == CV_INT ? a[2].u.i : -1, out);
        break;
    case CT_F_INT: case CT_F_FLOAT: {
        bool is_int = x->op == CT_F_INT;
        double d = 0;
        int64_t i = 0;
        bool ok = true;
        if (v->k == CV_INT || v->k == CV_BOOL) {
            i = v->k == CV_BOOL ? v->u.b : v->u.i;
            d = (double)i;
        } else if (v->k == CV_FLOAT) {
            d = v->u.d;
            i = (int64_t)d;
        } else if (v->k == CV_STR) {
            char *end;
            const char *s = sptr(v);
            d = strtod(s, &end);
            ok = end != s && *end == 0;
            i = (int64_t)d;
        } else {
            ok = false;
        }
        if (!ok) *out = a[0].k != CV_UNDEF ? cv_dup(&a[0]) : is_int ? cv_int(0) : cv_float(0);
        else *out = is_int ? cv_int(i) : cv_float(d);
        break;
    }
    case CT_F_ABS:
        if (v->k == CV_INT) *out = cv_int(v->u.i < 0 ? -v->u.i : v->u.i);
        else if (v->k == CV_FLOAT) *out = cv_float(fabs(v->u.d));
        else rc = fail(C, x, "abs of a %s", cv_kind_name(v->k));
        break;
    }
    drop_all(a, 3);
    return rc;
}

static int apply_test(ctx *C, const ct_node *x, const cv *v, bool *r)
{
    cv_kind k = v->k;
    switch ((ct_test)x->op) {
    case CT_T_STRING: *r = k == CV_STR; return 0;
    case CT_T_MAPPING: *r = k == CV_DICT; return 0;
    case CT_T_ITERABLE: case CT_T_SEQUENCE:
        *r = k == CV_STR || k == CV_LIST || k == CV_DICT || k == CV_UNDEF;
        return 0;
    case CT_T_DEFINED: *r = k != CV_UNDEF; return 0;
    case CT_T_UNDEFINED: *r = k == CV_UNDEF; return 0;
    case CT_T_NONE: *r = k == CV_NONE; return 0;
    case CT_T_FALSE: *r = k == CV_BOOL && !v->u.b; return 0;
    case CT_T_TRUE: *r = k == CV_BOOL && v->u.b; return 0;
    case CT_T_BOOLEAN: *r = k == CV_BOOL; return 0;
    case CT_T_NUMBER: *r = k == CV_INT || k == CV_FLOAT || k == CV_BOOL; return 0;
    case CT_T_INTEGER: *r = k == CV_INT; return 0;
    case CT_T_FLOAT: *r = k == CV_FLOAT; return 0;
    case CT_T_CALLABLE: *r = k == CV_MACRO; return 0;
    case CT_T_ODD: case CT_T_EVEN:
        if (k != CV_INT) return fail(C, x, "'%s' test of a %s", x->str, cv_kind_name(k));
        *r = (v->u.i % 2 != 0) == (x->op == CT_T_ODD);
        return 0;
    }
    return fail(C, x, "unsupported test");
}

/* ---- statements ---- */

static int assign(ctx *C, const ct_node *target, cv *val)
{
    if (target->kind == CT_NAME) return frame_set(C, target, C->cur, target->str, val);
    if (target->kind == CT_ATTR) {
        cv ns;
        lookup(C, target->a->str, &ns);
        if (ns.k != CV_NS) {
            cv_drop(&ns);
            cv_drop(val);
            return fail(C, target, "cannot set '%s' of a %s: only a namespace's attributes",
                        target->str, cv_kind_name(ns.k));
        }
        if (val->k == CV_MACRO) {
            cv_drop(&ns);
            return fail(C, target, "a macro cannot be stored in a namespace");
        }
        json_object_object_add(ns.u.j, target->str, cv_to_json(val));
        cv_drop(&ns);
        cv_drop(val);
        return 0;
    }
    /* tuple of names */
    if (val->k != CV_LIST || json_object_array_length(val->u.j) != target->n_kids) {
        cv_drop(val);
        return fail(C, target, "cannot unpack into %zu names", target->n_kids);
    }
    for (size_t i = 0; i < target->n_kids; i++) {
        cv e = cv_from_json(json_object_array_get_idx(val->u.j, i));
        if (frame_set(C, target->kids[i], C->cur, target->kids[i]->str, &e)) {
            cv_drop(val);
            return -1;
        }
    }
    cv_drop(val);
    return 0;
}

static int loop_var(ctx *C, const ct_node *x, json_object *items, size_t i, cv *out)
{
    size_t n = json_object_array_length(items);
    json_object *l = json_object_new_object();
    if (!l) return fail_nomem(C, x);
    json_object_object_add(l, "index", json_object_new_int64((int64_t)i + 1));
    json_object_object_add(l, "index0", json_object_new_int64((int64_t)i));
    json_object_object_add(l, "revindex", json_object_new_int64((int64_t)(n - i)));
    json_object_object_add(l, "revindex0", json_object_new_int64((int64_t)(n - i - 1)));
    json_object_object_add(l, "first", json_object_new_boolean(i == 0));
    json_object_object_add(l, "last", json_object_new_boolean(i + 1 == n));
    json_object_object_add(l, "length", json_object_new_int64((int64_t)n));
    json_object_object_add(l, "depth", json_object_new_int64(1));
    json_object_object_add(l, "depth0", json_object_new_int64(0));
    if (i > 0)
        json_object_object_add(l, "previtem", json_object_get(json_object_array_get_idx(items, i - 1)));
    if (i + 1 < n)
        json_object_object_add(l, "nextitem", json_object_get(json_object_array_get_idx(items, i + 1)));
    *out = (cv){.k = CV_DICT, .u.j = l};
    return 0;
}

static int exec_for(ctx *C, const ct_node *x)
{
    cv it, items;
    if (eval(C, x->b, &it)) return -1;
    if (it.k == CV_NONE || it.k == CV_INT || it.k == CV_FLOAT || it.k == CV_BOOL ||
        it.k == CV_NS || it.k == CV_MACRO) {
        cv_kind k = it.k;
        cv_drop(&it);
        return fail(C, x->b, "a %s is not iterable", cv_kind_name(k));
    }
    int rc = to_list(C, x->b, &it, &items);
    cv_drop(&it);
    if (rc) return -1;
    frame f = {.parent = C->cur};
    frame *saved = C->cur;
    C->cur = &f;
    if (x->c) { /* the loop's filter: items for which it holds, with the target bound */
        cv kept;
        rc = new_list(C, x, &kept);
        for (size_t i = 0; !rc && i < json_object_array_length(items.u.j); i++) {
            cv e = cv_from_json(json_object_array_get_idx(items.u.j, i)), c;
            if ((rc = assign(C, x->a, &e)) || (rc = eval(C, x->c, &c))) break;
            if (cv_truthy(&c))
                json_object_array_add(kept.u.j, json_object_get(json_object_array_get_idx(items.u.j, i)));
            cv_drop(&c);
        }
        cv_drop(&items);
        items = kept;
    }
    size_t n = rc ? 0 : json_object_array_length(items.u.j);
    for (size_t i = 0; !rc && i < n; i++) {
        if (++C->iterations > CT_MAX_ITERATIONS) {
            rc = fail(C, x, "more than %d loop iterations", CT_MAX_ITERATIONS);
            break;
        }
        cv e = cv_from_json(json_object_array_get_idx(items.u.j, i)), l;
        if ((rc = assign(C, x->a, &e)) || (rc = loop_var(C, x, items.u.j, i, &l)) ||
            (rc = frame_set(C, x, &f, "loop", &l)))
            break;
        rc = exec_body(C, x->d);
        if (C->flow == FLOW_BREAK) {
            C->flow = FLOW_NONE;
            break;
        }
        C->flow = FLOW_NONE;
    }
    C->cur = saved;
    frame_clear(&f);
    cv_drop(&items);
    if (!rc && n == 0 && x->e) rc = exec_body(C, x->e);
    return rc;
}

static int exec_stmt(ctx *C, const ct_node *x)
{
    cv v;
    switch (x->kind) {
    case CT_TEXT:
        return ct_buf_add(C->out, x->str, x->len) ? 0 : fail_nomem(C, x);
    case CT_OUTPUT: {
        if (eval(C, x->a, &v)) return -1;
        bool ok = cv_append_str(C->out, &v);
        cv_drop(&v);
        return ok ? 0 : fail_nomem(C, x);
    }
    case CT_IF:
        for (const ct_node *b = x; b;) {
            if (b->kind != CT_IF) return exec_body(C, b);
            if (eval(C, b->a, &v)) return -1;
            bool t = cv_truthy(&v);
            cv_drop(&v);
            if (t) return exec_body(C, b->b);
            b = b->c;
        }
        return 0;
    case CT_FOR: return exec_for(C, x);
    case CT_SET:
        if (eval(C, x->b, &v)) return -1;
        return assign(C, x->a, &v);
    case CT_SET_BLOCK: {
        ct_buf b = {0};
        ct_buf *saved = C->out;
        C->out = &b;
        int rc = exec_body(C, x->d);
        C->out = saved;
        if (!rc && b.over) rc = fail_nomem(C, x);
        if (!rc && !(rc = make_str(C, x, b.p ? b.p : "", b.n, &v))) rc = assign(C, x->a, &v);
        free(b.p);
        return rc;
    }
    case CT_MACRO:
        v = (cv){.k = CV_MACRO, .u.m = x};
        return frame_set(C, x, C->cur, x->str, &v);
    case CT_BREAK: C->flow = FLOW_BREAK; return 0;
    case CT_CONTINUE: C->flow = FLOW_CONTINUE; return 0;
    case CT_BODY: return exec_body(C, x);
    default: return fail(C, x, "not a statement");
    }
}

static int exec_body(ctx *C, const ct_node *body)
{
    for (size_t i = 0; i < body->n_kids; i++) {
        if (exec_stmt(C, body->kids[i])) return -1;
        if (C->flow != FLOW_NONE) return 0;
    }
    return 0;
}

int ct_eval_render(const chat_template *t, json_object *vars, ct_buf *out, char *err,
                   size_t errlen)
{
    frame top = {0};
    ctx C = {.vars = vars, .top = &top, .cur = &top, .out = out, .err = err, .errlen = errlen};
    if (errlen) err[0] = 0;
    int rc = exec_body(&C, t->root);
    if (!rc && out->over) rc = fail_nomem(&C, NULL);
    frame_clear(&top);
    return rc;
}
