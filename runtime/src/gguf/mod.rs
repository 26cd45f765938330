//! GGUF model files: a validating, memory-mapped reader, a writer, and the
//! Llama schema on top of them (hyperparameters, tensor names, tokenizer
//! vocabulary).
//!
//! # Format (versions 2 and 3, little-endian)
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count x (key: string, value_type: u32, value)
//! tensor_count x (name: string, n_dims: u32, dims: n_dims x u64, type: u32, offset: u64)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset, offset a multiple of the alignment
//! ```
//!
//! A string is a `u64` byte length and UTF-8 bytes; an array is an element type
//! `u32`, a `u64` count and the elements. `dims[0]` is the contiguous (fastest)
//! dimension, as in ggml: a `[576, 49152]` embedding is 49152 rows of 576.
//!
//! # Modules
//!
//! - [`types`]: [`GgmlType`] (block sizes, byte sizes, which are supported),
//!   metadata [`Value`]s and [`Array`]s.
//! - [`reader`]: [`Gguf`] (mmap or owned bytes), [`Header`], [`Metadata`] with
//!   typed accessors, [`TensorInfo`], [`TensorView`].
//! - [`quant`]: dequantization (F32, F16, BF16, Q8_0, Q4_0, Q4_1) and
//!   llama.cpp's reference quantization (for the writer and tests).
//! - [`writer`]: [`GgufWriter`], which lays files out as llama.cpp does.
//! - [`arch`]: [`Arch`], where the supported architectures (llama, qwen2,
//!   qwen3) differ, and [`RopeScaling`].
//! - [`llama`]: [`LlamaConfig`] (validated hyperparameters of any supported
//!   architecture) and the tensor names and shapes.
//! - [`vocab`]: [`Vocab`], the `tokenizer.ggml.*` keys.
//! - [`tiny`]: a small random-weight Llama with the real file's layout, for tests.
//!
//! # Invariants
//!
//! - Parsing never panics and never allocates much more than the input's size:
//!   every count and length is checked against the bytes that remain before
//!   anything is allocated, arrays nest at most [`reader::MAX_ARRAY_DEPTH`]
//!   deep, and all offset arithmetic is checked.
//! - A parsed [`Gguf`] is fully validated: keys and tensor names are unique,
//!   every tensor has a known type, a shape whose first dimension is a whole
//!   number of blocks, an aligned offset, and data inside the file that no
//!   other tensor's data overlaps. Views of it therefore need no further checks.
//! - This module depends only on `std`, `thiserror`, `memmap2`, `half` and
//!   the `kernels` crate (the block formats' f64 reference); of this crate
//!   only [`tiny`] uses more (the seeded generator) and it is left out of
//!   `--cfg fuzzing` builds, so the fuzz target (`runtime/fuzz`) compiles
//!   the module on its own, without LLVM or the CUDA bindings.

pub mod arch;
pub mod llama;
pub mod metadata;
pub mod quant;
pub mod reader;
pub mod tensor;
// The test-model writer draws its weights from the runtime's generator,
// which the fuzz target (compiled with `--cfg fuzzing`) does not have.
#[cfg(not(fuzzing))]
pub mod tiny;
pub mod types;
pub mod vocab;
pub mod writer;

#[cfg(test)]
pub(crate) mod tests;

pub use arch::{Arch, RopeScaling, RopeStyle};
pub use llama::LlamaConfig;
pub use metadata::Metadata;
pub use reader::{Gguf, Header};
pub use tensor::{TensorInfo, TensorView};
pub use types::{Array, GgmlType, Value, ValueType};
pub use vocab::{TokenType, Vocab};
pub use writer::GgufWriter;

/// Errors of GGUF reading, validation and writing.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Environment or user error: the file could not be opened, mapped or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// User error (corrupt file): the file ends in the middle of `what`.
    #[error("truncated GGUF: {what} at byte {offset} needs {needed} bytes, but the file has {len}")]
    Truncated {
        /// What was being read, e.g. "value of metadata key `llama.block_count`".
        what: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes the read needs.
        needed: u64,
        /// Length of the file.
        len: u64,
    },
    /// User error: the file does not start with `GGUF`.
    #[error("not a GGUF file: the magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// Unsupported: a GGUF version other than 2 or 3.
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    /// User error (corrupt file): a count or length cannot fit in the rest of the
    /// file, so nothing is allocated for it.
    #[error(
        "{what}: {count} entries of at least {min_size} bytes each do not fit in the {remaining} bytes left (a corrupt count or a truncated file)"
    )]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// The count stored in the file.
        count: u64,
        /// The fewest bytes one entry occupies.
        min_size: u64,
        /// Bytes left in the file after the count.
        remaining: u64,
    },
    /// User error (corrupt file): a string is not UTF-8.
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: String,
        /// Byte offset of the string's bytes.
        offset: u64,
    },
    /// User error (corrupt file): a metadata value type id outside 0..=12.
    #[error("{what}: unknown metadata value type {id}")]
    UnknownValueType {
        /// Which value.
        what: String,
        /// The type id.
        id: u32,
    },
    /// User error (corrupt file): a bool that is neither 0 nor 1.
    #[error("{what}: invalid bool byte {byte}")]
    InvalidBool {
        /// Which value.
        what: String,
        /// The byte.
        byte: u8,
    },
    /// User error (corrupt or hostile file): arrays of arrays nested too deep.
    #[error("{what}: arrays nested deeper than {limit} levels")]
    NestingTooDeep {
        /// Which value.
        what: String,
        /// The limit.
        limit: usize,
    },
    /// User error (corrupt file): a metadata key occurs twice.
    #[error("duplicate metadata key `{0}`")]
    DuplicateKey(String),
    /// User error (corrupt file): a tensor name occurs twice.
    #[error("duplicate tensor `{0}`")]
    DuplicateTensor(String),
    /// User error (corrupt file) or unsupported: a tensor type id ggml does not know.
    #[error("tensor `{tensor}`: unknown ggml type id {id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The type id.
        id: u32,
    },
    /// User error (corrupt file): a tensor's shape is invalid (too many
    /// dimensions, an element count that overflows, a first dimension that is
    /// not a whole number of blocks).
    #[error("tensor `{tensor}`: {message}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// What is wrong, as a full sentence.
        message: String,
    },
    /// User error (corrupt file): `general.alignment` is zero or not a power of two.
    #[error("general.alignment is {0}, which is not a power of two")]
    BadAlignment(u64),
    /// User error (corrupt file): a tensor's offset is not a multiple of the alignment.
    #[error("tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset within the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// User error (corrupt or truncated file): a tensor's data extends past the
    /// end of the file.
    #[error("tensor `{tensor}`: data bytes [{start}, {end}) of the data section lie outside its {len} bytes")]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Start offset within the data section.
        start: u64,
        /// End offset (exclusive) within the data section, saturated at `u64::MAX`.
        end: u64,
        /// Bytes in the data section.
        len: u64,
    },
    /// User error (corrupt file): two tensors' data overlap.
    #[error("tensors `{first}` and `{second}` have overlapping data")]
    OverlappingTensors {
        /// The tensor with the lower offset.
        first: String,
        /// The other tensor.
        second: String,
    },
    /// User error: a required metadata key is absent.
    #[error("missing metadata key `{0}`")]
    MissingKey(String),
    /// User error: a metadata key has the wrong type.
    #[error("metadata key `{key}` is a {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The expected type, in words.
        expected: &'static str,
        /// The stored type, in words.
        found: String,
    },
    /// User error: a metadata value is out of range or inconsistent.
    #[error("metadata key `{key}`: {message}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong, as a full sentence.
        message: String,
    },
    /// Unsupported: `general.architecture` is none of [`arch::SUPPORTED`].
    #[error("unsupported architecture `{0}` (supported: llama, qwen2, qwen3)")]
    UnsupportedArchitecture(String),
    /// User error: a tensor the caller (or the architecture) needs is absent.
    #[error("no tensor named `{0}`")]
    MissingTensor(String),
    /// User error: a tensor exists but its type or shape is not what the
    /// architecture needs.
    #[error("tensor `{tensor}`: {message}")]
    TensorMismatch {
        /// The tensor.
        tensor: String,
        /// What is wrong, as a full sentence.
        message: String,
    },
    /// Unsupported: the tensor's type is known but the runtime cannot read it.
    #[error(
        "tensor `{tensor}` has type {ty}, which the runtime does not support (supported: f32, f16, bf16, q8_0, q4_0, q4_1)"
    )]
    UnsupportedType {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// User error: a row index past the last row of a tensor.
    #[error("tensor `{tensor}`: row {row} is out of range (it has {n_rows} rows)")]
    RowOutOfRange {
        /// The tensor.
        tensor: String,
        /// The requested row.
        row: u64,
        /// Its number of rows.
        n_rows: u64,
    },
    /// User error: data of the wrong length was given to the writer or to
    /// (de)quantization.
    #[error("{what}: expected {expected} bytes or elements, got {found}")]
    SizeMismatch {
        /// What was given.
        what: String,
        /// The size it must have.
        expected: u64,
        /// The size it has.
        found: u64,
    },
}

/// Result alias of this module.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
