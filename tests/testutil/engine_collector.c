/* engine_collector.h */
#include "tests/testutil/engine_collector.h"

static bool col_cancelled(void *arg)
{
    (void)arg;
    return false;
}

static void col_token(void *arg, const engine_request *r, const worker_batch_item *it)
{
    (void)r;
    engine_collector *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->n < c->cap) c->tokens[c->n++] = it->out.token;
    pthread_mutex_unlock(&c->mu);
}

static void col_finish(void *arg, const engine_request *r)
{
    (void)r;
    engine_collector *c = arg;
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

const engine_sink engine_collector_sink = {.cancelled = col_cancelled, .on_token = col_token,
                                           .on_finish = col_finish};

void engine_collector_init(engine_collector *c, int32_t *tokens, int cap)
{
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->tokens = tokens;
    c->cap = cap;
    engine_collector_reset(c);
}

void engine_collector_reset(engine_collector *c)
{
    c->n = 0;
    c->done = false;
}

void engine_collector_wait(engine_collector *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void engine_collector_destroy(engine_collector *c)
{
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}
