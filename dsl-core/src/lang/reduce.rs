//! Reductions, scans and `dot`.
//!
//! `sum` accumulates f16/bf16 in f32 and small integers (and `i1`) in i32, and
//! returns that wider type, so summing a bf16 row is accurate.

use super::shape::norm_axis;
use super::{Tensor, cast_to};
use crate::builder::{Ctx, build_region, with_ctx};
use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::{ControlOp, DotOp, DotPrecision, ReduceKind, ReduceOp, ScanKind, ScanOp};
use crate::ir::{Op, Scalar, Value};
use crate::loc::Location;

/// The dtype `sum`/`cumsum` accumulate in.
fn sum_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        DType::I1 | DType::I8 | DType::U8 | DType::I16 => DType::I32,
        d => d,
    }
}

/// The neutral element of a built-in reduction over `d` (`None` for custom ones).
fn neutral(kind: ReduceKind, d: DType) -> Option<Scalar> {
    let (lo, hi) = match d.int_range() {
        Some((lo, hi)) => (Scalar::int(d, lo), Scalar::int(d, hi)),
        None => (Scalar::float(d, f64::NEG_INFINITY), Scalar::float(d, f64::INFINITY)),
    };
    match kind {
        ReduceKind::Sum => Some(Scalar::zero(d)),
        ReduceKind::Max | ReduceKind::Argmax => Some(lo),
        ReduceKind::Min | ReduceKind::Argmin => Some(hi),
        ReduceKind::Custom => None,
    }
}

fn reduce_at(kind: ReduceKind, x: Tensor, axis: i32, loc: &Location) -> Tensor {
    with_ctx(|c| {
        c.check(x);
        let t = c.func.ty(x.value()).clone();
        let mut v = x.value();
        if kind == ReduceKind::Sum {
            v = cast_to(c, v, sum_dtype(t.dtype()), loc);
        }
        let axis = norm_axis(axis, t.rank());
        if axis < t.rank() {
            // Padding lanes along the reduced axis become the neutral element.
            let d = c.func.ty(v).dtype();
            if let Some(fill) = neutral(kind, d) {
                v = c.fill_padding(v, &[axis], fill, loc);
            }
        }
        let mut out = t.shape.to_vec();
        if axis < out.len() {
            out.remove(axis);
        }
        let elem = match kind {
            ReduceKind::Argmax | ReduceKind::Argmin => Elem::Scalar(DType::I32),
            _ => c.func.ty(v).elem,
        };
        let r = c.push(Op::Reduce(ReduceOp { axis, kind }), &[v], loc, &[Type::tile(elem, &out)])[0];
        c.handle(r)
    })
}

located_fns! {
    reduce_at(x: Tensor, axis: i32);
    /// Sum along `axis` (negative counts from the end).
    sum => ReduceKind::Sum;
    /// Maximum along `axis`.
    max => ReduceKind::Max;
    /// Minimum along `axis`.
    min => ReduceKind::Min;
    /// Index (`i32`) of the maximum along `axis`; ties pick the smallest index.
    argmax => ReduceKind::Argmax;
    /// Index (`i32`) of the minimum along `axis`; ties pick the smallest index.
    argmin => ReduceKind::Argmin;
}

/// Reduces `inputs` (one shape) along `axis` with an associative `combine` that
/// maps (running values, new values), each one scalar per input, to the combined
/// scalars. Returns one result per input.
#[track_caller]
pub fn reduce(
    inputs: &[Tensor],
    axis: i32,
    combine: impl FnOnce(&[Tensor], &[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let loc = Location::caller();
    combine_at(inputs, "reduce", &loc, axis, combine, |c, vals, tys, ax| {
        let padded_axis = vals
            .iter()
            .any(|&v| c.logical(v).is_some_and(|e| e.get(ax).is_some_and(|&l| l < c.func.ty(v).shape[ax])));
        if padded_axis {
            c.error(&loc, Some("reduce"), "a custom reduction over a padded (non-power-of-two) axis has no neutral element to fill the padding with; reduce a power-of-two tile".into());
        }
        let op = Op::Reduce(ReduceOp { axis: ax, kind: ReduceKind::Custom });
        let out_tys = match op.infer(tys) {
            Ok(t) => t,
            Err(m) => {
                c.error(&loc, Some("reduce"), m);
                tys.iter().map(|t| Type::scalar(t.dtype())).collect()
            }
        };
        (op, out_tys)
    })
}

/// Builds the custom reduction or scan `name` of `inputs` along `axis` at
/// `loc`: `op` makes the op and its result types from the inputs' values
/// and types and the axis (made non-negative against the inputs' rank);
/// `combine` fills its combine region, which maps (running values, new
/// values), one scalar per input each, to the combined scalars.
fn combine_at(
    inputs: &[Tensor],
    name: &'static str,
    loc: &Location,
    axis: i32,
    combine: impl FnOnce(&[Tensor], &[Tensor]) -> Vec<Tensor>,
    op: impl FnOnce(&mut Ctx, &[Value], &[Type], usize) -> (Op, Vec<Type>),
) -> Vec<Tensor> {
    let (inst, elems, results) = with_ctx(|c| {
        let vals = c.values(inputs);
        let tys: Vec<Type> = vals.iter().map(|&v| c.func.ty(v).clone()).collect();
        let ax = norm_axis(axis, tys.first().map_or(0, |t| t.rank()));
        let (op, out_tys) = op(c, &vals, &tys, ax);
        let inst = c.func.create_inst(op, &vals, out_tys, loc.clone());
        let b = c.cur_block();
        c.func.append_inst(b, inst);
        let elems: Vec<Type> = tys.iter().map(|t| Type { elem: t.elem, shape: Default::default() }).collect();
        let results: Vec<Tensor> = c.func.insts[inst].results.clone().iter().map(|&v| c.handle(v)).collect();
        (inst, elems, results)
    });
    let n = elems.len();
    let arg_tys: Vec<Type> = elems.iter().chain(elems.iter()).cloned().collect();
    let (region, yielded) =
        build_region(inst, &arg_tys, loc, ControlOp::Yield, |args| combine(&args[..n], &args[n..]));
    with_ctx(|c| {
        c.func.insts[inst].regions.push(region);
        c.check_types(loc, name, &elems, &yielded, |want, got| {
            format!("the combine function must return {want} but returns {got}")
        });
    });
    results
}

fn scan_at(kind: ScanKind, x: Tensor, axis: i32, reverse: bool, loc: &Location) -> Tensor {
    with_ctx(|c| {
        c.check(x);
        let mut v = x.value();
        if kind == ScanKind::Sum {
            let d = c.func.ty(v).dtype();
            v = cast_to(c, v, sum_dtype(d), loc);
        }
        let t = c.func.ty(v).clone();
        let ax = norm_axis(axis, t.rank());
        if reverse && ax < t.rank() {
            // A reverse scan reads the padding lanes first: make them neutral.
            let rk = match kind {
                ScanKind::Sum => ReduceKind::Sum,
                ScanKind::Max => ReduceKind::Max,
                ScanKind::Min => ReduceKind::Min,
                ScanKind::Custom => ReduceKind::Custom,
            };
            if let Some(fill) = neutral(rk, t.dtype()) {
                v = c.fill_padding(v, &[ax], fill, loc);
            }
        }
        let op = ScanOp { axis: ax, kind, reverse };
        let r = c.push(Op::Scan(op), &[v], loc, &[t])[0];
        c.handle(r)
    })
}

// Forward scans (`reverse` false).
located_fns! {
    scan_at(x: Tensor, axis: i32) [false];
    /// Inclusive prefix sum along `axis`.
    cumsum => ScanKind::Sum;
    /// Inclusive running maximum along `axis`.
    cummax => ScanKind::Max;
    /// Inclusive running minimum along `axis`.
    cummin => ScanKind::Min;
}

/// Inclusive scan of `inputs` along `axis` with an associative `combine`
/// (see [`reduce`]); `reverse` scans from the end.
#[track_caller]
pub fn scan(
    inputs: &[Tensor],
    axis: i32,
    reverse: bool,
    combine: impl FnOnce(&[Tensor], &[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let loc = Location::caller();
    combine_at(inputs, "scan", &loc, axis, combine, |c, _, tys, ax| {
        let op = Op::Scan(ScanOp { axis: ax, kind: ScanKind::Custom, reverse });
        if let Err(m) = op.infer(tys) {
            c.error(&loc, Some("scan"), m);
        }
        (op, tys.to_vec())
    })
}

/// `acc + a @ b` for `a: [M, K]`, `b: [K, N]`; with `acc = None` a zero
/// accumulator (f32, or i32 for i8 inputs) is used.
#[track_caller]
pub fn dot(a: Tensor, b: Tensor, acc: Option<Tensor>) -> Tensor {
    dot_with(a, b, acc, DotPrecision::Ieee)
}

/// [`dot`] with an explicit precision for f32 inputs.
#[track_caller]
pub fn dot_with(a: Tensor, b: Tensor, acc: Option<Tensor>, precision: DotPrecision) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        c.check(a);
        c.check(b);
        let (ta, tb) = (c.func.ty(a.value()).clone(), c.func.ty(b.value()).clone());
        // Padding along K must not contribute: zero it in both operands.
        let (av, bv) = if ta.rank() == 2 && tb.rank() == 2 {
            let za = Scalar::zero(ta.dtype());
            let zb = Scalar::zero(tb.dtype());
            (c.fill_padding(a.value(), &[1], za, &loc), c.fill_padding(b.value(), &[0], zb, &loc))
        } else {
            (a.value(), b.value())
        };
        let m = ta.shape.first().copied().unwrap_or(1);
        let n = tb.shape.get(1).copied().unwrap_or(1);
        let acc_d = if ta.dtype() == DType::I8 { DType::I32 } else { DType::F32 };
        let acc_v = match acc {
            Some(t) => {
                c.check(t);
                t.value()
            }
            None => {
                let op = Op::Creation(crate::ir::ops::CreationOp::Full {
                    value: crate::ir::Scalar::zero(acc_d),
                    shape: [m, n].as_slice().into(),
                });
                c.push_typed(op, &[], vec![Type::tile(Elem::Scalar(acc_d), &[m, n])], &loc)[0]
            }
        };
        let fallback = Type::tile(Elem::Scalar(acc_d), &[m, n]);
        let r = c.push(Op::Dot(DotOp { precision }), &[av, bv, acc_v], &loc, &[fallback])[0];
        c.handle(r)
    })
}

impl Tensor {
    /// See [`sum`].
    #[track_caller]
    pub fn sum(self, axis: i32) -> Tensor {
        sum(self, axis)
    }
    /// See [`max`].
    #[track_caller]
    pub fn max(self, axis: i32) -> Tensor {
        max(self, axis)
    }
    /// See [`min`].
    #[track_caller]
    pub fn min(self, axis: i32) -> Tensor {
        min(self, axis)
    }
}
