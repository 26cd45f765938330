//! Canonicalization: constant folding, exact algebraic simplification, control
//! flow with constant conditions or trip counts, CSE ([`super::cse`]) and DCE
//! ([`super::dce`]), iterated to a fixed point.
//!
//! Folding follows the IR's numeric semantics through [`super::eval`]: results
//! are rounded to their dtype, unsigned integers wrap, and ops the interpreter
//! reports as errors (signed overflow, integer division by zero) are left in
//! place so that it still reports them. Transcendentals are not folded (the GPU
//! evaluates them approximately). Simplifications are exact for every input,
//! NaNs and signed zeros included: `x + -0.0` folds but `x + 0.0` does not, and
//! `x * 0` folds for integers only.
//!
//! Invariants: the IR stays valid (verifiable) after every step; a folded op is
//! rewritten in place into `const`/`full`, so it keeps its location; an op that
//! simplifies to an existing value has its uses redirected and is left for DCE;
//! nothing with side effects is removed, except code that provably never runs
//! (the untaken branch of a constant `if`, the body of a zero-trip `for`).

use super::{cse, dce, eval};
use crate::dtype::DType;
use crate::ir::ops::{
    ArithOp, BinaryOp, CastOp, CmpPred, CompareOp, ControlOp, CreationOp, ReduceKind, ShapeOp,
};
use crate::ir::{Block, Function, Inst, Op, Region, Scalar, Value};
use rustc_hash::FxHashMap;

/// Upper bound on fold/CSE/DCE rounds (each round that changes nothing ends it).
const MAX_ROUNDS: usize = 32;

/// What [`canonicalize`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CanonicalizeStats {
    /// Ops rewritten into constants.
    pub folded: usize,
    /// Ops replaced by one of their operands (or another existing value), and
    /// control flow simplified (constant `if`, zero- and one-trip `for`).
    pub simplified: usize,
    /// Ops merged by CSE.
    pub merged: usize,
    /// Instructions removed and control-flow results pruned by DCE.
    pub removed: usize,
    /// Rounds run (the last one changed nothing, unless the cap was reached).
    pub rounds: usize,
}

impl CanonicalizeStats {
    fn changes(&self) -> usize {
        self.folded + self.simplified + self.merged + self.removed
    }
}

/// Canonicalizes `f` in place until nothing changes; returns what was done.
pub fn canonicalize(f: &mut Function) -> CanonicalizeStats {
    let mut stats = CanonicalizeStats::default();
    while stats.rounds < MAX_ROUNDS {
        stats.rounds += 1;
        let before = stats.changes();
        fold(f, &mut stats);
        stats.simplified += simplify_control(f);
        stats.merged += cse::cse(f);
        stats.removed += dce::dce(f);
        if stats.changes() == before {
            break;
        }
    }
    stats
}

/// The outcome of folding one instruction.
enum Folded {
    /// Its (single) result is this constant.
    Const(Scalar),
    /// Its (single) result equals this existing value.
    Value(Value),
}

/// One folding sweep over every reachable instruction, in program order.
fn fold(f: &mut Function, stats: &mut CanonicalizeStats) {
    let mut order = Vec::new();
    f.walk(|i| order.push(i));
    let mut subst: FxHashMap<Value, Value> = FxHashMap::default();
    for i in order {
        for a in f.insts[i].args.iter_mut() {
            if let Some(&n) = subst.get(a) {
                *a = n;
            }
        }
        if f.insts[i].results.len() != 1 || !f.insts[i].regions.is_empty() {
            continue;
        }
        match fold_inst(f, i) {
            Some(Folded::Const(s)) => {
                set_constant(f, i, s);
                stats.folded += 1;
            }
            Some(Folded::Value(v)) => {
                subst.insert(f.result(i), v);
                stats.simplified += 1;
            }
            None => {}
        }
    }
}

/// Rewrites instruction `i` in place into a `const` (scalar result) or `full`
/// (tile result) of `s`, which has the result's dtype.
fn set_constant(f: &mut Function, i: Inst, s: Scalar) {
    let ty = f.ty(f.result(i));
    debug_assert_eq!(ty.elem, crate::dtype::Elem::Scalar(s.dtype()));
    let op = if ty.is_scalar() {
        Op::Creation(CreationOp::Const(s))
    } else {
        Op::Creation(CreationOp::Full { value: s, shape: ty.shape.clone() })
    };
    f.insts[i].op = op;
    f.insts[i].args.clear();
}

/// The all-ones value of an integer dtype (`true` for `i1`, `-1` for signed).
fn all_ones(d: DType) -> i64 {
    d.wrap_int(-1)
}

fn is_int_value(s: Scalar, v: i64) -> bool {
    s.dtype().is_int() && s.as_i64() == v
}

/// Folds or simplifies one single-result instruction without regions.
fn fold_inst(f: &Function, i: Inst) -> Option<Folded> {
    let data = &f.insts[i];
    let args = &data.args;
    let c = |k: usize| args.get(k).and_then(|&a| f.as_constant(a));
    let out = f.ty(data.results[0]);
    match &data.op {
        Op::Creation(CreationOp::Splat { .. }) => c(0).map(Folded::Const),
        Op::Shape(ShapeOp::ExpandDims { .. } | ShapeOp::Broadcast { .. } | ShapeOp::Reshape { .. })
        | Op::Shape(ShapeOp::Permute { .. }) => c(0).map(Folded::Const),
        Op::Shape(ShapeOp::Join) => match (c(0), c(1)) {
            (Some(a), Some(b)) if a == b => Some(Folded::Const(a)),
            _ => None,
        },
        Op::Arith(ArithOp::Binary(b)) => {
            if let (Some(x), Some(y)) = (c(0), c(1)) {
                return eval::binary(*b, x, y).map(Folded::Const);
            }
            simplify_binary(*b, args[0], args[1], c(0), c(1), out.dtype())
        }
        Op::Arith(ArithOp::Unary(u)) => c(0).and_then(|x| eval::unary(*u, x)).map(Folded::Const),
        Op::Arith(ArithOp::Fma) => match (c(0), c(1), c(2)) {
            (Some(x), Some(y), Some(z)) => eval::fma(x, y, z).map(Folded::Const),
            _ => None,
        },
        Op::Arith(ArithOp::AddPtr) => c(1).filter(|s| s.is_zero()).map(|_| Folded::Value(args[0])),
        Op::Compare(CompareOp::Cmp(p)) => {
            if let (Some(x), Some(y)) = (c(0), c(1)) {
                return eval::compare(*p, x, y).map(|r| Folded::Const(Scalar::bool(r)));
            }
            // `x op x` is decided for integers and pointers (floats may be NaN).
            if args[0] == args[1] && !f.ty(args[0]).is_float() {
                let r = matches!(p, CmpPred::Eq | CmpPred::Le | CmpPred::Ge);
                return Some(Folded::Const(Scalar::bool(r)));
            }
            None
        }
        Op::Compare(CompareOp::Select) => {
            if let Some(cond) = c(0) {
                return Some(Folded::Value(if cond.is_zero() { args[2] } else { args[1] }));
            }
            if args[1] == args[2] {
                return Some(Folded::Value(args[1]));
            }
            // `select c, true, false` is `c`.
            match (c(1), c(2)) {
                (Some(t), Some(e)) if out.is_bool() && t.is_one() && e.is_zero() => {
                    Some(Folded::Value(args[0]))
                }
                _ => None,
            }
        }
        Op::Cast(CastOp::Cast { to }) => {
            if f.ty(args[0]).dtype() == *to {
                return Some(Folded::Value(args[0]));
            }
            c(0).and_then(|x| eval::cast(*to, x)).map(Folded::Const)
        }
        Op::Cast(CastOp::Bitcast { to }) => {
            if f.ty(args[0]).dtype() == *to {
                return Some(Folded::Value(args[0]));
            }
            c(0).and_then(|x| eval::bitcast(*to, x)).map(Folded::Const)
        }
        Op::Cast(CastOp::PtrCast { to }) => (f.ty(args[0]).dtype() == *to).then_some(Folded::Value(args[0])),
        Op::Reduce(r) if args.len() == 1 => {
            let x = c(0)?;
            let n = f.ty(args[0]).shape.get(r.axis).copied()? as i64;
            match r.kind {
                ReduceKind::Max | ReduceKind::Min => Some(Folded::Const(x)),
                ReduceKind::Argmax | ReduceKind::Argmin if !x.as_f64().is_nan() => {
                    Some(Folded::Const(Scalar::int(DType::I32, 0)))
                }
                // The partial sums of an integer `full` lie between 0 and n*x, so
                // the sum overflows exactly when n*x does.
                ReduceKind::Sum if x.dtype().is_int() => {
                    eval::int_binary(BinaryOp::Mul, x.dtype(), x.as_i64(), n)
                        .map(|v| Folded::Const(Scalar::int(x.dtype(), v)))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Exact identities of a binary op with at most one constant operand.
fn simplify_binary(
    op: BinaryOp,
    a: Value,
    b: Value,
    ca: Option<Scalar>,
    cb: Option<Scalar>,
    d: DType,
) -> Option<Folded> {
    let int = d.is_int();
    let zero = Some(Folded::Const(Scalar::zero(d)));
    let is = |s: Option<Scalar>, pred: &dyn Fn(Scalar) -> bool| s.is_some_and(pred);
    let int_zero = |s: Scalar| is_int_value(s, 0);
    let int_ones = |s: Scalar| is_int_value(s, all_ones(d));
    let neg_zero = |s: Scalar| s.dtype().is_float() && s.is_zero() && s.as_f64().is_sign_negative();
    let pos_zero = |s: Scalar| s.dtype().is_float() && s.is_zero() && s.as_f64().is_sign_positive();
    let one = |s: Scalar| s.is_one();
    match op {
        BinaryOp::Add => {
            // x + 0 for integers; x + (-0.0) for floats (x + 0.0 turns -0.0 into +0.0).
            let neutral = |s: Scalar| if int { int_zero(s) } else { neg_zero(s) };
            if is(cb, &neutral) {
                return Some(Folded::Value(a));
            }
            if is(ca, &neutral) {
                return Some(Folded::Value(b));
            }
        }
        BinaryOp::Sub => {
            let neutral = |s: Scalar| if int { int_zero(s) } else { pos_zero(s) };
            if is(cb, &neutral) {
                return Some(Folded::Value(a));
            }
            if int && a == b {
                return zero;
            }
        }
        BinaryOp::Mul => {
            if is(cb, &one) {
                return Some(Folded::Value(a));
            }
            if is(ca, &one) {
                return Some(Folded::Value(b));
            }
            if int && (is(ca, &int_zero) || is(cb, &int_zero)) {
                return zero;
            }
        }
        BinaryOp::Div if int && is(cb, &one) => return Some(Folded::Value(a)),
        BinaryOp::Rem if int && is(cb, &one) => return zero,
        BinaryOp::And => {
            if is(ca, &int_zero) || is(cb, &int_zero) {
                return zero;
            }
            if is(cb, &int_ones) || a == b {
                return Some(Folded::Value(a));
            }
            if is(ca, &int_ones) {
                return Some(Folded::Value(b));
            }
        }
        BinaryOp::Or => {
            if is(ca, &int_ones) || is(cb, &int_ones) {
                return Some(Folded::Const(Scalar::int(d, all_ones(d))));
            }
            if is(cb, &int_zero) || a == b {
                return Some(Folded::Value(a));
            }
            if is(ca, &int_zero) {
                return Some(Folded::Value(b));
            }
        }
        BinaryOp::Xor => {
            if is(cb, &int_zero) {
                return Some(Folded::Value(a));
            }
            if is(ca, &int_zero) {
                return Some(Folded::Value(b));
            }
            if a == b {
                return zero;
            }
        }
        BinaryOp::Shl | BinaryOp::Shr if is(cb, &int_zero) => return Some(Folded::Value(a)),
        BinaryOp::Min | BinaryOp::Max if a == b => return Some(Folded::Value(a)),
        _ => {}
    }
    None
}

/// Simplifies control flow whose behavior is known: `if` on a constant is
/// replaced by the taken branch; a `for` with constant bounds and a positive
/// constant step that runs zero times is replaced by its initial values, and
/// one that runs once by its body. Returns the number of ops simplified.
fn simplify_control(f: &mut Function) -> usize {
    let mut candidates = Vec::new();
    f.walk(|i| {
        if matches!(f.insts[i].op, Op::Control(ControlOp::If | ControlOp::For)) {
            candidates.push(i);
        }
    });
    let mut n = 0;
    for i in candidates {
        // An earlier simplification may have detached it (or the region holding it).
        if !is_reachable(f, i) {
            continue;
        }
        let args = f.insts[i].args.clone();
        match f.insts[i].op {
            Op::Control(ControlOp::If) => {
                let Some(cond) = f.as_constant(args[0]) else { continue };
                let taken = f.insts[i].regions[if cond.is_zero() { 1 } else { 0 }];
                inline_region(f, i, taken, &FxHashMap::default());
                n += 1;
            }
            Op::Control(ControlOp::For) => {
                let (Some(lb), Some(ub), Some(step)) =
                    (f.as_constant(args[0]), f.as_constant(args[1]), f.as_constant(args[2]))
                else {
                    continue;
                };
                let (lb_v, ub_v, step_v) = (lb.as_i64(), ub.as_i64(), step.as_i64());
                if step_v <= 0 {
                    continue;
                }
                let body = f.insts[i].regions[0];
                let block_args = f.blocks[f.entry(body)].args.clone();
                if lb_v >= ub_v {
                    // Zero trips: the results are the initial values.
                    let results = f.insts[i].results.clone();
                    detach(f, i);
                    for (k, r) in results.into_iter().enumerate() {
                        f.replace_all_uses(r, args[3 + k]);
                    }
                    n += 1;
                } else if i128::from(lb_v) + i128::from(step_v) >= i128::from(ub_v) {
                    // One trip, with the induction variable equal to the lower bound.
                    let map: FxHashMap<Value, Value> = block_args
                        .iter()
                        .copied()
                        .zip(args.iter().copied().take(1).chain(args[3..].iter().copied()))
                        .collect();
                    inline_region(f, i, body, &map);
                    n += 1;
                }
            }
            _ => {}
        }
    }
    n
}

/// True when instruction `i` is still reachable from the body.
fn is_reachable(f: &Function, mut i: Inst) -> bool {
    loop {
        let Some(b) = f.insts[i].parent else { return false };
        if !f.blocks[b].insts.contains(&i) {
            return false;
        }
        let Some(r) = f.blocks[b].parent else { return false };
        if r == f.body {
            return true;
        }
        match f.regions[r].parent {
            Some(owner) => i = owner,
            None => return false,
        }
    }
}

/// Removes instruction `i` from its block.
fn detach(f: &mut Function, i: Inst) {
    if let Some(b) = f.insts[i].parent.take() {
        f.blocks[b].insts.retain(|&x| x != i);
    }
}

/// Replaces the region-owning instruction `owner` by the instructions of its
/// region `r` (minus the terminator): block arguments are replaced by `args`
/// and the owner's results by the terminator's operands.
fn inline_region(f: &mut Function, owner: Inst, r: Region, args: &FxHashMap<Value, Value>) {
    let parent: Block = f.insts[owner].parent.expect("a reachable instruction has a block");
    let pos = f.blocks[parent].insts.iter().position(|&x| x == owner).expect("owner is in its block");
    let b = f.entry(r);
    let mut body = std::mem::take(&mut f.blocks[b].insts);
    let term = body.pop().expect("an op region ends with a terminator");
    for &i in &body {
        f.insts[i].parent = Some(parent);
    }
    f.blocks[parent].insts.splice(pos..=pos, body);
    f.insts[owner].parent = None;
    for (&from, &to) in args {
        f.replace_all_uses(from, to);
    }
    let yielded: Vec<Value> = f.insts[term].args.iter().map(|v| args.get(v).copied().unwrap_or(*v)).collect();
    let results = f.insts[owner].results.clone();
    for (r, y) in results.into_iter().zip(yielded) {
        f.replace_all_uses(r, y);
    }
}
