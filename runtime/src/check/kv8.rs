//! GPU checks of the FP8 KV cache (`kernels::kv_cache`), appended to the
//! `paged_decode_tc` family:
//!
//! - `rope_kv_write` with `KV8` stores, in every written slot, exactly the
//!   bytes of `kernels::reference::kv_cache::fp8_cache` of the f32 values
//!   the f32 kernel stores on the same device from the same inputs (the
//!   quantization is exact arithmetic and one round-to-nearest-even).
//! - The decode kernel (fast and batch-invariant configs, split and not) and
//!   FlashAttention on an FP8 cache give, on the device, bit for bit the
//!   outputs of the same kernels on the bf16 cache of the values the
//!   reference reads back from it; the fast decode (f16 products) within a
//!   bound of those outputs.
//!
//! A bit-for-bit row's `max_abs` is the number of differing bytes.

use super::{CheckRow, Rng};
use crate::error::Result;
use crate::model::Device;
use crate::model::args::decode_args;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::launch::AnyDType;
use kernels::decode_attention::{kv8_tc_config, paged_decode_tc, tc_config};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::kv_cache::cache_bytes;
use kernels::reference::kv_cache::{fp8_cache, fp8_values, slot_ranges};
use kernels::rope::rope_kv_write;
use std::marker::PhantomData;

/// A check row comparing two byte strings.
fn row(kernel: &str, shape: String, got: &[u8], want: &[u8]) -> CheckRow {
    let differ = if got.len() == want.len() {
        got.iter().zip(want).filter(|(a, b)| a != b).count()
    } else {
        usize::MAX
    };
    CheckRow {
        kernel: kernel.into(),
        shape,
        dtype: DType::BF16,
        max_abs: differ as f64,
        max_rel: 0.0,
        pass: differ == 0,
    }
}

/// The binades of the heads' magnitudes: the full range, and the range in
/// which the fast FP8 decode's f16 operands hold exactly the 16-bit
/// product's values (`kernels::decode_attention`'s module doc: scales from
/// `2^-15`, and scores close enough that no weight falls below `2^-31`).
const FULL: (i32, i32) = (-20, 6);
const IN_RANGE: (i32, i32) = (-7, 1);

/// Random bf16 values `[slots, h_kv, head_dim]`, each head of one magnitude
/// `2^e`, `e` in `mags` (so the heads' scales differ).
fn head_values(rng: &mut Rng, slots: usize, h_kv: usize, head_dim: usize, mags: (i32, i32)) -> Vec<f32> {
    let mut out = Vec::with_capacity(slots * h_kv * head_dim);
    let span = (mags.1 - mags.0 + 1) as u64;
    for _ in 0..slots * h_kv {
        let mag = 2f32.powi((rng.next_u64() % span) as i32 + mags.0);
        let vals = rng.values::<bf16>(head_dim, 1.0);
        out.extend(vals.iter().map(|v| bf16::from_f32(v.to_f32() * mag).to_f32()));
    }
    out
}

/// Bytes as the bf16 elements a cache buffer holds.
fn as_bf16(b: &[u8]) -> Vec<bf16> {
    b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).collect()
}

/// A bf16 buffer as a pointer of any dtype (the kernels' `Ptr<T>`).
fn any<D: Device>(x: &D::Buf<bf16>) -> Result<D::Ptr<'_, AnyDType>> {
    D::ptr_at::<bf16, AnyDType>(x, 0)
}

fn bytes_of(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `rope_kv_write` with `KV8` against the reference of the f32 kernel's
/// values, 7 tokens (one of them padding) of 9 Q / 3 KV heads of 64.
fn writer<D: Device>(dev: &mut D, rng: &mut Rng) -> Result<CheckRow> {
    let (n_q, n_kv, d, tokens, slots) = (9usize, 3usize, 64usize, 7usize, 50usize);
    let qkv = rng.values::<bf16>(tokens * (n_q + 2 * n_kv) * d, 3.0);
    let positions: Vec<i32> = (0..tokens as i32).map(|t| 2 + 9 * t).collect();
    let slot_of: Vec<i32> = vec![4, 49, 17, -1, 0, 33, 21];
    let mut run = |dtype: DType, kv8: bool| -> Result<Vec<u8>> {
        let qd = if dtype == DType::F32 {
            let f: Vec<f32> = qkv.iter().map(|v| v.to_f32()).collect();
            dev.upload(&f).map(|b| (None, Some(b)))?
        } else {
            dev.upload(&qkv).map(|b| (Some(b), None))?
        };
        let len = if kv8 { cache_bytes(slots, n_kv, d) } else { slots * n_kv * d * dtype.size_bytes() };
        let (kd, vd, od) =
            (dev.zeros::<u8>(len)?, dev.zeros::<u8>(len)?, dev.zeros::<u8>(tokens * n_q * d * 4)?);
        let (pd, sd) = (dev.upload(&positions)?, dev.upload(&slot_of)?);
        let qkv_ptr = match &qd {
            (Some(b), _) => D::ptr_at::<bf16, AnyDType>(b, 0)?,
            (_, Some(f)) => D::ptr_at::<f32, AnyDType>(f, 0)?,
            _ => unreachable!("one of the two uploads"),
        };
        let args = rope_kv_write::Args {
            qkv_ptr,
            pos_ptr: D::ptr_at::<i32, i32>(&pd, 0)?,
            slot_ptr: D::ptr_at::<i32, i32>(&sd, 0)?,
            q_out_ptr: D::ptr_at::<u8, AnyDType>(&od, 0)?,
            k_cache_ptr: D::ptr_at::<u8, AnyDType>(&kd, 0)?,
            v_cache_ptr: D::ptr_at::<u8, AnyDType>(&vd, 0)?,
            theta: 10000.0,
            _marker: PhantomData,
        };
        let config = rope_kv_write::Config::new(dtype, n_q, n_kv, d, kv8);
        dev.run::<rope_kv_write::Kernel>([tokens as u32, 1, 1], &config, &args)?;
        let mut out = dev.download(&kd)?;
        out.extend(dev.download(&vd)?);
        Ok(out)
    };
    let plain = run(DType::F32, false)?;
    let f32s: Vec<f32> =
        plain.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let half = f32s.len() / 2;
    let len = cache_bytes(slots, n_kv, d);
    let (kw, vw) = (fp8_cache(&f32s[..half], slots, n_kv, d), fp8_cache(&f32s[half..], slots, n_kv, d));
    let got = run(DType::BF16, true)?;
    // Written slots: values and scales as the reference; the others zero.
    let mut want = vec![0u8; 2 * len];
    for (i, w) in [kw, vw].iter().enumerate() {
        for &s in slot_of.iter().filter(|&&s| s >= 0) {
            for r in slot_ranges(s as usize, n_kv, d) {
                want[i * len + r.start..i * len + r.end].copy_from_slice(&w[r]);
            }
        }
    }
    Ok(row("rope_kv_write [fp8 KV]", format!("{tokens} tokens, 9q/3kv x 64, bf16"), &got, &want))
}

/// The FP8 and bf16 caches of one random cache, and a shuffled block table.
struct Caches {
    k8: Vec<bf16>,
    v8: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    table: Vec<i32>,
    pages: usize,
}

impl Caches {
    /// K and V on `dev`: the FP8 caches with `kv8`, else the bf16 caches of
    /// their values.
    fn upload<D: Device>(&self, dev: &mut D, kv8: bool) -> Result<(D::Buf<bf16>, D::Buf<bf16>)> {
        let (k, v) = if kv8 { (&self.k8, &self.v8) } else { (&self.k, &self.v) };
        Ok((dev.upload(k)?, dev.upload(v)?))
    }
}

#[allow(clippy::too_many_arguments)]
fn caches(
    rng: &mut Rng,
    seqs: usize,
    max_ctx: usize,
    page: usize,
    h_kv: usize,
    d: usize,
    mags: (i32, i32),
) -> Caches {
    let pages = max_ctx.div_ceil(page);
    let blocks = seqs * pages + 1;
    let slots = blocks * page;
    let mut one = || {
        let b = fp8_cache(&head_values(rng, slots, h_kv, d, mags), slots, h_kv, d);
        let v: Vec<bf16> = fp8_values(&b, slots, h_kv, d).iter().map(|&x| bf16::from_f32(x)).collect();
        (as_bf16(&b), v)
    };
    let ((k8, k), (v8, v)) = (one(), one());
    let mut ids: Vec<i32> = (0..blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    Caches { k8, v8, k, v, table: ids[..seqs * pages].to_vec(), pages }
}

/// A check row comparing the decode outputs `got` and `want` (bf16 rows of
/// `d`, then the f32 partials, as [`decode`] downloads them) within the
/// f16 reader's deviation from the 16-bit product
/// (`kernels::decode_attention`'s module doc), far below E4M3's own
/// rounding (`2^-4` of a value). The worst case is a head of keys below
/// `2^-17`, whose scale is zero in f16: its scores, at most `2^-9` here
/// (`|q| <= 2`, 128 dimensions, scale 1/8), become zero, which moves its
/// weights by about `2^-11` of their size, and the output by that much of
/// its values' spread. So an output may move by `2^-9` of `vtop[r]`, the
/// largest value magnitude of its (sequence, KV head) `r` (the outputs
/// themselves, averages, can be far smaller), plus one rounding to bf16
/// either way (`2^-7` of itself) and `2^-20` absolute (values below
/// `2^-8`, rounded in f16, and the tensor cores' last bits); an `o` partial
/// by `2^-9` of `vtop[r]` times its weight sum, a running max by `2^-10`
/// and a weight sum by `2^-11` of itself. `rows` maps an output row (of
/// `d`) to `r`, `part_rows` a partial's row.
fn near_row(
    shape: String,
    (got, want): (&[u8], &[u8]),
    out_bytes: usize,
    d: usize,
    vtop: &[f64],
    (rows, part_rows): (&dyn Fn(usize) -> usize, &dyn Fn(usize) -> usize),
) -> CheckRow {
    let vals = |b: &[u8]| -> (Vec<f64>, Vec<f64>) {
        let (o, p) = b.split_at(out_bytes.min(b.len()));
        let o = o.chunks_exact(2).map(|c| f64::from(bf16::from_le_bytes([c[0], c[1]]).to_f32())).collect();
        let p = p.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect();
        (o, p)
    };
    let ((go, gp), (wo, wp)) = (vals(got), vals(want));
    let (mut max_abs, mut max_rel) = (0f64, 0f64);
    let mut pass = go.len() == wo.len() && gp.len() == wp.len();
    let mut one = |x: f64, y: f64, bound: f64| {
        let diff = (x - y).abs();
        pass &= diff <= bound;
        max_abs = max_abs.max(diff);
        if y.abs() > 0.0 {
            max_rel = max_rel.max(diff / y.abs());
        }
    };
    let e = |k: i32| 2f64.powi(k);
    for (i, (x, y)) in go.iter().zip(&wo).enumerate() {
        one(*x, *y, e(-9) * vtop[rows(i / d)] + e(-7) * y.abs() + e(-20));
    }
    // `part_o` in rows of `d`, then `part_m` and `part_l`.
    let parts = wp.len() / (d + 2);
    if gp.len() == wp.len() {
        let (o, m) = (parts * d, parts * (d + 1));
        for (i, (x, y)) in gp[..o].iter().zip(&wp[..o]).enumerate() {
            let l = wp[m + i / d];
            one(*x, *y, e(-9) * vtop[part_rows(i / d)] * l + e(-14) * y.abs() + e(-16));
        }
        for (x, y) in gp[o..m].iter().zip(&wp[o..m]) {
            one(*x, *y, e(-10));
        }
        for (x, y) in gp[m..].iter().zip(&wp[m..]) {
            one(*x, *y, e(-11) * y.abs());
        }
    }
    CheckRow { kernel: "paged_decode_tc [fp8 KV]".into(), shape, dtype: DType::BF16, max_abs, max_rel, pass }
}

/// The decode kernel on the FP8 cache against the bf16 cache of its values,
/// head magnitudes in the binades `mags`: bit for bit with `exact` (the
/// batch-invariant mode), else within [`near_row`]'s bound.
#[allow(clippy::too_many_arguments)]
fn decode<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    ctx: &[i32],
    (h_kv, group, d, page): (usize, usize, usize, usize),
    (invariant, split_len): (bool, Option<usize>),
    (block_n, warps, stages, per_sm): (usize, u32, u32, u32),
    (mags, exact): ((i32, i32), bool),
) -> Result<CheckRow> {
    let (b, nq) = (ctx.len(), h_kv * group);
    let max_ctx = ctx.iter().copied().max().unwrap_or(1).max(1) as usize;
    let c = caches(rng, b, max_ctx, page, h_kv, d, mags);
    let q = rng.values::<bf16>(b * nq * d, 2.0);
    let (split_len, splits) = match split_len {
        Some(l) => (l, max_ctx.div_ceil(l)),
        None => (max_ctx.div_ceil(block_n) * block_n, 1),
    };
    let mut run = |kv8: bool| -> Result<Vec<u8>> {
        let (kd, vd) = c.upload(dev, kv8)?;
        let (qd, od) = (dev.upload(&q)?, dev.zeros::<bf16>(b * nq * d)?);
        let (td, sd) = (dev.upload(&c.table)?, dev.upload(ctx)?);
        let parts = b * h_kv * splits * group;
        let (po, pm, pl) = (dev.zeros::<f32>(parts * d)?, dev.zeros::<f32>(parts)?, dev.zeros::<f32>(parts)?);
        let args = decode_args!(
            paged_decode_tc,
            (any::<D>(&qd)?, any::<D>(&kd)?, any::<D>(&vd)?, any::<D>(&od)?),
            (D::ptr_at::<i32, i32>(&td, 0)?, c.pages),
            D::ptr_at::<i32, i32>(&sd, 0)?,
            (
                (
                    D::ptr_at::<f32, f32>(&po, 0)?,
                    D::ptr_at::<f32, f32>(&pm, 0)?,
                    D::ptr_at::<f32, f32>(&pl, 0)?
                ),
                split_len
            ),
            0.125
        );
        let base = tc_config(DType::BF16, h_kv, group, d, page, block_n, splits > 1);
        let config = paged_decode_tc::Config { INVARIANT: invariant, KV8: kv8, ..base }
            .with_warps(warps)
            .with_stages(stages)
            .with_min_programs(per_sm);
        dev.run::<paged_decode_tc::Kernel>([b as u32, h_kv as u32, splits as u32], &config, &args)?;
        let mut out = bytes_of(&dev.download(&od)?);
        for p in [&po, &pm, &pl] {
            out.extend(dev.download(p)?.iter().flat_map(|x| x.to_le_bytes()));
        }
        Ok(out)
    };
    let (got, want) = (run(true)?, run(false)?);
    let shape = format!(
        "B{b} ctx<={max_ctx} {nq}q/{h_kv}kv x {d}, invariant {invariant}, {splits} splits, {block_n} keys x {stages} stages, {warps} warps{}, magnitudes 2^{}..2^{}{}",
        if per_sm > 0 { format!(", {per_sm} programs per SM") } else { String::new() },
        mags.0,
        mags.1,
        if exact { "" } else { ", within a bound" }
    );
    Ok(if exact {
        row("paged_decode_tc [fp8 KV]", shape, &got, &want)
    } else {
        // The largest value magnitude of each (sequence, KV head).
        let mut vtop = vec![0f64; b * h_kv];
        for (si, &n) in ctx.iter().enumerate() {
            for key in 0..n.max(0) as usize {
                let slot = c.table[si * c.pages + key / page] as usize * page + key % page;
                for h in 0..h_kv {
                    let at = (slot * h_kv + h) * d;
                    let top = c.v[at..at + d].iter().fold(0f64, |a, x| a.max(f64::from(x.to_f32().abs())));
                    vtop[si * h_kv + h] = vtop[si * h_kv + h].max(top);
                }
            }
        }
        let rows = |r: usize| (r / nq) * h_kv + (r % nq) / group;
        let part_rows = |r: usize| r / (splits * group);
        near_row(shape, (&got, &want), b * nq * d * 2, d, &vtop, (&rows, &part_rows))
    })
}

/// FlashAttention on the FP8 cache against the bf16 cache of its values.
fn prefill<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    seqs: &[(usize, usize)],
    (h_kv, group, d, page): (usize, usize, usize, usize),
    causal: bool,
) -> Result<CheckRow> {
    let (b, nq) = (seqs.len(), h_kv * group);
    let rows: usize = seqs.iter().map(|s| s.0).sum();
    let max_ctx = seqs.iter().map(|s| s.1).max().unwrap_or(1).max(1);
    let c = caches(rng, b, max_ctx, page, h_kv, d, FULL);
    let q = rng.values::<bf16>(rows * nq * d, 2.0);
    let ctx: Vec<i32> = seqs.iter().map(|s| s.1 as i32).collect();
    let mut cu = vec![0i32];
    for s in seqs {
        cu.push(cu[cu.len() - 1] + s.0 as i32);
    }
    let t = fa::config_for(d, DType::BF16, dev.wgmma(), page);
    let max_q = seqs.iter().map(|s| s.0).max().unwrap_or(1);
    let mut run = |kv8: bool| -> Result<Vec<u8>> {
        let (kd, vd) = c.upload(dev, kv8)?;
        let (qd, od) = (dev.upload(&q)?, dev.zeros::<bf16>(rows * nq * d)?);
        let (td, sd, cd) = (dev.upload(&c.table)?, dev.upload(&ctx)?, dev.upload(&cu)?);
        let args = flash_attention::Args {
            q_ptr: any::<D>(&qd)?,
            k_cache_ptr: any::<D>(&kd)?,
            v_cache_ptr: any::<D>(&vd)?,
            o_ptr: any::<D>(&od)?,
            block_tables_ptr: D::ptr_at::<i32, i32>(&td, 0)?,
            seq_lens_ptr: D::ptr_at::<i32, i32>(&sd, 0)?,
            cu_seqlens_q_ptr: D::ptr_at::<i32, i32>(&cd, 0)?,
            scale: 0.125,
            max_blocks_per_seq: c.pages as i32,
            _marker: PhantomData,
        };
        // The plain run boxes its whole blocks as the runtime does; the FP8
        // one never does.
        let config =
            fa::TileConfig { invariant: true, kv8, ..t }.config(DType::BF16, nq, h_kv, d, page, causal);
        dev.run::<flash_attention::Kernel>(fa::grid(max_q, b, nq, t.block_m), &config, &args)?;
        Ok(bytes_of(&dev.download(&od)?))
    };
    let (got, want) = (run(true)?, run(false)?);
    let shape = format!("{rows} rows, ctx<={max_ctx}, {nq}q/{h_kv}kv x {d}, page {page}, causal {causal}");
    Ok(row("flash_attention [fp8 KV]", shape, &got, &want))
}

/// The key block, warps, stages and occupancy hint of the runtime's FP8
/// decode launch outside the invariant mode ([`kv8_tc_config`]): of a grid
/// that fills a GPU twice over unsplit (`wide`), or of a split one.
fn runtime_tile(wide: bool) -> (usize, u32, u32, u32) {
    let c = if wide {
        kv8_tc_config(DType::BF16, 8, 4, 128, 16, false, 512, 132)
    } else {
        kv8_tc_config(DType::BF16, 8, 4, 128, 16, true, 128, 132)
    };
    (c.BLOCK_N, c.num_warps, c.num_stages, c.min_programs_per_sm)
}

/// Every FP8 cache check (see the module doc).
pub fn rows<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let r = &mut rng;
    let (in_range, full, near) = ((IN_RANGE, false), (FULL, true), (FULL, false));
    Ok(vec![
        writer(dev, r)?,
        // Outside the invariant mode the f16 reader comes within a bound of
        // the bf16 cache's result, on values in its exact range and on all.
        decode(dev, r, &[70, 1, 300, 129], (3, 3, 64, 16), (false, None), (64, 4, 3, 0), in_range)?,
        decode(dev, r, &[70, 1, 300, 129], (3, 3, 64, 16), (true, None), (64, 4, 3, 0), full)?,
        decode(dev, r, &[1000, 333], (8, 4, 128, 32), (false, Some(256)), (64, 4, 3, 0), in_range)?,
        decode(dev, r, &[700, 45], (8, 4, 128, 16), (true, None), (64, 4, 3, 0), full)?,
        // The runtime's FP8 tiles outside the invariant mode, wide and split.
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), runtime_tile(true), in_range)?,
        decode(dev, r, &[1000, 333], (8, 4, 128, 32), (false, Some(256)), runtime_tile(false), in_range)?,
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), runtime_tile(true), near)?,
        decode(dev, r, &[1000, 333], (8, 4, 128, 32), (false, Some(256)), runtime_tile(false), near)?,
        // The other autotune shapes of the pipelined FP8 tiles.
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), (32, 4, 4, 0), in_range)?,
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), (128, 4, 2, 0), in_range)?,
        decode(dev, r, &[300, 129, 1], (3, 3, 64, 16), (true, None), (128, 4, 2, 0), full)?,
        prefill(dev, r, &[(128, 300), (7, 7), (1, 65)], (3, 3, 64, 16), true)?,
        prefill(dev, r, &[(200, 200), (50, 150)], (8, 4, 128, 64), true)?,
        prefill(dev, r, &[(64, 100)], (2, 2, 64, 128), false)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::rows;
    use crate::model::emu::Emu;

    /// The checks pass on the Hopper emulation (the interpreter answering
    /// with the GPU's tiles): the FP8 cache reads and writes as specified.
    #[test]
    fn fp8_cache_rows_pass_on_the_hopper_emulation() {
        let mut emu = Emu::new();
        emu.hopper = true;
        for r in rows(&mut emu, 7).unwrap() {
            assert!(r.pass, "{r:?}");
        }
    }
}
