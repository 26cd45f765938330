//! Kernel library: the FP8 KV cache (`kernels::kv_cache`, `KV8`) on the
//! interpreter.
//!
//! - Writers: `rope_kv_write` and `rope_arch_kv_write` (NEOX pairs with
//!   QKV bias) with `KV8` store, for every written slot, exactly the bytes
//!   of `kernels::reference::kv_cache::fp8_cache` of the f32 values the
//!   f32 kernels store (same inputs), and leave padding tokens' slots
//!   untouched.
//! - Readers: the decode kernel (`paged_decode_tc`, fast and batch-
//!   invariant configs, split and not) and FlashAttention (unmasked and
//!   masked blocks, pages holding whole key blocks and not) on an FP8 cache
//!   give bit for bit the outputs of the same kernels on a bf16 cache
//!   holding the values the reference reads back from it: the FP8 cache
//!   changes the cached values, never the attention's arithmetic. The fast
//!   decode's f16 products do so on values in their exact range
//!   (`kernels::decode_attention`'s module doc; the GPU's tensor cores may
//!   still differ in a last bit, and `gpu-check` bounds the difference on
//!   values of every magnitude).
//!
//! Heads of very different magnitudes (2^-20 to 2^6; 2^-7 to 2^1 for the
//! fast decode) so the per-head scales differ, random non-zero values,
//! ragged contexts through shuffled block tables.

use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::{Buffer, Cpu, CpuPtr};
use dsl_core::launch::AnyDType;
use kernels::decode_attention::{paged_decode_tc, tc_config};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::kv_cache::cache_bytes;
use kernels::reference::kv_cache::{fp8_cache, fp8_values, slot_ranges};
use kernels::rope::{rope_arch_kv_write, rope_kv_write};
use std::marker::PhantomData;
use tests::reference::Rng;

/// The binades of the heads' magnitudes: all of them, and those where the
/// fast decode's f16 operands hold the 16-bit product's values exactly.
const FULL: (i32, i32) = (-20, 6);
const IN_RANGE: (i32, i32) = (-7, 1);

/// Random cache values `[slots, h_kv, head_dim]` (bf16-representable), each
/// head of one magnitude `2^e`, `e` in `mags`.
fn head_values(rng: &mut Rng, slots: usize, h_kv: usize, head_dim: usize, mags: (i32, i32)) -> Vec<f32> {
    let mut out = Vec::with_capacity(slots * h_kv * head_dim);
    for _ in 0..slots * h_kv {
        let mag = 2f32.powi(rng.below((mags.1 - mags.0 + 1) as u64) as i32 + mags.0);
        for _ in 0..head_dim {
            let v = rng.uniform(-1.0, 1.0) * mag;
            out.push(bf16::from_f32(if v == 0.0 { mag } else { v }).to_f32());
        }
    }
    out
}

/// A shuffled block table of `seqs` sequences of `pages` pages each.
fn tables(rng: &mut Rng, seqs: usize, pages: usize, num_blocks: usize) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    ids[..seqs * pages].to_vec()
}

/// A cache buffer of the bytes `b` (typed bf16, as the runtime allocates it).
fn byte_buffer(b: Vec<u8>) -> Buffer {
    Buffer::from_bytes(DType::BF16, b).expect("an even number of bytes")
}

/// The arguments `$k::Args` of `rope_kv_write` or `rope_arch_kv_write`:
/// the pointers `(qkv, positions, slots, q out, k cache, v cache)`, theta
/// 10000, then the kernel's own fields.
macro_rules! rope_args {
    ($k:ident, $p:expr $(, $f:ident: $v:expr)* $(,)?) => {{
        let (qkv_ptr, pos_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr) = $p;
        $k::Args {
            qkv_ptr, pos_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
            theta: 10000.0, $($f: $v,)* _marker: PhantomData,
        }
    }};
}

/// `rope_kv_write` (or the NEOX/bias `rope_arch_kv_write`) of random QKV
/// rows: the FP8 cache it writes against the reference of the f32 kernel's
/// values, slot by slot; the padding token's slot untouched.
fn writer_case(arch: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let (n_q, n_kv, d) = (6usize, 3usize, 64usize);
    let tokens = 5;
    let slots = 40;
    let row = (n_q + 2 * n_kv) * d;
    // bf16-representable (the f32 run then reads the bf16 run's inputs),
    // some small.
    let qkv: Vec<f64> = (0..tokens * row)
        .map(|i| {
            let v = rng.uniform(-3.0, 3.0) * if i % 7 == 0 { 1e-3 } else { 1.0 };
            f64::from(bf16::from_f32(v).to_f32())
        })
        .collect();
    let positions: Vec<i32> = (0..tokens as i32).map(|t| 3 + 5 * t).collect();
    // Distinct slots; token 2 is padding (-1).
    let slot_of: Vec<i32> = vec![7, 31, -1, 0, 18];
    let bias: Vec<f32> = (0..row).map(|_| rng.uniform(-0.5, 0.5)).collect();
    let run = |dtype: DType, kv8: bool| -> (Vec<u8>, Vec<u8>) {
        let mut cpu = Cpu::new();
        let qp = cpu.add_buffer(Buffer::from_f64(dtype, &qkv));
        let pp = cpu.upload(&positions);
        let sp = cpu.upload(&slot_of);
        let qo = cpu.add_buffer(Buffer::zeros(dtype, tokens * n_q * d));
        let len = if kv8 { cache_bytes(slots, n_kv, d) / dtype.size_bytes() } else { slots * n_kv * d };
        let kp = cpu.add_buffer(Buffer::zeros(dtype, len));
        let vp = cpu.add_buffer(Buffer::zeros(dtype, len));
        let ptrs = (qp, pp, sp, qo, kp, vp);
        if arch {
            let fp = cpu.upload(&[1f32]);
            let bp = cpu.upload(&bias);
            let np = cpu.upload(&[1f32]);
            let args =
                rope_args!(rope_arch_kv_write, ptrs, factors_ptr: fp, bias_ptr: bp, norm_ptr: np, eps: 1e-6);
            let config = rope_arch_kv_write::Config::new(dtype, n_q, n_kv, d, true, false, true, false, kv8);
            rope_arch_kv_write::interpret(&mut cpu, [tokens as u32, 1, 1], &config, &args).unwrap();
        } else {
            let args = rope_args!(rope_kv_write, ptrs);
            let config = rope_kv_write::Config::new(dtype, n_q, n_kv, d, kv8);
            rope_kv_write::interpret(&mut cpu, [tokens as u32, 1, 1], &config, &args).unwrap();
        }
        (cpu.buffer(kp).as_bytes().to_vec(), cpu.buffer(vp).as_bytes().to_vec())
    };
    // The f32 kernel stores the f32 values the FP8 writer quantizes.
    let (k32, v32) = run(DType::F32, false);
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let (kw, vw) = (fp8_cache(&f32s(&k32), slots, n_kv, d), fp8_cache(&f32s(&v32), slots, n_kv, d));
    for dtype in [DType::F32, DType::BF16] {
        let (k8, v8) = run(dtype, true);
        for (name, got, want) in [("K", &k8, &kw), ("V", &v8, &vw)] {
            let mut written = vec![false; got.len()];
            for slot in 0..slots {
                for r in slot_ranges(slot, n_kv, d) {
                    if slot_of.contains(&(slot as i32)) {
                        written[r.clone()].fill(true);
                        assert_eq!(got[r.clone()], want[r], "{dtype:?} arch {arch}: {name} slot {slot}");
                    } else {
                        assert!(got[r].iter().all(|&b| b == 0), "{dtype:?}: {name} slot {slot} written");
                    }
                }
            }
            // Nothing outside the written slots' values and scales (padding).
            assert!(
                got.iter().zip(&written).all(|(&b, &w)| w || b == 0),
                "{dtype:?}: {name} padding written"
            );
        }
    }
}

#[test]
fn fp8_writers_store_the_reference_bytes() {
    writer_case(false, 11);
    writer_case(true, 12);
}

/// One reader case: `seqs` sequences `(q_len, ctx)` over pages of `page`.
struct Reader {
    n_kv: usize,
    group: usize,
    d: usize,
    page: usize,
    seqs: Vec<(usize, usize)>,
}

impl Reader {
    /// Random FP8 caches, the block table and queries of `q_rows` rows.
    fn inputs(&self, rng: &mut Rng, q_rows: usize, mags: (i32, i32)) -> Inputs {
        let max_ctx = self.seqs.iter().map(|s| s.1).max().unwrap_or(1).max(1);
        let pages = max_ctx.div_ceil(self.page);
        let num_blocks = self.seqs.len() * pages + 2;
        let slots = num_blocks * self.page;
        let mut cache = || {
            let bytes =
                fp8_cache(&head_values(rng, slots, self.n_kv, self.d, mags), slots, self.n_kv, self.d);
            let vals = fp8_values(&bytes, slots, self.n_kv, self.d).iter().map(|&v| f64::from(v)).collect();
            (bytes, vals)
        };
        let (k, v) = (cache(), cache());
        let bt = tables(rng, self.seqs.len(), pages, num_blocks);
        let nq = self.n_kv * self.group;
        let q = (0..q_rows * nq * self.d)
            .map(|_| f64::from(bf16::from_f32(rng.uniform(-2.0, 2.0)).to_f32()))
            .collect();
        Inputs { k, v, bt, stride: pages, q }
    }
}

/// One reader case's inputs: `(fp8 cache bytes, bf16 values it reads as)`
/// for K and V, the block table, its stride and the queries.
struct Inputs {
    k: (Vec<u8>, Vec<f64>),
    v: (Vec<u8>, Vec<f64>),
    bt: Vec<i32>,
    stride: usize,
    q: Vec<f64>,
}

impl Inputs {
    /// Q, K and V on `cpu`: the FP8 caches with `kv8`, else the bf16 caches
    /// of their values.
    fn upload(&self, cpu: &mut Cpu, kv8: bool) -> (CpuPtr<AnyDType>, CpuPtr<AnyDType>, CpuPtr<AnyDType>) {
        let bf = |v: &[f64]| Buffer::from_f64(DType::BF16, v);
        let q = cpu.add_buffer(bf(&self.q));
        let (k, v) = if kv8 {
            (byte_buffer(self.k.0.clone()), byte_buffer(self.v.0.clone()))
        } else {
            (bf(&self.k.1), bf(&self.v.1))
        };
        (q, cpu.add_buffer(k), cpu.add_buffer(v))
    }
}

/// The decode kernel on an FP8 cache and on the bf16 cache of its values:
/// the outputs' bits.
fn decode_case(r: &Reader, invariant: bool, split_len: Option<usize>, seed: u64) {
    let mut rng = Rng::new(seed);
    let b = r.seqs.len();
    let inp = r.inputs(&mut rng, b, if invariant { FULL } else { IN_RANGE });
    let (bt, stride) = (&inp.bt, inp.stride);
    let ctx: Vec<i32> = r.seqs.iter().map(|s| s.1 as i32).collect();
    let max_ctx = r.seqs.iter().map(|s| s.1).max().unwrap_or(1).max(1);
    let block_n = 32;
    let (split_len, splits) = match split_len {
        Some(l) => (l, max_ctx.div_ceil(l)),
        None => (max_ctx.div_ceil(block_n) * block_n, 1),
    };
    let nq = r.n_kv * r.group;
    let run = |kv8: bool| -> Vec<u8> {
        let mut cpu = Cpu::new();
        let (qp, kp, vp) = inp.upload(&mut cpu, kv8);
        let op = cpu.add_buffer(Buffer::zeros(DType::BF16, b * nq * r.d));
        let parts = b * r.n_kv * splits * r.group;
        let (po, pm, pl) = (cpu.zeros::<f32>(parts * r.d), cpu.zeros::<f32>(parts), cpu.zeros::<f32>(parts));
        let (btp, slp) = (cpu.upload(bt), cpu.upload(&ctx));
        let args = paged_decode_tc::Args {
            q_ptr: qp,
            k_cache: kp,
            v_cache: vp,
            block_tables: btp,
            bt_stride: stride as i32,
            seq_lens: slp,
            out_ptr: op,
            part_o: po,
            part_m: pm,
            part_l: pl,
            scale: 0.125,
            split_len: split_len as i32,
            _marker: PhantomData,
        };
        let base = tc_config(DType::BF16, r.n_kv, r.group, r.d, r.page, block_n, splits > 1);
        let config = paged_decode_tc::Config { INVARIANT: invariant, KV8: kv8, ..base };
        paged_decode_tc::interpret(&mut cpu, [b as u32, r.n_kv as u32, splits as u32], &config, &args)
            .unwrap();
        let mut out = cpu.buffer(op).as_bytes().to_vec();
        out.extend_from_slice(cpu.buffer(po).as_bytes());
        out.extend_from_slice(cpu.buffer(pm).as_bytes());
        out.extend_from_slice(cpu.buffer(pl).as_bytes());
        out
    };
    assert_eq!(run(true), run(false), "decode: invariant {invariant}, split {split_len}");
}

/// FlashAttention on an FP8 cache and on the bf16 cache of its values.
fn prefill_case(r: &Reader, block_n: usize, causal: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let b = r.seqs.len();
    let rows: usize = r.seqs.iter().map(|s| s.0).sum();
    let inp = r.inputs(&mut rng, rows, FULL);
    let (bt, stride) = (&inp.bt, inp.stride);
    let ctx: Vec<i32> = r.seqs.iter().map(|s| s.1 as i32).collect();
    let mut cu = vec![0i32];
    for s in &r.seqs {
        cu.push(cu.last().unwrap() + s.0 as i32);
    }
    let nq = r.n_kv * r.group;
    let block_m = 16;
    let max_q = r.seqs.iter().map(|s| s.0).max().unwrap_or(1);
    let run = |kv8: bool| -> Vec<u8> {
        let mut cpu = Cpu::new();
        let (qp, kp, vp) = inp.upload(&mut cpu, kv8);
        let op = cpu.add_buffer(Buffer::zeros(DType::BF16, rows * nq * r.d));
        let (btp, slp, cup) = (cpu.upload(bt), cpu.upload(&ctx), cpu.upload(&cu));
        let args = flash_attention::Args {
            q_ptr: qp,
            k_cache_ptr: kp,
            v_cache_ptr: vp,
            o_ptr: op,
            block_tables_ptr: btp,
            seq_lens_ptr: slp,
            cu_seqlens_q_ptr: cup,
            scale: 0.125,
            max_blocks_per_seq: stride as i32,
            _marker: PhantomData,
        };
        let t = fa::TileConfig { invariant: true, kv8, ..fa::TileConfig::new(block_m, block_n, 4) };
        let config = t.config(DType::BF16, nq, r.n_kv, r.d, r.page, causal);
        let grid = fa::grid(max_q, b, nq, block_m);
        flash_attention::interpret(&mut cpu, grid, &config, &args).unwrap();
        cpu.buffer(op).as_bytes().to_vec()
    };
    assert_eq!(run(true), run(false), "prefill: block_n {block_n}, page {}, causal {causal}", r.page);
}

#[test]
fn fp8_decode_reads_exactly_the_cached_values() {
    let r = Reader { n_kv: 3, group: 3, d: 64, page: 16, seqs: vec![(1, 70), (1, 1), (1, 129), (1, 33)] };
    decode_case(&r, false, None, 21);
    decode_case(&r, true, None, 22);
    decode_case(&r, false, Some(64), 23);
    let r = Reader { n_kv: 2, group: 4, d: 128, page: 32, seqs: vec![(1, 95), (1, 40)] };
    decode_case(&r, true, None, 24);
}

#[test]
fn fp8_prefill_reads_exactly_the_cached_values() {
    let r = Reader { n_kv: 3, group: 3, d: 64, page: 16, seqs: vec![(20, 50), (7, 7), (1, 40)] };
    prefill_case(&r, 16, true, 31);
    prefill_case(&r, 32, false, 32);
    let r = Reader { n_kv: 1, group: 2, d: 64, page: 64, seqs: vec![(40, 100)] };
    prefill_case(&r, 32, true, 33);
}
