//! Deterministic inputs, and the weights and caches built from them on a backend.
//!
//! Weights are made from f32 values by kiln-quant's reference quantizers (ggml's
//! `quantize_row_*_ref`, bit for bit), and the reference then uses the values those bytes
//! dequantize to: what the backend holds, not what was quantized.

use std::sync::Arc;

use half::{bf16, f16};
use kiln_backend::{Backend, GptqMatrix, GptqTensors, Linear, WeightData};
use kiln_core::{GgmlType, SharedBytes};

/// Deterministic pseudo-random values in [-1, 1) (xorshift64), one stream per seed.
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// [`values`] times `scale`.
pub fn scaled(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    values(len, seed).into_iter().map(|v| v * scale).collect()
}

/// Deterministic integers below `n`.
pub fn indices(len: usize, n: usize, seed: u64) -> Vec<u32> {
    values(len, seed)
        .into_iter()
        .map(|v| (((v + 1.0) / 2.0 * n as f32) as usize).min(n - 1) as u32)
        .collect()
}

/// `v` stored as `ty` (float types converted, block types quantized by kiln-quant), and the f32
/// values those bytes hold.
pub fn encode(ty: GgmlType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let bytes: Vec<u8> = match ty {
        GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::F16 => v
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        GgmlType::BF16 => v
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        _ => {
            let mut out = vec![0u8; kiln_quant::quantized_size(ty, v.len()).unwrap()];
            kiln_quant::quantize(ty, v, &mut out).unwrap();
            out
        }
    };
    let deq = dequantize(ty, &bytes, v.len());
    (bytes, deq)
}

/// The `n` values `bytes` of `ty` hold (ggml's dequantizers, in kiln-quant).
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    kiln_quant::dequantize(ty, bytes, &mut out).unwrap();
    out
}

/// A Q8_0 matrix quantized here from `w` by hand (scale `max|w|/127` in f16, codes rounded),
/// independent of kiln-quant, and the values it holds: `code · scale` exactly.
pub fn q8_0_by_hand(w: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut deq = Vec::new();
    for block in w.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 127.0);
        bytes.extend_from_slice(&d.to_le_bytes());
        for &v in block {
            let q = if d.to_f32() == 0.0 {
                0
            } else {
                (v / d.to_f32()).round().clamp(-127.0, 127.0) as i8
            };
            bytes.push(q as u8);
            deq.push(q as f32 * d.to_f32());
        }
    }
    (bytes, deq)
}

/// Activations `x` (rows of `k`) as a backend that quantizes them into `act_ty` (ggml's
/// `vec_dot_type`: Q8_0, Q8_1 or Q8_K, by ggml's reference quantizers) holds them: the bytes, and
/// the values they dequantize to.
pub fn quantized_activations(act_ty: GgmlType, x: &[f32], k: usize) -> (Vec<u8>, Vec<f32>) {
    let row = kiln_quant::activation_bytes(act_ty, k).unwrap();
    let mut bytes = vec![0u8; x.len() / k * row];
    for (xr, out) in x.chunks(k).zip(bytes.chunks_mut(row)) {
        kiln_quant::quantize_activations(act_ty, xr, out).unwrap();
    }
    let values = dequantize(act_ty, &bytes, x.len());
    (bytes, values)
}

/// A weight as a file holds it.
pub fn weight_data(name: &str, ty: GgmlType, dims: &[usize], bytes: Vec<u8>) -> WeightData {
    WeightData {
        name: name.into(),
        ty,
        dims: dims.to_vec(),
        bytes: SharedBytes::from_vec(bytes),
    }
}

/// `bytes` uploaded as a weight of `ty` with GGUF dims `dims`.
pub fn upload<B: Backend>(
    b: &B,
    name: &str,
    ty: GgmlType,
    dims: &[usize],
    bytes: Vec<u8>,
) -> B::Weight {
    b.upload_weight(&weight_data(name, ty, dims, bytes))
        .unwrap_or_else(|e| panic!("{}: uploading {name} ({ty}, {dims:?}): {e}", b.name()))
}

/// An f32 vector weight (a norm's scale, a bias).
pub fn vector<B: Backend>(b: &B, name: &str, v: &[f32]) -> B::Weight {
    upload(
        b,
        name,
        GgmlType::F32,
        &[v.len()],
        encode(GgmlType::F32, v).0,
    )
}

/// A linear layer of `n` outputs and `k` inputs from the bytes of a `ty` matrix, with an f32 bias.
pub fn linear<B: Backend>(
    b: &B,
    ty: GgmlType,
    (n, k): (usize, usize),
    bytes: Vec<u8>,
    bias: Option<&[f32]>,
) -> Linear<B> {
    Linear {
        weight: Arc::new(upload(b, "w", ty, &[k, n], bytes)),
        bias: bias.map(|v| vector(b, "b", v)),
        in_features: k,
        out_features: n,
        ty,
    }
}

/// A GPTQ linear layer around `matrix` (its bias f32).
pub fn gptq_linear<B: Backend>(b: &B, matrix: &Arc<GptqMatrix>, bias: Option<&[f32]>) -> Linear<B> {
    Linear {
        weight: Arc::new(
            b.upload_gptq("gptq", matrix.clone())
                .unwrap_or_else(|e| panic!("{}: uploading a GPTQ matrix: {e}", b.name())),
        ),
        bias: bias.map(|v| vector(b, "b", v)),
        in_features: matrix.in_features,
        out_features: matrix.out_features,
        ty: GgmlType::I32,
    }
}

/// A GPTQ checkpoint's tensors for `out` outputs × `inputs` inputs in groups of `group`, random
/// codes, zero points and f16 scales; with `act_order`, a `g_idx` that deals inputs to groups in
/// turn (input `i` in group `i % groups`), as act-order checkpoints permute them; `v1`: zero
/// points stored minus one.
pub fn gptq(
    inputs: usize,
    out: usize,
    group: usize,
    act_order: bool,
    v1: bool,
    seed: u64,
) -> GptqMatrix {
    let groups = inputs / group;
    let word = |v: f32| ((v + 1.0) * 2_147_483_648.0) as u32;
    let qweight: Vec<u8> = values(inputs / 8 * out, seed)
        .into_iter()
        .flat_map(|v| word(v).to_le_bytes())
        .collect();
    // Zero points 1..=15 stored (v1: minus one, so 0..=14), never at the code range's ends.
    let qzeros: Vec<u8> = (0..groups * out / 8)
        .flat_map(|i| {
            let mut w = 0u32;
            for j in 0..8 {
                let z = 1 + ((i * 8 + j) * 7 + seed as usize) % 14;
                w |= ((z - usize::from(v1)) as u32) << (4 * j);
            }
            w.to_le_bytes()
        })
        .collect();
    let scales: Vec<u8> = values(groups * out, seed + 1)
        .into_iter()
        .flat_map(|v| f16::from_f32(0.002 + 0.02 * (v + 1.0)).to_le_bytes())
        .collect();
    let g_idx: Vec<u8> = (0..inputs)
        .flat_map(|i| ((i % groups) as u32).to_le_bytes())
        .collect();
    GptqMatrix::from_checkpoint(
        "gptq",
        &GptqTensors {
            qweight: &qweight,
            qzeros: &qzeros,
            scales: &scales,
            g_idx: act_order.then_some(&g_idx[..]),
        },
        inputs,
        out,
        group,
        v1,
    )
    .unwrap()
}

/// A tensor on `b`.
pub fn tensor<B: Backend>(b: &B, data: &[f32], rows: usize, cols: usize) -> B::Tensor {
    b.tensor_from_f32(data, rows, cols)
        .unwrap_or_else(|e| panic!("{}: tensor [{rows}, {cols}]: {e}", b.name()))
}

/// A tensor's values on the host.
pub fn host<B: Backend>(b: &B, t: &B::Tensor) -> Vec<f32> {
    b.to_f32(t).unwrap()
}

/// A KV cache of `rows` rows of `cols` on `b` holding `data` (written with `write_kv_rows`), and
/// the values it stores (rounded to its element type).
pub fn kv<B: Backend>(b: &B, data: &[f32], rows: usize, cols: usize) -> (B::Kv, Vec<f32>) {
    let mut cache = b.kv_zeros(rows, cols).unwrap();
    if rows > 0 {
        b.write_kv_rows(&mut cache, 0, &tensor(b, data, rows, cols))
            .unwrap();
    }
    let stored = b.kv_to_f32(&cache).unwrap();
    (cache, stored)
}

/// A pool of `table.len()` blocks of `block_size` rows holding `data`'s rows where `table` maps
/// them (logical row `j` at physical row `table[j / bs] · bs + j % bs`; other rows zero).
pub fn paged(data: &[f32], cols: usize, table: &[u32], bs: usize) -> Vec<f32> {
    let pool_blocks = table.iter().map(|&t| t as usize + 1).max().unwrap_or(0);
    let mut pool = vec![0.0f32; pool_blocks * bs * cols];
    for (j, row) in data.chunks(cols).enumerate() {
        let at = (table[j / bs] as usize * bs + j % bs) * cols;
        pool[at..at + cols].copy_from_slice(row);
    }
    pool
}

/// A block table of `blocks` entries that is not the identity: pairs swapped, then reversed.
pub fn shuffled_table(blocks: usize) -> Vec<u32> {
    let mut t: Vec<u32> = (0..blocks as u32).collect();
    for pair in t.chunks_mut(2) {
        pair.reverse();
    }
    t.reverse();
    t
}
