//! The continuous-batching scheduler: which tokens of which sequences run in
//! the next engine step, under a token budget, with chunked prefill, decode
//! first, prefix-cache hits and preemption by recompute.
//!
//! # The step loop
//!
//! ```text
//! loop {
//!     let plan = scheduler.schedule()?;           // StepPlan
//!     engine: run plan.copies, then the forward pass over plan.seqs
//!     for each (seq, row) in plan.logits_indices() {
//!         sample; scheduler.append_token(seq, tok)?  or  scheduler.finish(seq, reason)?
//!     }
//! }
//! ```
//!
//! Each plan must be executed before the next [`Scheduler::schedule`]: the
//! scheduler counts scheduled tokens as computed, and at the start of the next
//! step registers the full blocks they completed in the prefix cache (so a
//! cached block always holds written KV).
//!
//! # Policy
//!
//! A sequence has a token history (prompt, then generated tokens) of which the
//! first `num_computed` are in the KV cache. Each step, with a budget of
//! `max_num_batched_tokens` tokens:
//!
//! 1. **Decodes**: every running sequence with exactly one token left (the
//!    last sampled one), oldest first, one token each.
//! 2. **Running prefills**: running sequences with more tokens left (a long
//!    prompt being prefilled in chunks, or a resumed sequence recomputing),
//!    oldest first, `min(left, budget)` tokens each (chunked prefill).
//! 3. **Admission**: waiting sequences in arrival order, while the budget
//!    lasts and fewer than `max_num_seqs` run: the longest cached prefix of
//!    full blocks is reused (prefix hit) and the rest prefilled, chunked by
//!    the budget. Admission stops at the first sequence the pool cannot take
//!    now (first come, first served), and is skipped in a step that preempted.
//!
//! When a running sequence cannot get blocks, the scheduler preempts the most
//! recently arrived running sequence not already scheduled in this step
//! (possibly the requester itself) until it can: the victim's computed full
//! blocks go to the prefix cache, its blocks are freed, and it returns to the
//! waiting queue at its arrival position with its whole token history, to be
//! recomputed later (usually largely from the prefix cache).
//!
//! # Invariants (checked by [`Scheduler::check_invariants`])
//!
//! - Sequence ids grow with arrival; `running` and `waiting` are sorted by id
//!   and every live sequence is in exactly one of them, matching its status.
//! - Between steps a running sequence has a block table with exactly
//!   `num_computed` slots; a waiting or preempted one has no table and
//!   `num_computed == 0`.
//! - `running.len() <= max_num_seqs`; `max_model_len` tokens fit in the pool,
//!   and no sequence exceeds `max_model_len`, so every sequence fits the pool
//!   alone and the oldest running sequence always makes progress (no
//!   livelock).

mod plan;
pub mod sequence;

#[cfg(test)]
mod tests;

pub use plan::{ScheduledSeq, StepPlan};
pub use sequence::{FinishReason, SeqStatus, Sequence};

use crate::kv::{Allocation, BlockManager, KvError, KvResult, KvStats, PrefixHit, SeqId, blocks_for};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;

/// Limits of the scheduler and the shape of its block pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Token budget of one step (decode tokens plus prefill chunks).
    pub max_num_batched_tokens: usize,
    /// Sequences running at once (the batch limit).
    pub max_num_seqs: usize,
    /// Longest token history of one sequence (prompt plus generated tokens).
    pub max_model_len: usize,
    /// Blocks in the KV pool (from the memory plan).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Whether full blocks are cached and reused across sequences.
    pub enable_prefix_caching: bool,
}

impl SchedulerConfig {
    /// Checks the limits against each other; see the variants of
    /// [`KvError::Config`].
    pub fn validate(&self) -> KvResult<()> {
        if self.max_num_seqs == 0 || self.max_model_len == 0 {
            return Err(KvError::Config("max_num_seqs and max_model_len must be positive".into()));
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(KvError::Config(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs ({}) so that every running sequence \
                 can decode in each step",
                self.max_num_batched_tokens, self.max_num_seqs
            )));
        }
        if self.block_size > 0 && blocks_for(self.max_model_len, self.block_size) > self.num_blocks {
            return Err(KvError::Config(format!(
                "one sequence of max_model_len = {} tokens needs {} blocks of {} tokens but the KV pool has {} \
                 ({} tokens); lower max_model_len or give the KV cache more memory",
                self.max_model_len,
                blocks_for(self.max_model_len, self.block_size),
                self.block_size,
                self.num_blocks,
                self.num_blocks * self.block_size
            )));
        }
        Ok(())
    }
}

/// The scheduler; see the module doc.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    /// Waiting and preempted sequences, sorted by id (arrival).
    waiting: VecDeque<SeqId>,
    /// Running sequences, sorted by id (arrival).
    running: Vec<SeqId>,
    /// Finished since the last plan.
    finished: Vec<(SeqId, FinishReason)>,
    next_id: u64,
}

/// The plan under construction.
#[derive(Default)]
struct StepState {
    plan: StepPlan,
    budget: usize,
    scheduled: HashSet<SeqId>,
}

/// A bug in the caller, as an error.
fn invalid(seq: SeqId, message: impl Into<String>) -> KvError {
    KvError::InvalidState { seq, message: message.into() }
}

impl Scheduler {
    /// A scheduler with an empty pool of `config.num_blocks` blocks.
    pub fn new(config: SchedulerConfig) -> KvResult<Scheduler> {
        config.validate()?;
        let blocks = BlockManager::new(config.num_blocks, config.block_size, config.enable_prefix_caching)?;
        Ok(Scheduler {
            config,
            blocks,
            seqs: HashMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished: Vec::new(),
            next_id: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The block manager (read-only: tables, stats, invariants).
    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// The pool's counters.
    pub fn kv_stats(&self) -> KvStats {
        self.blocks.stats()
    }

    /// A live sequence.
    pub fn sequence(&self, seq: SeqId) -> Option<&Sequence> {
        self.seqs.get(&seq)
    }

    /// Running sequences, oldest first.
    pub fn running(&self) -> &[SeqId] {
        &self.running
    }

    /// Waiting and preempted sequences, oldest first.
    pub fn waiting(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.waiting.iter().copied()
    }

    /// Whether any sequence is live.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Queues a new request; returns its sequence id (ids grow with arrival).
    /// Errors for an empty prompt or one longer than `max_model_len`.
    pub fn add_request(&mut self, prompt: Vec<u32>) -> KvResult<SeqId> {
        let id = SeqId(self.next_id);
        if prompt.is_empty() {
            return Err(KvError::EmptyPrompt);
        }
        if prompt.len() > self.config.max_model_len {
            return Err(KvError::TooLong {
                seq: id,
                tokens: prompt.len(),
                max_model_len: self.config.max_model_len,
            });
        }
        self.next_id += 1;
        self.seqs.insert(id, Sequence::new(id, prompt));
        self.waiting.push_back(id);
        Ok(id)
    }

    /// Records the token sampled for `seq` from the logits of the last step.
    /// Errors when `seq` did not ask for logits (it is not running, or still
    /// has tokens to compute) or already holds `max_model_len` tokens (the
    /// engine should finish it with [`FinishReason::MaxModelLen`]).
    pub fn append_token(&mut self, seq: SeqId, token: u32) -> KvResult<()> {
        let max_model_len = self.config.max_model_len;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if s.status != SeqStatus::Running || s.num_computed != s.tokens.len() {
            return Err(invalid(seq, "a token was appended but the last step produced no logits for it"));
        }
        if s.tokens.len() >= max_model_len {
            return Err(KvError::TooLong { seq, tokens: s.tokens.len() + 1, max_model_len });
        }
        s.tokens.push(token);
        Ok(())
    }

    /// Appends speculative `drafts` to running `seq` for verification in the
    /// next step: the plan then schedules the last sampled token and the
    /// drafts together as one decode entry of `1 + drafts.len()` tokens (or,
    /// when the token budget is short or `seq` is preempted, drops the drafts
    /// and decodes one token). Errors when `seq` is not ready to decode, already
    /// holds drafts, or would pass `max_model_len`.
    pub fn propose(&mut self, seq: SeqId, drafts: &[u32]) -> KvResult<()> {
        let max_model_len = self.config.max_model_len;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if s.status != SeqStatus::Running || s.num_computed + 1 != s.tokens.len() || s.num_draft != 0 {
            return Err(invalid(seq, "drafts were proposed for a sequence that is not ready to decode"));
        }
        if s.tokens.len() + drafts.len() > max_model_len {
            return Err(KvError::TooLong { seq, tokens: s.tokens.len() + drafts.len(), max_model_len });
        }
        s.tokens.extend_from_slice(drafts);
        s.num_draft = drafts.len();
        Ok(())
    }

    /// Rolls running `seq` back to its first `len` tokens after a verification
    /// step (or drops unverified drafts): the history, the computed count and
    /// the block table shrink to `len` (whole blocks past it are freed), and
    /// the draft count is cleared. `len` may not cut into the prompt. Call it
    /// between steps, before the next [`Scheduler::schedule`] or
    /// [`Scheduler::finish`], so no block holding rejected tokens is ever
    /// registered in the prefix cache.
    pub fn rollback(&mut self, seq: SeqId, len: usize) -> KvResult<()> {
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if len < s.num_prompt_tokens || len > s.tokens.len() {
            return Err(invalid(seq, format!("rollback to {len} of {} tokens", s.tokens.len())));
        }
        s.tokens.truncate(len);
        s.num_draft = 0;
        if s.num_computed > len {
            s.num_computed = len;
            self.blocks.truncate(seq, len)?;
        }
        Ok(())
    }

    /// Ends `seq` (stop condition, length limit or abort) in any state, frees
    /// its blocks (computed full blocks stay in the prefix cache) and returns
    /// its final state. Call it between steps, after the last plan ran.
    pub fn finish(&mut self, seq: SeqId, reason: FinishReason) -> KvResult<Sequence> {
        let mut s = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        match s.status {
            SeqStatus::Running => {
                self.blocks.cache_full_blocks(seq, &s.tokens, s.num_computed)?;
                self.blocks.free(seq)?;
                self.running.retain(|&r| r != seq);
            }
            SeqStatus::Waiting | SeqStatus::Preempted => self.waiting.retain(|&w| w != seq),
            SeqStatus::Finished(_) => return Err(invalid(seq, "finished twice")),
        }
        s.status = SeqStatus::Finished(reason);
        self.finished.push((seq, reason));
        Ok(s)
    }

    /// Forks `parent` into a new sequence with the same token history (for
    /// n > 1 sampling: fork after the step that produced the prompt's logits,
    /// then append a different sample to each). A running parent shares its
    /// blocks with the child (copy-on-write at the first divergent write); a
    /// waiting one is simply cloned. Errors when the child could not run
    /// (`max_num_seqs` reached).
    pub fn fork(&mut self, parent: SeqId) -> KvResult<SeqId> {
        let p = self.seqs.get(&parent).ok_or(KvError::UnknownSeq(parent))?;
        let running = p.status == SeqStatus::Running;
        if running && self.running.len() >= self.config.max_num_seqs {
            return Err(KvError::TooManySeqs {
                seq: parent,
                running: self.running.len(),
                max_num_seqs: self.config.max_num_seqs,
            });
        }
        let child = SeqId(self.next_id);
        let mut c = p.clone();
        c.id = child;
        c.parent = Some(parent);
        c.num_preemptions = 0;
        if running {
            self.blocks.fork(parent, child)?;
            self.running.push(child);
        } else {
            self.waiting.push_back(child);
        }
        self.next_id += 1;
        self.seqs.insert(child, c);
        Ok(child)
    }

    /// Plans the next step; see the module doc for the policy.
    pub fn schedule(&mut self) -> KvResult<StepPlan> {
        // The previous plan has run: the full blocks it completed are valid
        // prefix-cache entries now.
        for &id in &self.running {
            let s = self.seqs.get(&id).ok_or(KvError::UnknownSeq(id))?;
            self.blocks.cache_full_blocks(id, &s.tokens, s.num_computed)?;
        }
        let mut st = StepState { budget: self.config.max_num_batched_tokens, ..StepState::default() };
        st.plan.finished = std::mem::take(&mut self.finished);

        // 1. Decodes, oldest first.
        let decodes: Vec<SeqId> = self.running.iter().copied().filter(|id| self.is_decode(*id)).collect();
        for id in decodes {
            if st.budget == 0 {
                break;
            }
            if self.running.contains(&id) {
                let mut n = self.left(id);
                if n > st.budget {
                    self.drop_drafts(id)?;
                    n = 1;
                }
                self.schedule_running(id, n, &mut st)?;
            }
        }
        st.plan.num_decodes = st.plan.seqs.len();

        // 2. Chunks of running prefills, oldest first.
        let prefills: Vec<SeqId> =
            self.running.iter().copied().filter(|id| self.left(*id) > 1 && !self.is_decode(*id)).collect();
        for id in prefills {
            if st.budget == 0 {
                break;
            }
            if self.running.contains(&id) {
                let n = self.left(id).min(st.budget);
                self.schedule_running(id, n, &mut st)?;
            }
        }

        // 3. Admission of waiting sequences, first come first served.
        if st.plan.preempted.is_empty() {
            while st.budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(&id) = self.waiting.front() else { break };
                let s = self.seqs.get(&id).ok_or(KvError::UnknownSeq(id))?;
                let hit = if self.blocks.prefix_caching() {
                    self.blocks.find_prefix(&s.tokens)
                } else {
                    PrefixHit::miss(s.tokens.len(), self.config.block_size)
                };
                let n = (s.tokens.len() - hit.num_tokens()).min(st.budget);
                let Some(alloc) = self.blocks.allocate(id, &hit, n)? else { break };
                self.waiting.pop_front();
                let s = self.seqs.get_mut(&id).ok_or(KvError::UnknownSeq(id))?;
                s.num_computed = hit.num_tokens();
                s.status = SeqStatus::Running;
                let at = self.running.partition_point(|&r| r < id);
                self.running.insert(at, id);
                self.push_entry(id, alloc, &mut st)?;
            }
        }
        // Drafts of sequences that did not get into this step are dropped.
        let unscheduled: Vec<SeqId> = self
            .seqs
            .values()
            .filter(|s| s.num_draft > 0 && !st.scheduled.contains(&s.id))
            .map(|s| s.id)
            .collect();
        for id in unscheduled {
            self.drop_drafts(id)?;
        }
        Ok(st.plan)
    }

    /// Whether running `id` decodes this step: one token left, or one plus
    /// its speculative drafts.
    fn is_decode(&self, id: SeqId) -> bool {
        self.seqs.get(&id).is_some_and(|s| s.tokens.len() - s.num_computed == 1 + s.num_draft)
    }

    /// Removes the unverified drafts of `id` from its history.
    fn drop_drafts(&mut self, id: SeqId) -> KvResult<()> {
        let s = self.seqs.get_mut(&id).ok_or(KvError::UnknownSeq(id))?;
        let n = s.tokens.len() - s.num_draft;
        s.tokens.truncate(n);
        s.num_draft = 0;
        Ok(())
    }

    /// Tokens of `id` not yet computed (0 for an unknown id).
    fn left(&self, id: SeqId) -> usize {
        self.seqs.get(&id).map_or(0, |s| s.tokens.len() - s.num_computed)
    }

    /// Schedules `n` tokens of running `id`, preempting the most recently
    /// arrived unscheduled running sequences (possibly `id` itself) while the
    /// pool lacks the blocks.
    fn schedule_running(&mut self, id: SeqId, n: usize, st: &mut StepState) -> KvResult<()> {
        loop {
            if let Some(alloc) = self.blocks.append_slots(id, n)? {
                return self.push_entry(id, alloc, st);
            }
            let victim =
                self.running.iter().rev().copied().find(|v| !st.scheduled.contains(v)).ok_or_else(|| {
                    invalid(id, "no preemption victim although the requester is unscheduled")
                })?;
            self.preempt(victim)?;
            st.plan.preempted.push(victim);
            if victim == id {
                return Ok(());
            }
        }
    }

    /// Preempts running `id` by recompute.
    fn preempt(&mut self, id: SeqId) -> KvResult<()> {
        self.drop_drafts(id)?;
        let s = self.seqs.get_mut(&id).ok_or(KvError::UnknownSeq(id))?;
        self.blocks.cache_full_blocks(id, &s.tokens, s.num_computed)?;
        self.blocks.free(id)?;
        s.num_computed = 0;
        s.status = SeqStatus::Preempted;
        s.num_preemptions += 1;
        self.running.retain(|&r| r != id);
        let at = self.waiting.partition_point(|&w| w < id);
        self.waiting.insert(at, id);
        Ok(())
    }

    /// Adds the entry of `id` for the slots in `alloc` and counts its tokens
    /// as computed.
    fn push_entry(&mut self, id: SeqId, alloc: Allocation, st: &mut StepState) -> KvResult<()> {
        let s = self.seqs.get_mut(&id).ok_or(KvError::UnknownSeq(id))?;
        let start = s.num_computed;
        let end = start + alloc.slots.len();
        if alloc.start != start || end > s.tokens.len() {
            return Err(invalid(id, "slots were allocated out of step with the computed tokens"));
        }
        s.num_computed = end;
        st.budget -= end - start;
        st.scheduled.insert(id);
        st.plan.copies.extend(alloc.copies);
        st.plan.seqs.push(ScheduledSeq {
            seq: id,
            tokens: s.tokens[start..end].to_vec(),
            positions: (start..end).map(|p| p as i32).collect(),
            slots: alloc.slots,
            block_table: self.blocks.block_table_i32(id).ok_or(KvError::UnknownSeq(id))?,
            context_len: end,
            needs_logits: end == s.tokens.len(),
        });
        Ok(())
    }

    /// Checks the invariants of the module doc and of the block manager; the
    /// error names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.blocks.check_invariants()?;
        if !self.running.is_sorted() || !self.waiting.iter().is_sorted() {
            return Err("a queue is out of arrival order".into());
        }
        if self.running.len() > self.config.max_num_seqs {
            return Err(format!(
                "{} running > max_num_seqs {}",
                self.running.len(),
                self.config.max_num_seqs
            ));
        }
        if self.running.len() + self.waiting.len() != self.seqs.len() {
            return Err("a live sequence is in no queue or in two".into());
        }
        for &id in &self.running {
            let s = self.seqs.get(&id).ok_or(format!("{id} runs but is unknown"))?;
            if s.status != SeqStatus::Running || self.blocks.num_slots(id) != Some(s.num_computed) {
                return Err(format!("{id} runs with status {:?} and slots out of step", s.status));
            }
        }
        for &id in &self.waiting {
            let s = self.seqs.get(&id).ok_or(format!("{id} waits but is unknown"))?;
            let waiting = matches!(s.status, SeqStatus::Waiting | SeqStatus::Preempted);
            if !waiting || self.blocks.has_seq(id) || s.num_computed != 0 {
                return Err(format!("{id} waits with status {:?}, a table or computed tokens", s.status));
            }
        }
        for s in self.seqs.values() {
            if s.tokens.len() > self.config.max_model_len {
                return Err(format!("{} is longer than max_model_len", s.id));
            }
        }
        Ok(())
    }
}
