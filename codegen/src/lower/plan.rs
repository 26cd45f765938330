//! The kernel plan: every decision the GPU lowering takes before it emits
//! any LLVM, made once, in one forward order, and printable
//! (`TESSERA_DUMP=plan`, [`crate::plan_text`]). The emission (`Lowerer`)
//! reads it and never changes it.
//!
//! The order, each step reading only the ones before it:
//!
//! 1. the chunk cap: the narrowest element any load or store moves decides
//!    how many elements a thread's chunk may hold (`blocked::spt_cap_for`;
//!    16 one-byte elements where step 3 finds FP8 codes read from their
//!    rings as B fragments, and step 3 runs again with it);
//! 2. the tensor-core plan (`dot/plan.rs`): which `dot`s run on tensor cores
//!    with which accumulator layout, which `b` is read from the `[N, K]`
//!    tile it was transposed from, which loop-invariant `a` is hoisted, and
//!    which products are `wgmma` candidates;
//! 3. the pipeline (`pipeline/`): which loads of which loops become
//!    `cp.async` or TMA rings, and which `wgmma` candidates it can feed (the
//!    others go back to `mma.sync`);
//! 4. resident `a` operands (`dot/resident.rs`): loop-invariant operands
//!    kept in shared memory instead of registers;
//! 5. register layouts (`assign.rs`): which values live in tensor-core
//!    layouts, and which of them also need a blocked copy;
//! 6. partial row sums (`partial.rs`);
//! 7. from all of the above, per `dot` its [`DotLowering`], per loop the A
//!    fragments loaded before it and the loop-invariant values converted
//!    before it, the shared-memory floor and the occupancy hint.

use super::assign::{self, Assignment, a_from_regs};
use super::dead_rows::{self, DeadRows};
use super::dot::plan::MmaPlan;
use super::partial::{self, Partials};
use super::pipeline::{self, Pipeline};
use crate::CompileOptions;
use crate::fragment::{MmaLayout, RegLayout};
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::{ControlOp, MemoryOp};
use dsl_core::ir::{Inst, Op, Value};
use dsl_core::passes::axis::AxisAnalysis;
use dsl_core::passes::block_load::BlockLoad;
use rustc_hash::FxHashMap;
use std::fmt::Write as _;

/// How one `dot` is lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DotLowering {
    /// FMAs over operands exchanged through shared memory (`dot/fma.rs`):
    /// inputs that are not f16/bf16, or a shape with no warp grid of whole
    /// `m16n8k16` instructions.
    Fma,
    /// `mma.sync.m16n8k16` on every warp (`dot/mma.rs`).
    MmaSync {
        /// The accumulator layout (the warp grid).
        layout: MmaLayout,
        /// Where the A fragments come from.
        a: MmaA,
        /// Where the B fragments come from.
        b: MmaB,
    },
    /// Warpgroup-wide `wgmma` (sm_90a, `dot/wgmma.rs`); `b` is always read
    /// from its pipeline ring by descriptor.
    Wgmma {
        /// The accumulator layout (every warp along `M`).
        layout: MmaLayout,
        /// Where `a` comes from.
        a: WgmmaA,
        /// Whether the group is left running into the next iteration
        /// (`Pipeline::deferred`).
        deferred: bool,
    },
}

/// The source of an `mma.sync` A operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmaA {
    /// Written to shared memory by the `dot` and read with `ldmatrix`.
    Staged,
    /// Read with `ldmatrix` from the stage of its pipeline ring.
    Ring,
    /// Loaded into A fragments once, before the enclosing loop.
    Hoisted,
    /// Packed from the accumulator registers it was computed in (a chained
    /// product: FlashAttention's probabilities).
    Accumulator,
    /// Kept in shared memory for the whole kernel at this byte offset.
    Resident(u64),
}

/// The source of an `mma.sync` B operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmaB {
    /// Written to shared memory as `[K, N]` and read with `ldmatrix.trans`.
    Staged,
    /// `b = permute(x)`: `x` (`[N, K]`) written to shared memory and read
    /// with plain `ldmatrix`; the permute is never lowered.
    StagedTransposed(Value),
    /// Read from the stage of its pipeline ring.
    Ring,
    /// `b = permute(x)` with `x` formed from the FP8 tile this load copies
    /// into its ring: the B fragments are read from that stage and `x`'s
    /// math runs on them (`pipeline::FragB`).
    Fragments(Inst),
    /// `b` formed from the FP8 tile this load copies, read from its stage
    /// by `ldmatrix.trans` on byte pairs into an interleaved accumulator
    /// (`pipeline::FragB`).
    FragmentsT(Inst),
}

/// The source of a `wgmma` A operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WgmmaA {
    /// A fragments in registers (hoisted, packed from an accumulator, or
    /// loaded from a ring stage).
    Registers,
    /// A pipelined load in swizzle atoms, read by descriptor.
    Ring,
    /// Computed by the loop body and written into a ring of swizzle atoms
    /// (`PipeLoop::a_stages`), read by descriptor.
    Staged,
    /// Resident in shared memory at this byte offset, read by descriptor.
    Resident(u64),
}

/// Every decision of one kernel's lowering; see the module documentation.
pub(crate) struct KernelPlan {
    /// The compile options the plan is for.
    pub opts: CompileOptions,
    /// Threads per program.
    pub threads: usize,
    /// The kernel-wide cap on elements per chunk (`blocked::spt_cap_for`).
    pub spt_cap: usize,
    /// Contiguity and divisibility facts of the values.
    pub axis: AxisAnalysis,
    /// The tensor-core plan.
    pub mma: MmaPlan,
    /// Pipelined loops, rings, resident operands, tensor maps.
    pub pipe: Pipeline,
    /// Register layouts of the values not in the blocked layout.
    pub lays: Assignment,
    /// Carried row sums kept as per-lane partials.
    pub partials: Partials,
    /// How each `dot` is lowered.
    pub dots: FxHashMap<Inst, DotLowering>,
    /// For each `for`: the loop-invariant `a` operands whose A fragments are
    /// loaded before it (hoisted ones that are neither in registers already
    /// nor resident).
    pub hoist: FxHashMap<Inst, Vec<(Value, MmaLayout)>>,
    /// For each `for`: the values defined outside it that ops of its body
    /// take in another layout, converted once before the loop
    /// ([`convert_ahead`]).
    pub convert_ahead: FxHashMap<Inst, Vec<(Value, RegLayout)>>,
    /// Bytes at the bottom of shared memory reserved for resident operands
    /// and the pipeline rings.
    pub smem_floor: u64,
    /// The `.minnctapersm` occupancy hint, when one is emitted.
    pub min_ctas: Option<u64>,
    /// Register slots of rows that nothing stores (`dead_rows.rs`).
    pub dead: DeadRows,
}

impl KernelPlan {
    /// Plans `f` (canonicalized, its `load_block`s expanded into the loads of
    /// `blocks`) for `opts`.
    pub(crate) fn build(
        f: &Function,
        blocks: &FxHashMap<Inst, BlockLoad>,
        opts: &CompileOptions,
    ) -> KernelPlan {
        let threads = 32 * opts.num_warps as usize;
        let axis = dsl_core::passes::axis::analyze(f);
        let narrowest = narrowest_access(f);
        let mut spt_cap = crate::blocked::spt_cap_for(narrowest);
        let stages = opts.num_stages.max(1) as usize;
        let mut mma = super::dot::plan::plan(f, threads / 32, opts.target, stages);
        let max_shared = opts.target.max_shared_bytes();
        let mut pipe = pipeline::analyze(f, &mma, &axis, blocks, threads, spt_cap, stages, max_shared);
        // A kernel whose FP8 codes are copied into rings that `mma.sync`
        // reads as B fragments (`pipeline::FragB`) takes chunks of 16 bytes
        // of codes: each copy moves 16 codes, and a thread computes the row
        // addresses (page lookups, slots) of half as many chunks.
        if narrowest == 1 && !pipe.frag_b.is_empty() && spt_cap < FRAG_B_CHUNK {
            spt_cap = FRAG_B_CHUNK;
            pipe = pipeline::analyze(f, &mma, &axis, blocks, threads, spt_cap, stages, max_shared);
        }
        // `wgmma` candidates the pipeline could not feed go back to the `mma.sync` warp grid.
        mma.settle_wgmma(f, &pipe.wgmma);
        // Products whose B fragments come from an FP8 tile by
        // `ldmatrix.trans` accumulate with interleaved n tiles (`pipeline::FragB`).
        mma.interleave(f, pipe.frag_b.iter().filter(|(_, fb)| !fb.k_major).map(|(&d, _)| d));
        super::dot::resident::plan(f, &mma, &mut pipe, threads);
        let lays = assign::assign(f, &mma, &pipe.regs);
        let partials = partial::plan(f, &lays);
        let dead = dead_rows::plan(f, &lays, threads);
        let smem_floor = pipe.resident_bytes + pipe.ring_bytes;
        // `.minnctapersm`: the config's occupancy hint when it gives one.
        // Without it, a loop that dequantizes `wgmma`'s A operand into a
        // large accumulator while the previous group runs
        // (`Pipeline::body_forms_a`) is built for one program per SM, as
        // CUTLASS's Hopper kernels declare, so ptxas schedules for
        // registers rather than for more programs; other kernels keep
        // ptxas's choice.
        let min_ctas = match opts.min_programs_per_sm {
            0 => pipe.body_forms_a.then_some(1u64),
            n => Some(u64::from(n)),
        };
        let hoist = mma
            .hoisted
            .iter()
            .map(|(&fi, vs)| {
                let keep = vs
                    .iter()
                    .copied()
                    .filter(|(v, l)| {
                        !a_from_regs(lays.lay(*v), l)
                            && !pipe.resident.contains_key(v)
                            && !pipe.mma_resident.contains_key(v)
                    })
                    .collect();
                (fi, keep)
            })
            .collect();
        let convert_ahead = convert_ahead(f, &mma, &lays);
        let mut plan = KernelPlan {
            opts: *opts,
            threads,
            spt_cap,
            axis,
            mma,
            pipe,
            lays,
            partials,
            dots: FxHashMap::default(),
            hoist,
            convert_ahead,
            smem_floor,
            min_ctas,
            dead,
        };
        let mut dots = Vec::new();
        f.walk(|i| {
            if matches!(f.insts[i].op, Op::Dot(_)) {
                dots.push(i);
            }
        });
        for d in dots {
            let l = plan.dot_lowering(f, d);
            plan.dots.insert(d, l);
        }
        plan
    }

    /// How `dot` `d` is lowered, from the decisions above.
    fn dot_lowering(&self, f: &Function, d: Inst) -> DotLowering {
        let Some(&layout) = self.mma.dots.get(&d) else { return DotLowering::Fma };
        let a = f.insts[d].args[0];
        let (pipe, lays) = (&self.pipe, &self.lays);
        if pipe.wgmma.contains(&d) {
            // A staged `a` is written from blocked registers; should the
            // layout assignment have put it in an accumulator layout after
            // all, its registers are the A fragments instead.
            let a_src = if pipe.wgmma_staged.contains(&d) {
                if lays.lay(a) == RegLayout::Blocked { WgmmaA::Staged } else { WgmmaA::Registers }
            } else if pipe.wgmma_rs.contains(&d) {
                WgmmaA::Registers
            } else if pipe.wgmma_resident.contains(&d) {
                WgmmaA::Resident(pipe.resident.get(&a).copied().unwrap_or(0))
            } else {
                WgmmaA::Ring
            };
            return DotLowering::Wgmma { layout, a: a_src, deferred: pipe.deferred.contains(&d) };
        }
        let hoisted = f.insts[d]
            .parent
            .and_then(|b| self.hoist.iter().find(|(fi, _)| f.entry(f.insts[**fi].regions[0]) == b))
            .is_some_and(|(_, vs)| vs.contains(&(a, layout)));
        let a_src = if a_from_regs(lays.lay(a), &layout) {
            MmaA::Accumulator
        } else if hoisted {
            MmaA::Hoisted
        } else if let Some(&off) = pipe.mma_resident.get(&a) {
            MmaA::Resident(off)
        } else if pipe.by_dot.contains_key(&(d, 0)) {
            MmaA::Ring
        } else {
            MmaA::Staged
        };
        let b_src = if let Some(fb) = pipe.frag_b.get(&d) {
            if fb.k_major { MmaB::Fragments(fb.codes) } else { MmaB::FragmentsT(fb.codes) }
        } else if pipe.by_dot.contains_key(&(d, 1)) {
            MmaB::Ring
        } else if let Some(&x) = self.mma.b_trans.get(&d) {
            MmaB::StagedTransposed(x)
        } else {
            MmaB::Staged
        };
        DotLowering::MmaSync { layout, a: a_src, b: b_src }
    }

    /// Whether every FP8 `dot` of `f` runs natively: on `wgmma` with both
    /// operands read from TMA-copied swizzle atoms (`dot::plan`'s module
    /// documentation). The code generator has no other FP8 lowering, so a
    /// plan where this fails is not lowered: the `dot`s are widened to f16
    /// and `f` is planned again.
    pub(crate) fn fp8_native(&self, f: &Function) -> bool {
        let copied_if_fp8 = |ld: &pipeline::PipeLoad| ld.elem_bytes == 2 || ld.tma.is_some() || ld.regs;
        let rings = self.pipe.loops.values().all(|pl| pl.loads.iter().all(copied_if_fp8));
        rings
            && self.dots.iter().all(|(&d, l)| {
                !f.ty(f.insts[d].args[0]).dtype().is_f8()
                    || matches!(l, DotLowering::Wgmma { a: WgmmaA::Ring, .. })
            })
    }

    /// The lowering of `dot` `d`.
    pub(crate) fn dot(&self, d: Inst) -> DotLowering {
        self.dots.get(&d).copied().unwrap_or(DotLowering::Fma)
    }

    /// The plan as text: the kernel-wide facts, then in program order per
    /// loop its hoisted operands and pipelining, per `dot` its lowering, and
    /// last the values held in tensor-core layouts. Values are named as
    /// `dsl_core::print` names them (`%12`), instructions by their results
    /// and op.
    pub(crate) fn print(&self, f: &Function) -> String {
        let names = dsl_core::print::value_names(f);
        let n = |v: Value| names.get(&v).cloned().unwrap_or_else(|| v.to_string());
        let mut out = String::new();
        let p = &self.pipe;
        let _ = writeln!(out, "plan @{}", f.name);
        let _ = writeln!(out, "  threads {}, chunk cap {}", self.threads, self.spt_cap);
        let _ = writeln!(
            out,
            "  shared floor {} (resident {}, rings {}), occupancy hint {}",
            self.smem_floor,
            p.resident_bytes,
            p.ring_bytes,
            self.min_ctas.map_or("none".to_string(), |n| n.to_string())
        );
        for (i, t) in p.tensor_maps.iter().enumerate() {
            let _ = writeln!(out, "  tensor map {i}: {t:?}");
        }
        for (&v, &off) in sorted(&p.resident) {
            let _ = writeln!(out, "  resident {} {} at {off} (wgmma)", n(v), f.ty(v));
        }
        for (&v, &off) in sorted(&p.mma_resident) {
            let _ = writeln!(out, "  resident {} {} at {off} (mma.sync)", n(v), f.ty(v));
        }
        let mut order = Vec::new();
        f.walk(|i| order.push(i));
        for &i in &order {
            let d = &f.insts[i];
            let name = || inst_name(f, &n, i);
            match &d.op {
                Op::Control(ControlOp::For) => self.print_loop(f, &n, i, &mut out),
                Op::Dot(_) => {
                    let _ = writeln!(out, "  {}: {}", name(), fmt_dot(f, self.dot(i), &n));
                }
                Op::Shape(_) if self.mma.skipped.contains(&i) => {
                    let _ = writeln!(out, "  {}: not lowered (its dot reads the operand)", name());
                }
                Op::Reduce(_) if self.partials.sums.contains(&i) => {
                    let _ = writeln!(out, "  {}: per-lane partial sums", name());
                }
                _ => {}
            }
        }
        if !self.dead.slots.is_empty() {
            let (vals, slots) =
                (self.dead.slots.len(), self.dead.slots.values().flatten().filter(|&&d| d).count());
            let _ = writeln!(
                out,
                "  rows no store reads: {slots} register slots of {vals} values left undefined"
            );
        }
        let mut held: Vec<(Value, RegLayout)> = self.lays.lays.iter().map(|(&v, &l)| (v, l)).collect();
        held.sort_by_key(|(v, _)| *v);
        for (v, l) in held {
            let copy = if self.lays.needs_blocked.contains(&v) { " + blocked copy" } else { "" };
            let _ = writeln!(out, "  layout {} {}: {}{copy}", n(v), f.ty(v), fmt_lay(l));
        }
        out
    }

    fn print_loop(&self, f: &Function, n: &dyn Fn(Value) -> String, fi: Inst, out: &mut String) {
        let name = inst_name(f, n, fi);
        if let Some(vs) = self.hoist.get(&fi).filter(|vs| !vs.is_empty()) {
            for (v, l) in vs {
                let _ = writeln!(out, "  {name}: hoists A fragments of {} for {}", n(*v), fmt_mma(l));
            }
        }
        for (v, l) in self.convert_ahead.get(&fi).into_iter().flatten() {
            let _ = writeln!(out, "  {name}: converts {} to {} before the loop", n(*v), fmt_lay(*l));
        }
        if let Some(ks) = self.partials.carried.get(&fi).filter(|k| !k.is_empty()) {
            let k: Vec<usize> = ks.iter().map(|(k, _)| *k).collect();
            let _ = writeln!(out, "  {name}: carries row sums {k:?} as per-lane partials");
        }
        let Some(pl) = self.pipe.loops.get(&fi) else { return };
        let mut flags = Vec::new();
        for (on, what) in [
            (pl.wgmma, "wgmma"),
            (pl.deferred(), "deferred"),
            (pl.released, "released"),
            (pl.unroll, "unrolled x2"),
            (pl.issue_after.is_some(), "copies after its mma"),
        ] {
            if on {
                flags.push(what);
            }
        }
        let _ = writeln!(
            out,
            "  {name}: pipelined, {} stages, {} ahead{}{}",
            pl.stages,
            pl.ahead,
            if flags.is_empty() { "" } else { ", " },
            flags.join(", ")
        );
        for ld in &pl.loads {
            let how = match &ld.tma {
                Some(t) => format!("TMA map {}", t.map),
                None => format!("cp.async {} elements", ld.width),
            };
            let runs = format!("one element per run of {}, read back into registers", ld.run);
            let by_dot = ld.regs && !self.pipe.regs.contains(&ld.load);
            let row_runs = format!("one element per run of {}, read by its dot's fragments", ld.run);
            let form = if ld.frag {
                if pipeline::frag_swizzled(ld.cols) {
                    "swizzled byte rows, read by its dot's fragments"
                } else {
                    "padded byte rows, read by its dot's fragments"
                }
            } else if by_dot {
                row_runs.as_str()
            } else if ld.regs && ld.run > 1 {
                runs.as_str()
            } else if ld.regs {
                "linear, read back into registers"
            } else if ld.atoms {
                "swizzle atoms"
            } else if pipeline::swizzled(ld.units()) {
                "swizzled rows"
            } else {
                "padded rows"
            };
            let _ = writeln!(
                out,
                "    load {}: [{}, {}] {how}, {form}, ring at {} + {} per stage",
                inst_name(f, n, ld.load),
                ld.rows,
                ld.cols,
                ld.ring_off,
                ld.stage_bytes
            );
        }
        for a in &pl.a_stages {
            let _ = writeln!(
                out,
                "    stages a of {}: ring at {} + {} per stage",
                inst_name(f, n, a.dot),
                a.ring_off,
                a.stage_bytes
            );
        }
        if let Some(at) = pl.bars {
            let _ = writeln!(out, "    mbarriers at {at}");
        }
        let dead = pl.slice.iter().filter(|i| self.pipe.dead.contains(i)).count();
        let _ = writeln!(
            out,
            "    address slice: {} ops, {dead} of them only for the copies (not lowered in place)",
            pl.slice.len()
        );
        if !pl.feed.is_empty() {
            let feed: Vec<String> = pl.feed.iter().map(|&i| inst_name(f, n, i)).collect();
            let _ = writeln!(out, "    loads one iteration early: {}", feed.join(", "));
        }
    }
}

/// The narrowest element (in bytes, at most 4) any load or store of `f`
/// moves; `i1` is not counted (it is stored as a byte but never vectorized).
fn narrowest_access(f: &Function) -> usize {
    let mut min_bytes = 4usize;
    f.walk(|i| {
        if let Op::Memory(MemoryOp::Load { .. } | MemoryOp::Store { .. }) = &f.insts[i].op
            && let Some(&p) = f.insts[i].args.first()
        {
            let d = f.ty(p).dtype();
            if d != DType::I1 {
                min_bytes = min_bytes.min(d.size_bytes());
            }
        }
    });
    min_bytes
}

/// The entries of `m` in key order.
fn sorted<K: Ord + Copy, V>(m: &FxHashMap<K, V>) -> Vec<(&K, &V)> {
    let mut v: Vec<(&K, &V)> = m.iter().collect();
    v.sort_by_key(|(k, _)| **k);
    v
}

/// `%12 = dot` / `for` (no results): an instruction by its results and op.
fn inst_name(f: &Function, n: &dyn Fn(Value) -> String, i: Inst) -> String {
    let d = &f.insts[i];
    let rs: Vec<String> = d.results.iter().map(|&r| n(r)).collect();
    if rs.is_empty() { d.op.name().to_string() } else { format!("{} = {}", rs.join(", "), d.op.name()) }
}

fn fmt_mma(l: &MmaLayout) -> String {
    let il = if l.interleaved { ", interleaved" } else { "" };
    format!("mma {}x{} warps {}x{}{il}", l.m, l.n, l.warps_m, l.warps_n)
}

fn fmt_lay(l: RegLayout) -> String {
    match l {
        RegLayout::Blocked => "blocked".to_string(),
        RegLayout::Mma(m) => fmt_mma(&m),
        RegLayout::MmaT(m) => format!("transposed {}", fmt_mma(&m)),
        RegLayout::Row(r) => format!("rows of {} over {} warps", r.m, r.warps_m),
    }
}

fn fmt_dot(f: &Function, d: DotLowering, n: &dyn Fn(Value) -> String) -> String {
    match d {
        DotLowering::Fma => "fma".to_string(),
        DotLowering::MmaSync { layout, a, b } => {
            let a = match a {
                MmaA::Staged => "staged".to_string(),
                MmaA::Ring => "ring".to_string(),
                MmaA::Hoisted => "hoisted".to_string(),
                MmaA::Accumulator => "accumulator registers".to_string(),
                MmaA::Resident(o) => format!("resident at {o}"),
            };
            let b = match b {
                MmaB::Staged => "staged".to_string(),
                MmaB::StagedTransposed(x) => format!("staged from {} (transposed)", n(x)),
                MmaB::Ring => "ring".to_string(),
                MmaB::Fragments(ld) => format!("fragments from the ring of {}", inst_name(f, n, ld)),
                MmaB::FragmentsT(ld) => {
                    format!("fragments from the ring of {} (transposed byte pairs)", inst_name(f, n, ld))
                }
            };
            format!("mma.sync, {}, a {a}, b {b}", fmt_mma(&layout))
        }
        DotLowering::Wgmma { layout, a, deferred } => {
            let a = match a {
                WgmmaA::Registers => "registers".to_string(),
                WgmmaA::Ring => "ring".to_string(),
                WgmmaA::Staged => "staged atoms".to_string(),
                WgmmaA::Resident(o) => format!("resident at {o}"),
            };
            format!("wgmma, {}, a {a}, b ring{}", fmt_mma(&layout), if deferred { ", deferred" } else { "" })
        }
    }
}

/// The chunk cap of a kernel with FP8 codes read from their rings as B
/// fragments: 16 one-byte codes, one 16-byte copy.
const FRAG_B_CHUNK: usize = 16;

/// Per `for`: the values defined outside it that an op of its body (not of
/// a nested region) takes in a tensor-core layout other than their own, a
/// row scale broadcast into an accumulator tile (`s * expand_dims(c, 1)`
/// with `c` computed before the loop) for one. `Lowerer::regs_as` would
/// exchange each through shared memory at every iteration; converted once
/// before the loop, the body reads the converted registers. Uniform values
/// and values computable from coordinates cost no exchange and are left
/// out, as are `dot` operands (their A fragments are hoisted instead) and
/// the operands of a `yield`.
fn convert_ahead(f: &Function, mma: &MmaPlan, lays: &Assignment) -> FxHashMap<Inst, Vec<(Value, RegLayout)>> {
    let mut fors = Vec::new();
    f.walk(|i| {
        if matches!(f.insts[i].op, Op::Control(ControlOp::For)) {
            fors.push(i);
        }
    });
    let mut out: FxHashMap<Inst, Vec<(Value, RegLayout)>> = FxHashMap::default();
    for fi in fors {
        let body = f.entry(f.insts[fi].regions[0]);
        let mut list = Vec::new();
        for &u in &f.blocks[body].insts {
            if matches!(f.insts[u].op, Op::Dot(_) | Op::Control(_)) {
                continue;
            }
            for (k, &x) in f.insts[u].args.iter().enumerate() {
                let want = assign::wants(f, mma, lays, u, k);
                let cheap = assign::is_uniform(f, x) || super::remat::computable(f, x);
                if cheap
                    || !matches!(want, RegLayout::Row(_) | RegLayout::Mma(_))
                    || lays.lay(x) != RegLayout::Blocked
                    || within(f, fi, x)
                    || list.contains(&(x, want))
                {
                    continue;
                }
                list.push((x, want));
            }
        }
        if !list.is_empty() {
            out.insert(fi, list);
        }
    }
    out
}

/// True when `v` is defined inside the regions of `owner` (by one of its
/// ops or as an argument of one of its blocks).
fn within(f: &Function, owner: Inst, v: Value) -> bool {
    let mut block = match f.values[v].def {
        dsl_core::ir::ValueDef::Result(i, _) => f.insts[i].parent,
        dsl_core::ir::ValueDef::BlockArg(b, _) => Some(b),
    };
    while let Some(b) = block {
        let Some(i) = f.blocks[b].parent.and_then(|r| f.regions[r].parent) else { return false };
        if i == owner {
            return true;
        }
        block = f.insts[i].parent;
    }
    false
}
