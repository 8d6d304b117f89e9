#version 450
// y[m, n] = act(x[m, k] · W[n, k]ᵀ + bias[n]) for one weight type (a W_* define).
//
// Each subgroup computes one weight row against up to MT activation rows: lane l dequantizes
// chunks l, l + S, l + 2S, … (S the subgroup size) of 16 weights once and multiplies each into
// every activation row; the lanes' sums are then added by subgroupAdd. There are no barriers and
// no shared memory (a software device pays dearly for both). Every output element is computed
// by the same operations whatever `m` is and wherever its row falls in a tile (batch
// invariance), and nothing depends on timing.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "dequant.glsl"

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
    uint half_ops; // (matmul_tiled.comp's)
    uint _pad;
} p;

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint step = gl_SubgroupSize;
    uint m0 = gl_WorkGroupID.y * MT;
    uint mt = min(MT, p.m - m0);
    uint nchunks = (p.k + 15u) / 16u;
    uint first = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint stride = gl_NumWorkGroups.x * gl_NumSubgroups;
    for (uint row = first; row < p.n; row += stride) {
        float acc[MT];
        for (uint i = 0u; i < MT; i++) {
            acc[i] = 0.0;
        }
        uint rb = row * p.row_bytes;
        for (uint c = lane; c < nchunks; c += step) {
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
            float r = subgroupAdd(acc[i]);
            if (lane == 0u && i < mt) {
                if (p.has_bias != 0u) {
                    r += p.bias.v[row];
                }
                if (p.act != 0u) {
                    r = activate(p.act - 1u, r);
                }
                p.y.v[(m0 + i) * p.n + row] = r;
            }
        }
    }
}
