//! [`Sequence`]: one generation stream's token history and progress, as the
//! scheduler tracks it.
//!
//! Invariants: `tokens` starts with the prompt (`num_prompt_tokens` of them)
//! followed by the generated tokens, and only grows (except speculative rollback); `num_computed <=
//! tokens.len()` counts the leading tokens whose KV is in the cache (or is
//! being written by the current step). Preemption resets `num_computed` to 0
//! and leaves `tokens` alone, so a resumed sequence recomputes the exact same
//! history. Speculative draft tokens (`num_draft` of them) are appended to
//! `tokens` for one step only and dropped or accepted by
//! [`super::Scheduler::rollback`] before the next plan; preemption drops them.

use crate::kv::SeqId;

/// Why a sequence ended (the engine decides; the scheduler never ends a
/// sequence on its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The end-of-sequence token was sampled.
    Eos,
    /// One of the request's stop tokens was sampled.
    StopToken(u32),
    /// The request's maximum number of new tokens was reached.
    MaxTokens,
    /// The sequence reached `max_model_len` tokens.
    MaxModelLen,
    /// The client went away or the engine gave up on the request.
    Aborted,
    /// The request's grammar allows no token here, not even an end token
    /// (structured output that cannot continue); nothing was sampled.
    Grammar,
}

/// Where a sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued, never scheduled yet.
    Waiting,
    /// Has a block table and is scheduled step after step.
    Running,
    /// Was running, lost its blocks, and waits to recompute.
    Preempted,
    /// Ended (only seen on the value [`super::Scheduler::finish`] returns).
    Finished(FinishReason),
}

/// One sequence's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    pub(super) id: SeqId,
    pub(super) parent: Option<SeqId>,
    pub(super) tokens: Vec<u32>,
    pub(super) num_prompt_tokens: usize,
    pub(super) num_computed: usize,
    pub(super) status: SeqStatus,
    pub(super) num_preemptions: u32,
    /// Speculative draft tokens at the end of `tokens`, proposed for the next
    /// step's verification (0 outside speculative decoding).
    pub(super) num_draft: usize,
}

impl Sequence {
    /// A new waiting sequence for `prompt`.
    pub(super) fn new(id: SeqId, prompt: Vec<u32>) -> Sequence {
        Sequence {
            id,
            parent: None,
            num_prompt_tokens: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            status: SeqStatus::Waiting,
            num_preemptions: 0,
            num_draft: 0,
        }
    }

    /// The sequence's id.
    pub fn id(&self) -> SeqId {
        self.id
    }

    /// The sequence it was forked from, if any.
    pub fn parent(&self) -> Option<SeqId> {
        self.parent
    }

    /// The whole token history: prompt, then generated tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The prompt.
    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.num_prompt_tokens]
    }

    /// The generated tokens.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.num_prompt_tokens..]
    }

    /// Length of the token history.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the history is empty (never, for a sequence the scheduler
    /// accepted).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Leading tokens whose KV is computed.
    pub fn num_computed(&self) -> usize {
        self.num_computed
    }

    /// Where the sequence is.
    pub fn status(&self) -> SeqStatus {
        self.status
    }

    /// Draft tokens at the end of [`Sequence::tokens`] awaiting verification
    /// (set by [`super::Scheduler::propose`], cleared by
    /// [`super::Scheduler::rollback`]).
    pub fn num_draft(&self) -> usize {
        self.num_draft
    }

    /// How often it was preempted.
    pub fn num_preemptions(&self) -> u32 {
        self.num_preemptions
    }
}
