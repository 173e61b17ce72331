#include "router/router_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "common/utf8.h"
#include "router/router_stop.h"
#include "rpc/rpc_sampling.h"

static int check_ids(const char *field, const int32_t *ids, size_t n, const tokenizer *tok,
                     status *st)
{
    size_t v = tok ? tokenizer_n_vocab(tok) : 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0)
            return status_fail(st, STATUS_INVALID, "%s[%zu]: id %d is negative", field, i, ids[i]);
        if (tok && (size_t)ids[i] >= v)
            return status_fail(st, STATUS_INVALID, "%s[%zu]: id %d is not below the vocabulary "
                               "size %zu", field, i, ids[i], v);
    }
    return 0;
}

int router_request_validate(const Deltaserve__V1__GenerateRequest *g, const tokenizer *tok,
                            status *st)
{
    if (strlen(g->request_id) > ROUTER_REQUEST_ID_MAX)
        return status_fail(st, STATUS_INVALID, "request_id: %zu bytes, at most %d",
                           strlen(g->request_id), ROUTER_REQUEST_ID_MAX);
    if (!utf8_valid(g->request_id, strlen(g->request_id))) /* it is echoed in every response */
        return status_fail(st, STATUS_INVALID, "request_id: not valid UTF-8");
    switch (g->prompt_case) {
    case DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT:
        if (!g->text[0]) return status_fail(st, STATUS_INVALID, "text: the prompt is empty");
        if (!tok)
            return status_fail(st, STATUS_INVALID,
                               "text: this router has no tokenizer (start it with --model); "
                               "send token_ids");
        if (!utf8_valid(g->text, strlen(g->text)))
            return status_fail(st, STATUS_INVALID, "text: not valid UTF-8");
        break;
    case DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS:
        if (!g->token_ids || g->token_ids->n_ids == 0)
            return status_fail(st, STATUS_INVALID, "token_ids.ids: the prompt is empty");
        if (check_ids("token_ids.ids", g->token_ids->ids, g->token_ids->n_ids, tok, st))
            return STATUS_INVALID;
        break;
    case DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT:
        if (!g->chat || g->chat->n_messages == 0)
            return status_fail(st, STATUS_INVALID, "chat.messages: no messages");
        if (!tok)
            return status_fail(st, STATUS_INVALID,
                               "chat: this router has no tokenizer (start it with --model)");
        for (size_t i = 0; i < g->chat->n_messages; i++) {
            const Deltaserve__V1__ChatMessage *m = g->chat->messages[i];
            /* which roles exist is the template's to say (raise_exception) */
            if (!m->role[0])
                return status_fail(st, STATUS_INVALID, "chat.messages[%zu].role: empty", i);
            const char *texts[] = {m->role, m->content, m->reasoning_content, m->tool_call_id,
                                   m->name};
            for (size_t k = 0; k < sizeof texts / sizeof *texts; k++)
                if (!utf8_valid(texts[k], strlen(texts[k])))
                    return status_fail(st, STATUS_INVALID, "chat.messages[%zu]: not valid UTF-8",
                                       i);
            for (size_t k = 0; k < m->n_tool_calls; k++)
                if (!m->tool_calls[k]->name[0])
                    return status_fail(st, STATUS_INVALID,
                                       "chat.messages[%zu].tool_calls[%zu].name: empty", i, k);
        }
        for (size_t i = 0; i < g->chat->n_tools; i++)
            if (!g->chat->tools[i]->name[0])
                return status_fail(st, STATUS_INVALID, "chat.tools[%zu].name: empty", i);
        break;
    default:
        return status_fail(st, STATUS_INVALID,
                           "prompt: one of text, token_ids or chat must be set");
    }
    /* sampling and logprobs: the same check (and messages) as the worker's */
    const sampling_params sp = rpc_sampling_from_proto(g->sampling, g->logprobs);
    if (sampling_params_validate(&sp, "sampling.", st)) return STATUS_INVALID;
    if (g->stopping) {
        if (g->stopping->n_stop_token_ids > ROUTER_REQUEST_MAX_STOP_IDS)
            return status_fail(st, STATUS_INVALID, "stopping.stop_token_ids: %zu ids, at most %d",
                               g->stopping->n_stop_token_ids, ROUTER_REQUEST_MAX_STOP_IDS);
        if (check_ids("stopping.stop_token_ids", g->stopping->stop_token_ids,
                      g->stopping->n_stop_token_ids, tok, st))
            return STATUS_INVALID;
    }
    if (g->n_stop > 0 && !tok)
        return status_fail(st, STATUS_INVALID,
                           "stop: stop strings need the router's tokenizer (start it with --model)");
    if (g->n_stop > ROUTER_STOP_MAX)
        return status_fail(st, STATUS_INVALID, "stop: %zu stop strings, at most %d", g->n_stop,
                           ROUTER_STOP_MAX);
    for (size_t i = 0; i < g->n_stop; i++) {
        size_t l = strlen(g->stop[i]);
        if (l == 0 || l > ROUTER_STOP_MAX_BYTES)
            return status_fail(st, STATUS_INVALID, "stop[%zu]: %zu bytes, must be 1..%d", i, l,
                               ROUTER_STOP_MAX_BYTES);
        if (!utf8_valid(g->stop[i], l))
            return status_fail(st, STATUS_INVALID, "stop[%zu]: not valid UTF-8", i);
    }
    return 0;
}

void router_request_template_init(router_request_template *c, const tokenizer *tok)
{
    memset(c, 0, sizeof *c);
    size_t len;
    const char *src = tok ? tokenizer_chat_template(tok, &len) : NULL;
    if (!tok) {
        snprintf(c->why, sizeof c->why, "this router has no tokenizer (start it with --model)");
    } else if (!src) {
        snprintf(c->why, sizeof c->why, "the model has no chat template (GGUF "
                 "tokenizer.chat_template); send text or token_ids");
    } else {
        char err[200];
        if (chat_template_parse(src, len, &c->tmpl, err, sizeof err))
            snprintf(c->why, sizeof c->why, "the model's chat template cannot be rendered: %s",
                     err);
        else
            c->thinking_default = chat_template_thinking_default(c->tmpl);
    }
}

void router_request_template_free(router_request_template *c)
{
    chat_template_free(c->tmpl);
    c->tmpl = NULL;
}

int router_request_render_chat(const router_request_template *c, struct json_object *messages,
                               struct json_object *tools, int thinking, char **text,
                               size_t *len, bool *in_reasoning, status *st)
{
    *text = NULL;
    *len = 0;
    if (!c || !c->tmpl)
        return status_fail(st, STATUS_PRECONDITION, "chat: %s",
                           c ? c->why : "no chat template");
    char err[sizeof st->msg - 8];
    bool reasoning = false;
    if (chat_template_render_chat(c->tmpl, messages, tools, thinking, true, text, len,
                                  &reasoning, err, sizeof err))
        return status_fail(st, STATUS_INVALID, "chat: %s", err);
    if (in_reasoning) *in_reasoning = reasoning;
    return 0;
}

static json_object *jstr(const char *s) { return json_object_new_string(s); }

int router_request_chat_json(const Deltaserve__V1__ChatPrompt *chat,
                             struct json_object **messages, struct json_object **tools,
                             int *thinking, status *st)
{
    *messages = json_object_new_array();
    *tools = NULL;
    *thinking = chat->thinking == DELTASERVE__V1__THINKING__THINKING_ON    ? 1
              : chat->thinking == DELTASERVE__V1__THINKING__THINKING_OFF ? 0 : -1;
    if (!*messages) return status_fail(st, STATUS_NOMEM, "chat: out of memory");
    for (size_t i = 0; i < chat->n_messages; i++) {
        const Deltaserve__V1__ChatMessage *m = chat->messages[i];
        json_object *o = json_object_new_object();
        json_object_array_add(*messages, o);
        json_object_object_add(o, "role", jstr(m->role));
        json_object_object_add(o, "content", jstr(m->content));
        if (m->reasoning_content[0])
            json_object_object_add(o, "reasoning_content", jstr(m->reasoning_content));
        if (m->n_tool_calls) {
            json_object *calls = json_object_new_array();
            json_object_object_add(o, "tool_calls", calls);
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                const Deltaserve__V1__ToolCall *tc = m->tool_calls[k];
                json_object *c = json_object_new_object(), *fn = json_object_new_object();
                json_object_array_add(calls, c);
                if (tc->id[0]) json_object_object_add(c, "id", jstr(tc->id));
                json_object_object_add(c, "type", jstr("function"));
                json_object_object_add(c, "function", fn);
                json_object_object_add(fn, "name", jstr(tc->name));
                /* JSON text, parsed to an object by chat_template_render_chat */
                json_object_object_add(fn, "arguments", jstr(tc->arguments[0] ? tc->arguments
                                                                              : "{}"));
            }
        }
        if (m->tool_call_id[0]) json_object_object_add(o, "tool_call_id", jstr(m->tool_call_id));
        if (m->name[0]) json_object_object_add(o, "name", jstr(m->name));
    }
    if (chat->n_tools) {
        *tools = json_object_new_array();
        for (size_t i = 0; i < chat->n_tools; i++) {
            const Deltaserve__V1__Tool *t = chat->tools[i];
            json_object *params;
            if (t->parameters[0]) {
                params = json_tokener_parse(t->parameters);
                if (!params || !json_object_is_type(params, json_type_object)) {
                    json_object_put(params);
                    json_object_put(*messages);
                    json_object_put(*tools);
                    *messages = *tools = NULL;
                    return status_fail(st, STATUS_INVALID,
                                       "chat.tools[%zu].parameters: not a JSON object", i);
                }
            } else {
                params = json_object_new_object();
            }
            json_object *o = json_object_new_object(), *fn = json_object_new_object();
            json_object_array_add(*tools, o);
            json_object_object_add(o, "type", jstr("function"));
            json_object_object_add(o, "function", fn);
            json_object_object_add(fn, "name", jstr(t->name));
            if (t->description[0]) json_object_object_add(fn, "description", jstr(t->description));
            json_object_object_add(fn, "parameters", params);
        }
    }
    return 0;
}

int router_request_prompt_ids(const Deltaserve__V1__GenerateRequest *g, const tokenizer *tok,
                              const router_request_template *chat, int32_t **ids, size_t *n,
                              bool *in_reasoning, status *st)
{
    *ids = NULL;
    *n = 0;
    if (in_reasoning) *in_reasoning = false;
    if (g->prompt_case == DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS) {
        size_t m = g->token_ids->n_ids;
        *ids = malloc(m * sizeof **ids);
        if (!*ids) return status_fail(st, STATUS_NOMEM, "token_ids: out of memory");
        memcpy(*ids, g->token_ids->ids, m * sizeof **ids);
        *n = m;
        return 0;
    }
    DS_ASSERT(tok);
    int rc;
    if (g->prompt_case == DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT) {
        char *text;
        size_t len;
        json_object *messages, *tools;
        int thinking;
        if ((rc = router_request_chat_json(g->chat, &messages, &tools, &thinking, st))) return rc;
        rc = router_request_render_chat(chat, messages, tools, thinking, &text, &len,
                                        in_reasoning, st);
        json_object_put(messages);
        json_object_put(tools);
        if (rc) return rc;
        rc = tokenizer_encode(tok, text, len, ids, n, st);
        free(text);
    } else {
        rc = tokenizer_encode(tok, g->text, strlen(g->text), ids, n, st);
    }
    if (rc) return rc;
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return status_fail(st, STATUS_INVALID, "text: the prompt tokenizes to no tokens");
    }
    return 0;
}
