//! What the machine offers: each device's memory, and what its kernels sustain (memory
//! bandwidth, multiply-add rates per weight type, the fixed costs of a step's ops).
//!
//! Memory is read afresh on every run (it changes); measured rates are cached per machine in a
//! JSON file under `$KILN_HOME/probe/` (see [`ProfileCache`]) because measuring them takes a few
//! seconds. A cache entry is keyed by the CPU's model name, the thread count, the SIMD level and
//! kiln's version, so a new machine, a new setting or a new kiln measures again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cost::ProductShape;

/// Activation rows at which matrix products are probed: one (decode), a small batch, a tile
/// regime, and a prompt chunk (where a float GEMM's packing of the weights is amortized over
/// many rows).
pub const PROBE_ROWS: [usize; 4] = [1, 8, 128, 512];
/// Changes whenever what the probes measure changes, or the kernels they time get faster or
/// slower, so that older cached rates are measured again (4: the VNNI one-row products and the
/// faster narrow kernels; 5: encoder attention in transposed form, pooled buffers in size
/// classes; 6: one-row and narrow kernels taking blocks in pairs, longer one-row tasks; 7: causal
/// attention over the backend's KV cache type, f16 by default).
const PROBE_VERSION: u32 = 7;
/// Bytes of the set of matrices a product probe streams through: larger than the last-level
/// cache of the machines kiln targets, as a forward pass streams its weights.
pub const PROBE_STREAM_BYTES: usize = 128 << 20;

/// What kind of device a profile describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    Cpu,
    /// A Vulkan device, by its index in the loader's list.
    Vulkan {
        index: usize,
    },
}

impl DeviceKind {
    /// The GPU's device index (`None` for the CPU).
    pub fn gpu_index(self) -> Option<usize> {
        match self {
            DeviceKind::Cpu => None,
            DeviceKind::Vulkan { index } => Some(index),
        }
    }
}

/// Measured rates of one device (cached).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Bytes per second its cores read from memory.
    pub bandwidth: f64,
    /// Per probed matrix (`ProductShape::key`: type and shape): multiply-adds per second at each
    /// of [`PROBE_ROWS`].
    pub matmul: BTreeMap<String, Vec<f64>>,
    /// Per attention shape (`AttentionShape::key`): multiply-adds per second over a prompt.
    pub attention: BTreeMap<String, f64>,
    /// Seconds per element of the element-wise ops of a pass over many rows.
    pub elementwise: f64,
    /// Seconds of one matrix product's fixed cost (a tiny one-row product).
    pub product_latency: f64,
    /// Seconds of one small element-wise op over a row (a norm).
    pub op_latency: f64,
}

impl Rates {
    /// Multiply-adds per second of `ty` at `rows` rows: the probes interpolated linearly in
    /// rows between the probed row counts around `rows` (the last probe beyond them). `None`
    /// when `ty` was not probed.
    pub fn matmul_rate(&self, shape: &ProductShape, rows: usize) -> Option<f64> {
        let rates = self.matmul.get(&shape.key())?;
        let rows = rows.max(1) as f64;
        let points: Vec<(f64, f64)> = PROBE_ROWS
            .iter()
            .zip(rates)
            .map(|(&r, &rate)| (r as f64, rate))
            .collect();
        let (&(r0, first), &(rn, last)) = (points.first()?, points.last()?);
        if rows <= r0 {
            return Some(first);
        }
        if rows >= rn {
            return Some(last);
        }
        points.windows(2).find_map(|w| {
            let ((a, ra), (b, rb)) = (w[0], w[1]);
            (rows >= a && rows <= b).then(|| ra + (rb - ra) * (rows - a) / (b - a))
        })
    }

    /// Whether the machine-wide figures (bandwidth, fixed costs) are measured.
    pub fn measured(&self) -> bool {
        self.bandwidth > 0.0 && self.elementwise > 0.0
    }

    /// The shapes among `shapes` with no probe yet.
    pub fn missing(&self, shapes: &[ProductShape]) -> Vec<ProductShape> {
        shapes
            .iter()
            .copied()
            .filter(|s| !self.matmul.contains_key(&s.key()))
            .collect()
    }
}

/// One device the planner may place layers on.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub kind: DeviceKind,
    /// For logs: "cpu (2 threads, AVX2)", "vulkan:0 NVIDIA H100".
    pub name: String,
    /// Bytes the planner may use (free memory, or a user's cap if lower).
    pub memory_free: u64,
    pub memory_total: u64,
    pub rates: Rates,
    /// Host↔device copy: bytes per second and seconds per transfer (zero for the CPU).
    pub link_bandwidth: f64,
    pub link_latency: f64,
}

/// The machine: the CPU and any GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Hardware {
    pub cpu: Device,
    /// Model name from `/proc/cpuinfo` (or "unknown").
    pub cpu_model: String,
    pub cores: usize,
    /// "AVX2", "scalar", ...
    pub simd: String,
    pub gpus: Vec<Device>,
}

/// The bytes of a `KEY:  N kB` line of a `/proc` file's `text` (`/proc/meminfo`,
/// `/proc/self/status`).
pub fn proc_kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// RAM from `/proc/meminfo`: `(MemTotal, MemAvailable)` in bytes.
pub fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some((
        proc_kib_field(&text, "MemTotal:")?,
        proc_kib_field(&text, "MemAvailable:")?,
    ))
}

/// The CPU's model name (`/proc/cpuinfo`), or "unknown".
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The probe cache: one JSON file of measured [`Rates`] per key.
pub struct ProfileCache {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    key: String,
    rates: Rates,
}

impl ProfileCache {
    /// The cache under `kiln_home/probe/`.
    pub fn new(kiln_home: &Path) -> Self {
        ProfileCache {
            dir: kiln_home.join("probe"),
        }
    }

    /// The key of a device's rates: what, if changed, changes them.
    pub fn key(device: &str, cpu_model: &str, threads: usize, simd: &str) -> String {
        format!(
            "{device}|{cpu_model}|{threads} threads|{simd}|kiln {}|probe v{PROBE_VERSION}",
            env!("CARGO_PKG_VERSION")
        )
    }

    fn path(&self, key: &str) -> PathBuf {
        // A stable file name from the key (FNV-1a), the key itself kept inside.
        let mut h: u64 = 0xcbf29ce484222325;
        for b in key.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
        self.dir.join(format!("{h:016x}.json"))
    }

    /// The cached rates of `key`, if any (an unreadable or foreign file counts as none).
    pub fn load(&self, key: &str) -> Option<Rates> {
        let text = std::fs::read_to_string(self.path(key)).ok()?;
        let file: CacheFile = serde_json::from_str(&text).ok()?;
        (file.key == key).then_some(file.rates)
    }

    /// Stores `rates` under `key` (written to a temporary file, then renamed into place).
    pub fn store(&self, key: &str, rates: &Rates) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let file = CacheFile {
            key: key.to_string(),
            rates: rates.clone(),
        };
        std::fs::write(&tmp, serde_json::to_string_pretty(&file)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_core::GgmlType;

    #[test]
    fn rates_interpolate_between_the_probed_rows() {
        let q8 = ProductShape {
            ty: GgmlType::Q8_0,
            k: 640,
            n: 2048,
        };
        let q4 = ProductShape {
            ty: GgmlType::Q4_K,
            k: 1024,
            n: 640,
        };
        let mut r = Rates::default();
        r.matmul.insert(q8.key(), vec![10.0, 80.0, 200.0, 200.0]);
        assert_eq!(r.matmul_rate(&q8, 1), Some(10.0));
        assert_eq!(r.matmul_rate(&q8, 4), Some(40.0));
        assert_eq!(r.matmul_rate(&q8, 8), Some(80.0));
        assert_eq!(r.matmul_rate(&q8, 68), Some(140.0));
        assert_eq!(r.matmul_rate(&q8, 512), Some(200.0));
        assert_eq!(r.matmul_rate(&q4, 1), None);
        assert_eq!(r.matmul_rate(&ProductShape { n: 1024, ..q8 }, 1), None);
        assert_eq!(r.missing(&[q8, q4]), [q4]);
    }

    #[test]
    fn the_cache_round_trips_and_keys_are_checked() {
        let dir = std::env::temp_dir().join(format!("kiln-probe-cache-{}", std::process::id()));
        let cache = ProfileCache::new(&dir);
        let key = ProfileCache::key("cpu", "Test CPU", 2, "AVX2");
        assert!(cache.load(&key).is_none());
        let mut r = Rates {
            bandwidth: 5e10,
            ..Rates::default()
        };
        r.matmul.insert("Q4_K".into(), vec![1e9, 2e9, 3e9, 4e9]);
        cache.store(&key, &r).unwrap();
        assert_eq!(cache.load(&key), Some(r));
        assert!(cache
            .load(&ProfileCache::key("cpu", "Test CPU", 1, "AVX2"))
            .is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
