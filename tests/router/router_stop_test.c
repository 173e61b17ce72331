#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "router/router_stop.h"
#include "tests/testutil/testutil.h"

/* Feeds pieces, concatenates what is released; returns the matched index (-1 = none, flushed). */
static int run(const char *const *stops, int n_stops, const char *const *pieces, int n_pieces,
               char *out, size_t out_cap)
{
    router_stop s;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_stop_init(&s, stops, n_stops, &st), 0);
    size_t len = 0;
    int m = -1;
    for (int i = 0; i < n_pieces && m < 0; i++) {
        const char *o;
        size_t no;
        m = router_stop_push(&s, pieces[i], strlen(pieces[i]), &o, &no, &st);
        CU_ASSERT_FATAL(len + no < out_cap);
        memcpy(out + len, o, no);
        len += no;
    }
    if (m < 0) {
        const char *o;
        size_t no;
        router_stop_flush(&s, &o, &no);
        memcpy(out + len, o, no);
        len += no;
    }
    out[len] = 0;
    router_stop_free(&s);
    return m;
}

static void test_no_stops_passes_through(void)
{
    const char *pieces[] = {"Hello", ", ", "world"};
    char out[64];
    CU_ASSERT_EQUAL(run(NULL, 0, pieces, 3, out, sizeof out), -1);
    CU_ASSERT_STRING_EQUAL(out, "Hello, world");
}

static void test_stop_inside_one_piece_is_trimmed(void)
{
    const char *stops[] = {"END"};
    const char *pieces[] = {"abc", "dEND", "never"};
    char out[64];
    CU_ASSERT_EQUAL(run(stops, 1, pieces, 3, out, sizeof out), 0);
    CU_ASSERT_STRING_EQUAL(out, "abcd");
}

static void test_stop_across_pieces_is_held_back(void)
{
    const char *stops[] = {"\n\nUser:"};
    router_stop s;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_stop_init(&s, stops, 1, &st), 0);
    const char *o;
    size_t n;
    CU_ASSERT_EQUAL(router_stop_push(&s, "Hi there\n", 9, &o, &n, &st), -1);
    CU_ASSERT_EQUAL(n, 8); /* the newline may begin the stop: held */
    CU_ASSERT_EQUAL(memcmp(o, "Hi there", 8), 0);
    CU_ASSERT_EQUAL(router_stop_push(&s, "\nUs", 3, &o, &n, &st), -1);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_EQUAL(router_stop_push(&s, "er:", 3, &o, &n, &st), 0);
    CU_ASSERT_EQUAL(n, 0);
    /* after a match nothing more is released */
    CU_ASSERT_EQUAL(router_stop_push(&s, "more", 4, &o, &n, &st), 0);
    CU_ASSERT_EQUAL(n, 0);
    router_stop_free(&s);
}

static void test_false_prefix_is_released(void)
{
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"xST", "Oy", "z"};
    char out[64];
    CU_ASSERT_EQUAL(run(stops, 1, pieces, 3, out, sizeof out), -1);
    CU_ASSERT_STRING_EQUAL(out, "xSTOyz");
}

static void test_held_prefix_flushed_at_end(void)
{
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"abcST"};
    char out[64];
    CU_ASSERT_EQUAL(run(stops, 1, pieces, 1, out, sizeof out), -1);
    CU_ASSERT_STRING_EQUAL(out, "abcST");
}

static void test_earliest_of_several_wins(void)
{
    const char *stops[] = {"cd", "bcdef", "b"};
    const char *pieces[] = {"a", "bcdefg"};
    char out[64];
    /* "b" starts at 1 like "bcdef"; "b" and "bcdef" tie on start, the first listed wins */
    CU_ASSERT_EQUAL(run(stops, 3, pieces, 2, out, sizeof out), 1);
    CU_ASSERT_STRING_EQUAL(out, "a");
    const char *stops2[] = {"de", "cd"};
    CU_ASSERT_EQUAL(run(stops2, 2, pieces, 2, out, sizeof out), 1);
    CU_ASSERT_STRING_EQUAL(out, "ab");
}

static void test_utf8_boundaries(void)
{
    /* stop "é!" (c3 a9 21); text pieces are whole characters */
    const char *stops[] = {"\xc3\xa9!"};
    router_stop s;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_stop_init(&s, stops, 1, &st), 0);
    const char *o;
    size_t n;
    CU_ASSERT_EQUAL(router_stop_push(&s, "caf\xc3\xa9", 5, &o, &n, &st), -1);
    CU_ASSERT_EQUAL(n, 3);
    CU_ASSERT(utf8_valid(o, n));
    CU_ASSERT_EQUAL(router_stop_push(&s, "?", 1, &o, &n, &st), -1);
    CU_ASSERT_EQUAL(n, 3);
    CU_ASSERT_EQUAL(memcmp(o, "\xc3\xa9?", 3), 0);
    router_stop_free(&s);
}

static void test_validation(void)
{
    router_stop s;
    status st;
    const char *empty[] = {"ok", ""};
    CU_ASSERT_EQUAL(router_stop_init(&s, empty, 2, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "stop[1]"));
    const char *bad[] = {"\xc3"};
    CU_ASSERT_EQUAL(router_stop_init(&s, bad, 1, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "UTF-8"));
    const char *many[ROUTER_STOP_MAX + 1];
    for (int i = 0; i <= ROUTER_STOP_MAX; i++) many[i] = "x";
    CU_ASSERT_EQUAL(router_stop_init(&s, many, ROUTER_STOP_MAX + 1, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "stop"));
    char big[ROUTER_STOP_MAX_BYTES + 2];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *longs[] = {big};
    CU_ASSERT_EQUAL(router_stop_init(&s, longs, 1, &st), STATUS_INVALID);
}

/* Random pieces: the released text plus the trimmed stop always reproduces the input up to the
 * first occurrence, and never contains a stop string. */
static void test_random_against_naive(void)
{
    const char *stops[] = {"aba", "bb", "abcab"};
    unsigned seed = 7;
    for (int iter = 0; iter < 2000; iter++) {
        char text[64];
        int tl = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 40;
        for (int i = 0; i < tl; i++)
            text[i] = "abc"[((seed = seed * 1103515245u + 12345u) >> 16) % 3];
        text[tl] = 0;
        /* naive: earliest start, first listed at ties */
        int want = -1;
        size_t want_at = 0;
        for (size_t p = 0; p < (size_t)tl && want < 0; p++)
            for (int k = 0; k < 3; k++)
                if (!strncmp(text + p, stops[k], strlen(stops[k]))) {
                    want = k;
                    want_at = p;
                    break;
                }
        /* split into random pieces */
        char pieces_buf[64][64];
        const char *pieces[64];
        int np = 0;
        for (int p = 0; p < tl;) {
            int l = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 4;
            if (p + l > tl) l = tl - p;
            memcpy(pieces_buf[np], text + p, l);
            pieces_buf[np][l] = 0;
            pieces[np] = pieces_buf[np];
            np++;
            p += l;
        }
        char out[128];
        int m = run(stops, 3, pieces, np, out, sizeof out);
        CU_ASSERT_EQUAL(m, want);
        if (want >= 0) {
            CU_ASSERT_EQUAL(strlen(out), want_at);
            CU_ASSERT_EQUAL(strncmp(out, text, want_at), 0);
        } else {
            CU_ASSERT_STRING_EQUAL(out, text);
        }
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("router/stop", NULL, NULL);
    CU_add_test(s, "no stops passes through", test_no_stops_passes_through);
    CU_add_test(s, "stop inside one piece is trimmed", test_stop_inside_one_piece_is_trimmed);
    CU_add_test(s, "stop across pieces is held back", test_stop_across_pieces_is_held_back);
    CU_add_test(s, "false prefix is released", test_false_prefix_is_released);
    CU_add_test(s, "held prefix flushed at end", test_held_prefix_flushed_at_end);
    CU_add_test(s, "earliest of several wins", test_earliest_of_several_wins);
    CU_add_test(s, "utf8 boundaries", test_utf8_boundaries);
    CU_add_test(s, "validation", test_validation);
    CU_add_test(s, "random against naive", test_random_against_naive);
    return testutil_cunit_run();
}
