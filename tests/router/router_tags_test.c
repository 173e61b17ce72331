/* router_tags: the feeds' tag map against a plain array under random puts, gets and removes
 * (tags drawn from a small range, so probe chains collide and wrap, and sequential tags as the
 * feeds assign them), through growth and back to empty; every present tag found with its
 * value, every absent one not, the count exact. */
#include <stdint.h>
#include <stdlib.h>

#include <CUnit/Basic.h>

#include "common/splitmix64.h"
#include "router/router_tags.h"
#include "tests/testutil/testutil.h"

enum { RANGE = 3000, OPS = 200000 };

static void check_all(const router_tags *t, void *const *ref, size_t n_ref, uint64_t base)
{
    size_t n = 0;
    for (uint64_t k = 0; k < RANGE; k++) {
        void *v = router_tags_get(t, base + k);
        CU_ASSERT_PTR_EQUAL(v, ref[k]);
        n += ref[k] != NULL;
    }
    CU_ASSERT_EQUAL(n, n_ref);
    CU_ASSERT_EQUAL(t->n, n_ref);
    CU_ASSERT(2 * t->n <= t->cap || t->cap == 0);
}

static void run(uint64_t base, uint64_t seed, int sequential)
{
    router_tags t = {0};
    void **ref = calloc(RANGE, sizeof *ref);
    CU_ASSERT_FATAL(ref != NULL);
    size_t n = 0;
    uint64_t next = 0, x = seed;
    for (int op = 0; op < OPS; op++) {
        x = splitmix64(x);
        const uint64_t k = sequential && (x >> 40) % 3 == 0 && next < RANGE ? next++ : x % RANGE;
        void *v = (void *)(uintptr_t)(x | 1);
        if (!ref[k] && (x >> 32) % 4 != 0) { /* mostly put while absent */
            CU_ASSERT_EQUAL(router_tags_put(&t, base + k, v), 0);
            ref[k] = v;
            n++;
        } else if (ref[k]) {
            CU_ASSERT(router_tags_remove(&t, base + k));
            ref[k] = NULL;
            n--;
        } else {
            CU_ASSERT(!router_tags_remove(&t, base + k));
        }
        if (op % 20000 == 0) check_all(&t, ref, n, base);
    }
    check_all(&t, ref, n, base);
    for (uint64_t k = 0; k < RANGE; k++) /* down to empty */
        if (ref[k]) {
            CU_ASSERT(router_tags_remove(&t, base + k));
            ref[k] = NULL;
        }
    check_all(&t, ref, 0, base);
    router_tags_free(&t);
    free(ref);
}

static void test_random(void) { run(1, 42, 0); }
static void test_sequential_tags(void) { run(1, 7, 1); }
static void test_high_tags(void) { run(UINT64_MAX - RANGE, 9, 0); }

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("router_tags", NULL, NULL);
    CU_add_test(s, "random", test_random);
    CU_add_test(s, "sequential_tags", test_sequential_tags);
    CU_add_test(s, "high_tags", test_high_tags);
    return testutil_cunit_run();
}
