//! The batch-invariance matrix: the situations in which a request must get
//! the same token ids and logprob bits as when it runs alone (README, "Batch
//! invariance"), run on any device and model. The CPU tests run it on a
//! tiny model, `tessera gpu-check --only invariance` on the real one.
//!
//! Every case runs the target requests in a fresh engine ([`Setup`]) under
//! one disturbance and compares their completions with the targets run one
//! at a time in the default setup:
//!
//! - batched with 1, 7 and 63 random other requests (prompts of 1 to 60
//!   tokens, 1 to 16 new tokens, greedy or sampled with their own seeds);
//! - chunked-prefill budgets (with 7 others, so chunks mix prefill and
//!   decode rows);
//! - the prefix cache warm (the targets again in the same engine);
//! - preemption and recompute (too few KV blocks);
//! - prompt-lookup speculation at k = 1..4, alone and batched, and a draft
//!   model (the target's first layers);
//! - CUDA graphs off (where the default replays them).

use super::{Engine, Request};
use crate::error::Result;
use crate::gguf::Gguf;
use crate::model::ActElem;
use crate::model::sampler::SamplingParams;
use crate::model::{Device, GraphMode, KvCacheDtype, Model, Weights};
use crate::scheduler::SchedulerConfig;
use crate::spec::SpecConfig;
use crate::spec::draft::{DraftModel, truncate_layers};

/// An engine's settings for one case.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// Token budget of a step (chunked prefill beyond it).
    pub budget: usize,
    /// KV blocks of 16 tokens.
    pub num_blocks: usize,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Longest sequence.
    pub max_model_len: usize,
    /// The batch-invariant arrangement.
    pub invariant: bool,
    /// How decode steps launch.
    pub graphs: GraphMode,
    /// What the KV cache stores.
    pub kv_cache: KvCacheDtype,
}

impl Setup {
    /// Room for 64 sequences of `max_model_len` tokens, the largest budget.
    pub fn roomy(max_model_len: usize) -> Setup {
        Setup {
            budget: 2048,
            num_blocks: 64 * max_model_len.div_ceil(16),
            max_num_seqs: 64,
            max_model_len,
            invariant: true,
            graphs: GraphMode::Graphs,
            kv_cache: KvCacheDtype::Auto,
        }
    }
}

/// An engine over `gguf` in dtype `T` with the settings `s`.
pub fn engine<D: Device, T: ActElem>(dev: &mut D, gguf: &Gguf, s: Setup) -> Result<Engine<D, T>> {
    let weights = Weights::<D, T>::load(dev, gguf)?;
    let mut model = Model::with_kv_cache(dev, weights, s.num_blocks, 16, s.kv_cache)?;
    model.set_batch_invariance(s.invariant);
    model.set_graph_mode(s.graphs);
    let config = SchedulerConfig {
        max_num_batched_tokens: s.budget,
        max_num_seqs: s.max_num_seqs,
        max_model_len: s.max_model_len,
        num_blocks: s.num_blocks,
        block_size: 16,
        enable_prefix_caching: true,
    };
    Engine::new(model, config)
}

/// A request's output: its token ids and the bits of their logprobs.
pub type Output = (Vec<u32>, Vec<u32>);

/// `n` random requests (seeded by `seed`): prompts of 1 to 60 ids in
/// `3..vocab`, 1 to 16 new tokens, greedy or sampled with their own seeds.
pub fn others(n: usize, seed: u64, vocab: usize) -> Vec<Request> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let span = vocab.saturating_sub(3).max(1) as u64;
    (0..n)
        .map(|_| {
            let len = 1 + next(60) as usize;
            let prompt = (0..len).map(|_| 3 + next(span) as u32).collect();
            let params = if next(2) == 0 {
                SamplingParams::default()
            } else {
                SamplingParams { temperature: 0.7, seed: next(1 << 40), ..Default::default() }
            };
            Request::new(prompt, params, 1 + next(16) as usize)
        })
        .collect()
}

/// Runs `targets` in `e` together with `extra` (the targets placed from
/// index `at` among them) and returns the targets' outputs.
pub fn run_with<D: Device, T: ActElem>(
    dev: &mut D,
    e: &mut Engine<D, T>,
    targets: &[Request],
    extra: Vec<Request>,
    at: usize,
) -> Result<Vec<Output>> {
    let mut reqs = extra;
    let at = at.min(reqs.len());
    for (i, r) in targets.iter().enumerate() {
        reqs.insert(at + i, r.clone());
    }
    let done = e.run(dev, reqs, |_| {})?;
    Ok(done[at..at + targets.len()]
        .iter()
        .map(|c| (c.tokens.clone(), c.logprobs.iter().map(|l| l.to_bits()).collect()))
        .collect())
}

/// One case's result: its name, the targets whose outputs differ from the
/// baseline (index, first differing token position), and a note.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// What the case did.
    pub name: String,
    /// Per differing target: its index and the first position whose token
    /// or logprob bits differ.
    pub differ: Vec<(usize, usize)>,
    /// A fact the case relies on that did not hold (e.g. no preemption
    /// happened), which fails the case too.
    pub missing: Option<String>,
}

impl CaseResult {
    /// Whether every target matched and the case exercised what it names.
    pub fn pass(&self) -> bool {
        self.differ.is_empty() && self.missing.is_none()
    }
}

/// The first position where `a` and `b` differ (tokens or logprob bits).
fn first_difference(a: &Output, b: &Output) -> Option<usize> {
    let n = a.0.len().max(b.0.len());
    (0..n).find(|&i| a.0.get(i) != b.0.get(i) || a.1.get(i) != b.1.get(i))
}

/// Which parts of the matrix to run.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// Numbers of random other requests.
    pub others: Vec<usize>,
    /// Chunked-prefill budgets.
    pub budgets: Vec<usize>,
    /// Prompt-lookup `k`s.
    pub ngram: Vec<usize>,
    /// A draft model of this many of the target's layers (none: skip).
    pub draft_layers: Option<usize>,
    /// Also run with CUDA graphs off (devices that replay graphs).
    pub graphs_off: bool,
}

impl Default for Matrix {
    fn default() -> Self {
        Matrix {
            others: vec![1, 7, 63],
            budgets: vec![16, 64, 2048],
            ngram: vec![1, 2, 3, 4],
            draft_layers: Some(1),
            graphs_off: true,
        }
    }
}

/// What a matrix case failed to exercise (`what`), unless it did (`done`).
fn missing_unless(done: bool, what: &str) -> Option<String> {
    (!done).then(|| what.into())
}

/// Runs the matrix for `targets` on `gguf` (see the module doc) and returns
/// one result per case; `base` sizes the engines. The baseline is each
/// target alone in a fresh engine of `base`.
pub fn run_matrix<D: Device, T: ActElem>(
    dev: &mut D,
    gguf: &Gguf,
    targets: &[Request],
    base: Setup,
    m: &Matrix,
) -> Result<Vec<CaseResult>>
where
    DraftModel<D, T>: Send + 'static,
{
    let vocab = crate::gguf::LlamaConfig::from_metadata(gguf.metadata())?.vocab_size;
    let mut want = Vec::new();
    for t in targets {
        let mut e = engine::<D, T>(dev, gguf, base)?;
        want.extend(run_with(dev, &mut e, std::slice::from_ref(t), Vec::new(), 0)?);
    }
    let mut out = Vec::new();
    let mut case = |name: String, got: Vec<Output>, missing: Option<String>| {
        let differ = want
            .iter()
            .zip(&got)
            .enumerate()
            .filter_map(|(i, (w, g))| first_difference(w, g).map(|p| (i, p)))
            .collect();
        out.push(CaseResult { name, differ, missing });
    };

    for &n in &m.others {
        let mut e = engine::<D, T>(dev, gguf, base)?;
        // Targets after the only other, in the middle of 7, after 63.
        let at = if n < 16 { n.div_ceil(2) } else { n };
        case(
            format!("batched with {n} others"),
            run_with(dev, &mut e, targets, others(n, n as u64, vocab), at)?,
            None,
        );
    }
    for &budget in &m.budgets {
        let s = Setup { budget, max_num_seqs: base.max_num_seqs.min(budget), ..base };
        let mut e = engine::<D, T>(dev, gguf, s)?;
        let got = run_with(dev, &mut e, targets, others(7, 100 + budget as u64, vocab), 2)?;
        case(format!("chunked prefill, budget {budget}, 7 others"), got, None);
    }
    {
        let mut e = engine::<D, T>(dev, gguf, base)?;
        run_with(dev, &mut e, targets, Vec::new(), 0)?;
        let before = e.scheduler().kv_stats().hit_rate();
        let got = run_with(dev, &mut e, targets, others(3, 9, vocab), 1)?;
        let hit = e.scheduler().kv_stats().hit_rate() > before;
        case("prefix cache warm, 3 others".into(), got, missing_unless(hit, "no prefix-cache hit"));
    }
    {
        // Blocks for the targets' whole length plus a few: the 15 others
        // cannot all fit at once.
        let longest = targets.iter().map(|t| t.prompt.len() + t.max_tokens).max().unwrap_or(1);
        let blocks = targets.len() * longest.div_ceil(16) + 4;
        let s = Setup { num_blocks: blocks, ..base };
        let mut e = engine::<D, T>(dev, gguf, s)?;
        let got = run_with(dev, &mut e, targets, others(15, 77, vocab), 4)?;
        let preempted = e.stats().preemptions > 0;
        case(
            format!("preemption ({blocks} KV blocks), 15 others"),
            got,
            missing_unless(preempted, "no preemption"),
        );
    }
    for &k in &m.ngram {
        let mut e = engine::<D, T>(dev, gguf, base)?;
        e.set_speculation(Some(SpecConfig::ngram(k)))?;
        let alone = run_with(dev, &mut e, targets, Vec::new(), 0)?;
        let proposed = e.spec_stats().proposed > 0;
        case(format!("prompt lookup k={k}"), alone, missing_unless(proposed, "nothing was proposed"));
        let got = run_with(dev, &mut e, targets, others(7, k as u64, vocab), 5)?;
        case(format!("prompt lookup k={k}, 7 others"), got, None);
    }
    if let Some(layers) = m.draft_layers {
        let draft = Gguf::from_bytes(truncate_layers(gguf, layers)?)?;
        let mut e = engine::<D, T>(dev, gguf, base)?;
        let d = DraftModel::new(engine::<D, T>(dev, &draft, base)?)?;
        e.set_drafter(3, Box::new(d))?;
        let got = run_with(dev, &mut e, targets, others(7, 5, vocab), 0)?;
        let proposed = e.spec_stats().proposed > 0;
        let missing = missing_unless(proposed, "nothing was proposed");
        case(format!("draft model ({layers} layers, k=3), 7 others"), got, missing);
    }
    if m.graphs_off && dev.supports_graphs() {
        let s = Setup { graphs: GraphMode::Off, ..base };
        let mut e = engine::<D, T>(dev, gguf, s)?;
        case(
            "CUDA graphs off, 7 others".into(),
            run_with(dev, &mut e, targets, others(7, 11, vocab), 3)?,
            None,
        );
    }
    Ok(out)
}
