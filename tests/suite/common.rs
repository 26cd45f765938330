//! Helpers the suite's modules share: the proptest configuration, the
//! storage types of activations, their tolerances and random non-zero
//! inputs.

use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::FloatElement;
use proptest::prelude::ProptestConfig;
use tests::reference::Rng;

/// `$f::<bf16>(args)` when `$bf`, else `$f::<f32>(args)`: a case run with
/// bf16 or f32 storage as a proptest input picks.
macro_rules! f32_or_bf16 {
    ($bf:expr, $f:ident($($arg:expr),* $(,)?)) => {
        if $bf { $f::<dsl_core::half::bf16>($($arg),*) } else { $f::<f32>($($arg),*) }
    };
}
pub(crate) use f32_or_bf16;

/// A proptest configuration of `n` cases that writes no regression files.
pub fn cases(n: u32) -> ProptestConfig {
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

/// `n` values in `[-2, -1/64] ∪ [1/64, 2]`, rounded to `dtype`.
pub fn nonzero(rng: &mut Rng, n: usize, dtype: DType) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let m = rng.uniform(1.0 / 64.0, 2.0) as f64;
            dtype.round_float(if rng.below(2) == 0 { m } else { -m })
        })
        .collect()
}

/// Storage types of the tests (activations the kernels read and write);
/// their `from_f64` (from [`FloatElement`]) rounds to the type.
pub trait Storage: FloatElement {}

impl Storage for f32 {}

impl Storage for bf16 {}

impl Storage for f16 {}

/// `(atol, rtol)` of outputs stored in `dtype` after a few f32 operations.
pub fn tol(dtype: DType) -> (f64, f64) {
    if dtype == DType::BF16 { (1e-6, 1.0 / 128.0) } else { (1e-6, 1e-5) }
}
