//! The server's metrics and their Prometheus text exposition (format 0.0.4,
//! hand-rolled: counters, gauges and histograms with fixed buckets).
//!
//! The engine thread writes the engine-side values once per step (requests
//! running and waiting, KV blocks, prefix-cache counters, preemptions, token
//! counters, latency histograms); the HTTP side counts rejections and its
//! admission queue. Everything sits behind one mutex, held for a few
//! microseconds per step or scrape.
//!
//! Invariants: counters never decrease; a histogram's `_bucket` lines are
//! cumulative, end with `le="+Inf"` equal to `_count`, and `_sum` is the sum
//! of the observations.

use std::fmt::Write;
use std::sync::Mutex;

/// Buckets (seconds) of time to first token.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
];
/// Buckets (seconds) of the gaps between tokens.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Buckets (seconds) of whole requests.
pub const E2E_BUCKETS: &[f64] =
    &[0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0];

/// A histogram with fixed upper bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (increasing).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Records `v`.
    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c;
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// How a request ended, as the `finished_reason` label says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted: the client went away, a stop string was found, or shutdown.
    Abort,
    /// The engine failed.
    Error,
}

/// Every metric's current value.
#[derive(Clone, Debug, PartialEq)]
pub struct Values {
    /// Requests the scheduler runs.
    pub running: usize,
    /// Requests the scheduler has queued (waiting or preempted).
    pub waiting: usize,
    /// Requests waiting at the HTTP side for an engine slot.
    pub queued: usize,
    /// KV blocks referenced by a sequence.
    pub kv_used: usize,
    /// KV blocks in the pool.
    pub kv_total: usize,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of those, tokens found.
    pub prefix_hits: u64,
    /// Preemptions by recompute.
    pub preemptions: u64,
    /// Prompt tokens of admitted engine requests.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub generation_tokens: u64,
    /// Finished engine requests per outcome (stop, length, abort, error).
    pub finished: [u64; 4],
    /// Requests rejected because the queue was full.
    pub rejected_full: u64,
    /// Requests rejected while shutting down.
    pub rejected_shutdown: u64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Gaps between tokens.
    pub itl: Histogram,
    /// Arrival to finish.
    pub e2e: Histogram,
}

impl Default for Values {
    fn default() -> Self {
        Values {
            running: 0,
            waiting: 0,
            queued: 0,
            kv_used: 0,
            kv_total: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: [0; 4],
            rejected_full: 0,
            rejected_shutdown: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

/// The shared metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    values: Mutex<Values>,
}

impl Metrics {
    /// Runs `f` on the values (a poisoned lock is recovered: metrics are
    /// plain numbers, always consistent enough to keep serving).
    pub fn update<R>(&self, f: impl FnOnce(&mut Values) -> R) -> R {
        let mut v = self.values.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut v)
    }

    /// A copy of the values.
    pub fn snapshot(&self) -> Values {
        self.update(|v| v.clone())
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        render(&self.snapshot())
    }
}

/// Writes one gauge or counter.
fn scalar(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// The Prometheus text of `v`.
pub fn render(v: &Values) -> String {
    let mut out = String::with_capacity(8192);
    let g = "gauge";
    let c = "counter";
    scalar(&mut out, "tessera_num_requests_running", g, "Requests in the running batch.", v.running);
    scalar(&mut out, "tessera_num_requests_waiting", g, "Requests queued in the scheduler.", v.waiting);
    scalar(&mut out, "tessera_num_requests_queued", g, "Requests waiting for an engine slot.", v.queued);
    let usage = if v.kv_total == 0 { 0.0 } else { v.kv_used as f64 / v.kv_total as f64 };
    scalar(
        &mut out,
        "tessera_kv_cache_usage_ratio",
        g,
        "Fraction of KV-cache blocks in use (0 to 1).",
        usage,
    );
    scalar(
        &mut out,
        "tessera_kv_cache_blocks_used",
        g,
        "KV-cache blocks referenced by a sequence.",
        v.kv_used,
    );
    scalar(&mut out, "tessera_kv_cache_blocks_total", g, "KV-cache blocks in the pool.", v.kv_total);
    scalar(
        &mut out,
        "tessera_prefix_cache_queries_total",
        c,
        "Prompt tokens looked up in the prefix cache.",
        v.prefix_queries,
    );
    scalar(
        &mut out,
        "tessera_prefix_cache_hits_total",
        c,
        "Prompt tokens found in the prefix cache.",
        v.prefix_hits,
    );
    let rate = if v.prefix_queries == 0 { 0.0 } else { v.prefix_hits as f64 / v.prefix_queries as f64 };
    scalar(&mut out, "tessera_prefix_cache_hit_rate", g, "Prefix-cache hits over queries, in tokens.", rate);
    scalar(
        &mut out,
        "tessera_num_preemptions_total",
        c,
        "Requests preempted (recomputed later).",
        v.preemptions,
    );
    scalar(
        &mut out,
        "tessera_prompt_tokens_total",
        c,
        "Prompt tokens of admitted requests.",
        v.prompt_tokens,
    );
    scalar(&mut out, "tessera_generation_tokens_total", c, "Generated tokens.", v.generation_tokens);
    let name = "tessera_request_success_total";
    let _ = writeln!(out, "# HELP {name} Finished engine requests by reason.\n# TYPE {name} counter");
    for (label, n) in ["stop", "length", "abort", "error"].iter().zip(v.finished) {
        let _ = writeln!(out, "{name}{{finished_reason=\"{label}\"}} {n}");
    }
    let name = "tessera_requests_rejected_total";
    let _ =
        writeln!(out, "# HELP {name} Requests refused before reaching the engine.\n# TYPE {name} counter");
    let _ = writeln!(out, "{name}{{reason=\"queue_full\"}} {}", v.rejected_full);
    let _ = writeln!(out, "{name}{{reason=\"shutting_down\"}} {}", v.rejected_shutdown);
    v.ttft.render(&mut out, "tessera_time_to_first_token_seconds", "Time from arrival to the first token.");
    v.itl.render(
        &mut out,
        "tessera_inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
    );
    v.e2e.render(&mut out, "tessera_e2e_request_latency_seconds", "Time from arrival to the last token.");
    out
}

impl Outcome {
    /// The index of this outcome in [`Values::finished`].
    pub fn index(self) -> usize {
        match self {
            Outcome::Stop => 0,
            Outcome::Length => 1,
            Outcome::Abort => 2,
            Outcome::Error => 3,
        }
    }
}

/// The value of the sample `name` (with its labels, e.g.
/// `tessera_request_success_total{finished_reason="stop"}`) in exposition
/// text; for tests and the benchmark client.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_end_with_inf() {
        let mut h = Histogram::new(&[0.125, 1.0]);
        for v in [0.0625, 0.125, 0.5, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "An example.");
        assert_eq!(
            out,
            "# HELP x An example.\n# TYPE x histogram\nx_bucket{le=\"0.125\"} 2\nx_bucket{le=\"1\"} 3\n\
             x_bucket{le=\"+Inf\"} 4\nx_sum 3.6875\nx_count 4\n"
        );
    }

    #[test]
    fn exposition_is_well_formed() {
        let m = Metrics::default();
        m.update(|v| {
            v.running = 3;
            v.kv_used = 5;
            v.kv_total = 20;
            v.prefix_queries = 10;
            v.prefix_hits = 4;
            v.finished[Outcome::Abort.index()] = 2;
            v.ttft.observe(0.02);
        });
        let text = m.render();
        assert_eq!(sample(&text, "tessera_num_requests_running"), Some(3.0));
        assert_eq!(sample(&text, "tessera_kv_cache_usage_ratio"), Some(0.25));
        assert_eq!(sample(&text, "tessera_prefix_cache_hit_rate"), Some(0.4));
        assert_eq!(sample(&text, "tessera_request_success_total{finished_reason=\"abort\"}"), Some(2.0));
        assert_eq!(sample(&text, "tessera_time_to_first_token_seconds_count"), Some(1.0));
        assert_eq!(sample(&text, "tessera_time_to_first_token_seconds_bucket{le=\"0.02\"}"), Some(1.0));
        assert_eq!(sample(&text, "tessera_time_to_first_token_seconds_bucket{le=\"0.01\"}"), Some(0.0));
        // Every sample line belongs to a family declared by HELP and TYPE
        // lines just before it, and has a numeric value.
        let mut family = String::new();
        let mut families = 0;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                family = parts.next().unwrap().to_string();
                let kind = parts.next().unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                families += 1;
            } else if !line.starts_with("# HELP ") {
                let (name, value) = line.rsplit_once(' ').unwrap();
                assert!(name.starts_with(&family), "{line} outside {family}");
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
        assert_eq!(families, 17);
    }
}
