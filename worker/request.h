/* Validation of a Worker/Generate request into engine_params: every field checked, each error
 * STATUS_INVALID (INVALID_ARGUMENT on the wire) with a message naming the field as the .proto
 * spells it ("sampling.top_p: 1.5 is outside (0, 1]"). Defaults for zero values are applied
 * here, as documented in proto/deltaserve/v1/deltaserve.proto. */
#ifndef DS_WORKER_REQUEST_H
#define DS_WORKER_REQUEST_H

#include <stdint.h>

#include "common/status.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "worker/engine.h"

#define WORKER_DEFAULT_MAX_NEW_TOKENS 256
#define WORKER_MAX_STREAM_INTERVAL 256 /* the largest WorkerGenerateRequest.stream_interval */

typedef struct worker_limits {
    int vocab; /* valid ids are [0, vocab) */
    int n_ctx; /* prompt + generated tokens of one request */
} worker_limits;

/* Fills out from req (and checks the fields the service reads itself: stream_interval).
 * random_seed is used when req asks for seed 0 ("pick one"); out->id is
 * req->request_id, or fallback_id when that is empty. out->prompt borrows req's ids. */
int worker_request_parse(const Deltaserve__V1__WorkerGenerateRequest *req,
                         const worker_limits *lim, uint64_t random_seed, const char *fallback_id,
                         engine_params *out, status *st);

#endif
