#version 450
// Activations for the integer-dot product (matmul_dot.comp): each block of 32 values of a row of
// x [m, k] (k a multiple of 32) becomes 11 words: the scale d = max|x| / 127 (as f32 bits), the
// 32 codes q = roundEven(x / d) as int8, four to a word (code 4j + i in byte i of word 1 + j),
// and the sums of codes 0..15 and 16..31. |x − d·q| ≤ d/2 (a few ulps aside); a block of zeros
// has d = 0 and codes 0. One invocation per block.
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Floats x;
    Uints xq;
    uint m;
    uint k;
} p;

void main() {
    uint blocks = p.k / 32u;
    uint blk = gl_GlobalInvocationID.x;
    if (blk >= blocks) {
        return;
    }
    for (uint row = gl_WorkGroupID.y; row < p.m; row += gl_NumWorkGroups.y) {
        uint xb = row * p.k + blk * 32u;
        float amax = 0.0;
        for (uint e = 0u; e < 32u; e++) {
            amax = max(amax, abs(p.x.v[xb + e]));
        }
        float inv = (amax > 0.0) ? 127.0 / amax : 0.0;
        uint out_base = (row * blocks + blk) * 11u;
        p.xq.v[out_base] = floatBitsToUint(amax / 127.0);
        int sums[2] = int[2](0, 0);
        for (uint j = 0u; j < 8u; j++) {
            uint word = 0u;
            for (uint i = 0u; i < 4u; i++) {
                int q = clamp(int(roundEven(p.x.v[xb + 4u * j + i] * inv)), -127, 127);
                sums[j / 4u] += q;
                word |= (uint(q) & 0xFFu) << (8u * i);
            }
            p.xq.v[out_base + 1u + j] = word;
        }
        p.xq.v[out_base + 9u] = uint(sums[0]);
        p.xq.v[out_base + 10u] = uint(sums[1]);
    }
}
