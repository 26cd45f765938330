//! Speculative decoding tests on the tiny random Llama and the CPU
//! interpreter: greedy and seeded sampling with speculation reproduce plain
//! decoding token for token (both drafters, batches of mixed lengths), a
//! chi-square test of the verified tokens' distribution against the target's
//! exact conditional distribution, KV rollback at the block level, and stop
//! conditions inside a run of accepted drafts.

use super::draft::{DraftModel, truncate_layers};
use super::ngram::propose_ngram;
use super::*;
use crate::check::model::tiny_model;
use crate::engine::tests::engine_over;
use crate::engine::{Completion, Engine, Request};
use crate::gguf::Gguf;
use crate::model::sampler::SamplingParams;
use crate::scheduler::{FinishReason, Scheduler, SchedulerConfig};
use dsl_core::interp::Cpu;
use std::collections::HashMap;

/// An engine over `gguf` with `num_blocks` blocks of 16 tokens.
fn engine_on(cpu: &mut Cpu, gguf: &Gguf, num_blocks: usize, max_num_seqs: usize) -> Engine<Cpu, f32> {
    engine_over(cpu, gguf, num_blocks, (max_num_seqs, 128, 96))
}

fn engine(cpu: &mut Cpu, num_blocks: usize, max_num_seqs: usize) -> Engine<Cpu, f32> {
    engine_on(cpu, &tiny_model().unwrap(), num_blocks, max_num_seqs)
}

/// Six prompts of mixed lengths (1 to 40 tokens); most repeat a short
/// pattern so prompt lookup has something to find.
fn prompts() -> Vec<Vec<u32>> {
    let lens = [9usize, 1, 23, 40, 4, 17];
    lens.iter()
        .enumerate()
        .map(|(i, &n)| (0..n as u32).map(|j| ((j % (3 + i as u32)) * 37 + 11 * i as u32 + 5) % 250).collect())
        .collect()
}

fn request(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> Request {
    Request::new(prompt, params, max_tokens)
}

fn run_all(
    cpu: &mut Cpu,
    e: &mut Engine<Cpu, f32>,
    params: SamplingParams,
    max_tokens: usize,
) -> Vec<Completion> {
    let reqs = prompts().into_iter().map(|p| request(p, params.clone(), max_tokens)).collect();
    e.run(cpu, reqs, |_| {}).unwrap()
}

/// Checks that every request finished with the same tokens and reason.
fn assert_same(want: &[Completion], got: &[Completion]) {
    assert_eq!(want.len(), got.len());
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}");
        assert_eq!(a.finish, b.finish, "request {i}");
    }
}

/// A drafter that knows the answer: it proposes the continuation of `full`
/// when the history is a prefix of it (so every draft is accepted).
struct Oracle {
    full: Vec<Vec<u32>>,
}

impl Drafter<Cpu> for Oracle {
    fn propose(&mut self, _dev: &mut Cpu, requests: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>> {
        Ok(requests
            .iter()
            .map(|&(h, k)| {
                self.full
                    .iter()
                    .find(|f| f.len() > h.len() && f.starts_with(h))
                    .map(|f| f[h.len()..(h.len() + k).min(f.len())].to_vec())
                    .unwrap_or_default()
            })
            .collect())
    }
}

/// A drafter that always proposes `k` copies of one token.
struct Constant(u32);

impl Drafter<Cpu> for Constant {
    fn propose(&mut self, _dev: &mut Cpu, requests: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>> {
        Ok(requests.iter().map(|&(_, k)| vec![self.0; k]).collect())
    }
}

#[test]
fn ngram_proposes_the_continuation_of_the_latest_longest_match() {
    // A periodic history proposes k tokens, not just the one after the latest match.
    assert_eq!(propose_ngram(&[3, 3, 3, 3, 3, 3], 3, 3, 1), vec![3, 3, 3]);
    assert_eq!(propose_ngram(&[3, 3, 3, 3, 3, 3, 3], 3, 3, 1), vec![3, 3, 3]);
    // Suffix [1, 2] occurs at 0 and 4; the latest one (4) is followed by 9, 1.
    let h = [1, 2, 3, 4, 1, 2, 9, 1, 2];
    assert_eq!(propose_ngram(&h, 2, 3, 1), vec![9, 1]);
    // The 3-gram [7, 1, 2] matches before any shorter n-gram.
    let h = [7, 1, 2, 5, 6, 1, 2, 8, 7, 1, 2];
    assert_eq!(propose_ngram(&h, 3, 3, 1), vec![5, 6, 1]);
    // Proposals stop at the end of the history; no match, no proposal.
    assert_eq!(propose_ngram(&[4, 5, 4], 5, 3, 1), vec![5, 4]);
    assert!(propose_ngram(&[1, 2, 3], 4, 3, 1).is_empty());
    assert!(propose_ngram(&[1, 2, 3, 3], 4, 3, 2).is_empty());
    assert_eq!(accept_len(&[3, 4, 5], &[3, 4, 6, 7]), 2);
    assert_eq!(accept_len(&[3], &[2, 3]), 0);
}

#[test]
fn greedy_with_ngram_speculation_equals_plain_greedy() {
    let mut cpu = Cpu::new();
    let mut plain = engine(&mut cpu, 64, 8);
    let want = run_all(&mut cpu, &mut plain, SamplingParams::default(), 24);
    for k in [1, 4] {
        let mut e = engine(&mut cpu, 64, 8);
        e.set_speculation(Some(SpecConfig::ngram(k))).unwrap();
        let got = run_all(&mut cpu, &mut e, SamplingParams::default(), 24);
        assert_same(&want, &got);
        let st = e.spec_stats();
        eprintln!("k = {k}: {st:?}, acceptance {:.2}", st.acceptance_rate());
        assert!(st.proposed > 0 && st.accepted > 0, "{st:?}");
        assert!(e.stats().steps < plain.stats().steps, "{:?} vs {:?}", e.stats(), plain.stats());
        e.scheduler().check_invariants().unwrap();
        assert_eq!(e.scheduler().kv_stats().used_blocks, 0);
    }
    // A drafter that is mostly wrong exercises rejection and rollback.
    let mut e = engine(&mut cpu, 64, 8);
    e.set_drafter(3, Box::new(Constant(5))).unwrap();
    let got = run_all(&mut cpu, &mut e, SamplingParams::default(), 24);
    assert_same(&want, &got);
    let st = e.spec_stats();
    assert!(st.proposed > 0 && st.accepted < st.proposed, "{st:?}");
    assert_eq!(e.scheduler().kv_stats().used_blocks, 0);
}

#[test]
fn greedy_with_a_draft_model_equals_plain_greedy() {
    let mut cpu = Cpu::new();
    let target = tiny_model().unwrap();
    let draft = Gguf::from_bytes(truncate_layers(&target, 1).unwrap()).unwrap();
    assert_eq!(draft.metadata().require_u32("llama.block_count").unwrap(), 1);
    assert!(draft.tensors().iter().all(|t| !t.name.starts_with("blk.1.")));
    assert!(truncate_layers(&target, 3).is_err() && truncate_layers(&target, 0).is_err());
    let mut plain = engine(&mut cpu, 64, 8);
    let want = run_all(&mut cpu, &mut plain, SamplingParams::default(), 20);
    // The full model as its own draft accepts everything; one layer less than
    // the target accepts some.
    for (gguf, all) in [(&target, true), (&draft, false)] {
        let d = DraftModel::new(engine_on(&mut cpu, gguf, 64, 8)).unwrap();
        let mut e = engine(&mut cpu, 64, 8);
        e.set_drafter(3, Box::new(d)).unwrap();
        let got = run_all(&mut cpu, &mut e, SamplingParams::default(), 20);
        assert_same(&want, &got);
        let st = e.spec_stats();
        eprintln!("draft (all = {all}): {st:?}");
        assert!(st.proposed > 0);
        if all {
            assert_eq!(st.accepted, st.proposed);
        }
        assert_eq!(e.scheduler().kv_stats().used_blocks, 0);
    }
}

#[test]
fn seeded_sampling_with_speculation_reproduces_plain_sampling() {
    let params = SamplingParams { temperature: 0.8, top_k: 20, seed: 7, ..SamplingParams::default() };
    let mut cpu = Cpu::new();
    let mut plain = engine(&mut cpu, 64, 8);
    let want = run_all(&mut cpu, &mut plain, params.clone(), 16);
    let mut e = engine(&mut cpu, 64, 8);
    e.set_speculation(Some(SpecConfig::ngram(3))).unwrap();
    let got = run_all(&mut cpu, &mut e, params, 16);
    assert_same(&want, &got);
    assert!(e.spec_stats().proposed > 0);
}

/// The upper 0.1 % point of the chi-square distribution with `dof` degrees
/// of freedom (Wilson-Hilferty).
fn chi2_critical(dof: usize) -> f64 {
    let d = dof as f64;
    let z = 3.09;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// The chi-square statistic and degrees of freedom of `observed` against
/// `expected` counts, with cells of expected count below 5 pooled into one.
fn chi2(observed: &[f64], expected: &[f64]) -> (f64, usize) {
    let (mut stat, mut cells, mut po, mut pe) = (0.0, 0, 0.0, 0.0);
    for (&o, &e) in observed.iter().zip(expected) {
        if e >= 5.0 {
            stat += (o - e) * (o - e) / e;
            cells += 1;
        } else {
            po += o;
            pe += e;
        }
    }
    if pe > 0.0 {
        stat += (po - pe) * (po - pe) / pe.max(1e-9);
        cells += 1;
    }
    (stat, cells - 1)
}

/// The target distribution after temperature `t` and top-k `k` of `logits`.
fn top_k_probs(logits: &[f32], k: usize, t: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let max = f64::from(logits[order[0]]);
    let mut p = vec![0.0; logits.len()];
    for &i in &order[..k] {
        p[i] = ((f64::from(logits[i]) - max) / t).exp();
    }
    let s: f64 = p.iter().sum();
    p.iter().map(|x| x / s).collect()
}

#[test]
fn chi_square_verified_tokens_follow_the_target_distribution() {
    const N: u64 = 1500;
    const TOP_K: usize = 6;
    let mut cpu = Cpu::new();
    let prompt: Vec<u32> = vec![17, 42, 99, 3, 17, 42];
    let mut e = engine(&mut cpu, 96, 48);
    // The draft is the target's most likely first token, so the verified
    // rows see both acceptances and rejections.
    let first = e.score(&mut cpu, &prompt, prompt.len() - 1..prompt.len()).unwrap();
    let vocab = first.len();
    let guess = top_k_probs(&first, 1, 1.0).iter().position(|&p| p > 0.5).unwrap() as u32;
    // The random model is very peaked: take the first temperature (a power
    // of two) that leaves the most likely token at most 60 %.
    let temp = (0..12)
        .map(|i| f64::from(1u32 << i))
        .find(|&t| top_k_probs(&first, TOP_K, t).iter().all(|&p| p <= 0.6))
        .unwrap();
    eprintln!("temperature {temp}");
    e.set_drafter(2, Box::new(Constant(guess))).unwrap();
    let reqs: Vec<Request> = (0..N)
        .map(|seed| {
            let params = SamplingParams {
                temperature: temp as f32,
                top_k: TOP_K as i32,
                seed,
                ..SamplingParams::default()
            };
            request(prompt.clone(), params, 4)
        })
        .collect();
    let outs = e.run(&mut cpu, reqs, |_| {}).unwrap();
    let st = e.spec_stats();
    eprintln!("{st:?}");
    assert!(st.accepted > 20 && st.accepted + 20 < st.proposed, "{st:?}");
    // Every output position after the first came from a verification row;
    // position t is tested conditionally on the t tokens before it.
    for t in 1..3 {
        let mut contexts: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
        for c in &outs {
            assert_eq!(c.tokens.len(), 4);
            contexts.entry(c.tokens[..t].to_vec()).or_default().push(c.tokens[t]);
        }
        let (mut observed, mut expected, mut wrong) = (Vec::new(), Vec::new(), Vec::new());
        for (ctx, next) in &contexts {
            let mut full = prompt.clone();
            full.extend(ctx);
            let logits = e.score(&mut cpu, &full, full.len() - 1..full.len()).unwrap();
            let p = top_k_probs(&logits, TOP_K, temp);
            let q = top_k_probs(&logits, TOP_K + 2, temp);
            let mut counts = vec![0.0; vocab];
            for &x in next {
                counts[x as usize] += 1.0;
            }
            let n = next.len() as f64;
            for v in 0..vocab {
                if p[v] > 0.0 || q[v] > 0.0 || counts[v] > 0.0 {
                    observed.push(counts[v]);
                    expected.push(n * p[v]);
                    wrong.push(n * q[v]);
                }
            }
        }
        let (stat, dof) = chi2(&observed, &expected);
        eprintln!("position {t}: chi2 = {stat:.1} on {dof} dof (critical {:.1})", chi2_critical(dof));
        assert!(dof >= 5 && stat < chi2_critical(dof), "position {t}: chi2 {stat} on {dof} dof");
        // The test has power: a slightly wrong distribution (top-k + 2) is
        // rejected by the same counts.
        let (bad, bad_dof) = chi2(&observed, &wrong);
        assert!(bad > chi2_critical(bad_dof), "position {t}: the wrong distribution passed ({bad})");
    }
}

#[test]
fn rollback_frees_whole_blocks_and_caches_only_accepted_tokens() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 16,
        max_num_seqs: 2,
        max_model_len: 32,
        num_blocks: 8,
        block_size: 4,
        enable_prefix_caching: true,
    };
    let mut s = Scheduler::new(config).unwrap();
    let id = s.add_request(vec![1, 2, 3, 4, 5]).unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(plan.seqs[0].tokens.len(), 5);
    s.append_token(id, 6).unwrap();
    s.propose(id, &[7, 8, 9, 10, 11, 12]).unwrap();
    assert!(s.propose(id, &[1]).is_err());
    let plan = s.schedule().unwrap();
    // One entry of 1 + 6 tokens at positions 5..12: three blocks in use.
    assert_eq!(plan.seqs[0].tokens, vec![6, 7, 8, 9, 10, 11, 12]);
    assert_eq!(plan.num_decodes, 1);
    assert_eq!(s.block_manager().block_table(id).unwrap().len(), 3);
    let free = s.block_manager().num_available();
    // Two drafts accepted (7, 8): history 1..=8 stays, the third block goes.
    s.rollback(id, 8).unwrap();
    assert_eq!(s.block_manager().num_available(), free + 1);
    assert_eq!(s.block_manager().num_slots(id), Some(8));
    assert_eq!(s.sequence(id).unwrap().tokens(), &[1, 2, 3, 4, 5, 6, 7, 8]);
    s.check_invariants().unwrap();
    s.append_token(id, 50).unwrap();
    s.schedule().unwrap();
    // Only the two blocks of accepted tokens are cached; a prompt of the
    // rejected history finds one cached block (its first four tokens).
    assert_eq!(s.kv_stats().cached_blocks, 2);
    assert_eq!(s.block_manager().find_prefix(&[1, 2, 3, 4, 5, 6, 9, 10, 11]).num_tokens(), 4);
    s.append_token(id, 51).unwrap();
    // Drafts that do not fit the budget are dropped and the sequence decodes
    // one token.
    s.propose(id, &[60; 20]).unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(plan.seqs[0].tokens, vec![51]);
    assert_eq!(s.sequence(id).unwrap().len(), 10);
    assert_eq!(s.sequence(id).unwrap().num_draft(), 0);
    s.check_invariants().unwrap();
    let id2 = s.add_request(vec![1; 3]).unwrap();
    s.append_token(id, 52).unwrap();
    s.propose(id, &[61; 4]).unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(plan.seqs.iter().find(|e| e.seq == id).unwrap().tokens.len(), 5);
    assert!(plan.seqs.iter().any(|e| e.seq == id2));
    // Nothing accepted: back to 11 tokens (the last block, 12..16, goes).
    s.rollback(id, 11).unwrap();
    assert_eq!(s.block_manager().num_slots(id), Some(11));
    s.check_invariants().unwrap();
    s.finish(id, FinishReason::Aborted).unwrap();
    s.finish(id2, FinishReason::Aborted).unwrap();
    assert_eq!(s.kv_stats().used_blocks, 0);
}

#[test]
fn stop_tokens_and_max_tokens_inside_an_accepted_run() {
    let mut cpu = Cpu::new();
    let mut plain = engine(&mut cpu, 64, 8);
    let base = run_all(&mut cpu, &mut plain, SamplingParams::default(), 24);
    let full: Vec<Vec<u32>> = base.iter().map(|c| [c.prompt.clone(), c.tokens.clone()].concat()).collect();
    // Stop at each output's 7th token (its first occurrence ends the request);
    // cap at 11 tokens otherwise.
    let reqs = |stop: bool| -> Vec<Request> {
        base.iter()
            .map(|c| Request {
                prompt: c.prompt.clone(),
                params: SamplingParams::default(),
                max_tokens: 11,
                stop_tokens: if stop { vec![c.tokens[6]] } else { Vec::new() },
                constraint: None,
            })
            .collect()
    };
    for stop in [true, false] {
        let mut p = engine(&mut cpu, 64, 8);
        let want = p.run(&mut cpu, reqs(stop), |_| {}).unwrap();
        let mut e = engine(&mut cpu, 64, 8);
        e.set_drafter(5, Box::new(Oracle { full: full.clone() })).unwrap();
        let mut events = Vec::new();
        let got = e.run(&mut cpu, reqs(stop), |ev| events.push(*ev)).unwrap();
        assert_same(&want, &got);
        let st = e.spec_stats();
        assert_eq!(st.accepted, st.proposed, "{st:?}");
        for c in &got {
            assert!(c.tokens.len() <= 11);
            if stop {
                assert!(matches!(c.finish, FinishReason::StopToken(_)), "{:?}", c.finish);
            } else {
                assert_eq!(c.finish, FinishReason::MaxTokens);
            }
            // Exactly one event ends each request, and nothing follows it.
            let ends = events.iter().filter(|ev| ev.seq == c.seq && ev.finish.is_some()).count();
            assert_eq!(ends, 1);
            let last = events.iter().rposition(|ev| ev.seq == c.seq).unwrap();
            assert!(events[last].finish.is_some());
        }
        if !stop {
            assert!(e.stats().steps < p.stats().steps);
        }
        assert_eq!(e.scheduler().kv_stats().used_blocks, 0);
    }
}

#[test]
fn verify_entries_split_into_decode_rows_sharing_their_tables() {
    use crate::spec::split_verify_entries;
    // Entries: a plain decode (1 token, context 7), a verification of 3
    // positions (context 12 with the drafts), and a prefill chunk of 4
    // tokens (context 4); stride 2.
    let cu = [0, 1, 4, 8];
    let lens = [7, 12, 4];
    let tables = [5, 0, 8, 9, 3, 0];
    let (c, l, t) = split_verify_entries(&cu, &lens, &tables, 2, 2).expect("one entry splits");
    assert_eq!(c, vec![0, 1, 2, 3, 4, 8]);
    assert_eq!(l, vec![7, 10, 11, 12, 4]);
    assert_eq!(t, vec![5, 0, 8, 9, 8, 9, 8, 9, 3, 0]);
    // A prefill entry is never split, and a step without drafts is unchanged.
    assert_eq!(split_verify_entries(&cu, &lens, &tables, 2, 1), None);
    assert_eq!(split_verify_entries(&[0, 1, 2], &[3, 9], &[1, 2], 1, 2), None);
}
