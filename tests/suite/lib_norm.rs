//! Kernel library: add+RMSNorm and RMSNorm on the interpreter against references.
//!
//! Random non-zero inputs, ragged shapes (1..9 tokens; hidden sizes that are
//! not multiples of 16, SmolLM2's 576, and a row stride wider than the row),
//! f32 and bf16 storage, `BLOCK` exactly the hidden size (usually not a power
//! of two) or padded to the next power of two. Tolerances: f32 1e-5 relative;
//! bf16 one unit of the final rounding (1/128 relative). The residual `h` of
//! add+RMSNorm is one rounding of an f32 sum, so it must match exactly.

use crate::common::{Storage, cases, tol};
use dsl_core::half::bf16;
use dsl_core::interp::{Cpu, Element};
use kernels::reference::norm as r;
use kernels::rmsnorm::{add_rmsnorm, rmsnorm};
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::{Rng, check_close};

const EPS: f32 = 1e-5;

/// Relative error allowed in the kernel's f32 `rstd` when deciding which way
/// the intermediate rounding of add+RMSNorm may go.
const RSTD_DELTA: f64 = 1e-5;

/// Non-zero values with magnitudes in `[1/64, hi)`, as stored in `T`.
fn values<T: Storage>(rng: &mut Rng, n: usize, hi: f32) -> Vec<T> {
    (0..n)
        .map(|_| {
            let m = rng.uniform(1.0 / 64.0, hi);
            T::from_f64(f64::from(if rng.next_u64() & 1 == 0 { m } else { -m }))
        })
        .collect()
}

/// A `rows x cols` tensor with row stride `stride` (gaps filled with junk) and
/// its dense f64 view.
fn strided<T: Storage>(rng: &mut Rng, rows: usize, cols: usize, stride: usize) -> (Vec<T>, Vec<f64>) {
    let buf = values::<T>(rng, rows * stride, 4.0);
    let dense =
        (0..rows).flat_map(|i| buf[i * stride..i * stride + cols].iter().map(|v| v.to_f64())).collect();
    (buf, dense)
}

/// The `rows x cols` values of a strided result, and whether the gaps stayed zero.
fn dense<T: Element>(buf: &[T], rows: usize, cols: usize, stride: usize) -> (Vec<f64>, bool) {
    let vals =
        (0..rows).flat_map(|i| buf[i * stride..i * stride + cols].iter().map(|v| v.to_f64())).collect();
    let gaps_zero =
        (0..rows).all(|i| buf[i * stride + cols..(i + 1) * stride].iter().all(|v| v.to_f64() == 0.0));
    (vals, gaps_zero)
}

/// A norm case: the RNG seed, `rows` rows of `cols` values `stride` apart,
/// and the kernels' `BLOCK`.
#[derive(Clone, Copy, Debug)]
struct Rows {
    seed: u64,
    rows: usize,
    cols: usize,
    stride: usize,
    block: usize,
}

impl Rows {
    /// The case's RNG after its first draws: the strided input `x` and its
    /// dense f64 view.
    fn input<T: Storage>(&self) -> (Rng, Vec<T>, Vec<f64>) {
        let mut rng = Rng::new(self.seed);
        let (x, x64) = strided::<T>(&mut rng, self.rows, self.cols, self.stride);
        (rng, x, x64)
    }
}

fn add_rmsnorm_case<T: Storage>(c: Rows) -> Result<(), TestCaseError> {
    let Rows { rows, cols, stride, block, .. } = c;
    let (mut rng, x, x64) = c.input::<T>();
    let (res, r64) = strided::<T>(&mut rng, rows, cols, stride);
    let w = values::<T>(&mut rng, cols, 2.0);
    let w64: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let mut cpu = Cpu::new();
    let (xp, rp, wp) = (cpu.upload(&x), cpu.upload(&res), cpu.upload(&w));
    let (op, hp) = (cpu.zeros::<T>(rows * stride), cpu.zeros::<T>(rows * stride));
    let args = add_rmsnorm::Args {
        x_ptr: xp.cast(),
        r_ptr: rp.cast(),
        w_ptr: wp.cast(),
        out_ptr: op.cast(),
        h_ptr: hp.cast(),
        n_cols: cols as i32,
        stride: stride as i32,
        eps: EPS,
        _marker: PhantomData,
    };
    let config = add_rmsnorm::Config::new(T::DTYPE, block);
    add_rmsnorm::interpret(&mut cpu, [rows as u32, 1, 1], &config, &args)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (want_out, want_h) = r::add_rmsnorm_scaled(&x64, &r64, &w64, rows, cols, EPS as f64, T::DTYPE, 1.0);
    let (got_h, h_gaps) = dense(&cpu.read(hp), rows, cols, stride);
    let (got_out, out_gaps) = dense(&cpu.read(op), rows, cols, stride);
    prop_assert!(h_gaps && out_gaps, "a store wrote past n_cols");
    prop_assert_eq!(got_h, want_h);
    let (atol, rtol) = tol(T::DTYPE);
    if check_close(&got_out, &want_out, atol, rtol).is_err() {
        // The intermediate `round_T(h * rstd)` may round the other way where
        // the f32 `rstd` (relative error ~1e-6) straddles a rounding boundary:
        // accept one unit of the final rounding from either neighbour.
        let near = |s: f64| r::add_rmsnorm_scaled(&x64, &r64, &w64, rows, cols, EPS as f64, T::DTYPE, s).0;
        let (lo, hi) = (near(1.0 - RSTD_DELTA), near(1.0 + RSTD_DELTA));
        for (i, &g) in got_out.iter().enumerate() {
            let ok = [want_out[i], lo[i], hi[i]].iter().any(|&w| (g - w).abs() <= atol + rtol * w.abs());
            prop_assert!(ok, "element {i}: got {g}, want {} (neighbours {}, {})", want_out[i], lo[i], hi[i]);
        }
    }
    Ok(())
}

fn rmsnorm_case<T: Storage>(c: Rows) -> Result<(), TestCaseError> {
    let Rows { rows, cols, stride, block, .. } = c;
    let (mut rng, x, x64) = c.input::<T>();
    let w = values::<T>(&mut rng, cols, 2.0);
    let w64: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let mut cpu = Cpu::new();
    let (xp, wp, op) = (cpu.upload(&x), cpu.upload(&w), cpu.zeros::<T>(rows * stride));
    let args = rmsnorm::Args {
        x_ptr: xp.cast(),
        w_ptr: wp.cast(),
        out_ptr: op.cast(),
        n_cols: cols as i32,
        stride: stride as i32,
        eps: EPS,
        _marker: PhantomData,
    };
    let config = rmsnorm::Config::new(T::DTYPE, block, false);
    rmsnorm::interpret(&mut cpu, [rows as u32, 1, 1], &config, &args)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let want = r::rmsnorm(&x64, &w64, rows, cols, EPS as f64, T::DTYPE);
    let (got, gaps) = dense(&cpu.read(op), rows, cols, stride);
    prop_assert!(gaps, "a store wrote past n_cols");
    let (atol, rtol) = tol(T::DTYPE);
    check_close(&got, &want, atol, rtol).map_err(TestCaseError::fail)?;
    Ok(())
}

/// Hidden sizes: SmolLM2's 576, other non-multiples of 16, and random ones.
fn hidden() -> impl Strategy<Value = usize> {
    prop_oneof![Just(576usize), Just(1), Just(17), Just(1000), Just(1031), 1usize..1200]
}

/// A norm case of one storage type.
type NormCase = fn(Rows) -> Result<(), TestCaseError>;

/// One ragged case of a norm: its bf16 form (`bf`) or its f32 form, on rows
/// `cols + 8 gap` apart, `BLOCK` the row length (`exact`) or its next power
/// of two.
fn ragged(
    bf16_case: NormCase,
    f32_case: NormCase,
    (seed, rows, cols, gap): (u64, usize, usize, usize),
    bf: bool,
    exact: bool,
) -> Result<(), TestCaseError> {
    let block = if exact { cols } else { cols.next_power_of_two() };
    let stride = cols + 8 * gap;
    let case = if bf { bf16_case } else { f32_case };
    case(Rows { seed, rows, cols, stride, block })
}

proptest! {
    #![proptest_config(cases(16))]

    #[test]
    fn add_rmsnorm_ragged(rows in 1usize..9, cols in hidden(), gap in 0usize..3, bf in any::<bool>(), exact in any::<bool>(), seed in any::<u64>()) {
        ragged(add_rmsnorm_case::<bf16>, add_rmsnorm_case::<f32>, (seed, rows, cols, gap), bf, exact)?;
    }

    #[test]
    fn rmsnorm_ragged(rows in 1usize..9, cols in hidden(), gap in 0usize..3, bf in any::<bool>(), exact in any::<bool>(), seed in any::<u64>()) {
        ragged(rmsnorm_case::<bf16>, rmsnorm_case::<f32>, (seed, rows, cols, gap), bf, exact)?;
    }
}

/// The shapes the bench and SmolLM2 use, in both dtypes, with exact `BLOCK`s.
#[test]
fn smollm2_and_llama_rows() {
    for (rows, cols) in [(3, 576), (2, 4096)] {
        let c = Rows { seed: 11, rows, cols, stride: cols, block: cols };
        add_rmsnorm_case::<bf16>(c).unwrap();
        add_rmsnorm_case::<f32>(Rows { seed: 12, ..c }).unwrap();
        rmsnorm_case::<bf16>(Rows { seed: 13, ..c }).unwrap();
        rmsnorm_case::<f32>(Rows { seed: 14, ..c }).unwrap();
    }
}
