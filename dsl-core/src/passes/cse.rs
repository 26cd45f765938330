//! Common-subexpression elimination over structured regions.
//!
//! Walks the body in program order with a scoped hash table keyed by (op with
//! attributes, operands, result types). An instruction whose key is already in
//! the table is merged into the earlier one: its uses are redirected and it is
//! detached from its block. The table is scoped by region, so an instruction is
//! only merged into one that dominates it (earlier in the same block, or
//! earlier in a block of an enclosing region); sibling regions (the branches of
//! an `if`, the two regions of a `while`) never see each other's entries.
//!
//! Invariants: only ops with `Op::is_pure` and no regions are merged, which
//! excludes loads, stores, atomics, debug ops and control flow. Operands of
//! commutative integer ops (and float `add`/`mul`) are put in a canonical
//! order for the key only; the IR keeps its operand order.

use super::BlockPass;
use crate::dtype::Type;
use crate::ir::ops::{ArithOp, BinaryOp};
use crate::ir::{Block, Function, Inst, Op, Value};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// What makes two instructions interchangeable.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    op: Op,
    args: SmallVec<[Value; 4]>,
    results: SmallVec<[Type; 2]>,
}

/// Runs CSE on `f`; returns the number of instructions merged away.
pub fn cse(f: &mut Function) -> usize {
    let mut c = Cse { table: FxHashMap::default(), subst: FxHashMap::default(), merged: 0 };
    c.region(f, f.body);
    c.merged
}

struct Cse {
    table: FxHashMap<Key, Inst>,
    /// Results of merged instructions, mapped to the results that replace them.
    subst: FxHashMap<Value, Value>,
    merged: usize,
}

impl BlockPass for Cse {
    fn block(&mut self, f: &mut Function, b: Block) {
        let insts = f.blocks[b].insts.clone();
        let mut keep = Vec::with_capacity(insts.len());
        let mut scope: Vec<Key> = Vec::new();
        for i in insts {
            // Uses are visited after their definitions, so one lookup suffices:
            // replacement values are never replaced themselves.
            for a in f.insts[i].args.iter_mut() {
                if let Some(&n) = self.subst.get(a) {
                    *a = n;
                }
            }
            if let Some(key) = key(f, i) {
                if let Some(&prev) = self.table.get(&key) {
                    for (&r, &p) in f.insts[i].results.iter().zip(f.insts[prev].results.iter()) {
                        self.subst.insert(r, p);
                    }
                    f.insts[i].parent = None;
                    self.merged += 1;
                    continue;
                }
                self.table.insert(key.clone(), i);
                scope.push(key);
            }
            keep.push(i);
            for r in f.insts[i].regions.clone() {
                self.region(f, r);
            }
        }
        f.blocks[b].insts = keep;
        for k in scope {
            self.table.remove(&k);
        }
    }
}

/// The CSE key of an instruction, or `None` when it must never be merged.
fn key(f: &Function, i: Inst) -> Option<Key> {
    let data = &f.insts[i];
    if !data.op.is_pure() || data.op.has_side_effects() || !data.regions.is_empty() || data.results.is_empty()
    {
        return None;
    }
    let mut args = data.args.clone();
    if let Op::Arith(ArithOp::Binary(b)) = data.op
        && commutes(b, f.ty(args[0]))
        && args[1] < args[0]
    {
        args.swap(0, 1);
    }
    Some(Key { op: data.op.clone(), args, results: data.results.iter().map(|&r| f.ty(r).clone()).collect() })
}

/// True when swapping the operands of `b` never changes the result bits. Float
/// `min`/`max` are excluded: the order of signed zeros is left to the target.
fn commutes(b: BinaryOp, t: &Type) -> bool {
    b.is_commutative() && (t.is_int() || matches!(b, BinaryOp::Add | BinaryOp::Mul))
}
