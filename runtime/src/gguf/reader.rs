//! The GGUF reader: [`Header::parse`] validates a whole file's structure from
//! bytes (the metadata of `metadata.rs`, the tensor table of `tensor.rs`),
//! [`Gguf`] owns the bytes (a memory map or a vector) with the parsed header
//! and hands out [`TensorView`]s.
//!
//! Invariants: parsing is a pure function of the bytes; it never panics, every
//! read is bounds-checked, every count is checked against the remaining bytes
//! before allocating (so allocation stays within a small multiple of the input
//! size), and every offset computation is checked. Once a [`Header`] exists,
//! each tensor's data range lies inside the data section, is aligned, and does
//! not overlap another tensor's (see the module doc of [`crate::gguf`]).

use super::metadata::{Metadata, wrong_type};
use super::tensor::{TensorInfo, TensorView, check_data_ranges};
use super::types::{Array, GgmlType, Value, ValueType};
use super::{GgufError, Result};
use std::collections::HashMap;
use std::path::Path;

/// The magic bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment (a `u32`, a power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's maximum number of tensor dimensions.
pub const MAX_DIMS: u32 = 4;
/// The deepest nesting of arrays of arrays the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// The fewest bytes one metadata key-value pair occupies (key length, value
/// type, a one-byte value).
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes one tensor info occupies (name length, `n_dims`, type,
/// offset).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// The parsed and validated structure of a GGUF file (everything but the
/// tensor data).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The format version (2 or 3).
    pub version: u32,
    /// The metadata.
    pub metadata: Metadata,
    /// The tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// The alignment of tensor data (`general.alignment` or 32).
    pub alignment: u64,
    /// Byte offset of the data section in the file.
    pub data_offset: u64,
    /// Bytes of the data section present in the file.
    pub data_len: u64,
    tensor_index: HashMap<String, usize>,
}

impl Header {
    /// Parses and validates the structure of a GGUF file held in `bytes` (the
    /// whole file). Never panics; every problem is a [`GgufError`].
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let mut r = Cursor { bytes, pos: 0 };
        let magic: [u8; 4] = r.array("the magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;

        r.check_count("metadata key-value pairs", n_kv, MIN_KV_BYTES)?;
        let mut metadata = Metadata::new();
        for i in 0..n_kv {
            let key = r.string(|| format!("metadata key {i}"))?;
            let what = || format!("value of metadata key `{key}`");
            let ty_id = r.u32_with(what)?;
            let ty = ValueType::from_id(ty_id)
                .ok_or_else(|| GgufError::UnknownValueType { what: what(), id: ty_id })?;
            let value = r.value(ty, &what, 0)?;
            metadata.insert(key, value)?;
        }

        let alignment = match metadata.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(Value::U32(a)) => return Err(GgufError::BadAlignment(u64::from(*a))),
            Some(v) => return Err(wrong_type(ALIGNMENT_KEY, "u32", v)),
        };

        r.check_count("tensor infos", n_tensors, MIN_TENSOR_INFO_BYTES)?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(|| format!("name of tensor info {i}"))?;
            let what = || format!("tensor info of `{name}`");
            let n_dims = r.u32_with(what)?;
            if n_dims > MAX_DIMS {
                return Err(GgufError::BadShape {
                    tensor: name,
                    message: format!("{n_dims} dimensions, at most {MAX_DIMS} are allowed."),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64_with(what)?);
            }
            let ty_id = r.u32_with(what)?;
            let offset = r.u64_with(what)?;
            let ty = GgmlType::from_id(ty_id)
                .ok_or_else(|| GgufError::UnknownTensorType { tensor: name.clone(), id: ty_id })?;
            let info = TensorInfo { name, dims, ty, offset };
            info.check_shape()?;
            if !offset.is_multiple_of(alignment) {
                return Err(GgufError::MisalignedTensor { tensor: info.name, offset, alignment });
            }
            if tensor_index.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        let len = bytes.len() as u64;
        // The data section starts at the next multiple of the alignment; a file
        // without tensors may end before it.
        let data_offset = (r.pos as u64).div_ceil(alignment).saturating_mul(alignment);
        let data_len = len.saturating_sub(data_offset);
        check_data_ranges(&tensors, data_len)?;
        Ok(Header { version, metadata, tensors, alignment, data_offset, data_len, tensor_index })
    }

    /// The info of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// Takes `n` bytes, or reports a truncation naming `what`.
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        // `n <= remaining`, which is a `usize`, so the cast is exact.
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.take(N as u64, || what.to_string())?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn array_with<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn u32_with(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        self.array_with(what).map(u32::from_le_bytes)
    }

    fn u64_with(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        self.array_with(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` entries of at least `min_size` bytes can fit in the
    /// remaining bytes, so that allocating `count` entries is bounded by the
    /// input size.
    fn check_count(&self, what: &str, count: u64, min_size: u64) -> Result<()> {
        let remaining = self.remaining();
        if count.checked_mul(min_size).is_none_or(|need| need > remaining) {
            return Err(GgufError::CountTooLarge { what: what.to_string(), count, min_size, remaining });
        }
        Ok(())
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String> {
        let n = self.u64_with(|| format!("length of {}", what()))?;
        let offset = self.pos as u64;
        let b = self.take(n, &what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(GgufError::InvalidUtf8 { what: what(), offset }),
        }
    }

    /// Reads one value of type `ty`; `depth` counts enclosing arrays.
    fn value(&mut self, ty: ValueType, what: &dyn Fn() -> String, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array_with(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array_with(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array_with(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array_with(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array_with(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array_with(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array_with(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array_with(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array_with(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array_with(what)?)),
            ValueType::Bool => Value::Bool(self.bool(what)?),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, depth + 1)?),
        })
    }

    fn bool(&mut self, what: &dyn Fn() -> String) -> Result<bool> {
        match self.array_with::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool { what: what(), byte }),
        }
    }

    /// Reads an array (element type, count, elements) at nesting `depth >= 1`.
    fn array_value(&mut self, what: &dyn Fn() -> String, depth: usize) -> Result<Array> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep { what: what(), limit: MAX_ARRAY_DEPTH });
        }
        let ty_id = self.u32_with(|| format!("element type of {}", what()))?;
        let ty = ValueType::from_id(ty_id)
            .ok_or_else(|| GgufError::UnknownValueType { what: what(), id: ty_id })?;
        let n = self.u64_with(|| format!("element count of {}", what()))?;
        self.check_count(&format!("elements of {}", what()), n, ty.min_encoded_size())?;
        // `check_count` bounds `n` by the remaining bytes, so it fits a `usize`.
        let n = n as usize;
        let mut out = Array::with_capacity(ty, n);
        macro_rules! fill {
            ($v:expr, $t:ty) => {
                for _ in 0..n {
                    $v.push(<$t>::from_le_bytes(self.array_with(what)?));
                }
            };
        }
        match &mut out {
            Array::U8(v) => fill!(v, u8),
            Array::I8(v) => fill!(v, i8),
            Array::U16(v) => fill!(v, u16),
            Array::I16(v) => fill!(v, i16),
            Array::U32(v) => fill!(v, u32),
            Array::I32(v) => fill!(v, i32),
            Array::F32(v) => fill!(v, f32),
            Array::U64(v) => fill!(v, u64),
            Array::I64(v) => fill!(v, i64),
            Array::F64(v) => fill!(v, f64),
            Array::Bool(v) => {
                for _ in 0..n {
                    v.push(self.bool(what)?);
                }
            }
            Array::String(v) => {
                for i in 0..n {
                    v.push(self.string(|| format!("element {i} of {}", what()))?);
                }
            }
            Array::Array(v) => {
                for i in 0..n {
                    let elem = || format!("element {i} of {}", what());
                    v.push(self.array_value(&elem, depth + 1)?);
                }
            }
        }
        Ok(out)
    }
}

/// The bytes behind a [`Gguf`].
enum Storage {
    /// A read-only memory map of the file.
    Mmap(memmap2::Mmap),
    /// Bytes in memory.
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A GGUF file: its bytes (memory-mapped or owned) and its validated [`Header`].
pub struct Gguf {
    storage: Storage,
    header: Header,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf").field("len", &self.bytes().len()).field("header", &self.header).finish()
    }
}

impl Gguf {
    /// Memory-maps and validates the file at `path`.
    ///
    /// The file must not be modified while the returned value lives (the usual
    /// contract of memory-mapped files; model files are read-only in practice).
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            // Mapping zero bytes fails on some systems; an empty file is simply truncated.
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this value; the bytes
            // may change only if another process writes the file, which the
            // documented contract of `open` excludes. Every access goes through
            // bounds-checked slices of the map.
            Storage::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Gguf::new(storage)
    }

    /// Validates a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Gguf::new(Storage::Owned(bytes))
    }

    fn new(storage: Storage) -> Result<Gguf> {
        let header = Header::parse(storage.bytes())?;
        Ok(Gguf { storage, header })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The info of tensor `name`, or [`GgufError::MissingTensor`].
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.header.tensor(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The raw data of tensor `name`, whatever its type.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name)?;
        Ok(self.data_of(info))
    }

    /// A view of tensor `name`; its type must be supported
    /// ([`GgmlType::is_supported`]), else [`GgufError::UnsupportedType`].
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self.tensor_info(name)?;
        if !info.ty.is_supported() {
            return Err(GgufError::UnsupportedType { tensor: info.name.clone(), ty: info.ty });
        }
        Ok(TensorView { info, data: self.data_of(info) })
    }

    fn data_of(&self, info: &TensorInfo) -> &[u8] {
        // The header validated `offset + n_bytes <= data_len`, and the data
        // section ends at the end of the file, so this range is in bounds; only
        // an empty tensor of a file that ends before its data section could
        // start past the end, and it gets an empty slice.
        let start = self.header.data_offset.saturating_add(info.offset);
        let end = start.saturating_add(info.n_bytes().unwrap_or(0));
        let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
            return &[];
        };
        self.bytes().get(start..end).unwrap_or(&[])
    }
}
