//! The tensor table of a GGUF file: [`TensorInfo`] (name, shape, type,
//! data offset) with its shape checks, the data-range check of a whole table
//! ([`check_data_ranges`]: inside the data section, no overlaps), and
//! [`TensorView`], a tensor's info with its bytes.

use super::reader::MAX_DIMS;
use super::types::GgmlType;
use super::{GgufError, Result};

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

/// Checks that every tensor's data lies inside a data section of `data_len`
/// bytes and that no two tensors' data overlap (empty tensors overlap nothing).
pub(super) fn check_data_ranges(tensors: &[TensorInfo], data_len: u64) -> Result<()> {
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
