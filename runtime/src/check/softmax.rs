//! The checks of `kernels::softmax`: the one-block row softmax (exact
//! non-power-of-two and padded `BLOCK`s) and the online softmax (rows longer
//! than `BLOCK`, scales, causal masks), f32 and bf16.

use crate::check::{CheckRow, DevicePtr, ROW_SHAPES, Rng, Tol, outcome, over_shapes, row_block, row_shape};
use crate::error::Result;
use crate::model::args::softmax_args;
use crate::model::{ActElem, Device};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::softmax::{softmax as row_softmax, softmax_online as online, softmax_warps};

/// The softmax of each row of `x` (rows of `cols`) with a `BLOCK` of `block` on `dev`.
fn softmax_on<T: ActElem, D: Device>(dev: &mut D, x: &[T], cols: usize, block: usize) -> Result<Vec<T>> {
    let config =
        row_softmax::Config::new(T::DEVICE_DTYPE, block).with_warps(softmax_warps(block.next_power_of_two()));
    let (xd, od) = (dev.upload(x)?, dev.zeros::<T>(x.len())?);
    let args = softmax_args!(row_softmax, (dev.ptr(&od)?, dev.ptr(&xd)?), cols);
    dev.run::<row_softmax::Kernel>([(x.len() / cols) as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

fn softmax_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols): (usize, usize),
    exact: bool,
) -> Result<[CheckRow; 1]> {
    let x = rng.values::<T>(rows * cols, 4.0);
    let block = row_block(cols, exact);
    let got = softmax_on(dev, &x, cols, block)?;
    let want = softmax_on(&mut Cpu::new(), &x, cols, block)?;
    let d = T::DEVICE_DTYPE;
    Ok([outcome("softmax", row_shape(rows, cols, exact), d, &got, &want, Tol::for_dtype(d))])
}

/// The `softmax` check: ragged shapes (exact non-power-of-two `BLOCK`s and
/// padded ones), f32 and bf16.
pub fn softmax<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &ROW_SHAPES, [softmax_case::<f32, D>, softmax_case::<bf16, D>])
}

/// One online-softmax check shape: `(rows, cols, BLOCK, warps, scale, causal
/// offset)`.
type OnlineShape = (usize, usize, usize, u32, f32, Option<i32>);

/// Online-softmax check shapes. Rows shorter than, exactly, and raggedly
/// longer than `BLOCK` (one to four chunks), causal offsets that mask whole
/// rows (-3) and that align the last query with the last key.
const SOFTMAX_ONLINE_SHAPES: [OnlineShape; 7] = [
    (1, 1, 256, 4, 1.0, None),
    (5, 17, 256, 4, 0.125, Some(0)),
    (37, 1000, 256, 4, 1.0, None),
    (64, 1024, 1024, 4, 0.125, Some(0)),
    (7, 4097, 1024, 8, 1.0, Some(4090)),
    (6, 3000, 1024, 8, 2.0, Some(-3)),
    (16, 8192, 4096, 16, 0.088, Some(8176)),
];

/// The online softmax of `x` at `shape` on `dev`.
fn softmax_online_on<T: ActElem, D: Device>(dev: &mut D, x: &[T], shape: OnlineShape) -> Result<Vec<T>> {
    let (rows, cols, block, warps, scale, causal) = shape;
    let config = online::Config::new(T::DEVICE_DTYPE, causal.is_some(), block).with_warps(warps);
    let (xd, od) = (dev.upload(x)?, dev.zeros::<T>(x.len())?);
    let args = softmax_args!(
        online,
        (dev.ptr(&od)?, dev.ptr(&xd)?),
        cols,
        scale,
        causal_offset: causal.unwrap_or(0),
    );
    dev.run::<online::Kernel>([rows as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

fn softmax_online_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    shape: OnlineShape,
) -> Result<[CheckRow; 1]> {
    let (rows, cols, block, warps, scale, causal) = shape;
    let x = rng.values::<T>(rows * cols, 4.0);
    let got = softmax_online_on(dev, &x, shape)?;
    let want = softmax_online_on(&mut Cpu::new(), &x, shape)?;
    let mask = causal.map_or("no mask".to_string(), |o| format!("causal {o}"));
    let shape = format!("{rows}x{cols}, BLOCK {block}, {warps}w, scale {scale}, {mask}");
    let d = T::DEVICE_DTYPE;
    Ok([outcome("softmax_online", shape, d, &got, &want, Tol::for_dtype(d))])
}

/// The `softmax_online` check: rows up to 8192 in 256..4096 chunks (ragged
/// and exact multiples), scales, causal on and off (incl. fully masked rows),
/// f32 and bf16.
pub fn softmax_online<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(
        dev,
        seed,
        &SOFTMAX_ONLINE_SHAPES,
        [softmax_online_case::<f32, D>, softmax_online_case::<bf16, D>],
    )
}
