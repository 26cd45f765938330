//! The paged KV cache's bookkeeping on the host: which physical cache block
//! holds which tokens of which sequence. No device memory is touched here; the
//! engine turns the block tables and slot mappings this module produces into
//! the i32 tensors the kernels read.
//!
//! - [`block_manager`]: [`BlockManager`], the pool of physical blocks with
//!   reference counts, per-sequence block tables, slot allocation for prefill
//!   and decode growth, copy-on-write, forking and freeing.
//! - [`prefix`]: the prefix cache (full token blocks identified by their whole
//!   prefix, exactly) and the LRU list of cached blocks nobody uses.
//!
//! # Cache layout contract (what the kernels consume)
//!
//! The K and V caches of one layer are `[num_blocks, block_size, n_kv,
//! head_dim]` (see `kernels::rope` and `kernels::decode_attention`). Token
//! position `p` of a sequence lives in physical block `table[p / block_size]`
//! at offset `p % block_size`; its **slot** is `block * block_size + offset`, an
//! i32 (`-1` tells `rope_kv_write` to skip a token; this module never produces
//! it, the engine pads with it). A block table is a row of i32 block ids; the
//! engine lays the tables of a batch out as `[B, bt_stride]`.
//!
//! # Invariants (checked by [`BlockManager::check_invariants`])
//!
//! - Every physical block is in exactly one state: *used* (reference count
//!   `> 0`), *free* (count 0, not cached, on the free list) or *evictable*
//!   (count 0, cached, on the LRU list). `used + free + evictable = total`.
//! - A block's reference count equals the number of times it appears in the
//!   sequences' block tables. The prefix cache holds no reference: a cached
//!   block nobody uses is evictable, and is reclaimed (uncached) only when the
//!   free list is empty.
//! - Only full blocks whose tokens have been computed are cached, so a cached
//!   block is never written again; a sequence about to write into a block
//!   shared with another sequence (after [`BlockManager::fork`]) first gets a
//!   private copy ([`BlockCopy`]).
//! - A sequence's table holds exactly `ceil(num_slots / block_size)` blocks.

pub mod block_manager;
pub mod prefix;

#[cfg(test)]
pub(crate) mod tests;

pub use block_manager::{Allocation, BlockManager, KvStats};
pub use prefix::{PrefixHit, PrefixId};

use std::fmt;

/// A physical block of the KV cache: the index into the cache's first
/// dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The index as a `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// A sequence (one generation stream of one request; forks are sequences of
/// their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {}", self.0)
    }
}

/// A copy of a whole physical block (every layer, K and V) that the engine
/// must perform **before** the step's KV writes: the copy-on-write of a shared
/// partial block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// The shared block to read.
    pub src: BlockId,
    /// The sequence's new private block to write.
    pub dst: BlockId,
}

/// Errors of the KV-cache bookkeeping, the scheduler and the memory plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// User error: a configuration value is invalid (zero block size, a pool
    /// whose slots overflow i32, a token budget below `max_num_seqs`, ...).
    #[error("invalid KV-cache/scheduler configuration: {0}")]
    Config(String),
    /// User error: the model, workspace and KV cache do not fit in the memory
    /// budget (the message says what to change).
    #[error("memory plan does not fit: {0}")]
    DoesNotFit(String),
    /// User error: a sequence needs more blocks than the whole pool has, so it
    /// could never be scheduled.
    #[error(
        "{seq} needs {needed} KV blocks for {tokens} tokens but the pool has only {total}; \
         shorten the sequence or give the KV cache more memory"
    )]
    PoolTooSmall {
        /// The sequence.
        seq: SeqId,
        /// Its length in tokens.
        tokens: usize,
        /// Blocks it needs.
        needed: usize,
        /// Blocks in the pool.
        total: usize,
    },
    /// User error: a prompt is empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// User error: a sequence would be longer than `max_model_len`.
    #[error("{seq} would hold {tokens} tokens, more than max_model_len = {max_model_len}")]
    TooLong {
        /// The sequence (for a new request, the id it would have had).
        seq: SeqId,
        /// Its length in tokens.
        tokens: usize,
        /// The limit.
        max_model_len: usize,
    },
    /// User error: forking a running sequence would exceed `max_num_seqs`.
    #[error("cannot fork {seq}: {running} sequences are running and max_num_seqs is {max_num_seqs}")]
    TooManySeqs {
        /// The sequence to fork.
        seq: SeqId,
        /// Running sequences.
        running: usize,
        /// The limit.
        max_num_seqs: usize,
    },
    /// Bug in the caller: the sequence is unknown (never added, or already
    /// finished).
    #[error("unknown {0}")]
    UnknownSeq(SeqId),
    /// Bug in the caller: the sequence already has a block table.
    #[error("{0} already has a block table")]
    DuplicateSeq(SeqId),
    /// Bug in the caller: the request does not fit the sequence's state (a
    /// token appended to a sequence that did not ask for logits, a stale prefix
    /// hit, ...).
    #[error("{seq}: {message}")]
    InvalidState {
        /// The sequence.
        seq: SeqId,
        /// What is wrong, as a full sentence.
        message: String,
    },
}

/// Result alias of the KV-cache modules.
pub type KvResult<T> = std::result::Result<T, KvError>;

/// `ceil(tokens / block_size)`: the blocks that hold `tokens` tokens.
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}
