//! `dsl-core`: the tile IR of the tessera kernel language, the builder API the
//! `#[kernel]` macro expands into, the verifier, the text printer and parser,
//! target-independent passes (canonicalization, axis analysis) and a CPU
//! interpreter that executes the same IR the GPU path lowers.
//!
//! Invariants: this crate depends on neither inkwell nor cudarc; ops and dtypes
//! are enums and values typed index newtypes (text appears only in the printer
//! and parser).

// The interpreter tests include `kernels::reference` files, which name this
// crate `dsl_core`.
#[cfg(test)]
extern crate self as dsl_core;

pub mod builder;
pub mod dtype;
pub mod error;
pub mod interp;
pub mod ir;
pub mod lang;
pub mod launch;
pub mod loc;
pub mod parse;
pub mod passes;
pub mod print;
pub mod verify;

pub use dtype::{DType, Elem, Shape, Type};
pub use error::{Diagnostic, Error, Result};
/// Re-exported so generated code can name `f16`/`bf16` element types.
pub use float8;
pub use half;
pub use ir::{Function, Op, Scalar, Value};
pub use loc::Location;
