//! The prefix cache: full token blocks identified exactly by their whole
//! prefix, plus the LRU list of cached blocks that no sequence uses.
//!
//! # Identity
//!
//! A full block is keyed by `(parent, tokens)`: the [`PrefixId`] of the block
//! before it (`None` for the first block of a sequence) and its `block_size`
//! token ids. Each distinct key gets a fresh `PrefixId` from a counter when it
//! is inserted, so two blocks have the same `PrefixId` exactly when the whole
//! token prefixes they end are equal: this is a chained hash whose "hash" is
//! interned, and the map compares full keys (tokens included), so a hash
//! collision can never make two different prefixes look alike. Ids are never
//! reused: when a block is evicted its key disappears; cached children that
//! named it as parent become unreachable (a later lookup of the same prefix
//! interns a new id) and age out of the LRU list like any other block.
//!
//! # LRU
//!
//! Cached blocks with reference count 0 sit in a list ordered by the tick at
//! which they became unused; eviction takes the oldest. The block manager
//! releases a sequence's blocks last block first, so the tail of a prompt is
//! evicted before its head (heads are the blocks other prompts share).
//!
//! Invariant: `map` and the block manager's per-block `cached` field describe
//! the same set of (key, id, block) triples; `lru` holds exactly the cached
//! blocks whose reference count is 0, each once.

use super::BlockId;
use std::collections::{BTreeMap, HashMap};

/// The exact identity of a token prefix that ends at a full block boundary;
/// see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrefixId(u64);

/// The key of a cached block: its parent's identity and its own tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PrefixKey {
    /// The identity of the prefix before this block (`None` at position 0).
    pub(crate) parent: Option<PrefixId>,
    /// The block's tokens (exactly `block_size` of them).
    pub(crate) tokens: Box<[u32]>,
}

impl PrefixKey {
    /// The key of a block with these tokens after `parent`.
    pub(crate) fn new(parent: Option<PrefixId>, tokens: &[u32]) -> PrefixKey {
        PrefixKey { parent, tokens: tokens.into() }
    }
}

/// The result of a prefix-cache lookup: the cached blocks that hold the
/// longest prefix of full blocks of a prompt (never the whole prompt: at least
/// its last token is left to compute, so that the step produces logits).
///
/// Valid until the block manager is next changed; [`super::BlockManager::allocate`]
/// verifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixHit {
    pub(crate) blocks: Vec<BlockId>,
    pub(crate) ids: Vec<PrefixId>,
    pub(crate) query_tokens: usize,
    pub(crate) block_size: usize,
}

impl PrefixHit {
    /// No hit, for a prompt of `query_tokens` tokens (prefix caching off, or a
    /// sequence that is not a fresh prompt).
    pub fn miss(query_tokens: usize, block_size: usize) -> PrefixHit {
        PrefixHit { blocks: Vec::new(), ids: Vec::new(), query_tokens, block_size }
    }

    /// The cached blocks, in table order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Tokens already in the cache (`blocks().len() * block_size`).
    pub fn num_tokens(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    /// The length of the prompt that was looked up.
    pub fn query_tokens(&self) -> usize {
        self.query_tokens
    }
}

/// The prefix map and the LRU list of unused cached blocks.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    map: HashMap<PrefixKey, (PrefixId, BlockId)>,
    next_id: u64,
    lru: BTreeMap<u64, BlockId>,
    next_tick: u64,
}

impl PrefixCache {
    /// The cached block with this key, if any.
    pub(crate) fn get(&self, key: &PrefixKey) -> Option<(PrefixId, BlockId)> {
        self.map.get(key).copied()
    }

    /// Caches `block` under `key` (which must be absent) and returns the new
    /// identity.
    pub(crate) fn insert(&mut self, key: PrefixKey, block: BlockId) -> PrefixId {
        let id = PrefixId(self.next_id);
        self.next_id += 1;
        let old = self.map.insert(key, (id, block));
        debug_assert!(old.is_none(), "a prefix key was inserted twice");
        id
    }

    /// Forgets `key`.
    pub(crate) fn remove(&mut self, key: &PrefixKey) {
        self.map.remove(key);
    }

    /// Number of cached blocks (used or not).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Every cached entry (for invariant checks).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&PrefixKey, PrefixId, BlockId)> {
        self.map.iter().map(|(k, &(id, b))| (k, id, b))
    }

    /// Appends `block` to the LRU list (most recently used end); returns its tick.
    pub(crate) fn lru_push(&mut self, block: BlockId) -> u64 {
        let tick = self.next_tick;
        self.next_tick += 1;
        self.lru.insert(tick, block);
        tick
    }

    /// Takes the block with this tick off the LRU list (a prefix hit revived it).
    pub(crate) fn lru_remove(&mut self, tick: u64) -> Option<BlockId> {
        self.lru.remove(&tick)
    }

    /// Takes the least recently used block off the list.
    pub(crate) fn lru_pop(&mut self) -> Option<BlockId> {
        self.lru.pop_first().map(|(_, b)| b)
    }

    /// Number of unused cached blocks.
    pub(crate) fn lru_len(&self) -> usize {
        self.lru.len()
    }

    /// The LRU list, oldest first (for invariant checks and tests).
    pub(crate) fn lru_iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.lru.iter().map(|(&t, &b)| (t, b))
    }
}
