//! The batch-invariance matrix ([`super::invariance`]) on a tiny random
//! Llama and the CPU interpreter (f32, the CPU's default dtype), for a
//! greedy and a seeded sampled request, plus a control: the fast
//! arrangement fails it, so the matrix is able to fail.

use super::invariance::{CaseResult, Matrix, Setup, engine, others, run_matrix, run_with};
use super::*;
use crate::check::model::tiny_flat_model;
use dsl_core::interp::Cpu;

/// The two requests under test: a greedy one and a seeded sampled one, with
/// prompts of 37 and 21 tokens (a repeating pattern, so prompt lookup finds
/// drafts).
fn targets() -> Vec<Request> {
    let prompt = |n: u32, salt: u32| (0..n).map(|j| ((j % 7) * 29 + salt) % 240 + 3).collect::<Vec<u32>>();
    let sampled =
        SamplingParams { temperature: 0.9, top_p: 0.9, top_k: 50, seed: 1234, ..Default::default() };
    vec![Request::greedy(prompt(37, 5), 14), Request::new(prompt(21, 11), sampled, 14)]
}

/// Asserts that every case of the matrix run `what` passed.
fn assert_all_pass(what: &str, results: &[CaseResult]) {
    for r in results {
        assert!(r.pass(), "{what}: {r:?}");
    }
}

#[test]
fn a_request_gets_the_same_tokens_and_logprobs_whatever_runs_with_it() {
    let mut cpu = Cpu::new();
    let gguf = tiny_flat_model().unwrap();
    let base = Setup::roomy(128);
    // The distributions are spread (logprobs well below 0) and the sampled
    // target draws varied tokens: logprob bits show every difference.
    let mut e = engine::<Cpu, f32>(&mut cpu, &gguf, base).unwrap();
    let alone = run_with(&mut cpu, &mut e, &targets(), Vec::new(), 0).unwrap();
    for (t, l) in &alone {
        assert_eq!(t.len(), 14);
        assert!(l.iter().all(|&b| f32::from_bits(b) < -0.01), "{t:?} {l:?}");
    }
    assert!(alone[1].0.iter().collect::<std::collections::HashSet<_>>().len() > 3, "{:?}", alone[1].0);
    let results = run_matrix::<Cpu, f32>(&mut cpu, &gguf, &targets(), base, &Matrix::default()).unwrap();
    assert!(results.len() >= 17, "{results:?}");
    assert_all_pass("the full matrix", &results);
}

/// The matrix on the native CPU backend, whose products are the CPU GEMV at
/// every batch size.
#[test]
fn the_native_backend_keeps_the_guarantee() {
    let mut host = codegen::host::Host::new();
    let gguf = tiny_flat_model().unwrap();
    let results = run_matrix::<codegen::host::Host, f32>(
        &mut host,
        &gguf,
        &targets(),
        Setup::roomy(128),
        &Matrix::default(),
    )
    .unwrap();
    assert!(results.len() >= 17, "{results:?}");
    assert_all_pass("the full matrix", &results);
}

/// The matrix on the native CPU backend for each architecture variant
/// (`check::model::tiny_arch_models`: QKV bias, NEOX RoPE, Q/K head norm,
/// RoPE factors): the options are per-token arithmetic, so the guarantee
/// holds for them too.
#[test]
fn the_native_backend_keeps_the_guarantee_on_every_architecture() {
    let mut host = codegen::host::Host::new();
    let m = Matrix { budgets: vec![64], ngram: vec![3], draft_layers: None, ..Matrix::default() };
    for (name, gguf) in crate::check::model::tiny_arch_models(0.03).unwrap() {
        let results =
            run_matrix::<codegen::host::Host, f32>(&mut host, &gguf, &targets(), Setup::roomy(128), &m)
                .unwrap();
        assert!(!results.is_empty(), "{name}");
        assert_all_pass(name, &results);
    }
}

/// The matrix with decode steps padded to their graph bucket (the launches a
/// CUDA graph replays, run directly): padding rows change nothing either.
#[test]
fn padded_decode_steps_keep_the_guarantee() {
    let mut cpu = Cpu::new();
    let gguf = tiny_flat_model().unwrap();
    let base = Setup { graphs: crate::model::GraphMode::Padded, ..Setup::roomy(128) };
    let m = Matrix { budgets: vec![64], ngram: vec![3], draft_layers: Some(1), ..Matrix::default() };
    let results = run_matrix::<Cpu, f32>(&mut cpu, &gguf, &targets(), base, &m).unwrap();
    assert_all_pass("padded decode steps", &results);
}

/// The control: the fast arrangement's rows do depend on the batch (small
/// decode batches run the FMA GEMVs on f32 operands, large ones the GEMM on
/// f16 operands), so the matrix above is able to fail.
#[test]
fn without_batch_invariance_batching_changes_the_logprobs() {
    let mut cpu = Cpu::new();
    let gguf = tiny_flat_model().unwrap();
    let fast = Setup { invariant: false, ..Setup::roomy(128) };
    let mut want = Vec::new();
    for t in targets() {
        let mut e = engine::<Cpu, f32>(&mut cpu, &gguf, fast).unwrap();
        want.extend(run_with(&mut cpu, &mut e, &[t], Vec::new(), 0).unwrap());
    }
    let mut e = engine::<Cpu, f32>(&mut cpu, &gguf, fast).unwrap();
    let vocab = e.model().weights.config.vocab_size;
    let got = run_with(&mut cpu, &mut e, &targets(), others(63, 3, vocab), 3).unwrap();
    assert!(want.iter().zip(&got).any(|(w, g)| w.1 != g.1), "the fast path happened to be batch-invariant");
}

/// The matrix with an FP8 KV cache: its readers form the same values in
/// every kernel (prefill, decode, any batch), so the guarantee holds as with
/// the 16-bit cache; and the cache really is FP8 (the tokens' logprobs
/// differ from the f32 cache's).
#[test]
fn an_fp8_kv_cache_keeps_the_guarantee() {
    let mut cpu = Cpu::new();
    let gguf = tiny_flat_model().unwrap();
    let base = Setup { kv_cache: crate::model::KvCacheDtype::Fp8, ..Setup::roomy(128) };
    let results = run_matrix::<Cpu, f32>(&mut cpu, &gguf, &targets(), base, &Matrix::default()).unwrap();
    assert!(results.len() >= 17, "{results:?}");
    assert_all_pass("the matrix with an FP8 KV cache", &results);
    let mut e8 = engine::<Cpu, f32>(&mut cpu, &gguf, base).unwrap();
    let fp8 = run_with(&mut cpu, &mut e8, &targets(), Vec::new(), 0).unwrap();
    let mut e = engine::<Cpu, f32>(&mut cpu, &gguf, Setup::roomy(128)).unwrap();
    let plain = run_with(&mut cpu, &mut e, &targets(), Vec::new(), 0).unwrap();
    assert_ne!(fp8[0].1, plain[0].1, "the FP8 cache left the greedy request's logprobs unchanged");
}
