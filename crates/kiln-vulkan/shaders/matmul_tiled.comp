#version 450
// y[m, n] = act(x[m, k] · W[n, k]ᵀ + bias[n]) for many activation rows (prefill), one weight type
// (a W_* define): a workgroup computes a 64 × 64 tile of y, stepping through k 32 at a time with
// the activations and the dequantized weights of the step in shared memory; each of its 256
// threads accumulates a 4 × 4 block of the tile. Sums run in a fixed order (k ascending), so
// results do not depend on timing; a row's results do depend on the tile it falls in relative
// to the one-row kernel, which is why batch-invariant mode never uses this kernel.
//
// With p.half_ops set, operands are rounded as matmul_coop.comp rounds them (half.glsl):
// activation rows scaled into f16's range, activations and weights rounded to f16, sums scaled
// back. Tests use it to check that rounding on devices without matrix units.
#include "common.glsl"
#include "dequant.glsl"

#define BM 64u
#define BN 64u
#define BK 32u
layout(local_size_x = 256) in;

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
    uint half_ops;
    uint _pad;
} p;

#include "half.glsl"

shared float xs[BK][BM + 1u];
shared float ws[BK][BN + 1u];

void main() {
    uint t = gl_LocalInvocationID.x;
    uint tx = t % 16u;
    uint ty = t / 16u;
    uint n0 = gl_WorkGroupID.x * BN;
    uint m0 = gl_WorkGroupID.y * BM;
    if (p.half_ops != 0u) {
        find_row_exponents(t, m0);
    }
    float acc[4][4];
    for (uint i = 0u; i < 4u; i++) {
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    uint nchunks = (p.k + 15u) / 16u;
    for (uint k0 = 0u; k0 < p.k; k0 += BK) {
        // Activations: 64 rows × 32 values, 8 per thread.
        for (uint e = t; e < BM * BK; e += 256u) {
            uint r = e / BK;
            uint c = e % BK;
            uint row = m0 + r;
            uint col = k0 + c;
            float v = (row < p.m && col < p.k) ? p.x.v[row * p.k + col] : 0.0;
            xs[c][r] = (p.half_ops != 0u) ? round_half(ldexp(v, -row_exp[r])) : v;
        }
        // Weights: 64 rows × 2 chunks of 16, one chunk per thread of the first 128.
        if (t < BN * 2u) {
            uint r = t / 2u;
            uint half_k = t % 2u;
            uint row = n0 + r;
            uint chunk = k0 / 16u + half_k;
            float v[16];
            if (row < p.n && chunk < nchunks) {
                dq16(p.w, row * p.row_bytes, p.k, chunk, v);
            } else {
                for (uint e = 0u; e < 16u; e++) {
                    v[e] = 0.0;
                }
            }
            for (uint e = 0u; e < 16u; e++) {
                ws[half_k * 16u + e][r] = (p.half_ops != 0u) ? round_half(v[e]) : v[e];
            }
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float a[4];
            float b[4];
            for (uint i = 0u; i < 4u; i++) {
                a[i] = xs[kk][ty * 4u + i];
                b[i] = ws[kk][tx * 4u + i];
            }
            for (uint i = 0u; i < 4u; i++) {
                for (uint j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(a[i], b[j], acc[i][j]);
                }
            }
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint row = m0 + ty * 4u + i;
        if (row >= p.m) {
            continue;
        }
        for (uint j = 0u; j < 4u; j++) {
            uint col = n0 + tx * 4u + j;
            if (col >= p.n) {
                continue;
            }
            float r = (p.half_ops != 0u) ? ldexp(acc[i][j], row_exp[ty * 4u + i]) : acc[i][j];
            if (p.has_bias != 0u) {
                r += p.bias.v[col];
            }
            if (p.act != 0u) {
                r = activate(p.act - 1u, r);
            }
            p.y.v[row * p.n + col] = r;
        }
    }
}
