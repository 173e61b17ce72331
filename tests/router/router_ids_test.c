/* router_ids: Abort's view of the live requests. An unknown id is not found; a waiting request
 * is marked aborted without a worker to reach; a running one lists its worker once (held) and
 * its call is cancelled only on that worker; a request that attaches after the abort learns it
 * at once; unregistered requests are gone. */
#include <string.h>

#include <CUnit/Basic.h>

#include "router/router_ids.h"
#include "tests/testutil/testutil.h"

static int held[4], cancelled[4];

static void hold(void *w, void *ctx)
{
    (void)ctx;
    held[(int *)w - held]++;
}

static void cancel(void *call, void *ctx)
{
    (void)ctx;
    cancelled[(int *)call - cancelled]++;
}

static void test_abort(void)
{
    router_ids *ids;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_ids_create(&ids, &st), STATUS_OK);
    memset(held, 0, sizeof held);
    memset(cancelled, 0, sizeof cancelled);
    router_live a, b, c, d;
    router_ids_register(ids, &a, "req-a");  /* waiting for a worker */
    router_ids_register(ids, &b, "req-b");  /* on worker 0 */
    router_ids_register(ids, &c, "req-b");  /* the same id, also on worker 0 */
    router_ids_register(ids, &d, "req-d");  /* on worker 1 */
    CU_ASSERT_EQUAL(router_ids_attach(ids, &b, &held[0], &cancelled[0]), 0);
    CU_ASSERT_EQUAL(router_ids_attach(ids, &c, &held[0], &cancelled[1]), 0);
    CU_ASSERT_EQUAL(router_ids_attach(ids, &d, &held[1], &cancelled[2]), 0);

    void *ws[4];
    int nw = -1;
    CU_ASSERT_EQUAL(router_ids_abort(ids, "req-nope", hold, NULL, ws, 4, &nw), 0);
    CU_ASSERT_EQUAL(nw, 0);
    CU_ASSERT_EQUAL(router_ids_abort(ids, "req-a", hold, NULL, ws, 4, &nw), 1);
    CU_ASSERT_EQUAL(nw, 0);
    CU_ASSERT(router_ids_aborted(ids, &a));
    CU_ASSERT(!router_ids_aborted(ids, &b));

    CU_ASSERT_EQUAL(router_ids_abort(ids, "req-b", hold, NULL, ws, 4, &nw), 2);
    CU_ASSERT_EQUAL(nw, 1); /* one worker, listed and held once */
    CU_ASSERT_PTR_EQUAL(ws[0], &held[0]);
    CU_ASSERT_EQUAL(held[0], 1);
    CU_ASSERT(router_ids_aborted(ids, &b) && router_ids_aborted(ids, &c));
    CU_ASSERT(!router_ids_aborted(ids, &d));
    /* cancelling on another worker touches nothing; on worker 0 both calls */
    CU_ASSERT_EQUAL(router_ids_cancel(ids, "req-b", &held[1], cancel, NULL), 0);
    CU_ASSERT_EQUAL(router_ids_cancel(ids, "req-b", &held[0], cancel, NULL), 2);
    CU_ASSERT(cancelled[0] == 1 && cancelled[1] == 1 && cancelled[2] == 0);
    /* detached: nothing to cancel any more */
    router_ids_detach(ids, &b);
    CU_ASSERT_EQUAL(router_ids_cancel(ids, "req-b", &held[0], cancel, NULL), 1);

    /* a request aborted while waiting learns it when its attempt starts */
    CU_ASSERT_EQUAL(router_ids_attach(ids, &a, &held[2], &cancelled[3]), 1);

    router_ids_unregister(ids, &a);
    router_ids_unregister(ids, &b);
    router_ids_unregister(ids, &c);
    CU_ASSERT_EQUAL(router_ids_abort(ids, "req-b", hold, NULL, ws, 4, &nw), 0);
    CU_ASSERT_EQUAL(router_ids_abort(ids, "req-d", hold, NULL, ws, 4, &nw), 1);
    CU_ASSERT_EQUAL(held[1], 1);
    router_ids_unregister(ids, &d);
    router_ids_destroy(ids);
}

/* An id longer than the limit is kept cut, and found by the cut id only. */
static void test_long_id(void)
{
    router_ids *ids;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_ids_create(&ids, &st), STATUS_OK);
    char rid[ROUTER_IDS_ID_MAX + 2];
    memset(rid, 'x', sizeof rid - 1);
    rid[sizeof rid - 1] = 0;
    router_live e;
    router_ids_register(ids, &e, rid);
    void *ws[1];
    int nw;
    CU_ASSERT_EQUAL(router_ids_abort(ids, rid, hold, NULL, ws, 1, &nw), 0);
    rid[ROUTER_IDS_ID_MAX] = 0;
    CU_ASSERT_EQUAL(router_ids_abort(ids, rid, hold, NULL, ws, 1, &nw), 1);
    router_ids_unregister(ids, &e);
    router_ids_destroy(ids);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("router_ids", NULL, NULL);
    CU_add_test(s, "abort", test_abort);
    CU_add_test(s, "long_id", test_long_id);
    return testutil_cunit_run();
}
