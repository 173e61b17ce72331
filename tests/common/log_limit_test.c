/* common/log.h's log_limit: the first line of a kind passes, the ones within LOG_LIMIT_MS after
 * it are held back and counted, the next one after the window passes with that count; from
 * several threads at once exactly one line passes per window and none is lost from the count. */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "tests/testutil/testutil.h"

static void wait_window(void)
{
    const long ms = LOG_LIMIT_MS + 50;
    const struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
    nanosleep(&ts, NULL); /* the window is time itself: nothing else to wait on */
}

static void test_one_a_window_with_counts(void)
{
    static log_limit l;
    long more = -1;
    double since = -1;
    CU_ASSERT_EQUAL(log_limit_pass(&l, &more, &since), 1);
    CU_ASSERT_EQUAL(more, 0);
    CU_ASSERT_EQUAL(since, 0.0); /* no line before */
    for (int i = 0; i < 500; i++) CU_ASSERT_EQUAL(log_limit_pass(&l, &more, &since), 0);
    wait_window();
    CU_ASSERT_EQUAL(log_limit_pass(&l, &more, &since), 1);
    CU_ASSERT_EQUAL(more, 500);
    CU_ASSERT(since >= LOG_LIMIT_MS / 1e3 && since < 10.0);
    wait_window();
    CU_ASSERT_EQUAL(log_limit_pass(&l, &more, &since), 1); /* nothing held back since */
    CU_ASSERT_EQUAL(more, 0);
}

static log_limit shared;
static _Atomic long passed, held;

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20000; i++) {
        long more;
        double since;
        if (log_limit_pass(&shared, &more, &since)) {
            atomic_fetch_add(&passed, 1);
            atomic_fetch_add(&held, more);
        }
    }
    return NULL;
}

static void test_threads(void)
{
    pthread_t th[4];
    const int64_t t0 = clock_now_ms();
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    const int64_t took = clock_now_ms() - t0;
    /* one line per window begun during the run */
    CU_ASSERT(passed >= 1 && passed <= 1 + took / LOG_LIMIT_MS);
    wait_window();
    long more;
    double since;
    CU_ASSERT_EQUAL(log_limit_pass(&shared, &more, &since), 1);
    CU_ASSERT_EQUAL(passed + held + more, 4 * 20000); /* every event a line or counted */
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/log_limit", NULL, NULL);
    CU_add_test(s, "one a window, with counts", test_one_a_window_with_counts);
    CU_add_test(s, "threads", test_threads);
    return testutil_cunit_run();
}
