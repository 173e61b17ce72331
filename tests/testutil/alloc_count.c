#include "tests/testutil/alloc_count.h"

#include <stdatomic.h>
#include <stddef.h>

static atomic_long n_allocs;

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_malloc(size_t n)
{
    atomic_fetch_add(&n_allocs, 1);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t a, size_t b)
{
    atomic_fetch_add(&n_allocs, 1);
    return __real_calloc(a, b);
}

void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add(&n_allocs, 1);
    return __real_realloc(p, n);
}

long testutil_allocs(void) { return atomic_load(&n_allocs); }
