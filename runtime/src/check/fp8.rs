//! The checks of `kernels::fp8`: per-group FP8 quantization and its inverse
//! on the device against the interpreter, bit for bit (the conversions are
//! the hardware's `cvt.rn.satfinite` on sm_90a and integer code elsewhere,
//! the interpreter's those of the language's definition): codes, scales,
//! and every one of the 256 codes of each format decoded; and the
//! block-scaled FP8 product against its f64 reference within the derived
//! bound.

use crate::bench::{BenchOptions, Record, push_measured, time_median_ms};
use crate::check::{CheckRow, DevicePtr, EXACT, Rng, compare, compare_each, outcome};
use crate::cuda::{Cuda, DeviceElem};
use crate::error::Result;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::float8::{F8E4M3, F8E5M2};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::fp8::{dequantize_fp8, quantize_fp8, scaled_matmul_fp8};
use std::marker::PhantomData;

/// Codes and scales of `x` (`[rows, n]`) quantized to `Q`'s format on `dev`.
fn quantize_on<T: ActElem, Q: DeviceElem, D: Device>(
    dev: &mut D,
    x: &[T],
    (rows, n): (usize, usize),
    (group, groups): (usize, usize),
) -> Result<(Vec<u8>, Vec<f32>)> {
    let n_groups = n.div_ceil(group);
    let (xd, qd, sd) = (dev.upload(x)?, dev.zeros::<Q>(rows * n)?, dev.zeros::<f32>(rows * n_groups)?);
    let args = quantize_fp8::Args {
        x_ptr: dev.ptr(&xd)?,
        q_ptr: dev.ptr(&qd)?,
        s_ptr: dev.ptr(&sd)?,
        n: n as i32,
        stride: n as i32,
        _marker: PhantomData,
    };
    let config = quantize_fp8::Config::new(T::DEVICE_DTYPE, Q::DEVICE_DTYPE, group, groups, false);
    dev.run::<quantize_fp8::Kernel>([rows as u32, n.div_ceil(group * groups) as u32, 1], &config, &args)?;
    let codes = dev.download(&qd)?.iter().map(|q| code_of(*q)).collect();
    Ok((codes, dev.download(&sd)?))
}

/// The byte of an 8-bit float.
fn code_of<Q: DeviceElem>(q: Q) -> u8 {
    let mut b = [0u8];
    q.write_le(&mut b);
    b[0]
}

fn quantize_case<T: ActElem, Q: DeviceElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (rows, n): (usize, usize),
    tiles: (usize, usize),
) -> Result<Vec<CheckRow>> {
    // Magnitudes over 2^-12 .. 2^12 in every row, an all-zero first group.
    let x: Vec<T> = (0..rows * n)
        .map(|i| {
            let e = (rng.next_u64() % 25) as i32 - 12;
            T::from_f64(if i < tiles.0.min(n) { 0.0 } else { rng.nonzero(2.0) * 2f64.powi(e) })
        })
        .collect();
    let (gc, gs) = quantize_on::<T, Q, D>(dev, &x, (rows, n), tiles)?;
    let (wc, ws) = quantize_on::<T, Q, Cpu>(&mut Cpu::new(), &x, (rows, n), tiles)?;
    let shape = format!("{rows}x{n} groups of {} -> {}", tiles.0, Q::DEVICE_DTYPE);
    Ok(vec![
        outcome("quantize_fp8 codes", shape.clone(), T::DEVICE_DTYPE, &gc, &wc, EXACT),
        outcome("quantize_fp8 scales", shape, T::DEVICE_DTYPE, &gs, &ws, EXACT),
    ])
}

/// The `quantize_fp8` check: f32 and bf16 inputs to E4M3 and E5M2, groups
/// of 128 (the block-scaled products' activation groups) and 32, ragged
/// rows; codes and scales bit for bit against the interpreter.
pub fn quantize<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (shape, tiles) in [((1, 300), (128, 2)), ((7, 4096), (128, 4)), ((33, 576), (32, 4))] {
        out.extend(quantize_case::<f32, F8E4M3, D>(dev, &mut rng, shape, tiles)?);
        out.extend(quantize_case::<bf16, F8E4M3, D>(dev, &mut rng, shape, tiles)?);
        out.extend(quantize_case::<f32, F8E5M2, D>(dev, &mut rng, shape, tiles)?);
        out.extend(quantize_case::<bf16, F8E5M2, D>(dev, &mut rng, shape, tiles)?);
    }
    Ok(out)
}

/// Every code of `Q`'s format dequantized with a scale of 1 to f32 on `dev`.
fn decode_all<Q: DeviceElem, D: Device>(dev: &mut D, codes: &[Q]) -> Result<Vec<f32>> {
    let (qd, sd, od) = (dev.upload(codes)?, dev.upload(&[1f32, 1.0])?, dev.zeros::<f32>(256)?);
    let args = dequantize_fp8::Args {
        q_ptr: dev.ptr(&qd)?,
        s_ptr: dev.ptr(&sd)?,
        out_ptr: dev.ptr(&od)?,
        n: 256,
        stride: 256,
        _marker: PhantomData,
    };
    let config = dequantize_fp8::Config::new(Q::DEVICE_DTYPE, DType::F32, 128, 1);
    dev.run::<dequantize_fp8::Kernel>([1, 2, 1], &config, &args)?;
    dev.download(&od)
}

fn decode_case<Q: DeviceElem, D: Device>(dev: &mut D) -> Result<CheckRow> {
    let codes: Vec<Q> = (0..=255u8).map(|b| Q::read_le(&[b])).collect();
    let got = decode_all::<Q, D>(dev, &codes)?;
    let want = decode_all::<Q, Cpu>(&mut Cpu::new(), &codes)?;
    // Bit for bit (signed zeros included); NaN codes only need to read as NaN.
    let same = |g: f32, w: f32| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
    let bits = |v: &[f32], w: &[f32]| -> Vec<f64> {
        v.iter().zip(w).map(|(&g, &w)| if same(g, w) { 0.0 } else { 1.0 }).collect()
    };
    let zero = vec![0.0; 256];
    Ok(compare(
        "dequantize_fp8 every code",
        "256 codes".into(),
        Q::DEVICE_DTYPE,
        &bits(&got, &want),
        &zero,
        EXACT,
    ))
}

/// The `dequantize_fp8` check: every code of both formats, bit for bit.
pub fn dequantize<D: Device>(dev: &mut D, _seed: u64) -> Result<Vec<CheckRow>> {
    Ok(vec![decode_case::<F8E4M3, D>(dev)?, decode_case::<F8E5M2, D>(dev)?])
}

/// The tile of the block-scaled forms in the `scaled_matmul_fp8` check:
/// `BLOCK_M` 64, `BLOCK_N` 128 (one weight scale per tile and K block), 4
/// warps (one warpgroup), the K loop pipelined 2 deep (48 KiB of rings;
/// the registers allow three programs per SM; at 8192^3 faster than 3
/// deep, `bench --only fp8`). The paired form at this tile is the fastest
/// block-scaled program where `m` is a few hundred rows.
pub const SCALED_TILE: (usize, usize, u32, u32) = (64, 128, 4, 2);

/// The paired block-scaled form's large tile, the fastest block-scaled
/// program on large squares (`bench --only fp8`): 128 x 128 on 8 warps
/// (two warpgroups of 64 rows), two K blocks a trip, 2 stages (128 KiB of
/// rings on sm_90a with K a multiple of 16, one program per SM). The check
/// runs the paired form on this tile and on [`SCALED_TILE`]. (Not the
/// registry's default: where K is not a multiple of 16, and on sm_80, its
/// registers spill.)
pub const PAIRED_TILE: (usize, usize, u32, u32) = (128, 128, 8, 2);

/// The tile of the per-tensor form in the check: 128 x 256 on 8 warps (two
/// warpgroups), 3 stages.
pub const PER_TENSOR_TILE: (usize, usize, u32, u32) = (128, 256, 8, 3);

/// Random codes of `Q`'s format whose values are the integers -2..=2, and
/// their values: every partial sum of fewer than 2^11 of their products is an
/// integer below 2^13, which any of the kernel's summations (even the
/// tensor cores' 14-bit one) holds exactly.
fn small_int_codes<Q: DeviceElem>(rng: &mut Rng, len: usize) -> (Vec<Q>, Vec<f64>) {
    let table: Vec<(Q, f64)> = (0..=255u8)
        .map(|b| Q::read_le(&[b]))
        .map(|q| (q, q.to_f64()))
        .filter(|&(_, v)| v.abs() <= 2.0 && v.fract() == 0.0 && (v != 0.0 || v.is_sign_positive()))
        .collect();
    (0..len).map(|_| table[(rng.next_u64() % table.len() as u64) as usize]).unzip()
}

/// Random finite codes of `Q`'s format and their values.
fn finite_codes<Q: DeviceElem>(rng: &mut Rng, len: usize) -> (Vec<Q>, Vec<f64>) {
    let mut codes = Vec::with_capacity(len);
    let mut vals = Vec::with_capacity(len);
    while codes.len() < len {
        let q = Q::read_le(&[(rng.next_u64() % 256) as u8]);
        let v = q.to_f64();
        if v.is_finite() {
            codes.push(q);
            vals.push(v);
        }
    }
    (codes, vals)
}

/// The arguments of `scaled_matmul_fp8` for `m x n x k` in the buffers of
/// `D` (codes `a`, `b`; scales `sa`, `sb`; bf16 output `c`).
fn scaled_args<'a, Q: DeviceElem, D: Device + 'a>(
    [a, b]: [&'a D::Buf<Q>; 2],
    [sa, sb]: [&'a D::Buf<f32>; 2],
    c: &'a D::Buf<bf16>,
    (m, n, k): (usize, usize, usize),
) -> Result<scaled_matmul_fp8::Args<'a, D>> {
    Ok(scaled_matmul_fp8::Args {
        a_ptr: D::ptr_at(a, 0)?,
        sa_ptr: D::ptr_at(sa, 0)?,
        b_ptr: D::ptr_at(b, 0)?,
        sb_ptr: D::ptr_at(sb, 0)?,
        c_ptr: D::ptr_at(c, 0)?,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        _marker: PhantomData,
    })
}

/// The configuration of `scaled_matmul_fp8` on `Q`'s codes, bf16 out, in
/// `form` (the per-tensor forms alike), with tiles of `BLOCK_M x BLOCK_N`,
/// `warps` and a K loop pipelined `stages` deep, and its grid for `m x n`.
fn scaled_config<Q: DeviceElem>(
    (bm, bn, warps, stages): (usize, usize, u32, u32),
    form: Form,
    (m, n): (usize, usize),
) -> (scaled_matmul_fp8::Config, [u32; 3]) {
    let (ahead, paired) = (form == Form::BlockScaledAhead, form == Form::BlockScaledPaired);
    let config = scaled_matmul_fp8::Config::new(
        Q::DEVICE_DTYPE,
        DType::BF16,
        bm,
        bn,
        form.per_tensor(),
        ahead,
        paired,
    )
    .with_warps(warps)
    .with_stages(stages);
    (config, [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1])
}

/// `scaled_matmul_fp8` with bf16 output on `dev` in `form` on `tile`, as
/// f64.
fn scaled_on<Q: DeviceElem, D: Device>(
    dev: &mut D,
    [a, b]: [&[Q]; 2],
    [sa, sb]: [&[f32]; 2],
    (m, n, k): (usize, usize, usize),
    form: Form,
    tile: (usize, usize, u32, u32),
) -> Result<Vec<f64>> {
    let (ad, bd, sad, sbd) = (dev.upload(a)?, dev.upload(b)?, dev.upload(sa)?, dev.upload(sb)?);
    let cd = dev.zeros::<bf16>(m * n)?;
    let args = scaled_args::<Q, D>([&ad, &bd], [&sad, &sbd], &cd, (m, n, k))?;
    let (config, grid) = scaled_config::<Q>(tile, form, (m, n));
    dev.run::<scaled_matmul_fp8::Kernel>(grid, &config, &args)?;
    Ok(dev.download(&cd)?.iter().map(|x| f64::from(x.to_f32())).collect())
}

/// How a `scaled_matmul_fp8` case draws its operands and scales.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// Random finite codes, block scales.
    BlockScaled,
    /// The same, each block's scales loaded one block ahead (`SCALES_AHEAD`).
    BlockScaledAhead,
    /// The same, two K blocks a trip (`PAIRED`).
    BlockScaledPaired,
    /// Random finite codes, one scale per operand.
    PerTensor,
    /// Codes of the integers -2..=2, one scale per operand: every
    /// summation is exact, so the bound is the f32 one.
    PerTensorExact,
}

impl Form {
    /// Whether the product takes one scale per operand.
    fn per_tensor(self) -> bool {
        matches!(self, Form::PerTensor | Form::PerTensorExact)
    }
}

fn scaled_case<Q: DeviceElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (m, n, k): (usize, usize, usize),
    form: Form,
    tile: (usize, usize, u32, u32),
) -> Result<CheckRow> {
    use kernels::reference::fp8::{BlockSums, scaled_matmul};
    let kb = k.div_ceil(128);
    let codes = if form == Form::PerTensorExact { small_int_codes::<Q> } else { finite_codes::<Q> };
    let (a, av) = codes(rng, m * k);
    let (b, bv) = codes(rng, n * k);
    let mut scale = || (1.0 + rng.unit()) as f32 * 2f32.powi((rng.next_u64() % 16) as i32 - 8);
    let (sa, sb): (Vec<f32>, Vec<f32>) = match form {
        Form::BlockScaled | Form::BlockScaledAhead | Form::BlockScaledPaired => {
            ((0..m * kb).map(|_| scale()).collect(), (0..n.div_ceil(128) * kb).map(|_| scale()).collect())
        }
        _ => (vec![scale()], vec![scale()]),
    };
    let per_tensor = form.per_tensor();
    let got = scaled_on::<Q, D>(dev, [&a, &b], [&sa, &sb], (m, n, k), form, tile)?;
    // The bound of the loosest summation the kernel may run: Hopper's
    // native FP8 `wgmma` (the f16-widened products sum in f32), over one
    // block or over the whole K.
    let sums = if form == Form::PerTensorExact { BlockSums::F32 } else { BlockSums::Fp8Wgmma };
    let (want, tol) = scaled_matmul(&av, &sa, &bv, &sb, (m, n, k), sums, per_tensor, 2f64.powi(-8));
    let what = match form {
        Form::BlockScaled => "",
        Form::BlockScaledAhead => " scales ahead",
        Form::BlockScaledPaired => " paired",
        Form::PerTensor => " per-tensor",
        Form::PerTensorExact => " per-tensor, small integers",
    };
    let (bm, bn, warps, _) = tile;
    let shape = format!("{m}x{n}x{k} -> bf16{what} [{bm}x{bn}/{warps}w]");
    Ok(compare_each("scaled_matmul_fp8", shape, Q::DEVICE_DTYPE, &got, &want, &tol))
}

/// The `scaled_matmul_fp8` check: both forms, E4M3 and E5M2 operands, bf16
/// output, ragged M, N and K (K a multiple of 16 takes the native FP8
/// `wgmma` on sm_90a), against the f64 reference within its derived bound
/// (not the interpreter: the larger shapes would take it minutes).
pub fn scaled_matmul<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for shape in [(1, 128, 128), (37, 200, 300), (130, 256, 1040), (256, 384, 512)] {
        for (form, tile) in [
            (Form::BlockScaled, SCALED_TILE),
            (Form::BlockScaledAhead, SCALED_TILE),
            (Form::BlockScaledPaired, SCALED_TILE),
            (Form::BlockScaledPaired, PAIRED_TILE),
            (Form::PerTensor, PER_TENSOR_TILE),
            (Form::PerTensorExact, PER_TENSOR_TILE),
        ] {
            out.push(scaled_case::<F8E4M3, D>(dev, &mut rng, shape, form, tile)?);
            out.push(scaled_case::<F8E5M2, D>(dev, &mut rng, shape, form, tile)?);
        }
    }
    Ok(out)
}

/// One `matmul/fp8e4m3/{M}x{N}x{K} [..]` record: the product of E4M3 codes
/// (no NaN codes) in `form` with unit scales, bf16 out, on tile
/// `(BLOCK_M, BLOCK_N, warps, stages)`. Named like peers.py's per-tensor
/// `_scaled_mm` row, so the bench prints the ratio to it.
fn scaled_record(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    (m, n, k): (usize, usize, usize),
    (bm, bn, warps, stages): (usize, usize, u32, u32),
    form: Form,
) -> Result<Record> {
    let mut rng = Rng::new((m + n + k) as u64);
    let mut codes = |len: usize| -> Vec<F8E4M3> {
        (0..len)
            .map(|_| F8E4M3::from_bits((rng.next_u64() % 0x70) as u8 | (0x80 * (rng.next_u64() % 2) as u8)))
            .collect()
    };
    let (a, b) = (codes(m * k), codes(n * k));
    let kb = k.div_ceil(128);
    let (ad, bd) = (cuda.upload(&a)?, cuda.upload(&b)?);
    drop((a, b));
    let (sad, sbd) = (cuda.upload(&vec![1f32; m * kb])?, cuda.upload(&vec![1f32; n.div_ceil(128) * kb])?);
    let cd = cuda.zeros::<bf16>(m * n)?;
    let args = scaled_args::<F8E4M3, Cuda>([&ad, &bd], [&sad, &sbd], &cd, (m, n, k))?;
    let (config, g) = scaled_config::<F8E4M3>((bm, bn, warps, stages), form, (m, n));
    let ms = time_median_ms(cuda, opts.warmup, opts.runs, |c: &mut Cuda| {
        c.run::<scaled_matmul_fp8::Kernel>(g, &config, &args)
    })?;
    let what = match form {
        Form::BlockScaled => "block-scaled",
        Form::BlockScaledAhead => "block-scaled, scales ahead,",
        Form::BlockScaledPaired => "block-scaled, paired,",
        _ => "per-tensor",
    };
    let name = format!("matmul/fp8e4m3/{m}x{n}x{k} [{what} {bm}x{bn}/{warps}w/{stages}s]");
    Ok(Record::new(name, "TFLOP/s", 2.0 * (m * n) as f64 * k as f64 / ms / 1e9, ms))
}

/// The FP8 bench records (`bench --only fp8`): both forms of the scaled
/// product at 8192^3 and at a prefill shape, on the tiles each form fits.
pub fn bench_records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for shape in [(8192, 8192, 8192), (256, 14336, 4096)] {
        for tile in [(64, 128, 4, 2), (64, 128, 4, 3), (128, 128, 8, 3)] {
            push_measured(&mut out, scaled_record(cuda, opts, shape, tile, Form::BlockScaled)?);
        }
        for tile in [(64, 128, 4, 2), (64, 128, 4, 3), (128, 128, 8, 3)] {
            push_measured(&mut out, scaled_record(cuda, opts, shape, tile, Form::BlockScaledAhead)?);
        }
        for tile in [(64, 128, 4, 2), (128, 128, 8, 2), (128, 128, 8, 3)] {
            push_measured(&mut out, scaled_record(cuda, opts, shape, tile, Form::BlockScaledPaired)?);
        }
        for tile in [(128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4), (64, 256, 4, 4)] {
            push_measured(&mut out, scaled_record(cuda, opts, shape, tile, Form::PerTensor)?);
        }
    }
    Ok(out)
}
