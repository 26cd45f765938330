//! The launch sequence of one forward step ([`launch_forward`]; the math is
//! in [`super::forward`]'s module doc), written as the model reads:
//! embedding, then per layer [`Fwd::qkv`], [`Fwd::rope`], [`Fwd::attention`],
//! [`Fwd::attn_out`] and [`Fwd::mlp`], then [`Fwd::lm_head`].
//!
//! Two arrangements of the same math ([`Plan::invariant`]):
//!
//! - Batch-invariant (the default): every product runs
//!   [`kernels::dequant::linear`] and every attention row the same
//!   online-softmax arithmetic ([`kernels::flash_attention`] for steps with
//!   a longer query run, [`kernels::decode_attention::paged_decode_tc`] with
//!   the prefill kernel's key block and warp layout for decode steps, never
//!   split), so a row's values depend only on its own inputs. Single-token
//!   steps fuse the norms into the products' prologues and the residual adds
//!   into their epilogues; those fusions compute exactly what the separate
//!   kernels compute (see the kernels' docs).
//! - Fast (`--no-batch-invariance`): the fastest kernel per shape (FMA GEMVs
//!   for small batches, tensor-core GEMMs above, split-KV decode); a row's
//!   rounding then depends on the batch it runs in.
//!
//! Invariant: [`launch_forward`] issues launches only (no allocation, copy or
//! synchronization), so it can be captured into a graph.

use super::buffers::{Buffers, KvCache, Scratch};
use super::device::Device;
use super::forward::{DECODE_BLOCK_N, FUSED_MAX_TOKENS, Launcher, Plan, TC_BLOCK_N, usage};
use super::inputs::Layout;
use super::weights::{Kind, MatRef, Weights};
use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::gguf::LlamaConfig;
use crate::model::ActElem;
use dsl_core::DType;
use dsl_core::half::f16;
use dsl_core::launch::AnyDType;
use kernels::decode_attention::{default_rows, paged_decode, paged_decode_reduce, paged_decode_tc};
use kernels::dequant::linear::linear;
use kernels::dequant::{
    LINEAR_SPLIT_MAX_M, QuantFormat, gemm_grid, gemv_grid, linear_grid, linear_tiles, linear_workspace,
    uses_gemv,
};
use kernels::embedding::{self, embedding_q8_0};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::rmsnorm::{self, add_rmsnorm, rmsnorm as rmsnorm_kernel};
use kernels::rope::rope_kv_write;
use std::marker::PhantomData;

fn any<'a, D: Device + 'a, T: ActElem>(b: &'a D::Buf<T>, off: usize) -> Result<D::Ptr<'a, AnyDType>> {
    D::ptr_at::<T, AnyDType>(b, off)
}

fn typed<'a, D: Device + 'a, T: DeviceElem>(b: &'a D::Buf<T>) -> Result<D::Ptr<'a, T>> {
    D::ptr_at::<T, T>(b, 0)
}

/// An i32 array at byte offset `off` of a byte arena.
pub(super) fn arena_i32<'a, D: Device + 'a>(arena: &'a D::Buf<u8>, off: usize) -> Result<D::Ptr<'a, i32>> {
    D::ptr_at::<u8, i32>(arena, off)
}

/// A buffer and an element offset into it.
type At<'a, B> = (&'a B, usize);

/// What a projection fuses: `Norm` is the RMSNorm prologue with its weight
/// and epsilon (single-token steps only), `Residual` the in-place residual
/// add of the epilogue.
#[derive(Clone, Copy)]
enum Fuse<'a, D: Device, T: ActElem> {
    None,
    Norm(At<'a, D::Buf<T>>, f32),
    Residual,
}

/// The step's shared, read-only state: weights, cache, buffers, inputs, plan.
pub(super) struct Fwd<'a, D: Device, T: ActElem> {
    w: &'a Weights<D, T>,
    kv: &'a KvCache<D, T>,
    s: &'a Scratch<D, T>,
    arena: &'a D::Buf<u8>,
    lay: &'a Layout,
    plan: &'a Plan,
}

/// Launches one step (see the module doc) on the inputs in `bufs`' arena at
/// `lay`, leaving the logits of the plan's rows in the scratch logits.
pub(super) fn launch_forward<D: Device, T: ActElem>(
    ln: &mut Launcher<'_, D>,
    w: &Weights<D, T>,
    kv: &KvCache<D, T>,
    bufs: &Buffers<D, T>,
    lay: &Layout,
    plan: &Plan,
) -> Result<()> {
    let s = bufs.scratch.as_ref().ok_or_else(|| usage("scratch buffers were not allocated".into()))?;
    let arena = &bufs.arena.as_ref().ok_or_else(|| usage("the input arena was not allocated".into()))?.0;
    if plan.mega {
        return super::mega::launch(ln, w, kv, s, arena, lay, plan);
    }
    let f = Fwd { w, kv, s, arena, lay, plan };
    f.embedding(ln)?;
    for l in 0..w.layers.len() {
        f.qkv(ln, l)?;
        f.rope(ln, l)?;
        f.attention(ln, l)?;
        f.attn_out(ln, l)?;
        f.mlp(ln, l)?;
    }
    f.lm_head(ln)
}

impl<D: Device, T: ActElem> Fwd<'_, D, T> {
    /// Whether this step fuses norms and residual adds into the products.
    fn fused(&self) -> bool {
        self.plan.n <= FUSED_MAX_TOKENS
    }

    /// `h = embedding(tokens)`.
    fn embedding(&self, ln: &mut Launcher<'_, D>) -> Result<()> {
        let (c, dtype) = (&self.w.config, T::DEVICE_DTYPE);
        let eb = embedding::block_for(c.n_embd);
        let config = embedding_q8_0::Config::new(dtype, eb).with_warps(embedding::warps_for(eb));
        let args = embedding_q8_0::Args {
            w_ptr: D::ptr_at::<u8, u8>(&self.w.embedding, 0)?,
            ids_ptr: arena_i32::<D>(self.arena, self.lay.tokens)?,
            out_ptr: any::<D, T>(&self.s.h, 0)?,
            hidden: c.n_embd as i32,
            vocab: c.vocab_size as i32,
            _marker: PhantomData,
        };
        let n = self.plan.n;
        let es = dtype.size_bytes();
        ln.cost(|| format!("embedding {n} rows"), n * (c.n_embd / 32 * 34 + c.n_embd * es + 4), 0);
        ln.run::<embedding_q8_0::Kernel>([n as u32, 1, 1], &config, &args)
    }

    /// `qkv = norm(h) @ Wqkv^T`: the attention norm is layer 0's RMSNorm of
    /// the embedding, or add+RMSNorm of the previous layer's down product
    /// into the residual (fused into the product on single-token steps).
    fn qkv(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (s, n, eps) = (self.s, self.plan.n, self.w.config.rms_norm_eps);
        let (w, norm) = (self.w.mat(l, Kind::Qkv), self.w.attn_norm(l));
        if self.fused() {
            return self.project(ln, "qkv", w, (&s.h, 0), (&s.qkv, 0), n, false, Fuse::Norm(norm, eps));
        }
        if l == 0 {
            self.rmsnorm(ln, (&s.h, 0), norm, (&s.normed, 0), n)?;
        } else {
            self.add_norm(ln, (&s.tmp, 0), (&s.h, 0), norm, (&s.normed, 0), n)?;
        }
        self.project(ln, "qkv", w, (&s.normed, 0), (&s.qkv, 0), n, false, Fuse::None)
    }

    /// RoPE on Q and K, K and V written to layer `l`'s paged cache.
    fn rope(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let c = &self.w.config;
        let config = rope_kv_write::Config::new(T::DEVICE_DTYPE, c.n_head, c.n_head_kv, c.head_dim);
        let args = rope_kv_write::Args {
            qkv_ptr: any::<D, T>(&self.s.qkv, 0)?,
            pos_ptr: arena_i32::<D>(self.arena, self.lay.positions)?,
            slot_ptr: arena_i32::<D>(self.arena, self.lay.slots)?,
            q_out_ptr: any::<D, T>(&self.s.q, 0)?,
            k_cache_ptr: any::<D, T>(&self.kv.k, l * self.kv.layer_len)?,
            v_cache_ptr: any::<D, T>(&self.kv.v, l * self.kv.layer_len)?,
            theta: c.rope_freq_base,
            _marker: PhantomData,
        };
        let (n, es) = (self.plan.n, T::DEVICE_DTYPE.size_bytes());
        // Reads Q, K, V; writes Q and the cache's K and V.
        let bytes = 2 * n * (c.n_head + 2 * c.n_head_kv) * c.head_dim * es;
        ln.cost(|| format!("rope + KV write {n} rows"), bytes, 0);
        ln.run::<rope_kv_write::Kernel>([n as u32, 1, 1], &config, &args)
    }

    /// The prefill kernel's tiles for this model, device and dtype.
    fn prefill_tiles(&self, ln: &Launcher<'_, D>) -> fa::TileConfig {
        prefill_tiles(
            self.w.config.head_dim,
            T::DEVICE_DTYPE,
            ln.dev.wgmma(),
            self.kv.block_size,
            self.plan.invariant,
        )
    }

    /// `attn = attention(q, K, V)` over layer `l`'s cache: FlashAttention
    /// when some sequence has more than one query token, the decode kernel
    /// otherwise.
    fn attention(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (c, s, plan, dtype) = (&self.w.config, self.s, self.plan, T::DEVICE_DTYPE);
        let (nq, nkv, hd) = (c.n_head, c.n_head_kv, c.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let (arena, lay) = (self.arena, self.lay);
        let es = dtype.size_bytes();
        // Every cached key and value of each sequence read once per KV head,
        // Q read and O written; QK^T and PV over each query row's keys.
        let bytes = plan.ctx_tokens * nkv * hd * 2 * es + 2 * plan.n * nq * hd * es;
        let kind = if plan.max_q > 1 { "prefill" } else { "decode" };
        ln.cost(|| format!("attention {kind} b{}", plan.b), bytes, 4 * plan.attended * nq * hd);
        if plan.max_q > 1 {
            let t = self.prefill_tiles(ln);
            let config = t.config(dtype, nq, nkv, hd, self.kv.block_size, true);
            let args = flash_attention::Args {
                q_ptr: any::<D, T>(&s.q, 0)?,
                k_cache_ptr: any::<D, T>(&self.kv.k, l * self.kv.layer_len)?,
                v_cache_ptr: any::<D, T>(&self.kv.v, l * self.kv.layer_len)?,
                o_ptr: any::<D, T>(&s.attn, 0)?,
                block_tables_ptr: arena_i32::<D>(arena, lay.tables)?,
                seq_lens_ptr: arena_i32::<D>(arena, lay.ctx)?,
                cu_seqlens_q_ptr: arena_i32::<D>(arena, lay.cu)?,
                scale,
                max_blocks_per_seq: lay.bt_stride as i32,
                _marker: PhantomData,
            };
            let grid = fa::grid(plan.max_q, plan.b, nq, t.block_m);
            return ln.run::<flash_attention::Kernel>(grid, &config, &args);
        }
        let split = plan.splits > 1;
        let group = nq / nkv;
        // The same arguments for both decode kernels.
        macro_rules! decode_args {
            ($k:ident) => {
                $k::Args {
                    q_ptr: any::<D, T>(&s.q, 0)?,
                    k_cache: any::<D, T>(&self.kv.k, l * self.kv.layer_len)?,
                    v_cache: any::<D, T>(&self.kv.v, l * self.kv.layer_len)?,
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
        let grid = [plan.b as u32, nkv as u32, plan.splits as u32];
        let page = self.kv.block_size;
        let half = matches!(dtype, DType::BF16 | DType::F16);
        if plan.invariant {
            let config = invariant_decode(dtype, ln.dev.wgmma(), nkv, group, hd, page);
            return ln.run::<paged_decode_tc::Kernel>(grid, &config, &decode_args!(paged_decode_tc));
        }
        if half {
            // Tensor cores for half caches (any split length: the kernel
            // masks its last partial key block).
            let config = paged_decode_tc::Config::new(
                dtype,
                nkv,
                group,
                hd,
                page,
                TC_BLOCK_N,
                split,
                default_rows(group),
                false,
            )
            .with_warps(4)
            .with_stages(3);
            ln.run::<paged_decode_tc::Kernel>(grid, &config, &decode_args!(paged_decode_tc))?;
        } else {
            let config =
                paged_decode::Config::new(dtype, nkv, group, hd, page, DECODE_BLOCK_N, split).with_warps(4);
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
            let parts = plan.b * nq * plan.splits;
            ln.cost(
                || format!("attention merge b{} splits{}", plan.b, plan.splits),
                parts * (hd + 2) * 4 + plan.b * nq * hd * es,
                0,
            );
            ln.run::<paged_decode_reduce::Kernel>([plan.b as u32, nq as u32, 1], &config, &args)?;
        }
        Ok(())
    }

    /// The O projection and its residual add (in place into `h` on
    /// single-token steps; otherwise into `tmp`, added by the MLP's norm).
    fn attn_out(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (s, n, w) = (self.s, self.plan.n, self.w.mat(l, Kind::O));
        if self.fused() {
            return self.project(ln, "o", w, (&s.attn, 0), (&s.h, 0), n, false, Fuse::Residual);
        }
        self.project(ln, "o", w, (&s.attn, 0), (&s.tmp, 0), n, false, Fuse::None)
    }

    /// `down(silu(gate(x)) * up(x))` with `x` the MLP norm of the residual:
    /// on single-token steps the norm is the gate/up product's prologue and
    /// the down product adds into `h`; otherwise add+RMSNorm first, and the
    /// down product goes to `tmp` (added by the next norm).
    fn mlp(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (s, n, eps) = (self.s, self.plan.n, self.w.config.rms_norm_eps);
        let (gu, down, norm) = (self.w.mat(l, Kind::GateUp), self.w.mat(l, Kind::Down), self.w.ffn_norm(l));
        if self.fused() {
            self.project(ln, "gate_up", gu, (&s.h, 0), (&s.act, 0), n, true, Fuse::Norm(norm, eps))?;
            return self.project(ln, "down", down, (&s.act, 0), (&s.h, 0), n, false, Fuse::Residual);
        }
        self.add_norm(ln, (&s.tmp, 0), (&s.h, 0), norm, (&s.normed, 0), n)?;
        self.project(ln, "gate_up", gu, (&s.normed, 0), (&s.act, 0), n, true, Fuse::None)?;
        self.project(ln, "down", down, (&s.act, 0), (&s.tmp, 0), n, false, Fuse::None)
    }

    /// The final norm of the requested rows and the LM head.
    fn lm_head(&self, ln: &mut Launcher<'_, D>) -> Result<()> {
        let (s, plan, c) = (self.s, self.plan, &self.w.config);
        let (e, eps, rows) = (c.n_embd, c.rms_norm_eps, plan.rows);
        if rows == 0 {
            return Ok(());
        }
        if self.fused() {
            // The residual is complete: one run of rows goes straight into
            // the LM head with the final norm in its prologue; several runs
            // are normed into `last` first (so the head reads its weight once).
            // The CPU GEMV's prologue would recompute the norm's statistic in
            // each of the head's programs (over a thousand), so the CPU
            // norms into `last` first too (the same bits: the fusion gives
            // the norm kernel's).
            if let [(r, j, count)] = plan.runs[..]
                && !ln.dev.cpu_gemv()
            {
                let out = (&s.logits, j * c.vocab_size);
                let fuse = Fuse::Norm((&self.w.output_norm, 0), eps);
                return self.project(
                    ln,
                    "lm_head",
                    self.w.lm_head.view(),
                    (&s.h, r * e),
                    out,
                    count,
                    false,
                    fuse,
                );
            }
            for &(r, j, count) in &plan.runs {
                self.rmsnorm(ln, (&s.h, r * e), (&self.w.output_norm, 0), (&s.last, j * e), count)?;
            }
        } else {
            // The final norm of the requested rows only, gathered into `last`
            // (one launch per run of consecutive rows).
            for &(r, j, count) in &plan.runs {
                self.add_norm(
                    ln,
                    (&s.tmp, r * e),
                    (&s.h, r * e),
                    (&self.w.output_norm, 0),
                    (&s.last, j * e),
                    count,
                )?;
            }
        }
        self.project(
            ln,
            "lm_head",
            self.w.lm_head.view(),
            (&s.last, 0),
            (&s.logits, 0),
            rows,
            false,
            Fuse::None,
        )
    }

    /// `out = x @ w^T` over `m` rows (or the fused SiLU-mul with `silu`), with
    /// `fuse`; `x` and `out` start at element offsets.
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        ln: &mut Launcher<'_, D>,
        role: &'static str,
        w: MatRef<'_, D>,
        x: (&D::Buf<T>, usize),
        out: (&D::Buf<T>, usize),
        m: usize,
        silu: bool,
        fuse: Fuse<'_, D, T>,
    ) -> Result<()> {
        let es = T::DEVICE_DTYPE.size_bytes();
        let n_out = if silu { w.n / 2 } else { w.n };
        let rw = if matches!(fuse, Fuse::Residual) { 2 } else { 1 };
        ln.cost(
            || format!("{role} {}x{} {} m{m}", w.n, w.k, w.format.name()),
            w.n * w.k / 32 * w.format.block_bytes() + m * w.k * es + rw * m * n_out * es,
            2 * m * w.n * w.k,
        );
        if self.plan.invariant {
            return linear_launch::<D, T>(ln, self.s, w, x, out, m, silu, fuse);
        }
        match fuse {
            Fuse::None => matmul::<D, T>(ln, w, x, out, m, silu),
            Fuse::Norm(nw, eps) => gemv_fused::<D, T>(ln, w, x, out, m, silu, Some((nw, eps)), false),
            Fuse::Residual => gemv_fused::<D, T>(ln, w, x, out, m, silu, None, true),
        }
    }

    /// `out = rmsnorm(x)` over `rows` rows (offsets in elements): with the
    /// batch-invariant plan in add+RMSNorm's rounding, as the fused prologue.
    fn rmsnorm(
        &self,
        ln: &mut Launcher<'_, D>,
        x: (&D::Buf<T>, usize),
        w: (&D::Buf<T>, usize),
        out: (&D::Buf<T>, usize),
        rows: usize,
    ) -> Result<()> {
        let c = &self.w.config;
        let block = rmsnorm::block_for(c.n_embd);
        let config = rmsnorm_kernel::Config::new(T::DEVICE_DTYPE, block, self.plan.invariant)
            .with_warps(rmsnorm::warps_for(block));
        let args = rmsnorm_kernel::Args {
            x_ptr: any::<D, T>(x.0, x.1)?,
            w_ptr: any::<D, T>(w.0, w.1)?,
            out_ptr: any::<D, T>(out.0, out.1)?,
            n_cols: c.n_embd as i32,
            stride: c.n_embd as i32,
            eps: c.rms_norm_eps,
            _marker: PhantomData,
        };
        let es = T::DEVICE_DTYPE.size_bytes();
        ln.cost(|| format!("rmsnorm {rows} rows"), (2 * rows + 1) * c.n_embd * es, 0);
        ln.run::<rmsnorm_kernel::Kernel>([rows as u32, 1, 1], &config, &args)
    }

    /// `out = add_rmsnorm(x, r)` over `rows` rows (offsets in elements), `h`
    /// (the new residual) written over `r`.
    fn add_norm(
        &self,
        ln: &mut Launcher<'_, D>,
        x: (&D::Buf<T>, usize),
        r: (&D::Buf<T>, usize),
        w: (&D::Buf<T>, usize),
        out: (&D::Buf<T>, usize),
        rows: usize,
    ) -> Result<()> {
        let c = &self.w.config;
        let block = rmsnorm::block_for(c.n_embd);
        let config = add_rmsnorm::Config::new(T::DEVICE_DTYPE, block).with_warps(rmsnorm::warps_for(block));
        let args = add_rmsnorm::Args {
            x_ptr: any::<D, T>(x.0, x.1)?,
            r_ptr: any::<D, T>(r.0, r.1)?,
            w_ptr: any::<D, T>(w.0, w.1)?,
            out_ptr: any::<D, T>(out.0, out.1)?,
            h_ptr: any::<D, T>(r.0, r.1)?,
            n_cols: c.n_embd as i32,
            stride: c.n_embd as i32,
            eps: c.rms_norm_eps,
            _marker: PhantomData,
        };
        let es = T::DEVICE_DTYPE.size_bytes();
        // Reads x and r, writes h and the normed rows.
        ln.cost(|| format!("add + rmsnorm {rows} rows"), (4 * rows + 1) * c.n_embd * es, 0);
        ln.run::<add_rmsnorm::Kernel>([rows as u32, 1, 1], &config, &args)
    }
}

/// FlashAttention's tiles for `head_dim`, `dtype`, the device (`wgmma`)
/// and pages of `page` tokens ([`fa::config_for`]), with the
/// batch-invariant softmax when `invariant`.
pub(crate) fn prefill_tiles(
    head_dim: usize,
    dtype: DType,
    wgmma: bool,
    page: usize,
    invariant: bool,
) -> fa::TileConfig {
    fa::TileConfig { invariant, ..fa::config_for(head_dim, dtype, wgmma, page) }
}

/// The batch-invariant decode kernel's configuration: each row computes
/// what [`prefill_tiles`]' prefill kernel computes for it, with the same key
/// block, the same warp layout of a row (a warpgroup of 64 rows on `wgmma`,
/// one warp of 16 rows per `mma.sync`), the same softmax arithmetic, and no
/// split.
pub(crate) fn invariant_decode(
    dtype: DType,
    wgmma: bool,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page: usize,
) -> paged_decode_tc::Config {
    let (block_n, rows, warps) = invariant_decode_shape(dtype, wgmma, group, head_dim, page);
    paged_decode_tc::Config::new(dtype, h_kv, group, head_dim, page, block_n, false, rows, true)
        .with_warps(warps)
        .with_stages(INVARIANT_DECODE_STAGES)
}

/// The pipeline depth of the batch-invariant decode kernel.
pub(crate) const INVARIANT_DECODE_STAGES: u32 = 3;

/// [`invariant_decode`]'s key block, tile height and warps.
pub(crate) fn invariant_decode_shape(
    dtype: DType,
    wgmma: bool,
    group: usize,
    head_dim: usize,
    page: usize,
) -> (usize, usize, u32) {
    let t = prefill_tiles(head_dim, dtype, wgmma, page, true);
    let half = matches!(dtype, DType::BF16 | DType::F16);
    let (rows, warps) = match (half, wgmma) {
        (true, true) => (64, 4),
        (true, false) => (16, 1),
        (false, _) => (default_rows(group), 4),
    };
    (t.block_n, rows.max(group), warps)
}

/// The configuration and grid of the batch-invariant product ([`linear`])
/// of `m` rows with a `format` weight of `rows` rows and `k` columns, with
/// its fusions, on the device's tiles ([`linear_tiles`]; f16 operands on
/// tensor cores), and the workspace entries and counters it needs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_config(
    dtype: DType,
    format: QuantFormat,
    m: usize,
    rows: usize,
    k: usize,
    silu: bool,
    norm: bool,
    residual: bool,
    tensor_cores: bool,
) -> (linear::Config, [u32; 3], (usize, usize)) {
    let t = linear_tiles(format, m, rows, k, tensor_cores);
    let n = if silu { rows / 2 } else { rows };
    let config = linear::Config::new(
        dtype,
        format,
        silu,
        norm,
        residual,
        t.split,
        tensor_cores,
        t.block_m,
        t.block_n,
        if norm { k.next_power_of_two() } else { 1 },
    )
    .with_warps(t.num_warps);
    let grid = linear_grid(m, n, k, silu, &t);
    (config, grid, linear_workspace(grid, &t))
}

/// The workspace entries and counters every split product of a model of
/// shape `c` fits in (its split batches have at most
/// [`LINEAR_SPLIT_MAX_M`] rows and need the same for any of them).
pub(crate) fn linear_workspace_for(c: &LlamaConfig, tensor_cores: bool) -> (usize, usize) {
    let qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
    let shapes = [
        (qkv, c.n_embd),
        (c.n_embd, c.n_head * c.head_dim),
        (2 * c.n_ff, c.n_embd),
        (c.n_embd, c.n_ff),
        (c.vocab_size, c.n_embd),
    ];
    let mut need = (0, 0);
    for (rows, k) in shapes {
        for format in [QuantFormat::Q4_0, QuantFormat::Q8_0] {
            let t = linear_tiles(format, LINEAR_SPLIT_MAX_M, rows, k, tensor_cores);
            let (ws, cnt) = linear_workspace(linear_grid(LINEAR_SPLIT_MAX_M, rows, k, false, &t), &t);
            need = (need.0.max(ws), need.1.max(cnt));
        }
    }
    need
}

/// The workspace entries and tile counters the persistent step's split
/// products need for a model of shape `c`.
pub(crate) fn mega_workspace_for(c: &LlamaConfig) -> (usize, usize) {
    let qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
    let shapes =
        [(qkv, c.n_embd), (c.n_embd, c.n_head * c.head_dim), (2 * c.n_ff, c.n_embd), (c.n_embd, c.n_ff)];
    let mut need = (0, 0);
    for (rows, k) in shapes {
        let (ws, cnt) = kernels::decode_step::workspace(rows, k);
        need = (need.0.max(ws), need.1.max(cnt));
    }
    need
}

/// The batch-invariant product with its fusions: [`linear`], or on devices
/// with [`Device::cpu_gemv`] the CPU GEMV at every batch size.
#[allow(clippy::too_many_arguments)]
fn linear_launch<D: Device, T: ActElem>(
    l: &mut Launcher<'_, D>,
    scratch: &Scratch<D, T>,
    w: MatRef<'_, D>,
    x: (&D::Buf<T>, usize),
    out: (&D::Buf<T>, usize),
    m: usize,
    silu: bool,
    fuse: Fuse<'_, D, T>,
) -> Result<()> {
    if l.dev.cpu_gemv() {
        // The native CPU's invariant product: `cpu_gemv`'s row arithmetic is
        // fixed by its K tile alone (the same for every `m`), and its fusions
        // give the separate kernels' bits.
        let norm = match fuse {
            Fuse::Norm(nw, eps) if m == 1 => Some((nw, eps)),
            Fuse::Norm(..) => return Err(usage(format!("the fused RMSNorm takes one row, not {m}"))),
            _ => None,
        };
        return gemv_fused::<D, T>(l, w, x, out, m, silu, norm, matches!(fuse, Fuse::Residual));
    }
    let n = if silu { w.n / 2 } else { w.n };
    let (np, eps, norm) = match fuse {
        Fuse::Norm(nw, eps) if m == 1 => (any::<D, T>(nw.0, nw.1)?, eps, true),
        Fuse::Norm(..) => return Err(usage(format!("the fused RMSNorm takes one row, not {m}"))),
        _ => (any::<D, T>(x.0, x.1)?, 0.0, false),
    };
    let residual = matches!(fuse, Fuse::Residual);
    let tc = l.dev.tensor_cores();
    let (config, grid, (ws, cnt)) =
        linear_config(T::DEVICE_DTYPE, w.format, m, w.n, w.k, silu, norm, residual, tc);
    let s = scratch;
    if ws > 0 && (ws > s.lin_ws_len || cnt > s.lin_cnt_len) {
        return Err(usage(format!(
            "internal error: the split product needs {ws} workspace entries and {cnt} counters"
        )));
    }
    let args = linear::Args {
        x_ptr: any::<D, T>(x.0, x.1)?,
        q_ptr: D::ptr_at::<u8, u8>(w.quants, w.q_off)?,
        s_ptr: D::ptr_at::<f16, f16>(w.scales, w.s_off)?,
        nw_ptr: np,
        out_ptr: any::<D, T>(out.0, out.1)?,
        ws_ptr: typed::<D, f32>(&s.lin_ws)?,
        cnt_ptr: typed::<D, i32>(&s.lin_cnt)?,
        m: m as i32,
        n: n as i32,
        k: w.k as i32,
        eps,
        _marker: PhantomData,
    };
    l.run::<linear::Kernel>(grid, &config, &args)
}

/// `out[m, n] = x[m, k] @ w^T` (or the fused SiLU-mul, `n = w.n / 2`) on the
/// fast path: the GEMV for small products, the tensor-core GEMM above.
fn matmul<D: Device, T: ActElem>(
    l: &mut Launcher<'_, D>,
    w: MatRef<'_, D>,
    x: (&D::Buf<T>, usize),
    out: (&D::Buf<T>, usize),
    m: usize,
    silu: bool,
) -> Result<()> {
    let dtype = T::DEVICE_DTYPE;
    let n = if silu { w.n / 2 } else { w.n };
    let (xp, op) = (any::<D, T>(x.0, x.1)?, any::<D, T>(out.0, out.1)?);
    let qp = D::ptr_at::<u8, u8>(w.quants, w.q_off)?;
    let sp = D::ptr_at::<f16, f16>(w.scales, w.s_off)?;
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
            let config =
                kk::Config::new(dtype, w.format, silu, a, b, c $(, $extra)*).with_warps(warps).with_stages(stages);
            l.run::<kk::Kernel>($grid, &config, &args)
        }};
    }
    if uses_gemv(m, w.n) {
        let t = l.dev.gemv_tiles(w.format, m, w.n, w.k);
        let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
        let tiles = (t.m_block, t.block_n, t.block_k, t.num_warps, 2);
        launch!(gemv, gemv, tiles, grid)
    } else {
        // The swapped product needs 16-bit activations and `wgmma`.
        let swap_ok = dtype != DType::F32 && l.dev.wgmma();
        let t = l.dev.gemm_tiles(w.format, m, w.n, w.k, swap_ok);
        let grid = gemm_grid(m, n, silu, t.block_m, t.block_n);
        let tiles = (t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages);
        launch!(gemm, gemm, tiles, grid, t.swap)
    }
}

/// A fused decode GEMV of the fast path ([`kernels::dequant::fused`], or
/// [`kernels::cpu_gemv`] where [`Device::cpu_gemv`]):
/// `out[m, n] = norm(x) @ w^T` (or the fused SiLU-mul) with `norm = Some((weights,
/// eps))` the RMSNorm prologue, or `out += x @ w^T` in place with
/// `residual` (one row with `norm`).
#[allow(clippy::too_many_arguments)]
fn gemv_fused<D: Device, T: ActElem>(
    l: &mut Launcher<'_, D>,
    w: MatRef<'_, D>,
    x: (&D::Buf<T>, usize),
    out: (&D::Buf<T>, usize),
    m: usize,
    silu: bool,
    norm: Option<(At<'_, D::Buf<T>>, f32)>,
    residual: bool,
) -> Result<()> {
    let dtype = T::DEVICE_DTYPE;
    let n = if silu { w.n / 2 } else { w.n };
    let (xp, op) = (any::<D, T>(x.0, x.1)?, any::<D, T>(out.0, out.1)?);
    let (np, eps) = match norm {
        Some((nw, eps)) => (any::<D, T>(nw.0, nw.1)?, eps),
        None => (any::<D, T>(x.0, x.1)?, 0.0),
    };
    let qp = D::ptr_at::<u8, u8>(w.quants, w.q_off)?;
    let sp = D::ptr_at::<f16, f16>(w.scales, w.s_off)?;
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
            let config = kk::Config::new(
                dtype,
                w.format,
                silu,
                norm.is_some(),
                residual,
                t.m_block,
                t.block_n,
                t.block_k,
            )
            .with_warps(t.num_warps);
            l.run::<kk::Kernel>(grid, &config, &args)
        }};
    }
    if l.dev.cpu_gemv() { launch!(cpu_gemv::cpu_gemv) } else { launch!(dequant::fused::gemv_fused) }
}
