//! Loads, stores, block loads, atomics and the synchronisation between
//! programs. Pointer, mask, `other` and value operands are broadcast to one
//! shape; values are converted to the pointee dtype. [`load_block`] takes a
//! scalar pointer and `i32` scalars (the matrix extents, row stride and box
//! origin) instead of a tile of pointers.
//!
//! Orderings: the `_opts` forms (what a kernel's `load(p, sem = "acquire",
//! scope = "gpu")`, `store(p, v, sem = "release")`, `atomic_add(p, v, sem =
//! "release")` call) take the semantics (`None`: a plain load or store, an
//! `acq_rel` atomic) and the scope (`gpu` by default); the rules are in
//! [`crate::ir::ops::memory`]. [`wait_until`] spins until a flag or counter
//! satisfies a comparison and [`prefetch_l2`] brings future tiles into L2.

use super::{Operand, Tensor, broadcast_value, literal};
use crate::builder::{Ctx, broadcast_shapes, with_ctx};
use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::memory::LOAD_BLOCK_OPERANDS;
use crate::ir::ops::{
    ArithOp, AtomicKind, BinaryOp, CacheModifier, CmpPred, EvictionPolicy, MemOrder, MemScope, MemSem,
    MemoryOp,
};
use crate::ir::{Op, Value};
use crate::loc::Location;

/// Cache and eviction hints of a load or store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemOpts {
    /// Cache modifier.
    pub cache: CacheModifier,
    /// Eviction policy.
    pub evict: EvictionPolicy,
    /// Volatile (loads only).
    pub volatile: bool,
    /// A strong access of this ordering (`None`: a plain, weak one).
    pub order: Option<MemOrder>,
}

/// The ordering named by a kernel's `sem`/`scope` arguments of a load or
/// store: none without `sem`; a `scope` alone is reported, since it only
/// means something for an ordered access.
fn order_of(sem: Option<MemSem>, scope: MemScope, loc: &Location, what: &'static str) -> Option<MemOrder> {
    if sem.is_none() && scope != MemScope::Gpu {
        with_ctx(|c| {
            c.error(
                loc,
                Some(what),
                format!("`{what}` with a `scope` needs a `sem` (`relaxed`, `acquire` or `release`)"),
            )
        });
    }
    sem.map(|sem| MemOrder { sem, scope })
}

/// Broadcasts a list of values to their common shape.
fn common_shape(c: &mut Ctx, vals: &mut [Value], loc: &Location, what: &'static str) {
    let mut shape: Vec<usize> = Vec::new();
    for &v in vals.iter() {
        match broadcast_shapes(&shape, &c.func.ty(v).shape) {
            Ok(s) => shape = s,
            Err(msg) => {
                c.error(loc, Some(what), msg);
                return;
            }
        }
    }
    for v in vals.iter_mut() {
        *v = broadcast_value(c, *v, &shape, loc);
    }
}

/// The operands `vals` of a memory op with an optional `mask` appended
/// (checked), brought to one shape, then the mask replaced by the effective
/// one ([`effective_mask`]: the user's and the padding's); returns the
/// operands and whether a mask is among them.
fn masked_operands(
    c: &mut Ctx,
    mut vals: Vec<Value>,
    mask: Option<Tensor>,
    loc: &Location,
    what: &'static str,
) -> (Vec<Value>, bool) {
    let n = vals.len();
    if let Some(m) = mask {
        c.check(m);
        vals.push(m.value());
    }
    common_shape(c, &mut vals, loc, what);
    let user_mask = mask.map(|_| vals[n]);
    let eff = effective_mask(c, &vals, user_mask, loc);
    vals.truncate(n);
    vals.extend(eff);
    (vals, eff.is_some())
}

/// The user's mask ANDed with the validity of every padded operand (see
/// `builder::padding`): padding lanes never touch memory.
fn effective_mask(c: &mut Ctx, operands: &[Value], user: Option<Value>, loc: &Location) -> Option<Value> {
    let mut mask = user;
    for &v in operands {
        let rank = c.func.ty(v).rank();
        let dims: Vec<usize> = (0..rank).collect();
        if let Some(m) = c.validity_mask(v, &dims, loc) {
            mask = Some(match mask {
                None => m,
                Some(prev) => {
                    let t = c.func.ty(m).clone();
                    c.push(Op::Arith(ArithOp::Binary(BinaryOp::And)), &[prev, m], loc, &[t])[0]
                }
            });
        }
    }
    mask
}

/// The pointee dtype of a pointer operand, or `None` after reporting an error.
fn pointee(c: &mut Ctx, p: Tensor, loc: &Location, what: &'static str) -> Option<DType> {
    c.check(p);
    match c.func.ty(p.value()).elem {
        Elem::Ptr(d) => Some(d),
        Elem::Scalar(_) => {
            c.error(loc, Some(what), format!("`{what}` needs a pointer, found {}", c.func.ty(p.value())));
            None
        }
    }
}

/// Loads from `ptr`; lanes where `mask` is false read nothing and yield `other`
/// (zero when `other` is `None`).
#[track_caller]
pub fn load(ptr: Tensor, mask: Option<Tensor>, other: Option<Operand>) -> Tensor {
    load_with(ptr, mask, other, MemOpts::default())
}

/// [`load`] with Triton's `cache_modifier` and `eviction_policy` hints (what
/// `load(p, mask = m, eviction_policy = "evict_first")` in a kernel calls).
/// The hints change how the load goes through the caches, never its value;
/// PTX has no load with both, so giving both is an error.
#[track_caller]
pub fn load_hinted(
    ptr: Tensor,
    mask: Option<Tensor>,
    other: Option<Operand>,
    cache: CacheModifier,
    evict: EvictionPolicy,
) -> Tensor {
    check_load_hints(cache, evict, &Location::caller(), "load");
    load_with(ptr, mask, other, MemOpts { cache, evict, volatile: false, order: None })
}

/// [`load_hinted`] with an ordering (what `load(...)` in a kernel calls):
/// `sem` `relaxed` or `acquire` makes it a strong load at `scope` (see the
/// module documentation); `None` a plain one.
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn load_opts(
    ptr: Tensor,
    mask: Option<Tensor>,
    other: Option<Operand>,
    cache: CacheModifier,
    evict: EvictionPolicy,
    sem: Option<MemSem>,
    scope: MemScope,
) -> Tensor {
    let loc = Location::caller();
    check_load_hints(cache, evict, &loc, "load");
    let order = order_of(sem, scope, &loc, "load");
    load_at(ptr, mask, other, MemOpts { cache, evict, volatile: false, order }, &loc)
}

/// Reports load hints PTX cannot express: a store-only cache modifier, or
/// both a cache modifier and an eviction policy.
fn check_load_hints(cache: CacheModifier, evict: EvictionPolicy, loc: &Location, what: &'static str) {
    if !matches!(cache, CacheModifier::None | CacheModifier::Ca | CacheModifier::Cg | CacheModifier::Cs) {
        with_ctx(|c| c.error(loc, Some(what), "a load's cache modifier is `.ca`, `.cg` or `.cs`".into()));
    } else if cache != CacheModifier::None && evict != EvictionPolicy::Normal {
        with_ctx(|c| {
            c.error(
                loc,
                Some(what),
                "a load takes a `cache_modifier` or an `eviction_policy`, not both (PTX has no such load)"
                    .into(),
            )
        });
    }
}

/// [`load`] with cache/eviction hints and ordering.
#[track_caller]
pub fn load_with(ptr: Tensor, mask: Option<Tensor>, other: Option<Operand>, opts: MemOpts) -> Tensor {
    load_at(ptr, mask, other, opts, &Location::caller())
}

/// Builds a `load`; errors are reported at `loc`.
fn load_at(
    ptr: Tensor,
    mask: Option<Tensor>,
    other: Option<Operand>,
    opts: MemOpts,
    loc: &Location,
) -> Tensor {
    let loc = loc.clone();
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, &loc, "load") else {
            return ptr;
        };
        let mut vals = vec![ptr.value()];
        if let Some(m) = mask {
            c.check(m);
            vals.push(m.value());
        }
        if let Some(o) = other {
            if mask.is_none() {
                c.error(
                    &loc,
                    Some("load"),
                    "`other` needs a `mask`: without one every lane is loaded".into(),
                );
            } else {
                vals.push(literal(c, o, d, &loc));
            }
        }
        common_shape(c, &mut vals, &loc, "load");
        let user_mask = mask.map(|_| vals[1]);
        let other_v = if vals.len() == 3 { Some(vals[2]) } else { None };
        let eff = effective_mask(c, &vals, user_mask, &loc);
        let mut vals = vec![vals[0]];
        vals.extend(eff);
        if let (Some(o), Some(_)) = (other_v, eff) {
            vals.push(o);
        }
        let op = MemoryOp::Load {
            has_mask: eff.is_some(),
            has_other: vals.len() == 3,
            cache: opts.cache,
            evict: opts.evict,
            volatile: opts.volatile,
            order: opts.order,
        };
        let fallback = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(op), &vals, &loc, &[fallback])[0];
        c.handle(v)
    })
}

/// Loads the `block = [BR, BC]` tile at `(row0, col0)` of the row-major
/// matrix `rows x cols` at the scalar pointer `ptr`, whose rows start
/// `row_stride` elements apart (Triton's tensor-descriptor load):
/// `out[i][j] = ptr[(row0 + i) * row_stride + col0 + j]` where
/// `0 <= row0 + i < rows` and `0 <= col0 + j < cols`, and zero elsewhere
/// (nothing is read there; `row0`/`col0` may be negative).
///
/// `rows`, `cols`, `row_stride`, `row0` and `col0` are `i32` scalars: kernel
/// parameters, computed values or integer literals (`i8`/`u8`/`i16` scalars
/// are widened; other dtypes are errors, convert them with `.to(i32)`).
/// `BR` and `BC` are powers of two. On sm_90a the codegen may copy it with
/// the Tensor Memory Accelerator; elsewhere it becomes a masked [`load`].
#[track_caller]
pub fn load_block(
    ptr: Tensor,
    rows: impl Into<Operand>,
    cols: impl Into<Operand>,
    row_stride: impl Into<Operand>,
    row0: impl Into<Operand>,
    col0: impl Into<Operand>,
    block: impl AsRef<[usize]>,
) -> Tensor {
    let scalars = [rows.into(), cols.into(), row_stride.into(), row0.into(), col0.into()];
    load_block_at(ptr, scalars, block.as_ref(), MemOpts::default(), &Location::caller())
}

/// [`load_block`] with the hints of [`load_hinted`] (what
/// `load_block(..., eviction_policy = "evict_first")` in a kernel calls).
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn load_block_hinted(
    ptr: Tensor,
    rows: impl Into<Operand>,
    cols: impl Into<Operand>,
    row_stride: impl Into<Operand>,
    row0: impl Into<Operand>,
    col0: impl Into<Operand>,
    block: impl AsRef<[usize]>,
    cache: CacheModifier,
    evict: EvictionPolicy,
) -> Tensor {
    let loc = Location::caller();
    check_load_hints(cache, evict, &loc, "load_block");
    let scalars = [rows.into(), cols.into(), row_stride.into(), row0.into(), col0.into()];
    load_block_at(ptr, scalars, block.as_ref(), MemOpts { cache, evict, volatile: false, order: None }, &loc)
}

/// Builds a `load_block`; errors are reported at `loc`.
fn load_block_at(
    ptr: Tensor,
    scalars: [Operand; 5],
    block: &[usize],
    opts: MemOpts,
    loc: &Location,
) -> Tensor {
    with_ctx(|c| {
        let what = "load_block";
        let d = pointee(c, ptr, loc, what);
        let pty = c.func.ty(ptr.value()).clone();
        if d.is_some() && !pty.is_scalar() {
            c.error(
                loc,
                Some(what),
                format!(
                    "`load_block` takes the matrix base as a scalar pointer, found {pty}; \
                     for a tile of pointers use `load`"
                ),
            );
        }
        let [br, bc] = match *block {
            [br, bc] if br.is_power_of_two() && bc.is_power_of_two() && u32::try_from(br.max(bc)).is_ok() => {
                [br, bc]
            }
            _ => {
                c.error(
                    loc,
                    Some(what),
                    format!(
                        "`load_block` takes a block of two powers of two `[BR, BC]`, found {}",
                        crate::dtype::fmt_shape(block)
                    ),
                );
                [1, 1]
            }
        };
        let mut vals = vec![ptr.value()];
        for (k, s) in scalars.into_iter().enumerate() {
            vals.push(index_scalar(c, s, LOAD_BLOCK_OPERANDS[k + 1], loc));
        }
        let elem = Elem::Scalar(d.unwrap_or(DType::F32));
        let fallback = Type::tile(elem, &[br, bc]);
        if d.is_none() || !pty.is_scalar() {
            let v = c.placeholder(&fallback, loc);
            return c.handle(v);
        }
        let op =
            MemoryOp::LoadBlock { rows: br as u32, cols: bc as u32, cache: opts.cache, evict: opts.evict };
        let v = c.push(Op::Memory(op), &vals, loc, &[fallback])[0];
        c.handle(v)
    })
}

/// An `i32` scalar operand of `load_block` named `what`: literals become
/// constants, narrower integer scalars are widened; anything else is reported
/// and replaced by a zero.
fn index_scalar(c: &mut Ctx, s: Operand, what: &str, loc: &Location) -> Value {
    let found = match s {
        Operand::Tensor(t) => {
            c.check(t);
            let ty = c.func.ty(t.value()).clone();
            match ty.elem {
                _ if !ty.is_scalar() => format!("the tile {ty}"),
                Elem::Scalar(DType::I32) => return t.value(),
                Elem::Scalar(DType::I8 | DType::U8 | DType::I16) => {
                    return super::cast_to(c, t.value(), DType::I32, loc);
                }
                Elem::Scalar(d) if d.is_int() && d != DType::I1 => {
                    format!("{ty} (convert it with `.to(i32)` where the values fit)")
                }
                _ => ty.to_string(),
            }
        }
        Operand::Int(_) => return literal(c, s, DType::I32, loc),
        Operand::Float(f) => format!("the float literal {f}"),
        Operand::Bool(b) => format!("the bool literal {b}"),
    };
    c.error(loc, Some("load_block"), format!("`load_block` takes `{what}` as an i32 scalar, found {found}"));
    c.constant(crate::ir::Scalar::zero(DType::I32), loc)
}

/// Stores `value` (converted to the pointee dtype) to `ptr` where `mask` is true.
#[track_caller]
pub fn store(ptr: Tensor, value: impl Into<Operand>, mask: Option<Tensor>) {
    store_with(ptr, value, mask, MemOpts::default())
}

/// [`store`] with an ordering (what `store(...)` in a kernel calls): `sem`
/// `relaxed` or `release` makes it a strong store at `scope` (see the module
/// documentation); `None` a plain one.
#[track_caller]
pub fn store_opts(
    ptr: Tensor,
    value: impl Into<Operand>,
    mask: Option<Tensor>,
    sem: Option<MemSem>,
    scope: MemScope,
) {
    let loc = Location::caller();
    let order = order_of(sem, scope, &loc, "store");
    store_at(ptr, value.into(), mask, MemOpts { order, ..MemOpts::default() }, &loc)
}

/// [`store`] with cache/eviction hints and ordering.
#[track_caller]
pub fn store_with(ptr: Tensor, value: impl Into<Operand>, mask: Option<Tensor>, opts: MemOpts) {
    store_at(ptr, value.into(), mask, opts, &Location::caller())
}

/// Builds a `store`; errors are reported at `loc`.
fn store_at(ptr: Tensor, value: Operand, mask: Option<Tensor>, opts: MemOpts, loc: &Location) {
    let loc = loc.clone();
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, &loc, "store") else {
            return;
        };
        let value = literal(c, value, d, &loc);
        let (vals, has_mask) = masked_operands(c, vec![ptr.value(), value], mask, &loc, "store");
        let op = MemoryOp::Store { has_mask, cache: opts.cache, evict: opts.evict, order: opts.order };
        c.push(Op::Memory(op), &vals, &loc, &[]);
    })
}

fn atomic_at(
    kind: AtomicKind,
    ptr: Tensor,
    value: Operand,
    mask: Option<Tensor>,
    order: MemOrder,
    loc: &Location,
) -> Tensor {
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, loc, kind.name()) else {
            return ptr;
        };
        let value = literal(c, value, d, loc);
        let (vals, has_mask) = masked_operands(c, vec![ptr.value(), value], mask, loc, kind.name());
        let op = MemoryOp::Atomic { kind, has_mask, sem: order.sem, scope: order.scope };
        let fallback = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(op), &vals, loc, &[fallback])[0];
        c.handle(v)
    })
}

/// The ordering of an atomic: `acq_rel` at GPU scope unless the kernel names one.
fn atomic_order(sem: Option<MemSem>, scope: MemScope) -> MemOrder {
    MemOrder { sem: sem.unwrap_or(MemSem::AcqRel), scope }
}

macro_rules! atomic_fns {
    ($($(#[$m:meta])* $f:ident, $g:ident => $k:ident;)*) => {$(
        $(#[$m])*
        #[track_caller]
        pub fn $f(ptr: Tensor, value: impl Into<Operand>, mask: Option<Tensor>) -> Tensor {
            atomic_at(AtomicKind::$k, ptr, value.into(), mask, atomic_order(None, MemScope::Gpu), &Location::caller())
        }

        #[doc = concat!("[`", stringify!($f), "`] with an ordering (what a kernel's `", stringify!($f),
            "(p, v, sem = \"release\", scope = \"gpu\")` calls; `None` is `acq_rel`).")]
        #[track_caller]
        pub fn $g(
            ptr: Tensor,
            value: impl Into<Operand>,
            mask: Option<Tensor>,
            sem: Option<MemSem>,
            scope: MemScope,
        ) -> Tensor {
            atomic_at(AtomicKind::$k, ptr, value.into(), mask, atomic_order(sem, scope), &Location::caller())
        }
    )*};
}

atomic_fns! {
    /// `*p += v` atomically; returns the old values.
    atomic_add, atomic_add_opts => Add;
    /// `*p = max(*p, v)` atomically; returns the old values.
    atomic_max, atomic_max_opts => Max;
    /// `*p = min(*p, v)` atomically; returns the old values.
    atomic_min, atomic_min_opts => Min;
    /// `*p &= v` atomically; returns the old values.
    atomic_and, atomic_and_opts => And;
    /// `*p |= v` atomically; returns the old values.
    atomic_or, atomic_or_opts => Or;
    /// `*p ^= v` atomically; returns the old values.
    atomic_xor, atomic_xor_opts => Xor;
    /// `*p = v` atomically; returns the old values.
    atomic_xchg, atomic_xchg_opts => Xchg;
}

/// Where `*p == cmp`, stores `value`; returns the old values.
#[track_caller]
pub fn atomic_cas(ptr: Tensor, cmp: impl Into<Operand>, value: impl Into<Operand>) -> Tensor {
    cas_at(ptr, cmp.into(), value.into(), atomic_order(None, MemScope::Gpu), &Location::caller())
}

/// [`atomic_cas`] with an ordering (`None` is `acq_rel`).
#[track_caller]
pub fn atomic_cas_opts(
    ptr: Tensor,
    cmp: impl Into<Operand>,
    value: impl Into<Operand>,
    sem: Option<MemSem>,
    scope: MemScope,
) -> Tensor {
    cas_at(ptr, cmp.into(), value.into(), atomic_order(sem, scope), &Location::caller())
}

/// Builds an `atomic_cas`; errors are reported at `loc`.
fn cas_at(ptr: Tensor, cmp: Operand, value: Operand, order: MemOrder, loc: &Location) -> Tensor {
    let loc = loc.clone();
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, &loc, "atomic_cas") else {
            return ptr;
        };
        let mut vals = vec![ptr.value(), literal(c, cmp, d, &loc), literal(c, value, d, &loc)];
        common_shape(c, &mut vals, &loc, "atomic_cas");
        let op = MemoryOp::AtomicCas { sem: order.sem, scope: order.scope };
        let fallback: Type = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(op), &vals, &loc, &[fallback])[0];
        c.handle(v)
    })
}

/// Blocks the program until `*ptr cmp value` holds, with acquire semantics
/// at GPU scope: the spin-wait of a persistent kernel on a flag or counter
/// another program releases (`ptr` a scalar pointer to `i32`, `u32` or
/// `i64`). Every thread of the program continues together once it holds,
/// and sees what the releasing program wrote before its release.
///
/// On the GPU every program that may be waited on must be resident at once,
/// or the wait never ends; the interpreter runs the programs interleaved and
/// reports a deadlock (every live program waiting) as an error.
#[track_caller]
pub fn wait_until(ptr: Tensor, cmp: CmpPred, value: impl Into<Operand>) {
    wait_at(ptr, cmp, value.into(), None, MemScope::Gpu, &Location::caller())
}

/// [`wait_until`] with an ordering (what a kernel's `wait_until(p, "ge", n,
/// sem = "relaxed", scope = "sys")` calls): `sem` `acquire` (`None`) or
/// `relaxed`, scope `gpu` or `sys`.
#[track_caller]
pub fn wait_until_opts(
    ptr: Tensor,
    cmp: CmpPred,
    value: impl Into<Operand>,
    sem: Option<MemSem>,
    scope: MemScope,
) {
    wait_at(ptr, cmp, value.into(), sem, scope, &Location::caller())
}

/// Builds a `wait_until`; errors are reported at `loc`.
fn wait_at(ptr: Tensor, cmp: CmpPred, value: Operand, sem: Option<MemSem>, scope: MemScope, loc: &Location) {
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, loc, "wait_until") else {
            return;
        };
        let vals = [ptr.value(), literal(c, value, d, loc)];
        let op = MemoryOp::WaitUntil { cmp, sem: sem.unwrap_or(MemSem::Acquire), scope };
        c.push(Op::Memory(op), &vals, loc, &[]);
    })
}

/// The 64-bit lines at `ptr` (pointers to `i64`), read once the high 32
/// bits of every line where `mask` holds equal `flag` (an integer scalar,
/// compared as 32 bits; masked-off lanes yield zero): the reader's half of
/// a flag-in-data hand-over (see [`crate::ir::ops::memory`]). The producer
/// stores each line whole, its data in the low half and the hand-over's
/// flag in the high half, with a relaxed strong `store`; the reader needs
/// no counter, fence or barrier. The program blocks until the lines
/// arrive; the interpreter reports a deadlock naming the line it waits on.
#[track_caller]
pub fn wait_load(ptr: Tensor, flag: impl Into<Operand>, mask: Option<Tensor>, scope: MemScope) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, &loc, "wait_load") else {
            return ptr;
        };
        // A tensor flag goes in as it is (the op's rule names a wrong one);
        // a literal becomes an i32.
        let flag = match flag.into() {
            Operand::Tensor(t) => {
                c.check(t);
                t.value()
            }
            op => literal(c, op, DType::I32, &loc),
        };
        let (mut vals, has_mask) = masked_operands(c, vec![ptr.value()], mask, &loc, "wait_load");
        vals.insert(1, flag);
        let fallback = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(MemoryOp::WaitLoad { has_mask, scope }), &vals, &loc, &[fallback])[0];
        c.handle(v)
    })
}

/// Asks for the lines holding the elements at `ptr` (where `mask` is true)
/// to be brought into L2, so a later load of them (the next task's weights
/// in a persistent kernel) does not wait for DRAM. It changes no value; the
/// interpreter checks the addresses like a load's.
#[track_caller]
pub fn prefetch_l2(ptr: Tensor, mask: Option<Tensor>) {
    let loc = Location::caller();
    with_ctx(|c| {
        if pointee(c, ptr, &loc, "prefetch_l2").is_none() {
            return;
        }
        let (vals, has_mask) = masked_operands(c, vec![ptr.value()], mask, &loc, "prefetch_l2");
        c.push(Op::Memory(MemoryOp::PrefetchL2 { has_mask }), &vals, &loc, &[]);
    })
}

#[cfg(test)]
mod tests {
    use crate::builder::kernel;
    use crate::ir::Op;
    use crate::ir::ops::{CacheModifier, EvictionPolicy, MemoryOp};
    use crate::lang::*;
    use crate::{Error, Function};

    /// The diagnostics of a build that must fail, as `(line, message)`.
    fn diagnostics(body: impl FnOnce()) -> Vec<(u32, String)> {
        match KernelBuilder::new("k").build(body) {
            Err(Error::Build { diagnostics, .. }) => {
                diagnostics.into_iter().map(|d| (d.loc.line, d.message)).collect()
            }
            other => panic!("expected build errors, got {other:?}"),
        }
    }

    /// The `load_block` ops of `f` and the dtypes of their operands.
    fn load_blocks(f: &Function) -> Vec<(MemoryOp, Vec<DType>)> {
        let mut out = Vec::new();
        f.walk(|i| {
            if let Op::Memory(m @ MemoryOp::LoadBlock { .. }) = &f.insts[i].op {
                out.push((m.clone(), f.insts[i].args.iter().map(|&a| f.ty(a).dtype()).collect()));
            }
        });
        out
    }

    #[test]
    fn load_block_takes_literals_params_and_narrow_integers() {
        let f = kernel("k", || {
            let x = param_ptr("x", DType::F16);
            let rows = param_scalar("rows", DType::I32);
            let col0 = param_scalar("col0", DType::I16);
            let t = load_block(x, rows, 100, 128, program_id(0) * 16, col0, [16, 32]);
            assert_eq!((t.shape(), t.dtype()), (vec![16, 32], DType::F16));
            let hint = CacheModifier::Cg;
            let u = load_block_hinted(x, rows, 100, 128, -3, 0, [1, 64], hint, EvictionPolicy::Normal);
            assert_eq!(u.shape(), vec![1, 64]);
            store(x + arange(0, 32), sum(t, 0), None);
            store(x + arange(0, 64), sum(u, 0), None);
        });
        let ops = load_blocks(&f);
        assert_eq!(ops.len(), 2);
        let i32s = [DType::I32; 5];
        for (k, (op, dts)) in ops.iter().enumerate() {
            assert_eq!(dts[0], DType::F16);
            assert_eq!(dts[1..], i32s, "operands of load_block {k}");
            let MemoryOp::LoadBlock { rows, cols, cache, .. } = *op else { unreachable!() };
            let want = if k == 0 { (16, 32, CacheModifier::None) } else { (1, 64, CacheModifier::Cg) };
            assert_eq!((rows, cols, cache), want);
        }
    }

    #[test]
    fn load_block_reports_bad_operands_at_the_call() {
        let line = std::cell::Cell::new(0);
        let d = diagnostics(|| {
            let x = param_ptr("x", DType::F32);
            let n = param_scalar("n", DType::I64);
            let i = param_scalar("i", DType::I32);
            line.set(line!() + 1);
            load_block(i, 4, 4, 4, 0, 0, [4, 4]);
            load_block(x + arange(0, 4), 4, 4, 4, 0, 0, [4, 4]);
            load_block(x, 4, 4, 4, 0, 0, [4, 3]);
            load_block(x, 4, 4, 4, 0, 0, [4]);
            load_block(x, n, 4, 4, 0, 0, [4, 4]);
            load_block(x, 4, 2.5, arange(0, 4), true, 1i64 << 40, [4, 4]);
            load_block_hinted(x, 4, 4, 4, 0, 0, [4, 4], CacheModifier::Cg, EvictionPolicy::First);
            load_block_hinted(x, 4, 4, 4, 0, 0, [4, 4], CacheModifier::Wb, EvictionPolicy::Normal);
        });
        let l = line.get();
        let want: Vec<(u32, &str)> = vec![
            (l, "`load_block` needs a pointer, found i32"),
            (l + 1, "`load_block` takes the matrix base as a scalar pointer, found tensor<4xptr<f32>>"),
            (l + 2, "`load_block` takes a block of two powers of two `[BR, BC]`, found [4, 3]"),
            (l + 3, "`load_block` takes a block of two powers of two `[BR, BC]`, found [4]"),
            (l + 4, "`load_block` takes `rows` as an i32 scalar, found i64 (convert it with `.to(i32)`"),
            (l + 5, "`load_block` takes `cols` as an i32 scalar, found the float literal 2.5"),
            (l + 5, "`load_block` takes `row_stride` as an i32 scalar, found the tile tensor<4xi32>"),
            (l + 5, "`load_block` takes `row0` as an i32 scalar, found the bool literal true"),
            (l + 5, "integer literal 1099511627776 does not fit in i32"),
            (l + 6, "not both"),
            (l + 7, "a load's cache modifier is `.ca`, `.cg` or `.cs`"),
        ];
        assert_eq!(d.len(), want.len(), "{d:#?}");
        for ((dl, dm), (wl, wm)) in d.iter().zip(&want) {
            assert_eq!(*dl, *wl, "{dm}");
            assert!(dm.contains(wm), "`{dm}` lacks `{wm}`");
        }
    }
}
