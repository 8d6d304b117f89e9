//! The Vulkan instance, the choice of a physical device and the logical device with its one
//! compute queue.
//!
//! Invariants: a [`Context`] owns every Vulkan object that outlives one operation (instance,
//! device, allocator, debug messenger) and destroys them in reverse order of creation, after the
//! device is idle; buffers and the executor hold an `Arc<Context>`, so it is dropped last.

use std::ffi::{c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::AllocationSizes;

use crate::{device_err, Result};

/// What kind of device a Vulkan physical device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Virtual,
    /// A software implementation on the CPU (Mesa's lavapipe): correct, slower than kiln's own
    /// CPU backend.
    Cpu,
    Other,
}

impl DeviceInfo {
    /// Whether kiln's prefill products run on the device's matrix units: where it has them
    /// ([`DeviceInfo::cooperative_matrix`]) and `KILN_VULKAN_COOPMAT=1` asks. Off by default
    /// until the kernel has been checked on such a device (`scripts/gpu-check` does): no
    /// software device offers `VK_KHR_cooperative_matrix`, so CI checks its rounding only
    /// through the tiled kernel's emulation of it.
    pub fn uses_matrix_units(&self) -> bool {
        self.cooperative_matrix && std::env::var("KILN_VULKAN_COOPMAT").is_ok_and(|v| v == "1")
    }
}

impl DeviceKind {
    fn from_vk(t: vk::PhysicalDeviceType) -> Self {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
            _ => DeviceKind::Other,
        }
    }

    /// "discrete GPU", "software (CPU)", …
    pub fn describe(self) -> &'static str {
        match self {
            DeviceKind::Discrete => "discrete GPU",
            DeviceKind::Integrated => "integrated GPU",
            DeviceKind::Virtual => "virtual GPU",
            DeviceKind::Cpu => "software (CPU)",
            DeviceKind::Other => "other",
        }
    }
}

/// One Vulkan device as kiln sees it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Position among the devices the loader lists (`--backend vulkan:N`).
    pub index: usize,
    pub name: String,
    pub kind: DeviceKind,
    /// Vulkan version the driver offers, "1.3.230".
    pub api_version: String,
    /// Bytes of the largest device-local memory heap.
    pub memory_bytes: u64,
    pub subgroup_size: u32,
    /// The device has the matrix units kiln's cooperative-matrix product needs (tensor cores on
    /// NVIDIA): `VK_KHR_cooperative_matrix` with 16 × 16 × 16 products of f16 into f32 in a
    /// subgroup of at most 64 invocations, the Vulkan memory model and f16 arithmetic. Whether
    /// kiln uses them: [`DeviceInfo::uses_matrix_units`].
    pub cooperative_matrix: bool,
    /// The device runs integer dot products of packed int8 vectors
    /// (`VK_KHR_shader_integer_dot_product`).
    pub integer_dot: bool,
    /// ... and accelerates them: kiln's few-row products of block weights then use them (on
    /// int8 activations). `KILN_VULKAN_INTDOT=0` keeps them off, `=1` uses them wherever the
    /// device runs them.
    pub integer_dot_accelerated: bool,
    /// Why kiln cannot use the device (a missing feature), or `None` when it can.
    pub unusable: Option<String>,
}

/// Validation messages collected by the debug messenger (when validation is on).
pub(crate) type Messages = Mutex<Vec<String>>;

/// The instance and the device kiln computes on.
pub(crate) struct Context {
    _entry: ash::Entry,
    pub instance: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// Owned by the messenger's user data pointer; freed after the messenger.
    messages: *mut Messages,
    pub device: ash::Device,
    pub queue: vk::Queue,
    pub queue_family: u32,
    pub allocator: ManuallyDrop<Mutex<Allocator>>,
    /// Released short-lived buffers (see `memory`).
    pub pool: Mutex<crate::memory::Pool>,
    pub info: DeviceInfo,
}

// SAFETY: the raw `messages` pointer is only read through shared references to a `Mutex`, and
// freed once in `Drop`; every other field is Send + Sync.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// Validation messages reported since the last call (emptied).
    pub fn take_messages(&self) -> Vec<String> {
        // SAFETY: `messages` lives until `drop`.
        let m = unsafe { &*self.messages };
        std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object was created by this context and nothing else holds it: buffers
        // and the executor hold an Arc<Context>, so they are gone.
        unsafe {
            let _ = self.device.device_wait_idle();
            let mut pool = std::mem::take(self.pool.get_mut().unwrap_or_else(|e| e.into_inner()));
            pool.drain(self);
            ManuallyDrop::drop(&mut self.allocator);
            self.device.destroy_device(None);
            if let Some((utils, messenger)) = self.debug.take() {
                utils.destroy_debug_utils_messenger(messenger, None);
            }
            self.instance.destroy_instance(None);
            drop(Box::from_raw(self.messages));
        }
    }
}

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if user.is_null() || data.is_null() {
        return vk::FALSE;
    }
    // SAFETY: the loader passes a valid callback data struct; `user` is the context's
    // `Messages`, alive as long as the messenger.
    let (data, messages) = unsafe { (&*data, &*(user as *const Messages)) };
    let text = if data.p_message.is_null() {
        String::from("(no message)")
    } else {
        // SAFETY: a NUL-terminated string from the layer.
        unsafe { CStr::from_ptr(data.p_message) }
            .to_string_lossy()
            .into_owned()
    };
    if let Ok(mut m) = messages.lock() {
        m.push(format!("{severity:?}: {text}"));
    }
    vk::FALSE
}

/// Opens the Vulkan loader (`libvulkan.so.1`, `vulkan-1.dll`, MoltenVK's loader).
fn load_entry() -> Result<ash::Entry> {
    // SAFETY: loading the system's Vulkan loader library; ash checks the entry points.
    unsafe { ash::Entry::load() }.map_err(|e| {
        device_err(format!(
            "no Vulkan loader on this machine ({e}); install one (Debian: apt-get install \
             libvulkan1 mesa-vulkan-drivers) or use the CPU backend"
        ))
    })
}

fn create_instance(entry: &ash::Entry, validation: bool) -> Result<ash::Instance> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"kiln")
        .engine_name(c"kiln")
        .api_version(vk::API_VERSION_1_2);
    // SAFETY: plain queries of the loader.
    let layers = unsafe { entry.enumerate_instance_layer_properties() }
        .map_err(|e| device_err(format!("listing instance layers: {e}")))?;
    let exts = unsafe { entry.enumerate_instance_extension_properties(None) }
        .map_err(|e| device_err(format!("listing instance extensions: {e}")))?;
    let has_ext = |name: &CStr| {
        exts.iter()
            .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
    };
    let mut layer_names = Vec::new();
    let mut ext_names = Vec::new();
    if validation {
        let present = layers
            .iter()
            .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
        if !present {
            return Err(device_err(
                "validation was asked for, but the Khronos validation layer is not installed \
                 (Debian: apt-get install vulkan-validationlayers)",
            ));
        }
        layer_names.push(VALIDATION_LAYER.as_ptr());
        ext_names.push(ash::ext::debug_utils::NAME.as_ptr());
    }
    let mut flags = vk::InstanceCreateFlags::empty();
    if has_ext(ash::khr::portability_enumeration::NAME) {
        // MoltenVK lists its devices only to instances that accept portability drivers.
        ext_names.push(ash::khr::portability_enumeration::NAME.as_ptr());
        flags |= vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR;
    }
    let info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_layer_names(&layer_names)
        .enabled_extension_names(&ext_names)
        .flags(flags);
    // SAFETY: the create info points at live data.
    unsafe { entry.create_instance(&info, None) }
        .map_err(|e| device_err(format!("creating a Vulkan instance: {e}")))
}

fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

/// Describes physical device `pd` (position `index`), with why kiln cannot use it, if so.
fn describe(
    entry: &ash::Entry,
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    index: usize,
) -> DeviceInfo {
    // SAFETY: queries of a physical device the instance listed.
    let (props, mem, exts) = unsafe {
        (
            instance.get_physical_device_properties(pd),
            instance.get_physical_device_memory_properties(pd),
            instance
                .enumerate_device_extension_properties(pd)
                .unwrap_or_default(),
        )
    };
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let has_dot_ext = exts.iter().any(|e| {
        e.extension_name_as_c_str()
            .is_ok_and(|n| n == ash::khr::shader_integer_dot_product::NAME)
    });
    let mut dot_props = vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
    let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
    if has_dot_ext {
        props2 = props2.push_next(&mut dot_props);
    }
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let has_coop_ext = exts.iter().any(|e| {
        e.extension_name_as_c_str()
            .is_ok_and(|n| n == ash::khr::cooperative_matrix::NAME)
    });
    let mut features2 = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut f11)
        .push_next(&mut f12);
    if has_coop_ext {
        features2 = features2.push_next(&mut coop);
    }
    if has_dot_ext {
        features2 = features2.push_next(&mut dot);
    }
    let api_ok = props.api_version >= vk::API_VERSION_1_2;
    if api_ok {
        // SAFETY: Vulkan 1.2 devices answer the *2 queries.
        unsafe {
            instance.get_physical_device_properties2(pd, &mut props2);
            instance.get_physical_device_features2(pd, &mut features2);
        }
    }
    let heaps = &mem.memory_heaps[..mem.memory_heap_count as usize];
    let memory_bytes = heaps
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
        .unwrap_or(0);
    let mut missing = Vec::new();
    if !api_ok {
        missing.push("Vulkan 1.2".to_string());
    } else {
        for (ok, name) in [
            (f12.buffer_device_address, "bufferDeviceAddress"),
            (f12.storage_buffer8_bit_access, "storageBuffer8BitAccess"),
            (f12.shader_int8, "shaderInt8"),
            (f11.storage_buffer16_bit_access, "storageBuffer16BitAccess"),
        ] {
            if ok == vk::FALSE {
                missing.push(name.to_string());
            }
        }
    }
    let unusable = (!missing.is_empty()).then(|| format!("lacks {}", missing.join(", ")));
    DeviceInfo {
        index,
        name: props
            .device_name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "(unnamed)".into()),
        kind: DeviceKind::from_vk(props.device_type),
        api_version: version_string(props.api_version),
        memory_bytes,
        subgroup_size: subgroup.subgroup_size,
        cooperative_matrix: api_ok
            && has_coop_ext
            && coop.cooperative_matrix == vk::TRUE
            && f12.vulkan_memory_model == vk::TRUE
            && f12.shader_float16 == vk::TRUE
            && (1..=64).contains(&subgroup.subgroup_size)
            && has_f16_product(entry, instance, pd),
        integer_dot: api_ok && has_dot_ext && dot.shader_integer_dot_product == vk::TRUE,
        integer_dot_accelerated: api_ok
            && has_dot_ext
            && dot.shader_integer_dot_product == vk::TRUE
            && dot_props.integer_dot_product4x8_bit_packed_signed_accelerated == vk::TRUE,
        unusable,
    }
}

/// Whether the device's cooperative matrices include the one kind the kernels use: 16 × 16 × 16,
/// f16 operands, f32 sums and results, subgroup scope.
fn has_f16_product(entry: &ash::Entry, instance: &ash::Instance, pd: vk::PhysicalDevice) -> bool {
    let ext = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: a query of a device that offers the extension.
    let kinds = unsafe { ext.get_physical_device_cooperative_matrix_properties(pd) };
    kinds.unwrap_or_default().iter().any(|k| {
        (k.m_size, k.n_size, k.k_size) == (16, 16, 16)
            && k.a_type == vk::ComponentTypeKHR::FLOAT16
            && k.b_type == vk::ComponentTypeKHR::FLOAT16
            && k.c_type == vk::ComponentTypeKHR::FLOAT32
            && k.result_type == vk::ComponentTypeKHR::FLOAT32
            && k.scope == vk::ScopeKHR::SUBGROUP
    })
}

/// Every Vulkan device the loader lists, usable or not (an error when there is no loader or no
/// instance can be made).
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let entry = load_entry()?;
    let instance = create_instance(&entry, false)?;
    // SAFETY: the instance is alive until destroyed below.
    let devices = unsafe { instance.enumerate_physical_devices() };
    let out = devices.map(|pds| {
        pds.iter()
            .enumerate()
            .map(|(i, &pd)| describe(&entry, &instance, pd, i))
            .collect()
    });
    // SAFETY: nothing made from the instance outlives this function.
    unsafe { instance.destroy_instance(None) };
    out.map_err(|e| device_err(format!("listing Vulkan devices: {e}")))
}

/// Opens device `index` (or, with `None`, the first usable device, preferring discrete, then
/// integrated GPUs over software ones).
pub(crate) fn open(index: Option<usize>, validation: bool) -> Result<Arc<Context>> {
    let entry = load_entry()?;
    let instance = create_instance(&entry, validation)?;
    let fail = |instance: &ash::Instance, e: crate::BackendError| {
        // SAFETY: nothing else was made from the instance yet.
        unsafe { instance.destroy_instance(None) };
        Err(e)
    };
    // SAFETY: the instance is alive.
    let pds = match unsafe { instance.enumerate_physical_devices() } {
        Ok(p) => p,
        Err(e) => return fail(&instance, device_err(format!("listing devices: {e}"))),
    };
    let infos: Vec<DeviceInfo> = pds
        .iter()
        .enumerate()
        .map(|(i, &pd)| describe(&entry, &instance, pd, i))
        .collect();
    let chosen = match index {
        Some(i) => match infos.get(i) {
            None => {
                let msg = format!(
                    "no Vulkan device {i}: this machine has {} ({})",
                    infos.len(),
                    infos
                        .iter()
                        .map(|d| format!("{}: {}", d.index, d.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return fail(&instance, device_err(msg));
            }
            Some(d) => match &d.unusable {
                Some(why) => {
                    let msg = format!("Vulkan device {i} ({}) {why}", d.name);
                    return fail(&instance, device_err(msg));
                }
                None => i,
            },
        },
        None => {
            let rank = |k: DeviceKind| match k {
                DeviceKind::Discrete => 0,
                DeviceKind::Integrated => 1,
                DeviceKind::Virtual => 2,
                DeviceKind::Other => 3,
                DeviceKind::Cpu => 4,
            };
            match infos
                .iter()
                .filter(|d| d.unusable.is_none())
                .min_by_key(|d| (rank(d.kind), d.index))
            {
                Some(d) => d.index,
                None if infos.is_empty() => {
                    return fail(&instance, device_err("the Vulkan loader lists no device"))
                }
                None => {
                    let msg = format!(
                        "no usable Vulkan device: {}",
                        infos
                            .iter()
                            .map(|d| format!("{} {}", d.name, d.unusable.as_deref().unwrap_or("")))
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                    return fail(&instance, device_err(msg));
                }
            }
        }
    };
    let pd = pds[chosen];
    let info = infos[chosen].clone();
    match open_device(entry, instance, pd, info, validation) {
        Ok(ctx) => Ok(Arc::new(ctx)),
        Err((instance, e)) => fail(&instance, e),
    }
}

#[allow(clippy::result_large_err)]
fn open_device(
    entry: ash::Entry,
    instance: ash::Instance,
    pd: vk::PhysicalDevice,
    info: DeviceInfo,
    validation: bool,
) -> std::result::Result<Context, (ash::Instance, crate::BackendError)> {
    // SAFETY: queries of a listed physical device.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let Some(queue_family) = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .map(|i| i as u32)
    else {
        return Err((
            instance,
            device_err(format!("{} has no compute queue", info.name)),
        ));
    };
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(queue_family)
        .queue_priorities(&priorities)];
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true);
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
        .buffer_device_address(true)
        .storage_buffer8_bit_access(true)
        .shader_int8(true);
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut ext_names = Vec::new();
    if info.integer_dot {
        dot = dot.shader_integer_dot_product(true);
        ext_names.push(ash::khr::shader_integer_dot_product::NAME.as_ptr());
    }
    if info.uses_matrix_units() {
        f12 = f12.vulkan_memory_model(true).shader_float16(true);
        coop = coop.cooperative_matrix(true);
        ext_names.push(ash::khr::cooperative_matrix::NAME.as_ptr());
    }
    let mut create = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&ext_names)
        .push_next(&mut f11)
        .push_next(&mut f12);
    if info.uses_matrix_units() {
        create = create.push_next(&mut coop);
    }
    if info.integer_dot {
        create = create.push_next(&mut dot);
    }
    // SAFETY: the features were checked by `describe`.
    let device = match unsafe { instance.create_device(pd, &create, None) } {
        Ok(d) => d,
        Err(e) => return Err((instance, device_err(format!("opening {}: {e}", info.name)))),
    };
    let queue = unsafe { device.get_device_queue(queue_family, 0) };
    let allocator = match Allocator::new(&AllocatorCreateDesc {
        instance: instance.clone(),
        device: device.clone(),
        physical_device: pd,
        debug_settings: Default::default(),
        buffer_device_address: true,
        allocation_sizes: AllocationSizes::default(),
    }) {
        Ok(a) => a,
        Err(e) => {
            unsafe { device.destroy_device(None) };
            return Err((instance, device_err(format!("memory allocator: {e}"))));
        }
    };
    let messages: *mut Messages = Box::into_raw(Box::new(Mutex::new(Vec::new())));
    let mut debug = None;
    if validation {
        let utils = ash::ext::debug_utils::Instance::new(&entry, &instance);
        let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                    | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                    | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(on_message))
            .user_data(messages as *mut c_void);
        // SAFETY: the messenger's user data outlives it (freed after it in Drop).
        match unsafe { utils.create_debug_utils_messenger(&info, None) } {
            Ok(m) => debug = Some((utils, m)),
            Err(e) => {
                drop(allocator);
                unsafe {
                    device.destroy_device(None);
                    drop(Box::from_raw(messages));
                }
                return Err((instance, device_err(format!("debug messenger: {e}"))));
            }
        }
    }
    Ok(Context {
        _entry: entry,
        instance,
        debug,
        messages,
        device,
        queue,
        queue_family,
        allocator: ManuallyDrop::new(Mutex::new(allocator)),
        pool: Mutex::new(Default::default()),
        info,
    })
}
