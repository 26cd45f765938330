//! The GPU check of the whole forward pass: a tiny random GGUF Llama (head
//! dim 64, GQA 2:1, Q4_1 projections, tied Q8_0 head) runs the same steps on
//! the GPU and on the CPU interpreter, in f32 and bf16, and the logits are
//! compared. The steps are a varlen prefill of two sequences (21 tokens: the
//! GEMM and FlashAttention path) and two decode steps (GEMV and paged decode,
//! crossing a page boundary through a non-identity block table).
//!
//! Tolerance (per logit, relative to the largest |logit| of the case): f32
//! `1e-3` (the GPU's `ex2`/`rsqrt`/`sin`/`cos` approximations through two
//! layers; wiring errors are O(1)); bf16 `1e-2` (both sides round every
//! activation to bf16, and one rounding flip early on moves later values by a
//! few bf16 ulps; on the interpreter, bf16 against f32 logits differ by about
//! `2.5e-3` of the scale).
//!
//! Not yet wired into `tessera gpu-check` (the CLI comes with a later issue):
//! call [`gpu_check`] with an open [`Cuda`].

use super::{Device, Model, Step, Weights};
use crate::check::{CheckRow, Sample, Tol, compare};
use crate::cuda::Cuda;
use crate::error::Result;
use crate::gguf::tiny::{TinyLlama, tiny_vocab_min_size};
use crate::gguf::{Gguf, LlamaConfig};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;

/// The tiny model's GGUF: two layers, hidden 128, FFN 256, 2 query heads
/// and 1 KV head of dimension 64, SmolLM2's tensor types.
pub fn tiny_model() -> Result<Gguf> {
    let t = TinyLlama {
        config: LlamaConfig {
            n_layers: 2,
            n_embd: 128,
            n_ff: 256,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            rope_dim: 64,
            rope_freq_base: 10000.0,
            rms_norm_eps: 1e-5,
            context_length: 256,
            vocab_size: tiny_vocab_min_size(),
        },
        ..TinyLlama::default()
    };
    Ok(Gguf::from_bytes(t.to_bytes()?)?)
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
pub fn run_scenario<D: Device, T: Sample>(dev: &mut D, gguf: &Gguf) -> Result<Vec<f32>> {
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
/// bf16 (`_seed` is unused: the model's weights are seeded by the tiny writer).
pub fn gpu_check(cuda: &mut Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let gguf = tiny_model()?;
    let mut cpu = Cpu::new();
    let want = run_scenario::<Cpu, f32>(&mut cpu, &gguf)?;
    let got = run_scenario::<Cuda, f32>(cuda, &gguf)?;
    let mut rows = vec![compare_logits("llama_forward", DType::F32, &got, &want, 1e-3)];
    let want = run_scenario::<Cpu, bf16>(&mut cpu, &gguf)?;
    let got = run_scenario::<Cuda, bf16>(cuda, &gguf)?;
    rows.push(compare_logits("llama_forward", DType::BF16, &got, &want, 1e-2));
    Ok(rows)
}
