/* Counts the process's heap allocations (malloc, calloc, realloc), for tests asserting that a
 * path allocates nothing: a test depending on //tests/testutil:alloc_count is linked with
 * -Wl,--wrap for the three, and every call anywhere in the binary counts once. */
#ifndef DS_TESTS_TESTUTIL_ALLOC_COUNT_H
#define DS_TESTS_TESTUTIL_ALLOC_COUNT_H

/* Allocations so far (any thread). */
long testutil_allocs(void);

#endif
