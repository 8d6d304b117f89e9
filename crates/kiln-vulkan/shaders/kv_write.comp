#version 450
// Rows of an f32 tensor into a KV cache: `kind` 0 an f16 cache (rounded to nearest-even), 1 a
// Q8_0 cache, 2 a Q4_0 cache (blocks of 32, quantized as ggml's quantize_row_q8_0_ref and
// quantize_row_q4_0_ref do; `n` and `dst_offset` are whole blocks). Mode 0 checks: a finite value
// of 65520 or more (an f16 infinity) sets bit 0 of `flag` (f16), a NaN or infinity bit 1 (the
// block types, which cannot encode it). Mode 1 writes, unless the flag is set (so a refused write
// leaves the cache as it was; the host reports the flag as a range error at its next read back).
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Push {
    Floats src;
    Halves dst;
    Uints flag;
    uint n;
    uint dst_offset;
    uint mode;
    uint kind;
} p;

// roundf: to the nearest integer, halves away from zero (x − trunc(x) is exact).
int round_away(float x) {
    float t = trunc(x);
    if (abs(x - t) >= 0.5) {
        t += sign(x);
    }
    return int(t);
}

// Block b of the source (elements 32b..32b+32) as Q8_0, at block dst_offset / 32 + b (17 16-bit
// words a block: the f16 scale, then the 32 codes two per word, low byte first).
void write_q8_0(uint b) {
    uint s0 = 32u * b;
    float amax = 0.0;
    for (uint j = 0u; j < 32u; j++) {
        amax = max(amax, abs(p.src.v[s0 + j]));
    }
    float d = amax / 127.0;
    float id = (d != 0.0) ? 1.0 / d : 0.0;
    uint w = (p.dst_offset / 32u + b) * 17u;
    p.dst.v[w] = uint16_t(float_to_half(d));
    for (uint j = 0u; j < 32u; j += 2u) {
        uint lo = uint(round_away(p.src.v[s0 + j] * id)) & 0xFFu;
        uint hi = uint(round_away(p.src.v[s0 + j + 1u] * id)) & 0xFFu;
        p.dst.v[w + 1u + j / 2u] = uint16_t(lo | (hi << 8));
    }
}

// Block b as Q4_0 (9 words: the scale, then 16 bytes whose low nibbles hold elements 0..16 and
// high nibbles 16..32).
void write_q4_0(uint b) {
    uint s0 = 32u * b;
    float amax = 0.0;
    float mx = 0.0;
    for (uint j = 0u; j < 32u; j++) {
        float v = p.src.v[s0 + j];
        if (amax < abs(v)) {
            amax = abs(v);
            mx = v;
        }
    }
    float d = mx / -8.0;
    float id = (d != 0.0) ? 1.0 / d : 0.0;
    uint w = (p.dst_offset / 32u + b) * 9u;
    p.dst.v[w] = uint16_t(float_to_half(d));
    for (uint j = 0u; j < 16u; j += 2u) {
        uint word = 0u;
        for (uint k = 0u; k < 2u; k++) {
            uint a = uint(min(15, int(p.src.v[s0 + j + k] * id + 8.5)));
            uint c = uint(min(15, int(p.src.v[s0 + 16u + j + k] * id + 8.5)));
            word |= (a | (c << 4)) << (8u * k);
        }
        p.dst.v[w + 1u + j / 2u] = uint16_t(word);
    }
}

void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    if (p.mode == 0u) {
        bool bad = false;
        for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
            float x = p.src.v[i];
            bad = bad || (p.kind == 0u ? half_overflows(x) : (isnan(x) || isinf(x)));
        }
        if (bad) {
            atomicOr(p.flag.v[0], p.kind == 0u ? 1u : 2u);
        }
        return;
    }
    if (p.flag.v[0] != 0u) {
        return;
    }
    if (p.kind == 0u) {
        for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
            p.dst.v[p.dst_offset + i] = uint16_t(float_to_half(p.src.v[i]));
        }
        return;
    }
    for (uint b = gl_GlobalInvocationID.x; b < p.n / 32u; b += stride) {
        if (p.kind == 1u) {
            write_q8_0(b);
        } else {
            write_q4_0(b);
        }
    }
}
