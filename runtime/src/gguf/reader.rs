//! The GGUF reader: [`Header::parse`] validates a whole file's structure from
//! bytes, [`Gguf`] owns the bytes (a memory map or a vector) with the parsed
//! header and hands out [`TensorView`]s.
//!
//! Invariants: parsing is a pure function of the bytes; it never panics, every
//! read is bounds-checked, every count is checked against the remaining bytes
//! before allocating (so allocation stays within a small multiple of the input
//! size), and every offset computation is checked. Once a [`Header`] exists,
//! each tensor's data range lies inside the data section, is aligned, and does
//! not overlap another tensor's (see the module doc of [`crate::gguf`]).

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

/// The metadata of a GGUF file: key-value pairs in file order, with unique keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty metadata set.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds a pair; an existing key is an error.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Result<()> {
        let key = key.into();
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Sets a pair, replacing the value of an existing key in place.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// The pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// The value of `key`, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// An optional integer key (any integer type) converted to `u32`; out of
    /// range is [`GgufError::InvalidValue`], a non-integer [`GgufError::WrongType`].
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| integer(key, v)).transpose()
    }

    /// A required integer key converted to `u32` (see [`Metadata::get_u32`]).
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        integer(key, self.require(key)?)
    }

    /// An optional float key (`f32` or `f64`) as `f32`.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key).map(|v| float(key, v)).transpose()
    }

    /// A required float key as `f32`.
    pub fn require_f32(&self, key: &str) -> Result<f32> {
        float(key, self.require(key)?)
    }

    /// An optional string key.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| wrong_type(key, "string", v)),
        }
    }

    /// A required string key.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// An optional bool key.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong_type(key, "bool", v)),
        }
    }

    /// An optional array key.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| wrong_type(key, "array", v)),
        }
    }

    /// A required array-of-strings key.
    pub fn require_strings(&self, key: &str) -> Result<&[String]> {
        let v = self.require(key)?;
        v.as_array().and_then(Array::as_strings).ok_or_else(|| wrong_type(key, "array of strings", v))
    }
}

/// A stored type, in words (`"array of u8"` for arrays).
pub(crate) fn type_words(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of {}", a.element_type()),
        other => other.value_type().to_string(),
    }
}

fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected, found: type_words(v) }
}

fn integer(key: &str, v: &Value) -> Result<u32> {
    let i = v.as_i128().ok_or_else(|| wrong_type(key, "integer", v))?;
    u32::try_from(i).map_err(|_| GgufError::InvalidValue {
        key: key.to_string(),
        message: format!("{i} is outside the range of a u32."),
    })
}

fn float(key: &str, v: &Value) -> Result<f32> {
    v.as_f64().map(|f| f as f32).ok_or_else(|| wrong_type(key, "float", v))
}

/// The description of one tensor: name, shape, type and where its data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// The dimensions, ggml order: `dims[0]` is contiguous.
    pub dims: Vec<u64>,
    /// The element type.
    pub ty: GgmlType,
    /// Byte offset of the data within the data section (a multiple of the
    /// alignment).
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (1 for zero dimensions). Validated not to overflow for
    /// parsed tensors; saturates otherwise.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX)
    }

    /// Bytes of the data, or `None` when the shape is not a whole number of blocks
    /// (never for a parsed tensor).
    pub fn n_bytes(&self) -> Option<u64> {
        self.ty.bytes_for(self.n_elements())
    }

    /// Elements per row (`dims[0]`; 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of `dims[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.n_elements().checked_div(self.row_len()).unwrap_or(0)
    }

    /// Checks the shape: at most [`MAX_DIMS`] dimensions, each and the element
    /// count at most `i64::MAX` (ggml stores them signed), `dims[0]` a whole
    /// number of blocks. Returns the data's byte size.
    pub fn check_shape(&self) -> Result<u64> {
        let bad = |message: String| GgufError::BadShape { tensor: self.name.clone(), message };
        if self.dims.len() > MAX_DIMS as usize {
            return Err(bad(format!("{} dimensions, at most {MAX_DIMS} are allowed.", self.dims.len())));
        }
        let mut n: u64 = 1;
        for &d in &self.dims {
            if d > i64::MAX as u64 {
                return Err(bad(format!("dimension {d} does not fit in an i64.")));
            }
            n = n
                .checked_mul(d)
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| bad(format!("the element count of shape {:?} overflows.", self.dims)))?;
        }
        let block = self.ty.block_size();
        if !self.row_len().is_multiple_of(block) {
            return Err(bad(format!(
                "the first dimension {} is not a multiple of the {} block size {block}.",
                self.row_len(),
                self.ty
            )));
        }
        self.ty.bytes_for(n).ok_or_else(|| bad(format!("the byte size of shape {:?} overflows.", self.dims)))
    }
}

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

/// Checks that every tensor's data lies inside a data section of `data_len`
/// bytes and that no two tensors' data overlap (empty tensors overlap nothing).
fn check_data_ranges(tensors: &[TensorInfo], data_len: u64) -> Result<()> {
    let mut ranges = Vec::with_capacity(tensors.len());
    for t in tensors {
        // `check_shape` succeeded during parsing, so the size is known.
        let size = t.n_bytes().unwrap_or(u64::MAX);
        let end = t.offset.checked_add(size);
        match end {
            Some(end) if end <= data_len => {
                if size > 0 {
                    ranges.push((t.offset, end, t.name.as_str()));
                }
            }
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: t.offset,
                    end: end.unwrap_or(u64::MAX),
                    len: data_len,
                });
            }
        }
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let ((_, end0, first), (start1, _, second)) = (pair[0], pair[1]);
        if start1 < end0 {
            return Err(GgufError::OverlappingTensors {
                first: first.to_string(),
                second: second.to_string(),
            });
        }
    }
    Ok(())
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

/// A tensor of a supported type and its data.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The tensor's info.
    pub info: &'a TensorInfo,
    /// Its data, exactly `info.n_bytes()` bytes.
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// The element type.
    pub fn ty(&self) -> GgmlType {
        self.info.ty
    }

    /// The dimensions (ggml order).
    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }

    /// Bytes of one row (`dims[0]` elements).
    pub fn row_bytes(&self) -> usize {
        // A whole number of blocks, validated when parsing.
        (self.info.row_len() / self.ty().block_size() * self.ty().block_bytes()) as usize
    }

    /// The data of row `i` (rows are `dims[0]` elements), or `None` past the end.
    pub fn row(&self, i: usize) -> Option<&'a [u8]> {
        let rb = self.row_bytes();
        let start = i.checked_mul(rb)?;
        self.data.get(start..start.checked_add(rb)?)
    }

    /// All elements dequantized to `f32`, in storage order.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.info.n_elements() as usize];
        // Supported type and consistent sizes by construction.
        let _ = super::quant::dequantize_into(self.ty(), self.data, &mut out);
        out
    }

    /// Row `i` dequantized into `out` (`dims[0]` values).
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<()> {
        let row = self.row(i).ok_or_else(|| GgufError::RowOutOfRange {
            tensor: self.info.name.clone(),
            row: i as u64,
            n_rows: self.info.n_rows(),
        })?;
        super::quant::dequantize_into(self.ty(), row, out)
    }
}
