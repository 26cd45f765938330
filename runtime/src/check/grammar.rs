//! `tessera gpu-check --only grammar`: structured output on the device.
//!
//! - `apply_token_mask`: the kernel on the device against the interpreter on
//!   random logits (49152 and a ragged 1001-token vocabulary with a wider
//!   stride, some rows unmasked, all-clear, all-set and random words);
//!   bit-exact, and unmasked rows untouched.
//! - `grammar_generate`: the tiny model on the device (f32 and bf16) runs a
//!   batch of regex-constrained and unconstrained requests: every
//!   constrained output matches its regex and ends with the stop token, the
//!   unconstrained requests equal their runs alone bit for bit (tokens and
//!   logprobs), and the batch gives the same tokens with CUDA graphs and
//!   without.

use super::{CheckRow, DevicePtr, Rng};
use crate::cuda::Cuda;
use crate::engine::{Completion, Engine, Request};
use crate::error::Result;
use crate::gguf::tiny::{tiny_vocab, tiny_vocab_min_size};
use crate::grammar::{GrammarCompiler, GrammarSpec};
use crate::model::sampler::SamplingParams;
use crate::model::{ActElem, Device, GraphMode, Model, Weights};
use crate::scheduler::{FinishReason, SchedulerConfig};
use crate::tokenizer::Tokenizer;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::sampling::apply_token_mask as atm;
use std::marker::PhantomData;

/// The logits after `apply_token_mask` over `rows` with `bits` on `dev`.
fn mask_on<D: Device>(
    dev: &mut D,
    x: &[f32],
    rows: &[i32],
    bits: &[i32],
    vocab: usize,
    stride: usize,
) -> Result<Vec<f32>> {
    let block = 1024;
    let (xd, rd, bd) = (dev.upload(x)?, dev.upload(rows)?, dev.upload(bits)?);
    let args = atm::Args {
        logits_ptr: dev.ptr(&xd)?,
        rows_ptr: dev.ptr(&rd)?,
        mask_ptr: dev.ptr(&bd)?,
        vocab: vocab as i32,
        stride: stride as i32,
        words: vocab.div_ceil(32) as i32,
        _marker: PhantomData,
    };
    dev.run::<atm::Kernel>(
        [rows.len() as u32, vocab.div_ceil(block) as u32, 1],
        &atm::Config::new(block),
        &args,
    )?;
    dev.download(&xd)
}

/// The kernel check (see the module doc), on any device.
pub fn token_mask<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (n, vocab, stride) in [(9usize, 49152usize, 49152usize), (5, 1001, 1040)] {
        let x: Vec<f32> = (0..n * stride).map(|_| rng.nonzero(8.0) as f32).collect();
        let rows: Vec<i32> = (0..n as i32).rev().filter(|r| r % 3 != 1).collect();
        let words = vocab.div_ceil(32);
        let bits: Vec<i32> = (0..rows.len() * words)
            .map(|i| match (i / words) % 3 {
                0 => rng.next_u64() as i32,
                1 => 0,
                _ => -1,
            })
            .collect();
        let got = mask_on(dev, &x, &rows, &bits, vocab, stride)?;
        let want = mask_on(&mut Cpu::new(), &x, &rows, &bits, vocab, stride)?;
        let mut row =
            CheckRow::passing("apply_token_mask", format!("{n}x{vocab} (stride {stride})"), DType::F32);
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            row.pass &= a.to_bits() == b.to_bits();
            // Unmasked rows are untouched.
            if !rows.contains(&((i / stride) as i32)) {
                row.pass &= a.to_bits() == x[i].to_bits();
            }
        }
        out.push(row);
    }
    Ok(out)
}

/// The regex of the generation check (bounded: outputs must end).
const REGEX: &str = "(ab|ba|[0-9]){2,5}x";

fn engine<T: ActElem>(cuda: &mut Cuda, mode: GraphMode) -> Result<Engine<Cuda, T>> {
    let gguf = crate::check::model::tiny_model()?;
    let weights = Weights::<Cuda, T>::load(cuda, &gguf)?;
    let mut model = Model::new(cuda, weights, 64, 16)?;
    model.set_graph_mode(mode);
    let config = SchedulerConfig {
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        max_model_len: 64,
        num_blocks: 64,
        block_size: 16,
        enable_prefix_caching: true,
    };
    Engine::new(model, config)
}

fn requests(g: &GrammarCompiler, only: Option<usize>) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    for i in 0..6u32 {
        if only.is_some_and(|o| o != i as usize) {
            continue;
        }
        let constraint = if i % 2 == 0 { Some(g.compile(&GrammarSpec::Regex(REGEX.into()))?) } else { None };
        out.push(Request {
            prompt: (0..3 + 7 * i).map(|j| (j * 29 + 13 * i + 5) % 250 + 3).collect(),
            params: SamplingParams { temperature: 0.7, seed: 11 + i as u64, ..SamplingParams::default() },
            max_tokens: 20,
            stop_tokens: vec![2],
            constraint,
        });
    }
    Ok(out)
}

fn generate_case<T: ActElem>(cuda: &mut Cuda) -> Result<Vec<CheckRow>> {
    let tok = Tokenizer::from_vocab(&tiny_vocab(tiny_vocab_min_size())?)?;
    let mut e = engine::<T>(cuda, GraphMode::Graphs)?;
    let g = GrammarCompiler::new(&tok, e.model().weights.config.vocab_size)?;
    let batch = e.run(cuda, requests(&g, None)?, |_| {})?;
    let re_ok = |c: &Completion| {
        let text = tok.decode(&c.tokens, false).unwrap_or_default();
        let t = text.strip_suffix('x').unwrap_or("?");
        c.finish == FinishReason::StopToken(2)
            && !t.is_empty()
            && t.replace("ab", "").replace("ba", "").chars().all(|ch| ch.is_ascii_digit())
    };
    let valid = batch.iter().step_by(2).filter(|c| re_ok(c)).count();
    let dt = T::DEVICE_DTYPE;
    let mut rows = vec![CheckRow {
        pass: valid == 3,
        ..CheckRow::passing("grammar_generate", format!("{valid}/3 constrained outputs match {REGEX}"), dt)
    }];
    let mut same = 0;
    for i in [1usize, 3, 5] {
        let mut alone = engine::<T>(cuda, GraphMode::Graphs)?;
        let a = alone.run(cuda, requests(&g, Some(i))?, |_| {})?;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        same +=
            usize::from(a[0].tokens == batch[i].tokens && bits(&a[0].logprobs) == bits(&batch[i].logprobs));
    }
    rows.push(CheckRow {
        pass: same == 3,
        ..CheckRow::passing(
            "grammar_generate",
            format!("{same}/3 unconstrained rows bitwise equal alone"),
            dt,
        )
    });
    let mut eager = engine::<T>(cuda, GraphMode::Off)?;
    let off = eager.run(cuda, requests(&g, None)?, |_| {})?;
    let equal = off.iter().zip(&batch).filter(|(a, b)| a.tokens == b.tokens).count();
    rows.push(CheckRow {
        pass: equal == batch.len(),
        ..CheckRow::passing("grammar_generate", format!("graphs vs eager: {equal}/{} equal", batch.len()), dt)
    });
    Ok(rows)
}

/// Every grammar check (`tessera gpu-check --only grammar`).
pub fn grammar_checks(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rows = token_mask(cuda, seed)?;
    rows.extend(generate_case::<f32>(cuda)?);
    rows.extend(generate_case::<bf16>(cuda)?);
    Ok(rows)
}
