//! BlockedLayout assignment: which tile values live in a tensor-core layout
//! ([`RegLayout::Mma`], [`RegLayout::Row`]) instead of the flattened blocked layout, and
//! which of them also need a blocked copy.
//!
//! The result of every tensor-core `dot` is in its accumulator layout. From
//! there layouts spread forward to the ops that can compute in them without
//! moving data between threads:
//! - elementwise ops (arithmetic, math, `fma`, comparisons, `select`, casts)
//!   of an `[M, N]` tile with an operand in an [`MmaLayout`] of that shape
//!   take it (their other operands are converted, constants splatted);
//! - a built-in `sum`/`max`/`min` along the last axis of an `[M, N]` tile in
//!   an [`MmaLayout`] gives its [`crate::fragment::RowLayout`] (quad shuffles);
//!   elementwise ops on row vectors keep it, and so do `expand_dims` and
//!   `reshape` between `[M]` and `[M, 1]`;
//! - `broadcast` of an `[M, 1]` row vector to `[M, N]` takes the layout of a
//!   tensor-core `dot` of that shape with the same split of `M`; so does a
//!   broadcast of any other `[M, 1]` vector that an elementwise op combines
//!   with a tile in such a layout (`p * expand_dims(scale, 1)`): its operand
//!   is converted to the row layout instead, `M` values rather than the
//!   broadcast tile;
//! - a row vector whose users all take it in one row layout, computed from
//!   plain loads, coordinates and uniform values only (also through a `for`
//!   that carries it), takes that layout back to its loads
//!   (`pulled_row`): they read the rows each thread holds, and nothing is
//!   exchanged (the block-scaled FP8 product's per-block scales);
//! - `trans` of an `[M, N]` tile in an [`MmaLayout`] of at least
//!   [`LARGE_ACC`] registers per thread keeps its registers ([`RegLayout::MmaT`]);
//!   its users take it through a blocked copy, which costs one exchange
//!   instead of two (accumulator to blocked, then a permute);
//! - a `for` carries a value in the layout its body yields (the initial
//!   value is converted once, before the loop), an `if` yields in the layout
//!   both branches agree on; `while` loops stay blocked.
//!
//! The assignment is iterated to a fixed point (loop-carried values feed
//! their own bodies) and capped; it is a performance decision only: the
//! lowering converts any operand whose layout differs from what its user
//! needs (`Lowerer::regs_as`), so every assignment is correct.
//!
//! A value in a tensor-core layout that has any user needing another layout
//! (a store, a load address, a shape op, ...) gets a blocked copy right
//! where it is defined ([`Assignment::needs_blocked`]), so the generic
//! lowering of those users reads plain blocked registers.

use super::dot::plan::MmaPlan;
use crate::fragment::{MmaLayout, RegLayout, RowLayout};
use dsl_core::Function;
use dsl_core::ir::ops::{ArithOp, CastOp, CompareOp, ControlOp, CreationOp, MemoryOp, ReduceKind, ShapeOp};
use dsl_core::ir::{Inst, Op, Value};
use rustc_hash::{FxHashMap, FxHashSet};

/// The layouts of a function's values; absent values are [`RegLayout::Blocked`].
#[derive(Debug, Default)]
pub(crate) struct Assignment {
    /// Values not in the blocked layout.
    pub lays: FxHashMap<Value, RegLayout>,
    /// Values in a tensor-core layout that also need a blocked copy.
    pub needs_blocked: FxHashSet<Value>,
}

impl Assignment {
    /// The layout of `v`.
    pub fn lay(&self, v: Value) -> RegLayout {
        self.lays.get(&v).copied().unwrap_or(RegLayout::Blocked)
    }
}

/// Accumulator registers per thread from which `trans` keeps the
/// accumulator's registers ([`RegLayout::MmaT`]) instead of converting to blocked
/// and permuting: the swapped dequant GEMM's 256 x 128 tile (128 registers)
/// stores its epilogue with one exchange instead of two. Below it the
/// permute is cheap and the other path changes ptxas's register choices for
/// the worse (the swapped 64 x 64 tile, 32 registers, is slower with it).
pub(crate) const LARGE_ACC: usize = 64;

/// True for elementwise ops that may compute in any layout.
pub(crate) fn is_elementwise(op: &Op) -> bool {
    match op {
        Op::Arith(a) => !matches!(a, ArithOp::AddPtr),
        Op::Compare(CompareOp::Cmp(_) | CompareOp::Select) => true,
        Op::Cast(c) => !matches!(c, CastOp::PtrCast { .. }),
        _ => false,
    }
}

/// True when `v` is the same in every thread and register (a constant or a
/// splat of a scalar): it takes any layout for free.
pub(crate) fn is_uniform(f: &Function, v: Value) -> bool {
    if f.ty(v).rank() == 0 {
        return true;
    }
    matches!(
        f.def_inst(v).map(|i| &f.insts[i].op),
        Some(Op::Creation(CreationOp::Const(_) | CreationOp::Full { .. } | CreationOp::Splat { .. }))
    )
}

/// The accumulator layout `l` can take its `a` operand from registers of
/// layout `a`: every warp holds whole rows of `a` (`warps_n == 1`) and both
/// split `M` the same way, so the A fragments of a warp's m tiles are its own
/// accumulator registers (two 8-column n tiles make one 16-wide k step).
pub(crate) fn a_from_regs(a: RegLayout, l: &MmaLayout) -> bool {
    matches!(a, RegLayout::Mma(al) if al.warps_n == 1 && al.m == l.m && al.warps_m == l.warps_m && !al.interleaved)
}

/// Assigns layouts to the values of `f` given its tensor-core plan.
/// `blocked_loads` (the pipeline's loads read back from their stages) stay
/// blocked.
pub(crate) fn assign(f: &Function, plan: &MmaPlan, blocked_loads: &FxHashSet<Inst>) -> Assignment {
    let mut a = Assignment::default();
    let mut order = Vec::new();
    f.walk(|i| order.push(i));
    let dot_layouts: Vec<MmaLayout> = {
        let mut v: Vec<MmaLayout> = order.iter().filter_map(|i| plan.dots.get(i).copied()).collect();
        v.dedup();
        v
    };
    let users = f.users();
    for _round in 0..8 {
        let mut changed = false;
        for &i in &order {
            if blocked_loads.contains(&i) {
                continue;
            }
            for (r, lay) in infer(f, plan, &a, &dot_layouts, &users, i) {
                if a.lay(r) != lay {
                    changed = true;
                    if lay == RegLayout::Blocked {
                        a.lays.remove(&r);
                    } else {
                        a.lays.insert(r, lay);
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    // Blocked copies: any use that wants another layout than the value's.
    for &i in &order {
        for (k, &v) in f.insts[i].args.iter().enumerate() {
            let lay = a.lay(v);
            if lay != RegLayout::Blocked && wants(f, plan, &a, i, k) != lay {
                a.needs_blocked.insert(v);
            }
        }
    }
    a
}

/// The layout the `k`-th operand of `inst` is consumed in.
pub(crate) fn wants(f: &Function, plan: &MmaPlan, a: &Assignment, inst: Inst, k: usize) -> RegLayout {
    let d = &f.insts[inst];
    let res = |n: usize| d.results.get(n).map(|&r| a.lay(r)).unwrap_or(RegLayout::Blocked);
    match &d.op {
        op if is_elementwise(op) => res(0),
        Op::Reduce(_) => match (a.lay(d.args[k]), res(0)) {
            (RegLayout::Mma(_), RegLayout::Row(_)) => a.lay(d.args[k]),
            _ => RegLayout::Blocked,
        },
        Op::Shape(ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. }) => match res(0) {
            RegLayout::Row(r) => RegLayout::Row(r),
            _ => RegLayout::Blocked,
        },
        Op::Shape(ShapeOp::Broadcast { .. }) => match res(0) {
            RegLayout::Mma(l) => RegLayout::Row(l.row()),
            _ => RegLayout::Blocked,
        },
        Op::Shape(ShapeOp::Permute { .. }) => match res(0) {
            RegLayout::MmaT(l) => RegLayout::Mma(l),
            _ => RegLayout::Blocked,
        },
        Op::Dot(_) => match plan.dots.get(&inst) {
            Some(l) if k == 2 => RegLayout::Mma(*l),
            // `a` in an accumulator layout: fragments from its registers, or
            // staged from them (see `dot/mma.rs`).
            Some(_) if k == 0 && matches!(a.lay(d.args[0]), RegLayout::Mma(_)) => a.lay(d.args[0]),
            _ => RegLayout::Blocked,
        },
        Op::Control(ControlOp::For) if k >= 3 => {
            let body = f.entry(d.regions[0]);
            f.blocks[body].args.get(k - 2).map(|&b| a.lay(b)).unwrap_or(RegLayout::Blocked)
        }
        Op::Control(ControlOp::Yield) => yield_wants(f, a, inst, k),
        _ => RegLayout::Blocked,
    }
}

/// The layout a region's `yield` passes its `k`-th operand on in: the
/// carried value's of a `for` body, the result's of an `if` branch.
fn yield_wants(f: &Function, a: &Assignment, y: Inst, k: usize) -> RegLayout {
    let Some(block) = f.insts[y].parent else { return RegLayout::Blocked };
    let Some(region) = f.blocks[block].parent else { return RegLayout::Blocked };
    let Some(owner) = f.regions[region].parent else { return RegLayout::Blocked };
    let od = &f.insts[owner];
    match od.op {
        Op::Control(ControlOp::For) => {
            f.blocks[block].args.get(k + 1).map(|&b| a.lay(b)).unwrap_or(RegLayout::Blocked)
        }
        Op::Control(ControlOp::If) => od.results.get(k).map(|&r| a.lay(r)).unwrap_or(RegLayout::Blocked),
        _ => RegLayout::Blocked,
    }
}

/// The layouts the results (and, for a `for`, the body arguments) of
/// `inst` should have, given the current assignment.
fn infer(
    f: &Function,
    plan: &MmaPlan,
    a: &Assignment,
    dot_layouts: &[MmaLayout],
    users: &FxHashMap<Value, Vec<Inst>>,
    inst: Inst,
) -> Vec<(Value, RegLayout)> {
    let d = &f.insts[inst];
    let one = |lay: RegLayout| d.results.first().map(|&r| vec![(r, lay)]).unwrap_or_default();
    let shape = |v: Value| f.ty(v).shape.to_vec();
    match &d.op {
        Op::Dot(_) => match plan.dots.get(&inst) {
            Some(l) => one(RegLayout::Mma(*l)),
            None => one(RegLayout::Blocked),
        },
        op if is_elementwise(op) => {
            let Some(&r) = d.results.first() else { return Vec::new() };
            let rs = shape(r);
            if rs.is_empty() {
                return one(RegLayout::Blocked);
            }
            let tiles: Vec<RegLayout> =
                d.args.iter().filter(|&&x| !is_uniform(f, x)).map(|&x| a.lay(x)).collect();
            let mma = tiles.iter().find_map(|l| match l {
                RegLayout::Mma(m) if rs == [m.m, m.n] => Some(RegLayout::Mma(*m)),
                _ => None,
            });
            let row = tiles.iter().find_map(|l| match l {
                RegLayout::Row(rl) if is_row_shape(&rs, rl.m) => Some(RegLayout::Row(*rl)),
                _ => None,
            });
            one(mma.or(row).or_else(|| pulled_row(f, plan, a, users, inst)).unwrap_or(RegLayout::Blocked))
        }
        Op::Memory(MemoryOp::Load { volatile: false, order: None, .. }) => {
            one(pulled_row(f, plan, a, users, inst).unwrap_or(RegLayout::Blocked))
        }
        Op::Reduce(o) => {
            let x = d.args[0];
            let ok = d.args.len() == 1
                && matches!(o.kind, ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min)
                && o.axis == 1
                && f.ty(x).rank() == 2;
            match a.lay(x) {
                RegLayout::Mma(l) if ok => one(RegLayout::Row(l.row())),
                _ => one(RegLayout::Blocked),
            }
        }
        Op::Shape(ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. }) => {
            let rs = shape(d.results[0]);
            match a.lay(d.args[0]) {
                RegLayout::Row(rl) if is_row_shape(&rs, rl.m) => one(RegLayout::Row(rl)),
                _ => one(pulled_row(f, plan, a, users, inst).unwrap_or(RegLayout::Blocked)),
            }
        }
        Op::Shape(ShapeOp::Broadcast { shape: out }) => {
            // An elementwise user that combines it with a tile in an
            // accumulator layout of its shape.
            let partner = || {
                users.get(&d.results[0]).into_iter().flatten().find_map(|&u| {
                    let ud = &f.insts[u];
                    is_elementwise(&ud.op).then_some(())?;
                    ud.args.iter().find_map(|&x| match a.lay(x) {
                        RegLayout::Mma(l) if [l.m, l.n] == [out[0], out[1]] => Some(l),
                        _ => None,
                    })
                })
            };
            match a.lay(d.args[0]) {
                RegLayout::Row(rl) if out.len() == 2 && shape(d.args[0]) == [rl.m, 1] => {
                    // That partner's layout when it has one (two products
                    // of one shape may differ, one with interleaved n tiles),
                    // else the first product of the shape.
                    let l = partner().filter(|l| l.row() == rl).or_else(|| {
                        dot_layouts.iter().find(|l| l.m == out[0] && l.n == out[1] && l.row() == rl).copied()
                    });
                    one(l.map_or(RegLayout::Blocked, RegLayout::Mma))
                }
                _ if out.len() == 2 && shape(d.args[0]) == [out[0], 1] => {
                    one(partner().map_or(RegLayout::Blocked, RegLayout::Mma))
                }
                _ => one(RegLayout::Blocked),
            }
        }
        Op::Shape(ShapeOp::Permute { order }) => match a.lay(d.args[0]) {
            RegLayout::Mma(l) if order.as_slice() == [1, 0] && l.regs() >= LARGE_ACC => {
                one(RegLayout::MmaT(l))
            }
            _ => one(RegLayout::Blocked),
        },
        Op::Control(ControlOp::For) => {
            let body = f.entry(d.regions[0]);
            let bargs = &f.blocks[body].args;
            let Some(&term) = f.blocks[body].insts.last() else { return Vec::new() };
            let yielded = &f.insts[term].args;
            let mut out = Vec::new();
            for (k, &y) in yielded.iter().enumerate() {
                let lay = if f.ty(y).rank() == 0 { RegLayout::Blocked } else { a.lay(y) };
                if let Some(&ba) = bargs.get(k + 1) {
                    out.push((ba, lay));
                }
                if let Some(&r) = d.results.get(k) {
                    out.push((r, lay));
                }
            }
            out
        }
        Op::Control(ControlOp::If) => {
            let ys: Vec<&[Value]> = d
                .regions
                .iter()
                .filter_map(|&r| {
                    let b = f.entry(r);
                    f.blocks[b].insts.last().map(|&t| f.insts[t].args.as_slice())
                })
                .collect();
            d.results
                .iter()
                .enumerate()
                .map(|(k, &r)| {
                    let lays: Vec<RegLayout> =
                        ys.iter().filter_map(|y| y.get(k)).map(|&v| a.lay(v)).collect();
                    let same = lays.len() == 2 && lays[0] == lays[1];
                    (r, if same { lays[0] } else { RegLayout::Blocked })
                })
                .collect()
        }
        _ => d.results.iter().map(|&r| (r, RegLayout::Blocked)).collect(),
    }
}

/// The row layout every user of `inst`'s result takes it in, when the
/// result can be computed in it without an exchange ([`row_able`]): a row
/// vector that is only scaled into accumulator tiles (`acc * expand_dims(s,
/// 1)` with `s` loaded) is then loaded, and computed, in the rows each
/// thread holds, instead of loaded blocked and exchanged through shared
/// memory at every use. Values computable from coordinates are left to
/// their users, which evaluate them in place (`remat.rs`).
fn pulled_row(
    f: &Function,
    plan: &MmaPlan,
    a: &Assignment,
    users: &FxHashMap<Value, Vec<Inst>>,
    inst: Inst,
) -> Option<RegLayout> {
    let d = &f.insts[inst];
    let &[r] = d.results.as_slice() else { return None };
    if super::remat::computable(f, r) || !row_able(f, a, r, &mut ROW_ABLE_NODES.clone()) {
        return None;
    }
    users_row(f, plan, a, users, r, true).filter(|rl| is_row_shape(&f.ty(r).shape, rl.m)).map(RegLayout::Row)
}

/// The one row layout every use of `v` takes it in (`None` when a use
/// takes another layout, or two take different rows). With `look_through`
/// a `for` body's `yield` of `v` counts as taking the layout every use of
/// the carried value takes (a scale loaded one iteration ahead), so that
/// the loop carries it in that layout.
fn users_row(
    f: &Function,
    plan: &MmaPlan,
    a: &Assignment,
    users: &FxHashMap<Value, Vec<Inst>>,
    v: Value,
    look_through: bool,
) -> Option<RowLayout> {
    let mut want = None;
    for &u in users.get(&v)? {
        for (k, _) in f.insts[u].args.iter().enumerate().filter(|&(_, &x)| x == v) {
            let rl = match wants(f, plan, a, u, k) {
                RegLayout::Row(rl) => rl,
                RegLayout::Blocked if look_through => {
                    let b = carried_arg(f, u, k)?;
                    users_row(f, plan, a, users, b, false)?
                }
                _ => return None,
            };
            if want.is_some_and(|w| w != rl) {
                return None;
            }
            want = Some(rl);
        }
    }
    want
}

/// The body argument that the `k`-th operand of `y` carries into the next
/// iteration, when `y` is the `yield` of a `for` body.
fn carried_arg(f: &Function, y: Inst, k: usize) -> Option<Value> {
    let block = f.insts[y].parent?;
    let owner = f.regions[f.blocks[block].parent?].parent?;
    let is_for = matches!(f.insts[owner].op, Op::Control(ControlOp::For));
    (is_for && f.insts[y].op == Op::Control(ControlOp::Yield))
        .then(|| f.blocks[block].args.get(k + 1).copied())?
}

/// Ops in the expression tree [`row_able`] follows before it gives up.
const ROW_ABLE_NODES: usize = 32;

/// True when `v` (a row vector `[M]` or `[M, 1]`) can be computed in a row
/// layout from values that need no exchange there: uniform values, values
/// already in a row layout, values computable from coordinates, and plain
/// loads, elementwise ops, `expand_dims` and `reshape` of such values.
fn row_able(f: &Function, a: &Assignment, v: Value, budget: &mut usize) -> bool {
    if is_uniform(f, v) || matches!(a.lay(v), RegLayout::Row(_)) || super::remat::computable(f, v) {
        return true;
    }
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    let Some(i) = f.def_inst(v) else {
        // A value a `for` carries: its initial and its yielded values.
        let dsl_core::ir::ValueDef::BlockArg(b, j) = f.values[v].def else { return false };
        let j = j as usize;
        let Some(owner) = f.blocks[b].parent.and_then(|r| f.regions[r].parent) else { return false };
        let Some(&y) = f.blocks[b].insts.last() else { return false };
        return j >= 1
            && matches!(f.insts[owner].op, Op::Control(ControlOp::For))
            && f.insts[owner].args.get(j + 2).is_some_and(|&x| row_able(f, a, x, budget))
            && f.insts[y].args.get(j - 1).is_some_and(|&x| row_able(f, a, x, budget));
    };
    let d = &f.insts[i];
    let row_shaped = matches!(f.ty(v).shape.as_slice(), [_] | [_, 1]);
    match &d.op {
        Op::Memory(MemoryOp::Load { volatile: false, order: None, .. })
        | Op::Shape(ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. }) => {
            row_shaped && d.args.iter().all(|&x| row_able(f, a, x, budget))
        }
        op if is_elementwise(op) => row_shaped && d.args.iter().all(|&x| row_able(f, a, x, budget)),
        _ => false,
    }
}

/// True for `[m]` and `[m, 1]`.
fn is_row_shape(s: &[usize], m: usize) -> bool {
    match s {
        [x] => *x == m,
        [x, 1] => *x == m,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::dot::plan::plan;
    use dsl_core::DType;

    /// The canonicalized FlashAttention kernel (head dim 64, `BLOCK_M` 64,
    /// `BLOCK_N` 32, causal) and its plan for 4 warps.
    fn flash(causal: bool) -> (Function, MmaPlan) {
        use kernels::flash_attention::flash_attention as k;
        let c = k::Config::new(DType::BF16, 9, 3, 64, 16, 64, 32, causal, false, false, false);
        let mut f = k::build(&c).unwrap();
        dsl_core::passes::canonicalize::canonicalize(&mut f);
        let p = plan(&f, 4, crate::Target::Sm90a, 2);
        (f, p)
    }

    #[test]
    fn flash_attention_softmax_stays_in_the_accumulator_layout() {
        let (f, p) = flash(true);
        let a = assign(&f, &p, &FxHashSet::default());
        let mut fors = Vec::new();
        f.walk(|i| {
            if matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
                fors.push(i);
            }
        });
        assert_eq!(fors.len(), 2, "two key loops");
        for &fi in &fors {
            let body = f.entry(f.insts[fi].regions[0]);
            let lays: Vec<RegLayout> = f.blocks[body].args[1..].iter().map(|&b| a.lay(b)).collect();
            let rows = lays.iter().filter(|l| matches!(l, RegLayout::Row(_))).count();
            let mmas = lays.iter().filter(|l| matches!(l, RegLayout::Mma(_))).count();
            assert_eq!((rows, mmas), (2, 1), "carried m, l in rows and acc in the mma layout: {lays:?}");
            // The second dot of the body takes `p` from registers.
            let dots: Vec<Inst> =
                f.blocks[body].insts.iter().copied().filter(|i| p.dots.contains_key(i)).collect();
            assert_eq!(dots.len(), 2);
            let l2 = p.dots[&dots[1]];
            let pa = a.lay(f.insts[dots[1]].args[0]);
            assert!(a_from_regs(pa, &l2), "p in {pa:?}, dot in {l2:?}");
            // Nothing of the loop's softmax needs a blocked copy but the causal mask's inputs.
            for &i in &f.blocks[body].insts {
                for &r in &f.insts[i].results {
                    assert!(!a.needs_blocked.contains(&r), "{} needs a blocked copy", f.insts[i].op.name());
                }
            }
        }
    }
}
