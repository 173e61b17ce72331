/* The chat side of a Generate stream: the model's output split into the answer (`text`), the
 * reasoning (`reasoning`) and completed tool calls (`tool_calls`) with model/chat_split.h, one
 * splitter per relay. The relay feeds each message's text after stop-string handling and sends
 * what this fills in. */
#ifndef DS_ROUTER_ROUTER_CHAT_H
#define DS_ROUTER_ROUTER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/chat_split.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"

typedef struct router_chat {
    chat_split *split;          /* owned */
    struct json_object *tools;  /* owned: the request's tools as OpenAI json-c objects, or NULL */
    char *text;                 /* owned, [text_cap] the answer of the message being built */
    size_t text_len, text_cap;
    char *reasoning;            /* owned, [reasoning_cap] its reasoning */
    size_t reasoning_len, reasoning_cap;
    char *strs;                 /* owned, [strs_cap] ids, names, arguments of its tool calls */
    size_t strs_len, strs_cap;
    Deltaserve__V1__ToolCall *calls;  /* owned, [calls_cap] its tool calls */
    Deltaserve__V1__ToolCall **ptrs;  /* owned, [calls_cap] pointers to them, for the message */
    size_t *offs;               /* owned, [calls_cap][3] id, name, arguments offsets in strs */
    size_t n_calls, calls_cap;
    uint64_t rng;               /* the call ids' random stream */
    int failed;                 /* out of memory while splitting */
} router_chat;

/* Sets up the splitter for a validated chat request: in_reasoning = the rendered prompt ends
 * inside <think>; the tools converted from chat->tools (STATUS_INVALID naming
 * chat.tools[i].parameters when one is not a JSON object); piece_cap = the largest text one
 * message can carry (the buffers start there). seed starts the call ids' random stream. */
int router_chat_init(router_chat *c, const Deltaserve__V1__ChatPrompt *chat, bool in_reasoning,
                     size_t piece_cap, uint64_t seed, status *st);
void router_chat_free(router_chat *c);

/* Whether a rendered prompt ends inside an open <think> block (its last "<think>" not closed):
 * the model's output then starts as reasoning. */
bool router_chat_prompt_in_reasoning(const char *prompt, size_t len);

/* Splits one message's text (len bytes); last = the final message (held text is flushed).
 * Sets out->text, out->reasoning and out->tool_calls to what this message says; they point
 * into c until the next call. Returns 0 or -1 (out of memory). */
int router_chat_message(router_chat *c, const char *text, size_t len, bool last,
                        Deltaserve__V1__GenerateResponse *out);

#endif
