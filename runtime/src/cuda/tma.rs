//! Tensor maps for the hidden parameters of kernels whose `load_block`s the
//! codegen copies with the Tensor Memory Accelerator (`codegen::tensor_map`).
//!
//! At each launch the runtime encodes one map per [`TensorMapSpec`] from the
//! launch's packed arguments ([`map_args`], a pure function, then
//! `cuTensorMapEncodeTiled`) and passes it by value after the kernel's own
//! parameters (the driver copies parameters at launch, also into a captured
//! graph). A matrix with no rows or columns reads as all zeros: its map
//! points at a small zeroed buffer of the backend instead of the (possibly
//! dangling) pointer, with extents 1 x 1, so the one element inside is zero
//! and everything else is filled with zeros by the hardware.

use super::validate::KernelParam;
use codegen::tensor_map::{MapDim, TensorMapSpec, box_cols};
use cudarc::driver::sys;
use dsl_core::DType;

/// The most tensor maps one launch passes.
pub const MAX_MAPS: usize = 8;

/// An encoded tensor map, 64-byte aligned as the driver requires.
pub type TensorMap = sys::CUtensorMap;

/// An all-zero map (a placeholder before encoding).
pub fn blank() -> TensorMap {
    sys::CUtensorMap { opaque: [0; 16] }
}

/// What one map is encoded from: the base address, the extents
/// `[cols, rows]` (innermost first) and the row stride in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapArgs {
    /// The matrix's base address.
    pub addr: u64,
    /// `[cols, rows]`.
    pub dims: [u64; 2],
    /// Bytes between rows.
    pub stride: u64,
}

/// The [`MapArgs`] of `spec` for a launch with the packed `params`, using
/// `zeros` (a device address of at least 16 zeroed bytes) for an empty
/// matrix; `Err` with the reason when the hardware cannot describe it.
pub fn map_args(spec: &TensorMapSpec, params: &[KernelParam], zeros: u64) -> Result<MapArgs, String> {
    let int = |d: MapDim, what: &str| -> Result<i64, String> {
        match d {
            MapDim::Const(c) => Ok(c),
            MapDim::Param(i) => match params.get(i) {
                Some(KernelParam::I32(v)) => Ok(*v as i64),
                Some(KernelParam::U32(v)) => Ok(*v as i64),
                Some(KernelParam::I64(v)) => Ok(*v),
                other => Err(format!("the {what} of a `load_block` is parameter {i}, found {other:?}")),
            },
        }
    };
    let Some(KernelParam::Ptr(addr)) = params.get(spec.ptr) else {
        return Err(format!("the base of a `load_block` is parameter {}, which is not a pointer", spec.ptr));
    };
    let rows = int(spec.rows, "row count")?;
    let cols = int(spec.cols, "column count")?;
    let stride = int(spec.row_stride, "row stride")?;
    let eb = spec.dtype.size_bytes() as i64;
    if rows <= 0 || cols <= 0 {
        return Ok(MapArgs { addr: zeros, dims: [1, 1], stride: 16 });
    }
    if stride <= 0 {
        return Err(format!(
            "a `load_block` copied by TMA needs a positive row stride, got {stride} (rows x cols = {rows} x {cols})"
        ));
    }
    let bytes = stride * eb;
    if bytes % 16 != 0 || bytes >= 1 << 40 {
        return Err(format!("a row stride of {bytes} bytes is not a multiple of 16 below 2^40 (TMA)"));
    }
    if addr % 16 != 0 {
        return Err(format!("the base address {addr:#x} of a `load_block` is not 16-byte aligned (TMA)"));
    }
    Ok(MapArgs { addr: *addr, dims: [cols as u64, rows as u64], stride: bytes as u64 })
}

/// Encodes the map of `spec` from `a` (`cuTensorMapEncodeTiled`: the box
/// `[box_rows, 128 bytes]`, 128-byte swizzle, zero fill, 256-byte L2
/// promotion).
pub fn encode(spec: &TensorMapSpec, a: &MapArgs, out: &mut TensorMap) -> Result<(), String> {
    let dtype = match spec.dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        // FP8 has no tensor-map type of its own: the copies move bytes.
        d if d.is_f8() => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        d => return Err(format!("no tensor map for {d} elements")),
    };
    let boxes = [box_cols(spec.dtype), spec.box_rows];
    let unit = [1u32, 1];
    let strides = [a.stride];
    // SAFETY: every pointer refers to a live local array of the length the
    // rank (2) implies; `out` is a 64-byte aligned, writable map. Encoding
    // only computes the descriptor on the host.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            out,
            dtype,
            2,
            a.addr as *mut std::ffi::c_void,
            a.dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            unit.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(|e| {
        format!(
            "cuTensorMapEncodeTiled failed ({e}) for a {} x {} matrix of {} at {:#x} with rows {} bytes apart",
            a.dims[1], a.dims[0], spec.dtype, a.addr, a.stride
        )
    })
}

/// Encodes every map of `specs` for a launch with `params` into `out`;
/// returns how many.
pub fn encode_all(
    specs: &[TensorMapSpec],
    params: &[KernelParam],
    zeros: u64,
    out: &mut [TensorMap; MAX_MAPS],
) -> Result<usize, String> {
    if specs.len() > MAX_MAPS {
        return Err(format!("{} tensor maps; the launcher passes at most {MAX_MAPS}", specs.len()));
    }
    for (spec, slot) in specs.iter().zip(out.iter_mut()) {
        encode(spec, &map_args(spec, params, zeros)?, slot)?;
    }
    Ok(specs.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TensorMapSpec {
        TensorMapSpec {
            ptr: 0,
            rows: MapDim::Param(1),
            cols: MapDim::Param(2),
            row_stride: MapDim::Param(3),
            dtype: DType::BF16,
            box_rows: 128,
        }
    }

    fn params(rows: i32, cols: i32, stride: i32) -> Vec<KernelParam> {
        vec![
            KernelParam::Ptr(0x10_0000),
            KernelParam::I32(rows),
            KernelParam::I32(cols),
            KernelParam::I32(stride),
        ]
    }

    #[test]
    fn map_args_take_the_launch_values_innermost_first() {
        let a = map_args(&spec(), &params(300, 4096, 4160), 0x99).unwrap();
        assert_eq!(a, MapArgs { addr: 0x10_0000, dims: [4096, 300], stride: 8320 });
        let mut s = spec();
        s.cols = MapDim::Const(64);
        s.row_stride = MapDim::Const(64);
        let a = map_args(&s, &params(7, 0, 0), 0x99).unwrap();
        assert_eq!(a, MapArgs { addr: 0x10_0000, dims: [64, 7], stride: 128 });
    }

    #[test]
    fn empty_matrices_read_the_zero_buffer() {
        for (r, c) in [(0, 64), (5, 0), (-3, 64)] {
            let a = map_args(&spec(), &params(r, c, 64), 0x99).unwrap();
            assert_eq!(a, MapArgs { addr: 0x99, dims: [1, 1], stride: 16 });
        }
    }

    #[test]
    fn what_tma_cannot_describe_is_an_error() {
        let e = map_args(&spec(), &params(4, 64, 0), 0).unwrap_err();
        assert!(e.contains("positive row stride"), "{e}");
        let e = map_args(&spec(), &params(4, 64, 12), 0).unwrap_err();
        assert!(e.contains("multiple of 16"), "{e}");
        let mut p = params(4, 64, 64);
        p[0] = KernelParam::Ptr(0x10_0008);
        let e = map_args(&spec(), &p, 0).unwrap_err();
        assert!(e.contains("16-byte aligned"), "{e}");
        p[0] = KernelParam::I32(1);
        assert!(map_args(&spec(), &p, 0).unwrap_err().contains("not a pointer"));
    }
}
