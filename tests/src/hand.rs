//! Hand-built kernels: the foundation's reference programs. The `#[kernel]`
//! versions of the same kernels must print identical IR.

use dsl_core::lang::*;
use dsl_core::{Function, Result};

/// `out[i] = x[i] + y[i]` for `i < n`, `BLOCK` elements per program.
pub fn vector_add(block: usize) -> Result<Function> {
    KernelBuilder::new("vector_add").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let y_ptr = param_ptr("y_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::F32);
        let n = param_scalar("n", DType::I32);
        let pid = program_id(0);
        let offs = pid * block as i32 + arange(0, block as i32);
        let mask = offs.lt(n);
        let x = load(x_ptr + offs, Some(mask), None);
        let y = load(y_ptr + offs, Some(mask), None);
        store(out_ptr + offs, x + y, Some(mask));
    })
}

/// Row softmax: one program per row of `n_cols` elements (`BLOCK >= n_cols`),
/// computed in f32, stored in `dtype`.
pub fn softmax(block: usize, dtype: DType) -> Result<Function> {
    KernelBuilder::new("softmax").build(|| {
        let out_ptr = param_ptr("out_ptr", dtype);
        let in_ptr = param_ptr("in_ptr", dtype);
        let n_cols = param_scalar("n_cols", DType::I32);
        let stride = param_scalar("stride", DType::I32);
        let row = program_id(0);
        let cols = arange(0, block as i32);
        let mask = cols.lt(n_cols);
        let x = load(in_ptr + row * stride + cols, Some(mask), Some(f32::NEG_INFINITY.into())).to(DType::F32);
        let x = x - max(x, 0);
        let e = exp(x);
        let y = e / sum(e, 0);
        store(out_ptr + row * stride + cols, y, Some(mask));
    })
}
