//! Device buffers: one `vk::Buffer` per tensor, weight or staging area, placed by
//! gpu-allocator, reached by kernels through its device address.
//!
//! Invariants: a buffer is released when its last `Arc` drops; the executor keeps an `Arc` of
//! every buffer a recorded command uses until that command has completed, so a tensor dropped
//! while the GPU still reads it stays alive until the GPU is done. Short-lived buffers (tensors,
//! per-step inputs, staging and read-back areas) go back to a pool on release, in size classes,
//! and are handed out again without a new allocation: a decode step makes a few hundred of them.
//! A pooled buffer is only reused once released, so no command still uses it.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::MemoryLocation;

use crate::device::Context;
use crate::{device_err, BackendError, Result};

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Place {
    /// Device memory for kernels that lives long (weights, caches); host-visible on some
    /// devices.
    Device,
    /// Device memory for a short-lived buffer (a tensor, a step's inputs): pooled.
    Scratch,
    /// Host memory the host writes and the device reads (uploads).
    Upload,
    /// Host memory the device writes and the host reads (read-backs).
    Readback,
}

pub(crate) struct Buffer {
    ctx: Arc<Context>,
    pub raw: vk::Buffer,
    alloc: Option<Allocation>,
    /// The device address kernels use.
    pub addr: u64,
    /// Bytes (at least the size asked for, a multiple of 4).
    pub size: u64,
    mapped: Option<NonNull<u8>>,
    place: Place,
}

/// A released short-lived buffer, ready to be handed out again.
pub(crate) struct Pooled {
    raw: vk::Buffer,
    alloc: Allocation,
    addr: u64,
    size: u64,
    mapped: Option<NonNull<u8>>,
}

// SAFETY: as for `Buffer`: plain handles and a mapping only used through a `Buffer`.
unsafe impl Send for Pooled {}

/// Released short-lived buffers by (place, size class), and their bytes in all.
#[derive(Default)]
pub(crate) struct Pool {
    free: HashMap<(Place, u64), Vec<Pooled>>,
    bytes: u64,
}

/// Bytes the pool may hold: released buffers beyond it are freed.
const POOL_CAP: u64 = 512 << 20;

/// The size class of `size`: at least 256 bytes, then the steps 2^k and 1.5 · 2^k (at most a
/// third more than asked for).
fn size_class(size: u64) -> u64 {
    if size <= 256 {
        return 256;
    }
    let p = size.next_power_of_two();
    let three_quarters = p / 4 * 3;
    if size <= three_quarters {
        three_quarters
    } else {
        p
    }
}

impl Pool {
    /// Frees every pooled buffer (before the device goes).
    pub fn drain(&mut self, ctx: &Context) {
        for (_, list) in self.free.drain() {
            for b in list {
                let _ = ctx
                    .allocator
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .free(b.alloc);
                // SAFETY: released buffers are used by no command.
                unsafe { ctx.device.destroy_buffer(b.raw, None) };
            }
        }
        self.bytes = 0;
    }
}

fn pooled(place: Place) -> bool {
    place != Place::Device
}

// SAFETY: the mapped pointer is only written through `write`, on buffers no recorded command
// uses yet (fresh ones) or after the executor waited for the device; Vulkan handles are plain
// values.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer of at least `size` bytes in `place`; `what` names it in errors.
    pub fn new(ctx: &Arc<Context>, size: u64, place: Place, what: &str) -> Result<Arc<Buffer>> {
        let size = if pooled(place) {
            size_class(size)
        } else {
            size.max(4).div_ceil(4) * 4
        };
        if pooled(place) {
            let mut pool = ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(b) = pool.free.get_mut(&(place, size)).and_then(Vec::pop) {
                pool.bytes -= b.size;
                return Ok(Arc::new(Buffer {
                    ctx: ctx.clone(),
                    raw: b.raw,
                    alloc: Some(b.alloc),
                    addr: b.addr,
                    size: b.size,
                    mapped: b.mapped,
                    place,
                }));
            }
        }
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST
            | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let heap = ctx.info.memory_bytes;
        if heap > 0 && size > heap {
            return Err(out_of_memory(
                ctx,
                size,
                what,
                &format!(
                    "more than its largest memory heap ({:.1} MiB)",
                    heap as f64 / 1048576.0
                ),
            ));
        }
        let dev = &ctx.device;
        // SAFETY: a valid create info; the buffer is destroyed on every path below.
        let raw = unsafe { dev.create_buffer(&info, None) }.map_err(|e| match e {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                out_of_memory(ctx, size, what, &e.to_string())
            }
            _ => device_err(format!("creating a buffer of {size} bytes for {what}: {e}")),
        })?;
        let requirements = unsafe { dev.get_buffer_memory_requirements(raw) };
        let location = match place {
            Place::Device | Place::Scratch => MemoryLocation::GpuOnly,
            Place::Upload => MemoryLocation::CpuToGpu,
            Place::Readback => MemoryLocation::GpuToCpu,
        };
        let alloc = {
            let mut a = ctx.allocator.lock().unwrap_or_else(|e| e.into_inner());
            a.allocate(&AllocationCreateDesc {
                name: what,
                requirements,
                location,
                linear: true,
                allocation_scheme: AllocationScheme::GpuAllocatorManaged,
            })
        };
        let alloc = match alloc {
            Ok(a) => a,
            Err(e) => {
                unsafe { dev.destroy_buffer(raw, None) };
                return Err(out_of_memory(ctx, size, what, &e.to_string()));
            }
        };
        // SAFETY: the allocation satisfies the buffer's requirements.
        if let Err(e) = unsafe { dev.bind_buffer_memory(raw, alloc.memory(), alloc.offset()) } {
            let _ = ctx
                .allocator
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free(alloc);
            unsafe { dev.destroy_buffer(raw, None) };
            return Err(device_err(format!("binding {size} bytes for {what}: {e}")));
        }
        let addr = unsafe {
            dev.get_buffer_device_address(&vk::BufferDeviceAddressInfo::default().buffer(raw))
        };
        let mapped = alloc.mapped_ptr().map(|p| p.cast::<u8>());
        Ok(Arc::new(Buffer {
            ctx: ctx.clone(),
            raw,
            alloc: Some(alloc),
            addr,
            size,
            mapped,
            place,
        }))
    }

    /// Whether the host can write and read the buffer directly.
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Copies `data` to byte `offset` of a mapped buffer. The caller guarantees that no command
    /// in flight uses the bytes (a fresh buffer, or one the device is done with).
    pub fn write(&self, offset: u64, data: &[u8]) {
        let p = self.mapped.expect("write on a mapped buffer");
        assert!(
            offset + data.len() as u64 <= self.size,
            "write within the buffer"
        );
        // SAFETY: in bounds of a live mapping; no device access overlaps (caller's promise).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                p.as_ptr().add(offset as usize),
                data.len(),
            )
        };
    }

    /// The first `len` bytes of a mapped buffer, once the device is done writing it.
    pub fn read(&self, len: usize) -> Vec<u8> {
        let p = self.mapped.expect("read of a mapped buffer");
        assert!(len as u64 <= self.size, "read within the buffer");
        let mut out = vec![0u8; len];
        // SAFETY: in bounds of a live mapping; the executor waited for the writes.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), out.as_mut_ptr(), len) };
        out
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if pooled(self.place) {
            let mut pool = self.ctx.pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.bytes + self.size <= POOL_CAP {
                if let Some(alloc) = self.alloc.take() {
                    pool.bytes += self.size;
                    pool.free
                        .entry((self.place, self.size))
                        .or_default()
                        .push(Pooled {
                            raw: self.raw,
                            alloc,
                            addr: self.addr,
                            size: self.size,
                            mapped: self.mapped,
                        });
                    return;
                }
            }
        }
        if let Some(a) = self.alloc.take() {
            let _ = self
                .ctx
                .allocator
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free(a);
        }
        // SAFETY: no command uses the buffer any more (the executor holds an Arc while one does).
        unsafe { self.ctx.device.destroy_buffer(self.raw, None) };
    }
}

/// The typed error of an allocation that failed: the bytes asked for, what they were for, and
/// how much the device has.
fn out_of_memory(ctx: &Context, size: u64, what: &str, detail: &str) -> BackendError {
    BackendError::OutOfMemory {
        backend: "vulkan",
        device: ctx.info.name.clone(),
        bytes: size,
        what: what.to_string(),
        detail: detail.to_string(),
    }
}
