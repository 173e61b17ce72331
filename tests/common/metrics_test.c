/* common/metrics: exact exposition text for counters, gauges (grouped by name under one
 * HELP/TYPE) and histograms (cumulative buckets, sum, count); atomic updates from many threads
 * add up; metrics_render runs the collect hook and returns the same text. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "common/metrics.h"
#include "tests/testutil/testutil.h"

static void test_format_exact(void)
{
    metrics *m;
    status st;
    CU_ASSERT_EQUAL_FATAL(metrics_create(8, &m, &st), STATUS_OK);
    metrics_series *stop = metrics_counter(m, "ds:req_total", "reason=\"stop\"", "Finished.");
    metrics_series *run = metrics_gauge(m, "ds:running", NULL, "Running.");
    metrics_series *len = metrics_counter(m, "ds:req_total", "reason=\"length\"", "Finished.");
    const double b[] = {0.1, 1};
    metrics_series *h = metrics_histogram(m, "ds:ttft_seconds", "model=\"x\"", "TTFT.", b, 2);
    metrics_inc(stop, 3);
    metrics_inc(len, 1);
    metrics_set(run, 2.5);
    metrics_observe(h, 0.05);
    metrics_observe(h, 0.1); /* le is inclusive */
    metrics_observe(h, 0.5);
    metrics_observe(h, 7);
    const char *want =
        "# HELP ds:req_total Finished.\n"
        "# TYPE ds:req_total counter\n"
        "ds:req_total{reason=\"stop\"} 3\n"
        "ds:req_total{reason=\"length\"} 1\n"
        "# HELP ds:running Running.\n"
        "# TYPE ds:running gauge\n"
        "ds:running 2.5\n"
        "# HELP ds:ttft_seconds TTFT.\n"
        "# TYPE ds:ttft_seconds histogram\n"
        "ds:ttft_seconds_bucket{model=\"x\",le=\"0.1\"} 2\n"
        "ds:ttft_seconds_bucket{model=\"x\",le=\"1\"} 3\n"
        "ds:ttft_seconds_bucket{model=\"x\",le=\"+Inf\"} 4\n"
        "ds:ttft_seconds_sum{model=\"x\"} 7.65\n"
        "ds:ttft_seconds_count{model=\"x\"} 4\n";
    char buf[2048];
    size_t n = metrics_format(m, buf, sizeof buf);
    CU_ASSERT_EQUAL(n, strlen(want));
    CU_ASSERT_STRING_EQUAL(buf, want);
    if (strcmp(buf, want) != 0) printf("\n--- got:\n%s--- want:\n%s", buf, want);
    /* truncation: returns the full length, writes a terminated prefix */
    char small[16];
    CU_ASSERT_EQUAL(metrics_format(m, small, sizeof small), strlen(want));
    CU_ASSERT_EQUAL(strlen(small), sizeof small - 1);
    CU_ASSERT_EQUAL(metrics_value(h), 4);
    metrics_destroy(m);
}

static metrics_series *g_counter, *g_hist;

static void *hammer(void *arg)
{
    for (int i = 0; i < 100000; i++) {
        metrics_inc(g_counter, 1);
        metrics_observe(g_hist, (i % 3) * 0.5);
    }
    return arg;
}

static void test_concurrent_updates(void)
{
    metrics *m;
    status st;
    CU_ASSERT_EQUAL_FATAL(metrics_create(4, &m, &st), STATUS_OK);
    g_counter = metrics_counter(m, "c_total", NULL, "c");
    g_hist = metrics_histogram(m, "h", NULL, "h", metrics_latency_buckets,
                               metrics_n_latency_buckets);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, NULL);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    CU_ASSERT_EQUAL(metrics_value(g_counter), 400000.0);
    CU_ASSERT_EQUAL(metrics_value(g_hist), 400000.0);
    char buf[8192];
    metrics_format(m, buf, sizeof buf);
    /* 0, 0.5, 1.0 each a third of the time (i % 3 over 100000: 33334, 33333, 33333) */
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "h_bucket{le=\"0.001\"} 133336\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "h_bucket{le=\"0.5\"} 266668\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "h_bucket{le=\"1\"} 400000\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "h_sum 199998\n"));
    metrics_destroy(m);
}

static int g_collects;
static void collect(void *arg)
{
    g_collects++;
    metrics_set(arg, 42);
}

static void test_render(void)
{
    metrics *m;
    status st;
    CU_ASSERT_EQUAL_FATAL(metrics_create(2, &m, &st), STATUS_OK);
    metrics_series *g = metrics_gauge(m, "deltaserve:num_requests_running", NULL, "Running.");
    metrics_set_collect(m, collect, g);
    g_collects = 0;
    size_t len = 0;
    char *text = metrics_render(m, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_EQUAL(g_collects, 1);
    CU_ASSERT_STRING_EQUAL(text, "# HELP deltaserve:num_requests_running Running.\n"
                                 "# TYPE deltaserve:num_requests_running gauge\n"
                                 "deltaserve:num_requests_running 42\n");
    CU_ASSERT_EQUAL(len, strlen(text));
    free(text);
    metrics_destroy(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("metrics", NULL, NULL);
    CU_add_test(s, "format_exact", test_format_exact);
    CU_add_test(s, "concurrent_updates", test_concurrent_updates);
    CU_add_test(s, "render", test_render);
    return testutil_cunit_run();
}
