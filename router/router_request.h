/* The public request, before any worker sees it: validation of every field the router owns
 * (INVALID_ARGUMENT naming the field), the prompt as token ids (text tokenized with the
 * model's tokenizer, chat messages rendered with ChatML first), and the Worker request built
 * from it. Sampling fields are checked here too, so a bad request fails fast at the router with
 * the same field names the worker uses. */
#ifndef DS_ROUTER_ROUTER_REQUEST_H
#define DS_ROUTER_ROUTER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
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

/* Renders chat messages as ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message,
 * then "<|im_start|>assistant\n". *out is malloc'd and NUL-terminated. */
int router_request_chatml(const Deltaserve__V1__ChatPrompt *chat, char **out, size_t *len,
                          status *st);

/* The prompt of a validated request as token ids: *ids malloc'd (caller frees), *n >= 1.
 * STATUS_INVALID when text tokenizes to nothing ("text: ... no tokens"). */
int router_request_prompt_ids(const Deltaserve__V1__GenerateRequest *g, const tokenizer *tok,
                              int32_t **ids, size_t *n, status *st);

#endif
