//! Rows of a tile that nothing observable reads: their registers are not
//! computed.
//!
//! A decode tile pads its query rows to a tensor-core height (the 3 or 4
//! query heads of a KV head in a 16-row `mma` tile, or a 64-row `wgmma`
//! one), and the padding rows go through the whole softmax like the real
//! ones although their results are never stored. The rows of such a tile
//! never mix: elementwise math, a reduction along the columns, a `dot`'s
//! left operand and accumulator keep each row apart. So a row is *live*
//! when it reaches a side effect through such ops only; a row that a store
//! masks off for certain (its mask a function of the row index and
//! constants that is false there) is not.
//!
//! The analysis runs backwards to a fixed point (a `for` carries its
//! values' rows into the next iteration and out of the loop); anything it
//! does not model makes every row of its operands live. A register slot of
//! a value in a tensor-core accumulator layout or its row slice is dead
//! when its row is dead in every thread (for a `[64, N]` tile of three real
//! rows, the rows `g + 8` each thread holds); the lowering leaves such a
//! slot undefined in the results of elementwise and shape ops, so LLVM
//! drops the instructions that computed it. Live rows keep their exact
//! values: nothing a live row reads comes from a dead one.

use super::assign::{Assignment, is_elementwise};
use crate::fragment::RegLayout;
use dsl_core::Function;
use dsl_core::ir::ops::{
    ArithOp, BinaryOp, CmpPred, CompareOp, ControlOp, CreationOp, MemoryOp, ReduceKind, ShapeOp,
};
use dsl_core::ir::{Inst, Op, Value, ValueDef};
use rustc_hash::FxHashMap;

/// Rounds of the backward pass before the analysis gives up (every row
/// live): loop nests converge in a few.
const MAX_ROUNDS: usize = 16;

/// The dead register slots of the values held in a tensor-core layout
/// (only values with at least one).
#[derive(Debug, Default)]
pub(crate) struct DeadRows {
    /// For each such value, one flag per register slot of its layout.
    pub slots: FxHashMap<Value, Vec<bool>>,
}

/// Finds the dead rows of `f`'s tiles and the register slots they make
/// dead in the layouts `lays` over `threads` threads.
pub(crate) fn plan(f: &Function, lays: &Assignment, threads: usize) -> DeadRows {
    let Some(live) = live_rows(f) else { return DeadRows::default() };
    let mut out = DeadRows::default();
    for (&v, &lay) in &lays.lays {
        let Some(rows) = live.get(&v) else { continue };
        let shape = f.ty(v).shape.as_slice();
        let dead: Vec<bool> = match lay {
            RegLayout::Mma(l) if shape == [l.m, l.n] => {
                (0..l.regs()).map(|s| (0..threads).all(|t| !rows[l.coord(t, s).0])).collect()
            }
            RegLayout::Row(r) if matches!(shape, [m] | [m, 1] if *m == r.m) => {
                (0..r.regs()).map(|s| (0..threads).all(|t| !rows[r.row_of(t, s)])).collect()
            }
            _ => continue,
        };
        if dead.iter().any(|&d| d) {
            out.slots.insert(v, dead);
        }
    }
    out
}

/// The live rows of every value of rank 1 or 2 (indexed by its first
/// dimension), or `None` when the pass did not converge.
fn live_rows(f: &Function) -> Option<FxHashMap<Value, Vec<bool>>> {
    let mut order = Vec::new();
    f.walk(|i| order.push(i));
    let mut live: FxHashMap<Value, Vec<bool>> = FxHashMap::default();
    for v in f.values.keys() {
        let ty = f.ty(v);
        if matches!(ty.rank(), 1 | 2) {
            live.insert(v, vec![false; ty.shape[0]]);
        }
    }
    for _ in 0..MAX_ROUNDS {
        let mut changed = false;
        for &i in order.iter().rev() {
            for (k, need) in needs(f, &live, i) {
                let arg = f.insts[i].args[k];
                changed |= merge(&mut live, arg, &need);
            }
            // Loop-carried values: a body argument's rows are what its
            // `yield` operand must provide, and the initial value's.
            if matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
                changed |= carry(f, &mut live, i);
            }
        }
        if !changed {
            return Some(live);
        }
    }
    None
}

/// What one use needs of an operand: its rows (`Rows`) or all of them.
enum Need {
    All,
    Rows(Vec<bool>),
}

/// Ors `need` into the live rows of `v`; true when they grew.
fn merge(live: &mut FxHashMap<Value, Vec<bool>>, v: Value, need: &Need) -> bool {
    let Some(rows) = live.get_mut(&v) else { return false };
    let mut grew = false;
    for (j, r) in rows.iter_mut().enumerate() {
        let want = match need {
            Need::All => true,
            Need::Rows(n) => n.get(j).copied().unwrap_or(true),
        };
        if want && !*r {
            *r = true;
            grew = true;
        }
    }
    grew
}

/// A `for`'s initial values and its body's arguments and `yield`: the
/// arguments need what the results and the `yield` operands need, both
/// ways.
fn carry(f: &Function, live: &mut FxHashMap<Value, Vec<bool>>, fi: Inst) -> bool {
    let d = &f.insts[fi];
    let body = f.entry(d.regions[0]);
    let Some(&y) = f.blocks[body].insts.last() else { return false };
    let mut changed = false;
    // Operands: lower bound, upper bound, step, then the initial values.
    for (k, &res) in d.results.iter().enumerate() {
        let (Some(&init), Some(&arg), Some(&yv)) =
            (d.args.get(3 + k), f.blocks[body].args.get(k + 1), f.insts[y].args.get(k))
        else {
            continue;
        };
        let mut need = live.get(&res).cloned();
        if let (Some(n), Some(a)) = (need.as_mut(), live.get(&arg)) {
            for (x, &b) in n.iter_mut().zip(a) {
                *x |= b;
            }
        }
        if let Some(n) = need {
            let need = Need::Rows(n);
            changed |= merge(live, init, &need);
            changed |= merge(live, yv, &need);
            changed |= merge(live, arg, &need);
        }
    }
    changed
}

/// The rows instruction `i` needs of each of its operands, given the live
/// rows of its results.
fn needs(f: &Function, live: &FxHashMap<Value, Vec<bool>>, i: Inst) -> Vec<(usize, Need)> {
    let d = &f.insts[i];
    let all = || (0..d.args.len()).map(|k| (k, Need::All)).collect::<Vec<_>>();
    // The result's live rows, when it has exactly one tracked result.
    let res_rows = || d.results.first().and_then(|r| live.get(r)).cloned();
    match &d.op {
        // The `for` itself: its bounds; its carried values go through `carry`.
        Op::Control(ControlOp::For) => (0..d.args.len().min(3)).map(|k| (k, Need::All)).collect(),
        // Other ops of several results (`split`, say) keep every row of
        // their operands.
        _ if d.results.len() > 1 => all(),
        // A `for` body's `yield` is handled by `carry`.
        Op::Control(ControlOp::Yield) if is_for_body(f, i) => Vec::new(),
        Op::Memory(MemoryOp::Store { has_mask, .. }) => {
            let mut out = all();
            if *has_mask && d.args.len() == 3 {
                let rows = f.ty(d.args[1]).shape.first().copied().unwrap_or(0);
                if let Some(masked) = rows_off(f, d.args[2], rows) {
                    out[1] = (1, Need::Rows(masked.iter().map(|&off| !off).collect()));
                }
            }
            out
        }
        op if is_elementwise(op) => {
            let Some(rr) = res_rows() else { return all() };
            let rshape = &f.ty(d.results[0]).shape;
            d.args
                .iter()
                .enumerate()
                .map(|(k, &a)| {
                    let ashape = &f.ty(a).shape;
                    // A broadcast operand (a scalar, a `[1, N]` row) holds
                    // every row's values.
                    let need = if ashape.len() == rshape.len() && ashape.first() == rshape.first() {
                        Need::Rows(rr.clone())
                    } else {
                        Need::All
                    };
                    (k, need)
                })
                .collect()
        }
        Op::Shape(s) => {
            let Some(rr) = res_rows() else { return all() };
            let a = d.args[0];
            let (ashape, rshape) = (&f.ty(a).shape, &f.ty(d.results[0]).shape);
            let row_wise = match s {
                ShapeOp::ExpandDims { axis } => *axis >= 1 && ashape.first() == rshape.first(),
                ShapeOp::Broadcast { .. } => ashape.first() == rshape.first(),
                ShapeOp::Reshape { .. } => {
                    // `[M]` <-> `[M, 1]`: the same rows.
                    let m = |sh: &[usize]| match sh {
                        [m] | [m, 1] => Some(*m),
                        _ => None,
                    };
                    m(ashape).is_some() && m(ashape) == m(rshape)
                }
                _ => false,
            };
            if row_wise { vec![(0, Need::Rows(rr))] } else { all() }
        }
        Op::Reduce(r) if r.kind != ReduceKind::Custom && f.ty(d.args[0]).rank() == 2 && r.axis == 1 => {
            match res_rows() {
                Some(rr) => (0..d.args.len()).map(|k| (k, Need::Rows(rr.clone()))).collect(),
                None => all(),
            }
        }
        Op::Dot(_) => match res_rows() {
            // `a` and the accumulator by rows; `b` wholly.
            Some(rr) => vec![(0, Need::Rows(rr.clone())), (1, Need::All), (2, Need::Rows(rr))],
            None => all(),
        },
        _ => all(),
    }
}

/// True when `y` is the `yield` of a `for` body.
fn is_for_body(f: &Function, y: Inst) -> bool {
    let Some(block) = f.insts[y].parent else { return false };
    let Some(owner) = f.blocks[block].parent.and_then(|r| f.regions[r].parent) else { return false };
    matches!(f.insts[owner].op, Op::Control(ControlOp::For))
}

/// For a mask `m` of a tile of `rows` rows: the rows where it is false in
/// every column for certain (it depends there on the row index and
/// constants only), or `None` when it cannot tell any.
fn rows_off(f: &Function, m: Value, rows: usize) -> Option<Vec<bool>> {
    let vals = match eval(f, m, 0)? {
        RowVals::Uniform(v) => vec![v; rows],
        RowVals::Rows(v) if v.len() == rows => v,
        RowVals::Rows(_) => return None,
    };
    let off: Vec<bool> = vals.iter().map(|v| *v == Some(0)).collect();
    off.iter().any(|&x| x).then_some(off)
}

/// The value of an integer or boolean tile as a function of its row alone.
#[derive(Clone)]
enum RowVals {
    /// The same in every element (`None`: unknown).
    Uniform(Option<i64>),
    /// One per row, the same along the row (`None`: unknown there).
    Rows(Vec<Option<i64>>),
}

impl RowVals {
    fn at(&self, r: usize) -> Option<i64> {
        match self {
            RowVals::Uniform(v) => *v,
            RowVals::Rows(v) => v.get(r).copied().flatten(),
        }
    }

    fn len(&self) -> Option<usize> {
        match self {
            RowVals::Uniform(_) => None,
            RowVals::Rows(v) => Some(v.len()),
        }
    }
}

/// Evaluates `v` row by row where it depends on the row index and
/// constants only (`depth` bounds the expression walked).
fn eval(f: &Function, v: Value, depth: usize) -> Option<RowVals> {
    if depth > 24 {
        return None;
    }
    let unknown = Some(RowVals::Uniform(None));
    let Some(i) = f.def_inst(v) else {
        return if matches!(f.values[v].def, ValueDef::BlockArg(..)) { unknown } else { None };
    };
    let d = &f.insts[i];
    let ty = f.ty(v);
    match &d.op {
        Op::Creation(CreationOp::Const(s)) => Some(RowVals::Uniform(Some(s.as_i64()))),
        Op::Creation(CreationOp::Full { value, .. }) => Some(RowVals::Uniform(Some(value.as_i64()))),
        Op::Creation(CreationOp::Splat { .. }) => match eval(f, d.args[0], depth + 1)? {
            RowVals::Uniform(x) => Some(RowVals::Uniform(x)),
            RowVals::Rows(_) => unknown,
        },
        Op::Creation(CreationOp::Arange { start, end }) if ty.rank() == 1 => {
            Some(RowVals::Rows((*start..*end).map(|x| Some(i64::from(x))).collect()))
        }
        Op::Shape(ShapeOp::ExpandDims { axis }) => match eval(f, d.args[0], depth + 1)? {
            RowVals::Rows(r) if *axis >= 1 => Some(RowVals::Rows(r)),
            RowVals::Rows(_) => unknown,
            u => Some(u),
        },
        // A broadcast along the columns, or `[M]` <-> `[M, 1]`: the same rows.
        Op::Shape(ShapeOp::Broadcast { .. } | ShapeOp::Reshape { .. }) => {
            let a = d.args[0];
            let same_rows = f.ty(a).shape.first() == ty.shape.first();
            match eval(f, a, depth + 1)? {
                RowVals::Rows(r) if same_rows => Some(RowVals::Rows(r)),
                RowVals::Rows(_) => unknown,
                u => Some(u),
            }
        }
        Op::Compare(CompareOp::Cmp(p)) => {
            let (a, b) = (eval(f, d.args[0], depth + 1)?, eval(f, d.args[1], depth + 1)?);
            Some(zip(&a, &b, |x, y| {
                let (x, y) = (x?, y?);
                Some(i64::from(match p {
                    CmpPred::Eq => x == y,
                    CmpPred::Ne => x != y,
                    CmpPred::Lt => x < y,
                    CmpPred::Le => x <= y,
                    CmpPred::Gt => x > y,
                    CmpPred::Ge => x >= y,
                }))
            }))
        }
        Op::Arith(ArithOp::Binary(b)) if ty.dtype().is_int() || ty.dtype().is_bool() => {
            let (x, y) = (eval(f, d.args[0], depth + 1)?, eval(f, d.args[1], depth + 1)?);
            let both = |g: fn(i64, i64) -> i64| zip(&x, &y, move |p, q| Some(g(p?, q?)));
            match b {
                // False on either side is false whatever the other is.
                BinaryOp::And => Some(zip(&x, &y, |p, q| match (p, q) {
                    (Some(0), _) | (_, Some(0)) => Some(0),
                    (Some(p), Some(q)) => Some(p & q),
                    _ => None,
                })),
                BinaryOp::Or => Some(both(|p, q| p | q)),
                BinaryOp::Add => Some(both(|p, q| p.wrapping_add(q))),
                BinaryOp::Sub => Some(both(|p, q| p.wrapping_sub(q))),
                BinaryOp::Mul => Some(both(|p, q| p.wrapping_mul(q))),
                _ => unknown,
            }
        }
        _ => unknown,
    }
}

/// Combines two row-wise values element by element.
fn zip(a: &RowVals, b: &RowVals, g: impl Fn(Option<i64>, Option<i64>) -> Option<i64>) -> RowVals {
    match a.len().or(b.len()) {
        None => RowVals::Uniform(g(a.at(0), b.at(0))),
        Some(n) => {
            if a.len().is_some_and(|m| m != n) || b.len().is_some_and(|m| m != n) {
                return RowVals::Uniform(None);
            }
            RowVals::Rows((0..n).map(|r| g(a.at(r), b.at(r))).collect())
        }
    }
}
