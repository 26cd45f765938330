//! The checks of the tutorial kernels (`kernels::examples`): vector add,
//! the FMA matmul, per-row argmax and cumsum, layer norm, histogram and
//! Collatz step counts, each run on the device and on the interpreter with
//! the same random inputs.
//!
//! Every `*_on` function is one launch on any [`Device`]: the check calls it
//! with the device under test and with a fresh interpreter and compares the
//! two outputs.

use crate::check::{
    CheckRow, DevicePtr, EXACT, F32_SUM, Rng, Tol, outcome, over_cases, over_row_shapes, over_shapes,
    row_block, row_shape,
};
use crate::error::Result;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::examples::{argmax_rows, collatz, cumsum_rows, histogram, layer_norm, matmul, vector_add};
use std::marker::PhantomData;

/// `x + y` on `dev`.
fn vector_add_on<T: ActElem, D: Device>(dev: &mut D, x: &[T], y: &[T]) -> Result<Vec<T>> {
    let n = x.len();
    let config = vector_add::Config::new(T::DEVICE_DTYPE, 1024);
    let (xd, yd, od) = (dev.upload(x)?, dev.upload(y)?, dev.zeros::<T>(n)?);
    let args = vector_add::Args {
        x_ptr: dev.ptr(&xd)?,
        y_ptr: dev.ptr(&yd)?,
        out_ptr: dev.ptr(&od)?,
        n: n as i32,
        _marker: PhantomData,
    };
    dev.run::<vector_add::Kernel>([n.div_ceil(1024) as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

fn vector_add_case<T: ActElem, D: Device>(dev: &mut D, rng: &mut Rng, n: usize) -> Result<[CheckRow; 1]> {
    let (x, y) = (rng.values::<T>(n, 8.0), rng.values::<T>(n, 8.0));
    let got = vector_add_on(dev, &x, &y)?;
    let want = vector_add_on(&mut Cpu::new(), &x, &y)?;
    let d = T::DEVICE_DTYPE;
    Ok([outcome("vector_add", n.to_string(), d, &got, &want, Tol::for_dtype(d))])
}

/// The `vector_add` check: ragged lengths, f32 and bf16.
pub fn vector_add<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &[1, 1000, 4097, 100_003], [vector_add_case::<f32, D>, vector_add_case::<bf16, D>])
}

/// The `[m, n]` f32 product of `a` (`[m, k]`) and `b` (`[k, n]`) on `dev`
/// with `(BLOCK_M, BLOCK_N, BLOCK_K, warps)` tiles.
fn matmul_on<T: ActElem, D: Device>(
    dev: &mut D,
    (a, b): (&[T], &[T]),
    (m, n, k): (usize, usize, usize),
    (bm, bn, bk, warps): (usize, usize, usize, u32),
) -> Result<Vec<f32>> {
    let config = matmul::Config::new(T::DEVICE_DTYPE, bm, bn, bk).with_warps(warps);
    let (ad, bd, cd) = (dev.upload(a)?, dev.upload(b)?, dev.zeros::<f32>(m * n)?);
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let args = matmul::Args {
        a_ptr: dev.ptr(&ad)?,
        b_ptr: dev.ptr(&bd)?,
        c_ptr: dev.ptr(&cd)?,
        m: mi,
        n: ni,
        k: ki,
        stride_am: ki,
        stride_bk: ni,
        stride_cm: ni,
        _marker: PhantomData,
    };
    dev.run::<matmul::Kernel>([m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1], &config, &args)?;
    dev.download(&cd)
}

/// One matmul check shape: `(m, n, k)` and `(BLOCK_M, BLOCK_N, BLOCK_K, warps)`.
type MatmulShape = ((usize, usize, usize), (usize, usize, usize, u32));

fn matmul_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    ((m, n, k), tiles): MatmulShape,
) -> Result<[CheckRow; 1]> {
    let (a, b) = (rng.values::<T>(m * k, 1.0), rng.values::<T>(k * n, 1.0));
    let got = matmul_on(dev, (&a, &b), (m, n, k), tiles)?;
    let want = matmul_on(&mut Cpu::new(), (&a, &b), (m, n, k), tiles)?;
    let (bm, bn, bk, warps) = tiles;
    let shape = format!("{m}x{n}x{k} ({bm}x{bn}x{bk}, {warps}w)");
    Ok([outcome("matmul", shape, T::DEVICE_DTYPE, &got, &want, F32_SUM)])
}

/// The `matmul` check: ragged `m x n x k`, two tile configs, f32 and bf16
/// inputs (f32 accumulate and output).
pub fn matmul<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let shapes: Vec<MatmulShape> = [(1, 1, 1), (37, 45, 70), (130, 66, 33), (64, 64, 64)]
        .into_iter()
        .flat_map(|shape| [(32, 32, 16, 4), (64, 64, 32, 8)].map(|tiles| (shape, tiles)))
        .collect();
    over_shapes(dev, seed, &shapes, [matmul_case::<f32, D>, matmul_case::<bf16, D>])
}

/// The check of a tutorial row kernel with the arguments `(x_ptr, out_ptr,
/// n_cols)`, one program a row writing `$per_row(cols)` elements of `$out`:
/// on every row shape ([`over_row_shapes`]), f32 inputs of magnitudes up to
/// `$hi`, run on the device and on the interpreter and compared within `$tol`.
macro_rules! row_kernel_check {
    ($(#[$doc:meta])* $kernel:ident -> $out:ty, $per_row:expr, $hi:expr, $tol:expr) => {
        $(#[$doc])*
        pub fn $kernel<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
            /// The kernel's outputs for `x` (rows of `cols`) on `dev`.
            fn on<D: Device>(dev: &mut D, x: &[f32], cols: usize, block: usize) -> Result<Vec<$out>> {
                let rows = x.len() / cols;
                let per_row: fn(usize) -> usize = $per_row;
                let (xd, od) = (dev.upload(x)?, dev.zeros::<$out>(rows * per_row(cols))?);
                let args = $kernel::Args {
                    x_ptr: dev.ptr(&xd)?,
                    out_ptr: dev.ptr(&od)?,
                    n_cols: cols as i32,
                    _marker: PhantomData,
                };
                dev.run::<$kernel::Kernel>([rows as u32, 1, 1], &$kernel::Config::new(block), &args)?;
                dev.download(&od)
            }

            fn case<D: Device>(
                dev: &mut D,
                rng: &mut Rng,
                (rows, cols, exact): (usize, usize, bool),
            ) -> Result<CheckRow> {
                let x = rng.values::<f32>(rows * cols, $hi);
                let block = row_block(cols, exact);
                let got = on(dev, &x, cols, block)?;
                let want = on(&mut Cpu::new(), &x, cols, block)?;
                Ok(outcome(stringify!($kernel), row_shape(rows, cols, exact), DType::F32, &got, &want, $tol))
            }

            over_row_shapes(dev, seed, case)
        }
    };
}

row_kernel_check!(
    /// The `argmax_rows` check (the index of each row's largest element):
    /// ragged shapes, exact and padded `BLOCK`s, exact indices (random
    /// inputs make ties improbable).
    argmax_rows -> i32, |_| 1, 8.0, EXACT
);

row_kernel_check!(
    /// The `cumsum_rows` check (the running sums of each row): ragged
    /// shapes, exact and padded `BLOCK`s, f32.
    cumsum_rows -> f32, |cols| cols, 1.0, F32_SUM
);

/// The layer norm of each row of `x` (rows of `cols`) with weight `w` and
/// bias `b` on `dev`.
fn layer_norm_on<D: Device>(
    dev: &mut D,
    (x, w, b): (&[f32], &[f32], &[f32]),
    block: usize,
) -> Result<Vec<f32>> {
    let (cols, rows) = (w.len(), x.len() / w.len());
    let (xd, wd, bd, yd) = (dev.upload(x)?, dev.upload(w)?, dev.upload(b)?, dev.zeros::<f32>(x.len())?);
    let args = layer_norm::Args {
        x_ptr: dev.ptr(&xd)?,
        y_ptr: dev.ptr(&yd)?,
        w_ptr: dev.ptr(&wd)?,
        b_ptr: dev.ptr(&bd)?,
        n_cols: cols as i32,
        eps: 1e-5,
        _marker: PhantomData,
    };
    dev.run::<layer_norm::Kernel>([rows as u32, 1, 1], &layer_norm::Config::new(block), &args)?;
    dev.download(&yd)
}

fn layer_norm_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols, exact): (usize, usize, bool),
) -> Result<CheckRow> {
    let (x, w, b) =
        (rng.values::<f32>(rows * cols, 4.0), rng.values::<f32>(cols, 2.0), rng.values::<f32>(cols, 2.0));
    let block = row_block(cols, exact);
    let got = layer_norm_on(dev, (&x, &w, &b), block)?;
    let want = layer_norm_on(&mut Cpu::new(), (&x, &w, &b), block)?;
    Ok(outcome("layer_norm", row_shape(rows, cols, exact), DType::F32, &got, &want, F32_SUM))
}

/// The `layer_norm` check: ragged shapes, exact (non-power-of-two) and padded
/// `BLOCK`s, f32.
pub fn layer_norm<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_row_shapes(dev, seed, layer_norm_case)
}

/// The counts of each of `bins` values in `data` on `dev`.
fn histogram_on<D: Device>(dev: &mut D, data: &[i32], bins: usize) -> Result<Vec<i32>> {
    let n = data.len();
    let (dd, hd) = (dev.upload(data)?, dev.zeros::<i32>(bins)?);
    let args = histogram::Args {
        bins_ptr: dev.ptr(&dd)?,
        hist_ptr: dev.ptr(&hd)?,
        n: n as i32,
        _marker: PhantomData,
    };
    dev.run::<histogram::Kernel>([n.div_ceil(1024) as u32, 1, 1], &histogram::Config::new(1024), &args)?;
    dev.download(&hd)
}

fn histogram_case<D: Device>(dev: &mut D, rng: &mut Rng, n: usize, bins: usize) -> Result<CheckRow> {
    let data: Vec<i32> = (0..n).map(|_| (rng.next_u64() % bins as u64) as i32).collect();
    let got = histogram_on(dev, &data, bins)?;
    let want = histogram_on(&mut Cpu::new(), &data, bins)?;
    Ok(outcome("histogram", format!("{n} into {bins} bins"), DType::I32, &got, &want, EXACT))
}

/// The `histogram` check: ragged lengths, exact counts (atomics).
pub fn histogram<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let cases = [(1, 1), (1000, 37), (4097, 256), (100_003, 37)];
    over_cases(dev, seed, cases, |dev, rng, (n, bins)| histogram_case(dev, rng, n, bins))
}

/// The Collatz step count of each of `xs` on `dev`.
fn collatz_on<D: Device>(dev: &mut D, xs: &[i32]) -> Result<Vec<i32>> {
    let n = xs.len();
    let (xd, od) = (dev.upload(xs)?, dev.zeros::<i32>(n)?);
    let args = collatz::Args { x_ptr: dev.ptr(&xd)?, out_ptr: dev.ptr(&od)?, _marker: PhantomData };
    dev.run::<collatz::Kernel>([n as u32, 1, 1], &collatz::Config::new(), &args)?;
    dev.download(&od)
}

fn collatz_case<D: Device>(dev: &mut D, xs: &[i32]) -> Result<CheckRow> {
    let (got, want) = (collatz_on(dev, xs)?, collatz_on(&mut Cpu::new(), xs)?);
    Ok(outcome("collatz", xs.len().to_string(), DType::I32, &got, &want, EXACT))
}

/// The `collatz` check: step counts of inputs in `1..=1000` (one random, all
/// of them, and a random ragged batch), exact.
pub fn collatz<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut draw = |n: usize| -> Vec<i32> { (0..n).map(|_| 1 + (rng.next_u64() % 1000) as i32).collect() };
    let (one, ragged) = (draw(1), draw(4097));
    let all: Vec<i32> = (1..=1000).collect();
    [one, all, ragged].iter().map(|xs| collatz_case(dev, xs)).collect()
}
