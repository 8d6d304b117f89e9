//! Recording and submitting work: compute pipelines (made on first use), one open command
//! buffer that every op records into, submitted in chunks while recording goes on, and waited
//! for only when the host reads a result.
//!
//! Invariants:
//! - Commands run in the order they were recorded: each is preceded by a global memory barrier
//!   (compute and transfer writes before compute and transfer reads and writes), which also
//!   orders it after every batch submitted before.
//! - A batch keeps an `Arc` of every buffer its commands use until its fence has signalled.
//! - `sync` leaves no batch in flight; errors of the device (lost, out of memory) and validation
//!   messages surface there as `BackendError::Device`.

use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;

use crate::device::Context;
use crate::kernels::{Kernel, COUNT, SPIRV};
use crate::memory::Buffer;
use crate::{device_err, Result};

/// Commands recorded into one command buffer before it is submitted (the device starts on a
/// forward pass while the rest of it is recorded).
const CHUNK: u32 = 64;

/// Bytes of push constants every kernel may use (Vulkan guarantees 128).
pub(crate) const PUSH_BYTES: u32 = 128;

struct Batch {
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    keep: Vec<Arc<Buffer>>,
    commands: u32,
}

struct State {
    pool: vk::CommandPool,
    recording: Option<Batch>,
    in_flight: Vec<Batch>,
    spare: Vec<(vk::CommandBuffer, vk::Fence)>,
    pipelines: Vec<Option<vk::Pipeline>>,
    /// A device error seen while submitting; reported (and the executor unusable) from then on.
    broken: Option<String>,
}

pub(crate) struct Exec {
    pub ctx: Arc<Context>,
    layout: vk::PipelineLayout,
    state: Mutex<State>,
}

impl Exec {
    pub fn new(ctx: Arc<Context>) -> Result<Exec> {
        let dev = &ctx.device;
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(PUSH_BYTES)];
        // SAFETY: valid create infos; destroyed in Drop.
        let layout = unsafe {
            dev.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges),
                None,
            )
        }
        .map_err(|e| device_err(format!("pipeline layout: {e}")))?;
        let pool = unsafe {
            dev.create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(ctx.queue_family)
                    .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                None,
            )
        }
        .map_err(|e| {
            unsafe { dev.destroy_pipeline_layout(layout, None) };
            device_err(format!("command pool: {e}"))
        })?;
        Ok(Exec {
            ctx: ctx.clone(),
            layout,
            state: Mutex::new(State {
                pool,
                recording: None,
                in_flight: Vec::new(),
                spare: Vec::new(),
                pipelines: vec![None; COUNT],
                broken: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `kernel` with `push` constants over `groups` workgroups; `uses` are the buffers
    /// it reads or writes (kept alive until it ran).
    pub fn dispatch(
        &self,
        kernel: Kernel,
        push: &[u8],
        groups: [u32; 3],
        uses: &[&Arc<Buffer>],
    ) -> Result<()> {
        debug_assert!(push.len() as u32 <= PUSH_BYTES);
        if groups.contains(&0) {
            return Ok(());
        }
        let mut st = self.lock();
        let pipeline = self.pipeline(&mut st, kernel)?;
        let layout = self.layout;
        self.record(&mut st, uses, |dev, cmd| unsafe {
            dev.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            dev.cmd_push_constants(cmd, layout, vk::ShaderStageFlags::COMPUTE, 0, push);
            dev.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
        })
    }

    /// Records copies of `regions` from `src` to `dst`.
    pub fn copy(
        &self,
        src: &Arc<Buffer>,
        dst: &Arc<Buffer>,
        regions: &[vk::BufferCopy],
    ) -> Result<()> {
        if regions.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        let (s, d) = (src.raw, dst.raw);
        self.record(&mut st, &[src, dst], |dev, cmd| unsafe {
            dev.cmd_copy_buffer(cmd, s, d, regions);
        })
    }

    /// Records filling `size` bytes of `dst` at `offset` (multiples of 4) with `word`.
    pub fn fill(&self, dst: &Arc<Buffer>, offset: u64, size: u64, word: u32) -> Result<()> {
        let mut st = self.lock();
        let d = dst.raw;
        self.record(&mut st, &[dst], |dev, cmd| unsafe {
            dev.cmd_fill_buffer(cmd, d, offset, size, word);
        })
    }

    /// Records writing `data` (a multiple of 4 bytes, at most 65536) into `dst` at `offset`:
    /// small per-step inputs (token ids, positions, block tables) travel in the command buffer.
    pub fn update(&self, dst: &Arc<Buffer>, offset: u64, data: &[u8]) -> Result<()> {
        debug_assert!(data.len().is_multiple_of(4) && data.len() <= 65536);
        if data.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        let d = dst.raw;
        self.record(&mut st, &[dst], |dev, cmd| unsafe {
            dev.cmd_update_buffer(cmd, d, offset, data);
        })
    }

    fn record(
        &self,
        st: &mut State,
        uses: &[&Arc<Buffer>],
        f: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<()> {
        if let Some(why) = &st.broken {
            return Err(device_err(why.clone()));
        }
        let dev = &self.ctx.device;
        if st.recording.is_none() {
            let batch = self.begin(st)?;
            st.recording = Some(batch);
        }
        let batch = st.recording.as_mut().expect("a batch is recording");
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE,
            )];
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        // SAFETY: the command buffer is in the recording state.
        unsafe {
            dev.cmd_pipeline_barrier(
                batch.cmd,
                stages,
                stages,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
        }
        f(dev, batch.cmd);
        batch.keep.extend(uses.iter().map(|b| Arc::clone(b)));
        batch.commands += 1;
        if batch.commands >= CHUNK {
            self.submit(st)?;
        }
        Ok(())
    }

    fn begin(&self, st: &mut State) -> Result<Batch> {
        let dev = &self.ctx.device;
        let (cmd, fence) = match st.spare.pop() {
            Some(pair) => pair,
            None => {
                // SAFETY: valid create infos for the pool this state owns.
                let cmd = unsafe {
                    dev.allocate_command_buffers(
                        &vk::CommandBufferAllocateInfo::default()
                            .command_pool(st.pool)
                            .level(vk::CommandBufferLevel::PRIMARY)
                            .command_buffer_count(1),
                    )
                }
                .map_err(|e| device_err(format!("allocating a command buffer: {e}")))?[0];
                let fence = unsafe { dev.create_fence(&vk::FenceCreateInfo::default(), None) }
                    .map_err(|e| device_err(format!("creating a fence: {e}")))?;
                (cmd, fence)
            }
        };
        // SAFETY: a command buffer that is not in flight (fresh or recycled after its fence).
        unsafe {
            dev.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
        }
        .map_err(|e| device_err(format!("beginning a command buffer: {e}")))?;
        Ok(Batch {
            cmd,
            fence,
            keep: Vec::new(),
            commands: 0,
        })
    }

    /// Submits the recording batch, if any, without waiting for it.
    fn submit(&self, st: &mut State) -> Result<()> {
        let Some(batch) = st.recording.take() else {
            return Ok(());
        };
        let dev = &self.ctx.device;
        // Device writes are made visible to the host reads that follow the fence.
        let to_host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        let cmds = [batch.cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: the batch's command buffer is recording; the queue is used under the lock.
        let r = unsafe {
            dev.cmd_pipeline_barrier(
                batch.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &to_host,
                &[],
                &[],
            );
            dev.end_command_buffer(batch.cmd)
                .and_then(|_| dev.queue_submit(self.ctx.queue, &submit, batch.fence))
        };
        match r {
            Ok(()) => {
                st.in_flight.push(batch);
                Ok(())
            }
            Err(e) => {
                let why = device_failure("submitting work", e, &self.ctx.info.name);
                st.broken = Some(why.clone());
                Err(device_err(why))
            }
        }
    }

    /// Submits what is recorded and waits for every batch in flight; then reports validation
    /// messages, if any.
    pub fn sync(&self) -> Result<()> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(device_err(why.clone()));
        }
        self.submit(&mut st)?;
        let dev = &self.ctx.device;
        let batches = std::mem::take(&mut st.in_flight);
        let fences: Vec<vk::Fence> = batches.iter().map(|b| b.fence).collect();
        if !fences.is_empty() {
            // SAFETY: fences of submitted batches. A lost device reports DEVICE_LOST here rather
            // than hanging: drivers signal lost fences.
            let r = unsafe { dev.wait_for_fences(&fences, true, u64::MAX) }
                .and_then(|_| unsafe { dev.reset_fences(&fences) });
            if let Err(e) = r {
                let why = device_failure("waiting for work", e, &self.ctx.info.name);
                st.broken = Some(why.clone());
                return Err(device_err(why));
            }
        }
        for b in batches {
            // SAFETY: the fence signalled: the command buffer is no longer in use.
            if unsafe { dev.reset_command_buffer(b.cmd, vk::CommandBufferResetFlags::empty()) }
                .is_ok()
            {
                st.spare.push((b.cmd, b.fence));
            }
            drop(b.keep);
        }
        drop(st);
        let messages = self.ctx.take_messages();
        if !messages.is_empty() {
            return Err(device_err(format!(
                "Vulkan validation: {}",
                messages.join("\n")
            )));
        }
        Ok(())
    }

    fn pipeline(&self, st: &mut State, kernel: Kernel) -> Result<vk::Pipeline> {
        let i = kernel as usize;
        if let Some(p) = st.pipelines[i] {
            return Ok(p);
        }
        let (name, bytes) = SPIRV[i];
        let code = ash::util::read_spv(&mut std::io::Cursor::new(bytes))
            .map_err(|e| device_err(format!("kernel {name}: bad SPIR-V: {e}")))?;
        let dev = &self.ctx.device;
        // SAFETY: SPIR-V from scripts/build-shaders; the module is destroyed once the pipeline
        // is made.
        let module = unsafe {
            dev.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&code), None)
        }
        .map_err(|e| device_err(format!("kernel {name}: {e}")))?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let info = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(self.layout)];
        let r = unsafe { dev.create_compute_pipelines(vk::PipelineCache::null(), &info, None) };
        unsafe { dev.destroy_shader_module(module, None) };
        let p = r.map_err(|(_, e)| device_err(format!("kernel {name}: {e}")))?[0];
        st.pipelines[i] = Some(p);
        Ok(p)
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        let _ = self.sync();
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let dev = &self.ctx.device;
        // SAFETY: nothing is in flight after sync (or the device is lost and idle).
        unsafe {
            let _ = dev.device_wait_idle();
            if let Some(b) = st.recording.take() {
                dev.destroy_fence(b.fence, None);
            }
            for b in st.in_flight.drain(..) {
                dev.destroy_fence(b.fence, None);
            }
            for (_, f) in st.spare.drain(..) {
                dev.destroy_fence(f, None);
            }
            for p in st.pipelines.iter().flatten() {
                dev.destroy_pipeline(*p, None);
            }
            dev.destroy_command_pool(st.pool, None);
            dev.destroy_pipeline_layout(self.layout, None);
        }
    }
}

/// What a failed Vulkan call means for the user.
fn device_failure(doing: &str, e: vk::Result, device: &str) -> String {
    match e {
        vk::Result::ERROR_DEVICE_LOST => format!(
            "{device} was lost while {doing} (a driver reset or a kernel fault); restart kiln"
        ),
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            format!("out of memory while {doing} on {device}: {e}")
        }
        _ => format!("{doing} on {device}: {e}"),
    }
}

/// The bytes of a push-constant struct.
pub(crate) fn push_bytes<T: Copy>(p: &T) -> &[u8] {
    // SAFETY: `T` is a `#[repr(C)]` struct of u64/u32/f32 fields (no padding read as
    // uninitialised: every push struct is laid out without holes, see ops.rs).
    unsafe { std::slice::from_raw_parts((p as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}
