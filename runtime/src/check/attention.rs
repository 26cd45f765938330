//! The GPU check of `flash_attention` (FlashAttention prefill over the paged
//! KV cache, `kernels::flash_attention`): the GPU against the CPU interpreter
//! with the same random non-zero inputs (|x| in [1/64, 2]), causal and full,
//! in f32 and bf16 (one case in f16), at SmolLM2's heads (9 Q, 3 KV, head dim
//! 64) on a ragged varlen batch (a single token after a long prefix, a fresh
//! prompt, an empty query run, chunked prefills whose contexts end mid-page,
//! a 1000-token prefix hit), GQA 4 and MHA at head dim 128, pages of 16, 32
//! and 64 behind shuffled block tables (unused entries `-1`), the default
//! tiles of `kernels::flash_attention::config_for` for the GPU, one small-tile
//! config and every autotune candidate.
//! The output starts filled with 100 (unreachable for |v| <= 2), so rows left
//! unwritten fail.
//!
//! Tolerance per element: both the interpreter and the GPU are within
//! `Attention::error_bound` (kernels::reference::attention) of the exact
//! result, so `|gpu - cpu|` must be within twice that bound; the GPU is also
//! checked against the f64 reference within the bound itself. The bound
//! covers the f32 scores and sums (the GPU reduces rows in another order and
//! uses `ex2.approx`, relative error about 2^-22, well inside its `4 (keys +
//! 8) 2^-24` term) and, in bf16/f16, the rounding of `p` and of the output,
//! which may round to the other neighbour on the two sides.

use crate::check::{CheckRow, DevicePtr, Rng, compare_each, over_cases, to_f64, unit_roundoff};
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::model::args::flash_args;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use kernels::flash_attention::{self as fa, TileConfig, flash_attention};
use kernels::reference::attention::PagedBatch;

/// One launch: the batch (heads, sequences `(q_len, ctx)`, page size),
/// tiles, mask.
#[derive(Clone, Debug)]
struct Case {
    batch: PagedBatch,
    tiles: TileConfig,
    causal: bool,
}

/// SmolLM2's ragged varlen batch: a decode-like single token after 96
/// cached ones, a fresh 37-token prompt, an empty query run, a 130-token
/// chunk after 170 cached tokens, a fresh 64-token prompt, and 5 tokens after
/// a 995-token prefix hit.
fn smollm2_batch() -> Vec<(usize, usize)> {
    vec![(1, 97), (37, 37), (0, 5), (130, 300), (64, 64), (5, 1000)]
}

/// The inputs of one FlashAttention launch.
struct AttentionInputs<'a, T> {
    /// Queries of every sequence's query run, `[tokens, n_q, d]`.
    q: &'a [T],
    /// The paged K cache.
    k: &'a [T],
    /// The paged V cache.
    v: &'a [T],
    /// Block tables, `max_blocks` entries a sequence.
    tables: &'a [i32],
    /// Each sequence's context length.
    seq_lens: &'a [i32],
    /// Cumulative query-run lengths.
    cu: &'a [i32],
}

/// FlashAttention's output for case `c` on `dev` (the output starts at 100
/// everywhere, so rows the kernel must not write are checked too).
fn attention_on<T: ActElem, D: Device>(
    dev: &mut D,
    c: &Case,
    inp: &AttentionInputs<'_, T>,
    max_blocks: usize,
) -> Result<Vec<T>> {
    let b = &c.batch;
    let config = c.tiles.config(T::DEVICE_DTYPE, b.n_q, b.n_kv, b.d, b.block_size, c.causal);
    let max_q = b.seqs.iter().map(|s| s.0).max().unwrap_or(0);
    let grid = fa::grid(max_q, b.seqs.len(), b.n_q, c.tiles.block_m);
    let o_init = vec![T::from_f64(100.0); inp.q.len()];
    let (qd, kd, vd, od) = (dev.upload(inp.q)?, dev.upload(inp.k)?, dev.upload(inp.v)?, dev.upload(&o_init)?);
    let (bd, sd, cd) = (dev.upload(inp.tables)?, dev.upload(inp.seq_lens)?, dev.upload(inp.cu)?);
    let (qkvo, lens) =
        ((dev.ptr(&qd)?, dev.ptr(&kd)?, dev.ptr(&vd)?, dev.ptr(&od)?), (dev.ptr(&sd)?, dev.ptr(&cd)?));
    let args =
        flash_args!(flash_attention, qkvo, (dev.ptr(&bd)?, max_blocks), lens, 1.0 / (b.d as f32).sqrt());
    dev.run::<flash_attention::Kernel>(grid, &config, &args)?;
    dev.download(&od)
}

fn attention_case<T: ActElem, D: Device>(dev: &mut D, rng: &mut Rng, c: &Case) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let (b, bs, d) = (&c.batch, c.batch.block_size, c.batch.d);
    let lay = b.layout(3, |n| rng.next_u64() % n);
    let q = rng.values::<T>(b.total_q() * b.n_q * d, 2.0);
    let (k, v) = (rng.values::<T>(lay.cache_len, 2.0), rng.values::<T>(lay.cache_len, 2.0));
    let scale = 1.0 / (d as f32).sqrt();
    let inp = AttentionInputs {
        q: &q,
        k: &k,
        v: &v,
        tables: &lay.tables,
        seq_lens: &lay.seq_lens,
        cu: &lay.cu_seqlens,
    };
    let got = to_f64(&attention_on(dev, c, &inp, lay.max_blocks)?);
    let want = to_f64(&attention_on(&mut Cpu::new(), c, &inp, lay.max_blocks)?);
    let exact = b.prefill(&to_f64(&q), &to_f64(&k), &to_f64(&v), &lay, scale as f64, c.causal);

    let lens: Vec<String> = b.seqs.iter().map(|&(q, ctx)| format!("{q}/{ctx}")).collect();
    let shape = format!(
        "{}q{}kv{}d {} bs{bs} {}x{} w{} s{}{} q/ctx {}",
        b.n_q,
        b.n_kv,
        d,
        if c.causal { "causal" } else { "full" },
        c.tiles.block_m,
        c.tiles.block_n,
        c.tiles.num_warps,
        c.tiles.num_stages,
        match c.tiles.min_programs_per_sm {
            0 => String::new(),
            n => format!(" {n}/SM"),
        },
        lens.join(",")
    );
    // Within twice the bound of the interpreter, and within the bound of the
    // exact value.
    let keys = b.seqs.iter().map(|s| s.1).max().unwrap_or(0);
    let bound: Vec<f64> =
        (0..got.len()).map(|e| exact.error_bound(e, d, keys, unit_roundoff(dtype))).collect();
    let twice: Vec<f64> = bound.iter().map(|b| 2.0 * b).collect();
    let mut row = compare_each("flash_attention", shape.clone(), dtype, &got, &want, &twice);
    row.pass &= compare_each("flash_attention", shape, dtype, &got, &exact.out, &bound).pass;
    Ok(row)
}

/// The `flash_attention` check: the SmolLM2 varlen batch (pages of 16), GQA 4
/// and MHA at head dim 128 (pages of 32 and 64), long contexts over pages of
/// 128 at head dims 128 and 64 (whole key blocks per page: `load_block`
/// boxes, TMA on sm_90a), causal and full, f32 and bf16 (one f16 case),
/// default tiles, one small-tile config and every autotune candidate.
pub fn flash_attention<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let small = TileConfig::new(16, 16, 4);
    let wgmma = dev.wgmma();
    // Each case with the storage dtype it runs in, in order.
    let mut cases = Vec::new();
    for causal in [true, false] {
        // A case with the default bf16 tiles of its head dim and page size.
        let case = |n_q, n_kv, d, seqs, block_size| Case {
            batch: PagedBatch { n_q, n_kv, d, seqs, block_size },
            tiles: fa::config_for(d, DType::BF16, wgmma, block_size),
            causal,
        };
        let f32_tiles = |c: &Case| Case {
            tiles: fa::config_for(c.batch.d, DType::F32, wgmma, c.batch.block_size),
            ..c.clone()
        };
        let smol = case(9, 3, 64, smollm2_batch(), 16);
        let gqa4 = case(8, 2, 128, vec![(200, 200), (7, 555), (1, 1)], 32);
        let mha = case(4, 4, 128, vec![(77, 130), (128, 128), (3, 67)], 64);
        // Pages of 128 tokens hold whole key blocks of every tile: the
        // unmasked key blocks are boxes of the cache (TMA on sm_90a, with
        // the warpgroups of 8-warp tiles taking turns at the products).
        let long128 = case(4, 2, 128, vec![(300, 700), (129, 129), (1, 260), (0, 3)], 128);
        let long64 = case(4, 2, 64, long128.batch.seqs.clone(), 128);
        cases.extend([
            (DType::F32, f32_tiles(&smol)),
            (DType::BF16, smol.clone()),
            (DType::BF16, Case { tiles: small, ..smol.clone() }),
            (DType::F32, f32_tiles(&gqa4)),
            (DType::BF16, gqa4.clone()),
            (DType::BF16, mha.clone()),
            (DType::F16, mha),
            (DType::BF16, long128.clone()),
            (DType::BF16, long64),
        ]);
        // Every autotune candidate (their warp grids differ: 16 or 32 rows
        // per warp, `p` from registers or through shared memory).
        for tiles in tune_tiles(wgmma) {
            for c in [&smol, &gqa4, &long128] {
                cases.push((DType::BF16, Case { tiles, ..c.clone() }));
            }
        }
    }
    over_cases(dev, seed, cases, |dev, rng, (dtype, c)| match dtype {
        DType::F32 => attention_case::<f32, _>(dev, rng, &c),
        DType::F16 => attention_case::<f16, _>(dev, rng, &c),
        _ => attention_case::<bf16, _>(dev, rng, &c),
    })
}

/// The tiles of `flash_attention`'s declared autotune configs (read from the
/// kernel, so a new config is always checked), boxes where `wgmma` copies
/// them with TMA (as `config_for` decides).
fn tune_tiles(wgmma: bool) -> Vec<TileConfig> {
    let base = flash_attention::Config::new(DType::BF16, 1, 1, 64, 16, 64, 32, false, wgmma, false, false);
    flash_attention::autotune_configs(&base)
        .iter()
        .map(|c| TileConfig {
            block_m: c.BLOCK_M,
            block_n: c.BLOCK_N,
            num_warps: c.num_warps,
            num_stages: c.num_stages,
            min_programs_per_sm: c.min_programs_per_sm,
            boxes: c.BOXES,
            invariant: c.INVARIANT,
            kv8: c.KV8,
        })
        .collect()
}
