//! Where each value of a kernel lives in host code: the storage plan,
//! decided once, in one backward pass per block, before any LLVM IR is
//! emitted (and printable, so the decisions can be inspected and tested).
//!
//! - `Scalar`: rank-0 values are LLVM scalars, computed at their program
//!   point.
//! - `Array`: a tile materialized in a stack array of its elements
//!   (row-major), written once where it is defined (or by its loop's
//!   `yield`) and read by its users.
//! - `Inline`: a tile that is never stored: each root that uses it (a store,
//!   a reduction, a `dot`, a materialized value, a `yield`, ...) computes it
//!   strip by strip, element for element, in registers, together with the
//!   root's other inline operands (loop fusion).
//!
//! A tile computed by a pure op (or a load) is inline unless:
//! - a user sits in another block (inside a loop or branch body): the tile
//!   is computed once, before, instead of once per iteration (constants,
//!   splats and ranges excepted: they cost nothing where they are used, and
//!   constants fold into their users);
//! - it is a load and a store, an atomic or control flow containing one lies
//!   between the load and a root it flows into (evaluated there, the load
//!   could read memory written after it), or a volatile load;
//! - it is expensive (a memory access, a transcendental) and flows into
//!   several roots, or reaches a root through a broadcast that repeats it;
//! - it reaches a root through a repeating broadcast and its inline
//!   expression is large (recomputing it per repetition would cost more
//!   than a store and loads).
//!
//! Everything else that produces tiles (reductions, scans, `dot`, atomics,
//! control flow, block arguments of loops) is an `Array`.
//!
//! Invariant: the plan depends only on the function, so the same IR always
//! gets the same code.

use dsl_core::ir::ops::{ArithOp, BinaryOp, ControlOp, MemoryOp, ShapeOp, UnaryOp};
use dsl_core::ir::{Block, EntityRef, Function, Inst, Op, Value};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::fmt::Write as _;

/// Where one value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Storage {
    /// An LLVM scalar (rank 0).
    Scalar,
    /// Computed where used, strip by strip.
    Inline,
    /// A stack array of its elements.
    Array,
}

/// The storage of every value of a function.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    storage: Vec<Storage>,
}

/// The cost units of an expensive op (against 1 for a cheap one).
const EXPENSIVE: u32 = 16;

/// An inline expression repeated by a broadcast is materialized from this
/// cost on.
const REPEAT_LIMIT: u32 = 12;

impl Plan {
    /// The storage of `v`.
    pub(crate) fn storage(&self, v: Value) -> Storage {
        self.storage.get(v.index()).copied().unwrap_or(Storage::Array)
    }
}

/// True for ops whose tile results can be computed inline.
fn inlinable(op: &Op) -> bool {
    matches!(
        op,
        Op::Creation(_)
            | Op::Arith(_)
            | Op::Compare(_)
            | Op::Cast(_)
            | Op::Hint(_)
            | Op::Shape(_)
            | Op::Memory(MemoryOp::Load { .. })
    )
}

/// True for ops that cost far more per element than an add: memory
/// accesses and calls of the math library.
fn expensive(op: &Op) -> bool {
    match op {
        Op::Memory(_) => true,
        Op::Arith(ArithOp::Unary(u)) => !matches!(
            u,
            UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sqrt
        ),
        Op::Arith(ArithOp::Binary(BinaryOp::Pow)) => true,
        _ => false,
    }
}

/// True when `op` writes memory (directly, or anywhere inside its regions).
fn writes_memory(f: &Function, i: Inst) -> bool {
    let d = &f.insts[i];
    let own = match &d.op {
        Op::Memory(m) => m.has_side_effects(),
        _ => false,
    };
    own || d
        .regions
        .iter()
        .any(|&r| f.regions[r].blocks.iter().any(|&b| f.blocks[b].insts.iter().any(|&j| writes_memory(f, j))))
}

/// What the backward pass knows about an inline candidate.
#[derive(Clone, Default)]
struct Flow {
    /// The roots it flows into.
    roots: SmallVec<[Inst; 2]>,
    /// Whether some path to a root repeats it through a broadcast.
    repeated: bool,
    /// The cost of its inline expression per element.
    cost: u32,
}

/// Computes the storage plan of a verified, canonicalized function.
pub(crate) fn plan(f: &Function) -> Plan {
    let mut storage = vec![Storage::Array; f.values.len()];
    for (v, d) in f.values.iter() {
        if d.ty.rank() == 0 {
            storage[v.index()] = Storage::Scalar;
        }
    }
    let users = f.users();
    let mut flows: FxHashMap<Value, Flow> = FxHashMap::default();
    let mut blocks = Vec::new();
    f.walk(|i| {
        for &r in &f.insts[i].regions {
            blocks.extend(f.regions[r].blocks.iter().copied());
        }
    });
    blocks.push(f.body_block());
    for b in blocks {
        plan_block(f, b, &users, &mut storage, &mut flows);
    }
    Plan { storage }
}

/// Decides the candidates of block `b`, last instruction first (so every
/// user's decision is known when its operands are decided).
fn plan_block(
    f: &Function,
    b: Block,
    users: &FxHashMap<Value, Vec<Inst>>,
    storage: &mut [Storage],
    flows: &mut FxHashMap<Value, Flow>,
) {
    let insts = &f.blocks[b].insts;
    let pos: FxHashMap<Inst, usize> = insts.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let writes: Vec<bool> = insts.iter().map(|&i| writes_memory(f, i)).collect();
    for (k, &i) in insts.iter().enumerate().rev() {
        let d = &f.insts[i];
        if !inlinable(&d.op) {
            continue;
        }
        for &v in &d.results {
            if f.ty(v).rank() == 0 {
                continue;
            }
            let mut flow = Flow { cost: if expensive(&d.op) { EXPENSIVE } else { 1 }, ..Flow::default() };
            let mut array = matches!(d.op, Op::Memory(MemoryOp::Load { volatile: true, .. }));
            // Constants, splats and ranges cost nothing to recompute, and
            // recomputed constants fold: they are inline in nested blocks too.
            let free = match d.op {
                Op::Creation(_) => true,
                // A pointer splat plus offsets: gathers take the scalar base
                // and the offsets apart (see `lower/memory.rs`).
                Op::Arith(ArithOp::AddPtr) => {
                    f.def_inst(d.args[0]).is_some_and(|p| matches!(f.insts[p].op, Op::Creation(_)))
                }
                _ => false,
            };
            for &u in users.get(&v).map(Vec::as_slice).unwrap_or(&[]) {
                if f.insts[u].parent != Some(b) {
                    array |= !free;
                    continue;
                }
                let ud = &f.insts[u];
                let inline_user = !ud.results.is_empty()
                    && ud.results.iter().all(|&r| storage[r.index()] == Storage::Inline);
                if !inline_user {
                    if !flow.roots.contains(&u) {
                        flow.roots.push(u);
                    }
                    continue;
                }
                let repeats = matches!(ud.op, Op::Shape(ShapeOp::Broadcast { .. }))
                    && f.ty(ud.results[0]).numel() > f.ty(v).numel();
                flow.repeated |= repeats;
                for &r in &ud.results {
                    if let Some(uf) = flows.get(&r) {
                        flow.repeated |= uf.repeated;
                        for &root in &uf.roots {
                            if !flow.roots.contains(&root) {
                                flow.roots.push(root);
                            }
                        }
                    }
                }
            }
            for &a in &d.args {
                if let Some(af) = flows.get(&a) {
                    flow.cost = flow.cost.saturating_add(af.cost);
                }
            }
            if let Op::Memory(MemoryOp::Load { .. }) = d.op {
                // The load is evaluated at its roots: no write may come between.
                let last = flow.roots.iter().filter_map(|r| pos.get(r)).copied().max().unwrap_or(k);
                if writes[k + 1..last.max(k + 1)].iter().any(|&w| w) {
                    array = true;
                }
            }
            if expensive(&d.op) && (flow.roots.len() > 1 || flow.repeated) {
                array = true;
            }
            if flow.repeated && flow.cost > REPEAT_LIMIT {
                array = true;
            }
            if array {
                storage[v.index()] = Storage::Array;
            } else {
                storage[v.index()] = Storage::Inline;
                flows.insert(v, flow);
            }
        }
        // A multi-result op (`split`) lives in one place.
        if d.results.len() > 1 && d.results.iter().any(|&r| storage[r.index()] == Storage::Array) {
            for &r in &d.results {
                if f.ty(r).rank() > 0 {
                    storage[r.index()] = Storage::Array;
                }
            }
        }
    }
}

/// The plan as text: one line per tile value, `v12 inline`, `v13 array`
/// (block arguments and op results in program order).
pub(crate) fn print(f: &Function, p: &Plan) -> String {
    let mut out = String::new();
    let mut line = |v: Value| {
        if f.ty(v).rank() > 0 {
            let s = match p.storage(v) {
                Storage::Scalar => "scalar",
                Storage::Inline => "inline",
                Storage::Array => "array",
            };
            let _ = writeln!(out, "{v} {s} {}", f.ty(v));
        }
    };
    f.walk(|i| {
        let d = &f.insts[i];
        for &r in &d.regions {
            for &b in &f.regions[r].blocks {
                for &a in &f.blocks[b].args {
                    line(a);
                }
            }
        }
        if !matches!(d.op, Op::Control(ControlOp::Yield | ControlOp::Condition)) {
            for &r in &d.results {
                line(r);
            }
        }
    });
    out
}
