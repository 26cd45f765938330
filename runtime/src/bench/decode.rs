//! Paged decode attention throughput on peers.py's decode shapes
//! (`decode/bf16/B<b>/L<l>/hq<q>_hkv<k>_hd<d>`, TB/s of K and V bytes read,
//! `2 * B * L * hkv * hd * 2`), so the ratio to the dense SDPA row of the
//! same name is the speedup. Our K/V live in a paged cache of 16-token pages
//! behind a shuffled block table (what the runtime does), every sequence at
//! the full length `L`; the timed work is the decode kernel plus, when the
//! split plan splits the context, the reduce kernel. The rows named like
//! peers.py's run the tensor-core kernel (`paged_decode_tc`); rows marked
//! `[streams]` run the per-lane-stream kernel (`paged_decode`, what f32
//! caches use) on the same bf16 inputs, for comparison; rows marked `[fp8
//! KV]` the tensor-core kernel on an FP8 cache (`kernels::kv_cache`) of the
//! same shape, in TB/s of the FP8 cache's bytes (values and scales, `2 * B *
//! L * slot_bytes`); the table compares those rows by time, with the plain
//! row (`16-bit cache 0.95x`: the token rate's ratio) and with the peers on
//! it.

use crate::bench::{BenchOptions, Record, pick_config, push_measured, time_median_ms};
use crate::check::Rng;
use crate::cuda::Cuda;
use crate::error::Result;
use crate::model::Device;
use crate::model::args::decode_args;
use dsl_core::DType;
use dsl_core::half::bf16;
use kernels::decode_attention::{
    kv8_tc_config, paged_decode, paged_decode_reduce, paged_decode_tc, split_plan, tc_config,
};
use kernels::kv_cache::{KV8_GROUP, cache_bytes, slot_bytes};
use kernels::reference::kv_cache::fp8_cache;
use std::marker::PhantomData;

/// peers.py's decode shapes: (batch, context, query heads, KV heads, head dim).
pub const SHAPES: [(usize, usize, usize, usize, usize); 5] = [
    (1, 4096, 32, 8, 128),
    (64, 2048, 32, 8, 128),
    (64, 8192, 32, 8, 128),
    (1, 2048, 9, 3, 64),
    (32, 1024, 9, 3, 64),
];

/// Tokens per cache page in the bench (vLLM's default).
const PAGE: usize = 16;

fn decode_record(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    (b, l, hq, hkv, hd): (usize, usize, usize, usize, usize),
    tc: bool,
    tuned: bool,
    kv8: bool,
) -> Result<Record> {
    let group = hq / hkv;
    let pages = l.div_ceil(PAGE);
    let num_blocks = b * pages;
    let cache = num_blocks * PAGE * hkv * hd;
    let mut rng = Rng::new((b * 131 + l) as u64);
    // A random pattern repeated over the cache (generating a GB per tensor on
    // the host would dominate the bench's time; the kernel cannot tell).
    let pattern = rng.values::<bf16>(1 << 20, 2.0);
    let fill: Vec<bf16> = if kv8 {
        // Whole FP8 groups of slots of random values, as bytes in bf16 pairs.
        let slots = (1 << 20) / (hkv * hd) / KV8_GROUP * KV8_GROUP;
        let vals: Vec<f32> = pattern[..slots * hkv * hd].iter().map(|v| v.to_f32()).collect();
        let bytes = fp8_cache(&vals, slots, hkv, hd);
        let n = cache_bytes(num_blocks * PAGE, hkv, hd) / 2;
        bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).cycle().take(n).collect()
    } else {
        pattern.iter().copied().cycle().take(cache).collect()
    };
    let (kd, vd) = (cuda.gpu().upload(&fill)?, cuda.gpu().upload(&fill)?);
    drop(fill);
    let q = rng.values::<bf16>(b * hq * hd, 2.0);
    let qd = cuda.gpu().upload(&q)?;
    let mut table: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let (td, sd) = (cuda.gpu().upload(&table)?, cuda.gpu().upload(&vec![l as i32; b])?);
    let sms = cuda.gpu().info().sm_count as usize;
    let (split_len, splits) = split_plan(b, hkv, l, sms, 32);
    let split = splits > 1;
    let parts = b * hkv * splits * group;
    let od = cuda.gpu().zeros::<bf16>(b * hq * hd)?;
    let (pod, pmd, pld) = (
        cuda.gpu().zeros::<f32>(parts * hd)?,
        cuda.gpu().zeros::<f32>(parts)?,
        cuda.gpu().zeros::<f32>(parts)?,
    );
    macro_rules! args {
        ($k:ident) => {{
            let qkvo = (qd.ptr().cast(), kd.ptr().cast(), vd.ptr().cast(), od.ptr().cast());
            let parts = ((pod.ptr(), pmd.ptr(), pld.ptr()), split_len);
            decode_args!($k, qkvo, (td.ptr(), pages), sd.ptr(), parts, 1.0 / (hd as f32).sqrt())
        }};
    }
    let grid = [b as u32, hkv as u32, splits as u32];
    let (tc_args, st_args) = (args!(paged_decode_tc), args!(paged_decode));
    // The runtime's configs: the FP8 cache's own tile (`kv8_tc_config`).
    let tc_base = if kv8 {
        kv8_tc_config(DType::BF16, hkv, group, hd, PAGE, split, b * hkv * splits, sms)
    } else {
        tc_config(DType::BF16, hkv, group, hd, PAGE, 64, split).with_warps(4).with_stages(3)
    };
    let st_base = paged_decode::Config::new(DType::BF16, hkv, group, hd, PAGE, 16, split);
    let (tc_config, st_config, tuned) = match (tc, tuned) {
        (true, true) => {
            let untuned = tc_base.clone();
            let (config, words) =
                pick_config::<paged_decode_tc::Kernel>(cuda, true, |_| grid, (&tc_base, untuned), &tc_args)?;
            (config, st_base, words)
        }
        (false, true) => {
            let untuned = st_base.clone();
            let (config, words) =
                pick_config::<paged_decode::Kernel>(cuda, true, |_| grid, (&st_base, untuned), &st_args)?;
            (tc_base, config, words)
        }
        (_, false) => (tc_base, st_base.with_warps(8), None),
    };
    let rconfig = paged_decode_reduce::Config::new(DType::BF16, group, hd);
    let rargs = paged_decode_reduce::Args {
        part_o: pod.ptr(),
        part_m: pmd.ptr(),
        part_l: pld.ptr(),
        seq_lens: sd.ptr(),
        out_ptr: od.ptr().cast(),
        split_len: split_len as i32,
        max_splits: splits as i32,
        _marker: PhantomData,
    };
    let rgrid = [b as u32, hq as u32, 1];
    let ms = time_median_ms(cuda, opts.warmup, opts.runs, |c| {
        if tc {
            c.run::<paged_decode_tc::Kernel>(grid, &tc_config, &tc_args)?;
        } else {
            c.run::<paged_decode::Kernel>(grid, &st_config, &st_args)?;
        }
        if split {
            c.run::<paged_decode_reduce::Kernel>(rgrid, &rconfig, &rargs)?;
        }
        Ok(())
    })?;
    let bytes =
        if kv8 { 2.0 * (b * l * slot_bytes(hkv, hd)) as f64 } else { 2.0 * (b * l * hkv * hd) as f64 * 2.0 };
    let variant = match (tc, kv8) {
        (_, true) => " [fp8 KV]",
        (true, false) => "",
        (false, false) => " [streams]",
    };
    let base = format!("decode/bf16/B{b}/L{l}/hq{hq}_hkv{hkv}_hd{hd}");
    let name = format!("{base}{variant}");
    let rec = Record::new(name, "TB/s", bytes / ms / 1e9, ms).with_tuned(tuned);
    // An FP8 row does the 16-bit row's work: the table compares their times.
    Ok(if kv8 { rec.with_work_of(base, "16-bit cache") } else { rec })
}

/// The decode rows (plus autotuned ones with `--autotune`).
pub fn records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for shape in SHAPES {
        for &tuned in opts.tunings() {
            push_measured(&mut out, decode_record(cuda, opts, shape, true, tuned, false)?);
        }
        push_measured(&mut out, decode_record(cuda, opts, shape, false, opts.autotune, false)?);
        for &tuned in opts.tunings() {
            push_measured(&mut out, decode_record(cuda, opts, shape, true, tuned, true)?);
        }
    }
    Ok(out)
}
