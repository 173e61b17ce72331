/* common/clock: the three resolutions agree and never go back; deadline arithmetic, including
 * "no deadline"; a timed wait on a clock_cond_init condition variable times out at the
 * deadline and not long after. */
#include <CUnit/Basic.h>
#include <pthread.h>

#include "common/clock.h"
#include "tests/testutil/testutil.h"

static void test_now(void)
{
    const int64_t ns = clock_now_ns(), us = clock_now_us(), ms = clock_now_ms();
    CU_ASSERT(ns > 0);
    CU_ASSERT(us >= ns / 1000 && us - ns / 1000 < 1000000); /* read after ns, within a second */
    CU_ASSERT(ms >= ns / 1000000 && ms - ns / 1000000 < 1000);
    int64_t prev = clock_now_ns();
    for (int i = 0; i < 10000; i++) {
        const int64_t t = clock_now_ns();
        CU_ASSERT(t >= prev);
        prev = t;
    }
}

static void test_deadlines(void)
{
    CU_ASSERT_EQUAL(clock_deadline_ms(CLOCK_NO_DEADLINE), CLOCK_NO_DEADLINE);
    CU_ASSERT_EQUAL(clock_deadline_ms(INT64_MAX - 1), CLOCK_NO_DEADLINE); /* saturates */
    CU_ASSERT_EQUAL(clock_left_ms(CLOCK_NO_DEADLINE), CLOCK_NO_DEADLINE);
    CU_ASSERT_FALSE(clock_expired(CLOCK_NO_DEADLINE));
    const int64_t d = clock_deadline_ms(60000);
    CU_ASSERT(clock_left_ms(d) > 59000 && clock_left_ms(d) <= 60000);
    CU_ASSERT_FALSE(clock_expired(d));
    CU_ASSERT_TRUE(clock_expired(clock_deadline_ms(-1)));
    CU_ASSERT_TRUE(clock_expired(clock_now_ms()));
    const struct timespec ts = clock_timespec_ms(12345);
    CU_ASSERT(ts.tv_sec == 12 && ts.tv_nsec == 345000000);
}

static void test_timed_wait(void)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    CU_ASSERT_EQUAL_FATAL(clock_cond_init(&cv), 0);
    const int64_t t0 = clock_now_ms(), deadline = clock_deadline_ms(50);
    const struct timespec ts = clock_timespec_ms(deadline);
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (rc == 0) rc = pthread_cond_timedwait(&cv, &mu, &ts); /* nobody signals */
    pthread_mutex_unlock(&mu);
    const int64_t took = clock_now_ms() - t0;
    CU_ASSERT(clock_expired(deadline));
    CU_ASSERT(took >= 49 && took < 5000); /* on the monotonic clock, not 1970's */
    pthread_cond_destroy(&cv);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/clock", NULL, NULL);
    CU_add_test(s, "now", test_now);
    CU_add_test(s, "deadlines", test_deadlines);
    CU_add_test(s, "timed_wait", test_timed_wait);
    return testutil_cunit_run();
}
