//! `tessera bench --only linear`: the batch-invariant product
//! (`kernels::dequant::linear`) at SmolLM2's projections, bf16, with the
//! fusions the decode step uses: at `M = 1` the RMSNorm prologue (QKV,
//! gate/up with SiLU, the Q8_0 head) or the residual epilogue (O, down); at
//! `M = 64` the plain products of a batched step, and at `M = 128` (a short
//! prompt) and `M = 2048` (a prefill chunk) SmolLM2's projections' plain
//! products.
//!
//! Rows (metric `us`, timing as the dequant rows: L2 flushed before every
//! run, median of CUDA-event times, host work outside the timed span):
//! - `linear/bf16/<what>/M<m>`: the runtime's tiles (`linear_tiles`);
//! - `linear/bf16/<what>/M<m> [BMxBNxBK/Ww]`: every candidate tile of the
//!   sweep (`N/SM`: with registers for `N` programs per SM) (every tile computes the same bits, so the fastest can be the
//!   runtime's choice). Compare with `gemv_fused/bf16/...` (the fast path's
//!   fused GEMVs at `M = 1`) and `gemm/...` rows.

use crate::bench::dequant::{product_planes, time_launch_ms};
use crate::bench::{BenchOptions, Record};
use crate::check::Rng;
use crate::check::dequant::gguf_weight;
use crate::cuda::Cuda;
use crate::error::{Error, Result};
use crate::model::args::product_args;
use crate::model::products::linear_config;
use dsl_core::DType;
use dsl_core::half::bf16;
use kernels::dequant::linear::linear;
use kernels::dequant::{LinearTiles, QuantFormat, linear_grid, repack};

/// The projections: `(label, format, silu, norm at M = 1, residual at M = 1,
/// k, weight rows)`. The `q8_0_` rows are QKV and gate/up in Q8_0 planes
/// (the Q5_0 and Q8_0 matrices of llama.cpp's Q4_K_M files).
/// The last three compare Q4_K and Q6_K (weights formed by the tile loader,
/// `linear::tile_load`) with Q4_1 at K 4096, N 14336: compare their
/// times per GGUF weight byte (Q4_1 0.625, Q4_K 0.5625, Q6_K 0.8203 bytes
/// per weight).
const SHAPES: [(&str, QuantFormat, bool, bool, bool, usize, usize); 10] = [
    ("qkv_norm", QuantFormat::Q4_1, false, true, false, 576, 960),
    ("o_residual", QuantFormat::Q4_1, false, false, true, 576, 576),
    ("gate_up_norm_silu", QuantFormat::Q4_1, true, true, false, 576, 3072),
    ("down_residual", QuantFormat::Q4_1, false, false, true, 1536, 576),
    ("lm_head_norm", QuantFormat::Q8_0, false, true, false, 576, 49152),
    ("q8_0_qkv_norm", QuantFormat::Q8_0, false, true, false, 576, 960),
    ("q8_0_gate_up_norm_silu", QuantFormat::Q8_0, true, true, false, 576, 3072),
    ("q4_1_k4096_n14336", QuantFormat::Q4_1, false, false, false, 4096, 14336),
    ("q4_k_k4096_n14336", QuantFormat::Q4_K, false, false, false, 4096, 14336),
    ("q6_k_k4096_n14336", QuantFormat::Q6_K, false, false, false, 4096, 14336),
];

/// Candidate tiles `(BLOCK_M, BLOCK_N, warps, split)` per batch size
/// (every warp owns 16 rows and at least 8 columns of a tile).
fn tiles(m: usize) -> Vec<(usize, usize, u32, bool)> {
    if m >= 128 {
        vec![
            (128, 128, 8, false),
            (64, 128, 8, false),
            (128, 64, 8, false),
            (128, 64, 4, false),
            (64, 128, 4, false),
            (64, 64, 4, false),
            (64, 256, 8, false),
            (256, 64, 8, false),
            (32, 128, 4, false),
            (128, 32, 4, false),
            (32, 32, 4, false),
            (32, 64, 4, false),
            (32, 32, 4, true),
            (64, 64, 4, true),
        ]
    } else if m == 1 {
        vec![
            (16, 16, 2, true),
            (16, 32, 2, true),
            (16, 32, 4, true),
            (16, 64, 4, true),
            (16, 64, 8, true),
            (16, 128, 8, true),
            (16, 32, 4, false),
            (16, 64, 8, false),
        ]
    } else {
        vec![
            (32, 32, 4, false),
            (64, 64, 4, false),
            (32, 64, 4, false),
            (64, 128, 8, false),
            (16, 32, 4, true),
            (32, 32, 4, true),
            (64, 64, 4, true),
        ]
    }
}

/// [`tiles`], each with ptxas's register budget (`0`), and at `M = 1` the
/// split 16 x 64 tile also with registers for 6, 7 and 8 programs per SM
/// (`min_programs_per_sm`): its programs are short, so how many are
/// resident at once bounds the weights in flight.
fn candidates(m: usize) -> Vec<(usize, usize, u32, bool, u32)> {
    let mut out: Vec<_> = tiles(m).into_iter().map(|(bm, bn, w, s)| (bm, bn, w, s, 0)).collect();
    if m == 1 {
        out.extend([6, 7, 8].map(|p| (16, 64, 4, true, p)));
    }
    out
}

/// Every row of the family (see the module doc).
pub fn records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    // The fast path's fused GEMVs at the same shapes, for comparison.
    let mut out = crate::bench::dequant::fused_records(cuda, opts)?;
    for (label, format, silu, norm1, residual1, k, rows) in SHAPES {
        let mut rng = Rng::new((k * 31 + rows) as u64);
        let raw = gguf_weight(&mut rng, format, rows, k);
        let w = repack(format, &raw, rows, k).map_err(|e| Error::Usage(e.to_string()))?;
        drop(raw);
        let n = if silu { rows / 2 } else { rows };
        // A short prompt (128 rows) and a prefill chunk (2048 rows) at
        // SmolLM2's projections, not the head.
        let batches: &[usize] = if k * rows < 1 << 24 { &[1, 64, 128, 2048] } else { &[1, 64] };
        for &m in batches {
            let (norm, residual) = if m == 1 { (norm1, residual1) } else { (false, false) };
            let x = rng.values::<bf16>(m * k, 2.0);
            let nw = rng.values::<bf16>(k, 2.0);
            let r = rng.values::<bf16>(m * n, 2.0);
            let gpu = cuda.gpu();
            // Room for any candidate's split products (16-row tiles of 16 columns).
            let (wsd, cntd) = (
                gpu.zeros::<f32>(m.next_multiple_of(64) * rows.next_multiple_of(128) * k.div_ceil(128))?,
                gpu.zeros::<i32>(rows)?,
            );
            let (xd, qd, sd, nd, od) = (
                gpu.upload(&x)?,
                gpu.upload(&w.quants)?,
                gpu.upload(&w.scales)?,
                gpu.upload(&nw)?,
                gpu.upload(&r)?,
            );
            let args = product_args!(
                linear,
                product_planes(&qd, &sd, &od),
                (m, n, k),
                x_ptr: xd.ptr().cast(),
                nw_ptr: nd.ptr().cast(),
                ws_ptr: wsd.ptr().cast(),
                cnt_ptr: cntd.ptr().cast(),
                ldo: n as i32,
                eps: 1e-5,
            );
            let (base, grid, _) =
                linear_config(DType::BF16, DType::BF16, format, m, rows, k, silu, norm, residual, true);
            let name = format!("linear/bf16/{label}/M{m}");
            let ms = time_launch_ms::<linear::Kernel>(cuda, opts, grid, &base, &args)?;
            eprintln!("measured {name}: {:.2} us", ms * 1e3);
            out.push(Record::latency(name.clone(), ms));
            for (bm, bn, warps, split, per_sm) in candidates(m) {
                let mut c = base.clone();
                (c.BLOCK_M, c.BLOCK_N, c.SPLIT) = (bm, bn, split);
                let c = c.with_warps(warps).with_min_programs(per_sm);
                let t = LinearTiles { block_m: bm, block_n: bn, num_warps: warps, split };
                let g = linear_grid(m, n, k, silu, &t);
                let ms = time_launch_ms::<linear::Kernel>(cuda, opts, g, &c, &args)?;
                let per_sm = if per_sm > 0 { format!(" {per_sm}/SM") } else { String::new() };
                let variant =
                    format!("{name} [{bm}x{bn}/{warps}w{}{per_sm}]", if split { " split" } else { "" });
                eprintln!("measured {variant}: {:.2} us", ms * 1e3);
                out.push(Record::latency(variant, ms));
            }
        }
    }
    Ok(out)
}
