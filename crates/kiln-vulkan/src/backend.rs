//! [`VulkanBackend`]: the trait's ops as kernel dispatches and buffer copies.
//!
//! Invariants: every operand is checked on the host before anything is recorded (a malformed
//! model or request gets a `BackendError`, never a kernel reading out of bounds); element
//! indices inside kernels are 32-bit, so a tensor, cache or weight must hold fewer than 2³²
//! elements (weights fewer than 2³² bytes), which upload and allocation check.

use std::ops::Range;
use std::sync::Arc;

use ash::vk;
use half::f16;
use kiln_backend::{
    shape_err, Activation, AttentionParams, Backend, BackendError, GptqMatrix, KvDtype, KvPages,
    Linear, PackedAttentionParams, Result, RopeParams, RopeStyle, WeightData,
};
use kiln_core::GgmlType;

use crate::device::{self, Context, DeviceInfo};
use crate::device_err;
use crate::exec::{push_bytes, Exec};
use crate::kernels::Kernel;
use crate::memory::{Buffer, Place};

/// How to open the Vulkan backend.
#[derive(Clone, Debug, Default)]
pub struct VulkanOptions {
    /// The device's position in the loader's list (`vulkan:N`); `None`: the first usable
    /// device, GPUs before software ones.
    pub device: Option<usize>,
    /// The element type of KV caches.
    pub kv_dtype: KvDtype,
    /// Turn on the Khronos validation layer; its messages become errors at the next read back.
    pub validation: bool,
    /// Compute every output row by the same operations whatever else the call holds (a
    /// sequence alone and batched get the same bits; `kiln serve` runs so): products of many
    /// rows then keep to the few-row kernel instead of the tiled one.
    pub batch_invariant: bool,
}

/// The Vulkan compute backend on one device.
pub struct VulkanBackend {
    shared: Arc<Shared>,
    kv_dtype: KvDtype,
    batch_invariant: bool,
    name: String,
    /// The most bytes of chunk results one attention dispatch writes
    /// ([`ATTENTION_PART_BYTES`]; smaller in tests, to cut calls into groups of rows).
    part_bytes: usize,
    /// The tiled product rounds its operands as the cooperative-matrix one does (tests).
    half_emulation: bool,
    /// Few-row products of block weights run on integer dot products.
    integer_dots: bool,
}

/// The device and what every backend on it shares (pipelines, the command stream).
struct Shared {
    exec: Exec,
    ctx: Arc<Context>,
    /// Bit 0: an f16 KV write met a value beyond f16 (reported by the next read back).
    flag: Arc<Buffer>,
}

/// A `[rows, cols]` f32 tensor in device memory.
pub struct VkTensor {
    buf: Arc<Buffer>,
    rows: usize,
    cols: usize,
}

/// A KV cache in device memory, in its backend's [`KvDtype`].
pub struct VkKv {
    buf: Arc<Buffer>,
    rows: usize,
    cols: usize,
    dtype: KvDtype,
}

/// A weight in device memory: matrices keep their file's type (blocks stay quantized); vectors
/// (norm weights, biases) are held as f32.
pub struct VkWeight {
    buf: Arc<Buffer>,
    ty: GgmlType,
    /// Elements per row.
    k: usize,
    /// Rows.
    n: usize,
    row_bytes: usize,
    /// A 1-D weight (stored as f32).
    vector: bool,
    name: String,
    /// A GPTQ 4-bit matrix: `buf` holds its codes, these the rest.
    gptq: Option<GptqParts>,
}

/// The scales, zero points and input order of a GPTQ matrix on the device.
struct GptqParts {
    scales: Arc<Buffer>,
    zeros: Arc<Buffer>,
    perm: Option<Arc<Buffer>>,
    group: usize,
}

/// The largest head a workgroup of the attention kernel holds.
const MAX_HEAD_DIM: usize = 256;
/// Keys of one attention workgroup (a chunk of a row's visible keys, counted from its first):
/// longer rows are spread over several workgroups and merged (attention_merge.comp).
const ATTENTION_CHUNK: usize = 256;
/// The most bytes of chunk results one attention dispatch writes; calls that would write more
/// run in groups of rows (a row's result does not depend on its group).
const ATTENTION_PART_BYTES: usize = 64 << 20;
/// The most workgroups of one dimension a dispatch may ask for (Vulkan's guaranteed minimum).
const MAX_GROUPS: u64 = 65535;
/// Activation rows of one matmul workgroup (`MT` in matmul.comp).
const MATMUL_ROWS: u64 = 8;
/// Activation rows from which a product runs tiled (matmul_tiled.comp), unless batch-invariant.
const TILED_MIN_ROWS: usize = 32;

fn groups(items: u64, per_group: u64) -> u32 {
    items.div_ceil(per_group).clamp(1, MAX_GROUPS) as u32
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        device_err(format!(
            "{what} ({v}) exceeds the 32-bit indices of the Vulkan kernels"
        ))
    })
}

fn act_code(a: Activation) -> u32 {
    match a {
        Activation::GeluTanh => 0,
        Activation::Gelu => 1,
        Activation::Silu => 2,
    }
}

/// The kernels of one weight type: the product for a few rows (decode), the tiled product for
/// many (prefill), and the embedding lookup.
#[derive(Clone, Copy)]
struct TypeKernels {
    product: Kernel,
    tiled: Kernel,
    /// The tiled product on cooperative matrices (f16 operands), for types f16 holds.
    coop: Option<Kernel>,
    /// The few-row product on integer dot products (int8 activations), for block types.
    dot: Option<Kernel>,
    embed: Kernel,
}

fn kernels_of(ty: GgmlType) -> Option<TypeKernels> {
    use GgmlType as T;
    use Kernel as K;
    let (product, tiled, coop, embed) = match ty {
        T::F32 => (K::MatmulF32, K::TiledF32, None, K::EmbedF32),
        T::F16 => (K::MatmulF16, K::TiledF16, Some(K::CoopF16), K::EmbedF16),
        T::BF16 => (K::MatmulBf16, K::TiledBf16, None, K::EmbedBf16),
        T::Q4_0 => (K::MatmulQ40, K::TiledQ40, Some(K::CoopQ40), K::EmbedQ40),
        T::Q4_1 => (K::MatmulQ41, K::TiledQ41, Some(K::CoopQ41), K::EmbedQ41),
        T::Q5_0 => (K::MatmulQ50, K::TiledQ50, Some(K::CoopQ50), K::EmbedQ50),
        T::Q5_1 => (K::MatmulQ51, K::TiledQ51, Some(K::CoopQ51), K::EmbedQ51),
        T::Q8_0 => (K::MatmulQ80, K::TiledQ80, Some(K::CoopQ80), K::EmbedQ80),
        T::Q2_K => (K::MatmulQ2K, K::TiledQ2K, Some(K::CoopQ2K), K::EmbedQ2K),
        T::Q3_K => (K::MatmulQ3K, K::TiledQ3K, Some(K::CoopQ3K), K::EmbedQ3K),
        T::Q4_K => (K::MatmulQ4K, K::TiledQ4K, Some(K::CoopQ4K), K::EmbedQ4K),
        T::Q5_K => (K::MatmulQ5K, K::TiledQ5K, Some(K::CoopQ5K), K::EmbedQ5K),
        T::Q6_K => (K::MatmulQ6K, K::TiledQ6K, Some(K::CoopQ6K), K::EmbedQ6K),
        T::Q8_K => (K::MatmulQ8K, K::TiledQ8K, Some(K::CoopQ8K), K::EmbedQ8K),
        _ => return None,
    };
    let dot = match ty {
        T::Q4_0 => Some(K::DotQ40),
        T::Q4_1 => Some(K::DotQ41),
        T::Q5_0 => Some(K::DotQ50),
        T::Q5_1 => Some(K::DotQ51),
        T::Q8_0 => Some(K::DotQ80),
        T::Q2_K => Some(K::DotQ2K),
        T::Q3_K => Some(K::DotQ3K),
        T::Q4_K => Some(K::DotQ4K),
        T::Q5_K => Some(K::DotQ5K),
        T::Q6_K => Some(K::DotQ6K),
        T::Q8_K => Some(K::DotQ8K),
        _ => None,
    };
    Some(TypeKernels {
        product,
        tiled,
        coop,
        dot,
        embed,
    })
}

// ---- push constants (layouts of the `Push` blocks in shaders/*.comp; no padding holes) ----

#[repr(C)]
#[derive(Clone, Copy)]
struct MatmulPush {
    w: u64,
    x: u64,
    y: u64,
    bias: u64,
    m: u32,
    k: u32,
    n: u32,
    row_bytes: u32,
    has_bias: u32,
    act: u32,
    half: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct GptqPush {
    codes: u64,
    x: u64,
    y: u64,
    bias: u64,
    scales: u64,
    zeros: u64,
    perm: u64,
    m: u32,
    k: u32,
    n: u32,
    group: u32,
    has_bias: u32,
    has_perm: u32,
    act: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct EmbedPush {
    w: u64,
    ids: u64,
    y: u64,
    n_ids: u32,
    k: u32,
    row_bytes: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct EltwisePush {
    a: u64,
    b: u64,
    y: u64,
    n: u32,
    op: u32,
    act: u32,
    s: f32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct NormPush {
    x: u64,
    r: u64,
    w: u64,
    b: u64,
    y: u64,
    rows: u32,
    cols: u32,
    group: u32,
    mode: u32,
    has_r: u32,
    has_b: u32,
    eps: f32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RopePush {
    x: u64,
    cs: u64,
    y: u64,
    rows: u32,
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    neox: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct AttentionPush {
    q: u64,
    k: u64,
    v: u64,
    table: u64,
    bounds: u64,
    o: u64,
    part: u64,
    n_q: u32,
    row0: u32,
    q_pos: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    kv_cols: u32,
    block_size: u32,
    window: u32,
    mode: u32,
    scale: f32,
    softcap: f32,
    chunk: u32,
    n_chunks: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct QuantActPush {
    x: u64,
    xq: u64,
    m: u32,
    k: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MergePush {
    part: u64,
    o: u64,
    n_q: u32,
    row0: u32,
    n_heads: u32,
    head_dim: u32,
    n_chunks: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct KvWritePush {
    src: u64,
    dst: u64,
    flag: u64,
    n: u32,
    dst_offset: u32,
    mode: u32,
    /// 0: f16, 1: Q8_0, 2: Q4_0.
    kind: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ScatterPush {
    dst: u64,
    src: u64,
    index: u64,
    weights: u64,
    n: u32,
    cols: u32,
}

/// Element-wise op codes of eltwise.comp.
const OP_ADD: u32 = 0;
const OP_MUL: u32 = 1;
const OP_SCALE: u32 = 2;
const OP_ACT: u32 = 3;
const OP_GATED: u32 = 4;

/// Modes of norm.comp.
const NORM_RMS: u32 = 0;
const NORM_RMS_ADD: u32 = 1;
const NORM_LAYER: u32 = 2;

impl VulkanBackend {
    /// Opens the device `options` names (see [`VulkanOptions`]).
    pub fn new(options: &VulkanOptions) -> Result<VulkanBackend> {
        let ctx = device::open(options.device, options.validation)?;
        let exec = Exec::new(ctx.clone())?;
        let flag = Buffer::new(&ctx, 4, Place::Device, "the f16 range flag")?;
        exec.fill(&flag, 0, 4, 0)?;
        let name = format!("vulkan:{} ({})", ctx.info.index, ctx.info.name);
        let ctx_dots = ctx.info.integer_dot
            && match std::env::var("KILN_VULKAN_INTDOT").as_deref() {
                Ok("0") => false,
                Ok("1") => true,
                _ => ctx.info.integer_dot_accelerated,
            };
        Ok(VulkanBackend {
            shared: Arc::new(Shared { exec, ctx, flag }),
            kv_dtype: options.kv_dtype,
            batch_invariant: options.batch_invariant,
            name,
            part_bytes: ATTENTION_PART_BYTES,
            half_emulation: false,
            integer_dots: ctx_dots,
        })
    }

    /// A backend on the same device (sharing its pipelines and command stream) whose KV caches
    /// hold `kv_dtype`, batch-invariant or not.
    pub fn with(&self, kv_dtype: KvDtype, batch_invariant: bool) -> VulkanBackend {
        VulkanBackend {
            shared: self.shared.clone(),
            kv_dtype,
            batch_invariant,
            name: self.name.clone(),
            part_bytes: self.part_bytes,
            half_emulation: self.half_emulation,
            integer_dots: self.integer_dots,
        }
    }

    /// Whether few-row products of block weights quantize the activations to int8 (blocks of
    /// 32, one f32 scale each) and run on integer dot products: where the device accelerates
    /// them ([`DeviceInfo::integer_dot_accelerated`]; `KILN_VULKAN_INTDOT=0` never, `=1`
    /// wherever the device runs them).
    pub fn int8_activations(&self) -> bool {
        self.integer_dots
    }

    /// This backend, with few-row products of block weights on integer dot products even where
    /// the device does not accelerate them (tests check the kernels on such devices); `None`
    /// where the device cannot run them at all.
    #[doc(hidden)]
    pub fn using_integer_dots(&self) -> Option<VulkanBackend> {
        self.shared.ctx.info.integer_dot.then(|| VulkanBackend {
            integer_dots: true,
            ..self.with(self.kv_dtype, self.batch_invariant)
        })
    }

    /// Whether products of many rows may round their operands to f16 (activation rows scaled
    /// into range) and sum in f32: on a device whose matrix units kiln uses
    /// ([`DeviceInfo::uses_matrix_units`]), unless batch-invariant (which keeps to the
    /// few-row kernel). F32 and BF16 weights always multiply f32 operands.
    pub fn half_products(&self) -> bool {
        !self.batch_invariant && (self.shared.ctx.info.uses_matrix_units() || self.half_emulation)
    }

    /// This backend, with the tiled product rounding its operands exactly as the
    /// cooperative-matrix product does: tests check that rounding on devices without matrix
    /// units.
    #[doc(hidden)]
    pub fn emulating_half_products(&self) -> VulkanBackend {
        VulkanBackend {
            half_emulation: true,
            ..self.with(self.kv_dtype, self.batch_invariant)
        }
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.shared.ctx.info
    }

    fn alloc(&self, bytes: usize, place: Place, what: &str) -> Result<Arc<Buffer>> {
        Buffer::new(&self.shared.ctx, bytes as u64, place, what)
    }

    fn new_tensor(&self, rows: usize, cols: usize) -> Result<VkTensor> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| shape_err("tensor", format!("[{rows}, {cols}] overflows")))?;
        u32_of(n, "tensor elements")?;
        Ok(VkTensor {
            buf: self.alloc(n * 4, Place::Scratch, "a tensor")?,
            rows,
            cols,
        })
    }

    /// A device buffer holding `bytes`: written in place when the device memory is mapped,
    /// else through a staging buffer copied by the device.
    fn upload_bytes(&self, bytes: &[u8], place: Place, what: &str) -> Result<Arc<Buffer>> {
        let buf = self.alloc(bytes.len(), place, what)?;
        if bytes.is_empty() {
            return Ok(buf);
        }
        if buf.is_mapped() {
            buf.write(0, bytes);
        } else if bytes.len().is_multiple_of(4) && bytes.len() <= 65536 {
            self.shared.exec.update(&buf, 0, bytes)?;
        } else {
            let staging = Buffer::new(&self.shared.ctx, bytes.len() as u64, Place::Upload, what)?;
            staging.write(0, bytes);
            let region = [vk::BufferCopy::default().size(bytes.len() as u64)];
            self.shared.exec.copy(&staging, &buf, &region)?;
        }
        Ok(buf)
    }

    fn upload_u32(&self, words: &[u32], place: Place, what: &str) -> Result<Arc<Buffer>> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.upload_bytes(&bytes, place, what)
    }

    fn upload_f32(&self, values: &[f32], place: Place, what: &str) -> Result<Arc<Buffer>> {
        let bytes: Vec<u8> = values.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.upload_bytes(&bytes, place, what)
    }

    /// `len` bytes of `buf` back on the host, after every op recorded so far; a range error
    /// raised by an f16 KV write since the last read back is reported here.
    fn read_back(&self, buf: &Arc<Buffer>, len: usize) -> Result<Vec<u8>> {
        let slot = (len as u64).div_ceil(4) * 4;
        let host = Buffer::new(&self.shared.ctx, slot + 4, Place::Readback, "a read back")?;
        let mut regions = vec![vk::BufferCopy::default()
            .src_offset(0)
            .dst_offset(slot)
            .size(4)];
        self.shared.exec.copy(&self.shared.flag, &host, &regions)?;
        if len > 0 {
            regions[0] = vk::BufferCopy::default().size(len as u64);
            self.shared.exec.copy(buf, &host, &regions)?;
        }
        self.shared.exec.sync()?;
        let all = host.read(slot as usize + 4);
        let flag = u32::from_le_bytes(all[slot as usize..].try_into().expect("4 bytes"));
        if flag != 0 {
            self.shared.exec.fill(&self.shared.flag, 0, 4, 0)?;
            let detail = if flag & 1 != 0 {
                "a key or value of magnitude 65520 or more cannot be stored in an f16 KV cache \
                 (it would be an infinity); the write was refused"
            } else {
                "a NaN or infinite key or value has no Q8_0/Q4_0 encoding; the write was refused"
            };
            return Err(BackendError::Range {
                op: "write_kv_rows",
                detail: detail.into(),
            });
        }
        Ok(all[..len].to_vec())
    }

    fn eltwise(
        &self,
        a: &VkTensor,
        b: Option<&VkTensor>,
        op: u32,
        act: u32,
        s: f32,
        name: &'static str,
    ) -> Result<VkTensor> {
        if let Some(b) = b {
            if (a.rows, a.cols) != (b.rows, b.cols) {
                return Err(shape_err(
                    name,
                    format!("[{}, {}] and [{}, {}]", a.rows, a.cols, b.rows, b.cols),
                ));
            }
        }
        let y = self.new_tensor(a.rows, a.cols)?;
        let n = (a.rows * a.cols) as u64;
        let push = EltwisePush {
            a: a.buf.addr,
            b: b.map_or(0, |b| b.buf.addr),
            y: y.buf.addr,
            n: n as u32,
            op,
            act,
            s,
        };
        let mut uses = vec![&a.buf, &y.buf];
        if let Some(b) = b {
            uses.push(&b.buf);
        }
        self.shared.exec.dispatch(
            Kernel::Eltwise,
            push_bytes(&push),
            [groups(n, 256), 1, 1],
            &uses,
        )?;
        Ok(y)
    }

    fn vector<'a>(&self, w: &'a VkWeight, len: usize, op: &'static str) -> Result<&'a VkWeight> {
        if !w.vector || w.k != len {
            return Err(shape_err(
                op,
                format!(
                    "weight {} is [{}, {}], wanted a vector of {len}",
                    w.name, w.n, w.k
                ),
            ));
        }
        Ok(w)
    }

    #[allow(clippy::too_many_arguments)]
    fn norm(
        &self,
        x: &VkTensor,
        residual: Option<&VkTensor>,
        w: &VkWeight,
        b: Option<&VkWeight>,
        eps: f32,
        mode: u32,
        op: &'static str,
    ) -> Result<VkTensor> {
        let group = if mode == NORM_LAYER { x.cols } else { w.k };
        self.vector(w, group, op)?;
        if let Some(b) = b {
            self.vector(b, x.cols, op)?;
        }
        if group == 0 || !x.cols.is_multiple_of(group) {
            return Err(shape_err(
                op,
                format!("rows of {} in groups of {group}", x.cols),
            ));
        }
        if let Some(r) = residual {
            if (r.rows, r.cols) != (x.rows, x.cols) {
                return Err(shape_err(
                    op,
                    format!(
                        "[{}, {}] and residual [{}, {}]",
                        x.rows, x.cols, r.rows, r.cols
                    ),
                ));
            }
        }
        let y = self.new_tensor(x.rows, x.cols)?;
        let push = NormPush {
            x: x.buf.addr,
            r: residual.map_or(0, |r| r.buf.addr),
            w: w.buf.addr,
            b: b.map_or(0, |b| b.buf.addr),
            y: y.buf.addr,
            rows: x.rows as u32,
            cols: x.cols as u32,
            group: group as u32,
            mode,
            has_r: residual.is_some() as u32,
            has_b: b.is_some() as u32,
            eps,
            _pad: 0,
        };
        let mut uses = vec![&x.buf, &w.buf, &y.buf];
        if let Some(r) = residual {
            uses.push(&r.buf);
        }
        if let Some(b) = b {
            uses.push(&b.buf);
        }
        self.shared.exec.dispatch(
            Kernel::Norm,
            push_bytes(&push),
            [groups(x.rows as u64, 1), 1, 1],
            &uses,
        )?;
        Ok(y)
    }

    fn product(&self, x: &VkTensor, w: &Linear<Self>, act: Option<Activation>) -> Result<VkTensor> {
        let wt = &*w.weight;
        if x.cols != w.in_features || wt.k != w.in_features || wt.n != w.out_features || wt.vector {
            return Err(shape_err(
                "matmul",
                format!(
                    "x [{}, {}] by weight {} [{}, {}] as a {} -> {} layer",
                    x.rows, x.cols, wt.name, wt.n, wt.k, w.in_features, w.out_features
                ),
            ));
        }
        if let Some(b) = &w.bias {
            self.vector(b, w.out_features, "matmul")?;
        }
        let y = self.new_tensor(x.rows, w.out_features)?;
        let tiles = (x.rows as u64).div_ceil(MATMUL_ROWS);
        if tiles > MAX_GROUPS {
            return Err(shape_err(
                "matmul",
                format!(
                    "{} rows at once (at most {})",
                    x.rows,
                    MAX_GROUPS * MATMUL_ROWS
                ),
            ));
        }
        // One weight row per subgroup of the 64 invocations of a workgroup.
        let rows_per_group = (64 / self.shared.ctx.info.subgroup_size.max(1)).max(1) as u64;
        let grid = [groups(wt.n as u64, rows_per_group), tiles.max(1) as u32, 1];
        let bias = w.bias.as_ref().map_or(0, |b| b.buf.addr);
        let act = act.map_or(0, |a| act_code(a) + 1);
        let mut uses = vec![&wt.buf, &x.buf, &y.buf];
        if let Some(b) = &w.bias {
            uses.push(&b.buf);
        }
        if let Some(g) = &wt.gptq {
            let push = GptqPush {
                codes: wt.buf.addr,
                x: x.buf.addr,
                y: y.buf.addr,
                bias,
                scales: g.scales.addr,
                zeros: g.zeros.addr,
                perm: g.perm.as_ref().map_or(0, |p| p.addr),
                m: x.rows as u32,
                k: wt.k as u32,
                n: wt.n as u32,
                group: g.group as u32,
                has_bias: w.bias.is_some() as u32,
                has_perm: g.perm.is_some() as u32,
                act,
                _pad: 0,
            };
            uses.extend([&g.scales, &g.zeros]);
            if let Some(p) = &g.perm {
                uses.push(p);
            }
            self.shared
                .exec
                .dispatch(Kernel::MatmulGptq, push_bytes(&push), grid, &uses)?;
            return Ok(y);
        }
        let kernels = kernels_of(wt.ty).expect("uploaded weights have a kernel");
        let few = self.batch_invariant || x.rows < TILED_MIN_ROWS;
        if let (true, true, Some(dot)) = (few, self.integer_dots, kernels.dot) {
            let blocks = wt.k / 32;
            let xq = self.alloc(x.rows * blocks * 44, Place::Scratch, "int8 activations")?;
            let quant = QuantActPush {
                x: x.buf.addr,
                xq: xq.addr,
                m: x.rows as u32,
                k: wt.k as u32,
            };
            self.shared.exec.dispatch(
                Kernel::QuantAct,
                push_bytes(&quant),
                [groups(blocks as u64, 64), groups(x.rows as u64, 1), 1],
                &[&x.buf, &xq],
            )?;
            // matmul_dot.comp's push block is MatmulPush's first ten fields, activations as
            // their int8 blocks.
            let push = MatmulPush {
                w: wt.buf.addr,
                x: xq.addr,
                y: y.buf.addr,
                bias,
                m: x.rows as u32,
                k: wt.k as u32,
                n: wt.n as u32,
                row_bytes: wt.row_bytes as u32,
                has_bias: w.bias.is_some() as u32,
                act,
                half: 0,
                _pad: 0,
            };
            uses.push(&xq);
            self.shared
                .exec
                .dispatch(dot, push_bytes(&push), grid, &uses)?;
            return Ok(y);
        }
        // Many rows: the tiled kernel (its sums group differently from the few-row kernel's,
        // so batch-invariant mode keeps to the latter).
        let tiled = !few;
        let mut half = false;
        let (kernel, grid) = if tiled {
            let tile = |v: usize| (v as u64).div_ceil(64);
            if tile(x.rows) > MAX_GROUPS || tile(wt.n) > MAX_GROUPS {
                return Err(shape_err(
                    "matmul",
                    format!(
                        "[{}, {}] x [{}, {}]ᵀ exceeds the tiled kernel's grid",
                        x.rows, x.cols, wt.n, wt.k
                    ),
                ));
            }
            // On matrix units where the device has them (same tiles, f16 operands).
            let kernel = match kernels.coop {
                Some(k) if self.shared.ctx.info.uses_matrix_units() => k,
                _ => kernels.tiled,
            };
            half = self.half_emulation && kernels.coop.is_some();
            (kernel, [tile(wt.n) as u32, tile(x.rows) as u32, 1])
        } else {
            (kernels.product, grid)
        };
        let push = MatmulPush {
            w: wt.buf.addr,
            x: x.buf.addr,
            y: y.buf.addr,
            bias,
            m: x.rows as u32,
            k: wt.k as u32,
            n: wt.n as u32,
            row_bytes: wt.row_bytes as u32,
            has_bias: w.bias.is_some() as u32,
            act,
            half: (half && kernel == kernels.tiled) as u32,
            _pad: 0,
        };
        self.shared
            .exec
            .dispatch(kernel, push_bytes(&push), grid, &uses)?;
        Ok(y)
    }

    fn check_kv_pair(&self, k: &VkKv, v: &VkKv, op: &'static str) -> Result<()> {
        if k.dtype != v.dtype {
            return Err(shape_err(
                op,
                format!("keys stored as {}, values as {}", k.dtype, v.dtype),
            ));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &VkTensor,
        k: &VkKv,
        v: &VkKv,
        pages: Option<&KvPages<'_>>,
        q_pos: usize,
        n_kv: usize,
        p: &AttentionParams,
    ) -> Result<VkTensor> {
        let op = if pages.is_some() {
            "paged_attention"
        } else {
            "attention"
        };
        self.check_kv_pair(k, v, op)?;
        let hd = p.head_dim;
        p.check(
            op,
            (q.rows, q.cols),
            (k.rows, k.cols),
            (v.rows, v.cols),
            q_pos,
            n_kv,
            pages.is_some(),
        )?;
        if hd > MAX_HEAD_DIM {
            return Err(shape_err(
                op,
                format!("heads of {hd} (the Vulkan kernel holds at most {MAX_HEAD_DIM})"),
            ));
        }
        let y = self.new_tensor(q.rows, q.cols)?;
        if q.rows == 0 || p.n_heads == 0 || hd == 0 {
            return Ok(y);
        }
        let table = match pages {
            Some(pg) => {
                let first_key = p.first_key(q_pos);
                pg.check(first_key..n_kv, k.rows.min(v.rows))
                    .map_err(|e| shape_err(op, e))?;
                let blocks = n_kv.div_ceil(pg.block_size);
                // Entries below the window (never read, not checked) become block 0, so that
                // the device never holds an address outside the pools.
                let mut table = pg.table[..blocks.max(1).min(pg.table.len())].to_vec();
                let unseen = (first_key / pg.block_size).min(table.len());
                table[..unseen].fill(0);
                Some(self.upload_u32(&table, Place::Scratch, "a block table")?)
            }
            None => None,
        };
        let window = p.sliding_window.unwrap_or(usize::MAX);
        let push = AttentionPush {
            q: q.buf.addr,
            k: k.buf.addr,
            v: v.buf.addr,
            table: table.as_ref().map_or(0, |t| t.addr),
            bounds: 0,
            o: y.buf.addr,
            part: 0,
            n_q: 0,
            row0: 0,
            q_pos: u32_of(q_pos, "a position")?,
            n_heads: p.n_heads as u32,
            n_kv_heads: p.n_kv_heads as u32,
            head_dim: hd as u32,
            kv_cols: k.cols as u32,
            block_size: pages.map_or(0, |pg| pg.block_size as u32),
            window: p
                .sliding_window
                .map_or(0, |w| w.min(u32::MAX as usize) as u32),
            mode: 0,
            scale: p.scale,
            softcap: p.softcap.unwrap_or(0.0),
            chunk: 0,
            n_chunks: 0,
        };
        let kernel = match k.dtype {
            KvDtype::F32 => Kernel::AttentionF32,
            KvDtype::F16 => Kernel::AttentionF16,
            KvDtype::Q8_0 => Kernel::AttentionQ80,
            KvDtype::Q4_0 => Kernel::AttentionQ40,
        };
        k.dtype.check_whole_blocks(op, "heads", hd)?;
        // The last row sees the most keys.
        let widest = (q_pos + q.rows).min(window);
        let mut uses = vec![&q.buf, &k.buf, &v.buf, &y.buf];
        if let Some(t) = &table {
            uses.push(t);
        }
        self.run_attention(kernel, push, q.rows, widest, &uses)?;
        Ok(y)
    }

    /// Records attention over `rows` query rows, none seeing more than `widest` keys: one
    /// workgroup per (head, row, chunk of [`ATTENTION_CHUNK`] keys), then, where rows span
    /// several chunks, the merge of their parts, in groups of rows whose parts fit
    /// [`ATTENTION_PART_BYTES`]. `push` holds everything but the row range and the chunking.
    fn run_attention(
        &self,
        kernel: Kernel,
        mut push: AttentionPush,
        rows: usize,
        widest: usize,
        uses: &[&Arc<Buffer>],
    ) -> Result<()> {
        let n_chunks = widest.div_ceil(ATTENTION_CHUNK).max(1);
        u32_of(n_chunks, "attention chunks")?;
        push.chunk = ATTENTION_CHUNK as u32;
        push.n_chunks = n_chunks as u32;
        let heads = push.n_heads as usize;
        if n_chunks == 1 {
            push.n_q = rows as u32;
            return self.shared.exec.dispatch(
                kernel,
                push_bytes(&push),
                [push.n_heads, groups(rows as u64, 1), 1],
                uses,
            );
        }
        let per_row = heads * n_chunks * (push.head_dim as usize + 2);
        let group = (self.part_bytes / (4 * per_row)).clamp(1, MAX_GROUPS as usize);
        let mut row0 = 0;
        while row0 < rows {
            let n = group.min(rows - row0);
            let part = self.new_tensor(n * heads * n_chunks, push.head_dim as usize + 2)?;
            push.part = part.buf.addr;
            push.n_q = n as u32;
            push.row0 = row0 as u32;
            let mut with_part = uses.to_vec();
            with_part.push(&part.buf);
            self.shared.exec.dispatch(
                kernel,
                push_bytes(&push),
                [push.n_heads, n as u32, n_chunks as u32],
                &with_part,
            )?;
            let merge = MergePush {
                part: part.buf.addr,
                o: push.o,
                n_q: n as u32,
                row0: row0 as u32,
                n_heads: push.n_heads,
                head_dim: push.head_dim,
                n_chunks: n_chunks as u32,
                _pad: 0,
            };
            self.shared.exec.dispatch(
                Kernel::AttentionMerge,
                push_bytes(&merge),
                [push.n_heads, n as u32, 1],
                &with_part,
            )?;
            row0 += n;
        }
        Ok(())
    }

    fn check_rows(&self, op: &'static str, at: usize, n: usize, rows: usize) -> Result<()> {
        match at.checked_add(n) {
            Some(end) if end <= rows => Ok(()),
            _ => Err(shape_err(
                op,
                format!("rows {at}..{at}+{n} of a tensor of {rows}"),
            )),
        }
    }
}

impl Backend for VulkanBackend {
    type Tensor = VkTensor;
    type Weight = VkWeight;
    type Kv = VkKv;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn synchronize(&self) -> Result<()> {
        self.shared.exec.sync()
    }

    fn upload_weight(&self, data: &WeightData) -> Result<VkWeight> {
        let werr = |detail: String| BackendError::Weight {
            name: data.name.clone(),
            detail,
        };
        if kernels_of(data.ty).is_none() {
            return Err(werr(format!("type {} has no Vulkan kernel", data.ty)));
        }
        let (k, n) = (data.row_len(), data.n_rows());
        let row_bytes = data.checked_row_bytes()?;
        if data.dims.len() == 1 {
            let mut v = vec![0.0f32; k];
            kiln_quant::dequantize(data.ty, &data.bytes, &mut v)
                .map_err(|e| werr(e.to_string()))?;
            return Ok(VkWeight {
                buf: self.upload_f32(&v, Place::Device, &data.name)?,
                ty: GgmlType::F32,
                k,
                n: 1,
                row_bytes: k * 4,
                vector: true,
                name: data.name.clone(),
                gptq: None,
            });
        }
        if u32::try_from(data.bytes.len()).is_err() {
            return Err(werr(format!(
                "{} bytes: the Vulkan kernels address weights of up to 4 GiB",
                data.bytes.len()
            )));
        }
        Ok(VkWeight {
            buf: self.upload_bytes(&data.bytes, Place::Device, &data.name)?,
            ty: data.ty,
            k,
            n,
            row_bytes,
            vector: false,
            name: data.name.clone(),
            gptq: None,
        })
    }

    fn upload_gptq(&self, name: &str, m: Arc<GptqMatrix>) -> Result<VkWeight> {
        let werr = |detail: String| BackendError::Weight {
            name: name.to_string(),
            detail,
        };
        let (k, n) = (m.in_features, m.out_features);
        if m.group_size == 0 || !m.group_size.is_multiple_of(16) || !k.is_multiple_of(m.group_size)
        {
            return Err(werr(format!(
                "groups of {} inputs over {k} (the Vulkan kernel takes groups of a multiple of 16 \
                 that divide the row)",
                m.group_size
            )));
        }
        let groups = n * (k / m.group_size);
        if m.codes.len() != n * k / 2 || m.scales.len() != groups || m.zeros.len() != groups {
            return Err(werr("inconsistent GPTQ matrix".into()));
        }
        u32_of(n * k, "GPTQ weight elements")?;
        let zeros: Vec<u32> = m.zeros.iter().map(|&z| z as u32).collect();
        let perm = match &m.perm {
            Some(p) if p.len() == k && p.iter().all(|&i| (i as usize) < k) => {
                Some(self.upload_u32(p, Place::Device, name)?)
            }
            Some(_) => return Err(werr("a permutation out of range".into())),
            None => None,
        };
        Ok(VkWeight {
            buf: self.upload_bytes(&m.codes, Place::Device, name)?,
            ty: GgmlType::I32,
            k,
            n,
            row_bytes: k / 2,
            vector: false,
            name: name.to_string(),
            gptq: Some(GptqParts {
                scales: self.upload_f32(&m.scales, Place::Device, name)?,
                zeros: self.upload_u32(&zeros, Place::Device, name)?,
                perm,
                group: m.group_size,
            }),
        })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<VkTensor> {
        let t = self.new_tensor(rows, cols)?;
        self.shared.exec.fill(&t.buf, 0, t.buf.size, 0)?;
        Ok(t)
    }

    fn kv_zeros(&self, rows: usize, cols: usize) -> Result<VkKv> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| shape_err("kv_zeros", format!("[{rows}, {cols}] overflows")))?;
        u32_of(n, "KV cache elements")?;
        let dtype = self.kv_dtype;
        dtype.check_whole_blocks("kv_zeros", "rows", cols)?;
        let buf = self.alloc(rows * dtype.row_bytes(cols), Place::Device, "a KV cache")?;
        self.shared.exec.fill(&buf, 0, buf.size, 0)?;
        Ok(VkKv {
            buf,
            rows,
            cols,
            dtype: self.kv_dtype,
        })
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    fn kv_shape(&self, x: &VkKv) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn kv_to_f32(&self, x: &VkKv) -> Result<Vec<f32>> {
        let n = x.rows * x.cols;
        let bytes = self.read_back(&x.buf, x.rows * x.dtype.row_bytes(x.cols))?;
        Ok(match x.dtype {
            KvDtype::Q8_0 | KvDtype::Q4_0 => {
                let mut out = vec![0.0; n];
                kiln_quant::dequantize(x.dtype.ggml_type(), &bytes, &mut out)
                    .map_err(|e| shape_err("kv_to_f32", e.to_string()))?;
                out
            }
            KvDtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
            KvDtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        })
    }

    fn tensor_from_f32(&self, data: &[f32], rows: usize, cols: usize) -> Result<VkTensor> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(shape_err(
                "tensor_from_f32",
                format!("{} values as [{rows}, {cols}]", data.len()),
            ));
        }
        u32_of(data.len(), "tensor elements")?;
        Ok(VkTensor {
            buf: self.upload_f32(data, Place::Scratch, "a tensor")?,
            rows,
            cols,
        })
    }

    fn to_f32(&self, x: &VkTensor) -> Result<Vec<f32>> {
        let bytes = self.read_back(&x.buf, x.rows * x.cols * 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }

    fn shape(&self, x: &VkTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn rows(&self, x: &VkTensor, range: Range<usize>) -> Result<VkTensor> {
        if range.start > range.end || range.end > x.rows {
            return Err(shape_err(
                "rows",
                format!("rows {range:?} of a tensor of {}", x.rows),
            ));
        }
        let y = self.new_tensor(range.len(), x.cols)?;
        let bytes = (range.len() * x.cols * 4) as u64;
        if bytes > 0 {
            let region = [vk::BufferCopy::default()
                .src_offset((range.start * x.cols * 4) as u64)
                .size(bytes)];
            self.shared.exec.copy(&x.buf, &y.buf, &region)?;
        }
        Ok(y)
    }

    fn write_rows(&self, dst: &mut VkTensor, dst_row: usize, src: &VkTensor) -> Result<()> {
        self.check_rows("write_rows", dst_row, src.rows, dst.rows)?;
        if src.cols != dst.cols {
            return Err(shape_err(
                "write_rows",
                format!("rows of {} into rows of {}", src.cols, dst.cols),
            ));
        }
        let bytes = (src.rows * src.cols * 4) as u64;
        if bytes > 0 {
            let region = [vk::BufferCopy::default()
                .dst_offset((dst_row * dst.cols * 4) as u64)
                .size(bytes)];
            self.shared.exec.copy(&src.buf, &dst.buf, &region)?;
        }
        Ok(())
    }

    fn write_kv_rows(&self, dst: &mut VkKv, dst_row: usize, src: &VkTensor) -> Result<()> {
        self.check_rows("write_kv_rows", dst_row, src.rows, dst.rows)?;
        if src.cols != dst.cols {
            return Err(shape_err(
                "write_kv_rows",
                format!("rows of {} into a cache of {}", src.cols, dst.cols),
            ));
        }
        let n = src.rows * src.cols;
        if n == 0 {
            return Ok(());
        }
        match dst.dtype {
            KvDtype::F32 => {
                let region = [vk::BufferCopy::default()
                    .dst_offset((dst_row * dst.cols * 4) as u64)
                    .size((n * 4) as u64)];
                self.shared.exec.copy(&src.buf, &dst.buf, &region)
            }
            KvDtype::F16 | KvDtype::Q8_0 | KvDtype::Q4_0 => {
                let kind = match dst.dtype {
                    KvDtype::Q8_0 => 1,
                    KvDtype::Q4_0 => 2,
                    _ => 0,
                };
                for mode in [0, 1] {
                    let push = KvWritePush {
                        src: src.buf.addr,
                        dst: dst.buf.addr,
                        flag: self.shared.flag.addr,
                        n: n as u32,
                        dst_offset: (dst_row * dst.cols) as u32,
                        mode,
                        kind,
                    };
                    self.shared.exec.dispatch(
                        Kernel::KvWrite,
                        push_bytes(&push),
                        [groups(n as u64, 256), 1, 1],
                        &[&src.buf, &dst.buf, &self.shared.flag],
                    )?;
                }
                Ok(())
            }
        }
    }

    fn gather_rows(&self, x: &VkTensor, index: &[u32]) -> Result<VkTensor> {
        if let Some(&bad) = index.iter().find(|&&i| i as usize >= x.rows) {
            return Err(shape_err(
                "gather_rows",
                format!("row {bad} of a tensor of {}", x.rows),
            ));
        }
        let y = self.new_tensor(index.len(), x.cols)?;
        let row = (x.cols * 4) as u64;
        if row == 0 {
            return Ok(y);
        }
        // Runs of consecutive source rows become one region.
        let mut regions: Vec<vk::BufferCopy> = Vec::new();
        for (i, &r) in index.iter().enumerate() {
            let (src, dst) = (r as u64 * row, i as u64 * row);
            match regions.last_mut() {
                Some(last)
                    if last.src_offset + last.size == src && last.dst_offset + last.size == dst =>
                {
                    last.size += row
                }
                _ => regions.push(
                    vk::BufferCopy::default()
                        .src_offset(src)
                        .dst_offset(dst)
                        .size(row),
                ),
            }
        }
        self.shared.exec.copy(&x.buf, &y.buf, &regions)?;
        Ok(y)
    }

    fn scatter_add_rows(
        &self,
        dst: &mut VkTensor,
        index: &[u32],
        src: &VkTensor,
        weights: &[f32],
    ) -> Result<()> {
        if index.len() != src.rows || weights.len() != src.rows || src.cols != dst.cols {
            return Err(shape_err(
                "scatter_add_rows",
                format!(
                    "{} rows of {} with {} indices and {} weights into rows of {}",
                    src.rows,
                    src.cols,
                    index.len(),
                    weights.len(),
                    dst.cols
                ),
            ));
        }
        if let Some(&bad) = index.iter().find(|&&i| i as usize >= dst.rows) {
            return Err(shape_err(
                "scatter_add_rows",
                format!("row {bad} of a tensor of {}", dst.rows),
            ));
        }
        if src.rows == 0 || src.cols == 0 {
            return Ok(());
        }
        let idx = self.upload_u32(index, Place::Scratch, "scatter indices")?;
        let w = self.upload_f32(weights, Place::Scratch, "scatter weights")?;
        let push = ScatterPush {
            dst: dst.buf.addr,
            src: src.buf.addr,
            index: idx.addr,
            weights: w.addr,
            n: src.rows as u32,
            cols: src.cols as u32,
        };
        self.shared.exec.dispatch(
            Kernel::Scatter,
            push_bytes(&push),
            [groups(src.cols as u64, 64), 1, 1],
            &[&dst.buf, &src.buf, &idx, &w],
        )
    }

    fn embedding(&self, table: &VkWeight, ids: &[u32]) -> Result<VkTensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.n) {
            return Err(shape_err(
                "embedding",
                format!("token {bad} of a table of {} ({})", table.n, table.name),
            ));
        }
        let Some(TypeKernels { embed: kernel, .. }) = kernels_of(table.ty) else {
            return Err(shape_err(
                "embedding",
                format!("{} is a GPTQ matrix, not an embedding table", table.name),
            ));
        };
        let y = self.new_tensor(ids.len(), table.k)?;
        if ids.is_empty() || table.k == 0 {
            return Ok(y);
        }
        let idb = self.upload_u32(ids, Place::Scratch, "token ids")?;
        let push = EmbedPush {
            w: table.buf.addr,
            ids: idb.addr,
            y: y.buf.addr,
            n_ids: ids.len() as u32,
            k: table.k as u32,
            row_bytes: table.row_bytes as u32,
            _pad: 0,
        };
        let chunks = (ids.len() * table.k.div_ceil(16)) as u64;
        self.shared.exec.dispatch(
            kernel,
            push_bytes(&push),
            [groups(chunks, 64), 1, 1],
            &[&table.buf, &idb, &y.buf],
        )?;
        Ok(y)
    }

    fn matmul(&self, x: &VkTensor, w: &Linear<Self>) -> Result<VkTensor> {
        self.product(x, w, None)
    }

    fn matmul_activation(
        &self,
        x: &VkTensor,
        w: &Linear<Self>,
        act: Activation,
    ) -> Result<VkTensor> {
        self.product(x, w, Some(act))
    }

    fn rms_norm(&self, x: &VkTensor, weight: &VkWeight, eps: f32) -> Result<VkTensor> {
        self.norm(x, None, weight, None, eps, NORM_RMS, "rms_norm")
    }

    fn add_rms_norm(
        &self,
        residual: &VkTensor,
        x: &VkTensor,
        weight: &VkWeight,
        eps: f32,
    ) -> Result<VkTensor> {
        self.norm(
            x,
            Some(residual),
            weight,
            None,
            eps,
            NORM_RMS_ADD,
            "add_rms_norm",
        )
    }

    fn layer_norm(
        &self,
        x: &VkTensor,
        weight: &VkWeight,
        bias: Option<&VkWeight>,
        eps: f32,
    ) -> Result<VkTensor> {
        self.norm(x, None, weight, bias, eps, NORM_LAYER, "layer_norm")
    }

    fn add_layer_norm(
        &self,
        residual: &VkTensor,
        x: &VkTensor,
        weight: &VkWeight,
        bias: Option<&VkWeight>,
        eps: f32,
    ) -> Result<VkTensor> {
        self.norm(
            x,
            Some(residual),
            weight,
            bias,
            eps,
            NORM_LAYER,
            "add_layer_norm",
        )
    }

    fn rope(&self, x: &VkTensor, positions: &[u32], p: &RopeParams) -> Result<VkTensor> {
        p.check(x.rows, x.cols, positions.len())?;
        let y = self.new_tensor(x.rows, x.cols)?;
        if x.rows == 0 || x.cols == 0 {
            return Ok(y);
        }
        // Angles in f64, rounded once: as exact as f32 allows at any position.
        let half = p.rope_dim / 2;
        let mut cs = vec![0.0f32; x.rows * p.rope_dim];
        for (r, &pos) in positions.iter().enumerate() {
            let row = &mut cs[r * p.rope_dim..(r + 1) * p.rope_dim];
            for i in 0..half {
                let inv = (p.base as f64).powf(-2.0 * i as f64 / p.rope_dim as f64);
                let factor = p.freq_factors.as_ref().map_or(1.0, |f| f[i] as f64);
                let theta = pos as f64 * p.freq_scale as f64 * inv / factor;
                row[i] = (theta.cos() * p.mscale as f64) as f32;
                row[half + i] = (theta.sin() * p.mscale as f64) as f32;
            }
        }
        let table = self.upload_f32(&cs, Place::Scratch, "rope angles")?;
        let push = RopePush {
            x: x.buf.addr,
            cs: table.addr,
            y: y.buf.addr,
            rows: x.rows as u32,
            n_heads: p.n_heads as u32,
            head_dim: p.head_dim as u32,
            rope_dim: p.rope_dim as u32,
            neox: (p.style == RopeStyle::Neox) as u32,
            _pad: 0,
        };
        let per_head = (half + p.head_dim - p.rope_dim) as u64;
        self.shared.exec.dispatch(
            Kernel::Rope,
            push_bytes(&push),
            [
                groups(x.rows as u64 * p.n_heads as u64 * per_head, 64),
                1,
                1,
            ],
            &[&x.buf, &table, &y.buf],
        )?;
        Ok(y)
    }

    fn attention(
        &self,
        q: &VkTensor,
        k_cache: &VkKv,
        v_cache: &VkKv,
        q_pos: usize,
        n_kv: usize,
        params: &AttentionParams,
    ) -> Result<VkTensor> {
        self.attend(q, k_cache, v_cache, None, q_pos, n_kv, params)
    }

    fn paged_attention(
        &self,
        q: &VkTensor,
        k_pool: &VkKv,
        v_pool: &VkKv,
        pages: &KvPages<'_>,
        q_pos: usize,
        n_kv: usize,
        params: &AttentionParams,
    ) -> Result<VkTensor> {
        self.attend(q, k_pool, v_pool, Some(pages), q_pos, n_kv, params)
    }

    fn packed_attention(
        &self,
        q: &VkTensor,
        k: &VkTensor,
        v: &VkTensor,
        seq_lens: &[usize],
        p: &PackedAttentionParams,
    ) -> Result<VkTensor> {
        let cols = p.n_heads * p.head_dim;
        let total: usize = seq_lens.iter().sum();
        if p.head_dim == 0 || [q, k, v].iter().any(|t| t.cols != cols || t.rows != total) {
            return Err(shape_err(
                "packed_attention",
                format!(
                    "q/k/v [{}, {}]/[{}, {}]/[{}, {}] for sequences {seq_lens:?} of {} heads of {}",
                    q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, p.n_heads, p.head_dim
                ),
            ));
        }
        if p.head_dim > MAX_HEAD_DIM {
            return Err(shape_err(
                "packed_attention",
                format!(
                    "heads of {} (the Vulkan kernel holds at most {MAX_HEAD_DIM})",
                    p.head_dim
                ),
            ));
        }
        let y = self.new_tensor(q.rows, q.cols)?;
        if total == 0 || p.n_heads == 0 {
            return Ok(y);
        }
        let mut bounds = Vec::with_capacity(2 * total);
        let mut start = 0usize;
        for &len in seq_lens {
            for i in start..start + len {
                let (lo, hi) = match p.radius {
                    Some(r) => (i.saturating_sub(r).max(start), (i + r).min(start + len - 1)),
                    None => (start, start + len - 1),
                };
                bounds.push(lo as u32);
                bounds.push(hi as u32);
            }
            start += len;
        }
        let widest = bounds
            .chunks(2)
            .map(|b| (b[1] - b[0]) as usize + 1)
            .max()
            .unwrap_or(1);
        let bounds_buf = self.upload_u32(&bounds, Place::Scratch, "sequence bounds")?;
        let push = AttentionPush {
            q: q.buf.addr,
            k: k.buf.addr,
            v: v.buf.addr,
            table: 0,
            bounds: bounds_buf.addr,
            o: y.buf.addr,
            part: 0,
            n_q: 0,
            row0: 0,
            q_pos: 0,
            n_heads: p.n_heads as u32,
            n_kv_heads: p.n_heads as u32,
            head_dim: p.head_dim as u32,
            kv_cols: cols as u32,
            block_size: 0,
            window: 0,
            mode: 1,
            scale: p.scale,
            softcap: 0.0,
            chunk: 0,
            n_chunks: 0,
        };
        self.run_attention(
            Kernel::AttentionF32,
            push,
            total,
            widest,
            &[&q.buf, &k.buf, &v.buf, &bounds_buf, &y.buf],
        )?;
        Ok(y)
    }

    fn activation(&self, x: &VkTensor, act: Activation) -> Result<VkTensor> {
        self.eltwise(x, None, OP_ACT, act_code(act), 0.0, "activation")
    }

    fn add(&self, a: &VkTensor, b: &VkTensor) -> Result<VkTensor> {
        self.eltwise(a, Some(b), OP_ADD, 0, 0.0, "add")
    }

    fn mul(&self, a: &VkTensor, b: &VkTensor) -> Result<VkTensor> {
        self.eltwise(a, Some(b), OP_MUL, 0, 0.0, "mul")
    }

    fn scale(&self, x: &VkTensor, s: f32) -> Result<VkTensor> {
        self.eltwise(x, None, OP_SCALE, 0, s, "scale")
    }

    fn gated_activation(
        &self,
        gate: &VkTensor,
        up: &VkTensor,
        act: Activation,
    ) -> Result<VkTensor> {
        self.eltwise(
            gate,
            Some(up),
            OP_GATED,
            act_code(act),
            0.0,
            "gated_activation",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_backend::KvPages;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) % 2001) as f32 / 1000.0
                    - 1.0
            })
            .collect()
    }

    /// Calls whose chunk results exceed the budget run in groups of rows, and a row's result
    /// does not depend on its group: groups of one row give the bits of one group.
    #[test]
    fn attention_in_groups_of_rows_gives_the_same_bits() {
        let Some(whole) = crate::testing::backend("attention in groups of rows") else {
            return;
        };
        let mut grouped = whole.with(KvDtype::F16, false);
        grouped.part_bytes = 1;
        let whole = whole.with(KvDtype::F16, false);
        let (heads, kv_heads, hd, n_kv, rows) = (4usize, 2usize, 24usize, 700usize, 9usize);
        let p = AttentionParams {
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: hd,
            scale: 0.3,
            sliding_window: Some(600),
            softcap: None,
        };
        let table: Vec<u32> = (0..n_kv.div_ceil(100) as u32).rev().collect();
        let pages = KvPages {
            table: &table,
            block_size: 100,
        };
        let run = |b: &VulkanBackend| {
            let kv = |seed| {
                let mut c = b.kv_zeros(n_kv, kv_heads * hd).unwrap();
                let t = b
                    .tensor_from_f32(&values(n_kv * kv_heads * hd, seed), n_kv, kv_heads * hd)
                    .unwrap();
                b.write_kv_rows(&mut c, 0, &t).unwrap();
                c
            };
            let (k, v) = (kv(1), kv(2));
            let q = b
                .tensor_from_f32(&values(rows * heads * hd, 3), rows, heads * hd)
                .unwrap();
            let contiguous = b.attention(&q, &k, &v, n_kv - rows, n_kv, &p).unwrap();
            let paged = b
                .paged_attention(&q, &k, &v, &pages, n_kv - rows, n_kv, &p)
                .unwrap();
            let x = b
                .tensor_from_f32(&values(n_kv * heads * hd, 4), n_kv, heads * hd)
                .unwrap();
            let packed = b
                .packed_attention(
                    &x,
                    &x,
                    &x,
                    &[300, n_kv - 300],
                    &PackedAttentionParams {
                        n_heads: heads,
                        head_dim: hd,
                        scale: 0.2,
                        radius: None,
                    },
                )
                .unwrap();
            [contiguous, paged, packed].map(|t| b.to_f32(&t).unwrap())
        };
        let (a, g) = (run(&whole), run(&grouped));
        for (what, (a, g)) in ["attention", "paged attention", "packed attention"]
            .iter()
            .zip(a.iter().zip(&g))
        {
            assert!(a.iter().all(|x| x.is_finite()), "{what}: finite");
            assert!(
                a.iter().zip(g).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what}: groups of one row changed the bits"
            );
        }
    }

    /// More than the device holds is [`BackendError::OutOfMemory`] naming the bytes, and the
    /// backend goes on working.
    #[test]
    fn too_large_an_allocation_is_out_of_memory_and_the_device_stays_usable() {
        let Some(b) = crate::testing::backend("out of memory") else {
            return;
        };
        let heap = b.device().memory_bytes;
        let oom = |e: BackendError, want: u64| match e {
            BackendError::OutOfMemory {
                bytes, ref what, ..
            } => {
                assert!(bytes >= want, "{e}: names {bytes} bytes, asked {want}");
                assert!(e.to_string().contains(&bytes.to_string()), "{e}: {what}");
            }
            other => panic!("not OutOfMemory: {other}"),
        };
        oom(
            b.alloc(heap as usize + 1, Place::Device, "a test buffer")
                .err()
                .expect("an allocation larger than the heap fails"),
            heap + 1,
        );
        // Through the trait: a KV cache larger than the heap (when its elements stay within the
        // kernels' 32-bit indices, as on lavapipe's 2 GiB heap).
        let cols = 1024usize;
        let rows = heap as usize / (4 * cols) + 1;
        if ((rows * cols) as u64) < 1 << 32 {
            let b32 = b.with(KvDtype::F32, false);
            oom(
                b32.kv_zeros(rows, cols)
                    .err()
                    .expect("a KV cache larger than the heap"),
                (rows * cols * 4) as u64,
            );
        }
        let t = b.tensor_from_f32(&[1.0, 2.0], 1, 2).unwrap();
        assert_eq!(b.to_f32(&t).unwrap(), vec![1.0, 2.0]);
    }
}
