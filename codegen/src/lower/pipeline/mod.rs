//! Software pipelining of `dot` operands with `cp.async` (`num_stages` deep).
//!
//! A `for` whose body loads an operand of a tensor-core `dot` (directly, or
//! the `[N, K]` tile of a `b = trans(x)` the plan reads in place) gets a ring
//! of `num_stages` shared-memory buffers per such load (`[rows, cols]` rows
//! of 128 bytes or more XOR-swizzled, see [`swizzled`]; narrower rows padded
//! to `[rows, cols + ROW_PAD]` as the `dot` stages them), and the loads
//! become asynchronous copies (`cp.async`, 16/8/4 bytes per thread chunk,
//! masked lanes zero-filled with a source size of 0) issued
//! `num_stages - 1` iterations ahead:
//!
//! ```text
//! prologue:  for j in 0..S-1: copy the tiles of iteration lb + j*step (if < ub); commit
//! body i:    wait until the group of iteration i landed (wait_group S-2); barrier
//!            copy the tiles of iteration i + S-1 (if < ub) into the stage read
//!            in iteration i-1; commit (an `mma.sync` GEMM: after its `dot`'s
//!            `mma`s instead, branch-free, see `PendingIssue`)
//!            ... the body; its dots read stage i mod S instead of staging ...
//! exit:      wait_group 0; barrier
//! ```
//!
//! The barrier after the wait makes every thread's copies visible and
//! guarantees that every thread finished reading the stage about to be
//! overwritten (it was read one iteration earlier). One group is committed
//! per prologue step and per iteration, even when empty, so the count the
//! wait names is exact.
//!
//! A load qualifies when (see [`analyze`]): its only use is that `dot`
//! operand, in the same body block; it is not volatile and its `other` is
//! absent or zero; its chunk accesses are 4, 8 or 16 bytes wide with one
//! mask value per chunk (the axis analysis); and its address and mask depend
//! only on the induction variable and values from outside the loop, through
//! region-free pure ops and loads (loads only when nothing in the body
//! stores), so they can be evaluated for a later iteration ([`Lowerer`] lowers
//! that slice again with the induction variable replaced; loads in it are
//! masked off past the end). Slice ops used by nothing else are not lowered
//! in the body at all. Loops with nested loops are left alone.
//!
//! `wgmma` (sm_90a, `dot/wgmma.rs`): when a planned `wgmma` candidate has
//! its `b` pipelined here (and its `a`, unless `a` is read from registers),
//! their stages hold 128-byte swizzle atoms
//! ([`atom_index`], 1024-byte aligned) that the tensor cores read in place,
//! each thread fences its landed copies for the async proxy before the
//! barrier, and from four stages on (three when every candidate's A
//! fragments are computed by the body) the loop defers its groups: each
//! iteration leaves its `wgmma` group running (`wait_group 1`) and copies
//! `S - 2` iterations ahead (into the stage the finished group read, not the
//! running one); the exit waits for the last group before the accumulators
//! are read or the ring is handed over, and such a loop is entered only when
//! it has an iteration (see `control.rs`). An `a` the body computes from
//! loads (a dequantization, say; not from an earlier product, whose
//! accumulator registers are A fragments already) with rows of 128 bytes
//! gets a ring of its own ([`PipeLoop::a_stages`]): the iteration writes it
//! into the stage of the loads' current index and the tensor cores read it
//! in place (`dot/wgmma.rs`), so the math forming the next tile overlaps
//! the running group. The stage is free: its last reader is the group of
//! `S` iterations back, waited for before the barrier that opened the
//! previous iteration. A deferred register-A group whose A fragments are
//! formed in the body (loaded from the ring or staged) is not waited for in
//! its own iteration at all: the next iteration waits for it (`wait_group
//! 0`) right before loading its own fragments into the same registers.
//!
//! Boxes of a `load_block` (TMA, sm_90a, `tma.rs`) land on a stage
//! mbarrier instead of a `cp.async` group; a loop of boxes only hands its
//! stages back through release mbarriers instead of the CTA barrier
//! ([`PipeLoop::released`]).
//!
//! Loads inside the slice (a block table's page numbers) are themselves
//! issued one iteration earlier than the copies that need them and carried
//! in registers: iteration `i` copies iteration `i + S - 1`'s tiles with page
//! numbers loaded during iteration `i - 1`, then loads iteration `i + S`'s,
//! so no warp waits on memory to form an address.
//!
//! The rings of all pipelined loops share one region at the bottom of shared
//! memory (loops run one after another; the exit wait and barrier hand the
//! region over). Inside a pipelined loop every other use of shared memory
//! starts above it; outside, other uses start at the bottom too, so a
//! barrier before each prologue makes sure nobody still reads them there.

use super::dot::plan::MmaPlan;
use super::{Lowerer, Regs};
use crate::Result;
use crate::layout::Layout;
use crate::mma::ROW_PAD;
use crate::tma::TensorMapSpec;
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::{CacheModifier, ControlOp, MemoryOp};
use dsl_core::ir::{Block, Inst, Op, Value};
use dsl_core::passes::axis::AxisAnalysis;
use dsl_core::passes::block_load::BlockLoad;
use inkwell::IntPredicate;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use rustc_hash::{FxHashMap, FxHashSet};

mod emit;

pub(crate) use emit::PendingIssue;

/// One pipelined load.
#[derive(Clone, Debug)]
pub(crate) struct PipeLoad {
    /// The `load`.
    pub load: Inst,
    /// Columns of the loaded tile (its stage is `[rows, cols]` swizzled or
    /// `[rows, cols + ROW_PAD]` padded, see [`swizzled`]).
    pub cols: usize,
    /// Bytes of one stage (16-byte aligned).
    pub stage_bytes: u64,
    /// Byte offset of stage 0 in the ring region.
    pub ring_off: u64,
    /// Elements per `cp.async`.
    pub width: usize,
    /// Rows of the loaded tile.
    pub rows: usize,
    /// Whether the stage holds 128-byte swizzle atoms for `wgmma`
    /// ([`atom_index`]) instead of swizzled or padded rows.
    pub atoms: bool,
    /// Copied by the Tensor Memory Accelerator instead of `cp.async`.
    pub tma: Option<TmaLoad>,
}

/// A pipelined `load_block` copied by the Tensor Memory Accelerator
/// (`crate::tma`): one thread issues its boxes, which complete on the
/// stage's mbarrier.
#[derive(Clone, Debug)]
pub(crate) struct TmaLoad {
    /// Index of its tensor map among the kernel's hidden parameters.
    pub map: usize,
    /// Its first row (an i32 scalar of the body or from outside the loop).
    pub row0: Value,
    /// Its first column.
    pub col0: Value,
}

/// The pipelining of one `for`.
#[derive(Clone, Debug)]
pub(crate) struct PipeLoop {
    /// Stages (buffers per load).
    pub stages: usize,
    /// Its pipelined loads.
    pub loads: Vec<PipeLoad>,
    /// Body instructions the loads' addresses and masks depend on, in order.
    pub slice: Vec<Inst>,
    /// The loads inside `slice` (a block table's page numbers, say): they
    /// are issued one iteration before the slice needs them and carried, so
    /// computing the copies' addresses never waits on memory.
    pub feed: Vec<Inst>,
    /// The instructions of `slice` that `feed`'s loads depend on (themselves
    /// included), in order.
    pub feed_slice: Vec<Inst>,
    /// Whether a `dot` of the body runs on `wgmma` (its operands are read
    /// by the async proxy: the copies are fenced before the barrier).
    pub wgmma: bool,
    /// Iterations whose copies are in flight ahead of the one computing:
    /// `stages - 1`, or `stages - 2` when the body's `wgmma`s are deferred
    /// (one group left running across the iteration boundary still reads
    /// the stage of the previous iteration, so the prefetch skips it).
    pub ahead: usize,
    /// With TMA loads: the byte offset in the ring region of the stages'
    /// mbarriers (8 bytes each, one per stage).
    pub bars: Option<u64>,
    /// Whether the stages are handed back by mbarriers instead of the
    /// per-iteration CTA barrier (`tma.rs`): every load is a TMA box, no
    /// `wgmma` group is deferred and the body stages no `a`. Each thread
    /// arrives on its stage's release mbarrier (`stages` more after the
    /// landing ones) when its iteration is done with the stage, and thread
    /// 0 waits for all of them before it refills the stage, so warpgroups
    /// drift apart instead of meeting every iteration.
    pub released: bool,
    /// The rings of the `a` operands the body computes and stages in swizzle
    /// atoms for `wgmma` ([`Pipeline::wgmma_staged`]): one stage per ring
    /// stage, written in the iteration that reads the loads' stage of the
    /// same index.
    pub a_stages: Vec<AStage>,
    /// Whether the loop's body is emitted twice per trip (`control.rs`):
    /// it stages a computed `a` and carries into later iterations the
    /// results of loads it issues after that product (a prefetch in
    /// registers that the product's proxy fence does not wait for). With
    /// one copy of the body, ptxas moves the prefetched registers into the
    /// carried ones at the back edge, and the moves wait for the loads to
    /// land; with two, each load writes the register its consumer reads.
    /// (Measured on the swapped dequant GEMM with words two tiles ahead:
    /// M 64 x N 14336 58.8 -> 54.1 us, M 256 x N 14336 74.3 -> 73.6, H100;
    /// unrolling its stream-K form, whose loads precede the product, lost
    /// 48.3 -> 51.2 us at M 256 x N 4096.)
    pub unroll: bool,
    /// The body's only tensor-core `dot` when the loop is an `mma.sync` GEMM's
    /// (no `wgmma`, every load a `cp.async` copy): each iteration issues its
    /// copies right after that `dot`'s `mma`s ([`PendingIssue`]).
    pub issue_after: Option<Inst>,
}

/// The staging ring of a computed `wgmma` `a` operand ([`PipeLoop::a_stages`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AStage {
    /// The `dot`.
    pub dot: Inst,
    /// Byte offset of stage 0 in the ring region (1024-byte aligned).
    pub ring_off: u64,
    /// Bytes of one stage (a multiple of 1024).
    pub stage_bytes: u64,
}

impl PipeLoop {
    /// Whether the body's `wgmma` groups are deferred ([`Pipeline::deferred`]).
    pub fn deferred(&self) -> bool {
        self.ahead + 2 == self.stages
    }

    /// Whether some load is copied by `cp.async` (not TMA): the loop then
    /// commits and waits for `cp.async` groups.
    pub fn cp_async(&self) -> bool {
        self.loads.iter().any(|l| l.tma.is_none())
    }
}

/// The pipelining decisions of a function.
#[derive(Debug, Default)]
pub(crate) struct Pipeline {
    /// Pipelined loops.
    pub loops: FxHashMap<Inst, PipeLoop>,
    /// Bytes of the ring region (the largest loop's rings).
    pub ring_bytes: u64,
    /// For a `(dot, operand)` pair (operand 0: `a`, 1: `b`): its load.
    pub by_dot: FxHashMap<(Inst, usize), Inst>,
    /// Pipelined loads (not lowered in place).
    pub loads: FxHashSet<Inst>,
    /// Body instructions that only feed pipelined loads (not lowered in place).
    pub dead: FxHashSet<Inst>,
    /// `dot`s lowered to `wgmma`: planned candidates whose `b` is pipelined.
    pub wgmma: FxHashSet<Inst>,
    /// Of those, the ones whose `a` comes from A fragments in registers
    /// (it is not a load pipelined in swizzle atoms).
    pub wgmma_rs: FxHashSet<Inst>,
    /// Of those, the ones whose `a` the body computes from loads (a
    /// dequantized weight tile, not the probabilities of an earlier `dot`,
    /// which are already in A-fragment registers) with rows of 64 columns
    /// or more: it is written into a ring stage of swizzle atoms
    /// ([`PipeLoop::a_stages`]) and read by the tensor cores in place.
    pub wgmma_staged: FxHashSet<Inst>,
    /// Of those, the ones whose `a` is resident ([`Pipeline::resident`]).
    pub wgmma_resident: FxHashSet<Inst>,
    /// Loop-invariant `wgmma` `a` operands kept in shared memory for the
    /// whole kernel, with their byte offsets in the resident region at the
    /// bottom of shared memory (below the rings): a tile of 16-bit
    /// elements computed before the loops (not from a product) with
    /// 128-byte rows (`K = 64`, see [`may_reside`]), `M` rows as the
    /// products', used by nothing but `wgmma` products in loops
    /// (FlashAttention's `q` at head dim 64). It is written in swizzle atoms
    /// right after its definition (`Lowerer::lower_block`) and every product
    /// reads it by descriptor (SS mode), so neither its registers nor its A
    /// fragments stay live across the loops (the tile itself was kept for
    /// the second loop's fragments).
    pub resident: FxHashMap<Value, u64>,
    /// Loop-invariant `mma.sync` `a` operands kept in shared memory
    /// (padded rows), with their byte offsets in the same region
    /// (`dot::resident`).
    pub mma_resident: FxHashMap<Value, u64>,
    /// Bytes of the resident region (a multiple of 1024).
    pub resident_bytes: u64,
    /// Of those, the ones whose group is left running into the next
    /// iteration (`wait_group 1`): the loop-carried accumulators of loops
    /// of at least four stages (three when the body computes every A
    /// operand), used by nothing but the `yield`; their
    /// loop waits for them (`wait_group 0`) at its exit.
    pub deferred: FxHashSet<Inst>,
    /// The kernel's hidden tensor-map parameters, in order (`crate::tma`).
    pub tensor_maps: Vec<TensorMapSpec>,
    /// Some loop defers `wgmma` groups whose A fragments its body computes
    /// (the swapped dequant GEMM: the next tile's dequantization overlaps
    /// the running group) into an accumulator of at least
    /// `layouts::LARGE_ACC` registers per thread, so its schedule wants
    /// registers more than another program per SM (`.minnctapersm 1`, see
    /// `lower::lower_function`).
    pub body_forms_a: bool,
}

/// Decides which loads of `f` are pipelined `stages` deep.
pub(crate) fn analyze(
    f: &Function,
    plan: &MmaPlan,
    axis: &AxisAnalysis,
    blocks: &FxHashMap<Inst, BlockLoad>,
    threads: usize,
    spt_cap: usize,
    stages: usize,
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
            let Op::Memory(MemoryOp::Load { has_mask, has_other, volatile: false, order: None, .. }) =
                f.insts[i].op
            else {
                continue;
            };
            let Some(key) = dot_use(f, plan, &users, body, f.insts[i].results[0]) else { continue };
            let args = &f.insts[i].args;
            if has_other && !is_zero(f, args[2]) {
                continue;
            }
            let ty = f.ty(f.insts[i].results[0]);
            if ty.rank() != 2 || !matches!(ty.dtype(), DType::F16 | DType::BF16) {
                continue;
            }
            let l = Layout::with_cap(ty.numel(), threads, spt_cap);
            let cols = ty.shape[1];
            let eb = 2usize;
            let mask = has_mask.then(|| args[1]);
            let w = (axis.masked_vector_width(args[0], mask, 1, eb as u32) as usize).clamp(1, l.spt);
            if !matches!(w * eb, 4 | 8 | 16) || l.spt > cols || l.replicated() {
                continue;
            }
            let roots: Vec<Value> = args[..if has_mask { 2 } else { 1 }].to_vec();
            let Some(s) = backward_slice(f, body, iv, &roots, stores) else { continue };
            slice.extend(s);
            let stage_bytes = ((ty.shape[0] * staged_cols(cols) * eb) as u64).div_ceil(16) * 16;
            let rows = ty.shape[0];
            loads.push(PipeLoad {
                load: i,
                cols,
                stage_bytes,
                ring_off: 0,
                width: w,
                rows,
                atoms: false,
                tma: None,
            });
            p.by_dot.insert(key, i);
            p.loads.insert(i);
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
                loads.iter().position(|x| x.load == *ld && swizzled(x.cols) && x.rows.is_multiple_of(8))
            };
            let (a, Some(b)) = (idx(0), idx(1)) else { continue };
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
        // flight; at three stages the matmul lost 12% with one). When the
        // body forms the A fragments itself, deferring is what lets that
        // math overlap the running group, and one tile in flight is enough
        // (the swapped dequant GEMM at 3 stages: 102.3 -> 98.1 us on H100).
        let defer = wgmma && only_yield && (stages >= 4 || (stages == 3 && formed_a));
        if defer {
            let large =
                ours.iter().any(|d| plan.dots.get(d).is_some_and(|l| l.regs() >= super::layouts::LARGE_ACC));
            p.body_forms_a |= formed_a && large;
            p.deferred.extend(ours.iter().copied());
        }
        let ahead = if defer { stages - 2 } else { stages - 1 };
        // `load_block`s in swizzle atoms whose matrix the host can describe
        // are copied by TMA boxes (`crate::tma`), which write exactly the
        // atoms' layout.
        for ld in loads.iter_mut().filter(|l| l.atoms) {
            let Some(bl) = blocks.get(&ld.load) else { continue };
            let dtype = f.ty(f.insts[ld.load].results[0]).dtype();
            let Some(spec) = crate::tma::spec_for(f, bl, dtype) else { continue };
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
            if ld.atoms || (swizzled(ld.cols) && ld.stage_bytes.is_multiple_of(1024)) {
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
/// reads its `a` from shared memory again, which at FlashAttention's
/// head dim 128 (`m64n64k16` scores) cost more than the 70 registers it
/// saved (254 -> 184, still two programs per SM): 438 -> 405 TFLOP/s at
/// L 4096, full (H100, same call). At head dim 64 the saved registers
/// (168 -> 127) let a fourth program onto each SM: 348 -> 377 TFLOP/s
/// causal, 388 -> 402 full.
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
            )
        ) || f.insts[i].regions.iter().any(|&r| body_stores(f, f.entry(r)))
    })
}

/// How the rows of a staged `mma.sync` operand are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rows {
    /// Rows padded by `ROW_PAD` elements.
    Padded,
    /// XOR-swizzled rows ([`swizzled`]).
    Swizzled,
    /// XOR-swizzled rows in a 1024-byte aligned stage of whole 1024-byte
    /// blocks: every row starts at a multiple of its own size (a power of
    /// two of at most 1024 bytes), so the swizzle of an address is an XOR of
    /// its low bits (`dot/mma.rs`).
    SwizzledAligned,
}

impl Rows {
    /// Whether the rows are XOR-swizzled.
    pub(crate) fn swizzled(self) -> bool {
        self != Rows::Padded
    }
}

/// True when a ring stage of rows of `cols` 16-bit elements is XOR-swizzled
/// instead of padded: rows of at least 128 bytes (8 chunks of 16 bytes), the
/// chunk `c` of row `r` stored at chunk `c ^ (r mod 8)` of the same row. An
/// `ldmatrix` phase (8 rows, one chunk each) and every 128-byte group of a
/// `cp.async` then hit distinct banks, with no padding: each 8-lane group of
/// a copy writes one aligned 128-byte line (with the 16-byte row padding the
/// groups straddled lines, and H100 replayed the copies and fetched their
/// sectors from L2 twice).
pub(crate) fn swizzled(cols: usize) -> bool {
    cols >= 64 && cols.is_power_of_two()
}

/// The element index of `(row, col)` in a stage of 128-byte swizzle atoms
/// (the `wgmma` operand layout, `Swizzle<3,4,3>` in CUTLASS's terms): the
/// `[rows, cols]` tile (`cols` a power of two >= 64) is cut along its columns
/// into `cols / 64` column blocks of `[rows, 64]`, stored one after another;
/// within a block each row is 128 bytes and its 16-byte chunk `c` sits at
/// chunk `c ^ (row mod 8)`. Every 8 rows of a block form one 1024-byte atom,
/// so with 1024-byte aligned stages the swizzle is the hardware's (address
/// bits 4-6 XOR bits 7-9). With `cols == 64` this is the layout of
/// [`swizzled`].
#[cfg(test)]
pub(crate) fn atom_index(row: usize, col: usize, rows: usize) -> usize {
    ((col / 64) * rows + row) * 64 + ((col % 64) ^ (8 * (row % 8)))
}

/// Elements per staged row of a ring stage of `cols` columns.
fn staged_cols(cols: usize) -> usize {
    if swizzled(cols) { cols } else { cols + ROW_PAD }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swizzle_atoms_are_a_permutation_within_row_blocks() {
        for &(rows, cols) in &[(64usize, 64usize), (128, 64), (64, 256), (8, 128)] {
            let mut seen = vec![false; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    let i = atom_index(r, c, rows);
                    assert!(!seen[i], "{rows}x{cols}: ({r}, {c}) collides");
                    seen[i] = true;
                    // 16-byte chunks stay whole and inside their 1024-byte atom,
                    // and the chunk's phase is the hardware's: bits 4-6 ^= bits 7-9.
                    let bytes = 2 * i;
                    assert_eq!(bytes / 1024, ((c / 64) * rows + r) / 8);
                    assert_eq!((bytes >> 4) & 7, ((c % 64) / 8) ^ ((bytes >> 7) & 7));
                    if cols == 64 {
                        assert_eq!(i, r * 64 + (c ^ (8 * (r % 8))), "the swizzled layout");
                    }
                }
            }
        }
    }
}
