#include "kernels/cpu/rope.h"

#include <math.h>

void ref_rope(float *x, int n_heads, int d_h, int n_rot, int pos, float base)
{
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(base, (float)(2 * i) / (float)n_rot);
        float ang = (float)pos * inv_freq;
        float c = cosf(ang), s = sinf(ang);
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + (long)h * d_h;
            float a = xh[i], b = xh[i + half];
            xh[i] = a * c - b * s;
            xh[i + half] = a * s + b * c;
        }
    }
}
