//! Shape ops: `expand_dims`, `broadcast_to`, `reshape`, `permute`/`trans`,
//! `join`/`split`.

use super::{Tensor, check_shape};
use crate::builder::with_ctx;
use crate::ir::Op;
use crate::ir::ops::ShapeOp;
use crate::loc::Location;

fn shape_op(op: ShapeOp, x: Tensor, loc: &Location) -> Tensor {
    with_ctx(|c| {
        c.check(x);
        let t = c.func.ty(x.value()).clone();
        let v = c.push(Op::Shape(op), &[x.value()], loc, &[t])[0];
        c.handle(v)
    })
}

/// Normalizes a possibly negative axis against `rank`.
pub(crate) fn norm_axis(axis: i32, rank: usize) -> usize {
    if axis < 0 { (rank as i64 + axis as i64).max(0) as usize } else { axis as usize }
}

/// Inserts a size-1 dimension at `axis` (negative counts from the end).
#[track_caller]
pub fn expand_dims(x: Tensor, axis: i32) -> Tensor {
    let loc = Location::caller();
    let rank = with_ctx(|c| c.func.ty(x.value()).rank());
    shape_op(ShapeOp::ExpandDims { axis: norm_axis(axis, rank + 1) }, x, &loc)
}

/// Broadcasts `x` to `shape` (scalars are splatted, lower ranks padded on the
/// left). Dimensions that are not powers of two are padded and masked (see
/// [`arange`](super::arange)): `shape` is compared with `x`'s logical extents.
#[track_caller]
pub fn broadcast_to(x: Tensor, shape: &[usize]) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        c.check(x);
        let phys = super::padded(shape);
        let from = c.func.ty(x.value()).shape.clone();
        let logical_from: Vec<usize> = c.logical(x.value()).map_or_else(|| from.to_vec(), |e| e.to_vec());
        let fits = shape.len() >= from.len()
            && logical_from.iter().rev().zip(shape.iter().rev()).all(|(&a, &b)| a == 1 || a == b);
        match crate::builder::broadcast_shapes(&from, &phys) {
            Ok(s) if s.as_slice() == phys.as_slice() && fits => {
                let v = super::broadcast_value(c, x.value(), &phys, &loc);
                let mut ext: crate::builder::padding::Extents =
                    c.logical(v).cloned().unwrap_or_else(|| phys.iter().copied().collect());
                for (e, &want) in ext.iter_mut().zip(shape) {
                    *e = (*e).min(want);
                }
                c.set_logical(v, ext);
                return c.handle(v);
            }
            _ => c.error(
                &loc,
                Some("broadcast"),
                format!(
                    "cannot broadcast {} to {}",
                    crate::dtype::fmt_shape(&from),
                    crate::dtype::fmt_shape(shape)
                ),
            ),
        }
        let v = super::broadcast_value(c, x.value(), &phys, &loc);
        c.handle(v)
    })
}

/// The same elements (row-major) with another shape of equal size.
#[track_caller]
pub fn reshape(x: Tensor, shape: &[usize]) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| check_shape(c, &loc, "reshape", shape));
    shape_op(ShapeOp::Reshape { shape: shape.into() }, x, &loc)
}

/// Permutes dimensions: result dimension `i` is `x`'s dimension `order[i]`.
#[track_caller]
pub fn permute(x: Tensor, order: &[usize]) -> Tensor {
    shape_op(ShapeOp::Permute { order: order.to_vec() }, x, &Location::caller())
}

/// Transposes a 2-D tile.
#[track_caller]
pub fn trans(x: Tensor) -> Tensor {
    shape_op(ShapeOp::Permute { order: vec![1, 0] }, x, &Location::caller())
}

/// Stacks two tiles of one type along a new trailing dimension of size 2.
#[track_caller]
pub fn join(a: Tensor, b: Tensor) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        c.check(a);
        c.check(b);
        let mut t = c.func.ty(a.value()).clone();
        t.shape.push(2);
        let v = c.push(Op::Shape(ShapeOp::Join), &[a.value(), b.value()], &loc, &[t])[0];
        c.handle(v)
    })
}

/// Splits a tile whose last dimension is 2 into its two halves.
#[track_caller]
pub fn split(x: Tensor) -> (Tensor, Tensor) {
    let loc = Location::caller();
    with_ctx(|c| {
        c.check(x);
        let t = c.func.ty(x.value()).clone();
        let s = &t.shape[..t.rank().saturating_sub(1)];
        let half = t.with_shape(s);
        let v = c.push(Op::Shape(ShapeOp::Split), &[x.value()], &loc, &[half.clone(), half]);
        (c.handle(v[0]), c.handle(v[1]))
    })
}

impl Tensor {
    /// See [`expand_dims`].
    #[track_caller]
    pub fn expand_dims(self, axis: i32) -> Tensor {
        expand_dims(self, axis)
    }
    /// See [`broadcast_to`].
    #[track_caller]
    pub fn broadcast_to(self, shape: &[usize]) -> Tensor {
        broadcast_to(self, shape)
    }
    /// See [`reshape`].
    #[track_caller]
    pub fn reshape(self, shape: &[usize]) -> Tensor {
        reshape(self, shape)
    }
    /// See [`trans`].
    #[track_caller]
    pub fn trans(self) -> Tensor {
        trans(self)
    }
}
