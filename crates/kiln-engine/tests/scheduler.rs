//! The continuous-batching scheduler on a real (tiny, random-weight) Llama checkpoint from the
//! model fixtures: batched, chunked, prefix-cached and preempted runs give each request the
//! tokens it gets alone, and every block goes back to the pool.

use std::collections::HashMap;
use std::path::Path;

use kiln_cpu::CpuBackend;
use kiln_engine::{
    Constraint, Event, FinishReason, Request, RequestId, SamplingParams, Scheduler,
    SchedulerConfig, SubmitError, TokenConstraint,
};
use kiln_formats::GgufFile;
use kiln_models::Decoder;

mod common;

fn model(b: &CpuBackend) -> Decoder<CpuBackend> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/decoders/llama/model-f32.gguf");
    let file = GgufFile::open(&path).unwrap();
    kiln_models::load_gguf_decoder(b, &file).unwrap()
}

fn config(n_blocks: usize, block_size: usize, max_step_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        n_blocks,
        window_blocks: None,
        block_size,
        max_step_tokens,
        max_running: 16,
        max_waiting: 64,
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_ids: vec![],
        logprobs: None,
        constraint: None,
    }
}

/// Prompts of varied lengths over the fixture's vocabulary (405 tokens); the first `shared`
/// tokens are the same in all of them.
fn prompts(n: usize, shared: usize) -> Vec<Vec<u32>> {
    common::prompts(n, shared, 0x9e37_79b9_7f4a_7c15, |i| 3 + 7 * i % 23)
}

type Outputs = HashMap<RequestId, (Vec<u32>, Option<FinishReason>)>;

fn record(out: &mut Outputs, events: Vec<Event>) {
    for e in events {
        match e {
            Event::Token { id, token, .. } => out.entry(id).or_default().0.push(token),
            Event::Finished { id, reason } => out.entry(id).or_default().1 = Some(reason),
            Event::Failed { id, error } => panic!("request {id} failed: {error}"),
        }
    }
}

/// Runs the scheduler until idle; returns each request's tokens and ending.
fn drain(
    s: &mut Scheduler<CpuBackend>,
    b: &CpuBackend,
    m: &Decoder<CpuBackend>,
) -> HashMap<RequestId, (Vec<u32>, FinishReason)> {
    drain_into(s, b, m, Outputs::new())
}

fn drain_into(
    s: &mut Scheduler<CpuBackend>,
    b: &CpuBackend,
    m: &Decoder<CpuBackend>,
    mut out: Outputs,
) -> HashMap<RequestId, (Vec<u32>, FinishReason)> {
    let mut steps = 0;
    while !s.is_idle() {
        record(&mut out, s.step(b, m).unwrap());
        s.check().unwrap();
        steps += 1;
        assert!(steps < 10_000, "the scheduler makes no progress");
    }
    assert_eq!(s.pool().in_use(), 0, "every block is back");
    out.into_iter()
        .map(|(id, (t, r))| (id, (t, r.expect("finished"))))
        .collect()
}

/// Each prompt alone, in a scheduler of its own.
fn alone(b: &CpuBackend, m: &Decoder<CpuBackend>, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| {
            let mut s = Scheduler::new(b, m, config(64, 16, 512)).unwrap();
            let id = s.submit(request(p.clone(), n)).unwrap();
            let out = drain(&mut s, b, m);
            assert_eq!(out[&id].1, FinishReason::Length);
            out[&id].0.clone()
        })
        .collect()
}

fn together(
    b: &CpuBackend,
    m: &Decoder<CpuBackend>,
    cfg: SchedulerConfig,
    prompts: &[Vec<u32>],
    n: usize,
) -> (Vec<Vec<u32>>, Scheduler<CpuBackend>) {
    let mut s = Scheduler::new(b, m, cfg).unwrap();
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| s.submit(request(p.clone(), n)).unwrap())
        .collect();
    let out = drain(&mut s, b, m);
    (ids.iter().map(|id| out[id].0.clone()).collect(), s)
}

#[test]
fn batched_requests_get_the_tokens_they_get_alone() {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b);
    let ps = prompts(12, 0);
    let want = alone(&b, &m, &ps, 10);
    assert!(want.iter().all(|t| t.len() == 10));
    let (got, _) = together(&b, &m, config(128, 16, 512), &ps, 10);
    assert_eq!(got, want);
}

#[test]
fn chunked_prefill_and_small_blocks_change_no_token() {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b);
    let ps = prompts(6, 0);
    let want = alone(&b, &m, &ps, 6);
    // 5 tokens per step: prompts are cut into chunks while other sequences decode.
    let (got, _) = together(&b, &m, config(128, 3, 5), &ps, 6);
    assert_eq!(got, want);
}

#[test]
fn shared_prefixes_hit_the_cache_and_change_no_token() {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b);
    let ps = prompts(5, 40);
    let want = alone(&b, &m, &ps, 5);
    // One at a time through the same scheduler: later prompts find the first one's blocks.
    let mut s = Scheduler::new(&b, &m, config(64, 8, 512)).unwrap();
    let mut got = Vec::new();
    for p in &ps {
        let id = s.submit(request(p.clone(), 5)).unwrap();
        got.push(drain(&mut s, &b, &m)[&id].0.clone());
    }
    assert_eq!(got, want);
    let stats = s.prefix_stats();
    // 40 shared tokens = 5 full blocks of 8, found by each of the 4 later prompts.
    assert!(stats.hit_blocks >= 4 * 5, "{stats:?}");
}

#[test]
fn preempted_requests_are_recomputed_and_change_no_token() {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b);
    let ps = prompts(6, 0);
    let want = alone(&b, &m, &ps, 24);
    // 16 blocks of 4 positions: each sequence fits alone (at most 25 + 24 positions), not all
    // six at once.
    let (got, s) = together(&b, &m, config(16, 4, 512), &ps, 24);
    assert!(
        s.preemptions() > 0,
        "the pool was large enough: no preemption tested"
    );
    assert_eq!(got, want);
}

#[test]
fn cancelled_and_stopped_requests_free_their_blocks() {
    let b = CpuBackend::new(1).unwrap();
    let m = model(&b);
    let ps = prompts(3, 0);
    let first = alone(&b, &m, &ps[..1], 4)[0].clone();
    let mut s = Scheduler::new(&b, &m, config(32, 4, 512)).unwrap();
    // Stop at the first occurrence of the 3rd token alone generates.
    let stop_at = first[2];
    let stop_len = first.iter().position(|&t| t == stop_at).unwrap() + 1;
    let a = s
        .submit(Request {
            stop_ids: vec![stop_at],
            ..request(ps[0].clone(), 50)
        })
        .unwrap();
    let c = s.submit(request(ps[1].clone(), 50)).unwrap();
    let waiting = s.submit(request(ps[2].clone(), 50)).unwrap();
    assert!(s.cancel(waiting));
    let mut out = Outputs::new();
    record(&mut out, s.step(&b, &m).unwrap());
    assert!(s.pool().in_use() > 0);
    assert!(s.cancel(c));
    assert!(!s.cancel(c), "already gone");
    s.check().unwrap();
    // A cancelled request produces nothing more (and no ending: its caller knows).
    let (c_tokens, c_end) = out.remove(&c).unwrap();
    assert_eq!((c_tokens.len(), c_end), (1, None));
    let out = drain_into(&mut s, &b, &m, out);
    assert_eq!(out[&a].1, FinishReason::Stop);
    assert_eq!(out[&a].0, first[..stop_len]);
    assert!(!out.contains_key(&waiting) && !out.contains_key(&c));
    assert_eq!(s.pool().in_use(), 0);
}

#[test]
fn a_sequence_larger_than_the_pool_ends_instead_of_looping() {
    let b = CpuBackend::new(1).unwrap();
    let m = model(&b);
    // 3 blocks of 4: a 5-token prompt fits, 12 positions is the most it can ever hold.
    let mut s = Scheduler::new(&b, &m, config(3, 4, 512)).unwrap();
    let id = s.submit(request(vec![5, 6, 7, 8, 9], 100)).unwrap();
    let out = drain(&mut s, &b, &m);
    assert_eq!(out[&id].1, FinishReason::CacheFull);
    // 7 tokens fill the 12 positions; an 8th is sampled from them, and has no room.
    assert_eq!(out[&id].0.len(), 12 - 5 + 1);
}

#[test]
fn refused_requests_say_why_and_change_nothing() {
    let b = CpuBackend::new(1).unwrap();
    let m = model(&b);
    let mut s = Scheduler::new(
        &b,
        &m,
        SchedulerConfig {
            max_waiting: 1,
            ..config(4, 4, 64)
        },
    )
    .unwrap();
    assert!(matches!(
        s.submit(request(vec![], 4)),
        Err(SubmitError::EmptyPrompt)
    ));
    assert!(matches!(
        s.submit(request(vec![1], 0)),
        Err(SubmitError::NoTokens)
    ));
    assert!(matches!(
        s.submit(request(vec![1; 16], 4)),
        Err(SubmitError::PromptTooLarge { needed: 5, pool: 4 })
    ));
    assert!(matches!(
        s.submit(request(vec![1; 300], 4)),
        Err(SubmitError::PromptTooLong {
            prompt: 300,
            context: 256
        })
    ));
    assert!(matches!(
        s.submit(request(vec![1, 405], 4)),
        Err(SubmitError::BadToken {
            id: 405,
            vocab: 405
        })
    ));
    let bad = Request {
        sampling: SamplingParams {
            temperature: -1.0,
            ..SamplingParams::greedy()
        },
        ..request(vec![1], 1)
    };
    assert!(matches!(s.submit(bad), Err(SubmitError::Sampling(_))));
    s.submit(request(vec![1, 2], 4)).unwrap();
    assert!(matches!(
        s.submit(request(vec![1, 2], 4)),
        Err(SubmitError::QueueFull(1))
    ));
    assert_eq!(s.waiting(), 1);
    assert!(Scheduler::new(&b, &m, config(4, 0, 64)).is_err());
    assert!(Scheduler::new(&b, &m, config(4, 4, 0)).is_err());
}

#[test]
fn token_logprobs_are_the_models_as_scoring_gives_them() {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b);
    let ps = prompts(3, 0);
    let mut s = Scheduler::new(&b, &m, config(64, 8, 512)).unwrap();
    let ids: Vec<RequestId> = ps
        .iter()
        .map(|p| {
            s.submit(Request {
                logprobs: Some(3),
                // Sampling with penalties: the reported log-probabilities are still the model's.
                sampling: SamplingParams {
                    temperature: 0.7,
                    presence_penalty: 1.0,
                    seed: 5,
                    ..SamplingParams::default()
                },
                ..request(p.clone(), 6)
            })
            .unwrap()
        })
        .collect();
    let mut got: HashMap<RequestId, Vec<(u32, kiln_engine::TokenLogprob)>> = HashMap::new();
    while !s.is_idle() {
        for e in s.step(&b, &m).unwrap() {
            if let Event::Token { id, token, logprob } = e {
                got.entry(id)
                    .or_default()
                    .push((token, logprob.expect("asked for")));
            }
        }
    }
    for (p, id) in ps.iter().zip(&ids) {
        let toks = &got[id];
        let mut all = p.clone();
        all.extend(toks.iter().map(|(t, _)| *t));
        let want = kiln_engine::score(&b, &m, &all, 3).unwrap();
        for (j, (token, lp)) in toks.iter().enumerate() {
            let w = &want[p.len() - 1 + j];
            assert!(
                (lp.logprob - w.logprob_next).abs() < 1e-4,
                "{} vs {}",
                lp.logprob,
                w.logprob_next
            );
            assert_eq!(lp.top.len(), 3);
            for ((a, x), (b, y)) in lp.top.iter().zip(&w.top) {
                assert!(a == b || (x - y).abs() < 1e-4, "top {a}:{x} vs {b}:{y}");
                assert!((x - y).abs() < 1e-4);
            }
            assert!(lp.top[0].1 >= lp.logprob - 1e-12, "token {token}");
        }
    }
}

/// A constraint that allows exactly the next token of `script` (or, with `alternatives`, that
/// token and the ones that follow it in the vocabulary), and is done after the last. It fails
/// to prepare at step `fail_at`, and refuses every commit when `refuse` is set.
struct Script {
    script: Vec<u32>,
    at: usize,
    alternatives: u32,
    fail_at: Option<usize>,
    refuse: bool,
    /// Steps prepared: each on the scheduler's worker thread, before the token is sampled.
    prepared: usize,
}

impl Script {
    fn new(script: Vec<u32>) -> Script {
        Script {
            script,
            at: 0,
            alternatives: 0,
            fail_at: None,
            refuse: false,
            prepared: 0,
        }
    }
}

impl TokenConstraint for Script {
    fn prepare(&mut self) -> Result<(), String> {
        if self.fail_at == Some(self.at) {
            return Err(format!("nothing can follow token {}", self.at));
        }
        self.prepared = self.at + 1;
        Ok(())
    }
    fn apply(&self, logits: &mut [f32]) {
        assert_eq!(self.prepared, self.at + 1, "applied before prepare");
        let next = self.script[self.at];
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as u32;
            if id < next || id > next + self.alternatives {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    fn accepts(&mut self, token: u32) -> bool {
        let next = self.script[self.at];
        !self.refuse && token >= next && token <= next + self.alternatives
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        let next = self.script[self.at];
        if self.refuse || token < next || token > next + self.alternatives {
            return Err(format!("token {token} refused"));
        }
        self.at += 1;
        Ok(())
    }
    fn is_done(&self) -> bool {
        self.at == self.script.len()
    }
}

#[test]
fn constrained_requests_take_only_allowed_tokens_and_change_no_other_request() {
    // Two threads take every core of a 2-core machine: the masks are prepared before each
    // forward pass. One thread leaves a core free: they are prepared during it.
    for threads in [2, 1] {
        constrained_requests_on(CpuBackend::new(threads).unwrap());
    }
}

fn constrained_requests_on(b: CpuBackend) {
    let m = model(&b);
    let ps = prompts(6, 0);
    let want = alone(&b, &m, &ps, 8);
    let mut s = Scheduler::new(&b, &m, config(128, 4, 7)).unwrap();
    let ids: Vec<RequestId> = ps
        .iter()
        .map(|p| s.submit(request(p.clone(), 8)).unwrap())
        .collect();
    // Two constrained requests in the same batch: one follows its script to the end (and ends
    // there, before max_tokens); one may pick among 3 tokens each step, under a bias toward a
    // token its mask refuses (the mask is applied after logit_bias).
    let script = vec![17, 3, 250, 250, 9];
    let forced = s
        .submit(Request {
            constraint: Some(Constraint::new(Script::new(script.clone()))),
            ..request(ps[2].clone(), 20)
        })
        .unwrap();
    let mut free = Script::new(vec![100; 6]);
    free.alternatives = 2;
    let free_id = s
        .submit(Request {
            constraint: Some(Constraint::new(free)),
            sampling: SamplingParams {
                logit_bias: vec![(99, 100.0), (103, 100.0)],
                ..SamplingParams::greedy()
            },
            ..request(ps[4].clone(), 20)
        })
        .unwrap();
    let out = drain(&mut s, &b, &m);
    assert_eq!(out[&forced], (script, FinishReason::Stop));
    let (tokens, reason) = &out[&free_id];
    assert_eq!((tokens.len(), *reason), (6, FinishReason::Stop));
    assert!(tokens.iter().all(|t| (100..=102).contains(t)), "{tokens:?}");
    let got: Vec<Vec<u32>> = ids.iter().map(|id| out[id].0.clone()).collect();
    assert_eq!(got, want, "the unconstrained requests changed");
}

#[test]
fn a_constraint_that_cannot_go_on_fails_its_request_only() {
    let b = CpuBackend::new(2).unwrap();
    let m = model(&b);
    let ps = prompts(3, 0);
    let want = alone(&b, &m, &ps[..1], 6);
    for (fail_at, refuse) in [(Some(2), false), (Some(0), false), (None, true)] {
        let mut s = Scheduler::new(&b, &m, config(64, 4, 512)).unwrap();
        let ok = s.submit(request(ps[0].clone(), 6)).unwrap();
        let mut c = Script::new(vec![5, 6, 7, 8]);
        c.fail_at = fail_at;
        c.refuse = refuse;
        let bad = s
            .submit(Request {
                constraint: Some(Constraint::new(c)),
                ..request(ps[1].clone(), 6)
            })
            .unwrap();
        let mut tokens = HashMap::<RequestId, Vec<u32>>::new();
        let mut failed = None;
        let mut finished = Vec::new();
        while !s.is_idle() {
            for e in s.step(&b, &m).unwrap() {
                match e {
                    Event::Token { id, token, .. } => tokens.entry(id).or_default().push(token),
                    Event::Finished { id, .. } => finished.push(id),
                    Event::Failed { id, error } => {
                        assert_eq!(id, bad);
                        failed = Some(error);
                    }
                }
            }
            s.check().unwrap();
        }
        assert_eq!(s.pool().in_use(), 0, "every block is back");
        let error = failed.expect("the constrained request failed");
        // The tokens before the failure, none after; never a token the constraint refused.
        let before = if refuse { 0 } else { fail_at.unwrap() };
        assert_eq!(
            tokens.get(&bad).cloned().unwrap_or_default(),
            vec![5, 6, 7, 8][..before].to_vec(),
            "{error}"
        );
        assert_eq!(finished, vec![ok], "the failed request also finished");
        assert_eq!(tokens[&ok], want[0]);
    }
}
