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
//! A load whose value reaches a `dot` operand through arithmetic rather
//! than directly (an FP8 cache's codes and scales, widened and multiplied
//! into a 16-bit operand) is copied the same way when some load of that
//! operand is FP8, into a stage in linear element order: each thread copies
//! the chunks it holds in the load's blocked layout (a tile whose address
//! repeats along its rows, a per-row scale, one element per run) and, after
//! the iteration's wait and barrier, every thread reads its chunks back from
//! the stage where the load stood ([`PipeLoad::regs`]). Without it such a
//! loop waits for its plain loads in every iteration. These rings are added
//! only while the loop's rings stay within half the target's shared memory
//! (`Target::max_shared_bytes`): the widened operands are staged for the
//! tensor cores above them.
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
//! so no warp waits on memory to form an address. The prologue loads the
//! page numbers of all its iterations (and of the first one the loop copies
//! for) before its first copy, so it waits for memory once, not once per
//! prologue iteration. Masked 4-byte loads in the slice are predicated
//! loads (`@p ld.global`, `memory.rs`) rather than branches around each
//! load: behind branches ptxas issues them one after another, each waiting
//! for the one before.
//!
//! The rings of all pipelined loops share one region at the bottom of shared
//! memory (loops run one after another; the exit wait and barrier hand the
//! region over). Inside a pipelined loop every other use of shared memory
//! starts above it; outside, other uses start at the bottom too, so a
//! barrier before each prologue makes sure nobody still reads them there.

use super::{Lowerer, Regs};
use crate::Result;
use crate::blocked::BlockedLayout;
use crate::fragment::ROW_PAD;
use crate::tensor_map::TensorMapSpec;
use dsl_core::ir::ops::{CacheModifier, MemoryOp};
use dsl_core::ir::{Inst, Op, Value};
use inkwell::IntPredicate;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use rustc_hash::{FxHashMap, FxHashSet};

mod analyze;
mod emit;

pub(crate) use analyze::{analyze, derives_from_dot};

pub(crate) use emit::PendingIssue;

/// One pipelined load.
#[derive(Clone, Debug)]
pub(crate) struct PipeLoad {
    /// The `load`.
    pub load: Inst,
    /// Columns of the loaded tile (its stage is `[rows, cols]` swizzled or
    /// `[rows, cols + ROW_PAD]` padded, see [`swizzled`]).
    pub cols: usize,
    /// Bytes per element: 2, or 1 for an FP8 tile (copied by TMA only,
    /// for a native FP8 `wgmma`).
    pub elem_bytes: usize,
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
    /// Read back into registers by the body (its value reaches a `dot`
    /// operand through arithmetic: FP8 codes widened, their scales) instead
    /// of read by a `dot` from the stage: the stage holds the tile in
    /// linear element order (see `run`), each chunk copied by the thread
    /// that holds it in the load's blocked layout (its owner when the
    /// layout is replicated), and every thread reads its chunks back after
    /// the iteration's barrier ([`Lowerer::pipe_read`]).
    pub regs: bool,
    /// For a load read back into registers: the length of the aligned runs
    /// of equal addresses and mask values along its rows (a power of two,
    /// a multiple of the chunk size when above 1; 1 for a plain tile). The
    /// stage holds one element per run, copied by the thread whose chunk
    /// starts the run; every chunk of the run reads it back.
    pub run: usize,
    /// An FP8 tile the tensor cores' B fragments are read from in place
    /// ([`FragB`]): its stage holds the `[rows, cols]` bytes in rows of
    /// 16-byte chunks, XOR-swizzled when a row is 128 bytes or more
    /// ([`frag_swizzled`]), else padded by 16 bytes, instead of linear
    /// element order; each thread still copies the chunks it holds in the
    /// load's blocked layout.
    pub frag: bool,
}

impl PipeLoad {
    /// A stage row in 16-bit units (the columns of a 16-bit tile, half
    /// those of an FP8 one): what [`swizzled`] and the swizzle atoms count,
    /// as they lay out 16-byte chunks of 128-byte rows whatever the element.
    pub(crate) fn units(&self) -> usize {
        self.cols * self.elem_bytes / 2
    }
}

/// A pipelined `load_block` copied by the Tensor Memory Accelerator
/// (`crate::tensor_map`): one thread issues its boxes, which complete on the
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
    /// (A loop whose loads precede the product, the stream-K form, gains
    /// nothing from it and is not unrolled.)
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
    /// Of those, the ones the body reads back into registers
    /// ([`PipeLoad::regs`]).
    pub regs: FxHashSet<Inst>,
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
    /// The kernel's hidden tensor-map parameters, in order (`crate::tensor_map`).
    pub tensor_maps: Vec<TensorMapSpec>,
    /// Some loop defers `wgmma` groups whose A fragments its body computes
    /// (the swapped dequant GEMM: the next tile's dequantization overlaps
    /// the running group) into an accumulator of at least
    /// `assign::LARGE_ACC` registers per thread, so its schedule wants
    /// registers more than another program per SM (`.minnctapersm 1`, see
    /// `lower::lower_function`).
    pub body_forms_a: bool,
    /// `mma.sync` `dot`s whose `b = trans(x)` is an FP8 tile widened by
    /// elementwise math that the `dot` evaluates on its B fragments, read
    /// straight from the tile's ring ([`FragB`]).
    pub frag_b: FxHashMap<Inst, FragB>,
    /// The instructions of those `x` chains (not lowered in place: their
    /// `dot` lowers them on its fragments).
    pub frag_chain: FxHashSet<Inst>,
    /// The `(a, layout)` pairs of those `dot`s: their A fragments are
    /// loaded in the permuted `k` order of [`FragB`].
    pub frag_a: FxHashSet<(Value, crate::fragment::MmaLayout)>,
}

/// A `dot` whose `b = trans(x)` (`x`: `[N, K]`) is computed from an FP8
/// tile of codes and per-row values (an FP8 KV cache's per-key scales) by
/// elementwise ops, all in one loop body whose pipeline copies those loads
/// ahead. Instead of reading the codes back in their blocked layout,
/// widening them there and staging the 16-bit tile for `ldmatrix`, the
/// `dot` loads each warp's B fragments from the codes' ring stage with
/// `ldmatrix` (each 16-bit lane pair is two codes, so a lane receives four
/// consecutive codes of one row: `k = 16 kk + 4 t .. 4 t + 3` of row
/// `n = 8 j + g`), reads the per-row values from their stages, lowers the
/// chain on those registers and packs them as B fragments. A lane's four
/// `k` slots `2t, 2t+1, 2t+8, 2t+9` of each 16-wide step thus hold the
/// columns `4t .. 4t+3`; the A fragments are loaded in the same order. A
/// permutation of the `k` slots inside one `mma.sync.m16n8k16` applied to
/// both operands gives the same result bits on the tensor cores, so the
/// product equals the staged one.
///
/// The same for a `b` that is itself such a tile (`[K, N]`, per-row values
/// along `K`: an FP8 cache's values times their per-key scales,
/// [`FragB::k_major`] false): `ldmatrix.trans` on byte pairs gives lane
/// `(g, t)` the codes of rows `2t, 2t+1` at columns `2g, 2g+1` in one
/// register, whose bytes `p` and `p + 2` are the B fragment of column `2g +
/// p`. The `k` slots keep their order (A fragments as usual); the two n
/// tiles of each 16 columns hold the even and the odd columns, so the
/// accumulator is the interleaved [`crate::fragment::MmaLayout`].
#[derive(Clone, Debug)]
pub(crate) struct FragB {
    /// `b = trans(x)` with `x` the `[N, K]` tile (true), or `b = x`, `[K, N]`.
    pub k_major: bool,
    /// The tile `x`.
    pub x: Value,
    /// The FP8 codes' load (`PipeLoad::frag`).
    pub codes: Inst,
    /// Loads of per-row values (`PipeLoad::run` a multiple of `K`).
    pub rows: Vec<Inst>,
    /// The elementwise instructions from those loads to `x`, in order.
    pub chain: Vec<Inst>,
}

/// Whether the stage of a [`PipeLoad::frag`] tile with rows of `cols`
/// bytes is XOR-swizzled (16-byte chunk `c` of row `r` at chunk `c ^ (r mod
/// 8)`): rows of 128 bytes or more, a power of two. Narrower rows are
/// padded by 16 bytes. Either way the eight row addresses of one
/// `ldmatrix` phase hit distinct banks.
pub(crate) fn frag_swizzled(cols: usize) -> bool {
    cols >= 128 && cols.is_power_of_two()
}

/// Bytes of one staged row of a [`PipeLoad::frag`] tile of `cols` bytes.
pub(crate) fn frag_row_bytes(cols: usize) -> usize {
    if frag_swizzled(cols) { cols } else { cols + 16 }
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
/// groups straddle lines, and the hardware replays the copies and fetches
/// their sectors from L2 twice).
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
