//! The GPU check of `rope_kv_write` (RoPE + paged KV write, `kernels::rope`):
//! the GPU against the CPU interpreter with the same random inputs, in f32 and
//! bf16, at the SmolLM2 shape (9 Q heads, 3 KV heads, head dim 64, theta 1e5)
//! and a (4, 2, 128) shape, ragged token counts, positions up to 8191,
//! distinct random slots (about a quarter `-1`), block sizes 16 and 32. The
//! caches start with random non-zero contents: every slot not written must
//! come back bit for bit, V bit for bit where written.
//!
//! Tolerance (per element of a rotated pair `(x0, x1)` of norm `n`, angle `a`):
//! `n * (a * 2^-20 + 2^-18)`, plus one unit of the final rounding (`|cpu|/128`)
//! in bf16. The GPU computes the same f32 sequence as the interpreter except
//! that `exp2`, `log2`, `sin` and `cos` are the PTX approximations: `ex2.approx`
//! has a relative error of about 2^-22 (the interpreter's is correctly
//! rounded), which the multiplication by the position turns into an angle
//! error of about `a * 2^-22`; `lg2.approx` adds less through the exponent; after
//! the kernel's range reduction to `[-pi, pi]`, `sin/cos.approx` are within
//! 2^-20.9 absolute. Both terms get a factor of 4 margin. At position 8191
//! this allows ~8e-3 * n on the lowest pairs: f32 angles at such positions
//! are only that accurate anywhere (the interpreter's own f32 angle is off the
//! exact one by up to ~1e-3 rad there); the kernel's rounding and pairing
//! errors are O(n) and still fail.

use crate::check::{CheckRow, DevicePtr, Rng, compare_each, over_shapes, to_f64};
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::model::args::rope_args;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use dsl_core::launch::AnyDType;
use kernels::rope::rope_kv_write;

/// Head counts, head size and theta of one case.
#[derive(Clone, Copy, Debug)]
struct Shape {
    n_q: usize,
    n_kv: usize,
    d: usize,
    theta: f32,
}

impl Shape {
    fn row(&self) -> usize {
        (self.n_q + 2 * self.n_kv) * self.d
    }
    fn slot(&self) -> usize {
        self.n_kv * self.d
    }
}

/// SmolLM2-135M's attention shape.
const SMOLLM2: Shape = Shape { n_q: 9, n_kv: 3, d: 64, theta: 100_000.0 };
/// A wider head (head dim 128, GQA 2:1).
const WIDE: Shape = Shape { n_q: 4, n_kv: 2, d: 128, theta: 10_000.0 };

/// The tolerance of element `j` of a rotated head `x` (`d` elements) at `pos`.
fn rotated_tol(x: &[f64], j: usize, d: usize, pos: i32, theta: f32, want: f64, dtype: DType) -> f64 {
    let i = j / 2;
    let n = x[2 * i].hypot(x[2 * i + 1]);
    let a = pos as f64 * (theta as f64).powf(-2.0 * i as f64 / d as f64);
    let round = if dtype == DType::F32 { 4.0 * f64::powi(2.0, -24) } else { 1.0 / 128.0 };
    n * (a * f64::powi(2.0, -20) + f64::powi(2.0, -18)) + round * want.abs()
}

/// The inputs of one RoPE launch.
struct RopeInputs<T> {
    /// The fused QKV rows, one per token.
    qkv: Vec<T>,
    /// Each token's position.
    positions: Vec<i32>,
    /// Each token's cache slot (-1: not written).
    slots: Vec<i32>,
    /// The K cache before the launch.
    k_init: Vec<T>,
    /// The V cache before the launch.
    v_init: Vec<T>,
}

/// The device buffers of one launch on [`RopeInputs`]: the inputs and the
/// caches uploaded, the Q output zeroed.
struct RopeBufs<D: Device, T: ActElem> {
    qkv: D::Buf<T>,
    positions: D::Buf<i32>,
    slots: D::Buf<i32>,
    q: D::Buf<T>,
    k: D::Buf<T>,
    v: D::Buf<T>,
}

impl<T: ActElem> RopeInputs<T> {
    /// Random inputs of `tokens` tokens at shape `s` into a cache of
    /// `n_slots` slots, drawn from `rng` in this order: the QKV rows, the
    /// positions (below `max_pos`), the slots (by `slots`), the K cache, the
    /// V cache.
    fn random(
        rng: &mut Rng,
        s: Shape,
        (tokens, n_slots, max_pos): (usize, usize, u64),
        slots: impl FnOnce(&mut Rng) -> Vec<i32>,
    ) -> RopeInputs<T> {
        let qkv = rng.values::<T>(tokens * s.row(), 2.0);
        let positions = (0..tokens).map(|_| (rng.next_u64() % max_pos) as i32).collect();
        let slots = slots(rng);
        let k_init = rng.values::<T>(n_slots * s.slot(), 2.0);
        RopeInputs { qkv, positions, slots, k_init, v_init: rng.values::<T>(n_slots * s.slot(), 2.0) }
    }

    /// `self` on `dev` for a launch at shape `s`.
    fn upload<D: Device>(&self, dev: &mut D, s: Shape) -> Result<RopeBufs<D, T>> {
        let (qkv, positions) = (dev.upload(&self.qkv)?, dev.upload(&self.positions)?);
        let (slots, q) = (dev.upload(&self.slots)?, dev.zeros::<T>(self.positions.len() * s.n_q * s.d)?);
        Ok(RopeBufs { qkv, positions, slots, q, k: dev.upload(&self.k_init)?, v: dev.upload(&self.v_init)? })
    }
}

impl<D: Device, T: ActElem> RopeBufs<D, T> {
    /// The pointers [`rope_args`] takes: the inputs `(qkv, positions,
    /// slots)` and the outputs `(q, k cache, v cache)`.
    #[allow(clippy::type_complexity)]
    fn ptrs(
        &self,
    ) -> Result<(
        (D::Ptr<'_, AnyDType>, D::Ptr<'_, i32>, D::Ptr<'_, i32>),
        (D::Ptr<'_, AnyDType>, D::Ptr<'_, AnyDType>, D::Ptr<'_, AnyDType>),
    )> {
        let inputs = (D::ptr_at(&self.qkv, 0)?, D::ptr_at(&self.positions, 0)?, D::ptr_at(&self.slots, 0)?);
        Ok((inputs, (D::ptr_at(&self.q, 0)?, D::ptr_at(&self.k, 0)?, D::ptr_at(&self.v, 0)?)))
    }

    /// `(q, k cache, v cache)` after the launch.
    fn download(&self, dev: &mut D) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        Ok((
            to_f64(&dev.download(&self.q)?),
            to_f64(&dev.download(&self.k)?),
            to_f64(&dev.download(&self.v)?),
        ))
    }
}

/// `(q, k cache, v cache)` after `rope_kv_write` of `inp` at shape `s` on `dev`.
fn rope_on<T: ActElem, D: Device>(
    dev: &mut D,
    s: Shape,
    inp: &RopeInputs<T>,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let config = rope_kv_write::Config::new(T::DEVICE_DTYPE, s.n_q, s.n_kv, s.d, false);
    let b = inp.upload(dev, s)?;
    let (inputs, outputs) = b.ptrs()?;
    let args = rope_args!(rope_kv_write, inputs, outputs, s.theta);
    dev.run::<rope_kv_write::Kernel>([inp.positions.len() as u32, 1, 1], &config, &args)?;
    b.download(dev)
}

/// One `rope_kv_write` case at shape `s`: `tokens` tokens into a cache of
/// `block_size`-slot blocks.
fn rope_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (s, tokens, block_size): (Shape, usize, usize),
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let n_slots = ((2 * tokens).div_ceil(block_size) + 1) * block_size;
    // Distinct random slots: the first `tokens` of a partial shuffle.
    let inputs = RopeInputs::<T>::random(rng, s, (tokens, n_slots, 8192), |rng| {
        let mut all: Vec<i32> = (0..n_slots as i32).collect();
        for t in 0..tokens {
            let j = t + (rng.next_u64() % (n_slots - t) as u64) as usize;
            all.swap(t, j);
        }
        (0..tokens).map(|t| if rng.next_u64() & 3 == 0 { -1 } else { all[t] }).collect()
    });
    let (q_got, k_got, v_got) = rope_on(dev, s, &inputs)?;
    let (q_want, k_want, v_want) = rope_on(&mut Cpu::new(), s, &inputs)?;
    let RopeInputs { qkv, positions, slots, .. } = &inputs;

    let x = to_f64(qkv);
    let mut q_tol = vec![0.0; q_want.len()];
    for t in 0..tokens {
        for h in 0..s.n_q {
            let head = &x[t * s.row() + h * s.d..][..s.d];
            for j in 0..s.d {
                let e = (t * s.n_q + h) * s.d + j;
                q_tol[e] = rotated_tol(head, j, s.d, positions[t], s.theta, q_want[e], dtype);
            }
        }
    }
    // Cache slots: exact unless written; written K within the rotation tolerance.
    let mut k_tol = vec![0.0; k_want.len()];
    for t in (0..tokens).filter(|&t| slots[t] >= 0) {
        for h in 0..s.n_kv {
            let head = &x[t * s.row() + (s.n_q + h) * s.d..][..s.d];
            for j in 0..s.d {
                let e = slots[t] as usize * s.slot() + h * s.d + j;
                k_tol[e] = rotated_tol(head, j, s.d, positions[t], s.theta, k_want[e], dtype);
            }
        }
    }
    let v_tol = vec![0.0; v_want.len()];
    let shape = format!("{}t {}q{}kv{}d bs{block_size}", tokens, s.n_q, s.n_kv, s.d);
    let all = |q: Vec<f64>, k: Vec<f64>, v: Vec<f64>| [q, k, v].concat();
    let (got, want) = (all(q_got, k_got, v_got), all(q_want, k_want, v_want));
    Ok(compare_each("rope_kv_write", shape, dtype, &got, &want, &all(q_tol, k_tol, v_tol)))
}

/// The `rope_kv_write` check: ragged token counts at the SmolLM2 shape (and
/// one wider-head shape), block sizes 16 and 32, f32 and bf16.
pub fn rope_kv_write<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_shapes(
        dev,
        seed,
        &[(SMOLLM2, 1, 16), (SMOLLM2, 7, 32), (SMOLLM2, 333, 16), (SMOLLM2, 2048, 32), (WIDE, 45, 16)],
        [rope_case::<f32, D>, rope_case::<bf16, D>],
    )
}

/// Which options of `rope_arch_kv_write` a case turns on.
#[derive(Clone, Copy, Debug)]
struct ArchOpts {
    neox: bool,
    factors: bool,
    bias: bool,
    qk_norm: bool,
}

/// `(q, k cache, v cache)` after `rope_arch_kv_write` on `dev`, with the
/// f32 vectors `factors`, `bias` and `norm` (Q then K weights).
#[allow(clippy::too_many_arguments)]
fn rope_arch_on<T: ActElem, D: Device>(
    dev: &mut D,
    s: Shape,
    o: ArchOpts,
    inp: &RopeInputs<T>,
    factors: &[f32],
    bias: &[f32],
    norm: &[f32],
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    use kernels::rope::rope_arch_kv_write as k;
    let config =
        k::Config::new(T::DEVICE_DTYPE, s.n_q, s.n_kv, s.d, o.neox, o.factors, o.bias, o.qk_norm, false);
    let b = inp.upload(dev, s)?;
    let (fd, bd, nd) = (dev.upload(factors)?, dev.upload(bias)?, dev.upload(norm)?);
    let (inputs, outputs) = b.ptrs()?;
    let args = rope_args!(
        k,
        inputs,
        outputs,
        s.theta,
        factors_ptr: dev.ptr(&fd)?,
        bias_ptr: dev.ptr(&bd)?,
        norm_ptr: dev.ptr(&nd)?,
        eps: 1e-6,
    );
    dev.run::<k::Kernel>([inp.positions.len() as u32, 1, 1], &config, &args)?;
    b.download(dev)
}

/// One `rope_arch_kv_write` case: the device against the interpreter on the
/// same random inputs (positions below 1024, so the GPU's approximate angle
/// is within `2^-10` rad). Tolerance per element: `1e-2` absolute (pairs of
/// norm up to ~10 times that angle error, plus the f32 arithmetic of the
/// head norm) plus one unit of the final rounding.
fn rope_arch_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (s, o, tokens): (Shape, ArchOpts, usize),
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let inputs = RopeInputs::<T>::random(rng, s, (tokens, 2 * tokens + 3, 1024), |rng| {
        (0..tokens).map(|t| if rng.next_u64() & 3 == 0 { -1 } else { (2 * t + 1) as i32 }).collect()
    });
    let mut f32s = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * (rng.next_u64() % 4096) as f32 / 4096.0).collect()
    };
    let factors = f32s(s.d / 2, 1.0, 8.0);
    let bias = f32s(s.row(), -2.0, 2.0);
    let norm = f32s(2 * s.d, 0.5, 1.5);
    let (q_got, k_got, v_got) = rope_arch_on(dev, s, o, &inputs, &factors, &bias, &norm)?;
    let (q_want, k_want, v_want) = rope_arch_on(&mut Cpu::new(), s, o, &inputs, &factors, &bias, &norm)?;
    let all = |q: Vec<f64>, k: Vec<f64>, v: Vec<f64>| [q, k, v].concat();
    let (got, want) = (all(q_got, k_got, v_got), all(q_want, k_want, v_want));
    let round = if dtype == DType::F32 { 4.0 * f64::powi(2.0, -24) } else { 1.0 / 128.0 };
    let tol: Vec<f64> = want.iter().map(|w| 1e-2 + round * w.abs()).collect();
    let shape = format!(
        "{tokens}t {}q{}kv{}d{}{}{}{}",
        s.n_q,
        s.n_kv,
        s.d,
        if o.neox { " neox" } else { "" },
        if o.factors { " factors" } else { "" },
        if o.bias { " bias" } else { "" },
        if o.qk_norm { " qk_norm" } else { "" }
    );
    Ok(compare_each("rope_arch_kv_write", shape, dtype, &got, &want, &tol))
}

/// The `rope_arch_kv_write` check: Qwen2's options (NEOX, bias), Qwen3's
/// (NEOX, head norm), Llama 3's (factors) and all of them, ragged token
/// counts, f32 and bf16.
pub fn rope_arch_kv_write<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let opts = |neox, factors, bias, qk_norm| ArchOpts { neox, factors, bias, qk_norm };
    over_shapes(
        dev,
        seed,
        &[
            (WIDE, opts(true, false, true, false), 37),
            (WIDE, opts(true, false, false, true), 5),
            (SMOLLM2, opts(false, true, false, false), 130),
            (SMOLLM2, opts(true, true, true, true), 1),
        ],
        [rope_arch_case::<f32, D>, rope_arch_case::<bf16, D>],
    )
}
