#version 450
// Norms of each row (one workgroup per row, groups of `group` elements in turn):
// mode 0: y = x / sqrt(mean(x²) + eps) · w, per group of `group` elements;
// mode 1: y = r + (mode 0);
// mode 2: s = x (+ r); y = (s − mean) / sqrt(var + eps) · w (+ b) over the whole row, with the
//         biased variance taken around the mean (two passes).
// Sums run in a fixed order (each thread a fixed stride, then a fixed tree).
#include "common.glsl"

#define WG 64u
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Floats x;
    Floats r;
    Floats w;
    Floats b;
    Floats y;
    uint rows;
    uint cols;
    uint group;
    uint mode;
    uint has_r;
    uint has_b;
    float eps;
} p;

shared float red[WG];

float block_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) {
            red[t] += red[t + s];
        }
        barrier();
    }
    float total = red[0];
    barrier();
    return total;
}

float input_at(uint i) {
    float v = p.x.v[i];
    if (p.mode == 2u && p.has_r != 0u) {
        v += p.r.v[i];
    }
    return v;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
        uint base = row * p.cols;
        if (p.mode == 2u) {
            float s = 0.0;
            for (uint i = t; i < p.cols; i += WG) {
                s += input_at(base + i);
            }
            float mean = block_sum(s) / float(p.cols);
            float q = 0.0;
            for (uint i = t; i < p.cols; i += WG) {
                float c = input_at(base + i) - mean;
                q = fma(c, c, q);
            }
            float var = block_sum(q) / float(p.cols);
            float inv = 1.0 / sqrt(var + p.eps);
            for (uint i = t; i < p.cols; i += WG) {
                float v = (input_at(base + i) - mean) * inv * p.w.v[i];
                if (p.has_b != 0u) {
                    v += p.b.v[i];
                }
                p.y.v[base + i] = v;
            }
        } else {
            for (uint g0 = 0u; g0 < p.cols; g0 += p.group) {
                float s = 0.0;
                for (uint i = t; i < p.group; i += WG) {
                    float v = p.x.v[base + g0 + i];
                    s = fma(v, v, s);
                }
                float ms = block_sum(s) / float(p.group);
                float inv = 1.0 / sqrt(ms + p.eps);
                for (uint i = t; i < p.group; i += WG) {
                    float v = p.x.v[base + g0 + i] * inv * p.w.v[i];
                    if (p.mode == 1u) {
                        v = p.r.v[base + g0 + i] + v;
                    }
                    p.y.v[base + g0 + i] = v;
                }
            }
        }
    }
}
