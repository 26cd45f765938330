//! Loads, stores and atomics. Pointer, mask, `other` and value operands are
//! broadcast to one shape; values are converted to the pointee dtype.

use super::{Operand, Tensor, broadcast_value, literal};
use crate::builder::{Ctx, broadcast_shapes, with_ctx};
use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::{
    ArithOp, AtomicKind, BinaryOp, CacheModifier, EvictionPolicy, MemScope, MemSem, MemoryOp,
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
    if !matches!(cache, CacheModifier::None | CacheModifier::Ca | CacheModifier::Cg | CacheModifier::Cs) {
        let loc = Location::caller();
        with_ctx(|c| c.error(&loc, Some("load"), "a load's cache modifier is `.ca`, `.cg` or `.cs`".into()));
    } else if cache != CacheModifier::None && evict != EvictionPolicy::Normal {
        let loc = Location::caller();
        with_ctx(|c| {
            c.error(
                &loc,
                Some("load"),
                "a load takes a `cache_modifier` or an `eviction_policy`, not both (PTX has no such load)"
                    .into(),
            )
        });
    }
    load_with(ptr, mask, other, MemOpts { cache, evict, volatile: false })
}

/// [`load`] with cache/eviction hints.
#[track_caller]
pub fn load_with(ptr: Tensor, mask: Option<Tensor>, other: Option<Operand>, opts: MemOpts) -> Tensor {
    let loc = Location::caller();
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
        };
        let fallback = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(op), &vals, &loc, &[fallback])[0];
        c.handle(v)
    })
}

/// Stores `value` (converted to the pointee dtype) to `ptr` where `mask` is true.
#[track_caller]
pub fn store(ptr: Tensor, value: impl Into<Operand>, mask: Option<Tensor>) {
    store_with(ptr, value, mask, MemOpts::default())
}

/// [`store`] with cache/eviction hints.
#[track_caller]
pub fn store_with(ptr: Tensor, value: impl Into<Operand>, mask: Option<Tensor>, opts: MemOpts) {
    let loc = Location::caller();
    let value = value.into();
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, &loc, "store") else {
            return;
        };
        let mut vals = vec![ptr.value(), literal(c, value, d, &loc)];
        if let Some(m) = mask {
            c.check(m);
            vals.push(m.value());
        }
        common_shape(c, &mut vals, &loc, "store");
        let user_mask = mask.map(|_| vals[2]);
        let eff = effective_mask(c, &vals, user_mask, &loc);
        vals.truncate(2);
        vals.extend(eff);
        let op = MemoryOp::Store { has_mask: eff.is_some(), cache: opts.cache, evict: opts.evict };
        c.push(Op::Memory(op), &vals, &loc, &[]);
    })
}

fn atomic_at(kind: AtomicKind, ptr: Tensor, value: Operand, mask: Option<Tensor>, loc: &Location) -> Tensor {
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, loc, kind.name()) else {
            return ptr;
        };
        let mut vals = vec![ptr.value(), literal(c, value, d, loc)];
        if let Some(m) = mask {
            c.check(m);
            vals.push(m.value());
        }
        common_shape(c, &mut vals, loc, kind.name());
        let user_mask = mask.map(|_| vals[2]);
        let eff = effective_mask(c, &vals, user_mask, loc);
        vals.truncate(2);
        vals.extend(eff);
        let op =
            MemoryOp::Atomic { kind, has_mask: eff.is_some(), sem: MemSem::AcqRel, scope: MemScope::Gpu };
        let fallback = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(op), &vals, loc, &[fallback])[0];
        c.handle(v)
    })
}

macro_rules! atomic_fns {
    ($($(#[$m:meta])* $f:ident => $k:ident;)*) => {$(
        $(#[$m])*
        #[track_caller]
        pub fn $f(ptr: Tensor, value: impl Into<Operand>, mask: Option<Tensor>) -> Tensor {
            atomic_at(AtomicKind::$k, ptr, value.into(), mask, &Location::caller())
        }
    )*};
}

atomic_fns! {
    /// `*p += v` atomically; returns the old values.
    atomic_add => Add;
    /// `*p = max(*p, v)` atomically; returns the old values.
    atomic_max => Max;
    /// `*p = min(*p, v)` atomically; returns the old values.
    atomic_min => Min;
    /// `*p &= v` atomically; returns the old values.
    atomic_and => And;
    /// `*p |= v` atomically; returns the old values.
    atomic_or => Or;
    /// `*p ^= v` atomically; returns the old values.
    atomic_xor => Xor;
    /// `*p = v` atomically; returns the old values.
    atomic_xchg => Xchg;
}

/// Where `*p == cmp`, stores `value`; returns the old values.
#[track_caller]
pub fn atomic_cas(ptr: Tensor, cmp: impl Into<Operand>, value: impl Into<Operand>) -> Tensor {
    let loc = Location::caller();
    let (cmp, value) = (cmp.into(), value.into());
    with_ctx(|c| {
        let Some(d) = pointee(c, ptr, &loc, "atomic_cas") else {
            return ptr;
        };
        let mut vals = vec![ptr.value(), literal(c, cmp, d, &loc), literal(c, value, d, &loc)];
        common_shape(c, &mut vals, &loc, "atomic_cas");
        let op = MemoryOp::AtomicCas { sem: MemSem::AcqRel, scope: MemScope::Gpu };
        let fallback: Type = c.func.ty(vals[0]).with_elem(Elem::Scalar(d));
        let v = c.push(Op::Memory(op), &vals, &loc, &[fallback])[0];
        c.handle(v)
    })
}
