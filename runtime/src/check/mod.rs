//! `tessera gpu-check` and `tessera host-check`: every registered kernel runs
//! on a device (the GPU, or the native CPU backend) and on the CPU
//! interpreter (the semantic oracle) with the same fresh random inputs at
//! ragged shapes, and the outputs are compared element by element. Each
//! check is one function generic over the [`Device`]; `gpu-check`
//! instantiates it for [`crate::cuda::Cuda`], `host-check`
//! ([`crate::check::host`]) for [`codegen::host::Host`].
//!
//! Invariants: inputs are random and non-zero (|x| >= 1/64), so a kernel that
//! writes nothing or zeros fails; every shape is checked in each storage dtype
//! the kernel supports (f32 and bf16 here); an element passes when
//! `|gpu - cpu| <= atol + rtol * |cpu|` with the dtype's tolerance ([`Tol`]).

use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::{Cpu, CpuPtr};
use dsl_core::launch::PtrElem;
use kernels::copy::copy;
use kernels::embedding::embedding_q8_0;
use kernels::examples::vector_add;
use kernels::examples::{argmax_rows, collatz, cumsum_rows, histogram, layer_norm, matmul as example_matmul};
use kernels::rmsnorm::{add_rmsnorm, rmsnorm};
use kernels::softmax::{softmax, softmax_warps};
use std::marker::PhantomData;

pub mod attention;
pub mod cpu_gemv;
pub mod decode;
pub mod dequant;
pub mod host;
pub mod invariance;
pub mod matmul;
pub mod mega;
pub mod model;
pub mod pdl;
pub mod q8;
pub mod rope;
pub mod sampling;
pub mod sync;

/// A pointer to the start of a device buffer, for the kernel arguments of
/// the checks (any device: the GPU for `gpu-check`, the native CPU backend
/// for `host-check`).
pub(crate) trait DevicePtr: Device {
    /// `buf` as a kernel pointer argument of pointee `U`.
    fn ptr<'a, T: DeviceElem, U: PtrElem>(&self, buf: &'a Self::Buf<T>) -> Result<Self::Ptr<'a, U>>
    where
        Self: 'a,
    {
        Self::ptr_at(buf, 0)
    }
}

impl<D: Device> DevicePtr for D {}

/// A seeded random number generator (SplitMix64): reproducible inputs without
/// a dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A value in `[-hi, -1/64] ∪ [1/64, hi]`: random and never (close to) zero.
    pub fn nonzero(&mut self, hi: f64) -> f64 {
        let m = 1.0 / 64.0 + self.unit() * (hi - 1.0 / 64.0);
        if self.next_u64() & 1 == 0 { m } else { -m }
    }

    /// `n` non-zero values in `T`, magnitudes up to `hi`.
    pub fn values<T: ActElem>(&mut self, n: usize, hi: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.nonzero(hi))).collect()
    }
}

/// Comparison tolerance: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

impl Tol {
    /// The tolerance of results stored in `dtype` after a few f32 operations
    /// (GPU math uses approximate `ex2`/`rcp`; bf16/f16 outputs may round to
    /// the neighbouring value).
    pub fn for_dtype(dtype: DType) -> Tol {
        match dtype {
            DType::BF16 => Tol { atol: 1e-6, rtol: 1.0 / 128.0 },
            DType::F16 => Tol { atol: 1e-6, rtol: 1.0 / 1024.0 },
            _ => Tol { atol: 1e-6, rtol: 1e-5 },
        }
    }
}

/// One line of the check table.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckRow {
    /// The kernel.
    pub kernel: String,
    /// The problem shape, e.g. `37x1000`.
    pub shape: String,
    /// The storage dtype.
    pub dtype: DType,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// Largest relative difference (over elements whose reference is non-zero).
    pub max_rel: f64,
    /// Whether every element is within tolerance.
    pub pass: bool,
}

/// Compares `got` (GPU) with `want` (interpreter).
pub fn compare(kernel: &str, shape: String, dtype: DType, got: &[f64], want: &[f64], tol: Tol) -> CheckRow {
    let mut row = CheckRow { kernel: kernel.into(), shape, dtype, max_abs: 0.0, max_rel: 0.0, pass: true };
    if got.len() != want.len() {
        row.pass = false;
        row.max_abs = f64::INFINITY;
        return row;
    }
    for (&g, &w) in got.iter().zip(want) {
        let d = (g - w).abs();
        // NaN differences fail (`d <= ..` is false for NaN).
        let d = if d.is_nan() && !(g.is_nan() && w.is_nan()) {
            f64::INFINITY
        } else if d.is_nan() {
            0.0
        } else {
            d
        };
        row.max_abs = row.max_abs.max(d);
        if w != 0.0 {
            row.max_rel = row.max_rel.max(d / w.abs());
        }
        if d > tol.atol + tol.rtol * w.abs() {
            row.pass = false;
        }
    }
    row
}

/// Widens device elements to f64.
pub fn to_f64<T: DeviceElem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// The unit roundoff of a storage dtype (0 for f32, for the roundings the
/// attention error model charges to the storage type: exact in f32).
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => f64::powi(2.0, -8),
        DType::F16 => f64::powi(2.0, -11),
        _ => 0.0,
    }
}

fn vector_add_case<T: ActElem, D: Device>(dev: &mut D, rng: &mut Rng, n: usize) -> Result<CheckRow> {
    let (x, y) = (rng.values::<T>(n, 8.0), rng.values::<T>(n, 8.0));
    let config = vector_add::Config::new(T::DEVICE_DTYPE, 1024);
    let grid = [n.div_ceil(1024) as u32, 1, 1];
    let (xd, yd, od) = (dev.upload(&x)?, dev.upload(&y)?, dev.zeros::<T>(n)?);
    let args = vector_add::Args {
        x_ptr: dev.ptr(&xd)?,
        y_ptr: dev.ptr(&yd)?,
        out_ptr: dev.ptr(&od)?,
        n: n as i32,
        _marker: PhantomData,
    };
    dev.run::<vector_add::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let mut cpu = Cpu::new();
    let (xc, yc, oc) = (cpu.upload(&x), cpu.upload(&y), cpu.zeros::<T>(n));
    let args = vector_add::Args {
        x_ptr: xc.cast(),
        y_ptr: yc.cast(),
        out_ptr: oc.cast(),
        n: n as i32,
        _marker: PhantomData,
    };
    vector_add::interpret(&mut cpu, grid, &config, &args)?;
    let want = cpu.read(oc);
    Ok(compare(
        "vector_add",
        n.to_string(),
        T::DEVICE_DTYPE,
        &to_f64(&got),
        &to_f64(&want),
        Tol::for_dtype(T::DEVICE_DTYPE),
    ))
}

/// The `vector_add` check: ragged lengths, f32 and bf16.
pub fn vector_add<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for n in [1, 1000, 4097, 100_003] {
        rows.push(vector_add_case::<f32, _>(dev, &mut rng, n)?);
        rows.push(vector_add_case::<bf16, _>(dev, &mut rng, n)?);
    }
    Ok(rows)
}

fn copy_case<T: ActElem, D: Device>(dev: &mut D, rng: &mut Rng, n: usize) -> Result<CheckRow> {
    let x = rng.values::<T>(n, 8.0);
    let config = copy::Config::new(T::DEVICE_DTYPE, 1024);
    let grid = [n.div_ceil(1024) as u32, 1, 1];
    let (xd, od) = (dev.upload(&x)?, dev.zeros::<T>(n)?);
    let args = copy::Args { x_ptr: dev.ptr(&xd)?, out_ptr: dev.ptr(&od)?, n: n as i32, _marker: PhantomData };
    dev.run::<copy::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let mut cpu = Cpu::new();
    let (xc, oc) = (cpu.upload(&x), cpu.zeros::<T>(n));
    let args = copy::Args { x_ptr: xc.cast(), out_ptr: oc.cast(), n: n as i32, _marker: PhantomData };
    copy::interpret(&mut cpu, grid, &config, &args)?;
    let want = cpu.read(oc);
    Ok(compare("copy", n.to_string(), T::DEVICE_DTYPE, &to_f64(&got), &to_f64(&want), EXACT))
}

/// The `copy` check: ragged lengths, f32 and bf16, bit-exact.
pub fn copy<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for n in [1, 1000, (1 << 18) + 3] {
        rows.push(copy_case::<f32, _>(dev, &mut rng, n)?);
        rows.push(copy_case::<bf16, _>(dev, &mut rng, n)?);
    }
    Ok(rows)
}

fn softmax_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    exact: bool,
) -> Result<CheckRow> {
    let x = rng.values::<T>(rows * cols, 4.0);
    let block = if exact { cols } else { cols.next_power_of_two() };
    let config =
        softmax::Config::new(T::DEVICE_DTYPE, block).with_warps(softmax_warps(block.next_power_of_two()));
    let grid = [rows as u32, 1, 1];
    let (xd, od) = (dev.upload(&x)?, dev.zeros::<T>(rows * cols)?);
    let (nc, st) = (cols as i32, cols as i32);
    let args = softmax::Args {
        out_ptr: dev.ptr(&od)?,
        in_ptr: dev.ptr(&xd)?,
        n_cols: nc,
        stride: st,
        _marker: PhantomData,
    };
    dev.run::<softmax::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let mut cpu = Cpu::new();
    let (xc, oc) = (cpu.upload(&x), cpu.zeros::<T>(rows * cols));
    let args =
        softmax::Args { out_ptr: oc.cast(), in_ptr: xc.cast(), n_cols: nc, stride: st, _marker: PhantomData };
    softmax::interpret(&mut cpu, grid, &config, &args)?;
    let want = cpu.read(oc);
    let shape = format!("{rows}x{cols}{}", if exact { "" } else { " (padded BLOCK)" });
    Ok(compare(
        "softmax",
        shape,
        T::DEVICE_DTYPE,
        &to_f64(&got),
        &to_f64(&want),
        Tol::for_dtype(T::DEVICE_DTYPE),
    ))
}

/// The `softmax` check: ragged shapes (exact non-power-of-two `BLOCK`s and
/// padded ones), f32 and bf16.
pub fn softmax<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (i, (rows, cols)) in [(1, 1), (5, 17), (37, 1000), (64, 1024), (7, 4097)].into_iter().enumerate() {
        let exact = i % 2 == 0;
        out.push(softmax_case::<f32, _>(dev, &mut rng, rows, cols, exact)?);
        out.push(softmax_case::<bf16, _>(dev, &mut rng, rows, cols, !exact)?);
    }
    Ok(out)
}

/// Exact equality (integer outputs, copies).
pub(crate) const EXACT: Tol = Tol { atol: 0.0, rtol: 0.0 };

/// f32 results of long sums (dot products, scans, row statistics): the GPU
/// adds in a different order than the interpreter.
pub(crate) const F32_SUM: Tol = Tol { atol: 1e-4, rtol: 1e-4 };

/// The same host data on both sides: a GPU buffer and an interpreter buffer.
pub(crate) fn upload_both<T: DeviceElem, D: Device>(
    dev: &mut D,
    cpu: &mut Cpu,
    x: &[T],
) -> Result<(D::Buf<T>, CpuPtr<T>)> {
    Ok((dev.upload(x)?, cpu.upload(x)))
}

/// `n` zeros on both sides (output buffers).
pub(crate) fn zeros_both<T: DeviceElem, D: Device>(
    dev: &mut D,
    cpu: &mut Cpu,
    n: usize,
) -> Result<(D::Buf<T>, CpuPtr<T>)> {
    Ok((dev.zeros::<T>(n)?, cpu.zeros::<T>(n)))
}

/// Compares GPU output `got` with interpreter output `want`, element by element.
pub(crate) fn outcome<T: DeviceElem>(
    kernel: &str,
    shape: String,
    dtype: DType,
    got: &[T],
    want: &[T],
    tol: Tol,
) -> CheckRow {
    compare(kernel, shape, dtype, &to_f64(got), &to_f64(want), tol)
}

fn matmul_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (m, n, k): (usize, usize, usize),
    (bm, bn, bk, warps): (usize, usize, usize, u32),
) -> Result<CheckRow> {
    let (a, b) = (rng.values::<T>(m * k, 1.0), rng.values::<T>(k * n, 1.0));
    let config = example_matmul::Config::new(T::DEVICE_DTYPE, bm, bn, bk).with_warps(warps);
    let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
    let mut cpu = Cpu::new();
    let ((ad, ac), (bd, bc)) = (upload_both(dev, &mut cpu, &a)?, upload_both(dev, &mut cpu, &b)?);
    let (cd, cc) = zeros_both::<f32, _>(dev, &mut cpu, m * n)?;
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let args = example_matmul::Args {
        a_ptr: dev.ptr(&ad)?,
        b_ptr: dev.ptr(&bd)?,
        c_ptr: dev.ptr(&cd)?,
        m: mi,
        n: ni,
        k: ki,
        stride_am: ki,
        stride_bk: ni,
        stride_cm: ni,
        _marker: PhantomData,
    };
    dev.run::<example_matmul::Kernel>(grid, &config, &args)?;
    let got = dev.download(&cd)?;
    let args = example_matmul::Args {
        a_ptr: ac.cast(),
        b_ptr: bc.cast(),
        c_ptr: cc,
        m: mi,
        n: ni,
        k: ki,
        stride_am: ki,
        stride_bk: ni,
        stride_cm: ni,
        _marker: PhantomData,
    };
    example_matmul::interpret(&mut cpu, grid, &config, &args)?;
    let shape = format!("{m}x{n}x{k} ({bm}x{bn}x{bk}, {warps}w)");
    Ok(outcome("matmul", shape, T::DEVICE_DTYPE, &got, &cpu.read(cc), F32_SUM))
}

/// The `matmul` check: ragged `m x n x k`, two tile configs, f32 and bf16
/// inputs (f32 accumulate and output).
pub fn matmul<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for shape in [(1, 1, 1), (37, 45, 70), (130, 66, 33), (64, 64, 64)] {
        for tiles in [(32, 32, 16, 4), (64, 64, 32, 8)] {
            rows.push(matmul_case::<f32, _>(dev, &mut rng, shape, tiles)?);
            rows.push(matmul_case::<bf16, _>(dev, &mut rng, shape, tiles)?);
        }
    }
    Ok(rows)
}

/// `BLOCK` for a row of `cols`: exactly `cols`, or padded to a power of two.
fn row_block(cols: usize, exact: bool) -> usize {
    if exact { cols } else { cols.next_power_of_two() }
}

/// The shape column of a row kernel's check.
fn row_shape(rows: usize, cols: usize, exact: bool) -> String {
    format!("{rows}x{cols}{}", if exact { "" } else { " (padded BLOCK)" })
}

/// Ragged `(rows, cols)` of the row-kernel checks, each with an exact and a
/// padded `BLOCK`.
const ROW_SHAPES: [(usize, usize); 5] = [(1, 1), (5, 17), (37, 1000), (64, 1024), (7, 4097)];

/// The rows of a row-kernel check: `case` on every shape of [`ROW_SHAPES`],
/// each with an exact and a padded `BLOCK`, from one random stream.
fn over_row_shapes<D: Device>(
    dev: &mut D,
    seed: u64,
    case: fn(&mut D, &mut Rng, usize, usize, bool) -> Result<CheckRow>,
) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (rows, cols) in ROW_SHAPES {
        for exact in [true, false] {
            out.push(case(dev, &mut rng, rows, cols, exact)?);
        }
    }
    Ok(out)
}

fn argmax_rows_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    exact: bool,
) -> Result<CheckRow> {
    let x = rng.values::<f32>(rows * cols, 8.0);
    let config = argmax_rows::Config::new(row_block(cols, exact));
    let grid = [rows as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((xd, xc), (od, oc)) = (upload_both(dev, &mut cpu, &x)?, zeros_both::<i32, _>(dev, &mut cpu, rows)?);
    let nc = cols as i32;
    let args =
        argmax_rows::Args { x_ptr: dev.ptr(&xd)?, out_ptr: dev.ptr(&od)?, n_cols: nc, _marker: PhantomData };
    dev.run::<argmax_rows::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let args = argmax_rows::Args { x_ptr: xc, out_ptr: oc, n_cols: nc, _marker: PhantomData };
    argmax_rows::interpret(&mut cpu, grid, &config, &args)?;
    let shape = row_shape(rows, cols, exact);
    Ok(outcome("argmax_rows", shape, DType::F32, &got, &cpu.read(oc), EXACT))
}

/// The `argmax_rows` check: ragged shapes, exact and padded `BLOCK`s, exact
/// indices (random inputs make ties improbable).
pub fn argmax_rows<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_row_shapes(dev, seed, argmax_rows_case)
}

fn cumsum_rows_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    exact: bool,
) -> Result<CheckRow> {
    let x = rng.values::<f32>(rows * cols, 1.0);
    let config = cumsum_rows::Config::new(row_block(cols, exact));
    let grid = [rows as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((xd, xc), (od, oc)) =
        (upload_both(dev, &mut cpu, &x)?, zeros_both::<f32, _>(dev, &mut cpu, rows * cols)?);
    let nc = cols as i32;
    let args =
        cumsum_rows::Args { x_ptr: dev.ptr(&xd)?, out_ptr: dev.ptr(&od)?, n_cols: nc, _marker: PhantomData };
    dev.run::<cumsum_rows::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let args = cumsum_rows::Args { x_ptr: xc, out_ptr: oc, n_cols: nc, _marker: PhantomData };
    cumsum_rows::interpret(&mut cpu, grid, &config, &args)?;
    let shape = row_shape(rows, cols, exact);
    Ok(outcome("cumsum_rows", shape, DType::F32, &got, &cpu.read(oc), F32_SUM))
}

/// The `cumsum_rows` check: ragged shapes, exact and padded `BLOCK`s, f32.
pub fn cumsum_rows<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_row_shapes(dev, seed, cumsum_rows_case)
}

fn layer_norm_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    exact: bool,
) -> Result<CheckRow> {
    let (x, w, b) =
        (rng.values::<f32>(rows * cols, 4.0), rng.values::<f32>(cols, 2.0), rng.values::<f32>(cols, 2.0));
    let config = layer_norm::Config::new(row_block(cols, exact));
    let grid = [rows as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((xd, xc), (wd, wc)) = (upload_both(dev, &mut cpu, &x)?, upload_both(dev, &mut cpu, &w)?);
    let ((bd, bc), (yd, yc)) =
        (upload_both(dev, &mut cpu, &b)?, zeros_both::<f32, _>(dev, &mut cpu, rows * cols)?);
    let (nc, eps) = (cols as i32, 1e-5);
    let args = layer_norm::Args {
        x_ptr: dev.ptr(&xd)?,
        y_ptr: dev.ptr(&yd)?,
        w_ptr: dev.ptr(&wd)?,
        b_ptr: dev.ptr(&bd)?,
        n_cols: nc,
        eps,
        _marker: PhantomData,
    };
    dev.run::<layer_norm::Kernel>(grid, &config, &args)?;
    let got = dev.download(&yd)?;
    let args = layer_norm::Args {
        x_ptr: xc,
        y_ptr: yc,
        w_ptr: wc,
        b_ptr: bc,
        n_cols: nc,
        eps,
        _marker: PhantomData,
    };
    layer_norm::interpret(&mut cpu, grid, &config, &args)?;
    let shape = row_shape(rows, cols, exact);
    Ok(outcome("layer_norm", shape, DType::F32, &got, &cpu.read(yc), F32_SUM))
}

/// The `layer_norm` check: ragged shapes, exact (non-power-of-two) and padded
/// `BLOCK`s, f32.
pub fn layer_norm<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_row_shapes(dev, seed, layer_norm_case)
}

/// Ragged `(rows, cols, num_warps)` of the RMSNorm checks: SmolLM2's hidden
/// size (one decode row and a batch), tiny and odd rows, and 4097 columns at 8
/// and 16 warps (the autotune candidates).
const NORM_SHAPES: [(usize, usize, u32); 6] =
    [(1, 576, 4), (33, 576, 4), (5, 17, 4), (64, 1024, 8), (7, 4097, 8), (7, 4097, 16)];

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

fn add_rmsnorm_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols, warps): (usize, usize, u32),
    exact: bool,
) -> Result<[CheckRow; 2]> {
    let n = rows * cols;
    let (x, r, w) = (rng.values::<T>(n, 4.0), rng.values::<T>(n, 4.0), rng.values::<T>(cols, 2.0));
    let config = add_rmsnorm::Config::new(T::DEVICE_DTYPE, row_block(cols, exact)).with_warps(warps);
    let grid = [rows as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((xd, xc), (rd, rc)) = (upload_both(dev, &mut cpu, &x)?, upload_both(dev, &mut cpu, &r)?);
    let (wd, wc) = upload_both(dev, &mut cpu, &w)?;
    let ((od, oc), (hd, hc)) = (zeros_both::<T, _>(dev, &mut cpu, n)?, zeros_both::<T, _>(dev, &mut cpu, n)?);
    let (nc, eps) = (cols as i32, 1e-5);
    let args = add_rmsnorm::Args {
        x_ptr: dev.ptr(&xd)?,
        r_ptr: dev.ptr(&rd)?,
        w_ptr: dev.ptr(&wd)?,
        out_ptr: dev.ptr(&od)?,
        h_ptr: dev.ptr(&hd)?,
        n_cols: nc,
        stride: nc,
        eps,
        _marker: PhantomData,
    };
    dev.run::<add_rmsnorm::Kernel>(grid, &config, &args)?;
    let (got_out, got_h) = (dev.download(&od)?, dev.download(&hd)?);
    let args = add_rmsnorm::Args {
        x_ptr: xc.cast(),
        r_ptr: rc.cast(),
        w_ptr: wc.cast(),
        out_ptr: oc.cast(),
        h_ptr: hc.cast(),
        n_cols: nc,
        stride: nc,
        eps,
        _marker: PhantomData,
    };
    add_rmsnorm::interpret(&mut cpu, grid, &config, &args)?;
    let shape = format!("{}, {warps}w", row_shape(rows, cols, exact));
    let d = T::DEVICE_DTYPE;
    Ok([
        // The residual is one rounding of an f32 sum on both sides: bit-exact.
        outcome("add_rmsnorm", format!("{shape}: h"), d, &got_h, &cpu.read(hc), EXACT),
        outcome("add_rmsnorm", format!("{shape}: out"), d, &got_out, &cpu.read(oc), add_rmsnorm_out_tol(d)),
    ])
}

/// The `add_rmsnorm` check: ragged shapes (exact non-power-of-two and padded
/// `BLOCK`s), f32 and bf16; `h` bit-exact, `out` within its tolerance.
pub fn add_rmsnorm<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (i, shape) in NORM_SHAPES.into_iter().enumerate() {
        let exact = i % 2 == 0;
        out.extend(add_rmsnorm_case::<f32, _>(dev, &mut rng, shape, exact)?);
        out.extend(add_rmsnorm_case::<bf16, _>(dev, &mut rng, shape, !exact)?);
    }
    Ok(out)
}

fn rmsnorm_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols, warps): (usize, usize, u32),
    exact: bool,
) -> Result<CheckRow> {
    let n = rows * cols;
    let (x, w) = (rng.values::<T>(n, 4.0), rng.values::<T>(cols, 2.0));
    let config = rmsnorm::Config::new(T::DEVICE_DTYPE, row_block(cols, exact), false).with_warps(warps);
    let grid = [rows as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((xd, xc), (wd, wc)) = (upload_both(dev, &mut cpu, &x)?, upload_both(dev, &mut cpu, &w)?);
    let (od, oc) = zeros_both::<T, _>(dev, &mut cpu, n)?;
    let (nc, eps) = (cols as i32, 1e-5);
    let args = rmsnorm::Args {
        x_ptr: dev.ptr(&xd)?,
        w_ptr: dev.ptr(&wd)?,
        out_ptr: dev.ptr(&od)?,
        n_cols: nc,
        stride: nc,
        eps,
        _marker: PhantomData,
    };
    dev.run::<rmsnorm::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let args = rmsnorm::Args {
        x_ptr: xc.cast(),
        w_ptr: wc.cast(),
        out_ptr: oc.cast(),
        n_cols: nc,
        stride: nc,
        eps,
        _marker: PhantomData,
    };
    rmsnorm::interpret(&mut cpu, grid, &config, &args)?;
    let shape = format!("{}, {warps}w", row_shape(rows, cols, exact));
    let d = T::DEVICE_DTYPE;
    Ok(outcome("rmsnorm", shape, d, &got, &cpu.read(oc), Tol::for_dtype(d)))
}

/// The `rmsnorm` check: ragged shapes (exact non-power-of-two and padded
/// `BLOCK`s), f32 and bf16 (one rounding at the end: one unit of it).
pub fn rmsnorm<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (i, shape) in NORM_SHAPES.into_iter().enumerate() {
        let exact = i % 2 == 0;
        out.push(rmsnorm_case::<f32, _>(dev, &mut rng, shape, exact)?);
        out.push(rmsnorm_case::<bf16, _>(dev, &mut rng, shape, !exact)?);
    }
    Ok(out)
}

/// A random Q8_0 table of `vocab` rows of `hidden` values (raw bytes): non-zero
/// f16 scales up to 0.1 in magnitude (the range of real embeddings), random i8 quants.
fn q8_0_table(rng: &mut Rng, vocab: usize, hidden: usize) -> Vec<u8> {
    let blocks = vocab * hidden / 32;
    let mut t = Vec::with_capacity(blocks * 34);
    for _ in 0..blocks {
        t.extend_from_slice(&f16::from_f64(rng.nonzero(0.1)).to_le_bytes());
        t.extend((0..32).map(|_| rng.next_u64() as u8));
    }
    t
}

fn embedding_q8_0_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (tokens, hidden, vocab): (usize, usize, usize),
    invalid: bool,
) -> Result<CheckRow> {
    let w = q8_0_table(rng, vocab, hidden);
    let mut ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
    if invalid {
        // Out-of-range ids give zero rows on both sides (the kernel's contract).
        ids[tokens / 2] = vocab as i32;
        ids[0] = -1;
    }
    let block = kernels::embedding::block_for(hidden);
    let warps = kernels::embedding::warps_for(block);
    let config = embedding_q8_0::Config::new(T::DEVICE_DTYPE, block).with_warps(warps);
    let grid = [tokens as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((wd, wc), (id, ic)) = (upload_both(dev, &mut cpu, &w)?, upload_both(dev, &mut cpu, &ids)?);
    let (od, oc) = zeros_both::<T, _>(dev, &mut cpu, tokens * hidden)?;
    let (h, v) = (hidden as i32, vocab as i32);
    let args = embedding_q8_0::Args {
        w_ptr: dev.ptr(&wd)?,
        ids_ptr: dev.ptr(&id)?,
        out_ptr: dev.ptr(&od)?,
        hidden: h,
        vocab: v,
        _marker: PhantomData,
    };
    dev.run::<embedding_q8_0::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let args = embedding_q8_0::Args {
        w_ptr: wc.cast(),
        ids_ptr: ic,
        out_ptr: oc.cast(),
        hidden: h,
        vocab: v,
        _marker: PhantomData,
    };
    embedding_q8_0::interpret(&mut cpu, grid, &config, &args)?;
    let shape = format!("{tokens}x{hidden} of {vocab}{}", if invalid { " (2 invalid ids)" } else { "" });
    Ok(outcome("embedding_q8_0", shape, T::DEVICE_DTYPE, &got, &cpu.read(oc), EXACT))
}

/// The `embedding_q8_0` check: ragged token counts, hidden 576 (SmolLM2, its
/// full 49152-row vocab once) and 4096 (a looped row), f32 and bf16 outputs,
/// exact (`d * q` is exact in f32; bf16 is one rounding of it on both sides).
pub fn embedding_q8_0<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let shapes = [(1, 576, 1000), (37, 576, 49152), (5, 4096, 300), (130, 4096, 64)];
    for (i, shape) in shapes.into_iter().enumerate() {
        out.push(embedding_q8_0_case::<f32, _>(dev, &mut rng, shape, i == 2)?);
        out.push(embedding_q8_0_case::<bf16, _>(dev, &mut rng, shape, i == 3)?);
    }
    Ok(out)
}

/// Online-softmax check shapes: `(rows, cols, BLOCK, warps, scale, causal
/// offset)`. Rows shorter than, exactly, and raggedly longer than `BLOCK`
/// (one to four chunks), causal offsets that mask whole rows (-3) and that
/// align the last query with the last key.
const SOFTMAX_ONLINE_SHAPES: [(usize, usize, usize, u32, f32, Option<i32>); 7] = [
    (1, 1, 256, 4, 1.0, None),
    (5, 17, 256, 4, 0.125, Some(0)),
    (37, 1000, 256, 4, 1.0, None),
    (64, 1024, 1024, 4, 0.125, Some(0)),
    (7, 4097, 1024, 8, 1.0, Some(4090)),
    (6, 3000, 1024, 8, 2.0, Some(-3)),
    (16, 8192, 4096, 16, 0.088, Some(8176)),
];

fn softmax_online_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, cols, block, warps, scale, causal): (usize, usize, usize, u32, f32, Option<i32>),
) -> Result<CheckRow> {
    use kernels::softmax::softmax_online as k;
    let n = rows * cols;
    let x = rng.values::<T>(n, 4.0);
    let config = k::Config::new(T::DEVICE_DTYPE, causal.is_some(), block).with_warps(warps);
    let grid = [rows as u32, 1, 1];
    let mut cpu = Cpu::new();
    let (xd, xc) = upload_both(dev, &mut cpu, &x)?;
    let (od, oc) = zeros_both::<T, _>(dev, &mut cpu, n)?;
    let (nc, off) = (cols as i32, causal.unwrap_or(0));
    let args = k::Args {
        out_ptr: dev.ptr(&od)?,
        in_ptr: dev.ptr(&xd)?,
        n_cols: nc,
        stride: nc,
        scale,
        causal_offset: off,
        _marker: PhantomData,
    };
    dev.run::<k::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let args = k::Args {
        out_ptr: oc.cast(),
        in_ptr: xc.cast(),
        n_cols: nc,
        stride: nc,
        scale,
        causal_offset: off,
        _marker: PhantomData,
    };
    k::interpret(&mut cpu, grid, &config, &args)?;
    let mask = causal.map_or("no mask".to_string(), |o| format!("causal {o}"));
    let shape = format!("{rows}x{cols}, BLOCK {block}, {warps}w, scale {scale}, {mask}");
    let d = T::DEVICE_DTYPE;
    Ok(outcome("softmax_online", shape, d, &got, &cpu.read(oc), Tol::for_dtype(d)))
}

/// The `softmax_online` check: rows up to 8192 in 256..4096 chunks (ragged
/// and exact multiples), scales, causal on and off (incl. fully masked rows),
/// f32 and bf16.
pub fn softmax_online<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for shape in SOFTMAX_ONLINE_SHAPES {
        out.push(softmax_online_case::<f32, _>(dev, &mut rng, shape)?);
        out.push(softmax_online_case::<bf16, _>(dev, &mut rng, shape)?);
    }
    Ok(out)
}

fn histogram_case<D: Device>(dev: &mut D, rng: &mut Rng, n: usize, bins: usize) -> Result<CheckRow> {
    let data: Vec<i32> = (0..n).map(|_| (rng.next_u64() % bins as u64) as i32).collect();
    let config = histogram::Config::new(1024);
    let grid = [n.div_ceil(1024) as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((dd, dc), (hd, hc)) =
        (upload_both(dev, &mut cpu, &data)?, zeros_both::<i32, _>(dev, &mut cpu, bins)?);
    let args = histogram::Args {
        bins_ptr: dev.ptr(&dd)?,
        hist_ptr: dev.ptr(&hd)?,
        n: n as i32,
        _marker: PhantomData,
    };
    dev.run::<histogram::Kernel>(grid, &config, &args)?;
    let got = dev.download(&hd)?;
    let args = histogram::Args { bins_ptr: dc, hist_ptr: hc, n: n as i32, _marker: PhantomData };
    histogram::interpret(&mut cpu, grid, &config, &args)?;
    let shape = format!("{n} into {bins} bins");
    Ok(outcome("histogram", shape, DType::I32, &got, &cpu.read(hc), EXACT))
}

/// The `histogram` check: ragged lengths, exact counts (atomics).
pub fn histogram<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for (n, bins) in [(1, 1), (1000, 37), (4097, 256), (100_003, 37)] {
        rows.push(histogram_case(dev, &mut rng, n, bins)?);
    }
    Ok(rows)
}

fn collatz_case<D: Device>(dev: &mut D, xs: &[i32]) -> Result<CheckRow> {
    let n = xs.len();
    let config = collatz::Config::new();
    let grid = [n as u32, 1, 1];
    let mut cpu = Cpu::new();
    let ((xd, xc), (od, oc)) = (upload_both(dev, &mut cpu, xs)?, zeros_both::<i32, _>(dev, &mut cpu, n)?);
    let args = collatz::Args { x_ptr: dev.ptr(&xd)?, out_ptr: dev.ptr(&od)?, _marker: PhantomData };
    dev.run::<collatz::Kernel>(grid, &config, &args)?;
    let got = dev.download(&od)?;
    let args = collatz::Args { x_ptr: xc, out_ptr: oc, _marker: PhantomData };
    collatz::interpret(&mut cpu, grid, &config, &args)?;
    Ok(outcome("collatz", n.to_string(), DType::I32, &got, &cpu.read(oc), EXACT))
}

/// The `collatz` check: step counts of inputs in `1..=1000` (one random, all
/// of them, and a random ragged batch), exact.
pub fn collatz<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut draw = |n: usize| -> Vec<i32> { (0..n).map(|_| 1 + (rng.next_u64() % 1000) as i32).collect() };
    let (one, ragged) = (draw(1), draw(4097));
    let all: Vec<i32> = (1..=1000).collect();
    [one, all, ragged].iter().map(|xs| collatz_case(dev, xs)).collect()
}

/// The failing row of a check that could not run (a compile or launch
/// error, reported separately).
pub fn error_row(kernel: &str) -> CheckRow {
    CheckRow {
        kernel: kernel.into(),
        shape: "(error)".into(),
        dtype: DType::F32,
        max_abs: f64::INFINITY,
        max_rel: f64::INFINITY,
        pass: false,
    }
}

/// Formats the check table; the second value is true when every row passed.
pub fn table(rows: &[CheckRow]) -> (String, bool) {
    let mut s = format!(
        "{:<12} | {:<24} | {:<5} | {:>12} | {:>12} | result\n",
        "kernel", "shape", "dtype", "max abs err", "max rel err"
    );
    s.push_str(&format!("{}\n", "-".repeat(86)));
    for r in rows {
        s.push_str(&format!(
            "{:<12} | {:<24} | {:<5} | {:>12.3e} | {:>12.3e} | {}\n",
            r.kernel,
            r.shape,
            r.dtype.name(),
            r.max_abs,
            r.max_rel,
            if r.pass { "PASS" } else { "FAIL" }
        ));
    }
    let ok = rows.iter().all(|r| r.pass);
    let failed = rows.iter().filter(|r| !r.pass).count();
    s.push_str(&format!("{} passed, {failed} failed\n", rows.len() - failed));
    (s, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_values_are_nonzero_and_reproducible() {
        let a: Vec<f32> = Rng::new(7).values(1000, 4.0);
        let b: Vec<f32> = Rng::new(7).values(1000, 4.0);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| v.abs() >= 1.0 / 64.0 && v.abs() <= 4.0));
        assert!(a.iter().any(|&v| v < 0.0) && a.iter().any(|&v| v > 0.0));
    }

    #[test]
    fn compare_applies_the_tolerance() {
        let t = Tol { atol: 1e-6, rtol: 1e-3 };
        let r = compare("k", "3".into(), DType::F32, &[1.0, 2.0005, 0.0], &[1.0, 2.0, 0.0], t);
        assert!(r.pass);
        assert!((r.max_abs - 5e-4).abs() < 1e-9);
        let r = compare("k", "3".into(), DType::F32, &[1.0, 2.01], &[1.0, 2.0], t);
        assert!(!r.pass);
        let r = compare("k", "1".into(), DType::F32, &[f64::NAN], &[1.0], t);
        assert!(!r.pass);
        let r = compare("k", "1".into(), DType::F32, &[1.0], &[1.0, 2.0], t);
        assert!(!r.pass);
        let (text, ok) = table(&[r]);
        assert!(!ok && text.contains("FAIL") && text.contains("0 passed, 1 failed"));
    }
}
