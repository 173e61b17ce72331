/* The chat side of a Generate stream (router_chat.h). */
#include "router/router_chat.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/router_policy.h"

#define CALL_ID_HEX 24

static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *b = realloc(*buf, c * elem);
    if (!b) return -1;
    *buf = b;
    *cap = c;
    return 0;
}

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (grow((void **)buf, cap, *len + n + 1, 1)) return -1;
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* Room for n tool calls in calls, ptrs and offs. */
static int calls_reserve(router_chat *c, size_t n)
{
    if (n <= c->calls_cap) return 0;
    size_t cap = c->calls_cap ? 2 * c->calls_cap : 4;
    while (cap < n) cap *= 2;
    void *a;
    if (!(a = realloc(c->calls, cap * sizeof *c->calls))) return -1;
    c->calls = a;
    if (!(a = realloc(c->ptrs, cap * sizeof *c->ptrs))) return -1;
    c->ptrs = a;
    if (!(a = realloc(c->offs, 3 * cap * sizeof *c->offs))) return -1;
    c->offs = a;
    c->calls_cap = cap;
    return 0;
}

bool router_chat_prompt_in_reasoning(const char *prompt, size_t len)
{
    const char *o = NULL;
    for (const char *p = prompt; (p = memmem(p, len - (size_t)(p - prompt), "<think>", 7)); p += 7)
        o = p;
    return o && !memmem(o, len - (size_t)(o - prompt), "</think>", 8);
}

/* The request's tools as OpenAI [{type: "function", function: {name, description,
 * parameters}}]. */
static int tools_json(const Deltaserve__V1__ChatPrompt *chat, struct json_object **out, status *st)
{
    *out = NULL;
    if (!chat->n_tools) return 0;
    struct json_object *a = json_object_new_array();
    if (!a) return status_fail(st, STATUS_NOMEM, "chat.tools: out of memory");
    for (size_t i = 0; i < chat->n_tools; i++) {
        const Deltaserve__V1__Tool *t = chat->tools[i];
        struct json_object *params = NULL;
        if (t->parameters && t->parameters[0]) {
            enum json_tokener_error e;
            params = json_tokener_parse_verbose(t->parameters, &e);
            if (!params || !json_object_is_type(params, json_type_object)) {
                json_object_put(params);
                json_object_put(a);
                return status_fail(st, STATUS_INVALID,
                                   "chat.tools[%zu].parameters: not a JSON object (%s)", i,
                                   params ? "another JSON value" : json_tokener_error_desc(e));
            }
        } else {
            params = json_object_new_object();
        }
        struct json_object *f = json_object_new_object(), *w = json_object_new_object();
        if (!params || !f || !w) {
            json_object_put(params);
            json_object_put(f);
            json_object_put(w);
            json_object_put(a);
            return status_fail(st, STATUS_NOMEM, "chat.tools: out of memory");
        }
        json_object_object_add(f, "name", json_object_new_string(t->name ? t->name : ""));
        json_object_object_add(f, "description",
                               json_object_new_string(t->description ? t->description : ""));
        json_object_object_add(f, "parameters", params);
        json_object_object_add(w, "type", json_object_new_string("function"));
        json_object_object_add(w, "function", f);
        json_object_array_add(a, w);
    }
    *out = a;
    return 0;
}

int router_chat_init(router_chat *c, const Deltaserve__V1__ChatPrompt *chat, bool in_reasoning,
                     size_t piece_cap, uint64_t seed, status *st)
{
    memset(c, 0, sizeof *c);
    c->rng = seed;
    int rc = tools_json(chat, &c->tools, st);
    if (rc) return rc;
    c->split = chat_split_new();
    if (!c->split || grow((void **)&c->text, &c->text_cap, piece_cap + 1, 1) ||
        grow((void **)&c->reasoning, &c->reasoning_cap, piece_cap + 1, 1) ||
        grow((void **)&c->strs, &c->strs_cap, 1024, 1) || calls_reserve(c, 4) ||
        !(c->pending = malloc(ROUTER_CHAT_PENDING * sizeof *c->pending))) {
        router_chat_free(c);
        return status_fail(st, STATUS_NOMEM, "chat: out of memory");
    }
    chat_split_reset(c->split, in_reasoning, c->tools);
    return 0;
}

void router_chat_free(router_chat *c)
{
    chat_split_free(c->split);
    json_object_put(c->tools);
    free(c->text);
    free(c->reasoning);
    free(c->strs);
    free(c->calls);
    free(c->ptrs);
    free(c->offs);
    free(c->pending);
    memset(c, 0, sizeof *c);
}

static int add_call(router_chat *c, const chat_piece *p)
{
    size_t n = c->n_calls + 1;
    if (calls_reserve(c, n)) return -1;
    char id[8 + 2 * 16];
    int k = snprintf(id, sizeof id, "call_");
    for (int i = 0; i < CALL_ID_HEX; i += 16) {
        uint64_t x = router_policy_rand(&c->rng);
        k += snprintf(id + k, sizeof id - (size_t)k, "%016llx", (unsigned long long)x);
    }
    id[5 + CALL_ID_HEX] = 0;
    size_t *o = c->offs + 3 * c->n_calls;
    o[0] = c->strs_len;
    if (append(&c->strs, &c->strs_len, &c->strs_cap, id, strlen(id) + 1)) return -1;
    o[1] = c->strs_len;
    if (append(&c->strs, &c->strs_len, &c->strs_cap, p->name, strlen(p->name) + 1)) return -1;
    o[2] = c->strs_len;
    if (append(&c->strs, &c->strs_len, &c->strs_cap, p->arguments, strlen(p->arguments) + 1))
        return -1;
    c->n_calls = n;
    return 0;
}

static void on_piece(void *ud, const chat_piece *p)
{
    router_chat *c = ud;
    int rc = 0;
    if (p->kind == CHAT_PIECE_REASONING)
        rc = append(&c->reasoning, &c->reasoning_len, &c->reasoning_cap, p->text, p->len);
    else if (p->kind == CHAT_PIECE_CONTENT)
        rc = append(&c->text, &c->text_len, &c->text_cap, p->text, p->len);
    else
        rc = add_call(c, p);
    if (rc) c->failed = 1;
}

void router_chat_token(router_chat *c, uint64_t at)
{
    if (c->reasoning_done) return; /* at >= every byte fed >= the reasoning's end */
    if (c->n_pending) {
        router_chat_pending *p =
            &c->pending[(c->pending_head + c->n_pending - 1) % ROUTER_CHAT_PENDING];
        if (p->at == at) {
            p->n++;
            return;
        }
    }
    /* the offsets pending lie in the bytes held back past what the splitter decided */
    DS_ASSERT(c->n_pending < ROUTER_CHAT_PENDING);
    router_chat_pending *p = &c->pending[(c->pending_head + c->n_pending) % ROUTER_CHAT_PENDING];
    p->at = at;
    p->n = 1;
    c->n_pending++;
}

/* Counts the pending tokens that start before the reasoning's end as far as it is known. */
static void count_reasoning(router_chat *c)
{
    if (c->reasoning_done) return;
    bool final;
    size_t end = chat_split_reasoning_end(c->split, &final);
    while (c->n_pending && c->pending[c->pending_head].at < (uint64_t)end) {
        c->reasoning_tokens += c->pending[c->pending_head].n;
        c->pending_head = (c->pending_head + 1) % ROUTER_CHAT_PENDING;
        c->n_pending--;
    }
    if (final) {
        c->reasoning_done = 1;
        c->n_pending = 0;
    }
}

uint32_t router_chat_reasoning_tokens(const router_chat *c) { return c->reasoning_tokens; }

void router_chat_begin(router_chat *c)
{
    c->text_len = c->reasoning_len = c->strs_len = c->n_calls = 0;
    c->text[0] = c->reasoning[0] = 0;
}

int router_chat_feed(router_chat *c, const char *text, size_t len)
{
    if (chat_split_feed(c->split, text, len, on_piece, c)) c->failed = 1;
    if (c->failed) return -1;
    count_reasoning(c);
    return 0;
}

int router_chat_end(router_chat *c, bool last, Deltaserve__V1__GenerateResponse *out)
{
    if (last && chat_split_finish(c->split, on_piece, c)) c->failed = 1;
    if (c->failed) return -1;
    count_reasoning(c);
    for (size_t i = 0; i < c->n_calls; i++) {
        Deltaserve__V1__ToolCall init = DELTASERVE__V1__TOOL_CALL__INIT;
        c->calls[i] = init;
        c->calls[i].id = c->strs + c->offs[3 * i];
        c->calls[i].name = c->strs + c->offs[3 * i + 1];
        c->calls[i].arguments = c->strs + c->offs[3 * i + 2];
        c->ptrs[i] = &c->calls[i];
    }
    out->text = c->text;
    out->reasoning = c->reasoning;
    out->n_tool_calls = c->n_calls;
    out->tool_calls = c->n_calls ? c->ptrs : NULL;
    return 0;
}

int router_chat_message(router_chat *c, const char *text, size_t len, bool last,
                        Deltaserve__V1__GenerateResponse *out)
{
    router_chat_begin(c);
    if (router_chat_feed(c, text, len)) return -1;
    return router_chat_end(c, last, out);
}
