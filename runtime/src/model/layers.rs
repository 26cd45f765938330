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

use super::args::{decode_args, embedding_args, flash_args, norm_args, rope_args};
use super::attention::{invariant_decode, prefill_tiles};
use super::buffers::{Buffers, KvCache, Scratch};
use super::device::Device;
use super::forward::{DECODE_BLOCK_N, FUSED_MAX_TOKENS, Launcher, Plan, TC_BLOCK_N, usage};
use super::inputs::Layout;
use super::products::{Fuse, Product, gemv_fused, linear_launch, matmul};
use super::weights::{Kind, MatRef, Weights};
use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::gguf::RopeStyle;
use crate::model::ActElem;
use dsl_core::DType;
use dsl_core::half::f16;
use dsl_core::launch::AnyDType;
use kernels::decode_attention::{
    kv8_tc_config, paged_decode, paged_decode_reduce, paged_decode_tc, tc_config,
};
use kernels::dequant::fast_path_gemv;
use kernels::embedding::{self, embedding_q8_0, embedding_repacked};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::rmsnorm::{self, add_rmsnorm, rmsnorm as rmsnorm_kernel};
use kernels::rope::{rope_arch_kv_write, rope_kv_write};
use std::marker::PhantomData;

/// Element `off` of `b` as a kernel's dtype-generic pointer.
pub(super) fn any<'a, D: Device + 'a, T: ActElem>(
    b: &'a D::Buf<T>,
    off: usize,
) -> Result<D::Ptr<'a, AnyDType>> {
    D::ptr_at::<T, AnyDType>(b, off)
}

/// The start of `b` as a typed kernel pointer.
pub(super) fn typed<'a, D: Device + 'a, T: DeviceElem>(b: &'a D::Buf<T>) -> Result<D::Ptr<'a, T>> {
    D::ptr_at::<T, T>(b, 0)
}

/// An i32 array at byte offset `off` of a byte arena.
pub(super) fn arena_i32<'a, D: Device + 'a>(arena: &'a D::Buf<u8>, off: usize) -> Result<D::Ptr<'a, i32>> {
    D::ptr_at::<u8, i32>(arena, off)
}

/// A buffer and an element offset into it.
pub(super) type At<'a, B> = (&'a B, usize);

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
        let sample = if plan.sample {
            let sb = bufs.sample.as_ref();
            Some(sb.ok_or_else(|| usage("internal error: the sampling buffers were not allocated".into()))?)
        } else {
            None
        };
        return super::mega::launch(ln, w, kv, s, arena, lay, plan, sample);
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
        let n = self.plan.n;
        let es = dtype.size_bytes();
        let ids_out = (arena_i32::<D>(self.arena, self.lay.tokens)?, any::<D, T>(&self.s.h, 0)?);
        if let Some(table) = self.w.embedding_table() {
            let config =
                embedding_repacked::Config::new(dtype, table.format, eb).with_warps(embedding::warps_for(eb));
            let args = embedding_args!(
                embedding_repacked,
                ids_out,
                (c.n_embd, c.vocab_size),
                q_ptr: D::ptr_at::<u8, u8>(&table.quants, 0)?,
                s_ptr: D::ptr_at::<f16, f16>(&table.scales, 0)?,
            );
            let row = table.format.gguf_bytes(1, c.n_embd);
            ln.cost(|| format!("embedding {n} rows"), n * (row + c.n_embd * es + 4), 0);
            return ln.run::<embedding_repacked::Kernel>([n as u32, 1, 1], &config, &args);
        }
        let config = embedding_q8_0::Config::new(dtype, eb).with_warps(embedding::warps_for(eb));
        let w_ptr = D::ptr_at::<u8, u8>(&self.w.embedding, 0)?;
        let args = embedding_args!(embedding_q8_0, ids_out, (c.n_embd, c.vocab_size), w_ptr);
        ln.cost(|| format!("embedding {n} rows"), n * (c.n_embd / 32 * 34 + c.n_embd * es + 4), 0);
        ln.run::<embedding_q8_0::Kernel>([n as u32, 1, 1], &config, &args)
    }

    /// `qkv = norm(h) @ Wqkv^T`: the attention norm is layer 0's RMSNorm of
    /// the embedding, or add+RMSNorm of the previous layer's down product
    /// into the residual (fused into the product on single-token steps).
    /// A QKV matrix whose parts differ in format runs one product per part,
    /// each into its column range of `qkv` ([`Weights::qkv_parts`]).
    fn qkv(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (s, n, eps) = (self.s, self.plan.n, self.w.config.rms_norm_eps);
        let (parts, norm) = (self.w.qkv_parts(l), self.w.attn_norm(l));
        let ldo = parts.iter().map(|(w, _)| w.n).sum();
        let (x, fuse) = if self.fused() {
            ((&s.h, 0), Fuse::Norm(norm, eps))
        } else {
            if l == 0 {
                self.norm(ln, (&s.h, 0), None, norm, (&s.normed, 0), n)?;
            } else {
                self.norm(ln, (&s.tmp, 0), Some((&s.h, 0)), norm, (&s.normed, 0), n)?;
            }
            ((&s.normed, 0), Fuse::None)
        };
        for (w, col) in parts {
            self.project(ln, "qkv", w, x, ((&s.qkv, col), Some(ldo)), n, false, fuse)?;
        }
        Ok(())
    }

    /// RoPE on Q and K, K and V written to layer `l`'s paged cache: the
    /// plain kernel for adjacent pairs and nothing else, otherwise the one
    /// with the architecture's options ([`Fwd::rope_arch`]).
    fn rope(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let c = &self.w.config;
        if !self.w.arch.plain(c) {
            return self.rope_arch(ln, l);
        }
        let config =
            rope_kv_write::Config::new(T::DEVICE_DTYPE, c.n_head, c.n_head_kv, c.head_dim, self.kv.fp8);
        let args = rope_args!(rope_kv_write, self.rope_inputs()?, self.rope_outputs(l)?, c.rope_freq_base);
        let (n, es) = (self.plan.n, T::DEVICE_DTYPE.size_bytes());
        // Reads Q, K, V; writes Q and the cache's K and V.
        let bytes = 2 * n * (c.n_head + 2 * c.n_head_kv) * c.head_dim * es;
        ln.cost(|| format!("rope + KV write {n} rows"), bytes, 0);
        ln.run::<rope_kv_write::Kernel>([n as u32, 1, 1], &config, &args)
    }

    /// What the RoPE kernels read ([`rope_args`]): the QKV rows, positions
    /// and cache slots.
    #[allow(clippy::type_complexity)]
    fn rope_inputs(&self) -> Result<(D::Ptr<'_, AnyDType>, D::Ptr<'_, i32>, D::Ptr<'_, i32>)> {
        let (arena, lay) = (self.arena, self.lay);
        Ok((
            any::<D, T>(&self.s.qkv, 0)?,
            arena_i32::<D>(arena, lay.positions)?,
            arena_i32::<D>(arena, lay.slots)?,
        ))
    }

    /// What the RoPE kernels write ([`rope_args`]): Q and layer `l`'s K and
    /// V caches.
    #[allow(clippy::type_complexity)]
    fn rope_outputs(
        &self,
        l: usize,
    ) -> Result<(D::Ptr<'_, AnyDType>, D::Ptr<'_, AnyDType>, D::Ptr<'_, AnyDType>)> {
        let at = l * self.kv.layer_len;
        Ok((any::<D, T>(&self.s.q, 0)?, any::<D, T>(&self.kv.k, at)?, any::<D, T>(&self.kv.v, at)?))
    }

    /// [`Fwd::rope`] with the architecture's options: NEOX pairs, frequency
    /// factors, QKV bias, Q/K head norm (`kernels::rope::rope_arch_kv_write`).
    fn rope_arch(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (c, a) = (&self.w.config, &self.w.arch);
        let row = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
        let config = rope_arch_kv_write::Config::new(
            T::DEVICE_DTYPE,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.arch.rope == RopeStyle::Neox,
            a.factors.is_some(),
            a.bias.is_some(),
            a.qk_norm.is_some(),
            self.kv.fp8,
        );
        let vec_at = |off: Option<usize>, per_layer: usize| {
            D::ptr_at::<f32, f32>(&a.buf, off.map_or(0, |o| o + l * per_layer))
        };
        let args = rope_args!(
            rope_arch_kv_write,
            self.rope_inputs()?,
            self.rope_outputs(l)?,
            c.rope_freq_base,
            factors_ptr: vec_at(a.factors, 0)?,
            bias_ptr: vec_at(a.bias, row)?,
            norm_ptr: vec_at(a.qk_norm, 2 * c.head_dim)?,
            eps: c.rms_norm_eps,
        );
        let (n, es) = (self.plan.n, T::DEVICE_DTYPE.size_bytes());
        let bytes = 2 * n * row * es + if a.bias.is_some() { row * 4 } else { 0 };
        ln.cost(|| format!("rope (arch) + KV write {n} rows"), bytes, 0);
        ln.run::<rope_arch_kv_write::Kernel>([n as u32, 1, 1], &config, &args)
    }

    /// The prefill kernel's tiles for this model, device and dtype.
    fn prefill_tiles(&self, ln: &Launcher<'_, D>) -> fa::TileConfig {
        let t = prefill_tiles(
            self.w.config.head_dim,
            T::DEVICE_DTYPE,
            ln.dev.wgmma(),
            self.kv.block_size,
            self.plan.invariant,
        );
        fa::TileConfig { kv8: self.kv.fp8, ..t }
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
        let at = l * self.kv.layer_len;
        let qkvo = (
            any::<D, T>(&s.q, 0)?,
            any::<D, T>(&self.kv.k, at)?,
            any::<D, T>(&self.kv.v, at)?,
            any::<D, T>(&s.attn, 0)?,
        );
        let (tables, seq_lens) =
            ((arena_i32::<D>(arena, lay.tables)?, lay.bt_stride), arena_i32::<D>(arena, lay.ctx)?);
        if plan.max_q > 1 {
            let t = self.prefill_tiles(ln);
            let config = t.config(dtype, nq, nkv, hd, self.kv.block_size, true);
            let lens = (seq_lens, arena_i32::<D>(arena, lay.cu)?);
            let args = flash_args!(flash_attention, qkvo, tables, lens, scale);
            let grid = fa::grid(plan.max_q, plan.b, nq, t.block_m);
            return ln.run::<flash_attention::Kernel>(grid, &config, &args);
        }
        let split = plan.splits > 1;
        let group = nq / nkv;
        let parts = (typed::<D, f32>(&s.part_o)?, typed::<D, f32>(&s.part_m)?, typed::<D, f32>(&s.part_l)?);
        // The same arguments for both decode kernels.
        macro_rules! args {
            ($k:ident) => {
                decode_args!($k, qkvo, tables, seq_lens, (parts, plan.split_len), scale)
            };
        }
        let grid = [plan.b as u32, nkv as u32, plan.splits as u32];
        let page = self.kv.block_size;
        let half = matches!(dtype, DType::BF16 | DType::F16);
        if plan.invariant {
            let config = paged_decode_tc::Config {
                KV8: self.kv.fp8,
                ..invariant_decode(dtype, ln.dev.wgmma(), nkv, group, hd, page)
            };
            return ln.run::<paged_decode_tc::Kernel>(grid, &config, &args!(paged_decode_tc));
        }
        if half || self.kv.fp8 {
            // Tensor cores for half caches (any split length: the kernel
            // masks its last partial key block); the FP8 cache's reader in
            // every dtype.
            let config = if self.kv.fp8 {
                let programs = plan.b * nkv * plan.splits;
                kv8_tc_config(dtype, nkv, group, hd, page, split, programs, ln.dev.sm_count())
            } else {
                tc_config(dtype, nkv, group, hd, page, TC_BLOCK_N, split).with_warps(4).with_stages(3)
            };
            ln.run::<paged_decode_tc::Kernel>(grid, &config, &args!(paged_decode_tc))?;
        } else {
            let config =
                paged_decode::Config::new(dtype, nkv, group, hd, page, DECODE_BLOCK_N, split).with_warps(4);
            ln.run::<paged_decode::Kernel>(grid, &config, &args!(paged_decode))?;
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
            return self.project(ln, "o", w, (&s.attn, 0), ((&s.h, 0), None), n, false, Fuse::Residual);
        }
        self.project(ln, "o", w, (&s.attn, 0), ((&s.tmp, 0), None), n, false, Fuse::None)
    }

    /// `down(silu(gate(x)) * up(x))` with `x` the MLP norm of the residual:
    /// on single-token steps the norm is the gate/up product's prologue and
    /// the down product adds into `h`; otherwise add+RMSNorm first, and the
    /// down product goes to `tmp` (added by the next norm).
    fn mlp(&self, ln: &mut Launcher<'_, D>, l: usize) -> Result<()> {
        let (s, n, eps) = (self.s, self.plan.n, self.w.config.rms_norm_eps);
        let (gu, down, norm) = (self.w.mat(l, Kind::GateUp), self.w.mat(l, Kind::Down), self.w.ffn_norm(l));
        if self.fused() {
            self.project(ln, "gate_up", gu, (&s.h, 0), ((&s.act, 0), None), n, true, Fuse::Norm(norm, eps))?;
            return self.project(ln, "down", down, (&s.act, 0), ((&s.h, 0), None), n, false, Fuse::Residual);
        }
        self.norm(ln, (&s.tmp, 0), Some((&s.h, 0)), norm, (&s.normed, 0), n)?;
        self.project(ln, "gate_up", gu, (&s.normed, 0), ((&s.act, 0), None), n, true, Fuse::None)?;
        self.project(ln, "down", down, (&s.act, 0), ((&s.tmp, 0), None), n, false, Fuse::None)
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
                    (out, None),
                    count,
                    false,
                    fuse,
                );
            }
            for &(r, j, count) in &plan.runs {
                self.norm(ln, (&s.h, r * e), None, (&self.w.output_norm, 0), (&s.last, j * e), count)?;
            }
        } else {
            // The final norm of the requested rows only, gathered into `last`
            // (one launch per run of consecutive rows).
            for &(r, j, count) in &plan.runs {
                self.norm(
                    ln,
                    (&s.tmp, r * e),
                    Some((&s.h, r * e)),
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
            ((&s.logits, 0), None),
            rows,
            false,
            Fuse::None,
        )
    }

    /// `out = x @ w^T` over `m` rows (or the fused SiLU-mul with `silu`), with
    /// `fuse`; `x` and `out` start at element offsets, and output rows are
    /// `ldo` elements apart (`None`: the product's width; wider for a column
    /// range of a wider output, which the fast path's unfused GEMV and GEMM
    /// cannot write, so such a product runs the batch-invariant one). The
    /// output is in `O` (`T`, or f32 for the logits).
    #[allow(clippy::too_many_arguments)]
    fn project<O: ActElem>(
        &self,
        ln: &mut Launcher<'_, D>,
        role: &'static str,
        w: MatRef<'_, D>,
        x: (&D::Buf<T>, usize),
        (out, ldo): ((&D::Buf<O>, usize), Option<usize>),
        m: usize,
        silu: bool,
        fuse: Fuse<'_, D, T>,
    ) -> Result<()> {
        let (es, os) = (T::DEVICE_DTYPE.size_bytes(), O::DEVICE_DTYPE.size_bytes());
        let n_out = w.n_out(silu);
        let ldo = ldo.unwrap_or(n_out);
        let rw = if matches!(fuse, Fuse::Residual) { 2 } else { 1 };
        ln.cost(
            || format!("{role} {}x{} {} m{m}", w.n, w.k, w.format.name()),
            w.format.gguf_bytes(w.n, w.k) + m * w.k * es + rw * m * n_out * os,
            2 * m * w.n * w.k,
        );
        // Formats the fast path's GPU-shaped kernels do not take run the
        // batch-invariant product (the CPU GEMV on CPU devices) on either
        // plan: the 16-bit floats, and the other block formats (which have
        // the GEMV, not the GEMM) beyond the rows `fast_path_gemv` gives
        // the GEMV.
        let narrow = ldo != n_out && matches!(fuse, Fuse::None);
        let fast = w.format.gpu_kernels() || (fast_path_gemv(w.format, m, w.n) && !ln.dev.cpu_gemv());
        let p = Product { w, x, out, ldo, m, silu };
        if self.plan.invariant || !fast || narrow {
            return linear_launch::<D, T, O>(ln, self.s, p, fuse);
        }
        match fuse {
            Fuse::None => matmul::<D, T, O>(ln, p),
            Fuse::Norm(nw, eps) => gemv_fused::<D, T, O>(ln, p, Some((nw, eps)), false),
            Fuse::Residual => gemv_fused::<D, T, O>(ln, p, None, true),
        }
    }

    /// `out = rmsnorm(x)` over `rows` rows (offsets in elements), with the
    /// batch-invariant plan in add+RMSNorm's rounding, as the fused prologue;
    /// with `r`, `out = add_rmsnorm(x, r)` with `h` (the new residual)
    /// written over `r`.
    fn norm(
        &self,
        ln: &mut Launcher<'_, D>,
        x: At<'_, D::Buf<T>>,
        r: Option<At<'_, D::Buf<T>>>,
        w: At<'_, D::Buf<T>>,
        out: At<'_, D::Buf<T>>,
        rows: usize,
    ) -> Result<()> {
        let c = &self.w.config;
        let (block, es) = (rmsnorm::block_for(c.n_embd), T::DEVICE_DTYPE.size_bytes());
        let warps = rmsnorm::warps_for(block);
        let xw = (any::<D, T>(x.0, x.1)?, any::<D, T>(w.0, w.1)?);
        let (hidden, out_ptr) = ((c.n_embd, c.n_embd, c.rms_norm_eps), any::<D, T>(out.0, out.1)?);
        let grid = [rows as u32, 1, 1];
        let Some(r) = r else {
            let config =
                rmsnorm_kernel::Config::new(T::DEVICE_DTYPE, block, self.plan.invariant).with_warps(warps);
            let args = norm_args!(rmsnorm_kernel, xw, hidden, out_ptr);
            ln.cost(|| format!("rmsnorm {rows} rows"), (2 * rows + 1) * c.n_embd * es, 0);
            return ln.run::<rmsnorm_kernel::Kernel>(grid, &config, &args);
        };
        let config = add_rmsnorm::Config::new(T::DEVICE_DTYPE, block).with_warps(warps);
        let r_ptr = any::<D, T>(r.0, r.1)?;
        let args = norm_args!(add_rmsnorm, xw, hidden, r_ptr, out_ptr, h_ptr: r_ptr);
        // Reads x and r, writes h and the normed rows.
        ln.cost(|| format!("add + rmsnorm {rows} rows"), (4 * rows + 1) * c.n_embd * es, 0);
        ln.run::<add_rmsnorm::Kernel>(grid, &config, &args)
    }
}
