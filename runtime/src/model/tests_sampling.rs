//! Tests of sampling inside the step and of decode graphs, on the CPU
//! interpreter with the tiny model:
//!
//! - greedy [`Model::forward_sample`] returns exactly the argmax (lowest
//!   index on ties) of the logits [`Model::forward`] returns for the same
//!   steps, and the logits it sampled are bit-identical to them (f32 and
//!   bf16, the latter through the on-device cast);
//! - seeded sampling is reproducible, depends on the generation step, and
//!   does not depend on the batch (order or companions);
//! - penalties change the choice exactly as vLLM's formulas computed on the
//!   host say (repetition over prompt and output, presence/frequency over
//!   the output only), rows without penalties are unaffected;
//! - split-KV decode matches the unsplit kernel;
//! - graphs, on the graph-recording interpreter ([`super::emu::Emu`]):
//!   replays are bit-identical to the same padded launches run directly and
//!   agree with unpadded eager steps, over several buckets, split plans and
//!   penalties; capture-time rule violations are errors;
//! - the sampler on the interpreter at SmolLM2's vocabulary (timings);
//! - sampling settings and rows are validated on the host: invalid ones
//!   are usage errors.

use super::emu::Emu;
use super::graph::GraphMode;
use super::mega::DecodePath;
use super::sampler::{SampleRow, Sampled, SamplingParams, sample_logits, validate_rows};
use super::{Device, Model, Step, Weights};
use crate::Error;
use crate::check::model::{
    SampledStep, Scenario, argmax, compare_exact, compare_greedy, decode_scenario, scenario_params,
    tiny_flat_model, tiny_model,
};
use crate::gguf::Gguf;
use crate::model::ActElem;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use std::time::Instant;

/// Block tables of the two-sequence steps: A uses blocks `[3, 0]`, B `[1, 2]`.
const TABLES: [i32; 4] = [3, 0, 1, 2];

fn slot(table: &[i32], p: usize) -> i32 {
    table[p / 16] * 16 + (p % 16) as i32
}

/// Owned arrays of one step.
struct OwnedStep {
    tokens: Vec<u32>,
    positions: Vec<i32>,
    slots: Vec<i32>,
    tables: Vec<i32>,
    ctx: Vec<i32>,
    cu: Vec<i32>,
    rows: Vec<usize>,
}

impl OwnedStep {
    fn step(&self) -> Step<'_> {
        Step {
            tokens: &self.tokens,
            positions: &self.positions,
            slot_mapping: &self.slots,
            block_tables: &self.tables,
            max_blocks_per_seq: 2,
            context_lens: &self.ctx,
            query_start: &self.cu,
            logit_rows: &self.rows,
        }
    }
}

/// The forward check's steps: a varlen prefill of A (18 tokens) and B (3)
/// with logit rows `[17, 20, 0]`, then two decode steps of both.
fn scenario_steps(vocab: u32) -> Vec<OwnedStep> {
    let (a, b) = crate::check::model::scenario_tokens(vocab);
    let mut positions: Vec<i32> = (0..18).collect();
    positions.extend(0..3);
    let mut slots: Vec<i32> = (0..18).map(|p| slot(&TABLES[0..2], p)).collect();
    slots.extend((0..3).map(|p| slot(&TABLES[2..4], p)));
    let mut steps = vec![OwnedStep {
        tokens: a[..18].iter().chain(&b[..3]).copied().collect(),
        positions,
        slots,
        tables: TABLES.to_vec(),
        ctx: vec![18, 3],
        cu: vec![0, 18, 21],
        rows: vec![17, 20, 0],
    }];
    for p in [18usize, 19] {
        let pb = p - 15;
        steps.push(OwnedStep {
            tokens: vec![a[p], b[pb]],
            positions: vec![p as i32, pb as i32],
            slots: vec![slot(&TABLES[0..2], p), slot(&TABLES[2..4], pb)],
            tables: TABLES.to_vec(),
            ctx: vec![p as i32 + 1, pb as i32 + 1],
            cu: vec![0, 1, 2],
            rows: vec![0, 1],
        });
    }
    steps
}

fn model<D: Device, T: ActElem>(dev: &mut D, g: &Gguf) -> Model<D, T> {
    let w = Weights::<D, T>::load(dev, g).unwrap();
    Model::new(dev, w, 8, 16).unwrap()
}

/// Host log-softmax of `row` at `i`, in f64.
fn logprob(row: &[f32], i: usize) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    row[i] as f64 - m - z.ln()
}

fn greedy_matches_forward<T: ActElem>() {
    let g = tiny_model().unwrap();
    let mut cpu = Cpu::new();
    let mut a = model::<Cpu, T>(&mut cpu, &g);
    let mut b = model::<Cpu, T>(&mut cpu, &g);
    let vocab = a.weights.config.vocab_size;
    let greedy = SamplingParams::default();
    let mut checked = 0;
    for s in scenario_steps(vocab as u32) {
        let logits = a.forward(&mut cpu, &s.step()).unwrap();
        let rows: Vec<SampleRow<'_>> = s
            .rows
            .iter()
            .map(|_| SampleRow { params: &greedy, step: 0, tokens: &[], prompt_len: 0 })
            .collect();
        let got = b.forward_sample(&mut cpu, &s.step(), &rows).unwrap();
        let seen = b.last_logits(&cpu).unwrap();
        assert_eq!(seen.len(), logits.len());
        assert!(seen.iter().zip(&logits).all(|(x, y)| x.to_bits() == y.to_bits()), "sampled logits differ");
        for (i, smp) in got.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            assert_eq!(smp.token, argmax(row), "row {i}");
            let want = logprob(row, smp.token as usize);
            assert!((smp.logprob as f64 - want).abs() < 1e-4, "logprob {} vs {want}", smp.logprob);
            checked += 1;
        }
    }
    assert_eq!(checked, 7);
}

#[test]
fn greedy_is_the_argmax_of_forward_logits_f32() {
    greedy_matches_forward::<f32>();
}

#[test]
fn greedy_is_the_argmax_of_forward_logits_bf16() {
    greedy_matches_forward::<bf16>();
}

/// A bf16 model's logits are the LM head's f32 sums, not bf16 values: a
/// 16-bit logit row would tie candidates a true step apart.
#[test]
fn bf16_models_return_unrounded_logits() {
    let g = tiny_model().unwrap();
    let mut cpu = Cpu::new();
    let mut m = model::<Cpu, bf16>(&mut cpu, &g);
    let (mut total, mut off_grid) = (0, 0);
    for s in scenario_steps(m.weights.config.vocab_size as u32) {
        for v in m.forward(&mut cpu, &s.step()).unwrap() {
            total += 1;
            off_grid += usize::from(bf16::from_f32(v).to_f32() != v);
        }
    }
    assert!(total > 0 && 2 * off_grid > total, "{off_grid} of {total} logits are not bf16 values");
}

/// A decode step of the sequences `order` (of three prefilled ones:
/// sequence `i` has `5 + i` tokens and blocks `[i]`), each fed token `7 + i`.
fn three_seq_step(order: &[usize]) -> OwnedStep {
    let k = order.len();
    OwnedStep {
        tokens: order.iter().map(|&i| 7 + i as u32).collect(),
        positions: order.iter().map(|&i| 5 + i as i32).collect(),
        slots: order.iter().map(|&i| 16 * i as i32 + 5 + i as i32).collect(),
        tables: order.iter().flat_map(|&i| [i as i32, 0]).collect(),
        ctx: order.iter().map(|&i| 6 + i as i32).collect(),
        cu: (0..=k as i32).collect(),
        rows: (0..k).collect(),
    }
}

/// The tiny model on a new interpreter, with three sequences prefilled
/// (`5 + i` tokens in block `i`).
fn three_seq_model<T: ActElem>() -> (Cpu, Model<Cpu, T>) {
    let g = tiny_model().unwrap();
    let mut cpu = Cpu::new();
    let mut m = model::<Cpu, T>(&mut cpu, &g);
    for i in 0..3usize {
        let n = 5 + i;
        let s = OwnedStep {
            tokens: (0..n as u32).map(|t| 3 + 5 * t + i as u32).collect(),
            positions: (0..n as i32).collect(),
            slots: (0..n as i32).map(|p| 16 * i as i32 + p).collect(),
            tables: vec![i as i32, 0],
            ctx: vec![n as i32],
            cu: vec![0, n as i32],
            rows: vec![],
        };
        m.forward(&mut cpu, &s.step()).unwrap();
    }
    (cpu, m)
}

fn sample_order(
    m: &mut Model<Cpu, f32>,
    cpu: &mut Cpu,
    order: &[usize],
    params: &[SamplingParams],
    step: u32,
) -> Vec<Sampled> {
    let s = three_seq_step(order);
    let rows: Vec<SampleRow<'_>> =
        order.iter().map(|&i| SampleRow { params: &params[i], step, tokens: &[], prompt_len: 0 }).collect();
    m.forward_sample(cpu, &s.step(), &rows).unwrap()
}

#[test]
fn seeded_sampling_is_reproducible_and_batch_independent() {
    let (mut cpu, mut m) = three_seq_model::<f32>();
    // The tiny model's top logit leads by ~15: a hot temperature spreads it.
    let hot = SamplingParams { temperature: 20.0, ..SamplingParams::default() };
    let params = [
        SamplingParams { seed: 1, ..hot.clone() },
        SamplingParams { seed: 2, top_p: 0.95, ..hot.clone() },
        SamplingParams { seed: 3, top_k: 50, ..hot.clone() },
    ];
    // Re-running a decode step rewrites the same cache slots with the same
    // K/V, so every call below sees the same context.
    let all = sample_order(&mut m, &mut cpu, &[0, 1, 2], &params, 4);
    assert_eq!(sample_order(&mut m, &mut cpu, &[0, 1, 2], &params, 4), all, "not reproducible");
    let swapped = sample_order(&mut m, &mut cpu, &[2, 0], &params, 4);
    assert_eq!(swapped[0].token, all[2].token);
    assert_eq!(swapped[1].token, all[0].token);
    assert!((swapped[0].logprob - all[2].logprob).abs() < 1e-5);
    let alone = sample_order(&mut m, &mut cpu, &[1], &params, 4);
    assert_eq!(alone[0].token, all[1].token);
    // The draw depends on the generation step (the Philox counter): over 12
    // steps a hot distribution yields several different tokens.
    let mut seen: Vec<u32> =
        (0..12).map(|step| sample_order(&mut m, &mut cpu, &[0], &params, step)[0].token).collect();
    seen.sort();
    seen.dedup();
    assert!(seen.len() >= 3, "tokens over 12 steps: {seen:?}");
    // So does it on the seed.
    let reseeded = [SamplingParams { seed: 99, ..params[0].clone() }, params[1].clone(), params[2].clone()];
    let differs = (0..12).any(|step| {
        sample_order(&mut m, &mut cpu, &[0], &params, step)[0].token
            != sample_order(&mut m, &mut cpu, &[0], &reseeded, step)[0].token
    });
    assert!(differs, "the seed does not change any draw");
}

/// vLLM's penalties on the host, in the kernel's f32 order.
fn penalize(row: &[f32], prompt: &[u32], output: &[u32], p: &SamplingParams) -> Vec<f32> {
    row.iter()
        .enumerate()
        .map(|(i, &x)| {
            let count = output.iter().filter(|&&t| t as usize == i).count() as f32;
            let seen = count > 0.0 || prompt.contains(&(i as u32));
            let r = if seen { p.repetition_penalty } else { 1.0 };
            let x = if x > 0.0 { x / r } else { x * r };
            let x = x - p.frequency_penalty * count;
            x - p.presence_penalty * (count > 0.0) as u32 as f32
        })
        .collect()
}

/// The decode step of sequences 0 and 1 of [`three_seq_model`], sequence 0
/// sampled with `p` after `tokens` (the first `prompt_len` of them its
/// prompt), sequence 1 greedy: the sampled rows and the logits the sampler
/// read.
fn pair_step<T: ActElem>(
    m: &mut Model<Cpu, T>,
    cpu: &mut Cpu,
    p: &SamplingParams,
    tokens: &[u32],
    prompt_len: usize,
) -> (Vec<Sampled>, Vec<f32>) {
    let greedy = SamplingParams::default();
    let rows = [
        SampleRow { params: p, step: 0, tokens, prompt_len },
        SampleRow { params: &greedy, step: 0, tokens: &[], prompt_len: 0 },
    ];
    let out = m.forward_sample(cpu, &three_seq_step(&[0, 1]).step(), &rows).unwrap();
    (out, m.last_logits(cpu).unwrap())
}

/// [`pair_step`] with both sequences greedy.
fn greedy_pair_step<T: ActElem>(m: &mut Model<Cpu, T>, cpu: &mut Cpu) -> (Vec<Sampled>, Vec<f32>) {
    pair_step(m, cpu, &SamplingParams::default(), &[], 0)
}

#[test]
fn penalties_change_the_choice_as_vllm_defines() {
    let (mut cpu, mut m) = three_seq_model::<f32>();
    let vocab = m.weights.config.vocab_size;
    let greedy = SamplingParams::default();
    let (base, logits) = greedy_pair_step(&mut m, &mut cpu);
    let t0 = base[0].token;
    let row0 = &logits[..vocab];
    let cases = [
        (SamplingParams { repetition_penalty: 10.0, ..greedy.clone() }, vec![t0], 1, Some(true)),
        // The same token only in the prompt: frequency/presence ignore it.
        (
            SamplingParams { frequency_penalty: 2.0, presence_penalty: 2.0, ..greedy.clone() },
            vec![t0],
            1,
            Some(false),
        ),
        // Ten occurrences in the output: -20, more than the tiny model's
        // top-1 lead (~15).
        (
            SamplingParams { frequency_penalty: 2.0, ..greedy.clone() },
            [vec![5], vec![t0; 10]].concat(),
            1,
            Some(true),
        ),
        (
            SamplingParams { presence_penalty: 2.0, repetition_penalty: 1.2, ..greedy.clone() },
            vec![t0, 9],
            0,
            None,
        ),
    ];
    for (k, (p, tokens, prompt_len, must_change)) in cases.iter().enumerate() {
        let (out, seen) = pair_step(&mut m, &mut cpu, p, tokens, *prompt_len);
        let want = penalize(row0, &tokens[..*prompt_len], &tokens[*prompt_len..], p);
        assert!(
            seen[..vocab].iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "case {k}: penalized logits differ from the host's"
        );
        assert_eq!(out[0].token, argmax(&want), "case {k}");
        if let Some(change) = must_change {
            assert_eq!(out[0].token != t0, *change, "case {k}: {} vs {t0}", out[0].token);
        }
        // The row without penalties is untouched.
        assert_eq!(out[1], base[1], "case {k}");
        assert!(seen[vocab..].iter().zip(&logits[vocab..]).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

/// With bf16 activations the penalties rewrite the step's f32 logits in
/// place: `last_logits` then gives the penalized logits (the host's
/// penalties, bit for bit), and after a later step without penalties the
/// logits that step's `sample` read, not the penalized ones.
#[test]
fn penalties_rewrite_bf16_models_logits_and_last_logits_follows() {
    let (mut cpu, mut m) = three_seq_model::<bf16>();
    let vocab = m.weights.config.vocab_size;
    let greedy = SamplingParams::default();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let (base, logits) = greedy_pair_step(&mut m, &mut cpu);
    let want_plain = m.forward(&mut cpu, &three_seq_step(&[0, 1]).step()).unwrap();
    assert_eq!(bits(&logits), bits(&want_plain), "the unpenalized step's logits");
    let t0 = base[0].token;
    let p = SamplingParams { repetition_penalty: 10.0, frequency_penalty: 1.5, ..greedy.clone() };
    let tokens = [t0, t0, 9];
    let (out, seen) = pair_step(&mut m, &mut cpu, &p, &tokens, 1);
    let want = penalize(&logits[..vocab], &tokens[..1], &tokens[1..], &p);
    assert_eq!(bits(&seen[..vocab]), bits(&want), "penalized logits differ from the host's");
    assert_eq!(bits(&seen[vocab..]), bits(&logits[vocab..]), "the row without penalties changed");
    assert_eq!(out[0].token, argmax(&want));
    assert_ne!(out[0].token, t0, "the penalties must change the choice");
    assert_eq!(out[1], base[1]);
    let (again, after) = greedy_pair_step(&mut m, &mut cpu);
    assert_eq!(again, base);
    assert_eq!(bits(&after), bits(&logits), "last_logits read the penalized logits");
}

#[test]
fn split_kv_decode_matches_the_unsplit_kernel() {
    let g = tiny_model().unwrap();
    let mut cpu = Cpu::new();
    let params = vec![SamplingParams::default()];
    // Contexts of 21 to 37 tokens: 2 or 3 splits of 16 tokens.
    let sc = |split| Scenario {
        seqs: 2,
        prompt: 20,
        batches: vec![2, 2, 1, 2],
        split,
        invariant: false,
        decode_path: DecodePath::Graphs,
    };
    let (plain, _) = decode_scenario::<Cpu, f32>(&mut cpu, &g, GraphMode::Off, &sc(None), &params).unwrap();
    let (split, _) =
        decode_scenario::<Cpu, f32>(&mut cpu, &g, GraphMode::Off, &sc(Some(16)), &params).unwrap();
    let vocab = plain[0].logits.len() / plain[0].sampled.len();
    let (bad, rel) = compare_greedy(&plain, &split, &params, vocab, 1e-4);
    eprintln!("split-KV vs unsplit decode: max logit difference {rel:.2e} of the scale");
    assert_eq!(bad, 0);
    assert!(rel < 1e-5, "{rel}");
    // The split path really ran: its logits are not bit-identical.
    let (_, differing, _) = compare_exact(&plain[1..], &split[1..]);
    assert!(differing > 0, "split and unsplit decode gave bit-identical logits");
}

/// The scenario of the graph tests: 5 sequences, buckets 1, 4, 2, 8 and
/// replays of each, contexts crossing 16 and 32 (new split classes);
/// batch-invariant unless `split` forces the split-KV path.
fn graph_scenario(split: Option<usize>) -> Scenario {
    Scenario {
        seqs: 5,
        prompt: 10,
        batches: vec![1, 3, 3, 2, 5, 1, 4, 2, 5, 3, 3, 3],
        split,
        invariant: split.is_none(),
        decode_path: DecodePath::Graphs,
    }
}

fn graph_vs_padded<T: ActElem>(split: Option<usize>) -> (Vec<SampledStep>, Vec<SampledStep>) {
    let g = tiny_model().unwrap();
    let params = scenario_params();
    let sc = graph_scenario(split);
    let mut emu = Emu::new();
    let (graphs, m) = decode_scenario::<Emu, T>(&mut emu, &g, GraphMode::Graphs, &sc, &params).unwrap();
    let keys = m.graph_keys();
    eprintln!("graph keys: {keys:?}; {} replays", emu.replays);
    assert!(emu.replays >= 5, "{} replays", emu.replays);
    let buckets: std::collections::BTreeSet<usize> = keys.iter().map(|k| k.bucket).collect();
    assert_eq!(buckets.into_iter().collect::<Vec<_>>(), vec![1, 2, 4, 8]);
    assert!(keys.iter().any(|k| k.penalties) && keys.iter().any(|k| !k.penalties));
    if split.is_some() {
        assert!(keys.iter().any(|k| k.splits > 1), "{keys:?}");
    }
    let mut cpu = Cpu::new();
    let (padded, _) = decode_scenario::<Cpu, T>(&mut cpu, &g, GraphMode::Padded, &sc, &params).unwrap();
    let (ids, logits, max_abs) = compare_exact(&graphs, &padded);
    assert_eq!((ids, logits), (0, 0), "graph replays differ from direct launches (max {max_abs})");
    let (eager, _) = decode_scenario::<Cpu, T>(&mut cpu, &g, GraphMode::Off, &sc, &params).unwrap();
    (graphs, eager)
}

#[test]
fn graph_replays_match_direct_launches_and_eager_steps() {
    let (graphs, eager) = graph_vs_padded::<f32>(None);
    let vocab = graphs[0].logits.len() / graphs[0].sampled.len();
    let (bad, rel) = compare_greedy(&graphs, &eager, &scenario_params(), vocab, 1e-4);
    eprintln!("graphs vs unpadded eager: {bad} greedy differences, logits within {rel:.2e} of the scale");
    assert_eq!(bad, 0);
    assert!(rel < 1e-5, "{rel}");
}

#[test]
fn graph_replays_with_split_kv_and_bf16() {
    let (graphs, eager) = graph_vs_padded::<bf16>(Some(16));
    let vocab = graphs[0].logits.len() / graphs[0].sampled.len();
    let (bad, rel) = compare_greedy(&graphs, &eager, &scenario_params(), vocab, 0.05);
    eprintln!("bf16 split graphs vs unpadded eager: {bad} greedy differences, logits within {rel:.2e}");
    assert_eq!(bad, 0);
    assert!(rel < 2e-2, "{rel}");
}

#[test]
fn graph_eligibility_and_capture_rules() {
    let g = tiny_model().unwrap();
    let mut emu = Emu::new();
    let mut m = model::<Emu, f32>(&mut emu, &g);
    m.set_graph_mode(GraphMode::Graphs);
    let greedy = SamplingParams::default();
    // A prefill step (and a decode step whose logit rows are permuted) run eagerly.
    let steps = scenario_steps(m.weights.config.vocab_size as u32);
    let rows = [SampleRow { params: &greedy, step: 0, tokens: &[], prompt_len: 0 }; 3];
    m.forward_sample(&mut emu, &steps[0].step(), &rows).unwrap();
    let mut swapped = steps[1].step();
    swapped.logit_rows = &[1, 0];
    m.forward_sample(&mut emu, &swapped, &rows[..2]).unwrap();
    assert!(m.graph_keys().is_empty());
    m.forward_sample(&mut emu, &steps[2].step(), &rows[..2]).unwrap();
    assert_eq!(m.graph_keys().len(), 1);
    // Off turns graphs off; the captured one is kept.
    m.set_graph_mode(GraphMode::Off);
    let replays = emu.replays;
    m.forward_sample(&mut emu, &steps[2].step(), &rows[..2]).unwrap();
    assert_eq!(emu.replays, replays);
    m.clear_graphs();
    assert!(m.graph_keys().is_empty());
    // A failed capture turns graphs off; the step's results still come back
    // (from the direct run) and equal those of a model without graphs.
    let mut fresh = model::<Emu, f32>(&mut emu, &g);
    fresh.set_graph_mode(GraphMode::Graphs);
    let mut plain = model::<Emu, f32>(&mut emu, &g);
    plain.set_graph_mode(GraphMode::Off);
    emu.fail_captures = true;
    for s in &steps {
        let rows = &rows[..s.rows.len()];
        let got = fresh.forward_sample(&mut emu, &s.step(), rows).unwrap();
        assert_eq!(got, plain.forward_sample(&mut emu, &s.step(), rows).unwrap());
    }
    emu.fail_captures = false;
    assert_eq!(fresh.graph_mode(), GraphMode::Off);
    assert!(fresh.graph_failure().is_some_and(|m| m.contains("invalidated")));
    assert!(fresh.graph_keys().is_empty());
    // The emulator enforces the capture rules.
    emu.begin_capture().unwrap();
    assert!(emu.zeros::<f32>(4).is_err());
    assert!(emu.begin_capture().is_err());
    assert!(emu.end_capture().is_err(), "an empty capture is an error");
    assert!(emu.end_capture().is_err(), "no capture is open");
}

/// The interpreter's sampler at SmolLM2's vocabulary (49152), one row:
/// greedy must be the argmax; prints the times.
#[test]
fn interpreter_sampling_at_smollm2_vocab() {
    let vocab = 49152;
    let mut rng = crate::check::Rng::new(7);
    let logits: Vec<f32> = (0..vocab).map(|_| (rng.unit() * 8.0 - 4.0) as f32).collect();
    let mut cpu = Cpu::new();
    let cases = [
        ("greedy", SamplingParams::default()),
        ("temperature", SamplingParams { temperature: 0.8, seed: 5, ..SamplingParams::default() }),
        (
            "top-k + top-p",
            SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, seed: 5, ..SamplingParams::default() },
        ),
    ];
    for (name, p) in &cases {
        let rows = [SampleRow { params: p, step: 3, tokens: &[], prompt_len: 0 }];
        let t0 = Instant::now();
        let out = sample_logits(&mut cpu, &logits, vocab, &rows).unwrap();
        eprintln!("interpreter sample 1x{vocab} {name}: {:?}", t0.elapsed());
        if p.is_greedy() {
            assert_eq!(out[0].token, argmax(&logits));
        }
        assert!((out[0].logprob as f64 - logprob(&logits, out[0].token as usize)).abs() < 1e-4);
    }
}

/// The persistent decode step against the multi-kernel batch-invariant
/// step on the interpreter `dev`: the same scenario (decode batches of 1 to
/// 3 rows, contexts of 61 to 69 tokens, so the attention runs whole key
/// blocks and a partial one, greedy and seeded sampling with penalties),
/// identical token ids, logprob bits and logit bits; and the persistent
/// kernel really ran for every decode step.
fn mega_matches_multi_kernel<D: Device, T: ActElem>(dev: &mut D) {
    mega_matches_multi_kernel_on::<D, T>(dev, &tiny_flat_model().unwrap());
}

/// [`mega_matches_multi_kernel`] on the model `g`.
fn mega_matches_multi_kernel_on<D: Device, T: ActElem>(dev: &mut D, g: &Gguf) {
    mega_matches_in::<D, T>(dev, g, 3, 60, &[3, 1, 2, 3, 1]);
}

/// [`mega_matches_multi_kernel`] on the model `g`, `seqs` sequences of
/// `prompt` tokens and more, decode steps of `batches` rows.
fn mega_matches_in<D: Device, T: ActElem>(
    dev: &mut D,
    g: &Gguf,
    seqs: usize,
    prompt: usize,
    batches: &[usize],
) {
    mega_matches_with::<D, T>(dev, g, seqs, prompt, batches, &scenario_params());
}

/// [`mega_matches_in`] with the rows' settings `params` (row `i` takes
/// entry `i % len`); returns how many steps the persistent kernel sampled
/// itself.
fn mega_matches_with<D: Device, T: ActElem>(
    dev: &mut D,
    g: &Gguf,
    seqs: usize,
    prompt: usize,
    batches: &[usize],
    params: &[SamplingParams],
) -> usize {
    let sc = |decode_path| Scenario {
        seqs,
        prompt,
        batches: batches.to_vec(),
        split: None,
        invariant: true,
        decode_path,
    };
    let (multi, m0) =
        decode_scenario::<D, T>(dev, g, GraphMode::Off, &sc(DecodePath::Graphs), params).unwrap();
    let (mega, m1) = decode_scenario::<D, T>(dev, g, GraphMode::Off, &sc(DecodePath::Mega), params).unwrap();
    assert_eq!((m0.mega_steps(), m1.mega_steps()), (0, batches.len()));
    assert_eq!(m0.mega_sampled_steps(), 0);
    let (ids, logits, max_abs) = compare_exact(&multi, &mega);
    assert_eq!((ids, logits), (0, 0), "persistent vs multi-kernel decode: max |logit difference| {max_abs}");
    m1.mega_sampled_steps()
}

/// Steps whose rows are all greedy without penalties are sampled by the
/// persistent kernel itself (its `sample_rows` tasks after the
/// LM head), with the ids and logprob bits of the sampler kernel; in the
/// mixed scenario of [`mega_matches_multi_kernel`] only its one-row steps
/// (row 0 greedy) are.
#[test]
fn mega_decode_samples_greedy_steps_itself() {
    let g = tiny_flat_model().unwrap();
    let greedy = [SamplingParams::default()];
    let batches = [3, 1, 2, 3, 1];
    assert_eq!(mega_matches_with::<Cpu, f32>(&mut Cpu::new(), &g, 3, 60, &batches, &greedy), 5);
    assert_eq!(mega_matches_with::<Emu, bf16>(&mut hopper(), &g, 3, 60, &batches, &greedy), 5);
    let mixed = scenario_params();
    assert_eq!(mega_matches_with::<Cpu, f32>(&mut Cpu::new(), &g, 3, 60, &batches, &mixed), 2);
}

/// The graph-recording interpreter answering as a Hopper GPU (run
/// eagerly): the model picks the kernels and configurations it runs there,
/// so the one-row steps take the stacked products with RoPE and the KV
/// write in the QKV tiles (`kernels::rope::rope_pairs`), and the attention
/// its `wgmma` tiles.
fn hopper() -> Emu {
    let mut emu = Emu::new();
    emu.hopper = true;
    emu
}

#[test]
fn mega_decode_matches_multi_kernel_f32() {
    mega_matches_multi_kernel::<Cpu, f32>(&mut Cpu::new());
}

#[test]
fn mega_decode_matches_multi_kernel_bf16() {
    mega_matches_multi_kernel::<Cpu, dsl_core::half::bf16>(&mut Cpu::new());
}

#[test]
fn mega_decode_matches_multi_kernel_hopper_f32() {
    mega_matches_multi_kernel::<Emu, f32>(&mut hopper());
}

#[test]
fn mega_decode_matches_multi_kernel_hopper_bf16() {
    mega_matches_multi_kernel::<Emu, dsl_core::half::bf16>(&mut hopper());
}

/// Contexts of four and five key blocks (`kernels::decode_step::
/// ATT_SPLIT_BLOCKS` and more: 32 keys on the interpreter, the `wgmma`
/// tile's 128 on the Hopper emulation): the persistent step's attention
/// runs a task per key block and the last one of a row and head folds
/// their partials (`kernels::decode_attention::fold_blocks`), bit for bit
/// the multi-kernel step, whose one program per row and head folds them
/// as it goes.
#[test]
fn mega_decode_folds_key_blocks() {
    assert_eq!(kernels::decode_step::ATT_SPLIT_BLOCKS, 4, "the contexts below are 4 and 5 blocks");
    let mut t = crate::check::model::tiny_llama();
    t.config.context_length = 1024;
    t.embedding_scale = 0.03;
    let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
    let t0 = Instant::now();
    mega_matches_in::<Cpu, f32>(&mut Cpu::new(), &g, 2, 125, &[2, 1, 2]);
    mega_matches_in::<Emu, bf16>(&mut hopper(), &g, 2, 510, &[2, 1, 2]);
    eprintln!("key blocks folded: {:?}", t0.elapsed());
}

/// Matrices in a format per layer (down in Q4_K then Q6_K, O in Q4_1 then
/// Q8_0): the persistent step runs each layer's tasks in its format and
/// waits for each layer's own tile counts, bit for bit as the multi-kernel
/// step: on the interpreter (every product split along K; layer 1's O has
/// half as many tiles) and on the Hopper emulation (the word-tiled
/// products stacked, the K-quants split).
#[test]
fn mega_decode_with_down_formats_by_layer() {
    let g = crate::check::model::tiny_down_by_layer_model().unwrap();
    mega_matches_multi_kernel_on::<Cpu, f32>(&mut Cpu::new(), &g);
    mega_matches_multi_kernel_on::<Emu, bf16>(&mut hopper(), &g);
}

/// A gate/up product wide enough that the persistent step packs its
/// stacked tiles (K of 3 tiles, 4,224 rows: five blocks of 4 rows in a
/// 64-row dot, `StackedShape::stacked_tiling`) runs bit for bit as the
/// multi-kernel step on the Hopper emulation.
#[test]
fn mega_decode_with_packed_gate_up_tiles() {
    use kernels::dequant::QuantFormat;
    use kernels::dequant::stacked::StackedShape;
    let mut t = crate::check::model::tiny_llama();
    t.config.n_layers = 1;
    t.config.n_embd = 320;
    t.config.n_head = 5;
    t.config.n_ff = 2112;
    t.embedding_scale = 0.03;
    let (stack, block_n, pack) = QuantFormat::Q4_1.stacked_tiling(1, 2 * 2112, 320, 64);
    assert!(pack > 1 && stack * block_n == 64, "({stack}, {block_n}, {pack})");
    let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
    let t0 = Instant::now();
    mega_matches_multi_kernel_on::<Emu, bf16>(&mut hopper(), &g);
    eprintln!("packed gate/up on the Hopper emulation: {:?}", t0.elapsed());
}

/// The native CPU backend does not run the persistent step: asking for it
/// is an error that says why, and `auto` keeps every step on the
/// multi-kernel path.
#[test]
fn mega_is_refused_where_it_cannot_run() {
    let g = tiny_model().unwrap();
    let mut host = codegen::host::Host::new();
    let weights = Weights::<codegen::host::Host, f32>::load(&mut host, &g).unwrap();
    let mut model = Model::new(&mut host, weights, 4, 16).unwrap();
    let err = model.set_decode_path(DecodePath::Mega).unwrap_err().to_string();
    assert!(err.contains("--decode-path mega") && err.contains("persistent"), "{err}");
    assert_eq!(model.decode_path(), DecodePath::Auto);
    assert_eq!(model.mega_rows(), 0);
}

#[test]
fn defaults_are_greedy_and_valid() {
    let p = SamplingParams::default();
    assert!(p.validate().is_ok());
    assert!(p.is_greedy());
    assert!(SamplingParams { top_k: 1, temperature: 0.8, ..p.clone() }.is_greedy());
    assert!(!SamplingParams { temperature: 0.8, ..p.clone() }.is_greedy());
}

#[test]
fn invalid_settings_are_usage_errors() {
    let p = SamplingParams::default();
    let bad = [
        SamplingParams { temperature: f32::NAN, ..p.clone() },
        SamplingParams { temperature: -0.5, ..p.clone() },
        SamplingParams { temperature: f32::INFINITY, ..p.clone() },
        SamplingParams { top_k: -2, ..p.clone() },
        SamplingParams { top_p: 0.0, ..p.clone() },
        SamplingParams { top_p: 1.5, ..p.clone() },
        SamplingParams { top_p: f32::NAN, ..p.clone() },
        SamplingParams { min_p: -0.1, ..p.clone() },
        SamplingParams { min_p: f32::NAN, ..p.clone() },
        SamplingParams { repetition_penalty: 0.0, ..p.clone() },
        SamplingParams { repetition_penalty: f32::NAN, ..p.clone() },
        SamplingParams { presence_penalty: 2.5, ..p.clone() },
        SamplingParams { frequency_penalty: -3.0, ..p.clone() },
    ];
    for (i, b) in bad.iter().enumerate() {
        match b.validate() {
            Err(Error::Usage(m)) => assert!(m.contains("invalid"), "{m}"),
            other => panic!("case {i}: {other:?}"),
        }
    }
    let ok = SamplingParams {
        temperature: 0.7,
        top_k: -1,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.2,
        presence_penalty: -2.0,
        frequency_penalty: 2.0,
        seed: u64::MAX,
    };
    assert!(ok.validate().is_ok());
}

#[test]
fn rows_are_checked_against_the_step() {
    let p = SamplingParams::default();
    let pen = SamplingParams { frequency_penalty: 0.5, ..p.clone() };
    let r = SampleRow { params: &p, step: 0, tokens: &[1, 2], prompt_len: 2 };
    assert!(validate_rows(&[r], 1, 10).is_ok());
    assert!(validate_rows(&[r], 2, 10).is_err());
    assert!(validate_rows(&[SampleRow { prompt_len: 3, ..r }], 1, 10).is_err());
    // Token ids are only read (and checked) for rows with penalties.
    assert!(validate_rows(&[SampleRow { tokens: &[1, 99], ..r }], 1, 10).is_ok());
    assert!(validate_rows(&[SampleRow { params: &pen, tokens: &[1, 99], ..r }], 1, 10).is_err());
}

/// A decode graph is keyed by whether it runs the persistent step: a step
/// of the same shape whose rows share a sequence (speculative verification
/// rows) captures a multi-kernel graph of its own rather than replaying the
/// persistent one.
#[test]
fn verification_rows_get_a_multi_kernel_graph_of_their_own() {
    let g = tiny_model().unwrap();
    let mut emu = hopper();
    let mut m = model::<Emu, f32>(&mut emu, &g);
    m.set_graph_mode(GraphMode::Graphs);
    m.set_decode_path(DecodePath::Mega).unwrap();
    let greedy = SamplingParams::default();
    let rows = [SampleRow { params: &greedy, step: 0, tokens: &[], prompt_len: 0 }; 3];
    let steps = scenario_steps(m.weights.config.vocab_size as u32);
    m.forward_sample(&mut emu, &steps[0].step(), &rows).unwrap();
    // Two sequences, one token each: the persistent step's graph.
    m.forward_sample(&mut emu, &steps[1].step(), &rows[..2]).unwrap();
    assert_eq!(m.mega_steps(), 1);
    let keys = m.graph_keys();
    assert!(keys.len() == 1 && keys[0].mega, "{keys:?}");
    // The same shape as sequence A's two verification rows (positions 18
    // and 19 against its block table).
    let (a, _) = crate::check::model::scenario_tokens(m.weights.config.vocab_size as u32);
    let tables = [TABLES[0], TABLES[1], TABLES[0], TABLES[1]];
    let verify = Step {
        tokens: &[a[18], a[19]],
        positions: &[18, 19],
        slot_mapping: &[slot(&TABLES[0..2], 18), slot(&TABLES[0..2], 19)],
        block_tables: &tables,
        max_blocks_per_seq: 2,
        context_lens: &[19, 20],
        query_start: &[0, 1, 2],
        logit_rows: &[0, 1],
    };
    m.forward_sample(&mut emu, &verify, &rows[..2]).unwrap();
    assert_eq!(m.mega_steps(), 1);
    let keys = m.graph_keys();
    assert!(keys.len() == 2 && keys.iter().any(|k| !k.mega), "{keys:?}");
}
