//! Kernel library: the batch-invariant linear layer (`kernels::dequant::linear`)
//! and the order-independent RMSNorm statistic (`kernels::rmsnorm::sum_squares`)
//! on the interpreter.
//!
//! - Accuracy: random GGUF weights (as in `lib_dequant`) and non-zero
//!   activations, ragged `M`, `N`, `K` (the K tail runs), every format, with
//!   and without SiLU, f16 and f32 operands, against the f64 reference within
//!   the dequant kernels' bounds.
//! - Invariance (bitwise): a row's output is the same whatever else is in the
//!   batch and whatever row tile runs it; the fused RMSNorm prologue equals
//!   the `rmsnorm` kernel (add+RMSNorm rounding) followed by the plain layer,
//!   and equals add+RMSNorm's output; the residual epilogue equals the plain
//!   layer followed by add+RMSNorm's residual add.
//! - `sum_squares`: within `2^-40` relative of the exact f64 sum, and the
//!   same bits for any permutation of its inputs and any tile width.

use crate::common::{cases, f32_or_bf16};
use crate::lib_dequant::{
    Act, Case, activations, check_outputs, random_weight, reference_gemvs, unrounded_f32_outputs,
};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::dequant::linear::{WIDE_ROWS, linear};
use kernels::dequant::{LinearTiles, QuantFormat, Repacked, linear_grid, linear_tiles, linear_workspace};
use kernels::reference::quant as r;
use kernels::rmsnorm::{add_rmsnorm, rmsnorm};
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

const EPS: f32 = 1e-5;

/// What the linear launch fuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fuse {
    None,
    Silu,
    Norm,
    Residual,
}

impl Fuse {
    /// The kernels' `FUSE` constexpr for this fusion.
    pub(crate) fn flags(self) -> kernels::dequant::Fuse {
        kernels::dequant::Fuse::NONE
            .with_silu(self == Fuse::Silu)
            .with_norm(self == Fuse::Norm)
            .with_residual(self == Fuse::Residual)
    }
}

/// The `Args` of a linear-layer kernel (`$args`, such as `linear::Args`) over
/// interpreter pointers: the operands `[x, q, s, nw, out, ws]` (activations,
/// the weight's quants and scales, the norm weight, the output and the f32
/// workspace) and then the kernel's other fields.
macro_rules! product_args {
    ($($args:ident)::+, [$x:expr, $q:expr, $s:expr, $nw:expr, $out:expr, $ws:expr], $($field:ident: $value:expr),* $(,)?) => {
        $($args)::+ {
            x_ptr: $x.cast(),
            q_ptr: $q.cast(),
            s_ptr: $s.cast(),
            nw_ptr: $nw.cast(),
            out_ptr: $out.cast(),
            ws_ptr: $ws.cast(),
            $($field: $value,)*
            _marker: std::marker::PhantomData,
        }
    };
}
pub(crate) use product_args;

/// Runs `linear` on the interpreter with tiles `(block_m, block_n, split)`;
/// `out0` is the initial output (the residual), `m` rows of `out0.len() / m`
/// values (the output's row stride `ldo`) in `O`; returns the output's raw
/// values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: Act, O: Act>(
    format: QuantFormat,
    fuse: Fuse,
    f16_ops: bool,
    (bm, bn, split): (usize, usize, bool),
    x: &[T],
    nw: &[T],
    out0: &[O],
    w: &Repacked,
    (m, n, k): (usize, usize, usize),
) -> Result<Vec<O>, String> {
    let mut cpu = Cpu::new();
    let (xp, qp, sp, np) = (cpu.upload(x), cpu.upload(&w.quants), cpu.upload(&w.scales), cpu.upload(nw));
    let op = cpu.upload(out0);
    let t = LinearTiles { block_m: bm, block_n: bn, num_warps: 4, split };
    let grid = linear_grid(m, n, k, fuse == Fuse::Silu, &t);
    let (ws, cnt) = linear_workspace(grid, &t);
    let (wsp, cntp) = (cpu.zeros::<f32>(ws.max(1)), cpu.zeros::<i32>(cnt.max(1)));
    let args = product_args!(
        linear::Args,
        [xp, qp, sp, np, op, wsp],
        cnt_ptr: cntp.cast(),
        m: m as i32,
        n: n as i32,
        ldo: (out0.len() / m) as i32,
        k: k as i32,
        eps: EPS,
    );
    let norm_block = k.next_power_of_two();
    let config =
        linear::Config::new(T::DTYPE, O::DTYPE, format, fuse.flags(), split, f16_ops, bm, bn, norm_block);
    linear::interpret(&mut cpu, grid, &config, &args).map_err(|e| e.to_string())?;
    // The split form leaves its counters zero for the next launch.
    if cpu.read::<i32>(cntp).iter().any(|&c| c != 0) {
        return Err("split counters not reset".into());
    }
    Ok(cpu.read(op))
}

/// One accuracy case against the f64 reference.
fn accuracy_case<T: Act>(c: Case, f16_ops: bool, tiles: (usize, usize, bool)) -> Result<(), TestCaseError> {
    let Case { format, silu, m, n, k, .. } = c;
    let (mut rng, x) = c.activations::<T>();
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let (w, raws) = random_weight(&mut rng, format, n, k, silu);
    let fuse = if silu { Fuse::Silu } else { Fuse::None };
    let out0 = vec![T::from_f32(0.0); m * n];
    let got = run::<T, T>(format, fuse, f16_ops, tiles, &x, &x, &out0, &w, (m, n, k))
        .map_err(TestCaseError::fail)?;
    let ys = reference_gemvs(format, &raws, n, k, &xf, m);
    let bound = |y: &r::Gemv, i: usize| {
        if f16_ops {
            r::gemm_swap_error_bound(format, k, y.abs[i], y.l1[i], DType::F16)
        } else {
            r::error_bound(format, k, 16, y.abs[i])
        }
    };
    let got: Vec<f64> = got.iter().map(|g| g.to_f64()).collect();
    let what = format!("{format:?} silu={silu} f16={f16_ops} {tiles:?} m={m} n={n} k={k}");
    check_outputs::<T>(&got, &ys, n, bound, &what)
}

fn format_strategy() -> impl Strategy<Value = QuantFormat> {
    prop_oneof![Just(QuantFormat::Q4_0), Just(QuantFormat::Q4_1), Just(QuantFormat::Q8_0)]
}

proptest! {
    #![proptest_config(cases(10))]

    /// Ragged shapes and tiles, every format, against the f64 reference.
    #[test]
    fn linear_random(
        seed in any::<u64>(),
        format in format_strategy(),
        silu in any::<bool>(),
        f16_ops in any::<bool>(),
        bf in any::<bool>(),
        m in 1usize..20,
        n in 1usize..40,
        kb in 1usize..7,
        tiles in prop_oneof![Just((16, 16, false)), Just((16, 32, true)), Just((4, 16, false)), Just((32, 8, true))],
    ) {
        let c = Case { seed, format, silu, m, n, k: 32 * kb };
        f32_or_bf16!(bf, accuracy_case(c, f16_ops, tiles))?;
    }
}

/// The LM head's output dtype: with bf16 activations and an f32 output,
/// `linear` stores its f32 sums unrounded
/// ([`crate::lib_dequant::unrounded_f32_outputs`]): unsplit and split, f16
/// and f32 operands, one row with the norm prologue and three rows without.
#[test]
fn f32_outputs_of_bf16_activations_are_unrounded() {
    let (n, k) = (45, 192);
    for (i, format) in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0].into_iter().enumerate() {
        let c = Case { seed: 0x11ea + i as u64, format, silu: false, m: 3, n, k };
        let (mut rng, x) = c.activations::<bf16>();
        let nw = activations::<bf16>(&mut rng, k);
        let (w, _) = random_weight(&mut rng, format, n, k, false);
        for (fuse, m) in [(Fuse::Norm, 1), (Fuse::None, 3)] {
            for f16_ops in [false, true] {
                for tiles in [(16, 16, false), (16, 32, true)] {
                    let x = &x[..m * k];
                    let wide = run::<bf16, f32>(
                        format,
                        fuse,
                        f16_ops,
                        tiles,
                        x,
                        &nw,
                        &vec![0.0; m * n],
                        &w,
                        (m, n, k),
                    );
                    let zeros = vec![bf16::ZERO; m * n];
                    let narrow =
                        run::<bf16, bf16>(format, fuse, f16_ops, tiles, x, &nw, &zeros, &w, (m, n, k));
                    let wide: Vec<f64> = wide.unwrap().iter().map(|v| *v as f64).collect();
                    let narrow: Vec<f64> = narrow.unwrap().iter().map(|v| v.to_f64()).collect();
                    let what = format!("{format:?} {fuse:?} f16={f16_ops} {tiles:?}");
                    unrounded_f32_outputs(&wide, &narrow, &what);
                }
            }
        }
    }
}

/// The wide tiles' form (`WIDE_ROWS` rows and more: each K tile's product
/// as two dots of half its columns, their loads at the top of each step)
/// against the f64 reference: two row tiles, three whole K tiles and a
/// partial one, each word-tiled format, with and without SiLU.
#[test]
fn wide_tiles_meet_the_reference() {
    for (i, format) in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0].into_iter().enumerate() {
        for silu in [false, true] {
            for f16_ops in [false, true] {
                let c = Case { seed: 40 + i as u64, format, silu, m: 130, n: 40, k: 32 * 13 };
                accuracy_case::<bf16>(c, f16_ops, (WIDE_ROWS, 16, false)).unwrap();
            }
        }
    }
}

/// The bits of a row of `out` (`n` columns).
fn row_bits<T: Act>(out: &[T], row: usize, n: usize) -> Vec<u64> {
    out[row * n..(row + 1) * n].iter().map(|v| v.to_f64().to_bits()).collect()
}

/// A row's output alone equals the same row inside batches of 7 and 64
/// rows, for every format and fusion, at the interpreter's tiles for each
/// batch size (`linear_tiles`) and with other row tiles, split or not: bit
/// for bit, with f32 outputs (which show every difference of the f32
/// accumulators) and bf16 ones.
#[test]
fn linear_rows_do_not_depend_on_the_batch() {
    batch_invariance::<f32>();
    batch_invariance::<bf16>();
}

fn batch_invariance<T: Act>() {
    let (n, k) = (40, 96);
    for (si, format) in [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0].into_iter().enumerate() {
        for fuse in [Fuse::None, Fuse::Silu, Fuse::Residual] {
            for f16_ops in [false, true] {
                let mut rng = Rng::new(11 + si as u64);
                let silu = fuse == Fuse::Silu;
                let (w, _) = random_weight(&mut rng, format, n, k, silu);
                let x = activations::<T>(&mut rng, 64 * k);
                let res = activations::<T>(&mut rng, 64 * n);
                let go = |m: usize, tiles: (usize, usize, bool)| {
                    run::<T, T>(format, fuse, f16_ops, tiles, &x[..m * k], &x, &res[..m * n], &w, (m, n, k))
                        .unwrap()
                };
                let tiles_for = |m: usize| {
                    let t = linear_tiles(format, m, if silu { 2 * n } else { n }, k, false);
                    (t.block_m, t.block_n, t.split)
                };
                let alone = go(1, tiles_for(1));
                for (m, tiles) in
                    [(7, tiles_for(7)), (64, tiles_for(64)), (7, (16, 8, true)), (64, (32, 32, true))]
                {
                    let batch = go(m, tiles);
                    assert_eq!(
                        row_bits(&alone, 0, n),
                        row_bits(&batch, 0, n),
                        "{:?} {format:?} {fuse:?} f16={f16_ops}: row 0 alone vs in a batch of {m} ({tiles:?})",
                        T::DTYPE
                    );
                }
            }
        }
    }
}

/// The split form's finishing sum over more K tiles than one trip of its
/// unrolled loop loads (`SPLIT_SUM_UNROLL`; here 11 tiles, the last
/// partial: one whole trip and one with tiles past the end) equals the
/// unsplit loop's, bit for bit, in f32 outputs.
#[test]
fn split_sum_over_many_k_tiles_equals_the_loop() {
    let (m, n, k) = (3, 40, 32 * 41);
    for (si, format) in [QuantFormat::Q4_1, QuantFormat::Q8_0].into_iter().enumerate() {
        let mut rng = Rng::new(70 + si as u64);
        let (w, _) = random_weight(&mut rng, format, n, k, false);
        let x = activations::<f32>(&mut rng, m * k);
        let zeros = vec![0.0f32; m * n];
        let go =
            |tiles| run::<f32, f32>(format, Fuse::None, true, tiles, &x, &x, &zeros, &w, (m, n, k)).unwrap();
        let (split, looped) = (go((16, 16, true)), go((16, 16, false)));
        for r in 0..m {
            assert_eq!(row_bits(&split, r, n), row_bits(&looped, r, n), "{format:?} row {r}");
        }
    }
}

/// The fused RMSNorm prologue (`FUSE.norm()`, one row) equals `rmsnorm` with
/// add+RMSNorm's rounding followed by the plain layer, and that `rmsnorm`
/// equals add+RMSNorm's normed output; the residual epilogue equals the
/// plain layer followed by add+RMSNorm's residual add: bit for bit, in f32
/// and bf16.
#[test]
fn linear_fusions_equal_the_separate_kernels() {
    fusions::<f32>();
    fusions::<bf16>();
}

fn fusions<T: Act>() {
    let (n, k) = (48usize, 576usize);
    let block = k.next_power_of_two();
    for format in [QuantFormat::Q4_1, QuantFormat::Q8_0] {
        for f16_ops in [false, true] {
            let mut rng = Rng::new(5);
            let (w, _) = random_weight(&mut rng, format, n, k, false);
            let x = activations::<T>(&mut rng, k);
            let nw = activations::<T>(&mut rng, k);
            let res = activations::<T>(&mut rng, n);
            let zeros_n = vec![T::from_f32(0.0); n];
            let tiles = (16, 16, false);
            let what = format!("{:?} {format:?} f16={f16_ops}", T::DTYPE);

            // The norm kernels, on the interpreter.
            let mut cpu = Cpu::new();
            let (xp, wp) = (cpu.upload(&x), cpu.upload(&nw));
            let (normed, zr, ao, ah) =
                (cpu.zeros::<T>(k), cpu.zeros::<T>(k), cpu.zeros::<T>(k), cpu.zeros::<T>(k));
            let args = rmsnorm::Args {
                x_ptr: xp.cast(),
                w_ptr: wp.cast(),
                out_ptr: normed.cast(),
                n_cols: k as i32,
                stride: k as i32,
                eps: EPS,
                _marker: PhantomData,
            };
            rmsnorm::interpret(&mut cpu, [1, 1, 1], &rmsnorm::Config::new(T::DTYPE, block, true), &args)
                .unwrap();
            let aargs = add_rmsnorm::Args {
                x_ptr: xp.cast(),
                r_ptr: zr.cast(),
                w_ptr: wp.cast(),
                out_ptr: ao.cast(),
                h_ptr: ah.cast(),
                n_cols: k as i32,
                stride: k as i32,
                eps: EPS,
                _marker: PhantomData,
            };
            add_rmsnorm::interpret(&mut cpu, [1, 1, 1], &add_rmsnorm::Config::new(T::DTYPE, block), &aargs)
                .unwrap();
            let normed: Vec<T> = cpu.read(normed);
            let bits = |v: &[T]| v.iter().map(|e| e.to_f64().to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&normed),
                bits(&cpu.read::<T>(ao)),
                "{what}: rmsnorm(ROUND_NORMED) vs add_rmsnorm, r = 0"
            );

            let fused =
                run::<T, T>(format, Fuse::Norm, f16_ops, tiles, &x, &nw, &zeros_n, &w, (1, n, k)).unwrap();
            let plain =
                run::<T, T>(format, Fuse::None, f16_ops, tiles, &normed, &nw, &zeros_n, &w, (1, n, k))
                    .unwrap();
            assert_eq!(bits(&fused), bits(&plain), "{what}: NORM prologue vs rmsnorm + linear");

            let fused =
                run::<T, T>(format, Fuse::Residual, f16_ops, tiles, &x, &nw, &res, &w, (1, n, k)).unwrap();
            let y = run::<T, T>(format, Fuse::None, f16_ops, tiles, &x, &x, &zeros_n, &w, (1, n, k)).unwrap();
            assert_eq!(
                bits(&fused),
                bits(&residual_add(&y, &res)),
                "{what}: RESIDUAL epilogue vs linear + add"
            );
        }
    }
}

/// add+RMSNorm's residual `h = round(y + r)` of one row, on the interpreter.
fn residual_add<T: Act>(y: &[T], r: &[T]) -> Vec<T> {
    let n = y.len();
    let mut cpu = Cpu::new();
    let (yp, rp, wp) = (cpu.upload(y), cpu.upload(r), cpu.upload(&vec![T::from_f32(1.0); n]));
    let (op, hp) = (cpu.zeros::<T>(n), cpu.zeros::<T>(n));
    let args = add_rmsnorm::Args {
        x_ptr: yp.cast(),
        r_ptr: rp.cast(),
        w_ptr: wp.cast(),
        out_ptr: op.cast(),
        h_ptr: hp.cast(),
        n_cols: n as i32,
        stride: n as i32,
        eps: EPS,
        _marker: PhantomData,
    };
    let block = n.next_power_of_two();
    add_rmsnorm::interpret(&mut cpu, [1, 1, 1], &add_rmsnorm::Config::new(T::DTYPE, block), &args).unwrap();
    cpu.read(hp)
}

/// `rmsnorm`'s statistic through `sum_squares`: one row per program.
fn rstd_of(x: &[f32], block: usize) -> f32 {
    let n = x.len();
    let mut cpu = Cpu::new();
    let (xp, wp, op) = (cpu.upload(x), cpu.upload(&vec![1.0f32; n]), cpu.zeros::<f32>(n));
    let args = rmsnorm::Args {
        x_ptr: xp.cast(),
        w_ptr: wp.cast(),
        out_ptr: op.cast(),
        n_cols: n as i32,
        stride: n as i32,
        eps: 0.0,
        _marker: PhantomData,
    };
    rmsnorm::interpret(&mut cpu, [1, 1, 1], &rmsnorm::Config::new(DType::F32, block, false), &args).unwrap();
    // out = x * rstd with unit weights: recover rstd from the first element.
    let out: Vec<f32> = cpu.read(op);
    out[0] / x[0]
}

/// The statistic is accurate and does not depend on the order of the row or
/// the tile width (the padding lanes).
#[test]
fn sum_squares_is_exact_enough_and_order_independent() {
    let mut rng = Rng::new(3);
    for n in [1usize, 7, 576, 1000] {
        let x: Vec<f32> = (0..n)
            .map(|_| {
                let e = rng.below(40) as i32 - 20;
                let v = rng.uniform(1.0, 2.0) * 2f32.powi(e);
                if rng.next_u64() & 1 == 0 { v } else { -v }
            })
            .collect();
        let exact: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let block = n.next_power_of_two();
        let rstd = rstd_of(&x, block);
        let want = 1.0 / (exact / n as f64).sqrt();
        assert!(((f64::from(rstd) - want) / want).abs() < 1e-6, "n={n}: rstd {rstd}, want {want}");
        let mut y = x.clone();
        y.reverse();
        y.rotate_left(n / 3);
        // The first element moved: compare through it.
        let first = y.iter().position(|&v| v.to_bits() == x[0].to_bits()).unwrap();
        y.swap(0, first);
        assert_eq!(rstd_of(&y, block).to_bits(), rstd.to_bits(), "n={n}: permuted row");
        assert_eq!(rstd_of(&x, block * 2).to_bits(), rstd.to_bits(), "n={n}: wider tile");
    }
    // A row with a NaN or an infinity gives NaN.
    for v in [f32::NAN, f32::INFINITY] {
        let mut bad = vec![1.0f32; 8];
        bad[3] = v;
        assert!(rstd_of(&bad, 8).is_nan(), "{v}");
    }
}

/// Output rows `ldo > n` apart (a column range of a wider output, as a QKV
/// product whose parts differ in format writes): the same bits in the
/// product's columns as with `ldo = n`, and the columns past `n` untouched,
/// plain, SiLU-mul and residual, split and unsplit tiles.
#[test]
fn a_wider_output_row_gets_the_same_bits_and_keeps_its_other_columns() {
    let mut rng = Rng::new(0x1d0);
    let (m, n, k, ldo) = (5, 24, 160, 37);
    for (fuse, tiles) in [
        (Fuse::None, (16, 16, false)),
        (Fuse::Silu, (16, 32, true)),
        (Fuse::Residual, (32, 16, true)),
        (Fuse::None, (16, 16, true)),
    ] {
        let silu = fuse == Fuse::Silu;
        let x = activations::<f32>(&mut rng, m * k);
        let (w, _) = random_weight(&mut rng, QuantFormat::Q4_1, n, k, silu);
        let wide0 = activations::<f32>(&mut rng, m * ldo);
        let narrow0: Vec<f32> = wide0.chunks(ldo).flat_map(|r| r[..n].to_vec()).collect();
        let narrow =
            run::<f32, f32>(QuantFormat::Q4_1, fuse, true, tiles, &x, &x, &narrow0, &w, (m, n, k)).unwrap();
        let wide =
            run::<f32, f32>(QuantFormat::Q4_1, fuse, true, tiles, &x, &x, &wide0, &w, (m, n, k)).unwrap();
        for r in 0..m {
            let (got, before) = (&wide[r * ldo..][..ldo], &wide0[r * ldo..][..ldo]);
            assert_eq!(
                got[..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                narrow[r * n..][..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{fuse:?} {tiles:?} row {r}"
            );
            assert_eq!(&got[n..], &before[n..], "{fuse:?} {tiles:?} row {r}: columns past n");
        }
    }
}
