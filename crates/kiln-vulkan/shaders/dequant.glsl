// Dequantization of one weight type (chosen by a W_* define): `dq16(w, rb, k, c, v)` writes
// elements 16c .. 16c + 15 of the row that starts at byte `rb` of `w` (a row of `k` elements)
// into `v`, as f32. Float types read only elements below `k` (zeros past it); block types are
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
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 2u) * 18u;
    float d = rdh(w, b);
    uint sh = (c % 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        int q = int((rd8(w, b + 2u + e) >> sh) & 0xFu) - 8;
        v[e] = float(q) * d;
    }
}
#elif defined(W_Q4_1)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 2u) * 20u;
    float d = rdh(w, b);
    float m = rdh(w, b + 2u);
    uint sh = (c % 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        uint q = (rd8(w, b + 4u + e) >> sh) & 0xFu;
        v[e] = float(q) * d + m;
    }
}
#elif defined(W_Q5_0)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 2u) * 22u;
    float d = rdh(w, b);
    uint qh = rd32(w, b + 2u);
    uint hi = c % 2u;
    for (uint e = 0u; e < 16u; e++) {
        uint q = (rd8(w, b + 6u + e) >> (hi * 4u)) & 0xFu;
        q |= ((qh >> (e + 16u * hi)) & 1u) << 4;
        v[e] = float(int(q) - 16) * d;
    }
}
#elif defined(W_Q5_1)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 2u) * 24u;
    float d = rdh(w, b);
    float m = rdh(w, b + 2u);
    uint qh = rd32(w, b + 4u);
    uint hi = c % 2u;
    for (uint e = 0u; e < 16u; e++) {
        uint q = (rd8(w, b + 8u + e) >> (hi * 4u)) & 0xFu;
        q |= ((qh >> (e + 16u * hi)) & 1u) << 4;
        v[e] = float(q) * d + m;
    }
}
#elif defined(W_Q8_0)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 2u) * 34u;
    float d = rdh(w, b);
    uint o = b + 2u + (c % 2u) * 16u;
    for (uint e = 0u; e < 16u; e++) {
        v[e] = float(rdi8(w, o + e)) * d;
    }
}
#elif defined(W_Q2_K)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 16u) * 84u;
    uint g = c % 16u;
    float d = rdh(w, b + 80u);
    float dmin = rdh(w, b + 82u);
    uint sc = rd8(w, b + g);
    float dl = d * float(sc & 0xFu);
    float ml = dmin * float(sc >> 4);
    uint q = b + 16u + (g / 8u) * 32u + (g % 2u) * 16u;
    uint shift = ((g % 8u) / 2u) * 2u;
    for (uint e = 0u; e < 16u; e++) {
        v[e] = dl * float((rd8(w, q + e) >> shift) & 3u) - ml;
    }
}
#elif defined(W_Q3_K)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 16u) * 110u;
    uint g = c % 16u;
    float d = rdh(w, b + 108u);
    uint s = b + 96u;
    uint lo = (g < 8u) ? (rd8(w, s + g) & 0xFu) : (rd8(w, s + g - 8u) >> 4);
    uint hi = (rd8(w, s + 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
    float dl = d * float(int(lo | (hi << 4)) - 32);
    uint n = g / 8u;
    uint j = (g % 8u) / 2u;
    uint l16 = (g % 2u) * 16u;
    uint q = b + 32u + n * 32u + l16;
    uint shift = 2u * j;
    uint mask = 1u << (n * 4u + j);
    for (uint e = 0u; e < 16u; e++) {
        int lo2 = int((rd8(w, q + e) >> shift) & 3u);
        int h = ((rd8(w, b + l16 + e) & mask) != 0u) ? 0 : 4;
        v[e] = dl * float(lo2 - h);
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
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 16u) * 144u;
    uint g = c % 16u;
    uint sub = g / 2u;
    float d = rdh(w, b);
    float dmin = rdh(w, b + 2u);
    uint sc;
    uint mn;
    scale_min_k4(w, b + 4u, sub, sc, mn);
    float d1 = d * float(sc);
    float m1 = dmin * float(mn);
    uint q = b + 16u + (sub / 2u) * 32u + (g % 2u) * 16u;
    uint sh = (sub % 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        v[e] = d1 * float((rd8(w, q + e) >> sh) & 0xFu) - m1;
    }
}
#else
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 16u) * 176u;
    uint g = c % 16u;
    uint sub = g / 2u;
    float d = rdh(w, b);
    float dmin = rdh(w, b + 2u);
    uint sc;
    uint mn;
    scale_min_k4(w, b + 4u, sub, sc, mn);
    float d1 = d * float(sc);
    float m1 = dmin * float(mn);
    uint l0 = (g % 2u) * 16u;
    uint q = b + 48u + (sub / 2u) * 32u + l0;
    uint sh = (sub % 2u) * 4u;
    uint hb = 1u << sub;
    for (uint e = 0u; e < 16u; e++) {
        uint qv = (rd8(w, q + e) >> sh) & 0xFu;
        if ((rd8(w, b + 16u + l0 + e) & hb) != 0u) {
            qv += 16u;
        }
        v[e] = d1 * float(qv) - m1;
    }
}
#endif
#elif defined(W_Q6_K)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 16u) * 210u;
    uint g = c % 16u;
    float d = rdh(w, b + 208u);
    uint n = g / 8u;
    uint r = (g % 8u) * 16u;
    uint qq = r / 32u;
    uint l0 = r % 32u;
    float dl = d * float(rdi8(w, b + 192u + n * 8u + l0 / 16u + 2u * qq));
    uint ql = b + n * 64u + l0 + (qq % 2u) * 32u;
    uint qh = b + 128u + n * 32u + l0;
    uint sh = (qq / 2u) * 4u;
    for (uint e = 0u; e < 16u; e++) {
        uint q = ((rd8(w, ql + e) >> sh) & 0xFu) | (((rd8(w, qh + e) >> (2u * qq)) & 3u) << 4);
        v[e] = dl * float(int(q) - 32);
    }
}
#elif defined(W_Q8_K)
void dq16(Bytes w, uint rb, uint k, uint c, out float v[16]) {
    uint b = rb + (c / 16u) * 292u;
    float d = uintBitsToFloat(rd32(w, b));
    uint o = b + 4u + (c % 16u) * 16u;
    for (uint e = 0u; e < 16u; e++) {
        v[e] = float(rdi8(w, o + e)) * d;
    }
}
#else
#error "no weight type defined"
#endif
