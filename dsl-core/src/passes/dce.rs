//! Dead-code elimination.
//!
//! Removes, recursively inside regions too, every instruction whose results are
//! unused and that has no side effects: pure ops, non-volatile loads, and
//! control flow (`for`, `if`, `while`, custom `reduce`/`scan`) whose regions
//! contain no side effect. It also prunes results of live control flow:
//! unused `if` results, and loop-carried values of `for` loops that are unused
//! after the loop and inside it only feed their own `yield`.
//!
//! Invariants: side-effecting ops (stores, atomics, volatile loads, asserts,
//! prints) and control flow containing them are never removed; terminators are
//! never removed; the IR stays valid (removal detaches instructions from their
//! block; the arenas are append-only). Removing a side-effect-free `while` loop
//! assumes it terminates (a kernel that never returns is a bug, and the pass
//! may turn the hang into a return).

use super::BlockPass;
use crate::ir::ops::ControlOp;
use crate::ir::{Block, EntityRef, Function, Inst, Op, Region, Value, ValueDef};
use rustc_hash::FxHashSet;

/// Runs DCE on `f`; returns how many instructions were removed plus how many
/// control-flow results (and loop-carried values) were pruned.
pub fn dce(f: &mut Function) -> usize {
    let mut uses = vec![0u32; f.values.len()];
    f.walk(|i| {
        for a in &f.insts[i].args {
            uses[a.index()] += 1;
        }
    });
    let mut d = Dce { uses, changes: 0 };
    d.region(f, f.body);
    d.changes
}

/// True when `inst` or anything nested in its regions has side effects.
pub(crate) fn has_effects(f: &Function, inst: Inst) -> bool {
    let data = &f.insts[inst];
    data.op.has_side_effects()
        || data.regions.iter().any(|&r| {
            f.regions[r].blocks.iter().any(|&b| f.blocks[b].insts.iter().any(|&i| has_effects(f, i)))
        })
}

/// Every value used by `inst` or by an instruction nested in its regions.
fn all_uses(f: &Function, inst: Inst, out: &mut Vec<Value>) {
    out.extend_from_slice(&f.insts[inst].args);
    for &r in &f.insts[inst].regions {
        for &b in &f.regions[r].blocks {
            for &i in &f.blocks[b].insts {
                all_uses(f, i, out);
            }
        }
    }
}

/// Number of instructions in `inst`'s regions, recursively.
fn nested_count(f: &Function, inst: Inst) -> usize {
    f.insts[inst]
        .regions
        .iter()
        .flat_map(|&r| f.regions[r].blocks.iter())
        .flat_map(|&b| f.blocks[b].insts.iter())
        .map(|&i| 1 + nested_count(f, i))
        .sum()
}

/// Renumbers the definitions of an instruction's results after some were removed.
pub(crate) fn renumber_results(f: &mut Function, inst: Inst) {
    for (k, v) in f.insts[inst].results.clone().into_iter().enumerate() {
        f.values[v].def = ValueDef::Result(inst, k as u32);
    }
}

/// Renumbers the definitions of a block's arguments after some were removed.
fn renumber_args(f: &mut Function, b: Block) {
    for (k, v) in f.blocks[b].args.clone().into_iter().enumerate() {
        f.values[v].def = ValueDef::BlockArg(b, k as u32);
    }
}

struct Dce {
    /// Use counts of values among reachable instructions.
    uses: Vec<u32>,
    changes: usize,
}

impl BlockPass for Dce {
    /// Sweeps a block backwards, so that uses are dropped before their
    /// definitions are examined; nested regions are swept before their owner's
    /// operands are reached.
    fn block(&mut self, f: &mut Function, b: Block) {
        let insts = f.blocks[b].insts.clone();
        let mut keep = Vec::with_capacity(insts.len());
        for &i in insts.iter().rev() {
            if self.removable(f, i) {
                let mut vals = Vec::new();
                all_uses(f, i, &mut vals);
                for v in vals {
                    self.drop_use(v);
                }
                self.changes += 1 + nested_count(f, i);
                f.insts[i].parent = None;
                continue;
            }
            match f.insts[i].op {
                Op::Control(ControlOp::If) => self.prune_if(f, i),
                Op::Control(ControlOp::For) => self.prune_for(f, i),
                _ => {}
            }
            for r in f.insts[i].regions.clone().into_iter().rev() {
                self.region(f, r);
            }
            keep.push(i);
        }
        keep.reverse();
        f.blocks[b].insts = keep;
    }
}

impl Dce {
    fn used(&self, v: Value) -> bool {
        self.uses[v.index()] > 0
    }

    fn drop_use(&mut self, v: Value) {
        let u = &mut self.uses[v.index()];
        *u = u.saturating_sub(1);
    }

    /// Dead and free of side effects (terminators are never removable).
    fn removable(&self, f: &Function, i: Inst) -> bool {
        let data = &f.insts[i];
        !data.op.is_terminator() && data.results.iter().all(|&r| !self.used(r)) && !has_effects(f, i)
    }

    /// Removes unused results of an `if` and the matching `yield` operands.
    fn prune_if(&mut self, f: &mut Function, i: Inst) {
        let n = f.insts[i].results.len();
        let mut pruned = false;
        for k in (0..n).rev() {
            if self.used(f.insts[i].results[k]) {
                continue;
            }
            for r in f.insts[i].regions.clone() {
                let y = terminator(f, r);
                let v = f.insts[y].args.remove(k);
                self.drop_use(v);
            }
            f.insts[i].results.remove(k);
            pruned = true;
            self.changes += 1;
        }
        if pruned {
            renumber_results(f, i);
        }
    }

    /// Removes loop-carried values of a `for` that are unused after the loop and
    /// that, inside the body, only feed their own `yield` operand (through
    /// instructions without side effects).
    fn prune_for(&mut self, f: &mut Function, i: Inst) {
        let body = f.insts[i].regions[0];
        let b = f.entry(body);
        let n = f.insts[i].results.len();
        let mut pruned = false;
        for k in (0..n).rev() {
            if self.used(f.insts[i].results[k]) || !self.carried_is_dead(f, b, k) {
                continue;
            }
            let y = terminator(f, body);
            let yv = f.insts[y].args.remove(k);
            self.drop_use(yv);
            let init = f.insts[i].args.remove(3 + k);
            self.drop_use(init);
            f.blocks[b].args.remove(k + 1);
            f.insts[i].results.remove(k);
            pruned = true;
            self.changes += 1;
        }
        if pruned {
            renumber_results(f, i);
            renumber_args(f, b);
        }
    }

    /// True when carried value `k` of the loop whose body block is `b` only
    /// flows into yield operand `k`: every top-level body instruction that
    /// (transitively) depends on its block argument is free of side effects, and
    /// no other yield operand depends on it.
    fn carried_is_dead(&self, f: &Function, b: Block, k: usize) -> bool {
        let mut tainted: FxHashSet<Value> = FxHashSet::default();
        tainted.insert(f.blocks[b].args[k + 1]);
        let insts = &f.blocks[b].insts;
        let Some((&yield_inst, rest)) = insts.split_last() else { return false };
        let mut vals = Vec::new();
        for &i in rest {
            vals.clear();
            all_uses(f, i, &mut vals);
            if vals.iter().any(|v| tainted.contains(v)) {
                if has_effects(f, i) {
                    return false;
                }
                tainted.extend(f.insts[i].results.iter().copied());
            }
        }
        f.insts[yield_inst].args.iter().enumerate().all(|(j, v)| j == k || !tainted.contains(v))
    }
}

/// The terminator of a region's block.
pub(crate) fn terminator(f: &Function, r: Region) -> Inst {
    let b = f.entry(r);
    *f.blocks[b].insts.last().expect("an op region ends with a terminator")
}
