//! `/metrics` in the Prometheus text format (version 0.0.4).
//!
//! Counters and histograms are kept here, under one mutex taken for a few nanoseconds per
//! update; the engine gauges (running and waiting sequences, KV blocks, prefix-cache hits) are
//! read from the model threads' [`DecoderStats`] at scrape time. Every series carries the
//! model name (`model="..."`) except the request counter, which is by endpoint and status.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use crate::engine::DecoderStats;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (seconds) of the time-per-output-token buckets.
const TPOT_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c;
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[derive(Default)]
struct Inner {
    /// (endpoint, status) → count.
    requests: BTreeMap<(String, u16), u64>,
    ttft: BTreeMap<String, Histogram>,
    tpot: BTreeMap<String, Histogram>,
    prompt_tokens: BTreeMap<String, u64>,
    generation_tokens: BTreeMap<String, u64>,
}

/// The server's counters and histograms.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// A label value with `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `# HELP` and `# TYPE` lines of a metric family.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A poisoned lock only means a panic elsewhere mid-update; the counts stay usable.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    pub fn request(&self, endpoint: &str, status: u16) {
        self.with(|m| {
            *m.requests
                .entry((endpoint.to_string(), status))
                .or_default() += 1
        });
    }

    pub fn time_to_first_token(&self, model: &str, secs: f64) {
        self.with(|m| {
            m.ttft
                .entry(model.to_string())
                .or_insert_with(|| Histogram::new(TTFT_BOUNDS))
                .observe(secs)
        });
    }

    pub fn time_per_output_token(&self, model: &str, secs: f64) {
        self.with(|m| {
            m.tpot
                .entry(model.to_string())
                .or_insert_with(|| Histogram::new(TPOT_BOUNDS))
                .observe(secs)
        });
    }

    pub fn tokens(&self, model: &str, prompt: usize, generated: usize) {
        self.with(|m| {
            *m.prompt_tokens.entry(model.to_string()).or_default() += prompt as u64;
            *m.generation_tokens.entry(model.to_string()).or_default() += generated as u64;
        });
    }

    /// The exposition text, with the gauges of `decoders` (name, stats).
    pub fn render(&self, decoders: &[(&str, &DecoderStats)]) -> String {
        let mut out = String::new();
        self.with(|m| {
            header(
                &mut out,
                "kiln_requests_total",
                "counter",
                "HTTP requests by endpoint and status.",
            );
            for ((endpoint, status), n) in &m.requests {
                let _ = writeln!(
                    out,
                    "kiln_requests_total{{endpoint=\"{}\",status=\"{status}\"}} {n}",
                    label(endpoint)
                );
            }
            for (name, help, map) in [
                (
                    "kiln_time_to_first_token_seconds",
                    "Time from a generation request's arrival to its first token.",
                    &m.ttft,
                ),
                (
                    "kiln_time_per_output_token_seconds",
                    "Time between consecutive generated tokens of a request.",
                    &m.tpot,
                ),
            ] {
                header(&mut out, name, "histogram", help);
                for (model, h) in map {
                    h.render(&mut out, name, &format!("model=\"{}\"", label(model)));
                }
            }
            for (name, help, map) in [
                (
                    "kiln_prompt_tokens_total",
                    "Prompt tokens of finished generation requests.",
                    &m.prompt_tokens,
                ),
                (
                    "kiln_generation_tokens_total",
                    "Tokens generated.",
                    &m.generation_tokens,
                ),
            ] {
                header(&mut out, name, "counter", help);
                for (model, n) in map {
                    let _ = writeln!(out, "{name}{{model=\"{}\"}} {n}", label(model));
                }
            }
        });
        type Read = fn(&DecoderStats) -> f64;
        let gauges: [(&str, &str, &str, Read); 10] = [
            (
                "kiln_running_sequences",
                "gauge",
                "Sequences in the running batch.",
                |s| s.occupancy().0 as f64,
            ),
            (
                "kiln_waiting_sequences",
                "gauge",
                "Requests queued for admission.",
                |s| s.occupancy().1 as f64,
            ),
            (
                "kiln_kv_blocks_used",
                "gauge",
                "KV-cache blocks held by sequences.",
                |s| s.occupancy().2 as f64,
            ),
            (
                "kiln_kv_blocks_free",
                "gauge",
                "KV-cache blocks free (including idle cached-prefix blocks).",
                |s| s.occupancy().3 as f64,
            ),
            (
                "kiln_kv_blocks_cached",
                "gauge",
                "Free KV-cache blocks that still hold a cached prefix.",
                |s| DecoderStats::get(&s.blocks_cached) as f64,
            ),
            (
                "kiln_kv_window_blocks_used",
                "gauge",
                "Blocks of the sliding-window layers' own KV pool held by sequences.",
                |s| DecoderStats::get(&s.window_blocks_used) as f64,
            ),
            (
                "kiln_kv_window_blocks_free",
                "gauge",
                "Blocks of the sliding-window layers' own KV pool free (0 without one).",
                |s| {
                    let total = DecoderStats::get(&s.window_blocks_total);
                    total.saturating_sub(DecoderStats::get(&s.window_blocks_used)) as f64
                },
            ),
            (
                "kiln_prefix_cache_queried_blocks_total",
                "counter",
                "Full prompt blocks looked up in the prefix cache.",
                |s| DecoderStats::get(&s.prefix_queried_blocks) as f64,
            ),
            (
                "kiln_prefix_cache_hit_blocks_total",
                "counter",
                "Full prompt blocks found in the prefix cache.",
                |s| DecoderStats::get(&s.prefix_hit_blocks) as f64,
            ),
            (
                "kiln_preemptions_total",
                "counter",
                "Sequences preempted (to be recomputed) for lack of KV blocks.",
                |s| DecoderStats::get(&s.preemptions) as f64,
            ),
        ];
        for (name, kind, help, read) in gauges {
            header(&mut out, name, kind, help);
            for (model, s) in decoders {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", label(model), read(s));
            }
        }
        header(
            &mut out,
            "kiln_prefix_cache_hit_rate",
            "gauge",
            "Fraction of looked-up prompt blocks found in the prefix cache.",
        );
        for (model, s) in decoders {
            let q = DecoderStats::get(&s.prefix_queried_blocks);
            let h = DecoderStats::get(&s.prefix_hit_blocks);
            let rate = if q == 0 { 0.0 } else { h as f64 / q as f64 };
            let _ = writeln!(
                out,
                "kiln_prefix_cache_hit_rate{{model=\"{}\"}} {rate}",
                label(model)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labels_escaped() {
        let m = Metrics::default();
        m.time_to_first_token("a\"b", 0.003);
        m.time_to_first_token("a\"b", 0.2);
        m.time_to_first_token("a\"b", 100.0);
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 200);
        let text = m.render(&[]);
        assert!(text
            .contains("kiln_time_to_first_token_seconds_bucket{model=\"a\\\"b\",le=\"0.005\"} 1"));
        assert!(text
            .contains("kiln_time_to_first_token_seconds_bucket{model=\"a\\\"b\",le=\"0.25\"} 2"));
        assert!(text
            .contains("kiln_time_to_first_token_seconds_bucket{model=\"a\\\"b\",le=\"+Inf\"} 3"));
        assert!(text.contains("kiln_time_to_first_token_seconds_count{model=\"a\\\"b\"} 3"));
        assert!(text.contains("kiln_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2"));
    }
}
