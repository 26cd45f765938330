//! The kernels the `tessera` binary knows by name: what `kernels list` shows,
//! `kernels dump` compiles and `gpu-check` verifies: the library's kernels
//! (`kernels::*`) and the example kernels of `kernels::examples` (vector add,
//! matmul, argmax, cumsum, layer norm, histogram, collatz). This file only
//! registers them; it defines none.
//!
//! Invariant: every entry builds with its default config, and has a check
//! (see [`crate::check`]) that compares a device with the CPU interpreter:
//! one generic function, run on the GPU by `gpu-check` and on the native CPU
//! backend by `host-check`.

use crate::check::{self, CheckRow};
use crate::cuda::Cuda;
use crate::error::Result;
use codegen::host::Host;
use dsl_core::launch::{Kernel, LaunchOptions};
use dsl_core::{DType, Function};
use kernels::copy::copy;
use kernels::decode_attention::{paged_decode, paged_decode_reduce, paged_decode_tc};
use kernels::dequant::fused::gemv_fused;
use kernels::dequant::q8::{gemv_q8, quantize_q8, rmsnorm_q8};
use kernels::dequant::{Fuse, QuantFormat};
use kernels::embedding::{embedding_q8_0, embedding_repacked};
use kernels::examples::vector_add;
use kernels::examples::{argmax_rows, collatz, cumsum_rows, histogram, layer_norm, matmul};
use kernels::examples::{handoff_chain, line_chain, row_stats, task_chain};
use kernels::fp8::{dequantize_fp8, quantize_fp8, scaled_matmul_fp8};
use kernels::matmul::half_matmul;
use kernels::rmsnorm::{add_rmsnorm, rmsnorm};
use kernels::rope::rope_kv_write;
use kernels::sampling::{penalties, sample, token_counts_add};
use kernels::softmax::{softmax, softmax_online, softmax_warps};

/// Builds the default specialization of an entry: its IR and launch options.
pub type BuildFn = fn() -> dsl_core::Result<(Function, LaunchOptions)>;

/// Runs an entry's GPU check (GPU against the CPU interpreter, fresh inputs from `seed`).
pub type CheckFn = fn(&mut Cuda, u64) -> Result<Vec<CheckRow>>;

/// Runs an entry's check on the native CPU backend (against the interpreter).
pub type HostCheckFn = fn(&mut Host, u64) -> Result<Vec<CheckRow>>;

/// An entry's check on both devices: one generic function instantiated for
/// the GPU and for the native CPU backend.
#[derive(Clone, Copy, Debug)]
pub struct Checks {
    /// The GPU instance (`gpu-check`).
    pub gpu: CheckFn,
    /// The native CPU instance (`host-check`).
    pub host: HostCheckFn,
}

/// [`Checks`] of the generic check function `$f`.
macro_rules! checks {
    ($f:path) => {
        Checks { gpu: $f, host: $f }
    };
}

/// One registered kernel.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// The kernel's name (as `kernels dump` takes it).
    pub name: &'static str,
    /// One line on what it computes.
    pub description: &'static str,
    /// The default config, in words.
    pub default_config: &'static str,
    /// Builds the default specialization.
    pub build: BuildFn,
    /// The check, on the GPU and on the native CPU backend.
    pub check: Checks,
}

/// The specialization `config` of `K`: its IR and launch options.
fn spec<K: Kernel>(config: K::Config) -> dsl_core::Result<(Function, LaunchOptions)> {
    Ok((K::build(&config)?, K::launch_options(&config)))
}

/// The default specialization of the dequantizing GEMV on `format`
/// weights: bf16, no SiLU, one row, `BLOCK_N` 16, `BLOCK_K` `block_k`,
/// 4 warps.
fn gemv_spec(format: QuantFormat, block_k: usize) -> dsl_core::Result<(Function, LaunchOptions)> {
    use kernels::dequant::gemv::gemv as k;
    spec::<k::Kernel>(k::Config::new(DType::BF16, DType::BF16, format, false, 1, 16, block_k).with_warps(4))
}

/// The default specialization of the tiled dequantizing GEMM on `format`
/// weights: bf16, no SiLU, `64 x 64` tiles, `BLOCK_K` `block_k`, 4 warps.
fn gemm_spec(format: QuantFormat, block_k: usize) -> dsl_core::Result<(Function, LaunchOptions)> {
    use kernels::dequant::gemm::gemm as k;
    spec::<k::Kernel>(
        k::Config::new(DType::BF16, DType::BF16, format, false, 64, 64, block_k, false).with_warps(4),
    )
}

/// Every registered kernel, in listing order.
pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "vector_add",
        description: "out[i] = x[i] + y[i]",
        default_config: "T = f32, BLOCK = 1024, num_warps = 4",
        build: || spec::<vector_add::Kernel>(vector_add::Config::new(DType::F32, 1024)),
        check: checks!(check::examples::vector_add),
    },
    Entry {
        name: "handoff_chain",
        description: "programs hand rows on through wait_until and release stores",
        default_config: "BLOCK = 64, num_warps = 4",
        build: || spec::<handoff_chain::Kernel>(handoff_chain::Config::new(64)),
        check: checks!(crate::check::sync::handoffs),
    },
    Entry {
        name: "line_chain",
        description: "programs hand rows on as lines carrying their flag (wait_load)",
        default_config: "BLOCK = 64, num_warps = 4",
        build: || spec::<line_chain::Kernel>(line_chain::Config::new(64)),
        check: checks!(crate::check::sync::line_chains),
    },
    Entry {
        name: "task_chain",
        description: "a persistent grid over a task list with release counters",
        default_config: "BLOCK = 64, num_warps = 4",
        build: || spec::<task_chain::Kernel>(task_chain::Config::new(64)),
        check: checks!(crate::check::sync::task_lists),
    },
    Entry {
        name: "copy",
        description: "out[i] = x[i] (the bandwidth ceiling)",
        default_config: "T = f32, BLOCK = 1024, num_warps = 4",
        build: || spec::<copy::Kernel>(copy::Config::new(DType::F32, 1024)),
        check: checks!(check::copy::copy),
    },
    Entry {
        name: "softmax",
        description: "row softmax, f32 math, stored in T",
        default_config: "T = f32, BLOCK = 1024, num_warps = 4",
        build: || {
            spec::<softmax::Kernel>(softmax::Config::new(DType::F32, 1024).with_warps(softmax_warps(1024)))
        },
        check: checks!(check::softmax::softmax),
    },
    Entry {
        name: "matmul",
        description: "C = A @ B (f32 accumulate and output), K loop over BMxBN tiles",
        default_config: "T = f32, BM = 64, BN = 64, BK = 32, num_warps = 8",
        build: || spec::<matmul::Kernel>(matmul::Config::new(DType::F32, 64, 64, 32).with_warps(8)),
        check: checks!(check::examples::matmul),
    },
    Entry {
        name: "argmax_rows",
        description: "out[row] = argmax(x[row, :]) (i32 index)",
        default_config: "BLOCK = 1024, num_warps = 4",
        build: || spec::<argmax_rows::Kernel>(argmax_rows::Config::new(1024)),
        check: checks!(check::examples::argmax_rows),
    },
    Entry {
        name: "cumsum_rows",
        description: "row-wise inclusive prefix sums, f32",
        default_config: "BLOCK = 1024, num_warps = 4",
        build: || spec::<cumsum_rows::Kernel>(cumsum_rows::Config::new(1024)),
        check: checks!(check::examples::cumsum_rows),
    },
    Entry {
        name: "layer_norm",
        description: "(x - mean) / sqrt(var + eps) * w + b over rows, f32",
        default_config: "BLOCK = 1024, num_warps = 4",
        build: || spec::<layer_norm::Kernel>(layer_norm::Config::new(1024)),
        check: checks!(check::examples::layer_norm),
    },
    Entry {
        name: "add_rmsnorm",
        description: "h = x + r; out = rmsnorm(h) * w (writes both)",
        default_config: "T = bf16, BLOCK = 4096, num_warps = 8",
        build: || {
            let block = kernels::rmsnorm::block_for(4096);
            spec::<add_rmsnorm::Kernel>(
                add_rmsnorm::Config::new(DType::BF16, block).with_warps(kernels::rmsnorm::warps_for(block)),
            )
        },
        check: checks!(check::rmsnorm::add_rmsnorm),
    },
    Entry {
        name: "rmsnorm",
        description: "out = x * rsqrt(mean(x^2) + eps) * w, f32 math",
        default_config: "T = bf16, BLOCK = 4096, num_warps = 8",
        build: || {
            let block = kernels::rmsnorm::block_for(4096);
            spec::<rmsnorm::Kernel>(
                rmsnorm::Config::new(DType::BF16, block, false)
                    .with_warps(kernels::rmsnorm::warps_for(block)),
            )
        },
        check: checks!(check::rmsnorm::rmsnorm),
    },
    Entry {
        name: "embedding_q8_0",
        description: "out[t, :] = dequant(w_q8_0[ids[t], :]) (token-embedding gather)",
        default_config: "T = bf16, BLOCK = 1024, num_warps = 4",
        build: || {
            let block = kernels::embedding::block_for(576);
            spec::<embedding_q8_0::Kernel>(
                embedding_q8_0::Config::new(DType::BF16, block)
                    .with_warps(kernels::embedding::warps_for(block)),
            )
        },
        check: checks!(check::embedding::embedding_q8_0),
    },
    Entry {
        name: "embedding_repacked_q4_k",
        description: "out[t, :] = w[ids[t], :] from a repacked table (Q4_0/Q4_1/Q5_x/K-quant token embeddings)",
        default_config: "T = bf16, QUANT = q4_K, BLOCK = 1024, num_warps = 4",
        build: || {
            let block = kernels::embedding::block_for(4096);
            spec::<embedding_repacked::Kernel>(
                embedding_repacked::Config::new(DType::BF16, QuantFormat::Q4_K, block)
                    .with_warps(kernels::embedding::warps_for(block)),
            )
        },
        check: checks!(check::embedding::embedding_repacked),
    },
    Entry {
        name: "quantize_fp8",
        description: "q = round_f8(x / s), s = max|x| / F8_MAX per group of columns (FP8 activations)",
        default_config: "T = bf16, F = f8e4m3, GROUP = 128, GROUPS = 4, num_warps = 4",
        build: || {
            spec::<quantize_fp8::Kernel>(quantize_fp8::Config::new(DType::BF16, DType::F8E4M3, 128, 4, false))
        },
        check: checks!(check::fp8::quantize),
    },
    Entry {
        name: "scaled_matmul_fp8",
        description: "scaled FP8 product: 1x128 activation and 128x128 weight scales (or per-tensor), f32 sums, bf16 out",
        default_config: "F = f8e4m3, T = bf16, BLOCK_M = 64, BLOCK_N = 128, PER_TENSOR = false, num_warps = 4, num_stages = 2",
        build: || {
            let (bm, bn, warps, stages) = crate::check::fp8::SCALED_TILE;
            spec::<scaled_matmul_fp8::Kernel>(
                scaled_matmul_fp8::Config::new(DType::F8E4M3, DType::BF16, bm, bn, false, false, false)
                    .with_warps(warps)
                    .with_stages(stages),
            )
        },
        check: checks!(crate::check::fp8::scaled_matmul),
    },
    Entry {
        name: "dequantize_fp8",
        description: "out = f32(q) * s per group of columns (FP8 back to 16/32-bit)",
        default_config: "F = f8e4m3, T = bf16, GROUP = 128, GROUPS = 4, num_warps = 4",
        build: || {
            spec::<dequantize_fp8::Kernel>(dequantize_fp8::Config::new(DType::F8E4M3, DType::BF16, 128, 4))
        },
        check: checks!(check::fp8::dequantize),
    },
    Entry {
        name: "softmax_online",
        description: "row softmax(scale * x) of any length, optional causal mask (online, chunked)",
        default_config: "T = bf16, CAUSAL = true, BLOCK = 4096, num_warps = 8",
        build: || {
            let block = kernels::softmax::block_for(8192);
            spec::<softmax_online::Kernel>(
                softmax_online::Config::new(DType::BF16, true, block)
                    .with_warps(kernels::softmax::warps_for(block)),
            )
        },
        check: checks!(check::softmax::softmax_online),
    },
    Entry {
        name: "histogram",
        description: "hist[bins[i]] += 1 with atomics (i32)",
        default_config: "BLOCK = 1024, num_warps = 4",
        build: || spec::<histogram::Kernel>(histogram::Config::new(1024)),
        check: checks!(check::examples::histogram),
    },
    Entry {
        name: "collatz",
        description: "Collatz step counts (runtime while around an if), i32",
        default_config: "num_warps = 4",
        build: || spec::<collatz::Kernel>(collatz::Config::new()),
        check: checks!(check::examples::collatz),
    },
    Entry {
        name: "rope_kv_write",
        description: "RoPE (adjacent pairs) on Q/K of fused QKV + paged K/V cache write",
        default_config: "T = bf16, N_Q = 9, N_KV = 3, HEAD_DIM = 64, num_warps = 4",
        build: || spec::<rope_kv_write::Kernel>(rope_kv_write::Config::new(DType::BF16, 9, 3, 64, false)),
        check: checks!(crate::check::rope::rope_kv_write),
    },
    Entry {
        name: "rope_arch_kv_write",
        description: "RoPE with the architecture options (NEOX pairs, frequency factors, QKV bias, Q/K head RMSNorm) + paged K/V cache write",
        default_config: "T = bf16, N_Q = 16, N_KV = 8, HEAD_DIM = 128, NEOX, FACTORS, BIAS, QK_NORM, num_warps = 4",
        build: || {
            use kernels::rope::rope_arch_kv_write as k;
            spec::<k::Kernel>(k::Config::new(DType::BF16, 16, 8, 128, true, true, true, true, false))
        },
        check: checks!(crate::check::rope::rope_arch_kv_write),
    },
    Entry {
        name: "sample",
        description: "per-row greedy/temperature/min-p/top-k/top-p sampling with a Philox draw, f32 logits",
        default_config: "BLOCK = 4096, num_warps = 16",
        build: || {
            let block = kernels::sampling::block_for(49152);
            spec::<sample::Kernel>(
                sample::Config::new(DType::BF16, block).with_warps(kernels::sampling::warps_for(block)),
            )
        },
        check: checks!(crate::check::sampling::sample),
    },
    Entry {
        name: "penalties",
        description: "vLLM repetition/frequency/presence penalties in place on f32 logits",
        default_config: "BLOCK = 1024, num_warps = 4",
        build: || spec::<penalties::Kernel>(penalties::Config::new(1024)),
        check: checks!(crate::check::sampling::penalties),
    },
    Entry {
        name: "token_counts_add",
        description: "counts[slot[j], ids[j]] += 1 (atomics), the penalties' token counts",
        default_config: "BLOCK = 128, num_warps = 4",
        build: || spec::<token_counts_add::Kernel>(token_counts_add::Config::new(128)),
        check: checks!(crate::check::sampling::token_counts_add),
    },
    Entry {
        name: "paged_decode",
        description: "decode attention over the paged KV cache, GQA-grouped, optional split-KV",
        default_config: "T = bf16, H_KV = 8, GROUP = 4, HEAD_DIM = 128, PAGE = 16, BLOCK_N = 16, SPLIT = false, num_warps = 8",
        build: || {
            spec::<paged_decode::Kernel>(
                paged_decode::Config::new(DType::BF16, 8, 4, 128, 16, 16, false).with_warps(8),
            )
        },
        check: checks!(crate::check::decode::paged_decode),
    },
    Entry {
        name: "paged_decode_tc",
        description: "paged decode attention on tensor cores (bf16/f16), K/V pipelined with cp.async",
        default_config: "T = bf16, H_KV = 8, GROUP = 4, HEAD_DIM = 128, PAGE = 16, BLOCK_N = 64, SPLIT = false, num_warps = 4, num_stages = 3",
        build: || {
            spec::<paged_decode_tc::Kernel>(
                paged_decode_tc::Config::new(DType::BF16, 8, 4, 128, 16, 64, false, 16, false, false)
                    .with_warps(4)
                    .with_stages(3),
            )
        },
        check: checks!(crate::check::decode::paged_decode_tc),
    },
    Entry {
        name: "quantize_q8",
        description: "activations to 8 bits per block of 32 (llama.cpp's q8_1 rule), for the dp4a GEMVs",
        default_config: "T = bf16, BLOCK = 1024, num_warps = 4",
        build: || spec::<quantize_q8::Kernel>(quantize_q8::Config::new(DType::BF16, 1024)),
        check: checks!(crate::check::q8::quantize),
    },
    Entry {
        name: "rmsnorm_q8",
        description: "RMSNorm fused with the 8-bit quantization of its output (the dp4a GEMVs' input)",
        default_config: "T = bf16, BLOCK = 4096, num_warps = 8",
        build: || {
            let block = kernels::rmsnorm::block_for(4096);
            spec::<rmsnorm_q8::Kernel>(
                rmsnorm_q8::Config::new(DType::BF16, block).with_warps(kernels::rmsnorm::warps_for(block)),
            )
        },
        check: checks!(crate::check::q8::rmsnorm_quant),
    },
    Entry {
        name: "gemv_q4_1_q8",
        description: "out = xq @ W^T on 8-bit activations with dp4a, W repacked Q4_1 (also Q4_0/Q8_0 variants)",
        default_config: "T = bf16, SILU = false, M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = 2048, num_warps = 4",
        build: || {
            spec::<gemv_q8::Kernel>(
                gemv_q8::Config::new(DType::BF16, QuantFormat::Q4_1, false, 1, 8, 2048).with_warps(4),
            )
        },
        check: checks!(crate::check::q8::gemv),
    },
    Entry {
        name: "paged_decode_reduce",
        description: "merges split-KV partials of paged_decode (checked with paged_decode)",
        default_config: "T = bf16, GROUP = 4, HEAD_DIM = 128, num_warps = 4",
        build: || spec::<paged_decode_reduce::Kernel>(paged_decode_reduce::Config::new(DType::BF16, 4, 128)),
        check: checks!(crate::check::decode::none),
    },
    Entry {
        name: "half_matmul",
        description: "C = A @ B in bf16/f16 with f32 accumulation (tensor cores on sm_80+)",
        default_config: "T = bf16, BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 32, PREFETCH = false, num_warps = 8",
        build: || spec::<half_matmul::Kernel>(kernels::matmul::CONFIGS[0].config(DType::BF16)),
        check: checks!(crate::check::matmul::check),
    },
    Entry {
        name: "flash_attention",
        description: "FlashAttention prefill over the paged KV cache: varlen, GQA, causal or full",
        default_config: "T = bf16, H_Q = 9, H_KV = 3, HEAD_DIM = 64, BLOCK_M = 64, BLOCK_N = 32, CAUSAL = true, num_warps = 4",
        build: || {
            use kernels::flash_attention::{config_for, flash_attention as k};
            spec::<k::Kernel>(config_for(64, DType::BF16, false, 16).config(DType::BF16, 9, 3, 64, 16, true))
        },
        check: checks!(crate::check::attention::flash_attention),
    },
    Entry {
        name: "row_stats",
        description: "row sum/max/argmax and broadcasts of [BR, BC] tiles (codegen coverage)",
        default_config: "BR = 16, BC = 64, num_warps = 4",
        build: || spec::<row_stats::Kernel>(row_stats::Config::new(16, 64)),
        check: checks!(crate::check::decode::row_stats),
    },
    Entry {
        name: "gemv_q4_1",
        description: "out = x @ W^T, W repacked Q4_1, M <= 16 (decode); SILU: silu(x@Wg^T) * (x@Wu^T)",
        default_config: "T = bf16, SILU = false, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = 512, num_warps = 4",
        build: || gemv_spec(QuantFormat::Q4_1, 512),
        check: checks!(crate::check::dequant::gemv_q4_1),
    },
    Entry {
        name: "gemv_q4_1_fused",
        description: "GEMV (any block format) with an RMSNorm prologue or a residual-add epilogue (FUSE)",
        default_config: "T = f32, FUSE = norm, M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = 512, num_warps = 4",
        build: || {
            spec::<gemv_fused::Kernel>(
                gemv_fused::Config::new(
                    DType::F32,
                    DType::F32,
                    QuantFormat::Q4_1,
                    Fuse::NONE.with_norm(true),
                    1,
                    8,
                    512,
                )
                .with_warps(4),
            )
        },
        check: checks!(crate::check::dequant::fused::gemv_fused),
    },
    Entry {
        name: "cpu_gemv_q4_1",
        description: "the fused GEMVs (every format, every FUSE) shaped for CPUs: the native backend's decode",
        default_config: "T = f32, FUSE = norm, M_BLOCK = 1, BLOCK_N = 64, BLOCK_K = 32",
        build: || {
            use kernels::cpu_gemv::cpu_gemv as k;
            spec::<k::Kernel>(k::Config::new(
                DType::F32,
                DType::F32,
                QuantFormat::Q4_1,
                Fuse::NONE.with_norm(true),
                1,
                64,
                32,
            ))
        },
        check: checks!(crate::check::cpu_gemv::cpu_gemv),
    },
    Entry {
        name: "gemv_q4_0",
        description: "out = x @ W^T, W repacked Q4_0, M <= 16 (decode); SILU variant",
        default_config: "T = bf16, SILU = false, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = 512, num_warps = 4",
        build: || gemv_spec(QuantFormat::Q4_0, 512),
        check: checks!(crate::check::dequant::gemv_q4_0),
    },
    Entry {
        name: "gemv_q8_0",
        description: "out = x @ W^T, W repacked Q8_0 (LM head), M <= 16 (decode); SILU variant",
        default_config: "T = bf16, SILU = false, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = 256, num_warps = 4",
        build: || gemv_spec(QuantFormat::Q8_0, 256),
        check: checks!(crate::check::dequant::gemv_q8_0),
    },
    Entry {
        name: "gemv_q4_k",
        description: "out = x @ W^T, W repacked Q4_K (sub-block scales and mins), M <= 16 (decode); SILU variant",
        default_config: "T = bf16, SILU = false, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = 512, num_warps = 4",
        build: || gemv_spec(QuantFormat::Q4_K, 512),
        check: checks!(crate::check::dequant::gemv_q4_k),
    },
    Entry {
        name: "gemv_q6_k",
        description: "out = x @ W^T, W repacked Q6_K (a scale per 16 weights), M <= 16 (decode); SILU variant",
        default_config: "T = bf16, SILU = false, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = 256, num_warps = 4",
        build: || gemv_spec(QuantFormat::Q6_K, 256),
        check: checks!(crate::check::dequant::gemv_q6_k),
    },
    Entry {
        name: "gemm_q4_1",
        description: "out = x @ W^T, W repacked Q4_1, tiled with dot (prefill); SILU variant",
        default_config: "T = bf16, SILU = false, BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, num_warps = 4",
        build: || gemm_spec(QuantFormat::Q4_1, 64),
        check: checks!(crate::check::dequant::gemm_q4_1),
    },
    Entry {
        name: "gemm_q4_0",
        description: "out = x @ W^T, W repacked Q4_0, tiled with dot (prefill); SILU variant",
        default_config: "T = bf16, SILU = false, BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, num_warps = 4",
        build: || gemm_spec(QuantFormat::Q4_0, 64),
        check: checks!(crate::check::dequant::gemm_q4_0),
    },
    Entry {
        name: "gemm_q8_0",
        description: "out = x @ W^T, W repacked Q8_0, tiled with dot (prefill); SILU variant",
        default_config: "T = bf16, SILU = false, BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, num_warps = 4",
        build: || gemm_spec(QuantFormat::Q8_0, 32),
        check: checks!(crate::check::dequant::gemm_q8_0),
    },
];

/// The entry named `name`.
pub fn find(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.name == name)
}

/// A GPU check of a runtime component that is not a single kernel: its
/// family name (as `gpu-check --only` takes it), one line on what it checks,
/// and the check.
pub type Family = (&'static str, &'static str, CheckFn);

/// The check families, run by `gpu-check` after the kernels.
pub const FAMILIES: &[Family] = &[
    (
        "model",
        "tiny Llama: forward vs interpreter, on-device sampling, CUDA-graph replay vs eager launches",
        crate::check::model::model_checks,
    ),
    (
        "grammar",
        "structured output: apply_token_mask vs interpreter bit for bit; the tiny model's regex-constrained \
         batch valid, unconstrained rows bitwise equal alone, graphs vs eager",
        crate::check::grammar::grammar_checks,
    ),
    (
        "schemas",
        "structured output on the real model: ten JSON schemas x twenty prompts on the GPU, every output \
         finishes, parses and validates",
        crate::grammar::schemas::schema_checks,
    ),
    (
        "pdl",
        "programmatic dependent launch: overlapped launch chains exact (eager and graph), no-wait control races",
        crate::check::pdl::pdl_checks,
    ),
    (
        "invariance",
        "batch invariance, bit for bit: linear rows at every batch size and its fusions, decode vs prefill \
         attention rows, the engine matrix and 64 server copies on the real model",
        crate::check::invariance::invariance_checks,
    ),
    (
        "megakernel",
        "the persistent decode step vs the multi-kernel batch-invariant step, bit for bit: tiny model f32/bf16 \
         and a SmolLM2-shaped model, eager and in CUDA graphs",
        crate::check::mega::mega_checks,
    ),
    (
        "megakernel_small",
        "the tiny model's megakernel rows, eager, four decode steps: short enough for compute-sanitizer's \
         racecheck",
        crate::check::mega::mega_small_checks,
    ),
];

/// The check family named `name`.
pub fn find_family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.0 == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_builds_and_verifies() {
        for e in ENTRIES {
            let (f, opts) = (e.build)().unwrap_or_else(|err| panic!("{}: {err}", e.name));
            dsl_core::verify::verify(&f).unwrap();
            assert_eq!(f.name, e.name);
            assert!(opts.num_warps.is_power_of_two());
        }
        assert!(find("softmax").is_some());
        // The kernel plan (`TESSERA_DUMP=plan`) of every entry, for both targets.
        for e in ENTRIES {
            let (f, opts) = (e.build)().unwrap();
            for target in [codegen::Target::Sm80, codegen::Target::Sm90a] {
                let plan = codegen::plan_text(&f, &codegen::CompileOptions::for_launch(target, &opts))
                    .unwrap_or_else(|err| panic!("{} for {target:?}: {err}", e.name));
                assert!(plan.starts_with(&format!("plan @{}\n", e.name)), "{}: {plan}", e.name);
            }
        }
        assert!(find("nope").is_none());
        assert!(find_family("model").is_some() && find_family("softmax").is_none());
    }
}
