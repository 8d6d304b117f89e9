#version 450
// Rotary embedding: y = x with, in every head of every row, the first `rope_dim` elements
// turned pairwise ((2i, 2i+1) for style 0, (i, i + rope_dim/2) for style 1) by the angle whose
// cos and sin (already scaled by mscale) the host computed for that row and pair.
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Floats x;
    Floats cs; // per row: rope_dim/2 cosines, then rope_dim/2 sines
    Floats y;
    uint rows;
    uint n_heads;
    uint head_dim;
    uint rope_dim;
    uint neox;
} p;

void main() {
    uint half_dim = p.rope_dim / 2u;
    uint pass_dim = p.head_dim - p.rope_dim;
    uint per_head = half_dim + pass_dim;
    uint total = p.rows * p.n_heads * per_head;
    uint stride = gl_NumWorkGroups.x * 64u;
    for (uint g = gl_GlobalInvocationID.x; g < total; g += stride) {
        uint row = g / (p.n_heads * per_head);
        uint rem = g % (p.n_heads * per_head);
        uint h = rem / per_head;
        uint i = rem % per_head;
        uint base = row * p.n_heads * p.head_dim + h * p.head_dim;
        if (i < half_dim) {
            uint i0 = (p.neox != 0u) ? i : 2u * i;
            uint i1 = (p.neox != 0u) ? i + half_dim : 2u * i + 1u;
            float c = p.cs.v[row * p.rope_dim + i];
            float s = p.cs.v[row * p.rope_dim + half_dim + i];
            float x0 = p.x.v[base + i0];
            float x1 = p.x.v[base + i1];
            p.y.v[base + i0] = x0 * c - x1 * s;
            p.y.v[base + i1] = x0 * s + x1 * c;
        } else {
            uint j = p.rope_dim + (i - half_dim);
            p.y.v[base + j] = p.x.v[base + j];
        }
    }
}
