//! A fork-join team for the many small parallel ops of a decode step.
//!
//! A decode step of a small model is hundreds of ops of a few to a few dozen microseconds each
//! (Gemma 3 270M: the K projection of one layer is 112 KB, 7 µs at memory speed). Waking a
//! sleeping worker through the kernel costs as much as the op, so the team's workers spin on one
//! atomic word for a short while after each job ([`SPIN`]) and only then park: back-to-back ops
//! hand work over in well under a microsecond, and an idle process stops burning CPU soon after.
//!
//! `run(n, f)` runs `f(0..n)` with the calling thread taking part; it returns when every task has
//! finished. Tasks are claimed one at a time from a shared cursor, so uneven tasks balance.
//!
//! Invariants:
//! - **One word says everything about a job's claims.** `cursor` packs (epoch, task count, next
//!   task). A worker claims a task by a compare-and-swap on it, so a claim can only succeed while
//!   its job is live; the job pointer is read only after a successful claim, and the caller does
//!   not return (so the closure outlives every use) until `completed` reaches the task count.
//! - **One job at a time.** Concurrent callers on other threads queue on `lock`. A call made from
//!   inside a task (nested parallelism) runs its tasks inline on that thread, never deadlocks.
//! - **Panics do not hang the caller.** A panicking task is counted as completed and the first
//!   panic is re-raised on the calling thread.
//! - **No lost wake-ups.** A worker announces itself in `sleepers` and re-checks the cursor under
//!   `park_lock` before waiting; the caller publishes the cursor, then notifies when anyone sleeps
//!   (both sides sequentially consistent).

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking. Long enough to bridge the serial gaps of a
/// decode step (norms, sampling), short enough that an idle server sleeps almost at once.
const SPIN: Duration = Duration::from_micros(2000);
/// How long a waiting thread spins without yielding: the usual gap between two ops. Past it the
/// machine may be oversubscribed, and a spinning thread would steal the core of the thread that
/// holds the work.
const PURE_SPIN: Duration = Duration::from_micros(50);

/// Bits of the cursor: epoch (24) | tasks (20) | next (20).
const IDX_BITS: u32 = 20;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
/// Most tasks one job may have (larger calls are split into several jobs).
pub(crate) const MAX_TASKS: usize = IDX_MASK as usize;

fn pack(epoch: u64, tasks: usize, next: usize) -> u64 {
    (epoch << (2 * IDX_BITS)) | ((tasks as u64) << IDX_BITS) | next as u64
}

fn unpack(c: u64) -> (u64, usize, usize) {
    (
        c >> (2 * IDX_BITS),
        ((c >> IDX_BITS) & IDX_MASK) as usize,
        (c & IDX_MASK) as usize,
    )
}

/// The job of the current epoch: a borrowed closure, valid until its caller returns.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    cursor: AtomicU64,
    job: AtomicPtr<Job<'static>>,
    completed: AtomicUsize,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    sleepers: AtomicUsize,
    park_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

thread_local! {
    /// Set while this thread runs a team task: nested calls run inline.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of worker threads plus the caller (see the module docs).
pub(crate) struct Team {
    shared: Arc<Shared>,
    lock: Mutex<()>,
    workers: Vec<JoinHandle<()>>,
}

impl Team {
    /// A team of `threads` (the caller counts as one, so `threads - 1` are spawned).
    pub(crate) fn new(threads: usize, name: &str) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            cursor: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            completed: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            park_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let mut team = Team {
            shared: shared.clone(),
            lock: Mutex::new(()),
            workers: Vec::new(),
        };
        for i in 1..threads.max(1) {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(&s))?;
            team.workers.push(h);
        }
        Ok(team)
    }

    /// Threads that take part in a job: the workers and the caller.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// `f(i)` for every `i` in `0..n`, spread over the team; returns when all have run.
    pub(crate) fn run(&self, n: usize, f: impl Fn(usize) + Sync) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers.is_empty() || IN_TASK.with(Cell::get) {
            (0..n).for_each(f);
            return;
        }
        let _serial = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        for start in (0..n).step_by(MAX_TASKS) {
            let len = (n - start).min(MAX_TASKS);
            self.run_job(len, &|i| f(start + i));
        }
    }

    fn run_job(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        let job = Job { f };
        let epoch = unpack(s.cursor.load(Relaxed)).0.wrapping_add(1) & ((1 << 24) - 1);
        s.completed.store(0, Relaxed);
        // SAFETY (lifetime erasure): the pointer is dereferenced only by a thread holding a claim
        // on a task of this epoch, and this function returns only after every task completed.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        s.job.store(ptr, Relaxed);
        s.cursor.store(pack(epoch, n, 0), SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        work(s);
        wait_until(|| s.completed.load(Acquire) >= n);
        if let Some(p) = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(p);
        }
    }

    /// `f(&mut state, i)` for every `i` in `0..n`, spread over the team, where each thread that
    /// takes part builds one `state` with `init` and reuses it for every index it claims
    /// (scratch buffers that should live for a run of tasks, not be rebuilt for each).
    pub(crate) fn for_each_with<S>(
        &self,
        n: usize,
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, usize) + Sync,
    ) {
        let next = AtomicUsize::new(0);
        self.run(self.threads().min(n), |_| {
            let mut state = None;
            loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= n {
                    break;
                }
                f(state.get_or_insert_with(&init), i);
            }
        });
    }

    /// `f(i, chunk_i)` over the `chunk`-sized pieces of `data`, in parallel.
    pub(crate) fn for_each_chunk<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunk = chunk.max(1);
        let len = data.len();
        let base = SendPtr(data.as_mut_ptr());
        self.run(len.div_ceil(chunk), |i| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: tasks get disjoint ranges `start..end` of `data`, which outlives the call
            // (run returns only when every task is done).
            let piece =
                unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            f(i, piece)
        });
    }
}

/// An output buffer that parallel tasks fill in disjoint pieces which are not contiguous chunks
/// (a task owning columns `j0..j1` of every row of a row-major matrix).
pub(crate) struct Disjoint<'a, T> {
    base: SendPtr<T>,
    len: usize,
    _data: std::marker::PhantomData<&'a mut [T]>,
}

impl<'a, T: Send> Disjoint<'a, T> {
    pub(crate) fn new(data: &'a mut [T]) -> Self {
        Disjoint {
            base: SendPtr(data.as_mut_ptr()),
            len: data.len(),
            _data: std::marker::PhantomData,
        }
    }

    /// The start of the buffer, for writers that take raw pointers (the same rule: no element
    /// written by two tasks, none read while another writes it).
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.base.get()
    }

    /// The elements `range` of the buffer.
    ///
    /// # Safety
    /// No two live slices obtained from this buffer (on any thread) may overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "Disjoint::slice out of bounds"
        );
        std::slice::from_raw_parts_mut(self.base.get().add(range.start), range.end - range.start)
    }
}

/// A raw pointer that may cross threads; users guarantee disjoint access.
struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used by `for_each_chunk`, whose tasks touch disjoint elements.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, SeqCst);
        {
            let _g = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Claim and run tasks of the current job until none is left.
fn work(s: &Shared) {
    let mut c = s.cursor.load(Acquire);
    loop {
        let (epoch, n, next) = unpack(c);
        if next >= n {
            return;
        }
        match s
            .cursor
            .compare_exchange_weak(c, pack(epoch, n, next + 1), AcqRel, Acquire)
        {
            Ok(_) => {
                // SAFETY: we hold a claim on task `next` of this epoch, so the job is live (see
                // run_job) and the pointer is this epoch's (written before the cursor release).
                let job = unsafe { &*s.job.load(Relaxed) };
                IN_TASK.with(|t| t.set(true));
                let r = catch_unwind(AssertUnwindSafe(|| (job.f)(next)));
                IN_TASK.with(|t| t.set(false));
                if let Err(p) = r {
                    let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
                s.completed.fetch_add(1, Release);
                c = s.cursor.load(Acquire);
            }
            Err(now) => c = now,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = unpack(s.cursor.load(Acquire)).0;
    loop {
        // Spin for new work, then yield between checks, then park.
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Relaxed) {
                return;
            }
            let epoch = unpack(s.cursor.load(Acquire)).0;
            if epoch != seen {
                seen = epoch;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                let idle = t0.elapsed();
                if idle > SPIN {
                    if park(s, seen) {
                        return;
                    }
                    seen = unpack(s.cursor.load(Acquire)).0;
                    break;
                }
                if idle > PURE_SPIN {
                    // Past the common op-to-op gap: leave the core to others that want it.
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        work(s);
    }
}

/// Sleep until the epoch moves on from `seen` or the team shuts down (then true).
fn park(s: &Shared, seen: u64) -> bool {
    let mut g = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, SeqCst);
    while unpack(s.cursor.load(SeqCst)).0 == seen && !s.shutdown.load(SeqCst) {
        g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    s.sleepers.fetch_sub(1, SeqCst);
    s.shutdown.load(SeqCst)
}

/// Wait (spinning, then yielding) until `done()`.
fn wait_until(done: impl Fn() -> bool) {
    let t0 = Instant::now();
    let mut spins = 0u32;
    while !done() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && t0.elapsed() > PURE_SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once() {
        let team = Team::new(3, "t").unwrap();
        for n in [0usize, 1, 2, 7, 100, 5000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            team.run(n, |i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn for_each_with_runs_every_index_once_and_builds_a_state_per_thread_at_most() {
        let team = Team::new(3, "t").unwrap();
        for n in [0usize, 1, 2, 3, 7, 1000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            let states = AtomicU32::new(0);
            team.for_each_with(
                n,
                || {
                    states.fetch_add(1, Relaxed);
                    Vec::<usize>::new()
                },
                |seen, i| {
                    // A state is one thread's alone: what it saw is in claim order.
                    assert!(seen.last().is_none_or(|&j| j < i));
                    seen.push(i);
                    hits[i].fetch_add(1, Relaxed);
                },
            );
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
            assert!(states.load(Relaxed) as usize <= n.min(3), "n = {n}");
        }
    }

    #[test]
    fn chunks_are_disjoint_and_cover_the_data() {
        let team = Team::new(2, "t").unwrap();
        let mut v = vec![0usize; 1003];
        team.for_each_chunk(&mut v, 10, |i, c| {
            for (j, x) in c.iter_mut().enumerate() {
                *x = i * 10 + j;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| i == x));
    }

    #[test]
    fn nested_calls_run_inline() {
        let team = Team::new(2, "t").unwrap();
        let total = AtomicU32::new(0);
        team.run(8, |_| {
            team.run(4, |_| {
                total.fetch_add(1, Relaxed);
            })
        });
        assert_eq!(total.load(Relaxed), 32);
    }

    #[test]
    fn workers_wake_after_parking_and_many_jobs_in_a_row_complete() {
        let team = Team::new(2, "t").unwrap();
        let total = AtomicU32::new(0);
        for round in 0..2000 {
            if round == 1000 {
                std::thread::sleep(SPIN * 3); // workers park
            }
            team.run(4, |_| {
                total.fetch_add(1, Relaxed);
            });
        }
        assert_eq!(total.load(Relaxed), 8000);
    }

    #[test]
    fn concurrent_callers_are_serialized() {
        let team = Arc::new(Team::new(2, "t").unwrap());
        let total = Arc::new(AtomicU32::new(0));
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let (team, total) = (team.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        team.run(5, |_| {
                            total.fetch_add(1, Relaxed);
                        });
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(total.load(Relaxed), 3 * 200 * 5);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller() {
        let team = Team::new(2, "t").unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(16, |i| {
                if i == 11 {
                    panic!("task 11");
                }
            })
        }));
        assert!(r.is_err());
        // The team still works afterwards.
        let total = AtomicU32::new(0);
        team.run(6, |_| {
            total.fetch_add(1, Relaxed);
        });
        assert_eq!(total.load(Relaxed), 6);
    }
}
