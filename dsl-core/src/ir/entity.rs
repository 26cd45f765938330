//! Typed index newtypes for IR entities and a vector indexed by them.
//!
//! Invariant: an entity index is only meaningful inside the `Function` that
//! allocated it; indices are never reused within a function.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// An entity reference: a dense `u32` index.
pub trait EntityRef: Copy + Eq + std::hash::Hash + fmt::Debug {
    /// Makes a reference from an index.
    fn new(index: usize) -> Self;
    /// The index of this reference.
    fn index(self) -> usize;
}

macro_rules! entity {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl EntityRef for $name {
            fn new(index: usize) -> Self {
                $name(u32::try_from(index).expect("more than 2^32 IR entities"))
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

entity!(
    /// An SSA value: an op result or a block argument.
    Value,
    "v"
);
entity!(
    /// An op instance in a function.
    Inst,
    "inst"
);
entity!(
    /// A basic block: arguments and a list of ops.
    Block,
    "block"
);
entity!(
    /// A region owned by an op (or the function body): a list of blocks.
    Region,
    "region"
);

/// A vector indexed by an entity reference.
#[derive(Clone, Debug)]
pub struct EntityVec<K: EntityRef, V> {
    items: Vec<V>,
    _k: PhantomData<K>,
}

impl<K: EntityRef, V> Default for EntityVec<K, V> {
    fn default() -> Self {
        EntityVec { items: Vec::new(), _k: PhantomData }
    }
}

impl<K: EntityRef, V> EntityVec<K, V> {
    /// An empty vector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `v` and returns its reference.
    pub fn push(&mut self, v: V) -> K {
        let k = K::new(self.items.len());
        self.items.push(v);
        k
    }

    /// Number of entities.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The entity data if `k` is in range.
    pub fn get(&self, k: K) -> Option<&V> {
        self.items.get(k.index())
    }

    /// Iterates over `(reference, data)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> {
        self.items.iter().enumerate().map(|(i, v)| (K::new(i), v))
    }

    /// Iterates over references.
    pub fn keys(&self) -> impl Iterator<Item = K> + use<K, V> {
        (0..self.items.len()).map(K::new)
    }
}

impl<K: EntityRef, V> Index<K> for EntityVec<K, V> {
    type Output = V;
    fn index(&self, k: K) -> &V {
        &self.items[k.index()]
    }
}

impl<K: EntityRef, V> IndexMut<K> for EntityVec<K, V> {
    fn index_mut(&mut self, k: K) -> &mut V {
        &mut self.items[k.index()]
    }
}

/// A dense side table keyed by entity, for analyses.
#[derive(Clone, Debug)]
pub struct SecondaryMap<K: EntityRef, V: Clone> {
    items: Vec<V>,
    default: V,
    _k: PhantomData<K>,
}

impl<K: EntityRef, V: Clone> SecondaryMap<K, V> {
    /// A map whose every entry starts as `default`.
    pub fn with_default(default: V) -> Self {
        SecondaryMap { items: Vec::new(), default, _k: PhantomData }
    }

    /// Sets the entry of `k`.
    pub fn set(&mut self, k: K, v: V) {
        let i = k.index();
        if i >= self.items.len() {
            self.items.resize(i + 1, self.default.clone());
        }
        self.items[i] = v;
    }
}

impl<K: EntityRef, V: Clone> Index<K> for SecondaryMap<K, V> {
    type Output = V;
    fn index(&self, k: K) -> &V {
        self.items.get(k.index()).unwrap_or(&self.default)
    }
}
