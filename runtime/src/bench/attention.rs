//! `tessera bench` rows of FlashAttention prefill (`kernels::flash_attention`),
//! named and counted like peers.py's `attention` records so the table shows
//! the ratio to `sdpa_flash2` / `sdpa_cudnn`.
//!
//! Names: `attention/bf16/hd{hd}/{causal|full}/B{B}xH{H}xL{L}` with peers.py's
//! shapes at `L = 4096`: `B = 4`, `H = 2048 / hd` query heads and as many KV
//! heads (peers.py runs multi-head SDPA), head dims 64 and 128. Metric
//! `TFLOP/s` with `flops = 4 B H L^2 hd`, halved for causal (peers.py's count,
//! whatever work the kernel actually skips).
//!
//! Inputs: random non-zero bf16 Q (`[B L, H hd]`, every sequence a fresh
//! `L`-token prompt, so `cu_seqlens_q = [0, L, 2L, ..]` and `seq_lens = L`),
//! and K/V in a paged cache behind a shuffled block table (peers.py's SDPA
//! reads dense K/V; paging costs the kernel a block-table lookup per key
//! block). The records named like peers.py's use pages of 128 tokens, which
//! hold whole key blocks, so the kernel reads each block as one box of the
//! cache (TMA on sm_90a, as FlashAttention-3 does for pages that are a
//! multiple of its key tile); the same shapes over 16-token pages (a
//! per-key gather by `cp.async`) follow with a `/page16` suffix. Softmax
//! scale `1 / sqrt(hd)`, the default tiles of
//! `kernels::flash_attention::config_for` for the page size.
//!
//! Timing: the method of [`crate::bench`] (L2 flushed before each run, median
//! of CUDA-event times) with at most 2 warm-up launches (at least one: the
//! first launch of a specialization compiles and loads it, which must stay
//! out of the timed events) and at most 10 timed runs.

use crate::bench::{BenchOptions, Record, pick_config, push_measured, time_median_ms};
use crate::check::Rng;
use crate::cuda::Cuda;
use crate::error::Result;
use crate::model::Device;
use crate::model::args::flash_args;
use dsl_core::DType;
use dsl_core::half::bf16;
use kernels::flash_attention::{config_for, flash_attention, grid};

/// Sequence length of the benchmarked prompts (peers.py's `--quick` length).
const L: usize = 4096;
/// Prompts per batch (`16384 / L`, as peers.py sizes it).
const B: usize = 4;
/// Page sizes of the paged KV cache: 128 tokens (the records named like
/// peers.py's; a page holds whole key blocks of every tile, so on sm_90a
/// the kernel copies them as TMA boxes), then 16 (vLLM's default and the
/// runtime's; key blocks gathered by `cp.async`), named with a `/page16`
/// suffix.
const PAGES: [usize; 2] = [128, 16];

/// Measures one `attention/bf16/hd{hd}/...` record.
fn attention_record(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    hd: usize,
    causal: bool,
    page: usize,
    tuned: bool,
) -> Result<Record> {
    let h = 2048 / hd;
    let tokens = B * L;
    let pages_per_seq = L / page;
    let num_blocks = B * pages_per_seq;
    let mut rng = Rng::new((hd * 2 + usize::from(causal)) as u64);
    let q = rng.values::<bf16>(tokens * h * hd, 2.0);
    let k = rng.values::<bf16>(num_blocks * page * h * hd, 2.0);
    let v = rng.values::<bf16>(num_blocks * page * h * hd, 2.0);
    let mut tables: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..tables.len()).rev() {
        tables.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let seq_lens = vec![L as i32; B];
    let cu: Vec<i32> = (0..=B).map(|b| (b * L) as i32).collect();

    let wgmma = cuda.wgmma();
    let gpu = cuda.gpu();
    let (qd, kd, vd) = (gpu.upload(&q)?, gpu.upload(&k)?, gpu.upload(&v)?);
    drop((q, k, v));
    let od = gpu.zeros::<bf16>(tokens * h * hd)?;
    let (bd, sd, cd) = (gpu.upload(&tables)?, gpu.upload(&seq_lens)?, gpu.upload(&cu)?);
    let base = config_for(hd, DType::BF16, wgmma, page).config(DType::BF16, h, h, hd, page, causal);
    let qkvo = (qd.ptr().cast(), kd.ptr().cast(), vd.ptr().cast(), od.ptr().cast());
    let args = flash_args!(
        flash_attention,
        qkvo,
        (bd.ptr(), pages_per_seq),
        (sd.ptr(), cd.ptr()),
        1.0 / (hd as f32).sqrt()
    );
    let grid_of = |c: &flash_attention::Config| grid(L, B, h, c.BLOCK_M);
    let (config, tuned) =
        pick_config::<flash_attention::Kernel>(cuda, tuned, grid_of, (&base, base.clone()), &args)?;
    let g = grid_of(&config);
    let launch = |c: &mut Cuda| c.run::<flash_attention::Kernel>(g, &config, &args);
    let ms = time_median_ms(cuda, opts.warmup.clamp(1, 2), opts.runs.clamp(1, 10), launch)?;
    let flops = 4.0 * (B * h) as f64 * (L * L) as f64 * hd as f64 * if causal { 0.5 } else { 1.0 };
    let mask = if causal { "causal" } else { "full" };
    let suffix = if page == PAGES[0] { String::new() } else { format!("/page{page}") };
    let name = format!("attention/bf16/hd{hd}/{mask}/B{B}xH{h}xL{L}{suffix}");
    Ok(Record::new(name, "TFLOP/s", flops / ms / 1e9, ms).with_tuned(tuned))
}

/// The attention records (head dims 64 and 128, causal and full), printing
/// each as it is measured.
pub fn records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for page in PAGES {
        for hd in [64, 128] {
            for causal in [true, false] {
                for &tuned in opts.tunings() {
                    push_measured(&mut out, attention_record(cuda, opts, hd, causal, page, tuned)?);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_peers_py() {
        // peers.py: B = max(1, 16384 // L), H = 2048 // hd.
        assert_eq!(B, (16384 / L).max(1));
        assert!(PAGES.iter().all(|p| L.is_multiple_of(*p)));
        let t = config_for(128, DType::BF16, false, 16);
        assert_eq!(grid(L, B, 2048 / 128, t.block_m), [(L / t.block_m) as u32, (B * 16) as u32, 1]);
    }
}
