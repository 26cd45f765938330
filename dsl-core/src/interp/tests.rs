//! Interpreter tests against plain-Rust references computed in f64: kernels
//! are built with the kernel language exactly like `tests/src/hand.rs`, run on
//! random non-zero inputs with ragged sizes (not multiples of the block).
//! Error cases live in `tests_errors.rs`.

use super::{Arg, Buffer, InterpError, Interpreter, Kernel, launch};
use crate::builder::kernel;
use crate::lang::*;
use crate::{Function, Result};
use half::{bf16, f16};
use proptest::prelude::*;
use reference_matmul::matmul as matmul_reference;
use reference_scan::cumsum_rows as cumsum_reference;
use reference_softmax::softmax as softmax_reference;

/// The hand-built kernels of the `tests` crate (vector add, softmax, tiled
/// matmul, row argmax and cumsum, histogram), which this crate's tests run on the interpreter and
/// canonicalize: included, as this crate cannot depend on `tests`.
#[allow(dead_code)]
#[path = "../../../tests/src/hand.rs"]
pub(crate) mod hand;
use hand::{argmax_rows, cumsum_rows, histogram, matmul, softmax, vector_add};

/// The f64 references of the kernel library (`kernels::reference`), shared
/// with the `tests` crate: this crate cannot depend on `kernels`, so it
/// includes the files (whose other references these tests do not use).
#[allow(dead_code)]
#[path = "../../../kernels/src/reference/matmul.rs"]
mod reference_matmul;
#[path = "../../../kernels/src/reference/scan.rs"]
mod reference_scan;
#[allow(dead_code)]
#[path = "../../../kernels/src/reference/softmax.rs"]
mod reference_softmax;

/// Runs `f` and returns its interpreter error (panics if it succeeds or fails otherwise).
pub(super) fn interp_err(f: &Function, grid: [u32; 3], bufs: &mut [Buffer], args: &[Arg]) -> InterpError {
    match launch(f, grid, bufs, args) {
        Err(crate::Error::Interp(e)) => e,
        other => panic!("expected an interpreter error, got {other:?}"),
    }
}

/// Asserts that `e` was raised by `op` and that its message contains every
/// part of `parts`.
pub(super) fn assert_raised(e: &InterpError, op: &str, parts: &[&str]) {
    assert_eq!(e.op, op);
    contains_all(&e.message, parts);
}

/// Asserts that `msg` contains every part.
pub(super) fn contains_all(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
}

/// A small deterministic generator (xorshift64*), so tests need no extra crates.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1), never exactly zero.
    pub(super) fn float(&mut self) -> f64 {
        let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        if v == 0.0 { 0.5 } else { v }
    }

    /// Uniform in [0, n).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(super) fn floats(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.float()).collect()
    }
}

fn assert_close(got: &[f64], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= abs + rel * w.abs(), "element {i}: got {g}, want {w}");
    }
}

fn run_vector_add(n: usize, block: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let (x, y) = (rng.floats(n), rng.floats(n));
    let mut bufs = [
        Buffer::from_f64(DType::F32, &x),
        Buffer::from_f64(DType::F32, &y),
        Buffer::from_f64(DType::F32, &vec![-7.0; n + 3]),
    ];
    let f = vector_add(block).unwrap();
    let grid = n.div_ceil(block) as u32;
    launch(&f, [grid, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::i32(n as i32)])
        .unwrap();
    let out = bufs[2].to_vec::<f32>();
    for i in 0..n {
        assert_eq!(out[i], x[i] as f32 + y[i] as f32, "element {i}");
    }
    // Masked-off lanes past `n` never write.
    assert!(out[n..].iter().all(|&v| v == -7.0));
}

#[test]
fn vector_add_ragged() {
    run_vector_add(1000, 128, 1);
    run_vector_add(1, 64, 2);
}

fn run_softmax(rows: usize, cols: usize, dtype: DType, seed: u64) {
    let mut rng = Rng::new(seed);
    let x: Vec<f64> = rng.floats(rows * cols).iter().map(|v| v * 4.0).collect();
    let inp = Buffer::from_f64(dtype, &x);
    // The reference sees the inputs as stored (rounded to `dtype`).
    let want = softmax_reference(&inp.to_f64(), rows, cols);
    let mut bufs = [Buffer::zeros(dtype, rows * cols), inp];
    let block = cols.next_power_of_two();
    let f = softmax(block, dtype).unwrap();
    let args = [Arg::ptr(0), Arg::ptr(1), Arg::i32(cols as i32), Arg::i32(cols as i32)];
    launch(&f, [rows as u32, 1, 1], &mut bufs, &args).unwrap();
    let rel = if dtype == DType::F32 { 1e-5 } else { 8e-3 };
    assert_close(&bufs[0].to_f64(), &want, rel, 1e-7);
}

#[test]
fn softmax_f32_and_bf16() {
    run_softmax(5, 100, DType::F32, 3);
    run_softmax(7, 33, DType::BF16, 4);
    run_softmax(2, 1, DType::F16, 5);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn prop_vector_add(n in 1usize..2000, log_block in 4u32..9, seed in any::<u64>()) {
        run_vector_add(n, 1 << log_block, seed);
    }

    #[test]
    fn prop_softmax(rows in 1usize..6, cols in 1usize..300, bf in any::<bool>(), seed in any::<u64>()) {
        run_softmax(rows, cols, if bf { DType::BF16 } else { DType::F32 }, seed);
    }
}

/// Runs the tiled matmul; returns (interpreter result, f64 reference).
fn run_matmul(
    m: usize,
    n: usize,
    k: usize,
    blocks: [usize; 3],
    dtype: DType,
    seed: u64,
) -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let a = Buffer::from_f64(dtype, &rng.floats(m * k));
    let b = Buffer::from_f64(dtype, &rng.floats(k * n));
    let want = matmul_reference(&a.to_f64(), &b.to_f64(), m, n, k);
    let mut bufs = [a, b, Buffer::zeros(DType::F32, m * n)];
    let [bm, bn, bk] = blocks;
    let kern = Kernel::new(&matmul(bm, bn, bk, dtype).unwrap()).unwrap();
    let args: Vec<Arg> = vec![Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]
        .into_iter()
        .chain([m, n, k, k, n, n].map(|v| Arg::i32(v as i32)))
        .collect();
    let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
    let start = std::time::Instant::now();
    kern.launch(grid, &mut bufs, &args).unwrap();
    if m * n * k >= 1 << 27 {
        eprintln!("{m}x{n}x{k} {dtype} matmul, {bm}x{bn}x{bk} tiles: launch took {:?}", start.elapsed());
    }
    (bufs[2].to_f64(), want)
}

#[test]
fn matmul_ragged_with_k_loop() {
    for (dtype, seed) in [(DType::F32, 6), (DType::F16, 7), (DType::BF16, 8)] {
        let (got, want) = run_matmul(70, 45, 100, [32, 32, 16], dtype, seed);
        assert_close(&got, &want, 1e-5, 1e-5);
    }
    let (got, want) = run_matmul(3, 130, 17, [16, 64, 32], DType::F32, 9);
    assert_close(&got, &want, 1e-5, 1e-5);
}

/// Timing of a 512^3 matmul (64x64x32 tiles); run with `--ignored --nocapture`.
#[test]
#[ignore]
fn matmul_512_timing() {
    let (got, want) = run_matmul(512, 512, 512, [64, 64, 32], DType::F16, 10);
    assert_close(&got, &want, 1e-5, 1e-4);
}

#[test]
fn argmax_and_cumsum_rows() {
    let (rows, cols, block) = (6usize, 50usize, 64usize);
    let argmax_k = argmax_rows(block).unwrap();
    let cumsum_k = cumsum_rows(block).unwrap();
    let mut rng = Rng::new(11);
    let mut x = rng.floats(rows * cols);
    // Row 1 has a tie (the first index wins); row 2 a NaN that must be ignored.
    x[cols + 7] = 5.0;
    x[cols + 30] = 5.0;
    x[2 * cols + 3] = f64::NAN;
    let mut bufs = [Buffer::from_f64(DType::F32, &x), Buffer::zeros(DType::I32, rows)];
    launch(&argmax_k, [rows as u32, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(cols as i32)])
        .unwrap();
    let got = bufs[1].to_vec::<i32>();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mut best = 0;
        for c in 0..cols {
            if !row[c].is_nan() && (row[best].is_nan() || row[c] > row[best]) {
                best = c;
            }
        }
        assert_eq!(got[r], best as i32, "row {r}");
    }
    assert_eq!(got[1], 7);

    x[2 * cols + 3] = 0.25;
    let mut bufs = [Buffer::from_f64(DType::F32, &x), Buffer::zeros(DType::F32, rows * cols)];
    launch(&cumsum_k, [rows as u32, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(cols as i32)])
        .unwrap();
    let want = cumsum_reference(&bufs[0].to_f64(), cols);
    assert_close(&bufs[1].to_f64(), &want, 1e-6, 1e-6);
}

#[test]
fn atomic_add_histogram() {
    let (n, bins, block) = (3001usize, 13usize, 128usize);
    let f = histogram(block).unwrap();
    let mut rng = Rng::new(12);
    let data: Vec<i32> = (0..n).map(|_| rng.below(bins as u64) as i32).collect();
    let mut want = vec![0i32; bins];
    for &b in &data {
        want[b as usize] += 1;
    }
    let mut bufs = [Buffer::from_slice(&data), Buffer::zeros(DType::I32, bins)];
    let grid = n.div_ceil(block) as u32;
    launch(&f, [grid, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(n as i32)]).unwrap();
    assert_eq!(bufs[1].to_vec::<i32>(), want);
}

#[test]
fn other_atomics_return_old_values() {
    let f = kernel("atomics", || {
        let p = param_ptr("p", DType::I32);
        let q = param_ptr("q", DType::F32);
        let olds = param_ptr("olds", DType::I32);
        let offs = arange(0, 4);
        let old_max = atomic_max(p + offs, offs * 3, None);
        store(olds + offs, old_max, None);
        let old_cas = atomic_cas(p + offs, 6, 100);
        store(olds + offs + 4, old_cas, None);
        let old_x = atomic_xchg(p + offs, 7, Some(offs.lt(2)));
        store(olds + offs + 8, old_x, None);
        atomic_add(q + full(&[4], 0, DType::I32), 0.5, None);
        atomic_min(q + 1 + full(&[4], 0, DType::I32), offs.to(DType::F32) - 1.0, None);
    });
    let mut bufs = [
        Buffer::from_slice(&[5i32, 5, 5, 5]),
        Buffer::from_slice(&[1.0f32, 0.0]),
        Buffer::zeros(DType::I32, 12),
    ];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]).unwrap();
    // max(5, [0, 3, 6, 9]) = [5, 5, 6, 9]; cas(==6 -> 100); xchg(7) on lanes 0, 1.
    assert_eq!(bufs[2].to_vec::<i32>(), vec![5, 5, 5, 5, 5, 5, 6, 9, 5, 5, 0, 0]);
    assert_eq!(bufs[0].to_vec::<i32>(), vec![7, 7, 100, 9]);
    assert_eq!(bufs[1].to_vec::<f32>(), vec![3.0, -1.0]);
}

/// Argmax of each row via a custom combine on (value, index) pairs; `branchy`
/// puts an `if` in the combine, so the region runs lane by lane.
fn custom_argmax(block: usize, branchy: bool) -> Result<Function> {
    KernelBuilder::new("custom_argmax").build(|| {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let out_ptr = param_ptr("out_ptr", DType::I32);
        let row = program_id(0);
        let cols = arange(0, block as i32);
        let x = load(x_ptr + row * block as i32 + cols, None, None);
        let r = reduce(&[x, cols], 0, |a, b| {
            let take_b = b[0].gt(a[0]) | (b[0].eq_(a[0]) & b[1].lt(a[1]));
            if branchy {
                if_else(take_b, || vec![b[0], b[1]], || vec![a[0], a[1]])
            } else {
                vec![where_(take_b, b[0], a[0]), where_(take_b, b[1], a[1])]
            }
        });
        store(out_ptr + row, r[1], None);
    })
}

#[test]
fn custom_combine_reduce_and_scan() {
    let (rows, block) = (5usize, 64usize);
    let mut rng = Rng::new(13);
    let mut x = rng.floats(rows * block);
    x[block + 40] = 2.0;
    x[block + 9] = 2.0;
    for branchy in [false, true] {
        let f = custom_argmax(block, branchy).unwrap();
        let mut bufs = [Buffer::from_f64(DType::F32, &x), Buffer::zeros(DType::I32, rows)];
        launch(&f, [rows as u32, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
        let got = bufs[1].to_vec::<i32>();
        for r in 0..rows {
            let row = &x[r * block..(r + 1) * block];
            let best = (0..block).fold(0, |b, c| if row[c] > row[b] { c } else { b });
            assert_eq!(got[r], best as i32, "row {r} (branchy: {branchy})");
        }
    }
    // A custom scan: running product, forward and reverse, on a 2-D tile along axis 1.
    let f = kernel("cumprod", || {
        let x_ptr = param_ptr("x_ptr", DType::F64);
        let out_ptr = param_ptr("out_ptr", DType::F64);
        let offs = expand_dims(arange(0, 4), 1) * 8 + expand_dims(arange(0, 8), 0);
        let x = load(x_ptr + offs, None, None);
        let fwd = scan(&[x], 1, false, |a, b| vec![a[0] * b[0]])[0];
        let rev = scan(&[x], 1, true, |a, b| vec![a[0] * b[0]])[0];
        store(out_ptr + offs, fwd, None);
        store(out_ptr + offs + 32, rev, None);
    });
    let xs: Vec<f64> = (0..32).map(|i| 1.0 + (i % 5) as f64 * 0.25).collect();
    let mut bufs = [Buffer::from_slice(&xs), Buffer::zeros(DType::F64, 64)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
    let got = bufs[1].to_vec::<f64>();
    for r in 0..4 {
        let row = &xs[r * 8..(r + 1) * 8];
        for c in 0..8 {
            let fwd: f64 = row[..=c].iter().product();
            let rev: f64 = row[c..].iter().product();
            assert!((got[r * 8 + c] - fwd).abs() < 1e-12 && (got[32 + r * 8 + c] - rev).abs() < 1e-12);
        }
    }
}

#[test]
fn while_loop_with_if_else() {
    let f = kernel("collatz", || {
        // `hand::collatz`, then a result-less `if`: odd programs also mark their slot.
        let (out_ptr, pid) = hand::collatz_steps();
        if_then((pid % 2).eq_(1), || store(out_ptr + pid + 32, 1, None));
    });
    let xs: Vec<i32> = (1..=27).collect();
    let want: Vec<i32> = xs
        .iter()
        .map(|&x| {
            let (mut x, mut s) = (x, 0);
            while x > 1 {
                x = if x % 2 == 0 { x / 2 } else { 3 * x + 1 };
                s += 1;
            }
            s
        })
        .collect();
    let mut bufs = [Buffer::from_slice(&xs), Buffer::zeros(DType::I32, 64)];
    launch(&f, [27, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
    let out = bufs[1].to_vec::<i32>();
    assert_eq!(&out[..27], &want[..]);
    assert_eq!(&out[32..59], &(0..27).map(|p| p % 2).collect::<Vec<_>>()[..]);
}

#[test]
fn shape_ops_round_trip() {
    let f = kernel("shapes", || {
        let x_ptr = param_ptr("x_ptr", DType::I32);
        let out_ptr = param_ptr("out_ptr", DType::I32);
        let offs = arange(0, 8);
        let x = load(x_ptr + offs, None, None);
        let m = reshape(x, &[2, 4]);
        let t = trans(m); // [4, 2]: t[i, j] = x[j * 4 + i]
        store(out_ptr + offs, reshape(t, &[8]), None);
        let j = join(x, x * 10); // [8, 2]
        let (a, b) = split(j);
        store(out_ptr + 8 + offs, a + b, None);
        let p = permute(reshape(x, &[2, 2, 2]), &[2, 0, 1]);
        store(out_ptr + 16 + offs, reshape(p, &[8]), None);
        let col = broadcast_to(expand_dims(arange(0, 2), 1), &[2, 4]);
        store(out_ptr + 24 + offs, reshape(col, &[8]), None);
    });
    let xs: Vec<i32> = (0..8).collect();
    let mut bufs = [Buffer::from_slice(&xs), Buffer::zeros(DType::I32, 32)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
    let out = bufs[1].to_vec::<i32>();
    assert_eq!(&out[..8], &[0, 4, 1, 5, 2, 6, 3, 7]);
    assert_eq!(&out[8..16], &[0, 11, 22, 33, 44, 55, 66, 77]);
    // p[k, i, j] = x[i * 4 + j * 2 + k].
    assert_eq!(&out[16..24], &[0, 2, 4, 6, 1, 3, 5, 7]);
    assert_eq!(&out[24..], &[0, 0, 0, 0, 1, 1, 1, 1]);
}

#[test]
fn casts_round_and_saturate() {
    let f = kernel("casts", || {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let h_ptr = param_ptr("h_ptr", DType::BF16);
        let i_ptr = param_ptr("i_ptr", DType::I8);
        let u_ptr = param_ptr("u_ptr", DType::U32);
        let offs = arange(0, 8);
        let x = load(x_ptr + offs, None, None);
        store(h_ptr + offs, x, None);
        store(i_ptr + offs, x.to(DType::I8), None);
        let bits = bitcast(x, DType::U32);
        store(u_ptr + offs, (bits >> 31) + (bits << 40), None);
    });
    let xs = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 300.0, -300.0, f32::NAN, -2.9, 0.5, -0.0];
    let mut bufs = [
        Buffer::from_slice(&xs),
        Buffer::zeros(DType::BF16, 8),
        Buffer::zeros(DType::I8, 8),
        Buffer::zeros(DType::U32, 8),
    ];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::ptr(3)]).unwrap();
    let h = bufs[1].to_vec::<bf16>();
    // Ties round to even: 1 + 2^-8 -> 1.0, 1 + 3 * 2^-8 -> 1 + 2^-6.
    assert_eq!(h[0].to_f32(), 1.0);
    assert_eq!(h[1].to_f32(), 1.0 + 1.0 / 64.0);
    assert_eq!(bufs[2].to_vec::<i8>(), vec![1, 1, 127, -128, 0, -2, 0, 0]);
    // Shifts by 40 >= 32 give 0; the logical shift right extracts the sign.
    assert_eq!(bufs[3].to_vec::<u32>(), vec![0, 0, 0, 1, 0, 1, 0, 1]);
}

#[test]
fn integer_semantics() {
    let f = kernel("ints", || {
        let out = param_ptr("out", DType::I32);
        let uout = param_ptr("uout", DType::U32);
        let a = full(&[4], -7, DType::I32);
        let b = full(&[4], 2, DType::I32);
        store(out + arange(0, 4), a / b, Some(arange(0, 4).lt(1)));
        store(out + 1, rem(constant(-7, DType::I32), constant(2, DType::I32)), None);
        store(out + 2, shr(constant(-16, DType::I32), constant(2, DType::I32)), None);
        store(out + 3, shr(constant(-16, DType::I32), constant(99, DType::I32)), None);
        store(out + 4, umulhi(constant(0x4000_0000, DType::I32), constant(8, DType::I32)), None);
        let u = constant(0u32, DType::U32) - constant(1u32, DType::U32);
        store(uout, u, None);
        store(uout + 1, shr(u, constant(28u32, DType::U32)), None);
        store(uout + 2, u * u, None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 5), Buffer::zeros(DType::U32, 3)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
    assert_eq!(bufs[0].to_vec::<i32>(), vec![-3, -1, -4, -1, 2]);
    assert_eq!(bufs[1].to_vec::<u32>(), vec![u32::MAX, 15, 1]);
}

#[test]
fn dp4a_multiplies_packed_bytes_by_their_dtypes_signedness() {
    // Words of bytes [1, -2, 3, -128] and [-1, 5, 0x7f, -1]: as i32 the bytes
    // are signed, as u32 unsigned (0xfe = 254, 0x80 = 128, 0xff = 255).
    let wa = i32::from_le_bytes([1, 0xfe, 3, 0x80]);
    let wb = i32::from_le_bytes([0xff, 5, 0x7f, 0xff]);
    let f = kernel("dp4a", || {
        let out = param_ptr("out", DType::I32);
        let uout = param_ptr("uout", DType::U32);
        let a = full(&[2], wa as i64, DType::I32);
        let b = full(&[2], wb as i64, DType::I32);
        let (ua, ub) = (bitcast(a, DType::U32), bitcast(b, DType::U32));
        store(out + arange(0, 2), dp4a(a, b, 10), None);
        store(out + 2 + arange(0, 2), dp4a(ua, b, 0), None);
        store(out + 4 + arange(0, 2), dp4a(a, ub, zeros(&[2], DType::I32)), None);
        store(uout + arange(0, 2), dp4a(ua, ub, 7u32), None);
        // The accumulator wraps like an integer addition.
        store(
            out + 6,
            dp4a(constant(0x7f7f_7f7f, DType::I32), constant(0x7f7f_7f7f, DType::I32), i32::MAX),
            None,
        );
    });
    let mut bufs = [Buffer::zeros(DType::I32, 7), Buffer::zeros(DType::U32, 2)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
    let dot = |x: [i64; 4], y: [i64; 4]| x.iter().zip(&y).map(|(p, q)| p * q).sum::<i64>();
    let (sa, ua) = ([1, -2, 3, -128], [1, 254, 3, 128]);
    let (sb, ub) = ([-1, 5, 127, -1], [255, 5, 127, 255]);
    let i = bufs[0].to_vec::<i32>();
    assert_eq!(i[0] as i64, 10 + dot(sa, sb));
    assert_eq!(i[2] as i64, dot(ua, sb));
    assert_eq!(i[4] as i64, dot(sa, ub));
    assert_eq!(i[6], i32::MAX.wrapping_add(4 * 127 * 127));
    assert_eq!(bufs[1].to_vec::<u32>()[1] as i64, 7 + dot(ua, ub));
}

#[test]
fn dp4a_rejects_operands_that_are_not_words() {
    let e = KernelBuilder::new("bad")
        .build(|| {
            let out = param_ptr("out", DType::I32);
            let a = full(&[2], 1, DType::I8);
            store(out + arange(0, 2), dp4a(a, a, 0), None);
        })
        .unwrap_err();
    assert!(e.to_string().contains("dp4a"), "{e}");
}

#[test]
fn packed_bytes_through_ptrcast_and_aliasing() {
    // A u8 buffer holding [f16; 4] after 2 bytes of header, read through ptrcast;
    // `out` aliases `src` at an element offset.
    let f = kernel("unpack", || {
        let raw = param_ptr("raw", DType::U8);
        let src = param_ptr("src", DType::F32);
        let dst = param_ptr("dst", DType::F32);
        let offs = arange(0, 4);
        let h = load(ptrcast(raw + 2, DType::F16) + offs, None, None);
        store(dst + offs, h.to(DType::F32) + load(src + offs, None, None), None);
    });
    let mut raw = vec![0xAAu8, 0xBB];
    for v in [1.5f32, -2.0, 0.25, 1024.0] {
        raw.extend_from_slice(&f16::from_f32(v).to_le_bytes());
    }
    let mut bufs = [Buffer::from_bytes(DType::U8, raw).unwrap(), Buffer::from_slice(&[1.0f32; 8])];
    let args = [Arg::ptr(0), Arg::ptr(1), Arg::ptr_at(1, 4)];
    launch(&f, [1, 1, 1], &mut bufs, &args).unwrap();
    assert_eq!(bufs[1].to_vec::<f32>(), vec![1.0, 1.0, 1.0, 1.0, 2.5, -1.0, 1.25, 1025.0]);
}

#[test]
fn hints_pass_when_true_and_print_goes_to_the_sink() {
    let f = kernel("hinted", || {
        let x = param_ptr("x", DType::F32);
        let offs = multiple_of(program_id(0) * 16, 16) + max_contiguous(arange(0, 16), 16);
        let offs = max_contiguous(multiple_of(offs, 16), 16);
        let c = max_constancy(broadcast_to(constant(0, DType::I32), &[2, 4]), 4);
        let p = multiple_of(x + offs, 16);
        let v = load(p, None, None);
        device_assert(v.ge(0.0), "non-negative input");
        store(p, v * 2.0, None);
        device_print("c ", &[c, sum(v, 0)]);
    });
    let mut bufs = [Buffer::from_slice(&[1.0f32; 32])];
    let mut printed = Vec::new();
    Interpreter::new()
        .with_print_sink(&mut printed)
        .launch(&Kernel::new(&f).unwrap(), [2, 1, 1], &mut bufs, &[Arg::ptr(0)])
        .unwrap();
    assert_eq!(bufs[0].to_vec::<f32>(), vec![2.0; 32]);
    let text = String::from_utf8(printed).unwrap();
    assert!(text.contains("pid (1, 0, 0) c  #1 f32: 16.0"), "{text}");
    assert!(text.contains("pid (0, 0, 0) c  #0 i32[2x4]: [0, 0, 0, 0, 0, 0, 0, 0]"), "{text}");
}

#[test]
fn benign_same_value_stores_and_2d_grid() {
    // Every program stores the same value to out[0] (benign) and its own id.
    let f = kernel("grid2d", || {
        let out = param_ptr("out", DType::I32);
        let (x, y) = (program_id(0), program_id(1));
        store(out, num_programs(0) * 100 + num_programs(1), None);
        store(out + 1 + x * num_programs(1) + y, x * 10 + y, None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 7)];
    launch(&f, [2, 3, 1], &mut bufs, &[Arg::ptr(0)]).unwrap();
    assert_eq!(bufs[0].to_vec::<i32>(), vec![203, 0, 1, 2, 10, 11, 12]);
    // A grid with a zero dimension runs nothing.
    launch(&f, [0, 3, 1], &mut bufs, &[Arg::ptr(0)]).unwrap();
}

/// Interpreter overhead per op on scalars and small tiles; run with `--ignored --nocapture`.
#[test]
#[ignore]
fn op_overhead_timing() {
    for width in [1usize, 128] {
        let f = kernel("spin", || {
            let x = param_ptr("x", DType::F32);
            let init = full(&[width], 0.0, DType::F32);
            let r = for_range(0, 100_000, 1, &[init], |i, c| {
                let v = i.to(DType::F32) * 0.5;
                vec![c[0] + v - 1.0]
            })[0];
            store(x + arange(0, width as i32), r, None);
        });
        let mut bufs = [Buffer::zeros(DType::F32, width)];
        let start = std::time::Instant::now();
        launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]).unwrap();
        let per_iter = start.elapsed() / 100_000;
        eprintln!("width {width}: {per_iter:?} per loop iteration (8 ops and a yield)");
    }
}

#[test]
fn int8_and_tf32_dot_math_and_builtin_scans() {
    let f = kernel("misc", || {
        let a_ptr = param_ptr("a", DType::I8);
        let c_ptr = param_ptr("c", DType::I32);
        let x_ptr = param_ptr("x", DType::F32);
        let y_ptr = param_ptr("y", DType::F32);
        let h_ptr = param_ptr("h", DType::BF16);
        let r = expand_dims(arange(0, 16), 1) * 16 + expand_dims(arange(0, 16), 0);
        let a = load(a_ptr + r, None, None);
        store(c_ptr + r, dot(a, trans(a), None), None);
        let x = load(x_ptr + r, None, None);
        let d = dot_with(x, x, Some(zeros(&[16, 16], DType::F32)), crate::ir::ops::DotPrecision::Tf32);
        store(y_ptr + r, d, None);
        let v = load(x_ptr + arange(0, 16), None, None);
        let e = exp(v.to(DType::BF16));
        store(h_ptr + arange(0, 16), fma(e, e, e), None);
        store(y_ptr + 256 + arange(0, 16), cummax(v, 0), None);
        let rev = scan(&[v], 0, true, |a, b| vec![minimum(a[0], b[0])])[0];
        store(y_ptr + 272 + arange(0, 16), rev, None);
        store(y_ptr + 288, argmin(v, 0).to(DType::F32), None);
    });
    let mut rng = Rng::new(14);
    let ai: Vec<i8> = (0..256).map(|_| (rng.below(256) as i64 - 128) as i8).collect();
    let xs: Vec<f64> = rng.floats(256);
    let mut bufs = [
        Buffer::from_slice(&ai),
        Buffer::zeros(DType::I32, 256),
        Buffer::from_f64(DType::F32, &xs),
        Buffer::zeros(DType::F32, 289),
        Buffer::zeros(DType::BF16, 16),
    ];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::ptr(3), Arg::ptr(4)])
        .unwrap();
    let c = bufs[1].to_vec::<i32>();
    let y = bufs[3].to_f64();
    let xf = bufs[2].to_f64();
    let tf32 = |v: f64| {
        let b = (v as f32).to_bits();
        f32::from_bits(b.wrapping_add(1 << 12) & !0x1fff) as f64
    };
    for i in 0..16 {
        for j in 0..16 {
            let want: i32 = (0..16).map(|k| ai[i * 16 + k] as i32 * ai[j * 16 + k] as i32).sum();
            assert_eq!(c[i * 16 + j], want);
            let want: f64 = (0..16).map(|k| tf32(xf[i * 16 + k]) * tf32(xf[k * 16 + j])).sum();
            assert!((y[i * 16 + j] - want).abs() < 1e-6, "tf32 dot ({i}, {j})");
        }
    }
    let h = bufs[4].to_f64();
    for i in 0..16 {
        let e = bf16::from_f64(bf16::from_f64(xf[i]).to_f64().exp()).to_f64();
        assert_eq!(h[i], bf16::from_f64(e * e + e).to_f64(), "bf16 exp/fma lane {i}");
        let cm = xf[..=i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(y[256 + i], cm);
        let rm = xf[i..16].iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(y[272 + i], rm);
    }
    let am = (0..16).fold(0, |b, i| if xf[i] < xf[b] { i } else { b });
    assert_eq!(y[288], am as f64);
}

/// A decode-style GEMV (`y = W x`, bf16 weights, N = 1536, K = 576 as in
/// SmolLM2-135M's MLP); run with `--ignored --nocapture`.
#[test]
#[ignore]
fn gemv_timing() {
    let (n, k, bn, bk) = (1536usize, 576usize, 16usize, 64usize);
    let f = kernel("gemv", || {
        let w_ptr = param_ptr("w", DType::BF16);
        let x_ptr = param_ptr("x", DType::F32);
        let y_ptr = param_ptr("y", DType::F32);
        let rows = program_id(0) * bn as i32 + arange(0, bn as i32);
        let acc = zeros(&[bn], DType::F32);
        let acc = for_range(0, k as i32, bk as i32, &[acc], |k0, c| {
            let ks = k0 + arange(0, bk as i32);
            let w = load(w_ptr + expand_dims(rows, 1) * k as i32 + expand_dims(ks, 0), None, None);
            let x = load(x_ptr + ks, None, None);
            vec![c[0] + sum(w.to(DType::F32) * expand_dims(x, 0), 1)]
        })[0];
        store(y_ptr + rows, acc, None);
    });
    let mut rng = Rng::new(15);
    let mut bufs = [
        Buffer::from_f64(DType::BF16, &rng.floats(n * k)),
        Buffer::from_f64(DType::F32, &rng.floats(k)),
        Buffer::zeros(DType::F32, n),
    ];
    let kern = Kernel::new(&f).unwrap();
    let start = std::time::Instant::now();
    for _ in 0..10 {
        kern.launch([(n / bn) as u32, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::ptr(2)]).unwrap();
    }
    eprintln!("gemv {n}x{k} bf16: {:?} per launch", start.elapsed() / 10);
}
