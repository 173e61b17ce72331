/* The chat output splitter (chat_split.h): a byte-wise marker matcher over the streamed text,
 * a tool-call buffer, and the qwen3_coder-style conversion of a call's parameters to JSON. */
#include "model/chat_split.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/status.h"

enum { MODE_REASONING, MODE_CONTENT, MODE_TOOL };

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"
#define FUNC_OPEN "<function="
#define FUNC_CLOSE "</function>"
#define PARAM_OPEN "<parameter="
#define PARAM_CLOSE "</parameter>"
#define HOLD_MAX 16 /* longer than any marker matched byte-wise */
#define CALL_CAP0 4096

struct chat_split {
    int mode;
    bool at_start;             /* CONTENT: nothing of the output decided yet ("<think>" counts) */
    char hold[HOLD_MAX];       /* the bytes matching a marker prefix so far */
    size_t n_hold;             /* of which the first n_old came in earlier feeds */
    size_t n_old;
    char *call;                /* owned, [call_cap] a <tool_call> block's text after the marker */
    size_t call_len, call_cap;
    char *out;                 /* owned, [out_cap] a call's name, then its arguments' JSON */
    size_t out_len, out_cap;
    int n_calls;               /* tool calls emitted this request */
    size_t n_fed;              /* bytes fed this request */
    size_t reasoning_end;      /* bytes of the output through its </think>; 0 before one */
    bool finished;             /* chat_split_finish ran */
    struct json_object *tools; /* borrowed: the request's tools, or NULL */
};

static size_t lit_len(const char *s) { return strlen(s); }

chat_split *chat_split_new(void)
{
    chat_split *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->call = malloc(CALL_CAP0);
    s->out = malloc(CALL_CAP0);
    if (!s->call || !s->out) {
        chat_split_free(s);
        return NULL;
    }
    s->call_cap = s->out_cap = CALL_CAP0;
    chat_split_reset(s, false, NULL);
    return s;
}

void chat_split_free(chat_split *s)
{
    if (!s) return;
    free(s->call);
    free(s->out);
    free(s);
}

void chat_split_reset(chat_split *s, bool in_reasoning, struct json_object *tools)
{
    s->mode = in_reasoning ? MODE_REASONING : MODE_CONTENT;
    s->at_start = !in_reasoning;
    s->n_hold = s->n_old = 0;
    s->call_len = 0;
    s->n_calls = 0;
    s->n_fed = s->reasoning_end = 0;
    s->finished = false;
    s->tools = tools;
}

bool chat_split_in_reasoning(const chat_split *s) { return s->mode == MODE_REASONING; }

size_t chat_split_reasoning_end(const chat_split *s, bool *final)
{
    if (s->mode == MODE_REASONING) { /* open: all of it so far; all of it at the end */
        *final = s->finished;
        return s->finished ? SIZE_MAX : s->n_fed;
    }
    if (s->at_start && !s->finished) { /* "<think>" may still open the output */
        *final = false;
        return 0;
    }
    *final = true;
    return s->reasoning_end;
}

static int grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap;
    while (c < need) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return -1;
    *buf = b;
    *cap = c;
    return 0;
}

static void emit_text(chat_split_sink sink, void *ud, chat_piece_kind kind, const char *p, size_t n)
{
    if (n == 0) return;
    chat_piece pc = {.kind = kind, .text = p, .len = n};
    sink(ud, &pc);
}

static chat_piece_kind text_kind(const chat_split *s)
{
    return s->mode == MODE_REASONING ? CHAT_PIECE_REASONING : CHAT_PIECE_CONTENT;
}

/* ---- the arguments' JSON ------------------------------------------------------------------ */

static int out_put(chat_split *s, const char *p, size_t n)
{
    if (grow(&s->out, &s->out_cap, s->out_len + n + 1)) return -1;
    memcpy(s->out + s->out_len, p, n);
    s->out_len += n;
    s->out[s->out_len] = 0;
    return 0;
}

/* Appends p[0..n) as a JSON string (quotes included). */
static int out_json_string(chat_split *s, const char *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (grow(&s->out, &s->out_cap, s->out_len + 6 * n + 3)) return -1;
    char *o = s->out + s->out_len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c == '\n') {
            *o++ = '\\', *o++ = 'n';
        } else if (c == '\t') {
            *o++ = '\\', *o++ = 't';
        } else if (c == '\r') {
            *o++ = '\\', *o++ = 'r';
        } else if (c < 0x20) {
            memcpy(o, "\\u00", 4);
            o[4] = hex[c >> 4];
            o[5] = hex[c & 15];
            o += 6;
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    s->out_len = (size_t)(o - s->out);
    s->out[s->out_len] = 0;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The JSON type of p[0..n) (surrounding whitespace ignored) if it is exactly one JSON value,
 * else -1. */
static int json_value_type(const char *p, size_t n)
{
    while (n && is_ws(*p)) p++, n--;
    while (n && is_ws(p[n - 1])) n--;
    if (n == 0 || memchr(p, 0, n)) return -1;
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return -1;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *o = json_tokener_parse_ex(tok, p, (int)n);
    int ok = json_tokener_get_error(tok) == json_tokener_success &&
             json_tokener_get_parse_end(tok) == n; /* nothing after the value */
    if (!o && json_tokener_get_error(tok) == json_tokener_continue) {
        /* a number or literal at the end of the input is still open: a NUL closes it */
        o = json_tokener_parse_ex(tok, "", 1);
        ok = json_tokener_get_error(tok) == json_tokener_success;
    }
    int type = ok ? (o ? (int)json_object_get_type(o) : (int)json_type_null) : -1;
    json_object_put(o);
    json_tokener_free(tok);
    return type;
}

/* The declared type of parameter name[0..n) of function fn in the tools, as a NUL-terminated
 * string: NULL when there is no schema for fn, "" when fn has one that does not list it (or
 * gives no plain type: then "any"). */
static const char *param_type(const chat_split *s, const char *fn, const char *name, size_t n,
                              char *key, size_t key_cap)
{
    if (!s->tools || !json_object_is_type(s->tools, json_type_array)) return NULL;
    struct json_object *schema = NULL;
    size_t nt = json_object_array_length(s->tools);
    for (size_t i = 0; i < nt && !schema; i++) {
        struct json_object *t = json_object_array_get_idx(s->tools, i), *f, *v;
        if (!json_object_object_get_ex(t, "function", &f)) f = t;
        if (json_object_object_get_ex(f, "name", &v) && json_object_is_type(v, json_type_string) &&
            strcmp(json_object_get_string(v), fn) == 0) {
            if (!json_object_object_get_ex(f, "parameters", &schema)) return NULL;
        }
    }
    struct json_object *props, *p, *type;
    if (!schema || !json_object_object_get_ex(schema, "properties", &props) ||
        !json_object_is_type(props, json_type_object))
        return NULL;
    if (n + 1 > key_cap || memchr(name, 0, n)) return "";
    memcpy(key, name, n);
    key[n] = 0;
    if (!json_object_object_get_ex(props, key, &p)) return "";
    if (!json_object_object_get_ex(p, "type", &type) || !json_object_is_type(type, json_type_string))
        return "any";
    return json_object_get_string(type);
}

static int has_prefix(const char *s, const char *pre) { return strncmp(s, pre, strlen(pre)) == 0; }

/* Appends value v[0..n) of a parameter whose declared type is `type` (param_type's answer). */
static int out_value(chat_split *s, const char *type, const char *v, size_t n)
{
    if (n == 4 && strncasecmp(v, "null", 4) == 0) return out_put(s, "null", 4);
    if (type && type[0] == 0) return out_json_string(s, v, n); /* not in the schema */
    int jt = json_value_type(v, n);
    if (!type) /* no schema: JSON if it is */
        return jt >= 0 ? out_put(s, v, n) : out_json_string(s, v, n);
    if (!strcmp(type, "string") || !strcmp(type, "str") || !strcmp(type, "text") ||
        !strcmp(type, "varchar") || !strcmp(type, "char") || !strcmp(type, "enum"))
        return out_json_string(s, v, n);
    if (has_prefix(type, "int") || has_prefix(type, "uint") || has_prefix(type, "long") ||
        has_prefix(type, "short") || has_prefix(type, "unsigned"))
        return jt == json_type_int ? out_put(s, v, n) : out_json_string(s, v, n);
    if (has_prefix(type, "num") || has_prefix(type, "float"))
        return jt == json_type_int || jt == json_type_double ? out_put(s, v, n)
                                                             : out_json_string(s, v, n);
    if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary")) {
        if (n == 4 && strncasecmp(v, "true", 4) == 0) return out_put(s, "true", 4);
        if (n == 5 && strncasecmp(v, "false", 5) == 0) return out_put(s, "false", 5);
        return out_json_string(s, v, n);
    }
    return jt >= 0 ? out_put(s, v, n) : out_json_string(s, v, n);
}

/* ---- tool-call blocks --------------------------------------------------------------------- */

static const char *find(const char *p, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    if (end - p < (ptrdiff_t)n) return NULL;
    return memmem(p, (size_t)(end - p), lit, n);
}

/* One <function=...>...</function> at p (after whitespace) within [p, end): sets the name
 * [*name, *name_end), the body [*body, *body_end) and returns the position after it; NULL if
 * there is none. */
static const char *next_function(const char *p, const char *end, const char **name,
                                 const char **name_end, const char **body, const char **body_end)
{
    while (p < end && is_ws(*p)) p++;
    if ((size_t)(end - p) < lit_len(FUNC_OPEN) || memcmp(p, FUNC_OPEN, lit_len(FUNC_OPEN)))
        return NULL;
    *name = p + lit_len(FUNC_OPEN);
    *name_end = memchr(*name, '>', (size_t)(end - *name));
    if (!*name_end || *name_end == *name || memchr(*name, '\n', (size_t)(*name_end - *name)) ||
        memchr(*name, 0, (size_t)(*name_end - *name)))
        return NULL;
    *body = *name_end + 1;
    *body_end = find(*body, end, FUNC_CLOSE);
    if (!*body_end) return NULL;
    return *body_end + lit_len(FUNC_CLOSE);
}

/* Whether [p, end) is one or more functions and whitespace. */
static bool block_valid(const char *p, const char *end)
{
    const char *a, *b, *c, *d;
    int n = 0;
    for (;;) {
        while (p < end && is_ws(*p)) p++;
        if (p == end) return n > 0;
        if (!(p = next_function(p, end, &a, &b, &c, &d))) return false;
        n++;
    }
}

/* Builds the arguments of the function body [p, end) into s->out after the name. */
static int build_arguments(chat_split *s, const char *fn, const char *p, const char *end)
{
    char key[256];
    if (out_put(s, "{", 1)) return -1;
    int n = 0;
    const char *q;
    while ((q = find(p, end, PARAM_OPEN))) {
        const char *nm = q + lit_len(PARAM_OPEN);
        const char *nm_end = memchr(nm, '>', (size_t)(end - nm));
        if (!nm_end) break;
        const char *v = nm_end + 1, *v_end = end, *x;
        size_t skip = 0;
        if ((x = find(v, end, PARAM_CLOSE)) && x < v_end) v_end = x, skip = lit_len(PARAM_CLOSE);
        if ((x = find(v, end, PARAM_OPEN)) && x < v_end) v_end = x, skip = 0;
        p = v_end + skip;
        if (v < v_end && *v == '\n') v++;
        if (v < v_end && v_end[-1] == '\n') v_end--;
        const char *type = param_type(s, fn, nm, (size_t)(nm_end - nm), key, sizeof key);
        if ((n++ && out_put(s, ", ", 2)) || out_json_string(s, nm, (size_t)(nm_end - nm)) ||
            out_put(s, ": ", 2) || out_value(s, type, v, (size_t)(v_end - v)))
            return -1;
    }
    return out_put(s, "}", 1);
}

/* Emits the calls of the block [p, end) (block_valid). */
static int emit_calls(chat_split *s, const char *p, const char *end, chat_split_sink sink, void *ud)
{
    const char *name, *name_end, *body, *body_end;
    while ((p = next_function(p, end, &name, &name_end, &body, &body_end))) {
        s->out_len = 0;
        size_t nn = (size_t)(name_end - name);
        if (out_put(s, name, nn) || out_put(s, "", 1)) return -1; /* the name, its NUL */
        size_t args_at = s->out_len;
        if (build_arguments(s, s->out, body, body_end)) return -1;
        chat_piece pc = {.kind = CHAT_PIECE_TOOL_CALL, .name = s->out,
                         .arguments = s->out + args_at, .index = s->n_calls++};
        sink(ud, &pc);
    }
    return 0;
}

/* The block in s->call ended (its </tool_call> removed, or the output ended): emits its calls,
 * or the block as answer text when it is not well formed. */
static int end_block(chat_split *s, bool closed, chat_split_sink sink, void *ud)
{
    const char *p = s->call, *end = s->call + s->call_len;
    s->mode = MODE_CONTENT;
    s->at_start = false;
    if (block_valid(p, end)) {
        if (emit_calls(s, p, end, sink, ud) == 0) return 0;
        /* out of memory building the arguments: the text is not lost */
        emit_text(sink, ud, CHAT_PIECE_CONTENT, CALL_OPEN, lit_len(CALL_OPEN));
        emit_text(sink, ud, CHAT_PIECE_CONTENT, p, s->call_len);
        if (closed) emit_text(sink, ud, CHAT_PIECE_CONTENT, CALL_CLOSE, lit_len(CALL_CLOSE));
        return -1;
    }
    emit_text(sink, ud, CHAT_PIECE_CONTENT, CALL_OPEN, lit_len(CALL_OPEN));
    emit_text(sink, ud, CHAT_PIECE_CONTENT, p, s->call_len);
    if (closed) emit_text(sink, ud, CHAT_PIECE_CONTENT, CALL_CLOSE, lit_len(CALL_CLOSE));
    return 0;
}

/* ---- the marker matcher ------------------------------------------------------------------- */

enum { MATCH_NONE, MATCH_PREFIX, MATCH_THINK_OPEN, MATCH_THINK_CLOSE, MATCH_CALL_OPEN };

static int match_one(const char *h, size_t n, const char *lit, int full)
{
    size_t l = strlen(lit);
    if (n > l || memcmp(h, lit, n)) return MATCH_NONE;
    return n == l ? full : MATCH_PREFIX;
}

/* What the held bytes h[0..n) are in the current mode. */
static int match(const chat_split *s, const char *h, size_t n)
{
    if (s->mode == MODE_REASONING) return match_one(h, n, THINK_CLOSE, MATCH_THINK_CLOSE);
    int m = match_one(h, n, CALL_OPEN, MATCH_CALL_OPEN);
    if (m == MATCH_NONE && s->at_start) m = match_one(h, n, THINK_OPEN, MATCH_THINK_OPEN);
    return m;
}

int chat_split_feed(chat_split *s, const char *text, size_t len, chat_split_sink sink, void *ud)
{
    size_t run = 0; /* text[run..) not yet emitted (pass-through, or held) */
    int rc = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (s->mode == MODE_TOOL) {
            if (grow(&s->call, &s->call_cap, s->call_len + 1)) {
                /* what cannot be kept is passed through as answer text */
                emit_text(sink, ud, CHAT_PIECE_CONTENT, CALL_OPEN, lit_len(CALL_OPEN));
                emit_text(sink, ud, CHAT_PIECE_CONTENT, s->call, s->call_len);
                s->call_len = 0;
                s->mode = MODE_CONTENT;
                run = i;
                rc = -1;
                i--;
                continue;
            }
            s->call[s->call_len++] = c;
            size_t l = lit_len(CALL_CLOSE);
            if (c == '>' && s->call_len >= l && !memcmp(s->call + s->call_len - l, CALL_CLOSE, l)) {
                s->call_len -= l;
                if (end_block(s, true, sink, ud)) rc = -1;
                s->call_len = 0;
                run = i + 1;
            }
            continue;
        }
        if (s->n_hold == 0) {
            if (c == '<') {
                s->hold[s->n_hold++] = c;
            } else {
                s->at_start = false;
            }
            continue;
        }
        s->hold[s->n_hold] = c;
        int m = match(s, s->hold, s->n_hold + 1);
        if (m == MATCH_PREFIX) {
            s->n_hold++;
            continue;
        }
        if (m != MATCH_NONE) {
            /* the marker starts n_hold - n_old bytes before c in text (or in an earlier feed) */
            size_t at = i + 1 - (s->n_hold + 1 - s->n_old);
            emit_text(sink, ud, text_kind(s), text + run, at - run);
            s->n_hold = s->n_old = 0;
            s->at_start = false;
            run = i + 1;
            if (m == MATCH_THINK_CLOSE) {
                s->mode = MODE_CONTENT;
                s->reasoning_end = s->n_fed + i + 1;
            }
            else if (m == MATCH_THINK_OPEN) s->mode = MODE_REASONING;
            else s->mode = MODE_TOOL, s->call_len = 0;
            continue;
        }
        /* not a marker: the held bytes are text; c starts a new hold if it can */
        if (s->n_old) emit_text(sink, ud, text_kind(s), s->hold, s->n_old); /* run is 0 */
        s->n_hold = s->n_old = 0;
        s->at_start = false;
        if (c == '<') s->hold[s->n_hold++] = c;
    }
    if (s->mode != MODE_TOOL) {
        size_t held_here = s->n_hold - s->n_old;
        DS_ASSERT(len - run >= held_here);
        emit_text(sink, ud, text_kind(s), text + run, len - run - held_here);
        s->n_old = s->n_hold;
    }
    s->n_fed += len;
    return rc;
}

int chat_split_finish(chat_split *s, chat_split_sink sink, void *ud)
{
    int rc = 0;
    if (s->mode == MODE_TOOL) {
        rc = end_block(s, false, sink, ud);
        s->call_len = 0;
    } else {
        emit_text(sink, ud, text_kind(s), s->hold, s->n_hold);
    }
    s->n_hold = s->n_old = 0;
    s->finished = true;
    return rc;
}
