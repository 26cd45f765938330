//! Kernel library: the online softmax on the interpreter against the reference.
//!
//! Random inputs, 1..6 rows of 1..3000 columns (rows shorter than, exact
//! multiples of, and ragged multiples of `BLOCK` = 256 or 1024, so the online
//! loop runs one to twelve chunks), a row stride wider than the row, scales
//! including 0 and negative ones, causal on and off with offsets that mask
//! whole rows. Tolerances: f32 1e-5 relative; bf16 one unit of the final
//! rounding (1/128 relative). Masked columns and the gaps between rows must be
//! exactly 0, and nothing may be NaN.

use crate::common::{Storage, cases, f32_or_bf16, tol};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::reference::softmax as r;
use kernels::softmax::softmax_online;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::{Rng, check_close};

/// One case: `rows x cols` with row stride `stride`, chunk `block`.
fn case<T: Storage>(
    seed: u64,
    (rows, cols, stride, block): (usize, usize, usize, usize),
    scale: f32,
    causal: Option<i32>,
) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let x: Vec<T> = (0..rows * stride).map(|_| T::from_f64(f64::from(rng.uniform(-4.0, 4.0)))).collect();
    let x64: Vec<f64> =
        (0..rows).flat_map(|i| x[i * stride..i * stride + cols].iter().map(|v| v.to_f64())).collect();
    let mut cpu = Cpu::new();
    let (xp, op) = (cpu.upload(&x), cpu.zeros::<T>(rows * stride));
    let args = softmax_online::Args {
        out_ptr: op.cast(),
        in_ptr: xp.cast(),
        n_cols: cols as i32,
        stride: stride as i32,
        scale,
        causal_offset: causal.unwrap_or(0),
        _marker: PhantomData,
    };
    let config = softmax_online::Config::new(T::DTYPE, causal.is_some(), block);
    softmax_online::interpret(&mut cpu, [rows as u32, 1, 1], &config, &args)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let out = cpu.read(op);
    let got: Vec<f64> =
        (0..rows).flat_map(|i| out[i * stride..i * stride + cols].iter().map(|v| v.to_f64())).collect();
    let gaps_zero =
        (0..rows).all(|i| out[i * stride + cols..(i + 1) * stride].iter().all(|v| v.to_f64() == 0.0));
    prop_assert!(gaps_zero, "a store wrote past n_cols");
    prop_assert!(got.iter().all(|v| !v.is_nan()), "NaN in the output");
    let offset = causal.map(i64::from);
    for i in 0..rows {
        for c in 0..cols {
            if !r::attends(i, c, offset) {
                prop_assert_eq!(got[i * cols + c], 0.0, "masked ({}, {}) not zero", i, c);
            }
        }
    }
    let want = r::softmax_online(&x64, rows, cols, scale, offset, T::DTYPE);
    let (atol, rtol) = tol(T::DTYPE);
    check_close(&got, &want, atol, rtol).map_err(TestCaseError::fail)?;
    Ok(())
}

/// Row lengths: below, at and past `BLOCK` multiples, and random ones.
fn lengths() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(256), Just(1024), Just(2048), Just(257), Just(1025), 1usize..3000]
}

/// Scales: 1, attention's `1/sqrt(64)`, larger, zero and negative.
fn scales() -> impl Strategy<Value = f32> {
    prop_oneof![Just(1.0f32), Just(0.125), Just(2.5), Just(0.0), Just(-1.0), -3.0f32..3.0]
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn softmax_online_ragged(
        rows in 1usize..6,
        cols in lengths(),
        gap in 0usize..3,
        big in any::<bool>(),
        scale in scales(),
        causal in proptest::option::of(-7i32..5),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let shape = (rows, cols, cols + 8 * gap, if big { 1024 } else { 256 });
        f32_or_bf16!(bf, case(seed, shape, scale, causal))?;
    }
}

/// Fixed corners: one-column rows, rows of exactly one and several chunks,
/// fully masked rows (negative offsets), an offset past the row, the
/// attention shape of SmolLM2 (1/sqrt(64)) and a non-power-of-two `BLOCK`.
#[test]
fn corners() {
    for causal in [None, Some(0), Some(-3), Some(-100), Some(5000)] {
        for (rows, cols, block) in
            [(3, 1, 256), (4, 256, 256), (5, 2048, 1024), (2, 2999, 256), (3, 1000, 576)]
        {
            let shape = (rows, cols, cols, block);
            case::<f32>(1, shape, 0.125, causal).unwrap();
            case::<bf16>(2, shape, 1.0, causal).unwrap();
        }
    }
}
