//! The tensor-core plan of a function, computed once before lowering: which
//! `dot`s use `mma.sync` (and with which [`MmaLayout`]), which `b` operands
//! are read straight from the `[N, K]` tile they were transposed from, and
//! which loop-invariant `a` operands are loaded into A fragments once,
//! before their loop. Where values live between ops is decided afterwards
//! from these layouts (`lower/assign.rs`).
//!
//! Chained products (FlashAttention's `dot(f(dot(q, k^T)), v)`): when the
//! `a` of a `dot` is computed elementwise from another `dot`'s result with
//! the same `M`, both get the warp grid with every warp along `M` (when the
//! shapes allow it), so each warp holds whole rows of the first result and
//! the second product takes its A fragments from those registers.
//!
//! On sm_90a, a planned `dot` in the body of a `for` whose `b` (or the
//! `[N, K]` tile of a transposed `b`) is loaded in that body is a `wgmma`
//! candidate when its shape fits one warpgroup-wide instruction per
//! warpgroup (`M = 64` per warpgroup, `N <= 256`, 128-byte swizzled `b`
//! rows, see [`wgmma_shape`]): its accumulator gets the warp grid with every
//! warp along `M` (16 rows each, the `wgmma` D fragment, which is also the
//! grid of chained products), and the pipeline decides whether it really
//! runs on `wgmma` (`pipeline/`: `b` must be pipelined) and whether `a` is
//! read from shared memory too (a pipelined load with 128-byte rows) or from
//! A fragments in registers (FlashAttention's hoisted `q` and its `p`).
//!
//! FP8 products (`f8e4m3`/`f8e5m2` operands) are planned on sm_90a only,
//! as `wgmma` candidates with `K` counted in 16-bit units ([`k_units`]):
//! the native `m64nNk32` instruction reads 32 bytes of K per step, as the
//! 16-bit one does. The code generator lowers them only when the pipeline
//! confirms them with both operands K-major in TMA-copied swizzle atoms
//! (`KernelPlan::fp8_native`); otherwise their operands are widened to
//! f16 first (`dsl_core::passes::f8_dot`) and the function is planned again.
//!
//! Invariant: a skipped `permute` has exactly one use, the `b` operand of a
//! planned `dot`; that `dot` reads the permute's operand instead.

use super::super::assign::is_elementwise;
use crate::Target;
use crate::fragment::MmaLayout;
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::{ControlOp, MemoryOp, ShapeOp};
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
    /// `wgmma` candidates (sm_90a, see the module documentation) and the
    /// layouts they had before (which they get back when the pipeline
    /// cannot feed them).
    pub wgmma: FxHashMap<Inst, MmaLayout>,
}

/// True when an `[m, k] x [k, n]` product over `warps` warps fits the
/// `wgmma` lowering: one `m64nNk16` instruction per warpgroup and k step
/// (`m = 16 * warps`, whole warpgroups), `n` a multiple of 8 up to 256, and
/// the rows of the staged `b` (along `K` for an `[N, K]` tile, `b_nk`; along
/// `N` for `[K, N]`) of at least 128 bytes, a power of two (the 128-byte
/// swizzle atoms of `pipeline/`). `a` is read from shared memory when it
/// is pipelined with such rows too, otherwise from A fragments in registers.
pub(crate) fn wgmma_shape(m: usize, n: usize, k: usize, warps: usize, b_nk: bool) -> bool {
    warps.is_multiple_of(4)
        && m == 16 * warps
        && n.is_multiple_of(8)
        && n <= 256
        && k.is_multiple_of(16)
        && rows128(if b_nk { k } else { n })
}

/// The `K` extent of a product of `dtype` operands in 16-bit units (the
/// `k` of the 16-bit rules above; a 128-byte row is 64 units).
pub(crate) fn k_units(k: usize, dtype: DType) -> usize {
    k * dtype.size_bytes() / 2
}

/// Rows of `c` 16-bit elements fill 128-byte swizzle atoms.
fn rows128(c: usize) -> bool {
    c >= 64 && c.is_power_of_two()
}

/// Builds the plan of `f` for `warps` warps per program on `target`, whose
/// loops are pipelined `stages` deep.
pub(crate) fn plan(f: &Function, warps: usize, target: Target, stages: usize) -> MmaPlan {
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
        let f8 = aty.dtype().is_f8() && target == Target::Sm90a && stages >= 2;
        if !matches!(aty.dtype(), DType::F16 | DType::BF16) && !f8 {
            continue;
        }
        let k = k_units(aty.shape[1], aty.dtype());
        let Some(l) = MmaLayout::choose(aty.shape[0], bty.shape[1], k, warps) else {
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
    if target == Target::Sm90a && stages >= 2 {
        wgmma_candidates(f, &mut p, warps);
    }
    p.hoist(f);
    p
}

impl MmaPlan {
    /// Keeps the `wgmma` candidates in `confirmed` (the pipeline feeds
    /// their `b`); the others get their earlier layouts back.
    pub(crate) fn settle_wgmma(&mut self, f: &Function, confirmed: &FxHashSet<Inst>) {
        let dropped: Vec<(Inst, MmaLayout)> =
            self.wgmma.iter().filter(|(d, _)| !confirmed.contains(d)).map(|(&d, &l)| (d, l)).collect();
        if dropped.is_empty() {
            return;
        }
        for (d, before) in dropped {
            self.wgmma.remove(&d);
            self.dots.insert(d, before);
        }
        self.hoist(f);
    }

    /// Gives the `dot`s `dots` (whose B fragments come from an FP8 tile by
    /// `ldmatrix.trans`, `pipeline::FragB`) the interleaved accumulator
    /// layout (`MmaLayout::interleaved`).
    pub(crate) fn interleave(&mut self, f: &Function, dots: impl IntoIterator<Item = Inst>) {
        let mut changed = false;
        for d in dots {
            if let Some(l) = self.dots.get_mut(&d)
                && let Some(il) = l.interleave()
            {
                *l = il;
                changed = true;
            }
        }
        if changed {
            self.hoist(f);
        }
    }

    /// Fills [`Self::hoisted`] from the planned `dot`s and their layouts.
    fn hoist(&mut self, f: &Function) {
        self.hoisted.clear();
        let mut fors = Vec::new();
        f.walk(|i| {
            if matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
                fors.push(i);
            }
        });
        for i in fors {
            let body = f.entry(f.insts[i].regions[0]);
            for &d in &f.blocks[body].insts {
                let Some(&l) = self.dots.get(&d) else { continue };
                let a = f.insts[d].args[0];
                let outer = f.def_inst(a).is_some_and(|ad| f.insts[ad].parent == f.insts[i].parent);
                let list = self.hoisted.entry(i).or_default();
                if outer && !list.contains(&(a, l)) {
                    list.push((a, l));
                }
            }
        }
    }
}

/// Marks the `wgmma` candidates (see the module documentation) and gives
/// them the all-warps-along-`M` grid.
fn wgmma_candidates(f: &Function, p: &mut MmaPlan, warps: usize) {
    let dots: Vec<Inst> = p.dots.keys().copied().collect();
    for d in dots {
        let Some(body) = f.insts[d].parent else { continue };
        let owner = f.blocks[body].parent.and_then(|r| f.regions[r].parent);
        let in_loop = owner.is_some_and(|o| matches!(f.insts[o].op, Op::Control(ControlOp::For)));
        let loaded_here = |v: Value| {
            f.def_inst(v).is_some_and(|i| {
                f.insts[i].parent == Some(body) && matches!(f.insts[i].op, Op::Memory(MemoryOp::Load { .. }))
            })
        };
        let args = &f.insts[d].args;
        let b_nk = p.b_trans.get(&d).copied();
        let b = b_nk.unwrap_or(args[1]);
        let (aty, bty) = (f.ty(args[0]), f.ty(args[1]));
        let (m, k, n) = (aty.shape[0], k_units(aty.shape[1], aty.dtype()), bty.shape[1]);
        if !in_loop || !loaded_here(b) || !wgmma_shape(m, n, k, warps, b_nk.is_some()) {
            continue;
        }
        if let Some(l) = MmaLayout::with_warps_m(m, n, k, warps, warps) {
            let before = p.dots.insert(d, l).unwrap_or(l);
            p.wgmma.insert(d, before);
        }
    }
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
        let k_of = |d: Inst| {
            let t = f.ty(f.insts[d].args[0]);
            k_units(t.shape[1], t.dtype())
        };
        let (k1, k2) = (k_of(d1), k_of(d2));
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
