//! Tests of the scheduler, driven by a simulated engine: every step runs the
//! plan's copies, writes a fingerprint of each token's prefix into its slot
//! (the KV write), checks that every context position read through the block
//! table holds the fingerprint of that position's prefix (attention), and
//! samples a token that is a deterministic function of the whole history
//! ("greedy"). Any wrong slot, table, copy, prefix hit or recompute makes a
//! read fail; any corrupted history changes the outputs, which are compared
//! with outputs computed without the scheduler.

use super::*;
use crate::kv::tests::fingerprint;
use proptest::prelude::*;
use std::collections::HashMap;

/// The "model": the greedy next token after `history` for a sequence whose
/// sampler is salted with `salt` (forks sample differently).
fn next_token(history: &[u32], salt: u64) -> u32 {
    ((fingerprint(history) ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32 % 50
}

/// End-of-sequence token of the simulation.
const EOS: u32 = 7;

/// The history a request ends with, computed without the scheduler.
fn expected(prompt: &[u32], salt: u64, max_tokens: usize, max_model_len: usize) -> Vec<u32> {
    let mut t = prompt.to_vec();
    while t.len() < max_model_len {
        let x = next_token(&t, salt);
        t.push(x);
        if x == EOS || t.len() - prompt.len() == max_tokens {
            break;
        }
    }
    t
}

fn config(num_blocks: usize, block_size: usize, budget: usize, max_num_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs,
        max_model_len: num_blocks * block_size,
        num_blocks,
        block_size,
        enable_prefix_caching: true,
    }
}

/// The simulated engine.
struct Sim {
    sched: Scheduler,
    /// The KV cache: one fingerprint per slot.
    cache: Vec<Option<u64>>,
    salt: HashMap<SeqId, u64>,
    /// Index of the first sampled token each sequence is responsible for.
    origin: HashMap<SeqId, usize>,
    max_tokens: HashMap<SeqId, usize>,
    done: HashMap<SeqId, (Sequence, FinishReason)>,
    /// Probability (per mille) of forking a sequence that produced logits.
    fork_per_mille: u64,
    rng: u64,
    plans: Vec<StepPlan>,
}

impl Sim {
    fn new(config: SchedulerConfig) -> Sim {
        Sim {
            sched: Scheduler::new(config).unwrap(),
            cache: vec![None; config.num_blocks * config.block_size],
            salt: HashMap::new(),
            origin: HashMap::new(),
            max_tokens: HashMap::new(),
            done: HashMap::new(),
            fork_per_mille: 0,
            rng: 0x2545_f491_4f6c_dd1d,
            plans: Vec::new(),
        }
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn add(&mut self, prompt: Vec<u32>, max_tokens: usize) -> SeqId {
        let len = prompt.len();
        let id = self.sched.add_request(prompt).unwrap();
        self.salt.insert(id, 0);
        self.origin.insert(id, len);
        self.max_tokens.insert(id, max_tokens);
        id
    }

    /// One step: schedule, execute, sample. Returns the plan.
    fn step(&mut self) -> Result<StepPlan, String> {
        let running_before = self.sched.running().to_vec();
        let plan = self.sched.schedule().map_err(|e| e.to_string())?;
        self.sched.check_invariants()?;
        if !plan.preempted.is_empty() && plan.seqs.iter().any(|e| !running_before.contains(&e.seq)) {
            return Err("a step that preempted also admitted a waiting sequence".into());
        }
        let bs = self.sched.config().block_size;
        if plan.num_tokens() > self.sched.config().max_num_batched_tokens
            || plan.seqs.len() > self.sched.config().max_num_seqs
        {
            return Err(format!("plan over budget: {} tokens, {} seqs", plan.num_tokens(), plan.seqs.len()));
        }
        let mut slots = plan.slot_mapping();
        slots.sort();
        if slots.windows(2).any(|w| w[0] == w[1]) {
            return Err("two tokens of one step share a slot".into());
        }
        for c in &plan.copies {
            for o in 0..bs {
                self.cache[c.dst.index() * bs + o] = self.cache[c.src.index() * bs + o];
            }
        }
        for (i, e) in plan.seqs.iter().enumerate() {
            let s = self.sched.sequence(e.seq).ok_or("scheduled an unknown sequence")?;
            let start = e.start();
            if e.tokens != s.tokens()[start..e.context_len]
                || e.positions != (start..e.context_len).map(|p| p as i32).collect::<Vec<_>>()
            {
                return Err(format!("{}: tokens or positions are not its history", e.seq));
            }
            if i < plan.num_decodes && e.tokens.len() != 1 {
                return Err("a decode entry has more than one token".into());
            }
            for (j, &slot) in e.slots.iter().enumerate() {
                let p = start + j;
                let table_slot = e.block_table[p / bs] as usize * bs + p % bs;
                if table_slot != slot as usize {
                    return Err(format!("{}: slot {slot} disagrees with the block table", e.seq));
                }
                self.cache[slot as usize] = Some(fingerprint(&s.tokens()[..=p]));
            }
        }
        // Attention: every context position of every scheduled sequence.
        for e in &plan.seqs {
            let s = self.sched.sequence(e.seq).ok_or("unknown")?;
            for p in 0..e.context_len {
                let slot = e.block_table[p / bs] as usize * bs + p % bs;
                if self.cache[slot] != Some(fingerprint(&s.tokens()[..=p])) {
                    return Err(format!("{} reads wrong KV at position {p} (slot {slot})", e.seq));
                }
            }
        }
        for (seq, _) in plan.logits_indices() {
            self.sample(seq)?;
        }
        self.plans.push(plan.clone());
        Ok(plan)
    }

    /// Samples for `seq` (maybe forking it first) and appends or finishes.
    fn sample(&mut self, seq: SeqId) -> Result<(), String> {
        if self.fork_per_mille > 0 && self.rand() % 1000 < self.fork_per_mille {
            match self.sched.fork(seq) {
                Ok(child) => {
                    let s = self.sched.sequence(seq).ok_or("lost parent")?;
                    let c = self.sched.sequence(child).ok_or("lost child")?;
                    if c.tokens() != s.tokens() || c.parent() != Some(seq) {
                        return Err("the fork does not copy the history".into());
                    }
                    let len = c.len();
                    // The child may generate as many tokens as the parent has left.
                    let max_tokens = self.max_tokens[&seq].max(c.output().len() + 1);
                    let salt = self.rand();
                    self.salt.insert(child, salt);
                    self.origin.insert(child, len);
                    self.max_tokens.insert(child, max_tokens);
                    self.sample_one(child)?;
                }
                Err(KvError::TooManySeqs { .. }) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        self.sample_one(seq)
    }

    fn sample_one(&mut self, seq: SeqId) -> Result<(), String> {
        let s = self.sched.sequence(seq).ok_or("sampled an unknown sequence")?;
        let tok = next_token(s.tokens(), self.salt[&seq]);
        let reason = if s.len() == self.sched.config().max_model_len {
            Some(FinishReason::MaxModelLen)
        } else {
            self.sched.append_token(seq, tok).map_err(|e| e.to_string())?;
            let s = self.sched.sequence(seq).ok_or("lost")?;
            if tok == EOS {
                Some(FinishReason::Eos)
            } else if s.output().len() >= self.max_tokens[&seq] {
                Some(FinishReason::MaxTokens)
            } else {
                None
            }
        };
        if let Some(reason) = reason {
            let s = self.sched.finish(seq, reason).map_err(|e| e.to_string())?;
            self.done.insert(seq, (s, reason));
        }
        Ok(())
    }

    /// Steps until nothing is live; errors after `max_steps`.
    fn run(&mut self, max_steps: usize) -> Result<(), String> {
        for _ in 0..max_steps {
            if !self.sched.has_unfinished() {
                return Ok(());
            }
            let plan = self.step()?;
            if plan.is_empty() && plan.preempted.is_empty() {
                return Err("an empty step with live sequences (livelock)".into());
            }
        }
        Err(format!("still {} live sequences after {max_steps} steps", self.sched.seqs.len()))
    }

    /// Every finished sequence's sampled tokens follow the model.
    fn check_outputs(&self) -> Result<(), String> {
        for (seq, (s, _)) in &self.done {
            let t = s.tokens();
            for i in self.origin[seq]..t.len() {
                if t[i] != next_token(&t[..i], self.salt[seq]) {
                    return Err(format!("{seq}: token {i} is not the model's"));
                }
            }
        }
        Ok(())
    }
}

#[test]
fn chunked_prefill_splits_a_long_prompt_under_the_budget() {
    let mut sim = Sim::new(SchedulerConfig { max_model_len: 200, ..config(64, 4, 32, 4) });
    let id = sim.add((0..100).map(|i| i % 40 + 10).collect(), 3);
    let mut chunks = Vec::new();
    for _ in 0..4 {
        let plan = sim.step().unwrap();
        assert_eq!(plan.seqs.len(), 1);
        let e = &plan.seqs[0];
        assert_eq!(e.seq, id);
        chunks.push((e.start(), e.tokens.len(), e.needs_logits, e.context_len));
        assert_eq!(plan.cu_seqlens_q(), [0, e.tokens.len() as i32]);
        assert_eq!(plan.seq_lens(), [e.context_len as i32]);
    }
    assert_eq!(chunks, [(0, 32, false, 32), (32, 32, false, 64), (64, 32, false, 96), (96, 4, true, 100)]);
    // The sampled token is then decoded, one token per step.
    let plan = sim.step().unwrap();
    assert_eq!((plan.num_decodes, plan.seqs[0].start(), plan.seqs[0].tokens.len()), (1, 100, 1));
    sim.run(100).unwrap();
    sim.check_outputs().unwrap();
}

#[test]
fn decodes_go_first_then_running_prefills_then_admissions() {
    let mut sim = Sim::new(SchedulerConfig { max_model_len: 128, ..config(64, 4, 16, 4) });
    let a = sim.add(vec![1, 2, 3, 4], 50);
    let b = sim.add(vec![5, 6, 7, 8], 50);
    let plan = sim.step().unwrap();
    assert_eq!(plan.seqs.iter().map(|e| e.seq).collect::<Vec<_>>(), [a, b]);
    assert_eq!(plan.num_decodes, 0);
    let c = sim.add((0..40).collect(), 50);
    let plan = sim.step().unwrap();
    assert_eq!(plan.num_decodes, 2);
    let order: Vec<_> = plan.seqs.iter().map(|e| (e.seq, e.tokens.len())).collect();
    assert_eq!(order, [(a, 1), (b, 1), (c, 14)]);
    assert_eq!(plan.logits_indices(), [(a, 0), (b, 1)]);
    // A new request waits behind the running prefill of C.
    let d = sim.add((100..110).collect(), 50);
    let plan = sim.step().unwrap();
    let order: Vec<_> = plan.seqs.iter().map(|e| (e.seq, e.tokens.len())).collect();
    assert_eq!(order, [(a, 1), (b, 1), (c, 14)]);
    let plan = sim.step().unwrap();
    let order: Vec<_> = plan.seqs.iter().map(|e| (e.seq, e.tokens.len())).collect();
    assert_eq!(order, [(a, 1), (b, 1), (c, 12), (d, 2)]);
    assert!(plan.seqs[2].needs_logits && !plan.seqs[3].needs_logits);
    let tables = plan.block_tables(plan.max_blocks_per_seq()).unwrap();
    assert_eq!(tables.len(), 4 * plan.max_blocks_per_seq());
    assert!(plan.block_tables(0).is_err());
    sim.run(500).unwrap();
    sim.check_outputs().unwrap();
}

#[test]
fn max_num_seqs_is_respected() {
    let mut sim = Sim::new(SchedulerConfig { max_model_len: 64, ..config(64, 4, 64, 2) });
    let ids: Vec<_> = (0..5u32).map(|i| sim.add(vec![i + 1; 5], 6)).collect();
    while sim.sched.has_unfinished() {
        let plan = sim.step().unwrap();
        assert!(plan.seqs.len() <= 2 && sim.sched.running().len() <= 2);
    }
    for (i, id) in ids.iter().enumerate() {
        let want = expected(&[i as u32 + 1; 5], 0, 6, 64);
        assert_eq!(sim.done[id].0.tokens(), want);
    }
}

/// Two sequences that outgrow an 8-block pool together.
fn preemption_run(prefix_caching: bool) {
    let cfg = SchedulerConfig { enable_prefix_caching: prefix_caching, ..config(8, 4, 64, 4) };
    let mut sim = Sim::new(cfg);
    // Salted prompts avoid early EOS: pick prompts whose expected run is long.
    let prompts: Vec<Vec<u32>> = (0..200u32)
        .map(|k| vec![k + 10, 11, 12, 13, 14, 15, 16, 17])
        .filter(|p| expected(p, 0, 20, 32).len() == 28)
        .take(2)
        .collect();
    assert_eq!(prompts.len(), 2, "no prompts without an early EOS");
    let a = sim.add(prompts[0].clone(), 20);
    let b = sim.add(prompts[1].clone(), 20);
    let mut preempted_at = None;
    while sim.sched.has_unfinished() {
        let history = sim.sched.sequence(b).map(|s| s.tokens().to_vec());
        let plan = sim.step().unwrap();
        if !plan.preempted.is_empty() && preempted_at.is_none() {
            // The most recent arrival is the victim; its history is intact.
            assert_eq!(plan.preempted, [b]);
            let s = sim.sched.sequence(b).unwrap();
            assert_eq!(s.status(), SeqStatus::Preempted);
            assert_eq!(Some(s.tokens().to_vec()), history);
            assert_eq!(s.num_computed(), 0);
            assert!(!sim.sched.block_manager().has_seq(b));
            assert_eq!(sim.sched.waiting().collect::<Vec<_>>(), [b]);
            preempted_at = Some(sim.plans.len());
        }
        assert!(sim.plans.len() < 200, "no progress");
    }
    let at = preempted_at.expect("the pool never ran out");
    // B resumed: a later plan recomputes its history from a cached prefix or
    // from scratch.
    let resume = sim.plans[at..].iter().flat_map(|p| &p.seqs).find(|e| e.seq == b).unwrap();
    if !prefix_caching {
        assert_eq!(resume.start(), 0);
    }
    assert!(resume.context_len > prompts[1].len());
    assert!(sim.done[&b].0.num_preemptions() >= 1);
    assert_eq!(sim.done[&a].0.tokens(), expected(&prompts[0], 0, 20, 32));
    assert_eq!(sim.done[&b].0.tokens(), expected(&prompts[1], 0, 20, 32));
    sim.sched.check_invariants().unwrap();
    assert_eq!(sim.sched.kv_stats().used_blocks, 0);
}

#[test]
fn preemption_by_recompute_keeps_the_history() {
    preemption_run(false);
}

#[test]
fn preemption_with_prefix_caching_keeps_the_history() {
    preemption_run(true);
}

#[test]
fn a_shared_prefix_is_a_hit_in_the_next_step() {
    let mut sim = Sim::new(SchedulerConfig { max_model_len: 64, ..config(32, 4, 64, 4) });
    let shared: Vec<u32> = (20..28).collect();
    sim.add([shared.clone(), vec![1, 2, 3]].concat(), 10);
    let first = sim.step().unwrap();
    let ta = first.seqs[0].block_table[..2].to_vec();
    let b = sim.add([shared, vec![4, 5, 6, 9, 9]].concat(), 10);
    let plan = sim.step().unwrap();
    let e = plan.seqs.iter().find(|e| e.seq == b).unwrap();
    assert_eq!((e.start(), e.tokens.as_slice()), (8, [4, 5, 6, 9, 9].as_slice()));
    assert_eq!(e.block_table[..2], ta);
    let s = sim.sched.kv_stats();
    assert_eq!((s.prefix_hit_tokens, s.prefix_query_tokens), (8, 11 + 13));
    sim.run(100).unwrap();
    sim.check_outputs().unwrap();
}

#[test]
fn fork_shares_blocks_and_copies_on_write() {
    let mut sim = Sim::new(SchedulerConfig { max_model_len: 64, ..config(32, 4, 64, 4) });
    let a = sim.add(vec![30, 31, 32, 33, 34, 35], 5);
    let plan = sim.sched.schedule().unwrap();
    assert!(plan.seqs[0].needs_logits);
    // n = 2 sampling: fork after the prompt's logits, one sample each.
    let c = sim.sched.fork(a).unwrap();
    assert_eq!(sim.sched.block_manager().block_table(c), sim.sched.block_manager().block_table(a));
    // Fill the cache for the prompt as the engine would have.
    for (p, &slot) in plan.seqs[0].slots.iter().enumerate() {
        sim.cache[slot as usize] = Some(fingerprint(&[30, 31, 32, 33, 34, 35][..=p]));
    }
    sim.salt.insert(c, 99);
    sim.origin.insert(c, 6);
    sim.max_tokens.insert(c, 5);
    sim.sample_one(a).unwrap();
    sim.sample_one(c).unwrap();
    // Neither first sample is EOS for this prompt and these salts.
    assert!(sim.sched.sequence(a).is_some() && sim.sched.sequence(c).is_some());
    let plan = sim.step().unwrap();
    assert_eq!(plan.num_decodes, 2);
    assert_eq!(plan.copies.len(), 1, "the shared partial block is copied once");
    assert_ne!(plan.seqs[0].slots, plan.seqs[1].slots);
    assert_eq!(sim.sched.kv_stats().cow_copies, 1);
    sim.run(100).unwrap();
    sim.check_outputs().unwrap();
}

#[test]
fn lengths_beyond_the_pool_are_errors_not_livelocks() {
    let err = Scheduler::new(SchedulerConfig { max_model_len: 100, ..config(10, 4, 64, 4) }).unwrap_err();
    assert!(matches!(err, KvError::Config(_)) && err.to_string().contains("lower max_model_len"), "{err}");
    let mut sched = Scheduler::new(config(10, 4, 64, 4)).unwrap();
    let err = sched.add_request(vec![1; 41]).unwrap_err();
    assert!(matches!(err, KvError::TooLong { tokens: 41, max_model_len: 40, .. }), "{err}");
    assert_eq!(sched.add_request(vec![]), Err(KvError::EmptyPrompt));
    // A prompt of exactly max_model_len runs, then cannot grow.
    let id = sched.add_request(vec![1; 40]).unwrap();
    let plan = sched.schedule().unwrap();
    assert!(plan.seqs[0].needs_logits);
    assert!(matches!(sched.append_token(id, 2), Err(KvError::TooLong { .. })));
    sched.finish(id, FinishReason::MaxModelLen).unwrap();
    sched.check_invariants().unwrap();
}

#[test]
fn invalid_configs_and_calls_are_errors() {
    assert!(Scheduler::new(config(10, 4, 3, 4)).is_err(), "budget below max_num_seqs");
    assert!(Scheduler::new(SchedulerConfig { max_num_seqs: 0, ..config(10, 4, 8, 4) }).is_err());
    let mut sched = Scheduler::new(config(10, 4, 8, 4)).unwrap();
    let id = sched.add_request(vec![1, 2, 3]).unwrap();
    assert!(matches!(sched.append_token(id, 5), Err(KvError::InvalidState { .. })));
    assert_eq!(sched.append_token(SeqId(9), 5), Err(KvError::UnknownSeq(SeqId(9))));
    assert!(sched.finish(SeqId(9), FinishReason::Aborted).is_err());
    // A chunk that leaves tokens to compute asks for no token.
    sched.add_request(vec![4; 20]).unwrap();
    let plan = sched.schedule().unwrap();
    assert_eq!(plan.num_tokens(), 8);
    let long = plan.seqs[1].seq;
    assert!(!plan.seqs[1].needs_logits);
    assert!(matches!(sched.append_token(long, 5), Err(KvError::InvalidState { .. })));
}

#[test]
fn aborts_free_blocks_and_are_reported() {
    let mut sched = Scheduler::new(config(16, 4, 64, 4)).unwrap();
    let running = sched.add_request(vec![1; 9]).unwrap();
    sched.schedule().unwrap();
    let waiting = sched.add_request(vec![2; 5]).unwrap();
    let s = sched.finish(running, FinishReason::Aborted).unwrap();
    assert_eq!(s.status(), SeqStatus::Finished(FinishReason::Aborted));
    sched.finish(waiting, FinishReason::Aborted).unwrap();
    assert_eq!(sched.kv_stats().used_blocks, 0);
    assert_eq!(sched.kv_stats().cached_blocks, 2, "the computed full blocks stay cached");
    let plan = sched.schedule().unwrap();
    assert!(plan.is_empty());
    assert_eq!(plan.finished, [(running, FinishReason::Aborted), (waiting, FinishReason::Aborted)]);
    assert!(sched.schedule().unwrap().finished.is_empty());
    assert!(!sched.has_unfinished());
    sched.check_invariants().unwrap();
}

/// Requests with shared prefixes, for the batch comparison.
fn workload(n: usize) -> Vec<(Vec<u32>, usize)> {
    (0..n)
        .map(|i| {
            let shared = (i % 3) as u32 * 100;
            let mut p: Vec<u32> = (shared..shared + 9).collect();
            p.extend((0..(i * 7) % 13).map(|k| (i * 31 + k) as u32 % 90));
            (p, 5 + (i * 11) % 17)
        })
        .collect()
}

/// Runs a workload; returns each request's final history.
fn outputs(cfg: SchedulerConfig, work: &[(Vec<u32>, usize)]) -> (Vec<Vec<u32>>, u32) {
    let mut sim = Sim::new(cfg);
    let ids: Vec<_> = work.iter().map(|(p, m)| sim.add(p.clone(), *m)).collect();
    sim.run(10_000).unwrap();
    sim.check_outputs().unwrap();
    let preemptions = sim.done.values().map(|(s, _)| s.num_preemptions()).sum();
    (ids.iter().map(|id| sim.done[id].0.tokens().to_vec()).collect(), preemptions)
}

#[test]
fn greedy_outputs_match_at_batch_1_and_batch_8() {
    let work = workload(12);
    let (one, _) = outputs(SchedulerConfig { max_model_len: 48, ..config(64, 4, 64, 1) }, &work);
    // Batch 8 in a pool that forces preemptions, chunked prefill by a small budget.
    let (eight, preemptions) = outputs(SchedulerConfig { max_model_len: 48, ..config(14, 4, 12, 8) }, &work);
    for (i, (p, m)) in work.iter().enumerate() {
        assert_eq!(one[i], expected(p, 0, *m, 48), "request {i} at batch 1");
    }
    assert_eq!(one, eight);
    assert!(preemptions > 0, "the small pool should force preemptions");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random pools, budgets and workloads with forks and aborts: every step
    /// keeps the invariants and reads correct KV, everything finishes (no
    /// livelock), and every sampled token follows the model.
    #[test]
    fn random_workloads_finish_correctly(
        block_size in 1usize..6,
        extra_blocks in 0usize..12,
        max_num_seqs in 1usize..6,
        budget_extra in 0usize..20,
        prefix_caching in any::<bool>(),
        fork_per_mille in prop_oneof![Just(0u64), 1u64..300],
        seed in any::<u64>(),
        requests in prop::collection::vec((0usize..3, 0usize..12, 1usize..12, 0usize..6), 1..10),
    ) {
        let max_model_len = 24usize;
        let num_blocks = max_model_len.div_ceil(block_size) + extra_blocks;
        let cfg = SchedulerConfig {
            max_num_batched_tokens: max_num_seqs + budget_extra,
            max_num_seqs,
            max_model_len,
            num_blocks,
            block_size,
            enable_prefix_caching: prefix_caching,
        };
        let mut sim = Sim::new(cfg);
        sim.fork_per_mille = fork_per_mille;
        sim.rng |= seed | 1;
        let mut pending: Vec<_> = requests.into_iter().collect();
        let mut steps = 0;
        while sim.sched.has_unfinished() || !pending.is_empty() {
            // Requests arrive over time.
            if let Some((base, len, max_tokens, delay)) = pending.first().copied()
                && delay <= steps % 6
            {
                pending.remove(0);
                let mut p: Vec<u32> = (0..8u32).map(|k| k + 10 * base as u32).collect();
                p.extend((0..len as u32).map(|k| (k * 7 + seed as u32) % 40 + 10));
                sim.add(p, max_tokens);
            }
            // Occasionally abort a live sequence.
            if sim.rand().is_multiple_of(50) {
                let live: Vec<_> = sim.sched.seqs.keys().copied().collect();
                if !live.is_empty() {
                    let victim = live[(sim.rand() % live.len() as u64) as usize];
                    sim.sched.finish(victim, FinishReason::Aborted).unwrap();
                }
            }
            sim.step().map_err(|e| TestCaseError::fail(format!("step {steps}: {e}")))?;
            steps += 1;
            prop_assert!(steps < 3000, "no progress after 3000 steps");
        }
        sim.check_outputs().map_err(TestCaseError::fail)?;
        sim.sched.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(sim.sched.kv_stats().used_blocks, 0);
    }
}
