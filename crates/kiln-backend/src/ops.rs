//! Parameters of the backend primitives. Plain data, so every backend reads them the same way.

use std::sync::Arc;

use kiln_core::config::{FfnActivation, RopeConfig, RopeKind};

/// Element-wise activation functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// `0.5·x·(1 + erf(x/√2))`.
    Gelu,
    /// `x·σ(x)`.
    Silu,
}

impl Activation {
    /// The scalar definition; backends' kernels are tested against it.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::GeluTanh => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
            }
            Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
            Activation::Silu => x / (1.0 + (-x).exp()),
        }
    }
}

/// The activation a model configuration names: the one mapping from the configuration's enum.
impl From<FfnActivation> for Activation {
    fn from(a: FfnActivation) -> Self {
        match a {
            FfnActivation::GeluTanh => Activation::GeluTanh,
            FfnActivation::Gelu => Activation::Gelu,
            FfnActivation::Silu => Activation::Silu,
        }
    }
}

/// erf with |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit), in f64 for accuracy.
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    (if x >= 0.0 { 1.0 - r } else { r - 1.0 }) as f32
}

/// Which element pairs a rotation mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (original Llama / GPT-J layout; llama.cpp "normal").
    Normal,
    /// Halves `(x[i], x[i + d/2])` (GPT-NeoX layout; Gemma, Qwen, Phi-3).
    Neox,
}

/// The rotary layout a model configuration names: the one mapping from the configuration's enum.
impl From<RopeKind> for RopeStyle {
    fn from(k: RopeKind) -> Self {
        match k {
            RopeKind::Normal => RopeStyle::Normal,
            RopeKind::Neox => RopeStyle::Neox,
        }
    }
}

/// Rotary embedding of each head: pair `i` of `rope_dim / 2` turns by
/// `θ = position · freq_scale · base^(-2i / rope_dim) / freq_factors[i]`, and the rotation is
/// scaled: `(x0, x1) ↦ mscale · (x0 cos θ − x1 sin θ, x0 sin θ + x1 cos θ)`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub n_heads: usize,
    pub head_dim: usize,
    /// Leading elements of each head that rotate (`== head_dim` for full rotary).
    pub rope_dim: usize,
    pub base: f32,
    /// Linear position scaling (1.0 = none).
    pub freq_scale: f32,
    /// `rope_dim / 2` frequency divisors (Llama 3.1 scaling, Phi-3 long-rope); `None` = all 1.
    pub freq_factors: Option<Arc<[f32]>>,
    /// Multiplies cos and sin (1.0 = none).
    pub mscale: f32,
    pub style: RopeStyle,
}

impl RopeParams {
    /// The rotation `rope` describes, on `n_heads` heads of `head_dim` whose first `rope_dim`
    /// elements rotate.
    pub fn new(
        rope: &RopeConfig,
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        style: RopeStyle,
    ) -> Self {
        RopeParams {
            n_heads,
            head_dim,
            rope_dim,
            base: rope.base,
            freq_scale: rope.freq_scale,
            freq_factors: rope.freq_factors.clone(),
            mscale: rope.mscale,
            style,
        }
    }
}

impl RopeParams {
    /// Checks that a rope with these parameters fits `[rows, cols]` with `positions` positions:
    /// one position per row, `n_heads × head_dim` columns, an even rotary part no wider than a
    /// head, one frequency factor per pair. Every backend refuses the same operands.
    pub fn check(&self, rows: usize, cols: usize, positions: usize) -> crate::Result<()> {
        let p = self;
        if positions != rows
            || p.n_heads.checked_mul(p.head_dim) != Some(cols)
            || p.rope_dim > p.head_dim
            || !p.rope_dim.is_multiple_of(2)
            || p.freq_factors
                .as_ref()
                .is_some_and(|f| f.len() != p.rope_dim / 2)
        {
            return Err(crate::shape_err(
                "rope",
                format!(
                    "[{rows}, {cols}] with {positions} positions, {} heads of {} (rotary {})",
                    p.n_heads, p.head_dim, p.rope_dim
                ),
            ));
        }
        Ok(())
    }
}

/// The element type a backend stores its KV cache in ([`crate::Backend::kv_zeros`]). Keys and
/// values are computed in f32 either way; `F16` rounds them once, when they are stored (to the
/// nearest, ties to even), which halves the cache's memory and what attention reads from it.
/// llama.cpp stores its cache in f16 by default as well. `Q8_0` and `Q4_0` store llama.cpp's
/// blocks of 32 (an f16 scale and 32 8-bit or 4-bit integers: 8.5 and 4.5 bits a value), as its
/// `--cache-type-k/v q8_0|q4_0` do; a row's blocks never straddle two heads, so a head's size
/// must be a multiple of 32 ([`KvDtype::block`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// Exactly the f32 keys and values the model computed.
    F32,
    /// IEEE half precision: 11 significant bits, largest finite value 65504.
    #[default]
    F16,
    /// Blocks of 32: `x = d · q`, `q` in −127..=127, `d = max|x| / 127` (f16).
    Q8_0,
    /// Blocks of 32: `x = d · (q − 8)`, `q` in 0..16, `d = −(the x of largest |x|) / 8` (f16).
    Q4_0,
}

impl KvDtype {
    /// Every type, in the order the docs list them.
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0];

    /// Elements per stored block: 1 for the float types, 32 for the block types. A cache's rows
    /// (and the heads in them) hold whole blocks.
    pub fn block(self) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 => 1,
            KvDtype::Q8_0 | KvDtype::Q4_0 => 32,
        }
    }

    /// Bytes of one stored block.
    pub fn block_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
            KvDtype::Q8_0 => 34,
            KvDtype::Q4_0 => 18,
        }
    }

    /// Bytes of a row of `cols` elements (a multiple of [`KvDtype::block`]; a partial block
    /// counts whole).
    pub fn row_bytes(self, cols: usize) -> usize {
        cols.div_ceil(self.block()) * self.block_bytes()
    }

    /// The GGML type whose layout this type stores (llama.cpp's cache tensor type).
    pub fn ggml_type(self) -> kiln_core::GgmlType {
        match self {
            KvDtype::F32 => kiln_core::GgmlType::F32,
            KvDtype::F16 => kiln_core::GgmlType::F16,
            KvDtype::Q8_0 => kiln_core::GgmlType::Q8_0,
            KvDtype::Q4_0 => kiln_core::GgmlType::Q4_0,
        }
    }

    /// An error of `op` unless `n` values (a row of `what`: "rows", "heads") are whole blocks.
    pub fn check_whole_blocks(self, op: &'static str, what: &str, n: usize) -> crate::Result<()> {
        if n.is_multiple_of(self.block()) {
            return Ok(());
        }
        Err(crate::shape_err(
            op,
            format!(
                "a {self} KV cache stores whole blocks of {} values: {what} of {n} do not divide \
                 into them",
                self.block()
            ),
        ))
    }

    /// `"f32"`, `"f16"`, `"q8_0"` or `"q4_0"`, as [`KvDtype::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// A [`KvDtype::name`] (any case).
    pub fn parse(s: &str) -> Option<KvDtype> {
        let s = s.to_ascii_lowercase();
        KvDtype::ALL.into_iter().find(|t| t.name() == s)
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Attention over a KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies `q·k` before the softmax (usually `1/√head_dim`).
    pub scale: f32,
    /// A query at position `p` sees keys at positions `> p - window` (and `≤ p`).
    pub sliding_window: Option<usize>,
    /// `s = cap · tanh(s / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// The first key position a query at `q_pos` sees (its window's start, or 0).
    pub fn first_key(&self, q_pos: usize) -> usize {
        self.sliding_window
            .map_or(0, |w| kiln_core::config::window_start(q_pos, w))
    }

    /// Checks the operands of [`crate::Backend::attention`] (`op` names it in the error): `q`
    /// of `n_heads × head_dim` columns at `q_pos`, caches `k`, `v` (`(rows, cols)`) of
    /// `n_kv_heads × head_dim` columns holding at least `n_kv` rows (not checked when `paged`:
    /// the block table is checked instead), whole groups of query heads per KV head, and every
    /// query position below `n_kv`. Every backend refuses the same operands.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        op: &'static str,
        q: (usize, usize),
        k: (usize, usize),
        v: (usize, usize),
        q_pos: usize,
        n_kv: usize,
        paged: bool,
    ) -> crate::Result<()> {
        let (p, hd) = (self, self.head_dim);
        let rows_ok = paged || (n_kv <= k.0 && n_kv <= v.0);
        if p.n_kv_heads == 0
            || !p.n_heads.is_multiple_of(p.n_kv_heads)
            || q.1 != p.n_heads * hd
            || k.1 != p.n_kv_heads * hd
            || v.1 != p.n_kv_heads * hd
            || !rows_ok
            || q_pos.checked_add(q.0).is_none_or(|end| end > n_kv)
        {
            return Err(crate::shape_err(
                op,
                format!(
                    "q [{}, {}] at {q_pos}, caches [{}, {}]/[{}, {}] with {n_kv} filled, {} heads / {} kv heads of {hd}",
                    q.0, q.1, k.0, k.1, v.0, v.1, p.n_heads, p.n_kv_heads
                ),
            ));
        }
        Ok(())
    }
}

/// Where a sequence's KV rows live in a paged cache: logical row `j` (position `j`) is physical
/// row `table[j / block_size] * block_size + j % block_size` of the per-layer K and V pools
/// (`[n_blocks * block_size, kv_cols]`). The engine's block manager owns the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPages<'a> {
    pub table: &'a [u32],
    pub block_size: usize,
}

/// One sequence's attention in [`crate::Backend::attention_many`]: its queries, its K and V
/// (a contiguous cache, or the pools with `pages`), and the arguments of
/// [`crate::Backend::attention`].
#[derive(Clone, Copy, Debug)]
pub struct AttentionJob<'a, T, K> {
    pub q: &'a T,
    pub k: &'a K,
    pub v: &'a K,
    /// `Some`: `k` and `v` are pools read through these pages ([`crate::Backend::paged_attention`]).
    pub pages: Option<KvPages<'a>>,
    pub q_pos: usize,
    pub n_kv: usize,
}

impl<T, K> AttentionJob<'_, T, K> {
    /// The job alone on `b`: [`crate::Backend::paged_attention`] with pages, else
    /// [`crate::Backend::attention`].
    pub fn run<B: crate::Backend<Tensor = T, Kv = K>>(
        &self,
        b: &B,
        params: &AttentionParams,
    ) -> crate::Result<T> {
        match &self.pages {
            Some(pages) => {
                b.paged_attention(self.q, self.k, self.v, pages, self.q_pos, self.n_kv, params)
            }
            None => b.attention(self.q, self.k, self.v, self.q_pos, self.n_kv, params),
        }
    }
}

impl KvPages<'_> {
    /// The physical row of logical row `j`, when the table covers it and the pool holds
    /// `pool_rows` rows.
    pub fn physical_row(&self, j: usize, pool_rows: usize) -> Option<usize> {
        if self.block_size == 0 {
            return None;
        }
        let block = *self.table.get(j / self.block_size)? as usize;
        let row = block
            .checked_mul(self.block_size)?
            .checked_add(j % self.block_size)?;
        (row < pool_rows).then_some(row)
    }

    /// Checks that logical rows `rows` all map into a pool of `pool_rows` rows (entries of the
    /// table outside them are not looked at: a sliding window's table may hold no block for the
    /// rows it can no longer see); describes the first problem otherwise.
    pub fn check(&self, rows: std::ops::Range<usize>, pool_rows: usize) -> Result<(), String> {
        if self.block_size == 0 {
            return Err("block size 0".into());
        }
        if rows.is_empty() {
            return Ok(());
        }
        let (first, blocks) = (
            rows.start / self.block_size,
            rows.end.div_ceil(self.block_size),
        );
        if self.table.len() < blocks {
            return Err(format!(
                "{} rows need {blocks} blocks of {}, the table has {}",
                rows.end,
                self.block_size,
                self.table.len()
            ));
        }
        let pool_blocks = pool_rows / self.block_size;
        match self.table[first..blocks]
            .iter()
            .position(|&b| b as usize >= pool_blocks)
        {
            Some(i) => Err(format!(
                "block {} (entry {}) is outside a pool of {pool_blocks} blocks",
                self.table[first + i],
                first + i
            )),
            None => Ok(()),
        }
    }
}

/// Bidirectional attention inside each sequence of a packed batch (encoders).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedAttentionParams {
    pub n_heads: usize,
    pub head_dim: usize,
    /// Multiplies `q·k` before the softmax (usually `1/√head_dim`).
    pub scale: f32,
    /// Local attention: token `i` sees tokens `j` with `|i − j| ≤ radius` of its own sequence
    /// (ModernBERT's local layers: `radius = local_attention / 2`). `None`: the whole sequence.
    pub radius: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_pages_map_rows_and_check_their_table() {
        let pages = KvPages {
            table: &[3, 0, 2],
            block_size: 4,
        };
        assert_eq!(pages.physical_row(0, 16), Some(12));
        assert_eq!(pages.physical_row(5, 16), Some(1));
        assert_eq!(pages.physical_row(11, 16), Some(11));
        assert_eq!(pages.physical_row(12, 16), None, "past the table");
        assert_eq!(pages.physical_row(0, 12), None, "past the pool");
        assert!(pages.check(0..12, 16).is_ok());
        assert!(pages
            .check(0..13, 16)
            .unwrap_err()
            .contains("need 4 blocks"));
        assert!(pages.check(0..1, 12).unwrap_err().contains("block 3"));
        // Only the rows asked about: block 3 (entry 0) is past a pool of 12 rows.
        assert!(pages.check(4..12, 12).is_ok());
        assert!(pages.check(3..12, 12).unwrap_err().contains("entry 0"));
        let empty = KvPages {
            table: &[],
            block_size: 0,
        };
        assert_eq!(empty.physical_row(0, 8), None);
        assert!(empty.check(0..0, 8).is_err());
    }

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-6,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn activations_at_reference_points() {
        // Values from PyTorch: gelu(x, approximate="tanh"), gelu(x), silu(x).
        let x = 1.5f32;
        assert!((Activation::GeluTanh.apply(x) - 1.399_572_5).abs() < 1e-6);
        assert!((Activation::Gelu.apply(x) - 1.399_789_5).abs() < 1e-6);
        assert!((Activation::Silu.apply(x) - 1.226_361_6).abs() < 1e-6);
    }
}
