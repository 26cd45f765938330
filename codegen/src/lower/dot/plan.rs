//! The tensor-core plan of a function, computed once before lowering: which
//! `dot`s use `mma.sync` (and with which [`MmaLayout`]), which `b` operands
//! are read straight from the `[N, K]` tile they were transposed from, and
//! which loop-invariant `a` operands are loaded into A fragments once,
//! before their loop. Where values live between ops is decided afterwards
//! from these layouts (`lower/layouts.rs`).
//!
//! Chained products (FlashAttention's `dot(f(dot(q, k^T)), v)`): when the
//! `a` of a `dot` is computed elementwise from another `dot`'s result with
//! the same `M`, both get the warp grid with every warp along `M` (when the
//! shapes allow it), so each warp holds whole rows of the first result and
//! the second product takes its A fragments from those registers.
//!
//! Invariant: a skipped `permute` has exactly one use, the `b` operand of a
//! planned `dot`; that `dot` reads the permute's operand instead.

use super::super::layouts::is_elementwise;
use crate::mma::MmaLayout;
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::{ControlOp, ShapeOp};
use dsl_core::ir::{Inst, Op, Value};
use rustc_hash::{FxHashMap, FxHashSet};

/// The tensor-core decisions for one function; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct MmaPlan {
    /// Planned `dot`s and their accumulator layouts.
    pub dots: FxHashMap<Inst, MmaLayout>,
    /// For a planned `dot` whose `b` is `permute(x, [1, 0])`: `x` (`[N, K]`).
    pub b_trans: FxHashMap<Inst, Value>,
    /// `permute`s that are not lowered (their only user reads their operand).
    pub skipped: FxHashSet<Inst>,
    /// For each `for`: the loop-invariant `a` operands (defined in the block
    /// of the `for`) of planned `dot`s directly in its body, whose A
    /// fragments are loaded once before the loop and kept in registers.
    pub hoisted: FxHashMap<Inst, Vec<(Value, MmaLayout)>>,
}

/// Builds the plan of `f` for `warps` warps per program.
pub(crate) fn plan(f: &Function, warps: usize) -> MmaPlan {
    let mut uses: FxHashMap<Value, usize> = FxHashMap::default();
    let mut all = Vec::new();
    f.walk(|i| {
        all.push(i);
        for &a in &f.insts[i].args {
            *uses.entry(a).or_default() += 1;
        }
    });
    let once = |v: Value| uses.get(&v).copied() == Some(1);
    let mut p = MmaPlan::default();
    for &i in &all {
        if !matches!(f.insts[i].op, Op::Dot(_)) {
            continue;
        }
        let args = &f.insts[i].args;
        let (aty, bty) = (f.ty(args[0]), f.ty(args[1]));
        if !matches!(aty.dtype(), DType::F16 | DType::BF16) {
            continue;
        }
        let Some(l) = MmaLayout::choose(aty.shape[0], bty.shape[1], aty.shape[1], warps) else {
            continue;
        };
        p.dots.insert(i, l);
        if let Some(d) = f.def_inst(args[1])
            && let Op::Shape(ShapeOp::Permute { order }) = &f.insts[d].op
            && order.as_slice() == [1, 0]
            && once(args[1])
        {
            p.b_trans.insert(i, f.insts[d].args[0]);
            p.skipped.insert(d);
        }
    }
    chain_rows(f, &mut p, warps);
    for &i in &all {
        if !matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
            continue;
        }
        let body = f.entry(f.insts[i].regions[0]);
        for &d in &f.blocks[body].insts {
            let Some(&l) = p.dots.get(&d) else { continue };
            let a = f.insts[d].args[0];
            let outer = f.def_inst(a).is_some_and(|ad| f.insts[ad].parent == f.insts[i].parent);
            let list = p.hoisted.entry(i).or_default();
            if outer && !list.contains(&(a, l)) {
                list.push((a, l));
            }
        }
    }
    p
}

/// Gives chained products (see the module docs) the all-warps-along-`M`
/// grid: for each planned `dot` whose `a` comes elementwise from another
/// planned `dot`'s result of the same `M`, both layouts are re-chosen with
/// `warps_m = warps` when both shapes allow it.
fn chain_rows(f: &Function, p: &mut MmaPlan, warps: usize) {
    let dots: Vec<Inst> = p.dots.keys().copied().collect();
    for d2 in dots {
        let Some(d1) = source_dot(f, p, f.insts[d2].args[0]) else { continue };
        let (l1, l2) = (p.dots[&d1], p.dots[&d2]);
        if l1.m != l2.m {
            continue;
        }
        let k1 = f.ty(f.insts[d1].args[0]).shape[1];
        let k2 = f.ty(f.insts[d2].args[0]).shape[1];
        if let (Some(n1), Some(n2)) = (
            MmaLayout::with_warps_m(l1.m, l1.n, k1, warps, warps),
            MmaLayout::with_warps_m(l2.m, l2.n, k2, warps, warps),
        ) {
            p.dots.insert(d1, n1);
            p.dots.insert(d2, n2);
        }
    }
}

/// The planned `dot` whose result `v` is computed from through elementwise
/// ops on tiles of `v`'s shape (searched depth first), if any.
fn source_dot(f: &Function, p: &MmaPlan, v: Value) -> Option<Inst> {
    let shape = f.ty(v).shape.to_vec();
    let mut stack = vec![v];
    let mut seen = FxHashSet::default();
    while let Some(cur) = stack.pop() {
        if !seen.insert(cur) || seen.len() > 256 {
            continue;
        }
        let Some(d) = f.def_inst(cur) else { continue };
        if p.dots.contains_key(&d) {
            return Some(d);
        }
        if is_elementwise(&f.insts[d].op) {
            stack.extend(
                f.insts[d].args.iter().rev().filter(|&&x| f.ty(x).shape.as_slice() == shape.as_slice()),
            );
        }
    }
    None
}
