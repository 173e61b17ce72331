#include "router/router_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            if (!m->role[0])
                return status_fail(st, STATUS_INVALID, "chat.messages[%zu].role: empty", i);
            if (strpbrk(m->role, "\n<"))
                return status_fail(st, STATUS_INVALID,
                                   "chat.messages[%zu].role: must not contain '\\n' or '<'", i);
            if (!utf8_valid(m->role, strlen(m->role)) ||
                !utf8_valid(m->content, strlen(m->content)))
                return status_fail(st, STATUS_INVALID, "chat.messages[%zu]: not valid UTF-8", i);
        }
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

int router_request_chatml(const Deltaserve__V1__ChatPrompt *chat, char **out, size_t *len,
                          status *st)
{
    static const char start[] = "<|im_start|>", end[] = "<|im_end|>\n";
    static const char tail[] = "<|im_start|>assistant\n";
    size_t n = sizeof tail;
    for (size_t i = 0; i < chat->n_messages; i++)
        n += sizeof start + strlen(chat->messages[i]->role) + 1 +
             strlen(chat->messages[i]->content) + sizeof end;
    char *s = malloc(n);
    if (!s) return status_fail(st, STATUS_NOMEM, "chat: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < chat->n_messages; i++)
        k += (size_t)sprintf(s + k, "%s%s\n%s%s", start, chat->messages[i]->role,
                             chat->messages[i]->content, end);
    k += (size_t)sprintf(s + k, "%s", tail);
    *out = s;
    *len = k;
    return 0;
}

int router_request_prompt_ids(const Deltaserve__V1__GenerateRequest *g, const tokenizer *tok,
                              int32_t **ids, size_t *n, status *st)
{
    *ids = NULL;
    *n = 0;
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
        if ((rc = router_request_chatml(g->chat, &text, &len, st))) return rc;
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
