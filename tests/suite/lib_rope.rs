//! Kernel library: RoPE + paged KV write on the interpreter against references.
//!
//! `rope_kv_write` (kernels::rope) on the CPU interpreter against the f64
//! reference (kernels::reference::rope): random non-zero inputs, ragged token
//! counts, the SmolLM2 shape (9 Q heads, 3 KV heads, head dim 64, theta 1e5)
//! and a (4, 2, 128) shape, positions up to 8191, distinct random slots with
//! some `-1`, block sizes 16 and 32, f32 and bf16. Caches start with random
//! non-zero contents; slots not written must keep them bit for bit.
//!
//! Tolerance per element of a rotated pair `(x0, x1)` with norm `n`:
//! `n * (1e-5 + angle_error_bound)`, the f32 arithmetic of the kernel plus the
//! error of its f32 angle (which grows with the position); bf16 adds one unit
//! of the final rounding, `|want| / 128`. V is a copy: exact.

use crate::common::{Storage, cases, f32_or_bf16, nonzero};
use dsl_core::DType;
use dsl_core::interp::{Cpu, CpuPtr};
use kernels::reference::rope::{self as r, RopeShape};
use kernels::rope::{rope_arch_kv_write, rope_kv_write};
use proptest::prelude::*;
use std::marker::PhantomData;
use std::ops::Range;
use tests::reference::Rng;

/// Per-element tolerances of rotated heads: `x` holds `heads` heads of `d`
/// elements per token (token stride `stride`, offset `off` into the row).
#[allow(clippy::too_many_arguments)]
fn rotated_tol(
    x: &[f64],
    stride: usize,
    off: usize,
    heads: usize,
    d: usize,
    pos: i32,
    theta: f64,
    t: usize,
    bf: bool,
    want: &[f64],
) -> Vec<f64> {
    let mut tol = Vec::with_capacity(heads * d);
    for h in 0..heads {
        for j in 0..d {
            let i = j / 2;
            let b = t * stride + off + h * d + 2 * i;
            let n = x[b].hypot(x[b + 1]);
            let w = want[h * d + j].abs();
            tol.push(n * (1e-5 + r::angle_error_bound(pos, i, d, theta)) + if bf { w / 128.0 } else { 0.0 });
        }
    }
    tol
}

fn check(what: &str, got: &[f64], want: &[f64], tol: &[f64]) -> Result<(), TestCaseError> {
    for (e, ((g, w), t)) in got.iter().zip(want).zip(tol).enumerate() {
        let d = (g - w).abs();
        if d.is_nan() || d > *t {
            return Err(TestCaseError::fail(format!("{what}[{e}]: got {g}, want {w}, |diff| {d} > {t}")));
        }
    }
    Ok(())
}

/// The inputs of one launch: QKV rows, positions, slots, K and V caches.
type Inputs<'a> = (&'a [f64], &'a [i32], &'a [i32], &'a [f64], &'a [f64]);

/// The outputs of one launch: Q, the K cache and the V cache.
type Outputs = (Vec<f64>, Vec<f64>, Vec<f64>);

/// The random inputs of one case: non-zero QKV rows and initial caches of
/// `n_slots` slots in `dtype`, positions below 8192, and `slots` (drawn
/// after the positions; `-1`: the token's KV is not written).
struct RandomInputs {
    qkv: Vec<f64>,
    positions: Vec<i32>,
    slots: Vec<i32>,
    k_init: Vec<f64>,
    v_init: Vec<f64>,
}

impl RandomInputs {
    fn new(
        rng: &mut Rng,
        (shape, tokens, n_slots): (RopeShape, usize, usize),
        dtype: DType,
        slots: impl FnOnce(&mut Rng) -> Vec<i32>,
    ) -> Self {
        let qkv = nonzero(rng, tokens * shape.row(), dtype);
        let positions: Vec<i32> = (0..tokens).map(|_| rng.below(8192) as i32).collect();
        let slots = slots(rng);
        let k_init = nonzero(rng, n_slots * shape.slot(), dtype);
        let v_init = nonzero(rng, n_slots * shape.slot(), dtype);
        RandomInputs { qkv, positions, slots, k_init, v_init }
    }

    fn inputs(&self) -> Inputs<'_> {
        (&self.qkv, &self.positions, &self.slots, &self.k_init, &self.v_init)
    }

    /// The caches a launch left, `(k_got, v_got)`, hold the initial contents
    /// bit for bit at every slot no token writes (slots of `sl` elements).
    fn check_untouched(&self, k_got: &[f64], v_got: &[f64], sl: usize) -> Result<(), TestCaseError> {
        for s in (0..self.k_init.len() / sl).filter(|s| !self.slots.contains(&(*s as i32))) {
            let (a, b) = (s * sl, (s + 1) * sl);
            prop_assert_eq!(&k_got[a..b], &self.k_init[a..b], "k_cache slot {} must be untouched", s);
            prop_assert_eq!(&v_got[a..b], &self.v_init[a..b], "v_cache slot {} must be untouched", s);
        }
        Ok(())
    }
}

/// What both random tests draw: `tokens` tokens of the attention shape
/// `shape` with RoPE base `theta`, activations and caches in bf16 (`bf`) or
/// f32, inputs from `seed`.
#[derive(Clone, Copy, Debug)]
struct Case {
    tokens: usize,
    shape: RopeShape,
    theta: f64,
    bf: bool,
    seed: u64,
}

impl Case {
    /// The case's random stream and storage dtype.
    fn start(&self) -> (Rng, DType) {
        (Rng::new(self.seed), if self.bf { DType::BF16 } else { DType::F32 })
    }
}

/// Cases of a token count in `tokens` and one of `ropes` (shape and theta).
fn cases_of(tokens: Range<usize>, ropes: [(RopeShape, f64); 2]) -> impl Strategy<Value = Case> {
    (tokens, prop::sample::select(ropes.to_vec()), any::<bool>(), any::<u64>())
        .prop_map(|(tokens, (shape, theta), bf, seed)| Case { tokens, shape, theta, bf, seed })
}

/// The interpreter with one launch's buffers, activations and caches in
/// `T`: QKV rows, positions, slots, Q out and the K and V caches.
struct Buffers<T: Storage> {
    cpu: Cpu,
    qkv: CpuPtr<T>,
    pos: CpuPtr<i32>,
    slot: CpuPtr<i32>,
    q: CpuPtr<T>,
    k: CpuPtr<T>,
    v: CpuPtr<T>,
}

impl<T: Storage> Buffers<T> {
    /// `inputs` uploaded, Q out zeroed.
    fn new((qkv, positions, slots, k_init, v_init): Inputs<'_>, shape: RopeShape) -> Self {
        let store = |v: &[f64]| v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>();
        let mut cpu = Cpu::new();
        let (pos, slot) = (cpu.upload(positions), cpu.upload(slots));
        let (qkv, q) =
            (cpu.upload(&store(qkv)), cpu.zeros::<T>(positions.len() * shape.n_q * shape.head_dim));
        let (k, v) = (cpu.upload(&store(k_init)), cpu.upload(&store(v_init)));
        Buffers { cpu, qkv, pos, slot, q, k, v }
    }

    /// `(q, k cache, v cache)` as they are now.
    fn read(&self) -> Outputs {
        let f = |v: Vec<T>| v.into_iter().map(|x| x.to_f64()).collect();
        (f(self.cpu.read(self.q)), f(self.cpu.read(self.k)), f(self.cpu.read(self.v)))
    }
}

/// The launch arguments `$k::Args` of `rope_kv_write` or
/// `rope_arch_kv_write` on the buffers `$b`: the fields they both take (the
/// buffers' pointers and `theta`), then the kernel's own fields by name.
macro_rules! rope_args {
    ($k:ident, $b:expr, $theta:expr $(, $f:ident $(: $v:expr)?)* $(,)?) => {
        $k::Args {
            qkv_ptr: $b.qkv.cast(), pos_ptr: $b.pos, slot_ptr: $b.slot,
            q_out_ptr: $b.q.cast(), k_cache_ptr: $b.k.cast(), v_cache_ptr: $b.v.cast(),
            theta: $theta as f32, $($f $(: $v)?,)* _marker: PhantomData,
        }
    };
}

/// `(q, k cache, v cache)` after `rope_kv_write` on the interpreter, with
/// activations and caches stored in `T`.
fn interpret<T: Storage>(inputs: Inputs<'_>, shape: RopeShape, theta: f64) -> Result<Outputs, TestCaseError> {
    let RopeShape { n_q, n_kv, head_dim: d } = shape;
    let tokens = inputs.1.len();
    let mut b = Buffers::<T>::new(inputs, shape);
    let args = rope_args!(rope_kv_write, b, theta);
    let config = rope_kv_write::Config::new(T::DTYPE, n_q, n_kv, d, false);
    rope_kv_write::interpret(&mut b.cpu, [tokens as u32, 1, 1], &config, &args)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(b.read())
}

/// One random case `c` into a cache of `block_size`-slot blocks.
fn run_case(c: Case, block_size: usize) -> Result<(), TestCaseError> {
    let Case { tokens, shape, theta, bf, .. } = c;
    let (mut rng, dtype) = c.start();
    let RopeShape { n_q, n_kv, head_dim: d } = shape;
    let num_blocks = (2 * tokens).div_ceil(block_size) + 1;
    let n_slots = num_blocks * block_size;
    // Distinct slots (a partial Fisher-Yates shuffle), about a quarter skipped.
    let inp = RandomInputs::new(&mut rng, (shape, tokens, n_slots), dtype, |rng| {
        let mut all: Vec<i32> = (0..n_slots as i32).collect();
        for t in 0..tokens {
            let j = t + rng.below((n_slots - t) as u64) as usize;
            all.swap(t, j);
        }
        (0..tokens).map(|t| if rng.below(4) == 0 { -1 } else { all[t] }).collect()
    });
    let RandomInputs { qkv, positions, slots, k_init, v_init } = &inp;

    let (mut k_want, mut v_want) = (k_init.clone(), v_init.clone());
    let q_want = r::rope_kv_write(qkv, positions, slots, theta, shape, dtype, &mut k_want, &mut v_want);

    let (q_got, k_got, v_got) = f32_or_bf16!(bf, interpret(inp.inputs(), shape, theta))?;

    // Q: every token.
    for (t, &pos) in positions.iter().enumerate() {
        let (a, b) = (t * n_q * d, (t + 1) * n_q * d);
        let tol = rotated_tol(qkv, shape.row(), 0, n_q, d, pos, theta, t, bf, &q_want[a..b]);
        check(&format!("q_out token {t}"), &q_got[a..b], &q_want[a..b], &tol)?;
    }
    // Caches: written slots within tolerance (V exact), every other slot unchanged.
    let sl = shape.slot();
    for (t, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let (a, b) = (s as usize * sl, (s as usize + 1) * sl);
        let tol = rotated_tol(qkv, shape.row(), n_q * d, n_kv, d, positions[t], theta, t, bf, &k_want[a..b]);
        check(&format!("k_cache slot {s} (token {t})"), &k_got[a..b], &k_want[a..b], &tol)?;
        let v_src = &qkv[t * shape.row() + (n_q + n_kv) * d..(t + 1) * shape.row()];
        prop_assert_eq!(&v_got[a..b], v_src, "v_cache slot {} (token {})", s, t);
        prop_assert_eq!(&v_want[a..b], v_src);
    }
    inp.check_untouched(&k_got, &v_got, sl)
}

/// The hand-computed rotation case: one query and one KV head of 4 elements
/// at position 1 into slot 1 of a two-slot cache holding 9s, theta 100 (pair
/// 0 rotates by exactly 1 rad, pair 1 by 0.1 rad).
const HAND_SHAPE: RopeShape = RopeShape { n_q: 1, n_kv: 1, head_dim: 4 };
const HAND_QKV: [f64; 12] =
    [1.0, 0.0, 0.0, 1.0, /* k */ 0.0, 1.0, 1.0, 0.0, /* v */ 5.0, 6.0, 7.0, 8.0];

/// The reference on the hand-computed case, the plain rotation or with
/// `arch`'s options: `(q, k cache)`, after checking that V went to slot 1
/// unchanged. Also `(cos 1, sin 1, cos 0.1, sin 0.1)`.
fn hand_case(arch: Option<&r::RopeArch>) -> (Vec<f64>, Vec<f64>, [f64; 4]) {
    let (mut k, mut v) = (vec![9.0; 8], vec![9.0; 8]);
    let q = match arch {
        None => r::rope_kv_write(&HAND_QKV, &[1], &[1], 100.0, HAND_SHAPE, DType::F64, &mut k, &mut v),
        Some(a) => {
            r::rope_arch_kv_write(&HAND_QKV, &[1], &[1], 100.0, HAND_SHAPE, a, DType::F64, &mut k, &mut v)
        }
    };
    assert_eq!(v, [9.0, 9.0, 9.0, 9.0, 5.0, 6.0, 7.0, 8.0]);
    (q, k, [1f64.cos(), 1f64.sin(), 0.1f64.cos(), 0.1f64.sin()])
}

/// Every `got` within `tol` of `want`.
fn assert_near(got: &[f64], want: [f64; 4], tol: f64) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < tol, "{got:?}");
    }
}

/// The rotation convention: adjacent pairs (llama.cpp `NORM`), checked on a
/// hand-computed case.
#[test]
fn rope_rotates_adjacent_pairs() {
    let (q, k, [c0, s0, c1, s1]) = hand_case(None);
    assert_near(&q, [c0, s0, -s1, c1], 1e-12);
    assert_eq!(&k[..4], &[9.0; 4]);
    assert_near(&k[4..], [-s0, c0, c1, s1], 1e-12);
}

/// `rope_arch_kv_write` on the interpreter: `(q, k cache, v cache)`.
fn interpret_arch<T: Storage>(
    inputs: Inputs<'_>,
    shape: RopeShape,
    theta: f64,
    arch: &r::RopeArch,
) -> Result<Outputs, TestCaseError> {
    let RopeShape { n_q, n_kv, head_dim: d } = shape;
    let tokens = inputs.1.len();
    let f32s = |v: Option<&Vec<f64>>| v.map_or(vec![0f32], |v| v.iter().map(|&x| x as f32).collect());
    let norm: Option<Vec<f64>> = arch.qk_norm.as_ref().map(|(q, k, _)| q.iter().chain(k).copied().collect());
    let eps = arch.qk_norm.as_ref().map_or(1e-6, |n| n.2) as f32;
    let mut b = Buffers::<T>::new(inputs, shape);
    let fp = b.cpu.upload(&f32s(arch.factors.as_ref()));
    let bp = b.cpu.upload(&f32s(arch.bias.as_ref()));
    let np = b.cpu.upload(&f32s(norm.as_ref()));
    let args = rope_args!(rope_arch_kv_write, b, theta, factors_ptr: fp, bias_ptr: bp, norm_ptr: np, eps);
    let config = rope_arch_kv_write::Config::new(
        T::DTYPE,
        n_q,
        n_kv,
        d,
        arch.neox,
        arch.factors.is_some(),
        arch.bias.is_some(),
        arch.qk_norm.is_some(),
        false,
    );
    rope_arch_kv_write::interpret(&mut b.cpu, [tokens as u32, 1, 1], &config, &args)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(b.read())
}

/// Tolerances of the rotated heads `heads` (from head `first` of the fused
/// row `row`) at `pos`: per element the norm of its pair after bias and
/// head norm, times the f32 arithmetic and twice the angle bound (the
/// factor's division adds one rounding); bf16 adds one unit of the
/// final rounding.
#[allow(clippy::too_many_arguments)]
fn arch_tol(
    arch: &r::RopeArch,
    row: &[f64],
    first: usize,
    heads: usize,
    d: usize,
    norm: Option<&[f64]>,
    pos: i32,
    theta: f64,
    bf: bool,
    want: &[f64],
) -> Vec<f64> {
    let mut tol = vec![0.0; heads * d];
    for h in 0..heads {
        let x = arch.head(row, (first + h) * d, d, norm);
        for i in 0..d / 2 {
            let (a, b) = arch.pair(i, d);
            let n = x[a].hypot(x[b]);
            for j in [a, b] {
                let w = want[h * d + j].abs();
                tol[h * d + j] = n * (1e-5 + 2.0 * r::angle_error_bound(pos, i, d, theta))
                    + if bf { w / 128.0 } else { 0.0 };
            }
        }
    }
    tol
}

/// One random case `c` with the architecture options `opts` (bits: NEOX
/// pairs, frequency factors, QKV bias, Q/K head norm).
fn run_arch_case(c: Case, opts: u8) -> Result<(), TestCaseError> {
    let Case { tokens, shape, theta, bf, .. } = c;
    let (mut rng, dtype) = c.start();
    let RopeShape { n_q, n_kv, head_dim: d } = shape;
    let vals = |rng: &mut Rng, n: usize, lo: f32, hi: f32| -> Vec<f64> {
        (0..n).map(|_| rng.uniform(lo, hi) as f64).collect()
    };
    let arch = r::RopeArch {
        neox: opts & 1 != 0,
        factors: (opts & 2 != 0).then(|| vals(&mut rng, d / 2, 1.0, 8.0)),
        bias: (opts & 4 != 0).then(|| vals(&mut rng, shape.row(), -2.0, 2.0)),
        qk_norm: (opts & 8 != 0).then(|| (vals(&mut rng, d, 0.5, 1.5), vals(&mut rng, d, 0.5, 1.5), 1e-6)),
    };
    let n_slots = 2 * tokens + 3;
    let inp = RandomInputs::new(&mut rng, (shape, tokens, n_slots), dtype, |rng| {
        (0..tokens).map(|t| if rng.below(4) == 0 { -1 } else { (2 * t + 1) as i32 }).collect()
    });
    let RandomInputs { qkv, positions, slots, k_init, v_init } = &inp;
    let (mut k_want, mut v_want) = (k_init.clone(), v_init.clone());
    let q_want =
        r::rope_arch_kv_write(qkv, positions, slots, theta, shape, &arch, dtype, &mut k_want, &mut v_want);
    let (q_got, k_got, v_got) = f32_or_bf16!(bf, interpret_arch(inp.inputs(), shape, theta, &arch))?;
    let (qn, kn) = match &arch.qk_norm {
        Some((q, k, _)) => (Some(q.as_slice()), Some(k.as_slice())),
        None => (None, None),
    };
    let (sl, rl) = (shape.slot(), shape.row());
    for (t, &pos) in positions.iter().enumerate() {
        let row = &qkv[t * rl..(t + 1) * rl];
        let (a, b) = (t * n_q * d, (t + 1) * n_q * d);
        let tol = arch_tol(&arch, row, 0, n_q, d, qn, pos, theta, bf, &q_want[a..b]);
        check(&format!("q_out token {t} opts {opts}"), &q_got[a..b], &q_want[a..b], &tol)?;
        if slots[t] < 0 {
            continue;
        }
        let (a, b) = (slots[t] as usize * sl, (slots[t] as usize + 1) * sl);
        let tol = arch_tol(&arch, row, n_q, n_kv, d, kn, pos, theta, bf, &k_want[a..b]);
        check(&format!("k_cache token {t} opts {opts}"), &k_got[a..b], &k_want[a..b], &tol)?;
        let v_tol: Vec<f64> =
            v_want[a..b].iter().map(|w| w.abs() * if bf { 1.0 / 128.0 } else { 1e-6 }).collect();
        check(&format!("v_cache token {t} opts {opts}"), &v_got[a..b], &v_want[a..b], &v_tol)?;
    }
    // Slots no token writes keep their contents.
    inp.check_untouched(&k_got, &v_got, sl)
}

proptest! {
    #![proptest_config(cases(32))]

    /// The SmolLM2 shape (theta 1e5) and a (4, 2, 128) one (theta 1e4), ragged
    /// token counts, block sizes 16 and 32.
    #[test]
    fn rope_kv_write_ragged(
        c in cases_of(1..13, [
            (RopeShape { n_q: 9, n_kv: 3, head_dim: 64 }, 100_000.0),
            (RopeShape { n_q: 4, n_kv: 2, head_dim: 128 }, 10_000.0),
        ]),
        block_size in prop::sample::select(vec![16usize, 32]),
    ) {
        run_case(c, block_size)?;
    }

    /// Every combination of NEOX pairs, frequency factors, QKV bias and
    /// Q/K head norm, ragged token counts, GQA shapes, f32 and bf16.
    #[test]
    fn rope_arch_kv_write_ragged(
        c in cases_of(1..9, [
            (RopeShape { n_q: 4, n_kv: 2, head_dim: 128 }, 1_000_000.0),
            (RopeShape { n_q: 7, n_kv: 1, head_dim: 32 }, 10_000.0),
        ]),
        opts in 0u8..16,
    ) {
        run_arch_case(c, opts)?;
    }
}

/// NEOX pairs `(x[i], x[i + d/2])` with every option off equal the plain
/// kernel's rotation of the permuted head; checked on a hand-computed case.
#[test]
fn rope_arch_rotates_neox_halves() {
    // q = (1, 0 | 0, 1): pair 0 is (q[0], q[2]) = (1, 0), pair 1 (q[1], q[3]) = (0, 1).
    let arch = r::RopeArch { neox: true, ..Default::default() };
    let (q, _, [c0, s0, c1, s1]) = hand_case(Some(&arch));
    let want_q = [c0, -s1, s0, c1];
    assert_near(&q, want_q, 1e-12);
    let inputs = (&HAND_QKV[..], &[1][..], &[1][..], &[9.0; 8][..], &[9.0; 8][..]);
    let (gq, _, _) = interpret_arch::<f32>(inputs, HAND_SHAPE, 100.0, &arch).unwrap();
    assert_near(&gq, want_q, 1e-6);
}
