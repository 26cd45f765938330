//! The checks of `kernels::embedding`: the Q8_0 row gather and the gather
//! from repacked tables (every format the model repacks its table in), each
//! exact against the interpreter, out-of-range ids giving zero rows.

use crate::check::{CheckRow, DevicePtr, EXACT, Rng, outcome, over_cases};
use crate::error::Result;
use crate::model::args::embedding_args;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use kernels::embedding::embedding_q8_0 as kernel;

/// A random Q8_0 table of `vocab` rows of `hidden` values (raw bytes): non-zero
/// f16 scales up to 0.1 in magnitude (the range of real embeddings), random i8 quants.
fn q8_0_table(rng: &mut Rng, vocab: usize, hidden: usize) -> Vec<u8> {
    let blocks = vocab * hidden / 32;
    let mut t = Vec::with_capacity(blocks * 34);
    for _ in 0..blocks {
        t.extend_from_slice(&f16::from_f64(rng.nonzero(0.1)).to_le_bytes());
        t.extend((0..32).map(|_| rng.next_u64() as u8));
    }
    t
}

/// The rows `ids` of the table `w` (`vocab` rows of `hidden` values) on `dev`.
fn embedding_on<T: ActElem, D: Device>(
    dev: &mut D,
    w: &[u8],
    ids: &[i32],
    (hidden, vocab): (usize, usize),
) -> Result<Vec<T>> {
    let tokens = ids.len();
    let block = kernels::embedding::block_for(hidden);
    let config = kernel::Config::new(T::DEVICE_DTYPE, block).with_warps(kernels::embedding::warps_for(block));
    let (wd, id, od) = (dev.upload(w)?, dev.upload(ids)?, dev.zeros::<T>(tokens * hidden)?);
    let args = embedding_args!(kernel, (dev.ptr(&id)?, dev.ptr(&od)?), (hidden, vocab), w_ptr: dev.ptr(&wd)?);
    dev.run::<kernel::Kernel>([tokens as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

fn embedding_q8_0_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (tokens, hidden, vocab): (usize, usize, usize),
    invalid: bool,
) -> Result<CheckRow> {
    let w = q8_0_table(rng, vocab, hidden);
    let mut ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
    if invalid {
        // Out-of-range ids give zero rows on both sides (the kernel's contract).
        ids[tokens / 2] = vocab as i32;
        ids[0] = -1;
    }
    let got = embedding_on::<T, _>(dev, &w, &ids, (hidden, vocab))?;
    let want = embedding_on::<T, _>(&mut Cpu::new(), &w, &ids, (hidden, vocab))?;
    let shape = format!("{tokens}x{hidden} of {vocab}{}", if invalid { " (2 invalid ids)" } else { "" });
    Ok(outcome("embedding_q8_0", shape, T::DEVICE_DTYPE, &got, &want, EXACT))
}

/// The `embedding_q8_0` check: ragged token counts, hidden 576 (SmolLM2, its
/// full 49152-row vocab once) and 4096 (a looped row), f32 and bf16 outputs,
/// exact (`d * q` is exact in f32; bf16 is one rounding of it on both sides).
pub fn embedding_q8_0<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let shapes = [(1, 576, 1000), (37, 576, 49152), (5, 4096, 300), (130, 4096, 64)];
    over_cases(dev, seed, shapes.into_iter().enumerate(), |dev, rng, (i, shape)| {
        Ok([
            embedding_q8_0_case::<f32, _>(dev, rng, shape, i == 2)?,
            embedding_q8_0_case::<bf16, _>(dev, rng, shape, i == 3)?,
        ])
    })
}

/// The rows `ids` of the repacked table `w` (`vocab` rows of `hidden`
/// values) gathered by `embedding_repacked` on `dev`.
fn repacked_on<T: ActElem, D: Device>(
    dev: &mut D,
    w: &kernels::dequant::Repacked,
    ids: &[i32],
    block: usize,
) -> Result<Vec<T>> {
    use kernels::embedding::embedding_repacked as k;
    let (tokens, hidden, vocab) = (ids.len(), w.k, w.n);
    let config =
        k::Config::new(T::DEVICE_DTYPE, w.format, block).with_warps(kernels::embedding::warps_for(block));
    let (qd, sd, id) = (dev.upload(&w.quants)?, dev.upload(&w.scales)?, dev.upload(ids)?);
    let od = dev.zeros::<T>(tokens * hidden)?;
    let args = embedding_args!(
        k,
        (dev.ptr(&id)?, dev.ptr(&od)?),
        (hidden, vocab),
        q_ptr: dev.ptr(&qd)?,
        s_ptr: dev.ptr(&sd)?,
    );
    dev.run::<k::Kernel>([tokens as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

/// The `embedding_repacked` check: each format a table is repacked in
/// (Q4_0, Q4_1, Q5_0 as Q8_0 planes, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16;
/// random GGUF bytes with finite scales), hidden 576 or 4096 (a looped row), ragged
/// token counts with two out-of-range ids, f32 and bf16 outputs, exact
/// against the interpreter (the same `fma`s on both sides).
pub fn embedding_repacked<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    use kernels::dequant::repack;
    over_cases(dev, seed, kernels::embedding::repacked_formats(), |dev, rng, format| {
        let hidden = if format.is_k_quant() { 4096 } else { 576 };
        let (vocab, tokens) = (300, 37);
        let raw = super::dequant::gguf_weight(rng, format, vocab, hidden);
        let w = repack(format, &raw, vocab, hidden).map_err(|e| crate::error::Error::Usage(e.to_string()))?;
        let mut ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
        ids[tokens / 2] = vocab as i32;
        ids[0] = -1;
        let block = kernels::embedding::block_for(hidden);
        let shape = format!("{} {tokens}x{hidden} of {vocab} (2 invalid ids)", format.name());
        let f = repacked_on::<f32, _>(dev, &w, &ids, block)?;
        let fw = repacked_on::<f32, _>(&mut Cpu::new(), &w, &ids, block)?;
        let h = repacked_on::<bf16, _>(dev, &w, &ids, block)?;
        let hw = repacked_on::<bf16, _>(&mut Cpu::new(), &w, &ids, block)?;
        Ok([
            outcome("embedding_repacked", shape.clone(), DType::F32, &f, &fw, EXACT),
            outcome("embedding_repacked", shape, DType::BF16, &h, &hw, EXACT),
        ])
    })
}
