//! # Tutorial 2: fused row softmax
//!
//! Run with `cargo run --release -p tests --example 02_softmax`.
//!
//! Softmax of a row is `exp(x - max(x)) / sum(exp(x - max(x)))`. Written as
//! separate kernels it reads and writes the matrix several times; fused, each
//! program loads its row once, reduces it in registers and writes it once, so
//! the kernel runs at memory speed.
//!
//! New here:
//! - reductions (`max(x, 0)`, `sum(e, 0)`) over a tile axis;
//! - a dtype generic `T`: the same kernel stores f32 or bf16; it loads in `T`
//!   and computes in f32 (`.to(f32)`), as fast kernels do;
//! - `other = -inf` for masked-off lanes, so they do not affect the maximum;
//! - tile sizes that are not powers of two. Triton requires a power-of-two
//!   `BLOCK`; tessera pads the tile to the next power of two and masks the
//!   padding automatically, so `BLOCK` can be the exact row length (1000 here).

use dsl_core::half::bf16;
use dsl_core::interp::{Cpu, Element};
use dsl_macros::kernel;
use std::marker::PhantomData;

/// Row softmax: one program per row of `n_cols` elements, `BLOCK >= n_cols`.
#[kernel]
fn softmax<T: Float>(out_ptr: Ptr<T>, in_ptr: Ptr<T>, n_cols: i32, stride: i32, #[constexpr] BLOCK: usize) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    // Load in the storage dtype, compute in f32.
    let x = load(in_ptr + row * stride + cols, mask = mask, other = f32::NEG_INFINITY).to(f32);
    let x = x - max(x, 0);
    let e = exp(x);
    let y = e / sum(e, 0);
    // `store` converts to the pointee dtype (bf16 rounds to nearest even).
    store(out_ptr + row * stride + cols, y, mask = mask);
}

/// The reference, in f64.
fn reference(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.iter().map(move |v| (v - m).exp() / s).collect::<Vec<_>>()
        })
        .collect()
}

/// Runs the kernel on `x` (`rows` rows of `cols`, stored in `T`) with
/// `BLOCK = cols` and returns the output widened to f64. The dtype is part
/// of the config, so each `T` is its own specialization of one kernel.
fn run<T: Element>(
    cpu: &mut Cpu,
    x: &[T],
    rows: usize,
    cols: usize,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let config = softmax::Config::new(T::DTYPE, cols);
    let (xp, out) = (cpu.upload(x), cpu.zeros::<T>(rows * cols));
    let args = softmax::Args {
        out_ptr: out.cast(),
        in_ptr: xp.cast(),
        n_cols: cols as i32,
        stride: cols as i32,
        _marker: PhantomData,
    };
    softmax::interpret(cpu, [rows as u32, 1, 1], &config, &args)?;
    Ok(cpu.read(out).into_iter().map(Element::to_f64).collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (rows, cols) = (37, 1000);
    let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 125.0) - 4.0 + 1e-3).collect();
    let mut cpu = Cpu::new();

    // f32 storage, BLOCK = 1000 (padded to 1024 inside the kernel).
    let got = run(&mut cpu, &x, rows, cols)?;
    let want = reference(&x.iter().map(|&v| v as f64).collect::<Vec<_>>(), cols);
    let err32 = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);

    // bf16 storage: same kernel, another specialization.
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let got = run(&mut cpu, &xb, rows, cols)?;
    let want = reference(&xb.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), cols);
    let rel16 = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / w.abs().max(1e-30)).fold(0.0, f64::max);

    println!("softmax {rows}x{cols}: f32 max abs error {err32:.2e}, bf16 max relative error {rel16:.2e}");
    if err32 > 1e-6 || rel16 > 1.0 / 128.0 {
        return Err("softmax differs from the reference beyond rounding".into());
    }
    println!("ok: both specializations agree with the f64 reference");
    Ok(())
}
