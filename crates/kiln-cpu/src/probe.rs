//! A memory-bandwidth probe: how many bytes per second `threads` cores can stream from memory.
//!
//! Decoding one token reads every weight once, so decode speed is bounded by this figure
//! (`kiln bench` prints the share of it each decode test reaches). The probe is the classic
//! read-only stream:
//!
//! - Each thread maps and writes its own part of the buffer first, so the pages are real (not
//!   the shared zero page a fresh allocation maps) and sit on the thread's NUMA node, as
//!   first-touch puts them; then it sums its part, contiguous, with 256-bit loads (AVX2, chosen
//!   at run time; a scalar `u64` loop elsewhere), four accumulators deep so that the loads, not
//!   the additions, are the limit.
//! - The parts live in pages of the kind the weights will: [`Pages::Huge`] asks Linux for
//!   transparent huge pages (`MADV_HUGEPAGE`), as the GGUF loader does for the private copy it
//!   decodes from by default; [`Pages::Small`] leaves 4 KiB pages, as a memory-mapped model has.
//!   The kind matters as much as the thread count: huge pages stream markedly faster on the
//!   machines measured (`cargo run --release -p kiln-cpu --example probe_bench`;
//!   docs/BENCHMARKS.md), so a probe on small pages would understate the bound decode runs
//!   against.
//! - The whole buffer is far larger than the last-level cache (8× the sum of the L3 caches that
//!   sysfs lists, at least 256 MiB and at most 1 GiB), so a pass cannot be served from cache.
//! - Passes start together (a barrier releases every thread at once); a pass lasts from the
//!   first worker's start to the last worker's end, as the workers themselves timestamp them (a
//!   separate timing thread would compete with them for the cores: with as many workers as cores
//!   it can be scheduled late and miss most of the pass). The best of a few passes is reported,
//!   as STREAM does, since anything else running on the machine can only slow a pass down.
//!
//! Invariants: nothing is written during a timed pass; every buffer is freed before the probe
//! returns (so a caller can reset its peak-RSS mark afterwards); a failed allocation or thread
//! spawn is an error, never a panic or a hang (no thread enters a barrier before all are known
//! to be ready).

use std::sync::{Barrier, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use kiln_backend::{BackendError, Result};

/// The smallest buffer the probe streams (bytes).
const MIN_BUFFER: usize = 256 << 20;
/// The largest (bytes): enough for any last-level cache we know, and it keeps the probe short.
const MAX_BUFFER: usize = 1 << 30;
/// Timed passes; the best is reported.
const PASSES: usize = 5;
/// The smallest buffer of [`memory_bandwidth_quick`] (bytes).
const QUICK_MIN_BUFFER: usize = 64 << 20;
/// Timed passes of [`memory_bandwidth_quick`].
const QUICK_PASSES: usize = 5;
/// Words summed per step of the kernels (four 256-bit loads).
const STEP_WORDS: usize = 16;

/// Which pages the probe streams (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pages {
    /// Transparent huge pages asked for (`MADV_HUGEPAGE`; a hint, on Linux only): the pages of
    /// a model read into memory, `kiln`'s default.
    #[default]
    Huge,
    /// The system's default pages: those of a memory-mapped model (`--mmap`).
    Small,
}

impl Pages {
    /// `"huge"` or `"small"`, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Pages::Huge => "huge",
            Pages::Small => "small",
        }
    }
}

/// What a probe measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    /// Bytes per second read by the best pass.
    pub bytes_per_s: f64,
    /// Bytes of all passes over their total time: what the machine gave on average while the
    /// probe ran (below `bytes_per_s` when other work slowed some passes down).
    pub sustained_bytes_per_s: f64,
    /// Bytes read in one pass (the buffer, all threads together).
    pub buffer_bytes: usize,
    pub threads: usize,
    pub passes: usize,
    /// Whether the AVX2 loop ran (else the scalar one).
    pub avx2: bool,
    /// The pages asked for.
    pub pages: Pages,
}

/// Read bandwidth of this machine with `threads` threads (0 = one per available core) from
/// `pages`, over a buffer sized from the last-level cache (see the module docs). Takes a few
/// hundred milliseconds.
pub fn memory_bandwidth(threads: usize, pages: Pages) -> Result<Bandwidth> {
    memory_bandwidth_with(threads, probe_buffer_bytes(), PASSES, pages)
}

/// A short probe, for taking the bandwidth beside each of a benchmark's runs: 4× the
/// last-level cache (64 MiB to 256 MiB) and `QUICK_PASSES` passes, tens of milliseconds. On a
/// shared host the memory speed moves from one tenth of a second to the next, in bursts that a
/// best pass catches and a whole run does not (docs/BENCHMARKS.md), so a run is only compared
/// fairly with what the machine gave around it, on average (`sustained_bytes_per_s`), not at its
/// best.
pub fn memory_bandwidth_quick(threads: usize, pages: Pages) -> Result<Bandwidth> {
    let bytes = (4 * last_level_cache_bytes()).clamp(QUICK_MIN_BUFFER, MIN_BUFFER);
    memory_bandwidth_with(threads, bytes, QUICK_PASSES, pages)
}

/// [`memory_bandwidth`] over a buffer of about `buffer_bytes` (split evenly between the
/// threads, each part rounded down to whole 128-byte steps, at least one) and `passes` timed
/// passes (at least one).
pub fn memory_bandwidth_with(
    threads: usize,
    buffer_bytes: usize,
    passes: usize,
    pages: Pages,
) -> Result<Bandwidth> {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let passes = passes.max(1);
    let words_per_thread = (buffer_bytes / threads / 8 / STEP_WORDS).max(1) * STEP_WORDS;
    let avx2 = has_avx2();

    let gate = Gate::default();
    let span = PassSpan::default();
    // Every worker plus the coordinating thread.
    let barrier = Barrier::new(threads + 1);
    let mut best = f64::INFINITY;
    let (mut total, mut timed) = (0.0f64, 0usize);
    std::thread::scope(|s| -> Result<()> {
        let mut spawned = 0;
        let mut spawn_error = None;
        for i in 0..threads {
            let worker = || {
                stream_worker(
                    words_per_thread,
                    passes,
                    pages,
                    avx2,
                    &gate,
                    &barrier,
                    &span,
                )
            };
            match std::thread::Builder::new()
                .name(format!("kiln-probe-{i}"))
                .spawn_scoped(s, worker)
            {
                Ok(_) => spawned += 1,
                Err(e) => {
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        // Only once every worker holds its filled part do they enter the barrier.
        let go = gate.decide(spawned, spawn_error.is_none());
        if let Some(e) = spawn_error {
            return Err(device(format!("starting probe thread {spawned}: {e}")));
        }
        if !go {
            return Err(device(format!(
                "could not allocate {} MiB for the bandwidth probe",
                (words_per_thread * 8 * threads) >> 20
            )));
        }
        for _ in 0..passes {
            barrier.wait();
            barrier.wait();
            // Every worker has recorded its pass; none writes again before the next barrier.
            if let Some(seconds) = span.take() {
                best = best.min(seconds);
                total += seconds;
                timed += 1;
            }
        }
        Ok(())
    })?;
    let bytes = words_per_thread * 8 * threads;
    Ok(Bandwidth {
        bytes_per_s: bytes as f64 / best.max(1e-9),
        sustained_bytes_per_s: (timed * bytes) as f64 / total.max(1e-9),
        buffer_bytes: bytes,
        threads,
        passes,
        avx2,
        pages,
    })
}

/// The span of one pass: the earliest start and the latest end any worker recorded.
#[derive(Default)]
struct PassSpan(Mutex<Option<(Instant, Instant)>>);

impl PassSpan {
    fn record(&self, start: Instant, end: Instant) {
        let mut span = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *span = Some(match *span {
            Some((s, e)) => (s.min(start), e.max(end)),
            None => (start, end),
        });
    }

    /// The recorded span in seconds, clearing it for the next pass.
    fn take(&self) -> Option<f64> {
        let span = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        span.map(|(s, e)| e.duration_since(s).as_secs_f64())
    }
}

fn device(detail: String) -> BackendError {
    BackendError::Device {
        backend: "cpu",
        detail,
    }
}

/// The start handshake: workers report whether their part is allocated and filled, then wait
/// for the timing thread's decision (go, or abort when a part or a thread is missing).
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    ready: usize,
    failed: bool,
    go: Option<bool>,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        // A worker cannot panic while holding the lock; take the state even if one did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A worker's report; returns whether to run the passes.
    fn report(&self, ok: bool) -> bool {
        let mut st = self.lock();
        st.ready += 1;
        st.failed |= !ok;
        self.changed.notify_all();
        loop {
            if let Some(go) = st.go {
                return go && ok;
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits for the `spawned` workers' reports and tells them to go when all are ready and
    /// `all_spawned`; returns that decision.
    fn decide(&self, spawned: usize, all_spawned: bool) -> bool {
        let mut st = self.lock();
        while st.ready < spawned {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let go = all_spawned && !st.failed;
        st.go = Some(go);
        self.changed.notify_all();
        go
    }
}

/// A worker's part of the buffer: `words` words in an anonymous map of the asked `pages`,
/// written (distinct values, so that every page is really backed: a zero fill could be left to
/// the shared zero page). `None` when the map fails.
fn map_part(words: usize, pages: Pages) -> Option<memmap2::MmapMut> {
    let mut map = memmap2::MmapOptions::new()
        .len(words.checked_mul(8)?)
        .map_anon()
        .ok()?;
    // A hint: without transparent huge pages the probe still runs, on small pages.
    #[cfg(target_os = "linux")]
    if pages == Pages::Huge {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = pages;
    // SAFETY: every bit pattern is a valid u64; `align_to_mut` keeps the middle aligned.
    let (_, middle, _) = unsafe { map.align_to_mut::<u64>() };
    for (i, w) in middle.iter_mut().enumerate() {
        *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    Some(map)
}

fn stream_worker(
    words: usize,
    passes: usize,
    pages: Pages,
    avx2: bool,
    gate: &Gate,
    barrier: &Barrier,
    span: &PassSpan,
) {
    let part = map_part(words, pages);
    if !gate.report(part.is_some()) {
        return;
    }
    // SAFETY: as in `map_part`; a map is page-aligned, so the middle is the whole map.
    let read = part
        .as_ref()
        .map(|m| unsafe { m.align_to::<u64>() }.1)
        .filter(|r| r.len() == words);
    let Some(read) = read else {
        // Unreachable (a page-aligned map of `8 * words` bytes is `words` aligned words); the
        // barrier count would then be short, so still take part in every pass.
        for _ in 0..passes {
            barrier.wait();
            barrier.wait();
        }
        return;
    };
    for _ in 0..passes {
        barrier.wait();
        let start = Instant::now();
        std::hint::black_box(sum_words(read, avx2));
        span.record(start, Instant::now());
        barrier.wait();
    }
}

/// The wrapping sum of `words`: with AVX2 when `avx2` (and the CPU has it), else scalar. Both
/// give the same value.
fn sum_words(words: &[u64], avx2: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if avx2 && has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time just above).
        return unsafe { sum_avx2(words) };
    }
    let _ = avx2;
    sum_scalar(words)
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn sum_scalar(words: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for (a, &w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(w);
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&acc)
        .fold(0u64, |s, &w| s.wrapping_add(w))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut chunks = words.chunks_exact(STEP_WORDS);
    for c in &mut chunks {
        let p = c.as_ptr().cast::<__m256i>();
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 16 u64 (128 bytes), so the 32 bytes at `p + j`, j < 4, lie
            // inside it; `loadu` has no alignment requirement.
            *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(p.add(j)) });
        }
    }
    let total = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 bytes, the size of one unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), total) };
    lanes
        .iter()
        .fold(sum_scalar(chunks.remainder()), |s, &w| s.wrapping_add(w))
}

/// 8× the last-level cache this machine's sysfs lists (each distinct L3 once), clamped to
/// `MIN_BUFFER..=MAX_BUFFER`; `MIN_BUFFER` when sysfs says nothing.
fn probe_buffer_bytes() -> usize {
    (8 * last_level_cache_bytes()).clamp(MIN_BUFFER, MAX_BUFFER)
}

/// The sum of the sizes of the distinct L3 caches in sysfs (a cache shared by several cores is
/// listed under each; its `shared_cpu_list` tells the copies apart). 0 when unreadable.
fn last_level_cache_bytes() -> usize {
    let Ok(cpus) = std::fs::read_dir("/sys/devices/system/cpu") else {
        return 0;
    };
    let mut seen = std::collections::BTreeMap::new();
    for cpu in cpus.flatten() {
        let name = cpu.file_name();
        let is_cpu = name
            .to_str()
            .and_then(|n| n.strip_prefix("cpu"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_cpu {
            continue;
        }
        let Ok(caches) = std::fs::read_dir(cpu.path().join("cache")) else {
            continue;
        };
        for index in caches.flatten() {
            let read = |f: &str| std::fs::read_to_string(index.path().join(f)).ok();
            if read("level").as_deref().map(str::trim) != Some("3") {
                continue;
            }
            let (Some(size), Some(shared)) = (read("size"), read("shared_cpu_list")) else {
                continue;
            };
            if let Some(bytes) = parse_cache_size(&size) {
                seen.insert(shared.trim().to_string(), bytes);
            }
        }
    }
    seen.values().sum()
}

/// A sysfs cache size: `32768K`, `1M`, or plain bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kernels_sum_every_word() {
        // Lengths around the 16-word step and the 4-word scalar step, values that wrap.
        for len in [0, 1, 3, 4, 15, 16, 17, 33, 64, 1000] {
            let words: Vec<u64> = (0..len as u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 60))
                .collect();
            let want = words.iter().fold(0u64, |s, &w| s.wrapping_add(w));
            assert_eq!(sum_scalar(&words), want, "scalar, {len} words");
            assert_eq!(sum_words(&words, true), want, "dispatched, {len} words");
        }
    }

    #[test]
    fn a_pass_spans_the_first_start_to_the_last_end() {
        let span = PassSpan::default();
        assert_eq!(span.take(), None);
        let t0 = Instant::now();
        let ms = |n| t0 + std::time::Duration::from_millis(n);
        // Worker 1 starts late and ends first; worker 2 starts first and ends last.
        span.record(ms(5), ms(20));
        span.record(ms(2), ms(30));
        let seconds = span.take().unwrap();
        assert!((seconds - 0.028).abs() < 1e-9, "{seconds}");
        // Taken: the next pass starts from nothing.
        assert_eq!(span.take(), None);
        span.record(ms(40), ms(41));
        assert!((span.take().unwrap() - 0.001).abs() < 1e-9);
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("lots"), None);
        assert_eq!(parse_cache_size("12Q"), None);
    }

    #[test]
    fn a_small_probe_reports_a_finite_positive_bandwidth() {
        let b = memory_bandwidth_with(2, 4 << 20, 2, Pages::Small).unwrap();
        assert!(b.bytes_per_s.is_finite() && b.bytes_per_s > 0.0, "{b:?}");
        // The best pass is at least the average one.
        assert!(
            b.sustained_bytes_per_s > 0.0
                && b.sustained_bytes_per_s <= b.bytes_per_s * (1.0 + 1e-12),
            "{b:?}"
        );
        assert_eq!((b.threads, b.passes), (2, 2));
        // Each thread's part is whole 128-byte steps.
        assert_eq!(b.buffer_bytes % (2 * 128), 0);
        assert!(b.buffer_bytes <= 4 << 20 && b.buffer_bytes > 4 << 19);
    }

    #[test]
    fn the_quick_probe_streams_more_than_the_cache() {
        let b = memory_bandwidth_quick(2, Pages::Huge).unwrap();
        assert!(b.bytes_per_s.is_finite() && b.bytes_per_s > 0.0, "{b:?}");
        assert_eq!(b.passes, QUICK_PASSES);
        let asked = (4 * last_level_cache_bytes()).clamp(QUICK_MIN_BUFFER, MIN_BUFFER);
        assert!(
            b.buffer_bytes > asked - 256 && b.buffer_bytes <= asked,
            "{b:?}"
        );
    }

    #[test]
    fn the_full_probe_reports_a_finite_positive_bandwidth() {
        let b = memory_bandwidth(1, Pages::Huge).unwrap();
        assert!(b.bytes_per_s.is_finite() && b.bytes_per_s > 0.0, "{b:?}");
        assert!(b.buffer_bytes >= MIN_BUFFER - 128 && b.buffer_bytes <= MAX_BUFFER);
    }
}
