/* The public request, before any worker sees it: validation of every field the router owns
 * (INVALID_ARGUMENT naming the field), the prompt as token ids (text tokenized with the
 * model's tokenizer, chat messages rendered with the model's own chat template first,
 * model/chat_template.h), and the Worker request built from it. Sampling fields are checked here too, so a bad request fails fast at the router with
 * the same field names the worker uses. */
#ifndef DS_ROUTER_ROUTER_REQUEST_H
#define DS_ROUTER_ROUTER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"

#define ROUTER_REQUEST_ID_MAX 128     /* bytes of request_id */
#define ROUTER_REQUEST_MAX_STOP_IDS 16
#define ROUTER_REQUEST_DEFAULT_MAX_NEW 256

/* STATUS_INVALID naming the field for any bad public field. tok may be NULL (no --model):
 * then text and chat prompts and stop strings are refused (they need the tokenizer), and
 * token ids are only checked for being >= 0 (the worker checks the vocabulary). */
int router_request_validate(const Deltaserve__V1__GenerateRequest *g, const tokenizer *tok,
                            status *st);

struct json_object;

/* The model's chat template as the router holds it: parsed once at start from the GGUF's
 * tokenizer.chat_template; read-only afterwards (any thread may render with it). */
typedef struct router_request_template {
    chat_template *tmpl;   /* owned, NULL when there is none usable */
    bool thinking_default; /* chat_template_thinking_default(tmpl), false without one */
    char why[256];         /* when tmpl is NULL: why (no --model, no template, the parse error) */
} router_request_template;

/* Parses tok's template (tok may be NULL). Never fails: a template that is absent or does not
 * parse leaves tmpl NULL and the reason in why (the caller logs it once). */
void router_request_template_init(router_request_template *c, const tokenizer *tok);
void router_request_template_free(router_request_template *c);

/* OpenAI-shaped messages and tools (chat_template_render_chat's shapes) -> prompt text with
 * the generation prompt, for the gRPC chat prompt and the HTTP door alike. thinking: -1 the
 * template's default, 0 off, 1 on. *text malloc'd (caller frees); *in_reasoning: the prompt
 * ends inside an open <think> block, so the model's output starts as reasoning.
 * STATUS_PRECONDITION naming c->why when there is no template; STATUS_INVALID with the
 * template's message (raise_exception's text, or the malformed field) otherwise. */
int router_request_render_chat(const router_request_template *c, struct json_object *messages,
                               struct json_object *tools, int thinking, char **text,
                               size_t *len, bool *in_reasoning, status *st);

/* The gRPC ChatPrompt in the OpenAI shape: *messages and *tools (NULL when the prompt has no
 * tools) are new json-c references the caller puts; *thinking -1/0/1. STATUS_INVALID naming
 * the field for a tool's parameters that are not a JSON object. */
int router_request_chat_json(const Deltaserve__V1__ChatPrompt *chat,
                             struct json_object **messages, struct json_object **tools,
                             int *thinking, status *st);

/* The prompt of a validated request as token ids: *ids malloc'd (caller frees), *n >= 1;
 * *in_reasoning (may be NULL) true when a chat prompt ends inside an open <think> block.
 * STATUS_INVALID when text tokenizes to nothing ("text: ... no tokens"); chat prompts fail as
 * router_request_render_chat. */
int router_request_prompt_ids(const Deltaserve__V1__GenerateRequest *g, const tokenizer *tok,
                              const router_request_template *chat, int32_t **ids, size_t *n,
                              bool *in_reasoning, status *st);

#endif
