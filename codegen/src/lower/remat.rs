//! Rematerialization: a tile computed only from `arange`s, constants,
//! scalars, shape ops (`expand_dims`, `broadcast`, `reshape`, `permute`) and
//! elementwise math is a pure function of its coordinates. A user that
//! needs it in a tensor-core layout ([`RegLayout::Mma`]) evaluates it register by
//! register at that layout's coordinates instead of exchanging its blocked
//! registers through shared memory (Triton rematerializes such chains
//! rather than converting layouts too).
//!
//! The same evaluation replaces the exchange of a blocked shape op whose
//! result is computable (a `broadcast` along an inner axis, a `permute`):
//! the index tiles kernels build from `arange`s before their loops (a
//! weight word's index broadcast over the elements it holds, say) cost ALU
//! work instead of barriers and shared-memory round trips.
//!
//! Each register's expression is built from the thread's coordinates and
//! constants, so LLVM folds what registers share.
//!
//! Invariants: only values for which [`computable`] holds are evaluated;
//! scalars are read from their (uniform) registers; an expression tree above
//! [`MAX_NODES`] ops is converted instead.

use super::{Lowerer, Regs, assign};
use crate::Result;
use crate::fragment::{MmaLayout, RowLayout};
use dsl_core::Function;
use dsl_core::ir::ops::{ArithOp, CastOp, CreationOp, ShapeOp};
use dsl_core::ir::{Op, Value};
use inkwell::values::{AsValueRef, BasicValueEnum, IntValue};
use rustc_hash::FxHashMap;

/// Ops in a value's expression tree (counting shared subtrees each time
/// they are reached) above which it is converted, not rematerialized.
pub(crate) const MAX_NODES: usize = 96;

/// True when `v` (rank 1 or more) can be evaluated at any coordinates: its
/// expression tree reaches only creation ops, scalars, shape ops and
/// register-wise ops (elementwise math, `addptr`, pointer casts), within
/// [`MAX_NODES`] ops.
pub(crate) fn computable(f: &Function, v: Value) -> bool {
    f.ty(v).rank() > 0 && within(f, v, &mut MAX_NODES.clone())
}

fn within(f: &Function, v: Value, budget: &mut usize) -> bool {
    if f.ty(v).rank() == 0 {
        return true;
    }
    let Some(i) = f.def_inst(v) else { return false };
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    let d = &f.insts[i];
    match &d.op {
        Op::Creation(_) => true,
        Op::Shape(
            ShapeOp::ExpandDims { .. }
            | ShapeOp::Broadcast { .. }
            | ShapeOp::Reshape { .. }
            | ShapeOp::Permute { .. },
        )
        | Op::Hint(_) => within(f, d.args[0], budget),
        op if register_wise(op) => d.args.iter().all(|&a| within(f, a, budget)),
        _ => false,
    }
}

/// Ops computed register by register, in any layout.
fn register_wise(op: &Op) -> bool {
    assign::is_elementwise(op) || matches!(op, Op::Arith(ArithOp::AddPtr) | Op::Cast(CastOp::PtrCast { .. }))
}

/// Memo of one evaluation: (value, coordinates) -> register.
type Memo<'ctx> = FxHashMap<(Value, Vec<usize>), BasicValueEnum<'ctx>>;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The registers of the `[l.m, l.n]` tile `v` ([`computable`]) in
    /// accumulator layout `l`, evaluated at each register's coordinates.
    pub(crate) fn remat_mma(&mut self, v: Value, l: &MmaLayout) -> Result<Regs<'ctx>> {
        let (row0, col0) = self.mma_origin(l)?;
        self.with_own_overrides(|lw| {
            let mut memo = Memo::default();
            (0..l.regs())
                .map(|s| {
                    let (dr, dc) = l.slot_delta(s);
                    let idx = vec![lw.plus(row0, dr)?, lw.plus(col0, dc)?];
                    lw.remat_at(v, &idx, &mut memo)
                })
                .collect()
        })
    }

    /// The registers of the `[r.m]` or `[r.m, 1]` row vector `v`
    /// ([`computable`]) in row layout `r`, evaluated at each register's row.
    pub(crate) fn remat_row(&mut self, v: Value, r: &RowLayout) -> Result<Regs<'ctx>> {
        let rank = self.f.ty(v).rank();
        self.with_own_overrides(|lw| {
            let mut memo = Memo::default();
            (0..r.regs())
                .map(|q| {
                    let mut idx = vec![lw.row_index(r, q)?];
                    if rank == 2 {
                        idx.push(lw.i32c(0));
                    }
                    lw.remat_at(v, &idx, &mut memo)
                })
                .collect()
        })
    }

    /// The blocked registers of `v` ([`computable`]), evaluated at each
    /// register's coordinates (for a shape op that would otherwise exchange
    /// its operand through shared memory).
    pub(crate) fn remat_blocked(&mut self, v: Value) -> Result<Regs<'ctx>> {
        let shape = self.f.ty(v).shape.to_vec();
        let l = self.layout_of(v);
        let strides = crate::blocked::strides(&shape);
        let base = self.thread_base(&l)?;
        self.with_own_overrides(|lw| {
            let mut memo = Memo::default();
            (0..l.regs())
                .map(|s| {
                    let lin = lw.linear_index(&l, base, s)?;
                    let idx = shape
                        .iter()
                        .zip(&strides)
                        .map(|(&n, &st)| lw.dim_index(lin, st, n))
                        .collect::<Result<Vec<_>>>()?;
                    lw.remat_at(v, &idx, &mut memo)
                })
                .collect()
        })
    }

    /// Runs `eval` with no operand overrides (the caller's, set by an
    /// elementwise op converting its operands, are set aside: an
    /// evaluation uses its own) and restores them, also when it fails.
    fn with_own_overrides<R>(&mut self, eval: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        let saved = std::mem::take(&mut self.overrides);
        let out = eval(self);
        self.overrides = saved;
        out
    }

    /// `base + d` (no instruction for `d = 0`).
    fn plus(&self, base: IntValue<'ctx>, d: usize) -> Result<IntValue<'ctx>> {
        Ok(if d == 0 { base } else { self.b.build_int_add(base, self.i32c(d as i64), "")? })
    }

    /// `v` at coordinates `idx` (i32, one per dimension of `v`).
    fn remat_at(
        &mut self,
        v: Value,
        idx: &[IntValue<'ctx>],
        memo: &mut Memo<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let f = self.f;
        if f.ty(v).rank() == 0 {
            return Ok(self.raw_regs(v)?[0]);
        }
        let key = (v, idx.iter().map(|x| x.as_value_ref() as usize).collect::<Vec<_>>());
        if let Some(&r) = memo.get(&key) {
            return Ok(r);
        }
        let Some(inst) = f.def_inst(v) else {
            return Err(crate::Error::Invalid(format!("value {v} is not computable from coordinates")));
        };
        let d = &f.insts[inst];
        let shape = |x: Value| f.ty(x).shape.to_vec();
        let r = match &d.op {
            Op::Creation(CreationOp::Const(s) | CreationOp::Full { value: s, .. }) => self.const_scalar(*s),
            Op::Creation(CreationOp::Splat { .. }) => self.raw_regs(d.args[0])?[0],
            Op::Creation(CreationOp::Arange { start, .. }) => {
                if *start == 0 {
                    idx[0].into()
                } else {
                    self.b.build_int_add(idx[0], self.i32c(*start as i64), "")?.into()
                }
            }
            Op::Shape(ShapeOp::ExpandDims { axis }) => {
                let mut a = idx.to_vec();
                a.remove(*axis);
                self.remat_at(d.args[0], &a, memo)?
            }
            Op::Shape(ShapeOp::Broadcast { .. }) => {
                let from = shape(d.args[0]);
                let a: Vec<IntValue<'ctx>> =
                    idx.iter().zip(&from).map(|(&x, &n)| if n == 1 { self.i32c(0) } else { x }).collect();
                self.remat_at(d.args[0], &a, memo)?
            }
            Op::Shape(ShapeOp::Reshape { .. }) => {
                let (to, from) = (shape(v), shape(d.args[0]));
                let mut lin = self.i32c(0);
                for (&x, &n) in idx.iter().zip(&to) {
                    lin = self.b.build_int_add(self.b.build_int_mul(lin, self.i32c(n as i64), "")?, x, "")?;
                }
                let mut a = vec![self.i32c(0); from.len()];
                for (k, &n) in from.iter().enumerate().rev() {
                    let nn = self.i32c(n as i64);
                    a[k] = self.b.build_int_unsigned_rem(lin, nn, "")?;
                    lin = self.b.build_int_unsigned_div(lin, nn, "")?;
                }
                self.remat_at(d.args[0], &a, memo)?
            }
            Op::Shape(ShapeOp::Permute { order }) => {
                let mut a = vec![self.i32c(0); order.len()];
                for (k, &o) in order.iter().enumerate() {
                    a[o] = idx[k];
                }
                self.remat_at(d.args[0], &a, memo)?
            }
            Op::Hint(_) => self.remat_at(d.args[0], idx, memo)?,
            op if register_wise(op) => {
                // The op's own lowering, on one register per operand.
                let mut ins = Vec::with_capacity(d.args.len());
                for &a in &d.args {
                    let x = self.remat_at(a, idx, memo)?;
                    ins.push((a, x));
                }
                let res = d.results[0];
                for &(a, x) in &ins {
                    self.overrides.insert(a, vec![x]);
                }
                let held = self.vals.remove(&res);
                let done = self.lower_op(inst, d.op.clone());
                let got = self.vals.remove(&res);
                if let Some(h) = held {
                    self.vals.insert(res, h);
                }
                for (a, _) in &ins {
                    self.overrides.remove(a);
                }
                done?;
                match got.as_deref() {
                    Some([x]) => *x,
                    _ => return Err(self.bug(inst, "rematerialized op gave no single register")),
                }
            }
            _ => return Err(self.bug(inst, "not computable from coordinates")),
        };
        memo.insert(key, r);
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsl_core::DType;
    use dsl_core::ir::Inst;
    use dsl_core::ir::ops::MemoryOp;
    use dsl_core::lang::*;

    /// The `store`s of `f`, in order.
    fn stores(f: &Function) -> Vec<Inst> {
        let mut out = Vec::new();
        f.walk(|i| {
            if matches!(f.insts[i].op, Op::Memory(MemoryOp::Store { .. })) {
                out.push(i);
            }
        });
        out
    }

    #[test]
    fn computable_tiles_reach_only_coordinates_and_scalars() {
        let f = KernelBuilder::new("remat")
            .build(|| {
                let p = param_ptr("p", DType::I32);
                let n = param_scalar("n", DType::I32);
                // Index math from aranges, a scalar and shape ops: computable.
                let idx = expand_dims(arange(0, 16), 1) * n + expand_dims(arange(0, 16), 0);
                let t = permute(broadcast_to(expand_dims(arange(0, 16), 0), &[16, 16]), &[1, 0]);
                store(p + idx, t + idx, None);
                // Anything reached through a load is not.
                let ld = load(p + idx, None, None);
                store(p + idx, ld + idx, None);
                // Nor a tree of more than MAX_NODES ops.
                let mut deep = idx;
                for _ in 0..MAX_NODES {
                    deep = deep + 1;
                }
                store(p + idx, deep, None);
            })
            .unwrap();
        let st = stores(&f);
        assert_eq!(st.len(), 3);
        let sv = |i: usize| (f.insts[st[i]].args[0], f.insts[st[i]].args[1]);
        assert!(computable(&f, sv(0).0) && computable(&f, sv(0).1), "pointer and value of index math");
        assert!(computable(&f, sv(1).0) && !computable(&f, sv(1).1), "a loaded tile");
        assert!(!computable(&f, sv(2).1), "over the node budget");
        // Scalars are operands, not tiles.
        let scalar = f.params[1].value;
        assert!(!computable(&f, scalar));
    }
}
