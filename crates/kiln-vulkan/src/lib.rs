//! kiln-vulkan: the [`Backend`] on Vulkan compute, for any GPU with a Vulkan 1.2 driver
//! (NVIDIA, AMD, Intel; Apple through MoltenVK) and for Mesa's lavapipe, the software device
//! that CI tests every kernel on.
//!
//! - **Loading**: the Vulkan loader is opened at run time ([`ash::Entry::load`]); a machine
//!   without one gets a clear error from [`VulkanBackend::new`] and runs kiln on the CPU.
//! - **Kernels** are GLSL under `shaders/`, compiled to SPIR-V by `scripts/build-shaders`
//!   (glslc from shaderc 2023.2, pinned; the cooperative-matrix and integer-dot kernels by a
//!   pinned glslang 15.1.0) and committed under `spv/`; CI checks that compiling the sources
//!   again gives the same bytes and that spirv-val accepts them. Building the crate needs cargo
//!   alone.
//! - **Products**: a subgroup per weight row for a few activation rows (decode; on integer dot
//!   products of int8 activations where the device accelerates them), 64 × 64 tiles for many
//!   (prefill; on the device's matrix units, f16 operands, where it offers
//!   `VK_KHR_cooperative_matrix` and `KILN_VULKAN_COOPMAT=1` asks). Batch-invariant mode keeps
//!   to the few-row kernels.
//! - **Attention** takes each row's keys in chunks of 256 per workgroup, merged in chunk order,
//!   so long contexts spread over the device.
//! - **Buffers** are reached through device addresses in push constants, so there are no
//!   descriptor sets and no limit of one storage-buffer range per tensor.
//! - **Execution**: every op records into one open command buffer (submitted in chunks as it
//!   fills); only reading a result back waits for the device ([`exec`]).
//! - **Determinism**: every reduction runs in a fixed order, with no float atomics; each output
//!   row of matmul and attention is computed by the same operations whatever else the call
//!   holds, so the backend is batch-invariant.
//! - **Errors**: out of device memory is [`BackendError::OutOfMemory`] naming the bytes (more
//!   than the largest heap is refused before Vulkan is called); a lost device is reported at
//!   the next read back, not waited on forever. A key or value too large for an f16 KV cache is refused
//!   on the device (the cache keeps its rows) and reported as [`BackendError::Range`] by the
//!   next read back, since the host does not see the values when it records the write.

mod backend;
mod device;
mod exec;
#[rustfmt::skip]
mod kernels;
mod memory;

pub use backend::{VkKv, VkTensor, VkWeight, VulkanBackend, VulkanOptions};
pub use device::{list_devices, DeviceInfo, DeviceKind};

use kiln_backend::{BackendError, Result};

/// A [`BackendError::Device`] of this backend.
pub(crate) fn device_err(detail: impl Into<String>) -> BackendError {
    BackendError::Device {
        backend: "vulkan",
        detail: detail.into(),
    }
}

/// What the tests that need a Vulkan device share (here and in kiln-cli): without a usable
/// device they say so and pass, unless `KILN_REQUIRE_VULKAN=1` (set by `.ci/run`), under which
/// they fail.
#[doc(hidden)]
pub mod testing {
    use super::{VulkanBackend, VulkanOptions};

    /// Whether the environment variable `name` is `1`.
    pub fn flag(name: &str) -> bool {
        std::env::var(name).is_ok_and(|v| v == "1")
    }

    /// Reports that `test` cannot run for want of a device (`why`): panics under
    /// `KILN_REQUIRE_VULKAN=1`, otherwise says it is skipped.
    pub fn unavailable(test: &str, why: &str) {
        if flag("KILN_REQUIRE_VULKAN") {
            panic!("{test}: KILN_REQUIRE_VULKAN=1, but no Vulkan backend: {why}");
        }
        eprintln!("{test} skipped: no Vulkan backend: {why}");
    }

    /// A backend on the first usable device (with the validation layer under
    /// `KILN_VULKAN_VALIDATION=1`), or `None` after [`unavailable`].
    pub fn backend(test: &str) -> Option<VulkanBackend> {
        match VulkanBackend::new(&options()) {
            Ok(b) => Some(b),
            Err(e) => {
                unavailable(test, &e.to_string());
                None
            }
        }
    }

    /// The default options, with validation as `KILN_VULKAN_VALIDATION` asks.
    pub fn options() -> VulkanOptions {
        VulkanOptions {
            validation: flag("KILN_VULKAN_VALIDATION"),
            ..VulkanOptions::default()
        }
    }
}
