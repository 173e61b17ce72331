#include "kernels/cpu/norm.h"

#include <math.h>

#include "kernels/cpu/act.h"

void ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y)
{
    double ss = 0; /* double: the sum of n squares must not lose the small ones */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    if (w)
        for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

void ref_rmsnorm_heads(float *x, const float *w, int n_heads, int d, float eps)
{
    for (int h = 0; h < n_heads; h++) ref_rmsnorm(x + (long)h * d, w, d, eps, x + (long)h * d);
}

void ref_l2norm(float *x, int n, float eps, float scale)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss + eps)) * scale;
    for (int i = 0; i < n; i++) x[i] *= r;
}

void ref_rmsnorm_gated(float *o, const float *z, const float *w, int d, float eps)
{
    ref_rmsnorm(o, w, d, eps, o);
    for (int i = 0; i < d; i++) o[i] *= ref_silu(z[i]);
}
