//! `#[kernel]`: write tile kernels in Rust syntax.
//!
//! This crate is a placeholder until the macro lands (issue "#[kernel]"); it
//! already builds so the workspace layout is fixed. Macro output names only
//! `::dsl_core` paths.
