//! The 8-bit floats (`f8e4m3`, `f8e5m2`) in the interpreter, bit for bit
//! against references written here from the format definitions (OCP FP8,
//! NVIDIA's `.satfinite` conversions): every one of the 256 codes decoded,
//! and conversions from f32, f16 and bf16 of every code's value, of every
//! tie between neighbouring codes and the f32 values beside it, of the
//! saturation and underflow boundaries, of infinities and NaN, and of
//! random f32 values over a wide exponent range. Also the verifier's rules:
//! no arithmetic, comparison or reduction on 8-bit floats, casts only to and
//! from the 16- and 32-bit floats. And `dot` on FP8 tiles, with the pass that
//! widens its operands to f16 for the codegen.

use super::tests::Rng;
use super::{Arg, Buffer, launch};
use crate::builder::kernel;
use crate::dtype::DType;
use crate::lang::*;
use half::{bf16, f16};

const FORMATS: [DType; 2] = [DType::F8E4M3, DType::F8E5M2];

/// The value of code `b` in format `d` (NaN for the NaN codes), from the
/// format's definition: sign, biased exponent, mantissa, subnormals at
/// exponent 0; E4M3 has no infinities and one NaN per sign (`S.1111.111`),
/// E5M2 follows IEEE (`S.11111.00` infinite, `S.11111.xx` NaN otherwise).
fn decode(d: DType, b: u8) -> f64 {
    let (ebits, mbits, bias) = if d == DType::F8E4M3 { (4, 3, 7) } else { (5, 2, 15) };
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> mbits) & ((1 << ebits) - 1));
    let m = f64::from(b & ((1 << mbits) - 1));
    let top = (1 << ebits) - 1;
    let frac = m / f64::from(1u32 << mbits);
    let v = if d == DType::F8E4M3 && e == top && m == 7.0 {
        f64::NAN
    } else if d == DType::F8E5M2 && e == top {
        if m == 0.0 { f64::INFINITY } else { f64::NAN }
    } else if e == 0 {
        frac * 2f64.powi(1 - bias)
    } else {
        (1.0 + frac) * 2f64.powi(e - bias)
    };
    sign * v
}

/// The largest finite value of `d`.
fn max_finite(d: DType) -> f64 {
    if d == DType::F8E4M3 { 448.0 } else { 57344.0 }
}

/// The code `x` converts to in format `d`: NaN to a NaN code (`None`),
/// beyond the largest finite magnitude (infinities included) to that value,
/// otherwise the nearest code, ties to the even code (mantissa bit 0 clear);
/// the sign is kept, zeros included.
fn encode(d: DType, x: f64) -> Option<u8> {
    if x.is_nan() {
        return None;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(max_finite(d));
    // Non-negative finite codes in increasing order of value.
    let codes: Vec<u8> = (0u8..0x80).filter(|&c| decode(d, c).is_finite()).collect();
    let mut best = codes[0];
    for &c in &codes {
        let (dc, db) = ((decode(d, c) - a).abs(), (decode(d, best) - a).abs());
        if dc < db || (dc == db && c & 1 == 0) {
            best = c;
        }
    }
    Some(best | sign)
}

/// Casts `src` (of dtype `from`) to `to` and stores it, one program.
fn run_cast(from: DType, to: DType, src: Buffer) -> Buffer {
    let n = src.len();
    let block = n.next_power_of_two();
    let f = kernel("cast", || {
        let x_ptr = param_ptr("x", from);
        let y_ptr = param_ptr("y", to);
        let n = param_scalar("n", DType::I32);
        let offs = arange(0, block as i32);
        let mask = offs.lt(n);
        let x = load(x_ptr + offs, Some(mask), None);
        store(y_ptr + offs, x.to(to), Some(mask));
    });
    let mut bufs = [src, Buffer::zeros(to, n)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(n as i32)]).unwrap();
    let [_, out] = bufs;
    out
}

/// The f32 inputs of the conversion tests for format `d`.
fn inputs(d: DType, rng: &mut Rng) -> Vec<f32> {
    let mut v = Vec::new();
    let finite: Vec<f64> = (0u8..0x80).map(|c| decode(d, c)).filter(|x| x.is_finite()).collect();
    for w in finite.windows(2) {
        let mid = ((w[0] + w[1]) / 2.0) as f32;
        v.extend([w[0] as f32, mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)]);
    }
    let max = max_finite(d) as f32;
    let tiny = finite[1] as f32;
    v.extend([
        max,
        max * 1.03125,
        max * 1.0625,
        max * 1.5,
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
        0.0,
        tiny * 0.5,
        f32::from_bits((tiny * 0.5).to_bits() + 1),
        tiny * 0.25,
        f32::MIN_POSITIVE,
        1e-30,
    ]);
    for _ in 0..2000 {
        let e = rng.below(50) as i32 - 30;
        let m = 1.0 + rng.float().abs();
        v.push((m * 2f64.powi(e)) as f32);
    }
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// Checks `got` (codes of `d`) against [`encode`] of `want` (the inputs as
/// the source dtype holds them).
fn check_codes(d: DType, from: DType, want: &[f64], got: &Buffer) {
    let got: Vec<u8> = got.as_bytes().to_vec();
    for (i, (&x, &g)) in want.iter().zip(&got).enumerate() {
        match encode(d, x) {
            None => assert!(decode(d, g).is_nan(), "{from} -> {d}, input {i} NaN: got code {g:#04x}"),
            Some(c) => assert_eq!(g, c, "{from} -> {d}, input {i} = {x:e}: got {g:#04x}, want {c:#04x}"),
        }
    }
}

#[test]
fn every_code_decodes_exactly() {
    for d in FORMATS {
        let src = Buffer::from_bytes(d, (0..=255u8).collect()).unwrap();
        for to in [DType::F32, DType::F16, DType::BF16] {
            let out = run_cast(d, to, src.clone()).to_f64();
            for (b, &g) in out.iter().enumerate() {
                let w = decode(d, b as u8);
                if w.is_nan() {
                    assert!(g.is_nan(), "{d} code {b:#04x} -> {to}: got {g}, want NaN");
                } else {
                    assert_eq!(g.to_bits(), w.to_bits(), "{d} code {b:#04x} -> {to}: got {g}, want {w}");
                }
            }
        }
    }
}

#[test]
fn conversions_round_to_nearest_even_and_saturate() {
    let mut rng = Rng::new(8);
    for d in FORMATS {
        let xs = inputs(d, &mut rng);
        let x64: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
        check_codes(d, DType::F32, &x64, &run_cast(DType::F32, d, Buffer::from_slice(&xs)));
        // From f16 and bf16: the inputs as those types hold them, converted once.
        let h: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let hw: Vec<f64> = h.iter().map(|x| x.to_f64()).collect();
        check_codes(d, DType::F16, &hw, &run_cast(DType::F16, d, Buffer::from_slice(&h)));
        let b: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        let bw: Vec<f64> = b.iter().map(|x| x.to_f64()).collect();
        check_codes(d, DType::BF16, &bw, &run_cast(DType::BF16, d, Buffer::from_slice(&b)));
    }
}

#[test]
fn one_format_converts_to_the_other_through_its_value() {
    for (from, to) in [(DType::F8E4M3, DType::F8E5M2), (DType::F8E5M2, DType::F8E4M3)] {
        let src = Buffer::from_bytes(from, (0..=255u8).collect()).unwrap();
        let want: Vec<f64> = (0..=255u8).map(|b| decode(from, b)).collect();
        check_codes(to, from, &want, &run_cast(from, to, src));
    }
}

#[test]
fn host_buffers_hold_the_codes() {
    let x = [float8::F8E4M3::from_f32(1.5), float8::F8E4M3::from_f32(-448.0)];
    let b = Buffer::from_slice(&x);
    assert_eq!(b.as_bytes(), &[0x3c, 0xfe]);
    assert_eq!(b.to_f64(), vec![1.5, -448.0]);
    assert_eq!(Buffer::from_f64(DType::F8E5M2, &[1e9, -0.0]).as_bytes(), &[0x7b, 0x80]);
}

/// Builds the kernel `name` storing `body(x, offs)` to `y` (of dtype
/// `out`), `x` a 16-lane `f8e4m3` tile loaded at `offs`.
fn f8_kernel(
    name: &str,
    out: DType,
    body: impl Fn(Tensor, Tensor) -> Tensor,
) -> crate::Result<crate::Function> {
    KernelBuilder::new(name).build(|| {
        let x_ptr = param_ptr("x", DType::F8E4M3);
        let y_ptr = param_ptr("y", out);
        let offs = arange(0, 16);
        let x = load(x_ptr + offs, None, None);
        store(y_ptr + offs, body(x, offs), None);
    })
}

/// The error building a one-input kernel whose body is `op(x)`, `x` an
/// `f8e4m3` tile.
fn verify_error(op: impl Fn(Tensor) -> Tensor) -> String {
    f8_kernel("bad", DType::F32, |x, _| op(x).to(DType::F32)).unwrap_err().to_string()
}

#[test]
fn the_verifier_keeps_8_bit_floats_to_storage_casts_and_selects() {
    let e = verify_error(|x| x + x);
    assert!(e.contains("does not compute on 8-bit floats"), "{e}");
    let e = verify_error(|x| exp(x));
    assert!(e.contains("does not compute on 8-bit floats"), "{e}");
    let e = verify_error(|x| where_(x.lt(x), x, x));
    assert!(e.contains("does not compute on 8-bit floats"), "{e}");
    let e = verify_error(|x| expand_dims(x.sum(0), 0));
    assert!(e.contains("does not compute on 8-bit floats"), "{e}");
    let e = verify_error(|x| x.to(DType::I32).to(DType::F8E4M3));
    assert!(e.contains("convert to and from f16, bf16 and f32 only"), "{e}");
    let e = verify_error(|x| x.to(DType::F64));
    assert!(e.contains("convert to and from f16, bf16 and f32 only"), "{e}");
    // Bitcasts to a byte and selects are fine.
    f8_kernel("ok", DType::U8, |x, offs| {
        let y = where_(offs.lt(8), x, full(&[16], 2.0, DType::F8E4M3));
        bitcast(y, DType::U8)
    })
    .unwrap();
}

/// `out = acc + a @ b` for `[M, K] x [K, N]` tiles of dtype `d` (row-major
/// buffers), as a kernel.
fn dot_kernel(d: DType, m: usize, k: usize, n: usize) -> crate::Function {
    kernel("f8_dot", || {
        let a_ptr = param_ptr("a", d);
        let b_ptr = param_ptr("b", d);
        let c_ptr = param_ptr("c", DType::F32);
        let (rm, rk, rn) = (arange(0, m as i32), arange(0, k as i32), arange(0, n as i32));
        let a = load(a_ptr + expand_dims(rm, 1) * k as i32 + expand_dims(rk, 0), None, None);
        let b = load(b_ptr + expand_dims(rk, 1) * n as i32 + expand_dims(rn, 0), None, None);
        let at = c_ptr + expand_dims(rm, 1) * n as i32 + expand_dims(rn, 0);
        store(at, dot(a, b, Some(load(at, None, None))), None);
    })
}

/// FP8 `dot`: every product exact and the sum taken exactly, then rounded
/// once with the accumulator (the interpreter's rule for every float
/// `dot`), against an f64 reference of the codes' values; and the same
/// bits as the f16 `dot` of the widened operands, which is what the codegen
/// runs ([`crate::passes::f8_dot`]).
#[test]
fn fp8_dots_sum_exact_products_like_their_f16_widening() {
    let (m, k, n) = (16, 32, 16);
    let mut rng = Rng::new(0xf8d0);
    for d in FORMATS {
        // Finite codes only (the values of random f32s, rounded to `d`).
        let codes = |rng: &mut Rng, len: usize| -> Vec<f64> {
            (0..len)
                .map(|_| {
                    let c = rng.below(256) as u8;
                    let v = decode(d, c);
                    if v.is_finite() { v } else { 1.0 }
                })
                .collect()
        };
        let (av, bv) = (codes(&mut rng, m * k), codes(&mut rng, k * n));
        let acc: Vec<f32> = (0..m * n).map(|i| (i as f32 - 100.0) * 0.25).collect();
        let run = |dt: DType| -> Vec<f32> {
            let mut bufs = [Buffer::from_f64(dt, &av), Buffer::from_f64(dt, &bv), Buffer::from_slice(&acc)];
            launch(&dot_kernel(dt, m, k, n), [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)])
                .unwrap();
            bufs[2].to_vec::<f32>()
        };
        let got = run(d);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|t| av[i * k + t] * bv[t * n + j]).sum();
                let want = (f64::from(acc[i * n + j]) + s) as f32;
                assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{d} [{i}, {j}]");
            }
        }
        assert_eq!(got, run(DType::F16), "{d}: the f16 widening differs");
    }
    // Mixed FP8 inputs are not a `dot`.
    let e = KernelBuilder::new("mixed")
        .build(|| {
            let a = load(param_ptr("a", DType::F8E4M3) + arange(0, 16), None, None);
            let b = load(param_ptr("b", DType::F8E5M2) + arange(0, 16), None, None);
            let c = zeros(&[16, 16], DType::F32);
            let _ = dot(reshape(a, &[16, 1]), reshape(b, &[1, 16]), Some(c));
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("`dot` inputs must share a dtype"), "{e}");
}

/// The pass the codegen runs: each FP8 `dot`'s operands become f16 casts,
/// the result verifies and computes the same values.
#[test]
fn the_f8_dot_pass_widens_operands_and_keeps_the_values() {
    let f = dot_kernel(DType::F8E5M2, 16, 16, 16);
    let mut g = f.clone();
    assert_eq!(crate::passes::f8_dot::widen(&mut g), 1);
    crate::verify::verify(&g).unwrap();
    let text = crate::print::print(&g);
    assert_eq!(text.lines().filter(|l| l.contains("= cast ")).count(), 2, "{text}");
    assert!(text.contains("tensor<16x16xf16>"), "{text}");
    let mut rng = Rng::new(7);
    let vals: Vec<f64> = (0..256).map(|_| decode(DType::F8E5M2, rng.below(0x7b) as u8)).collect();
    let out = |f: &crate::Function| -> Vec<f32> {
        let mut bufs = [
            Buffer::from_f64(DType::F8E5M2, &vals),
            Buffer::from_f64(DType::F8E5M2, &vals),
            Buffer::zeros(DType::F32, 256),
        ];
        launch(f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]).unwrap();
        bufs[2].to_vec::<f32>()
    };
    assert_eq!(out(&f), out(&g));
    // Other dots are left alone.
    let mut h = dot_kernel(DType::F16, 16, 16, 16);
    assert_eq!(crate::passes::f8_dot::widen(&mut h), 0);
}
