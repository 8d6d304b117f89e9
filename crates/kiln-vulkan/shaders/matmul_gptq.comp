#version 450
// y[m, n] = act(x[m, k] · W[n, k]ᵀ + bias[n]) for a GPTQ 4-bit matrix, kept packed: row j holds
// k/2 bytes of codes in packed order (position p is nibble p % 2 of byte p / 2), a scale and a
// zero point per group of `group` packed positions, and packed position p multiplies input
// perm[p] (the identity without a permutation). The weight is scale · (code − zero).
//
// The same scheme as matmul.comp: a subgroup per weight row, lanes over chunks of 16 packed
// positions, subgroupAdd of the lanes' sums; no barriers, nothing depends on timing, and each
// output element is computed the same way whatever the other rows are.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"

#define MT 8u
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Bytes codes;
    Floats x;
    Floats y;
    Floats bias;
    Floats scales;
    Uints zeros;
    Uints perm;
    uint m;
    uint k;
    uint n;
    uint group;
    uint has_bias;
    uint has_perm;
    uint act; // 0: none, else activation code + 1
    uint pad;
} p;

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint step = gl_SubgroupSize;
    uint m0 = gl_WorkGroupID.y * MT;
    uint mt = min(MT, p.m - m0);
    uint nchunks = p.k / 16u;
    uint groups = p.k / p.group;
    uint first = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint stride = gl_NumWorkGroups.x * gl_NumSubgroups;
    for (uint row = first; row < p.n; row += stride) {
        float acc[MT];
        for (uint i = 0u; i < MT; i++) {
            acc[i] = 0.0;
        }
        for (uint c = lane; c < nchunks; c += step) {
            uint p0 = c * 16u;
            uint g = row * groups + p0 / p.group;
            float scale = p.scales.v[g];
            int zero = int(p.zeros.v[g]);
            float v[16];
            for (uint e = 0u; e < 16u; e += 2u) {
                uint b = uint(p.codes.v[row * (p.k / 2u) + (p0 + e) / 2u]);
                v[e] = scale * float(int(b & 15u) - zero);
                v[e + 1u] = scale * float(int(b >> 4) - zero);
            }
            for (uint i = 0u; i < MT; i++) {
                if (i < mt) {
                    uint xb = (m0 + i) * p.k;
                    float s = 0.0;
                    for (uint e = 0u; e < 16u; e++) {
                        uint col = (p.has_perm != 0u) ? p.perm.v[p0 + e] : p0 + e;
                        s = fma(v[e], p.x.v[xb + col], s);
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
