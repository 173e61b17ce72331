/* One engine request's generated tokens, collected through an engine_sink (worker/engine.h), for
 * the tests that run requests through a real engine:
 *
 *   int32_t tok[64];
 *   engine_collector c;
 *   engine_collector_init(&c, tok, 64);
 *   engine_submit(e, &params, &engine_collector_sink, &c, &st);
 *   engine_collector_wait(&c);             c.n tokens in tok (at most cap kept), c.done
 *   engine_collector_destroy(&c);
 *
 * engine_collector_reset readies it for another request on the same buffer. */
#ifndef DS_TESTS_TESTUTIL_ENGINE_COLLECTOR_H
#define DS_TESTS_TESTUTIL_ENGINE_COLLECTOR_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "worker/engine.h"

typedef struct engine_collector {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *tokens; /* [cap] */
    int cap, n;
    bool done;
} engine_collector;

extern const engine_sink engine_collector_sink;

void engine_collector_init(engine_collector *c, int32_t *tokens, int cap);
void engine_collector_reset(engine_collector *c);
void engine_collector_wait(engine_collector *c);
void engine_collector_destroy(engine_collector *c);

#endif
