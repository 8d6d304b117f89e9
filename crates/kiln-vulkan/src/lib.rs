//! kiln-vulkan: the [`Backend`] on Vulkan compute, for any GPU with a Vulkan 1.2 driver
//! (NVIDIA, AMD, Intel; Apple through MoltenVK) and for Mesa's lavapipe, the software device
//! that CI tests every kernel on.
//!
//! - **Loading**: the Vulkan loader is opened at run time ([`ash::Entry::load`]); a machine
//!   without one gets a clear error from [`VulkanBackend::new`] and runs kiln on the CPU.
//! - **Kernels** are GLSL under `shaders/`, compiled to SPIR-V by `scripts/build-shaders`
//!   (glslc from shaderc 2023.2, pinned) and committed under `spv/`; CI checks that compiling the
//!   sources again gives the same bytes. Building the crate needs cargo alone.
//! - **Buffers** are reached through device addresses in push constants, so there are no
//!   descriptor sets and no limit of one storage-buffer range per tensor.
//! - **Execution**: every op records into one open command buffer (submitted in chunks as it
//!   fills); only reading a result back waits for the device ([`exec`]).
//! - **Determinism**: every reduction runs in a fixed order, with no float atomics; each output
//!   row of matmul and attention is computed by the same operations whatever else the call
//!   holds, so the backend is batch-invariant.
//! - **Errors**: out of device memory names the bytes; a lost device is reported at the next
//!   read back, not waited on forever. A key or value too large for an f16 KV cache is refused
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
