//! The speculative-decoding benchmark (`tessera bench --only spec`): greedy
//! generation on the loaded model, one request at a time (batch 1, where
//! speculation pays), without speculation, with prompt lookup and with a
//! draft of the model's own first layers, on two workloads:
//!
//! - `repeat`: a chat prompt asking the model to repeat a ~120-word paragraph
//!   verbatim, 256 new tokens (prompt lookup's best case);
//! - `golden`: the golden prompts (`tests/data/smollm2-135m-q4_1.json`,
//!   their `prompt_ids`), 64 new tokens each.
//!
//! No stop tokens, so every configuration generates the same number of
//! tokens. Per workload and configuration it reports tok/s (generated tokens
//! over wall time, prefill included), the speedup over no speculation, the
//! acceptance rate, the mean accepted length (tokens emitted per verification)
//! and the number of sequences whose output differs from the
//! non-speculative one (speculation is exact, so this should be 0; the bench
//! reports it and does not fail).
//!
//! Each engine first runs a short untimed request whose prompt repeats a
//! pattern (so verification rows run and their kernels are compiled), then
//! every workload once untimed (it reaches batch buckets, CUDA-graph
//! captures and kernel specializations the short request does not, whose
//! compilation inside a timed run of a fraction of a second would dominate
//! it), then the timed pass. Each configuration loads a fresh
//! engine and runs the same passes, so prefix-cache state is equal (the
//! timed pass finds its prompts cached in every configuration).

use crate::app::{self, Context, EngineTask, LoadOptions, Session};
use crate::bench::Record;
use crate::chat::Message;
use crate::engine::{Engine, Request};
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::parity::Golden;
use crate::spec::SpecStats;
use crate::spec::cli::Speculation;
use std::path::PathBuf;
use std::time::Instant;

/// The paragraph of the `repeat` workload (about 120 words).
pub const PARAGRAPH: &str = "The old lighthouse stood at the edge of the northern cliffs for more than two \
hundred years. Every evening the keeper climbed the narrow spiral staircase, trimmed the wick, polished the \
great glass lens and watched the beam sweep across the dark water. Fishermen returning late from the banks \
relied on that steady light to find the harbour entrance between the rocks. When the storms of winter came, \
waves broke over the gallery and the whole tower trembled, yet the lamp never failed. Today the light is \
automatic and the keeper's cottage has become a small museum, where visitors can read the logbooks, see the \
brass instruments and imagine the long, lonely nights of those who kept the flame burning for the ships.";

/// The benchmark's settings.
#[derive(Clone, Debug)]
pub struct SpecBenchOptions {
    /// Draft tokens per step for both drafters.
    pub k: usize,
    /// Layers of the draft model (the target's first layers).
    pub draft_layers: usize,
    /// New tokens of the `repeat` workload.
    pub repeat_tokens: usize,
    /// New tokens per golden prompt.
    pub golden_tokens: usize,
    /// The golden file, or `None` for the golden prompts built into the
    /// binary (`tests/data/smollm2-135m-q4_1.json`: the benchmark then runs
    /// from any directory).
    pub golden: Option<PathBuf>,
}

impl Default for SpecBenchOptions {
    fn default() -> Self {
        SpecBenchOptions { k: 4, draft_layers: 8, repeat_tokens: 256, golden_tokens: 64, golden: None }
    }
}

/// Prompts generated greedily one at a time, `max_tokens` each.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The workload's name in record names.
    pub name: String,
    /// Prompt token ids.
    pub prompts: Vec<Vec<u32>>,
    /// New tokens per prompt.
    pub max_tokens: usize,
}

/// What one workload measured on one engine.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The workload's name.
    pub name: String,
    /// The generated tokens per prompt.
    pub tokens: Vec<Vec<u32>>,
    /// Wall time of the whole workload in seconds.
    pub secs: f64,
    /// Speculation counters of this workload alone.
    pub stats: SpecStats,
}

impl Measured {
    /// Generated tokens per second.
    pub fn tok_per_s(&self) -> f64 {
        self.tokens.iter().map(Vec::len).sum::<usize>() as f64 / self.secs.max(1e-12)
    }
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::greedy(prompt, max_tokens)
}

/// Counters accumulated between `before` and `after`.
fn delta(before: SpecStats, after: SpecStats) -> SpecStats {
    SpecStats {
        verifications: after.verifications - before.verifications,
        proposed: after.proposed - before.proposed,
        accepted: after.accepted - before.accepted,
        emitted: after.emitted - before.emitted,
    }
}

/// Runs one short untimed request whose prompt repeats a pattern of ids
/// below `vocab` (compiles the kernels of prefill, decode and verification).
pub fn warm_up<D: Device, T: ActElem>(dev: &mut D, e: &mut Engine<D, T>, vocab: usize) -> Result<()> {
    let prompt = (0..24u32).map(|i| (i % 6 * 17 + 3) % vocab as u32).collect();
    e.run(dev, vec![greedy(prompt, 12)], |_| {})?;
    Ok(())
}

/// Generates `w` on `e`, one prompt at a time, twice: the first pass is
/// untimed (verification steps reach batch buckets, graph captures and
/// kernel specializations that a short warm-up does not, and compiling them
/// would land in a run of a fraction of a second), the second is timed.
pub fn measure<D: Device, T: ActElem>(dev: &mut D, e: &mut Engine<D, T>, w: &Workload) -> Result<Measured> {
    let pass = |dev: &mut D, e: &mut Engine<D, T>| -> Result<Vec<Vec<u32>>> {
        let mut tokens = Vec::with_capacity(w.prompts.len());
        for p in &w.prompts {
            let mut done = e.run(dev, vec![greedy(p.clone(), w.max_tokens)], |_| {})?;
            tokens.push(done.pop().map(|c| c.tokens).unwrap_or_default());
        }
        Ok(tokens)
    };
    pass(dev, e)?;
    let before = e.spec_stats();
    let t0 = Instant::now();
    let tokens = pass(dev, e)?;
    let secs = t0.elapsed().as_secs_f64();
    Ok(Measured { name: w.name.clone(), tokens, secs, stats: delta(before, e.spec_stats()) })
}

/// Sequences of `got` whose tokens differ from `want`'s (a missing sequence
/// counts as differing).
pub fn mismatches(want: &Measured, got: &Measured) -> usize {
    let missing = want.tokens.len().abs_diff(got.tokens.len());
    missing + want.tokens.iter().zip(&got.tokens).filter(|(a, b)| a != b).count()
}

fn record(name: String, metric: &'static str, value: f64, ms: f64) -> Record {
    eprintln!("measured {name}: {value:.3} {metric}");
    Record::new(name, metric, value, ms)
}

/// The records of configuration `label` measured as `got` against the
/// non-speculative `base` (same workloads in the same order): tok/s,
/// speedup, acceptance rate and mean accepted length (speculative
/// configurations only) and mismatching sequences.
pub fn report(label: &str, base: &[Measured], got: &[Measured]) -> Vec<Record> {
    let mut out = Vec::new();
    for (b, g) in base.iter().zip(got) {
        let name = |what: &str| format!("spec/{}/{label}{what}", g.name);
        out.push(record(name(""), "tok/s", g.tok_per_s(), g.secs * 1e3));
        if label == "plain" {
            continue;
        }
        out.push(record(name("/speedup"), "x", g.tok_per_s() / b.tok_per_s().max(1e-12), 0.0));
        out.push(record(name("/acceptance"), "%", 100.0 * g.stats.acceptance_rate(), 0.0));
        out.push(record(name("/mean_accepted_len"), "tok", g.stats.mean_accepted_len(), 0.0));
        out.push(record(name("/mismatches"), "seqs", mismatches(b, g) as f64, 0.0));
    }
    out
}

/// The benchmark's workloads on one loaded engine (an [`EngineTask`]).
struct SpecTask {
    golden: Golden,
    opts: SpecBenchOptions,
}

impl SpecTask {
    /// The `repeat` and `golden` workloads, encoded with the model's
    /// tokenizer (and chat template, when it has one).
    fn workloads(&self, ctx: &Context) -> Result<Vec<Workload>> {
        let ask = format!("Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}");
        let prompt = match &ctx.template {
            Some(t) => ctx.tokenizer.encode(&t.render(&[Message::user(ask)], true)?, true)?,
            None => ctx.tokenizer.encode_prompt(&ask)?,
        };
        Ok(vec![
            Workload { name: "repeat".into(), prompts: vec![prompt], max_tokens: self.opts.repeat_tokens },
            Workload {
                name: "golden".into(),
                prompts: self.golden.cases.iter().map(|c| c.prompt_ids.clone()).collect(),
                max_tokens: self.opts.golden_tokens,
            },
        ])
    }
}

impl EngineTask for SpecTask {
    type Output = Vec<Measured>;

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Vec<Measured>> {
        let Session { dev, engine: e, ctx } = s;
        let workloads = self.workloads(ctx)?;
        warm_up(dev, e, ctx.config.vocab_size)?;
        workloads.iter().map(|w| measure(dev, e, w)).collect()
    }
}

/// The golden prompts built into the binary.
const BUNDLED_GOLDEN: &str = include_str!("../../tests/data/smollm2-135m-q4_1.json");

/// Runs the benchmark on the model of `load` (its `speculation` is
/// replaced): plain, `ngram_k<k>` and `draft<n>_k<k>`, one fresh engine each.
pub fn run(load: &LoadOptions, opts: &SpecBenchOptions) -> Result<Vec<Record>> {
    let golden = match &opts.golden {
        Some(path) => Golden::load(path)?,
        None => Golden::parse(BUNDLED_GOLDEN).map_err(|m| {
            crate::error::Error::Usage(format!("internal error: the bundled golden prompts: {m}"))
        })?,
    };
    let (k, n) = (opts.k, opts.draft_layers);
    let configs = [
        ("plain".to_string(), None),
        (format!("ngram_k{k}"), Some(Speculation::ngram(k))),
        (format!("draft{n}_k{k}"), Some(Speculation::draft_layers(n, k))),
    ];
    let mut base = Vec::new();
    let mut out = Vec::new();
    for (label, speculation) in configs {
        let l = LoadOptions { speculation, ..load.clone() };
        let got = app::run_task(&l, SpecTask { golden: golden.clone(), opts: opts.clone() })?;
        if label == "plain" {
            base = got.clone();
        }
        out.extend(report(&label, &base, &got));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::model::tiny_model;
    use crate::gguf::Gguf;
    use crate::model::{Model, Weights};
    use crate::scheduler::SchedulerConfig;
    use crate::spec::SpecConfig;
    use crate::spec::draft::{DraftModel, truncate_layers};
    use dsl_core::interp::Cpu;

    fn engine_on(cpu: &mut Cpu, gguf: &Gguf) -> Engine<Cpu, f32> {
        let weights = Weights::<Cpu, f32>::load(cpu, gguf).unwrap();
        let model = Model::new(cpu, weights, 32, 16).unwrap();
        let config = SchedulerConfig {
            max_num_batched_tokens: 128,
            max_num_seqs: 2,
            max_model_len: 128,
            num_blocks: 32,
            block_size: 16,
            enable_prefix_caching: true,
        };
        Engine::new(model, config).unwrap()
    }

    /// The whole measurement path on the tiny model and the CPU interpreter:
    /// the three configurations, their records, and exact outputs.
    #[test]
    fn measures_plain_ngram_and_draft_on_the_tiny_model() {
        let mut cpu = Cpu::new();
        let target = tiny_model().unwrap();
        let draft = Gguf::from_bytes(truncate_layers(&target, 1).unwrap()).unwrap();
        let workloads = [
            Workload {
                name: "repeat".into(),
                prompts: vec![(0..40u32).map(|i| (i % 9) * 13 + 2).collect()],
                max_tokens: 24,
            },
            Workload { name: "golden".into(), prompts: vec![vec![5, 9, 2], vec![7; 5]], max_tokens: 12 },
        ];
        let mut engines = vec![("plain", engine_on(&mut cpu, &target))];
        let mut ngram = engine_on(&mut cpu, &target);
        ngram.set_speculation(Some(SpecConfig::ngram(4))).unwrap();
        engines.push(("ngram_k4", ngram));
        let mut drafted = engine_on(&mut cpu, &target);
        drafted.set_drafter(4, Box::new(DraftModel::new(engine_on(&mut cpu, &draft)).unwrap())).unwrap();
        engines.push(("draft1_k4", drafted));
        let mut base = Vec::new();
        for (label, mut e) in engines {
            warm_up(&mut cpu, &mut e, crate::gguf::tiny::tiny_vocab_min_size()).unwrap();
            let got: Vec<Measured> =
                workloads.iter().map(|w| measure(&mut cpu, &mut e, w).unwrap()).collect();
            if label == "plain" {
                base = got.clone();
                assert!(got.iter().all(|m| m.stats == SpecStats::default()));
            } else {
                assert!(got[0].stats.proposed > 0, "{label}: {:?}", got[0].stats);
            }
            assert_eq!(got[0].tokens[0].len(), 24);
            let recs = report(label, &base, &got);
            assert_eq!(recs.len(), if label == "plain" { 2 } else { 10 });
            for r in recs.iter().filter(|r| r.name.ends_with("/mismatches")) {
                assert_eq!(r.value, 0.0, "{label}: {}", r.name);
            }
            assert!(recs.iter().all(|r| r.value.is_finite()), "{recs:?}");
        }
    }

    #[test]
    fn mismatches_count_differing_and_missing_sequences() {
        let m = |tokens: Vec<Vec<u32>>| Measured {
            name: "w".into(),
            tokens,
            secs: 1.0,
            stats: SpecStats::default(),
        };
        assert_eq!(mismatches(&m(vec![vec![1, 2], vec![3]]), &m(vec![vec![1, 2], vec![3]])), 0);
        assert_eq!(mismatches(&m(vec![vec![1, 2], vec![3]]), &m(vec![vec![1, 3], vec![3]])), 1);
        assert_eq!(mismatches(&m(vec![vec![1, 2], vec![3]]), &m(vec![vec![1, 2]])), 1);
    }
}
