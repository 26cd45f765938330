//! `tessera gpu-check --only megakernel`: the persistent decode step
//! ([`crate::model::mega`]) against the multi-kernel batch-invariant step
//! on the GPU. Every row passes only when token ids, logprob bits and logit
//! bits are identical and the persistent kernel ran for every decode step.
//!
//! - the tiny model (2 layers, f32 and bf16), as written and with its down
//!   matrices in Q4_K and Q6_K by layer: a decode scenario of 1 to 6 rows
//!   (greedy and seeded sampling with penalties), eager and in CUDA graphs;
//!   and with every row greedy, which the persistent kernel samples itself
//!   (those rows pass only if it sampled every decode step);
//! - a SmolLM2-shaped model (random weights of the real shapes: 30 layers,
//!   9/3 heads of 64, FFN 1536, Q4_1 projections, the Q8_0 head) in bf16:
//!   the same scenario over contexts that cross several key blocks, over
//!   contexts long enough that the persistent step splits the attention
//!   into a task per key block, and (eager) with llama.cpp's Q4_K_M types,
//!   which pick the down matrices' format per layer.
//!
//! `megakernel_small` runs the tiny model's rows alone, eager, over four
//! decode steps (greedy rows among them), and the tiny model at contexts where the attention splits
//! by key block: the family `compute-sanitizer --tool racecheck` finishes
//! (the SmolLM2-shaped rows take it longer than a device call).

use crate::check::CheckRow;
use crate::check::model::{
    Scenario, compare_exact, decode_scenario, scenario_params, tiny_down_by_layer_model, tiny_llama,
    tiny_model,
};
use crate::cuda::Cuda;
use crate::error::Result;
use crate::gguf::Gguf;
use crate::gguf::tiny::{TinyLlama, q4_k_m_types, synth_shape};
use crate::model::ActElem;
use crate::model::GraphMode;
use crate::model::attention::invariant_decode_shape;
use crate::model::mega::DecodePath;
use crate::model::sampler::SamplingParams;
use dsl_core::half::bf16;
use kernels::decode_step::ATT_SPLIT_BLOCKS;

/// One comparison of the scenario `sc` on `gguf` in `T`, graph mode `mode`.
fn compare<T: ActElem>(
    cuda: &mut Cuda,
    gguf: &Gguf,
    what: &str,
    mode: GraphMode,
    sc: &Scenario,
) -> Result<CheckRow> {
    compare_with::<T>(cuda, gguf, what, mode, sc, &scenario_params())
}

/// [`compare`] with every row greedy: the persistent kernel must sample
/// every decode step itself.
fn compare_greedy<T: ActElem>(
    cuda: &mut Cuda,
    gguf: &Gguf,
    what: &str,
    mode: GraphMode,
    sc: &Scenario,
) -> Result<CheckRow> {
    let what = format!("{what}, greedy rows");
    compare_with::<T>(cuda, gguf, &what, mode, sc, &[SamplingParams::default()])
}

/// [`compare`] with the rows' settings `params`; where all are greedy the
/// persistent kernel must have sampled every decode step.
fn compare_with<T: ActElem>(
    cuda: &mut Cuda,
    gguf: &Gguf,
    what: &str,
    mode: GraphMode,
    sc: &Scenario,
    params: &[SamplingParams],
) -> Result<CheckRow> {
    let multi = Scenario { decode_path: DecodePath::Graphs, ..sc.clone() };
    let mega = Scenario { decode_path: DecodePath::Mega, ..sc.clone() };
    let (a, ma) = decode_scenario::<Cuda, T>(cuda, gguf, mode, &multi, params)?;
    let (b, mb) = decode_scenario::<Cuda, T>(cuda, gguf, mode, &mega, params)?;
    let (ids, logits, max_abs) = compare_exact(&a, &b);
    let steps = sc.batches.len();
    let ran = (ma.mega_steps(), mb.mega_steps());
    let sampled = mb.mega_sampled_steps();
    let all_greedy = params.iter().all(SamplingParams::is_greedy);
    let compared: usize = a.iter().map(|s| s.logits.len()).sum();
    Ok(CheckRow {
        kernel: "megakernel".into(),
        shape: format!(
            "{what} {mode:?}: {steps} decode steps of {:?} rows, persistent {} of {steps}, sampled in \
             it {sampled}: {ids} ids/logprobs and {logits} of {compared} logits differ (max {max_abs:.2e})",
            sc.batches, ran.1
        ),
        dtype: T::DEVICE_DTYPE,
        max_abs,
        max_rel: 0.0,
        pass: ids == 0
            && logits == 0
            && ran == (0, steps)
            && compared > 0
            && ma.mega_sampled_steps() == 0
            && (!all_greedy || sampled == steps),
    })
}

/// The family's rows (see the module doc).
pub fn mega_checks(cuda: &mut Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let sc = tiny_scenario();
    let mut rows = tiny_rows(cuda, &[GraphMode::Off, GraphMode::Graphs], &sc)?;
    let config = synth_shape("smollm2-135m")
        .ok_or_else(|| crate::error::Error::Usage("internal error: no smollm2-135m shape".into()))?;
    let t = TinyLlama { config, seed: 7, embedding_scale: 0.05, ..TinyLlama::default() };
    let smol = Gguf::from_bytes(t.to_bytes()?)?;
    let long = Scenario { seqs: 4, prompt: 150, batches: vec![1, 4, 2, 1, 3, 4, 1], ..sc.clone() };
    for mode in [GraphMode::Off, GraphMode::Graphs] {
        rows.push(compare::<bf16>(cuda, &smol, "smollm2-shaped", mode, &long)?);
        rows.push(compare_greedy::<bf16>(cuda, &smol, "smollm2-shaped", mode, &long)?);
    }
    // Contexts of 5 to 7 key blocks: the attention split into a task per
    // block, folded by the last.
    let split = Scenario { seqs: 3, prompt: 600, batches: vec![1, 3, 2, 1, 3], ..sc };
    for mode in [GraphMode::Off, GraphMode::Graphs] {
        rows.push(compare::<bf16>(cuda, &smol, "smollm2-shaped, split attention", mode, &split)?);
    }
    let k_mix = q4_k_m_types(&t.config, false);
    let smol_k = Gguf::from_bytes(t.with_mix(k_mix).to_bytes()?)?;
    let what = "smollm2-shaped, llama.cpp's Q4_K_M types (down in Q4_K or Q6_K by layer)";
    rows.push(compare::<bf16>(cuda, &smol_k, what, GraphMode::Off, &long)?);
    Ok(rows)
}

/// `megakernel_small`: the tiny model's rows, eager only, over four decode
/// steps, and ([`split_row`]) over three steps at contexts where the
/// persistent step splits the attention into a task per key block and the
/// last block's task folds them: short enough to run under
/// `compute-sanitizer --tool racecheck`.
pub fn mega_small_checks(cuda: &mut Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let sc = Scenario { seqs: 3, batches: vec![1, 3, 2, 1], ..tiny_scenario() };
    let mut rows = tiny_rows(cuda, &[GraphMode::Off], &sc)?;
    rows.push(split_row::<f32>(cuda)?);
    rows.push(split_row::<bf16>(cuda)?);
    Ok(rows)
}

/// The tiny model in `T` over three decode steps whose shortest context
/// reaches [`ATT_SPLIT_BLOCKS`] key blocks of the invariant decode tile
/// this device runs for `T` (the prompt sized from that tile, the model's
/// context from the prompt), eager.
fn split_row<T: ActElem>(cuda: &mut Cuda) -> Result<CheckRow> {
    let mut t = tiny_llama();
    let c = &t.config;
    // The scenario's KV pages hold 16 tokens.
    let (block_n, _, _) =
        invariant_decode_shape(T::DEVICE_DTYPE, cuda.wgmma(), c.n_head / c.n_head_kv, c.head_dim, 16);
    let prompt = (ATT_SPLIT_BLOCKS - 1) * block_n + 16;
    t.config.context_length = (prompt + 64).next_multiple_of(64);
    let long = Gguf::from_bytes(t.to_bytes()?)?;
    let split = Scenario { seqs: 2, prompt, batches: vec![1, 2, 1], ..tiny_scenario() };
    compare::<T>(cuda, &long, "tiny, split attention", GraphMode::Off, &split)
}

/// The tiny model's scenario: decode batches of 1 to 6 rows.
fn tiny_scenario() -> Scenario {
    Scenario {
        seqs: 6,
        prompt: 10,
        batches: vec![1, 3, 3, 2, 5, 1, 6, 2, 4, 1, 6, 6],
        split: None,
        invariant: true,
        decode_path: DecodePath::Graphs,
    }
}

/// The tiny model's rows (f32 and bf16) of scenario `sc` in each of
/// `modes`, as written and with its down matrices in Q4_K and Q6_K by layer.
fn tiny_rows(cuda: &mut Cuda, modes: &[GraphMode], sc: &Scenario) -> Result<Vec<CheckRow>> {
    let models = [("tiny", tiny_model()?), ("tiny, down Q4_K/Q6_K by layer", tiny_down_by_layer_model()?)];
    let mut rows = Vec::new();
    for (what, g) in &models {
        for &mode in modes {
            rows.push(compare::<f32>(cuda, g, what, mode, sc)?);
            rows.push(compare::<bf16>(cuda, g, what, mode, sc)?);
        }
    }
    for &mode in modes {
        rows.push(compare_greedy::<f32>(cuda, &models[0].1, models[0].0, mode, sc)?);
        rows.push(compare_greedy::<bf16>(cuda, &models[0].1, models[0].0, mode, sc)?);
    }
    Ok(rows)
}
