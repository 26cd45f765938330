//! The tensor-core plan of a function, computed once before lowering: which
//! `dot`s use `mma.sync` (and with which [`MmaLayout`]), which `b` operands
//! are read straight from the `[N, K]` tile they were transposed from, and
//! which loop-carried accumulators stay in the accumulator layout across the
//! iterations of a `for`, and which loop-invariant `a` operands are loaded
//! into A fragments once, before their loop.
//!
//! Invariants (what the lowering relies on):
//! - A skipped `permute` has exactly one use, the `b` operand of a planned
//!   `dot`; that `dot` reads the permute's operand instead.
//! - A held value is either a `for` body argument whose only use is the
//!   accumulator of a planned `dot` in that body, or the result of a planned
//!   `dot` of that chain whose only use is the accumulator of the next `dot`
//!   of the chain or, for the last, the body's `yield` at the same position
//!   (all `dot`s of a chain share one layout). Every other value is
//!   in the blocked layout, so only the `for` itself converts (its initial
//!   value before the loop, its result after it).

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
    /// Values whose registers are in the accumulator layout.
    pub held: FxHashMap<Value, MmaLayout>,
    /// For each `for`: the carried positions kept in the accumulator layout.
    pub carried: FxHashMap<Inst, Vec<(usize, MmaLayout)>>,
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
    for &i in &all {
        if !matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
            continue;
        }
        let body = f.entry(f.insts[i].regions[0]);
        let bargs = &f.blocks[body].args;
        let Some(&term) = f.blocks[body].insts.last() else { continue };
        let yielded = &f.insts[term].args;
        for &d in &f.blocks[body].insts {
            let Some(&l) = p.dots.get(&d) else { continue };
            let a = f.insts[d].args[0];
            let outer = f.def_inst(a).is_some_and(|ad| f.insts[ad].parent == f.insts[i].parent);
            let list = p.hoisted.entry(i).or_default();
            if outer && !list.contains(&(a, l)) {
                list.push((a, l));
            }
        }
        for (pos, &y) in yielded.iter().enumerate() {
            let Some(&ba) = bargs.get(pos + 1) else { continue };
            if let Some((l, chain)) = accumulator_chain(f, &p, body, ba, y, &once) {
                for v in chain {
                    p.held.insert(v, l);
                }
                p.carried.entry(i).or_default().push((pos, l));
            }
        }
    }
    p
}

/// The chain of planned `dot`s of `body` that carries the loop value `ba`
/// to the yielded `y` (`y = dot(.., dot(.., ba))`, e.g. a K tile split into
/// two products), when every link has the same accumulator layout and every
/// value of the chain (`ba` included) has exactly one use, the next link;
/// returns that layout and the chain's values (`ba`, then each result).
fn accumulator_chain(
    f: &Function,
    p: &MmaPlan,
    body: dsl_core::ir::Block,
    ba: Value,
    y: Value,
    once: &impl Fn(Value) -> bool,
) -> Option<(MmaLayout, Vec<Value>)> {
    let mut chain = vec![ba];
    let mut layout: Option<MmaLayout> = None;
    let mut v = y;
    loop {
        let d = f.def_inst(v)?;
        let l = *p.dots.get(&d)?;
        if f.insts[d].parent != Some(body) || !once(v) || layout.is_some_and(|x| x != l) {
            return None;
        }
        layout = Some(l);
        chain.push(v);
        let acc = f.insts[d].args[2];
        if acc == ba {
            return once(ba).then_some((l, chain));
        }
        v = acc;
    }
}
