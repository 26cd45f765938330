//! Host backend tests: hand-built kernels run natively and on the
//! interpreter on the same random inputs; the buffers must agree bit for
//! bit (the two backends compute the same values, see `lower/`).

use super::backend::run_function;
use super::cache::HostCache;
use dsl_core::interp::{Arg, Buffer, launch};
use dsl_core::ir::ops::DotPrecision;
use dsl_core::lang::*;
use dsl_core::{Function, Result};
use std::sync::OnceLock;
use tests::hand::{f8_casts, histogram_steps, softmax, tile_ranges};

/// One memory-only cache for the tests (compiles are shared).
fn cache() -> &'static HostCache {
    static C: OnceLock<HostCache> = OnceLock::new();
    C.get_or_init(|| HostCache::with_dir(None))
}

/// SplitMix64, for reproducible inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n` floats in [-scale, scale).
    fn floats(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale).collect()
    }
}

/// Runs `f` on both backends from the same buffers and asserts that every
/// buffer ends bit-identical. The function is first specialized on the
/// arguments as the launchers do (16-byte aligned offsets, integers
/// divisible by 16).
fn same(f: &Function, grid: [u32; 3], bufs: &[Buffer], args: &[Arg]) {
    let facts: Vec<Option<u64>> = args
        .iter()
        .map(|a| match *a {
            Arg::Ptr { buffer, offset } => Some((offset * bufs[buffer].dtype().size_bytes()) as u64),
            Arg::Scalar(s) if s.dtype().is_int() => Some(s.as_i64() as u64),
            Arg::Scalar(_) => None,
        })
        .collect();
    let (f, _) = dsl_core::launch::specialize(f, &facts);
    let f = &f;
    let mut want = bufs.to_vec();
    launch(f, grid, &mut want, args).unwrap_or_else(|e| panic!("interpreter: {e}"));
    let mut got = bufs.to_vec();
    run_function(cache(), f, grid, &mut got, args).unwrap_or_else(|e| panic!("host: {e}"));
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.as_bytes() != w.as_bytes() {
            let (gv, wv) = (g.to_f64(), w.to_f64());
            let i = gv.iter().zip(&wv).position(|(a, b)| a.to_bits() != b.to_bits()).unwrap_or(0);
            panic!(
                "{}: buffer {k} differs first at element {i}: host {} vs interpreter {}",
                f.name, gv[i], wv[i]
            );
        }
    }
}

/// The head of a two-input elementwise kernel over `n` elements of
/// `dtype`: its parameters `x_ptr`, `y_ptr`, `out_ptr` and `n`, and this
/// program's `block` offsets and mask; returns `(out_ptr, offs, mask, x, y)`
/// with `x` and `y` loaded under the mask.
fn two_inputs(block: usize, dtype: DType) -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
    let x_ptr = param_ptr("x_ptr", dtype);
    let y_ptr = param_ptr("y_ptr", dtype);
    let out_ptr = param_ptr("out_ptr", dtype);
    let n = param_scalar("n", DType::I32);
    let offs = program_id(0) * block as i32 + arange(0, block as i32);
    let mask = offs.lt(n);
    (out_ptr, offs, mask, load(x_ptr + offs, Some(mask), None), load(y_ptr + offs, Some(mask), None))
}

fn vector_add(block: usize, dtype: DType) -> Result<Function> {
    KernelBuilder::new("vector_add").build(|| {
        let (out_ptr, offs, mask, x, y) = two_inputs(block, dtype);
        store(out_ptr + offs, x + y, Some(mask));
    })
}

#[test]
fn host_vector_add() {
    let mut rng = Rng(1);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (n, block) in [(1000, 128), (1, 64), (4097, 1024)] {
            let f = vector_add(block, dtype).unwrap();
            let bufs = [
                Buffer::from_f64(dtype, &rng.floats(n, 4.0)),
                Buffer::from_f64(dtype, &rng.floats(n, 4.0)),
                Buffer::from_f64(dtype, &vec![-7.0; n + 3]),
            ];
            let grid = [n.div_ceil(block) as u32, 1, 1];
            same(&f, grid, &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::i32(n as i32)]);
        }
    }
}

#[test]
fn host_softmax() {
    let mut rng = Rng(2);
    for dtype in [DType::F32, DType::BF16] {
        for (rows, cols, block) in [(5, 17, 32), (3, 1000, 1024), (2, 2, 2), (1, 1, 1)] {
            let f = softmax(block, dtype).unwrap();
            let bufs = [
                Buffer::from_f64(dtype, &vec![0.0; rows * cols]),
                Buffer::from_f64(dtype, &rng.floats(rows * cols, 4.0)),
            ];
            let args = [Arg::ptr(0), Arg::ptr(1), Arg::i32(cols as i32), Arg::i32(cols as i32)];
            same(&f, [rows as u32, 1, 1], &bufs, &args);
        }
    }
}

/// The binary arithmetic of every numeric dtype, one result per op.
fn binary_ops(x: Tensor, y: Tensor) -> [Tensor; 7] {
    [x + y, x - y, x * y, x / y, x % y, minimum(x, y), maximum(x, y)]
}

/// Stores `results` cast to `dtype` one `block`-wide row per result:
/// result `k` at `out_ptr + k * block + offs`.
fn store_rows(
    out_ptr: Tensor,
    block: usize,
    offs: Tensor,
    results: Vec<Tensor>,
    dtype: DType,
    mask: Option<Tensor>,
) {
    for (k, r) in results.into_iter().enumerate() {
        store(out_ptr + (k * block) as i32 + offs, cast(r, dtype), mask);
    }
}

/// Unary and binary float math of every kind, stored one row per op.
fn float_ops(block: usize, dtype: DType) -> Result<Function> {
    KernelBuilder::new("float_ops").build(|| {
        // One program (`offs` from 0).
        let (out_ptr, offs, mask, x, y) = two_inputs(block, dtype);
        let ax = abs(x) + 0.5;
        let mut results = vec![
            exp(x),
            exp2(x),
            log(ax),
            log2(ax),
            sqrt(ax),
            rsqrt(ax),
            sin(x),
            cos(x),
            tanh(x),
            sigmoid(x),
            erf(x),
            floor(x * 3.0),
            ceil(x * 3.0),
            abs(x),
            -x,
        ];
        results.extend(binary_ops(x, y));
        results.extend([
            pow(ax, y),
            fma(x, y, x),
            where_(x.lt(y), x, y),
            cast(cast(x * 100.0, DType::F16), dtype),
            cast(cast(x * 100.0, DType::BF16), dtype),
            cast(cast(x, DType::F64), dtype),
            cast(cast(x * 100.0, DType::I32), dtype),
            cast(cast(x * 100.0, DType::U8), dtype),
            cast(cast(x * 100.0, DType::I8), dtype),
            cast(cast(x * 1e6, DType::I64), dtype),
            cast(x.gt(y), dtype),
            cast(cast(x, DType::I1), dtype),
        ]);
        store_rows(out_ptr, block, offs, results, dtype, Some(mask));
    })
}

#[test]
fn host_float_ops() {
    let mut rng = Rng(3);
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for (n, block) in [(37, 64), (1, 1), (3, 4)] {
            let f = float_ops(block, dtype).unwrap();
            let mut x = rng.floats(n, 3.0);
            x[0] = if n > 1 { -0.0 } else { x[0] };
            let bufs = [
                Buffer::from_f64(dtype, &x),
                Buffer::from_f64(dtype, &rng.floats(n, 3.0)),
                Buffer::from_f64(dtype, &vec![0.0; 40 * block]),
            ];
            same(&f, [1, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::i32(n as i32)]);
        }
    }
}

/// Integer arithmetic, shifts, bit ops and casts of every kind.
fn int_ops(block: usize, dtype: DType) -> Result<Function> {
    KernelBuilder::new("int_ops").build(|| {
        let x_ptr = param_ptr("x_ptr", dtype);
        let y_ptr = param_ptr("y_ptr", dtype);
        let out_ptr = param_ptr("out_ptr", dtype);
        let offs = arange(0, block as i32);
        let x = load(x_ptr + offs, None, None);
        let y = load(y_ptr + offs, None, None);
        let s = cast(y & 7, dtype);
        let mut results = binary_ops(x, y).to_vec();
        results.extend([
            x & y,
            x | y,
            x ^ y,
            x << s,
            x >> s,
            x << y,
            x >> y,
            umulhi(x, y),
            !x,
            where_(x.gt(y), x, y),
            cast(cast(x, DType::F32), dtype),
            cast(cast(x, DType::BF16), dtype),
            cast(cast(x, DType::I8), dtype),
            cast(cast(x, DType::U32), dtype),
            cast(cast(x, DType::I64), dtype),
            cast(cast(x, DType::I1), dtype),
        ]);
        store_rows(out_ptr, block, offs, results, dtype, None);
    })
}

#[test]
fn host_int_ops() {
    let mut rng = Rng(4);
    for dtype in [DType::I32, DType::U32, DType::I64, DType::I8, DType::U8, DType::I16] {
        let block = 32;
        let f = int_ops(block, dtype).unwrap();
        // Signed products must not overflow (the interpreter reports it).
        let span = match dtype {
            DType::I8 => 11.0,
            DType::U8 => 200.0,
            DType::I16 => 180.0,
            DType::I32 => 4e4,
            _ => 2e9,
        };
        let fix = |v: f64| if dtype.is_signed_int() { v.round() } else { v.round().abs() };
        let x: Vec<f64> = rng.floats(block, span).into_iter().map(fix).collect();
        let y: Vec<f64> =
            rng.floats(block, span).into_iter().map(|v| if fix(v) == 0.0 { 3.0 } else { fix(v) }).collect();
        let bufs =
            [Buffer::from_f64(dtype, &x), Buffer::from_f64(dtype, &y), Buffer::zeros(dtype, 30 * block)];
        same(&f, [1, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]);
    }
}

/// `c = a @ b` with a K loop: `[BM, BK] x [BK, BN]` tiles, masked edges.
fn matmul(bm: usize, bn: usize, bk: usize, dtype: DType, tf32: bool) -> Result<Function> {
    KernelBuilder::new("matmul").build(|| {
        let a_ptr = param_ptr("a_ptr", dtype);
        let b_ptr = param_ptr("b_ptr", dtype);
        let c_ptr = param_ptr("c_ptr", if dtype == DType::I8 { DType::I32 } else { DType::F32 });
        let m = param_scalar("m", DType::I32);
        let n = param_scalar("n", DType::I32);
        let k = param_scalar("k", DType::I32);
        let (rm, rn, rk) = tile_ranges(bm, bn, bk);
        let acc_ty = if dtype == DType::I8 { DType::I32 } else { DType::F32 };
        let acc = zeros(&[bm, bn], acc_ty);
        let out = for_range(0, k, bk as i32, &[acc], |k0, carried| {
            let ka = k0 + rk;
            let a_mask = expand_dims(rm.lt(m), 1) & expand_dims(ka.lt(k), 0);
            let b_mask = expand_dims(ka.lt(k), 1) & expand_dims(rn.lt(n), 0);
            let a = load(a_ptr + expand_dims(rm * k, 1) + expand_dims(ka, 0), Some(a_mask), None);
            // `b` as `trans` of its transpose (`[BN, BK]`, the dequant GEMM's
            // shape) every other K step.
            let b = if bn == bk {
                let bt_mask = expand_dims(rn.lt(n), 1) & expand_dims(ka.lt(k), 0);
                trans(load(b_ptr + expand_dims(rn, 1) + expand_dims(ka * n, 0), Some(bt_mask), None))
            } else {
                load(b_ptr + expand_dims(ka * n, 1) + expand_dims(rn, 0), Some(b_mask), None)
            };
            let p = if tf32 { DotPrecision::Tf32 } else { DotPrecision::Ieee };
            vec![dot_with(a, b, Some(carried[0]), p)]
        });
        let c_mask = expand_dims(rm.lt(m), 1) & expand_dims(rn.lt(n), 0);
        store(c_ptr + expand_dims(rm * n, 1) + expand_dims(rn, 0), out[0], Some(c_mask));
    })
}

#[test]
fn host_matmul() {
    let mut rng = Rng(5);
    for (dtype, tf32) in [
        (DType::F32, false),
        (DType::F32, true),
        (DType::BF16, false),
        (DType::F16, false),
        (DType::F8E4M3, false),
        (DType::F8E5M2, false),
        (DType::I8, false),
    ] {
        for ((m, n, k), (bm, bn, bk)) in [
            ((37, 45, 70), (32, 32, 16)),
            ((5, 3, 2), (16, 16, 16)),
            ((64, 64, 64), (64, 64, 32)),
            ((33, 40, 50), (16, 32, 32)),
        ] {
            let f = matmul(bm, bn, bk, dtype, tf32).unwrap();
            let scale = if dtype == DType::I8 { 100.0 } else { 1.0 };
            let round = |v: Vec<f64>| -> Vec<f64> {
                if dtype == DType::I8 { v.iter().map(|x| x.round()).collect() } else { v }
            };
            let out_ty = if dtype == DType::I8 { DType::I32 } else { DType::F32 };
            let bufs = [
                Buffer::from_f64(dtype, &round(rng.floats(m * k, scale))),
                Buffer::from_f64(dtype, &round(rng.floats(k * n, scale))),
                Buffer::zeros(out_ty, m * n),
            ];
            let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
            let args = [
                Arg::ptr(0),
                Arg::ptr(1),
                Arg::ptr(2),
                Arg::i32(m as i32),
                Arg::i32(n as i32),
                Arg::i32(k as i32),
            ];
            same(&f, grid, &bufs, &args);
        }
    }
}

/// Every built-in reduction and scan of an `[R, C]` tile along both axes,
/// and of an `[R, 2, C / 2]` view along its middle axis.
fn reductions(r: usize, c: usize, dtype: DType) -> Result<Function> {
    KernelBuilder::new("reductions").build(|| {
        let x_ptr = param_ptr("x_ptr", dtype);
        let out_ptr = param_ptr("out_ptr", dtype);
        let idx_ptr = param_ptr("idx_ptr", DType::I32);
        let rows = arange(0, r as i32);
        let cols = arange(0, c as i32);
        let x = load(x_ptr + expand_dims(rows * c as i32, 1) + expand_dims(cols, 0), None, None);
        let mut at = 0i32;
        let mut put = |v: Tensor| {
            let n = v.shape().iter().product::<usize>() as i32;
            store(out_ptr + at + reshape(arange(0, n), &v.shape()), v, None);
            at += n;
        };
        for axis in [0, 1] {
            put(sum(x, axis));
            put(max(x, axis));
            put(min(x, axis));
            put(cumsum(x, axis));
            put(cummax(x, axis));
            put(cummin(x, axis));
        }
        let x3 = reshape(x, &[r, 2, c / 2]);
        put(sum(x3, 1));
        put(max(x3, 1));
        let mut iat = 0i32;
        for axis in [0, 1] {
            for v in [argmax(x, axis), argmin(x, axis)] {
                let n = v.shape().iter().product::<usize>() as i32;
                store(idx_ptr + iat + arange(0, n), v, None);
                iat += n;
            }
        }
    })
}

#[test]
fn host_reductions() {
    let mut rng = Rng(6);
    for dtype in [DType::F32, DType::BF16, DType::F64, DType::I32, DType::U8] {
        for (r, c) in [(4, 8), (16, 64), (2, 2), (8, 4), (1, 32)] {
            let f = reductions(r, c, dtype).unwrap();
            let mut x = rng.floats(r * c, if dtype.is_int() { 50.0 } else { 4.0 });
            if dtype.is_int() {
                x.iter_mut().for_each(|v| *v = v.round().abs());
            }
            // Ties, signed zeros and a NaN where the dtype has them.
            x[1] = x[0];
            if dtype.is_float() {
                x[2] = -0.0;
                if r * c > 8 {
                    x[5] = f64::NAN;
                }
            }
            let bufs = [
                Buffer::from_f64(dtype, &x),
                Buffer::zeros(dtype, 16 * r * c),
                Buffer::zeros(DType::I32, 4 * (r + c)),
            ];
            same(&f, [1, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]);
        }
    }
}

/// Shape ops: permutes of a 3-D tile, join/split, leading and trailing
/// broadcasts, reshapes, on loaded data.
fn shapes(a: usize, b: usize, c: usize) -> Result<Function> {
    KernelBuilder::new("shapes").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::F32);
        let n = (a * b * c) as i32;
        let x = reshape(load(x_ptr + arange(0, n), None, None), &[a, b, c]);
        let mut at = 0i32;
        let mut put = |v: Tensor| {
            let k = v.shape().iter().product::<usize>() as i32;
            store(out_ptr + at + reshape(arange(0, k), &v.shape()), v, None);
            at += k;
        };
        put(permute(x, &[2, 0, 1]));
        put(permute(x, &[1, 0, 2]));
        put(permute(x, &[0, 2, 1]));
        let (lo, hi) = split(reshape(x, &[a * b * c / 2, 2]));
        put(lo * 2.0 + hi);
        put(join(hi, lo));
        let row = load(x_ptr + arange(0, c as i32), None, None);
        let col = load(x_ptr + arange(0, (a * b) as i32), None, None);
        let m = reshape(x, &[a * b, c]);
        put(m + expand_dims(row, 0));
        put(m * expand_dims(col, 1));
        put(broadcast_to(expand_dims(max(m, 1), 1), &[a * b, c]) - m);
        put(trans(m) + 1.0);
    })
}

#[test]
fn host_shapes() {
    let mut rng = Rng(7);
    for (a, b, c) in [(2, 4, 8), (4, 2, 32), (1, 2, 2), (2, 1, 4)] {
        let f = shapes(a, b, c).unwrap();
        let bufs = [
            Buffer::from_f64(DType::F32, &rng.floats(a * b * c, 2.0)),
            Buffer::zeros(DType::F32, 12 * a * b * c),
        ];
        same(&f, [1, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1)]);
    }
}

/// Control flow: a `while` around an `if` (Collatz), a `for` carrying a
/// tile and a scalar, an `if` with tile results.
fn control(block: usize) -> Result<Function> {
    KernelBuilder::new("control").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::I32);
        let out_ptr = param_ptr("out_ptr", DType::I32);
        let pid = program_id(0);
        let x = load(x_ptr + pid, None, None);
        let r = while_loop(
            &[x, constant(0, DType::I32)],
            |c| c[0].gt(1),
            |c| {
                let odd = (c[0] % 2).eq_(1);
                let next = if_else(odd, || vec![c[0] * 3 + 1], || vec![c[0] / 2]);
                vec![next[0], c[1] + 1]
            },
        );
        store(out_ptr + pid, r[1], None);
        let offs = arange(0, block as i32);
        let t = load(x_ptr + offs, None, None);
        let acc = for_range(0, pid + 3, 1, &[t, constant(0, DType::I32)], |i, c| {
            let shifted = c[0] + i;
            vec![where_(shifted.gt(10), shifted - c[0] / 2, shifted * 2), c[1] + sum(c[0], 0)]
        });
        let big = if_else(acc[1].gt(100), || vec![acc[0] + 1], || vec![acc[0] - 1]);
        store(out_ptr + 64 + pid * block as i32 + offs, big[0], None);
    })
}

#[test]
fn host_control() {
    let f = control(16).unwrap();
    let x: Vec<f64> = (0..64).map(|i| (i * 7 + 3) as f64).collect();
    let bufs = [Buffer::from_f64(DType::I32, &x), Buffer::zeros(DType::I32, 64 + 16 * 8)];
    same(&f, [8, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1)]);
}

/// Atomics: an integer histogram over all programs, float max/add and a
/// compare-and-swap within one program (float adds across programs depend
/// on their order). Its parameters: `hand::histogram`'s (`bins_ptr`,
/// `hist_ptr`, `n`), then `f_ptr` and `old_ptr`.
fn atomics(block: usize) -> Result<Function> {
    KernelBuilder::new("atomics").build(|| {
        let (hist_ptr, bins, offs, mask) = histogram_steps(block);
        let f_ptr = param_ptr("f_ptr", DType::F32);
        let old_ptr = param_ptr("old_ptr", DType::F32);
        atomic_max(hist_ptr + 16 + bins % 4, offs, Some(mask));
        let first = program_id(0).eq_(0);
        let one = arange(0, block as i32).lt(block as i32) & first;
        let v = cast(bins, DType::F32) * 0.37;
        let old = atomic_add(f_ptr + bins % 8, v, Some(one));
        store(old_ptr + arange(0, block as i32), old, Some(one));
        let old2 = atomic_max(f_ptr + 8 + bins % 4, v, Some(one));
        store(old_ptr + block as i32 + arange(0, block as i32), old2, Some(one));
        let c = atomic_cas(hist_ptr + 32 + (bins % 2), 0, offs + 1);
        store(hist_ptr + 40 + offs, c, Some(mask));
    })
}

#[test]
fn host_atomics() {
    let block = 64;
    let f = atomics(block).unwrap();
    let n: usize = 300;
    let bins: Vec<f64> = (0..n).map(|i| ((i * 7919) % 13) as f64).collect();
    let bufs = [
        Buffer::from_f64(DType::I32, &bins),
        Buffer::zeros(DType::I32, 40 + 320),
        Buffer::zeros(DType::F32, 16),
        Buffer::zeros(DType::F32, 2 * block),
    ];
    // The compare-and-swap slots are claimed by the first program to run
    // there; run one program of the grid at a time on both sides.
    let (f1, _) = dsl_core::launch::specialize(&f, &[]);
    let args = [Arg::ptr(0), Arg::ptr(1), Arg::i32(n as i32), Arg::ptr(2), Arg::ptr(3)];
    same(&f1, [1, 1, 1], &bufs, &args);
    let mut want = bufs.to_vec();
    launch(&f, [n.div_ceil(block) as u32, 1, 1], &mut want, &args).unwrap();
    let mut got = bufs.to_vec();
    run_function(cache(), &f, [n.div_ceil(block) as u32, 1, 1], &mut got, &args).unwrap();
    // Integer histogram and maxima are order-independent.
    assert_eq!(got[1].to_vec::<i32>()[..32], want[1].to_vec::<i32>()[..32]);
}

/// Custom combines: a (max, argmax) reduction and a reverse running sum as
/// scans, along both axes.
fn combines(r: usize, c: usize) -> Result<Function> {
    KernelBuilder::new("combines").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::F32);
        let idx_ptr = param_ptr("idx_ptr", DType::I32);
        let rows = arange(0, r as i32);
        let cols = arange(0, c as i32);
        let x = load(x_ptr + expand_dims(rows * c as i32, 1) + expand_dims(cols, 0), None, None);
        let i = broadcast_to(expand_dims(cols, 0), &[r, c]);
        let red = reduce(&[x, i], 1, |a, b| {
            let take = b[0].gt(a[0]);
            vec![where_(take, b[0], a[0]), where_(take, b[1], a[1])]
        });
        store(out_ptr + rows, red[0], None);
        store(idx_ptr + rows, red[1], None);
        for (k, axis) in [0, 1].into_iter().enumerate() {
            let s = scan(&[x], axis, true, |a, b| vec![a[0] * 0.5 + b[0]]);
            let o = (r + k * r * c) as i32;
            store(out_ptr + o + expand_dims(rows * c as i32, 1) + expand_dims(cols, 0), s[0], None);
        }
    })
}

#[test]
fn host_combines() {
    let mut rng = Rng(8);
    for (r, c) in [(4, 8), (2, 16), (1, 2)] {
        let f = combines(r, c).unwrap();
        let bufs = [
            Buffer::from_f64(DType::F32, &rng.floats(r * c, 2.0)),
            Buffer::zeros(DType::F32, r + 2 * r * c),
            Buffer::zeros(DType::I32, r),
        ];
        same(&f, [1, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]);
    }
}

/// Philox draws (`randint`, `rand`, `randn`) and a block load.
fn random(block: usize) -> Result<Function> {
    KernelBuilder::new("random").build(|| {
        let out_ptr = param_ptr("out_ptr", DType::F32);
        let bits_ptr = param_ptr("bits_ptr", DType::U32);
        let m_ptr = param_ptr("m_ptr", DType::F32);
        let seed = param_scalar("seed", DType::I64);
        let offs = program_id(0) * block as i32 + arange(0, block as i32);
        store(bits_ptr + offs, randint(seed, offs), None);
        store(out_ptr + offs, rand(seed, offs), None);
        store(out_ptr + 4 * block as i32 + offs, randn(seed, offs), None);
        let t = load_block(m_ptr, 5, 7, 7, program_id(0) - 1, 3, [4, 8]);
        store(out_ptr + 8 * block as i32 + program_id(0) * 32 + reshape(arange(0, 32), &[4, 8]), t, None);
    })
}

#[test]
fn host_random_and_block_loads() {
    let block = 64;
    let f = random(block).unwrap();
    let m: Vec<f64> = (0..35).map(|i| i as f64 + 0.5).collect();
    let bufs = [
        Buffer::zeros(DType::F32, 8 * block + 4 * 32),
        Buffer::zeros(DType::U32, 4 * block),
        Buffer::from_f64(DType::F32, &m),
    ];
    same(&f, [4, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::i64(0x1234_5678_9abc)]);
}

#[test]
fn host_assert_fails_with_its_location() {
    let f = KernelBuilder::new("asserts")
        .build(|| {
            let x_ptr = param_ptr("x_ptr", DType::I32);
            let x = load(x_ptr + arange(0, 8), None, None);
            device_assert(x.lt(5), "x must stay below 5");
        })
        .unwrap();
    let mut bufs = [Buffer::from_f64(DType::I32, &[1.0, 2.0, 3.0, 9.0, 1.0, 1.0, 1.0, 1.0])];
    let e = run_function(cache(), &f, [3, 1, 1], &mut bufs, &[Arg::ptr(0)]).unwrap_err().to_string();
    assert!(e.contains("device assertion failed: x must stay below 5"), "{e}");
    assert!(e.contains("program (0, 0, 0)") && e.contains("tests.rs"), "{e}");
}

/// The kernel `name` over f32 pointers `x_ptr` and `out_ptr` and a count
/// `n`, one block of `block` elements per program: `body(x_ptr, out_ptr, n,
/// offs)` with `offs` the block's element indices.
fn blockwise(
    name: &str,
    block: usize,
    body: impl FnOnce(Tensor, Tensor, Tensor, Tensor),
) -> Result<Function> {
    KernelBuilder::new(name).build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::F32);
        let n = param_scalar("n", DType::I32);
        let offs = program_id(0) * block as i32 + arange(0, block as i32);
        body(x_ptr, out_ptr, n, offs);
    })
}

/// `exp`, `exp2` and `sigmoid` of one block of f32 values per program.
fn exponentials(block: usize) -> Result<Function> {
    blockwise("exponentials", block, |x_ptr, out_ptr, n, offs| {
        let x = load(x_ptr + offs, None, None);
        store(out_ptr + offs, exp(x), None);
        store(out_ptr + n + offs, exp2(x), None);
        store(out_ptr + n * 2 + offs, sigmoid(x), None);
    })
}

/// The vector exponentials (`lower/math.rs`) round to the interpreter's
/// f32 on a quarter million arguments across the whole f32 range of
/// `exp`'s and `exp2`'s results, and on the special values.
#[test]
fn host_exponentials_match_the_library() {
    let (block, programs) = (1024, 256);
    let n = block * programs;
    let mut rng = Rng(9);
    let mut x = rng.floats(n, 160.0);
    for (k, v) in x.iter_mut().enumerate().take(n / 2) {
        // Half of them small, where softmax and SiLU live.
        *v /= [16.0, 256.0, 4096.0, 1e6][k % 4];
    }
    let special = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        88.72,
        88.73,
        -87.33,
        -103.9,
        -104.0,
        128.0,
        -149.0,
        -150.0,
    ];
    x[..special.len()].copy_from_slice(&special);
    let f = exponentials(block).unwrap();
    let bufs = [Buffer::from_f64(DType::F32, &x), Buffer::from_f64(DType::F32, &vec![0.0; 3 * n])];
    same(&f, [programs as u32, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(n as i32)]);
}

/// `out = x + 1` with a prefetch of the next block (`llvm.prefetch` on the
/// native backend, a hint): the same results as the interpreter.
fn prefetching_add(block: usize) -> Result<Function> {
    blockwise("prefetching_add", block, |x_ptr, out_ptr, n, offs| {
        let next = offs + block as i32;
        prefetch_l2(x_ptr + next, Some(next.lt(n)));
        let x = load(x_ptr + offs, Some(offs.lt(n)), None);
        store(out_ptr + offs, x + 1.0f32, Some(offs.lt(n)));
    })
}

#[test]
fn host_prefetch_is_a_hint() {
    let mut rng = Rng(9);
    for (n, block) in [(1000, 128), (64, 64)] {
        let f = prefetching_add(block).unwrap();
        let bufs = [Buffer::from_f64(DType::F32, &rng.floats(n, 4.0)), Buffer::zeros(DType::F32, n)];
        same(&f, [n.div_ceil(block) as u32, 1, 1], &bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(n as i32)]);
    }
    // The prefetch reaches the machine code: one per contiguous strip, each
    // under its lane-0 mask.
    let f = prefetching_add(128).unwrap();
    let (_, dumps) = super::compile_with_dumps(&f, &super::HostTarget::native(), "prefetching_add").unwrap();
    assert!(dumps.llvm.contains("@llvm.prefetch"), "{}", dumps.llvm);
    if cfg!(target_arch = "x86_64") {
        assert!(dumps.asm.contains("prefetcht0"), "{}", dumps.asm);
    }
}

/// Programs that hand data over (a wait, an acquire load, a release store)
/// are an `Unsupported` error naming the op on the native backend, which
/// runs programs to completion in any order; the interpreter runs them.
#[test]
fn host_rejects_waits_and_ordered_accesses() {
    use dsl_core::ir::ops::{CacheModifier, CmpPred, EvictionPolicy, MemScope, MemSem};
    let wait = KernelBuilder::new("waits")
        .build(|| {
            let flag = param_ptr("flag", DType::I32);
            wait_until(flag, CmpPred::Ge, 1);
        })
        .unwrap();
    let acquire = KernelBuilder::new("acquires")
        .build(|| {
            let flag = param_ptr("flag", DType::I32);
            let v = load_opts(
                flag,
                None,
                None,
                CacheModifier::None,
                EvictionPolicy::Normal,
                Some(MemSem::Acquire),
                MemScope::Gpu,
            );
            store(flag + 1, v, None);
        })
        .unwrap();
    let release = KernelBuilder::new("releases")
        .build(|| {
            let flag = param_ptr("flag", DType::I32);
            store_opts(flag, 1, None, Some(MemSem::Release), MemScope::Gpu);
        })
        .unwrap();
    for (f, op) in [(&wait, "wait_until"), (&acquire, "load"), (&release, "store")] {
        let mut bufs = [Buffer::from_f64(DType::I32, &[1.0, 0.0])];
        let e = run_function(cache(), f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]).unwrap_err().to_string();
        assert!(e.contains(op) && e.contains("interpreter runs them"), "{}: {e}", f.name);
        // The interpreter runs each.
        let mut bufs = [Buffer::from_f64(DType::I32, &[1.0, 0.0])];
        launch(f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]).unwrap();
    }
}

/// The 8-bit float conversions on the host against the interpreter, bit for
/// bit: 300 elements over three programs of 128 (a ragged last one), f32
/// inputs over a wide range of magnitudes with the format's boundaries,
/// infinities and NaN, and every code read back and converted.
#[test]
fn host_f8_casts() {
    let mut rng = Rng(7);
    let n = 300;
    for f8 in [DType::F8E4M3, DType::F8E5M2] {
        let mut x: Vec<f32> = rng
            .floats(n, 1.0)
            .iter()
            .enumerate()
            .map(|(i, v)| (v * 2f64.powi(i as i32 % 48 - 30)) as f32)
            .collect();
        let specials =
            [0.0, -0.0, 448.0, 464.0, 57344.0, 61440.0, 1e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        x[..specials.len()].copy_from_slice(&specials);
        x[20] = 2f32.powi(-10) * 1.5;
        x[21] = 2f32.powi(-17) * 0.5;
        let codes: Vec<u8> = (0..n).map(|i| (i % 256) as u8).collect();
        let bufs = [
            Buffer::from_slice(&x),
            Buffer::from_bytes(f8, codes).unwrap(),
            Buffer::zeros(f8, n),
            Buffer::zeros(DType::F32, n),
            Buffer::zeros(DType::BF16, n),
            Buffer::zeros(f8, n),
        ];
        let args = [
            Arg::ptr(0),
            Arg::ptr(1),
            Arg::ptr(2),
            Arg::ptr(3),
            Arg::ptr(4),
            Arg::ptr(5),
            Arg::i32(n as i32),
        ];
        same(&f8_casts(128, f8).unwrap(), [3, 1, 1], &bufs, &args);
    }
}
