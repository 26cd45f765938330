//! One forward step of a Llama over a varlen batch, made only of library
//! kernels, generic over the [`Device`] (CPU interpreter or GPU) and the
//! activation dtype `T`:
//!
//! ```text
//! h = embedding_q8_0(tokens)
//! per layer l:
//!     x    = l == 0 ? rmsnorm(h) : add_rmsnorm(down_{l-1}, h)     (h updated in place)
//!     qkv  = x @ Wqkv^T                                            (one fused product)
//!     q    = rope_kv_write(qkv) ; K, V written to the paged cache of layer l
//!     a    = flash_attention(q)      if some sequence has > 1 query token
//!          = paged_decode(q)         otherwise
//!     x    = add_rmsnorm(a @ Wo^T, h)
//!     down = silu(x @ Wg^T) * (x @ Wu^T)  @ Wd^T                  (fused SiLU-mul product)
//! logits = add_rmsnorm(down, h)[rows] @ Wlm^T                      (only the requested rows)
//! ```
//!
//! Steps of at most [`FUSED_MAX_TOKENS`] tokens (batch-1 decode) run the same
//! math with the norms and residual adds fused into the GEMVs
//! ([`kernels::dequant::fused`]), 6 launches per layer instead of 8:
//!
//! ```text
//! per layer l:
//!     qkv = rmsnorm(h) @ Wqkv^T          (norm in the GEMV prologue)
//!     rope_kv_write ; attention           (as above)
//!     h  += a @ Wo^T                      (residual in the GEMV epilogue)
//!     act = silu(x @ Wg^T) * (x @ Wu^T) with x = rmsnorm(h)
//!     h  += act @ Wd^T
//! logits = rmsnorm(h)[rows] @ Wlm^T      (norm in the LM head's prologue)
//! ```
//!
//! Products with few rows ([`kernels::dequant::uses_gemv`]: small decode
//! batches, by rows times weight rows) use the GEMV kernels, larger ones the
//! tensor-core GEMM kernels. Decode attention splits the context over several
//! programs (split-KV, then a merge kernel) when the batch alone would not
//! fill the device ([`kernels::decode_attention::split_plan`]).
//!
//! The launch sequence itself ([`launch_forward`]) reads every step input
//! from one device byte arena (see [`super::inputs`]) and writes the logits
//! to a scratch buffer: [`Model::forward`] stages and downloads around it,
//! [`Model::forward_sample`] (in [`super::sampler`]) samples on the device
//! after it, and [`super::graph`] captures the same sequence into CUDA graphs.
//!
//! # Inputs ([`Step`])
//!
//! Sequence `b` has `q_len_b = query_start[b + 1] - query_start[b]` new
//! tokens, which are the last `q_len_b` positions of its context of
//! `context_lens[b]` tokens: token `query_start[b] + i` sits at position
//! `context_lens[b] - q_len_b + i` (checked). Its K/V go to
//! `slot_mapping[t]` (`block * block_size + offset`, `-1` for none); earlier
//! positions must already be in the cache. `block_tables` is `[B,
//! max_blocks_per_seq]`. Every index is validated on the host before any
//! launch, so a bad step is an error, never an out-of-bounds access.
//!
//! # Invariants
//!
//! The KV cache of layer `l` is `[num_blocks, block_size, n_head_kv,
//! head_dim]` in `T` (the layout `rope_kv_write` writes and both attention
//! kernels read); the eager buffers grow to the largest step seen and are
//! reused (the interpreter cannot free buffers); buffers that a graph's
//! launches point to ([`Buffers::fixed`]) never move. Everything a launch
//! sequence bakes in (token count, sequence count, block-table stride, split
//! plan, logit rows) is in its [`Plan`] and [`Layout`].

use super::buffers::{Buffers, KvCache};
use super::device::Device;
use super::graph::{GraphMode, GraphState};
use super::inputs::{Layout, Stager, StepArrays, stage_step};
use super::weights::{Matrix, Weights};
use crate::check::Sample;
use crate::cuda::DeviceElem;
use crate::error::{Error, Result};
use crate::gguf::LlamaConfig;
use dsl_core::half::f16;
use dsl_core::launch::AnyDType;
use dsl_core::launch::Kernel;
use kernels::decode_attention::{paged_decode, paged_decode_reduce, paged_decode_tc, split_plan};
use kernels::dequant::{QuantFormat, gemm_grid, gemv_grid, uses_gemv};
use kernels::embedding::{self, embedding_q8_0};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::rmsnorm::{self, add_rmsnorm, rmsnorm as rmsnorm_kernel};
use kernels::rope::rope_kv_write;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// The most tokens a step may have to take the fused decode path (norms in
/// the GEMV prologues, residual adds in the epilogues). Measured on an H100
/// (2026-11-22, bf16, SmolLM2 shapes): at one row the fused GEMVs beat
/// GEMV + `add_rmsnorm` (batch-1 ITL p50 0.98 -> 0.92 ms), but at 8 rows the
/// fused kernels are slower than the pair (gate/up with the norm 21.8 us
/// against 10.9 + 4.2 us: the norm prologue raises register use to ~255), and
/// batch-64 decode fell from 10.7k to 8.7k tok/s. Larger steps therefore keep
/// the separate norm kernels.
pub const FUSED_MAX_TOKENS: usize = 1;

/// Tokens per chunk of the decode-attention kernel (f32 caches), and the
/// granularity of decode split lengths.
pub(super) const DECODE_BLOCK_N: usize = 16;

/// Keys per block of the tensor-core decode kernel (bf16/f16 caches).
pub(super) const TC_BLOCK_N: usize = 64;

/// The inputs of one forward step (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// Token ids, `[N]`.
    pub tokens: &'a [u32],
    /// Positions, `[N]`.
    pub positions: &'a [i32],
    /// Cache slots, `[N]` (`-1`: do not write).
    pub slot_mapping: &'a [i32],
    /// Block tables, `[B, max_blocks_per_seq]` row-major.
    pub block_tables: &'a [i32],
    /// Row stride of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// Context lengths including the new tokens, `[B]`.
    pub context_lens: &'a [i32],
    /// Query offsets (`cu_seqlens_q`), `[B + 1]`, from 0 to `N`.
    pub query_start: &'a [i32],
    /// The token rows whose logits are returned, in this order.
    pub logit_rows: &'a [usize],
}

/// What a launch sequence bakes in besides buffer addresses: sizes, the
/// decode split plan and which rows reach the LM head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Tokens.
    pub n: usize,
    /// Sequences.
    pub b: usize,
    /// The longest query run (1: the decode kernels).
    pub max_q: usize,
    /// Decode split length (tokens per program, a multiple of
    /// [`DECODE_BLOCK_N`]) and split count (1: no split).
    pub split_len: usize,
    pub splits: usize,
    /// Final-norm runs `(first token row, first logit row, count)`.
    pub runs: Vec<(usize, usize, usize)>,
    /// Logit rows.
    pub rows: usize,
}

impl Plan {
    /// The plan of a validated step; decode steps split per
    /// [`split_plan`] for `sms` (or every `split_override` tokens).
    pub fn of(step: &Step<'_>, c: &LlamaConfig, sms: usize, split_override: Option<usize>) -> Plan {
        let max_q = step.query_start.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        let max_ctx = step.context_lens.iter().copied().max().unwrap_or(0).max(1) as usize;
        let b = step.context_lens.len();
        let (split_len, splits) = decode_split(b, c.n_head_kv, max_ctx, sms, split_override);
        Plan {
            n: step.tokens.len(),
            b,
            max_q,
            split_len,
            splits,
            runs: runs_of(step.logit_rows),
            rows: step.logit_rows.len(),
        }
    }

    /// Split-KV partial rows the plan needs.
    pub fn parts(&self, c: &LlamaConfig) -> usize {
        if self.max_q <= 1 && self.splits > 1 { self.b * c.n_head * self.splits } else { 0 }
    }
}

/// The decode split `(split_len, splits)` for `b` sequences of at most
/// `max_ctx` tokens.
pub(super) fn decode_split(
    b: usize,
    h_kv: usize,
    max_ctx: usize,
    sms: usize,
    split_override: Option<usize>,
) -> (usize, usize) {
    match split_override {
        Some(len) => {
            let len = len.div_ceil(DECODE_BLOCK_N).max(1) * DECODE_BLOCK_N;
            (len, max_ctx.max(1).div_ceil(len))
        }
        None => split_plan(b, h_kv, max_ctx, sms, DECODE_BLOCK_N),
    }
}

/// Consecutive runs of `rows` (token row `r + i` to logit row `j + i`).
pub(super) fn runs_of(rows: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (j, &r) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some(last) if last.0 + last.2 == r => last.2 += 1,
            _ => runs.push((r, j, 1)),
        }
    }
    runs
}

/// A model on a device: weights, the paged KV cache of every layer and the
/// buffers of the forward pass (eager ones, and those of the decode graphs).
pub struct Model<D: Device, T: Sample> {
    /// The weights.
    pub weights: Weights<D, T>,
    pub(super) kv: KvCache<D, T>,
    /// Buffers of steps run directly (they grow with the steps).
    pub(super) eager: Buffers<D, T>,
    /// Host staging of the step inputs (reused).
    pub(super) staging: Vec<u8>,
    /// Penalty token lists on the device (bytes) and their host staging.
    pub(super) pen_arena: Option<(D::Buf<u8>, usize)>,
    pub(super) pen_staging: Vec<u8>,
    /// How decode steps of [`Model::forward_sample`] run.
    pub(super) graph_mode: GraphMode,
    /// The decode graphs and their buffers (created on first use).
    pub(super) graphs: Option<GraphState<D, T>>,
    /// A fixed decode split length (tests), instead of the split plan.
    pub(super) split_override: Option<usize>,
    /// Where the last sampled step's f32 logits are: `(graph buffers, rows)`.
    pub(super) last_sampled: Option<(bool, usize)>,
    /// Why graphs were turned off, if a capture failed.
    pub(super) graph_failure: Option<String>,
    pub(super) profile: Option<Profile>,
}

/// Per-kernel launch counts and host wall time, by kernel name.
pub type Profile = BTreeMap<&'static str, (usize, Duration)>;

/// A device plus the optional profile its launches are recorded in.
pub(super) struct Launcher<'d, D: Device> {
    pub dev: &'d mut D,
    pub profile: &'d mut Option<Profile>,
}

impl<D: Device> Launcher<'_, D> {
    /// Launches `K`, adding its wall time to the profile when one is kept.
    pub fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, D>,
    ) -> Result<()>
    where
        D: 'a,
    {
        let start = self.profile.is_some().then(Instant::now);
        self.dev.run::<K>(grid, config, args)?;
        if let (Some(p), Some(t0)) = (self.profile.as_mut(), start) {
            let e = p.entry(K::NAME).or_default();
            e.0 += 1;
            e.1 += t0.elapsed();
        }
        Ok(())
    }
}

fn any<'a, D: Device + 'a, T: Sample>(b: &'a D::Buf<T>, off: usize) -> Result<D::Ptr<'a, AnyDType>> {
    D::ptr_at::<T, AnyDType>(b, off)
}

fn typed<'a, D: Device + 'a, T: DeviceElem>(b: &'a D::Buf<T>) -> Result<D::Ptr<'a, T>> {
    D::ptr_at::<T, T>(b, 0)
}

/// An i32 array at byte offset `off` of a byte arena.
pub(super) fn arena_i32<'a, D: Device + 'a>(arena: &'a D::Buf<u8>, off: usize) -> Result<D::Ptr<'a, i32>> {
    D::ptr_at::<u8, i32>(arena, off)
}

pub(super) fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

/// `out[m, n] = x[m, k] @ w^T` (or the fused SiLU-mul, `n = w.n / 2`), with
/// `x` and `out` starting at element offsets `x_off` and `out_off`.
#[allow(clippy::too_many_arguments)]
fn matmul<D: Device, T: Sample>(
    l: &mut Launcher<'_, D>,
    w: &Matrix<D>,
    x: &D::Buf<T>,
    x_off: usize,
    out: &D::Buf<T>,
    out_off: usize,
    m: usize,
    silu: bool,
) -> Result<()> {
    let dtype = T::DEVICE_DTYPE;
    let n = if silu { w.n / 2 } else { w.n };
    let (xp, op) = (any::<D, T>(x, x_off)?, any::<D, T>(out, out_off)?);
    let qp = D::ptr_at::<u8, u8>(&w.quants, 0)?;
    let sp = D::ptr_at::<f16, f16>(&w.scales, 0)?;
    let (mi, ni, ki) = (m as i32, n as i32, w.k as i32);
    macro_rules! launch {
        ($family:ident, $kernel:ident, $tiles:expr, $grid:expr $(, $extra:expr)*) => {{
            use kernels::dequant::$family::$kernel as kk;
            let (a, b, c, warps, stages) = $tiles;
            let args = kk::Args {
                x_ptr: xp,
                q_ptr: qp,
                s_ptr: sp,
                out_ptr: op,
                m: mi,
                n: ni,
                k: ki,
                _marker: PhantomData,
            };
            let config = kk::Config::new(dtype, silu, a, b, c $(, $extra)*).with_warps(warps).with_stages(stages);
            l.run::<kk::Kernel>($grid, &config, &args)
        }};
    }
    if uses_gemv(m, w.n) {
        let t = l.dev.gemv_tiles(w.format, m, w.n, w.k);
        let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
        let tiles = (t.m_block, t.block_n, t.block_k, t.num_warps, 2);
        match w.format {
            QuantFormat::Q4_0 => launch!(gemv, gemv_q4_0, tiles, grid),
            QuantFormat::Q4_1 => launch!(gemv, gemv_q4_1, tiles, grid),
            QuantFormat::Q8_0 => launch!(gemv, gemv_q8_0, tiles, grid),
        }
    } else {
        // The swapped product needs 16-bit activations and `wgmma`.
        let swap_ok = dtype != dsl_core::DType::F32 && l.dev.wgmma();
        let t = l.dev.gemm_tiles(w.format, m, w.n, w.k, swap_ok);
        let grid = gemm_grid(m, n, silu, t.block_m, t.block_n);
        let tiles = (t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages);
        match w.format {
            QuantFormat::Q4_0 => launch!(gemm, gemm_q4_0, tiles, grid, t.swap),
            QuantFormat::Q4_1 => launch!(gemm, gemm_q4_1, tiles, grid, t.swap),
            QuantFormat::Q8_0 => launch!(gemm, gemm_q8_0, tiles, grid, t.swap),
        }
    }
}

/// A fused decode GEMV (see [`kernels::dequant::fused`], or
/// [`kernels::cpu_gemv`] where [`Device::cpu_gemv`]): `out[m, n] =
/// norm(x) @ w^T` (or the fused SiLU-mul) with `norm = Some((weights, eps))`
/// the RMSNorm prologue, or `out += x @ w^T` in place with `residual`. `x`
/// and `out` start at element offsets; `m <= FUSED_MAX_TOKENS`.
#[allow(clippy::too_many_arguments)]
fn gemv_fused<D: Device, T: Sample>(
    l: &mut Launcher<'_, D>,
    w: &Matrix<D>,
    x: (&D::Buf<T>, usize),
    out: (&D::Buf<T>, usize),
    m: usize,
    silu: bool,
    norm: Option<(&D::Buf<T>, f32)>,
    residual: bool,
) -> Result<()> {
    let dtype = T::DEVICE_DTYPE;
    let n = if silu { w.n / 2 } else { w.n };
    let (xp, op) = (any::<D, T>(x.0, x.1)?, any::<D, T>(out.0, out.1)?);
    let (np, eps) = match norm {
        Some((nw, eps)) => (any::<D, T>(nw, 0)?, eps),
        None => (any::<D, T>(x.0, x.1)?, 0.0),
    };
    let qp = D::ptr_at::<u8, u8>(&w.quants, 0)?;
    let sp = D::ptr_at::<f16, f16>(&w.scales, 0)?;
    let (mi, ni, ki) = (m as i32, n as i32, w.k as i32);
    let t = l.dev.gemv_tiles(w.format, m, w.n, w.k);
    let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
    macro_rules! launch {
        ($($kernel:ident)::+) => {{
            use kernels::$($kernel)::+ as kk;
            let args = kk::Args {
                x_ptr: xp,
                q_ptr: qp,
                s_ptr: sp,
                nw_ptr: np,
                out_ptr: op,
                m: mi,
                n: ni,
                k: ki,
                eps,
                _marker: PhantomData,
            };
            let config =
                kk::Config::new(dtype, silu, norm.is_some(), residual, t.m_block, t.block_n, t.block_k)
                    .with_warps(t.num_warps);
            l.run::<kk::Kernel>(grid, &config, &args)
        }};
    }
    match (w.format, l.dev.cpu_gemv()) {
        (QuantFormat::Q4_0, false) => launch!(dequant::fused::gemv_q4_0_fused),
        (QuantFormat::Q4_1, false) => launch!(dequant::fused::gemv_q4_1_fused),
        (QuantFormat::Q8_0, false) => launch!(dequant::fused::gemv_q8_0_fused),
        (QuantFormat::Q4_0, true) => launch!(cpu_gemv::cpu_gemv_q4_0),
        (QuantFormat::Q4_1, true) => launch!(cpu_gemv::cpu_gemv_q4_1),
        (QuantFormat::Q8_0, true) => launch!(cpu_gemv::cpu_gemv_q8_0),
    }
}

/// `out = add_rmsnorm(x, r)` over `rows` rows (offsets in elements), `h`
/// (the new residual) written over `r`.
#[allow(clippy::too_many_arguments)]
fn add_norm<D: Device, T: Sample>(
    l: &mut Launcher<'_, D>,
    x: (&D::Buf<T>, usize),
    r: (&D::Buf<T>, usize),
    w: &D::Buf<T>,
    out: (&D::Buf<T>, usize),
    rows: usize,
    n_cols: usize,
    eps: f32,
) -> Result<()> {
    let block = rmsnorm::block_for(n_cols);
    let config = add_rmsnorm::Config::new(T::DEVICE_DTYPE, block).with_warps(rmsnorm::warps_for(block));
    let args = add_rmsnorm::Args {
        x_ptr: any::<D, T>(x.0, x.1)?,
        r_ptr: any::<D, T>(r.0, r.1)?,
        w_ptr: any::<D, T>(w, 0)?,
        out_ptr: any::<D, T>(out.0, out.1)?,
        h_ptr: any::<D, T>(r.0, r.1)?,
        n_cols: n_cols as i32,
        stride: n_cols as i32,
        eps,
        _marker: PhantomData,
    };
    l.run::<add_rmsnorm::Kernel>([rows as u32, 1, 1], &config, &args)
}

/// Launches one step (see the module doc) on the inputs in `bufs`' arena at
/// `lay`, leaving the logits of the plan's rows in the scratch logits.
/// Issues only launches (no allocation, copy or synchronization), so it can
/// be captured into a graph.
pub(super) fn launch_forward<D: Device, T: Sample>(
    ln: &mut Launcher<'_, D>,
    w: &Weights<D, T>,
    kv: &KvCache<D, T>,
    bufs: &Buffers<D, T>,
    lay: &Layout,
    plan: &Plan,
) -> Result<()> {
    let s = bufs.scratch.as_ref().ok_or_else(|| usage("scratch buffers were not allocated".into()))?;
    let arena = &bufs.arena.as_ref().ok_or_else(|| usage("the input arena was not allocated".into()))?.0;
    let (n, b) = (plan.n, plan.b);
    let c = &w.config;
    let (e, eps, dtype) = (c.n_embd, c.rms_norm_eps, T::DEVICE_DTYPE);
    let (nq, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();

    let eb = embedding::block_for(e);
    let config = embedding_q8_0::Config::new(dtype, eb).with_warps(embedding::warps_for(eb));
    let args = embedding_q8_0::Args {
        w_ptr: D::ptr_at::<u8, u8>(&w.embedding, 0)?,
        ids_ptr: arena_i32::<D>(arena, lay.tokens)?,
        out_ptr: any::<D, T>(&s.h, 0)?,
        hidden: e as i32,
        vocab: c.vocab_size as i32,
        _marker: PhantomData,
    };
    ln.run::<embedding_q8_0::Kernel>([n as u32, 1, 1], &config, &args)?;

    // Decode-sized steps fuse the norms into the GEMV prologues and the
    // residual adds into their epilogues; larger ones (the GEMM path) run the
    // norms as kernels of their own.
    let fused = n <= FUSED_MAX_TOKENS;
    for (l, layer) in w.layers.iter().enumerate() {
        if fused {
            let norm = Some((&layer.attn_norm, eps));
            gemv_fused::<D, T>(ln, &layer.qkv, (&s.h, 0), (&s.qkv, 0), n, false, norm, false)?;
        } else if l == 0 {
            let block = rmsnorm::block_for(e);
            let config = rmsnorm_kernel::Config::new(dtype, block).with_warps(rmsnorm::warps_for(block));
            let args = rmsnorm_kernel::Args {
                x_ptr: any::<D, T>(&s.h, 0)?,
                w_ptr: any::<D, T>(&layer.attn_norm, 0)?,
                out_ptr: any::<D, T>(&s.normed, 0)?,
                n_cols: e as i32,
                stride: e as i32,
                eps,
                _marker: PhantomData,
            };
            ln.run::<rmsnorm_kernel::Kernel>([n as u32, 1, 1], &config, &args)?;
        } else {
            add_norm::<D, T>(ln, (&s.tmp, 0), (&s.h, 0), &layer.attn_norm, (&s.normed, 0), n, e, eps)?;
        }
        if !fused {
            matmul::<D, T>(ln, &layer.qkv, &s.normed, 0, &s.qkv, 0, n, false)?;
        }

        let config = rope_kv_write::Config::new(dtype, nq, nkv, hd);
        let args = rope_kv_write::Args {
            qkv_ptr: any::<D, T>(&s.qkv, 0)?,
            pos_ptr: arena_i32::<D>(arena, lay.positions)?,
            slot_ptr: arena_i32::<D>(arena, lay.slots)?,
            q_out_ptr: any::<D, T>(&s.q, 0)?,
            k_cache_ptr: any::<D, T>(&kv.k[l], 0)?,
            v_cache_ptr: any::<D, T>(&kv.v[l], 0)?,
            theta: c.rope_freq_base,
            _marker: PhantomData,
        };
        ln.run::<rope_kv_write::Kernel>([n as u32, 1, 1], &config, &args)?;

        if plan.max_q > 1 {
            let t = fa::config_for(hd, dtype, ln.dev.wgmma(), kv.block_size);
            let config = t.config(dtype, nq, nkv, hd, kv.block_size, true);
            let args = flash_attention::Args {
                q_ptr: any::<D, T>(&s.q, 0)?,
                k_cache_ptr: any::<D, T>(&kv.k[l], 0)?,
                v_cache_ptr: any::<D, T>(&kv.v[l], 0)?,
                o_ptr: any::<D, T>(&s.attn, 0)?,
                block_tables_ptr: arena_i32::<D>(arena, lay.tables)?,
                seq_lens_ptr: arena_i32::<D>(arena, lay.ctx)?,
                cu_seqlens_q_ptr: arena_i32::<D>(arena, lay.cu)?,
                scale,
                max_blocks_per_seq: lay.bt_stride as i32,
                _marker: PhantomData,
            };
            let grid = fa::grid(plan.max_q, b, nq, t.block_m);
            ln.run::<flash_attention::Kernel>(grid, &config, &args)?;
        } else {
            let split = plan.splits > 1;
            let group = nq / nkv;
            // The same arguments for both decode kernels.
            macro_rules! decode_args {
                ($k:ident) => {
                    $k::Args {
                        q_ptr: any::<D, T>(&s.q, 0)?,
                        k_cache: any::<D, T>(&kv.k[l], 0)?,
                        v_cache: any::<D, T>(&kv.v[l], 0)?,
                        block_tables: arena_i32::<D>(arena, lay.tables)?,
                        bt_stride: lay.bt_stride as i32,
                        seq_lens: arena_i32::<D>(arena, lay.ctx)?,
                        out_ptr: any::<D, T>(&s.attn, 0)?,
                        part_o: typed::<D, f32>(&s.part_o)?,
                        part_m: typed::<D, f32>(&s.part_m)?,
                        part_l: typed::<D, f32>(&s.part_l)?,
                        scale,
                        split_len: plan.split_len as i32,
                        _marker: PhantomData,
                    }
                };
            }
            let grid = [b as u32, nkv as u32, plan.splits as u32];
            if matches!(dtype, dsl_core::DType::BF16 | dsl_core::DType::F16) {
                // Tensor cores for half caches (any split length: the kernel
                // masks its last partial key block).
                let config =
                    paged_decode_tc::Config::new(dtype, nkv, group, hd, kv.block_size, TC_BLOCK_N, split)
                        .with_warps(4)
                        .with_stages(3);
                ln.run::<paged_decode_tc::Kernel>(grid, &config, &decode_args!(paged_decode_tc))?;
            } else {
                let config =
                    paged_decode::Config::new(dtype, nkv, group, hd, kv.block_size, DECODE_BLOCK_N, split)
                        .with_warps(4);
                ln.run::<paged_decode::Kernel>(grid, &config, &decode_args!(paged_decode))?;
            }
            if split {
                let config = paged_decode_reduce::Config::new(dtype, group, hd);
                let args = paged_decode_reduce::Args {
                    part_o: typed::<D, f32>(&s.part_o)?,
                    part_m: typed::<D, f32>(&s.part_m)?,
                    part_l: typed::<D, f32>(&s.part_l)?,
                    seq_lens: arena_i32::<D>(arena, lay.ctx)?,
                    out_ptr: any::<D, T>(&s.attn, 0)?,
                    split_len: plan.split_len as i32,
                    max_splits: plan.splits as i32,
                    _marker: PhantomData,
                };
                ln.run::<paged_decode_reduce::Kernel>([b as u32, nq as u32, 1], &config, &args)?;
            }
        }

        if fused {
            gemv_fused::<D, T>(ln, &layer.o, (&s.attn, 0), (&s.h, 0), n, false, None, true)?;
            let norm = Some((&layer.ffn_norm, eps));
            gemv_fused::<D, T>(ln, &layer.gate_up, (&s.h, 0), (&s.act, 0), n, true, norm, false)?;
            gemv_fused::<D, T>(ln, &layer.down, (&s.act, 0), (&s.h, 0), n, false, None, true)?;
        } else {
            matmul::<D, T>(ln, &layer.o, &s.attn, 0, &s.tmp, 0, n, false)?;
            add_norm::<D, T>(ln, (&s.tmp, 0), (&s.h, 0), &layer.ffn_norm, (&s.normed, 0), n, e, eps)?;
            matmul::<D, T>(ln, &layer.gate_up, &s.normed, 0, &s.act, 0, n, true)?;
            matmul::<D, T>(ln, &layer.down, &s.act, 0, &s.tmp, 0, n, false)?;
        }
    }

    if plan.rows == 0 {
        return Ok(());
    }
    if fused {
        // The residual is complete: one run of rows goes straight into the
        // LM head with the final norm in its prologue; several runs are
        // normed into `last` first (so the head reads its weight once).
        if let [(r, j, count)] = plan.runs[..] {
            let norm = Some((&w.output_norm, eps));
            let out = (&s.logits, j * c.vocab_size);
            return gemv_fused::<D, T>(ln, &w.lm_head, (&s.h, r * e), out, count, false, norm, false);
        }
        let block = rmsnorm::block_for(e);
        let config = rmsnorm_kernel::Config::new(dtype, block).with_warps(rmsnorm::warps_for(block));
        for &(r, j, count) in &plan.runs {
            let args = rmsnorm_kernel::Args {
                x_ptr: any::<D, T>(&s.h, r * e)?,
                w_ptr: any::<D, T>(&w.output_norm, 0)?,
                out_ptr: any::<D, T>(&s.last, j * e)?,
                n_cols: e as i32,
                stride: e as i32,
                eps,
                _marker: PhantomData,
            };
            ln.run::<rmsnorm_kernel::Kernel>([count as u32, 1, 1], &config, &args)?;
        }
        return matmul::<D, T>(ln, &w.lm_head, &s.last, 0, &s.logits, 0, plan.rows, false);
    }
    // The final norm of the requested rows only, gathered into `last` (one
    // launch per run of consecutive rows).
    for &(r, j, count) in &plan.runs {
        add_norm::<D, T>(
            ln,
            (&s.tmp, r * e),
            (&s.h, r * e),
            &w.output_norm,
            (&s.last, j * e),
            count,
            e,
            eps,
        )?;
    }
    matmul::<D, T>(ln, &w.lm_head, &s.last, 0, &s.logits, 0, plan.rows, false)
}

impl<D: Device, T: Sample> Model<D, T> {
    /// A model over `weights` with a zeroed paged KV cache of `num_blocks`
    /// blocks of `block_size` tokens per layer.
    ///
    /// Errors: `block_size` not 16, 32 or 64 (the decode kernel's pages), an
    /// empty or too large cache (32-bit offsets), or a device error.
    pub fn new(
        dev: &mut D,
        weights: Weights<D, T>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Model<D, T>> {
        if ![16, 32, 64].contains(&block_size) {
            return Err(usage(format!("block size {block_size}: the decode kernel takes 16, 32 or 64")));
        }
        let c = &weights.config;
        let per_layer = num_blocks
            .checked_mul(block_size * c.n_head_kv * c.head_dim)
            .filter(|&n| n > 0 && n < 1 << 31)
            .ok_or_else(|| usage(format!("a KV cache of {num_blocks} blocks does not fit 32-bit offsets")))?;
        let mut k = Vec::with_capacity(c.n_layers);
        let mut v = Vec::with_capacity(c.n_layers);
        for _ in 0..c.n_layers {
            k.push(dev.zeros::<T>(per_layer)?);
            v.push(dev.zeros::<T>(per_layer)?);
        }
        Ok(Model {
            weights,
            kv: KvCache { k, v, num_blocks, block_size },
            eager: Buffers::new(),
            staging: Vec::new(),
            pen_arena: None,
            pen_staging: Vec::new(),
            graph_mode: GraphMode::from_env(),
            graphs: None,
            split_override: None,
            last_sampled: None,
            graph_failure: None,
            profile: None,
        })
    }

    /// Starts (or, with `false`, stops) recording per-kernel launch counts
    /// and host wall times. On the interpreter a launch runs to completion,
    /// so the times are the kernels'; GPU launches are asynchronous, so there
    /// they are launch overheads only (graph replays record nothing).
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(Profile::new);
    }

    /// The profile recorded since profiling was turned on, if it is.
    pub fn profile(&self) -> Option<&Profile> {
        self.profile.as_ref()
    }

    /// The paged cache's block size.
    pub fn block_size(&self) -> usize {
        self.kv.block_size
    }

    /// Blocks of the paged cache.
    pub fn num_blocks(&self) -> usize {
        self.kv.num_blocks
    }

    /// Uses a fixed decode split length of `len` tokens (rounded up to the
    /// decode chunk) instead of the split plan; `None` restores the plan. For
    /// tests of the split-KV path on small contexts. Drops the decode graphs
    /// and their buffers (sized for the split plan).
    pub fn set_split_override(&mut self, len: Option<usize>) {
        if len != self.split_override {
            self.graphs = None;
        }
        self.split_override = len;
    }

    /// Checks `step` against the model and the cache (see the module doc).
    pub(super) fn validate(&self, s: &Step<'_>) -> Result<()> {
        let c = &self.weights.config;
        let n = s.tokens.len();
        if n == 0 {
            return Err(usage("a step needs at least one token".into()));
        }
        if s.positions.len() != n || s.slot_mapping.len() != n {
            return Err(usage(format!(
                "{n} tokens but {} positions and {} slots",
                s.positions.len(),
                s.slot_mapping.len()
            )));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(usage(format!("token id {t} is outside the vocabulary of {}", c.vocab_size)));
        }
        let b = s.context_lens.len();
        if b == 0 || s.query_start.len() != b + 1 || s.query_start[0] != 0 || s.query_start[b] as usize != n {
            return Err(usage(format!(
                "query_start must run from 0 to {n} over {} sequences (got {:?})",
                b, s.query_start
            )));
        }
        let mbs = s.max_blocks_per_seq;
        if s.block_tables.len() != b * mbs {
            return Err(usage(format!(
                "block tables have {} entries, not {b} x {mbs}",
                s.block_tables.len()
            )));
        }
        let slots = self.kv.num_blocks * self.kv.block_size;
        if let Some(&bad) = s.slot_mapping.iter().find(|&&x| x < -1 || x >= slots as i32) {
            return Err(usage(format!("slot {bad} is outside the cache of {slots} slots")));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(&dup) = s.slot_mapping.iter().find(|&&x| x >= 0 && !seen.insert(x)) {
            return Err(usage(format!("slot {dup} is written twice in one step")));
        }
        for i in 0..b {
            let (lo, hi) = (s.query_start[i], s.query_start[i + 1]);
            let ctx = s.context_lens[i];
            if hi <= lo || ctx < hi - lo {
                return Err(usage(format!("sequence {i}: {} query tokens, context {ctx}", hi - lo)));
            }
            let pages = (ctx as usize).div_ceil(self.kv.block_size);
            if pages > mbs {
                return Err(usage(format!(
                    "sequence {i}: context {ctx} needs {pages} blocks, the table has {mbs}"
                )));
            }
            for &blk in &s.block_tables[i * mbs..i * mbs + pages] {
                if blk < 0 || blk as usize >= self.kv.num_blocks {
                    return Err(usage(format!("sequence {i}: block {blk} is outside the cache")));
                }
            }
            for (j, t) in (lo..hi).enumerate() {
                let want = ctx - (hi - lo) + j as i32;
                if s.positions[t as usize] != want {
                    return Err(usage(format!(
                        "token {t} has position {}, but sequence {i}'s query token {j} sits at {want}",
                        s.positions[t as usize]
                    )));
                }
            }
        }
        if let Some(&r) = s.logit_rows.iter().find(|&&r| r >= n) {
            return Err(usage(format!("logit row {r} is not a token of this step ({n} tokens)")));
        }
        // The final norm updates the residual of each requested row in place.
        let mut rows = std::collections::HashSet::new();
        if let Some(&r) = s.logit_rows.iter().find(|&&r| !rows.insert(r)) {
            return Err(usage(format!("logit row {r} is requested twice")));
        }
        Ok(())
    }

    /// Stages a validated step into the eager buffers (sized for it, with
    /// sampling settings of `rows` rows when given) and returns its layout
    /// and plan. The sampling settings are staged by the caller through
    /// `stage_rows`, before the single copy.
    pub(super) fn stage_eager(
        &mut self,
        dev: &mut D,
        step: &Step<'_>,
        sample_rows: Option<usize>,
        stage_rows: impl FnOnce(&mut Stager<'_>, &Layout),
    ) -> Result<(Layout, Plan)> {
        let c = &self.weights.config;
        let plan = Plan::of(step, c, dev.sm_count(), self.split_override);
        let b = step.context_lens.len();
        let lay = Layout::new(step.tokens.len(), b, step.max_blocks_per_seq, sample_rows);
        self.eager.ensure_arena(dev, lay.len)?;
        self.eager.ensure_scratch(dev, c, plan.n, plan.rows, plan.parts(c))?;
        let mut st = Stager::new(&mut self.staging, lay.copy_len(b));
        let arrays = StepArrays {
            tokens: step.tokens,
            positions: step.positions,
            slots: step.slot_mapping,
            ctx: step.context_lens,
            cu: step.query_start,
            tables: step.block_tables,
            src_stride: step.max_blocks_per_seq,
        };
        stage_step(&mut st, &lay, &arrays);
        stage_rows(&mut st, &lay);
        let arena =
            &self.eager.arena.as_ref().ok_or_else(|| usage("the input arena was not allocated".into()))?.0;
        dev.write(arena, st.bytes())?;
        Ok((lay, plan))
    }

    /// Runs one step and returns the f32 logits of `step.logit_rows`,
    /// `[rows, vocab]` row-major, writing the step's K/V into the cache.
    pub fn forward(&mut self, dev: &mut D, step: &Step<'_>) -> Result<Vec<f32>> {
        self.validate(step)?;
        let (lay, plan) = self.stage_eager(dev, step, None, |_, _| ())?;
        let Model { weights, kv, eager, profile, .. } = self;
        launch_forward(&mut Launcher { dev, profile }, weights, kv, eager, &lay, &plan)?;
        if plan.rows == 0 {
            return Ok(Vec::new());
        }
        let s = eager.scratch.as_ref().ok_or_else(|| usage("scratch buffers were not allocated".into()))?;
        let logits = dev.download_prefix(&s.logits, plan.rows * weights.config.vocab_size)?;
        Ok(logits.iter().map(|v| v.to_f64() as f32).collect())
    }
}
