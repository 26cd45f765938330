//! The generation engine: requests in, tokens out. It owns a [`Model`] and a
//! [`Scheduler`] and runs the step loop of continuous batching:
//!
//! ```text
//! loop {
//!     plan    = scheduler.schedule()            decodes first, chunked prefill, admission
//!     sampled = model.forward_sample(plan)      one varlen forward + on-device sampling
//!     for each sequence that produced logits:
//!         stop token / max_tokens / max_model_len  -> scheduler.finish(seq)
//!         otherwise                                -> scheduler.append_token(seq, token)
//! }
//! ```
//!
//! Every request carries its own [`SamplingParams`] (greedy by default), a
//! token limit and stop tokens. [`Engine::step`] returns one [`Event`] per
//! sampled token, so callers stream text as it comes; [`Engine::run`] drives
//! the loop until every request is done and returns [`Completion`]s with the
//! generated ids and per-request latencies (time to first token, the gaps
//! between tokens).
//!
//! Invariants: a stop token ends its request and is not part of the output
//! (as in llama.cpp and vLLM); a request never produces more than
//! `max_tokens` tokens; preemption is invisible to callers (a preempted
//! request recomputes its history and continues where it was); the engine
//! never calls the model with an empty step, and a step in which nothing can
//! be scheduled while requests remain is an error, not a hang.
//!
//! With speculation on ([`Engine::set_speculation`], see [`crate::spec`]),
//! decoding sequences get draft tokens before each plan, their entries verify
//! `1 + k` positions in the same varlen forward (as `1 + k` decode rows), and
//! one step may emit several tokens per request (still never past a stop
//! token or `max_tokens`).
//!
//! Structured output ([`crate::grammar`]): a request may carry a
//! [`Constraint`]. The engine keeps it beside the request and feeds it the
//! request's emitted tokens only (preemption, recompute and the prefix cache
//! never reach it). Each step, the host advances the grammars by the tokens
//! the previous step emitted and computes the masks of the constrained rows
//! while the device runs the forward pass
//! ([`Model::forward_sample_masked`]), so neither waits for the other;
//! verification rows of a draft get the
//! mask after the drafts before them, and drafts are cut at the first token
//! the grammar rejects (or a stop token) before they are verified. A row
//! whose grammar allows no token at all ends its request with
//! [`FinishReason::Grammar`] (its sample is dropped); stop tokens are only
//! allowed where the grammar accepts.

use crate::error::{Error, Result};
use crate::grammar::{Constraint, mask_words};
use crate::kv::SeqId;
use crate::model::ActElem;
use crate::model::sampler::{HostTimes, RowMasks, SampleRow, Sampled, SamplingParams};
use crate::model::{Device, Model, Step};
use crate::scheduler::{FinishReason, Scheduler, SchedulerConfig};
use crate::spec::{Drafter, SpecConfig, SpecStats, accept_len, ngram::NgramDrafter, split_verify_entries};
use rustc_hash::FxHashMap as HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt's token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Sampling settings.
    pub params: SamplingParams,
    /// The most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Tokens that end the request when sampled (end-of-generation tokens).
    pub stop_tokens: Vec<u32>,
    /// The grammar the output must match (structured output), if any.
    pub constraint: Option<Constraint>,
}

impl Request {
    /// A request sampled with `params`, without stop tokens or a constraint.
    pub fn new(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> Request {
        Request { prompt, params, max_tokens, stop_tokens: Vec::new(), constraint: None }
    }

    /// A greedy request without stop tokens or a constraint.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request::new(prompt, SamplingParams::default(), max_tokens)
    }
}

/// A sampled token, as [`Engine::step`] reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    /// The request (its id from [`Engine::add`]).
    pub seq: SeqId,
    /// The token, `None` when a stop token ended the request (stop tokens are
    /// not output).
    pub token: Option<u32>,
    /// The token's log-probability (of the stop token when `token` is `None`).
    pub logprob: f32,
    /// Set when this event ends the request.
    pub finish: Option<FinishReason>,
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The request's id.
    pub seq: SeqId,
    /// The prompt's ids.
    pub prompt: Vec<u32>,
    /// The generated ids (without a final stop token).
    pub tokens: Vec<u32>,
    /// Their log-probabilities.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: FinishReason,
    /// Time from [`Engine::add`] to the first sampled token.
    pub ttft: Duration,
    /// Gaps between consecutive sampled tokens.
    pub itl: Vec<Duration>,
    /// How often the request was preempted and recomputed.
    pub preemptions: u32,
}

/// Engine-side state of a live request.
struct Live {
    req: Request,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    added: Instant,
    last: Option<Instant>,
    ttft: Duration,
    itl: Vec<Duration>,
}

/// Counters of the engine's work so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Steps run.
    pub steps: u64,
    /// Prompt (and recomputed) tokens fed through prefill.
    pub prefill_tokens: u64,
    /// Tokens fed as decodes.
    pub decode_tokens: u64,
    /// Preemptions by recompute.
    pub preemptions: u64,
}

/// Where the host's time went in the engine's last step
/// ([`Engine::last_step_times`]), phases one after the other.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimes {
    /// Drafting (speculative decoding), scheduling and building the step's
    /// arrays and sampling rows.
    pub schedule: Duration,
    /// The forward pass and sampling ([`Model::forward_sample_masked`]),
    /// phase by phase.
    pub model: HostTimes,
    /// Recording the sampled tokens: stop conditions, events, finished
    /// requests.
    pub accept: Duration,
}

/// The engine (see the module doc).
pub struct Engine<D: Device, T: ActElem> {
    model: Model<D, T>,
    scheduler: Scheduler,
    live: HashMap<SeqId, Live>,
    done: Vec<Completion>,
    stats: EngineStats,
    spec: Option<(SpecConfig, Box<dyn Drafter<D> + Send>)>,
    spec_stats: SpecStats,
    /// The grammar state of each constrained live request.
    constraints: HashMap<SeqId, Guide>,
    last_times: StepTimes,
}

/// A constrained request's grammar and the emitted tokens it has not yet
/// consumed. Emitted tokens are consumed at the start of the next mask
/// computation, which runs on the host while the device runs the forward
/// pass, so the grammar's advance stays off the step's critical path. The
/// masks guarantee that a sampled token is one the grammar accepts.
struct Guide {
    constraint: Constraint,
    pending: Vec<u32>,
    /// The grammar rejected a pending token: the request ends at its next
    /// sampled row.
    rejected: bool,
}

impl Guide {
    fn new(constraint: Constraint) -> Guide {
        Guide { constraint, pending: Vec::new(), rejected: false }
    }

    /// Consumes the pending tokens. Returns false when the grammar rejected
    /// one, now or before.
    fn catch_up(&mut self) -> bool {
        for t in std::mem::take(&mut self.pending) {
            if self.rejected {
                break;
            }
            self.rejected = self.constraint.consume(t).is_err();
        }
        !self.rejected
    }
}

impl<D: Device, T: ActElem> Engine<D, T> {
    /// An engine over `model` with the scheduler limits of `config`, whose
    /// pool must match the model's cache (`num_blocks`, `block_size`).
    pub fn new(model: Model<D, T>, config: SchedulerConfig) -> Result<Engine<D, T>> {
        if config.num_blocks != model.num_blocks() || config.block_size != model.block_size() {
            return Err(Error::Usage(format!(
                "the scheduler plans {} blocks of {} tokens but the model's cache has {} of {}",
                config.num_blocks,
                config.block_size,
                model.num_blocks(),
                model.block_size()
            )));
        }
        let scheduler = Scheduler::new(config)?;
        Ok(Engine {
            model,
            scheduler,
            live: HashMap::default(),
            done: Vec::new(),
            stats: EngineStats::default(),
            spec: None,
            spec_stats: SpecStats::default(),
            constraints: HashMap::default(),
            last_times: StepTimes::default(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Model<D, T> {
        &self.model
    }

    /// The model, mutably (profiling, graph switches).
    pub fn model_mut(&mut self) -> &mut Model<D, T> {
        &mut self.model
    }

    /// The scheduler (read-only: queues, KV statistics).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Work counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Where the host's time went in the last step (all zero before the
    /// first, after a failed one, and in the model's phases for a step that
    /// sampled nothing or captured a CUDA graph).
    pub fn last_step_times(&self) -> StepTimes {
        self.last_times
    }

    /// Turns speculative decoding on (`Some`) or off; errors for invalid
    /// settings.
    pub fn set_speculation(&mut self, config: Option<SpecConfig>) -> Result<()> {
        self.spec = match config {
            None => None,
            Some(c) if c.method == crate::spec::SpecMethod::Draft => {
                return Err(Error::Usage("the draft-model drafter is installed with set_drafter".into()));
            }
            Some(c) => {
                c.validate()?;
                Some((c, Box::new(NgramDrafter { max: c.ngram_max, min: c.ngram_min })))
            }
        };
        Ok(())
    }

    /// Turns speculative decoding on with `k` drafts per step from `drafter`
    /// (a draft model, or a test drafter).
    pub fn set_drafter(&mut self, k: usize, drafter: Box<dyn Drafter<D> + Send>) -> Result<()> {
        let mut c = SpecConfig::ngram(k);
        c.validate()?;
        c.method = crate::spec::SpecMethod::Draft;
        self.spec = Some((c, drafter));
        Ok(())
    }

    /// Speculation counters so far (all zero without speculation).
    pub fn spec_stats(&self) -> SpecStats {
        self.spec_stats
    }

    /// Whether any request is still running or waiting.
    pub fn has_unfinished(&self) -> bool {
        !self.live.is_empty()
    }

    /// Queues `req`; errors for an empty or too long prompt, `max_tokens ==
    /// 0`, a token outside the vocabulary or invalid sampling settings.
    pub fn add(&mut self, mut req: Request) -> Result<SeqId> {
        req.params.validate()?;
        if req.max_tokens == 0 {
            return Err(Error::Usage("max_tokens must be at least 1".into()));
        }
        let vocab = self.model.weights.config.vocab_size;
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Usage(format!("prompt token {t} is outside the vocabulary of {vocab}")));
        }
        let constraint = req.constraint.take();
        let seq = self.scheduler.add_request(req.prompt.clone())?;
        if let Some(c) = constraint {
            self.constraints.insert(seq, Guide::new(c));
        }
        let live = Live {
            req,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            added: Instant::now(),
            last: None,
            ttft: Duration::ZERO,
            itl: Vec::new(),
        };
        self.live.insert(seq, live);
        Ok(seq)
    }

    /// Aborts a live request (its completion is reported with
    /// [`FinishReason::Aborted`]).
    pub fn abort(&mut self, seq: SeqId) -> Result<()> {
        if !self.live.contains_key(&seq) {
            return Err(Error::Usage(format!("request {seq:?} is not live")));
        }
        self.finish(seq, FinishReason::Aborted)
    }

    /// Takes the completions finished so far.
    pub fn take_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.done)
    }

    /// Runs one step and returns the tokens it sampled (none when nothing
    /// is live).
    pub fn step(&mut self, dev: &mut D) -> Result<Vec<Event>> {
        if self.live.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        self.last_times = StepTimes::default();
        self.propose_drafts(dev)?;
        let plan = self.scheduler.schedule()?;
        self.stats.preemptions += plan.preempted.len() as u64;
        if plan.is_empty() {
            return Err(Error::Usage(format!(
                "no request could be scheduled ({} live, {} KV blocks free)",
                self.live.len(),
                self.scheduler.block_manager().num_available()
            )));
        }
        if !plan.copies.is_empty() {
            return Err(Error::Unsupported(
                "copy-on-write block copies (forked sequences) are not run by this engine".into(),
            ));
        }
        let tokens = plan.input_ids();
        let positions = plan.positions();
        let slots = plan.slot_mapping();
        let cu = plan.cu_seqlens_q();
        let lens = plan.seq_lens();
        let stride = plan.max_blocks_per_seq().max(1);
        let tables = plan.block_tables(stride)?;
        // Verification entries run as single-token decode rows (see
        // `split_verify_entries`): plain decoding's kernels and graphs.
        let (cu, lens, tables) = match split_verify_entries(&cu, &lens, &tables, stride, plan.num_decodes) {
            Some(split) => split,
            None => (cu, lens, tables),
        };
        let logits = plan.logits_indices();
        // A sequence with `d` drafts samples its last `d + 1` rows, row `j`
        // with the seed step and history plain decoding would give it.
        let mut rows = Vec::with_capacity(logits.len());
        let mut sample_rows = Vec::with_capacity(logits.len());
        let mut drafts = Vec::with_capacity(logits.len());
        // Constrained requests: (first sample row, sequence, drafts).
        let mut constrained = Vec::new();
        for &(seq, r) in &logits {
            let live = self.live.get(&seq).ok_or_else(|| unknown(seq))?;
            let s = self.scheduler.sequence(seq).ok_or_else(|| unknown(seq))?;
            let d = s.num_draft();
            let base = s.len() - d;
            if self.constraints.contains_key(&seq) {
                constrained.push((sample_rows.len(), seq, d));
            }
            for j in 0..=d {
                rows.push(r - d + j);
                sample_rows.push(SampleRow {
                    params: &live.req.params,
                    step: (live.tokens.len() + j) as u32,
                    tokens: &s.tokens()[..base + j],
                    prompt_len: s.prompt().len(),
                });
            }
            drafts.push(d);
        }
        let step = Step {
            tokens: &tokens,
            positions: &positions,
            slot_mapping: &slots,
            block_tables: &tables,
            max_blocks_per_seq: stride,
            context_lens: &lens,
            query_start: &cu,
            logit_rows: &rows,
        };
        let mut dead = vec![false; sample_rows.len()];
        let scheduled = Instant::now();
        let sampled = if constrained.is_empty() {
            self.model.forward_sample(dev, &step, &sample_rows)?
        } else {
            let words = mask_words(self.model.weights.config.vocab_size);
            let (constraints, live, scheduler) = (&mut self.constraints, &self.live, &self.scheduler);
            let dead = &mut dead;
            let mut masker = || -> Result<RowMasks> {
                let mut m = RowMasks::default();
                for &(at, seq, d) in &constrained {
                    let g = constraints.get_mut(&seq).ok_or_else(|| unknown(seq))?;
                    if !g.catch_up() {
                        // A sampled token the grammar rejects (the masks
                        // rule it out): the request ends at this step.
                        dead[at..=at + d].fill(true);
                        continue;
                    }
                    let c = &mut g.constraint;
                    let stop = &live.get(&seq).ok_or_else(|| unknown(seq))?.req.stop_tokens;
                    let s = scheduler.sequence(seq).ok_or_else(|| unknown(seq))?;
                    let draft = &s.tokens()[s.len() - d..];
                    let mut consumed = 0;
                    for j in 0..=d {
                        if j > 0 {
                            if c.consume(draft[j - 1]).is_err() {
                                // Drafts were checked; a failure leaves the
                                // rest of this request's rows unmasked and
                                // ends it at the first of them.
                                dead[at + j..=at + d].fill(true);
                                break;
                            }
                            consumed += 1;
                        }
                        let start = m.bits.len();
                        m.bits.resize(start + words, 0);
                        if c.fill_mask(stop, &mut m.bits[start..]) {
                            m.rows.push((at + j) as u32);
                        } else {
                            m.bits.truncate(start);
                            dead[at + j] = true;
                        }
                    }
                    c.rollback(consumed)?;
                }
                Ok(m)
            };
            self.model.forward_sample_masked(dev, &step, &sample_rows, Some(&mut masker))?
        };
        drop(sample_rows);
        let sampled_at = Instant::now();
        self.stats.steps += 1;
        let decode_tokens: usize = plan.seqs[..plan.num_decodes].iter().map(|e| e.tokens.len()).sum();
        self.stats.decode_tokens += decode_tokens as u64;
        self.stats.prefill_tokens += (tokens.len() - decode_tokens) as u64;
        let now = Instant::now();
        let mut events = Vec::with_capacity(sampled.len());
        let mut at = 0;
        for (&(seq, _), &d) in logits.iter().zip(&drafts) {
            events.extend(self.accept(seq, &sampled[at..at + d + 1], &dead[at..at + d + 1], d, now)?);
            at += d + 1;
        }
        self.last_times = StepTimes {
            schedule: scheduled - start,
            model: self.model.last_host_times(),
            accept: sampled_at.elapsed(),
        };
        Ok(events)
    }

    /// Records the tokens sampled for `seq`, whose last `drafts` history
    /// tokens are drafts verified by `samples` (`drafts + 1` rows): the
    /// accepted drafts and the correction (or bonus) token are emitted in
    /// order until a stop condition ends the request, and the sequence is
    /// rolled back to what was emitted. A `dead` row (its grammar allows no
    /// token) ends the request there with [`FinishReason::Grammar`], its
    /// sample dropped; emitted tokens advance the request's grammar at the
    /// next step (see [`Guide`]).
    fn accept(
        &mut self,
        seq: SeqId,
        samples: &[Sampled],
        dead: &[bool],
        drafts: usize,
        now: Instant,
    ) -> Result<Vec<Event>> {
        let max_model_len = self.scheduler.config().max_model_len;
        let (base, proposed) = {
            let s = self.scheduler.sequence(seq).ok_or_else(|| unknown(seq))?;
            (s.len() - drafts, s.tokens()[s.len() - drafts..].to_vec())
        };
        let ids: Vec<u32> = samples.iter().map(|s| s.token).collect();
        let m = accept_len(&proposed, &ids);
        if drafts > 0 {
            self.spec_stats.verifications += 1;
            self.spec_stats.proposed += drafts as u64;
            self.spec_stats.accepted += m as u64;
        }
        let mut events = Vec::with_capacity(m + 1);
        for (i, s) in samples[..=m].iter().enumerate() {
            let live = self.live.get_mut(&seq).ok_or_else(|| unknown(seq))?;
            match live.last {
                None => live.ttft = now - live.added,
                Some(t) => live.itl.push(now - t),
            }
            live.last = Some(now);
            let grammar_ok = !dead[i];
            if grammar_ok
                && !live.req.stop_tokens.contains(&s.token)
                && let Some(g) = self.constraints.get_mut(&seq)
            {
                g.pending.push(s.token);
            }
            let finish = if !grammar_ok {
                Some(FinishReason::Grammar)
            } else if live.req.stop_tokens.contains(&s.token) {
                Some(FinishReason::StopToken(s.token))
            } else {
                live.tokens.push(s.token);
                live.logprobs.push(s.logprob);
                if live.tokens.len() >= live.req.max_tokens {
                    Some(FinishReason::MaxTokens)
                } else if base + i + 1 >= max_model_len {
                    Some(FinishReason::MaxModelLen)
                } else {
                    None
                }
            };
            let token = (!matches!(finish, Some(FinishReason::StopToken(_) | FinishReason::Grammar)))
                .then_some(s.token);
            let logprob = if finish == Some(FinishReason::Grammar) { 0.0 } else { s.logprob };
            events.push(Event { seq, token, logprob, finish });
            if let Some(reason) = finish {
                if drafts > 0 {
                    self.spec_stats.emitted += i as u64 + 1;
                    self.scheduler.rollback(seq, base + i)?;
                }
                self.finish(seq, reason)?;
                return Ok(events);
            }
        }
        if drafts > 0 {
            self.spec_stats.emitted += m as u64 + 1;
            self.scheduler.rollback(seq, base + m)?;
        }
        self.scheduler.append_token(seq, samples[m].token)?;
        Ok(events)
    }

    /// Proposes drafts for every running sequence that decodes next, capped
    /// so that the emitted run cannot pass `max_tokens` or `max_model_len`.
    fn propose_drafts(&mut self, dev: &mut D) -> Result<()> {
        let Some((cfg, drafter)) = self.spec.as_mut() else { return Ok(()) };
        let max_model_len = self.scheduler.config().max_model_len;
        let mut asks: Vec<(SeqId, usize)> = Vec::new();
        for &id in self.scheduler.running() {
            let (Some(s), Some(live)) = (self.scheduler.sequence(id), self.live.get(&id)) else { continue };
            if s.num_computed() + 1 != s.len() || s.num_draft() != 0 {
                continue;
            }
            let remaining = live.req.max_tokens.saturating_sub(live.tokens.len());
            let k = cfg
                .num_speculative_tokens
                .min(remaining.saturating_sub(1))
                .min(max_model_len.saturating_sub(1 + s.len()));
            if k > 0 {
                asks.push((id, k));
            }
        }
        if asks.is_empty() {
            return Ok(());
        }
        let mut requests = Vec::with_capacity(asks.len());
        for &(id, k) in &asks {
            requests.push((self.scheduler.sequence(id).ok_or_else(|| unknown(id))?.tokens(), k));
        }
        let proposals = drafter.propose(dev, &requests)?;
        drop(requests);
        let vocab = self.model.weights.config.vocab_size;
        for (&(id, k), mut drafts) in asks.iter().zip(proposals) {
            drafts.truncate(k);
            // A constrained request verifies only the drafts its grammar
            // accepts, up to the first stop token.
            if let Some(g) = self.constraints.get_mut(&id) {
                let stop = &self.live.get(&id).ok_or_else(|| unknown(id))?.req.stop_tokens;
                let plain = drafts.iter().position(|t| stop.contains(t) || *t as usize >= vocab);
                drafts.truncate(plain.unwrap_or(drafts.len()));
                // A rejected pending token leaves no draft; the next mask
                // computation ends the request.
                let n = if g.catch_up() { g.constraint.valid_prefix(&drafts) } else { 0 };
                drafts.truncate(n);
            }
            if !drafts.is_empty() {
                self.scheduler.propose(id, &drafts)?;
            }
        }
        Ok(())
    }

    /// Ends `seq` and files its completion.
    fn finish(&mut self, seq: SeqId, reason: FinishReason) -> Result<()> {
        let s = self.scheduler.finish(seq, reason)?;
        let live = self.live.remove(&seq).ok_or_else(|| unknown(seq))?;
        self.constraints.remove(&seq);
        self.done.push(Completion {
            seq,
            prompt: live.req.prompt,
            tokens: live.tokens,
            logprobs: live.logprobs,
            finish: reason,
            ttft: live.ttft,
            itl: live.itl,
            preemptions: s.num_preemptions(),
        });
        Ok(())
    }

    /// The logits (`[rows.len(), vocab]`, f32) at positions `rows` of
    /// `tokens` fed as one fresh sequence in a single prefill: teacher
    /// forcing and scoring. The engine must be idle; the pass writes KV
    /// blocks `0..` directly, so the scheduler is reset afterwards (its
    /// prefix cache would otherwise point at overwritten blocks).
    pub fn score(&mut self, dev: &mut D, tokens: &[u32], rows: Range<usize>) -> Result<Vec<f32>> {
        if !self.live.is_empty() {
            return Err(Error::Usage("score needs an idle engine (requests are live)".into()));
        }
        let n = tokens.len();
        let bs = self.model.block_size();
        let blocks = n.div_ceil(bs);
        if n == 0 || rows.start >= rows.end || rows.end > n {
            return Err(Error::Usage(format!("score: rows {rows:?} of {n} tokens")));
        }
        if blocks > self.model.num_blocks() {
            return Err(Error::Usage(format!(
                "score: {n} tokens need {blocks} KV blocks but the cache has {}",
                self.model.num_blocks()
            )));
        }
        let positions: Vec<i32> = (0..n as i32).collect();
        let table: Vec<i32> = (0..blocks as i32).collect();
        let logit_rows: Vec<usize> = rows.collect();
        let step = Step {
            tokens,
            positions: &positions,
            slot_mapping: &positions,
            block_tables: &table,
            max_blocks_per_seq: blocks,
            context_lens: &[n as i32],
            query_start: &[0, n as i32],
            logit_rows: &logit_rows,
        };
        let logits = self.model.forward(dev, &step);
        self.scheduler = Scheduler::new(*self.scheduler.config())?;
        logits
    }

    /// Runs `requests` to completion (together with any already live) and
    /// returns the completions of `requests` in their order. `on_event` sees
    /// every event as it happens (for streaming).
    pub fn run(
        &mut self,
        dev: &mut D,
        requests: Vec<Request>,
        mut on_event: impl FnMut(&Event),
    ) -> Result<Vec<Completion>> {
        let ids = requests.into_iter().map(|r| self.add(r)).collect::<Result<Vec<_>>>()?;
        let mut by_id: HashMap<SeqId, Completion> = HashMap::default();
        while ids.iter().any(|id| !by_id.contains_key(id)) {
            for e in self.step(dev)? {
                on_event(&e);
            }
            for c in self.take_completions() {
                by_id.insert(c.seq, c);
            }
            if !self.has_unfinished() && ids.iter().any(|id| !by_id.contains_key(id)) {
                return Err(Error::Usage("a request ended without a completion".into()));
            }
        }
        Ok(ids.iter().filter_map(|id| by_id.remove(id)).collect())
    }
}

/// The error for a sequence the engine does not know (a bug).
fn unknown(seq: SeqId) -> Error {
    Error::Usage(format!("internal: sequence {seq:?} has no engine state"))
}

pub mod invariance;
#[cfg(test)]
mod real_model;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_grammar;
#[cfg(test)]
mod tests_invariance;
