#version 450
// dst[index[i]] += weights[i] · src[i] for each row i of src, in order of i (one thread per
// column, so rows that share a destination add up in order).
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Floats dst;
    Floats src;
    Uints index;
    Floats weights;
    uint n;
    uint cols;
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 64u;
    for (uint c = gl_GlobalInvocationID.x; c < p.cols; c += stride) {
        for (uint i = 0u; i < p.n; i++) {
            uint d = p.index.v[i] * p.cols + c;
            p.dst.v[d] = p.dst.v[d] + p.weights.v[i] * p.src.v[i * p.cols + c];
        }
    }
}
