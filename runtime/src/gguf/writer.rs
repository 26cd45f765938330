//! The GGUF writer: metadata and tensors in, a version-3 file out, laid out as
//! llama.cpp's `gguf_write` does (each tensor's data at the next multiple of the
//! alignment, zero padding after each tensor, including the last).
//!
//! Invariant: whatever the writer accepts, [`Header::parse`] accepts, and
//! `Gguf::from_bytes(w.to_bytes())` gives back the same metadata (same order),
//! tensor infos and data. Inputs the reader would reject (a bad shape, data of
//! the wrong size, a duplicate name, a bad `general.alignment`) are rejected
//! when added.
//!
//! [`Header::parse`]: super::Header::parse

use super::metadata::Metadata;
use super::quant;
use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use super::tensor::TensorInfo;
use super::types::{Array, GgmlType, Value};
use super::{GgufError, Result};
use std::path::Path;

/// Builds a GGUF file in memory.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    metadata: Metadata,
    tensors: Vec<(TensorInfo, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file.
    pub fn new() -> GgufWriter {
        GgufWriter { version: 3, metadata: Metadata::new(), tensors: Vec::new() }
    }

    /// Sets the version written in the header (2 and 3 share one layout; other
    /// values are for tests of the reader).
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// The metadata so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Sets a metadata pair (replacing an existing key in place, keeping its
    /// position). `general.alignment` must be a `u32` power of two.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<()> {
        let value = value.into();
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => {}
                Value::U32(a) => return Err(GgufError::BadAlignment(u64::from(a))),
                ref v => {
                    return Err(GgufError::WrongType {
                        key: key.to_string(),
                        expected: "u32",
                        found: super::metadata::type_words(v),
                    });
                }
            }
        }
        self.metadata.set(key, value);
        Ok(())
    }

    /// The alignment the file will use.
    pub fn alignment(&self) -> u64 {
        match self.metadata.get(ALIGNMENT_KEY) {
            Some(Value::U32(a)) => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Adds a tensor with raw data of type `ty` and shape `dims` (ggml order).
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64], data: Vec<u8>) -> Result<()> {
        if self.tensors.iter().any(|(t, _)| t.name == name) {
            return Err(GgufError::DuplicateTensor(name.to_string()));
        }
        let info = TensorInfo { name: name.to_string(), dims: dims.to_vec(), ty, offset: 0 };
        let bytes = info.check_shape()?;
        if data.len() as u64 != bytes {
            return Err(GgufError::SizeMismatch {
                what: format!("data of tensor `{name}` ({ty}, shape {dims:?})"),
                expected: bytes,
                found: data.len() as u64,
            });
        }
        self.tensors.push((info, data));
        Ok(())
    }

    /// Adds a tensor from `f32` values, quantized to `ty` (a supported type).
    pub fn add_f32_tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64], values: &[f32]) -> Result<()> {
        let info = TensorInfo { name: name.to_string(), dims: dims.to_vec(), ty, offset: 0 };
        info.check_shape()?;
        let n = info.n_elements();
        if values.len() as u64 != n {
            return Err(GgufError::SizeMismatch {
                what: format!("values of tensor `{name}` (shape {dims:?})"),
                expected: n,
                found: values.len() as u64,
            });
        }
        let data = quant::quantize(ty, values).map_err(|e| match e {
            GgufError::UnsupportedType { ty, .. } => {
                GgufError::UnsupportedType { tensor: name.to_string(), ty }
            }
            other => other,
        })?;
        self.add_tensor(name, ty, dims, data)
    }

    /// The tensor infos with the offsets they will have in the file.
    pub fn tensor_infos(&self) -> Vec<TensorInfo> {
        let align = self.alignment();
        let mut offset = 0u64;
        self.tensors
            .iter()
            .map(|(info, data)| {
                let info = TensorInfo { offset, ..info.clone() };
                offset += (data.len() as u64).next_multiple_of(align);
                info
            })
            .collect()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            put_str(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut out, value);
        }
        for info in self.tensor_infos() {
            put_str(&mut out, &info.name);
            out.extend_from_slice(&(info.dims.len() as u32).to_le_bytes());
            for d in &info.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&info.ty.id().to_le_bytes());
            out.extend_from_slice(&info.offset.to_le_bytes());
        }
        if !self.tensors.is_empty() {
            out.resize(out.len().next_multiple_of(align), 0);
            for (_, data) in &self.tensors {
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(align), 0);
            }
        }
        out
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes())
            .map_err(|source| GgufError::Io { path: path.display().to_string(), source })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(b) => out.push(u8::from(*b)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.element_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            $v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}
