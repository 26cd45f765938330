//! Structured control flow (`for_range`, `if_else`, `while_loop`), device
//! assert/print and axis-analysis hints.

use super::{Operand, Tensor, literal};
use crate::builder::padding::Extents;
use crate::builder::{build_region, build_region_padded, computation_type, with_ctx};
use crate::dtype::{DType, Type};
use crate::ir::ops::{CmpPred, CompareOp, ControlOp, DebugOp, HintOp, ProgramOp};
use crate::ir::{Inst, Op, Value};
use crate::loc::Location;

/// A counted loop `for iv in (lb..ub).step_by(step)` with loop-carried values.
///
/// `body` receives the induction variable and the current carried values and
/// returns the next carried values (same types as `init`). Returns the final
/// carried values. Bounds may be Rust integers or integer scalars; they are
/// promoted to one integer type (i32 unless a bound is wider).
#[track_caller]
pub fn for_range(
    lb: impl Into<Operand>,
    ub: impl Into<Operand>,
    step: impl Into<Operand>,
    init: &[Tensor],
    body: impl FnOnce(Tensor, &[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let loc = Location::caller();
    let bounds = [lb.into(), ub.into(), step.into()];
    let (inst, arg_tys, results, logical) = with_ctx(|c| {
        let mut d = DType::I32;
        for b in bounds {
            if let Operand::Tensor(t) = b {
                c.check(t);
                let ty = c.func.ty(t.value()).clone();
                if !ty.is_scalar() || !ty.is_int() || ty.is_bool() {
                    c.error(&loc, Some("for"), format!("loop bounds must be integer scalars, found {ty}"));
                } else {
                    d = computation_type(d, ty.dtype());
                }
            }
        }
        if let Operand::Int(s) = bounds[2]
            && s <= 0
        {
            c.error(&loc, Some("for"), format!("the step of a `for` loop must be positive, found {s}"));
        }
        let mut vals: Vec<Value> = bounds.iter().map(|&b| literal(c, b, d, &loc)).collect();
        for t in init {
            c.check(*t);
            vals.push(t.value());
        }
        let init_tys: Vec<Type> = init.iter().map(|t| c.func.ty(t.value()).clone()).collect();
        let inst = c.func.create_inst(Op::Control(ControlOp::For), &vals, init_tys.clone(), loc.clone());
        let b = c.cur_block();
        c.func.append_inst(b, inst);
        let mut arg_tys = vec![Type::scalar(d)];
        arg_tys.extend(init_tys);
        // Loop-carried values keep the padding of their initial values.
        let mut logical: Vec<Option<Extents>> = vec![None];
        logical.extend(init.iter().map(|t| c.logical(t.value()).cloned()));
        let res = c.func.insts[inst].results.clone();
        for (r, e) in res.iter().zip(&logical[1..]) {
            if let Some(e) = e {
                c.set_logical(*r, e.clone());
            }
        }
        let results: Vec<Tensor> = res.iter().map(|&v| c.handle(v)).collect();
        (inst, arg_tys, results, logical)
    });
    let (region, yielded) = build_region_padded(inst, &arg_tys, &logical, &loc, ControlOp::Yield, |args| {
        body(args[0], &args[1..])
    });
    with_ctx(|c| {
        c.func.insts[inst].regions.push(region);
        c.check_types(&loc, "for", &arg_tys[1..], &yielded, |want, got| {
            format!("loop-carried values start as {want} but the body yields {got}")
        });
    });
    results
}

/// Converts a condition to a scalar `i1` (integers compare `!= 0`).
fn to_cond(cond: Tensor, loc: &Location, what: &'static str) -> Value {
    with_ctx(|c| {
        c.check(cond);
        let ty = c.func.ty(cond.value()).clone();
        if !ty.is_scalar() {
            c.error(loc, Some(what), format!("the condition must be a scalar, found {ty}"));
            return c.placeholder(&Type::scalar(DType::I1), loc);
        }
        if ty.is_bool() {
            return cond.value();
        }
        if ty.is_ptr() {
            c.error(loc, Some(what), format!("the condition must be a boolean, found {ty}"));
            return c.placeholder(&Type::scalar(DType::I1), loc);
        }
        let zero = literal(c, Operand::Int(0), ty.dtype(), loc);
        let op = Op::Compare(CompareOp::Cmp(CmpPred::Ne));
        c.push(op, &[cond.value(), zero], loc, &[Type::scalar(DType::I1)])[0]
    })
}

/// Appends an `if` on `cond` (without regions or results yet) to the
/// current block.
fn open_if(cond: Tensor, loc: &Location) -> Inst {
    let cv = to_cond(cond, loc, "if");
    with_ctx(|c| {
        let inst = c.func.create_inst(Op::Control(ControlOp::If), &[cv], Vec::new(), loc.clone());
        let b = c.cur_block();
        c.func.append_inst(b, inst);
        inst
    })
}

/// A runtime branch. Both closures return the values of the branch (same types
/// in both); returns them as the results of the `if`.
#[track_caller]
pub fn if_else(
    cond: Tensor,
    then_: impl FnOnce() -> Vec<Tensor>,
    else_: impl FnOnce() -> Vec<Tensor>,
) -> Vec<Tensor> {
    let loc = Location::caller();
    let inst = open_if(cond, &loc);
    let mut yielded: [Vec<Tensor>; 2] = [Vec::new(), Vec::new()];
    let (r_then, then_tys) = build_region(inst, &[], &loc, ControlOp::Yield, |_| {
        yielded[0] = then_();
        yielded[0].clone()
    });
    let (r_else, else_tys) = build_region(inst, &[], &loc, ControlOp::Yield, |_| {
        yielded[1] = else_();
        yielded[1].clone()
    });
    with_ctx(|c| {
        c.func.insts[inst].regions.extend([r_then, r_else]);
        c.check_types(&loc, "if", &then_tys, &else_tys, |then, else_| {
            format!(
                "the branches of an `if` must produce the same types: then gives {then}, else gives {else_}"
            )
        });
        let vals: Vec<Value> = then_tys.iter().map(|t| c.func.add_inst_result(inst, t.clone())).collect();
        // A result is valid where the values of both branches are.
        for (i, &r) in vals.iter().enumerate() {
            let ext = |c: &crate::builder::Ctx, k: usize| -> Option<Extents> {
                yielded[k].get(i).and_then(|t| c.logical(t.value()).cloned())
            };
            let merged = match (ext(c, 0), ext(c, 1)) {
                (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| *x.min(y)).collect()),
                (Some(a), None) | (None, Some(a)) => Some(a),
                (None, None) => None,
            };
            if let Some(e) = merged {
                c.set_logical(r, e);
            }
        }
        vals.into_iter().map(|v| c.handle(v)).collect()
    })
}

/// A runtime `if` without results.
#[track_caller]
pub fn if_then(cond: Tensor, then_: impl FnOnce()) {
    let loc = Location::caller();
    let inst = open_if(cond, &loc);
    let (r_then, _) = build_region(inst, &[], &loc, ControlOp::Yield, |_| {
        then_();
        Vec::new()
    });
    let (r_else, _) = build_region(inst, &[], &loc, ControlOp::Yield, |_| Vec::new());
    with_ctx(|c| c.func.insts[inst].regions.extend([r_then, r_else]));
}

/// `while cond(carried) { carried = body(carried) }`; returns the final values.
#[track_caller]
pub fn while_loop(
    init: &[Tensor],
    cond: impl FnOnce(&[Tensor]) -> Tensor,
    body: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let loc = Location::caller();
    let (inst, tys, logical) = with_ctx(|c| {
        let vals = c.values(init);
        let tys: Vec<Type> = vals.iter().map(|&v| c.func.ty(v).clone()).collect();
        let inst = c.func.create_inst(Op::Control(ControlOp::While), &vals, tys.clone(), loc.clone());
        let b = c.cur_block();
        c.func.append_inst(b, inst);
        let logical: Vec<Option<Extents>> = vals.iter().map(|&v| c.logical(v).cloned()).collect();
        let res = c.func.insts[inst].results.clone();
        for (r, e) in res.iter().zip(&logical) {
            if let Some(e) = e {
                c.set_logical(*r, e.clone());
            }
        }
        (inst, tys, logical)
    });
    let (r_before, _) = build_region_padded(inst, &tys, &logical, &loc, ControlOp::Condition, |args| {
        let cv = to_cond(cond(args), &loc, "while");
        let cv = with_ctx(|c| c.handle(cv));
        let mut out = vec![cv];
        out.extend_from_slice(args);
        out
    });
    let (r_after, yielded) = build_region_padded(inst, &tys, &logical, &loc, ControlOp::Yield, body);
    with_ctx(|c| {
        c.func.insts[inst].regions.extend([r_before, r_after]);
        c.check_types(&loc, "while", &tys, &yielded, |want, got| {
            format!("loop-carried values start as {want} but the body yields {got}")
        });
        c.func.insts[inst].results.clone().iter().map(|&v| c.handle(v)).collect()
    })
}

/// Waits until the kernels this launch depends on have completed and their
/// writes are visible (Hopper's programmatic dependent launch; Triton's
/// `gdc_wait`). Call it once, at the top level of the kernel, before any
/// store or atomic and before any load of memory an earlier kernel of the
/// stream writes; loads before it (weights, for example) overlap the previous
/// kernel's tail. A no-op on the interpreter and before sm_90. A kernel that
/// calls it may be launched overlapping its predecessor (see
/// [`crate::ir::ops::program`]).
#[track_caller]
pub fn gdc_wait() {
    program_effect(ProgramOp::GdcWait, &Location::caller());
}

/// Lets the next kernel of the stream be scheduled before this one ends
/// (once every program has called this or exited): its programs run up to
/// their [`gdc_wait`] while this kernel finishes. A hint with no effect on
/// results; a no-op on the interpreter and before sm_90.
#[track_caller]
pub fn gdc_launch_dependents() {
    program_effect(ProgramOp::GdcLaunchDependents, &Location::caller());
}

/// A barrier among the threads of the program: what the program stored
/// before it is visible to every load of the program after it (`bar.sync`
/// on the GPU). The interpreter and the native CPU backend run a program's
/// operations in order, so there it orders nothing further. Call it where
/// the whole program runs (a scalar `if` or loop is the whole program's).
#[track_caller]
pub fn barrier() {
    program_effect(ProgramOp::Barrier, &Location::caller());
}

/// A nanosecond clock shared by every program of the launch, an `i64`
/// scalar (`%globaltimer` on the GPU; on the interpreter, nanoseconds since
/// the interpreter's first read): for timing the phases of a persistent
/// kernel. Every call reads the clock anew.
#[track_caller]
pub fn globaltimer() -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let v = c.push(Op::Program(ProgramOp::GlobalTimer), &[], &loc, &[Type::scalar(DType::I64)])[0];
        c.handle(v)
    })
}

/// Fails the kernel with `message` where `cond` is false (any element).
#[track_caller]
pub fn device_assert(cond: Tensor, message: &str) {
    let loc = Location::caller();
    with_ctx(|c| {
        c.check(cond);
        c.push(Op::Debug(DebugOp::Assert { message: message.into() }), &[cond.value()], &loc, &[]);
    });
}

/// Prints `values` with `prefix` from every program.
#[track_caller]
pub fn device_print(prefix: &str, values: &[Tensor]) {
    let loc = Location::caller();
    with_ctx(|c| {
        let vals = c.values(values);
        c.push(Op::Debug(DebugOp::Print { prefix: prefix.into() }), &vals, &loc, &[]);
    });
}

fn hint_at(make: fn(Vec<u32>) -> HintOp, x: Tensor, n: u32, loc: &Location) -> Tensor {
    with_ctx(|c| {
        c.check(x);
        let t = c.func.ty(x.value()).clone();
        let op = make(vec![n; t.rank().max(1)]);
        let v = c.push(Op::Hint(op), &[x.value()], loc, &[t])[0];
        c.handle(v)
    })
}

located_fns! {
    hint_at(x: Tensor, n: u32);
    /// Promises every element of `x` is a multiple of `n` (a power of two).
    multiple_of => HintOp::MultipleOf;
    /// Promises runs of `n` consecutive elements of `x` are contiguous.
    max_contiguous => HintOp::MaxContiguous;
    /// Promises runs of `n` consecutive elements of `x` are equal.
    max_constancy => HintOp::MaxConstancy;
}

/// Records `op`, a program op with no operands and no results, at `loc`.
fn program_effect(op: ProgramOp, loc: &Location) {
    with_ctx(|c| {
        c.push(Op::Program(op), &[], loc, &[]);
    });
}
