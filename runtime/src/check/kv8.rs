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
//!   reference reads back from it.
//!
//! A row's `max_abs` is the number of differing bytes.

use super::{CheckRow, Rng};
use crate::error::Result;
use crate::model::Device;
use crate::model::args::decode_args;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::launch::AnyDType;
use kernels::decode_attention::{kv8_tc_config, paged_decode_tc, tc_config};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::kv_cache::slot_bytes;
use kernels::reference::kv_cache::{fp8_cache, fp8_values};
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

/// Random bf16 values `[slots, h_kv, head_dim]`, each head of one magnitude
/// from 2^-20 to 2^6 (so the heads' scales differ).
fn head_values(rng: &mut Rng, slots: usize, h_kv: usize, head_dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(slots * h_kv * head_dim);
    for _ in 0..slots * h_kv {
        let mag = 2f32.powi((rng.next_u64() % 27) as i32 - 20);
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
        let len = slots * if kv8 { slot_bytes(n_kv, d) } else { n_kv * d * dtype.size_bytes() };
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
    let sb = slot_bytes(n_kv, d);
    let (kw, vw) = (fp8_cache(&f32s[..half], slots, n_kv, d), fp8_cache(&f32s[half..], slots, n_kv, d));
    let got = run(DType::BF16, true)?;
    // Written slots: values and scales as the reference; the others zero.
    let mut want = vec![0u8; 2 * slots * sb];
    for (i, w) in [kw, vw].iter().enumerate() {
        for &s in slot_of.iter().filter(|&&s| s >= 0) {
            let at = i * slots * sb + s as usize * sb;
            let used = n_kv * (d + 4);
            want[at..at + used].copy_from_slice(&w[s as usize * sb..s as usize * sb + used]);
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

fn caches(rng: &mut Rng, seqs: usize, max_ctx: usize, page: usize, h_kv: usize, d: usize) -> Caches {
    let pages = max_ctx.div_ceil(page);
    let blocks = seqs * pages + 1;
    let slots = blocks * page;
    let mut one = || {
        let b = fp8_cache(&head_values(rng, slots, h_kv, d), slots, h_kv, d);
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

/// The decode kernel on the FP8 cache against the bf16 cache of its values.
fn decode<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    ctx: &[i32],
    (h_kv, group, d, page): (usize, usize, usize, usize),
    (invariant, split_len): (bool, Option<usize>),
    (block_n, warps, stages, per_sm): (usize, u32, u32, u32),
) -> Result<CheckRow> {
    let (b, nq) = (ctx.len(), h_kv * group);
    let max_ctx = ctx.iter().copied().max().unwrap_or(1).max(1) as usize;
    let c = caches(rng, b, max_ctx, page, h_kv, d);
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
        "B{b} ctx<={max_ctx} {nq}q/{h_kv}kv x {d}, invariant {invariant}, {splits} splits, {block_n} keys x {stages} stages, {warps} warps{}",
        if per_sm > 0 { format!(", {per_sm} programs per SM") } else { String::new() }
    );
    Ok(row("paged_decode_tc [fp8 KV]", shape, &got, &want))
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
    let c = caches(rng, b, max_ctx, page, h_kv, d);
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
    Ok(vec![
        writer(dev, r)?,
        decode(dev, r, &[70, 1, 300, 129], (3, 3, 64, 16), (false, None), (64, 4, 3, 0))?,
        decode(dev, r, &[70, 1, 300, 129], (3, 3, 64, 16), (true, None), (64, 4, 3, 0))?,
        decode(dev, r, &[1000, 333], (8, 4, 128, 32), (false, Some(256)), (64, 4, 3, 0))?,
        decode(dev, r, &[700, 45], (8, 4, 128, 16), (true, None), (64, 4, 3, 0))?,
        // The runtime's FP8 tiles outside the invariant mode, wide and split.
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), runtime_tile(true))?,
        decode(dev, r, &[1000, 333], (8, 4, 128, 32), (false, Some(256)), runtime_tile(false))?,
        // The other autotune shapes of the pipelined FP8 tiles.
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), (32, 4, 4, 0))?,
        decode(dev, r, &[515, 2, 64], (8, 4, 128, 16), (false, None), (128, 4, 2, 0))?,
        decode(dev, r, &[300, 129, 1], (3, 3, 64, 16), (true, None), (128, 4, 2, 0))?,
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
