//! The GPU checks of the model (`tessera gpu-check --only model`), on a tiny
//! random GGUF Llama (head dim 64, GQA 2:1, Q4_1 projections, tied Q8_0
//! head):
//!
//! - `llama_forward` ([`gpu_check`]): the same steps on the GPU and on the CPU
//!   interpreter, in f32 and bf16, logits compared. The steps are a varlen
//!   prefill of two sequences (21 tokens: the GEMM and FlashAttention path)
//!   and two decode steps (GEMV and paged decode, crossing a page boundary
//!   through a non-identity block table).
//! - `model_sampling` ([`sampling_check`]): the [`decode_scenario`] on the
//!   GPU (eager, unpadded); per step, the GPU's greedy ids must equal the
//!   argmax of the GPU's own logits (lowest index on ties) and the ids the
//!   interpreter's sampler draws from those same logits; sampled rows are
//!   compared too and their agreement is reported (they may only differ
//!   where a kernel decision sits within rounding of a cut, see
//!   `check_sampling`; the check passes when at most a quarter differ). The
//!   logits the GPU returns are already penalized, so the interpreter samples
//!   them with the penalties turned off.
//! - `model_graph` ([`graph_check`]): the scenario with CUDA graphs against
//!   the same padded launches run directly ([`GraphMode::Padded`]): sampled
//!   ids, logprobs and logits must be bit-identical, over replays of several
//!   buckets, with and without split-KV, with penalties, in f32 and bf16;
//!   and against unpadded eager steps ([`GraphMode::Off`]): greedy ids equal
//!   wherever the top-2 logit gap exceeds the f32 noise, logits within
//!   `1e-3` of the scale.
//!
//! Tolerance (per logit, relative to the largest |logit| of the case): f32
//! `1e-3` (the GPU's `ex2`/`rsqrt`/`sin`/`cos` approximations through two
//! layers; wiring errors are O(1)); bf16 `1e-2` (both sides round every
//! activation to bf16, and one rounding flip early on moves later values by a
//! few bf16 ulps; on the interpreter, bf16 against f32 logits differ by about
//! `2.5e-3` of the scale).
//!
//! [`model_checks`] runs all three.

use crate::check::{CheckRow, Tol, compare};
use crate::cuda::Cuda;
use crate::error::Result;
use crate::gguf::tiny::{TinyLlama, tiny_vocab_min_size};
use crate::gguf::{Gguf, LlamaConfig};
use crate::model::ActElem;
use crate::model::GraphMode;
use crate::model::mega::DecodePath;
use crate::model::sampler::{SampleRow, Sampled, SamplingParams, sample_logits};
use crate::model::{Device, KvCacheDtype, Model, Step, Weights};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;

/// The tiny model's GGUF: two layers, hidden 128, FFN 256, 2 query heads
/// and 1 KV head of dimension 64, SmolLM2's tensor types.
pub fn tiny_model() -> Result<Gguf> {
    Ok(Gguf::from_bytes(tiny_llama().to_bytes()?)?)
}

/// The description [`tiny_model`] is written from (the end-to-end server
/// test writes it to a file).
pub fn tiny_llama() -> TinyLlama {
    TinyLlama {
        config: LlamaConfig {
            arch: crate::gguf::Arch::LLAMA,
            n_layers: 2,
            n_embd: 128,
            n_ff: 256,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            rope_dim: 64,
            rope_freq_base: 10000.0,
            rope_scaling: crate::gguf::RopeScaling::None,
            rms_norm_eps: 1e-5,
            context_length: 256,
            vocab_size: tiny_vocab_min_size(),
        },
        ..TinyLlama::default()
    }
}

/// [`tiny_model`] with small token embeddings: its outputs are spread over
/// the vocabulary (the default's are near-certain, logprobs 0), so every
/// rounding difference shows in the logprobs (the batch-invariance tests).
pub fn tiny_flat_model() -> Result<Gguf> {
    let config = LlamaConfig::from_metadata(tiny_model()?.metadata())?;
    let t = TinyLlama { config, embedding_scale: 0.03, ..TinyLlama::default() };
    Ok(Gguf::from_bytes(t.to_bytes()?)?)
}

/// [`tiny_llama`] quantized as llama.cpp's mixed types are: V in Q8_0 beside
/// Q4_1 Q and K (the QKV product runs per run of formats) and a tied Q4_1
/// embedding table (repacked, gathered by `embedding_repacked`).
pub fn tiny_mixed_quant_model() -> Result<Gguf> {
    use crate::gguf::GgmlType;
    let t = TinyLlama {
        matrix_types: vec![("attn_v".into(), GgmlType::Q8_0)],
        embedding_type: GgmlType::Q4_1,
        ..tiny_llama()
    };
    Ok(Gguf::from_bytes(t.to_bytes()?)?)
}

/// The bundled SmolLM2 requantized to `quant` (`Q4_K_M`, ...) by `make
/// kquant-models`, or `None`, with a note on stderr, when the file is
/// missing (the tests that need it skip).
#[cfg(test)]
pub fn requantized_model(quant: &str) -> Option<std::path::PathBuf> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../models/SmolLM2-135M-Instruct.{quant}.gguf"));
    let found = path.is_file();
    if !found {
        eprintln!("skipped {quant}: {} is missing (make kquant-models)", path.display());
    }
    found.then_some(path)
}

/// [`tiny_llama`] with matrices in a format per layer, as llama.cpp's
/// Q4_K_M files have them: down in Q4_K (layer 0) and Q6_K (layer 1), and
/// O in Q4_1 and Q8_0 (whose split tiles are twice as tall, so the stage
/// after it waits for fewer tiles in layer 1). The multi-kernel step reads
/// them padded to one stride; the persistent step runs each layer's tasks
/// in its format.
pub fn tiny_down_by_layer_model() -> Result<Gguf> {
    use crate::gguf::GgmlType;
    let t = TinyLlama {
        matrix_types: vec![
            ("blk.0.ffn_down".into(), GgmlType::Q4_K),
            ("blk.1.ffn_down".into(), GgmlType::Q6_K),
            ("blk.1.attn_output".into(), GgmlType::Q8_0),
        ],
        embedding_scale: 0.03,
        ..tiny_llama()
    };
    Ok(Gguf::from_bytes(t.to_bytes()?)?)
}

/// The tiny model ([`tiny_llama`], with `embedding_scale`) in each variant
/// of the forward pass beyond plain Llama: `qwen2` (QKV bias, NEOX RoPE),
/// `qwen3` (Q/K head norm, NEOX RoPE, 4 query heads of 64 on the hidden size
/// of 128, so the Q and O projections are wider than the model) and `llama3`
/// (RoPE frequency factors, `rope_freqs.weight`).
pub fn tiny_arch_models(embedding_scale: f32) -> Result<Vec<(&'static str, Gguf)>> {
    use crate::gguf::Arch;
    use crate::gguf::tiny::llama3_rope_freqs;
    let base = tiny_llama();
    let c = base.config.clone();
    let variants = [
        ("qwen2", LlamaConfig { arch: Arch::QWEN2, ..c.clone() }, None),
        ("qwen3", LlamaConfig { arch: Arch::QWEN3, n_head: 4, ..c.clone() }, None),
        ("llama3", c.clone(), Some(llama3_rope_freqs(c.head_dim, c.rope_freq_base, 8.0, 1.0, 4.0, 16.0))),
    ];
    variants
        .into_iter()
        .map(|(name, config, rope_freqs)| {
            let t = TinyLlama { config, rope_freqs, embedding_scale, ..base.clone() };
            Ok((name, Gguf::from_bytes(t.to_bytes()?)?))
        })
        .collect()
}

/// The two test sequences' tokens (20 and 5) for a vocabulary of `v`.
pub fn scenario_tokens(v: u32) -> (Vec<u32>, Vec<u32>) {
    ((0..20u32).map(|i| (i * 37 + 5) % v).collect(), (0..5u32).map(|i| (i * 11 + 3) % v).collect())
}

/// Block tables of the scenario: A uses blocks `[3, 0]`, B `[1, 2]`.
const TABLES: [i32; 4] = [3, 0, 1, 2];

fn slot(table: &[i32], p: usize) -> i32 {
    table[p / 16] * 16 + (p % 16) as i32
}

/// Runs the scenario on `dev` in dtype `T`: logits of the prefill rows
/// `[17, 20, 0]` (A's last, B's last, A's first) then of both sequences at
/// each of two decode steps, concatenated (`7 x vocab` f32).
pub fn run_scenario<D: Device, T: ActElem>(dev: &mut D, gguf: &Gguf) -> Result<Vec<f32>> {
    let weights = Weights::<D, T>::load(dev, gguf)?;
    let (a, b) = scenario_tokens(weights.config.vocab_size as u32);
    let mut model = Model::new(dev, weights, 4, 16)?;
    let mut positions: Vec<i32> = (0..18).collect();
    positions.extend(0..3);
    let mut slots: Vec<i32> = (0..18).map(|p| slot(&TABLES[0..2], p)).collect();
    slots.extend((0..3).map(|p| slot(&TABLES[2..4], p)));
    let tokens: Vec<u32> = a[..18].iter().chain(&b[..3]).copied().collect();
    let mut out = model.forward(
        dev,
        &Step {
            tokens: &tokens,
            positions: &positions,
            slot_mapping: &slots,
            block_tables: &TABLES,
            max_blocks_per_seq: 2,
            context_lens: &[18, 3],
            query_start: &[0, 18, 21],
            logit_rows: &[17, 20, 0],
        },
    )?;
    for p in [18usize, 19] {
        let pb = p - 15;
        out.extend(model.forward(
            dev,
            &Step {
                tokens: &[a[p], b[pb]],
                positions: &[p as i32, pb as i32],
                slot_mapping: &[slot(&TABLES[0..2], p), slot(&TABLES[2..4], pb)],
                block_tables: &TABLES,
                max_blocks_per_seq: 2,
                context_lens: &[p as i32 + 1, pb as i32 + 1],
                query_start: &[0, 1, 2],
                logit_rows: &[0, 1],
            },
        )?);
    }
    Ok(out)
}

/// Compares `got` with `want` at a tolerance of `rel` times the largest |want|.
pub fn compare_logits(kernel: &str, dtype: DType, got: &[f32], want: &[f32], rel: f64) -> CheckRow {
    let scale = want.iter().map(|v| v.abs() as f64).fold(0.0, f64::max).max(1.0);
    let (got, want): (Vec<f64>, Vec<f64>) =
        (got.iter().map(|&v| v as f64).collect(), want.iter().map(|&v| v as f64).collect());
    compare(
        kernel,
        "tiny llama 2L h128 prefill 21t + 2 decode".into(),
        dtype,
        &got,
        &want,
        Tol { atol: rel * scale, rtol: 0.0 },
    )
}

/// The model check: the scenario on the GPU against the interpreter, f32 and
/// bf16, for the tiny Llama, its [`tiny_arch_models`] variants and
/// [`tiny_mixed_quant_model`] (`_seed`
/// is unused: the model's weights are seeded by the tiny writer).
pub fn gpu_check(cuda: &mut Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let gguf = tiny_model()?;
    let mut cpu = Cpu::new();
    let want = run_scenario::<Cpu, f32>(&mut cpu, &gguf)?;
    let got = run_scenario::<Cuda, f32>(cuda, &gguf)?;
    let mut rows = vec![compare_logits("llama_forward", DType::F32, &got, &want, 1e-3)];
    let want = run_scenario::<Cpu, bf16>(&mut cpu, &gguf)?;
    let got = run_scenario::<Cuda, bf16>(cuda, &gguf)?;
    rows.push(compare_logits("llama_forward", DType::BF16, &got, &want, 1e-2));
    // The other architectures' variants (bias, NEOX, head norm, factors),
    // and mixed quantization types.
    let mixed = ("mixed_quant", tiny_mixed_quant_model()?);
    for (name, gguf) in tiny_arch_models(0.5)?.into_iter().chain([mixed]) {
        let kernel = format!("{name}_forward");
        let want = run_scenario::<Cpu, f32>(&mut cpu, &gguf)?;
        let got = run_scenario::<Cuda, f32>(cuda, &gguf)?;
        rows.push(compare_logits(&kernel, DType::F32, &got, &want, 1e-3));
        let want = run_scenario::<Cpu, bf16>(&mut cpu, &gguf)?;
        let got = run_scenario::<Cuda, bf16>(cuda, &gguf)?;
        rows.push(compare_logits(&kernel, DType::BF16, &got, &want, 1e-2));
    }
    Ok(rows)
}

/// Settings of the scenario rows (row `i` uses entry `i % 6`): greedy,
/// temperature, top-k + top-p, min-p, greedy with repetition and frequency
/// penalties, temperature with presence penalty.
pub fn scenario_params() -> Vec<SamplingParams> {
    let d = SamplingParams::default();
    vec![
        d.clone(),
        SamplingParams { temperature: 1.0, seed: 11, ..d.clone() },
        SamplingParams { temperature: 0.8, top_k: 20, top_p: 0.9, seed: 12, ..d.clone() },
        SamplingParams { temperature: 1.3, min_p: 0.05, seed: 13, ..d.clone() },
        SamplingParams { repetition_penalty: 1.5, frequency_penalty: 0.7, ..d.clone() },
        SamplingParams { temperature: 0.7, presence_penalty: 1.0, seed: 14, ..d },
    ]
}

/// One row of a scenario step: its settings (index into the params) and the
/// request state it was sampled with.
#[derive(Clone, Debug, PartialEq)]
pub struct RowState {
    /// Index into the scenario's params.
    pub params: usize,
    /// The generation step.
    pub step: u32,
    /// Prompt then output tokens.
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
}

impl RowState {
    /// The row as the sampler reads it, with its settings from `params`.
    fn sample_row<'a>(&'a self, params: &'a [SamplingParams]) -> SampleRow<'a> {
        SampleRow {
            params: &params[self.params],
            step: self.step,
            tokens: &self.tokens,
            prompt_len: self.prompt_len,
        }
    }
}

/// One step of [`decode_scenario`]: the rows, what was sampled and the f32
/// logits the sampler read (`[rows, vocab]`).
#[derive(Clone, Debug, PartialEq)]
pub struct SampledStep {
    /// The rows' request states.
    pub rows: Vec<RowState>,
    /// The sampled tokens.
    pub sampled: Vec<Sampled>,
    /// The logits the sampler read.
    pub logits: Vec<f32>,
}

/// A scenario's shape: sequences, prompt lengths, decode batch sizes, the
/// decode split override (see [`Model::set_split_override`]) and the
/// arrangement ([`Model::set_batch_invariance`]).
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Sequences.
    pub seqs: usize,
    /// Prompt length of sequence 0; sequence `i` has `prompt + 2 i` tokens.
    pub prompt: usize,
    /// Per decode step, how many sequences (the first ones) take part.
    pub batches: Vec<usize>,
    /// Fixed decode split length, or `None` for the split plan (split-KV
    /// exists only outside the batch-invariant arrangement).
    pub split: Option<usize>,
    /// The batch-invariant arrangement.
    pub invariant: bool,
    /// Which decode steps run as one persistent kernel.
    pub decode_path: DecodePath,
}

/// The teacher-forced token of sequence `i` at position `pos`.
fn forced(i: usize, pos: usize, vocab: usize) -> u32 {
    ((i * 131 + pos * 17 + 7) % vocab) as u32
}

/// Blocks per sequence in [`decode_scenario`] (16 tokens each), at least:
/// longer scenarios take as many as their longest sequence needs.
const SEQ_PAGES: usize = 4;

/// Runs `sc` on `dev` in dtype `T` with graph mode `mode`: one varlen prefill
/// of all sequences (each samples after its prompt), then the decode steps,
/// every sequence fed its teacher-forced next token (so two runs stay
/// comparable step by step even where their samples differ). Sequence `i`
/// keeps page `p` in block `p * seqs + i` (block size 16) and samples with
/// `params[i % params.len()]`.
pub fn decode_scenario<D: Device, T: ActElem>(
    dev: &mut D,
    gguf: &Gguf,
    mode: GraphMode,
    sc: &Scenario,
    params: &[SamplingParams],
) -> Result<(Vec<SampledStep>, Model<D, T>)> {
    decode_scenario_kv(dev, gguf, mode, sc, params, KvCacheDtype::Auto)
}

/// [`decode_scenario`] with the KV cache in `kv`.
pub fn decode_scenario_kv<D: Device, T: ActElem>(
    dev: &mut D,
    gguf: &Gguf,
    mode: GraphMode,
    sc: &Scenario,
    params: &[SamplingParams],
    kv: KvCacheDtype,
) -> Result<(Vec<SampledStep>, Model<D, T>)> {
    let weights = Weights::<D, T>::load(dev, gguf)?;
    let vocab = weights.config.vocab_size;
    let pages = (sc.prompt + 2 * sc.seqs + sc.batches.len()).div_ceil(16).max(SEQ_PAGES);
    let mut model = Model::with_kv_cache(dev, weights, sc.seqs * pages, 16, kv)?;
    model.set_graph_mode(mode);
    model.set_split_override(sc.split);
    model.set_batch_invariance(sc.invariant);
    model.set_decode_path(sc.decode_path)?;
    let n = sc.seqs;
    let table = |i: usize| -> Vec<i32> { (0..pages).map(|p| (p * n + i) as i32).collect() };
    let slot = |i: usize, pos: usize| table(i)[pos / 16] * 16 + (pos % 16) as i32;
    let mut hist: Vec<Vec<u32>> =
        (0..n).map(|i| (0..sc.prompt + 2 * i).map(|p| forced(i, p, vocab)).collect()).collect();
    let prompt: Vec<usize> = hist.iter().map(Vec::len).collect();
    let row_states = |hist: &[Vec<u32>], k: usize| -> Vec<RowState> {
        (0..k)
            .map(|i| RowState {
                params: i % params.len(),
                step: (hist[i].len() - prompt[i]) as u32,
                tokens: hist[i].clone(),
                prompt_len: prompt[i],
            })
            .collect()
    };
    let mut out = Vec::new();
    let mut run =
        |model: &mut Model<D, T>, dev: &mut D, step: &Step<'_>, states: Vec<RowState>| -> Result<()> {
            let rows: Vec<SampleRow<'_>> = states.iter().map(|r| r.sample_row(params)).collect();
            let sampled = model.forward_sample(dev, step, &rows)?;
            let logits = model.last_logits(dev)?;
            out.push(SampledStep { rows: states, sampled, logits });
            Ok(())
        };

    // The prefill of every prompt.
    let mut tokens = Vec::new();
    let (mut positions, mut slots, mut cu, mut last) = (Vec::new(), Vec::new(), vec![0i32], Vec::new());
    for (i, h) in hist.iter().enumerate() {
        for (p, &t) in h.iter().enumerate() {
            tokens.push(t);
            positions.push(p as i32);
            slots.push(slot(i, p));
        }
        cu.push(tokens.len() as i32);
        last.push(tokens.len() - 1);
    }
    let tables: Vec<i32> = (0..n).flat_map(table).collect();
    let ctx: Vec<i32> = hist.iter().map(|h| h.len() as i32).collect();
    let step = Step {
        tokens: &tokens,
        positions: &positions,
        slot_mapping: &slots,
        block_tables: &tables,
        max_blocks_per_seq: pages,
        context_lens: &ctx,
        query_start: &cu,
        logit_rows: &last,
    };
    run(&mut model, dev, &step, row_states(&hist, n))?;

    for &k in &sc.batches {
        let k = k.min(n);
        let mut tokens = Vec::with_capacity(k);
        let (mut positions, mut slots) = (Vec::with_capacity(k), Vec::with_capacity(k));
        for (i, h) in hist.iter_mut().enumerate().take(k) {
            let p = h.len();
            let t = forced(i, p, vocab);
            h.push(t);
            tokens.push(t);
            positions.push(p as i32);
            slots.push(slot(i, p));
        }
        let ctx: Vec<i32> = hist[..k].iter().map(|h| h.len() as i32).collect();
        let cu: Vec<i32> = (0..=k as i32).collect();
        let rows_idx: Vec<usize> = (0..k).collect();
        let step = Step {
            tokens: &tokens,
            positions: &positions,
            slot_mapping: &slots,
            block_tables: &tables[..k * pages],
            max_blocks_per_seq: pages,
            context_lens: &ctx,
            query_start: &cu,
            logit_rows: &rows_idx,
        };
        run(&mut model, dev, &step, row_states(&hist, k))?;
    }
    Ok((out, model))
}

/// The lowest index of the largest value of `row`, as a token id.
pub fn argmax(row: &[f32]) -> u32 {
    kernels::reference::sampling::argmax(row) as u32
}

/// The gap between the two largest values of `row`.
fn top2_gap(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// The decode scenario of the GPU checks: 6 sequences with prompts of 10 to
/// 20 tokens (contexts cross 16 and 32: new split classes), buckets 1, 4,
/// 2, 8 and replays of each; batch-invariant unless `split` forces the
/// split-KV path.
pub fn check_scenario(split: Option<usize>) -> Scenario {
    Scenario {
        seqs: 6,
        prompt: 10,
        batches: vec![1, 3, 3, 2, 5, 1, 6, 2, 4, 3, 6, 6],
        split,
        invariant: split.is_none(),
        decode_path: DecodePath::Graphs,
    }
}

/// Bit-level comparison of two runs of a scenario: (mismatching ids or
/// logprobs, mismatching logits, max |logit difference|).
pub fn compare_exact(a: &[SampledStep], b: &[SampledStep]) -> (usize, usize, f64) {
    let (mut ids, mut logits, mut max_abs) = (0, 0, 0.0f64);
    if a.len() != b.len() {
        return (usize::MAX, usize::MAX, f64::INFINITY);
    }
    for (x, y) in a.iter().zip(b) {
        ids += x.sampled.len().abs_diff(y.sampled.len());
        ids += x
            .sampled
            .iter()
            .zip(&y.sampled)
            .filter(|(p, q)| p.token != q.token || p.logprob.to_bits() != q.logprob.to_bits())
            .count();
        logits += x.logits.len().abs_diff(y.logits.len());
        for (p, q) in x.logits.iter().zip(&y.logits) {
            if p.to_bits() != q.to_bits() {
                logits += 1;
                max_abs = max_abs.max((p - q).abs() as f64);
            }
        }
    }
    (ids, logits, max_abs)
}

/// Greedy agreement of two runs of a scenario that may round differently:
/// (greedy rows whose ids differ although their top-2 gap exceeds `gap`,
/// max |logit difference| relative to the largest |logit|).
pub fn compare_greedy(
    a: &[SampledStep],
    b: &[SampledStep],
    params: &[SamplingParams],
    vocab: usize,
    gap: f32,
) -> (usize, f64) {
    let (mut bad, mut rel) = (0, 0.0f64);
    if a.len() != b.len() {
        return (usize::MAX, f64::INFINITY);
    }
    for (x, y) in a.iter().zip(b) {
        let scale = x.logits.iter().map(|v| v.abs() as f64).fold(1.0, f64::max);
        if x.logits.len() != y.logits.len() || x.sampled.len() != y.sampled.len() {
            return (usize::MAX, f64::INFINITY);
        }
        for (p, q) in x.logits.iter().zip(&y.logits) {
            rel = rel.max((p - q).abs() as f64 / scale);
        }
        for (i, r) in x.rows.iter().enumerate() {
            let row = &x.logits[i * vocab..(i + 1) * vocab];
            if params[r.params].is_greedy() && top2_gap(row) > gap && x.sampled[i].token != y.sampled[i].token
            {
                bad += 1;
            }
        }
    }
    (bad, rel)
}

fn row(kernel: &str, shape: String, dtype: DType, max_abs: f64, max_rel: f64, pass: bool) -> CheckRow {
    CheckRow { kernel: kernel.into(), shape, dtype, max_abs, max_rel, pass }
}

/// The sampling check (see the module doc) in dtype `T`.
fn sampling_case<T: ActElem>(cuda: &mut Cuda, gguf: &Gguf) -> Result<Vec<CheckRow>> {
    let params = scenario_params();
    let (steps, model) =
        decode_scenario::<Cuda, T>(cuda, gguf, GraphMode::Off, &check_scenario(None), &params)?;
    let vocab = model.weights.config.vocab_size;
    drop(model);
    let mut cpu = Cpu::new();
    // The logits are already penalized: sample them without penalties.
    let unpenalized: Vec<SamplingParams> = params
        .iter()
        .map(|p| SamplingParams {
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ..p.clone()
        })
        .collect();
    let (mut greedy_rows, mut greedy_bad, mut argmax_bad, mut sampled_rows, mut sampled_diff) =
        (0, 0, 0, 0, 0);
    let mut lp_err = 0.0f64;
    for s in &steps {
        let rows: Vec<SampleRow<'_>> = s.rows.iter().map(|r| r.sample_row(&unpenalized)).collect();
        let want = sample_logits(&mut cpu, &s.logits, vocab, &rows)?;
        for (i, r) in s.rows.iter().enumerate() {
            let (g, w) = (s.sampled[i], want[i]);
            lp_err = lp_err.max((g.logprob - w.logprob).abs() as f64);
            if params[r.params].is_greedy() {
                greedy_rows += 1;
                greedy_bad += usize::from(g.token != w.token);
                argmax_bad += usize::from(g.token != argmax(&s.logits[i * vocab..(i + 1) * vocab]));
            } else {
                sampled_rows += 1;
                sampled_diff += usize::from(g.token != w.token);
            }
        }
    }
    let shape = format!(
        "tiny llama {} steps: {greedy_rows} greedy rows ({greedy_bad} differ from the interpreter, {argmax_bad} from \
         the argmax), {sampled_rows} sampled rows ({sampled_diff} differ)",
        steps.len()
    );
    let pass = greedy_rows > 0
        && greedy_bad == 0
        && argmax_bad == 0
        && 4 * sampled_diff <= sampled_rows
        && lp_err < 1e-3;
    Ok(vec![row("model_sampling", shape, T::DEVICE_DTYPE, lp_err, 0.0, pass)])
}

/// The sampling check: GPU sampling inside the step against the
/// interpreter's sampler on the same logits, f32 and bf16.
pub fn sampling_check(cuda: &mut Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let gguf = tiny_model()?;
    let mut rows = sampling_case::<f32>(cuda, &gguf)?;
    rows.extend(sampling_case::<bf16>(cuda, &gguf)?);
    Ok(rows)
}

/// The graph check (see the module doc) in dtype `T`, with split override `split`.
fn graph_case<T: ActElem>(cuda: &mut Cuda, gguf: &Gguf, split: Option<usize>) -> Result<Vec<CheckRow>> {
    let params = scenario_params();
    let sc = check_scenario(split);
    let (graphs, model) = decode_scenario::<Cuda, T>(cuda, gguf, GraphMode::Graphs, &sc, &params)?;
    let keys = model.graph_keys();
    let vocab = model.weights.config.vocab_size;
    drop(model);
    let (padded, _) = decode_scenario::<Cuda, T>(cuda, gguf, GraphMode::Padded, &sc, &params)?;
    let (eager, _) = decode_scenario::<Cuda, T>(cuda, gguf, GraphMode::Off, &sc, &params)?;
    let split_keys = keys.iter().filter(|k| k.splits > 1).count();
    let what = match split {
        Some(l) => format!("split {l}"),
        None => "split plan".into(),
    };
    let (ids, logits, max_abs) = compare_exact(&graphs, &padded);
    let shape = format!(
        "graphs vs padded eager, {what}: {} graphs ({split_keys} split), {ids} id/logprob and {logits} logit mismatches",
        keys.len()
    );
    let exact_pass = !keys.is_empty() && ids == 0 && logits == 0 && (split.is_none() || split_keys > 0);
    let mut out = vec![row("model_graph", shape, T::DEVICE_DTYPE, max_abs, 0.0, exact_pass)];
    let (bad, rel) = compare_greedy(&graphs, &eager, &params, vocab, 1e-3);
    let shape = format!("graphs vs unpadded eager, {what}: {bad} greedy ids differ (top-2 gap > 1e-3)");
    out.push(row("model_graph", shape, T::DEVICE_DTYPE, 0.0, rel, bad == 0 && rel <= 1e-3));
    Ok(out)
}

/// The graph check: CUDA-graph replays against direct launches, with and
/// without split-KV, f32 and bf16.
pub fn graph_check(cuda: &mut Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let gguf = tiny_model()?;
    let mut rows = Vec::new();
    for split in [None, Some(16)] {
        rows.extend(graph_case::<f32>(cuda, &gguf, split)?);
        rows.extend(graph_case::<bf16>(cuda, &gguf, split)?);
    }
    Ok(rows)
}

/// Every model check: the forward, sampling and graphs (`tessera gpu-check
/// --only model`). A failing part becomes a failed row; the others still run.
pub fn model_checks(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
    let parts: [(&str, crate::registry::CheckFn); 3] =
        [("llama_forward", gpu_check), ("model_sampling", sampling_check), ("model_graph", graph_check)];
    let mut rows = Vec::new();
    for (name, check) in parts {
        match check(cuda, seed) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("error: {name}: {e}");
                rows.push(row(name, "(error)".into(), DType::F32, f64::INFINITY, f64::INFINITY, false));
            }
        }
    }
    Ok(rows)
}
