//! The checks of `kernels::fp8`: per-group FP8 quantization and its inverse
//! on the device against the interpreter, bit for bit (the conversions are
//! the hardware's `cvt.rn.satfinite` on sm_90a and integer code elsewhere,
//! the interpreter's those of the language's definition): codes, scales,
//! and every one of the 256 codes of each format decoded.

use crate::check::{CheckRow, DevicePtr, EXACT, Rng, compare, outcome};
use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::float8::{F8E4M3, F8E5M2};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::fp8::{dequantize_fp8, quantize_fp8};
use std::marker::PhantomData;

/// Codes and scales of `x` (`[rows, n]`) quantized to `Q`'s format on `dev`.
fn quantize_on<T: ActElem, Q: DeviceElem, D: Device>(
    dev: &mut D,
    x: &[T],
    (rows, n): (usize, usize),
    (group, groups): (usize, usize),
) -> Result<(Vec<u8>, Vec<f32>)> {
    let n_groups = n.div_ceil(group);
    let (xd, qd, sd) = (dev.upload(x)?, dev.zeros::<Q>(rows * n)?, dev.zeros::<f32>(rows * n_groups)?);
    let args = quantize_fp8::Args {
        x_ptr: dev.ptr(&xd)?,
        q_ptr: dev.ptr(&qd)?,
        s_ptr: dev.ptr(&sd)?,
        n: n as i32,
        stride: n as i32,
        _marker: PhantomData,
    };
    let config = quantize_fp8::Config::new(T::DEVICE_DTYPE, Q::DEVICE_DTYPE, group, groups);
    dev.run::<quantize_fp8::Kernel>([rows as u32, n.div_ceil(group * groups) as u32, 1], &config, &args)?;
    let codes = dev.download(&qd)?.iter().map(|q| code_of(*q)).collect();
    Ok((codes, dev.download(&sd)?))
}

/// The byte of an 8-bit float.
fn code_of<Q: DeviceElem>(q: Q) -> u8 {
    let mut b = [0u8];
    q.write_le(&mut b);
    b[0]
}

fn quantize_case<T: ActElem, Q: DeviceElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, n): (usize, usize),
    tiles: (usize, usize),
) -> Result<Vec<CheckRow>> {
    // Magnitudes over 2^-12 .. 2^12 in every row, an all-zero first group.
    let x: Vec<T> = (0..rows * n)
        .map(|i| {
            let e = (rng.next_u64() % 25) as i32 - 12;
            T::from_f64(if i < tiles.0.min(n) { 0.0 } else { rng.nonzero(2.0) * 2f64.powi(e) })
        })
        .collect();
    let (gc, gs) = quantize_on::<T, Q, D>(dev, &x, (rows, n), tiles)?;
    let (wc, ws) = quantize_on::<T, Q, Cpu>(&mut Cpu::new(), &x, (rows, n), tiles)?;
    let shape = format!("{rows}x{n} groups of {} -> {}", tiles.0, Q::DEVICE_DTYPE);
    Ok(vec![
        outcome("quantize_fp8 codes", shape.clone(), T::DEVICE_DTYPE, &gc, &wc, EXACT),
        outcome("quantize_fp8 scales", shape, T::DEVICE_DTYPE, &gs, &ws, EXACT),
    ])
}

/// The `quantize_fp8` check: f32 and bf16 inputs to E4M3 and E5M2, groups
/// of 128 (the block-scaled products' activation groups) and 32, ragged
/// rows; codes and scales bit for bit against the interpreter.
pub fn quantize<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (shape, tiles) in [((1, 300), (128, 2)), ((7, 4096), (128, 4)), ((33, 576), (32, 4))] {
        out.extend(quantize_case::<f32, F8E4M3, D>(dev, &mut rng, shape, tiles)?);
        out.extend(quantize_case::<bf16, F8E4M3, D>(dev, &mut rng, shape, tiles)?);
        out.extend(quantize_case::<f32, F8E5M2, D>(dev, &mut rng, shape, tiles)?);
        out.extend(quantize_case::<bf16, F8E5M2, D>(dev, &mut rng, shape, tiles)?);
    }
    Ok(out)
}

/// Every code of `Q`'s format dequantized with a scale of 1 to f32 on `dev`.
fn decode_all<Q: DeviceElem, D: Device>(dev: &mut D, codes: &[Q]) -> Result<Vec<f32>> {
    let (qd, sd, od) = (dev.upload(codes)?, dev.upload(&[1f32, 1.0])?, dev.zeros::<f32>(256)?);
    let args = dequantize_fp8::Args {
        q_ptr: dev.ptr(&qd)?,
        s_ptr: dev.ptr(&sd)?,
        out_ptr: dev.ptr(&od)?,
        n: 256,
        stride: 256,
        _marker: PhantomData,
    };
    let config = dequantize_fp8::Config::new(Q::DEVICE_DTYPE, DType::F32, 128, 1);
    dev.run::<dequantize_fp8::Kernel>([1, 2, 1], &config, &args)?;
    dev.download(&od)
}

fn decode_case<Q: DeviceElem, D: Device>(dev: &mut D) -> Result<CheckRow> {
    let codes: Vec<Q> = (0..=255u8).map(|b| Q::read_le(&[b])).collect();
    let got = decode_all::<Q, D>(dev, &codes)?;
    let want = decode_all::<Q, Cpu>(&mut Cpu::new(), &codes)?;
    // Bit for bit (signed zeros included); NaN codes only need to read as NaN.
    let same = |g: f32, w: f32| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
    let bits = |v: &[f32], w: &[f32]| -> Vec<f64> {
        v.iter().zip(w).map(|(&g, &w)| if same(g, w) { 0.0 } else { 1.0 }).collect()
    };
    let zero = vec![0.0; 256];
    Ok(compare(
        "dequantize_fp8 every code",
        "256 codes".into(),
        Q::DEVICE_DTYPE,
        &bits(&got, &want),
        &zero,
        EXACT,
    ))
}

/// The `dequantize_fp8` check: every code of both formats, bit for bit.
pub fn dequantize<D: Device>(dev: &mut D, _seed: u64) -> Result<Vec<CheckRow>> {
    Ok(vec![decode_case::<F8E4M3, D>(dev)?, decode_case::<F8E5M2, D>(dev)?])
}
