/* Internals of the chat-template renderer (chat_template.h): the AST the parser builds, the
 * values the evaluator computes with, and the helpers the three files share. */
#ifndef DS_MODEL_CHAT_TEMPLATE_INTERNAL_H
#define DS_MODEL_CHAT_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#include "model/chat_template.h"

#define CT_MAX_NEST 256          /* parse nesting (expressions and blocks) */
#define CT_MAX_CALL_DEPTH 64     /* macro calls within macro calls */
#define CT_MAX_ITERATIONS 1000000 /* loop iterations per render */
#define CT_MAX_OUTPUT ((size_t)64 << 20)        /* bytes of one output or string */
#define CT_MAX_STRING_BYTES ((size_t)256 << 20) /* bytes of all strings one render makes */

typedef enum ct_kind {
    /* expressions */
    CT_LIT_STR,  /* str, len */
    CT_LIT_INT,  /* ival */
    CT_LIT_FLOAT, /* dval */
    CT_LIT_BOOL, /* ival */
    CT_LIT_NONE,
    CT_NAME,     /* str */
    CT_ATTR,     /* a.str */
    CT_INDEX,    /* a[b] */
    CT_SLICE,    /* a[b:c:d], any of b, c, d NULL */
    CT_CALL,     /* a(kids; kw[i] names a keyword argument) */
    CT_FILTER,   /* a | op(kids) */
    CT_TEST,     /* a is [not] op(kids); ival = negated */
    CT_NOT,      /* not a */
    CT_NEG,      /* -a (op '-') or +a (op '+') */
    CT_BINOP,    /* a op b: op is one of CT_OP_* */
    CT_AND,
    CT_OR,
    CT_COND,     /* b if a else c (c NULL: undefined) */
    CT_LIST,     /* [kids] */
    CT_TUPLE,    /* (kids) */
    CT_DICT,     /* {kids[2i]: kids[2i+1]} */
    /* statements */
    CT_BODY,     /* kids in order */
    CT_TEXT,     /* str, len */
    CT_OUTPUT,   /* {{ a }} */
    CT_IF,       /* if a: b else c (c a CT_BODY, a CT_IF for elif, or NULL) */
    CT_FOR,      /* for a (CT_NAME or CT_TUPLE of names) in b [if c]: d else e */
    CT_SET,      /* a (CT_NAME, CT_ATTR of a CT_NAME, or CT_TUPLE of names) = b */
    CT_SET_BLOCK, /* a (CT_NAME) = rendered d */
    CT_MACRO,    /* str(kids: CT_NAME params, a = default or NULL): d */
    CT_BREAK,
    CT_CONTINUE,
} ct_kind;

typedef enum ct_op {
    CT_OP_ADD, CT_OP_SUB, CT_OP_MUL, CT_OP_DIV, CT_OP_FLOORDIV, CT_OP_MOD, CT_OP_POW,
    CT_OP_CONCAT, CT_OP_EQ, CT_OP_NE, CT_OP_LT, CT_OP_GT, CT_OP_LE, CT_OP_GE, CT_OP_IN,
    CT_OP_NOTIN,
} ct_op;

typedef enum ct_filter {
    CT_F_TRIM, CT_F_LENGTH, CT_F_ITEMS, CT_F_STRING, CT_F_SAFE, CT_F_TOJSON, CT_F_DEFAULT,
    CT_F_JOIN, CT_F_FIRST, CT_F_LAST, CT_F_LIST, CT_F_LOWER, CT_F_UPPER, CT_F_CAPITALIZE,
    CT_F_TITLE, CT_F_REPLACE, CT_F_INT, CT_F_FLOAT, CT_F_ABS,
} ct_filter;

typedef enum ct_test {
    CT_T_STRING, CT_T_MAPPING, CT_T_ITERABLE, CT_T_SEQUENCE, CT_T_DEFINED, CT_T_UNDEFINED,
    CT_T_NONE, CT_T_FALSE, CT_T_TRUE, CT_T_BOOLEAN, CT_T_NUMBER, CT_T_INTEGER, CT_T_FLOAT,
    CT_T_CALLABLE, CT_T_ODD, CT_T_EVEN,
} ct_test;

typedef struct ct_node ct_node;
struct ct_node {
    ct_kind kind;
    int op;                 /* ct_op, ct_filter or ct_test */
    int line, col;          /* of the construct, 1-based */
    const char *str;        /* arena, NUL-terminated; a name or text */
    size_t len;
    int64_t ival;
    double dval;
    ct_node *a, *b, *c, *d, *e;
    ct_node **kids;         /* arena, [n_kids] */
    const char **kw;        /* arena, [n_kids] keyword names (NULL: positional), or NULL */
    size_t n_kids;
};

struct chat_template {
    void *arena;            /* owned: a chain of blocks holding every node and string */
    ct_node *root;          /* CT_BODY */
};

/* Arena allocation (chat_template_parse.c). NULL when out of memory. */
void *ct_arena_alloc(void **arena, size_t n);
void ct_arena_free(void *arena);

/* ---- values (chat_template_value.c) ---- */

typedef enum cv_kind {
    CV_UNDEF, CV_NONE, CV_BOOL, CV_INT, CV_FLOAT, CV_STR, CV_LIST, CV_DICT, CV_NS, CV_MACRO,
} cv_kind;

/* A value: scalars inline; strings, lists, dicts and namespaces as one json-c reference the
 * value owns (cv_drop puts it); a macro as its node. */
typedef struct cv {
    cv_kind k;
    union {
        bool b;
        int64_t i;
        double d;
        json_object *j;
        const ct_node *m;
    } u;
} cv;

/* A growable byte buffer with a size bound. */
typedef struct ct_buf {
    char *p;
    size_t n, cap;
    bool over;              /* an append failed (out of memory or past CT_MAX_OUTPUT) */
} ct_buf;

bool ct_buf_add(ct_buf *b, const char *s, size_t n);
static inline bool ct_buf_adds(ct_buf *b, const char *s);

cv cv_undef(void);
cv cv_none(void);
cv cv_bool(bool b);
cv cv_int(int64_t i);
cv cv_float(double d);
cv cv_str(const char *s, size_t n);       /* copies; k CV_NONE when out of memory */
cv cv_from_json(json_object *j);          /* takes a new reference */
json_object *cv_to_json(const cv *v);     /* a new reference (NULL for none/undefined) */
cv cv_dup(const cv *v);
void cv_drop(cv *v);
bool cv_truthy(const cv *v);
const char *cv_kind_name(cv_kind k);
/* Python str(v) appended (undefined: nothing; None, True, floats and containers as Python
 * prints them). */
bool cv_append_str(ct_buf *b, const cv *v);
/* json.dumps(v, ensure_ascii=False, indent, sort_keys) appended; indent < 0: none. */
bool cv_append_json(ct_buf *b, const cv *v, int indent, bool sort_keys);
bool cv_equal(const cv *a, const cv *b);
/* Python whitespace (str.strip's set) at s[0..n): the length of the character, 0 if not. */
size_t ct_space_len(const char *s, size_t n);
/* Code points in s[0..n) (UTF-8; a stray byte counts as one). */
size_t ct_utf8_count(const char *s, size_t n);
/* Byte offset of code point index cp in s[0..n) (n when past the end). */
size_t ct_utf8_offset(const char *s, size_t n, size_t cp);

static inline bool ct_buf_adds(ct_buf *b, const char *s)
{
    size_t n = 0;
    while (s[n]) n++;
    return ct_buf_add(b, s, n);
}

/* ---- evaluation (chat_template_eval.c) ---- */

/* Renders root with vars; 0 or -1 with err. */
int ct_eval_render(const chat_template *t, json_object *vars, ct_buf *out, char *err,
                   size_t errlen);

#endif
