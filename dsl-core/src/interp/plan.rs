//! Facts about a verified function that the executor needs on every run,
//! computed once per kernel: when each value dies, and how each custom combine
//! region can run.
//!
//! - Kills: after instruction `i` runs, the values listed in `kills[i]` are
//!   dropped from the environment. A value is killed by the last instruction of
//!   its own block that uses it (directly or inside a nested region), so a
//!   value defined outside a loop stays alive for every iteration, and tiles
//!   are freed as soon as possible (peak memory stays near the live set).
//! - Vectorized combines: a custom `reduce`/`scan` region whose ops are all
//!   elementwise (and whose captured outer values are scalars) runs once per
//!   combine step on whole slices; any other region runs lane by lane.
//!
//! Invariant: the function was verified, so every use is dominated by its
//! definition and the analysis needs no error handling for broken SSA.

use crate::ir::ops::{ControlOp, ReduceKind, ScanKind};
use crate::ir::{Block, EntityRef, Function, Inst, Op, Region, Value, ValueDef};
use rustc_hash::FxHashMap;

/// The largest tile (in elements) the interpreter accepts.
pub(crate) const MAX_TILE_ELEMS: usize = 1 << 24;

/// Per-instruction facts for the executor (indexed by instruction index).
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    /// Values to drop after each instruction.
    pub kills: Vec<Vec<Value>>,
    /// For custom reduce/scan instructions: whether the region runs vectorized.
    pub vector_combine: Vec<bool>,
}

/// Computes the plan of a verified function; fails on tiles too large to run.
pub(crate) fn plan(f: &Function) -> Result<Plan, String> {
    for (v, data) in f.values.iter() {
        let n = data.ty.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if n.is_none_or(|n| n > MAX_TILE_ELEMS) {
            return Err(format!(
                "value {v} has type {}, more than the interpreter's limit of {MAX_TILE_ELEMS} elements per tile",
                data.ty
            ));
        }
    }
    let mut p = Plan { kills: vec![Vec::new(); f.insts.len()], vector_combine: vec![false; f.insts.len()] };
    region(f, f.body, &mut p);
    Ok(p)
}

/// Plans every block of region `r`.
fn region(f: &Function, r: Region, p: &mut Plan) {
    for &b in &f.regions[r].blocks {
        block(f, b, p);
    }
}

/// True when `v` is defined in block `b` (an argument or a result of one of its ops).
fn defined_in(f: &Function, v: Value, b: Block) -> bool {
    match f.values.get(v).map(|d| d.def) {
        Some(ValueDef::BlockArg(bb, _)) => bb == b,
        Some(ValueDef::Result(i, _)) => f.insts.get(i).is_some_and(|d| d.parent == Some(b)),
        None => false,
    }
}

/// Every value `i` uses, including uses inside its regions.
fn uses(f: &Function, i: Inst, out: &mut Vec<Value>) {
    let d = &f.insts[i];
    out.extend(d.args.iter().copied());
    for &r in &d.regions {
        for &b in &f.regions[r].blocks {
            for &j in &f.blocks[b].insts {
                uses(f, j, out);
            }
        }
    }
}

/// Plans the kills of block `b`, then its nested regions.
fn block(f: &Function, b: Block, p: &mut Plan) {
    let insts = &f.blocks[b].insts;
    let mut last: FxHashMap<Value, usize> = FxHashMap::default();
    let mut buf = Vec::new();
    for (pos, &i) in insts.iter().enumerate() {
        // Results nobody uses die right away (a later use overrides this).
        for &r in &f.insts[i].results {
            last.insert(r, pos);
        }
        buf.clear();
        uses(f, i, &mut buf);
        for &v in &buf {
            if defined_in(f, v, b) {
                last.insert(v, pos);
            }
        }
    }
    for (v, pos) in last {
        p.kills[insts[pos].index()].push(v);
    }
    for &i in insts {
        let d = &f.insts[i];
        let custom = matches!(d.op, Op::Reduce(r) if r.kind == ReduceKind::Custom)
            || matches!(d.op, Op::Scan(s) if s.kind == ScanKind::Custom);
        if custom && let Some(&r) = d.regions.first() {
            p.vector_combine[i.index()] = vectorizable(f, r);
        }
        for &r in &d.regions {
            region(f, r, p);
        }
    }
}

/// True when a combine region may run on flat slices instead of scalars: its
/// ops are elementwise (or constants, grid queries, asserts and the final
/// `yield`), and every value it captures from outside is a scalar.
fn vectorizable(f: &Function, r: Region) -> bool {
    let Some(&b) = f.regions[r].blocks.first() else { return false };
    f.blocks[b].insts.iter().all(|&i| {
        let d = &f.insts[i];
        let op_ok = match &d.op {
            Op::Creation(c) => matches!(c, crate::ir::ops::CreationOp::Const(_)),
            Op::Arith(a) => !matches!(a, crate::ir::ops::ArithOp::AddPtr),
            Op::Compare(_) | Op::Program(_) => true,
            Op::Cast(c) => !matches!(c, crate::ir::ops::CastOp::PtrCast { .. }),
            Op::Control(c) => *c == ControlOp::Yield,
            Op::Debug(dbg) => matches!(dbg, crate::ir::ops::DebugOp::Assert { .. }),
            _ => false,
        };
        op_ok && d.args.iter().all(|&a| defined_in(f, a, b) || f.ty(a).is_scalar())
    })
}
