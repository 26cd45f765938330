//! The checks of `kernels::rmsnorm`: add+RMSNorm (`h` bit-exact, `out`
//! within its tolerance) and RMSNorm, at ragged shapes with exact
//! (non-power-of-two) and padded `BLOCK`s, f32 and bf16.

use crate::check::{CheckRow, DevicePtr, EXACT, Rng, Tol, outcome, over_shapes, row_block, row_shape};
use crate::error::Result;
use crate::model::args::norm_args;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::rmsnorm::{add_rmsnorm, rmsnorm};

/// Ragged `(rows, cols, num_warps)` of the RMSNorm checks: SmolLM2's hidden
/// size (one decode row and a batch), tiny and odd rows, and 4097 columns at 8
/// and 16 warps (the autotune candidates).
const NORM_SHAPES: [(usize, usize, u32); 6] =
    [(1, 576, 4), (33, 576, 4), (5, 17, 4), (64, 1024, 8), (7, 4097, 8), (7, 4097, 16)];

/// The norms' epsilon.
const EPS: f32 = 1e-5;

/// The `out` tolerance of add+RMSNorm: the normalized value is rounded to `T`
/// before the weight multiply (as torch does), and where the GPU's f32 `rstd`
/// (another summation order, approximate `rsqrt`) puts `h * rstd` on the other
/// side of a bf16 rounding boundary the result differs by up to two units of
/// its rounding; f32 keeps [`Tol::for_dtype`].
fn add_rmsnorm_out_tol(dtype: DType) -> Tol {
    match dtype {
        DType::BF16 => Tol { atol: 1e-6, rtol: 2.0 / 128.0 },
        DType::F16 => Tol { atol: 1e-6, rtol: 2.0 / 1024.0 },
        d => Tol::for_dtype(d),
    }
}

/// `(out, h)` of add+RMSNorm of `x + r` with weight `w` on `dev`.
fn add_rmsnorm_on<T: ActElem, D: Device>(
    dev: &mut D,
    (x, r, w): (&[T], &[T], &[T]),
    block: usize,
    warps: u32,
) -> Result<(Vec<T>, Vec<T>)> {
    let (n, cols) = (x.len(), w.len());
    let config = add_rmsnorm::Config::new(T::DEVICE_DTYPE, block).with_warps(warps);
    let (xd, rd, wd) = (dev.upload(x)?, dev.upload(r)?, dev.upload(w)?);
    let (od, hd) = (dev.zeros::<T>(n)?, dev.zeros::<T>(n)?);
    let xw = (dev.ptr(&xd)?, dev.ptr(&wd)?);
    let args = norm_args!(
        add_rmsnorm,
        xw,
        (cols, cols, EPS),
        r_ptr: dev.ptr(&rd)?,
        out_ptr: dev.ptr(&od)?,
        h_ptr: dev.ptr(&hd)?,
    );
    dev.run::<add_rmsnorm::Kernel>([(n / cols) as u32, 1, 1], &config, &args)?;
    Ok((dev.download(&od)?, dev.download(&hd)?))
}

fn add_rmsnorm_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols, warps): (usize, usize, u32),
    exact: bool,
) -> Result<[CheckRow; 2]> {
    let n = rows * cols;
    let (x, r, w) = (rng.values::<T>(n, 4.0), rng.values::<T>(n, 4.0), rng.values::<T>(cols, 2.0));
    let block = row_block(cols, exact);
    let (got_out, got_h) = add_rmsnorm_on(dev, (&x, &r, &w), block, warps)?;
    let (want_out, want_h) = add_rmsnorm_on(&mut Cpu::new(), (&x, &r, &w), block, warps)?;
    let shape = format!("{}, {warps}w", row_shape(rows, cols, exact));
    let d = T::DEVICE_DTYPE;
    Ok([
        // The residual is one rounding of an f32 sum on both sides: bit-exact.
        outcome("add_rmsnorm", format!("{shape}: h"), d, &got_h, &want_h, EXACT),
        outcome("add_rmsnorm", format!("{shape}: out"), d, &got_out, &want_out, add_rmsnorm_out_tol(d)),
    ])
}

/// The `add_rmsnorm` check: ragged shapes (exact non-power-of-two and padded
/// `BLOCK`s), f32 and bf16; `h` bit-exact, `out` within its tolerance.
pub fn add_rmsnorm<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &NORM_SHAPES, [add_rmsnorm_case::<f32, D>, add_rmsnorm_case::<bf16, D>])
}

/// RMSNorm of the rows of `x` (`w.len()` values, `stride` apart) with
/// weight `w` and the given `BLOCK` and warps on `dev`; the whole buffer
/// comes back (the gaps between rows zero).
pub(crate) fn rmsnorm_on<T: ActElem, D: Device>(
    dev: &mut D,
    (x, w): (&[T], &[T]),
    stride: usize,
    (block, warps): (usize, u32),
) -> Result<Vec<T>> {
    let (n, cols) = (x.len(), w.len());
    let config = rmsnorm::Config::new(T::DEVICE_DTYPE, block, false).with_warps(warps);
    let (xd, wd, od) = (dev.upload(x)?, dev.upload(w)?, dev.zeros::<T>(n)?);
    let args =
        norm_args!(rmsnorm, (dev.ptr(&xd)?, dev.ptr(&wd)?), (cols, stride, EPS), out_ptr: dev.ptr(&od)?);
    dev.run::<rmsnorm::Kernel>([(n / stride) as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

fn rmsnorm_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols, warps): (usize, usize, u32),
    exact: bool,
) -> Result<[CheckRow; 1]> {
    let (x, w) = (rng.values::<T>(rows * cols, 4.0), rng.values::<T>(cols, 2.0));
    let block = row_block(cols, exact);
    let got = rmsnorm_on(dev, (&x, &w), cols, (block, warps))?;
    let want = rmsnorm_on(&mut Cpu::new(), (&x, &w), cols, (block, warps))?;
    let shape = format!("{}, {warps}w", row_shape(rows, cols, exact));
    let d = T::DEVICE_DTYPE;
    Ok([outcome("rmsnorm", shape, d, &got, &want, Tol::for_dtype(d))])
}

/// The `rmsnorm` check: ragged shapes (exact non-power-of-two and padded
/// `BLOCK`s), f32 and bf16 (one rounding at the end: one unit of it).
pub fn rmsnorm<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &NORM_SHAPES, [rmsnorm_case::<f32, D>, rmsnorm_case::<bf16, D>])
}
