#version 450
// y[m, n] = act(x[m, k] · W[n, k]ᵀ + bias[n]) for many activation rows (prefill) on a device's
// matrix units (VK_KHR_cooperative_matrix: tensor cores on NVIDIA), one weight type (a W_*
// define). The variant of matmul_tiled.comp for devices that offer 16 × 16 × 16 products of f16
// with f32 sums: the same 64 × 64 output tiles and steps of 32 through k, the same weights
// (dq16 of dequant.glsl), but both operands rounded to f16 in shared memory and multiplied by
// subgroups, one 16 × 16 block of the tile at a time, into f32 accumulators.
//
// f16 holds magnitudes below 65,504 only: activation rows are scaled into range (half.glsl).
// Weights must dequantize below 65,504 (every real model's do). Products of f16 values are exact in f32; the order of the sums within a 16 × 16 × 16
// block is the device's own (fixed for a device), so results do not depend on timing.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"
#include "dequant.glsl"

#define BM 64u
#define BN 64u
#define BK 32u
// Rows of the f16 tiles in shared memory: 32 values and 8 of padding (80 bytes, a multiple of
// the 16 bytes a cooperative load's stride needs).
#define BKP 40u
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
    uint half_ops; // (matmul_tiled.comp's)
    uint _pad;
} p;

shared float16_t xs[BM * BKP];
shared float16_t ws[BN * BKP];
shared float cs[BM * BN];
#include "half.glsl"

float16_t to_half(float v) {
    return unpackFloat2x16(float_to_half(v)).x;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint n0 = gl_WorkGroupID.x * BN;
    uint m0 = gl_WorkGroupID.y * BM;

    find_row_exponents(t, m0);

    uint sg = gl_SubgroupID;
    uint n_sg = gl_NumSubgroups;
    // The 16 blocks of the tile, block b = 4·(block row) + (block column), dealt to subgroups
    // in turn: at most 4 each (the host uses this kernel where subgroups have at most 64
    // invocations, so a workgroup has at least 4 of them).
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[4];
    for (uint i = 0u; i < 4u; i++) {
        acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    }
    uint nchunks = (p.k + 15u) / 16u;
    for (uint k0 = 0u; k0 < p.k; k0 += BK) {
        // Activations: 64 rows × 32 values, 8 per thread, scaled and rounded to f16.
        for (uint e = t; e < BM * BK; e += 256u) {
            uint r = e / BK;
            uint c = e % BK;
            uint row = m0 + r;
            uint col = k0 + c;
            float v = (row < p.m && col < p.k) ? p.x.v[row * p.k + col] : 0.0;
            xs[r * BKP + c] = to_half(ldexp(v, -row_exp[r]));
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
                ws[r * BKP + half_k * 16u + e] = to_half(v[e]);
            }
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk += 16u) {
            for (uint i = 0u; i < 4u; i++) {
                uint b = sg + i * n_sg;
                if (b < 16u) {
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> bt;
                    // A: rows of x as stored ([m][k]); B = Wᵀ: ws holds [n][k], column-major.
                    coopMatLoad(a, xs, (b / 4u) * 16u * BKP + kk, BKP,
                                gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(bt, ws, (b % 4u) * 16u * BKP + kk, BKP,
                                gl_CooperativeMatrixLayoutColumnMajor);
                    acc[i] = coopMatMulAdd(a, bt, acc[i]);
                }
            }
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint b = sg + i * n_sg;
        if (b < 16u) {
            coopMatStore(acc[i], cs, (b / 4u) * 16u * BN + (b % 4u) * 16u, BN,
                         gl_CooperativeMatrixLayoutRowMajor);
        }
    }
    barrier();
    for (uint e = t; e < BM * BN; e += 256u) {
        uint r = e / BN;
        uint c = e % BN;
        uint row = m0 + r;
        uint col = n0 + c;
        if (row >= p.m || col >= p.n) {
            continue;
        }
        float v = ldexp(cs[e], row_exp[r]);
        if (p.has_bias != 0u) {
            v += p.bias.v[col];
        }
        if (p.act != 0u) {
            v = activate(p.act - 1u, v);
        }
        p.y.v[row * p.n + col] = v;
    }
}
