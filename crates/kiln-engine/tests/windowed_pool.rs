//! The scheduler with a pool of its own for sliding-window layers (`SchedulerConfig::
//! window_blocks`) against one pool for every layer, on the fixture families with windows
//! (Gemma 3: window 8, five local layers of six; Mistral: 8; Phi-3: 12), with sequences that
//! run far past their windows.
//!
//! Tolerance: none. Under the same scheduling (the same passes), the windowed layers read the
//! same rows through their own tables, so every token and every log-probability must be the
//! same bits: plain batches, chunked prefill with small blocks, prompts sharing a prefix, and
//! preemption. The window pool must give every block back, never hold a block below a window
//! (`Scheduler::check`), and stay within the reservation that `SchedulerConfig::sized_for`
//! makes for it.

use std::collections::HashMap;
use std::path::Path;

use kiln_backend::KvDtype;
use kiln_cpu::CpuBackend;
use kiln_engine::{
    Event, FinishReason, Request, RequestId, SamplingParams, Scheduler, SchedulerConfig,
};
use kiln_models::Decoder;

mod common;

fn model(b: &CpuBackend, family: &str) -> Decoder<CpuBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders")
        .join(family);
    kiln_models::load_hf_decoder(b, &dir).unwrap()
}

fn config(
    n_blocks: usize,
    window_blocks: Option<usize>,
    bs: usize,
    step: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        n_blocks,
        window_blocks,
        block_size: bs,
        max_step_tokens: step,
        max_running: 8,
        max_waiting: 64,
    }
}

/// `n` prompts, the first `shared` tokens common to all.
fn prompts(n: usize, shared: usize, seed: u64) -> Vec<Vec<u32>> {
    common::prompts(n, shared, seed, |i| 3 + 11 * i % 37)
}

/// Per request: its tokens with their log-probabilities' bits, and its ending.
type Outputs = HashMap<RequestId, (Vec<(u32, u64)>, Option<FinishReason>)>;

/// Submits `prompts` (each for `max_tokens`, greedy, with log-probabilities), runs the
/// scheduler until idle, checking its invariants after every step; returns each request's
/// output and the most blocks the window pool held at once.
fn run(
    b: &CpuBackend,
    m: &Decoder<CpuBackend>,
    cfg: SchedulerConfig,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> (Outputs, usize) {
    let mut s = Scheduler::new(b, m, cfg).unwrap();
    let mut out = Outputs::new();
    let mut peak = 0;
    for p in prompts {
        s.submit(Request {
            prompt: p.clone(),
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            logprobs: Some(2),
            constraint: None,
        })
        .unwrap();
    }
    let mut steps = 0;
    while !s.is_idle() {
        for e in s.step(b, m).unwrap() {
            match e {
                Event::Token { id, token, logprob } => out
                    .entry(id)
                    .or_default()
                    .0
                    .push((token, logprob.unwrap().logprob.to_bits())),
                Event::Finished { id, reason } => out.entry(id).or_default().1 = Some(reason),
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
            }
        }
        s.check().unwrap();
        if let Some(wp) = s.window_pool() {
            peak = peak.max(wp.in_use());
        }
        steps += 1;
        assert!(steps < 10_000, "the scheduler makes no progress");
    }
    assert_eq!(s.pool().in_use(), 0, "every block is back");
    if let Some(wp) = s.window_pool() {
        assert_eq!(wp.in_use(), 0, "every window block is back");
    }
    (out, peak)
}

fn same(family: &str, a: &Outputs, b: &Outputs, what: &str) {
    assert_eq!(a.len(), b.len(), "{family} {what}");
    for (id, x) in a {
        assert_eq!(Some(x), b.get(id), "{family} {what}: request {id}");
    }
}

fn check_family(family: &str) {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b, family);
    let long = prompts(6, 0, 0x9e37_79b9_7f4a_7c15);
    // Plain batches: one pool, then a window pool as large (nothing evicted, same passes).
    let (full, _) = run(&b, &m, config(256, None, 4, 512), &long, 40);
    let (windowed, _) = run(&b, &m, config(256, Some(256), 4, 512), &long, 40);
    same(family, &full, &windowed, "plain");
    assert!(full
        .values()
        .all(|(t, r)| t.len() == 40 && *r == Some(FinishReason::Length)));

    // Chunked prefill in passes of 5 tokens, blocks of 2.
    let (full, _) = run(&b, &m, config(512, None, 2, 5), &long, 20);
    let (windowed, _) = run(&b, &m, config(512, Some(512), 2, 5), &long, 20);
    same(family, &full, &windowed, "chunked");

    // Shared prefixes: a second wave of prompts finds the first wave's blocks, in both pools.
    let shared = prompts(8, 24, 0x1234_5678_9abc_def1);
    let waves = |cfg: SchedulerConfig| {
        let mut s = Scheduler::new(&b, &m, cfg).unwrap();
        let mut out = Vec::new();
        for wave in [&shared[..4], &shared[4..]] {
            for p in wave {
                s.submit(Request {
                    prompt: p.clone(),
                    max_tokens: 12,
                    sampling: SamplingParams::greedy(),
                    stop_ids: vec![],
                    logprobs: Some(1),
                    constraint: None,
                })
                .unwrap();
            }
            while !s.is_idle() {
                for e in s.step(&b, &m).unwrap() {
                    if let Event::Token { id, token, logprob } = e {
                        out.push((id, token, logprob.unwrap().logprob.to_bits()));
                    }
                }
                s.check().unwrap();
            }
        }
        (out, s.prefix_stats())
    };
    let (full, full_stats) = waves(config(256, None, 4, 512));
    let (windowed, window_stats) = waves(config(256, Some(256), 4, 512));
    assert_eq!(full, windowed, "{family} shared prefixes");
    assert!(full_stats.hit_blocks > 0, "{family}: the second wave hits");
    assert_eq!(full_stats, window_stats, "{family}: the same prefix hits");

    // Preemption: a main pool too small for every sequence at once.
    let (full, _) = run(&b, &m, config(40, None, 4, 512), &long, 40);
    let (windowed, _) = run(&b, &m, config(40, Some(40), 4, 512), &long, 40);
    same(family, &full, &windowed, "preempted");

    // The window pool as `sized_for` reserves it: more sequences than running slots, each far
    // past its window; the same outputs, and the window pool stays within its reservation.
    let many = prompts(12, 0, 0x0bad_cafe_f00d_d00d);
    let sized = config(0, None, 4, 16).sized_for(&m.config, KvDtype::F16, 1 << 20);
    let reserved = sized.window_blocks.unwrap();
    assert!(reserved < sized.n_blocks, "{family}: {sized:?}");
    let (full, _) = run(&b, &m, config(sized.n_blocks, None, 4, 16), &many, 60);
    let (windowed, peak) = run(&b, &m, sized, &many, 60);
    same(family, &full, &windowed, "reserved window pool");
    assert!(peak <= reserved, "{family}: peak {peak} of {reserved}");
}

#[test]
fn gemma3_window_pool_changes_no_bit() {
    check_family("gemma3");
}

#[test]
fn mistral_window_pool_changes_no_bit() {
    check_family("mistral");
}

#[test]
fn phi3_window_pool_changes_no_bit() {
    check_family("phi3");
}

#[test]
fn pools_are_sized_by_what_windowed_layers_can_hold() {
    let b = CpuBackend::new(1).unwrap();
    let c = model(&b, "gemma3").config;
    // Gemma 3's pattern: five windowed layers of six.
    assert_eq!((c.windowed_layers(), c.n_layers), (5, 6));
    let budget = 64 << 20;
    let one =
        config(0, None, 16, 512).sized_for(&m_config_without_windows(&c), KvDtype::F16, budget);
    let two = config(0, None, 16, 512).sized_for(&c, KvDtype::F16, budget);
    assert_eq!(one.window_blocks, None);
    assert!(one.kv_bytes(&c, KvDtype::F16) <= budget);
    assert!(two.kv_bytes(&c, KvDtype::F16) <= budget);
    // Window 8, blocks of 16: each of 8 running sequences reserves 1 + 3 blocks, one step's
    // 512 tokens 32 more.
    assert_eq!(two.window_blocks, Some(8 * 4 + 32));
    // The global layer (one of six) gets the rest: about six times the positions.
    assert!(
        two.n_blocks > 5 * one.n_blocks,
        "{} vs {}",
        two.n_blocks,
        one.n_blocks
    );
    // A budget too small for the reservation: one pool's worth in both.
    let small = config(0, None, 16, 512).sized_for(&c, KvDtype::F16, 64 << 10);
    assert_eq!(small.window_blocks, Some(small.n_blocks));
    assert!(small.kv_bytes(&c, KvDtype::F16) <= 64 << 10);
}

/// `c` with every layer global.
fn m_config_without_windows(
    c: &kiln_core::config::DecoderConfig,
) -> kiln_core::config::DecoderConfig {
    let mut c = c.clone();
    for a in &mut c.layer_attention {
        *a = kiln_core::config::LayerAttention::Global;
    }
    c
}
