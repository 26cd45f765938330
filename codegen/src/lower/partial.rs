//! Row sums that a `for` carries stay per-lane partial sums until the loop
//! ends (FlashAttention-2's `row_sum`).
//!
//! The online softmax carries `l = l * alpha + sum(p, 1)`, with `p` an
//! `[M, N]` tile in accumulator layout and `l`, `alpha` in its row slice
//! ([`RegLayout::Row`]), where the register of a row is replicated over the four
//! lanes of a quad that hold the row's columns. Reducing `p` fully costs,
//! per row and iteration, two shuffles and two adds after each lane's fold,
//! and keeps their temporaries live among the `mma`s. The recurrence is
//! linear in `l` and `alpha` is the same in the four lanes, so when each
//! lane carries its own `l` with its own fold of `p`, the quad's four
//! partials add up to the row's `l` at every iteration. A carried `f32` row
//! vector `l` qualifies when its only use in the body is `l * alpha + s` or
//! `l + s` (either operand order), `s = sum(p, 1)` of an accumulator-layout
//! `p` with at least [`MIN_COLS`] columns per warp or several warps along
//! `N` (below), the product and `s` used only by that sum, and the sum used
//! only by the `yield`. Then:
//! - the loop's initial `l` enters as partials: the value in the quad's
//!   first lane, zero in the other three ([`Lowerer::quad_partials`]);
//! - `s` stops after each lane's fold (`reduce.rs`, no shuffles);
//! - the loop's result adds the quad's partials with the same two
//!   shuffles, once (`Lowerer::quad_sum`, the full reduction's butterfly).
//!
//! With several warps along `N` (a decode tile whose warps split the keys)
//! the full reduction also exchanges the warps' sums through shared
//! memory, between two barriers, at every iteration. Such a tile's row
//! sums stay partial whatever its width: each warp's lanes carry their own
//! folds (the initial `l` only in the first warp's quad leaders), and the
//! loop's result adds the quads', then the warps' sums, once
//! ([`Lowerer::warp_row_sums`]). `alpha` is the same in every warp (the
//! running max is reduced over all of them), so the recurrence still adds
//! up.
//!
//! Invariant: a partial value is never read outside that chain (the use
//! conditions above), so no other lowering sees one. The sum is
//! reassociated (each lane sums its columns across iterations before the
//! quad adds), which changes the rounding but not the precision.

use super::Lowerer;
use super::Regs;
use super::assign::Assignment;
use super::reduce::Comb;
use crate::Result;
use crate::fragment::{MmaLayout, RegLayout};
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::{ArithOp, BinaryOp, ControlOp, ReduceKind};
use dsl_core::ir::{Inst, Op, Value};
use inkwell::IntPredicate;
use inkwell::values::BasicValueEnum;
use rustc_hash::{FxHashMap, FxHashSet};

/// The narrowest warp tile (columns of `p` per warp) whose row sums stay
/// partial when one warp holds a row's columns. At 32 columns (FlashAttention's `mma.sync` 128 x 32 tile at
/// head dim 128) ptxas, once the shuffles are gone, issues one k step's
/// 16 exponentials in a row after the other k step's `mma`s instead of
/// among them, which loses over large pages; 64-column tiles gain, and the
/// 128 x 64 tile at head dim 128 no longer spills its row sums in the loop.
const MIN_COLS: usize = 64;

/// The partial row sums of a kernel (see the module documentation).
#[derive(Default)]
pub(crate) struct Partials {
    /// Row reductions whose result stays per-lane (no shuffles).
    pub sums: FxHashSet<Inst>,
    /// Per `for`: the indices (among its carried values) held as partials,
    /// with the accumulator layout of the tile each sums.
    pub carried: FxHashMap<Inst, Vec<(usize, MmaLayout)>>,
}

/// Finds the carried row sums of `f` that stay partial.
pub(crate) fn plan(f: &Function, lays: &Assignment) -> Partials {
    let users = f.users();
    let mut out = Partials::default();
    f.walk(|fi| {
        if !matches!(f.insts[fi].op, Op::Control(ControlOp::For)) {
            return;
        }
        let body = f.entry(f.insts[fi].regions[0]);
        let Some(&y) = f.blocks[body].insts.last() else { return };
        if !matches!(f.insts[y].op, Op::Control(ControlOp::Yield)) {
            return;
        }
        for (k, &arg) in f.blocks[body].args.iter().skip(1).enumerate() {
            let Some(&next) = f.insts[y].args.get(k) else { continue };
            if let Some((red, ml)) = carried_sum(f, lays, &users, arg, next, y) {
                out.sums.insert(red);
                out.carried.entry(fi).or_default().push((k, ml));
            }
        }
    });
    out
}

/// The reduction `s` when `next = l * alpha + s` (or `l + s`) qualifies for
/// carried argument `l` yielded by `y` (see the module documentation).
fn carried_sum(
    f: &Function,
    lays: &Assignment,
    users: &FxHashMap<Value, Vec<Inst>>,
    l: Value,
    next: Value,
    y: Inst,
) -> Option<(Inst, MmaLayout)> {
    let only = |v: Value, u: Inst| users.get(&v).is_some_and(|us| us.as_slice() == [u]);
    let row = match lays.lay(l) {
        RegLayout::Row(r) => r,
        _ => return None,
    };
    let same = |v: Value| lays.lay(v) == RegLayout::Row(row) && f.ty(v) == f.ty(l);
    if f.ty(l).dtype() != DType::F32 || !same(next) || !only(next, y) {
        return None;
    }
    let binary = |v: Value, op: BinaryOp| {
        let d = f.def_inst(v)?;
        (f.insts[d].op == Op::Arith(ArithOp::Binary(op))).then_some(d)
    };
    let add = binary(next, BinaryOp::Add)?;
    let [x, z] = f.insts[add].args[..] else { return None };
    // `s` is the operand that a row sum of an accumulator tile defines.
    let sum_of = |s: Value| {
        let d = f.def_inst(s)?;
        let Op::Reduce(r) = f.insts[d].op else { return None };
        let p = *f.insts[d].args.first()?;
        let RegLayout::Mma(ml) = lays.lay(p) else { return None };
        let ok = r.kind == ReduceKind::Sum
            && r.axis + 1 == f.ty(p).rank()
            && (ml.warps_n > 1 || ml.tile_n() >= MIN_COLS)
            && same(s)
            && only(s, add);
        ok.then_some((d, ml))
    };
    let (red, other) = match (sum_of(x), sum_of(z)) {
        (Some(d), _) => (d, z),
        (None, Some(d)) => (d, x),
        _ => return None,
    };
    if other == l {
        return only(l, add).then_some(red);
    }
    let mul = binary(other, BinaryOp::Mul)?;
    let [u, w] = f.insts[mul].args[..] else { return None };
    let alpha_ok = (u == l) != (w == l);
    (alpha_ok && same(other) && only(other, add) && only(l, mul)).then_some(red)
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// A row vector's registers as partials of a sum over the tile of
    /// layout `l`: each value in the first lane of its quad in the first
    /// warp along `N`, zero in every other lane.
    pub(super) fn quad_partials(
        &self,
        regs: &[BasicValueEnum<'ctx>],
        l: &MmaLayout,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let q = self.b.build_and(self.tid, self.i32c(3), "")?;
        let mut first = self.b.build_int_compare(IntPredicate::EQ, q, self.i32c(0), "")?;
        if l.warps_n > 1 {
            let (_, wn, _) = self.warp_coords(l)?;
            let w0 = self.b.build_int_compare(IntPredicate::EQ, wn, self.i32c(0), "")?;
            first = self.b.build_and(first, w0, "")?;
        }
        let zero = self.ctx.f32_type().const_zero();
        regs.iter().map(|&v| Ok(self.b.build_select(first, v, zero.into(), "")?)).collect()
    }

    /// The row sums that partials (see [`Self::quad_partials`]) over the
    /// tile of layout `l` add up to: the quad's, then (several warps along
    /// `N`) the warps' (uniform control flow: barriers).
    pub(super) fn warp_row_sums(
        &mut self,
        regs: &[BasicValueEnum<'ctx>],
        l: &MmaLayout,
    ) -> Result<Regs<'ctx>> {
        let quads = self.quad_sum(regs)?;
        if l.warps_n == 1 {
            return Ok(quads);
        }
        let rows = quads.into_iter().map(|v| vec![v]).collect();
        let sums = self.cross_warp_rows(Comb::Sum, DType::F32, l, rows)?;
        Ok(sums.into_iter().map(|v| v[0]).collect())
    }
}
