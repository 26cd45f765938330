//! The engine thread: the only code that touches the [`Engine`] and its
//! device while the server runs.
//!
//! ```text
//! HTTP tasks --Command (bounded sync_channel)--> engine thread
//!     Add(Submit)   engine.add; the request's slot permit moves in with it
//!     Abort         engine.abort (client gone, or a stop string found: then
//!                   counted as a `stop` finish)
//!     AbortAll      shutdown deadline: every live request ends as aborted
//!     Shutdown      leave the loop
//! engine thread --Event (one unbounded channel per request)--> its HTTP task
//!     Token         one per sampled token, the last one carries the finish
//!     Failed        the engine refused the request or a step failed
//! ```
//!
//! The loop blocks on the command channel while the engine is idle;
//! otherwise it drains pending commands, runs one step, sends the step's
//! events and publishes the engine's gauges to [`Metrics`].
//!
//! Invariants: the loop never blocks on an HTTP task (events go through
//! unbounded channels whose length is bounded by the request's
//! `max_tokens`); a request whose event receiver is gone is aborted before
//! the next step, so its KV blocks are freed even if no `Abort` arrives; every
//! admitted request holds one permit of the admission semaphore until the
//! engine is done with it, so at most `max_concurrent` requests exist, and
//! the command channel (two messages per request) cannot overflow; the
//! engine's completions are drained every step (no growth).

use super::metrics::{Metrics, Outcome, Values};
use crate::engine::{Engine, Event as EngineEvent, Request};
use crate::error::Result;
use crate::kv::SeqId;
use crate::model::ActElem;
use crate::model::Device;
use crate::scheduler::FinishReason;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::UnboundedSender;

/// A request for the engine.
#[derive(Debug)]
pub struct Submit {
    /// The server's id of this engine request.
    pub id: u64,
    /// The engine request.
    pub request: Request,
    /// Alternatives to report per token (0: none; computed from the step's
    /// logits only when non-zero).
    pub top_logprobs: usize,
    /// When the HTTP request arrived (for TTFT and end-to-end latency).
    pub arrival: Instant,
    /// Where this request's events go.
    pub events: UnboundedSender<Event>,
    /// The admission slot, released when the engine is done with the request.
    pub permit: OwnedSemaphorePermit,
}

/// A command to the engine thread.
#[derive(Debug)]
pub enum Command {
    /// Start a request.
    Add(Box<Submit>),
    /// Abort a request (unknown or finished ids are ignored).
    Abort {
        /// The request.
        id: u64,
        /// How to count it: [`Outcome::Abort`], or [`Outcome::Stop`] when
        /// the HTTP side found a stop string.
        outcome: Outcome,
    },
    /// Abort every live request, telling each one it was aborted.
    AbortAll,
    /// Leave the loop (live requests are aborted first).
    Shutdown,
}

/// What the engine thread tells a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sampled token.
    Token {
        /// The token (`None` when a stop token ended the request).
        token: Option<u32>,
        /// Its log-probability.
        logprob: f32,
        /// The most likely alternatives `(token, logprob)`, best first (empty
        /// unless asked for).
        top: Vec<(u32, f32)>,
        /// Set on the request's last event.
        finish: Option<FinishReason>,
    },
    /// The request failed (the message says why); no more events follow.
    Failed(String),
}

/// Engine-thread state of a live request.
struct Live {
    seq: SeqId,
    events: UnboundedSender<Event>,
    top: usize,
    arrival: Instant,
    last: Option<Instant>,
    _permit: OwnedSemaphorePermit,
}

/// The loop's bookkeeping.
#[derive(Default)]
struct Worker {
    live: HashMap<u64, Live>,
    by_seq: HashMap<SeqId, u64>,
    /// Requests whose event receiver is gone, aborted after the pending
    /// commands are read (an `Abort` among them says how to count them).
    dead: Vec<u64>,
}

/// The outcome label of an engine finish reason.
pub fn outcome(reason: FinishReason) -> Outcome {
    match reason {
        FinishReason::Eos | FinishReason::StopToken(_) | FinishReason::Grammar => Outcome::Stop,
        FinishReason::MaxTokens | FinishReason::MaxModelLen => Outcome::Length,
        FinishReason::Aborted => Outcome::Abort,
    }
}

/// Runs the engine loop until a [`Command::Shutdown`] arrives or every
/// sender is gone; see the module doc.
pub fn run<D: Device, T: ActElem>(
    dev: &mut D,
    engine: &mut Engine<D, T>,
    commands: &Receiver<Command>,
    metrics: &Metrics,
) -> Result<()> {
    let mut w = Worker::default();
    w.publish(engine, metrics);
    'outer: loop {
        if !engine.has_unfinished() {
            w.publish(engine, metrics);
            match commands.recv() {
                Ok(cmd) => {
                    if !w.handle(engine, metrics, cmd) {
                        break 'outer;
                    }
                }
                Err(_) => break 'outer,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(cmd) => {
                    if !w.handle(engine, metrics, cmd) {
                        break 'outer;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => break 'outer,
            }
        }
        w.reap(engine, metrics);
        if !engine.has_unfinished() {
            continue;
        }
        match engine.step(dev) {
            Ok(events) => {
                // Gauges first, so that a client that sees its last token
                // also sees its blocks freed.
                w.publish(engine, metrics);
                w.dispatch(dev, engine, metrics, &events);
            }
            Err(e) => {
                eprintln!("tessera: engine step failed: {e}");
                w.fail_all(engine, metrics, &format!("the engine failed: {e}"));
            }
        }
        engine.take_completions();
        w.publish(engine, metrics);
    }
    w.abort_all(engine, metrics, true);
    engine.take_completions();
    w.publish(engine, metrics);
    Ok(())
}

impl Worker {
    /// Handles one command; `false` means leave the loop.
    fn handle<D: Device, T: ActElem>(
        &mut self,
        engine: &mut Engine<D, T>,
        metrics: &Metrics,
        cmd: Command,
    ) -> bool {
        match cmd {
            Command::Add(s) => {
                let Submit { id, request, top_logprobs, arrival, events, permit } = *s;
                let prompt_len = request.prompt.len() as u64;
                match engine.add(request) {
                    Ok(seq) => {
                        metrics.update(|v| v.prompt_tokens += prompt_len);
                        self.by_seq.insert(seq, id);
                        let live =
                            Live { seq, events, top: top_logprobs, arrival, last: None, _permit: permit };
                        self.live.insert(id, live);
                    }
                    Err(e) => {
                        let _ = events.send(Event::Failed(e.to_string()));
                        metrics.update(|v| v.finished[Outcome::Error.index()] += 1);
                    }
                }
                true
            }
            Command::Abort { id, outcome } => {
                if let Some(live) = self.live.remove(&id) {
                    self.by_seq.remove(&live.seq);
                    let _ = engine.abort(live.seq);
                    metrics.update(|v| {
                        v.finished[outcome.index()] += 1;
                        if outcome != Outcome::Abort {
                            v.e2e.observe(live.arrival.elapsed().as_secs_f64());
                        }
                    });
                }
                true
            }
            Command::AbortAll => {
                self.abort_all(engine, metrics, true);
                true
            }
            Command::Shutdown => false,
        }
    }

    /// Sends one step's events to their requests and retires finished ones.
    fn dispatch<D: Device, T: ActElem>(
        &mut self,
        dev: &mut D,
        engine: &mut Engine<D, T>,
        metrics: &Metrics,
        events: &[EngineEvent],
    ) {
        let vocab = engine.model().weights.config.vocab_size;
        let wants_top = events.iter().any(|e| self.get(e.seq).is_some_and(|l| l.top > 0));
        // The sampler's logits stay on the device; they are read only when a
        // request of this step asked for alternatives. Row i is event i's.
        let logits = if wants_top {
            match engine.model().last_logits(dev) {
                Ok(l) if l.len() == events.len() * vocab => Some(l),
                Ok(l) => {
                    eprintln!(
                        "tessera: top logprobs skipped: {} logit values for {} events of a {vocab}-token vocabulary",
                        l.len(),
                        events.len()
                    );
                    None
                }
                Err(e) => {
                    eprintln!("tessera: top logprobs skipped: {e}");
                    None
                }
            }
        } else {
            None
        };
        metrics.update(|v| {
            for (i, e) in events.iter().enumerate() {
                let Some(&id) = self.by_seq.get(&e.seq) else { continue };
                let Some(live) = self.live.get_mut(&id) else { continue };
                let now = Instant::now();
                match live.last {
                    None => v.ttft.observe((now - live.arrival).as_secs_f64()),
                    Some(t) => v.itl.observe((now - t).as_secs_f64()),
                }
                live.last = Some(now);
                if e.token.is_some() {
                    v.generation_tokens += 1;
                }
                let top = match &logits {
                    Some(l) if live.top > 0 => top_logprobs(&l[i * vocab..(i + 1) * vocab], live.top),
                    _ => Vec::new(),
                };
                let event = Event::Token { token: e.token, logprob: e.logprob, top, finish: e.finish };
                let delivered = live.events.send(event).is_ok();
                match e.finish {
                    Some(reason) => {
                        let o = outcome(reason);
                        v.finished[o.index()] += 1;
                        if o != Outcome::Abort {
                            v.e2e.observe((now - live.arrival).as_secs_f64());
                        }
                        self.by_seq.remove(&e.seq);
                        self.live.remove(&id);
                    }
                    // The HTTP side is gone (client disconnected, or a stop
                    // string ended the choice): abort before the next step.
                    None if !delivered => self.dead.push(id),
                    None => {}
                }
            }
        });
    }

    /// Aborts the requests found dead that no command has ended since.
    fn reap<D: Device, T: ActElem>(&mut self, engine: &mut Engine<D, T>, metrics: &Metrics) {
        for id in std::mem::take(&mut self.dead) {
            if let Some(live) = self.live.remove(&id) {
                self.by_seq.remove(&live.seq);
                let _ = engine.abort(live.seq);
                metrics.update(|v| v.finished[Outcome::Abort.index()] += 1);
            }
        }
    }

    fn get(&self, seq: SeqId) -> Option<&Live> {
        self.by_seq.get(&seq).and_then(|id| self.live.get(id))
    }

    /// Ends every live request with `Failed(message)` after a failed step.
    fn fail_all<D: Device, T: ActElem>(
        &mut self,
        engine: &mut Engine<D, T>,
        metrics: &Metrics,
        message: &str,
    ) {
        for (_, live) in self.live.drain() {
            let _ = engine.abort(live.seq);
            let _ = live.events.send(Event::Failed(message.to_string()));
            metrics.update(|v| v.finished[Outcome::Error.index()] += 1);
        }
        self.by_seq.clear();
    }

    /// Aborts every live request; with `tell`, each gets a last `Aborted` event.
    fn abort_all<D: Device, T: ActElem>(&mut self, engine: &mut Engine<D, T>, metrics: &Metrics, tell: bool) {
        for (_, live) in self.live.drain() {
            let _ = engine.abort(live.seq);
            if tell {
                let last = Event::Token {
                    token: None,
                    logprob: 0.0,
                    top: Vec::new(),
                    finish: Some(FinishReason::Aborted),
                };
                let _ = live.events.send(last);
            }
            metrics.update(|v| v.finished[Outcome::Abort.index()] += 1);
        }
        self.by_seq.clear();
    }

    /// Copies the scheduler's and the KV pool's state into the metrics.
    fn publish<D: Device, T: ActElem>(&self, engine: &Engine<D, T>, metrics: &Metrics) {
        let kv = engine.scheduler().kv_stats();
        let running = engine.scheduler().running().len();
        let waiting = engine.scheduler().waiting().count();
        let preemptions = engine.stats().preemptions;
        metrics.update(|v: &mut Values| {
            v.running = running;
            v.waiting = waiting;
            v.kv_used = kv.used_blocks;
            v.kv_total = kv.total_blocks;
            v.prefix_queries = kv.prefix_query_tokens;
            v.prefix_hits = kv.prefix_hit_tokens;
            v.preemptions = preemptions;
        });
    }
}

/// The `k` most likely tokens of one logit row and their log-probabilities
/// (log-softmax of the row), best first; ties go to the lower id.
pub fn top_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(row.len());
    if k == 0 {
        return Vec::new();
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64 + row.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln();
    let better = |a: &u32, b: &u32| {
        let (x, y) = (row[*a as usize], row[*b as usize]);
        y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    if k < ids.len() {
        ids.select_nth_unstable_by(k - 1, better);
        ids.truncate(k);
    }
    ids.sort_by(better);
    ids.into_iter().map(|i| (i, (row[i as usize] as f64 - lse) as f32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logprobs_are_the_best_k_of_the_log_softmax() {
        let row = [0.0f32, 2.0, 1.0, 2.0, -1.0];
        let top = top_logprobs(&row, 3);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        for (id, lp) in top {
            assert!((lp as f64 - (row[id as usize] as f64 - lse)).abs() < 1e-6);
        }
        assert_eq!(top_logprobs(&row, 0), []);
        assert_eq!(top_logprobs(&row, 9).len(), 5);
    }
}
