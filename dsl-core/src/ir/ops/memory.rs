//! Memory ops: masked loads and stores, atomics.
//!
//! Semantics: a masked-off lane neither reads nor writes memory; a masked-off
//! load lane yields `other` (or zero when there is no `other`). Atomics return
//! the value in memory before the update.

use super::{Attr, Attrs, attr_flag, attr_word, expect_args, same_shapes};
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
    },
    /// `store ptr, value [, mask]`: no results.
    Store {
        /// Operand 2 is an `i1` mask.
        has_mask: bool,
        /// Cache modifier.
        cache: CacheModifier,
        /// Eviction policy.
        evict: EvictionPolicy,
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
}

fn cache_name(c: CacheModifier) -> &'static str {
    match c {
        CacheModifier::None => "none",
        CacheModifier::Ca => "ca",
        CacheModifier::Cg => "cg",
        CacheModifier::Cs => "cs",
        CacheModifier::Wb => "wb",
        CacheModifier::Wt => "wt",
    }
}

fn evict_name(e: EvictionPolicy) -> &'static str {
    match e {
        EvictionPolicy::Normal => "normal",
        EvictionPolicy::First => "first",
        EvictionPolicy::Last => "last",
    }
}

fn sem_name(s: MemSem) -> &'static str {
    match s {
        MemSem::Relaxed => "relaxed",
        MemSem::Acquire => "acquire",
        MemSem::Release => "release",
        MemSem::AcqRel => "acq_rel",
    }
}

fn scope_name(s: MemScope) -> &'static str {
    match s {
        MemScope::Gpu => "gpu",
        MemScope::Cta => "cta",
        MemScope::Sys => "sys",
    }
}

const ATOMICS: [(AtomicKind, &str); 7] = [
    (AtomicKind::Add, "atomic_add"),
    (AtomicKind::Max, "atomic_max"),
    (AtomicKind::Min, "atomic_min"),
    (AtomicKind::And, "atomic_and"),
    (AtomicKind::Or, "atomic_or"),
    (AtomicKind::Xor, "atomic_xor"),
    (AtomicKind::Xchg, "atomic_xchg"),
];

fn parse_word<T: Copy>(
    attrs: &[(String, Attr)],
    key: &str,
    all: &[T],
    name: fn(T) -> &'static str,
    default: T,
) -> Result<T, String> {
    if super::attr(attrs, key).is_none() {
        return Ok(default);
    }
    let w = attr_word(attrs, key)?;
    all.iter().copied().find(|v| name(*v) == w).ok_or(format!("unknown {key} `{w}`"))
}

const CACHES: [CacheModifier; 6] = [
    CacheModifier::None,
    CacheModifier::Ca,
    CacheModifier::Cg,
    CacheModifier::Cs,
    CacheModifier::Wb,
    CacheModifier::Wt,
];
const EVICTS: [EvictionPolicy; 3] = [EvictionPolicy::Normal, EvictionPolicy::First, EvictionPolicy::Last];
const SEMS: [MemSem; 4] = [MemSem::Relaxed, MemSem::Acquire, MemSem::Release, MemSem::AcqRel];
const SCOPES: [MemScope; 3] = [MemScope::Gpu, MemScope::Cta, MemScope::Sys];

impl AtomicKind {
    /// The mnemonic of the atomic op.
    pub fn name(self) -> &'static str {
        ATOMICS.iter().find(|(k, _)| *k == self).map(|(_, n)| *n).unwrap_or("?")
    }
}

impl MemoryOp {
    /// The mnemonic.
    pub fn name(&self) -> &'static str {
        match self {
            MemoryOp::Load { .. } => "load",
            MemoryOp::Store { .. } => "store",
            MemoryOp::Atomic { kind, .. } => kind.name(),
            MemoryOp::AtomicCas { .. } => "atomic_cas",
        }
    }

    /// True for ops that write memory.
    pub fn has_side_effects(&self) -> bool {
        !matches!(self, MemoryOp::Load { volatile: false, .. })
    }

    /// Attributes for printing (defaults are omitted).
    pub fn attrs(&self) -> Attrs {
        let mut a: Attrs = Vec::new();
        let hints = |a: &mut Attrs, c: CacheModifier, e: EvictionPolicy| {
            if c != CacheModifier::None {
                a.push(("cache", Attr::Word(cache_name(c).into())));
            }
            if e != EvictionPolicy::Normal {
                a.push(("evict", Attr::Word(evict_name(e).into())));
            }
        };
        match *self {
            MemoryOp::Load { has_mask, has_other, cache, evict, volatile } => {
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
            }
            MemoryOp::Store { has_mask, cache, evict } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
                hints(&mut a, cache, evict);
            }
            MemoryOp::Atomic { has_mask, sem, scope, .. } => {
                if has_mask {
                    a.push(("mask", Attr::Flag));
                }
                a.push(("sem", Attr::Word(sem_name(sem).into())));
                a.push(("scope", Attr::Word(scope_name(scope).into())));
            }
            MemoryOp::AtomicCas { sem, scope } => {
                a.push(("sem", Attr::Word(sem_name(sem).into())));
                a.push(("scope", Attr::Word(scope_name(scope).into())));
            }
        }
        a
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<MemoryOp>, String> {
        let cache = parse_word(attrs, "cache", &CACHES, cache_name, CacheModifier::None)?;
        let evict = parse_word(attrs, "evict", &EVICTS, evict_name, EvictionPolicy::Normal)?;
        let sem = parse_word(attrs, "sem", &SEMS, sem_name, MemSem::AcqRel)?;
        let scope = parse_word(attrs, "scope", &SCOPES, scope_name, MemScope::Gpu)?;
        let has_mask = attr_flag(attrs, "mask");
        Ok(Some(match name {
            "load" => MemoryOp::Load {
                has_mask,
                has_other: attr_flag(attrs, "other"),
                cache,
                evict,
                volatile: attr_flag(attrs, "volatile"),
            },
            "store" => MemoryOp::Store { has_mask, cache, evict },
            "atomic_cas" => MemoryOp::AtomicCas { sem, scope },
            _ => match ATOMICS.iter().find(|(_, n)| *n == name) {
                Some((kind, _)) => MemoryOp::Atomic { kind: *kind, has_mask, sem, scope },
                None => return Ok(None),
            },
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        let name = self.name();
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
            MemoryOp::Load { has_mask, has_other, .. } => {
                if has_other && !has_mask {
                    return Err("`load` with `other` needs a mask".into());
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
            MemoryOp::Store { has_mask, .. } => {
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
        }
    }
}
