#version 450
// y[m, n] = act(x[m, k] · W[n, k]ᵀ + bias[n]) for a block weight type (a W_* define) with
// integer dot products (GL_EXT_integer_dot_product; used where the device accelerates them):
// the activations come quantized by quant_act.comp (blocks of 32: an f32 scale, int8 codes,
// sums of 16), the weights as their codes (cq16 of dequant.glsl), and each chunk of 16 is
//   d_x · (scale · Σ q_w·q_x + offset · Σ q_x),
// the integer sum exact (four dotPacked4x8EXT of four code pairs each). The work is laid out as
// in matmul.comp (a subgroup per weight row, lanes over chunks, up to MT activation rows, a
// subgroupAdd), so each output element is computed the same way whatever m is.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_integer_dot_product : require
#include "common.glsl"
#include "dequant.glsl"

#define MT 8u
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Bytes w;
    Uints xq;
    Floats y;
    Floats bias;
    uint m;
    uint k;
    uint n;
    uint row_bytes;
    uint has_bias;
    uint act; // 0: none, else activation code + 1
} p;

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint step = gl_SubgroupSize;
    uint m0 = gl_WorkGroupID.y * MT;
    uint mt = min(MT, p.m - m0);
    uint nchunks = p.k / 16u;
    uint blocks = p.k / 32u;
    uint first = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uint stride = gl_NumWorkGroups.x * gl_NumSubgroups;
    for (uint row = first; row < p.n; row += stride) {
        float acc[MT];
        for (uint i = 0u; i < MT; i++) {
            acc[i] = 0.0;
        }
        uint rb = row * p.row_bytes;
        for (uint c = lane; c < nchunks; c += step) {
            int q[16];
            float scale;
            float offset;
            cq16(p.w, rb, c, q, scale, offset);
            int wq[4];
            for (uint j = 0u; j < 4u; j++) {
                wq[j] = int((uint(q[4u * j]) & 0xFFu) | ((uint(q[4u * j + 1u]) & 0xFFu) << 8)
                    | ((uint(q[4u * j + 2u]) & 0xFFu) << 16) | (uint(q[4u * j + 3u]) << 24));
            }
            uint half16 = c % 2u;
            for (uint i = 0u; i < MT; i++) {
                if (i < mt) {
                    uint xb = ((m0 + i) * blocks + c / 2u) * 11u;
                    int s = 0;
                    for (uint j = 0u; j < 4u; j++) {
                        s += dotPacked4x8EXT(wq[j], int(p.xq.v[xb + 1u + half16 * 4u + j]));
                    }
                    float dx = uintBitsToFloat(p.xq.v[xb]);
                    float sx = float(int(p.xq.v[xb + 9u + half16]));
                    acc[i] += dx * (scale * float(s) + offset * sx);
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
