//! Kernel library: the sampling kernels on the interpreter against the
//! reference (`kernels::reference::sampling`).
//!
//! - `sample_matches_reference`: random non-zero logits (a few `-inf`, about
//!   12% exact repeats, a few of which tie at a threshold), ragged
//!   vocabularies (1 to 3000, below, at and past multiples of `BLOCK` = 64 or
//!   256), row strides wider than the row, odd batch sizes, mixed per-row
//!   settings (greedy, temperature, top-k, top-p, min-p and combinations,
//!   random seeds and steps). Greedy rows must return the argmax exactly and
//!   `thresh = +inf`. Sampled rows: the workspace equals the reference `w`
//!   to 1e-6 relative; the chosen id is always in the kernel's own kept set;
//!   and, whenever the reference's closest decision is at least `MARGIN`
//!   (relative) away from its boundary, the kept set and the id equal the
//!   reference's exactly. Logprobs within 1e-5 of the reference's
//!   log-softmax of the token the kernel drew (near a boundary the kernel
//!   may draw another token than the reference:
//!   `logprob_is_of_the_drawn_token_near_a_boundary`).
//! - `decisions_are_rarely_near_a_boundary`: a fixed batch of 240 rows checks
//!   that the margin rule above skips few rows (so the exact checks bite).
//! - `greedy_is_argmax_with_ties`: repeated maxima, lowest index.
//! - `ties_at_the_thresholds_are_kept`: every token tied with the top-k or
//!   top-p boundary value is kept (explicit kept counts).
//! - `corner_settings_match_reference`: `top_p <= 0` and `> 1`, `min_p` at,
//!   above and below its range, `top_k` negative and past the vocabulary,
//!   `min_p` and `top_p` NaN (off), all three filters tight, temperatures just
//!   below, at and far above the greedy epsilon and NaN, a negative step and
//!   an all-ones seed.
//! - `underflowed_tokens_are_never_drawn`: every other `w` underflows in f32.
//! - `rows_are_independent_of_the_batch`: a row's draw is the same alone and
//!   at another position among other rows (same seed and step), and changes
//!   with the step.
//! - `draws_follow_the_kept_distribution`: chi-square over 3000 draws (steps
//!   0..3000) on a 12-token vocabulary, against the reference's renormalized
//!   kept distribution, for four settings; tokens outside the kept set must
//!   never appear; the statistic against the unfiltered softmax must be far
//!   above the critical value (the test has power).
//! - `penalties_match_reference`, `token_counts_add_matches_reference`: exact
//!   (bitwise) equality; slots permuted, some negative; sparse random counts.
//! - `token_mask_matches_reference`: `apply_token_mask` on a random subset of
//!   the rows (in a random order) with random bitmasks (all clear, all set
//!   and random words among them), ragged vocabularies and strides: masked
//!   rows equal the reference bit for bit, every other row and the padding
//!   past `vocab` are untouched.
//! - `exp_units_truncate_to_multiples_of_the_unit`: the logprob sum's
//!   fixed-point terms are `e * 2^40` truncated, exactly.
//! - `logprobs_do_not_depend_on_the_chunk`: 120 rows, half greedy, sampled
//!   in chunks of 64, 256 and 1024: the greedy rows' ids and logprob bits
//!   agree (a float sum fails this: its per-lane partials follow the
//!   chunk), and a one-pass greedy kernel of `row_argmax` and
//!   `row_exp_sum` (chunks of 128) writes the greedy rows' ids, logprobs
//!   and thresholds bit for bit.

use crate::common::cases;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::reference::sampling::{self as r, RowParams};
use kernels::sampling::{apply_token_mask, penalties, sample, token_counts_add};
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// The relative margin above which the kernel must agree exactly.
const MARGIN: f64 = 1e-5;

/// The kernel's outputs for a batch.
struct Out {
    ids: Vec<i32>,
    logprobs: Vec<f32>,
    thresh: Vec<f32>,
    ws: Vec<f32>,
}

/// Runs `sample` on the interpreter over `rows` rows of `vocab` f32 logits
/// at row stride `stride`.
fn run_sample(
    x: &[f32],
    vocab: usize,
    stride: usize,
    params: &[RowParams],
    block: usize,
) -> Result<Out, String> {
    assert_eq!(x.len(), params.len() * stride);
    let mut cpu = Cpu::new();
    let xp = cpu.upload(x).cast();
    sample_on(cpu, xp, DType::F32, vocab, stride, params, block)
}

/// [`run_sample`] of logits uploaded in `dtype` (at `xp` on `cpu`).
fn sample_on(
    mut cpu: Cpu,
    xp: dsl_core::interp::CpuPtr<dsl_core::launch::AnyDType>,
    dtype: DType,
    vocab: usize,
    stride: usize,
    params: &[RowParams],
    block: usize,
) -> Result<Out, String> {
    let rows = params.len();
    let col = |f: &dyn Fn(&RowParams) -> f32| params.iter().map(f).collect::<Vec<f32>>();
    let (temp, top_p, min_p) = (col(&|p| p.temperature), col(&|p| p.top_p), col(&|p| p.min_p));
    let top_k: Vec<i32> = params.iter().map(|p| p.top_k).collect();
    let seed: Vec<i64> = params.iter().map(|p| p.seed as i64).collect();
    let step: Vec<i32> = params.iter().map(|p| p.step).collect();
    // The workspace starts as NaN: every element the kernel must write is checked.
    let wp = cpu.upload(&vec![f32::NAN; rows * stride]);
    let (tp, kp, pp, mp) = (cpu.upload(&temp), cpu.upload(&top_k), cpu.upload(&top_p), cpu.upload(&min_p));
    let (sp, stp) = (cpu.upload(&seed), cpu.upload(&step));
    let (ip, lp, hp) = (cpu.zeros::<i32>(rows), cpu.zeros::<f32>(rows), cpu.zeros::<f32>(rows));
    let args = sample::Args {
        logits_ptr: xp,
        ws_ptr: wp,
        temperature_ptr: tp,
        top_k_ptr: kp,
        top_p_ptr: pp,
        min_p_ptr: mp,
        seed_ptr: sp,
        step_ptr: stp,
        ids_ptr: ip,
        logprobs_ptr: lp,
        thresh_ptr: hp,
        vocab: vocab as i32,
        stride: stride as i32,
        _marker: PhantomData,
    };
    sample::interpret(&mut cpu, [rows as u32, 1, 1], &sample::Config::new(dtype, block), &args)
        .map_err(|e| e.to_string())?;
    Ok(Out { ids: cpu.read(ip), logprobs: cpu.read(lp), thresh: cpu.read(hp), ws: cpu.read(wp) })
}

/// Checks row `i` of `out` against the reference; returns whether the exact
/// comparisons applied (the margin was comfortable).
fn check_row(x: &[f32], p: &RowParams, out: &Out, i: usize, stride: usize) -> Result<bool, String> {
    let vocab = x.len();
    let want = r::sample(x, p);
    let id = out.ids[i];
    if !(id >= 0 && (id as usize) < vocab) {
        return Err(format!("row {i}: id {id} outside the vocabulary of {vocab}"));
    }
    // The logprob of the token the kernel drew (the reference's own token
    // when the decision is clear of its boundary, checked below).
    let lp = out.logprobs[i] as f64;
    let want_lp = r::logprob_of(x, id as usize);
    if (lp - want_lp).abs() > 1e-5 * (1.0 + want_lp.abs()) {
        return Err(format!("row {i}: logprob {lp} vs {want_lp} of token {id} ({p:?})"));
    }
    if want.greedy {
        if id as usize != want.id || out.thresh[i] != f32::INFINITY {
            return Err(format!("row {i}: greedy id {id} vs {} thresh {}", want.id, out.thresh[i]));
        }
        return Ok(true);
    }
    let ws = &out.ws[i * stride..i * stride + vocab];
    for (j, (&g, &w)) in ws.iter().zip(&want.w).enumerate() {
        // Exactly zero where the reference cuts (min-p) unless within the margin.
        if (g as f64 - w).abs() > 1e-6 * w.abs() + 1e-30 && want.margin >= MARGIN {
            return Err(format!("row {i}: ws[{j}] = {g} vs {w} ({p:?})"));
        }
    }
    let tau = out.thresh[i];
    if !(id >= 0 && (id as usize) < vocab && ws[id as usize] >= tau && ws[id as usize] > 0.0) {
        return Err(format!("row {i}: id {id} is not in the kernel's kept set (tau {tau})"));
    }
    if want.margin < MARGIN {
        return Ok(false);
    }
    let kept: Vec<bool> = ws.iter().map(|&v| v > 0.0 && v >= tau).collect();
    if kept != want.kept {
        let diff: Vec<usize> = (0..vocab).filter(|&j| kept[j] != want.kept[j]).collect();
        return Err(format!("row {i}: kept sets differ at {diff:?} (tau {tau}, {p:?})"));
    }
    if id as usize != want.id {
        return Err(format!("row {i}: id {id} vs {} (u {}, margin {}, {p:?})", want.id, want.u, want.margin));
    }
    Ok(true)
}

/// Random settings: a mix of greedy, pure temperature and every filter.
fn random_params(rng: &mut Rng, vocab: usize) -> RowParams {
    let temperature = match rng.below(6) {
        0 => 0.0,
        1 => 1.0,
        2 => 0.7,
        _ => rng.uniform(0.2, 2.0),
    };
    let top_k = match rng.below(5) {
        0 | 1 => 0,
        2 => 1 + rng.below(8) as i32,
        3 => 1 + rng.below(vocab as u64 + 2) as i32,
        _ => vocab as i32,
    };
    let top_p = match rng.below(4) {
        0 | 1 => 1.0,
        2 => 0.9,
        _ => rng.uniform(0.05, 0.99),
    };
    let min_p = match rng.below(4) {
        0 | 1 => 0.0,
        2 => 0.05,
        _ => rng.uniform(0.001, 0.5),
    };
    RowParams { temperature, top_k, top_p, min_p, seed: rng.next_u64(), step: rng.next_u64() as i32 }
}

/// `rows` rows of `vocab` random logits in `[-scale, scale)` (never zero), a
/// few `-inf` (banned tokens, never the whole row) and about 12% repeats of
/// earlier values (exact ties), row stride `stride`.
fn random_logits(rng: &mut Rng, rows: usize, vocab: usize, stride: usize, scale: f32) -> Vec<f32> {
    let mut x = vec![0.0f32; rows * stride];
    for i in 0..rows {
        for j in 0..stride {
            x[i * stride + j] = match rng.below(50) {
                // A banned token (never the first, so no row is all -inf).
                0 if j > 0 && j < vocab => f32::NEG_INFINITY,
                // A repeat of an earlier logit: exact ties, also at the thresholds.
                1..=6 if j > 0 => x[i * stride + rng.below(j as u64) as usize],
                _ => rng.uniform(-scale, scale),
            };
        }
    }
    x
}

/// One batch: runs the kernel and checks every row; returns (exact rows, rows).
fn batch(
    seed: u64,
    rows: usize,
    vocab: usize,
    gap: usize,
    block: usize,
    scale: f32,
) -> Result<(usize, usize), String> {
    let mut rng = Rng::new(seed);
    let stride = vocab + gap;
    let x = random_logits(&mut rng, rows, vocab, stride, scale);
    let params: Vec<RowParams> = (0..rows).map(|_| random_params(&mut rng, vocab)).collect();
    let out = run_sample(&x, vocab, stride, &params, block)?;
    let mut exact = 0;
    for (i, p) in params.iter().enumerate() {
        if check_row(&x[i * stride..i * stride + vocab], p, &out, i, stride)? {
            exact += 1;
        }
    }
    Ok((exact, rows))
}

fn vocabs() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(2), Just(64), Just(256), Just(257), Just(1000), 1usize..3000]
}

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn sample_matches_reference(
        rows in prop_oneof![Just(1usize), Just(3), Just(5), 1usize..8],
        vocab in vocabs(),
        gap in 0usize..5,
        big in any::<bool>(),
        scale in prop_oneof![Just(1.0f32), Just(4.0), Just(10.0), 0.5f32..12.0],
        seed in any::<u64>(),
    ) {
        batch(seed, rows, vocab, gap, if big { 256 } else { 64 }, scale).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn decisions_are_rarely_near_a_boundary() {
    let (mut exact, mut total) = (0, 0);
    for (k, vocab) in [300usize, 700, 1500, 2048].into_iter().enumerate() {
        let (e, t) = batch(1000 + k as u64, 60, vocab, 3, 256, 6.0).unwrap();
        exact += e;
        total += t;
    }
    println!("{exact} of {total} rows compared exactly");
    assert!(exact * 10 >= total * 9, "only {exact} of {total} rows were compared exactly");
}

#[test]
fn greedy_is_argmax_with_ties() {
    let mut rng = Rng::new(7);
    let (rows, vocab) = (9, 777);
    let mut x = random_logits(&mut rng, rows, vocab, vocab, 3.0);
    let mut want = Vec::new();
    for i in 0..rows {
        // Two or three copies of a new maximum at random places.
        let mut at: Vec<usize> = (0..2 + i % 2).map(|_| rng.below(vocab as u64) as usize).collect();
        at.sort();
        for &j in &at {
            x[i * vocab + j] = 5.0;
        }
        want.push(at[0] as i32);
    }
    let params: Vec<RowParams> = (0..rows)
        .map(|i| match i % 3 {
            0 => RowParams::temperature(0.0, i as u64, 0),
            1 => RowParams::temperature(-1.0, i as u64, 0),
            _ => RowParams { top_k: 1, ..RowParams::temperature(1.3, i as u64, 0) },
        })
        .collect();
    let out = run_sample(&x, vocab, vocab, &params, 128).unwrap();
    assert_eq!(out.ids, want);
}

/// Logits in bf16 (the GPU's activation dtype, read without a conversion
/// kernel) sample as their f32 values do: the same ids, logprobs and
/// thresholds bit for bit, greedy and sampled rows, a ragged vocabulary.
#[test]
fn bf16_logits_sample_as_their_f32_values() {
    let mut rng = Rng::new(23);
    let (rows, vocab) = (6, 1000);
    let wide: Vec<bf16> =
        random_logits(&mut rng, rows, vocab, vocab, 4.0).iter().map(|&v| bf16::from_f32(v)).collect();
    let exact: Vec<f32> = wide.iter().map(|v| v.to_f32()).collect();
    let params: Vec<RowParams> = (0..rows)
        .map(|i| match i % 3 {
            0 => RowParams::temperature(0.0, i as u64, 0),
            1 => RowParams::temperature(0.8, 7 + i as u64, 2),
            _ => RowParams { top_k: 40, top_p: 0.9, ..RowParams::temperature(1.1, 3 + i as u64, 5) },
        })
        .collect();
    let want = run_sample(&exact, vocab, vocab, &params, 128).unwrap();
    let mut cpu = Cpu::new();
    let xp = cpu.upload(&wide).cast();
    let got = sample_on(cpu, xp, DType::BF16, vocab, vocab, &params, 128).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(got.ids, want.ids);
    assert_eq!(bits(&got.logprobs), bits(&want.logprobs));
    assert_eq!(bits(&got.thresh), bits(&want.thresh));
    assert!(want.thresh.iter().any(|t| t.is_finite()), "no sampled row kept a finite threshold");
}

#[test]
fn rows_are_independent_of_the_batch() {
    let mut rng = Rng::new(11);
    let vocab = 500;
    let x = random_logits(&mut rng, 5, vocab, vocab, 2.0);
    let params: Vec<RowParams> = (0..5).map(|i| RowParams::temperature(1.0, 99 + i, 3)).collect();
    let all = run_sample(&x, vocab, vocab, &params, 128).unwrap();
    // Row 3 alone, then in front of row 0.
    let row3 = &x[3 * vocab..4 * vocab];
    let alone = run_sample(row3, vocab, vocab, &params[3..4], 128).unwrap();
    let swapped: Vec<f32> = row3.iter().chain(&x[..vocab]).copied().collect();
    let pair = run_sample(&swapped, vocab, vocab, &[params[3], params[0]], 128).unwrap();
    assert_eq!(alone.ids[0], all.ids[3]);
    assert_eq!(pair.ids, vec![all.ids[3], all.ids[0]]);
    // Another step draws again: over 16 steps the ids are not all equal.
    let steps: Vec<RowParams> = (0..16).map(|s| RowParams { step: s, ..params[3] }).collect();
    let rows: Vec<f32> = (0..16).flat_map(|_| row3.iter().copied()).collect();
    let out = run_sample(&rows, vocab, vocab, &steps, 128).unwrap();
    assert!(out.ids.iter().any(|&v| v != out.ids[0]), "{:?}", out.ids);
}

#[test]
fn ties_at_the_thresholds_are_kept() {
    // Scattered copies of 4.0 behind one 5.0, over a tail of small values.
    let vocab = 200;
    let mut row: Vec<f32> = (0..vocab).map(|j| -1.0 - (j as f32) * 0.01).collect();
    row[150] = 5.0;
    for j in [3, 77, 140, 199] {
        row[j] = 4.0;
    }
    let base = RowParams::temperature(1.0, 3, 9);
    // k = 2 and k = 5 both end inside or at the tied group: 1 + 4 kept. The
    // top-p mass of {5.0} alone is about 0.37: p = 0.3 keeps it alone, p = 0.5
    // needs the whole tied group.
    let settings = [
        (RowParams { top_k: 2, ..base }, 5),
        (RowParams { top_k: 5, ..base }, 5),
        (RowParams { top_k: 6, ..base }, 6),
        (RowParams { top_p: 0.5, ..base }, 5),
        (RowParams { top_p: 0.3, ..base }, 1),
        (RowParams { top_k: 3, top_p: 0.95, ..base }, 5),
    ];
    let params: Vec<RowParams> = settings.iter().map(|s| s.0).collect();
    let x: Vec<f32> = (0..params.len()).flat_map(|_| row.iter().copied()).collect();
    let out = run_sample(&x, vocab, vocab, &params, 64).unwrap();
    for (i, (p, n_kept)) in settings.iter().enumerate() {
        let ws = &out.ws[i * vocab..(i + 1) * vocab];
        let kept = ws.iter().filter(|&&w| w > 0.0 && w >= out.thresh[i]).count();
        assert_eq!(kept, *n_kept, "{p:?}");
        assert_eq!(r::sample(&row, p).kept.iter().filter(|&&k| k).count(), *n_kept, "{p:?}");
        assert!(check_row(&row, p, &out, i, vocab).unwrap(), "{p:?}");
    }
}

#[test]
fn corner_settings_match_reference() {
    let mut rng = Rng::new(21);
    let vocab = 301;
    let base = RowParams::temperature(0.8, 77, 5);
    let settings = [
        RowParams { top_p: 0.0, ..base },
        RowParams { top_p: -1.0, ..base },
        RowParams { top_p: 1.5, ..base },
        RowParams { min_p: 1.0, ..base },
        RowParams { min_p: 5.0, ..base },
        RowParams { min_p: -1.0, ..base },
        RowParams { min_p: f32::NAN, top_p: f32::NAN, ..base },
        RowParams { top_k: -3, ..base },
        RowParams { top_k: vocab as i32 + 10, ..base },
        RowParams { top_k: 2, top_p: 0.01, min_p: 0.99, ..base },
        RowParams::temperature(1e-6, 1, 1),
        RowParams::temperature(f32::NAN, 1, 1),
        RowParams::temperature(1e-5, 1, 1),
        RowParams::temperature(1e6, 3, 4),
        RowParams { step: -1, seed: u64::MAX, ..base },
    ];
    let rows = settings.len();
    let x = random_logits(&mut rng, rows, vocab, vocab, 4.0);
    let out = run_sample(&x, vocab, vocab, &settings, 64).unwrap();
    for (i, p) in settings.iter().enumerate() {
        assert!(check_row(&x[i * vocab..(i + 1) * vocab], p, &out, i, vocab).unwrap(), "row {i} {p:?}");
    }
}

/// A token far above the rest at a low temperature: every other `w`
/// underflows to 0 in f32, so only that token can be drawn.
#[test]
fn underflowed_tokens_are_never_drawn() {
    let mut rng = Rng::new(5);
    let (rows, vocab) = (12, 300);
    let mut x = random_logits(&mut rng, rows, vocab, vocab, 1.0);
    for i in 0..rows {
        x[i * vocab + 17 + i] = 40.0;
    }
    let params: Vec<RowParams> = (0..rows).map(|i| RowParams::temperature(0.3, i as u64, i as i32)).collect();
    let out = run_sample(&x, vocab, vocab, &params, 64).unwrap();
    for (i, p) in params.iter().enumerate() {
        assert_eq!(out.ids[i], 17 + i as i32);
        assert!(check_row(&x[i * vocab..(i + 1) * vocab], p, &out, i, vocab).unwrap());
        let ws = &out.ws[i * vocab..(i + 1) * vocab];
        assert_eq!(ws.iter().filter(|&&w| w > 0.0).count(), 1);
    }
}

/// The chi-square statistic of `counts` against `probs` (cells with p > 0).
fn chi_square(counts: &[usize], probs: &[f64], n: usize) -> f64 {
    counts
        .iter()
        .zip(probs)
        .filter(|&(_, &p)| p > 0.0)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// The chi-square 0.9999 quantile for `df` degrees of freedom (1..=11).
fn chi_square_critical(df: usize) -> f64 {
    [15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83, 33.72, 35.56, 37.37][df - 1]
}

#[test]
fn draws_follow_the_kept_distribution() {
    let logits: Vec<f32> = vec![2.0, 1.5, -0.5, 0.25, 1.0, -1.0, 0.6, 1.75, -2.0, 0.1, 0.9, -0.2];
    let vocab = logits.len();
    let n = 3000;
    let settings = [
        RowParams::temperature(1.0, 5, 0),
        RowParams { top_k: 5, ..RowParams::temperature(0.8, 6, 0) },
        RowParams { top_p: 0.8, ..RowParams::temperature(1.2, 7, 0) },
        RowParams { top_k: 8, top_p: 0.9, min_p: 0.1, ..RowParams::temperature(0.9, 8, 0) },
    ];
    for base in settings {
        let params: Vec<RowParams> = (0..n).map(|s| RowParams { step: s as i32, ..base }).collect();
        let x: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
        let out = run_sample(&x, vocab, vocab, &params, 16).unwrap();
        let want = r::sample(&logits, &base);
        let mut counts = vec![0usize; vocab];
        for &id in &out.ids {
            counts[id as usize] += 1;
        }
        for (j, (&kept, &c)) in want.kept.iter().zip(&counts).enumerate() {
            assert!(kept || c == 0, "{base:?}: token {j} drawn {c} times but not kept");
        }
        let kept = want.kept.iter().filter(|&&k| k).count();
        let stat = chi_square(&counts, &want.probs, n);
        assert!(stat < chi_square_critical(kept - 1), "{base:?}: chi-square {stat} ({kept} kept) {counts:?}");
        // Power: the same draws against the unfiltered softmax at T = 1.
        if base.top_k > 0 || base.top_p < 1.0 || base.temperature != 1.0 {
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = logits.iter().map(|&v| ((v - m) as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            let full: Vec<f64> = e.iter().map(|v| v / s).collect();
            let off = chi_square(&counts, &full, n);
            assert!(off > 4.0 * chi_square_critical(vocab - 1), "{base:?}: {off}");
        }
    }
}

/// Runs `penalties` on the interpreter (in place); returns the logits.
#[allow(clippy::too_many_arguments)]
fn run_penalties(
    x: &[f32],
    slots: &[i32],
    prompt: &[i32],
    output: &[i32],
    rpf: &[(f32, f32, f32)],
    vocab: usize,
    stride: usize,
    block: usize,
) -> Result<Vec<f32>, String> {
    let rows = slots.len();
    let mut cpu = Cpu::new();
    let xp = cpu.upload(x);
    let (sp, pp, op) = (cpu.upload(slots), cpu.upload(prompt), cpu.upload(output));
    let rep: Vec<f32> = rpf.iter().map(|v| v.0).collect();
    let pres: Vec<f32> = rpf.iter().map(|v| v.1).collect();
    let freq: Vec<f32> = rpf.iter().map(|v| v.2).collect();
    let (rp, prp, fp) = (cpu.upload(&rep), cpu.upload(&pres), cpu.upload(&freq));
    let args = penalties::Args {
        logits_ptr: xp,
        slot_ptr: sp,
        prompt_ptr: pp,
        output_ptr: op,
        repetition_ptr: rp,
        presence_ptr: prp,
        frequency_ptr: fp,
        vocab: vocab as i32,
        stride: stride as i32,
        _marker: PhantomData,
    };
    let grid = [rows as u32, vocab.div_ceil(block) as u32, 1];
    penalties::interpret(&mut cpu, grid, &penalties::Config::new(block), &args).map_err(|e| e.to_string())?;
    Ok(cpu.read(xp))
}

/// Sparse random counts: mostly 0, some 1..4.
fn counts(rng: &mut Rng, n: usize) -> Vec<i32> {
    (0..n).map(|_| if rng.below(4) == 0 { 1 + rng.below(4) as i32 } else { 0 }).collect()
}

/// `(rows, vocab, stride, block)` of the mask and penalty tests: 1 to 6
/// rows of a vocabulary from [`vocabs`] up to 4 apart, blocks of 64 or 256.
fn logit_rows() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    (1usize..7, vocabs(), 0usize..5, any::<bool>())
        .prop_map(|(rows, vocab, gap, big)| (rows, vocab, vocab + gap, if big { 256 } else { 64 }))
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn token_mask_matches_reference(
        (rows, vocab, stride, block) in logit_rows(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let words = vocab.div_ceil(32);
        let x = random_logits(&mut rng, rows, vocab, stride, 5.0);
        // A random subset of the rows, in a random order.
        let mut order: Vec<i32> = (0..rows as i32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let masked: Vec<i32> = order.into_iter().filter(|_| rng.below(3) != 0).collect();
        let mask: Vec<u32> = (0..masked.len() * words)
            .map(|_| match rng.below(4) {
                0 => 0,
                1 => u32::MAX,
                _ => (rng.below(1 << 32)) as u32,
            })
            .collect();
        let mut cpu = Cpu::new();
        let xp = cpu.upload(&x);
        let rp = cpu.upload(&masked);
        let words_i32: Vec<i32> = mask.iter().map(|&w| w as i32).collect();
        let mp = cpu.upload(&words_i32);
        let args = apply_token_mask::Args {
            logits_ptr: xp,
            rows_ptr: rp,
            mask_ptr: mp,
            vocab: vocab as i32,
            stride: stride as i32,
            words: words as i32,
            _marker: PhantomData,
        };
        if !masked.is_empty() {
            let grid = [masked.len() as u32, vocab.div_ceil(block) as u32, 1];
            apply_token_mask::interpret(&mut cpu, grid, &apply_token_mask::Config::new(block), &args)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let got = cpu.read(xp);
        for i in 0..rows {
            let row = &x[i * stride..(i + 1) * stride];
            let mut want = row.to_vec();
            if let Some(p) = masked.iter().position(|&m| m as usize == i) {
                let w = r::apply_token_mask(&row[..vocab], &mask[p * words..(p + 1) * words]);
                want[..vocab].copy_from_slice(&w);
            }
            let g = &got[i * stride..(i + 1) * stride];
            let same = g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "row {} (masked {:?}) differs", i, masked);
        }
    }

    #[test]
    fn penalties_match_reference(
        (rows, vocab, stride, block) in logit_rows(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let n_slots = rows + 2;
        let x = random_logits(&mut rng, rows, vocab, stride, 5.0);
        let prompt = counts(&mut rng, n_slots * vocab);
        let output = counts(&mut rng, n_slots * vocab);
        // Distinct slots in a random order, about one in five negative.
        let mut order: Vec<i32> = (0..n_slots as i32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let slots: Vec<i32> = (0..rows).map(|i| if rng.below(5) == 0 { -1 } else { order[i] }).collect();
        let rpf: Vec<(f32, f32, f32)> = (0..rows)
            .map(|_| match rng.below(4) {
                0 => (1.0, 0.0, 0.0),
                1 => (rng.uniform(1.0, 2.0), 0.0, 0.0),
                2 => (1.0, rng.uniform(-1.0, 1.0), rng.uniform(-1.0, 1.0)),
                _ => (rng.uniform(0.5, 2.0), rng.uniform(-1.0, 2.0), rng.uniform(0.0, 1.0)),
            })
            .collect();
        let got = run_penalties(&x, &slots, &prompt, &output, &rpf, vocab, stride, block)
            .map_err(TestCaseError::fail)?;
        for i in 0..rows {
            let row = &x[i * stride..(i + 1) * stride];
            let mut want = row.to_vec();
            if slots[i] >= 0 {
                let s = slots[i] as usize * vocab;
                let (rep, pres, freq) = rpf[i];
                let w = r::penalties(&row[..vocab], &prompt[s..s + vocab], &output[s..s + vocab], rep, pres, freq);
                want[..vocab].copy_from_slice(&w);
            }
            let g = &got[i * stride..(i + 1) * stride];
            let same = g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "row {} (slot {}, {:?}) differs", i, slots[i], rpf[i]);
        }
    }

    #[test]
    fn token_counts_add_matches_reference(
        n in 1usize..300,
        vocab in 1usize..50,
        n_slots in 1usize..6,
        big in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let block = if big { 128 } else { 32 };
        let init = counts(&mut rng, n_slots * vocab);
        let slots: Vec<i32> =
            (0..n).map(|_| if rng.below(8) == 0 { -1 } else { rng.below(n_slots as u64) as i32 }).collect();
        let ids: Vec<i32> = (0..n).map(|_| rng.below(vocab as u64 + 2) as i32 - 1).collect();
        let mut cpu = Cpu::new();
        let (cp, sp, ip) = (cpu.upload(&init), cpu.upload(&slots), cpu.upload(&ids));
        let args = token_counts_add::Args {
            counts_ptr: cp, slot_ptr: sp, ids_ptr: ip, n: n as i32, vocab: vocab as i32, _marker: PhantomData,
        };
        token_counts_add::interpret(&mut cpu, [n.div_ceil(block) as u32, 1, 1], &token_counts_add::Config::new(block), &args)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut want = init.clone();
        r::token_counts_add(&mut want, &slots, &ids, vocab);
        prop_assert_eq!(cpu.read(cp), want);
    }
}

/// A batch proptest once found (`sample_matches_reference`): row 4 (top-k
/// 401, temperature 1.78) decides within the margin, so the kernel may
/// legitimately draw another token than the reference; its logprob must be
/// that of its own token.
#[test]
fn logprob_is_of_the_drawn_token_near_a_boundary() {
    let (exact, rows) = batch(1967047503493335221, 5, 1013, 3, 256, 4.0).unwrap();
    assert!(exact < rows, "row 4 must decide within the margin ({exact} of {rows} exact)");
}

/// `exp_units` of every element of `e_ptr` into `u_ptr` (`n` of them).
#[dsl_macros::kernel]
fn exp_units_of(e_ptr: Ptr<f32>, u_ptr: Ptr<i64>, n: i32, #[constexpr] BLOCK: usize) {
    let i = program_id(0) * BLOCK as i32 + arange(0, BLOCK);
    let e = load(e_ptr + i, mask = i < n, other = 0.0);
    store(u_ptr + i, kernels::sampling::exp_units(e), mask = i < n);
}

/// Greedy rows from the library's row maximum and fixed-point sum alone
/// (one program per row): the argmax, its logprob and `+inf`.
#[dsl_macros::kernel]
fn greedy_rows(
    logits_ptr: Ptr<f32>,
    ids_ptr: Ptr<i32>,
    logprobs_ptr: Ptr<f32>,
    thresh_ptr: Ptr<f32>,
    vocab: i32,
    stride: i32,
    #[constexpr] BLOCK: usize,
) {
    let row = program_id(0);
    let x_row = logits_ptr + row * stride;
    let (m, id) = kernels::sampling::row_argmax(x_row, vocab, BLOCK);
    let lsum = kernels::sampling::row_exp_sum(x_row, vocab, m, BLOCK);
    store(ids_ptr + row, id);
    store(logprobs_ptr + row, load(x_row + id) - m - log(lsum));
    store(thresh_ptr + row, f32::INFINITY);
}

/// `exp_units` is `e * 2^40` truncated, exactly, for weights in `[0, 1]`:
/// 1, powers of two down past the unit, subnormals, zero and random values.
#[test]
fn exp_units_truncate_to_multiples_of_the_unit() {
    let mut rng = Rng::new(40);
    let mut e: Vec<f32> = vec![1.0, 0.5, 0.75, 0.0, f32::MIN_POSITIVE, 1e-45, 2f32.powi(-40), 2f32.powi(-41)];
    e.extend((1..=48).map(|k| 2f32.powi(-k) * 1.337));
    e.extend((0..2000).map(|_| rng.uniform(0.0, 1.0)));
    e.extend((0..500).map(|_| (rng.uniform(-60.0, 0.0) as f64).exp() as f32));
    let mut cpu = Cpu::new();
    let n = e.len();
    let (ep, up) = (cpu.upload(&e), cpu.zeros::<i64>(n));
    let args = exp_units_of::Args { e_ptr: ep, u_ptr: up, n: n as i32, _marker: PhantomData };
    let block = 256;
    exp_units_of::interpret(
        &mut cpu,
        [n.div_ceil(block) as u32, 1, 1],
        &exp_units_of::Config::new(block),
        &args,
    )
    .unwrap();
    let got: Vec<i64> = cpu.read(up);
    for (&v, &g) in e.iter().zip(&got) {
        let want = (v as f64 * 2f64.powi(40)).floor() as i64;
        assert_eq!(g, want, "exp_units({v:e})");
    }
}

/// A greedy row's logprob sum is exact in fixed point: its logprob is the
/// same bits whatever chunk `sample` walks it in (a float sum's bits would
/// change with the chunk, which sets the per-lane partial sums), and a
/// kernel of `row_argmax` and `row_exp_sum` alone, with yet another chunk,
/// writes what `sample` writes for greedy rows. Sampled rows between them must keep their ids (the
/// draws do not depend on the chunk far from a boundary).
#[test]
fn logprobs_do_not_depend_on_the_chunk() {
    let mut rng = Rng::new(41);
    let (rows, vocab) = (120, 2999);
    let x = random_logits(&mut rng, rows, vocab, vocab, 6.0);
    let params: Vec<RowParams> = (0..rows)
        .map(|i| if i % 2 == 0 { RowParams::temperature(0.0, 0, 0) } else { random_params(&mut rng, vocab) })
        .collect();
    let outs: Vec<Out> =
        [64, 256, 1024].iter().map(|&b| run_sample(&x, vocab, vocab, &params, b).unwrap()).collect();
    for o in &outs[1..] {
        for (i, p) in params.iter().enumerate().filter(|(_, p)| p.greedy()) {
            assert_eq!(
                (o.ids[i], o.logprobs[i].to_bits()),
                (outs[0].ids[i], outs[0].logprobs[i].to_bits()),
                "row {i} {p:?}"
            );
        }
    }

    let mut cpu = Cpu::new();
    let xp = cpu.upload(&x);
    let (ip, lp, hp) = (cpu.zeros::<i32>(rows), cpu.zeros::<f32>(rows), cpu.zeros::<f32>(rows));
    let args = greedy_rows::Args {
        logits_ptr: xp,
        ids_ptr: ip,
        logprobs_ptr: lp,
        thresh_ptr: hp,
        vocab: vocab as i32,
        stride: vocab as i32,
        _marker: PhantomData,
    };
    greedy_rows::interpret(&mut cpu, [rows as u32, 1, 1], &greedy_rows::Config::new(128), &args).unwrap();
    let (ids, lps, th): (Vec<i32>, Vec<f32>, Vec<f32>) = (cpu.read(ip), cpu.read(lp), cpu.read(hp));
    for i in (0..rows).filter(|&i| params[i].greedy()) {
        assert_eq!(
            (ids[i], lps[i].to_bits(), th[i]),
            (outs[1].ids[i], outs[1].logprobs[i].to_bits(), outs[1].thresh[i])
        );
        assert_eq!(ids[i] as usize, r::argmax(&x[i * vocab..][..vocab]));
    }
}
