//! Automatic pad-and-mask for non-power-of-two tile sizes.
//!
//! Tiles are powers of two in the IR. When a kernel asks for another size
//! (`arange(0, 100)`, `zeros(&[48, 100])`), the builder makes the next power of
//! two and remembers the *logical* extent of each padded dimension. The extent
//! follows values through elementwise ops, broadcasts, `expand_dims`,
//! `permute`, reductions, `dot`, loads and loop-carried values. Padding lanes
//! hold unspecified values, so every place where they could leak is masked:
//! loads and stores (and atomics) AND their mask with the validity of the
//! pointer tile, reductions and scans replace padding lanes by the combine's
//! neutral element first, and `dot` zeroes padding along K.
//!
//! Invariant: a value without an entry in `Ctx::logical` has no padding.

use super::Ctx;
use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::{ArithOp, BinaryOp, CmpPred, CompareOp, CreationOp, ShapeOp};
use crate::ir::{Op, Scalar, Value};
use crate::loc::Location;
use smallvec::SmallVec;

/// Logical extents per dimension (equal to the physical size where unpadded).
pub(crate) type Extents = SmallVec<[usize; 4]>;

impl Ctx {
    /// The logical extents of `v`, if it has padding.
    pub(crate) fn logical(&self, v: Value) -> Option<&Extents> {
        self.logical.get(&v)
    }

    /// Records logical extents for `v`, dropping the entry when nothing is padded.
    pub(crate) fn set_logical(&mut self, v: Value, ext: Extents) {
        let phys = &self.func.ty(v).shape;
        if phys.len() == ext.len() && phys.iter().zip(&ext).any(|(p, l)| l < p) {
            self.logical.insert(v, ext);
        }
    }

    /// Propagates logical extents from an op's operands to its results.
    pub(crate) fn propagate_logical(&mut self, op: &Op, args: &[Value], results: &[Value], loc: &Location) {
        if !args.iter().any(|a| self.logical.contains_key(a)) {
            return;
        }
        let ext_of = |c: &Ctx, v: Value| -> Extents {
            c.logical.get(&v).cloned().unwrap_or_else(|| c.func.ty(v).shape.clone())
        };
        let out: Option<Extents> = match op {
            Op::Arith(_) | Op::Compare(_) | Op::Cast(_) | Op::Hint(_) | Op::Memory(_) => {
                // Elementwise: the valid region is where every operand is valid.
                let rank = results.first().map_or(0, |r| self.func.ty(*r).rank());
                let mut e: Extents =
                    results.first().map(|r| self.func.ty(*r).shape.clone()).unwrap_or_default();
                for &a in args {
                    let ae = ext_of(self, a);
                    if ae.len() == rank {
                        for (x, y) in e.iter_mut().zip(ae) {
                            *x = (*x).min(y);
                        }
                    }
                }
                Some(e)
            }
            Op::Shape(ShapeOp::ExpandDims { axis }) => {
                let mut e = ext_of(self, args[0]);
                e.insert(*axis, 1);
                Some(e)
            }
            Op::Shape(ShapeOp::Broadcast { shape }) => {
                let e = ext_of(self, args[0]);
                Some(e.iter().zip(shape.iter()).map(|(&l, &t)| if l == 1 { t } else { l }).collect())
            }
            Op::Shape(ShapeOp::Permute { order }) => {
                let e = ext_of(self, args[0]);
                Some(order.iter().map(|&o| e[o]).collect())
            }
            Op::Shape(ShapeOp::Join) => {
                let mut e = ext_of(self, args[0]);
                e.push(2);
                Some(e)
            }
            Op::Shape(ShapeOp::Split) => {
                let mut e = ext_of(self, args[0]);
                e.pop();
                Some(e)
            }
            Op::Shape(ShapeOp::Reshape { .. }) => {
                self.error(
                    loc,
                    Some("reshape"),
                    "cannot reshape a tile padded to a power of two (its padding lanes would move into valid positions); use power-of-two sizes here".into(),
                );
                None
            }
            Op::Reduce(r) => {
                let mut e = ext_of(self, args[0]);
                if r.axis < e.len() {
                    e.remove(r.axis);
                }
                Some(e)
            }
            Op::Scan(_) => Some(ext_of(self, args[0])),
            Op::Dot(_) => {
                let (a, b) = (ext_of(self, args[0]), ext_of(self, args[1]));
                let c = ext_of(self, args[2]);
                Some([a[0].min(c[0]), b[1].min(c[1])].into_iter().collect())
            }
            _ => None,
        };
        if let Some(e) = out {
            for &r in results {
                if self.func.ty(r).rank() == e.len() {
                    self.set_logical(r, e.clone());
                }
            }
        }
    }

    /// An `i1` tile of `shape` that is true exactly on the valid (unpadded) lanes of
    /// the dimensions in `dims`, or `None` if none of them is padded.
    pub(crate) fn validity_mask(&mut self, v: Value, dims: &[usize], loc: &Location) -> Option<Value> {
        let ext = self.logical.get(&v)?.clone();
        let shape = self.func.ty(v).shape.clone();
        let mut mask: Option<Value> = None;
        for &d in dims {
            let (l, p) = (ext[d], shape[d]);
            if l >= p {
                continue;
            }
            let i32t = |s: &[usize]| Type::tile(Elem::Scalar(DType::I32), s);
            let idx = self.push_typed(
                Op::Creation(CreationOp::Arange { start: 0, end: p as i32 }),
                &[],
                vec![i32t(&[p])],
                loc,
            )[0];
            let bound = Op::Creation(CreationOp::Full {
                value: Scalar::int(DType::I32, l as i64),
                shape: [p].as_slice().into(),
            });
            let bound = self.push_typed(bound, &[], vec![i32t(&[p])], loc)[0];
            let b1 = Type::tile(Elem::Scalar(DType::I1), &[p]);
            let mut m =
                self.push_typed(Op::Compare(CompareOp::Cmp(CmpPred::Lt)), &[idx, bound], vec![b1], loc)[0];
            // Place the 1-D mask on axis `d` of the full shape, then broadcast.
            let mut s1: SmallVec<[usize; 4]> = SmallVec::from_elem(1, shape.len());
            s1[d] = p;
            if s1.len() > 1 {
                let t = Type::tile(Elem::Scalar(DType::I1), &s1);
                m = self.push_typed(Op::Shape(ShapeOp::Reshape { shape: s1.clone() }), &[m], vec![t], loc)[0];
            }
            if s1 != shape {
                let t = Type::tile(Elem::Scalar(DType::I1), &shape);
                m = self.push_typed(
                    Op::Shape(ShapeOp::Broadcast { shape: shape.clone() }),
                    &[m],
                    vec![t],
                    loc,
                )[0];
            }
            mask = Some(match mask {
                None => m,
                Some(prev) => {
                    let t = Type::tile(Elem::Scalar(DType::I1), &shape);
                    self.push_typed(Op::Arith(ArithOp::Binary(BinaryOp::And)), &[prev, m], vec![t], loc)[0]
                }
            });
        }
        mask
    }

    /// `v` with its padding lanes along `dims` replaced by `fill`.
    pub(crate) fn fill_padding(&mut self, v: Value, dims: &[usize], fill: Scalar, loc: &Location) -> Value {
        let Some(mask) = self.validity_mask(v, dims, loc) else { return v };
        let ty = self.func.ty(v).clone();
        let full = Op::Creation(CreationOp::Full { value: fill, shape: ty.shape.clone() });
        let f = self.push_typed(full, &[], vec![ty.with_elem(Elem::Scalar(fill.dtype()))], loc)[0];
        let ext = self.logical.get(&v).cloned();
        let r = self.push_typed(Op::Compare(CompareOp::Select), &[mask, v, f], vec![ty], loc)[0];
        if let Some(mut e) = ext {
            // Only `dims` became valid-by-construction; other padded dims stay padded.
            for &d in dims {
                e[d] = self.func.ty(r).shape[d];
            }
            self.set_logical(r, e);
        }
        r
    }
}
