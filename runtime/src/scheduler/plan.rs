//! What one engine step runs: [`StepPlan`], the scheduled sequences with
//! their tokens, positions, slots and block tables, and helpers that flatten a
//! plan into the i32 tensors the kernels read (`rope_kv_write`'s positions and
//! slot mapping, `flash_attention`'s `cu_seqlens_q`/`seq_lens`/block tables,
//! `paged_decode`'s block tables and context lengths).
//!
//! Invariants: the first [`StepPlan::num_decodes`] entries each have exactly
//! one token and come from the decode pass; every entry's tokens are the last
//! `tokens.len()` positions of its context (`context_len - tokens.len() ..
//! context_len`); slots are distinct across the plan; the copies must run
//! before any KV write of the step.

use crate::kv::{BlockCopy, KvError, KvResult, SeqId};

use super::FinishReason;

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq: SeqId,
    /// The token ids to feed (a prefill chunk, or the one decode token).
    pub tokens: Vec<u32>,
    /// Their positions, `start..context_len`.
    pub positions: Vec<i32>,
    /// Their cache slots (`block * block_size + offset`).
    pub slots: Vec<i32>,
    /// The sequence's whole block table after this step's allocation.
    pub block_table: Vec<i32>,
    /// Positions in the cache once this step's KV is written (the attention
    /// context length, current tokens included).
    pub context_len: usize,
    /// Whether the step must produce logits for the last token (the last
    /// chunk of a prefill, or a decode): the engine then samples and calls
    /// [`super::Scheduler::append_token`] or [`super::Scheduler::finish`].
    pub needs_logits: bool,
}

impl ScheduledSeq {
    /// The position of the first token.
    pub fn start(&self) -> usize {
        self.context_len - self.tokens.len()
    }
}

/// Everything the engine needs for one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Scheduled sequences: decodes first (running sequences in arrival
    /// order), then prefill chunks of running sequences, then newly admitted
    /// ones.
    pub seqs: Vec<ScheduledSeq>,
    /// How many leading entries of `seqs` are decodes.
    pub num_decodes: usize,
    /// Copy-on-write block copies to run before the step's KV writes.
    pub copies: Vec<BlockCopy>,
    /// Sequences preempted in this step (their blocks are freed; they will
    /// recompute). Engine-side state (sampler, detokenizer) stays.
    pub preempted: Vec<SeqId>,
    /// Sequences finished or aborted since the previous plan (their blocks
    /// are freed): the engine drops their state.
    pub finished: Vec<(SeqId, FinishReason)>,
}

impl StepPlan {
    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Tokens fed in this step.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// The decode entries.
    pub fn decodes(&self) -> &[ScheduledSeq] {
        &self.seqs[..self.num_decodes]
    }

    /// The prefill entries.
    pub fn prefills(&self) -> &[ScheduledSeq] {
        &self.seqs[self.num_decodes..]
    }

    /// All token ids, concatenated in entry order.
    pub fn input_ids(&self) -> Vec<u32> {
        self.seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect()
    }

    /// All positions, concatenated.
    pub fn positions(&self) -> Vec<i32> {
        self.seqs.iter().flat_map(|s| s.positions.iter().copied()).collect()
    }

    /// All slots, concatenated (`rope_kv_write`'s slot mapping).
    pub fn slot_mapping(&self) -> Vec<i32> {
        self.seqs.iter().flat_map(|s| s.slots.iter().copied()).collect()
    }

    /// Prefix sums of the entries' token counts, `[B + 1]`, starting at 0.
    pub fn cu_seqlens_q(&self) -> Vec<i32> {
        let mut cu = Vec::with_capacity(self.seqs.len() + 1);
        let mut total = 0i32;
        cu.push(0);
        for s in &self.seqs {
            total += s.tokens.len() as i32;
            cu.push(total);
        }
        cu
    }

    /// Context lengths, `[B]`.
    pub fn seq_lens(&self) -> Vec<i32> {
        self.seqs.iter().map(|s| s.context_len as i32).collect()
    }

    /// The longest block table.
    pub fn max_blocks_per_seq(&self) -> usize {
        self.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0)
    }

    /// Block tables as one `[B, stride]` i32 matrix (rows padded with block 0,
    /// which the kernels never read: they read `ceil(context_len / block_size)`
    /// entries). Errors when a table is longer than `stride`.
    pub fn block_tables(&self, stride: usize) -> KvResult<Vec<i32>> {
        let mut out = vec![0i32; self.seqs.len() * stride];
        for (i, s) in self.seqs.iter().enumerate() {
            let row = &mut out[i * stride..(i + 1) * stride];
            if s.block_table.len() > stride {
                return Err(KvError::InvalidState {
                    seq: s.seq,
                    message: format!(
                        "its block table has {} blocks, more than stride {stride}",
                        s.block_table.len()
                    ),
                });
            }
            row[..s.block_table.len()].copy_from_slice(&s.block_table);
        }
        Ok(out)
    }

    /// For each entry that needs logits, in entry order: the sequence and the
    /// index of its last token in [`StepPlan::input_ids`] (the rows of the
    /// hidden state to project to logits).
    pub fn logits_indices(&self) -> Vec<(SeqId, usize)> {
        let mut end = 0;
        let mut out = Vec::new();
        for s in &self.seqs {
            end += s.tokens.len();
            if s.needs_logits {
                out.push((s.seq, end - 1));
            }
        }
        out
    }
}
