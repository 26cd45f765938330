//! `tessera gpu-check` and `tessera host-check`: every registered kernel runs
//! on a device (the GPU, or the native CPU backend) and on the CPU
//! interpreter (the semantic oracle) with the same fresh random inputs at
//! ragged shapes, and the outputs are compared element by element. Each
//! check is one function generic over the [`Device`]; `gpu-check`
//! instantiates it for [`crate::cuda::Cuda`], `host-check`
//! ([`crate::check::host`]) for [`codegen::host::Host`].
//!
//! This file is the harness (random inputs, tolerances, comparison, the
//! table); each kernel family's checks live in a file of their own named like
//! the family's file in `kernels`. Where a check's launch is one function
//! generic over the device (`*_on`), it runs that function on the device and
//! on a fresh interpreter ([`Cpu`] is a [`Device`] too) and compares the two.
//!
//! Invariants: inputs are random and non-zero (|x| >= 1/64), so a kernel that
//! writes nothing or zeros fails; every shape is checked in each storage dtype
//! the kernel supports (f32 and bf16 for most); an element passes when
//! `|gpu - cpu| <= atol + rtol * |cpu|` with the dtype's tolerance ([`Tol`]).

use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::model::Device;
use dsl_core::DType;
use dsl_core::launch::PtrElem;

pub mod attention;
pub mod copy;
pub mod cpu_gemv;
pub mod decode;
pub mod dequant;
pub mod embedding;
pub mod examples;
pub mod fp8;
pub mod grammar;
pub mod host;
pub mod invariance;
pub mod kv8;
pub mod matmul;
pub mod mega;
pub mod model;
pub mod pdl;
pub mod q8;
pub mod rmsnorm;
pub mod rope;
pub mod sampling;
pub mod softmax;
pub mod sync;

pub use crate::rng::Rng;

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

/// A case's single row, so that one-row and several-row cases go through the
/// same loops ([`over_cases`], [`over_shapes`]).
impl IntoIterator for CheckRow {
    type Item = CheckRow;
    type IntoIter = std::iter::Once<CheckRow>;

    fn into_iter(self) -> Self::IntoIter {
        std::iter::once(self)
    }
}

impl CheckRow {
    /// A passing row with no difference yet, for a comparison to fill in.
    pub fn passing(kernel: impl Into<String>, shape: String, dtype: DType) -> CheckRow {
        CheckRow { kernel: kernel.into(), shape, dtype, max_abs: 0.0, max_rel: 0.0, pass: true }
    }
}

/// Compares `got` (GPU) with `want` (interpreter).
pub fn compare(kernel: &str, shape: String, dtype: DType, got: &[f64], want: &[f64], tol: Tol) -> CheckRow {
    let mut row = CheckRow::passing(kernel, shape, dtype);
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

/// Compares `got` with `want`, element `i` within `tol[i]` (absolute).
pub(crate) fn compare_each(
    kernel: &str,
    shape: String,
    dtype: DType,
    got: &[f64],
    want: &[f64],
    tol: &[f64],
) -> CheckRow {
    let mut row = CheckRow::passing(kernel, shape, dtype);
    if got.len() != want.len() {
        row.pass = false;
        row.max_abs = f64::INFINITY;
        return row;
    }
    for ((&g, &w), &t) in got.iter().zip(want).zip(tol) {
        let d = (g - w).abs();
        let d = if d.is_nan() { f64::INFINITY } else { d };
        row.max_abs = row.max_abs.max(d);
        if w != 0.0 {
            row.max_rel = row.max_rel.max(d / w.abs());
        }
        if d > t {
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

/// Exact equality (integer outputs, copies).
pub(crate) const EXACT: Tol = Tol { atol: 0.0, rtol: 0.0 };

/// f32 results of long sums (dot products, scans, row statistics): the GPU
/// adds in a different order than the interpreter.
pub(crate) const F32_SUM: Tol = Tol { atol: 1e-4, rtol: 1e-4 };

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

/// `BLOCK` for a row of `cols`: exactly `cols`, or padded to a power of two.
pub(crate) fn row_block(cols: usize, exact: bool) -> usize {
    if exact { cols } else { cols.next_power_of_two() }
}

/// The shape column of a row kernel's check.
pub(crate) fn row_shape(rows: usize, cols: usize, exact: bool) -> String {
    format!("{rows}x{cols}{}", if exact { "" } else { " (padded BLOCK)" })
}

/// Ragged `(rows, cols)` of the row-kernel checks, each with an exact and a
/// padded `BLOCK`.
pub(crate) const ROW_SHAPES: [(usize, usize); 5] = [(1, 1), (5, 17), (37, 1000), (64, 1024), (7, 4097)];

/// The rows of a check: `case` on each of `cases` in order, from one random
/// stream.
pub(crate) fn over_cases<D: Device, C, R: IntoIterator<Item = CheckRow>>(
    dev: &mut D,
    seed: u64,
    cases: impl IntoIterator<Item = C>,
    mut case: impl FnMut(&mut D, &mut Rng, C) -> Result<R>,
) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for c in cases {
        out.extend(case(dev, &mut rng, c)?);
    }
    Ok(out)
}

/// The rows of a row-kernel check: `case` on every shape `(rows, cols)` of
/// [`ROW_SHAPES`], each with an exact and a padded `BLOCK` (`exact`), from
/// one random stream.
pub(crate) fn over_row_shapes<D: Device>(
    dev: &mut D,
    seed: u64,
    case: ShapeCase<D, (usize, usize, bool), CheckRow>,
) -> Result<Vec<CheckRow>> {
    let cases = ROW_SHAPES.into_iter().flat_map(|(rows, cols)| [true, false].map(|e| (rows, cols, e)));
    over_cases(dev, seed, cases, case)
}

/// A check case on one shape `S`, its rows `R`.
pub(crate) type ShapeCase<D, S, R> = fn(&mut D, &mut Rng, S) -> Result<R>;

/// A row-kernel check case on one shape `S` with an exact `BLOCK` or not.
pub(crate) type BlockCase<D, S, R> = fn(&mut D, &mut Rng, S, bool) -> Result<R>;

/// A check case in one dtype as [`over_shapes`] runs it on shape `i` of its
/// list: a [`ShapeCase`] on the shape alone; a [`BlockCase`] with exact and
/// padded `BLOCK`s in turn (shape `i`'s f32 case has an exact `BLOCK` where
/// `i` is even, its bf16 case where `i` is odd).
pub(crate) trait DtypeCase<D, S, R> {
    /// The rows of the case on `shape`, the `i`th of the list, in f32
    /// (`is_f32`) or bf16.
    fn rows(&self, dev: &mut D, rng: &mut Rng, i: usize, shape: S, is_f32: bool) -> Result<R>;
}

impl<D, S, R> DtypeCase<D, S, R> for ShapeCase<D, S, R> {
    fn rows(&self, dev: &mut D, rng: &mut Rng, _: usize, shape: S, _: bool) -> Result<R> {
        self(dev, rng, shape)
    }
}

impl<D, S, R> DtypeCase<D, S, R> for BlockCase<D, S, R> {
    fn rows(&self, dev: &mut D, rng: &mut Rng, i: usize, shape: S, is_f32: bool) -> Result<R> {
        self(dev, rng, shape, i.is_multiple_of(2) == is_f32)
    }
}

/// The rows of a check over `shapes` in f32 and bf16: on each shape the f32
/// case, then the bf16 case, from one random stream (see [`DtypeCase`] for
/// the `BLOCK`s of row kernels' cases).
pub(crate) fn over_shapes<D: Device, S: Copy, R: IntoIterator<Item = CheckRow>>(
    dev: &mut D,
    seed: u64,
    shapes: &[S],
    [f32_case, bf16_case]: [impl DtypeCase<D, S, R>; 2],
) -> Result<Vec<CheckRow>> {
    over_cases(dev, seed, shapes.iter().copied().enumerate(), |dev, rng, (i, shape)| {
        let f32_rows = f32_case.rows(dev, rng, i, shape, true)?;
        Ok(f32_rows.into_iter().chain(bf16_case.rows(dev, rng, i, shape, false)?).collect::<Vec<_>>())
    })
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
