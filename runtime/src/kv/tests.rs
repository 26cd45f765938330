//! Tests of the block manager: slot arithmetic, prefix hits (full blocks
//! only, never the last token), LRU eviction, copy-on-write after a fork,
//! all-or-nothing allocation, errors, and a property test of random operation
//! sequences against a shadow KV cache whose every slot holds a fingerprint of
//! the token prefix it was computed from.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

/// A fingerprint of a token prefix: what the KV at its last position depends
/// on (FNV-1a; collisions are irrelevant at test sizes).
pub(crate) fn fingerprint(prefix: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in prefix {
        for b in t.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

const A: SeqId = SeqId(0);
const B: SeqId = SeqId(1);
const C: SeqId = SeqId(2);
const D: SeqId = SeqId(3);

/// Allocates the whole prompt after its prefix hit and caches its full
/// blocks as if the step had run; returns the hit length in tokens.
fn prefill(bm: &mut BlockManager, seq: SeqId, tokens: &[u32]) -> usize {
    let hit = bm.find_prefix(tokens);
    let alloc = bm.allocate(seq, &hit, tokens.len() - hit.num_tokens()).unwrap().unwrap();
    assert_eq!(alloc.start, hit.num_tokens());
    bm.cache_full_blocks(seq, tokens, tokens.len()).unwrap();
    bm.check_invariants().unwrap();
    hit.num_tokens()
}

fn ids(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn slots_follow_the_block_table() {
    let mut bm = BlockManager::new(8, 4, true).unwrap();
    let a = bm.allocate(A, &PrefixHit::miss(3, 4), 3).unwrap().unwrap();
    assert_eq!(a.slots, [0, 1, 2]);
    let b = bm.allocate(B, &PrefixHit::miss(5, 4), 5).unwrap().unwrap();
    assert_eq!(b.slots, [4, 5, 6, 7, 8]);
    // A's position 3 completes block 0; positions 4 and 5 start block 3.
    let a = bm.append_slots(A, 3).unwrap().unwrap();
    assert_eq!((a.start, a.slots.as_slice()), (3, [3, 12, 13].as_slice()));
    assert_eq!(bm.block_table(A).unwrap(), [BlockId(0), BlockId(3)]);
    assert_eq!(bm.block_table_i32(B).unwrap(), [1, 2]);
    assert_eq!(bm.slot(A, 5), Some(13));
    assert_eq!(bm.slot(A, 6), None);
    bm.check_invariants().unwrap();
    bm.free(A).unwrap();
    bm.free(B).unwrap();
    let s = bm.stats();
    assert_eq!((s.used_blocks, s.free_blocks, s.evictable_blocks), (0, 8, 0));
    bm.check_invariants().unwrap();
}

#[test]
fn prefix_hits_share_full_blocks_only() {
    let mut bm = BlockManager::new(16, 4, true).unwrap();
    let a = ids(1..11); // 10 tokens: two full blocks and a partial one.
    assert_eq!(prefill(&mut bm, A, &a), 0);
    let a_table = bm.block_table(A).unwrap().to_vec();

    // B shares the two full blocks, then diverges: it allocates only the rest.
    let mut b = a[..8].to_vec();
    b.extend([50, 51, 52]);
    let used_before = bm.stats().used_blocks;
    assert_eq!(prefill(&mut bm, B, &b), 8);
    let b_table = bm.block_table(B).unwrap().to_vec();
    assert_eq!(b_table[..2], a_table[..2]);
    assert_ne!(b_table[2], a_table[2]);
    assert_eq!(bm.stats().used_blocks, used_before + 1);
    assert_eq!(bm.refcount(a_table[0]), 2);
    assert_eq!(bm.refcount(a_table[2]), 1);

    // The same prompt again: the partial last block is never shared.
    assert_eq!(prefill(&mut bm, C, &a), 8);
    let c_table = bm.block_table(C).unwrap().to_vec();
    assert_eq!(c_table[..2], a_table[..2]);
    assert_ne!(c_table[2], a_table[2]);
    assert!(!bm.is_cached(a_table[2]));

    // A block-aligned prompt that is entirely cached still computes its last
    // block (the step must produce logits for its last token).
    let hit = bm.find_prefix(&a[..8]);
    assert_eq!(hit.num_tokens(), 4);
    assert_eq!(hit.blocks(), &a_table[..1]);

    let s = bm.stats();
    assert_eq!((s.prefix_query_tokens, s.prefix_hit_tokens), (10 + 11 + 10, 16));
    assert!((s.hit_rate() - 16.0 / 31.0).abs() < 1e-12);
    // A's two full blocks; B's and C's third blocks are partial.
    assert_eq!(s.cached_blocks, 2);
    assert!(s.to_string().contains("prefix hit rate 51.6%"), "{s}");
}

#[test]
fn prefix_caching_off_never_hits() {
    let mut bm = BlockManager::new(16, 4, false).unwrap();
    let a = ids(1..11);
    assert_eq!(prefill(&mut bm, A, &a), 0);
    assert_eq!(prefill(&mut bm, B, &a), 0);
    bm.free(A).unwrap();
    assert_eq!(bm.stats().cached_blocks, 0);
    assert_eq!(bm.stats().evictable_blocks, 0);
}

#[test]
fn freed_cached_blocks_are_revived_by_hits() {
    let mut bm = BlockManager::new(8, 4, true).unwrap();
    let a = ids(1..11);
    prefill(&mut bm, A, &a);
    let table = bm.block_table(A).unwrap().to_vec();
    bm.free(A).unwrap();
    let s = bm.stats();
    assert_eq!((s.used_blocks, s.evictable_blocks, s.free_blocks), (0, 2, 6));
    // Released last block first: the tail of the prompt is evicted first.
    assert_eq!(bm.evictable_blocks(), [table[1], table[0]]);
    let mut e = a[..8].to_vec();
    e.push(99);
    assert_eq!(prefill(&mut bm, B, &e), 8);
    assert_eq!(bm.block_table(B).unwrap()[..2], table[..2]);
    let s = bm.stats();
    assert_eq!((s.used_blocks, s.evictable_blocks, s.free_blocks), (3, 0, 5));
}

#[test]
fn lru_evicts_least_recently_freed_first() {
    // Four blocks of two tokens.
    let mut bm = BlockManager::new(4, 2, true).unwrap();
    prefill(&mut bm, A, &[1, 2, 9]); // Block 0 caches [1, 2]; block 1 is partial.
    prefill(&mut bm, B, &[3, 4, 9]); // Block 2 caches [3, 4]; block 3 is partial.
    bm.free(A).unwrap();
    bm.free(B).unwrap();
    assert_eq!(bm.evictable_blocks(), [BlockId(0), BlockId(2)]);
    // Five tokens need three blocks: the two free ones and A's cached block
    // (freed before B's).
    bm.allocate(C, &PrefixHit::miss(5, 2), 5).unwrap().unwrap();
    bm.check_invariants().unwrap();
    assert_eq!(bm.stats().evictions, 1);
    assert!(!bm.is_cached(BlockId(0)));
    assert_eq!(bm.find_prefix(&[1, 2, 9]).num_tokens(), 0);
    assert_eq!(bm.find_prefix(&[3, 4, 9]).blocks(), [BlockId(2)]);
}

#[test]
fn eviction_forgets_prefixes_and_recaching_works() {
    let mut bm = BlockManager::new(3, 2, true).unwrap();
    prefill(&mut bm, A, &[1, 2, 3, 4, 5]); // Blocks 0 = [1, 2], 1 = [3, 4], 2 partial.
    bm.free(A).unwrap();
    // Six tokens take the free block 2, then evict block 1 and block 0.
    bm.allocate(B, &PrefixHit::miss(6, 2), 6).unwrap().unwrap();
    assert_eq!(bm.stats().evictions, 2);
    bm.free(B).unwrap();
    assert_eq!(bm.find_prefix(&[1, 2, 3, 4, 5]).num_tokens(), 0);
    // The same prompt is cached again under fresh identities and hits.
    assert_eq!(prefill(&mut bm, C, &[1, 2, 3, 4, 5]), 0);
    bm.free(C).unwrap();
    assert_eq!(bm.find_prefix(&[1, 2, 3, 4, 5, 6]).num_tokens(), 4);
    bm.check_invariants().unwrap();
}

#[test]
fn fork_copies_the_shared_partial_block_on_write() {
    let mut bm = BlockManager::new(8, 4, true).unwrap();
    prefill(&mut bm, A, &ids(0..6)); // Block 0 full, block 1 holds two tokens.
    bm.fork(A, C).unwrap();
    assert_eq!(bm.refcount(BlockId(0)), 2);
    assert_eq!(bm.refcount(BlockId(1)), 2);
    bm.check_invariants().unwrap();

    // A writes position 6 into the shared partial block: it gets a copy.
    let a = bm.append_slots(A, 1).unwrap().unwrap();
    let dst = bm.block_table(A).unwrap()[1];
    assert_ne!(dst, BlockId(1));
    assert_eq!(a.copies, [BlockCopy { src: BlockId(1), dst }]);
    assert_eq!(a.slots, [dst.0 as i32 * 4 + 2]);
    assert_eq!((bm.refcount(BlockId(1)), bm.refcount(dst), bm.refcount(BlockId(0))), (1, 1, 2));

    // C is the block's only user now: it writes in place.
    let c = bm.append_slots(C, 1).unwrap().unwrap();
    assert!(c.copies.is_empty());
    assert_eq!(c.slots, [6]);
    assert_eq!(bm.stats().cow_copies, 1);
    bm.check_invariants().unwrap();
    bm.free(A).unwrap();
    bm.free(C).unwrap();
    assert_eq!(bm.stats().used_blocks, 0);
    bm.check_invariants().unwrap();
}

#[test]
fn fork_with_a_full_last_block_needs_no_copy() {
    let mut bm = BlockManager::new(8, 4, true).unwrap();
    prefill(&mut bm, A, &ids(0..8));
    bm.fork(A, C).unwrap();
    let a = bm.append_slots(A, 1).unwrap().unwrap();
    let c = bm.append_slots(C, 1).unwrap().unwrap();
    assert!(a.copies.is_empty() && c.copies.is_empty());
    assert_ne!(a.slots, c.slots);
    assert_eq!(bm.block_table(A).unwrap()[..2], bm.block_table(C).unwrap()[..2]);
}

#[test]
fn a_missing_block_is_none_and_changes_nothing() {
    let mut bm = BlockManager::new(3, 4, true).unwrap();
    prefill(&mut bm, A, &ids(0..8));
    let before = bm.stats();
    assert_eq!(bm.allocate(B, &PrefixHit::miss(9, 4), 9).unwrap(), None);
    assert!(!bm.has_seq(B));
    assert_eq!(bm.stats(), before);
    // The copy-on-write block counts too: after a fork the shared partial
    // block needs a copy plus nothing else, and one block is free.
    bm.free(A).unwrap();
    prefill(&mut bm, A, &ids(0..6));
    bm.fork(A, C).unwrap();
    // Four more tokens need a copy of the shared partial block plus one block
    // for positions 8 and 9, but only one block is available.
    let before = bm.stats();
    assert_eq!(bm.append_slots(A, 4).unwrap(), None);
    assert_eq!(bm.stats(), before);
    bm.check_invariants().unwrap();
}

#[test]
fn a_sequence_longer_than_the_pool_is_an_error() {
    let mut bm = BlockManager::new(3, 4, true).unwrap();
    let err = bm.allocate(A, &PrefixHit::miss(13, 4), 13).unwrap_err();
    assert_eq!(err, KvError::PoolTooSmall { seq: A, tokens: 13, needed: 4, total: 3 });
    assert!(err.to_string().contains("pool has only 3"), "{err}");
    prefill(&mut bm, A, &ids(0..8));
    assert!(matches!(bm.append_slots(A, 5), Err(KvError::PoolTooSmall { .. })));
    assert!(bm.append_slots(A, 4).unwrap().is_some());
}

#[test]
fn a_stale_prefix_hit_is_an_error() {
    let mut bm = BlockManager::new(2, 2, true).unwrap();
    prefill(&mut bm, A, &[1, 2, 3]);
    bm.free(A).unwrap();
    let hit = bm.find_prefix(&[1, 2, 9]);
    assert_eq!(hit.num_tokens(), 2);
    bm.allocate(B, &PrefixHit::miss(4, 2), 4).unwrap().unwrap(); // Evicts block 0.
    bm.free(B).unwrap();
    assert!(matches!(bm.allocate(C, &hit, 1), Err(KvError::InvalidState { .. })));
    assert!(!bm.has_seq(C));
}

#[test]
fn the_same_prefix_computed_twice_is_cached_once() {
    let mut bm = BlockManager::new(8, 2, true).unwrap();
    let p = [5, 6, 7, 8, 9];
    bm.allocate(A, &bm.find_prefix(&p), 5).unwrap().unwrap();
    bm.allocate(B, &bm.find_prefix(&p), 5).unwrap().unwrap();
    bm.cache_full_blocks(A, &p, 5).unwrap();
    bm.cache_full_blocks(B, &p, 5).unwrap();
    bm.check_invariants().unwrap();
    assert_eq!(bm.stats().cached_blocks, 2);
    assert_eq!(bm.find_prefix(&p).blocks(), &bm.block_table(A).unwrap()[..2]);
    // B's twins go straight back to the free list.
    bm.free(B).unwrap();
    assert_eq!(bm.stats().evictable_blocks, 0);
}

#[test]
fn misuse_is_reported() {
    assert!(matches!(BlockManager::new(0, 16, true), Err(KvError::Config(_))));
    assert!(matches!(BlockManager::new(1 << 28, 16, true), Err(KvError::Config(_))));
    let mut bm = BlockManager::new(4, 4, true).unwrap();
    prefill(&mut bm, A, &[1, 2]);
    assert_eq!(bm.allocate(A, &PrefixHit::miss(1, 4), 1), Err(KvError::DuplicateSeq(A)));
    assert_eq!(bm.append_slots(D, 1), Err(KvError::UnknownSeq(D)));
    assert_eq!(bm.free(D), Err(KvError::UnknownSeq(D)));
    assert_eq!(bm.fork(D, C), Err(KvError::UnknownSeq(D)));
    assert_eq!(bm.fork(A, A), Err(KvError::DuplicateSeq(A)));
    let foreign = BlockManager::new(4, 2, true).unwrap().find_prefix(&[1]);
    assert!(matches!(bm.allocate(B, &foreign, 1), Err(KvError::InvalidState { .. })));
    bm.check_invariants().unwrap();
}

/// One random operation of the property test.
#[derive(Debug, Clone)]
enum Op {
    /// A new sequence: `len` tokens of base prompt `base` then `tail` random ones.
    Start { base: usize, len: usize, tail: Vec<u32> },
    /// `tokens` more tokens for live sequence number `which`.
    Grow { which: usize, tokens: Vec<u32> },
    /// Fork live sequence number `which`.
    Fork { which: usize },
    /// Free live sequence number `which`.
    Free { which: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let tok = 0u32..3;
    prop_oneof![
        3 => (0usize..3, 0usize..14, prop::collection::vec(tok.clone(), 0..4))
            .prop_map(|(base, len, tail)| Op::Start { base, len, tail }),
        4 => (any::<usize>(), prop::collection::vec(tok, 1..7)).prop_map(|(which, tokens)| Op::Grow { which, tokens }),
        1 => any::<usize>().prop_map(|which| Op::Fork { which }),
        2 => any::<usize>().prop_map(|which| Op::Free { which }),
    ]
}

/// The shadow state: token histories and the content of every slot.
struct Shadow {
    bm: BlockManager,
    tokens: HashMap<SeqId, Vec<u32>>,
    content: Vec<Option<u64>>,
    next: u64,
}

impl Shadow {
    fn live(&self, which: usize) -> Option<SeqId> {
        let mut ids: Vec<_> = self.tokens.keys().copied().collect();
        ids.sort();
        (!ids.is_empty()).then(|| ids[which % ids.len()])
    }

    /// Runs the copies, then writes the fingerprints of the new positions.
    fn write(&mut self, seq: SeqId, alloc: &Allocation) {
        let bs = self.bm.block_size();
        for c in &alloc.copies {
            for o in 0..bs {
                self.content[c.dst.index() * bs + o] = self.content[c.src.index() * bs + o];
            }
        }
        let t = &self.tokens[&seq];
        for (i, &slot) in alloc.slots.iter().enumerate() {
            self.content[slot as usize] = Some(fingerprint(&t[..=alloc.start + i]));
        }
    }

    /// Every position of every sequence reads the fingerprint of its prefix.
    fn check(&self) -> Result<(), String> {
        self.bm.check_invariants()?;
        for (&seq, t) in &self.tokens {
            if self.bm.num_slots(seq) != Some(t.len()) {
                return Err(format!("{seq}: slots out of step"));
            }
            for p in 0..t.len() {
                let slot = self.bm.slot(seq, p).ok_or("no slot")? as usize;
                if self.content[slot] != Some(fingerprint(&t[..=p])) {
                    return Err(format!("{seq} position {p} reads wrong KV from slot {slot}"));
                }
            }
        }
        let s = self.bm.stats();
        if s.used_blocks + s.free_blocks + s.evictable_blocks != s.total_blocks {
            return Err("used + free + evictable != total".into());
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), String> {
        const BASES: [[u32; 14]; 3] =
            [[1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2], [1, 2, 1, 2, 0, 0, 1, 1, 2, 2, 0, 1, 2, 0], [0; 14]];
        match op {
            Op::Start { base, len, tail } => {
                let mut t = BASES[base][..len].to_vec();
                t.extend(tail);
                if t.is_empty() {
                    return Ok(());
                }
                let seq = SeqId(self.next);
                self.next += 1;
                let hit = self.bm.find_prefix(&t);
                // A hit must hold exactly this prompt's KV.
                for (i, b) in hit.blocks().iter().enumerate() {
                    for o in 0..self.bm.block_size() {
                        let p = i * self.bm.block_size() + o;
                        if self.content[b.index() * self.bm.block_size() + o] != Some(fingerprint(&t[..=p])) {
                            return Err(format!("prefix hit {b} holds other tokens"));
                        }
                    }
                }
                let before = self.bm.stats();
                match self.bm.allocate(seq, &hit, t.len() - hit.num_tokens()) {
                    Ok(Some(alloc)) => {
                        self.tokens.insert(seq, t.clone());
                        self.write(seq, &alloc);
                        self.bm.cache_full_blocks(seq, &t, t.len()).map_err(|e| e.to_string())?;
                    }
                    Ok(None) if self.bm.stats() == before => {}
                    Err(KvError::PoolTooSmall { needed, total, .. }) if needed > total => {}
                    other => return Err(format!("allocate: {other:?}")),
                }
            }
            Op::Grow { which, tokens } => {
                let Some(seq) = self.live(which) else { return Ok(()) };
                let before = self.bm.stats();
                match self.bm.append_slots(seq, tokens.len()) {
                    Ok(Some(alloc)) => {
                        self.tokens.get_mut(&seq).ok_or("lost")?.extend(&tokens);
                        self.write(seq, &alloc);
                        let t = self.tokens[&seq].clone();
                        self.bm.cache_full_blocks(seq, &t, t.len()).map_err(|e| e.to_string())?;
                    }
                    Ok(None) if self.bm.stats() == before => {}
                    Err(KvError::PoolTooSmall { needed, total, .. }) if needed > total => {}
                    other => return Err(format!("append: {other:?}")),
                }
            }
            Op::Fork { which } => {
                let Some(seq) = self.live(which) else { return Ok(()) };
                let child = SeqId(self.next);
                self.next += 1;
                self.bm.fork(seq, child).map_err(|e| e.to_string())?;
                let t = self.tokens[&seq].clone();
                self.tokens.insert(child, t);
            }
            Op::Free { which } => {
                let Some(seq) = self.live(which) else { return Ok(()) };
                self.bm.free(seq).map_err(|e| e.to_string())?;
                self.tokens.remove(&seq);
            }
        }
        self.check()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random allocate/grow/fork/free sequences never leak or double-count a
    /// block (refcounts equal table references; used + free + evictable =
    /// total; the cache map and the blocks agree) and every position always
    /// reads the KV of its own prefix, through prefix hits, evictions and
    /// copy-on-write.
    #[test]
    fn random_operations_keep_the_invariants(
        num_blocks in 2usize..20,
        block_size in 1usize..5,
        prefix_caching in any::<bool>(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let bm = BlockManager::new(num_blocks, block_size, prefix_caching).unwrap();
        let mut shadow = Shadow { bm, tokens: HashMap::new(), content: vec![None; num_blocks * block_size], next: 0 };
        for op in ops {
            let text = format!("{op:?}");
            shadow.apply(op).map_err(|e| TestCaseError::fail(format!("after {text}: {e}")))?;
        }
        let live: Vec<_> = shadow.tokens.keys().copied().collect();
        for seq in live {
            shadow.bm.free(seq).unwrap();
        }
        shadow.tokens.clear();
        shadow.check().map_err(TestCaseError::fail)?;
        let s = shadow.bm.stats();
        prop_assert_eq!(s.used_blocks, 0);
        prop_assert_eq!(s.free_blocks + s.evictable_blocks, num_blocks);
    }
}
