#version 450
// Attention of one query row, one head and one chunk of keys per workgroup, over keys and values
// stored as f32 (KV_F32), f16 (KV_F16), or Q8_0 / Q4_0 blocks (KV_Q8_0, KV_Q4_0).
//
// mode 0 (causal, decoders): query row i is at position q_pos + i and sees keys j with
//   max(0, pos + 1 − window) ≤ j ≤ pos (window 0: no window); logical key row j is physical row
//   table[j / block_size] · block_size + j % block_size when block_size > 0 (a paged cache),
//   row j otherwise; grouped-query heads share the key head h / (n_heads / n_kv_heads).
// mode 1 (packed, encoders): query row i sees key rows bounds[2i] ..= bounds[2i + 1].
//
// A row's visible keys lo..=hi are cut into chunks of p.chunk keys counted from lo, so a row's
// chunks depend on that row alone; workgroup z takes chunk z. Within a chunk, keys are taken in
// tiles of 64 in increasing order with an online softmax (running maximum, rescaled sums). With
// one chunk (p.n_chunks == 1) the workgroup writes the output row; otherwise it writes its part
// (maximum, sum, unnormalised values: 2 + head_dim floats; an empty chunk writes sum 0) and
// attention_merge.comp combines the parts in chunk order. Every sum has a fixed order, so results
// do not depend on timing, on the other rows of the call, or on where the rows live (paged =
// contiguous, bit for bit). Chunks keep each invocation's loops short: long contexts spread over
// the device, and lavapipe's loop guard (65,535 iterations per invocation) is never reached.
#include "common.glsl"

#define WG 64u
#define MAX_HD 256u
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
    Floats q;
    Bytes k;
    Bytes v;
    Uints table;
    Uints bounds;
    Floats o;
    Floats part;
    uint n_q;
    uint row0;
    uint q_pos;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint kv_cols;
    uint block_size;
    uint window;
    uint mode;
    float scale;
    float softcap;
    uint chunk;
    uint n_chunks;
} p;

shared float qs[MAX_HD];
shared float sc[WG];
shared uint rows[WG];

// Element i (row-major over [rows, kv_cols]) of a cache, as f32: exactly the value it stores.
// The block types hold rows of whole blocks of 32 (kv_cols a multiple of 32), so element i is
// element i % 32 of block i / 32: Q8_0 `d · q`, Q4_0 `d · (q − 8)`, the scale an f16 at the
// block's start (the CPU backend computes the same products).
float kv_at(Bytes b, uint i) {
#if defined(KV_F16)
    return half_to_float(uint(Halves(b).v[i]));
#elif defined(KV_Q8_0)
    uint base = (i / 32u) * 34u;
    float d = half_to_float(uint(b.v[base]) | (uint(b.v[base + 1u]) << 8));
    int q = int(uint(b.v[base + 2u + i % 32u]));
    return d * float(q > 127 ? q - 256 : q);
#elif defined(KV_Q4_0)
    uint base = (i / 32u) * 18u;
    uint j = i % 32u;
    float d = half_to_float(uint(b.v[base]) | (uint(b.v[base + 1u]) << 8));
    uint byte = uint(b.v[base + 2u + (j & 15u)]);
    uint q = (j < 16u) ? (byte & 15u) : (byte >> 4);
    return d * float(int(q) - 8);
#else
    return Floats(b).v[i];
#endif
}

uint physical(uint j) {
    if (p.block_size == 0u) {
        return j;
    }
    return p.table.v[j / p.block_size] * p.block_size + j % p.block_size;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint c = gl_WorkGroupID.z;
    uint hd = p.head_dim;
    for (uint r = gl_WorkGroupID.y; r < p.n_q; r += gl_NumWorkGroups.y) {
        uint i = p.row0 + r;
        uint lo;
        uint hi;
        uint kvh;
        if (p.mode == 0u) {
            uint pos = p.q_pos + i;
            hi = pos;
            lo = (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
            kvh = h / (p.n_heads / p.n_kv_heads);
        } else {
            lo = p.bounds.v[2u * i];
            hi = p.bounds.v[2u * i + 1u];
            kvh = h;
        }
        // This workgroup's chunk of the row's keys.
        uint part_base = ((r * p.n_heads + h) * p.n_chunks + c) * (hd + 2u);
        uint first = lo + c * p.chunk;
        if (first > hi) {
            // Nothing to see: sum 0 tells attention_merge.comp to skip this part.
            if (t == 0u) {
                p.part.v[part_base] = 0.0;
                p.part.v[part_base + 1u] = 0.0;
            }
            continue;
        }
        lo = first;
        hi = min(hi, first + p.chunk - 1u);
        uint q_base = i * p.n_heads * hd + h * hd;
        for (uint d = t; d < hd; d += WG) {
            qs[d] = p.q.v[q_base + d];
        }
        barrier();
        float m = -1.0 / 0.0;
        float l = 0.0;
        float acc[MAX_HD / WG];
        for (uint a = 0u; a < MAX_HD / WG; a++) {
            acc[a] = 0.0;
        }
        for (uint j0 = lo; j0 <= hi; j0 += WG) {
            uint j = j0 + t;
            float s = -1.0 / 0.0;
            if (j <= hi) {
                uint r = physical(j);
                rows[t] = r;
                uint kb = r * p.kv_cols + kvh * hd;
                float dot = 0.0;
                for (uint d = 0u; d < hd; d++) {
                    dot = fma(qs[d], kv_at(p.k, kb + d), dot);
                }
                s = dot * p.scale;
                if (p.softcap > 0.0) {
                    s = p.softcap * stable_tanh(s / p.softcap);
                }
            }
            sc[t] = s;
            barrier();
            uint nt = min(WG, hi - j0 + 1u);
            float tmax = sc[0];
            for (uint u = 1u; u < nt; u++) {
                tmax = max(tmax, sc[u]);
            }
            float m_new = max(m, tmax);
            float alpha = exp(m - m_new);
            barrier();
            if (t < nt) {
                sc[t] = exp(sc[t] - m_new);
            }
            barrier();
            float psum = 0.0;
            for (uint u = 0u; u < nt; u++) {
                psum += sc[u];
            }
            l = l * alpha + psum;
            for (uint a = 0u; a < MAX_HD / WG; a++) {
                uint d = t + a * WG;
                if (d < hd) {
                    float s2 = 0.0;
                    for (uint u = 0u; u < nt; u++) {
                        s2 = fma(sc[u], kv_at(p.v, rows[u] * p.kv_cols + kvh * hd + d), s2);
                    }
                    acc[a] = acc[a] * alpha + s2;
                }
            }
            m = m_new;
            barrier();
        }
        if (p.n_chunks == 1u) {
            for (uint a = 0u; a < MAX_HD / WG; a++) {
                uint d = t + a * WG;
                if (d < hd) {
                    p.o.v[q_base + d] = acc[a] / l;
                }
            }
        } else {
            if (t == 0u) {
                p.part.v[part_base] = m;
                p.part.v[part_base + 1u] = l;
            }
            for (uint a = 0u; a < MAX_HD / WG; a++) {
                uint d = t + a * WG;
                if (d < hd) {
                    p.part.v[part_base + 2u + d] = acc[a];
                }
            }
        }
        barrier();
    }
}
