// Activations as products on f16 operands see them (matmul_coop.comp, and matmul_tiled.comp when
// it stands in for it in tests): each row of the tile is scaled by 2^-e, with e the smallest
// power that brings the row's largest |x| under 2^15 (e = 0 for most rows), then rounded to f16
// (to nearest, ties to even); sums are scaled back by 2^e. Both scalings are exact.
//
// Include after the `p` push block (x, m, k) and the BM define; a workgroup of 256 invocations
// calls find_row_exponents(t, m0) once, with every invocation, before reading row_exp.

shared uint row_max[BM][4];
shared int row_exp[BM];

void find_row_exponents(uint t, uint m0) {
    // 4 invocations per row find its largest |x| (as bits: ordered like the values they hold,
    // for non-negative floats).
    uint r = t / 4u;
    uint part = t % 4u;
    uint row = m0 + r;
    uint mx = 0u;
    if (row < p.m) {
        for (uint c = part; c < p.k; c += 4u) {
            mx = max(mx, floatBitsToUint(abs(p.x.v[row * p.k + c])));
        }
    }
    row_max[r][part] = mx;
    barrier();
    if (t < BM) {
        uint m4 = max(max(row_max[t][0], row_max[t][1]), max(row_max[t][2], row_max[t][3]));
        row_exp[t] = max(0, int((m4 >> 23) & 0xFFu) - 127 - 14);
    }
    barrier();
}

// v as f16 holds it (as f32).
float round_half(float v) {
    return half_to_float(float_to_half(v));
}
