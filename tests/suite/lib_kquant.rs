//! Kernel library: the formats added for GGUF K-quant files (Q5_0, Q5_1,
//! Q4_K, Q5_K, Q6_K, F16, BF16) through the CPU GEMV (`kernels::cpu_gemv`,
//! the native backend's product at every batch size) on the interpreter,
//! against the f64 reference of `kernels::reference::quant` on the raw GGUF
//! bytes (so the repack is checked too). Weights: random quant, scale and
//! high-bit bytes with random finite f16 `d`/`dmin`/`m` of either sign over
//! several binades; activations random non-zero. Shapes ragged in `M` and
//! `N`, `K` whole super-blocks for the K-quants; plain and with SiLU-mul
//! (gate/up interleaved). Tolerance: the f32 accumulation bound
//! `error_bound` with the format's weight-rounding term, plus the final
//! rounding and the SiLU propagation bound.

use crate::lib_dequant::{Act, activations, check_outputs, reference_gemvs};
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use dsl_macros::kernel;
use kernels::cpu_gemv::weight_tile_any;
use kernels::cpu_gemv::{cpu_gemv, cpu_gemv_tiles};
use kernels::dequant::fused::gemv_fused;
use kernels::dequant::linear::{LINEAR_BLOCK_K, loaded_weights, tile_load};
use kernels::dequant::{
    Fuse, GemvTiles, QuantFormat, Repacked, gemv_grid, gemv_tiles, interleave_gate_up, repack,
};
use kernels::reference::quant as r;
use std::marker::PhantomData;
use tests::reference::Rng;

/// A random finite f16 of either sign with exponent in `[lo, hi)`.
fn f16_value(rng: &mut Rng, lo: i32, hi: i32) -> f16 {
    let e = lo + rng.below((hi - lo) as u64) as i32;
    let v = (1.0 + rng.uniform(0.0, 1.0)) * 2f32.powi(e);
    f16::from_f32(if rng.next_u64() & 1 == 0 { v } else { -v })
}

/// Random GGUF bytes of a `[n, k]` weight in any supported format.
fn gguf_any(rng: &mut Rng, format: QuantFormat, n: usize, k: usize) -> Vec<u8> {
    let mut raw: Vec<u8> = (0..format.gguf_bytes(n, k)).map(|_| rng.next_u64() as u8).collect();
    let put = |b: &mut [u8], v: f16| b.copy_from_slice(&v.to_le_bytes());
    for blk in raw.chunks_exact_mut(format.block_bytes()) {
        match format {
            QuantFormat::F16 => put(blk, f16_value(rng, -4, 2)),
            QuantFormat::BF16 => {
                let v = bf16::from_f32(f16_value(rng, -4, 2).to_f32());
                blk.copy_from_slice(&v.to_le_bytes());
            }
            QuantFormat::Q6_K => put(&mut blk[208..210], f16_value(rng, -12, -6)),
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                put(&mut blk[0..2], f16_value(rng, -12, -6));
                put(&mut blk[2..4], f16_value(rng, -12, -6));
            }
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                put(&mut blk[0..2], f16_value(rng, -8, 0));
                put(&mut blk[2..4], f16_value(rng, -6, 1));
            }
            _ => put(&mut blk[0..2], f16_value(rng, -8, 0)),
        }
    }
    raw
}

/// A random case's operands from `seed`: activations `x` (`m x k`), the
/// GGUF weights (gate and up with `silu`) and their repacked matrix (gate
/// and up interleaved).
fn operands<T: Act>(
    seed: u64,
    format: QuantFormat,
    silu: bool,
    (m, n, k): (usize, usize, usize),
) -> (Vec<T>, Vec<Vec<u8>>, Repacked) {
    let mut rng = Rng::new(seed);
    let x = activations::<T>(&mut rng, m * k);
    let raws: Vec<Vec<u8>> =
        (0..if silu { 2 } else { 1 }).map(|_| gguf_any(&mut rng, format, n, k)).collect();
    let reps: Vec<_> = raws.iter().map(|g| repack(format, g, n, k).unwrap()).collect();
    let w = if silu { interleave_gate_up(&reps[0], &reps[1]).unwrap() } else { reps[0].clone() };
    (x, raws, w)
}

/// Which GEMV a case runs: the CPU GEMV with its native tiles, or the GPU
/// GEMV body (`gemv_fused` without fusions, whose body `gemv` shares) with
/// the given tiles.
#[derive(Clone, Copy, Debug)]
enum Body {
    Cpu,
    Gpu(GemvTiles),
}

/// Runs `body` (no norm, no residual) on the interpreter and checks it
/// against the reference.
fn case<T: Act>(seed: u64, format: QuantFormat, silu: bool, (m, n, k): (usize, usize, usize), body: Body) {
    let (x, raws, w) = operands::<T>(seed, format, silu, (m, n, k));
    let t = match body {
        Body::Cpu => cpu_gemv_tiles(w.format, m, w.n, k),
        Body::Gpu(t) => t,
    };
    let mut cpu = Cpu::new();
    let (xp, qp, sp) = (cpu.upload(&x), cpu.upload(&w.quants), cpu.upload(&w.scales));
    let op = cpu.zeros::<T>(m * n);
    let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
    macro_rules! run {
        ($kk:ident) => {{
            let args = $kk::Args {
                x_ptr: xp.cast(),
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                nw_ptr: xp.cast(),
                out_ptr: op.cast(),
                m: m as i32,
                n: n as i32,
                ldo: n as i32,
                k: k as i32,
                eps: 0.0,
                _marker: PhantomData,
            };
            let fuse = Fuse::NONE.with_silu(silu);
            let config =
                $kk::Config::new(T::DTYPE, T::DTYPE, w.format, fuse, t.m_block, t.block_n, t.block_k)
                    .with_warps(t.num_warps);
            $kk::interpret(&mut cpu, grid, &config, &args).unwrap();
        }};
    }
    match body {
        Body::Cpu => run!(cpu_gemv),
        Body::Gpu(_) => run!(gemv_fused),
    }
    let got: Vec<f64> = cpu.read(op).iter().map(|v| v.to_f64()).collect();
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let ys = reference_gemvs(format, &raws, n, k, &xf, m);
    let what = format!("{body:?} {} silu={silu} m={m} n={n} k={k}", format.name());
    let bound = |y: &r::Gemv, i: usize| r::error_bound(w.format, k, t.block_k, y.abs[i]);
    check_outputs::<T>(&got, &ys, n, bound, &what).unwrap();
}

const NEW: [QuantFormat; 7] = [
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q4_K,
    QuantFormat::Q5_K,
    QuantFormat::Q6_K,
    QuantFormat::F16,
    QuantFormat::BF16,
];

#[test]
fn cpu_gemv_new_formats_f32() {
    for (i, format) in NEW.into_iter().enumerate() {
        let k = if format.is_k_quant() { 512 } else { 96 };
        case::<f32>(11 + i as u64, format, false, (3, 9, k), Body::Cpu);
        case::<f32>(31 + i as u64, format, true, (1, 5, k), Body::Cpu);
    }
}

#[test]
fn cpu_gemv_new_formats_bf16() {
    for (i, format) in NEW.into_iter().enumerate() {
        let k = if format.is_k_quant() { 256 } else { 64 };
        case::<bf16>(51 + i as u64, format, false, (2, 7, k), Body::Cpu);
    }
}

/// The GPU GEMV body on the block formats beyond the word-tiled three
/// (Q5_1, Q4_K, Q5_K, Q6_K): the runtime's tiles; a K tile of 512 quant
/// bytes (Q5_K and Q6_K: one whole tile and a partial one at K 768; Q4_K
/// and Q5_1: no whole tile, only the clamped tail step); four activation rows per
/// program with SiLU-mul; f32 and bf16.
#[test]
fn gpu_gemv_block_formats() {
    let formats = [QuantFormat::Q5_1, QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K];
    for (i, format) in formats.into_iter().enumerate() {
        let k = if format.is_k_quant() { 768 } else { 160 };
        let s = 201 + 4 * i as u64;
        let wide = GemvTiles { m_block: 1, block_n: 4, block_k: format.k_tile(512), num_warps: 2 };
        let rows4 = GemvTiles { m_block: 4, block_n: 8, block_k: format.k_tile(128), num_warps: 4 };
        case::<f32>(s, format, false, (1, 9, k), Body::Gpu(gemv_tiles(format, 1, 9, k)));
        case::<bf16>(s + 1, format, false, (2, 7, k), Body::Gpu(wide));
        case::<bf16>(s + 2, format, true, (5, 6, k), Body::Gpu(rows4));
        case::<f32>(s + 3, format, true, (3, 5, k), Body::Gpu(gemv_tiles(format, 3, 10, k)));
    }
}

/// The batch-invariant product (`linear`, the GPU's default at every batch
/// size) on the new formats: unsplit and split tiles, f16 tensor-core
/// operands and f32, plain and SiLU-mul, a partial last K tile for the
/// 32-block formats; against the reference within `linear`'s bounds.
fn linear_case<T: Act>(
    seed: u64,
    format: QuantFormat,
    silu: bool,
    f16_ops: bool,
    tiles: (usize, usize, bool),
    (m, n, k): (usize, usize, usize),
) {
    use crate::lib_linear::{Fuse, run};
    let (x, raws, w) = operands::<T>(seed, format, silu, (m, n, k));
    let fuse = if silu { Fuse::Silu } else { Fuse::None };
    let out0 = vec![T::from_f32(0.0); m * n];
    let got = run::<T, T>(w.format, fuse, f16_ops, tiles, &x, &x, &out0, &w, (m, n, k)).unwrap();
    let got: Vec<f64> = got.iter().map(|g| g.to_f64()).collect();
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let ys = reference_gemvs(format, &raws, n, k, &xf, m);
    let bound = |y: &r::Gemv, i: usize| {
        if f16_ops {
            r::gemm_swap_error_bound(w.format, k, y.abs[i], y.l1[i], dsl_core::DType::F16)
        } else {
            r::error_bound(w.format, k, 16, y.abs[i])
        }
    };
    let what = format!("linear {} silu={silu} f16={f16_ops} {tiles:?} m={m} n={n} k={k}", format.name());
    check_outputs::<T>(&got, &ys, n, bound, &what).unwrap();
}

#[test]
fn linear_new_formats() {
    for (i, format) in NEW.into_iter().enumerate() {
        let k = if format.is_k_quant() { 512 } else { 160 };
        let s = 71 + 4 * i as u64;
        linear_case::<f32>(s, format, false, false, (16, 16, false), (3, 9, k));
        linear_case::<f32>(s + 1, format, true, true, (16, 32, true), (2, 5, k));
        linear_case::<bf16>(s + 2, format, false, true, (16, 16, false), (5, 7, k));
    }
}

/// The gather from a repacked token-embedding table
/// (`kernels::embedding::embedding_repacked`: llama.cpp's K-quant files
/// store `token_embd` in Q4_K or Q6_K) in every format a table is repacked
/// in (all but Q8_0), against the f64 dequantization of the GGUF bytes: f32 rows within
/// two units of the weight formation's rounding (`|w|` plus the format's
/// weight-rounding term), zero rows for ids out of range; one tile per row
/// and a looped row.
#[test]
fn embedding_gathers_repacked_tables() {
    use kernels::embedding::{block_for, embedding_repacked as kk, repacked_formats};
    for (i, format) in repacked_formats().enumerate() {
        let (vocab, hidden) = (7, if format.is_k_quant() { 512 } else { 160 });
        let mut rng = Rng::new(91 + i as u64);
        let raw = gguf_any(&mut rng, format, vocab, hidden);
        let w = repack(format, &raw, vocab, hidden).unwrap();
        let ids = [3, -1, 6, 0, 7, 3];
        for block in [block_for(hidden), 64] {
            let mut cpu = Cpu::new();
            let (qp, sp, ip) = (cpu.upload(&w.quants), cpu.upload(&w.scales), cpu.upload(&ids));
            let op = cpu.zeros::<f32>(ids.len() * hidden);
            let args = kk::Args {
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                ids_ptr: ip.cast(),
                out_ptr: op.cast(),
                hidden: hidden as i32,
                vocab: vocab as i32,
                _marker: PhantomData,
            };
            let config = kk::Config::new(dsl_core::DType::F32, w.format, block);
            kk::interpret(&mut cpu, [ids.len() as u32, 1, 1], &config, &args).unwrap();
            let got = cpu.read(op);
            for (t, &id) in ids.iter().enumerate() {
                let row = &got[t * hidden..][..hidden];
                let what = format!("{} block {block} token {t} (id {id})", format.name());
                if !(0..vocab as i32).contains(&id) {
                    assert!(row.iter().all(|&v| v == 0.0), "{what}: an out-of-range id gives a zero row");
                    continue;
                }
                let (want, extra) = r::dequant_row(format, &raw, hidden, id as usize);
                for c in 0..hidden {
                    let tol = 2f64.powi(-22) * (want[c].abs() + extra[c]);
                    let err = (row[c] as f64 - want[c]).abs();
                    assert!(err <= tol, "{what} column {c}: {} vs {} (tolerance {tol:e})", row[c], want[c]);
                }
            }
        }
    }
}

/// Both weight formations of `linear`'s tile loader for one
/// `[BN, LINEAR_BLOCK_K]` tile from column `k0`: the word loads
/// (`tile_load`, the weights by `loaded_weights`) then the one-byte-per-weight form
/// (`weight_tile_any`), each `BN * LINEAR_BLOCK_K` f32 values.
#[kernel]
fn weight_tiles_probe(
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<f32>,
    rows: i32,
    k: i32,
    k0: i32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] BN: usize,
) {
    let wrow = minimum(arange(0, BN), rows - 1);
    let (wd, sr) = tile_load(q_ptr, s_ptr, wrow, k / 32, k0, QUANT, BN);
    let words = loaded_weights(wd, sr, QUANT, BN, LINEAR_BLOCK_K);
    let cols = expand_dims(arange(0, LINEAR_BLOCK_K), 0);
    let any = weight_tile_any(q_ptr, s_ptr, expand_dims(wrow, 1), k0 + cols, k, QUANT);
    let o = expand_dims(arange(0, BN), 1) * LINEAR_BLOCK_K + cols;
    store(out_ptr + o, words);
    store(out_ptr + BN * LINEAR_BLOCK_K + o, any);
}

/// `linear`'s word-loaded weights of the quantized formats that are not
/// word-tiled elsewhere (Q5_1, Q4_K, Q5_K, Q6_K) are `weight_tile_any`'s
/// bit for bit (so the batch-invariant product's arithmetic, and the
/// native CPU backend's weights, are unchanged), on random planes, every K
/// tile of the row, rows clamped past the matrix.
#[test]
fn word_loaded_weights_equal_the_per_byte_ones() {
    let (rows, k, bn) = (5, 512, 8);
    for (i, format) in
        [QuantFormat::Q5_1, QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K].into_iter().enumerate()
    {
        let mut rng = Rng::new(0x70 + i as u64);
        let raw = gguf_any(&mut rng, format, rows, k);
        let w = repack(format, &raw, rows, k).unwrap();
        for k0 in (0..k).step_by(LINEAR_BLOCK_K) {
            let mut cpu = Cpu::new();
            let (qp, sp) = (cpu.upload(&w.quants), cpu.upload(&w.scales));
            let op = cpu.zeros::<f32>(2 * bn * LINEAR_BLOCK_K);
            let args = weight_tiles_probe::Args {
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                out_ptr: op.cast(),
                rows: rows as i32,
                k: k as i32,
                k0: k0 as i32,
                _marker: PhantomData,
            };
            let config = weight_tiles_probe::Config::new(w.format, bn);
            weight_tiles_probe::interpret(&mut cpu, [1, 1, 1], &config, &args).unwrap();
            let got = cpu.read(op);
            let (words, any) = got.split_at(bn * LINEAR_BLOCK_K);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(words), bits(any), "{} k0 {k0}", format.name());
            assert!(any.iter().any(|&v| v != 0.0), "{}: an all-zero tile proves nothing", format.name());
        }
    }
}

/// The word-tiled kernels (GEMM, stream-K, Q8 GEMV) index their planes as
/// Q4_0/Q4_1/Q8_0 ones: built for any other format they are refused with
/// an error naming the formats they take, never built to read another
/// format's planes out of bounds. The GEMVs take every block format and
/// refuse the 16-bit floats.
#[test]
fn word_tiled_kernels_refuse_other_formats() {
    use dsl_core::DType;
    use dsl_core::launch::Kernel;
    use kernels::dequant::fused::gemv_fused;
    use kernels::dequant::gemm::gemm;
    use kernels::dequant::gemv::gemv;
    use kernels::dequant::q8::gemv_q8;
    use kernels::dequant::stream_k::gemm_stream_k;
    fn refused<K: Kernel>(config: &K::Config, format: QuantFormat) {
        let e = K::build(config).expect_err(&format!("{} built for {format:?}", K::NAME));
        assert!(e.to_string().contains("take Q4_0, Q4_1 and Q8_0"), "{}: {e}", K::NAME);
    }
    let bf = DType::BF16;
    for f in [QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K, QuantFormat::Q5_1, QuantFormat::F16] {
        refused::<gemm::Kernel>(&gemm::Config::new(bf, bf, f, false, 64, 64, 64, false), f);
        refused::<gemm::Kernel>(&gemm::Config::new(bf, bf, f, false, 64, 64, 64, true), f);
        refused::<gemm_stream_k::Kernel>(&gemm_stream_k::Config::new(bf, f, false, 256, 128, 64), f);
        refused::<gemv_q8::Kernel>(&gemv_q8::Config::new(bf, f, false, 1, 4, 256), f);
    }
    // The formats they take still build.
    for f in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
        gemm::build(&gemm::Config::new(bf, bf, f, false, 64, 64, 64, false)).unwrap();
    }
    // The GEMV takes every block format and refuses the 16-bit floats.
    for f in [QuantFormat::F16, QuantFormat::BF16] {
        for (name, e) in [
            ("gemv", gemv::build(&gemv::Config::new(bf, bf, f, false, 1, 4, 256)).err()),
            (
                "gemv_fused",
                gemv_fused::build(&gemv_fused::Config::new(bf, bf, f, Fuse::NONE.with_norm(true), 1, 4, 256))
                    .err(),
            ),
        ] {
            let e = e.unwrap_or_else(|| panic!("{name} built for {f:?}"));
            assert!(e.to_string().contains("16-bit float weights go through `linear`"), "{name}: {e}");
        }
    }
    for f in [QuantFormat::Q5_1, QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K] {
        gemv::build(&gemv::Config::new(bf, bf, f, false, 1, 4, 256)).unwrap();
    }
}
