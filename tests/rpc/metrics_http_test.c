/* rpc/metrics_http: GET /metrics serves the registry's exposition (collect hook run per
 * scrape), 404 elsewhere; a busy port and a malformed address fail naming it. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "rpc/metrics_http.h"
#include "tests/testutil/testutil.h"

static int g_collects;
static void collect(void *arg)
{
    g_collects++;
    metrics_set(arg, 42);
}

/* GET path over a plain socket; returns the whole response in buf. */
static int http_get(int port, const char *path, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)r;
    buf[len] = '\0';
    close(fd);
    return (int)len;
}

static void test_http_endpoint(void)
{
    metrics *m;
    status st;
    CU_ASSERT_EQUAL_FATAL(metrics_create(4, &m, &st), STATUS_OK);
    metrics_series *g = metrics_gauge(m, "deltaserve:num_requests_running", NULL, "Running.");
    metrics_set_collect(m, collect, g);
    metrics_http *h, *h2 = NULL;
    CU_ASSERT_EQUAL_FATAL(metrics_http_start(m, "127.0.0.1:0", &h, &st), STATUS_OK);
    CU_ASSERT(metrics_http_port(h) > 0);
    char buf[4096];
    CU_ASSERT(http_get(metrics_http_port(h), "/metrics", buf, sizeof buf) > 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "200 OK"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "text/plain; version=0.0.4"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\r\n\r\n# HELP deltaserve:num_requests_running Running.\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "deltaserve:num_requests_running 42\n"));
    CU_ASSERT_EQUAL(g_collects, 1);
    CU_ASSERT(http_get(metrics_http_port(h), "/other", buf, sizeof buf) > 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "404"));
    /* a second endpoint on the same port fails, naming the address */
    metrics *m2;
    CU_ASSERT_EQUAL_FATAL(metrics_create(1, &m2, &st), STATUS_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", metrics_http_port(h));
    CU_ASSERT_EQUAL(metrics_http_start(m2, addr, &h2, &st), STATUS_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, addr));
    CU_ASSERT_PTR_NULL(h2);
    CU_ASSERT_EQUAL(metrics_http_start(m2, "no-port", &h2, &st), STATUS_INVALID);
    metrics_destroy(m2);
    metrics_http_stop(h);
    metrics_destroy(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("metrics_http", NULL, NULL);
    CU_add_test(s, "http_endpoint", test_http_endpoint);
    return testutil_cunit_run();
}
