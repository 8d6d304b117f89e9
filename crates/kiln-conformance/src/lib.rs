//! kiln-conformance: one suite of op checks written against `impl Backend`, run against every
//! backend compiled in.
//!
//! Each case (a `pub fn` of [`cases`], generic over `B: Backend`) builds its inputs on the host,
//! runs one op (or a few) on the backend, and compares the result with the scalar reference of
//! [`reference`](mod@reference): plain f64 loops written from the trait's definitions, independent of any
//! backend's kernels. The comparison allows, per output element, the rounding error an f32
//! implementation of the op can make ([`tolerance`] states each bound and where it comes from);
//! results the trait promises exactly (copies, single IEEE operations, `matmul_many` and
//! `attention_many` against their one-by-one calls, paged against contiguous attention, batch
//! invariance) are compared bit for bit.
//!
//! The case list follows llama.cpp's `tests/test-backend-ops.cpp` in spirit: every op of the
//! trait, every weight type, odd shapes (rows that are not a multiple of a block or tile, one row,
//! 70 rows, `k` not a multiple of 256 where the type allows), grouped-query attention, sliding
//! windows, soft-capping, contiguous and paged KV caches in both [`KvDtype`]s, MoE gather and
//! scatter, packed encoder attention, the fused default methods against their unfused
//! definitions, and batch invariance where the backend claims it.
//!
//! A backend joins with one line in a test file (here, with the backend as a dev-dependency, as
//! `tests/cpu.rs` does; or in the backend's crate, with this crate as a dev-dependency):
//!
//! ```ignore
//! kiln_conformance::suite!(cpu_scalar, |kv| Some(make_cpu_backend(kv)));
//! kiln_conformance::suite!(cpu_invariant, |kv| Some(make(kv)), Claims::default().batch_invariant());
//! ```
//!
//! which expands to a module `cpu_scalar` holding one `#[test]` per case, so the test runner
//! reports each case per backend by name (`cpu_scalar::rms_norm`). The factory is given the
//! [`KvDtype`] the case wants its caches in and returns the backend, or `None` when that backend
//! cannot run on this machine (every case then says so and passes). What a backend states about
//! itself — batch invariance, the weight types and KV element types it computes — is a [`Claims`];
//! the suite holds the backend to it.
//!
//! With `KILN_CONFORMANCE_MARGINS=1` (and `--no-capture`), every toleranced comparison prints the
//! largest share of its bound a result used: how close a backend runs to each bound.

pub mod cases;
pub mod check;
pub mod data;
pub mod reference;
pub mod tolerance;

use kiln_backend::{Backend, KvDtype};
use kiln_core::GgmlType;

/// Every weight type a backend may compute (those the CPU backend takes), in the order cases run
/// them.
pub const ALL_WEIGHT_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

/// What a backend states about itself, which the suite then checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// Every row of an op's result is computed by the same operations whatever the other rows of
    /// the call are (a sequence alone and batched gets the same bits). The `batch_invariant_*`
    /// cases check it when claimed and skip otherwise.
    pub batch_invariant: bool,
    /// The weight types `upload_weight` accepts; a case refused a listed type fails, one that
    /// is not listed is skipped with a message.
    pub weight_types: Vec<GgmlType>,
    /// `upload_gptq` accepts GPTQ 4-bit matrices (else the backend must refuse them by name).
    pub gptq: bool,
    /// The KV element types the factory can give a backend for.
    pub kv_dtypes: Vec<KvDtype>,
    /// Products of many rows may round activations and dequantized weights to f16 (each
    /// activation row scaled by a power of two to stay in range) and sum in f32, as matrix
    /// units do: the product cases then also accept that result.
    pub half_products: bool,
    /// Products of block weights may quantize each block of 32 activations to int8 codes with
    /// one scale (integer dot products): the product cases then also accept that result.
    pub int8_activations: bool,
    /// Products of F32 weights may split each operand into two BF16 parts (`v = hi + lo`, each
    /// rounded to nearest) and add three of the four part products (all but `lo·lo`) in f32, as
    /// AMX BF16 tiles run an f32 product: the float product cases then also accept that result
    /// ([`tolerance::split_product`]).
    pub split_products: bool,
}

impl Default for Claims {
    /// Everything the trait describes: all weight types, GPTQ, every KV cache type; no batch
    /// invariance.
    fn default() -> Self {
        Claims {
            batch_invariant: false,
            weight_types: ALL_WEIGHT_TYPES.to_vec(),
            gptq: true,
            kv_dtypes: KvDtype::ALL.to_vec(),
            half_products: false,
            int8_activations: false,
            split_products: false,
        }
    }
}

impl Claims {
    /// These claims, and split BF16 products of F32 weights.
    pub fn split_products(self) -> Self {
        Claims {
            split_products: true,
            ..self
        }
    }

    /// These claims, and batch invariance.
    pub fn batch_invariant(self) -> Self {
        Claims {
            batch_invariant: true,
            ..self
        }
    }
}

/// A backend under test: how to make one (with the KV element type a case asks for), and what it
/// claims.
pub struct Target<B> {
    make: Box<dyn Fn(KvDtype) -> Option<B>>,
    name: &'static str,
    pub claims: Claims,
}

impl<B: Backend> Target<B> {
    /// `make(kv)`: a backend whose caches hold `kv` (`None`: not available on this machine).
    pub fn new(
        name: &'static str,
        make: impl Fn(KvDtype) -> Option<B> + 'static,
        claims: Claims,
    ) -> Self {
        Target {
            make: Box::new(make),
            name,
            claims,
        }
    }

    /// The configuration's name (the suite's module name).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A fresh backend with the first claimed KV element type (for cases that make no cache).
    pub fn backend(&self) -> B {
        let kv = self.claims.kv_dtypes.first().copied().unwrap_or_default();
        (self.make)(kv).expect("the factory made a backend a moment ago")
    }

    /// A fresh backend for each claimed KV element type, checked to store that type.
    pub fn kv_backends(&self) -> Vec<(KvDtype, B)> {
        self.claims
            .kv_dtypes
            .iter()
            .map(|&kv| {
                let b = (self.make)(kv).expect("the factory made a backend a moment ago");
                assert_eq!(
                    b.kv_dtype(),
                    kv,
                    "{}: the factory was asked for a {kv} KV cache",
                    b.name()
                );
                (kv, b)
            })
            .collect()
    }

    /// Whether the backend claims `ty`; says so when a case skips it.
    pub fn computes(&self, ty: GgmlType, case: &str) -> bool {
        let ok = self.claims.weight_types.contains(&ty);
        if !ok {
            eprintln!("{}: {case}: {ty} skipped (not claimed)", self.name);
        }
        ok
    }

    /// Whether the backend is available here (the factory gives a backend).
    fn available(&self) -> bool {
        let kv = self.claims.kv_dtypes.first().copied().unwrap_or_default();
        (self.make)(kv).is_some()
    }
}

/// Runs `case` against the backend `make` gives (the body of each generated test).
pub fn run_case<B: Backend>(
    config: &'static str,
    case: &'static str,
    make: impl Fn(KvDtype) -> Option<B> + 'static,
    claims: Claims,
    run: fn(&Target<B>),
) {
    let target = Target::new(config, make, claims);
    if !target.available() {
        eprintln!("{config}: {case} skipped: this backend is not available on this machine");
        return;
    }
    run(&target);
}

/// One `#[test]` per case for a backend: `suite!(name, factory)` or `suite!(name, factory,
/// claims)`. `factory` is `Fn(KvDtype) -> Option<B>` (see the crate docs); `claims` a
/// [`Claims`] (default: [`Claims::default`]). The tests live in a module `name`, which sees the
/// items of the module the macro is called in.
#[macro_export]
macro_rules! suite {
    ($name:ident, $factory:expr $(,)?) => {
        $crate::suite!($name, $factory, $crate::Claims::default());
    };
    ($name:ident, $factory:expr, $claims:expr $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__cases!(
                $name,
                $factory,
                $claims;
                tensor_round_trip,
                gather_rows,
                scatter_add_rows,
                kv_cache_round_trip,
                write_paged_rows,
                add_mul_scale,
                activation,
                gated_activation,
                rms_norm,
                add_rms_norm,
                layer_norm,
                add_layer_norm,
                rope,
                rope_is_history_independent,
                embedding,
                matmul_f32,
                matmul_f16,
                matmul_bf16,
                matmul_q4_0,
                matmul_q4_1,
                matmul_q5_0,
                matmul_q5_1,
                matmul_q8_0,
                matmul_q2_k,
                matmul_q3_k,
                matmul_q4_k,
                matmul_q5_k,
                matmul_q6_k,
                matmul_q8_k,
                matmul_gptq,
                matmul_many,
                matmul_activation,
                attention,
                paged_attention,
                attention_many,
                long_attention,
                packed_attention,
                batch_invariant_matmul,
                batch_invariant_attention,
                batch_invariant_packed_attention,
                deterministic,
                shape_errors,
            );
        }
    };
}

/// The tests of [`suite!`], one per case name.
#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($config:ident, $factory:expr, $claims:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_case(
                    stringify!($config),
                    stringify!($case),
                    $factory,
                    $claims,
                    $crate::cases::$case,
                );
            }
        )*
    };
}
