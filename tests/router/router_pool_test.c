#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

#include "router/router_policy.h"
#include "router/router_pool.h"
#include "tests/testutil/testutil.h"

/* ---- policy ---- */

static void test_least_prefers_lower_load(void)
{
    router_policy p;
    router_policy_defaults(&p);
    router_policy_cand c[2] = {{.key = 1, .load = 100, .eligible = 1},
                               {.key = 2, .load = 5, .eligible = 1}};
    uint64_t rng = 1;
    for (int i = 0; i < 100; i++) CU_ASSERT_EQUAL(router_policy_pick(&p, c, 2, 0, &rng), 1);
}

static void test_none_eligible(void)
{
    router_policy p;
    router_policy_defaults(&p);
    router_policy_cand c[2] = {{.key = 1}, {.key = 2}};
    uint64_t rng = 1;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 2, 0, &rng), -1);
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 0, 0, &rng), -1);
    c[1].eligible = 1;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 2, 0, &rng), 1);
}

/* Power of two choices over 8 equal workers spreads picks; the most loaded is never picked. */
static void test_p2c_spreads_and_avoids_max(void)
{
    router_policy p;
    router_policy_defaults(&p);
    router_policy_cand c[8];
    for (int i = 0; i < 8; i++)
        c[i] = (router_policy_cand){.key = (uint64_t)i, .load = 10, .eligible = 1};
    c[3].load = 1000;
    c[5].eligible = 0;
    int hits[8] = {0};
    uint64_t rng = 42;
    for (int i = 0; i < 7000; i++) hits[router_policy_pick(&p, c, 8, 0, &rng)]++;
    CU_ASSERT_EQUAL(hits[3], 0);
    CU_ASSERT_EQUAL(hits[5], 0);
    for (int i = 0; i < 8; i++)
        if (i != 3 && i != 5) CU_ASSERT(hits[i] > 700); /* ~1167 expected each */
}

static void test_prefix_affinity_and_overload(void)
{
    router_policy p;
    router_policy_defaults(&p);
    p.mode = ROUTER_ROUTING_PREFIX;
    router_policy_cand c[4];
    for (int i = 0; i < 4; i++)
        c[i] = (router_policy_cand){.key = router_policy_hash_str((char[]){'w', (char)('0' + i), 0}),
                                    .load = 0, .eligible = 1};
    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = b[i] = i * 7;
    b[39] = 99999; /* differs after the first 32 tokens: same prefix hash */
    uint64_t ha = router_policy_prefix_hash(a, 40, p.prefix_tokens);
    CU_ASSERT_EQUAL(ha, router_policy_prefix_hash(b, 40, p.prefix_tokens));
    CU_ASSERT_NOT_EQUAL(ha, router_policy_prefix_hash(a, 31, p.prefix_tokens));
    uint64_t rng = 3;
    int first = router_policy_pick(&p, c, 4, ha, &rng);
    CU_ASSERT(first >= 0);
    for (int i = 0; i < 50; i++) CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, ha, &rng), first);
    /* different prefixes spread over the workers */
    int hits[4] = {0};
    for (int32_t k = 0; k < 400; k++) {
        int32_t ids[1] = {k};
        hits[router_policy_pick(&p, c, 4, router_policy_prefix_hash(ids, 1, 32), &rng)]++;
    }
    for (int i = 0; i < 4; i++) CU_ASSERT(hits[i] > 50);
    /* removing another worker does not move this prefix (rendezvous hashing) */
    int other = (first + 1) % 4;
    c[other].eligible = 0;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, ha, &rng), first);
    c[other].eligible = 1;
    /* overloaded by load: falls back to least */
    c[first].load = 5000;
    int alt = router_policy_pick(&p, c, 4, ha, &rng);
    CU_ASSERT_NOT_EQUAL(alt, first);
    /* within the slack it stays */
    c[first].load = 500;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, ha, &rng), first);
    /* a waiting queue counts as overloaded */
    c[first].waiting = 2;
    CU_ASSERT_NOT_EQUAL(router_policy_pick(&p, c, 4, ha, &rng), first);
}

/* A worker that holds the prefix (its heads list the hash) wins over the rendezvous choice,
 * the least loaded of several holders first; an overloaded holder does not; least mode ignores
 * the heads. */
static void test_prefix_heads(void)
{
    router_policy p;
    router_policy_defaults(&p);
    p.mode = ROUTER_ROUTING_PREFIX;
    router_policy_cand c[4];
    for (int i = 0; i < 4; i++)
        c[i] = (router_policy_cand){.key = router_policy_hash_str((char[]){'w', (char)('0' + i), 0}),
                                    .load = 10, .eligible = 1};
    int32_t ids[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    uint64_t h = router_policy_prefix_hash(ids, 8, p.prefix_tokens);
    uint64_t rng = 7;
    int rdv = router_policy_pick(&p, c, 4, h, &rng);
    CU_ASSERT_FATAL(rdv >= 0);
    int holder = (rdv + 2) % 4;
    c[holder].holds_prefix = 1;
    for (int i = 0; i < 20; i++) CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), holder);
    /* two holders: the less loaded one */
    int other = (rdv + 1) % 4;
    c[other].holds_prefix = 1;
    c[other].load = 5;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), other);
    c[other].load = 50;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), holder);
    c[other].holds_prefix = 0;
    c[other].load = 10;
    /* a holder with a queue, over the load limit or not eligible is passed over: rendezvous */
    c[holder].waiting = 1;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), rdv);
    c[holder].waiting = 0;
    c[holder].load = 5000;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), rdv);
    c[holder].load = 10;
    c[holder].eligible = 0;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), rdv);
    c[holder].eligible = 1;
    CU_ASSERT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), holder);
    /* least mode does not look at heads: the holder at a higher load is never picked */
    p.mode = ROUTER_ROUTING_LEAST;
    c[holder].load = 1000;
    for (int i = 0; i < 50; i++) CU_ASSERT_NOT_EQUAL(router_policy_pick(&p, c, 4, h, &rng), holder);
}

static void test_parse_mode(void)
{
    router_routing m;
    status st;
    CU_ASSERT_EQUAL(router_policy_parse_mode("prefix", &m, &st), 0);
    CU_ASSERT_EQUAL(m, ROUTER_ROUTING_PREFIX);
    CU_ASSERT_EQUAL(router_policy_parse_mode("least", &m, &st), 0);
    CU_ASSERT_EQUAL(m, ROUTER_ROUTING_LEAST);
    CU_ASSERT_EQUAL(router_policy_parse_mode("random", &m, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--routing"));
}

/* ---- pool, with fake connections that count opens and closes ---- */

static int n_open, n_close;
static void *fake_connect(const char *addr, void *ctx)
{
    (void)ctx;
    if (!strcmp(addr, "refuse:1")) return NULL;
    n_open++;
    return (void *)addr; /* any non-NULL token */
}
static void fake_disconnect(void *conn, void *ctx)
{
    (void)conn;
    (void)ctx;
    n_close++;
}

static router_pool *make_pool(router_routing mode)
{
    router_policy pol;
    router_policy_defaults(&pol);
    pol.mode = mode;
    router_pool_ops ops = {fake_connect, fake_disconnect, NULL};
    router_pool *p = NULL;
    status st;
    CU_ASSERT_EQUAL(router_pool_create(&p, &pol, &ops, &st), 0);
    return p;
}

static void mark_all(router_pool *p, int serving)
{
    router_worker *w[16];
    int n = router_pool_snapshot(p, w, 16);
    for (int i = 0; i < n; i++) {
        router_pool_report_health(p, w[i], serving ? ROUTER_CHECK_SERVING : ROUTER_CHECK_NOT_SERVING);
        router_pool_unref(p, w[i]);
    }
}

static void test_pool_set_and_eligibility(void)
{
    n_open = n_close = 0;
    router_pool *p = make_pool(ROUTER_ROUTING_LEAST);
    status st;
    const char *a[] = {"h:1", "h:2", "h:1"};
    CU_ASSERT_EQUAL(router_pool_set(p, a, 3, &st), 2);
    CU_ASSERT_EQUAL(router_pool_n_workers(p), 2);
    CU_ASSERT_EQUAL(n_open, 2);
    uint64_t rng = 9;
    /* unknown until checked: nothing eligible */
    CU_ASSERT_PTR_NULL(router_pool_acquire(p, 0, 10, NULL, 0, &rng));
    mark_all(p, 1);
    CU_ASSERT_EQUAL(router_pool_n_healthy(p), 2);
    router_worker *w1 = router_pool_acquire(p, 0, 100, NULL, 0, &rng);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w1);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w1), 100);
    /* the second request goes to the other, idle worker */
    router_worker *w2 = router_pool_acquire(p, 0, 100, NULL, 0, &rng);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w2);
    CU_ASSERT_PTR_NOT_EQUAL(w1, w2);
    /* excluding both: none */
    router_worker *ex[2] = {w1, w2};
    CU_ASSERT_PTR_NULL(router_pool_acquire(p, 0, 1, ex, 2, &rng));
    /* failure makes a worker ineligible at once */
    router_pool_report_failure(p, w1);
    CU_ASSERT_EQUAL(router_pool_worker_state(p, w1), ROUTER_WORKER_UNHEALTHY);
    router_worker *w3 = router_pool_acquire(p, 0, 1, NULL, 0, &rng);
    CU_ASSERT_PTR_EQUAL(w3, w2);
    router_pool_progress(p, w2, 50);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 51);
    router_pool_release(p, w3, 1);
    router_pool_release(p, w2, 50);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 0);
    /* polled load beyond our own is other routers' traffic and counts once two polls agree */
    router_worker_load l = {.outstanding_tokens = 700, .waiting = 0};
    router_pool_report_load(p, w2, &l);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 0); /* one poll: maybe a spike */
    router_pool_report_load(p, w2, &l);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 700);
    /* a poll that only saw our own requests adds nothing once they finish */
    router_worker *w4 = router_pool_acquire(p, 0, 300, ex, 1, &rng); /* not w1: w2 */
    CU_ASSERT_PTR_EQUAL_FATAL(w4, w2);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 1000);
    router_worker_load l2 = {.outstanding_tokens = 300};
    router_pool_report_load(p, w2, &l2);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 300);
    router_pool_release(p, w4, 300);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 0);
    /* a poll that still sees our ended requests (the worker drops them at its next step) */
    router_worker_load l3 = {.outstanding_tokens = 5000};
    router_pool_report_load(p, w2, &l3);
    CU_ASSERT_EQUAL(router_pool_worker_load(p, w2), 0);
    router_pool_release(p, w1, 100);
    router_pool_destroy(p);
    CU_ASSERT_EQUAL(n_close, 2);
}

/* The health state machine: a healthy worker survives ROUTER_POOL_CHECK_FAILS - 1 unanswered
 * checks in a row (a slow check on a busy machine), leaves at the next; any answer resets the
 * count; an answer of "not serving" and a failed call take it out at once; a worker never
 * seen healthy is out at its first failed check. */
static void test_pool_health_needs_consecutive_failures(void)
{
    n_open = n_close = 0;
    router_pool *p = make_pool(ROUTER_ROUTING_LEAST);
    status st;
    const char *a[] = {"h:1"};
    CU_ASSERT_EQUAL(router_pool_set(p, a, 1, &st), 1);
    router_worker *w;
    CU_ASSERT_EQUAL_FATAL(router_pool_snapshot(p, &w, 1), 1);
    CU_ASSERT_EQUAL(router_pool_worker_state(p, w), ROUTER_WORKER_UNKNOWN);
    /* never healthy: the first failed check says unhealthy (not eligible either way) */
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_FAILED), ROUTER_WORKER_UNHEALTHY);
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_SERVING), ROUTER_WORKER_HEALTHY);
    uint64_t rng = 3;
    for (int round = 0; round < 3; round++) {
        for (int i = 1; i < ROUTER_POOL_CHECK_FAILS; i++) {
            CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_FAILED),
                            ROUTER_WORKER_HEALTHY);
            CU_ASSERT_EQUAL(router_pool_n_healthy(p), 1);
            router_worker *x = router_pool_acquire(p, 0, 1, NULL, 0, &rng);
            CU_ASSERT_PTR_EQUAL(x, w); /* still routed to */
            if (x) router_pool_release(p, x, 1);
        }
        if (round < 2) /* an answer before the last failure resets the count */
            CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_SERVING),
                            ROUTER_WORKER_HEALTHY);
    }
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_FAILED), ROUTER_WORKER_UNHEALTHY);
    CU_ASSERT_EQUAL(router_pool_n_healthy(p), 0);
    CU_ASSERT_PTR_NULL(router_pool_acquire(p, 0, 1, NULL, 0, &rng));
    /* more failures keep it out; one answer brings it back with a fresh count */
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_FAILED), ROUTER_WORKER_UNHEALTHY);
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_SERVING), ROUTER_WORKER_HEALTHY);
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_FAILED), ROUTER_WORKER_HEALTHY);
    /* "not serving" (draining, NOT_SERVING) is an answer: out at once, count or not */
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_NOT_SERVING),
                    ROUTER_WORKER_UNHEALTHY);
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_SERVING), ROUTER_WORKER_HEALTHY);
    /* and so is a failed call */
    router_pool_report_failure(p, w);
    CU_ASSERT_EQUAL(router_pool_worker_state(p, w), ROUTER_WORKER_UNHEALTHY);
    /* after NOT_SERVING then SERVING the count starts from zero */
    CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_SERVING), ROUTER_WORKER_HEALTHY);
    for (int i = 1; i < ROUTER_POOL_CHECK_FAILS; i++)
        CU_ASSERT_EQUAL(router_pool_report_health(p, w, ROUTER_CHECK_FAILED),
                        ROUTER_WORKER_HEALTHY);
    router_pool_unref(p, w);
    router_pool_destroy(p);
    CU_ASSERT_EQUAL(n_close, 1);
}

/* A worker whose polled capacity (slots + queue) is taken by this router's requests is not
 * eligible; the pool is full when every healthy worker is. */
static void test_pool_full_workers_are_skipped(void)
{
    n_open = n_close = 0;
    router_pool *p = make_pool(ROUTER_ROUTING_LEAST);
    status st;
    const char *a[] = {"h:1", "h:2"};
    CU_ASSERT_EQUAL(router_pool_set(p, a, 2, &st), 2);
    CU_ASSERT_FALSE(router_pool_full(p)); /* none healthy: not "full" (UNAVAILABLE instead) */
    mark_all(p, 1);
    router_worker *w[2];
    CU_ASSERT_EQUAL_FATAL(router_pool_snapshot(p, w, 2), 2);
    uint64_t rng = 5;
    /* capacity unknown (no load polled): never full */
    router_worker *x[8];
    for (int i = 0; i < 8; i++) CU_ASSERT_PTR_NOT_NULL(x[i] = router_pool_acquire(p, 0, 1, NULL, 0, &rng));
    CU_ASSERT_FALSE(router_pool_full(p));
    for (int i = 0; i < 8; i++) router_pool_release(p, x[i], 1);
    router_worker_load l = {.total_slots = 1, .queue_capacity = 1};
    for (int i = 0; i < 2; i++) router_pool_report_load(p, w[i], &l);
    /* 2 + 2 requests fit; the fifth finds both full */
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_FALSE(router_pool_full(p));
        CU_ASSERT_PTR_NOT_NULL(x[i] = router_pool_acquire(p, 0, 1, NULL, 0, &rng));
    }
    CU_ASSERT_TRUE(router_pool_full(p));
    CU_ASSERT_PTR_NULL(router_pool_acquire(p, 0, 1, NULL, 0, &rng));
    /* one ends: its worker has room again, and only that one is picked */
    router_worker *freed = x[0];
    router_pool_release(p, x[0], 1);
    CU_ASSERT_FALSE(router_pool_full(p));
    CU_ASSERT_PTR_EQUAL(x[0] = router_pool_acquire(p, 0, 1, NULL, 0, &rng), freed);
    CU_ASSERT_TRUE(router_pool_full(p));
    /* an unhealthy worker does not count: the other one full is the whole pool full */
    router_pool_report_health(p, w[0], ROUTER_CHECK_NOT_SERVING);
    CU_ASSERT_TRUE(router_pool_full(p));
    for (int i = 0; i < 4; i++) router_pool_release(p, x[i], 1);
    CU_ASSERT_FALSE(router_pool_full(p));
    for (int i = 0; i < 2; i++) router_pool_unref(p, w[i]);
    router_pool_destroy(p);
}

static void test_pool_retire_waits_for_requests(void)
{
    n_open = n_close = 0;
    router_pool *p = make_pool(ROUTER_ROUTING_LEAST);
    status st;
    const char *a[] = {"h:1"};
    CU_ASSERT_EQUAL(router_pool_set(p, a, 1, &st), 1);
    mark_all(p, 1);
    uint64_t rng = 1;
    router_worker *w = router_pool_acquire(p, 0, 10, NULL, 0, &rng);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    const char *b[] = {"h:2", "h:3"};
    CU_ASSERT_EQUAL(router_pool_set(p, b, 2, &st), 2);
    CU_ASSERT_EQUAL(router_pool_n_workers(p), 2);
    CU_ASSERT_EQUAL(n_close, 0); /* still used by the request */
    CU_ASSERT_STRING_EQUAL(router_pool_worker_addr(w), "h:1");
    router_pool_release(p, w, 10);
    CU_ASSERT_EQUAL(n_close, 1);
    /* same set again: nothing added or closed */
    CU_ASSERT_EQUAL(router_pool_set(p, b, 2, &st), 0);
    CU_ASSERT_EQUAL(n_close, 1);
    CU_ASSERT_EQUAL(n_open, 3);
    /* a connection that cannot be opened is an error naming the worker */
    const char *c[] = {"h:2", "refuse:1"};
    CU_ASSERT_EQUAL(router_pool_set(p, c, 2, &st), STATUS_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "refuse:1"));
    const char *d[] = {""};
    CU_ASSERT_EQUAL(router_pool_set(p, d, 1, &st), STATUS_INVALID);
    router_pool_destroy(p);
    CU_ASSERT_EQUAL(n_close, 3);
}

/* The pool marks as holder the workers whose last polled load listed the prefix hash. */
static void test_pool_prefix_heads(void)
{
    n_open = n_close = 0;
    router_pool *p = make_pool(ROUTER_ROUTING_PREFIX);
    status st;
    const char *a[] = {"h:1", "h:2", "h:3"};
    CU_ASSERT_EQUAL(router_pool_set(p, a, 3, &st), 3);
    mark_all(p, 1);
    router_worker *w[3];
    CU_ASSERT_EQUAL_FATAL(router_pool_snapshot(p, w, 3), 3);
    int32_t ids[4] = {1, 2, 3, 4};
    uint64_t h = router_policy_prefix_hash(ids, 4, 32);
    uint64_t rng = 5;
    router_worker *rdv = router_pool_acquire(p, h, 1, NULL, 0, &rng);
    CU_ASSERT_PTR_NOT_NULL_FATAL(rdv);
    router_pool_release(p, rdv, 1);
    router_worker *holder = w[0] == rdv ? w[1] : w[0];
    static router_worker_load l; /* 2 KiB of heads: not on the test's stack */
    memset(&l, 0, sizeof l);
    l.prefix_heads[0] = h ^ 1;
    l.prefix_heads[1] = h;
    l.n_prefix_heads = 2;
    router_pool_report_load(p, holder, &l);
    for (int i = 0; i < 10; i++) {
        router_worker *x = router_pool_acquire(p, h, 1, NULL, 0, &rng);
        CU_ASSERT_PTR_EQUAL(x, holder);
        router_pool_release(p, x, 1);
    }
    /* another prefix is not held: rendezvous as before */
    router_worker *y = router_pool_acquire(p, h ^ 1 ^ 2, 1, NULL, 0, &rng);
    CU_ASSERT_PTR_NOT_NULL(y);
    if (y) router_pool_release(p, y, 1);
    /* the next poll without the head forgets it */
    l.n_prefix_heads = 1;
    router_pool_report_load(p, holder, &l);
    router_worker *z = router_pool_acquire(p, h, 1, NULL, 0, &rng);
    CU_ASSERT_PTR_EQUAL(z, rdv);
    router_pool_release(p, z, 1);
    for (int i = 0; i < 3; i++) router_pool_unref(p, w[i]);
    router_pool_destroy(p);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("router/policy", NULL, NULL);
    CU_add_test(s, "least prefers lower load", test_least_prefers_lower_load);
    CU_add_test(s, "none eligible", test_none_eligible);
    CU_add_test(s, "p2c spreads and avoids max", test_p2c_spreads_and_avoids_max);
    CU_add_test(s, "prefix affinity and overload", test_prefix_affinity_and_overload);
    CU_add_test(s, "prefix heads", test_prefix_heads);
    CU_add_test(s, "parse mode", test_parse_mode);
    CU_pSuite s2 = CU_add_suite("router/pool", NULL, NULL);
    CU_add_test(s2, "set and eligibility", test_pool_set_and_eligibility);
    CU_add_test(s2, "retire waits for requests", test_pool_retire_waits_for_requests);
    CU_add_test(s2, "full workers are skipped", test_pool_full_workers_are_skipped);
    CU_add_test(s2, "health needs consecutive failures",
                test_pool_health_needs_consecutive_failures);
    CU_add_test(s2, "prefix heads", test_pool_prefix_heads);
    return testutil_cunit_run();
}
