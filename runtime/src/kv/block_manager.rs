//! [`BlockManager`]: the pool of physical KV-cache blocks, their reference
//! counts, the sequences' block tables and the prefix cache.
//!
//! # Life of a sequence
//!
//! 1. [`BlockManager::find_prefix`] looks up the cached full blocks that start
//!    the prompt (no side effects) and [`BlockManager::allocate`] creates the
//!    sequence's table from that hit plus fresh blocks for the first tokens to
//!    compute, all or nothing.
//! 2. [`BlockManager::append_slots`] grows the table for the next chunk of
//!    prefill or the next decode token and returns the tokens' slots; when the
//!    first slot falls in a partial block shared with another sequence, the
//!    sequence gets a private copy first ([`BlockCopy`]).
//! 3. [`BlockManager::cache_full_blocks`] registers the full blocks whose KV is
//!    computed in the prefix cache (called once the step that wrote them has
//!    run).
//! 4. [`BlockManager::free`] drops the table: blocks nobody else uses become
//!    free, or evictable if cached.
//!
//! Allocation never fails half-way: every operation checks the blocks it
//! needs against `free + evictable` first and returns `Ok(None)` (retry later,
//! or preempt someone) without changing anything when they are missing, and
//! [`KvError::PoolTooSmall`] when the sequence would need more blocks than the
//! whole pool (no amount of waiting helps). The module-level invariants are
//! listed in [`super`] and checked by [`BlockManager::check_invariants`].

use super::prefix::{PrefixCache, PrefixHit, PrefixId, PrefixKey};
use super::{BlockCopy, BlockId, KvError, KvResult, SeqId, blocks_for};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;
use std::fmt;

/// What one physical block is doing.
#[derive(Debug, Clone, Default)]
struct BlockMeta {
    /// Block-table references to this block.
    refcount: u32,
    /// Its prefix-cache identity and key, when cached.
    cached: Option<(PrefixId, PrefixKey)>,
    /// Its tick on the LRU list, when cached and unused.
    lru_tick: Option<u64>,
}

/// One sequence's block table.
#[derive(Debug, Clone)]
struct SeqBlocks {
    /// Physical blocks, in position order.
    blocks: Vec<BlockId>,
    /// Positions `0..num_slots` have slots.
    num_slots: usize,
    /// Prefix identities of the first `hashed.len()` (full, computed) blocks.
    hashed: Vec<PrefixId>,
}

/// The slots for the tokens of one step of one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The position of the first token.
    pub start: usize,
    /// One slot (`block * block_size + offset`) per token, positions
    /// `start..start + slots.len()`.
    pub slots: Vec<i32>,
    /// Block copies to perform before the step's KV writes (copy-on-write).
    pub copies: Vec<BlockCopy>,
}

/// Counters of the pool and the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvStats {
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// Blocks referenced by at least one block table.
    pub used_blocks: usize,
    /// Unreferenced, uncached blocks.
    pub free_blocks: usize,
    /// Unreferenced cached blocks (reusable by prefix hits until evicted).
    pub evictable_blocks: usize,
    /// Cached blocks, used or not.
    pub cached_blocks: usize,
    /// Sequences with a block table.
    pub num_seqs: usize,
    /// Prompt tokens looked up in the prefix cache (by committed allocations).
    pub prefix_query_tokens: u64,
    /// Of those, tokens found in the cache.
    pub prefix_hit_tokens: u64,
    /// Cached blocks reclaimed for new data.
    pub evictions: u64,
    /// Copy-on-write block copies issued.
    pub cow_copies: u64,
}

impl KvStats {
    /// `prefix_hit_tokens / prefix_query_tokens` (0 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        if self.prefix_query_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_query_tokens as f64
        }
    }
}

impl fmt::Display for KvStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KV blocks: {} used, {} free, {} evictable of {} ({} cached); {} seqs; \
             prefix hit rate {:.1}% ({}/{} tokens); {} evictions; {} CoW copies",
            self.used_blocks,
            self.free_blocks,
            self.evictable_blocks,
            self.total_blocks,
            self.cached_blocks,
            self.num_seqs,
            100.0 * self.hit_rate(),
            self.prefix_hit_tokens,
            self.prefix_query_tokens,
            self.evictions,
            self.cow_copies
        )
    }
}

/// The pool of physical KV-cache blocks; see the module doc.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    prefix_caching: bool,
    blocks: Vec<BlockMeta>,
    free: VecDeque<BlockId>,
    cache: PrefixCache,
    seqs: HashMap<SeqId, SeqBlocks>,
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
    evictions: u64,
    cow_copies: u64,
}

/// A bug in the caller or in this module, as an error.
fn bug(seq: SeqId, message: impl Into<String>) -> KvError {
    KvError::InvalidState { seq, message: message.into() }
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens, all free.
    ///
    /// Errors when either is 0 or when slots (`num_blocks * block_size`) would
    /// not fit in an i32.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> KvResult<BlockManager> {
        if num_blocks == 0 || block_size == 0 {
            return Err(KvError::Config(format!(
                "the KV pool needs at least one block of at least one token (got {num_blocks} blocks of \
                 {block_size} tokens)"
            )));
        }
        match num_blocks.checked_mul(block_size) {
            Some(slots) if slots <= i32::MAX as usize => {}
            _ => {
                return Err(KvError::Config(format!(
                    "{num_blocks} blocks of {block_size} tokens have more slots than an i32 slot mapping can \
                     address"
                )));
            }
        }
        Ok(BlockManager {
            block_size,
            prefix_caching,
            blocks: vec![BlockMeta::default(); num_blocks],
            free: (0..num_blocks as u32).map(BlockId).collect(),
            cache: PrefixCache::default(),
            seqs: HashMap::default(),
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
            evictions: 0,
            cow_copies: 0,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether full blocks are cached and looked up.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks an allocation can take now: free plus evictable.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.cache.lru_len()
    }

    /// Whether `seq` has a block table.
    pub fn has_seq(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The block table of `seq`, in position order.
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    /// The block table of `seq` as the i32 row the kernels read.
    pub fn block_table_i32(&self, seq: SeqId) -> Option<Vec<i32>> {
        self.block_table(seq).map(|t| t.iter().map(|b| b.0 as i32).collect())
    }

    /// Positions of `seq` that have slots (`0..num_slots`).
    pub fn num_slots(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.num_slots)
    }

    /// The slot of position `pos` of `seq`, if it has one.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Option<i32> {
        let s = self.seqs.get(&seq)?;
        if pos >= s.num_slots {
            return None;
        }
        Some(self.slot_in(&s.blocks, pos))
    }

    /// The reference count of `block` (0 for an id outside the pool).
    pub fn refcount(&self, block: BlockId) -> u32 {
        self.blocks.get(block.index()).map_or(0, |m| m.refcount)
    }

    /// Whether `block` is in the prefix cache.
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.blocks.get(block.index()).is_some_and(|m| m.cached.is_some())
    }

    /// The slot of `pos` in `table` (the table must cover `pos`; slots fit
    /// in i32 by construction, see [`BlockManager::new`]).
    fn slot_in(&self, table: &[BlockId], pos: usize) -> i32 {
        (table[pos / self.block_size].index() * self.block_size + pos % self.block_size) as i32
    }

    /// The cached blocks holding the longest run of full blocks at the start
    /// of `tokens`, leaving at least the last token uncached (so the step that
    /// computes the rest produces logits). No side effects.
    pub fn find_prefix(&self, tokens: &[u32]) -> PrefixHit {
        let mut hit = PrefixHit::miss(tokens.len(), self.block_size);
        if !self.prefix_caching || tokens.is_empty() {
            return hit;
        }
        let full = (tokens.len() - 1) / self.block_size;
        for chunk in tokens.chunks_exact(self.block_size).take(full) {
            let key = PrefixKey::new(hit.ids.last().copied(), chunk);
            match self.cache.get(&key) {
                Some((id, block)) => {
                    hit.ids.push(id);
                    hit.blocks.push(block);
                }
                None => break,
            }
        }
        hit
    }

    /// Creates the block table of `seq` from `hit` (see
    /// [`BlockManager::find_prefix`]; [`PrefixHit::miss`] for none) and slots
    /// for the next `num_new` tokens after it.
    ///
    /// Returns `Ok(None)`, changing nothing, when the pool lacks the blocks
    /// now. Errors when `seq` already has a table, when `hit` is stale, or when
    /// the tokens need more blocks than the pool has.
    pub fn allocate(&mut self, seq: SeqId, hit: &PrefixHit, num_new: usize) -> KvResult<Option<Allocation>> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSeq(seq));
        }
        if hit.block_size != self.block_size || hit.blocks.len() != hit.ids.len() {
            return Err(bug(seq, "the prefix hit comes from another block manager"));
        }
        for (&b, &id) in hit.blocks.iter().zip(&hit.ids) {
            let meta = self.blocks.get(b.index()).ok_or_else(|| bug(seq, "the prefix hit names no block"))?;
            if meta.cached.as_ref().map(|c| c.0) != Some(id) {
                return Err(bug(seq, "the prefix hit is stale (the block was evicted since the lookup)"));
            }
        }
        let tokens = hit.num_tokens() + num_new;
        self.check_fits(seq, tokens)?;
        let revived = hit.blocks.iter().filter(|b| self.blocks[b.index()].refcount == 0).count();
        let fresh = blocks_for(tokens, self.block_size) - hit.blocks.len();
        if fresh > self.num_available() - revived {
            return Ok(None);
        }
        // Commit: revive or share the hit blocks before taking fresh ones, so
        // that eviction cannot reclaim a hit block.
        for &b in &hit.blocks {
            let meta = &mut self.blocks[b.index()];
            if meta.refcount == 0 {
                let tick =
                    meta.lru_tick.take().ok_or_else(|| bug(seq, "an unused cached block is off the LRU"))?;
                self.cache.lru_remove(tick);
            }
            meta.refcount += 1;
        }
        self.prefix_query_tokens += hit.query_tokens as u64;
        self.prefix_hit_tokens += hit.num_tokens() as u64;
        let table =
            SeqBlocks { blocks: hit.blocks.clone(), num_slots: hit.num_tokens(), hashed: hit.ids.clone() };
        self.seqs.insert(seq, table);
        self.grow(seq, num_new, false).map(Some)
    }

    /// Slots for the next `num_new` tokens of `seq` (positions
    /// `num_slots..num_slots + num_new`), growing its table and, when the first
    /// of them falls in a partial block shared with another sequence, copying
    /// that block first.
    ///
    /// Returns `Ok(None)`, changing nothing, when the pool lacks the blocks
    /// now (the scheduler then preempts). Errors for an unknown sequence or one
    /// that would need more blocks than the pool has.
    pub fn append_slots(&mut self, seq: SeqId, num_new: usize) -> KvResult<Option<Allocation>> {
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let end = s.num_slots + num_new;
        self.check_fits(seq, end)?;
        let cow = self.needs_cow(s, num_new);
        let fresh = blocks_for(end, self.block_size) - s.blocks.len() + usize::from(cow);
        if fresh > self.num_available() {
            return Ok(None);
        }
        self.grow(seq, num_new, cow).map(Some)
    }

    /// Whether writing `num_new` tokens after the slots of `s` writes into a
    /// partial block that another table references.
    fn needs_cow(&self, s: &SeqBlocks, num_new: usize) -> bool {
        num_new > 0
            && !s.num_slots.is_multiple_of(self.block_size)
            && s.blocks.last().is_some_and(|b| self.blocks[b.index()].refcount > 1)
    }

    /// Errors when `tokens` tokens need more blocks than the pool has.
    fn check_fits(&self, seq: SeqId, tokens: usize) -> KvResult<()> {
        let needed = blocks_for(tokens, self.block_size);
        if needed > self.blocks.len() {
            return Err(KvError::PoolTooSmall { seq, tokens, needed, total: self.blocks.len() });
        }
        Ok(())
    }

    /// Takes a block for new data (free list first, then the least recently
    /// used cached block) with reference count 1.
    fn take_block(&mut self, seq: SeqId) -> KvResult<BlockId> {
        let block = match self.free.pop_front() {
            Some(b) => b,
            None => {
                let b = self.cache.lru_pop().ok_or_else(|| bug(seq, "the pool ran out after the check"))?;
                let meta = &mut self.blocks[b.index()];
                meta.lru_tick = None;
                if let Some((_, key)) = meta.cached.take() {
                    self.cache.remove(&key);
                }
                self.evictions += 1;
                b
            }
        };
        self.blocks[block.index()].refcount = 1;
        Ok(block)
    }

    /// Drops one reference to `block`; at zero it becomes evictable (cached)
    /// or free.
    fn release(&mut self, block: BlockId) {
        let meta = &mut self.blocks[block.index()];
        meta.refcount -= 1;
        if meta.refcount == 0 {
            if meta.cached.is_some() {
                meta.lru_tick = Some(self.cache.lru_push(block));
            } else {
                self.free.push_back(block);
            }
        }
    }

    /// Copies the shared last block when `cow`, appends fresh blocks for
    /// `num_new` more tokens and returns their slots. The caller has checked
    /// that enough blocks are available.
    fn grow(&mut self, seq: SeqId, num_new: usize, cow: bool) -> KvResult<Allocation> {
        let (start, have) = {
            let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
            (s.num_slots, s.blocks.len())
        };
        let end = start + num_new;
        let mut copies = Vec::new();
        if cow {
            let dst = self.take_block(seq)?;
            let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
            let last = s.blocks.last_mut().ok_or_else(|| bug(seq, "copy-on-write of an empty table"))?;
            let src = std::mem::replace(last, dst);
            // The source stays referenced by the other table(s).
            self.blocks[src.index()].refcount -= 1;
            self.cow_copies += 1;
            copies.push(BlockCopy { src, dst });
        }
        let mut fresh = Vec::new();
        for _ in have..blocks_for(end, self.block_size) {
            fresh.push(self.take_block(seq)?);
        }
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        s.blocks.extend(fresh);
        s.num_slots = end;
        // Slots fit in i32 by construction (see `new`).
        let slots = (start..end).map(|p| (s.blocks[p / bs].index() * bs + p % bs) as i32).collect();
        Ok(Allocation { start, slots, copies })
    }

    /// Registers in the prefix cache the full blocks of `seq` whose KV is
    /// computed: positions `< num_computed` of `tokens` (the sequence's whole
    /// token history). Call it only after the step that wrote those positions
    /// has run. A block whose prefix is already cached in another block stays
    /// uncached (its twin serves future hits).
    pub fn cache_full_blocks(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize) -> KvResult<()> {
        if !self.prefix_caching {
            return Ok(());
        }
        let Self { seqs, cache, blocks, block_size, .. } = self;
        let s = seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let full = num_computed.min(s.num_slots).min(tokens.len()) / *block_size;
        for i in s.hashed.len()..full {
            let key =
                PrefixKey::new(s.hashed.last().copied(), &tokens[i * *block_size..(i + 1) * *block_size]);
            if let Some((id, _)) = cache.get(&key) {
                s.hashed.push(id);
                continue;
            }
            let block = s.blocks[i];
            let meta = &mut blocks[block.index()];
            if meta.cached.is_some() {
                return Err(bug(seq, format!("{block} is cached under another prefix")));
            }
            let id = cache.insert(key.clone(), block);
            meta.cached = Some((id, key));
            s.hashed.push(id);
        }
        Ok(())
    }

    /// Gives `child` a table sharing every block of `parent` (for n > 1
    /// sampling or speculative branches). The first write of either into their
    /// shared partial last block copies it.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> KvResult<()> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSeq(child));
        }
        let table = self.seqs.get(&parent).ok_or(KvError::UnknownSeq(parent))?.clone();
        for b in &table.blocks {
            self.blocks[b.index()].refcount += 1;
        }
        self.seqs.insert(child, table);
        Ok(())
    }

    /// Shrinks the table of `seq` to its first `num_slots` slots (rollback of
    /// rejected speculative tokens): whole blocks past the new end are
    /// released; a partially used last block is kept and its stale slots are
    /// overwritten by later writes. Prefix-cache identities of blocks past the
    /// new end are forgotten (only full computed blocks are ever registered,
    /// and callers roll back before registering). Errors when `num_slots`
    /// exceeds the table.
    pub fn truncate(&mut self, seq: SeqId, num_slots: usize) -> KvResult<()> {
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if num_slots > s.num_slots {
            return Err(bug(seq, format!("truncate to {num_slots} of {} slots", s.num_slots)));
        }
        let keep = blocks_for(num_slots, bs);
        let dropped: Vec<BlockId> = s.blocks.drain(keep..).collect();
        s.num_slots = num_slots;
        s.hashed.truncate(num_slots / bs);
        for &b in dropped.iter().rev() {
            self.release(b);
        }
        Ok(())
    }

    /// Drops the table of `seq` (finished, aborted or preempted). Blocks are
    /// released last first, so a prompt's tail is evicted before its head.
    pub fn free(&mut self, seq: SeqId) -> KvResult<()> {
        let table = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        for &b in table.blocks.iter().rev() {
            self.release(b);
        }
        Ok(())
    }

    /// The pool's counters.
    pub fn stats(&self) -> KvStats {
        let evictable = self.cache.lru_len();
        KvStats {
            total_blocks: self.blocks.len(),
            used_blocks: self.blocks.len() - self.free.len() - evictable,
            free_blocks: self.free.len(),
            evictable_blocks: evictable,
            cached_blocks: self.cache.len(),
            num_seqs: self.seqs.len(),
            prefix_query_tokens: self.prefix_query_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            evictions: self.evictions,
            cow_copies: self.cow_copies,
        }
    }

    /// The LRU list of unused cached blocks, least recently used first.
    pub fn evictable_blocks(&self) -> Vec<BlockId> {
        self.cache.lru_iter().map(|(_, b)| b).collect()
    }

    /// Checks every invariant of [`super`]; the error names the first
    /// violation. Cheap enough for tests and debug assertions, linear in the
    /// pool and the tables.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.blocks.len();
        let mut refs = vec![0u32; n];
        for (seq, s) in &self.seqs {
            if s.blocks.len() != blocks_for(s.num_slots, self.block_size) {
                return Err(format!("{seq}: {} blocks for {} slots", s.blocks.len(), s.num_slots));
            }
            if s.hashed.len() > s.num_slots / self.block_size {
                return Err(format!("{seq}: {} hashed blocks but {} slots", s.hashed.len(), s.num_slots));
            }
            for b in &s.blocks {
                *refs.get_mut(b.index()).ok_or_else(|| format!("{seq}: {b} is outside the pool"))? += 1;
            }
        }
        let mut on_free = vec![false; n];
        for &b in &self.free {
            let m = &self.blocks[b.index()];
            if std::mem::replace(&mut on_free[b.index()], true) {
                return Err(format!("{b} is on the free list twice"));
            }
            if m.refcount != 0 || m.cached.is_some() || m.lru_tick.is_some() {
                return Err(format!("{b} is on the free list but used or cached"));
            }
        }
        let mut on_lru = vec![false; n];
        for (tick, b) in self.cache.lru_iter() {
            let m = &self.blocks[b.index()];
            if std::mem::replace(&mut on_lru[b.index()], true) {
                return Err(format!("{b} is on the LRU list twice"));
            }
            if m.refcount != 0 || m.cached.is_none() || m.lru_tick != Some(tick) {
                return Err(format!("{b} is on the LRU list but used, uncached or mis-ticked"));
            }
        }
        let mut cached = 0;
        for (i, m) in self.blocks.iter().enumerate() {
            if m.refcount != refs[i] {
                return Err(format!("block {i}: refcount {} but {} table references", m.refcount, refs[i]));
            }
            let states = usize::from(m.refcount > 0) + usize::from(on_free[i]) + usize::from(on_lru[i]);
            if states != 1 {
                return Err(format!("block {i} is in {states} of the states used/free/evictable"));
            }
            cached += usize::from(m.cached.is_some());
        }
        if cached != self.cache.len() {
            return Err(format!("{cached} blocks say they are cached but the map has {}", self.cache.len()));
        }
        for (key, id, b) in self.cache.entries() {
            let m =
                self.blocks.get(b.index()).ok_or_else(|| format!("the cache names {b} outside the pool"))?;
            if m.cached.as_ref() != Some(&(id, key.clone())) {
                return Err(format!("{b} disagrees with its prefix-cache entry"));
            }
            if key.tokens.len() != self.block_size {
                return Err(format!("{b} is cached with {} tokens", key.tokens.len()));
            }
        }
        let distinct: HashSet<_> = self.cache.entries().map(|(_, id, _)| id).collect();
        if distinct.len() != self.cache.len() {
            return Err("two cache entries share a prefix id".to_string());
        }
        Ok(())
    }
}
