//! Host buffers and launch arguments of the interpreter.
//!
//! A [`Buffer`] is a dtype and raw little-endian bytes, like device memory: a
//! kernel reads and writes it through pointers, and packed formats (GGUF
//! quantized blocks) are passed as `u8` buffers and reinterpreted in the kernel
//! with `ptrcast`. [`Element`] maps Rust element types to dtypes.
//!
//! Invariants: `bytes.len()` is a multiple of the dtype's size; `i1` is stored
//! as one byte holding 0 or 1.

use crate::dtype::{DType, f64_to_f32_odd};
use crate::ir::Scalar;
use half::{bf16, f16};

mod sealed {
    /// Prevents implementations of `Element` outside this crate.
    pub trait Sealed {}
}

/// A Rust type that is the host representation of one dtype.
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The dtype this type represents.
    const DTYPE: DType;
    /// Writes the little-endian bytes of `self` into `out` (exactly the dtype's size).
    fn write_le(self, out: &mut [u8]);
    /// Reads a value from exactly the dtype's size of little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
    /// The value as an `f64` (exact for every dtype but large `i64`s).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $d:ident, $n:literal, |$x:ident| $to_f64:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn write_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; $n];
                b.copy_from_slice(&bytes[..$n]);
                <$t>::from_le_bytes(b)
            }
            fn to_f64(self) -> f64 {
                let $x = self;
                $to_f64
            }
        }
    };
}

element!(f32, F32, 4, |x| x as f64);
element!(f64, F64, 8, |x| x);
element!(f16, F16, 2, |x| x.to_f64());
element!(bf16, BF16, 2, |x| x.to_f64());

/// The 8-bit floats, stored as their one byte.
macro_rules! element_f8 {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn write_le(self, out: &mut [u8]) {
                out[0] = self.to_bits();
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_bits(bytes[0])
            }
            fn to_f64(self) -> f64 {
                f64::from(self.to_f32())
            }
        }
    };
}

element_f8!(float8::F8E4M3, F8E4M3);
element_f8!(float8::F8E5M2, F8E5M2);
element!(i8, I8, 1, |x| x as f64);
element!(u8, U8, 1, |x| x as f64);
element!(i16, I16, 2, |x| x as f64);
element!(i32, I32, 4, |x| x as f64);
element!(u32, U32, 4, |x| x as f64);
element!(i64, I64, 8, |x| x as f64);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::I1;
    fn write_le(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
}

/// The float types activations are stored in (f32, bf16, f16): an
/// [`Element`] that can also be made from an `f64`, as a kernel's test
/// inputs and the runtime's activations are.
pub trait FloatElement: Element {
    /// The nearest value of this type.
    fn from_f64(v: f64) -> Self;
}

impl FloatElement for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl FloatElement for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

impl FloatElement for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

/// A host buffer: a dtype and its elements as raw little-endian bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Buffer {
    dtype: DType,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} x {})", self.len(), self.dtype)
    }
}

impl Buffer {
    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> Buffer {
        let size = T::DTYPE.size_bytes();
        let mut bytes = vec![0u8; data.len() * size];
        for (chunk, &x) in bytes.chunks_exact_mut(size).zip(data) {
            x.write_le(chunk);
        }
        Buffer { dtype: T::DTYPE, bytes }
    }

    /// A buffer of `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        Buffer { dtype, bytes: vec![0u8; len * dtype.size_bytes()] }
    }

    /// A buffer of `dtype` holding `data` converted like the kernel's `cast`:
    /// floats round to nearest even; integers truncate toward zero and saturate
    /// (NaN becomes 0); `i1` is `!= 0`.
    pub fn from_f64(dtype: DType, data: &[f64]) -> Buffer {
        let size = dtype.size_bytes();
        let mut bytes = vec![0u8; data.len() * size];
        for (chunk, &x) in bytes.chunks_exact_mut(size).zip(data) {
            write_f64(dtype, x, chunk);
        }
        Buffer { dtype, bytes }
    }

    /// A buffer of `dtype` over raw little-endian `bytes`; `None` when the byte
    /// count is not a whole number of elements.
    pub fn from_bytes(dtype: DType, bytes: Vec<u8>) -> Option<Buffer> {
        if !bytes.len().is_multiple_of(dtype.size_bytes()) {
            return None;
        }
        Some(Buffer { dtype, bytes })
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_bytes()
    }

    /// True when the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The raw little-endian bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// The elements as `T`, or `None` when `T` is not the buffer's dtype.
    pub fn try_to_vec<T: Element>(&self) -> Option<Vec<T>> {
        if T::DTYPE != self.dtype {
            return None;
        }
        Some(self.bytes.chunks_exact(self.dtype.size_bytes()).map(T::read_le).collect())
    }

    /// The elements as `T`.
    ///
    /// # Panics
    /// When `T` is not the buffer's dtype (a host programming error, like an
    /// out-of-range slice index); use [`Buffer::try_to_vec`] to check instead.
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        match self.try_to_vec() {
            Some(v) => v,
            None => panic!("Buffer::to_vec::<{}> on a {} buffer", T::DTYPE, self.dtype),
        }
    }

    /// The elements converted to `f64` (exact except for huge `i64` values).
    pub fn to_f64(&self) -> Vec<f64> {
        let size = self.dtype.size_bytes();
        self.bytes.chunks_exact(size).map(|b| read_f64(self.dtype, b)).collect()
    }
}

/// Reads one element of `dtype` from its little-endian bytes as an `f64`.
pub(crate) fn read_f64(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::I1 => bool::read_le(b).to_f64(),
        DType::I8 => i8::read_le(b).to_f64(),
        DType::U8 => u8::read_le(b).to_f64(),
        DType::I16 => i16::read_le(b).to_f64(),
        DType::I32 => i32::read_le(b).to_f64(),
        DType::U32 => u32::read_le(b).to_f64(),
        DType::I64 => i64::read_le(b).to_f64(),
        DType::F16 => f16::read_le(b).to_f64(),
        DType::BF16 => bf16::read_le(b).to_f64(),
        DType::F32 => f32::read_le(b).to_f64(),
        DType::F64 => f64::read_le(b),
        DType::F8E4M3 => float8::F8E4M3::read_le(b).to_f64(),
        DType::F8E5M2 => float8::F8E5M2::read_le(b).to_f64(),
    }
}

/// Writes `x` converted to `dtype` (cast semantics) as little-endian bytes.
fn write_f64(dtype: DType, x: f64, out: &mut [u8]) {
    match dtype {
        DType::F16 | DType::BF16 => {
            let v = super::tile::narrow_f64(dtype, x);
            let bits =
                if dtype == DType::F16 { f16::from_f32(v).to_bits() } else { bf16::from_f32(v).to_bits() };
            out.copy_from_slice(&bits.to_le_bytes());
        }
        DType::F8E4M3 | DType::F8E5M2 => out[0] = crate::dtype::f8_bits(dtype, f64_to_f32_odd(x)),
        DType::F32 => (x as f32).write_le(out),
        DType::F64 => x.write_le(out),
        DType::I1 => (x != 0.0).write_le(out),
        d => {
            let (lo, hi) = d.int_range().unwrap_or((i64::MIN, i64::MAX));
            let v = (x as i64).clamp(lo, hi);
            let bytes = v.to_le_bytes();
            out.copy_from_slice(&bytes[..d.size_bytes()]);
        }
    }
}

/// A launch argument, bound to the kernel parameter at the same position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A pointer to element `offset` (in the buffer's own elements) of
    /// `buffers[buffer]`. Several arguments may name the same buffer.
    Ptr {
        /// Index into the buffer slice passed to the launch.
        buffer: usize,
        /// Element offset into that buffer.
        offset: usize,
    },
    /// A scalar; its dtype must equal the parameter's.
    Scalar(Scalar),
}

impl Arg {
    /// A pointer to the start of `buffers[buffer]`.
    pub fn ptr(buffer: usize) -> Arg {
        Arg::Ptr { buffer, offset: 0 }
    }

    /// A pointer to element `offset` of `buffers[buffer]`.
    pub fn ptr_at(buffer: usize, offset: usize) -> Arg {
        Arg::Ptr { buffer, offset }
    }

    /// An `i32` scalar.
    pub fn i32(v: i32) -> Arg {
        Arg::Scalar(Scalar::int(DType::I32, v as i64))
    }

    /// A `u32` scalar.
    pub fn u32(v: u32) -> Arg {
        Arg::Scalar(Scalar::int(DType::U32, v as i64))
    }

    /// An `i64` scalar.
    pub fn i64(v: i64) -> Arg {
        Arg::Scalar(Scalar::int(DType::I64, v))
    }

    /// An `f32` scalar.
    pub fn f32(v: f32) -> Arg {
        Arg::Scalar(Scalar::float(DType::F32, v as f64))
    }

    /// An `f64` scalar.
    pub fn f64(v: f64) -> Arg {
        Arg::Scalar(Scalar::float(DType::F64, v))
    }

    /// An `i1` scalar.
    pub fn bool(v: bool) -> Arg {
        Arg::Scalar(Scalar::bool(v))
    }
}

impl From<Scalar> for Arg {
    fn from(s: Scalar) -> Arg {
        Arg::Scalar(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let b = Buffer::from_slice(&[1.5f32, -2.0]);
        assert_eq!(b.len(), 2);
        assert_eq!(b.to_vec::<f32>(), vec![1.5, -2.0]);
        assert_eq!(b.to_f64(), vec![1.5, -2.0]);
        assert!(b.try_to_vec::<i32>().is_none());
        let h = Buffer::from_f64(DType::BF16, &[1.0 + 1.0 / 512.0, 3.0]);
        assert_eq!(h.to_vec::<bf16>(), vec![bf16::from_f32(1.0), bf16::from_f32(3.0)]);
        let i = Buffer::from_f64(DType::I8, &[300.0, -1.7, f64::NAN]);
        assert_eq!(i.to_vec::<i8>(), vec![127, -1, 0]);
        assert!(Buffer::from_bytes(DType::F32, vec![0; 6]).is_none());
        assert_eq!(Buffer::from_bytes(DType::U8, vec![1, 2, 3]).map(|b| b.len()), Some(3));
        assert_eq!(Buffer::from_slice(&[true, false]).as_bytes(), &[1, 0]);
    }
}
