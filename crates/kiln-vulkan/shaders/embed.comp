#version 450
// y[i, :] = row ids[i] of an embedding table of one weight type (a W_* define), as f32: one
// thread per chunk of 16 elements.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Bytes w;
    Uints ids;
    Floats y;
    uint n_ids;
    uint k;
    uint row_bytes;
} p;

void main() {
    uint nchunks = (p.k + 15u) / 16u;
    uint total = p.n_ids * nchunks;
    uint stride = gl_NumWorkGroups.x * 64u;
    for (uint g = gl_GlobalInvocationID.x; g < total; g += stride) {
        uint i = g / nchunks;
        uint c = g % nchunks;
        float v[16];
        dq16(p.w, p.ids.v[i] * p.row_bytes, p.k, c, v);
        uint e0 = c * 16u;
        uint ne = min(16u, p.k - e0);
        for (uint e = 0u; e < ne; e++) {
            p.y.v[i * p.k + e0 + e] = v[e];
        }
    }
}
