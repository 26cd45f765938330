//! [`Rng`], the one seeded generator of the runtime: the checks' random
//! inputs, the synthetic models' weights and the serving benchmark's prompts
//! and arrival gaps, reproducible without a dependency.

use crate::model::ActElem;

/// A seeded random number generator (SplitMix64): reproducible inputs without
/// a dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        kernels::reference::splitmix64(&mut self.0)
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform float in `(0, 1]` (its logarithm is finite).
    pub fn unit_nonzero(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// A uniform `f32` in `[-1, 1)` on a grid of 2^-23.
    pub fn signed_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// A value in `[-hi, -1/64] ∪ [1/64, hi]`: random and never (close to) zero.
    pub fn nonzero(&mut self, hi: f64) -> f64 {
        let m = 1.0 / 64.0 + self.unit() * (hi - 1.0 / 64.0);
        if self.next_u64() & 1 == 0 { m } else { -m }
    }

    /// `n` non-zero values in `T`, magnitudes up to `hi`.
    pub fn values<T: ActElem>(&mut self, n: usize, hi: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.nonzero(hi))).collect()
    }
}
