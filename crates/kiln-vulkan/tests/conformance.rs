//! The conformance suite on the Vulkan backend: every op on the first usable Vulkan device
//! (lavapipe in CI), against the scalar reference, in both KV element types: as it runs by
//! default (tiled products for many rows, on the device's matrix units where kiln uses them)
//! and in batch-invariant mode, with the invariance claimed. `vulkan_half` runs the product
//! cases with the tiled kernel rounding its operands as the cooperative-matrix kernel does, so
//! that rounding is checked on devices without matrix units too.
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

/// What the device's backend claims: products on f16 operands where it uses matrix units.
fn claims() -> Claims {
    Claims {
        half_products: vulkan(KvDtype::F32, false).is_some_and(|b| b.half_products()),
        ..Claims::default()
    }
}

suite!(vulkan_device, |kv| vulkan(kv, false), claims());
suite!(
    vulkan_invariant,
    |kv| vulkan(kv, true),
    Claims::default().batch_invariant()
);

/// The product cases on the tiled kernel with the cooperative-matrix kernel's rounding.
macro_rules! half_cases {
    ($($case:ident),* $(,)?) => {
        mod vulkan_half {
            use super::*;
            $(
                #[test]
                fn $case() {
                    run_case(
                        "vulkan_half",
                        stringify!($case),
                        |kv| vulkan(kv, false).map(|b| b.emulating_half_products()),
                        Claims {
                            half_products: true,
                            ..Claims::default()
                        },
                        cases::$case,
                    );
                }
            )*
        }
    };
}

half_cases!(
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
