//! GPU checks of the 8-bit-activation GEMVs (`kernels::dequant::q8`): the
//! `quantize_q8` kernel and `gemv_q4_1_q8`, `gemv_q4_0_q8`, `gemv_q8_0_q8`
//! (plain and SiLU-mul), on random GGUF weights and random non-zero bf16/f32
//! activations.
//!
//! - `quantize_q8` on ragged rows: GPU quants and block scales equal to the
//!   interpreter's and to `reference::quant::quantize_q8` bit for bit (the
//!   kernel's f32 divisions are IEEE on both).
//! - GEMVs on ragged shapes (`M` odd, `N` and `K` not multiples of the tiles,
//!   0 to 2 whole K tiles plus a partial one), every declared autotune config
//!   of `gemv_q4_1_q8` and the default of the others, and the bench shape
//!   M = 1, K = 4096, N = 14336 (Q4_1) and the LM-head shape M = 1, K = 576,
//!   N = 49152 (Q8_0): GPU against the f64 product with the quantized
//!   activations within `reference::quant::error_bound_q8` plus one rounding
//!   to the output dtype (plus the SiLU propagation bound), and against the
//!   interpreter within twice that (on the small shapes).

use crate::check::dequant::{Weight, gguf_rows};
use crate::check::rmsnorm::rmsnorm_on;
use crate::check::{CheckRow, DevicePtr, Rng, over_shapes, to_f64};
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::model::args::{norm_args, product_args};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::dequant::q8::{gemv_q8, quantize_q8};
use kernels::dequant::{QuantFormat, Repacked, gemv_grid};
use kernels::reference::quant as r;
use kernels::rmsnorm::{block_for, warps_for};
use std::marker::PhantomData;

/// The ragged `(rows, k)` of the quantize and RMSNorm + quantize checks.
const QUANT_SHAPES: [(usize, usize); 5] = [(1, 576), (3, 4096), (5, 1536), (2, 96), (1, 32)];

/// The quantize kernel's block for rows of `k` values.
pub fn quantize_block(k: usize) -> usize {
    k.next_power_of_two().clamp(64, 1024)
}

/// `quantize_q8` of `x` (rows of `k`) on `dev`: the quants and the block scales.
fn quantize_on<T: ActElem, D: Device>(dev: &mut D, x: &[T], k: usize) -> Result<(Vec<i8>, Vec<f32>)> {
    let m = x.len() / k;
    let (xd, qd, dd) = (dev.upload(x)?, dev.zeros::<i8>(m * k)?, dev.zeros::<f32>(m * k / 32)?);
    let block = quantize_block(k);
    let config = quantize_q8::Config::new(T::DEVICE_DTYPE, block);
    let a = quantize_q8::Args {
        x_ptr: dev.ptr(&xd)?,
        xq_ptr: dev.ptr(&qd)?,
        xd_ptr: dev.ptr(&dd)?,
        k: k as i32,
        _marker: PhantomData,
    };
    dev.run::<quantize_q8::Kernel>([k.div_ceil(block) as u32, m as u32, 1], &config, &a)?;
    Ok((dev.download(&qd)?, dev.download(&dd)?))
}

/// The quantize check on one ragged shape.
fn quantize_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (m, k): (usize, usize),
) -> Result<[CheckRow; 1]> {
    let x = rng.values::<T>(m * k, 2.0);
    let block = quantize_block(k);
    let (gq, gd) = quantize_on(dev, &x, k)?;
    let (cq, cdv) = quantize_on(&mut Cpu::new(), &x, k)?;
    let xf: Vec<f32> = x.iter().map(|v| v.to_f64() as f32).collect();
    let (wq, wd) = r::quantize_q8(&xf, k);
    let (mut max_abs, mut pass) = (0.0f64, gq == cq && gq == wq);
    for ((g, c), w) in gd.iter().zip(&cdv).zip(&wd) {
        max_abs = max_abs.max(f64::from((g - w).abs()));
        pass &= g.to_bits() == w.to_bits() && c.to_bits() == w.to_bits();
    }
    let q_off = gq.iter().zip(&wq).filter(|(a, b)| a != b).count();
    max_abs = max_abs.max(q_off as f64);
    Ok([CheckRow {
        kernel: "quantize_q8".into(),
        shape: format!("{m}x{k} block {block}"),
        dtype: T::DEVICE_DTYPE,
        max_abs,
        max_rel: 0.0,
        pass,
    }])
}

/// The norms' epsilon.
const EPS: f32 = 1e-5;

/// `rmsnorm_q8` of the rows of `x` (`w.len()` values, `stride` apart) with
/// weight `w` on `dev`: the quants and the block scales.
fn rmsnorm_q8_on<T: ActElem, D: Device>(
    dev: &mut D,
    (x, w): (&[T], &[T]),
    stride: usize,
    block: usize,
) -> Result<(Vec<i8>, Vec<f32>)> {
    use kernels::dequant::q8::rmsnorm_q8;
    let (k, m) = (w.len(), x.len() / stride);
    let (xd, wd) = (dev.upload(x)?, dev.upload(w)?);
    let (qd, dd) = (dev.zeros::<i8>(m * k)?, dev.zeros::<f32>(m * k / 32)?);
    let config = rmsnorm_q8::Config::new(T::DEVICE_DTYPE, block).with_warps(warps_for(block));
    let xw = (dev.ptr(&xd)?, dev.ptr(&wd)?);
    let a = norm_args!(rmsnorm_q8, xw, (k, stride, EPS), xq_ptr: dev.ptr(&qd)?, xd_ptr: dev.ptr(&dd)?);
    dev.run::<rmsnorm_q8::Kernel>([m as u32, 1, 1], &config, &a)?;
    Ok((dev.download(&qd)?, dev.download(&dd)?))
}

/// The fused RMSNorm + quantize check on one ragged shape (rows `stride`
/// apart): the interpreter's quants and scales equal, bit for bit, the
/// interpreter's `rmsnorm` of each row quantized by
/// `reference::quant::quantize_q8` (the rule the `quantize_q8` kernel meets
/// bit for bit); the GPU's are within one quant and 1e-5 relative of them
/// (its `rsqrt` is approximate); the GPU's dequantized row is within half a
/// quantization step of the f64 RMSNorm (plus one rounding to `T`).
fn rmsnorm_quant_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (m, k): (usize, usize),
) -> Result<[CheckRow; 1]> {
    let stride = k + 32;
    let x = rng.values::<T>(m * stride, 2.0);
    let w = rng.values::<T>(k, 1.5);
    let block = block_for(k).max(32);
    let (gq, gd) = rmsnorm_q8_on(dev, (&x, &w), stride, block)?;
    let (cq, cdv) = rmsnorm_q8_on(&mut Cpu::new(), (&x, &w), stride, block)?;
    // The unfused pair on the interpreter: `rmsnorm` of each row, then the
    // quantization rule (`reference::quant::quantize_q8`, which the
    // `quantize_q8` kernel matches bit for bit).
    let ys = rmsnorm_on(&mut Cpu::new(), (&x, &w), stride, (block, warps_for(block)))?;
    let y: Vec<T> = (0..m).flat_map(|r| ys[r * stride..r * stride + k].iter().copied()).collect();
    let yf: Vec<f32> = y.iter().map(|v| v.to_f64() as f32).collect();
    let (wq, wdv) = r::quantize_q8(&yf, k);
    // The interpreter's fused kernel is the unfused pair bit for bit. The
    // GPU's `rsqrt` is not correctly rounded, so its normalized row may sit
    // an ulp away: a quant may move by one at a rounding tie and a scale by
    // a few ulps; the bound below holds either way.
    let mut pass = cq == wq && cdv.iter().zip(&wdv).all(|(c, e)| c.to_bits() == e.to_bits());
    pass &= gq.iter().zip(&cq).all(|(g, c)| (i32::from(*g) - i32::from(*c)).abs() <= 1);
    for (g, c) in gd.iter().zip(&cdv) {
        pass &= f64::from((g - c).abs()) <= f64::from(c.abs()) * 1e-5;
    }
    // Against f64 RMSNorm: |q d - y| <= d / 2 + one rounding of y to `T`.
    let unit = crate::check::unit_roundoff(T::DEVICE_DTYPE);
    let mut max_abs = 0.0f64;
    for row in 0..m {
        let xs: Vec<f64> = x[row * stride..row * stride + k].iter().map(|v| v.to_f64()).collect();
        let ms = xs.iter().map(|v| v * v).sum::<f64>() / k as f64;
        let rstd = 1.0 / (ms + f64::from(EPS)).sqrt();
        for c in 0..k {
            let want = xs[c] * rstd * w[c].to_f64();
            let d = f64::from(gd[row * (k / 32) + c / 32]);
            let got = f64::from(gq[row * k + c]) * d;
            let err = (got - want).abs();
            max_abs = max_abs.max(err);
            pass &= err <= d / 2.0 + want.abs() * unit * 2.0 + d * 1e-3 + 1e-6;
        }
    }
    Ok([CheckRow {
        kernel: "rmsnorm_q8".into(),
        shape: format!("{m}x{k} stride {stride} block {block}"),
        dtype: T::DEVICE_DTYPE,
        max_abs,
        max_rel: 0.0,
        pass,
    }])
}

/// Registry check `rmsnorm_q8`.
pub fn rmsnorm_quant<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &QUANT_SHAPES, [rmsnorm_quant_case::<f32, D>, rmsnorm_quant_case::<bf16, D>])
}

/// An 8-bit GEMV of the quantized activations `(xq, xd)` (`m` rows) and
/// weight `w` (`n` outputs, or SiLU-mul of `2n` interleaved rows) with
/// `tiles = (m_block, block_n, block_k, warps)` on `dev`: `out[m, n]` as f64.
#[allow(clippy::too_many_arguments)]
fn gemv_q8_on<T: ActElem, D: Device>(
    dev: &mut D,
    format: QuantFormat,
    silu: bool,
    (xq, xd): (&[i8], &[f32]),
    w: &Repacked,
    (m, n): (usize, usize),
    (m_block, block_n, block_k, warps): (usize, usize, usize, u32),
) -> Result<Vec<f64>> {
    let (xqd, xdd) = (dev.upload(xq)?, dev.upload(xd)?);
    let (qd, sd, od) = (dev.upload(&w.quants)?, dev.upload(&w.scales)?, dev.zeros::<T>(m * n)?);
    let grid = gemv_grid(m, n, silu, m_block, block_n);
    macro_rules! go {
        ($k:ident) => {{
            let config =
                $k::Config::new(T::DEVICE_DTYPE, format, silu, m_block, block_n, block_k).with_warps(warps);
            let planes = (dev.ptr(&qd)?, dev.ptr(&sd)?, dev.ptr(&od)?);
            let a = product_args!($k, planes, (m, n, w.k), xq_ptr: dev.ptr(&xqd)?, xd_ptr: dev.ptr(&xdd)?);
            dev.run::<$k::Kernel>(grid, &config, &a)?;
        }};
    }
    go!(gemv_q8);
    Ok(to_f64(&dev.download(&od)?))
}

/// One 8-bit GEMV problem: `tiles = (m_block, block_n, block_k, warps)`;
/// with `interp`, also against the interpreter; `rows` limits the reference
/// to a subset of output columns on large shapes.
#[allow(clippy::too_many_arguments)]
fn gemv_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    format: QuantFormat,
    silu: bool,
    (m, n, k): (usize, usize, usize),
    tiles: (usize, usize, usize, u32),
    interp: bool,
) -> Result<CheckRow> {
    let (m_block, block_n, block_k, warps) = tiles;
    let x = rng.values::<T>(m * k, 2.0);
    let xf: Vec<f32> = x.iter().map(|v| v.to_f64() as f32).collect();
    let (xq, xdv) = r::quantize_q8(&xf, k);
    let xhat = r::dequantize_q8(&xq, &xdv);
    let w = Weight::random(rng, format, silu, n, k)?;
    let got = gemv_q8_on::<T, _>(dev, format, silu, (&xq, &xdv), &w.repacked, (m, n), tiles)?;
    let cpu_out = if interp {
        Some(gemv_q8_on::<T, _>(&mut Cpu::new(), format, silu, (&xq, &xdv), &w.repacked, (m, n), tiles)?)
    } else {
        None
    };
    let (g_raw, u_raw) = w.raws();
    // The reference on at most 64 output columns (spread over the row).
    let cols: Vec<usize> = if n <= 64 { (0..n).collect() } else { (0..64).map(|i| i * n / 64).collect() };
    let sub = |raw: &[u8]| gguf_rows(format, raw, k, &cols);
    let g = r::gemv(format, &sub(g_raw), cols.len(), k, &xhat, m);
    let u = u_raw.map(|u| r::gemv(format, &sub(u), cols.len(), k, &xhat, m));
    let round = crate::check::unit_roundoff(T::DEVICE_DTYPE).max(f64::powi(2.0, -23));
    let shape = format!(
        "{m}x{k}x{n} {}tiles {m_block}/{block_n}/{block_k} w{warps}",
        if silu { "silu " } else { "" }
    );
    let mut row =
        CheckRow::passing(format!("gemv_{}_q8", format.name().to_lowercase()), shape, T::DEVICE_DTYPE);
    for i in 0..m {
        for (j, &c) in cols.iter().enumerate() {
            let e = i * cols.len() + j;
            let eg = r::error_bound_q8(format, k, block_k, g.abs[e]);
            let (want, tol) = match &u {
                Some(u) => {
                    let eu = r::error_bound_q8(format, k, block_k, u.abs[e]);
                    (r::silu_mul(g.y[e], u.y[e]), r::silu_mul_bound(g.y[e], u.y[e], eg, eu))
                }
                None => (g.y[e], eg),
            };
            let tol = tol + round * (want.abs() + tol) + 1e-30;
            let v = got[i * n + c];
            let diff = if (v - want).abs().is_nan() { f64::INFINITY } else { (v - want).abs() };
            row.max_abs = row.max_abs.max(diff);
            if want != 0.0 {
                row.max_rel = row.max_rel.max(diff / want.abs());
            }
            let vs_cpu = cpu_out.as_ref().map_or(0.0, |o| (v - o[i * n + c]).abs());
            if diff > tol || vs_cpu.is_nan() || vs_cpu > 2.0 * tol {
                row.pass = false;
            }
        }
    }
    Ok(row)
}

/// Registry check `quantize_q8`.
pub fn quantize<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &QUANT_SHAPES, [quantize_case::<f32, D>, quantize_case::<bf16, D>])
}

/// The autotune tiles of `gemv_q4_1_q8` as `(M_BLOCK, BLOCK_N, BLOCK_K,
/// num_warps)`, read from the kernel's declared configs (so a new config is
/// checked without editing this file).
fn q4_tiles() -> Vec<(usize, usize, usize, u32)> {
    let base = gemv_q8::Config::new(dsl_core::DType::BF16, QuantFormat::Q4_1, false, 1, 8, 2048);
    gemv_q8::autotune_configs(&base).iter().map(|c| (c.M_BLOCK, c.BLOCK_N, c.BLOCK_K, c.num_warps)).collect()
}

/// Registry check `gemv_q4_1_q8` (also runs the Q4_0 and Q8_0 variants).
pub fn gemv<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    let tiles = q4_tiles();
    for &t in &tiles {
        // 0, 1 and 2 whole K tiles plus a partial one.
        for whole in 0..3 {
            let k = whole * t.2 + 160;
            rows.push(gemv_case::<bf16, _>(dev, &mut rng, QuantFormat::Q4_1, false, (3, 37, k), t, true)?);
        }
        rows.push(gemv_case::<f32, _>(dev, &mut rng, QuantFormat::Q4_1, true, (5, 21, t.2 + 96), t, true)?);
    }
    let q40 = (1, 16, 1024, 4);
    rows.push(gemv_case::<bf16, _>(dev, &mut rng, QuantFormat::Q4_0, false, (7, 45, 1024 + 224), q40, true)?);
    rows.push(gemv_case::<bf16, _>(dev, &mut rng, QuantFormat::Q4_0, true, (2, 19, 576), q40, true)?);
    let q80 = (1, 4, 1024, 2);
    rows.push(gemv_case::<bf16, _>(dev, &mut rng, QuantFormat::Q8_0, false, (3, 53, 512 + 64), q80, true)?);
    rows.push(gemv_case::<f32, _>(dev, &mut rng, QuantFormat::Q8_0, false, (1, 29, 1536), q80, true)?);
    // The bench and LM-head shapes against the reference alone.
    rows.push(gemv_case::<bf16, _>(
        dev,
        &mut rng,
        QuantFormat::Q4_1,
        false,
        (1, 14336, 4096),
        tiles[0],
        false,
    )?);
    rows.push(gemv_case::<bf16, _>(dev, &mut rng, QuantFormat::Q8_0, false, (1, 49152, 576), q80, false)?);
    Ok(rows)
}
