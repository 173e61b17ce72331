/* libFuzzer target for the request decoder (built by tools/fuzz with clang
 * -fsanitize=fuzzer,address,undefined): every input is unpacked with protobuf-c twice,
 *   as deltaserve.v1.GenerateRequest (the router's public request): router_request_validate
 *     with the tokenizer (tiny-r2-tied.gguf, as tokenizer_fuzz) and without one (a router
 *     started with no --model); when it passes, the router's next steps as router_generate.c
 *     takes them: router_request_prompt_ids, router_stop_init, the WorkerGenerateRequest built
 *     from it, packed, unpacked and parsed by the worker as below;
 *   as deltaserve.v1.WorkerGenerateRequest (the worker's request): worker_request_parse under
 *     a roomy context (4096) and a tight one (8).
 * (The router validates the request as received, as router_generate.c does, and builds the
 * worker request from views into it, the unknown fields of sampling and stopping left out.)
 * Before both, as the server does before unpacking (rpc/rpc_wire.h): an input whose string
 * field holds a NUL is refused there (then the input holds a 0 byte, the path names a field,
 * and the offset lies inside the input) and goes no further; the walk itself must stay inside
 * the input whatever it is.
 * Each step must end in STATUS_OK or a clean error: STATUS_INVALID (NOMEM allowed where the
 * function says so) with a non-empty message. On success the contracts are checked: prompt ids
 * in the vocabulary, at least one, prompt + max_new_tokens within the context, stop ids in the
 * vocabulary, sampling valid, a seed picked. A request the router accepts must reach the
 * worker as one the worker accepts too when it fits the worker's context (same sampling check,
 * same vocabulary). Every message is freed (LeakSanitizer checks each input). Any check that
 * fails aborts with the line, so libFuzzer keeps the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sampling.h"
#include "common/status.h"
#include "model/tokenizer.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "router/router_request.h"
#include "router/router_stop.h"
#include "rpc/rpc_wire.h"
#include "worker/request.h"

#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "request_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* rc is OK with an empty-or-OK status, or one of the allowed error codes with a message. */
#define FUZZ_CHECK_RESULT(rc, st, allowed_nomem)                                              \
    do {                                                                                      \
        if ((rc) == STATUS_OK) break;                                                         \
        FUZZ_CHECK((rc) == STATUS_INVALID || ((allowed_nomem) && (rc) == STATUS_NOMEM));      \
        FUZZ_CHECK((int)(st).code == (rc));                                                   \
        FUZZ_CHECK((st).msg[0] != '\0');                                                      \
        FUZZ_CHECK(memchr((st).msg, '\0', sizeof (st).msg) != NULL);                          \
    } while (0)

#define CTX_ROOMY 4096
#define CTX_TIGHT 8
#define RANDOM_SEED 0x9e3779b97f4a7c15ull

static tokenizer *g_tok;
static router_request_template g_chat; /* the tokenizer's chat template */
static int g_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *path = getenv("DS_FUZZ_TOKENIZER");
    char buf[4096];
    if (!path) {
        const char *dir = getenv("DS_REFERENCE_DIR");
        snprintf(buf, sizeof buf, "%s/tiny-r2-tied.gguf", dir ? dir : "../shared/reference");
        path = buf;
    }
    status st = {0};
    if (tokenizer_load_path(&g_tok, path, &st)) {
        fprintf(stderr, "request_fuzz: %s\n", st.msg);
        exit(2);
    }
    g_vocab = (int)tokenizer_n_vocab(g_tok);
    router_request_template_init(&g_chat, g_tok);
    return 0;
}

static void check_worker_params(const Deltaserve__V1__WorkerGenerateRequest *req,
                                const worker_limits *lim, const engine_params *p)
{
    FUZZ_CHECK(memchr(p->id, '\0', sizeof p->id));
    FUZZ_CHECK(p->id[0]);
    FUZZ_CHECK(p->prompt == req->prompt_token_ids);
    FUZZ_CHECK(p->n_prompt >= 1 && (size_t)p->n_prompt == req->n_prompt_token_ids);
    FUZZ_CHECK(p->n_prompt < lim->n_ctx);
    for (int i = 0; i < p->n_prompt; i++) FUZZ_CHECK(p->prompt[i] >= 0 && p->prompt[i] < lim->vocab);
    FUZZ_CHECK(p->max_new_tokens >= 1);
    FUZZ_CHECK((int64_t)p->n_prompt + p->max_new_tokens <= lim->n_ctx);
    if (req->stopping && req->stopping->max_new_tokens)
        FUZZ_CHECK((uint32_t)p->max_new_tokens == req->stopping->max_new_tokens);
    FUZZ_CHECK(p->n_stop_ids >= 0 && p->n_stop_ids <= ENGINE_MAX_STOP_IDS);
    for (int i = 0; i < p->n_stop_ids; i++)
        FUZZ_CHECK(p->stop_ids[i] >= 0 && p->stop_ids[i] < lim->vocab);
    FUZZ_CHECK(sampling_params_validate(&p->sampling, "sampling.", NULL) == STATUS_OK);
    FUZZ_CHECK(p->sampling.seed != 0);
    if (req->sampling && req->sampling->seed) FUZZ_CHECK(p->sampling.seed == req->sampling->seed);
}

/* Returns worker_request_parse's result under lim, checked. */
static int worker_side(const Deltaserve__V1__WorkerGenerateRequest *req, int n_ctx)
{
    const worker_limits lim = {.vocab = g_vocab, .n_ctx = n_ctx};
    engine_params p;
    status st = {0};
    int rc = worker_request_parse(req, &lim, RANDOM_SEED, "fuzz-fallback", &p, &st);
    FUZZ_CHECK_RESULT(rc, st, 0);
    if (rc == STATUS_OK) check_worker_params(req, &lim, &p);
    return rc;
}

/* The worker request the router sends for an accepted g (as router_generate.c builds it),
 * through the wire, into the worker's parse. */
static void router_to_worker(const Deltaserve__V1__GenerateRequest *g, const int32_t *ids,
                             size_t n_ids)
{
    Deltaserve__V1__SamplingParams samp = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    if (g->sampling) samp = *g->sampling;
    samp.base.n_unknown_fields = 0;
    samp.base.unknown_fields = NULL;
    if (!samp.seed) samp.seed = 12345;
    Deltaserve__V1__WorkerGenerateRequest wr = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    wr.request_id = g->request_id[0] ? g->request_id : "fuzz-router";
    wr.n_prompt_token_ids = n_ids;
    wr.prompt_token_ids = (int32_t *)ids;
    wr.sampling = &samp;
    Deltaserve__V1__StoppingCriteria stopping;
    if (g->stopping) {
        stopping = *g->stopping;
        stopping.base.n_unknown_fields = 0;
        stopping.base.unknown_fields = NULL;
        wr.stopping = &stopping;
    }
    wr.logprobs = g->logprobs;
    wr.no_speculation = g->no_speculation;
    size_t n = deltaserve__v1__worker_generate_request__get_packed_size(&wr);
    uint8_t *buf = malloc(n ? n : 1);
    FUZZ_CHECK(buf);
    FUZZ_CHECK(deltaserve__v1__worker_generate_request__pack(&wr, buf) == n);
    Deltaserve__V1__WorkerGenerateRequest *w =
        deltaserve__v1__worker_generate_request__unpack(NULL, n, buf);
    FUZZ_CHECK(w);
    /* the same request as the router sent it: id, ids, stop ids, logprobs survive the wire */
    FUZZ_CHECK(!strcmp(w->request_id, wr.request_id));
    FUZZ_CHECK(w->n_prompt_token_ids == n_ids);
    FUZZ_CHECK(!memcmp(w->prompt_token_ids, ids, n_ids * sizeof *ids));
    FUZZ_CHECK(w->logprobs == g->logprobs);
    int rc = worker_side(w, CTX_ROOMY);
    /* the router checked request_id (<= 128 bytes), sampling, logprobs, stop ids (in the
     * vocabulary, at most 16): what the worker may still refuse is the context */
    if (rc != STATUS_OK) {
        uint32_t max_new = g->stopping ? g->stopping->max_new_tokens : 0;
        FUZZ_CHECK(n_ids >= CTX_ROOMY || (uint64_t)n_ids + max_new > CTX_ROOMY);
    }
    deltaserve__v1__worker_generate_request__free_unpacked(w, NULL);
    free(buf);
}

static void router_side(const uint8_t *data, size_t size)
{
    Deltaserve__V1__GenerateRequest *g = deltaserve__v1__generate_request__unpack(NULL, size, data);
    if (!g) return; /* protobuf-c refused the bytes: the server answers INVALID_ARGUMENT */

    status st = {0};
    int rc_none = router_request_validate(g, NULL, &st);
    FUZZ_CHECK_RESULT(rc_none, st, 0);

    status_clear(&st);
    int rc = router_request_validate(g, g_tok, &st);
    FUZZ_CHECK_RESULT(rc, st, 0);
    /* a tokenizer only adds checks (vocabulary) and allows text, chat and stop strings */
    if (rc == STATUS_OK && rc_none != STATUS_OK)
        FUZZ_CHECK(g->prompt_case != DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS ||
                   g->n_stop > 0);
    if (rc != STATUS_OK) goto out;

    int32_t *ids = NULL;
    size_t n_ids = 0;
    status_clear(&st);
    rc = router_request_prompt_ids(g, g_tok, &g_chat, &ids, &n_ids, NULL, &st);
    FUZZ_CHECK_RESULT(rc, st, 1);
    if (rc == STATUS_OK) {
        FUZZ_CHECK(ids && n_ids >= 1);
        for (size_t i = 0; i < n_ids; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < g_vocab);
    } else {
        FUZZ_CHECK(!ids && n_ids == 0);
        goto out;
    }

    router_stop stop;
    status_clear(&st);
    rc = router_stop_init(&stop, (const char *const *)g->stop, (int)g->n_stop, &st);
    FUZZ_CHECK(rc == STATUS_OK); /* validated above: the same rules */
    router_stop_free(&stop);

    router_to_worker(g, ids, n_ids);
    free(ids);
out:
    deltaserve__v1__generate_request__free_unpacked(g, NULL);
}

static void worker_direct(const uint8_t *data, size_t size)
{
    Deltaserve__V1__WorkerGenerateRequest *w =
        deltaserve__v1__worker_generate_request__unpack(NULL, size, data);
    if (!w) return;
    int roomy = worker_side(w, CTX_ROOMY);
    int tight = worker_side(w, CTX_TIGHT);
    /* a smaller context never accepts what a larger one refuses */
    if (roomy != STATUS_OK) FUZZ_CHECK(tight != STATUS_OK);
    deltaserve__v1__worker_generate_request__free_unpacked(w, NULL);
}

/* The server's NUL check for a request of type desc: 1 when it refuses the input. */
static int refused_for_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                           size_t size)
{
    char path[RPC_WIRE_PATH_MAX];
    size_t off;
    if (!rpc_wire_find_nul(desc, data, size, path, &off)) return 0;
    FUZZ_CHECK(path[0] != '\0' && memchr(path, '\0', sizeof path) != NULL);
    FUZZ_CHECK(off < size && memchr(data, 0, size) != NULL);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!refused_for_nul(&deltaserve__v1__generate_request__descriptor, data, size))
        router_side(data, size);
    if (!refused_for_nul(&deltaserve__v1__worker_generate_request__descriptor, data, size))
        worker_direct(data, size);
    return 0;
}
