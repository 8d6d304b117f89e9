//! The conformance suite on the Vulkan backend: every op on the first usable Vulkan device
//! (lavapipe in CI), against the scalar reference, in both KV element types: as it runs by
//! default (tiled products for many rows) and in batch-invariant mode, with the invariance
//! claimed.
//!
//! With no Vulkan loader or device the cases say so and pass, unless `KILN_REQUIRE_VULKAN=1`
//! (set by `.ci/run`), under which they fail. `KILN_VULKAN_VALIDATION=1` turns on the Khronos
//! validation layer; any message it reports fails the case at its next read back.

use std::sync::OnceLock;

use kiln_backend::KvDtype;
use kiln_conformance::{suite, Claims};
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

suite!(vulkan_device, |kv| vulkan(kv, false));
suite!(
    vulkan_invariant,
    |kv| vulkan(kv, true),
    Claims::default().batch_invariant()
);
