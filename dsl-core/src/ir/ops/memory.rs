//! Memory ops: masked loads and stores, 2-D block loads, atomics, and the
//! synchronisation between programs (ordered loads and stores, `wait_until`,
//! `prefetch_l2`).
//!
//! Semantics: a masked-off lane neither reads nor writes memory; a masked-off
//! load lane yields `other` (or zero when there is no `other`). Atomics return
//! the value in memory before the update.
//!
//! Ordering (PTX's memory model, one program acting as one thread): a plain
//! `load`/`store` is weak; one with a [`MemOrder`] is a strong access of that
//! semantics and scope (`ld.acquire.gpu`, `st.release.gpu`, ...), as every
//! atomic is. A release (store or atomic) makes every earlier access of the
//! program visible to a program whose acquire (load, atomic or `wait_until`)
//! reads the released value or a later value of the same atomic chain; a
//! relaxed access orders nothing. Loads take `relaxed` or `acquire`, stores
//! `relaxed` or `release`; ordered loads and stores move 32- or 64-bit
//! elements and take no cache hints. Two programs synchronise only through
//! `gpu` or `sys` scope (`cta` orders accesses within one program only).
//!
//! `wait_until ptr, value {cmp, sem, scope}` blocks the program until
//! `*ptr cmp value` holds for a value it reads (`ptr` a scalar pointer to
//! `i32`, `u32` or `i64`; `sem` `acquire` or `relaxed`, scope `gpu` or
//! `sys`): the spin-wait of a persistent kernel, which lowers to a loop the
//! compiler cannot remove. It is a side effect and returns nothing.
//!
//! `wait_load ptr, flag [, mask] {scope}` reads the 64-bit lines at `ptr`
//! (a tile of pointers to `i64`) and blocks the program until the
//! high 32 bits of every active lane's line equal `flag` (an `i32` or `u32`
//! scalar, compared as bits); it returns the lines read (masked-off lanes:
//! zero). Each lane's read is a relaxed strong access of `scope` (`gpu` or
//! `sys`), so a line is read whole: a producer that stores each 64-bit
//! line (data in the low half, the flag in the high half) with one relaxed
//! store hands the data over with no fence and no counter, and the reader
//! sees the data as soon as the line arrives (NCCL's LL protocol). It
//! orders no other memory access. The lines must change their flag with
//! every hand-over (a step or epoch number), or a reader may take an old
//! line for a new one.
//!
//! `prefetch_l2 ptr [, mask]` asks for the lines of the pointed-to elements
//! to be brought into L2 (`prefetch.global.L2`). It changes no value; the
//! interpreter still checks its addresses like a load's, since a prefetch
//! of memory the kernel does not own is a bug even though the GPU ignores it.
//!
//! `load_block` (Triton's tensor-descriptor load) reads a `[BR, BC]` box of
//! the row-major matrix `rows x cols` with leading stride `row_stride` (inner
//! stride 1) at `(row0, col0)`: element `[i, j]` is
//! `ptr[(row0 + i) * row_stride + col0 + j]` where `0 <= row0 + i < rows` and
//! `0 <= col0 + j < cols`, and zero elsewhere (nothing is read there;
//! negative offsets are allowed). It is what a Hopper TMA copy does; the
//! codegen either lowers it that way or first expands it into an ordinary
//! masked `load` (`crate::passes::block_load`). Like a non-volatile `load`,
//! it has no side effects.

use super::{Attr, Attrs, CmpPred, attr_flag, attr_int, attr_word, expect_args, same_shapes};
use crate::dtype::{DType, Elem, Type};

/// Cache modifier of a load or store (PTX `.ca`, `.cg`, `.cs`, `.wb`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CacheModifier {
    /// The default.
    #[default]
    None,
    /// Cache at all levels.
    Ca,
    /// Cache in L2 only.
    Cg,
    /// Streaming: likely accessed once.
    Cs,
    /// Write-back (stores).
    Wb,
    /// Write-through (stores).
    Wt,
}

/// Eviction policy hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EvictionPolicy {
    /// The default.
    #[default]
    Normal,
    /// Evict first.
    First,
    /// Evict last.
    Last,
}

/// The read-modify-write of an atomic op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicKind {
    /// `*p += v`.
    Add,
    /// `*p = max(*p, v)`.
    Max,
    /// `*p = min(*p, v)`.
    Min,
    /// `*p &= v`.
    And,
    /// `*p |= v`.
    Or,
    /// `*p ^= v`.
    Xor,
    /// `*p = v`.
    Xchg,
}

/// Memory ordering of an atomic op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemSem {
    /// No ordering.
    Relaxed,
    /// Acquire.
    Acquire,
    /// Release.
    Release,
    /// Acquire and release (Triton's default).
    #[default]
    AcqRel,
}

/// Visibility scope of an atomic op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemScope {
    /// The whole GPU (default).
    #[default]
    Gpu,
    /// The thread block.
    Cta,
    /// The system (host and peers).
    Sys,
}

/// The ordering of a strong load or store: its semantics and scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemOrder {
    /// `relaxed` or `acquire` on loads, `relaxed` or `release` on stores.
    pub sem: MemSem,
    /// Who the ordering is with.
    pub scope: MemScope,
}

impl MemOrder {
    /// An ordering of semantics `sem` at GPU scope.
    pub fn gpu(sem: MemSem) -> MemOrder {
        MemOrder { sem, scope: MemScope::Gpu }
    }
}

/// The memory family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MemoryOp {
    /// `load ptr [, mask [, other]]`: result has the pointee dtype and `ptr`'s shape.
    Load {
        /// Operand 1 is an `i1` mask.
        has_mask: bool,
        /// Operand 2 is the value of masked-off lanes (needs a mask).
        has_other: bool,
        /// Cache modifier.
        cache: CacheModifier,
        /// Eviction policy.
        evict: EvictionPolicy,
        /// Volatile load (never cached or merged).
        volatile: bool,
        /// A strong load of this ordering (`None`: a weak, plain load).
        order: Option<MemOrder>,
    },
    /// `load_block ptr, rows, cols, row_stride, row0, col0 {br, bc}`: the
    /// `[br, bc]` tile of the pointee dtype at `(row0, col0)` of the
    /// row-major matrix `rows x cols` with leading stride `row_stride`
    /// (zero outside the matrix; see the module documentation). `ptr` is a
    /// scalar pointer, the other operands are `i32` scalars.
    LoadBlock {
        /// Rows of the block (`br`, a power of two): the result's dimension 0.
        rows: u32,
        /// Columns of the block (`bc`, a power of two): the result's dimension 1.
        cols: u32,
        /// Cache modifier.
        cache: CacheModifier,
        /// Eviction policy.
        evict: EvictionPolicy,
    },
    /// `store ptr, value [, mask]`: no results.
    Store {
        /// Operand 2 is an `i1` mask.
        has_mask: bool,
        /// Cache modifier.
        cache: CacheModifier,
        /// Eviction policy.
        evict: EvictionPolicy,
        /// A strong store of this ordering (`None`: a weak, plain store).
        order: Option<MemOrder>,
    },
    /// `atomic_<kind> ptr, value [, mask]`: returns the old values.
    Atomic {
        /// The update.
        kind: AtomicKind,
        /// Operand 2 is an `i1` mask.
        has_mask: bool,
        /// Ordering.
        sem: MemSem,
        /// Scope.
        scope: MemScope,
    },
    /// `atomic_cas ptr, cmp, value`: where `*p == cmp` store `value`; returns the old values.
    AtomicCas {
        /// Ordering.
        sem: MemSem,
        /// Scope.
        scope: MemScope,
    },
    /// `wait_until ptr, value`: blocks until `*ptr cmp value` (see the
    /// module documentation); no results.
    WaitUntil {
        /// The comparison of the value read (left) with `value` (right).
        cmp: CmpPred,
        /// `acquire` (the default) or `relaxed`.
        sem: MemSem,
        /// `gpu` or `sys`.
        scope: MemScope,
    },
    /// `wait_load ptr, flag [, mask]`: the lines at `ptr` once every active
    /// lane's high half equals `flag` (see the module documentation).
    WaitLoad {
        /// Operand 2 is an `i1` mask.
        has_mask: bool,
        /// `gpu` or `sys`.
        scope: MemScope,
    },
    /// `prefetch_l2 ptr [, mask]`: prefetches the lines of the addresses into
    /// L2; no results.
    PrefetchL2 {
        /// Operand 1 is an `i1` mask.
        has_mask: bool,
    },
}

spellings! { CacheModifier: None = "none", Ca = "ca", Cg = "cg", Cs = "cs", Wb = "wb", Wt = "wt" }
spellings! { EvictionPolicy: Normal = "normal", First = "first", Last = "last" }
spellings! { MemSem: Relaxed = "relaxed", Acquire = "acquire", Release = "release", AcqRel = "acq_rel" }
spellings! { MemScope: Gpu = "gpu", Cta = "cta", Sys = "sys" }
spellings! { AtomicKind:
    Add = "atomic_add", Max = "atomic_max", Min = "atomic_min", And = "atomic_and", Or = "atomic_or",
    Xor = "atomic_xor", Xchg = "atomic_xchg",
}

/// The word attribute `key` read by `from_name`, or `default` when absent.
fn parse_word<T>(
    attrs: &[(String, Attr)],
    key: &str,
    from_name: fn(&str) -> Option<T>,
    default: T,
) -> Result<T, String> {
    if super::attr(attrs, key).is_none() {
        return Ok(default);
    }
    let w = attr_word(attrs, key)?;
    from_name(w).ok_or(format!("unknown {key} `{w}`"))
}

/// The operands of a `load` by role ([`MemoryOp::load_operands`]): the
/// pointer tile, the optional `i1` mask and the optional value of masked-off
/// lanes. `T` is whatever stands for an operand (a `Value`, a lowered
/// register set, an interpreter tile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOperands<T> {
    /// The pointers.
    pub ptr: T,
    /// The mask, when the load has one.
    pub mask: Option<T>,
    /// The value of masked-off lanes, when the load has one (never without a mask).
    pub other: Option<T>,
}

mnemonics! { MemoryOp:
    Load = "load", LoadBlock = "load_block", Store = "store", AtomicCas = "atomic_cas",
    WaitUntil = "wait_until", WaitLoad = "wait_load", PrefetchL2 = "prefetch_l2";
    MemoryOp::Atomic { kind, .. } => kind.name()
}

impl MemoryOp {
    /// The operands of a `load` with arguments `args`, by role; `None` for
    /// the other memory ops. (A `load`'s flags say which optional operands
    /// it has; this is the one place that decodes them.)
    pub fn load_operands<T: Copy>(&self, args: &[T]) -> Option<LoadOperands<T>> {
        let MemoryOp::Load { has_mask, has_other, .. } = *self else { return None };
        Some(LoadOperands {
            ptr: *args.first()?,
            mask: if has_mask { Some(*args.get(1)?) } else { None },
            other: if has_other { Some(*args.get(2)?) } else { None },
        })
    }

    /// True for ops that write memory, read it volatile or ordered (a read
    /// that synchronises is never removed, merged or moved), wait or prefetch.
    pub fn has_side_effects(&self) -> bool {
        !matches!(self, MemoryOp::Load { volatile: false, order: None, .. } | MemoryOp::LoadBlock { .. })
    }

    /// True for ops that synchronise with other programs: ordered loads and
    /// stores, atomics with acquire or release semantics, and waits.
    pub fn synchronizes(&self) -> bool {
        match *self {
            MemoryOp::Load { order, .. } | MemoryOp::Store { order, .. } => {
                order.is_some_and(|o| o.sem != MemSem::Relaxed)
            }
            MemoryOp::Atomic { sem, .. } | MemoryOp::AtomicCas { sem, .. } => sem != MemSem::Relaxed,
            MemoryOp::WaitUntil { .. } | MemoryOp::WaitLoad { .. } => true,
            MemoryOp::LoadBlock { .. } | MemoryOp::PrefetchL2 { .. } => false,
        }
    }

    /// Attributes for printing (defaults are omitted).
    pub fn attrs(&self) -> Attrs {
        let mut a: Attrs = Vec::new();
        let hints = |a: &mut Attrs, c: CacheModifier, e: EvictionPolicy| {
            if c != CacheModifier::None {
                a.push(("cache", Attr::Word(c.name().into())));
            }
            if e != EvictionPolicy::Normal {
                a.push(("evict", Attr::Word(e.name().into())));
            }
        };
        let ordered = |a: &mut Attrs, sem: MemSem, scope: MemScope| {
            a.push(("sem", Attr::Word(sem.name().into())));
            a.push(("scope", Attr::Word(scope.name().into())));
        };
        match *self {
            MemoryOp::Load { has_mask, has_other, cache, evict, volatile, order } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
                if has_other {
                    a.push(("other", Attr::Flag));
                }
                hints(&mut a, cache, evict);
                if volatile {
                    a.push(("volatile", Attr::Flag));
                }
                if let Some(o) = order {
                    ordered(&mut a, o.sem, o.scope);
                }
            }
            MemoryOp::LoadBlock { rows, cols, cache, evict } => {
                a.push(("br", Attr::Int(i64::from(rows))));
                a.push(("bc", Attr::Int(i64::from(cols))));
                hints(&mut a, cache, evict);
            }
            MemoryOp::Store { has_mask, cache, evict, order } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
                hints(&mut a, cache, evict);
                if let Some(o) = order {
                    ordered(&mut a, o.sem, o.scope);
                }
            }
            MemoryOp::Atomic { has_mask, sem, scope, .. } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
                ordered(&mut a, sem, scope);
            }
            MemoryOp::AtomicCas { sem, scope } => ordered(&mut a, sem, scope),
            MemoryOp::WaitUntil { cmp, sem, scope } => {
                a.push(("cmp", Attr::Word(cmp.name().into())));
                ordered(&mut a, sem, scope);
            }
            MemoryOp::WaitLoad { has_mask, scope } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
                a.push(("scope", Attr::Word(scope.name().into())));
            }
            MemoryOp::PrefetchL2 { has_mask } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
            }
        }
        a
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<MemoryOp>, String> {
        let cache = parse_word(attrs, "cache", CacheModifier::from_name, CacheModifier::None)?;
        let evict = parse_word(attrs, "evict", EvictionPolicy::from_name, EvictionPolicy::Normal)?;
        let sem = parse_word(attrs, "sem", MemSem::from_name, MemSem::AcqRel)?;
        let scope = parse_word(attrs, "scope", MemScope::from_name, MemScope::Gpu)?;
        let has_mask = attr_flag(attrs, "mask");
        // A load or store is ordered when it names its semantics.
        let order = super::attr(attrs, "sem").is_some().then_some(MemOrder { sem, scope });
        Ok(Some(match name {
            "load" => MemoryOp::Load {
                has_mask,
                has_other: attr_flag(attrs, "other"),
                cache,
                evict,
                volatile: attr_flag(attrs, "volatile"),
                order,
            },
            "load_block" => {
                let dim = |key: &str| -> Result<u32, String> {
                    let v = attr_int(attrs, key)?;
                    u32::try_from(v)
                        .map_err(|_| format!("block dimension `{key}` must be in 0..2^32, found {v}"))
                };
                MemoryOp::LoadBlock { rows: dim("br")?, cols: dim("bc")?, cache, evict }
            }
            "store" => MemoryOp::Store { has_mask, cache, evict, order },
            "atomic_cas" => MemoryOp::AtomicCas { sem, scope },
            "wait_until" => {
                let w = attr_word(attrs, "cmp")?;
                let cmp = CmpPred::from_name(w).ok_or(format!("unknown comparison `{w}`"))?;
                MemoryOp::WaitUntil { cmp, sem: order.map_or(MemSem::Acquire, |o| o.sem), scope }
            }
            "wait_load" => MemoryOp::WaitLoad { has_mask, scope },
            "prefetch_l2" => MemoryOp::PrefetchL2 { has_mask },
            _ => match AtomicKind::from_name(name) {
                Some(kind) => MemoryOp::Atomic { kind, has_mask, sem, scope },
                None => return Ok(None),
            },
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        let name = self.name();
        if let MemoryOp::LoadBlock { rows, cols, .. } = *self {
            return infer_load_block(rows, cols, args);
        }
        let ptr = args.first().ok_or(format!("`{name}` needs a pointer operand"))?;
        let pointee = match ptr.elem {
            Elem::Ptr(d) => d,
            Elem::Scalar(_) => return Err(format!("`{name}` needs a pointer as operand 0, found {ptr}")),
        };
        let value_ty = ptr.with_elem(Elem::Scalar(pointee));
        let check_mask = |m: &Type| -> Result<(), String> {
            if !m.is_bool() {
                return Err(format!("`{name}` mask must be i1, found {m}"));
            }
            Ok(())
        };
        let check_value = |v: &Type, what: &str| -> Result<(), String> {
            if v.elem != Elem::Scalar(pointee) {
                return Err(format!("`{name}` {what} must be {pointee} like the pointee, found {}", v.elem));
            }
            Ok(())
        };
        match *self {
            MemoryOp::Load { has_mask, has_other, cache, evict, volatile, order } => {
                if has_other && !has_mask {
                    return Err("`load` with `other` needs a mask".into());
                }
                if let Some(o) = order {
                    check_order(name, pointee, o, MemSem::Acquire, cache, evict)?;
                    if volatile {
                        return Err(
                            "an ordered `load` is already never merged or removed: drop `volatile`".into()
                        );
                    }
                }
                expect_args(name, args, 1 + has_mask as usize + has_other as usize)?;
                same_shapes(name, args)?;
                if has_mask {
                    check_mask(&args[1])?;
                }
                if has_other {
                    check_value(&args[2], "`other`")?;
                }
                Ok(vec![value_ty])
            }
            // Checked above, before operand 0 must be a pointer of any shape.
            MemoryOp::LoadBlock { rows, cols, .. } => infer_load_block(rows, cols, args),
            MemoryOp::Store { has_mask, cache, evict, order } => {
                if let Some(o) = order {
                    check_order(name, pointee, o, MemSem::Release, cache, evict)?;
                }
                expect_args(name, args, 2 + has_mask as usize)?;
                same_shapes(name, args)?;
                check_value(&args[1], "value")?;
                if has_mask {
                    check_mask(&args[2])?;
                }
                Ok(Vec::new())
            }
            MemoryOp::Atomic { kind, has_mask, .. } => {
                expect_args(name, args, 2 + has_mask as usize)?;
                same_shapes(name, args)?;
                check_value(&args[1], "value")?;
                if has_mask {
                    check_mask(&args[2])?;
                }
                let ok = match kind {
                    AtomicKind::Add => matches!(
                        pointee,
                        DType::I32
                            | DType::U32
                            | DType::I64
                            | DType::F16
                            | DType::BF16
                            | DType::F32
                            | DType::F64
                    ),
                    AtomicKind::Max | AtomicKind::Min => {
                        matches!(pointee, DType::I32 | DType::U32 | DType::I64 | DType::F32)
                    }
                    AtomicKind::And | AtomicKind::Or | AtomicKind::Xor => {
                        matches!(pointee, DType::I32 | DType::U32 | DType::I64)
                    }
                    AtomicKind::Xchg => pointee.bits() >= 32,
                };
                if !ok {
                    return Err(format!("`{name}` is not supported on {pointee}"));
                }
                Ok(vec![value_ty])
            }
            MemoryOp::AtomicCas { .. } => {
                expect_args(name, args, 3)?;
                same_shapes(name, args)?;
                check_value(&args[1], "compare value")?;
                check_value(&args[2], "new value")?;
                if !matches!(pointee, DType::I32 | DType::U32 | DType::I64 | DType::F32 | DType::F64) {
                    return Err(format!("`atomic_cas` is not supported on {pointee}"));
                }
                Ok(vec![value_ty])
            }
            MemoryOp::WaitUntil { sem, scope, .. } => {
                expect_args(name, args, 2)?;
                if !ptr.is_scalar() || !matches!(pointee, DType::I32 | DType::U32 | DType::I64) {
                    return Err(format!(
                        "`wait_until` waits on a scalar pointer to i32, u32 or i64 (a flag or counter), found {ptr}"
                    ));
                }
                if !args[1].is_scalar() {
                    return Err(format!("`wait_until` compares with a scalar, found {}", args[1]));
                }
                check_value(&args[1], "value")?;
                if !matches!(sem, MemSem::Acquire | MemSem::Relaxed) {
                    return Err(format!(
                        "`wait_until` is a read: its semantics are `acquire` or `relaxed`, not `{}`",
                        sem.name()
                    ));
                }
                if scope == MemScope::Cta {
                    return Err(
                        "`wait_until` waits for another program: its scope is `gpu` or `sys`, not `cta` \
                                (a CTA-scoped read does not synchronise with other programs)"
                            .into(),
                    );
                }
                Ok(Vec::new())
            }
            MemoryOp::WaitLoad { has_mask, scope } => {
                expect_args(name, args, 2 + has_mask as usize)?;
                if pointee != DType::I64 {
                    return Err(format!(
                        "`wait_load` reads 64-bit lines (data and flag): its pointee is i64, found {pointee}"
                    ));
                }
                if !args[1].is_scalar() || !matches!(args[1].elem, Elem::Scalar(DType::I32 | DType::U32)) {
                    return Err(format!(
                        "`wait_load` compares the lines' flags with an i32 or u32 scalar, found {}",
                        args[1]
                    ));
                }
                if has_mask {
                    check_mask(&args[2])?;
                    if args[2].shape != ptr.shape {
                        return Err(format!(
                            "`wait_load` mask must have the pointers' shape {:?}, found {:?}",
                            ptr.shape, args[2].shape
                        ));
                    }
                }
                if scope == MemScope::Cta {
                    return Err(
                        "`wait_load` waits for another program: its scope is `gpu` or `sys`, not `cta`"
                            .into(),
                    );
                }
                Ok(vec![value_ty])
            }
            MemoryOp::PrefetchL2 { has_mask } => {
                expect_args(name, args, 1 + has_mask as usize)?;
                same_shapes(name, args)?;
                if has_mask {
                    check_mask(&args[1])?;
                }
                Ok(Vec::new())
            }
        }
    }
}

/// Checks the ordering of a strong load (`allowed` = acquire) or store
/// (`allowed` = release): relaxed or `allowed` semantics, a 32- or 64-bit
/// element, no cache hints.
fn check_order(
    name: &str,
    pointee: DType,
    o: MemOrder,
    allowed: MemSem,
    cache: CacheModifier,
    evict: EvictionPolicy,
) -> Result<(), String> {
    if o.sem != MemSem::Relaxed && o.sem != allowed {
        let what = if allowed == MemSem::Acquire { "a read" } else { "a write" };
        return Err(format!(
            "`{name}` is {what}: its semantics are `relaxed` or `{}`, not `{}` (only atomics are both)",
            allowed.name(),
            o.sem.name()
        ));
    }
    if pointee.bits() < 32 {
        return Err(format!(
            "an ordered `{name}` moves 32- or 64-bit elements (flags and counters), found {pointee}"
        ));
    }
    if cache != CacheModifier::None || evict != EvictionPolicy::Normal {
        return Err(format!("an ordered `{name}` takes no cache modifier or eviction policy"));
    }
    Ok(())
}

/// The names of `load_block`'s operands, in order.
pub const LOAD_BLOCK_OPERANDS: [&str; 6] = ["ptr", "rows", "cols", "row_stride", "row0", "col0"];

/// Result type of `load_block` with a `[br, bc]` block: operand 0 a scalar
/// pointer, operands 1 to 5 `i32` scalars, both block dimensions powers of two.
fn infer_load_block(br: u32, bc: u32, args: &[Type]) -> Result<Vec<Type>, String> {
    expect_args("load_block", args, LOAD_BLOCK_OPERANDS.len())?;
    let ptr = &args[0];
    let pointee = match ptr.elem {
        Elem::Ptr(d) if ptr.is_scalar() => d,
        _ => {
            return Err(format!(
                "`load_block` needs a scalar pointer (the matrix base) as operand 0 (`ptr`), found {ptr}"
            ));
        }
    };
    for (k, t) in args.iter().enumerate().skip(1) {
        if !t.is_scalar() || t.elem != Elem::Scalar(DType::I32) {
            return Err(format!(
                "`load_block` operand {k} (`{}`) must be an i32 scalar, found {t}",
                LOAD_BLOCK_OPERANDS[k]
            ));
        }
    }
    if !br.is_power_of_two() || !bc.is_power_of_two() {
        return Err(format!("`load_block` block dimensions must be powers of two, found [{br}, {bc}]"));
    }
    Ok(vec![Type::tile(Elem::Scalar(pointee), &[br as usize, bc as usize])])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(br: u32, bc: u32) -> MemoryOp {
        MemoryOp::LoadBlock { rows: br, cols: bc, cache: CacheModifier::None, evict: EvictionPolicy::Normal }
    }

    fn args(ptr: Type) -> Vec<Type> {
        let mut a = vec![ptr];
        a.extend(std::iter::repeat_n(Type::scalar(DType::I32), 5));
        a
    }

    #[test]
    fn load_block_infers_the_block_of_the_pointee() {
        let t = lb(64, 32).infer(&args(Type::ptr(DType::BF16))).unwrap();
        assert_eq!(t, vec![Type::tile(Elem::Scalar(DType::BF16), &[64, 32])]);
        assert!(!lb(64, 32).has_side_effects());
        assert_eq!(lb(1, 1).infer(&args(Type::ptr(DType::I32))).unwrap()[0].shape.as_slice(), &[1, 1]);
    }

    #[test]
    fn load_block_rejects_malformed_operands() {
        let err = |op: MemoryOp, a: &[Type]| op.infer(a).unwrap_err();
        let ptr = Type::ptr(DType::F32);
        assert_eq!(err(lb(8, 8), &args(ptr.clone())[..5]), "`load_block` takes 6 operand(s), found 5");
        let e = err(lb(8, 8), &args(Type::scalar(DType::I32)));
        assert!(
            e.contains("needs a scalar pointer (the matrix base) as operand 0 (`ptr`), found i32"),
            "{e}"
        );
        let e = err(lb(8, 8), &args(Type::tile(Elem::Ptr(DType::F32), &[8])));
        assert!(e.contains("needs a scalar pointer"), "{e}");
        for (k, name) in LOAD_BLOCK_OPERANDS.iter().enumerate().skip(1) {
            for bad in [Type::scalar(DType::I64), Type::tile(Elem::Scalar(DType::I32), &[2]), ptr.clone()] {
                let mut a = args(ptr.clone());
                a[k] = bad.clone();
                let e = err(lb(8, 8), &a);
                assert_eq!(
                    e,
                    format!("`load_block` operand {k} (`{name}`) must be an i32 scalar, found {bad}")
                );
            }
        }
        let e = err(lb(8, 12), &args(ptr.clone()));
        assert_eq!(e, "`load_block` block dimensions must be powers of two, found [8, 12]");
        assert!(err(lb(0, 8), &args(ptr)).contains("powers of two"));
    }

    #[test]
    fn load_block_attributes_round_trip() {
        let op = MemoryOp::LoadBlock {
            rows: 16,
            cols: 64,
            cache: CacheModifier::Cg,
            evict: EvictionPolicy::Normal,
        };
        let attrs: Vec<(String, Attr)> = op.attrs().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(attrs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["br", "bc", "cache"],);
        assert_eq!(MemoryOp::parse("load_block", &attrs), Ok(Some(op)));
        let missing = vec![("br".to_string(), Attr::Int(4))];
        assert_eq!(MemoryOp::parse("load_block", &missing), Err("missing attribute `bc`".to_string()));
        let negative = vec![("br".to_string(), Attr::Int(-4)), ("bc".to_string(), Attr::Int(4))];
        assert!(MemoryOp::parse("load_block", &negative).unwrap_err().contains("found -4"));
    }
}
