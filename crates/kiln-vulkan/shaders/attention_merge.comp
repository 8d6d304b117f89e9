#version 450
// The output rows of attention.comp when a row's keys span several chunks: workgroup (h, r)
// combines the parts of query row row0 + r and head h in chunk order,
//   o = Σ_c e^(m_c − M) · acc_c / Σ_c e^(m_c − M) · l_c,   M = max_c m_c,
// skipping empty chunks (l_c = 0). Each lane owns head elements d = lane + 64·a, and the sums
// run over chunks in a fixed order, so the result depends only on the row's own parts.
#include "common.glsl"

#define WG 64u
#define MAX_HD 256u
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Floats part;
    Floats o;
    uint n_q;
    uint row0;
    uint n_heads;
    uint head_dim;
    uint n_chunks;
    uint _pad;
} p;

void main() {
    uint t = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint hd = p.head_dim;
    uint stride = hd + 2u;
    for (uint r = gl_WorkGroupID.y; r < p.n_q; r += gl_NumWorkGroups.y) {
        uint base = (r * p.n_heads + h) * p.n_chunks * stride;
        float mx = -1.0 / 0.0;
        for (uint c = 0u; c < p.n_chunks; c++) {
            if (p.part.v[base + c * stride + 1u] > 0.0) {
                mx = max(mx, p.part.v[base + c * stride]);
            }
        }
        float l = 0.0;
        float acc[MAX_HD / WG];
        for (uint a = 0u; a < MAX_HD / WG; a++) {
            acc[a] = 0.0;
        }
        for (uint c = 0u; c < p.n_chunks; c++) {
            uint at = base + c * stride;
            float lc = p.part.v[at + 1u];
            if (lc > 0.0) {
                float f = exp(p.part.v[at] - mx);
                l = fma(f, lc, l);
                for (uint a = 0u; a < MAX_HD / WG; a++) {
                    uint d = t + a * WG;
                    if (d < hd) {
                        acc[a] = fma(f, p.part.v[at + 2u + d], acc[a]);
                    }
                }
            }
        }
        uint o_base = (p.row0 + r) * p.n_heads * hd + h * hd;
        for (uint a = 0u; a < MAX_HD / WG; a++) {
            uint d = t + a * WG;
            if (d < hd) {
                p.o.v[o_base + d] = acc[a] / l;
            }
        }
    }
}
