//! Shared fixtures of the cross-crate test suite: the hand-built reference
//! kernels (built with the `dsl_core` builder API, exactly what `#[kernel]`
//! expands into) and plain-Rust references to check them against.

pub mod dsl;
pub mod hand;
pub mod reference;
