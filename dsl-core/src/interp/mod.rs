//! The CPU interpreter: runs a function over a grid, program by program. It is
//! the semantic oracle of the GPU path and runs whole models in CI.
//!
//! Usage:
//! ```
//! use dsl_core::interp::{Arg, Buffer, launch};
//! use dsl_core::lang::*;
//!
//! let f = KernelBuilder::new("double").build(|| {
//!     let x = param_ptr("x", DType::F32);
//!     let offs = arange(0, 4);
//!     store(x + offs, load(x + offs, None, None) * 2.0, None);
//! })?;
//! let mut bufs = [Buffer::from_slice(&[1.0f32, 2.0, 3.0, 4.0])];
//! launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)])?;
//! assert_eq!(bufs[0].to_vec::<f32>(), vec![2.0, 4.0, 6.0, 8.0]);
//! # Ok::<(), dsl_core::Error>(())
//! ```
//!
//! Design (one file per concern):
//! - `buffer.rs`: host [`Buffer`]s (dtype + little-endian bytes) and [`Arg`]s;
//! - `launch.rs`: [`Kernel`] (verified and analyzed once), [`Interpreter`]
//!   options, argument validation, the grid loop, and the cooperative
//!   scheduler of kernels that `wait_until` (deadlocks are errors);
//! - `plan.rs`: liveness (values are dropped after their last use) and which
//!   custom combine regions can run vectorized;
//! - `exec.rs`: the executor (environment indexed by value, control flow as
//!   an explicit frame stack, so a waiting program can stop and resume);
//! - `tile.rs`: runtime tiles (shared, typed storage) and float rounding;
//! - `arith.rs`, `cast.rs`, `shape.rs`, `dot.rs`, `reduce.rs`: op kernels that
//!   process a whole tile per call in tight typed loops;
//! - `memory.rs`, `atomic.rs`: pointers, bounds/alignment checks, loads,
//!   block loads, stores, atomics and write-race detection;
//! - `model.rs`: the happens-before check of kernels that synchronise
//!   programs (missing releases and acquires);
//! - `debug.rs`: checked hints, `assert`, `print`.
//!
//! Invariants: the interpreter never panics on kernel input (IR is verified
//! first; every runtime problem is an [`InterpError`] naming the op, its source
//! location and the program); floats are rounded to their dtype after every op
//! (f16/bf16 to nearest even, as the GPU stores them); programs run one at a
//! time (one after another, or interleaved at waits in a fixed order), so
//! results are deterministic.

mod arith;
mod atomic;
mod buffer;
mod cast;
mod debug;
mod dot;
mod exec;
mod launch;
mod memory;
mod model;
mod plan;
mod reduce;
mod shape;
mod tile;

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_block;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_f8;
#[cfg(test)]
mod tests_sync;
#[cfg(test)]
mod tests_wait_load;

pub use arith::erf;
pub use buffer::{Arg, Buffer, Element, FloatElement};
pub use launch::{Interpreter, Kernel};

use crate::ir::Function;
use crate::loc::Location;

/// An error raised while interpreting a kernel, naming the op and its location.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{loc}: in `{op}`: {message}")]
pub struct InterpError {
    /// Location of the failing op in the kernel source.
    pub loc: Location,
    /// The failing op's mnemonic.
    pub op: &'static str,
    /// What went wrong (it starts with the failing program's id).
    pub message: String,
    /// The grid coordinates of the failing program.
    pub program: Option<[u32; 3]>,
}

/// Verifies `f` and runs it over `grid` with default options (prints go to
/// stdout, race detection on). To launch one kernel many times, prepare it once
/// with [`Kernel::new`] instead.
///
/// Errors: [`crate::Error::Verify`], [`crate::Error::Launch`] or
/// [`crate::Error::Interp`] (see [`Interpreter::launch`]).
pub fn launch(f: &Function, grid: [u32; 3], buffers: &mut [Buffer], args: &[Arg]) -> crate::Result<()> {
    Kernel::new(f)?.launch(grid, buffers, args)
}

mod cpu;
pub use cpu::{Cpu, CpuPtr, KernelCache};
