/* The chat side of a Generate stream: the model's output split into the answer (`text`), the
 * reasoning (`reasoning`) and completed tool calls (`tool_calls`) with model/chat_split.h, one
 * splitter per relay. The relay feeds each token's text after stop-string handling and sends
 * what this fills in; it also counts the reasoning tokens exactly, by where each token's text
 * starts. */
#ifndef DS_ROUTER_ROUTER_CHAT_H
#define DS_ROUTER_ROUTER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/chat_split.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"

/* Tokens whose text starts at byte `at` of the output (after detokenization, before stop
 * strings), not yet known to be reasoning or not. */
typedef struct router_chat_pending {
    uint64_t at;
    uint32_t n;
} router_chat_pending;

/* Distinct start offsets a stream can have uncounted: the bytes the stop matcher and the
 * splitter hold back (ROUTER_STOP_MAX_BYTES, a marker), and one. */
#define ROUTER_CHAT_PENDING 512

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
    /* reasoning tokens: the tokens whose text starts before the reasoning's end (a prefix of
     * the output, chat_split_reasoning_end), counted once that end is known past them */
    router_chat_pending *pending; /* owned, [ROUTER_CHAT_PENDING] ring: tokens not yet counted,
                                     one entry per distinct start offset */
    size_t pending_head, n_pending;
    uint32_t reasoning_tokens;  /* counted so far */
    int reasoning_done;         /* the end is known and every token before it counted */
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

/* One message's split, in three steps: begin (the message's answer, reasoning and calls
 * emptied), feed its text in pieces as they come (after stop-string handling; each piece
 * after the router_chat_token calls of the tokens that produced it), end (last = the final
 * message: held text is flushed). end sets out->text, out->reasoning and out->tool_calls to
 * what the message says; they point into c until the next begin. feed and end return 0 or -1
 * (out of memory). router_chat_message is the three for a message of one piece. */
void router_chat_begin(router_chat *c);
int router_chat_feed(router_chat *c, const char *text, size_t len);
int router_chat_end(router_chat *c, bool last, Deltaserve__V1__GenerateResponse *out);
int router_chat_message(router_chat *c, const char *text, size_t len, bool last,
                        Deltaserve__V1__GenerateResponse *out);

/* One generated token whose text starts at byte `at` of the output text (the detokenizer's
 * output, before stop strings: the text the splitter is fed is a prefix of it). Call in token
 * order, before the message with the token's text is split. */
void router_chat_token(router_chat *c, uint64_t at);

/* The reasoning tokens so far: exact once the final message was split (tokens from the first
 * through the one whose text completes </think>, or all of them when the output ends inside
 * reasoning; 0 when it has none). */
uint32_t router_chat_reasoning_tokens(const router_chat *c);

#endif
