// Shared declarations of every kiln kernel.
//
// Buffers are reached through buffer device addresses passed in push constants (no descriptor
// sets): a kernel's operands are `Floats`, `Halves`, `Bytes` or `Uints` references, whatever the
// buffer's size. Conversions between f16 and f32 are written out in integer arithmetic so that
// they round to nearest-even and keep subnormals on every device (GLSL's packHalf2x16 leaves the
// rounding to the implementation).

#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Uints { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Halves { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer Bytes { uint8_t v[]; };

// IEEE half (as its 16 bits) to float, exactly.
float half_to_float(uint h) {
    uint s = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1Fu;
    uint m = h & 0x3FFu;
    if (e == 0u) {
        float f = float(m) * 5.9604644775390625e-8; // m · 2⁻²⁴: exact
        return (s != 0u) ? -f : f;
    }
    if (e == 31u) {
        return uintBitsToFloat(s | 0x7F800000u | (m << 13));
    }
    return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

// float to IEEE half bits, rounded to nearest, ties to even; finite values of 65520 or more
// become infinities (callers that must refuse them test `half_overflows` first).
uint float_to_half(float f) {
    uint x = floatBitsToUint(f);
    uint s = (x >> 16) & 0x8000u;
    uint ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        return s | 0x7C00u | ((ax > 0x7F800000u) ? 0x200u : 0u);
    }
    if (ax >= 0x477FF000u) {
        return s | 0x7C00u;
    }
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u) {
            return s;
        }
        uint e = ax >> 23;
        uint m = (ax & 0x7FFFFFu) | 0x800000u;
        uint shift = 126u - e;
        uint q = m >> shift;
        uint rem = m & ((1u << shift) - 1u);
        uint half_ulp = 1u << (shift - 1u);
        if (rem > half_ulp || (rem == half_ulp && (q & 1u) == 1u)) {
            q += 1u;
        }
        return s | q;
    }
    uint r = ax - 0x38000000u;
    r = r + 0x0FFFu + ((r >> 13) & 1u);
    return s | (r >> 13);
}

// Whether a finite value is too large for an f16 (rounds to infinity).
bool half_overflows(float f) {
    uint ax = floatBitsToUint(f) & 0x7FFFFFFFu;
    return ax >= 0x477FF000u && ax < 0x7F800000u;
}

// tanh without the overflow of (e^2x - 1)/(e^2x + 1) for large |x|.
float stable_tanh(float x) {
    float t = exp(-2.0 * abs(x));
    float r = (1.0 - t) / (1.0 + t);
    return (x < 0.0) ? -r : r;
}

// erf with |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit), as kiln-backend's scalar
// definition.
float erf_approx(float xf) {
    float z = abs(xf);
    float t = 1.0 / (1.0 + 0.5 * z);
    float r = t * exp(-z * z - 1.26551223
        + t * (1.00002368
        + t * (0.37409196
        + t * (0.09678418
        + t * (-0.18628806
        + t * (0.27886807
        + t * (-1.13520398
        + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277)))))))));
    return (xf >= 0.0) ? 1.0 - r : r - 1.0;
}

// Activation codes: 0 gelu (tanh approximation), 1 gelu (erf), 2 silu.
float activate(uint act, float x) {
    if (act == 0u) {
        return 0.5 * x * (1.0 + stable_tanh(0.7978846 * (x + 0.044715 * x * x * x)));
    } else if (act == 1u) {
        return 0.5 * x * (1.0 + erf_approx(x * 0.70710678));
    }
    return x / (1.0 + exp(-x));
}
