//! The pipelining decisions (see the module documentation of `pipeline/`):
//! which loads of which loops become rings, in which form, how far ahead,
//! and which `wgmma` candidates they feed.

use super::super::dot::plan::MmaPlan;
use super::{AStage, FragB, PipeLoad, PipeLoop, Pipeline, TmaLoad, staged_cols, swizzled};
use crate::blocked::BlockedLayout;
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::{ControlOp, MemoryOp};
use dsl_core::ir::{Block, Inst, Op, Value};
use dsl_core::passes::axis::AxisAnalysis;
use dsl_core::passes::block_load::BlockLoad;
use rustc_hash::{FxHashMap, FxHashSet};

/// Decides which loads of `f` are pipelined `stages` deep, on a target
/// whose programs may use `max_shared` bytes of shared memory.
#[allow(clippy::too_many_arguments)]
pub(crate) fn analyze(
    f: &Function,
    plan: &MmaPlan,
    axis: &AxisAnalysis,
    blocks: &FxHashMap<Inst, BlockLoad>,
    threads: usize,
    spt_cap: usize,
    stages: usize,
    max_shared: u64,
) -> Pipeline {
    let mut p = Pipeline::default();
    if stages < 2 {
        return p;
    }
    let users = f.users();
    let mut fors = Vec::new();
    f.walk(|i| {
        if matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
            fors.push(i);
        }
    });
    // Loop-invariant `a` operands of `wgmma` candidates that may reside in
    // shared memory, with the products reading them.
    let mut invariant: FxHashMap<Value, Vec<Inst>> = FxHashMap::default();
    for fi in fors {
        let body = f.entry(f.insts[fi].regions[0]);
        // A loop that waits for or acquires from other programs reads what
        // they release: prefetching a later iteration's loads would read
        // before the wait (a persistent kernel's task loop).
        if has_nested_loop(f, body) || synchronizes(f, body) {
            continue;
        }
        let iv = f.blocks[body].args[0];
        let stores = body_stores(f, body);
        let mut loads = Vec::new();
        let mut slice: FxHashSet<Inst> = FxHashSet::default();
        for &i in &f.blocks[body].insts {
            let Some((ptr, mask)) = copyable(f, i) else { continue };
            let Some(key) = dot_use(f, plan, &users, body, f.insts[i].results[0]) else { continue };
            let ty = f.ty(f.insts[i].results[0]);
            // FP8 tiles only feed native FP8 `wgmma`s (`dot::plan`), which
            // read both operands from swizzle atoms copied by TMA.
            if ty.rank() != 2 || !(matches!(ty.dtype(), DType::F16 | DType::BF16) || ty.dtype().is_f8()) {
                continue;
            }
            let l = BlockedLayout::with_cap(ty.numel(), threads, spt_cap);
            let cols = ty.shape[1];
            let eb = ty.dtype().size_bytes();
            let w = (axis.masked_vector_width(ptr, mask, 1, eb as u32) as usize).clamp(1, l.spt);
            if !matches!(w * eb, 4 | 8 | 16) || l.spt > cols || l.replicated() {
                continue;
            }
            let roots: Vec<Value> = std::iter::once(ptr).chain(mask).collect();
            let Some(s) = backward_slice(f, body, iv, &roots, stores) else { continue };
            slice.extend(s);
            let units = cols * eb / 2;
            let stage_bytes = ((ty.shape[0] * staged_cols(units) * 2) as u64).div_ceil(16) * 16;
            let rows = ty.shape[0];
            loads.push(PipeLoad {
                load: i,
                cols,
                elem_bytes: eb,
                stage_bytes,
                ring_off: 0,
                width: w,
                rows,
                atoms: false,
                tma: None,
                regs: false,
                run: 1,
                frag: false,
            });
            p.by_dot.insert(key, i);
            p.loads.insert(i);
        }
        // Loads that reach a tensor-core operand through arithmetic, FP8
        // codes widened and scaled, say: copied the same way, read back
        // into registers by the body (`PipeLoad::regs`), as long as the
        // loop's rings stay within half the target's shared memory (the
        // widened operands are staged for the tensor cores above them).
        let mut widened: Vec<(PipeLoad, FxHashSet<Inst>)> = Vec::new();
        for i in widened_operand_loads(f, plan, body) {
            if p.loads.contains(&i) {
                continue;
            }
            let Some((ptr, mask)) = copyable(f, i) else { continue };
            let ty = f.ty(f.insts[i].results[0]);
            if ty.rank() == 0 {
                continue;
            }
            let l = BlockedLayout::with_cap(ty.numel(), threads, spt_cap);
            let eb = ty.dtype().size_bytes();
            let last = ty.rank() - 1;
            let cols = ty.shape[last];
            // A pointer repeated along the rows (a per-row scale broadcast
            // over the columns) is copied once per run of equal addresses
            // (and mask values), whole chunks to a run.
            let constant = |v: Value| axis.get(v).constancy.get(last).copied().unwrap_or(1).max(1);
            let c = mask.map_or(constant(ptr), |m| constant(ptr).min(constant(m)));
            let run = if c < 2 { 1 } else { (1usize << c.min(cols as u64).ilog2()).min(cols) };
            let w = if run > 1 {
                1
            } else {
                (axis.masked_vector_width(ptr, mask, last, eb as u32) as usize).clamp(1, l.spt)
            };
            let runs_ok = run == 1 || run.is_multiple_of(l.spt);
            let bytes_ok = matches!(w * eb, 4 | 8 | 16);
            if !bytes_ok || !runs_ok || !l.spt.is_multiple_of(w) {
                continue;
            }
            let roots: Vec<Value> = std::iter::once(ptr).chain(mask).collect();
            let Some(s) = backward_slice(f, body, iv, &roots, stores) else { continue };
            let load = PipeLoad {
                load: i,
                cols,
                elem_bytes: eb,
                stage_bytes: ((ty.numel() / run * eb) as u64).div_ceil(16) * 16,
                ring_off: 0,
                width: w,
                rows: ty.numel() / cols.max(1),
                atoms: false,
                tma: None,
                regs: true,
                run,
                frag: false,
            };
            widened.push((load, s));
        }
        let ring = |l: &PipeLoad| l.stage_bytes.next_multiple_of(1024) * stages as u64;
        let rings = loads.iter().map(ring).sum::<u64>() + widened.iter().map(|(l, _)| ring(l)).sum::<u64>();
        if rings <= max_shared / 2 {
            for (load, s) in widened {
                slice.extend(s);
                p.loads.insert(load.load);
                p.regs.insert(load.load);
                loads.push(load);
            }
        }
        // `mma.sync` products whose `b` is such a widened FP8 tile take
        // their B fragments from the codes' ring (`FragB`).
        for (d, fb) in frag_b_dots(f, plan, &users, body, &loads, &p) {
            for ld in loads.iter_mut() {
                if ld.load == fb.codes {
                    ld.frag = true;
                    ld.stage_bytes = ((ld.rows * super::frag_row_bytes(ld.cols)) as u64).div_ceil(16) * 16;
                }
            }
            p.regs.remove(&fb.codes);
            for r in &fb.rows {
                p.regs.remove(r);
            }
            p.frag_chain.extend(fb.chain.iter().copied());
            if fb.k_major {
                p.frag_a.insert((f.insts[d].args[0], plan.dots[&d]));
            }
            p.frag_b.insert(d, fb);
        }
        if loads.is_empty() {
            continue;
        }
        // `wgmma` candidates of this body whose `b` is pipelined in swizzle
        // atoms (1024-byte aligned, whole 8-row groups); `a` too when it is
        // pipelined with 128-byte rows, otherwise it comes from registers.
        let mut wgmma = false;
        // Whether every candidate's `a` is A fragments formed in this body
        // (a dequantized tile, say), and whether every candidate's result
        // only feeds the `yield`.
        let mut formed_a = true;
        let mut only_yield = true;
        let mut ours = Vec::new();
        let mut cands: Vec<Inst> = plan.wgmma.keys().copied().collect();
        cands.sort();
        for d in cands {
            if f.insts[d].parent != Some(body) {
                continue;
            }
            let idx = |o: usize| {
                let ld = p.by_dot.get(&(d, o))?;
                loads.iter().position(|x| x.load == *ld && swizzled(x.units()) && x.rows.is_multiple_of(8))
            };
            let (a, Some(b)) = (idx(0), idx(1)) else { continue };
            // An FP8 product reads both operands K-major from the rings.
            if f.ty(f.insts[d].args[0]).dtype().is_f8() && (a.is_none() || !plan.b_trans.contains_key(&d)) {
                continue;
            }
            loads[b].atoms = true;
            // A deferred register-A group's A fragments stay untouched into
            // the next iteration (`control.rs` carries them to its wait).
            match a {
                Some(a) => {
                    loads[a].atoms = true;
                    formed_a = false;
                }
                None => {
                    // Computed by the body, not a pipelined load whose
                    // fragments come from the ring (the K=32 matmul tiles).
                    let av = f.insts[d].args[0];
                    let def = f.def_inst(av);
                    let computed = def.is_some_and(|i| f.insts[i].parent == Some(body))
                        && !p.by_dot.contains_key(&(d, 0));
                    formed_a &= computed;
                    if computed && swizzled(f.ty(av).shape[1]) && !from_dot(f, body, av) {
                        p.wgmma_staged.insert(d);
                    } else if may_reside(f, plan, body, d) {
                        invariant.entry(av).or_default().push(d);
                    } else {
                        p.wgmma_rs.insert(d);
                    }
                }
            }
            p.wgmma.insert(d);
            wgmma = true;
            ours.push(d);
            let r = f.insts[d].results[0];
            only_yield &= users.get(&r).is_some_and(|us| {
                us.iter().all(|&u| {
                    matches!(f.insts[u].op, Op::Control(ControlOp::Yield)) && f.insts[u].parent == Some(body)
                })
            });
        }
        // Deferring costs one stage of prefetch distance. With operands
        // from shared memory it pays from four stages on (two tiles still in
        // flight; with one, at three stages, the copies are exposed). When
        // the body forms the A fragments itself, deferring is what lets
        // that math overlap the running group, and one tile in flight is
        // enough.
        let defer = wgmma && only_yield && (stages >= 4 || (stages == 3 && formed_a));
        if defer {
            let large = ours
                .iter()
                .any(|d| plan.dots.get(d).is_some_and(|l| l.regs() >= super::super::assign::LARGE_ACC));
            p.body_forms_a |= formed_a && large;
            p.deferred.extend(ours.iter().copied());
        }
        let ahead = if defer { stages - 2 } else { stages - 1 };
        // `load_block`s in swizzle atoms whose matrix the host can describe
        // are copied by TMA boxes (`crate::tensor_map`), which write exactly the
        // atoms' layout.
        for ld in loads.iter_mut().filter(|l| l.atoms) {
            let Some(bl) = blocks.get(&ld.load) else { continue };
            let dtype = f.ty(f.insts[ld.load].results[0]).dtype();
            let Some(spec) = crate::tensor_map::spec_for(f, bl, dtype) else { continue };
            let map = match p.tensor_maps.iter().position(|s| *s == spec) {
                Some(m) => m,
                None => {
                    p.tensor_maps.push(spec);
                    p.tensor_maps.len() - 1
                }
            };
            ld.tma = Some(TmaLoad { map, row0: bl.row0, col0: bl.col0 });
        }
        let mut ring = 0u64;
        for ld in &mut loads {
            // Swizzle atoms, and swizzled rows in whole 1024-byte stages (so
            // that `ldmatrix` addresses are one XOR from the stage's, see
            // `dot/mma.rs`), start 1024-byte aligned.
            if !ld.regs && (ld.atoms || (swizzled(ld.units()) && ld.stage_bytes.is_multiple_of(1024))) {
                ring = ring.next_multiple_of(1024);
            }
            ld.ring_off = ring;
            ring += ld.stage_bytes * stages as u64;
        }
        // Computed `a` operands staged for `wgmma` (`dot/wgmma.rs`).
        let mut a_stages = Vec::new();
        for &d in ours.iter().filter(|d| p.wgmma_staged.contains(d)) {
            let ty = f.ty(f.insts[d].args[0]);
            let stage_bytes = (ty.numel() * 2) as u64;
            ring = ring.next_multiple_of(1024);
            a_stages.push(AStage { dot: d, ring_off: ring, stage_bytes });
            ring += stage_bytes * stages as u64;
        }
        // The mbarriers follow the rings; what follows them (the scratch
        // region of the loop body) starts 128-byte aligned again.
        let released = !defer && a_stages.is_empty() && loads.iter().all(|l| l.tma.is_some());
        let bars = loads.iter().any(|l| l.tma.is_some()).then(|| {
            let at = ring.next_multiple_of(8);
            let n = if released { 2 * stages } else { stages };
            ring = (at + 8 * n as u64).next_multiple_of(128);
            at
        });
        p.ring_bytes = p.ring_bytes.max(ring);
        let ordered: Vec<Inst> = f.blocks[body].insts.iter().copied().filter(|i| slice.contains(i)).collect();
        // Slice ops whose every user is a pipelined load or such an op.
        let mut dead: FxHashSet<Inst> = FxHashSet::default();
        for &i in ordered.iter().rev() {
            let only = f.insts[i].results.iter().all(|r| {
                users.get(r).is_none_or(|us| us.iter().all(|u| p.loads.contains(u) || dead.contains(u)))
            });
            if only {
                dead.insert(i);
            }
        }
        p.dead.extend(dead);
        let feed: Vec<Inst> = ordered
            .iter()
            .copied()
            .filter(|&i| matches!(f.insts[i].op, Op::Memory(MemoryOp::Load { .. })))
            .collect();
        let feed_roots: Vec<Value> = feed.iter().flat_map(|&i| f.insts[i].args.iter().copied()).collect();
        let mut feed_set = backward_slice(f, body, iv, &feed_roots, stores).unwrap_or_default();
        feed_set.extend(feed.iter().copied());
        let feed_slice = ordered.iter().copied().filter(|i| feed_set.contains(i)).collect();
        let staged: Vec<Inst> = a_stages.iter().map(|a| a.dot).collect();
        let unroll = yields_loads_after(f, body, &staged);
        let mut dots = plan.dots.keys().copied().filter(|&d| f.insts[d].parent == Some(body));
        let only = dots.next().filter(|_| dots.next().is_none());
        let issue_after = only.filter(|_| !wgmma && loads.iter().all(|l| l.tma.is_none()));
        let pl = PipeLoop {
            stages,
            loads,
            slice: ordered,
            feed,
            feed_slice,
            wgmma,
            ahead,
            bars,
            released,
            a_stages,
            unroll,
            issue_after,
        };
        p.loops.insert(fi, pl);
    }
    // An operand resides when every one of its uses is such a product;
    // otherwise its products take it as register A fragments.
    let mut vals: Vec<(Value, Vec<Inst>)> = invariant.into_iter().collect();
    vals.sort_by_key(|(v, _)| *v);
    for (v, ds) in vals {
        if users.get(&v).is_some_and(|us| us.iter().all(|u| ds.contains(u))) {
            p.resident.insert(v, p.resident_bytes);
            p.resident_bytes += (f.ty(v).numel() * 2) as u64;
            p.wgmma_resident.extend(ds);
        } else {
            p.wgmma_rs.extend(ds);
        }
    }
    p
}

/// The loads of block `body` that reach an operand of one of its planned
/// tensor-core `dot`s through region-free ops of the same block, not
/// directly (those are staged operands), for the operands that are widened
/// FP8 tiles scaled by arithmetic: among their loads is an FP8 tile and
/// among their ops an arithmetic one (the codes of an FP8 cache times
/// their scales). Other computed operands keep their own schedules:
/// dequantized weights, and the FP8 `dot` fallback's operands, which are
/// only cast (their rings would come on top of the product's staging,
/// which already fills shared memory).
fn widened_operand_loads(f: &Function, plan: &MmaPlan, body: Block) -> Vec<Inst> {
    let mut out: Vec<Inst> = Vec::new();
    let mut dots: Vec<Inst> =
        plan.dots.keys().copied().filter(|&d| f.insts[d].parent == Some(body)).collect();
    dots.sort();
    for d in dots {
        for &root in &f.insts[d].args[..2] {
            let mut found = Vec::new();
            let mut scaled = false;
            let mut stack = vec![root];
            let mut seen = FxHashSet::default();
            while let Some(v) = stack.pop() {
                if !seen.insert(v) {
                    continue;
                }
                let Some(i) = f.def_inst(v) else { continue };
                if f.insts[i].parent != Some(body) || !f.insts[i].regions.is_empty() {
                    continue;
                }
                match &f.insts[i].op {
                    // A load that is the operand itself is a staged operand.
                    Op::Memory(MemoryOp::Load { .. }) if v != root => found.push(i),
                    Op::Memory(_) | Op::Dot(_) | Op::Control(_) | Op::Debug(_) => {}
                    op => {
                        scaled |= matches!(op, Op::Arith(_));
                        stack.extend(f.insts[i].args.iter().copied());
                    }
                }
            }
            if scaled && found.iter().any(|&i| f.ty(f.insts[i].results[0]).dtype().is_f8()) {
                for i in found {
                    if !out.contains(&i) {
                        out.push(i);
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// The `mma.sync` `dot`s of loop body `body` that read their B fragments
/// from an FP8 ring ([`FragB`]): `b = trans(x)` with `x` an `[N, K]` tile,
/// or `b = x` itself (`[K, N]`), its rows a power of two wide, computed by
/// single-use elementwise ops of the body from loads read back into
/// registers (`loads`, `PipeLoad::regs`) and uniform values, exactly one of
/// those loads a plain FP8 tile of `x`'s shape and every other one a
/// per-row value (its runs span whole rows); a 16-bit product with one warp
/// along `M` (every B fragment is loaded by one warp). With `b = trans(x)`
/// its `a` is neither a ring stage nor an accumulator (its A fragments are
/// loaded from padded rows, in the permuted order); with `b = x` the warp
/// tiles are a multiple of 16 columns wide (the interleaved accumulator).
fn frag_b_dots(
    f: &Function,
    plan: &MmaPlan,
    users: &FxHashMap<Value, Vec<Inst>>,
    body: Block,
    loads: &[PipeLoad],
    p: &Pipeline,
) -> Vec<(Inst, FragB)> {
    let mut dots: Vec<Inst> = plan
        .dots
        .keys()
        .copied()
        .filter(|&d| f.insts[d].parent == Some(body) && !plan.wgmma.contains_key(&d))
        .collect();
    dots.sort();
    let order: FxHashMap<Inst, usize> =
        f.blocks[body].insts.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let single = |v: Value| users.get(&v).is_some_and(|us| us.len() == 1);
    let mut out = Vec::new();
    'dots: for d in dots {
        let l = plan.dots[&d];
        let a = f.insts[d].args[0];
        let (k_major, x) = match plan.b_trans.get(&d) {
            Some(&x) => (true, x),
            None => (false, f.insts[d].args[1]),
        };
        let xt = f.ty(x);
        if l.warps_m != 1
            || !matches!(f.ty(a).dtype(), DType::F16 | DType::BF16)
            || (k_major && (p.by_dot.contains_key(&(d, 0)) || derives_from_dot(f, a)))
            || (!k_major && (p.by_dot.contains_key(&(d, 1)) || l.interleave().is_none()))
            || xt.rank() != 2
            || !xt.shape[1].is_power_of_two()
            || !single(x)
        {
            continue;
        }
        // `n` rows of `k` codes each as staged (for `b = x`: `K` rows of
        // `N`).
        let (n, k) = (xt.shape[0], xt.shape[1]);
        let mut chain = Vec::new();
        let mut codes = None;
        let mut rows = Vec::new();
        let mut stack = vec![x];
        let mut seen = FxHashSet::default();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            if super::super::assign::is_uniform(f, v) && v != x {
                continue;
            }
            let Some(i) = f.def_inst(v) else { continue 'dots };
            if f.insts[i].parent != Some(body) || !single(v) {
                continue 'dots;
            }
            if let Some(ld) = loads.iter().find(|ld| ld.load == i) {
                if !ld.regs || f.ty(v).shape != xt.shape {
                    continue 'dots;
                }
                if f.ty(v).dtype().is_f8() && ld.run == 1 && codes.is_none() {
                    codes = Some(i);
                } else if ld.run.is_multiple_of(k) {
                    rows.push(i);
                } else {
                    continue 'dots;
                }
                continue;
            }
            if !super::super::assign::is_elementwise(&f.insts[i].op) || f.insts[i].results.len() != 1 {
                continue 'dots;
            }
            chain.push(i);
            stack.extend(f.insts[i].args.iter().copied());
        }
        let Some(codes) = codes else { continue };
        if n == 0 || chain.is_empty() {
            continue;
        }
        chain.sort_by_key(|i| order.get(i).copied().unwrap_or(usize::MAX));
        rows.sort();
        out.push((d, FragB { k_major, x, codes, rows, chain }));
    }
    out
}

/// Whether `v` is computed from the result of a `dot` (anywhere in `f`): an
/// accumulator-layout value, whose registers are A fragments already.
pub(crate) fn derives_from_dot(f: &Function, v: Value) -> bool {
    let mut stack = vec![v];
    let mut seen = FxHashSet::default();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        let Some(d) = f.def_inst(v) else { continue };
        if matches!(f.insts[d].op, Op::Dot(_)) {
            return true;
        }
        stack.extend(f.insts[d].args.iter().copied());
    }
    false
}

/// Whether the `a` of the `wgmma` candidate `d` (in loop body `body`) may
/// reside in shared memory ([`Pipeline::resident`]): a tile computed outside
/// the loop, not from a product, of 16-bit elements, with rows of exactly 128 bytes (`K = 64`,
/// one column block of swizzle atoms) and the product's `M` rows, a
/// multiple of 64 (one warpgroup's rows each).
///
/// Wider operands keep register A: each `k` step of an SS-mode `wgmma`
/// reads its `a` from shared memory again, which at FlashAttention's head
/// dim 128 costs more than the registers it saves (they do not buy another
/// program per SM there). At head dim 64 the saved registers let one more
/// program onto each SM, which pays.
fn may_reside(f: &Function, plan: &MmaPlan, body: Block, d: Inst) -> bool {
    let av = f.insts[d].args[0];
    let Some(def) = f.def_inst(av) else { return false };
    let ty = f.ty(av);
    f.insts[def].parent != Some(body)
        && !derives_from_dot(f, av)
        && ty.rank() == 2
        && matches!(ty.dtype(), DType::F16 | DType::BF16)
        && ty.shape[1] == 64
        && ty.shape[0].is_multiple_of(64)
        && plan.dots.get(&d).is_some_and(|l| l.m == ty.shape[0])
}

/// The `(dot, operand)` whose staged operand is `v` (directly, or through a
/// permute the plan reads in place), when that is `v`'s only use and the
/// `dot` is planned and in block `body`.
fn dot_use(
    f: &Function,
    plan: &MmaPlan,
    users: &FxHashMap<Value, Vec<Inst>>,
    body: Block,
    v: Value,
) -> Option<(Inst, usize)> {
    let us = users.get(&v)?;
    let [u] = us.as_slice() else { return None };
    if plan.skipped.contains(u) {
        // `trans(x)` read in place: the dot whose `b_trans` is `v`.
        let (&d, _) = plan.b_trans.iter().find(|&(_, &x)| x == v)?;
        return (f.insts[d].parent == Some(body)).then_some((d, 1));
    }
    if !plan.dots.contains_key(u) || f.insts[*u].parent != Some(body) {
        return None;
    }
    let args = &f.insts[*u].args;
    if args[0] == v && args[1] != v {
        Some((*u, 0))
    } else if args[1] == v && args[0] != v && !plan.b_trans.contains_key(u) {
        Some((*u, 1))
    } else {
        None
    }
}

/// The body instructions `roots` depend on, when every path leads to the
/// induction variable `iv`, values from outside the loop, or (when the body
/// has no stores) loads; `None` when something else is in the way.
fn backward_slice(
    f: &Function,
    body: Block,
    iv: Value,
    roots: &[Value],
    stores: bool,
) -> Option<FxHashSet<Inst>> {
    let mut out = FxHashSet::default();
    let mut stack: Vec<Value> = roots.to_vec();
    let mut seen = FxHashSet::default();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        let Some(d) = f.def_inst(v) else {
            // A block argument: the induction variable of this loop, or an
            // argument of an enclosing block (defined before the loop).
            let inside = f.blocks[body].args.contains(&v);
            if inside && v != iv {
                return None;
            }
            continue;
        };
        if f.insts[d].parent != Some(body) {
            continue;
        }
        let ok = match &f.insts[d].op {
            Op::Memory(MemoryOp::Load { volatile, order, .. }) => !volatile && order.is_none() && !stores,
            Op::Memory(_) | Op::Dot(_) | Op::Control(_) | Op::Debug(_) => false,
            _ => f.insts[d].regions.is_empty(),
        };
        if !ok {
            return None;
        }
        out.insert(d);
        stack.extend(f.insts[d].args.iter().copied());
    }
    Some(out)
}

/// True when `v` depends, inside block `body`, on the result of a `dot`
/// (attention probabilities, say), also through a carried value that the
/// body yields from one (scores computed an iteration ahead): such a tile is
/// computed in the accumulator's layout, from which the A fragments are
/// taken in registers.
fn from_dot(f: &Function, body: Block, v: Value) -> bool {
    let mut stack = vec![v];
    let mut seen = FxHashSet::default();
    let args = &f.blocks[body].args;
    let yielded = f.blocks[body].insts.last().map(|&y| &f.insts[y].args);
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        let Some(d) = f.def_inst(v) else {
            // A carried value (argument `j` of the body, after the
            // induction variable): what the body yields in its place.
            if let (Some(j), Some(ys)) = (args.iter().position(|&a| a == v), yielded)
                && j > 0
                && let Some(&y) = ys.get(j - 1)
            {
                stack.push(y);
            }
            continue;
        };
        if f.insts[d].parent != Some(body) {
            continue;
        }
        if matches!(f.insts[d].op, Op::Dot(_)) {
            return true;
        }
        stack.extend(f.insts[d].args.iter().copied());
    }
    false
}

/// True when block `body` yields the result of one of its own loads issued
/// after one of the `dots` (a prefetch for a later iteration that the
/// staged product's proxy fence does not wait for).
fn yields_loads_after(f: &Function, body: Block, dots: &[Inst]) -> bool {
    let insts = &f.blocks[body].insts;
    let Some(first) = insts.iter().position(|i| dots.contains(i)) else { return false };
    let Some(&y) = insts.last() else { return false };
    f.insts[y].args.iter().any(|&v| {
        f.def_inst(v).is_some_and(|d| {
            matches!(f.insts[d].op, Op::Memory(MemoryOp::Load { .. }))
                && insts.iter().position(|&i| i == d).is_some_and(|at| at > first)
        })
    })
}

/// The pointer and mask of `i` when it is a load the pipeline may copy: a
/// plain (not volatile, unordered) load whose `other` is absent or zero,
/// the value a zero-filling copy gives masked-off elements.
fn copyable(f: &Function, i: Inst) -> Option<(Value, Option<Value>)> {
    let Op::Memory(op @ MemoryOp::Load { volatile: false, order: None, .. }) = &f.insts[i].op else {
        return None;
    };
    let ops = op.load_operands(&f.insts[i].args)?;
    if ops.other.is_some_and(|o| !is_zero(f, o)) {
        return None;
    }
    Some((ops.ptr, ops.mask))
}

/// True when `v` is a constant zero.
fn is_zero(f: &Function, v: Value) -> bool {
    f.as_constant(v).is_some_and(|s| s.as_f64() == 0.0)
}

/// True when block `b` (or a region inside it) contains a `for` or `while`.
fn has_nested_loop(f: &Function, b: Block) -> bool {
    f.blocks[b].insts.iter().any(|&i| {
        matches!(f.insts[i].op, Op::Control(ControlOp::For | ControlOp::While))
            || f.insts[i].regions.iter().any(|&r| has_nested_loop(f, f.entry(r)))
    })
}

/// True when block `b` (or a region inside it) synchronises with other
/// programs (`MemoryOp::synchronizes`: waits, acquires, releases).
fn synchronizes(f: &Function, b: Block) -> bool {
    f.blocks[b].insts.iter().any(|&i| {
        matches!(&f.insts[i].op, Op::Memory(m) if m.synchronizes())
            || f.insts[i].regions.iter().any(|&r| synchronizes(f, f.entry(r)))
    })
}

/// True when block `b` (or a region inside it) stores or performs atomics.
fn body_stores(f: &Function, b: Block) -> bool {
    f.blocks[b].insts.iter().any(|&i| {
        matches!(
            f.insts[i].op,
            Op::Memory(
                MemoryOp::Store { .. }
                    | MemoryOp::Atomic { .. }
                    | MemoryOp::AtomicCas { .. }
                    | MemoryOp::WaitUntil { .. }
                    | MemoryOp::WaitLoad { .. }
            )
        ) || f.insts[i].regions.iter().any(|&r| body_stores(f, f.entry(r)))
    })
}
