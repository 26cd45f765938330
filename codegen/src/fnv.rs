//! A stable 64-bit FNV-1a hasher (std's default hasher is not stable across
//! releases), shared by the PTX cache key (`cache.rs`) and the build
//! script's hash of the compiler's sources (`build.rs`, which includes this
//! file by path).

use std::hash::Hasher;

/// FNV-1a, 64 bits; [`Fnv::new`] starts from the standard offset basis.
pub(crate) struct Fnv(u64);

impl Fnv {
    /// A hasher at the FNV-1a offset basis.
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
