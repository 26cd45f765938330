//! CUDA graphs for decode steps: one graph per batch-size bucket (1, 2, 4,
//! ..., 64 sequences, see [`super::inputs::BUCKETS`]), captured lazily on
//! first use and replayed afterwards.
//!
//! A decode step of `B` sequences (one query token each, logit rows `0..B`
//! in order) is padded to its bucket `P >= B`: padding rows read token 0 at
//! position 0 with a context of 1, write no cache slot and sample greedily;
//! their outputs are ignored. The step's inputs (tokens, positions, slots,
//! context lengths, block tables, sampling settings) are staged on the host
//! and copied with one asynchronous write into a fixed arena; penalty counts
//! (when a row uses them) are rebuilt by eager launches into fixed count
//! buffers; then the graph replays the forward pass and the sampler, and the
//! sampled ids are read back (the step's only synchronization).
//!
//! What a graph bakes in, and how replays stay correct:
//! - buffer addresses: every buffer a graph points to (the input arena,
//!   activations, sampling buffers, counts, weights, KV cache) is allocated
//!   once, at its final size, and never moves ([`Buffers::fixed`]);
//! - sizes and grids: the bucket `P` is part of the key;
//! - the block-table stride: fixed for all graphs (`max_pages` entries per
//!   row, enough for the model's context length, at most [`MAX_GRAPH_PAGES`]);
//!   steps with a longer context run eagerly;
//! - the decode split plan (split length and count, grid and scalar
//!   arguments): computed from the bucket and the step's longest context
//!   rounded up to a power of two, and part of the key, so a graph is only
//!   replayed for steps whose contexts fit its splits;
//! - whether the penalties kernel runs: part of the key (penalty-free
//!   batches replay a graph without it);
//! - everything else (per-row settings, lengths, positions, tables) is data.
//!
//! The first step of a key runs its launches directly on the graph buffers
//! (warming up every kernel: a capture must not compile or allocate), its
//! results are read, and only then is the same launch sequence captured.
//! [`GraphMode::Padded`] runs every bucket step that way and never captures:
//! the exact launches a graph replays, for checking graphs against.

use super::buffers::Buffers;
use super::device::Device;
use super::forward::{DECODE_BLOCK_N, Launcher, Model, Plan, Step, decode_split, usage};
use super::inputs::{
    BUCKETS, Layout, PaddedDecode, Stager, StepArrays, bucket_for, stage_sampling, stage_step, uses_penalties,
};
use super::layers::launch_forward;
use super::sampler::{
    HostTimes, Masker, SampleRow, Sampled, build_counts, launch_sampling, read_sampled, upload_masks,
};
use crate::error::Result;
use crate::model::ActElem;
use std::collections::HashMap;

/// The most block-table entries per row of a graph (longer contexts run eagerly).
pub const MAX_GRAPH_PAGES: usize = 1024;

/// How the decode steps of [`Model::forward_sample`] run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GraphMode {
    /// Every step runs its own launches directly, unpadded.
    Off,
    /// Decode steps are padded to their bucket and run directly on the graph
    /// buffers: the launches a graph would replay, without capturing (for
    /// checking graphs; works on every device).
    Padded,
    /// Decode steps are padded to their bucket and replayed from a CUDA
    /// graph captured on first use. On a device without graphs (the
    /// interpreter) this acts as [`GraphMode::Off`].
    #[default]
    Graphs,
}

impl GraphMode {
    /// The environment variable that sets the mode of new models:
    /// `off`/`0`, `padded`, or `on`/`1` (the default).
    pub const ENV: &'static str = "TESSERA_CUDA_GRAPHS";

    /// Parses a mode name (see [`GraphMode::ENV`]).
    pub fn parse(s: &str) -> Option<GraphMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Some(GraphMode::Off),
            "padded" => Some(GraphMode::Padded),
            "on" | "1" | "true" | "yes" | "graphs" => Some(GraphMode::Graphs),
            _ => None,
        }
    }

    /// The mode [`GraphMode::ENV`] asks for, or the default; an unknown value
    /// is reported on stderr and ignored.
    pub fn from_env() -> GraphMode {
        match std::env::var(Self::ENV) {
            Ok(v) => GraphMode::parse(&v).unwrap_or_else(|| {
                eprintln!("warning: {}={v:?} is not off, padded or on; using on", Self::ENV);
                GraphMode::default()
            }),
            Err(_) => GraphMode::default(),
        }
    }
}

/// What selects a graph (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Padded batch size.
    pub bucket: usize,
    /// Decode split length in tokens.
    pub split_len: usize,
    /// Decode splits.
    pub splits: usize,
    /// Whether the penalties kernel runs.
    pub penalties: bool,
    /// Whether the step has grammar masks: the graph then holds the forward
    /// pass only, and the mask and the sampler run after it, outside the
    /// graph (the masks are computed on the host while the graph runs).
    pub masked: bool,
    /// Entries per block-table row in the step's inputs: the pages of the
    /// context class (see `graph_step`), so the host stages and copies the
    /// rows' pages in use rather than whole rows of the longest context.
    pub pages: usize,
    /// Whether the step runs as the persistent kernel (a step of the same
    /// shape whose rows share a sequence does not).
    pub mega: bool,
    /// Whether the persistent kernel samples the rows itself (see
    /// [`super::mega::samples_in_step`]): no sampler launch in the graph.
    pub sample: bool,
}

/// The decode graphs of a model and the fixed buffers they point to.
pub(super) struct GraphState<D: Device, T: ActElem> {
    pub bufs: Buffers<D, T>,
    pub layout: Layout,
    pub graphs: HashMap<GraphKey, D::Graph>,
}

/// Block-table entries per row of the graphs of a model: its context length
/// in pages, at most the cache and [`MAX_GRAPH_PAGES`].
fn graph_pages(context_length: usize, num_blocks: usize, block_size: usize) -> usize {
    context_length.div_ceil(block_size).min(num_blocks).clamp(1, MAX_GRAPH_PAGES)
}

/// The context class of a step whose longest context is `max_ctx`: the next
/// power of two (at least one decode chunk).
fn ctx_class(max_ctx: usize) -> usize {
    max_ctx.max(1).next_power_of_two().max(DECODE_BLOCK_N)
}

impl<D: Device, T: ActElem> Model<D, T> {
    /// Sets how decode steps run (see [`GraphMode`]; new models take
    /// [`GraphMode::from_env`], [`GraphMode::Graphs`] unless
    /// `TESSERA_CUDA_GRAPHS` says otherwise). Captured graphs are kept.
    pub fn set_graph_mode(&mut self, mode: GraphMode) {
        self.graph_mode = mode;
    }

    /// How decode steps run.
    pub fn graph_mode(&self) -> GraphMode {
        self.graph_mode
    }

    /// The keys of the graphs captured so far.
    pub fn graph_keys(&self) -> Vec<GraphKey> {
        let mut keys: Vec<GraphKey> =
            self.graphs.as_ref().map(|g| g.graphs.keys().copied().collect()).unwrap_or_default();
        keys.sort_by_key(|k| (k.bucket, k.split_len, k.splits, k.penalties));
        keys
    }

    /// Why graphs were turned off, when a capture failed (the mode is then
    /// [`GraphMode::Off`]; the step whose capture failed still returned its
    /// results from the direct run).
    pub fn graph_failure(&self) -> Option<&str> {
        self.graph_failure.as_deref()
    }

    /// Drops every captured graph (the next decode step of each key captures
    /// again).
    pub fn clear_graphs(&mut self) {
        if let Some(g) = self.graphs.as_mut() {
            g.graphs.clear();
        }
    }

    /// The graph buffers, allocated at their final sizes on first use.
    fn graph_state(&mut self, dev: &mut D) -> Result<&mut GraphState<D, T>> {
        if self.graphs.is_none() {
            let c = &self.weights.config;
            let max = BUCKETS[BUCKETS.len() - 1];
            let max_pages = graph_pages(c.context_length, self.kv.num_blocks, self.kv.block_size);
            let layout = Layout::new(max, max, max_pages, Some(max));
            // Split-KV partials, and the persistent step's key-block
            // partials at every bucket it can take (whichever decode path
            // later steps take: the buffers are fixed): the most any
            // bucket and context class needs.
            let top = ctx_class(max_pages * self.kv.block_size);
            let sms = dev.sm_count();
            let mut parts = 0;
            for &bucket in &BUCKETS {
                if self.invariant && bucket <= kernels::decode_step::MAX_ROWS {
                    parts = parts.max(super::forward::mega_parts(bucket, c, max_pages * self.kv.block_size));
                }
                let mut class = DECODE_BLOCK_N;
                while class <= top {
                    let (_, splits) =
                        decode_split(bucket, c.n_head_kv, class, sms, self.split_override, self.invariant);
                    if splits > 1 {
                        parts = parts.max(bucket * c.n_head * splits);
                    }
                    class *= 2;
                }
            }
            let mut bufs = Buffers::new();
            bufs.fixed = true;
            bufs.ensure_arena(dev, layout.len)?;
            bufs.ensure_scratch(dev, c, max, max, parts)?;
            bufs.ensure_sample(dev, c.vocab_size, max)?;
            self.graphs = Some(GraphState { bufs, layout, graphs: HashMap::new() });
        }
        self.graphs.as_mut().ok_or_else(|| usage("internal error: no graph state".into()))
    }

    /// Runs `step` as a padded bucket step when it is one and the mode
    /// allows; `None` when it must run eagerly. `step` and `rows` are
    /// validated.
    pub(super) fn graph_step(
        &mut self,
        dev: &mut D,
        step: &Step<'_>,
        rows: &[SampleRow<'_>],
        masker: &mut Option<Masker<'_>>,
        start: std::time::Instant,
    ) -> Result<Option<Vec<Sampled>>> {
        let capture = match self.graph_mode {
            GraphMode::Off => return Ok(None),
            GraphMode::Padded => false,
            // A profile times each launch: no capture, no replay.
            GraphMode::Graphs if self.profile.is_some() => false,
            GraphMode::Graphs if dev.supports_graphs() => true,
            GraphMode::Graphs => return Ok(None),
        };
        let b = step.context_lens.len();
        let decode = step.tokens.len() == b && step.logit_rows.iter().enumerate().all(|(i, &r)| r == i);
        let Some(bucket) = bucket_for(b).filter(|_| decode && step.logit_rows.len() == b) else {
            return Ok(None);
        };
        let c = &self.weights.config;
        let (vocab, nkv) = (c.vocab_size, c.n_head_kv);
        let max_ctx = step.context_lens.iter().copied().max().unwrap_or(1).max(1) as usize;
        let block_size = self.kv.block_size;
        let max_pages = graph_pages(c.context_length, self.kv.num_blocks, block_size);
        if max_ctx > max_pages * block_size {
            return Ok(None);
        }
        // Block-table rows as long as the context class needs: every
        // kernel reads a row's pages below its context only.
        let pages = ctx_class(max_ctx).div_ceil(block_size).min(max_pages);
        let (split_len, splits) = decode_split(
            bucket,
            nkv,
            ctx_class(max_ctx),
            dev.sm_count(),
            self.split_override,
            self.invariant,
        );
        let penalties = rows.iter().any(uses_penalties);
        let masked = masker.is_some();
        let mega = super::forward::runs_persistent(self.invariant, bucket, self.mega_rows(), step);
        // (The padding rows sample greedily.)
        let sample = super::mega::samples_in_step(mega, penalties, masked, rows);
        let key = GraphKey { bucket, split_len, splits, penalties, masked, pages, mega, sample };
        let parts = if splits > 1 { bucket * c.n_head * splits } else { 0 };
        let plan = Plan {
            n: bucket,
            b: bucket,
            max_q: 1,
            split_len,
            splits,
            runs: vec![(0, 0, bucket)],
            rows: bucket,
            invariant: self.invariant,
            mega,
            sample,
            max_ctx,
            ctx_tokens: step.context_lens.iter().map(|&c| c.max(0) as usize).sum(),
            attended: step.context_lens.iter().map(|&c| c.max(0) as usize).sum(),
        };
        self.mega_steps += usize::from(plan.mega);
        self.mega_sampled += usize::from(plan.sample);

        // Stage the padded step and its settings, one copy.
        let padded =
            PaddedDecode::new(step.tokens, step.positions, step.slot_mapping, step.context_lens, bucket);
        self.graph_state(dev)?;
        let Model {
            weights,
            kv,
            graphs,
            staging,
            pen_arena,
            pen_staging,
            profile,
            mask_bufs,
            last_mask_time,
            last_host_times,
            ..
        } = self;
        let gs = graphs.as_mut().ok_or_else(|| usage("internal error: no graph state".into()))?;
        if gs.bufs.scratch.as_ref().is_none_or(|s| s.parts < parts) {
            return Err(usage(format!(
                "internal error: the graph buffers hold too few split partials for {key:?}"
            )));
        }
        // The arena's block tables come last: a shorter stride uses a prefix
        // of their region and leaves every other array where it is.
        let lay = Layout { bt_stride: pages.min(gs.layout.bt_stride), ..gs.layout };
        let sl = lay.sampling.ok_or_else(|| usage("internal error: no sampling layout".into()))?;
        let mut st = Stager::new(staging, lay.copy_len(bucket));
        let arrays = StepArrays {
            tokens: &padded.tokens,
            positions: &padded.positions,
            slots: &padded.slots,
            ctx: &padded.ctx,
            cu: &padded.cu,
            tables: step.block_tables,
            src_stride: step.max_blocks_per_seq,
        };
        stage_step(&mut st, &lay, &arrays);
        stage_sampling(&mut st, &sl, rows, bucket - b);
        let arena = &gs.bufs.arena.as_ref().ok_or_else(|| usage("internal error: no graph arena".into()))?.0;
        dev.write(arena, st.bytes())?;
        if penalties {
            // Allocated once, at the full size (graphs point to them).
            gs.bufs.ensure_counts(dev, vocab, BUCKETS[BUCKETS.len() - 1])?;
        }

        let staged = std::time::Instant::now();
        let ln = &mut Launcher { dev, profile };
        if let Some(counts) = gs.bufs.counts.as_ref().filter(|_| penalties) {
            build_counts(ln, pen_arena, pen_staging, counts, rows, vocab)?;
        }
        // The graph's launches: the forward pass, and the sampler too unless
        // the step is masked (then the sampler runs after the masks, below)
        // or the persistent kernel samples the rows itself.
        let record = |ln: &mut Launcher<'_, D>| -> Result<()> {
            launch_forward(ln, weights, kv, &gs.bufs, &lay, &plan)?;
            if masked || plan.sample {
                Ok(())
            } else {
                launch_sampling(ln, vocab, &gs.bufs, &sl, bucket, penalties, None)
            }
        };
        // The end of a step run directly (after `record` or a replay): on a
        // masked step the host computes the masks while the device runs the
        // forward pass launched before, and the mask kernel and the sampler
        // follow it; then the sampled rows are read back.
        let mut finish = |ln: &mut Launcher<'_, D>| -> Result<_> {
            if masked {
                let t = std::time::Instant::now();
                let m = masker.as_mut().map(|f| f()).transpose()?;
                *last_mask_time = t.elapsed();
                let dm = upload_masks(ln.dev, mask_bufs, m.as_ref(), b, vocab)?;
                launch_sampling(ln, vocab, &gs.bufs, &sl, bucket, penalties, dm.as_ref())?;
            }
            read_sampled(ln.dev, &gs.bufs, bucket, b)
        };
        // The phases of a step run without a capture (a capture's step
        // records none: it runs twice).
        let phases = |launched: std::time::Instant| HostTimes {
            prepare: staged - start,
            launch: launched - staged,
            wait: launched.elapsed(),
        };
        if let Some(g) = gs.graphs.get(&key).filter(|_| ln.profile.is_none()) {
            ln.dev.replay(g)?;
        } else {
            record(ln)?;
            if capture {
                // Finish this step's direct run before capturing (a capture
                // runs nothing).
                let out = finish(ln)?;
                let captured = ln.dev.begin_capture().and_then(|()| {
                    let recorded = record(ln);
                    let graph = ln.dev.end_capture();
                    recorded.and(graph)
                });
                match captured {
                    Ok(g) => {
                        gs.graphs.insert(key, g);
                    }
                    Err(e) => {
                        // This step's results are valid (they come from the
                        // direct run); later steps run without graphs.
                        let msg = format!("CUDA graph capture of {key:?} failed: {e}");
                        eprintln!("warning: {msg}; decode steps run without graphs from now on");
                        self.graph_failure = Some(msg);
                        self.graph_mode = GraphMode::Off;
                    }
                }
                self.last_sampled = Some((true, b));
                return Ok(Some(out));
            }
        }
        let launched = std::time::Instant::now();
        let out = finish(ln)?;
        *last_host_times = phases(launched);
        self.last_sampled = Some((true, b));
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!(GraphMode::parse("off"), Some(GraphMode::Off));
        assert_eq!(GraphMode::parse(" 0 "), Some(GraphMode::Off));
        assert_eq!(GraphMode::parse("Padded"), Some(GraphMode::Padded));
        assert_eq!(GraphMode::parse("on"), Some(GraphMode::Graphs));
        assert_eq!(GraphMode::parse("maybe"), None);
    }

    #[test]
    fn pages_and_classes() {
        assert_eq!(graph_pages(8192, 100_000, 16), 512);
        assert_eq!(graph_pages(8192, 100, 16), 100);
        assert_eq!(graph_pages(1 << 20, 1 << 20, 16), MAX_GRAPH_PAGES);
        assert_eq!(graph_pages(0, 10, 16), 1);
        assert_eq!(ctx_class(1), DECODE_BLOCK_N);
        assert_eq!(ctx_class(17), 32);
        assert_eq!(ctx_class(256), 256);
        assert_eq!(ctx_class(257), 512);
    }
}
