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

use crate::check::DevicePtr;
use crate::check::{CheckRow, Rng};
use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::rope::rope_kv_write;
use std::marker::PhantomData;

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

/// Folds one element into `row` (max errors, pass/fail).
fn account(row: &mut CheckRow, got: f64, want: f64, tol: f64) {
    let d = (got - want).abs();
    let d = if d.is_nan() { f64::INFINITY } else { d };
    row.max_abs = row.max_abs.max(d);
    if want != 0.0 {
        row.max_rel = row.max_rel.max(d / want.abs());
    }
    if d > tol {
        row.pass = false;
    }
}

fn to_f64<T: DeviceElem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn rope_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    s: Shape,
    tokens: usize,
    block_size: usize,
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let n_slots = ((2 * tokens).div_ceil(block_size) + 1) * block_size;
    let qkv = rng.values::<T>(tokens * s.row(), 2.0);
    let positions: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % 8192) as i32).collect();
    let mut all: Vec<i32> = (0..n_slots as i32).collect();
    for t in 0..tokens {
        let j = t + (rng.next_u64() % (n_slots - t) as u64) as usize;
        all.swap(t, j);
    }
    let slots: Vec<i32> = (0..tokens).map(|t| if rng.next_u64() & 3 == 0 { -1 } else { all[t] }).collect();
    let k_init = rng.values::<T>(n_slots * s.slot(), 2.0);
    let v_init = rng.values::<T>(n_slots * s.slot(), 2.0);
    let config = rope_kv_write::Config::new(dtype, s.n_q, s.n_kv, s.d);
    let grid = [tokens as u32, 1, 1];
    let (xd, pd, sd) = (dev.upload(&qkv)?, dev.upload(&positions)?, dev.upload(&slots)?);
    let (qd, kd, vd) = (dev.zeros::<T>(tokens * s.n_q * s.d)?, dev.upload(&k_init)?, dev.upload(&v_init)?);
    let args = rope_kv_write::Args {
        qkv_ptr: dev.ptr(&xd)?,
        pos_ptr: dev.ptr(&pd)?,
        slot_ptr: dev.ptr(&sd)?,
        q_out_ptr: dev.ptr(&qd)?,
        k_cache_ptr: dev.ptr(&kd)?,
        v_cache_ptr: dev.ptr(&vd)?,
        theta: s.theta,
        _marker: PhantomData,
    };
    dev.run::<rope_kv_write::Kernel>(grid, &config, &args)?;
    let (q_got, k_got, v_got) =
        (to_f64(&dev.download(&qd)?), to_f64(&dev.download(&kd)?), to_f64(&dev.download(&vd)?));

    let mut cpu = Cpu::new();
    let (xc, pc, sc) = (cpu.upload(&qkv), cpu.upload(&positions), cpu.upload(&slots));
    let (qc, kc, vc) = (cpu.zeros::<T>(tokens * s.n_q * s.d), cpu.upload(&k_init), cpu.upload(&v_init));
    let args = rope_kv_write::Args {
        qkv_ptr: xc.cast(),
        pos_ptr: pc,
        slot_ptr: sc,
        q_out_ptr: qc.cast(),
        k_cache_ptr: kc.cast(),
        v_cache_ptr: vc.cast(),
        theta: s.theta,
        _marker: PhantomData,
    };
    rope_kv_write::interpret(&mut cpu, grid, &config, &args)?;
    let (q_want, k_want, v_want) = (to_f64(&cpu.read(qc)), to_f64(&cpu.read(kc)), to_f64(&cpu.read(vc)));

    let shape = format!("{}t {}q{}kv{}d bs{block_size}", tokens, s.n_q, s.n_kv, s.d);
    let mut row =
        CheckRow { kernel: "rope_kv_write".into(), shape, dtype, max_abs: 0.0, max_rel: 0.0, pass: true };
    let x = to_f64(&qkv);
    for t in 0..tokens {
        for h in 0..s.n_q {
            let head = &x[t * s.row() + h * s.d..][..s.d];
            for j in 0..s.d {
                let e = (t * s.n_q + h) * s.d + j;
                let tol = rotated_tol(head, j, s.d, positions[t], s.theta, q_want[e], dtype);
                account(&mut row, q_got[e], q_want[e], tol);
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
    for e in 0..k_want.len() {
        account(&mut row, k_got[e], k_want[e], k_tol[e]);
        account(&mut row, v_got[e], v_want[e], 0.0);
    }
    Ok(row)
}

/// The `rope_kv_write` check: ragged token counts at the SmolLM2 shape (and
/// one wider-head shape), block sizes 16 and 32, f32 and bf16.
pub fn rope_kv_write<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for (s, tokens, block_size) in
        [(SMOLLM2, 1, 16), (SMOLLM2, 7, 32), (SMOLLM2, 333, 16), (SMOLLM2, 2048, 32), (WIDE, 45, 16)]
    {
        rows.push(rope_case::<f32, _>(dev, &mut rng, s, tokens, block_size)?);
        rows.push(rope_case::<bf16, _>(dev, &mut rng, s, tokens, block_size)?);
    }
    Ok(rows)
}
