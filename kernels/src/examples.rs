//! Small example kernels written with `#[kernel]`: the tutorials' and tests'
//! reference programs (vector add, softmax, tiled matmul with a K loop, argmax,
//! cumsum, a while/if program, an atomic histogram, layer norm). The test suite
//! checks that each builds IR identical to a hand-built twin and matches a
//! reference on the interpreter; `tessera gpu-check` runs them on the GPU.

use crate::softmax::row_exp;
use dsl_macros::{kernel, kernel_fn};

/// `out[i] = x[i] + y[i]` for `i < n`, in `T`.
#[kernel]
pub fn vector_add<T: Float>(
    x_ptr: Ptr<T>,
    y_ptr: Ptr<T>,
    out_ptr: Ptr<T>,
    n: i32,
    #[constexpr] BLOCK: usize,
) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let x = load(x_ptr + offs, mask = mask);
    let y = load(y_ptr + offs, mask = mask);
    store(out_ptr + offs, x + y, mask = mask);
}

/// Row softmax, computed in f32 and stored in `T`; one program per row.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8)], key = [n_cols]))]
pub fn softmax<T: Float>(
    out_ptr: Ptr<T>,
    in_ptr: Ptr<T>,
    n_cols: i32,
    stride: i32,
    #[constexpr] BLOCK: usize,
) {
    let (row, cols, mask, e) = row_exp(in_ptr, n_cols, stride, BLOCK);
    let y = e / sum(e, 0);
    store(out_ptr + row * stride + cols, y, mask = mask);
}

/// `C = A @ B` with a K loop; `BM x BN` tiles over a 2-D grid.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn matmul<T: Float>(
    a_ptr: Ptr<T>,
    b_ptr: Ptr<T>,
    c_ptr: Ptr<f32>,
    m: i32,
    n: i32,
    k: i32,
    stride_am: i32,
    stride_bk: i32,
    stride_cm: i32,
    #[constexpr] BM: usize,
    #[constexpr] BN: usize,
    #[constexpr] BK: usize,
) {
    let rm = program_id(0) * BM + arange(0, BM);
    let rn = program_id(1) * BN + arange(0, BN);
    let rk = arange(0, BK);
    let rows = expand_dims(rm, 1);
    let cols = expand_dims(rn, 0);
    let mut acc = zeros([BM, BN], f32);
    for k0 in range(0, k, BK) {
        let ks = k0 + rk;
        let a_mask = rows < m && expand_dims(ks, 0) < k;
        let a = load(a_ptr + rows * stride_am + expand_dims(ks, 0), mask = a_mask, other = 0.0);
        let b_mask = expand_dims(ks, 1) < k && cols < n;
        let b = load(b_ptr + expand_dims(ks, 1) * stride_bk + cols, mask = b_mask, other = 0.0);
        acc = dot(a, b, acc);
    }
    store(c_ptr + rows * stride_cm + cols, acc, mask = rows < m && cols < n);
}

/// `out[row] = argmax(x[row, :n_cols])`.
#[kernel]
pub fn argmax_rows(x_ptr: Ptr<f32>, out_ptr: Ptr<i32>, n_cols: i32, #[constexpr] BLOCK: usize) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let x = load(x_ptr + row * n_cols + cols, mask = mask, other = f32::NEG_INFINITY);
    store(out_ptr + row, argmax(x, 0));
}

/// Row-wise inclusive prefix sums.
#[kernel]
pub fn cumsum_rows(x_ptr: Ptr<f32>, out_ptr: Ptr<f32>, n_cols: i32, #[constexpr] BLOCK: usize) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let x = load(x_ptr + row * n_cols + cols, mask = mask, other = 0.0);
    store(out_ptr + row * n_cols + cols, cumsum(x, 0), mask = mask);
}

/// One Collatz step: `x / 2` if even, else `3x + 1`.
#[kernel_fn]
pub fn collatz_step(x: Tensor) -> Tensor {
    if x % 2 == 0 { x / 2 } else { x * 3 + 1 }
}

/// Collatz step counts: a runtime `while` around a runtime `if` (in a helper).
#[kernel]
pub fn collatz(x_ptr: Ptr<i32>, out_ptr: Ptr<i32>) {
    let pid = program_id(0);
    let mut x = load(x_ptr + pid);
    let mut steps = 0;
    while x > 1 {
        x = collatz_step(x);
        steps += 1;
    }
    store(out_ptr + pid, steps);
}

/// `hist[bins[i]] += 1` with atomics.
#[kernel]
pub fn histogram(bins_ptr: Ptr<i32>, hist_ptr: Ptr<i32>, n: i32, #[constexpr] BLOCK: usize) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let bins = load(bins_ptr + offs, mask = mask, other = 0);
    atomic_add(hist_ptr + bins, 1, mask = mask);
}

/// Layer norm over rows: `(x - mean) / sqrt(var + eps) * w + b`.
#[kernel]
pub fn layer_norm(
    x_ptr: Ptr<f32>,
    y_ptr: Ptr<f32>,
    w_ptr: Ptr<f32>,
    b_ptr: Ptr<f32>,
    n_cols: i32,
    eps: f32,
    #[constexpr] BLOCK: usize,
) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let x = load(x_ptr + row * n_cols + cols, mask = mask, other = 0.0);
    let mean = sum(x, 0) / n_cols;
    let xc = where_(mask, x - mean, 0.0);
    let var = sum(xc * xc, 0) / n_cols;
    let rstd = rsqrt(var + eps);
    let w = load(w_ptr + cols, mask = mask);
    let b = load(b_ptr + cols, mask = mask);
    store(y_ptr + row * n_cols + cols, xc * rstd * w + b, mask = mask);
}

/// Row statistics of a `[BR, BC]` tile per program (rows `program_id * BR ..`):
/// `sums[r] = sum(x[r, :] + bias)`, `maxs[r]`, `args[r] = argmax` and
/// `y[r, c] = x[r, c] + bias[c] - maxs[r]`. It exercises the codegen paths of
/// row-wise reductions (rows shorter than a chunk, within a warp, across
/// warps, longer than one pass of all threads) and of leading (`bias`) and
/// trailing (`maxs`) broadcasts.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn row_stats(
    x_ptr: Ptr<f32>,
    bias_ptr: Ptr<f32>,
    sums_ptr: Ptr<f32>,
    maxs_ptr: Ptr<f32>,
    args_ptr: Ptr<i32>,
    y_ptr: Ptr<f32>,
    n_rows: i32,
    n_cols: i32,
    #[constexpr] BR: usize,
    #[constexpr] BC: usize,
) {
    let rows = program_id(0) * BR + arange(0, BR);
    let cols = arange(0, BC);
    let row_ok = rows < n_rows;
    let col_ok = cols < n_cols;
    let mask = expand_dims(row_ok, 1) && expand_dims(col_ok, 0);
    let offs = expand_dims(rows * n_cols, 1) + expand_dims(cols, 0);
    let bias = load(bias_ptr + cols, mask = col_ok, other = 0.0);
    let x = load(x_ptr + offs, mask = mask, other = 0.0) + expand_dims(bias, 0);
    let xm = where_(mask, x, f32::NEG_INFINITY);
    let mx = max(xm, 1);
    store(sums_ptr + rows, sum(x, 1), mask = row_ok);
    store(maxs_ptr + rows, mx, mask = row_ok);
    store(args_ptr + rows, argmax(xm, 1), mask = row_ok);
    store(y_ptr + offs, x - expand_dims(mx, 1), mask = mask);
}

/// A hand-over chain between programs: the program of rank `r` (ranks run
/// backwards over the grid with `rev != 0`, so most programs wait first)
/// waits until `flags[r] >= 1`, reads row `r` of `vals` (`BLOCK` wide),
/// writes row `r + 1` as `row r + r + 1` and release-stores `flags[r + 1]`.
/// `flags[0] = 1` and row 0 come from the host. Every program of the grid
/// must be resident at once on a GPU.
#[kernel]
pub fn handoff_chain(vals: Ptr<i32>, flags: Ptr<i32>, rev: i32, #[constexpr] BLOCK: usize) {
    let pid = program_id(0);
    let r = where_(rev != 0, num_programs(0) - 1 - pid, pid);
    let offs = arange(0, BLOCK);
    wait_until(flags + r, "ge", 1);
    let prev = load(vals + r * BLOCK + offs);
    store(vals + (r + 1) * BLOCK + offs, prev + r + 1);
    store(flags + r + 1, 1, sem = "release");
}

/// [`handoff_chain`] with flag-in-data hand-overs: each row is `BLOCK`
/// 64-bit lines, a value in the low half and the hand-over's `flag` in the
/// high half. The program of rank `r` reads row `r` with `wait_load` (which
/// waits until every line of the row carries `flag`), and writes row
/// `r + 1` as `row r + r + 1` with relaxed stores of whole lines: no
/// counter, fence or barrier. Row 0 comes from the host with `flag`; the
/// other rows may hold older lines of any other flag.
#[kernel]
pub fn line_chain(lines: Ptr<i64>, flag: i32, rev: i32, #[constexpr] BLOCK: usize) {
    let pid = program_id(0);
    let r = where_(rev != 0, num_programs(0) - 1 - pid, pid);
    let offs = arange(0, BLOCK);
    let prev = wait_load(lines + r * BLOCK + offs, flag).to(i32);
    let next = bitcast(prev + r + 1, u32).to(i64) | flag.to(i64) << 32;
    store(lines + (r + 1) * BLOCK + offs, next, sem = "relaxed");
}

/// A task list run by a persistent grid, the pattern of a persistent decode
/// step: program `p` runs tasks `p, p + G, ...`; task `t` waits until
/// `done[t]` counts its finished dependencies (tasks `t - 1` and `t - 2`),
/// writes row `t + 2` of `vals` as `(row t + 1 + row t) % 65521 + t`,
/// prefetches the row it will need after the next into L2, and releases
/// its dependents with `atomic_add`. Rows 0 and 1 come from the host;
/// `done` has `n + 2` zeroed counters.
#[kernel]
pub fn task_chain(vals: Ptr<i32>, done: Ptr<i32>, n: i32, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK);
    for t in range(program_id(0), n, num_programs(0)) {
        prefetch_l2(vals + (t + 2) * BLOCK + offs, mask = offs < BLOCK);
        wait_until(done + t, "ge", minimum(t, 2));
        let a = load(vals + (t + 1) * BLOCK + offs);
        let b = load(vals + t * BLOCK + offs);
        store(vals + (t + 2) * BLOCK + offs, (a + b) % 65521 + t);
        atomic_add(done + t + 1, 1, sem = "release");
        atomic_add(done + t + 2, 1, sem = "release");
    }
}
