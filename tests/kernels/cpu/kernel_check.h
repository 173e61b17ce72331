/* Element-wise comparison for kernel tests: |got - ref| <= atol + rtol·|ref| for every element,
 * plus the normalised MSE; prints the first mismatches (docs/STYLE.md "Tests"). */
#ifndef DS_TESTS_KERNELS_CPU_KERNEL_CHECK_H
#define DS_TESTS_KERNELS_CPU_KERNEL_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* Returns the number of elements outside the bound (NaN counts); prints up to 5 of them. */
static inline long kernel_check(const char *what, const float *got, const float *ref, long n,
                                double atol, double rtol)
{
    long bad = 0;
    double se = 0, sr = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        se += d * d;
        sr += (double)ref[i] * ref[i];
        if (!(d <= atol + rtol * fabs(ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "  %s[%ld]: got %.8g ref %.8g (|d| %.3g)\n", what, i, got[i], ref[i], d);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "  %s: %ld of %ld outside atol %g rtol %g, nmse %.3g\n", what, bad, n, atol, rtol, sr > 0 ? se / sr : se);
    return bad;
}

/* Largest |got - ref| over the largest |ref| (the reference-logit criterion). */
static inline double kernel_rel_max(const float *got, const float *ref, long n)
{
    double md = 0, mr = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= md)) md = d; /* NaN propagates as infinity */
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}

/* xorshift64*: deterministic test data. */
typedef struct kc_rng { uint64_t s; } kc_rng;
static inline double kc_uniform(kc_rng *r) /* [0, 1) */
{
    r->s ^= r->s >> 12, r->s ^= r->s << 25, r->s ^= r->s >> 27;
    return (double)((r->s * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}
static inline float kc_sym(kc_rng *r, float a) { return (float)((2 * kc_uniform(r) - 1) * a); }
static inline void kc_fill(kc_rng *r, float *x, long n, float a)
{
    for (long i = 0; i < n; i++) x[i] = kc_sym(r, a);
}

#endif
