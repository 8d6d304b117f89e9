#version 450
// Rows of an f32 tensor into an f16 KV cache, rounded to nearest-even. Mode 0 checks: a finite
// value of 65520 or more (an f16 infinity) sets bit 0 of `flag`. Mode 1 writes, unless the
// flag is set (so a refused write leaves the cache as it was; the host reports the flag as a
// range error at its next read back).
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Push {
    Floats src;
    Halves dst;
    Uints flag;
    uint n;
    uint dst_offset;
    uint mode;
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    if (p.mode == 0u) {
        bool bad = false;
        for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
            bad = bad || half_overflows(p.src.v[i]);
        }
        if (bad) {
            atomicOr(p.flag.v[0], 1u);
        }
        return;
    }
    if (p.flag.v[0] != 0u) {
        return;
    }
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        p.dst.v[p.dst_offset + i] = uint16_t(float_to_half(p.src.v[i]));
    }
}
