// Dequantization of one weight type (chosen by a W_* define): `dq16(w, rb, k, c, v)` writes
// elements 16c .. 16c + 15 of the row that starts at byte `rb` of `w` (a row of `k` elements)
// into `v`, as f32. Block types are written once, as `cq16(w, rb, c, q, scale, offset)`: the
// 16 integer codes of the chunk (each within -128..127) and the chunk's scale and offset, the
// weights being `q · scale + offset`; dq16 (and the integer-dot product) build on it. Float types read only elements below `k` (zeros past it); block types are
// whole blocks (16 elements always belong to one block). The block layouts are GGML's
// (ggml-common.h), little-endian.

uint rd8(Bytes w, uint o) { return uint(w.v[o]); }
uint rd16(Bytes w, uint o) { return uint(w.v[o]) | (uint(w.v[o + 1u]) << 8); }
uint rd32(Bytes w, uint o) { return rd16(w, o) | (rd16(w, o + 2u) << 16); }
float rdh(Bytes w, uint o) { return half_to_float(rd16(w, o)); }
int rdi8(Bytes w, uint o) { return int(int8_t(w.v[o])); }

#if defined(W_F32)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    Floats f = Floats(w);
    uint base = rb / 4u;
    for (uint e = 0u; e < 16u; e++) {
        uint i = c * 16u + e;
        v[e] = (i < k) ? f.v[base + i] : 0.0;
    }
}
#elif defined(W_F16)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    Halves h = Halves(w);
    uint base = rb / 2u;
    for (uint e = 0u; e < 16u; e++) {
        uint i = c * 16u + e;
        v[e] = (i < k) ? half_to_float(uint(h.v[base + i])) : 0.0;
    }
}
#elif defined(W_BF16)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    Halves h = Halves(w);
    uint base = rb / 2u;
    for (uint e = 0u; e < 16u; e++) {
        uint i = c * 16u + e;
        v[e] = (i < k) ? uintBitsToFloat(uint(h.v[base + i]) << 16) : 0.0;
    }
}
#elif defined(W_Q4_0)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 2u) * 18u;
    scale = rdh(w, b);
    offset = 0.0;
    uint sh = (c % 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        q[e] = int((rd8(w, b + 2u + e) >> sh) & 0xFu) - 8;
    }
}
#elif defined(W_Q4_1)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 2u) * 20u;
    scale = rdh(w, b);
    offset = rdh(w, b + 2u);
    uint sh = (c % 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        q[e] = int((rd8(w, b + 4u + e) >> sh) & 0xFu);
    }
}
#elif defined(W_Q5_0)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 2u) * 22u;
    scale = rdh(w, b);
    offset = 0.0;
    uint qh = rd32(w, b + 2u);
    uint hi = c % 2u;
    for (uint e = 0u; e < 16u; e++) {
        uint v = (rd8(w, b + 6u + e) >> (hi * 4u)) & 0xFu;
        v |= ((qh >> (e + 16u * hi)) & 1u) << 4;
        q[e] = int(v) - 16;
    }
}
#elif defined(W_Q5_1)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 2u) * 24u;
    scale = rdh(w, b);
    offset = rdh(w, b + 2u);
    uint qh = rd32(w, b + 4u);
    uint hi = c % 2u;
    for (uint e = 0u; e < 16u; e++) {
        uint v = (rd8(w, b + 8u + e) >> (hi * 4u)) & 0xFu;
        v |= ((qh >> (e + 16u * hi)) & 1u) << 4;
        q[e] = int(v);
    }
}
#elif defined(W_Q8_0)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 2u) * 34u;
    scale = rdh(w, b);
    offset = 0.0;
    uint o = b + 2u + (c % 2u) * 16u;
    for (uint e = 0u; e < 16u; e++) {
        q[e] = rdi8(w, o + e);
    }
}
#elif defined(W_Q2_K)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 16u) * 84u;
    uint g = c % 16u;
    float d = rdh(w, b + 80u);
    float dmin = rdh(w, b + 82u);
    uint sc = rd8(w, b + g);
    scale = d * float(sc & 0xFu);
    offset = -(dmin * float(sc >> 4));
    uint o = b + 16u + (g / 8u) * 32u + (g % 2u) * 16u;
    uint shift = ((g % 8u) / 2u) * 2u;
    for (uint e = 0u; e < 16u; e++) {
        q[e] = int((rd8(w, o + e) >> shift) & 3u);
    }
}
#elif defined(W_Q3_K)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 16u) * 110u;
    uint g = c % 16u;
    float d = rdh(w, b + 108u);
    uint s = b + 96u;
    uint lo = (g < 8u) ? (rd8(w, s + g) & 0xFu) : (rd8(w, s + g - 8u) >> 4);
    uint hi = (rd8(w, s + 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
    scale = d * float(int(lo | (hi << 4)) - 32);
    offset = 0.0;
    uint n = g / 8u;
    uint j = (g % 8u) / 2u;
    uint l16 = (g % 2u) * 16u;
    uint o = b + 32u + n * 32u + l16;
    uint shift = 2u * j;
    uint mask = 1u << (n * 4u + j);
    for (uint e = 0u; e < 16u; e++) {
        int lo2 = int((rd8(w, o + e) >> shift) & 3u);
        int h = ((rd8(w, b + l16 + e) & mask) != 0u) ? 0 : 4;
        q[e] = lo2 - h;
    }
}
#elif defined(W_Q4_K) || defined(W_Q5_K)
// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K/Q5_K block's 12 scale bytes.
void scale_min_k4(Bytes w, uint s, uint j, out uint sc, out uint mn) {
    if (j < 4u) {
        sc = rd8(w, s + j) & 63u;
        mn = rd8(w, s + j + 4u) & 63u;
    } else {
        sc = (rd8(w, s + j + 4u) & 0xFu) | ((rd8(w, s + j - 4u) >> 6) << 4);
        mn = (rd8(w, s + j + 4u) >> 4) | ((rd8(w, s + j) >> 6) << 4);
    }
}
#if defined(W_Q4_K)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 16u) * 144u;
    uint g = c % 16u;
    uint sub = g / 2u;
    float d = rdh(w, b);
    float dmin = rdh(w, b + 2u);
    uint sc;
    uint mn;
    scale_min_k4(w, b + 4u, sub, sc, mn);
    scale = d * float(sc);
    offset = -(dmin * float(mn));
    uint o = b + 16u + (sub / 2u) * 32u + (g % 2u) * 16u;
    uint sh = (sub % 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        q[e] = int((rd8(w, o + e) >> sh) & 0xFu);
    }
}
#else
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 16u) * 176u;
    uint g = c % 16u;
    uint sub = g / 2u;
    float d = rdh(w, b);
    float dmin = rdh(w, b + 2u);
    uint sc;
    uint mn;
    scale_min_k4(w, b + 4u, sub, sc, mn);
    scale = d * float(sc);
    offset = -(dmin * float(mn));
    uint l0 = (g % 2u) * 16u;
    uint o = b + 48u + (sub / 2u) * 32u + l0;
    uint sh = (sub % 2u) * 4u;
    uint hb = 1u << sub;
    for (uint e = 0u; e < 16u; e++) {
        uint qv = (rd8(w, o + e) >> sh) & 0xFu;
        if ((rd8(w, b + 16u + l0 + e) & hb) != 0u) {
            qv += 16u;
        }
        q[e] = int(qv);
    }
}
#endif
#elif defined(W_Q6_K)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 16u) * 210u;
    uint g = c % 16u;
    float d = rdh(w, b + 208u);
    uint n = g / 8u;
    uint r = (g % 8u) * 16u;
    uint qq = r / 32u;
    uint l0 = r % 32u;
    scale = d * float(rdi8(w, b + 192u + n * 8u + l0 / 16u + 2u * qq));
    offset = 0.0;
    uint ql = b + n * 64u + l0 + (qq % 2u) * 32u;
    uint qh = b + 128u + n * 32u + l0;
    uint sh = (qq / 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        uint v = ((rd8(w, ql + e) >> sh) & 0xFu) | (((rd8(w, qh + e) >> (2u * qq)) & 3u) << 4);
        q[e] = int(v) - 32;
    }
}
#elif defined(W_Q8_K)
void cq16(Bytes w, uint rb, uint c, out int q[16], out float scale, out float offset) {
    uint b = rb + (c / 16u) * 292u;
    scale = uintBitsToFloat(rd32(w, b));
    offset = 0.0;
    uint o = b + 4u + (c % 16u) * 16u;
    for (uint e = 0u; e < 16u; e++) {
        q[e] = rdi8(w, o + e);
    }
}
#else
#error "no weight type defined"
#endif

#if !defined(W_F32) && !defined(W_F16) && !defined(W_BF16)
#define W_BLOCKS
// A block type's 16 weights: their codes times the chunk's scale, plus its offset.
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    int q[16];
    float scale;
    float offset;
    cq16(w, rb, c, q, scale, offset);
    for (uint e = 0u; e < 16u; e++) {
        v[e] = float(q[e]) * scale + offset;
    }
}
#endif
