//! Tensor maps: what the runtime encodes at launch for the `load_block`s the
//! codegen copies with the Tensor Memory Accelerator (sm_90a).
//!
//! A pipelined `load_block` feeding `wgmma` in swizzle atoms
//! (`lower/pipeline/`) is copied by `cp.async.bulk.tensor` boxes issued by
//! one thread, instead of by every thread's `cp.async`. The box reads a
//! tensor map: a 128-byte descriptor of the row-major matrix (base address,
//! extents, row stride, box size, swizzle) that only the host can encode
//! (`cuTensorMapEncodeTiled`). The kernel takes one such map per distinct
//! matrix as a hidden `.param .align 64 .b8 [128]` parameter after the
//! author's parameters (a grid constant, so the copies read it in place);
//! [`TensorMapSpec`] tells the runtime how to build it from the launch's
//! arguments.
//!
//! The map's box is `[box_rows, 128 bytes]` with the 128-byte swizzle (64
//! elements of a 16-bit dtype, 128 of an FP8 one, [`box_cols`]), the layout
//! of one column block of a `wgmma` swizzle atom stage
//! (`pipeline::atom_index`); a `[rows, cols]` tile takes `cols /
//! box_cols` boxes side by side (and `rows / 256` along the rows when it is taller than a
//! box may be). Elements outside the matrix read as zero, exactly the
//! semantics of `load_block`.

use dsl_core::DType;
use dsl_core::Function;
use dsl_core::ir::Value;
use dsl_core::passes::block_load::BlockLoad;

/// Bytes per box row: the 128-byte swizzle's span.
pub const BOX_ROW_BYTES: u32 = 128;

/// Elements of `dtype` per box row ([`BOX_ROW_BYTES`]).
pub fn box_cols(dtype: DType) -> u32 {
    BOX_ROW_BYTES / dtype.size_bytes() as u32
}

/// Whether a tensor map may hold `dtype`: the 16-bit floats and the FP8
/// formats (which the hardware copies as bytes).
pub fn mappable(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) || dtype.is_f8()
}

/// The most rows one box may have (the hardware's limit per dimension).
pub const MAX_BOX_ROWS: u32 = 256;

/// A scalar of the tensor map taken from the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapDim {
    /// The `i32` kernel parameter with this index.
    Param(usize),
    /// A constant.
    Const(i64),
}

/// One hidden tensor-map parameter: a row-major `rows x cols` matrix of
/// `dtype` at the pointer parameter `ptr`, with `row_stride` elements
/// between rows, read in `[box_rows, box_cols(dtype)]` boxes with the 128-byte
/// swizzle and zero fill outside the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSpec {
    /// Index of the pointer parameter (the matrix's base address).
    pub ptr: usize,
    /// Rows of the matrix.
    pub rows: MapDim,
    /// Columns of the matrix (contiguous).
    pub cols: MapDim,
    /// Elements between the starts of consecutive rows.
    pub row_stride: MapDim,
    /// The element type ([`mappable`]).
    pub dtype: DType,
    /// Rows of one box.
    pub box_rows: u32,
}

impl TensorMapSpec {
    /// Bytes one box moves (zero-filled elements included).
    pub fn box_bytes(&self) -> u32 {
        self.box_rows * BOX_ROW_BYTES
    }

    /// The text form kept in the PTX cache's metadata (see [`TensorMapSpec::parse`]).
    pub fn to_line(&self) -> String {
        let d = |d: MapDim| match d {
            MapDim::Param(i) => format!("p{i}"),
            MapDim::Const(c) => format!("c{c}"),
        };
        format!(
            "tma {} {} {} {} {} {}",
            self.ptr,
            d(self.rows),
            d(self.cols),
            d(self.row_stride),
            self.dtype,
            self.box_rows
        )
    }

    /// Parses [`TensorMapSpec::to_line`]'s form.
    pub fn parse(line: &str) -> Option<TensorMapSpec> {
        let mut w = line.split(' ');
        if w.next()? != "tma" {
            return None;
        }
        let dim = |s: &str| -> Option<MapDim> {
            match s.split_at_checked(1)? {
                ("p", i) => i.parse().ok().map(MapDim::Param),
                ("c", c) => c.parse().ok().map(MapDim::Const),
                _ => None,
            }
        };
        let ptr = w.next()?.parse().ok()?;
        let rows = dim(w.next()?)?;
        let cols = dim(w.next()?)?;
        let row_stride = dim(w.next()?)?;
        let dtype = DType::from_name(w.next()?).filter(|&d| mappable(d))?;
        let box_rows = w.next()?.parse().ok()?;
        w.next().is_none().then_some(TensorMapSpec { ptr, rows, cols, row_stride, dtype, box_rows })
    }
}

/// The tensor map a `load_block` of a `[rows, cols]` tile can be copied
/// through, when everything the map holds is a kernel parameter or a
/// constant the hardware accepts: the base pointer a parameter specialized
/// for 16-byte alignment, the extents parameters or constants, the row
/// stride a multiple of 16 bytes (a parameter specialized for multiples of
/// 16 bytes, or such a constant), a [`mappable`] dtype, `cols` a multiple
/// of [`box_cols`] and `rows` a multiple of 8 (whole swizzle atoms). `None`
/// otherwise: the load is then copied by `cp.async` like any other.
pub fn spec_for(f: &Function, bl: &BlockLoad, dtype: DType) -> Option<TensorMapSpec> {
    let [rows, cols] = bl.block;
    if !mappable(dtype) || !cols.is_multiple_of(box_cols(dtype) as usize) || !rows.is_multiple_of(8) {
        return None;
    }
    let param = |v: Value| f.params.iter().position(|p| p.value == v);
    let ptr = param(bl.ptr)?;
    if !f.params[ptr].hints.divisibility.unwrap_or(1).is_multiple_of(16) {
        return None;
    }
    let dim = |v: Value| -> Option<MapDim> {
        match param(v) {
            Some(i) => Some(MapDim::Param(i)),
            None => f.as_constant(v).map(|s| MapDim::Const(s.as_i64())),
        }
    };
    let eb = dtype.size_bytes() as i64;
    let row_stride = match dim(bl.row_stride)? {
        MapDim::Param(i) => {
            let d = f.params[i].hints.divisibility.unwrap_or(1) as i64;
            ((d * eb) % 16 == 0).then_some(MapDim::Param(i))?
        }
        MapDim::Const(c) => (c > 0 && (c * eb) % 16 == 0).then_some(MapDim::Const(c))?,
    };
    Some(TensorMapSpec {
        ptr,
        rows: dim(bl.rows)?,
        cols: dim(bl.cols)?,
        row_stride,
        dtype,
        box_rows: (rows as u32).min(MAX_BOX_ROWS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_lines_round_trip() {
        let s = TensorMapSpec {
            ptr: 2,
            rows: MapDim::Param(4),
            cols: MapDim::Const(4096),
            row_stride: MapDim::Param(5),
            dtype: DType::BF16,
            box_rows: 128,
        };
        assert_eq!(TensorMapSpec::parse(&s.to_line()), Some(s));
        assert_eq!(s.box_bytes(), 128 * 128);
        let f8 = TensorMapSpec { dtype: DType::F8E4M3, ..s };
        assert_eq!(TensorMapSpec::parse(&f8.to_line()), Some(f8));
        assert_eq!((f8.box_bytes(), box_cols(DType::F8E4M3), box_cols(DType::BF16)), (128 * 128, 128, 64));
        for bad in ["tma 1 p2 c3 p4 f32 64", "tma 1 p2 c3 p4 bf16", "tma 1 q2 c3 p4 bf16 64", "tm 1"] {
            assert_eq!(TensorMapSpec::parse(bad), None, "{bad}");
        }
    }
}
