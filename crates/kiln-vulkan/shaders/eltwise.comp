#version 450
// Element-wise ops over n values: 0 a + b, 1 a · b, 2 a · s, 3 act(a), 4 act(a) · b.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Push {
    Floats a;
    Floats b;
    Floats y;
    uint n;
    uint op;
    uint act;
    float s;
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        float a = p.a.v[i];
        float r;
        if (p.op == 0u) {
            r = a + p.b.v[i];
        } else if (p.op == 1u) {
            r = a * p.b.v[i];
        } else if (p.op == 2u) {
            r = a * p.s;
        } else if (p.op == 3u) {
            r = activate(p.act, a);
        } else {
            r = activate(p.act, a) * p.b.v[i];
        }
        p.y.v[i] = r;
    }
}
