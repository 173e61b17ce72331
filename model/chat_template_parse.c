/* The chat-template lexer and parser (chat_template.h): source -> tokens -> AST, with jinja2's
 * whitespace rules (trim_blocks, lstrip_blocks, `-` and `+` markers) applied in the lexer. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat_template_internal.h"

/* ---- arena ---- */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_block;

void *ct_arena_alloc(void **arena, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    arena_block *b = *arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        *arena = b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void ct_arena_free(void *arena)
{
    arena_block *b = arena;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
}

/* ---- lexer ---- */

typedef enum tok_kind {
    TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME,
    TK_STRING, TK_INT, TK_FLOAT, TK_OP,
} tok_kind;

typedef struct tok {
    tok_kind kind;
    int line, col;
    const char *s;  /* arena copy (text, name, unescaped string, operator) */
    size_t len;
    int64_t ival;
    double dval;
} tok;

typedef struct parser {
    const char *src;   /* normalised source (newlines "\n", one trailing newline dropped) */
    size_t n;
    void *arena;
    tok *toks;
    size_t n_toks, cap_toks, pos;
    size_t where_off;  /* where() resumes from this offset's line and column */
    int where_line, where_col;
    int depth;
    char *err;
    size_t errlen;
    bool failed;
} parser;

static void where(parser *P, size_t off, int *line, int *col)
{
    int l = 1, c = 1;
    size_t i = 0;
    if (off >= P->where_off) { /* tokens come in order: continue from the last one */
        i = P->where_off;
        l = P->where_line;
        c = P->where_col;
    }
    for (; i < off && i < P->n; i++) {
        if (P->src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)P->src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    P->where_off = i;
    P->where_line = l;
    P->where_col = c;
    *line = l;
    *col = c;
}

static int fail_at(parser *P, int line, int col, const char *fmt, ...)
{
    if (P->failed) return -1;
    P->failed = true;
    int k = snprintf(P->err, P->errlen, "line %d:%d: ", line, col);
    if (k < 0) k = 0;
    if ((size_t)k < P->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(P->err + k, P->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int fail_off(parser *P, size_t off, const char *fmt, const char *arg)
{
    int l, c;
    where(P, off, &l, &c);
    return fail_at(P, l, c, fmt, arg);
}

static char *arena_str(parser *P, const char *s, size_t n)
{
    char *p = ct_arena_alloc(&P->arena, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static tok *push_tok(parser *P, tok_kind k, size_t off)
{
    if (P->n_toks == P->cap_toks) {
        size_t cap = P->cap_toks ? P->cap_toks * 2 : 256;
        tok *t = realloc(P->toks, cap * sizeof *t);
        if (!t) return NULL;
        P->toks = t;
        P->cap_toks = cap;
    }
    tok *t = &P->toks[P->n_toks++];
    memset(t, 0, sizeof *t);
    t->kind = k;
    where(P, off, &t->line, &t->col);
    return t;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal at s[*p] (the quote): Python's unicode-escape rules, as jinja2 applies. */
static int lex_string(parser *P, size_t *p)
{
    const char *s = P->src;
    size_t start = *p;
    char q = s[start];
    size_t i = start + 1;
    while (i < P->n && s[i] != q) i += (s[i] == '\\' && i + 1 < P->n) ? 2 : 1;
    if (i >= P->n) return fail_off(P, start, "unterminated string literal%s", "");
    char *o = ct_arena_alloc(&P->arena, i - start + 1);
    if (!o) return fail_off(P, start, "out of memory%s", "");
    size_t k = 0;
    for (size_t j = start + 1; j < i; j++) {
        if (s[j] != '\\') {
            o[k++] = s[j];
            continue;
        }
        char e = s[++j];
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = j + 1 + (size_t)d < i ? hexval(s[j + 1 + d]) : -1;
                if (h < 0) return fail_off(P, j - 1, "bad \\%c escape in a string literal",
                                           e == 'x' ? "x" : e == 'u' ? "u" : "U");
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                return fail_off(P, j - 1, "escape %s out of the Unicode range", "");
            j += (size_t)nd;
            /* room: the escape's own bytes are at least as many as its UTF-8 (4 <= 2+nd,
               except \x, whose code point < 0x100 takes at most 2 bytes) */
            k += put_utf8(o + k, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = 0;
                int d = 0;
                while (d < 3 && j < i && s[j] >= '0' && s[j] <= '7') {
                    cp = cp * 8 + (uint32_t)(s[j] - '0');
                    j++;
                    d++;
                }
                j--;
                k += put_utf8(o + k, cp);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
    }
    o[k] = 0;
    tok *t = push_tok(P, TK_STRING, start);
    if (!t) return fail_off(P, start, "out of memory%s", "");
    t->s = o;
    t->len = k;
    *p = i + 1;
    return 0;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char OPS1[] = "+-*/%~<>=()[]{},.:|";

/* Tokens of one tag from *p up to its end marker; kind '{' or '%'. */
static int lex_tag(parser *P, size_t *p, char kind, bool *line_starting)
{
    const char *s = P->src;
    size_t i = *p;
    char close = kind == '{' ? '}' : '%';
    const tok begin = P->toks[P->n_toks - 1];
    for (;;) {
        while (i < P->n && is_ws(s[i])) i++;
        if (i >= P->n)
            return fail_at(P, begin.line, begin.col, "unterminated %s",
                           kind == '{' ? "'{{'" : "'{%'");
        /* the end marker: [-+]?%} or -?}} */
        bool minus = s[i] == '-', plus = s[i] == '+' && kind == '%';
        size_t e = i + (minus || plus);
        if (e + 1 < P->n && s[e] == close && s[e + 1] == '}') {
            if (!push_tok(P, kind == '{' ? TK_VAR_END : TK_BLOCK_END, i))
                return fail_off(P, i, "out of memory%s", "");
            e += 2;
            if (minus) {
                while (e < P->n && is_ws(s[e])) e++;
            } else if (kind == '%' && !plus && e < P->n && s[e] == '\n') {
                e++; /* trim_blocks */
            }
            *line_starting = e > 0 && s[e - 1] == '\n';
            *p = e;
            return 0;
        }
        char c = s[i];
        if (c == '\'' || c == '"') {
            if (lex_string(P, &i)) return -1;
            continue;
        }
        if (is_name_start(c)) {
            size_t j = i;
            while (j < P->n && (is_name_start(s[j]) || is_digit(s[j]))) j++;
            tok *t = push_tok(P, TK_NAME, i);
            if (!t || !(t->s = arena_str(P, s + i, j - i)))
                return fail_off(P, i, "out of memory%s", "");
            t->len = j - i;
            i = j;
            continue;
        }
        if (is_digit(c)) {
            size_t j = i;
            bool fl = false;
            while (j < P->n && (is_digit(s[j]) || s[j] == '_')) j++;
            if (j + 1 < P->n && s[j] == '.' && is_digit(s[j + 1])) {
                fl = true;
                j++;
                while (j < P->n && (is_digit(s[j]) || s[j] == '_')) j++;
            }
            if (j < P->n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < P->n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < P->n && is_digit(s[k])) {
                    fl = true;
                    j = k;
                    while (j < P->n && is_digit(s[j])) j++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t k = i; k < j && m + 1 < sizeof num; k++)
                if (s[k] != '_') num[m++] = s[k];
            num[m] = 0;
            tok *t = push_tok(P, fl ? TK_FLOAT : TK_INT, i);
            if (!t) return fail_off(P, i, "out of memory%s", "");
            if (fl) {
                t->dval = strtod(num, NULL);
            } else {
                char *end;
                unsigned long long v = strtoull(num, &end, 10);
                if (m > 18 && v > INT64_MAX)
                    return fail_off(P, i, "integer literal out of range%s", "");
                t->ival = (int64_t)v;
            }
            i = j;
            continue;
        }
        size_t olen = 0;
        for (size_t k = 0; k < sizeof OPS2 / sizeof *OPS2; k++)
            if (i + 1 < P->n && s[i] == OPS2[k][0] && s[i + 1] == OPS2[k][1]) olen = 2;
        if (!olen && strchr(OPS1, c) && c) olen = 1;
        if (!olen) {
            char ch[8];
            snprintf(ch, sizeof ch, "%c", c);
            return fail_off(P, i, "unexpected character '%s' in a tag", ch);
        }
        tok *t = push_tok(P, TK_OP, i);
        if (!t || !(t->s = arena_str(P, s + i, olen)))
            return fail_off(P, i, "out of memory%s", "");
        t->len = olen;
        i += olen;
    }
}

static int lex(parser *P)
{
    const char *s = P->src;
    size_t p = 0;
    bool line_starting = true;
    while (p < P->n) {
        size_t q = p;
        while (q + 1 < P->n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' ||
                                                   s[q + 1] == '#')))
            q++;
        if (q + 1 >= P->n) q = P->n;
        size_t text_end = q;
        char kind = q < P->n ? s[q + 1] : 0;
        if (q < P->n) {
            char sign = q + 2 < P->n ? s[q + 2] : 0;
            if (sign == '-') {
                while (text_end > p && is_ws(s[text_end - 1])) text_end--;
            } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
                size_t l = q;
                while (l > p && s[l - 1] != '\n') l--;
                bool had_nl = l > p;
                bool all_ws = l < q;
                for (size_t k = l; k < q; k++)
                    if (!is_ws(s[k])) all_ws = false;
                if ((had_nl || line_starting) && all_ws) text_end = l;
            }
        }
        if (text_end > p) {
            tok *t = push_tok(P, TK_TEXT, p);
            if (!t || !(t->s = arena_str(P, s + p, text_end - p)))
                return fail_off(P, p, "out of memory%s", "");
            t->len = text_end - p;
        }
        if (q >= P->n) break;
        size_t t = q + 2;
        if (t < P->n && (s[t] == '-' || s[t] == '+')) t++;
        if (kind == '#') {
            size_t e = t;
            while (e + 1 < P->n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= P->n) return fail_off(P, q, "unterminated comment%s", "");
            bool minus = e > t && s[e - 1] == '-';
            e += 2;
            if (minus) {
                while (e < P->n && is_ws(s[e])) e++;
            } else if (e < P->n && s[e] == '\n') {
                e++;
            }
            line_starting = s[e - 1] == '\n';
            p = e;
            continue;
        }
        if (!push_tok(P, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, q))
            return fail_off(P, q, "out of memory%s", "");
        p = t;
        if (lex_tag(P, &p, kind, &line_starting)) return -1;
    }
    if (!push_tok(P, TK_EOF, P->n)) return fail_off(P, P->n, "out of memory%s", "");
    return 0;
}

/* ---- parser ---- */

static tok *peek(parser *P) { return &P->toks[P->pos]; }
static tok *peek2(parser *P)
{
    return &P->toks[P->pos + 1 < P->n_toks ? P->pos + 1 : P->pos];
}
static tok *next(parser *P)
{
    tok *t = &P->toks[P->pos];
    if (t->kind != TK_EOF) P->pos++;
    return t;
}

static bool is_op(const tok *t, const char *op)
{
    return t->kind == TK_OP && strcmp(t->s, op) == 0;
}
static bool is_name(const tok *t, const char *name)
{
    return t->kind == TK_NAME && strcmp(t->s, name) == 0;
}

static const char *tok_desc(const tok *t)
{
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "text";
    case TK_VAR_BEGIN: return "{{";
    case TK_VAR_END: return "}}";
    case TK_BLOCK_BEGIN: return "{%";
    case TK_BLOCK_END: return "%}";
    case TK_STRING: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    default: return t->s;
    }
}

static int fail_tok(parser *P, const tok *t, const char *what)
{
    bool quote = t->kind != TK_EOF && t->kind != TK_TEXT && t->kind != TK_STRING &&
                 t->kind != TK_INT && t->kind != TK_FLOAT;
    return fail_at(P, t->line, t->col, quote ? "expected %s, found '%s'" : "expected %s, found %s",
                   what, tok_desc(t));
}

static int expect_op(parser *P, const char *op)
{
    tok *t = peek(P);
    if (!is_op(t, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op);
        return fail_tok(P, t, what);
    }
    next(P);
    return 0;
}

static ct_node *node(parser *P, ct_kind k, const tok *at)
{
    ct_node *n = ct_arena_alloc(&P->arena, sizeof *n);
    if (!n) {
        fail_at(P, at->line, at->col, "out of memory");
        return NULL;
    }
    n->kind = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* A growing list of nodes (and keyword names), copied into the arena when done. */
typedef struct nlist {
    ct_node **v;
    const char **kw;
    size_t n, cap;
    bool any_kw;
} nlist;

static int nlist_push(parser *P, nlist *l, ct_node *x, const char *kw)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        ct_node **v = realloc(l->v, cap * sizeof *v);
        if (!v) return fail_at(P, x->line, x->col, "out of memory");
        l->v = v;
        const char **k = realloc(l->kw, cap * sizeof *k);
        if (!k) return fail_at(P, x->line, x->col, "out of memory");
        l->kw = k;
        l->cap = cap;
    }
    l->v[l->n] = x;
    l->kw[l->n++] = kw;
    if (kw) l->any_kw = true;
    return 0;
}

static int nlist_finish(parser *P, nlist *l, ct_node *into)
{
    into->n_kids = l->n;
    if (l->n) {
        into->kids = ct_arena_alloc(&P->arena, l->n * sizeof *into->kids);
        if (!into->kids) return fail_at(P, into->line, into->col, "out of memory");
        memcpy(into->kids, l->v, l->n * sizeof *into->kids);
        if (l->any_kw) {
            into->kw = ct_arena_alloc(&P->arena, l->n * sizeof *into->kw);
            if (!into->kw) return fail_at(P, into->line, into->col, "out of memory");
            memcpy(into->kw, l->kw, l->n * sizeof *into->kw);
        }
    }
    free(l->v);
    free(l->kw);
    memset(l, 0, sizeof *l);
    return 0;
}

static void nlist_drop(nlist *l)
{
    free(l->v);
    free(l->kw);
}

static ct_node *parse_expr(parser *P);
static ct_node *parse_or(parser *P);
static ct_node *parse_unary(parser *P);

static bool enter(parser *P, const tok *t)
{
    if (++P->depth > CT_MAX_NEST) {
        fail_at(P, t->line, t->col, "nesting deeper than %d", CT_MAX_NEST);
        return false;
    }
    return true;
}

/* Call arguments after '(' up to ')': positional then name=value. */
static int parse_args(parser *P, ct_node *into)
{
    nlist l = {0};
    while (!is_op(peek(P), ")")) {
        if (l.n && expect_op(P, ",")) goto fail;
        if (is_op(peek(P), ")")) break;
        const char *kw = NULL;
        if (peek(P)->kind == TK_NAME && is_op(peek2(P), "=")) {
            kw = next(P)->s;
            next(P);
        } else if (l.any_kw) {
            fail_at(P, peek(P)->line, peek(P)->col, "positional argument after a keyword one");
            goto fail;
        }
        ct_node *x = parse_expr(P);
        if (!x || nlist_push(P, &l, x, kw)) goto fail;
    }
    next(P);
    return nlist_finish(P, &l, into);
fail:
    nlist_drop(&l);
    return -1;
}

static const struct {
    const char *name;
    int id;
} FILTERS[] = {
    {"trim", CT_F_TRIM},       {"length", CT_F_LENGTH},   {"count", CT_F_LENGTH},
    {"items", CT_F_ITEMS},     {"string", CT_F_STRING},   {"safe", CT_F_SAFE},
    {"tojson", CT_F_TOJSON},   {"default", CT_F_DEFAULT}, {"d", CT_F_DEFAULT},
    {"join", CT_F_JOIN},       {"first", CT_F_FIRST},     {"last", CT_F_LAST},
    {"list", CT_F_LIST},       {"lower", CT_F_LOWER},     {"upper", CT_F_UPPER},
    {"capitalize", CT_F_CAPITALIZE}, {"title", CT_F_TITLE}, {"replace", CT_F_REPLACE},
    {"int", CT_F_INT},         {"float", CT_F_FLOAT},     {"abs", CT_F_ABS},
}, TESTS[] = {
    {"string", CT_T_STRING},     {"mapping", CT_T_MAPPING}, {"iterable", CT_T_ITERABLE},
    {"sequence", CT_T_SEQUENCE}, {"defined", CT_T_DEFINED}, {"undefined", CT_T_UNDEFINED},
    {"none", CT_T_NONE},         {"false", CT_T_FALSE},     {"true", CT_T_TRUE},
    {"boolean", CT_T_BOOLEAN},   {"number", CT_T_NUMBER},   {"integer", CT_T_INTEGER},
    {"float", CT_T_FLOAT},       {"callable", CT_T_CALLABLE}, {"odd", CT_T_ODD},
    {"even", CT_T_EVEN},
};

/* Filters (`| name(args)`) and tests (`is [not] name`) after a unary operand. */
static ct_node *parse_filters(parser *P, ct_node *x)
{
    for (;;) {
        tok *t = peek(P);
        if (is_op(t, "|")) {
            next(P);
            tok *nt = next(P);
            if (nt->kind != TK_NAME) return fail_tok(P, nt, "a filter name"), NULL;
            int id = -1;
            for (size_t i = 0; i < sizeof FILTERS / sizeof *FILTERS; i++)
                if (strcmp(FILTERS[i].name, nt->s) == 0) id = FILTERS[i].id;
            if (id < 0) {
                fail_at(P, nt->line, nt->col, "unsupported filter '%s'", nt->s);
                return NULL;
            }
            ct_node *f = node(P, CT_FILTER, nt);
            if (!f) return NULL;
            f->op = id;
            f->str = nt->s;
            f->a = x;
            if (is_op(peek(P), "(")) {
                next(P);
                if (parse_args(P, f)) return NULL;
            }
            x = f;
        } else if (is_name(t, "is")) {
            next(P);
            bool neg = false;
            if (is_name(peek(P), "not")) {
                next(P);
                neg = true;
            }
            tok *nt = next(P);
            const char *name = nt->kind == TK_NAME ? nt->s : NULL;
            if (!name) return fail_tok(P, nt, "a test name"), NULL;
            int id = -1;
            for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++)
                if (strcmp(TESTS[i].name, name) == 0) id = TESTS[i].id;
            if (id < 0) {
                fail_at(P, nt->line, nt->col, "unsupported test '%s'", name);
                return NULL;
            }
            ct_node *f = node(P, CT_TEST, nt);
            if (!f) return NULL;
            f->op = id;
            f->str = name;
            f->ival = neg;
            f->a = x;
            x = f;
        } else {
            return x;
        }
    }
}

/* Literals, names, parenthesised expressions, lists, dicts; then . [] () postfixes. */
static ct_node *parse_primary(parser *P)
{
    tok *t = next(P);
    ct_node *x = NULL;
    switch (t->kind) {
    case TK_STRING: {
        /* adjacent literals concatenate */
        size_t n = t->len;
        size_t j = P->pos;
        while (P->toks[j].kind == TK_STRING) n += P->toks[j++].len;
        char *s = ct_arena_alloc(&P->arena, n + 1);
        if (!(x = node(P, CT_LIT_STR, t)) || !s) return NULL;
        memcpy(s, t->s, t->len);
        size_t k = t->len;
        while (peek(P)->kind == TK_STRING) {
            tok *u = next(P);
            memcpy(s + k, u->s, u->len);
            k += u->len;
        }
        x->str = s;
        x->len = n;
        break;
    }
    case TK_INT:
        if (!(x = node(P, CT_LIT_INT, t))) return NULL;
        x->ival = t->ival;
        break;
    case TK_FLOAT:
        if (!(x = node(P, CT_LIT_FLOAT, t))) return NULL;
        x->dval = t->dval;
        break;
    case TK_NAME:
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") ||
            !strcmp(t->s, "False")) {
            if (!(x = node(P, CT_LIT_BOOL, t))) return NULL;
            x->ival = t->s[0] == 't' || t->s[0] == 'T';
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            if (!(x = node(P, CT_LIT_NONE, t))) return NULL;
        } else {
            if (!(x = node(P, CT_NAME, t))) return NULL;
            x->str = t->s;
            x->len = t->len;
        }
        break;
    case TK_OP:
        if (is_op(t, "(")) {
            if (is_op(peek(P), ")")) {
                next(P);
                if (!(x = node(P, CT_TUPLE, t))) return NULL;
                break;
            }
            ct_node *first = parse_expr(P);
            if (!first) return NULL;
            if (is_op(peek(P), ",")) {
                nlist l = {0};
                if (!(x = node(P, CT_TUPLE, t)) || nlist_push(P, &l, first, NULL)) {
                    nlist_drop(&l);
                    return NULL;
                }
                while (is_op(peek(P), ",")) {
                    next(P);
                    if (is_op(peek(P), ")")) break;
                    ct_node *y = parse_expr(P);
                    if (!y || nlist_push(P, &l, y, NULL)) {
                        nlist_drop(&l);
                        return NULL;
                    }
                }
                if (nlist_finish(P, &l, x)) return NULL;
            } else {
                x = first;
            }
            if (expect_op(P, ")")) return NULL;
        } else if (is_op(t, "[") || is_op(t, "{")) {
            bool dict = is_op(t, "{");
            const char *close = dict ? "}" : "]";
            nlist l = {0};
            if (!(x = node(P, dict ? CT_DICT : CT_LIST, t))) return NULL;
            while (!is_op(peek(P), close)) {
                if (l.n && expect_op(P, ",")) goto fail_list;
                if (is_op(peek(P), close)) break;
                ct_node *y = parse_expr(P);
                if (!y || nlist_push(P, &l, y, NULL)) goto fail_list;
                if (dict) {
                    if (expect_op(P, ":")) goto fail_list;
                    ct_node *v = parse_expr(P);
                    if (!v || nlist_push(P, &l, v, NULL)) goto fail_list;
                }
            }
            next(P);
            if (nlist_finish(P, &l, x)) return NULL;
            break;
        fail_list:
            nlist_drop(&l);
            return NULL;
        } else {
            return fail_tok(P, t, "an expression"), NULL;
        }
        break;
    default:
        return fail_tok(P, t, "an expression"), NULL;
    }
    /* postfixes */
    for (;;) {
        tok *u = peek(P);
        if (is_op(u, ".")) {
            next(P);
            tok *nt = next(P);
            ct_node *y;
            if (nt->kind == TK_NAME) {
                if (!(y = node(P, CT_ATTR, nt))) return NULL;
                y->str = nt->s;
                y->len = nt->len;
            } else if (nt->kind == TK_INT) {
                if (!(y = node(P, CT_INDEX, nt))) return NULL;
                if (!(y->b = node(P, CT_LIT_INT, nt))) return NULL;
                y->b->ival = nt->ival;
            } else {
                return fail_tok(P, nt, "an attribute name"), NULL;
            }
            y->a = x;
            x = y;
        } else if (is_op(u, "[")) {
            next(P);
            ct_node *parts[3] = {NULL, NULL, NULL};
            int n_colon = 0;
            for (;;) {
                tok *v = peek(P);
                if (is_op(v, "]")) break;
                if (is_op(v, ":")) {
                    if (++n_colon > 2) return fail_tok(P, v, "']'"), NULL;
                    next(P);
                    continue;
                }
                if (parts[n_colon]) return fail_tok(P, v, "':' or ']'"), NULL;
                if (!(parts[n_colon] = parse_expr(P))) return NULL;
            }
            next(P);
            ct_node *y;
            if (n_colon == 0) {
                if (!parts[0]) return fail_at(P, u->line, u->col, "empty subscript"), NULL;
                if (!(y = node(P, CT_INDEX, u))) return NULL;
                y->b = parts[0];
            } else {
                if (!(y = node(P, CT_SLICE, u))) return NULL;
                y->b = parts[0];
                y->c = parts[1];
                y->d = parts[2];
            }
            y->a = x;
            x = y;
        } else if (is_op(u, "(")) {
            next(P);
            ct_node *y = node(P, CT_CALL, u);
            if (!y) return NULL;
            y->a = x;
            if (parse_args(P, y)) return NULL;
            x = y;
        } else {
            return x;
        }
    }
}

static ct_node *parse_unary(parser *P)
{
    tok *t = peek(P);
    if (!enter(P, t)) return NULL;
    ct_node *x;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(P);
        ct_node *y = parse_unary(P);
        if (!y || !(x = node(P, CT_NEG, t))) return NULL;
        x->op = t->s[0];
        x->a = y;
    } else {
        x = parse_primary(P);
    }
    if (x) x = parse_filters(P, x);
    P->depth--;
    return x;
}

static ct_node *binop(parser *P, const tok *t, int op, ct_node *a, ct_node *b)
{
    ct_node *x = node(P, CT_BINOP, t);
    if (!x) return NULL;
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static ct_node *parse_pow(parser *P)
{
    ct_node *x = parse_unary(P);
    while (x && is_op(peek(P), "**")) {
        tok *t = next(P);
        ct_node *y = parse_unary(P);
        x = y ? binop(P, t, CT_OP_POW, x, y) : NULL;
    }
    return x;
}

static ct_node *parse_math2(parser *P)
{
    ct_node *x = parse_pow(P);
    for (;;) {
        tok *t = peek(P);
        int op = is_op(t, "*") ? CT_OP_MUL : is_op(t, "/") ? CT_OP_DIV
               : is_op(t, "//") ? CT_OP_FLOORDIV : is_op(t, "%") ? CT_OP_MOD : -1;
        if (!x || op < 0) return x;
        next(P);
        ct_node *y = parse_pow(P);
        x = y ? binop(P, t, op, x, y) : NULL;
    }
}

static ct_node *parse_concat(parser *P)
{
    ct_node *x = parse_math2(P);
    while (x && is_op(peek(P), "~")) {
        tok *t = next(P);
        ct_node *y = parse_math2(P);
        x = y ? binop(P, t, CT_OP_CONCAT, x, y) : NULL;
    }
    return x;
}

static ct_node *parse_math1(parser *P)
{
    ct_node *x = parse_concat(P);
    for (;;) {
        tok *t = peek(P);
        int op = is_op(t, "+") ? CT_OP_ADD : is_op(t, "-") ? CT_OP_SUB : -1;
        if (!x || op < 0) return x;
        next(P);
        ct_node *y = parse_concat(P);
        x = y ? binop(P, t, op, x, y) : NULL;
    }
}

static ct_node *parse_compare(parser *P)
{
    ct_node *x = parse_math1(P);
    for (;;) {
        tok *t = peek(P);
        int op = is_op(t, "==") ? CT_OP_EQ : is_op(t, "!=") ? CT_OP_NE
               : is_op(t, "<") ? CT_OP_LT : is_op(t, ">") ? CT_OP_GT
               : is_op(t, "<=") ? CT_OP_LE : is_op(t, ">=") ? CT_OP_GE
               : is_name(t, "in") ? CT_OP_IN
               : (is_name(t, "not") && is_name(peek2(P), "in")) ? CT_OP_NOTIN : -1;
        if (!x || op < 0) return x;
        next(P);
        if (op == CT_OP_NOTIN) next(P);
        ct_node *y = parse_math1(P);
        x = y ? binop(P, t, op, x, y) : NULL;
    }
}

static ct_node *parse_not(parser *P)
{
    tok *t = peek(P);
    if (is_name(t, "not")) {
        next(P);
        if (!enter(P, t)) return NULL;
        ct_node *y = parse_not(P);
        P->depth--;
        ct_node *x = y ? node(P, CT_NOT, t) : NULL;
        if (x) x->a = y;
        return x;
    }
    return parse_compare(P);
}

static ct_node *parse_and(parser *P)
{
    ct_node *x = parse_not(P);
    while (x && is_name(peek(P), "and")) {
        tok *t = next(P);
        ct_node *y = parse_not(P);
        ct_node *z = y ? node(P, CT_AND, t) : NULL;
        if (z) {
            z->a = x;
            z->b = y;
        }
        x = z;
    }
    return x;
}

static ct_node *parse_or(parser *P)
{
    ct_node *x = parse_and(P);
    while (x && is_name(peek(P), "or")) {
        tok *t = next(P);
        ct_node *y = parse_and(P);
        ct_node *z = y ? node(P, CT_OR, t) : NULL;
        if (z) {
            z->a = x;
            z->b = y;
        }
        x = z;
    }
    return x;
}

/* or-expression [if or-expression [else expression]] */
static ct_node *parse_expr(parser *P)
{
    tok *t0 = peek(P);
    if (!enter(P, t0)) return NULL;
    ct_node *x = parse_or(P);
    while (x && is_name(peek(P), "if")) {
        tok *t = next(P);
        ct_node *c = node(P, CT_COND, t);
        if (!c || !(c->a = parse_or(P))) {
            x = NULL;
            break;
        }
        c->b = x;
        if (is_name(peek(P), "else")) {
            next(P);
            if (!(c->c = parse_or(P))) {
                x = NULL;
                break;
            }
        }
        x = c;
    }
    P->depth--;
    return x;
}

/* ---- statements ---- */

static int expect_block_end(parser *P)
{
    tok *t = peek(P);
    if (t->kind != TK_BLOCK_END) return fail_tok(P, t, "'%}'");
    next(P);
    return 0;
}

/* A name or a comma-separated tuple of names (for and set targets). */
static ct_node *parse_target(parser *P, bool allow_attr)
{
    tok *t = next(P);
    if (t->kind != TK_NAME) return fail_tok(P, t, "a variable name"), NULL;
    ct_node *x = node(P, CT_NAME, t);
    if (!x) return NULL;
    x->str = t->s;
    x->len = t->len;
    if (allow_attr && is_op(peek(P), ".")) {
        next(P);
        tok *a = next(P);
        if (a->kind != TK_NAME) return fail_tok(P, a, "an attribute name"), NULL;
        ct_node *y = node(P, CT_ATTR, a);
        if (!y) return NULL;
        y->a = x;
        y->str = a->s;
        y->len = a->len;
        return y;
    }
    if (!is_op(peek(P), ",")) return x;
    ct_node *tu = node(P, CT_TUPLE, t);
    nlist l = {0};
    if (!tu || nlist_push(P, &l, x, NULL)) goto fail;
    while (is_op(peek(P), ",")) {
        next(P);
        tok *u = next(P);
        if (u->kind != TK_NAME) {
            fail_tok(P, u, "a variable name");
            goto fail;
        }
        ct_node *y = node(P, CT_NAME, u);
        if (!y) goto fail;
        y->str = u->s;
        y->len = u->len;
        if (nlist_push(P, &l, y, NULL)) goto fail;
    }
    if (nlist_finish(P, &l, tu)) return NULL;
    return tu;
fail:
    nlist_drop(&l);
    return NULL;
}

static ct_node *parse_body(parser *P, const char *const *ends, const char **found);

static ct_node *parse_if(parser *P, const tok *t)
{
    ct_node *x = node(P, CT_IF, t);
    if (!x || !(x->a = parse_expr(P)) || expect_block_end(P)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *found;
    if (!(x->b = parse_body(P, ends, &found))) return NULL;
    if (!strcmp(found, "elif")) {
        tok *e = &P->toks[P->pos - 1];
        if (!(x->c = parse_if(P, e))) return NULL;
        return x; /* the nested if consumed endif */
    }
    if (!strcmp(found, "else")) {
        if (expect_block_end(P)) return NULL;
        static const char *const ends2[] = {"endif", NULL};
        if (!(x->c = parse_body(P, ends2, &found))) return NULL;
    }
    return expect_block_end(P) ? NULL : x;
}

static ct_node *parse_for(parser *P, const tok *t)
{
    ct_node *x = node(P, CT_FOR, t);
    if (!x || !(x->a = parse_target(P, false))) return NULL;
    if (!is_name(peek(P), "in")) return fail_tok(P, peek(P), "'in'"), NULL;
    next(P);
    if (!(x->b = parse_or(P))) return NULL;
    if (is_name(peek(P), "if")) {
        next(P);
        if (!(x->c = parse_expr(P))) return NULL;
    }
    if (is_name(peek(P), "recursive")) {
        tok *r = peek(P);
        fail_at(P, r->line, r->col, "unsupported: recursive loops");
        return NULL;
    }
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *found;
    if (!(x->d = parse_body(P, ends, &found))) return NULL;
    if (!strcmp(found, "else")) {
        if (expect_block_end(P)) return NULL;
        static const char *const ends2[] = {"endfor", NULL};
        if (!(x->e = parse_body(P, ends2, &found))) return NULL;
    }
    return expect_block_end(P) ? NULL : x;
}

static ct_node *parse_set(parser *P, const tok *t)
{
    ct_node *target = parse_target(P, true);
    if (!target) return NULL;
    if (is_op(peek(P), "=")) {
        next(P);
        ct_node *x = node(P, CT_SET, t);
        if (!x) return NULL;
        x->a = target;
        if (!(x->b = parse_expr(P)) || expect_block_end(P)) return NULL;
        return x;
    }
    if (target->kind != CT_NAME)
        return fail_at(P, target->line, target->col, "a block set needs a plain name"), NULL;
    ct_node *x = node(P, CT_SET_BLOCK, t);
    if (!x || expect_block_end(P)) return NULL;
    x->a = target;
    static const char *const ends[] = {"endset", NULL};
    const char *found;
    if (!(x->d = parse_body(P, ends, &found))) return NULL;
    return expect_block_end(P) ? NULL : x;
}

static ct_node *parse_macro(parser *P, const tok *t)
{
    tok *nt = next(P);
    if (nt->kind != TK_NAME) return fail_tok(P, nt, "a macro name"), NULL;
    ct_node *x = node(P, CT_MACRO, nt);
    if (!x || expect_op(P, "(")) return NULL;
    x->str = nt->s;
    x->len = nt->len;
    nlist l = {0};
    while (!is_op(peek(P), ")")) {
        if (l.n && expect_op(P, ",")) goto fail;
        tok *pt = next(P);
        if (pt->kind != TK_NAME) {
            fail_tok(P, pt, "a parameter name");
            goto fail;
        }
        ct_node *p = node(P, CT_NAME, pt);
        if (!p) goto fail;
        p->str = pt->s;
        p->len = pt->len;
        if (is_op(peek(P), "=")) {
            next(P);
            if (!(p->a = parse_expr(P))) goto fail;
        }
        if (nlist_push(P, &l, p, NULL)) goto fail;
    }
    next(P);
    if (nlist_finish(P, &l, x) || expect_block_end(P)) return NULL;
    (void)t;
    static const char *const ends[] = {"endmacro", NULL};
    const char *found;
    if (!(x->d = parse_body(P, ends, &found))) return NULL;
    if (peek(P)->kind == TK_NAME) next(P); /* {% endmacro name %} */
    return expect_block_end(P) ? NULL : x;
fail:
    nlist_drop(&l);
    return NULL;
}

/* One statement after '{%' (the current token is its keyword). */
static ct_node *parse_statement(parser *P)
{
    tok *t = next(P);
    if (t->kind != TK_NAME) return fail_tok(P, t, "a statement"), NULL;
    if (!enter(P, t)) return NULL;
    ct_node *x = NULL;
    if (!strcmp(t->s, "if")) {
        x = parse_if(P, t);
    } else if (!strcmp(t->s, "for")) {
        x = parse_for(P, t);
    } else if (!strcmp(t->s, "set")) {
        x = parse_set(P, t);
    } else if (!strcmp(t->s, "macro")) {
        x = parse_macro(P, t);
    } else if (!strcmp(t->s, "break") || !strcmp(t->s, "continue")) {
        x = node(P, t->s[0] == 'b' ? CT_BREAK : CT_CONTINUE, t);
        if (x && expect_block_end(P)) x = NULL;
    } else if (!strcmp(t->s, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        const char *found;
        if (!expect_block_end(P)) x = parse_body(P, ends, &found);
        if (x && expect_block_end(P)) x = NULL;
    } else {
        fail_at(P, t->line, t->col, "unsupported statement '%s'", t->s);
    }
    P->depth--;
    return x;
}

/* Statements until '{% <one of ends> ' (left with that keyword consumed; *found names it) or,
 * with ends NULL, the end of the template. */
static ct_node *parse_body(parser *P, const char *const *ends, const char **found)
{
    tok *t0 = peek(P);
    ct_node *body = node(P, CT_BODY, t0);
    nlist l = {0};
    if (!body) return NULL;
    for (;;) {
        tok *t = peek(P);
        ct_node *x = NULL;
        if (t->kind == TK_EOF) {
            if (ends) {
                size_t k = 0;
                while (ends[k + 1]) k++;
                fail_at(P, t->line, t->col, "unexpected end of template, expected '{%% %s %%}'",
                        ends[k]);
                goto fail;
            }
            break;
        }
        if (t->kind == TK_TEXT) {
            next(P);
            if (!(x = node(P, CT_TEXT, t))) goto fail;
            x->str = t->s;
            x->len = t->len;
        } else if (t->kind == TK_VAR_BEGIN) {
            next(P);
            if (!(x = node(P, CT_OUTPUT, t)) || !(x->a = parse_expr(P))) goto fail;
            tok *e = next(P);
            if (e->kind != TK_VAR_END) {
                fail_tok(P, e, "'}}'");
                goto fail;
            }
        } else if (t->kind == TK_BLOCK_BEGIN) {
            tok *kw = peek2(P);
            bool is_end = false;
            for (size_t i = 0; ends && ends[i]; i++)
                if (is_name(kw, ends[i])) {
                    *found = ends[i];
                    is_end = true;
                }
            if (is_end) {
                next(P);
                next(P);
                break;
            }
            if (kw->kind == TK_NAME &&
                (!strncmp(kw->s, "end", 3) || !strcmp(kw->s, "else") || !strcmp(kw->s, "elif"))) {
                fail_at(P, kw->line, kw->col, "unexpected '%s'", kw->s);
                goto fail;
            }
            next(P);
            if (!(x = parse_statement(P))) goto fail;
        } else {
            fail_tok(P, t, "text or a tag");
            goto fail;
        }
        if (nlist_push(P, &l, x, NULL)) goto fail;
    }
    if (nlist_finish(P, &l, body)) return NULL;
    return body;
fail:
    nlist_drop(&l);
    return NULL;
}

int chat_template_parse(const char *src, size_t len, chat_template **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    if (errlen) err[0] = 0;
    parser P = {.err = err, .errlen = errlen, .where_line = 1, .where_col = 1};
    char *norm = malloc(len + 1);
    if (!norm) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* jinja2 reads the source line by line: "\r\n" and "\r" become "\n", and the final line
       break is dropped (keep_trailing_newline off). */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    P.src = norm;
    P.n = n;
    chat_template *t = calloc(1, sizeof *t);
    int rc = -1;
    if (!t) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    if (memchr(norm, 0, n)) {
        fail_off(&P, (size_t)((const char *)memchr(norm, 0, n) - norm),
                 "a NUL byte in the template%s", "");
        goto done;
    }
    if (lex(&P)) goto done;
    const char *found = NULL;
    ct_node *root = parse_body(&P, NULL, &found);
    if (!root) goto done;
    t->root = root;
    t->arena = P.arena;
    P.arena = NULL;
    *out = t;
    t = NULL;
    rc = 0;
done:
    free(t);
    ct_arena_free(P.arena);
    free(P.toks);
    free(norm);
    return rc;
}

void chat_template_free(chat_template *t)
{
    if (!t) return;
    ct_arena_free(t->arena);
    free(t);
}
