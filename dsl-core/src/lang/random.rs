//! Counter-based random numbers: Philox 4x32 with 10 rounds, as Triton's
//! `tl.randint4x`/`tl.rand`/`tl.randn`. The stream is a pure function of
//! `(seed, offset)`, so kernels are reproducible and programs never share state.
//!
//! `seed` is a 64-bit key (its low and high halves are the two Philox keys);
//! `offset` (an integer tile) is the counter's first word, the others are zero.

use super::{Operand, Tensor, bitcast, cast, where_};
use crate::dtype::DType;

const KEY_A: u32 = 0x9E37_79B9;
const KEY_B: u32 = 0xBB67_AE85;
const ROUND_A: u32 = 0xD251_1F53;
const ROUND_B: u32 = 0xCD9E_8D57;
const ROUNDS: usize = 10;

/// The four 32-bit words of Philox 4x32-10 for each counter `offset` under key `seed`.
#[track_caller]
pub fn randint4x(seed: impl Into<Operand>, offset: Tensor) -> (Tensor, Tensor, Tensor, Tensor) {
    let seed = super::__tensor(seed);
    let seed = cast(seed, DType::I64);
    let k0 = cast(seed & 0xFFFF_FFFFi64, DType::U32);
    let k1 = cast((seed >> 32i64) & 0xFFFF_FFFFi64, DType::U32);
    let c0 = cast(offset, DType::U32);
    let shape = c0.shape();
    let zero =
        if shape.is_empty() { super::constant(0, DType::U32) } else { super::zeros(&shape, DType::U32) };
    let (mut c0, mut c1, mut c2, mut c3) = (c0, zero, zero, zero);
    let (mut k0, mut k1) = (k0, k1);
    for _ in 0..ROUNDS {
        let (a0, a2) = (c0, c2);
        c0 = super::umulhi(super::constant(ROUND_B as i64, DType::U32), a2) ^ c1 ^ k0;
        c2 = super::umulhi(super::constant(ROUND_A as i64, DType::U32), a0) ^ c3 ^ k1;
        c1 = a2 * super::constant(ROUND_B as i64, DType::U32);
        c3 = a0 * super::constant(ROUND_A as i64, DType::U32);
        k0 = k0 + super::constant(KEY_A as i64, DType::U32);
        k1 = k1 + super::constant(KEY_B as i64, DType::U32);
    }
    (c0, c1, c2, c3)
}

/// A random `u32` per element of `offset`.
#[track_caller]
pub fn randint(seed: impl Into<Operand>, offset: Tensor) -> Tensor {
    randint4x(seed, offset).0
}

/// Maps random `u32` words to floats uniform in `[0, 1)` (as Triton does).
#[track_caller]
pub fn uint_to_uniform_float(x: Tensor) -> Tensor {
    let x = bitcast(x, DType::I32);
    // Fold negative values onto non-negative ones so every bit pattern is used.
    let x = where_(x.lt(0), -x - 1, x);
    cast(x, DType::F32) * 4.656_612_7e-10f32
}

/// A float uniform in `[0, 1)` per element of `offset`.
#[track_caller]
pub fn rand(seed: impl Into<Operand>, offset: Tensor) -> Tensor {
    uint_to_uniform_float(randint(seed, offset))
}

/// A standard normal float per element of `offset` (Box-Muller on two words).
#[track_caller]
pub fn randn(seed: impl Into<Operand>, offset: Tensor) -> Tensor {
    let (a, b, _, _) = randint4x(seed, offset);
    let u1 = super::maximum(uint_to_uniform_float(a), 1.0e-7f32);
    let u2 = uint_to_uniform_float(b);
    let r = super::sqrt(super::log(u1) * -2.0f32);
    let th = u2 * 6.283_185_5f32;
    r * super::cos(th)
}

/// Reference Philox 4x32-10 in plain Rust (for tests of kernels that use it).
pub fn philox_reference(seed: u64, offset: u32) -> [u32; 4] {
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    let (mut c0, mut c1, mut c2, mut c3) = (offset, 0u32, 0u32, 0u32);
    let hi = |a: u32, b: u32| ((a as u64 * b as u64) >> 32) as u32;
    for _ in 0..ROUNDS {
        let (a0, a2) = (c0, c2);
        c0 = hi(ROUND_B, a2) ^ c1 ^ k0;
        c2 = hi(ROUND_A, a0) ^ c3 ^ k1;
        c1 = a2.wrapping_mul(ROUND_B);
        c3 = a0.wrapping_mul(ROUND_A);
        k0 = k0.wrapping_add(KEY_A);
        k1 = k1.wrapping_add(KEY_B);
    }
    [c0, c1, c2, c3]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::kernel;
    use crate::interp::{Arg, Buffer, launch};
    use crate::lang::*;

    #[test]
    fn philox_matches_the_reference_on_the_interpreter() {
        let f = kernel("philox", || {
            let out = param_ptr("out", DType::U32);
            let u = param_ptr("u", DType::F32);
            let seed = param_scalar("seed", DType::I64);
            let offs = arange(0, 64) * 977;
            let (w0, w1, w2, w3) = randint4x(seed, offs);
            let w = [w0, w1, w2, w3];
            let lane = arange(0, 64) * 4;
            for (i, word) in w.iter().enumerate() {
                store(out + lane + i as i32, *word, None);
            }
            store(u + arange(0, 64), rand(seed, offs), None);
        });
        let seed: u64 = 0x1234_5678_9ABC_DEF0;
        let mut bufs = [Buffer::zeros(DType::U32, 256), Buffer::zeros(DType::F32, 64)];
        launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i64(seed as i64)]).unwrap();
        let got = bufs[0].to_vec::<u32>();
        let u = bufs[1].to_vec::<f32>();
        for i in 0..64 {
            let want = philox_reference(seed, (i * 977) as u32);
            assert_eq!(&got[4 * i..4 * i + 4], &want, "offset {}", i * 977);
            assert!((0.0..1.0).contains(&u[i]), "{}", u[i]);
        }
        // Known-answer: Philox4x32-10 with zero key and counter (Random123's test vector).
        assert_eq!(philox_reference(0, 0), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
    }
}
