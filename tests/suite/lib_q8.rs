//! Kernel library: the 8-bit-activation GEMVs (`kernels::dequant::q8`) on the
//! interpreter.
//!
//! - `quantize_q8` must reproduce `reference::quant::quantize_q8` bit for bit
//!   (quants and block scales) on random non-zero f32/bf16 rows of ragged
//!   lengths (K a multiple of 32, not of the kernel's block), and on a row
//!   with an all-zero block (scale 0, quants 0).
//! - `gemv_q4_1_q8`, `gemv_q4_0_q8`, `gemv_q8_0_q8` (with and without the
//!   SiLU-mul epilogue) on random GGUF weights (built as raw GGUF blocks and
//!   repacked, like `lib_dequant`) against the f64 product with the
//!   *quantized* activations, within `reference::quant::error_bound_q8` plus
//!   the output rounding; ragged `M` (1..9) and `N`, `K` from 0 to 2 whole K
//!   tiles plus a partial one (both loops), every autotune config of the
//!   Q4_1 kernel and the first of the others.
//! - The quantized result is also within `q8_activation_bound` of the
//!   product with the unquantized activations.
//! - `rmsnorm_q8` (RMSNorm fused with the quantization) equals `rmsnorm`
//!   then the quantization rule bit for bit, on ragged rows with a row
//!   stride, and stays within half a step of the f64 RMSNorm.

use super::lib_dequant::{
    Act, Case, activations, check_outputs, gguf_weight, random_weight, reference_gemvs,
};
use crate::common::cases;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::dequant::q8::{gemv_q8, quantize_q8};
use kernels::dequant::{QuantFormat, Repacked, gemv_grid};
use kernels::reference::quant as r;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// Quantizes `x[m, k]` with the kernel; returns the quants and block scales.
fn quantize<T: Act>(x: &[T], m: usize, k: usize, block: usize) -> Result<(Vec<i8>, Vec<f32>), String> {
    let mut cpu = Cpu::new();
    let xp = cpu.upload(x);
    let (qp, dp) = (cpu.zeros::<i8>(m * k), cpu.zeros::<f32>(m * k / 32));
    let args =
        quantize_q8::Args { x_ptr: xp.cast(), xq_ptr: qp, xd_ptr: dp, k: k as i32, _marker: PhantomData };
    let grid = [k.div_ceil(block) as u32, m as u32, 1];
    quantize_q8::interpret(&mut cpu, grid, &quantize_q8::Config::new(T::DTYPE, block), &args)
        .map_err(|e| e.to_string())?;
    Ok((cpu.read(qp), cpu.read(dp)))
}

fn quantize_case<T: Act>(
    seed: u64,
    (m, k): (usize, usize),
    block: usize,
    zero_block: bool,
) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let mut x = activations::<T>(&mut rng, m * k);
    if zero_block {
        x[..32].iter_mut().for_each(|v| *v = T::from_f32(0.0));
    }
    let (q, d) = quantize(&x, m, k, block).map_err(TestCaseError::fail)?;
    let xf: Vec<f32> = x.iter().map(|v| v.to_f64() as f32).collect();
    let (wq, wd) = r::quantize_q8(&xf, k);
    prop_assert_eq!(&d, &wd, "block scales, m={} k={} block={}", m, k, block);
    prop_assert_eq!(&q, &wq, "quants, m={} k={} block={}", m, k, block);
    Ok(())
}

/// Which 8-bit GEMV.
#[derive(Clone, Copy, Debug)]
struct Tiles {
    m_block: usize,
    block_n: usize,
    block_k: usize,
}

/// The 8-bit GEMV of the quantized activations `(xq, xd)` and the repacked
/// weight `w` on the interpreter for the product of shape `(m, n, k)`.
fn gemv<T: Act>(
    format: QuantFormat,
    silu: bool,
    t: Tiles,
    (xq, xd): (&[i8], &[f32]),
    w: &Repacked,
    (m, n, k): (usize, usize, usize),
) -> Result<Vec<f64>, String> {
    let mut cpu = Cpu::new();
    let (xqp, xdp, qp, sp) = (cpu.upload(xq), cpu.upload(xd), cpu.upload(&w.quants), cpu.upload(&w.scales));
    let op = cpu.zeros::<T>(m * n);
    let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
    macro_rules! go {
        ($k:ident) => {{
            let args = $k::Args {
                xq_ptr: xqp,
                xd_ptr: xdp,
                q_ptr: qp,
                s_ptr: sp,
                out_ptr: op.cast(),
                m: m as i32,
                n: n as i32,
                k: k as i32,
                _marker: PhantomData,
            };
            let config = $k::Config::new(T::DTYPE, format, silu, t.m_block, t.block_n, t.block_k);
            $k::interpret(&mut cpu, grid, &config, &args).map_err(|e| e.to_string())?
        }};
    }
    go!(gemv_q8);
    Ok(cpu.read(op).iter().map(|v| v.to_f64()).collect())
}

fn gemv_case<T: Act>(c: Case, t: Tiles) -> Result<(), TestCaseError> {
    let Case { format, silu, m, n, k, .. } = c;
    let (mut rng, x) = c.activations::<T>();
    let xf: Vec<f32> = x.iter().map(|v| v.to_f64() as f32).collect();
    let (xq, xd) = r::quantize_q8(&xf, k);
    let xhat = r::dequantize_q8(&xq, &xd);
    let fail = |e: String| TestCaseError::fail(e);
    let (weight, raws) = random_weight(&mut rng, format, n, k, silu);
    let ys = reference_gemvs(format, &raws, n, k, &xhat, m);
    let got = gemv::<T>(format, silu, t, (&xq, &xd), &weight, (m, n, k)).map_err(fail)?;
    let bound = |y: &r::Gemv, i: usize| r::error_bound_q8(format, k, t.block_k, y.abs[i]);
    check_outputs::<T>(&got, &ys, n, bound, &format!("{format:?} {t:?} silu={silu} m={m} n={n} k={k}"))?;
    // Against the unquantized activations: within half a step per value.
    if !silu {
        let exact = r::gemv(format, &raws[0], n, k, &xf.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), m);
        for (i, &got_i) in got.iter().enumerate() {
            let (row, col) = (i / n, i % n);
            let (w, _) = r::dequant_row(format, &raws[0], k, col);
            let xrow: Vec<f64> = xf[row * k..(row + 1) * k].iter().map(|&v| f64::from(v)).collect();
            let bound = r::q8_activation_bound(&w, &xrow, &xd[row * k / 32..(row + 1) * k / 32])
                + 2.0 * r::error_bound_q8(format, k, t.block_k, ys[0].abs[i])
                + T::ROUND * got_i.abs();
            prop_assert!((got_i - exact.y[i]).abs() <= bound, "activation quantization bound at {i}");
        }
    }
    Ok(())
}

/// The Q4_1 kernel's autotune tiles (`M_BLOCK`, `BLOCK_N`, `BLOCK_K`), read
/// from its declared configs.
fn q4_tiles() -> Vec<(usize, usize, usize)> {
    let base = gemv_q8::Config::new(dsl_core::DType::F32, QuantFormat::Q4_1, false, 1, 8, 2048);
    gemv_q8::autotune_configs(&base).iter().map(|c| (c.M_BLOCK, c.BLOCK_N, c.BLOCK_K)).collect()
}

/// `rmsnorm_q8` on `x[m, stride]` (rows of `k` values) on the interpreter
/// against the interpreter's `rmsnorm` of each row quantized by the
/// reference rule, bit for bit; and the dequantized row within half a step
/// plus one `T` rounding of the f64 RMSNorm.
fn rmsnorm_q8_case<T: Act>(seed: u64, (m, k): (usize, usize), pad: usize) -> Result<(), TestCaseError> {
    use kernels::dequant::q8::rmsnorm_q8;
    use kernels::rmsnorm::{block_for, rmsnorm};
    let mut rng = Rng::new(seed);
    let stride = k + pad;
    let x = activations::<T>(&mut rng, m * stride);
    let w = activations::<T>(&mut rng, k);
    let eps = 1e-5f32;
    let block = block_for(k).max(32);
    let mut cpu = Cpu::new();
    let (xp, wp) = (cpu.upload(&x), cpu.upload(&w));
    let (qp, dp) = (cpu.zeros::<i8>(m * k), cpu.zeros::<f32>(m * k / 32));
    let args = rmsnorm_q8::Args {
        x_ptr: xp.cast(),
        w_ptr: wp.cast(),
        xq_ptr: qp,
        xd_ptr: dp,
        n_cols: k as i32,
        stride: stride as i32,
        eps,
        _marker: PhantomData,
    };
    rmsnorm_q8::interpret(&mut cpu, [m as u32, 1, 1], &rmsnorm_q8::Config::new(T::DTYPE, block), &args)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (q, d) = (cpu.read(qp), cpu.read(dp));
    let yp = cpu.zeros::<T>(m * stride);
    let nargs = rmsnorm::Args {
        x_ptr: xp.cast(),
        w_ptr: wp.cast(),
        out_ptr: yp.cast(),
        n_cols: k as i32,
        stride: stride as i32,
        eps,
        _marker: PhantomData,
    };
    rmsnorm::interpret(&mut cpu, [m as u32, 1, 1], &rmsnorm::Config::new(T::DTYPE, block, false), &nargs)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let y = cpu.read(yp);
    let yf: Vec<f32> =
        (0..m).flat_map(|r| y[r * stride..r * stride + k].iter().map(|v| v.to_f64() as f32)).collect();
    let (wq, wd) = r::quantize_q8(&yf, k);
    prop_assert_eq!(&d, &wd, "block scales, m={} k={}", m, k);
    prop_assert_eq!(&q, &wq, "quants, m={} k={}", m, k);
    let wf: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    for row in 0..m {
        let xs: Vec<f64> = x[row * stride..row * stride + k].iter().map(|v| v.to_f64()).collect();
        let exact = kernels::reference::norm::rmsnorm(&xs, &wf, 1, k, f64::from(eps), dsl_core::DType::F64);
        for c in 0..k {
            let step = f64::from(d[row * (k / 32) + c / 32]);
            let got = f64::from(q[row * k + c]) * step;
            let bound = step / 2.0 + exact[c].abs() * 2.0 * T::ROUND + 1e-6;
            prop_assert!((got - exact[c]).abs() <= bound, "row {} col {}: {} vs {}", row, c, got, exact[c]);
        }
    }
    Ok(())
}

/// `(m, k)` of the quantization tests: 1 to 3 rows of 32 to 1248 values (a
/// multiple of 32).
fn q8_rows() -> impl Strategy<Value = (usize, usize)> {
    (1usize..4, (1usize..40).prop_map(|kb| 32 * kb))
}

/// The `BLOCK`s `quantize_q8` is tested with.
fn quantize_blocks() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![64usize, 256, 1024])
}

proptest! {
    #![proptest_config(cases(16))]

    #[test]
    fn quantize_matches_the_reference_bit_for_bit(
        rows in q8_rows(),
        block in quantize_blocks(),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        if bf { quantize_case::<bf16>(seed, rows, block, false)? } else { quantize_case::<f32>(seed, rows, block, false)? }
    }

    #[test]
    fn rmsnorm_q8_equals_rmsnorm_then_quantize(
        rows in q8_rows(),
        pad in prop::sample::select(vec![0usize, 8, 64]),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        if bf { rmsnorm_q8_case::<bf16>(seed, rows, pad)? } else { rmsnorm_q8_case::<f32>(seed, rows, pad)? }
    }

    #[test]
    fn gemv_q8_ragged(
        m in 1usize..9,
        n in 1usize..40,
        whole in 0usize..3,
        part in 0usize..16,
        fmt in 0usize..3,
        silu in any::<bool>(),
        tiles in prop::sample::select(q4_tiles()),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let format = [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0][fmt];
        let (m_block, block_n, block_k) = match format {
            QuantFormat::Q4_1 => tiles,
            QuantFormat::Q4_0 => (1, 16, 1024),
            _ => (1, 16, 512),
        };
        // Keep the interpreter's work small: at most 8 rows per program.
        let t = Tiles { m_block: m_block.min(m), block_n, block_k };
        let t = Tiles { m_block: if t.m_block.is_power_of_two() { t.m_block } else { 1 }, ..t };
        // 0 to 2 whole K tiles (the pipelined loop) and a partial one (the
        // masked tail), K a multiple of 32.
        let k = (whole * t.block_k + 32 * part * t.block_k / 512).max(32);
        let c = Case { seed, format, silu, m, n, k };
        if bf { gemv_case::<bf16>(c, t)? } else { gemv_case::<f32>(c, t)? }
    }
}

#[test]
fn quantize_zero_block_has_zero_scale() {
    quantize_case::<f32>(3, (2, 96), 64, true).unwrap();
    quantize_case::<bf16>(4, (1, 64), 64, true).unwrap();
}

/// A wrong weight is caught: one flipped nibble moves an output by `d d_x q`
/// beyond the bound.
#[test]
fn bound_catches_one_wrong_nibble() {
    let (n, k, m) = (3, 64, 1);
    let mut rng = Rng::new(11);
    let x = activations::<f32>(&mut rng, m * k);
    let (xq, xd) = r::quantize_q8(&x, k);
    let xhat = r::dequantize_q8(&xq, &xd);
    let raw = gguf_weight(&mut rng, QuantFormat::Q4_1, n, k);
    let mut bad = raw.clone();
    bad[4] ^= 0x08; // row 0, block 0, byte 0: value 0 off by 8 d.
    let (good, wrong) =
        (r::gemv(QuantFormat::Q4_1, &raw, n, k, &xhat, m), r::gemv(QuantFormat::Q4_1, &bad, n, k, &xhat, m));
    let tol = r::error_bound_q8(QuantFormat::Q4_1, k, 1024, good.abs[0]);
    assert!((good.y[0] - wrong.y[0]).abs() > 4.0 * tol, "{} vs tol {tol}", (good.y[0] - wrong.y[0]).abs());
}
