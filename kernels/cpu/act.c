#include "kernels/cpu/act.h"

void ref_swiglu(const float *gate, const float *up, int n, float *out)
{
    for (int i = 0; i < n; i++) out[i] = ref_silu(gate[i]) * up[i];
}

void ref_sigmoid_gate(float *o, const float *gate, int n)
{
    for (int i = 0; i < n; i++) o[i] *= ref_sigmoid(gate[i]);
}

void ref_add(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += x[i];
}
