//! Engine tests on the tiny random Llama and the CPU interpreter: batch
//! invariance of greedy output, preemption and prefix-cache hits that do not
//! change results, stop conditions, scoring, and bad requests.

use super::*;
use crate::check::model::tiny_model;
use crate::gguf::Gguf;
use crate::model::{Model, Weights};
use crate::scheduler::SchedulerConfig;
use dsl_core::interp::Cpu;

/// An engine over `gguf` on the interpreter with `num_blocks` blocks of 16
/// tokens, prefix caching and the scheduler limits `(max_num_seqs,
/// max_num_batched_tokens, max_model_len)`: the engine and speculation
/// tests' setup.
pub(crate) fn engine_over(
    cpu: &mut Cpu,
    gguf: &Gguf,
    num_blocks: usize,
    (max_num_seqs, max_num_batched_tokens, max_model_len): (usize, usize, usize),
) -> Engine<Cpu, f32> {
    let weights = Weights::<Cpu, f32>::load(cpu, gguf).unwrap();
    let model = Model::new(cpu, weights, num_blocks, 16).unwrap();
    let config = SchedulerConfig {
        max_num_batched_tokens,
        max_num_seqs,
        max_model_len,
        num_blocks,
        block_size: 16,
        enable_prefix_caching: true,
    };
    Engine::new(model, config).unwrap()
}

/// An engine over the tiny model with `num_blocks` blocks of 16 tokens.
fn engine(cpu: &mut Cpu, num_blocks: usize, max_num_seqs: usize) -> Engine<Cpu, f32> {
    engine_over(cpu, &tiny_model().unwrap(), num_blocks, (max_num_seqs, 64, 64))
}

/// Eight prompts of different lengths (1 to 36 tokens) over the tiny vocabulary.
fn prompts() -> Vec<Vec<u32>> {
    let lens = [5usize, 1, 17, 36, 8, 16, 23, 2];
    lens.iter()
        .enumerate()
        .map(|(i, &n)| (0..n as u32).map(|j| (j * 31 + 7 * i as u32 + 3) % 200).collect())
        .collect()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::greedy(prompt, max_tokens)
}

#[test]
fn greedy_output_is_the_same_at_batch_1_and_batch_8() {
    let mut cpu = Cpu::new();
    let mut e = engine(&mut cpu, 64, 8);
    let alone: Vec<Vec<u32>> = prompts()
        .into_iter()
        .map(|p| e.run(&mut cpu, vec![greedy(p, 12)], |_| {}).unwrap().remove(0).tokens)
        .collect();
    let mut e = engine(&mut cpu, 64, 8);
    let batch = e.run(&mut cpu, prompts().into_iter().map(|p| greedy(p, 12)).collect(), |_| {}).unwrap();
    assert_eq!(batch.len(), 8);
    for (i, (a, b)) in alone.iter().zip(&batch).enumerate() {
        assert_eq!(a.len(), 12);
        assert_eq!(a, &b.tokens, "prompt {i}");
        assert_eq!(b.finish, FinishReason::MaxTokens);
    }
    // The batch really ran together: fewer steps than one request at a time.
    assert!(e.stats().steps < 8 * 12, "{:?}", e.stats());
    assert!(e.stats().decode_tokens > 0 && e.stats().prefill_tokens >= 108);
}

#[test]
fn preemption_and_prefix_hits_do_not_change_the_output() {
    let mut cpu = Cpu::new();
    let mut roomy = engine(&mut cpu, 64, 8);
    let want = roomy.run(&mut cpu, prompts().into_iter().map(|p| greedy(p, 20)).collect(), |_| {}).unwrap();
    // 8 blocks of 16 tokens cannot hold all eight sequences (up to 56 tokens each).
    let mut tight = engine(&mut cpu, 8, 8);
    let got = tight.run(&mut cpu, prompts().into_iter().map(|p| greedy(p, 20)).collect(), |_| {}).unwrap();
    assert!(tight.stats().preemptions > 0, "{:?}", tight.stats());
    assert!(got.iter().any(|c| c.preemptions > 0));
    for (a, b) in want.iter().zip(&got) {
        assert_eq!(a.tokens, b.tokens);
    }
    tight.scheduler().check_invariants().unwrap();
    // The same long prompt again: its full blocks come from the prefix cache.
    let p = prompts()[3].clone();
    let first = roomy.run(&mut cpu, vec![greedy(p.clone(), 6)], |_| {}).unwrap();
    let hits = roomy.scheduler().kv_stats();
    let again = roomy.run(&mut cpu, vec![greedy(p, 6)], |_| {}).unwrap();
    assert!(roomy.scheduler().kv_stats().hit_rate() > hits.hit_rate() || hits.hit_rate() > 0.0);
    assert_eq!(first[0].tokens, again[0].tokens);
}

#[test]
fn stop_tokens_end_requests_and_are_not_output() {
    let mut cpu = Cpu::new();
    let mut e = engine(&mut cpu, 16, 4);
    let free = e.run(&mut cpu, vec![greedy(prompts()[0].clone(), 10)], |_| {}).unwrap().remove(0);
    // Stop at the third generated token.
    let stop = free.tokens[2];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    let mut req = greedy(prompts()[0].clone(), 10);
    req.stop_tokens = vec![stop];
    let mut events = Vec::new();
    let c = e.run(&mut cpu, vec![req], |ev| events.push(*ev)).unwrap().remove(0);
    assert_eq!(c.tokens, free.tokens[..first]);
    assert_eq!(c.finish, FinishReason::StopToken(stop));
    let last = events.last().unwrap();
    assert_eq!((last.token, last.finish), (None, Some(FinishReason::StopToken(stop))));
    assert_eq!(events.len(), first + 1);
    assert_eq!(c.itl.len(), first);
}

#[test]
fn score_matches_generation_and_leaves_the_engine_usable() {
    let mut cpu = Cpu::new();
    let mut e = engine(&mut cpu, 16, 4);
    let p = prompts()[2].clone();
    let c = e.run(&mut cpu, vec![greedy(p.clone(), 8)], |_| {}).unwrap().remove(0);
    let mut all = p.clone();
    all.extend(&c.tokens[..7]);
    let v = e.model().weights.config.vocab_size;
    let logits = e.score(&mut cpu, &all, p.len() - 1..all.len()).unwrap();
    assert_eq!(logits.len(), 8 * v);
    let forced: Vec<u32> = logits.chunks_exact(v).map(crate::check::model::argmax).collect();
    assert_eq!(forced, c.tokens);
    let again = e.run(&mut cpu, vec![greedy(p, 8)], |_| {}).unwrap().remove(0);
    assert_eq!(again.tokens, c.tokens);
}

#[test]
fn bad_requests_are_errors() {
    let mut cpu = Cpu::new();
    let mut e = engine(&mut cpu, 8, 4);
    assert!(e.add(greedy(Vec::new(), 4)).is_err());
    assert!(e.add(greedy(vec![1, 2], 0)).is_err());
    let err = e.add(greedy(vec![1, 1_000_000], 4)).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert!(e.add(greedy(vec![1; 65], 4)).is_err());
    let bad = SamplingParams { temperature: f32::NAN, ..SamplingParams::default() };
    assert!(e.add(Request { params: bad, ..greedy(vec![1], 4) }).is_err());
    assert!(!e.has_unfinished());
    assert!(e.score(&mut cpu, &[1, 2, 3], 3..3).is_err());
    assert!(e.score(&mut cpu, &vec![1; 200], 0..1).is_err());
}

/// The host's phases of a step lie within the step's wall time and a step
/// that samples records the model's (on the interpreter the launches run
/// synchronously, inside `launch`); a failed step leaves them zero.
#[test]
fn a_step_records_where_the_host_time_went() {
    let mut cpu = Cpu::new();
    let mut e = engine(&mut cpu, 16, 4);
    assert_eq!(e.last_step_times(), StepTimes::default());
    e.add(greedy(prompts()[2].clone(), 3)).unwrap();
    // The prefill step, then a decode step.
    for _ in 0..2 {
        let t = Instant::now();
        e.step(&mut cpu).unwrap();
        let wall = t.elapsed();
        let s = e.last_step_times();
        let m = s.model;
        assert!(s.schedule > Duration::ZERO && m.prepare > Duration::ZERO, "{s:?}");
        assert!(m.launch > m.prepare && m.launch > s.accept, "{s:?}");
        assert!(s.schedule + m.prepare + m.launch + m.wait + s.accept <= wall, "{s:?} in {wall:?}");
    }
}
