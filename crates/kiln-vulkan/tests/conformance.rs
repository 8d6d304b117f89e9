//! The conformance suite on the Vulkan backend: every op on the first usable Vulkan device
//! (lavapipe in CI), against the scalar reference, in both KV element types: as it runs by
//! default (tiled products for many rows, on the device's matrix units where kiln uses them)
//! and in batch-invariant mode, with the invariance claimed. `vulkan_half` runs the product
//! cases with the tiled kernel rounding its operands as the cooperative-matrix kernel does, so
//! that rounding is checked on devices without matrix units too; `vulkan_dot` runs them on
//! integer dot products, where the device can run them.
//!
//! With no Vulkan loader or device the cases say so and pass, unless `KILN_REQUIRE_VULKAN=1`
//! (set by `.ci/run`), under which they fail. `KILN_VULKAN_VALIDATION=1` turns on the Khronos
//! validation layer; any message it reports fails the case at its next read back.

use std::sync::OnceLock;

use kiln_backend::KvDtype;
use kiln_conformance::{cases, run_case, suite, Claims};
use kiln_vulkan::{testing, VulkanBackend};

/// One device for the whole test binary (opening one and compiling its kernels is the slow
/// part on a software device); each case gets a backend on it with the KV type it asks for.
fn vulkan(kv: KvDtype, batch_invariant: bool) -> Option<VulkanBackend> {
    static DEVICE: OnceLock<Result<VulkanBackend, String>> = OnceLock::new();
    let opened =
        DEVICE.get_or_init(|| VulkanBackend::new(&testing::options()).map_err(|e| e.to_string()));
    match opened {
        Ok(b) => Some(b.with(kv, batch_invariant)),
        Err(e) => {
            testing::unavailable("the conformance suite", e);
            None
        }
    }
}

/// What the device's backend claims: products on f16 operands where it uses matrix units, on
/// int8 activations where it uses integer dot products.
fn claims(batch_invariant: bool) -> Claims {
    let b = vulkan(KvDtype::F32, batch_invariant);
    Claims {
        half_products: b.as_ref().is_some_and(|b| b.half_products()),
        int8_activations: b.as_ref().is_some_and(|b| b.int8_activations()),
        batch_invariant,
        ..Claims::default()
    }
}

suite!(vulkan_device, |kv| vulkan(kv, false), claims(false));
suite!(vulkan_invariant, |kv| vulkan(kv, true), claims(true));

/// Cases of `config` on backends `make` derives from the device's, with `claims`.
macro_rules! some_cases {
    ($config:ident, $make:expr, $claims:expr; $($case:ident),* $(,)?) => {
        mod $config {
            use super::*;
            $(
                #[test]
                fn $case() {
                    run_case(stringify!($config), stringify!($case), $make, $claims, cases::$case);
                }
            )*
        }
    };
}

// The product cases on the tiled kernel with the cooperative-matrix kernel's rounding.
some_cases!(
    vulkan_half,
    |kv| vulkan(kv, false).map(|b| b.emulating_half_products()),
    Claims {
        half_products: true,
        ..Claims::default()
    };
    matmul_f16,
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
);

// The few-row products of block weights on integer dot products (lavapipe runs them, without
// accelerating them, so kiln does not use them there unasked), batch-invariant as serving runs.
some_cases!(
    vulkan_dot,
    |kv| vulkan(kv, true).and_then(|b| b.using_integer_dots()),
    Claims {
        int8_activations: true,
        ..Claims::default().batch_invariant()
    };
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
    matmul_many,
    matmul_activation,
    batch_invariant_matmul,
    deterministic,
);
