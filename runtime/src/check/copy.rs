//! The check of `kernels::copy` (the bandwidth probe): ragged lengths, f32
//! and bf16, bit-exact against the interpreter.

use crate::check::{CheckRow, DevicePtr, EXACT, Rng, outcome, over_shapes};
use crate::error::Result;
use crate::model::{ActElem, Device};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::copy::copy as kernel;
use std::marker::PhantomData;

/// A copy of `x` made by the kernel on `dev`.
fn copy_on<T: ActElem, D: Device>(dev: &mut D, x: &[T]) -> Result<Vec<T>> {
    let n = x.len();
    let config = kernel::Config::new(T::DEVICE_DTYPE, 1024);
    let (xd, od) = (dev.upload(x)?, dev.zeros::<T>(n)?);
    let args =
        kernel::Args { x_ptr: dev.ptr(&xd)?, out_ptr: dev.ptr(&od)?, n: n as i32, _marker: PhantomData };
    dev.run::<kernel::Kernel>([n.div_ceil(1024) as u32, 1, 1], &config, &args)?;
    dev.download(&od)
}

fn copy_case<T: ActElem, D: Device>(dev: &mut D, rng: &mut Rng, n: usize) -> Result<CheckRow> {
    let x = rng.values::<T>(n, 8.0);
    let (got, want) = (copy_on(dev, &x)?, copy_on(&mut Cpu::new(), &x)?);
    Ok(outcome("copy", n.to_string(), T::DEVICE_DTYPE, &got, &want, EXACT))
}

/// The `copy` check: ragged lengths, f32 and bf16, bit-exact.
pub fn copy<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(dev, seed, &[1, 1000, (1 << 18) + 3], [copy_case::<f32, D>, copy_case::<bf16, D>])
}
