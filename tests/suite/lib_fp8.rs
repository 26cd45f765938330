//! Kernel library: per-group FP8 quantization (`kernels::fp8::quantize_fp8`)
//! on the interpreter against the reference: f32 and bf16 inputs, E4M3 and
//! E5M2 outputs, groups of 32 and 128 columns, ragged row lengths (a partial
//! last group, several programs per row) and magnitudes spread over many
//! binades per row, an all-zero group included. The codes and scales must
//! equal the reference's bit for bit, and the dequantized values must lie
//! within the reference's bound of the inputs. The block-scaled FP8 product
//! (`kernels::fp8::scaled_matmul_fp8`) against its f64 reference within the
//! derived bound.

use crate::common::{Storage, cases};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::fp8::quantize_fp8;
use kernels::reference::fp8 as r;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// Inputs `[rows, n]` in `T`, magnitudes `2^-12 .. 2^12` of random sign;
/// the first group of row 0 is all zero.
fn inputs<T: Storage>(rng: &mut Rng, rows: usize, n: usize, group: usize) -> Vec<T> {
    (0..rows * n)
        .map(|i| {
            if i < group.min(n) {
                return T::from_f64(0.0);
            }
            let m = f64::from(rng.uniform(1.0, 2.0)) * 2f64.powi(rng.below(25) as i32 - 12);
            T::from_f64(if rng.below(2) == 0 { m } else { -m })
        })
        .collect()
}

/// Runs the kernel (scales group-major with `group_major`); returns the
/// codes and the scales.
#[allow(clippy::too_many_arguments)]
fn run<T: Storage>(
    x: &[T],
    rows: usize,
    n: usize,
    f8: DType,
    group: usize,
    groups: usize,
    group_major: bool,
) -> (Vec<u8>, Vec<f32>) {
    let mut cpu = Cpu::new();
    let n_groups = n.div_ceil(group);
    let (xp, qp, sp) = (cpu.upload(x), cpu.zeros::<u8>(rows * n), cpu.zeros::<f32>(rows * n_groups));
    let args = quantize_fp8::Args {
        x_ptr: xp.cast(),
        q_ptr: qp.cast(),
        s_ptr: sp.cast(),
        n: n as i32,
        stride: n as i32,
        _marker: PhantomData,
    };
    let config = quantize_fp8::Config::new(T::DTYPE, f8, group, groups, group_major);
    let grid = [rows as u32, n.div_ceil(group * groups) as u32, 1];
    quantize_fp8::interpret(&mut cpu, grid, &config, &args).unwrap();
    (cpu.read(qp), cpu.read(sp))
}

fn check<T: Storage>(seed: u64, rows: usize, n: usize, f8: DType, group: usize, groups: usize) {
    let mut rng = Rng::new(seed);
    let x: Vec<T> = inputs(&mut rng, rows, n, group);
    let xf: Vec<f32> = x.iter().map(|v| v.to_f64() as f32).collect();
    let want = r::quantize_fp8(&xf, rows, n, group, f8);
    let (codes, scales) = run(&x, rows, n, f8, group, groups, false);
    assert_eq!(scales, want.scales, "scales, {f8} group {group} n {n}");
    assert_eq!(codes, want.codes, "codes, {f8} group {group} n {n}");
    let n_groups = n.div_ceil(group);
    // Group-major scales (the block-scaled product's activation layout):
    // the same codes, and the scales transposed.
    let (codes_t, scales_t) = run(&x, rows, n, f8, group, groups, true);
    assert_eq!(codes_t, codes, "codes, group-major, {f8} group {group} n {n}");
    let transposed: Vec<f32> =
        (0..n_groups * rows).map(|i| scales[(i % rows) * n_groups + i / rows]).collect();
    assert_eq!(scales_t, transposed, "group-major scales, {f8} group {group} n {n}");
    for (i, (&v, &xi)) in want.values.iter().zip(&xf).enumerate() {
        let s = f64::from(scales[(i / n) * n_groups + (i % n) / group]);
        let b = r::quantize_bound(f64::from(xi), s, f8);
        assert!((v - f64::from(xi)).abs() <= b, "element {i}: {v} vs {xi} (bound {b})");
    }
}

#[test]
fn quantize_fp8_formats_groups_and_dtypes() {
    for f8 in [DType::F8E4M3, DType::F8E5M2] {
        check::<f32>(1, 3, 300, f8, 128, 2);
        check::<bf16>(2, 2, 257, f8, 32, 4);
        check::<f32>(3, 1, 32, f8, 32, 1);
    }
}

proptest! {
    #![proptest_config(cases(12))]

    #[test]
    fn quantize_fp8_ragged(seed in any::<u64>(), rows in 1usize..4, n in 1usize..600, e4 in any::<bool>()) {
        let f8 = if e4 { DType::F8E4M3 } else { DType::F8E5M2 };
        check::<f32>(seed, rows, n, f8, 128, 1);
    }
}

/// Every code of both formats dequantized with a scale of 1 (f32 output:
/// the codes' exact values, NaN codes NaN) and with scales of 3 (bf16
/// output: one rounding of the exact product), over two groups.
#[test]
fn dequantize_fp8_every_code() {
    for f8 in [DType::F8E4M3, DType::F8E5M2] {
        let codes: Vec<u8> = (0..=255u8).collect();
        for (scale, out) in [(1f32, DType::F32), (3.0, DType::BF16)] {
            let mut cpu = Cpu::new();
            let (qp, sp) = (cpu.upload(&codes), cpu.upload(&[scale, scale]));
            let op = cpu.zeros::<f32>(256);
            let ob = cpu.zeros::<bf16>(256);
            let args = kernels::fp8::dequantize_fp8::Args {
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                out_ptr: if out == DType::F32 { op.cast() } else { ob.cast() },
                n: 256,
                stride: 256,
                _marker: PhantomData,
            };
            let config = kernels::fp8::dequantize_fp8::Config::new(f8, out, 128, 1);
            kernels::fp8::dequantize_fp8::interpret(&mut cpu, [1, 2, 1], &config, &args).unwrap();
            let got: Vec<f64> = if out == DType::F32 {
                cpu.read(op).iter().map(|v| f64::from(*v)).collect()
            } else {
                cpu.read(ob).iter().map(|v| v.to_f64()).collect()
            };
            for (b, g) in got.iter().enumerate() {
                let v = f64::from(dsl_core::dtype::f8_value(f8, b as u8)) * f64::from(scale);
                let w = out.round_float(v);
                assert!(
                    w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
                    "{f8} code {b}: {g} vs {w}"
                );
            }
        }
    }
}

/// Random finite codes of `f8` (as bytes) and their values.
fn codes(rng: &mut Rng, len: usize, f8: DType) -> (Vec<u8>, Vec<f64>) {
    let value = |b: u8| -> f64 {
        if f8 == DType::F8E4M3 {
            f64::from(dsl_core::float8::F8E4M3::from_bits(b).to_f32())
        } else {
            f64::from(dsl_core::float8::F8E5M2::from_bits(b).to_f32())
        }
    };
    let mut bytes = Vec::with_capacity(len);
    while bytes.len() < len {
        let b = rng.below(256) as u8;
        if value(b).is_finite() {
            bytes.push(b);
        }
    }
    let vals = bytes.iter().map(|&b| value(b)).collect();
    (bytes, vals)
}

/// Scales `2^e * (1..2)`, `e` in `-8..8`.
fn scales(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.uniform(1.0, 2.0) * 2f32.powi(rng.below(16) as i32 - 8)).collect()
}

/// `scaled_matmul_fp8` on the interpreter against the f64 reference within
/// its derived bound: both forms, both formats, f32 and bf16 outputs,
/// ragged M, N and K (a partial K block, a partial weight block, one-row
/// outputs); the block-scaled form with its scales loaded a block ahead,
/// and with two K blocks a trip (an odd and an even block count), gives
/// the same values.
#[test]
fn scaled_matmul_fp8_matches_the_f64_reference() {
    use kernels::fp8::scaled_matmul_fp8 as k8;
    let mut rng = Rng::new(0x5ca1ed);
    for (f8, out) in [(DType::F8E4M3, DType::F32), (DType::F8E5M2, DType::BF16), (DType::F8E4M3, DType::BF16)]
    {
        for ((m, n, k), per_tensor) in
            [(1usize, 64usize, 128usize), (17, 200, 300), (5, 130, 40), (9, 70, 512)]
                .into_iter()
                .flat_map(|s| [(s, false), (s, true)])
        {
            let kb = k.div_ceil(128);
            let (ab, av) = codes(&mut rng, m * k, f8);
            let (bb, bv) = codes(&mut rng, n * k, f8);
            let (sa, sb) = if per_tensor {
                (scales(&mut rng, 1), scales(&mut rng, 1))
            } else {
                (scales(&mut rng, m * kb), scales(&mut rng, n.div_ceil(128) * kb))
            };
            // The block-scaled form with SCALES_AHEAD, with PAIRED.
            let run = |ahead: bool, paired: bool| -> Vec<f64> {
                let mut cpu = Cpu::new();
                let (ap, sap, bp, sbp) = (cpu.upload(&ab), cpu.upload(&sa), cpu.upload(&bb), cpu.upload(&sb));
                let cp = cpu.zeros::<f32>(m * n);
                let cb = cpu.zeros::<bf16>(m * n);
                let args = k8::Args {
                    a_ptr: ap.cast(),
                    sa_ptr: sap.cast(),
                    b_ptr: bp.cast(),
                    sb_ptr: sbp.cast(),
                    c_ptr: if out == DType::F32 { cp.cast() } else { cb.cast() },
                    m: m as i32,
                    n: n as i32,
                    k: k as i32,
                    _marker: PhantomData,
                };
                let config = k8::Config::new(f8, out, 16, 64, per_tensor, ahead, paired);
                let grid = [m.div_ceil(16) as u32, n.div_ceil(64) as u32, 1];
                k8::interpret(&mut cpu, grid, &config, &args).unwrap();
                if out == DType::F32 {
                    cpu.read(cp).iter().map(|&x| f64::from(x)).collect()
                } else {
                    cpu.read(cb).iter().map(|&x| f64::from(x.to_f32())).collect()
                }
            };
            let got = run(false, false);
            if !per_tensor {
                // The scales loaded a block ahead are the same scales, and
                // paired blocks are scaled in in the same order.
                assert_eq!(run(true, false), got, "scales ahead, {f8} -> {out} {m}x{n}x{k}");
                assert_eq!(run(false, true), got, "paired, {f8} -> {out} {m}x{n}x{k}");
            }
            let u_out = if out == DType::F32 { 2f64.powi(-24) } else { 2f64.powi(-8) };
            let (want, tol) =
                r::scaled_matmul(&av, &sa, &bv, &sb, (m, n, k), r::BlockSums::F32, per_tensor, u_out);
            for (i, ((g, w), t)) in got.iter().zip(&want).zip(&tol).enumerate() {
                let what = if per_tensor { "per-tensor" } else { "block-scaled" };
                assert!(
                    (g - w).abs() <= *t,
                    "{what} {f8} -> {out} {m}x{n}x{k} [{i}]: {g} vs {w} (bound {t})"
                );
            }
            // The scales reach every block: a wrong one breaks the bound.
            assert!(want.iter().any(|w| w.abs() > 1e-3), "{m}x{n}x{k}: a vacuous case");
        }
    }
}
