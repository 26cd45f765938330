//! The GPU checks of the sampling kernels (`kernels::sampling`): the GPU
//! against the CPU interpreter with the same random inputs.
//!
//! `sample`: SmolLM2's vocabulary (49152, 4096-element chunks, 16 warps, every
//! pointer and integer specialized), a ragged 32001 (not a multiple of 16, so
//! unspecialized) and a small ragged 1000 with a wider stride (1024-element
//! chunks, 4 warps); 5 to 16 rows each with mixed settings (greedy,
//! temperature, top-k, top-p, min-p and combinations, random seeds and
//! steps). Logits are LLM-like: a tail of values in `[-2, 2]`, a few dozen to
//! a few hundred candidates in `[4, 14]`, a few exact repeats and banned
//! (`-inf`) tokens. Per row:
//!
//! - the GPU id is in the GPU's own kept set `{ws >= thresh}`;
//! - ids, kept sets and thresholds must be **equal** to the interpreter's
//!   whenever the f64 reference's closest decision (min-p cut, top-k gap,
//!   top-p mass, inverse-CDF position) is at least `1e-4` relative from its
//!   boundary. Closer rows can legitimately differ: the GPU's `ex2.approx`
//!   and its reduction order move `w` and the f32 sums by a few 1e-6; they
//!   are counted in the shape column (`fragile`) and at least half the rows
//!   must be exact-checked;
//! - the workspace within `2e-5` relative (`1e-30` absolute) of the
//!   interpreter's, logprobs within `1e-4 + 1e-5 |lp|` (`lg2.approx`).
//!
//! `max_abs` is the largest logprob difference; `max_rel` the largest
//! workspace difference.
//!
//! `penalties` and `token_counts_add`: bit-exact (IEEE `div.rn`, no
//! contraction, integer atomics).

use crate::check::DevicePtr;
use crate::check::{CheckRow, Rng, over_cases};
use crate::cuda::{Cuda, DeviceElem};
use crate::error::Result;
use crate::model::Device;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::reference::sampling::{self as reference, RowParams};
use kernels::sampling::{block_for, penalties as pen, sample as smp, token_counts_add as tca, warps_for};
use std::marker::PhantomData;

/// Relative decision margin above which GPU and interpreter must agree exactly.
const MARGIN: f64 = 1e-4;

/// LLM-like logits: a flat tail and a few high candidates, some repeats and
/// banned tokens; `rows` rows at `stride`.
fn logits(rng: &mut Rng, rows: usize, vocab: usize, stride: usize) -> Vec<f32> {
    let mut x = vec![0.0f32; rows * stride];
    for r in 0..rows {
        let row = &mut x[r * stride..(r + 1) * stride];
        for v in row.iter_mut() {
            *v = (rng.unit() * 4.0 - 2.0) as f32;
        }
        let candidates = 20 + (rng.next_u64() % 300) as usize;
        for _ in 0..candidates.min(vocab) {
            let j = (rng.next_u64() % vocab as u64) as usize;
            row[j] = (4.0 + rng.unit() * 10.0) as f32;
        }
        for _ in 0..vocab / 50 {
            let (i, j) = ((rng.next_u64() % vocab as u64) as usize, (rng.next_u64() % vocab as u64) as usize);
            row[i] = row[j];
        }
        // Banned tokens; token 0 never is, so no row is all -inf.
        for _ in 0..vocab / 100 {
            let j = (rng.next_u64() % vocab as u64) as usize;
            if j != 0 {
                row[j] = f32::NEG_INFINITY;
            }
        }
    }
    x
}

/// Mixed per-row settings, the filters in the candidates' range.
fn params(rng: &mut Rng, vocab: usize) -> RowParams {
    let pick = |rng: &mut Rng, n: u64| rng.next_u64() % n;
    let temperature = match pick(rng, 5) {
        0 => 0.0,
        1 => 1.0,
        2 => 0.6,
        _ => (0.3 + rng.unit() * 1.2) as f32,
    };
    let top_k = match pick(rng, 4) {
        0 | 1 => 0,
        2 => [1, 2, 5, 20, 40][pick(rng, 5) as usize],
        _ => vocab as i32,
    };
    let top_p = match pick(rng, 3) {
        0 => 1.0,
        1 => 0.9,
        _ => (0.2 + rng.unit() * 0.75) as f32,
    };
    let min_p = match pick(rng, 3) {
        0 => 0.0,
        1 => 0.05,
        _ => (rng.unit() * 0.3) as f32,
    };
    RowParams { temperature, top_k, top_p, min_p, seed: rng.next_u64(), step: rng.next_u64() as i32 }
}

/// The per-row outputs of one backend.
struct Outputs {
    ids: Vec<i32>,
    logprobs: Vec<f32>,
    thresh: Vec<f32>,
    ws: Vec<f32>,
}

/// Runs `sample` on `dev` over `rows` rows of `x` (logits in `E`, of
/// dtype `dtype`) at `stride` with the per-row settings `ps` (the check's
/// config for `vocab`).
fn sample_on<D: Device, E: DeviceElem>(
    dev: &mut D,
    x: &[E],
    dtype: DType,
    ps: &[RowParams],
    vocab: usize,
    stride: usize,
) -> Result<Outputs> {
    let rows = ps.len();
    let temp: Vec<f32> = ps.iter().map(|p| p.temperature).collect();
    let top_k: Vec<i32> = ps.iter().map(|p| p.top_k).collect();
    let top_p: Vec<f32> = ps.iter().map(|p| p.top_p).collect();
    let min_p: Vec<f32> = ps.iter().map(|p| p.min_p).collect();
    let seed: Vec<i64> = ps.iter().map(|p| p.seed as i64).collect();
    let step: Vec<i32> = ps.iter().map(|p| p.step).collect();
    let block = block_for(vocab);
    let config = smp::Config::new(dtype, block).with_warps(warps_for(block));
    let (xd, wd) = (dev.upload(x)?, dev.zeros::<f32>(rows * stride)?);
    let (td, kd, pd, md) =
        (dev.upload(&temp)?, dev.upload(&top_k)?, dev.upload(&top_p)?, dev.upload(&min_p)?);
    let (sd, std_) = (dev.upload(&seed)?, dev.upload(&step)?);
    let (id, ld, hd) = (dev.zeros::<i32>(rows)?, dev.zeros::<f32>(rows)?, dev.zeros::<f32>(rows)?);
    let args = smp::Args {
        logits_ptr: dev.ptr(&xd)?,
        ws_ptr: dev.ptr(&wd)?,
        temperature_ptr: dev.ptr(&td)?,
        top_k_ptr: dev.ptr(&kd)?,
        top_p_ptr: dev.ptr(&pd)?,
        min_p_ptr: dev.ptr(&md)?,
        seed_ptr: dev.ptr(&sd)?,
        step_ptr: dev.ptr(&std_)?,
        ids_ptr: dev.ptr(&id)?,
        logprobs_ptr: dev.ptr(&ld)?,
        thresh_ptr: dev.ptr(&hd)?,
        vocab: vocab as i32,
        stride: stride as i32,
        _marker: PhantomData,
    };
    dev.run::<smp::Kernel>([rows as u32, 1, 1], &config, &args)?;
    Ok(Outputs {
        ids: dev.download(&id)?,
        logprobs: dev.download(&ld)?,
        thresh: dev.download(&hd)?,
        ws: dev.download(&wd)?,
    })
}

/// One `sample` row: the device against the interpreter on the same logits,
/// in f32 or (`bf16`, as the model's sampler reads them without a
/// conversion kernel) rounded to bf16; the reference takes their f32 values.
fn sample_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    vocab: usize,
    stride: usize,
    bf16_logits: bool,
) -> Result<CheckRow> {
    let mut x = logits(rng, rows, vocab, stride);
    let ps: Vec<RowParams> = (0..rows).map(|_| params(rng, vocab)).collect();
    let (got, want, dtype) = if bf16_logits {
        let narrow: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        x = narrow.iter().map(|v| v.to_f32()).collect();
        let got = sample_on(dev, &narrow, DType::BF16, &ps, vocab, stride)?;
        (got, sample_on(&mut Cpu::new(), &narrow, DType::BF16, &ps, vocab, stride)?, DType::BF16)
    } else {
        let got = sample_on(dev, &x, DType::F32, &ps, vocab, stride)?;
        (got, sample_on(&mut Cpu::new(), &x, DType::F32, &ps, vocab, stride)?, DType::F32)
    };

    let mut row = CheckRow::passing("sample", String::new(), dtype);
    let mut fragile = 0;
    for (r, p) in ps.iter().enumerate() {
        let xr = &x[r * stride..r * stride + vocab];
        let re = reference::sample(xr, p);
        let d = (got.logprobs[r] as f64 - want.logprobs[r] as f64).abs();
        row.max_abs = row.max_abs.max(d);
        if d.is_nan() || d > 1e-4 + 1e-5 * (want.logprobs[r] as f64).abs() {
            row.pass = false;
        }
        if re.greedy {
            row.pass &= got.ids[r] == want.ids[r] && got.thresh[r] == f32::INFINITY;
            continue;
        }
        let (gw, cw) = (&got.ws[r * stride..r * stride + vocab], &want.ws[r * stride..r * stride + vocab]);
        let g_id = got.ids[r];
        let in_kept = g_id >= 0 && (g_id as usize) < vocab && {
            let w = gw[g_id as usize];
            w > 0.0 && w >= got.thresh[r]
        };
        row.pass &= in_kept;
        if re.margin < MARGIN {
            fragile += 1;
            continue;
        }
        for (&a, &b) in gw.iter().zip(cw) {
            let d = (a as f64 - b as f64).abs();
            if b != 0.0 {
                row.max_rel = row.max_rel.max(d / (b as f64).abs());
            }
            if d.is_nan() || d > 1e-30 + 2e-5 * (b as f64).abs() {
                row.pass = false;
            }
        }
        let kept = |w: &[f32], t: f32| w.iter().map(|&v| v > 0.0 && v >= t).collect::<Vec<bool>>();
        row.pass &= kept(gw, got.thresh[r]) == kept(cw, want.thresh[r]);
        row.pass &= g_id == want.ids[r];
    }
    row.pass &= fragile * 2 <= rows;
    row.shape = format!("{rows}x{vocab} (stride {stride}, {fragile} fragile)");
    Ok(row)
}

/// The `sample` check: 49152 (SmolLM2), ragged 32001 and 1000, and bf16
/// logits (the model's) at 49152 and 1000.
pub fn sample<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let cases = [
        (16, 49152, 49152, false),
        (7, 32001, 32001, false),
        (5, 1000, 1003, false),
        (16, 49152, 49152, true),
        (5, 1000, 1003, true),
    ];
    over_cases(dev, seed, cases, |dev, rng, (n, vocab, stride, narrow)| {
        sample_case(dev, rng, n, vocab, stride, narrow)
    })
}

/// Sparse random counts: mostly 0, some 1..4.
fn counts(rng: &mut Rng, n: usize) -> Vec<i32> {
    (0..n)
        .map(|_| if rng.next_u64().is_multiple_of(4) { 1 + (rng.next_u64() % 4) as i32 } else { 0 })
        .collect()
}

/// The inputs of one `penalties` launch.
struct PenaltyInputs {
    /// Logits, rows at `stride`.
    logits: Vec<f32>,
    /// Each row's counts slot (-1: none).
    slots: Vec<i32>,
    /// Prompt token counts per slot.
    prompt: Vec<i32>,
    /// Output token counts per slot.
    output: Vec<i32>,
    /// Per-row repetition penalties.
    rep: Vec<f32>,
    /// Per-row presence penalties.
    pres: Vec<f32>,
    /// Per-row frequency penalties.
    freq: Vec<f32>,
}

/// The logits after `penalties` of `inp` on `dev`.
fn penalties_on<D: Device>(
    dev: &mut D,
    inp: &PenaltyInputs,
    vocab: usize,
    stride: usize,
) -> Result<Vec<f32>> {
    let block = 1024;
    let grid = [inp.rep.len() as u32, vocab.div_ceil(block) as u32, 1];
    let (xd, sd) = (dev.upload(&inp.logits)?, dev.upload(&inp.slots)?);
    let (pd, od) = (dev.upload(&inp.prompt)?, dev.upload(&inp.output)?);
    let (rd, prd, fd) = (dev.upload(&inp.rep)?, dev.upload(&inp.pres)?, dev.upload(&inp.freq)?);
    let args = pen::Args {
        logits_ptr: dev.ptr(&xd)?,
        slot_ptr: dev.ptr(&sd)?,
        prompt_ptr: dev.ptr(&pd)?,
        output_ptr: dev.ptr(&od)?,
        repetition_ptr: dev.ptr(&rd)?,
        presence_ptr: dev.ptr(&prd)?,
        frequency_ptr: dev.ptr(&fd)?,
        vocab: vocab as i32,
        stride: stride as i32,
        _marker: PhantomData,
    };
    dev.run::<pen::Kernel>(grid, &pen::Config::new(block), &args)?;
    dev.download(&xd)
}

fn penalties_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    vocab: usize,
    stride: usize,
) -> Result<CheckRow> {
    let n_slots = rows + 3;
    let x: Vec<f32> = (0..rows * stride).map(|_| rng.nonzero(8.0) as f32).collect();
    let prompt = counts(rng, n_slots * vocab);
    let output = counts(rng, n_slots * vocab);
    let slots: Vec<i32> = (0..rows)
        .map(|r| if rng.next_u64().is_multiple_of(5) { -1 } else { ((r * 7 + 2) % n_slots) as i32 })
        .collect();
    let mut rep = Vec::new();
    let mut pres = Vec::new();
    let mut freq = Vec::new();
    for r in 0..rows {
        let identity = r % 4 == 3;
        rep.push(if identity { 1.0 } else { (0.5 + rng.unit() * 1.5) as f32 });
        pres.push(if identity { 0.0 } else { rng.nonzero(1.0) as f32 });
        freq.push(if identity { 0.0 } else { rng.nonzero(1.0) as f32 });
    }
    let inp = PenaltyInputs { logits: x, slots, prompt, output, rep, pres, freq };
    let got = penalties_on(dev, &inp, vocab, stride)?;
    let want = penalties_on(&mut Cpu::new(), &inp, vocab, stride)?;
    let mut row = CheckRow::passing("penalties", format!("{rows}x{vocab} (stride {stride})"), DType::F32);
    for (&a, &b) in got.iter().zip(&want) {
        let d = (a as f64 - b as f64).abs();
        row.max_abs = row.max_abs.max(d);
        row.pass &= a.to_bits() == b.to_bits();
    }
    Ok(row)
}

/// The `penalties` check: 49152 and a ragged vocabulary with a wider stride; bit-exact.
pub fn penalties<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let cases = [(9, 49152, 49152), (5, 1001, 1040)];
    over_cases(dev, seed, cases, |dev, rng, (n, vocab, stride)| penalties_case(dev, rng, n, vocab, stride))
}

/// The counts `init` after `token_counts_add` of `ids` into `slots` on `dev`.
fn token_counts_on<D: Device>(
    dev: &mut D,
    init: &[i32],
    slots: &[i32],
    ids: &[i32],
    vocab: usize,
) -> Result<Vec<i32>> {
    let (block, n) = (128, ids.len());
    let (cd, sd, id) = (dev.upload(init)?, dev.upload(slots)?, dev.upload(ids)?);
    let args = tca::Args {
        counts_ptr: dev.ptr(&cd)?,
        slot_ptr: dev.ptr(&sd)?,
        ids_ptr: dev.ptr(&id)?,
        n: n as i32,
        vocab: vocab as i32,
        _marker: PhantomData,
    };
    dev.run::<tca::Kernel>([n.div_ceil(block) as u32, 1, 1], &tca::Config::new(block), &args)?;
    dev.download(&cd)
}

fn token_counts_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    n: usize,
    vocab: usize,
    n_slots: usize,
) -> Result<CheckRow> {
    let init = counts(rng, n_slots * vocab);
    let slots: Vec<i32> = (0..n)
        .map(|_| if rng.next_u64().is_multiple_of(8) { -1 } else { (rng.next_u64() % n_slots as u64) as i32 })
        .collect();
    // Ids in [-1, vocab]: both ends invalid; small vocabularies give repeats.
    let ids: Vec<i32> = (0..n).map(|_| (rng.next_u64() % (vocab as u64 + 2)) as i32 - 1).collect();
    let got = token_counts_on(dev, &init, &slots, &ids, vocab)?;
    let want = token_counts_on(&mut Cpu::new(), &init, &slots, &ids, vocab)?;
    let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    Ok(CheckRow {
        kernel: "token_counts_add".into(),
        shape: format!("{n} ids, {n_slots}x{vocab}"),
        dtype: DType::I32,
        max_abs,
        max_rel: 0.0,
        pass: got == want,
    })
}

/// The `token_counts_add` check: decode-sized and prompt-sized id lists
/// (repeats, invalid slots and ids); exact.
pub fn token_counts_add<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let cases = [(37, 49152, 64), (5000, 300, 3), (1, 7, 1)];
    over_cases(dev, seed, cases, |dev, rng, (n, vocab, slots)| token_counts_case(dev, rng, n, vocab, slots))
}

/// Latency benchmarks of the sampling kernels (`tessera bench`, family
/// `sampling`), in microseconds per launch (L2 flushed before each run, as
/// every bench): `sample` over LLM-like logits (the check's generator) at
/// SmolLM2's vocabulary for 1 and 64 rows, all rows with one setting:
/// `greedy`, `temp` (T = 0.7, no filter), `top_p` (T = 0.7, p = 0.9) and
/// `k_p_minp` (T = 0.7, k = 50, p = 0.95, min-p 0.05); and `penalties` on
/// 64 rows (every row active).
pub fn bench_records(
    cuda: &mut Cuda,
    opts: &crate::bench::BenchOptions,
) -> Result<Vec<crate::bench::Record>> {
    use crate::bench::{Record, push_measured, time_median_ms};
    let vocab = 49152;
    let block = block_for(vocab);
    let config = smp::Config::new(DType::F32, block).with_warps(warps_for(block));
    let mut out = Vec::new();
    let settings: [(&str, RowParams); 4] = [
        ("greedy", RowParams::temperature(0.0, 1, 0)),
        ("temp", RowParams::temperature(0.7, 1, 0)),
        ("top_p", RowParams { top_p: 0.9, ..RowParams::temperature(0.7, 1, 0) }),
        ("k_p_minp", RowParams { top_k: 50, top_p: 0.95, min_p: 0.05, ..RowParams::temperature(0.7, 1, 0) }),
    ];
    for rows in [1usize, 64] {
        let mut rng = Rng::new(rows as u64);
        let x = logits(&mut rng, rows, vocab, vocab);
        for (name, p) in settings {
            let ps: Vec<RowParams> =
                (0..rows).map(|r| RowParams { seed: r as u64 * 7 + 1, step: r as i32, ..p }).collect();
            let gpu = cuda.gpu();
            let xd = gpu.upload(&x)?;
            let wd = gpu.zeros::<f32>(rows * vocab)?;
            let td = gpu.upload(&ps.iter().map(|p| p.temperature).collect::<Vec<f32>>())?;
            let kd = gpu.upload(&ps.iter().map(|p| p.top_k).collect::<Vec<i32>>())?;
            let pd = gpu.upload(&ps.iter().map(|p| p.top_p).collect::<Vec<f32>>())?;
            let md = gpu.upload(&ps.iter().map(|p| p.min_p).collect::<Vec<f32>>())?;
            let sd = gpu.upload(&ps.iter().map(|p| p.seed as i64).collect::<Vec<i64>>())?;
            let std_ = gpu.upload(&ps.iter().map(|p| p.step).collect::<Vec<i32>>())?;
            let (id, ld, hd) = (gpu.zeros::<i32>(rows)?, gpu.zeros::<f32>(rows)?, gpu.zeros::<f32>(rows)?);
            let args = smp::Args {
                logits_ptr: xd.ptr().cast(),
                ws_ptr: wd.ptr(),
                temperature_ptr: td.ptr(),
                top_k_ptr: kd.ptr(),
                top_p_ptr: pd.ptr(),
                min_p_ptr: md.ptr(),
                seed_ptr: sd.ptr(),
                step_ptr: std_.ptr(),
                ids_ptr: id.ptr(),
                logprobs_ptr: ld.ptr(),
                thresh_ptr: hd.ptr(),
                vocab: vocab as i32,
                stride: vocab as i32,
                _marker: PhantomData,
            };
            let grid = [rows as u32, 1, 1];
            let ms =
                time_median_ms(cuda, opts.warmup, opts.runs, |c| c.run::<smp::Kernel>(grid, &config, &args))?;
            push_measured(&mut out, Record::latency(format!("sample/f32/{rows}x{vocab}/{name}"), ms));
        }
    }
    let rows = 64;
    let mut rng = Rng::new(64);
    let x: Vec<f32> = (0..rows * vocab).map(|_| rng.nonzero(8.0) as f32).collect();
    let (prompt, output) = (counts(&mut rng, rows * vocab), counts(&mut rng, rows * vocab));
    let slots: Vec<i32> = (0..rows as i32).collect();
    let gpu = cuda.gpu();
    let (xd, sd, pd, od) = (gpu.upload(&x)?, gpu.upload(&slots)?, gpu.upload(&prompt)?, gpu.upload(&output)?);
    let (rd, prd, fd) = (gpu.upload(&[1.1f32; 64])?, gpu.upload(&[0.5f32; 64])?, gpu.upload(&[0.25f32; 64])?);
    let args = pen::Args {
        logits_ptr: xd.ptr(),
        slot_ptr: sd.ptr(),
        prompt_ptr: pd.ptr(),
        output_ptr: od.ptr(),
        repetition_ptr: rd.ptr(),
        presence_ptr: prd.ptr(),
        frequency_ptr: fd.ptr(),
        vocab: vocab as i32,
        stride: vocab as i32,
        _marker: PhantomData,
    };
    let block = 1024;
    let config = pen::Config::new(block);
    let grid = [rows as u32, vocab.div_ceil(block) as u32, 1];
    let ms = time_median_ms(cuda, opts.warmup, opts.runs, |c| c.run::<pen::Kernel>(grid, &config, &args))?;
    push_measured(&mut out, Record::latency(format!("penalties/f32/{rows}x{vocab}"), ms));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check's inputs on the interpreter against the f64 reference (no
    /// GPU): few rows are near a decision boundary, so the GPU check's exact
    /// comparisons bite, and the exact ones agree with the reference.
    #[test]
    fn check_inputs_are_decisive_on_the_interpreter() {
        let mut rng = Rng::new(0x5eed);
        for (rows, vocab, stride) in [(16, 49152, 49152), (7, 32001, 32001), (5, 1000, 1003)] {
            let x = logits(&mut rng, rows, vocab, stride);
            let ps: Vec<RowParams> = (0..rows).map(|_| params(&mut rng, vocab)).collect();
            let out = sample_on(&mut Cpu::new(), &x, DType::F32, &ps, vocab, stride).unwrap();
            let mut fragile = 0;
            for (r, p) in ps.iter().enumerate() {
                let want = reference::sample(&x[r * stride..r * stride + vocab], p);
                if want.margin < MARGIN {
                    fragile += 1;
                    continue;
                }
                assert_eq!(out.ids[r] as usize, want.id, "{vocab}: row {r} {p:?}");
            }
            assert!(fragile * 4 <= rows, "{vocab}: {fragile} of {rows} rows near a boundary");
        }
    }
}
