#version 450
// y[m, n] = act(x[m, k] · W[n, k]ᵀ + bias[n]) for one weight type (a W_* define).
//
// A workgroup computes one weight row against up to MT activation rows: each of its 64 threads
// dequantizes every 64th chunk of 16 weights once and multiplies it into each activation row;
// the 64 partial sums are then added in a fixed tree. Every output element is computed by the
// same operations whatever `m` is and wherever its row falls in a tile (batch invariance), and
// nothing depends on timing.
#include "common.glsl"
#include "dequant.glsl"

#define WG 64u
#define MT 8u
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Bytes w;
    Floats x;
    Floats y;
    Floats bias;
    uint m;
    uint k;
    uint n;
    uint row_bytes;
    uint has_bias;
    uint act; // 0: none, else activation code + 1
} p;

shared float red[MT][WG];

void main() {
    uint t = gl_LocalInvocationID.x;
    uint m0 = gl_WorkGroupID.y * MT;
    uint mt = min(MT, p.m - m0);
    uint nchunks = (p.k + 15u) / 16u;
    for (uint row = gl_WorkGroupID.x; row < p.n; row += gl_NumWorkGroups.x) {
        float acc[MT];
        for (uint i = 0u; i < MT; i++) {
            acc[i] = 0.0;
        }
        uint rb = row * p.row_bytes;
        for (uint c = t; c < nchunks; c += WG) {
            float v[16];
            dq16(p.w, rb, p.k, c, v);
            uint e0 = c * 16u;
            uint ne = min(16u, p.k - e0);
            for (uint i = 0u; i < MT; i++) {
                if (i < mt) {
                    uint xb = (m0 + i) * p.k + e0;
                    float s = 0.0;
                    for (uint e = 0u; e < ne; e++) {
                        s = fma(v[e], p.x.v[xb + e], s);
                    }
                    acc[i] += s;
                }
            }
        }
        for (uint i = 0u; i < MT; i++) {
            red[i][t] = acc[i];
        }
        barrier();
        for (uint s = WG / 2u; s > 0u; s >>= 1) {
            if (t < s) {
                for (uint i = 0u; i < MT; i++) {
                    red[i][t] += red[i][t + s];
                }
            }
            barrier();
        }
        if (t < mt) {
            float r = red[t][0];
            if (p.has_bias != 0u) {
                r += p.bias.v[row];
            }
            if (p.act != 0u) {
                r = activate(p.act - 1u, r);
            }
            p.y.v[(m0 + t) * p.n + row] = r;
        }
        barrier();
    }
}
