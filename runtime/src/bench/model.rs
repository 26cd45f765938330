//! The model benchmark (`tessera bench --only model`): SmolLM2-135M served by
//! the engine at batch sizes 1..64, in the workload of peers.py's HF
//! transformers row (`generate/smollm2-135m-shape/bs<b>`): `b` prompts of 128
//! tokens, 256 new tokens each, greedy, no stop tokens.
//!
//! Per batch size it reports:
//! - `generate/smollm2-135m-shape/bs<b>`: `b * 256 / wall time` (tok/s), the
//!   peer row's own definition (prefill included);
//! - `model/prefill/bs<b>`: prompt tokens per second of the steps that
//!   carried prefill tokens;
//! - `model/decode/bs<b>`: generated tokens per second of the pure decode
//!   steps;
//! - `model/ttft_p50/bs<b>` and `model/itl_p50|p99/bs<b>` in milliseconds;
//! - `model/peak_mem/bs<b>`: the most device memory in use (GiB) seen
//!   between steps (GPU only).
//!
//! With a grammar (`--json-schema`) every request is constrained by it; a
//! request ends where the grammar does, so the schema should allow outputs
//! longer than the new tokens for rows comparable with the unconstrained
//! ones.
//!
//! Each batch size first runs an untimed warm-up of the same length (kernel
//! compilation, graph capture, autotuning of every context-length bucket),
//! then the timed run, or `repeats` timed runs with each rate the median
//! over them (a prefill of 64 prompts lasts a few milliseconds, so one
//! run's rate moves by several percent from run to run). Prompts are
//! distinct pseudo-random ids, new for every run, so the prefix cache
//! never hits.

use crate::app::{EngineTask, Session};
use crate::bench::Record;
use crate::engine::{Completion, Engine, Request};
use crate::error::Result;
use crate::grammar::{GrammarCompiler, GrammarSpec};
use crate::model::ActElem;
use crate::model::Device;
use std::time::{Duration, Instant};

/// The benchmark's settings.
pub struct ModelBench {
    /// Batch sizes.
    pub batches: Vec<usize>,
    /// Prompt tokens per request.
    pub prompt_len: usize,
    /// New tokens per request.
    pub new_tokens: usize,
    /// A variant appended to every row name as ` [variant]` (compared with
    /// the peers' row of the base name).
    pub variant: Option<String>,
    /// A constraint on every request (structured output), if any.
    pub grammar: Option<GrammarSpec>,
    /// Timed runs per batch size, each on new prompts; each rate reported
    /// is its median over the runs, the latency quantiles are over every
    /// run's requests.
    pub repeats: usize,
}

impl Default for ModelBench {
    fn default() -> Self {
        ModelBench {
            batches: vec![1, 8, 32, 64],
            prompt_len: 128,
            new_tokens: 256,
            variant: None,
            grammar: None,
            repeats: 1,
        }
    }
}

/// `b` distinct prompts of `len` pseudo-random ids below `vocab`.
pub(crate) fn prompts(b: usize, len: usize, vocab: usize, salt: u64) -> Vec<Vec<u32>> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ salt;
    (0..b)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((x >> 33) % vocab as u64) as u32
                })
                .collect()
        })
        .collect()
}

/// The `q`-quantile of `v` (sorted in place), in milliseconds.
fn quantile_ms(v: &mut [Duration], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i].as_secs_f64() * 1e3
}

/// Device memory in use (GiB), when a CUDA context is current.
fn gpu_used_gib() -> Option<f64> {
    let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
    Some((total - free) as f64 / (1u64 << 30) as f64)
}

/// What one timed run measured.
struct Run {
    wall: f64,
    prefill_tokens: u64,
    prefill_secs: f64,
    decode_tokens: u64,
    decode_secs: f64,
    peak_gib: Option<f64>,
    done: Vec<Completion>,
}

/// Runs `reqs` to completion step by step, timing prefill and decode steps apart.
fn timed<D: Device, T: ActElem>(
    dev: &mut D,
    e: &mut Engine<D, T>,
    reqs: Vec<Request>,
    gpu: bool,
) -> Result<Run> {
    let ids = reqs.into_iter().map(|r| e.add(r)).collect::<Result<Vec<_>>>()?;
    let mut run = Run {
        wall: 0.0,
        prefill_tokens: 0,
        prefill_secs: 0.0,
        decode_tokens: 0,
        decode_secs: 0.0,
        peak_gib: None,
        done: Vec::new(),
    };
    let t0 = Instant::now();
    while e.has_unfinished() {
        let before = e.stats();
        let t = Instant::now();
        e.step(dev)?;
        let secs = t.elapsed().as_secs_f64();
        let after = e.stats();
        let prefill = after.prefill_tokens - before.prefill_tokens;
        if prefill > 0 {
            run.prefill_tokens += prefill;
            run.prefill_secs += secs;
        } else {
            run.decode_tokens += after.decode_tokens - before.decode_tokens;
            run.decode_secs += secs;
        }
        if gpu && let Some(g) = gpu_used_gib() {
            run.peak_gib = Some(run.peak_gib.map_or(g, |p: f64| p.max(g)));
        }
    }
    run.wall = t0.elapsed().as_secs_f64();
    let mut done = e.take_completions();
    done.sort_by_key(|c| ids.iter().position(|&i| i == c.seq));
    run.done = done;
    Ok(run)
}

/// The median of `(rate, ms)` pairs by rate (the upper one of an even
/// count), with its run's milliseconds; `(0, 0)` for none.
fn median_rate(mut v: Vec<(f64, f64)>) -> (f64, f64) {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v.get(v.len() / 2).copied().unwrap_or((0.0, 0.0))
}

fn record(name: String, metric: &'static str, value: f64, ms: f64) -> Record {
    eprintln!("measured {name}: {value:.2} {metric}");
    Record::new(name, metric, value, ms)
}

/// `name`, with ` [variant]` appended when there is one.
fn named(name: String, variant: &Option<String>) -> String {
    match variant {
        Some(v) => format!("{name} [{v}]"),
        None => name,
    }
}

impl EngineTask for ModelBench {
    type Output = Vec<Record>;

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Vec<Record>> {
        let Session { dev, engine: e, ctx } = s;
        let vocab = ctx.config.vocab_size;
        let constraint = match &self.grammar {
            Some(g) => Some(GrammarCompiler::new(&ctx.tokenizer, vocab)?.compile(g)?),
            None => None,
        };
        let greedy =
            |p: Vec<u32>, n: usize| Request { constraint: constraint.clone(), ..Request::greedy(p, n) };
        let mut out = Vec::new();
        for (i, &b) in self.batches.iter().enumerate() {
            // The warm-up runs as long as the timed run: kernels specialize
            // and autotune per context-length bucket (the decode split plan
            // is an autotune key), so a shorter one left first-use tuning
            // inside the timed steps on a machine with a cold cache.
            let warm = prompts(b, self.prompt_len, vocab, 1000 + i as u64);
            timed(dev, e, warm.into_iter().map(|p| greedy(p, self.new_tokens)).collect(), ctx.is_gpu)?;
            let mut runs = Vec::new();
            for rep in 0..self.repeats.max(1) {
                // Salts apart from the warm-up's (1000 + i) for any batch index.
                let salt = (i + 2000 * rep) as u64;
                let reqs =
                    prompts(b, self.prompt_len, vocab, salt).into_iter().map(|p| greedy(p, self.new_tokens));
                runs.push(timed(dev, e, reqs.collect(), ctx.is_gpu)?);
            }
            let generated = |r: &Run| r.done.iter().map(|c| c.tokens.len()).sum::<usize>() as f64 / r.wall;
            let rate = |f: &dyn Fn(&Run) -> (f64, f64)| median_rate(runs.iter().map(f).collect());
            let (g, g_ms) = rate(&|r| (generated(r), r.wall * 1e3));
            out.push(record(
                named(format!("generate/smollm2-135m-shape/bs{b}"), &self.variant),
                "tok/s",
                g,
                g_ms,
            ));
            let (p, p_ms) =
                rate(&|r| (r.prefill_tokens as f64 / r.prefill_secs.max(1e-12), r.prefill_secs * 1e3));
            out.push(record(named(format!("model/prefill/bs{b}"), &self.variant), "tok/s", p, p_ms));
            let (d, d_ms) =
                rate(&|r| (r.decode_tokens as f64 / r.decode_secs.max(1e-12), r.decode_secs * 1e3));
            out.push(record(named(format!("model/decode/bs{b}"), &self.variant), "tok/s", d, d_ms));
            let mut ttft: Vec<Duration> = runs.iter().flat_map(|r| r.done.iter().map(|c| c.ttft)).collect();
            let mut itl: Vec<Duration> = runs
                .iter_mut()
                .flat_map(|r| r.done.iter_mut().flat_map(|c| std::mem::take(&mut c.itl)))
                .collect();
            let t50 = quantile_ms(&mut ttft, 0.5);
            out.push(record(named(format!("model/ttft_p50/bs{b}"), &self.variant), "ms", t50, t50));
            let i50 = quantile_ms(&mut itl, 0.5);
            out.push(record(named(format!("model/itl_p50/bs{b}"), &self.variant), "ms", i50, i50));
            let i99 = quantile_ms(&mut itl, 0.99);
            out.push(record(named(format!("model/itl_p99/bs{b}"), &self.variant), "ms", i99, i99));
            if let Some(g) = runs.iter().filter_map(|r| r.peak_gib).reduce(f64::max) {
                out.push(record(named(format!("model/peak_mem/bs{b}"), &self.variant), "GiB", g, 0.0));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::median_rate;

    /// The median keeps its own run's milliseconds and ignores outliers.
    #[test]
    fn median_rate_takes_the_middle_run() {
        assert_eq!(median_rate(vec![(3.0, 30.0), (1.0, 10.0), (100.0, 1.0)]), (3.0, 30.0));
        assert_eq!(median_rate(vec![(2.0, 20.0), (1.0, 10.0)]), (2.0, 20.0));
        assert_eq!(median_rate(vec![(5.0, 50.0)]), (5.0, 50.0));
        assert_eq!(median_rate(Vec::new()), (0.0, 0.0));
    }
}
