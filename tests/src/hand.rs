//! Hand-built kernels: the foundation's reference programs. The `#[kernel]`
//! versions of the same kernels must print identical IR.

use dsl_core::lang::*;
use dsl_core::{Function, Result};

/// The column tile of this program's row (`program_id(0)`) of `n_cols`
/// elements in a `block` tile: `(row, cols, cols < n_cols)`.
fn row_tile(block: usize, n_cols: Tensor) -> (Tensor, Tensor, Tensor) {
    let row = program_id(0);
    let cols = arange(0, block as i32);
    let mask = cols.lt(n_cols);
    (row, cols, mask)
}

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
        let (row, cols, mask) = row_tile(block, n_cols);
        let x = load(in_ptr + row * stride + cols, Some(mask), Some(f32::NEG_INFINITY.into())).to(DType::F32);
        let x = x - max(x, 0);
        let e = exp(x);
        let y = e / sum(e, 0);
        store(out_ptr + row * stride + cols, y, Some(mask));
    })
}

/// `C[M, N] = A[M, K] @ B[K, N]` (row-major, given row strides), `BM x BN` tiles
/// per program over a 2-D grid, a K loop of `BK` steps with `dot`; f32 output.
pub fn matmul(bm: usize, bn: usize, bk: usize, dtype: DType) -> Result<Function> {
    KernelBuilder::new("matmul").build(|| {
        let a_ptr = param_ptr("a_ptr", dtype);
        let b_ptr = param_ptr("b_ptr", dtype);
        let c_ptr = param_ptr("c_ptr", DType::F32);
        let m = param_scalar("m", DType::I32);
        let n = param_scalar("n", DType::I32);
        let k = param_scalar("k", DType::I32);
        let stride_am = param_scalar("stride_am", DType::I32);
        let stride_bk = param_scalar("stride_bk", DType::I32);
        let stride_cm = param_scalar("stride_cm", DType::I32);
        let (rm, rn, rk) = tile_ranges(bm, bn, bk);
        let rows = expand_dims(rm, 1);
        let cols = expand_dims(rn, 0);
        let acc = zeros(&[bm, bn], DType::F32);
        let acc = for_range(0, k, bk as i32, &[acc], |k0, carried| {
            let ks = k0 + rk;
            let a_mask = rows.lt(m) & expand_dims(ks, 0).lt(k);
            let a = load(a_ptr + rows * stride_am + expand_dims(ks, 0), Some(a_mask), Some(0.0.into()));
            let b_mask = expand_dims(ks, 1).lt(k) & cols.lt(n);
            let b = load(b_ptr + expand_dims(ks, 1) * stride_bk + cols, Some(b_mask), Some(0.0.into()));
            vec![dot(a, b, Some(carried[0]))]
        })[0];
        store(c_ptr + rows * stride_cm + cols, acc, Some(rows.lt(m) & cols.lt(n)));
    })
}

/// The ranges of a `BM x BN` output tile per program over a 2-D grid and of
/// one `BK` step of the K loop: `(rows, cols, ks)` with rows
/// `program_id(0) * BM + [0, BM)`, columns `program_id(1) * BN + [0, BN)`
/// and `ks` `[0, BK)`.
pub fn tile_ranges(bm: usize, bn: usize, bk: usize) -> (Tensor, Tensor, Tensor) {
    let rm = program_id(0) * bm as i32 + arange(0, bm as i32);
    let rn = program_id(1) * bn as i32 + arange(0, bn as i32);
    let rk = arange(0, bk as i32);
    (rm, rn, rk)
}

/// `out[row] = argmax(x[row, :n_cols])`, one program per row.
pub fn argmax_rows(block: usize) -> Result<Function> {
    KernelBuilder::new("argmax_rows").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::I32);
        let n_cols = param_scalar("n_cols", DType::I32);
        let (row, cols, mask) = row_tile(block, n_cols);
        let x = load(x_ptr + row * n_cols + cols, Some(mask), Some(f32::NEG_INFINITY.into()));
        store(out_ptr + row, argmax(x, 0), None);
    })
}

/// Row-wise inclusive prefix sum of `x[row, :n_cols]`.
pub fn cumsum_rows(block: usize) -> Result<Function> {
    KernelBuilder::new("cumsum_rows").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::F32);
        let n_cols = param_scalar("n_cols", DType::I32);
        let (row, cols, mask) = row_tile(block, n_cols);
        let x = load(x_ptr + row * n_cols + cols, Some(mask), Some(0.0.into()));
        store(out_ptr + row * n_cols + cols, cumsum(x, 0), Some(mask));
    })
}

/// Collatz step counts: `out[i]` = number of steps for `x[i]` to reach 1, one
/// scalar per program; exercises `while` with an `if` inside.
pub fn collatz() -> Result<Function> {
    KernelBuilder::new("collatz").build(|| {
        collatz_steps();
    })
}

/// The body of [`collatz`] (its parameters, the step loop and the store of
/// the count), for kernels that extend it: returns `(out_ptr, program_id(0))`.
pub fn collatz_steps() -> (Tensor, Tensor) {
    let x_ptr = param_ptr("x_ptr", DType::I32);
    let out_ptr = param_ptr("out_ptr", DType::I32);
    let pid = program_id(0);
    let x = load(x_ptr + pid, None, None);
    let steps = constant(0, DType::I32);
    let done = while_loop(
        &[x, steps],
        |v| v[0].gt(1),
        |v| {
            let (x, steps) = (v[0], v[1]);
            let even = (x % 2).eq_(0);
            let next = if_else(even, || vec![x / 2], || vec![x * 3 + 1])[0];
            vec![next, steps + 1]
        },
    );
    store(out_ptr + pid, done[1], None);
    (out_ptr, pid)
}

/// Histogram: `hist[bins[i]] += 1` for `i < n` with `atomic_add`.
pub fn histogram(block: usize) -> Result<Function> {
    KernelBuilder::new("histogram").build(|| {
        histogram_steps(block);
    })
}

/// The body of [`histogram`] (its parameters, the bin loads and the
/// `atomic_add`s), for kernels that extend it: returns `(hist_ptr, bins,
/// offs, offs < n)`.
pub fn histogram_steps(block: usize) -> (Tensor, Tensor, Tensor, Tensor) {
    let bins_ptr = param_ptr("bins_ptr", DType::I32);
    let hist_ptr = param_ptr("hist_ptr", DType::I32);
    let n = param_scalar("n", DType::I32);
    let offs = program_id(0) * block as i32 + arange(0, block as i32);
    let mask = offs.lt(n);
    let bins = load(bins_ptr + offs, Some(mask), Some(0.into()));
    atomic_add(hist_ptr + bins, 1, Some(mask));
    (hist_ptr, bins, offs, mask)
}

/// Layer norm over rows of `n_cols`: `y = (x - mean) / sqrt(var + eps) * w + b`.
pub fn layer_norm(block: usize) -> Result<Function> {
    KernelBuilder::new("layer_norm").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let y_ptr = param_ptr("y_ptr", DType::F32);
        let w_ptr = param_ptr("w_ptr", DType::F32);
        let b_ptr = param_ptr("b_ptr", DType::F32);
        let n_cols = param_scalar("n_cols", DType::I32);
        let eps = param_scalar("eps", DType::F32);
        let (row, cols, mask) = row_tile(block, n_cols);
        let x = load(x_ptr + row * n_cols + cols, Some(mask), Some(0.0.into()));
        let mean = sum(x, 0) / n_cols;
        let xc = where_(mask, x - mean, 0.0);
        let var = sum(xc * xc, 0) / n_cols;
        let rstd = rsqrt(var + eps);
        let w = load(w_ptr + cols, Some(mask), None);
        let b = load(b_ptr + cols, Some(mask), None);
        store(y_ptr + row * n_cols + cols, xc * rstd * w + b, Some(mask));
    })
}

/// The 8-bit float conversions, `BLOCK` elements per program over `n`: `x`
/// (f32) rounded to `F8` and stored in `q`; the `F8` codes `c` read as f32
/// into `y` and converted to the other 8-bit format and then to bf16 into
/// `z`; and `w = where(x > 0, q, 2.0)` in `F8` (a constant in the format).
pub fn f8_casts(block: usize, f8: DType) -> Result<Function> {
    let other = if f8 == DType::F8E4M3 { DType::F8E5M2 } else { DType::F8E4M3 };
    KernelBuilder::new("f8_casts").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let c_ptr = param_ptr("c_ptr", f8);
        let q_ptr = param_ptr("q_ptr", f8);
        let y_ptr = param_ptr("y_ptr", DType::F32);
        let z_ptr = param_ptr("z_ptr", DType::BF16);
        let w_ptr = param_ptr("w_ptr", f8);
        let n = param_scalar("n", DType::I32);
        let offs = program_id(0) * block as i32 + arange(0, block as i32);
        let mask = offs.lt(n);
        let x = load(x_ptr + offs, Some(mask), None);
        let q = x.to(f8);
        store(q_ptr + offs, q, Some(mask));
        let c = load(c_ptr + offs, Some(mask), None);
        store(y_ptr + offs, c.to(DType::F32), Some(mask));
        store(z_ptr + offs, c.to(other).to(DType::BF16), Some(mask));
        store(w_ptr + offs, where_(x.gt(0.0), q, full(&[block], 2.0, f8)), Some(mask));
    })
}
