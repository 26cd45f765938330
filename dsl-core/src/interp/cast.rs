//! Numeric casts and bitcasts (`ptrcast` only changes the element type and is
//! handled by the executor as a view).
//!
//! Cast semantics (see `ir/ops/cast.rs`): to a float rounds to nearest even,
//! once; float to integer truncates toward zero and saturates, NaN becoming 0;
//! integer to integer sign- or zero-extends by the source (already encoded in
//! the `i64` storage) or truncates; to `i1` means `!= 0`, so a NaN float gives
//! `true` (unordered not-equal, as Triton lowers it).
//!
//! Bitcasts go through the raw bit pattern. Caveat: f16/bf16 values are stored
//! as f32, so a NaN's payload may be quieted on the way through; every other
//! bit pattern round-trips exactly.

use super::tile::{Data, Tile, int_to_float_f32, internal, narrow_f64};
use crate::dtype::{DType, Elem, f8_bits, f8_round, f8_value};
use half::{bf16, f16};

/// A float (as f64) to integer dtype `d`: truncate toward zero, saturate, NaN -> 0.
fn float_to_int(d: DType, x: f64) -> i64 {
    if d == DType::I1 {
        return (x != 0.0) as i64;
    }
    let (lo, hi) = d.int_range().unwrap_or((i64::MIN, i64::MAX));
    // `as` truncates toward zero, saturates at the i64 range and maps NaN to 0.
    (x as i64).clamp(lo, hi)
}

/// `cast x` to `to`.
pub(crate) fn cast(x: &Tile, to: DType) -> Result<Tile, String> {
    let from = x.dtype();
    let elem = Elem::Scalar(to);
    if from == to {
        return Ok(x.view(elem, x.shape.clone()));
    }
    if (from.is_f8() || to.is_f8())
        && !(from.is_float() && to.is_float() && from != DType::F64 && to != DType::F64)
    {
        // The verifier allows 8-bit floats to convert to and from f16, bf16
        // and f32 only.
        return Err(internal(format!("`cast` from {from} to {to}")));
    }
    let data = match &*x.data {
        Data::Int(v) => match to {
            DType::F16 | DType::BF16 | DType::F32 => {
                Data::F32(v.iter().map(|&i| int_to_float_f32(to, i)).collect())
            }
            DType::F64 => Data::F64(v.iter().map(|&i| i as f64).collect()),
            DType::I1 => Data::Int(v.iter().map(|&i| (i != 0) as i64).collect()),
            _ => {
                let mut out = v.clone();
                super::arith::wrap_all(to, &mut out);
                Data::Int(out)
            }
        },
        Data::F32(v) => match to {
            // Every f16/bf16 value is exactly an f32: share the storage.
            DType::F32 => return Ok(x.view(elem, x.shape.clone())),
            DType::F16 => Data::F32(v.iter().map(|&f| f16::from_f32(f).to_f32()).collect()),
            DType::BF16 => Data::F32(v.iter().map(|&f| bf16::from_f32(f).to_f32()).collect()),
            DType::F8E4M3 | DType::F8E5M2 => Data::F32(v.iter().map(|&f| f8_round(to, f)).collect()),
            DType::F64 => Data::F64(v.iter().map(|&f| f as f64).collect()),
            _ => Data::Int(v.iter().map(|&f| float_to_int(to, f as f64)).collect()),
        },
        Data::F64(v) => match to {
            DType::F16 | DType::BF16 | DType::F32 => {
                Data::F32(v.iter().map(|&f| narrow_f64(to, f)).collect())
            }
            DType::F64 => Data::F64(v.clone()),
            _ => Data::Int(v.iter().map(|&f| float_to_int(to, f)).collect()),
        },
    };
    Ok(Tile::new(elem, x.shape.clone(), data))
}

/// The raw bit patterns of `x`'s elements (zero-extended to 64 bits).
fn to_bits(d: DType, data: &Data) -> Result<Vec<u64>, String> {
    Ok(match data {
        Data::Int(v) => {
            let mask = if d.bits() >= 64 { u64::MAX } else { (1u64 << d.bits()) - 1 };
            v.iter().map(|&i| (i as u64) & mask).collect()
        }
        Data::F32(v) => match d {
            DType::F16 => v.iter().map(|&f| u64::from(f16::from_f32(f).to_bits())).collect(),
            DType::BF16 => v.iter().map(|&f| u64::from(bf16::from_f32(f).to_bits())).collect(),
            DType::F8E4M3 | DType::F8E5M2 => v.iter().map(|&f| u64::from(f8_bits(d, f))).collect(),
            _ => v.iter().map(|&f| u64::from(f.to_bits())).collect(),
        },
        Data::F64(v) => v.iter().map(|&f| f.to_bits()).collect(),
    })
}

/// Elements of dtype `d` from raw bit patterns.
fn from_bits(d: DType, bits: &[u64]) -> Result<Data, String> {
    Ok(match d {
        DType::I8 => Data::Int(bits.iter().map(|&b| b as u8 as i8 as i64).collect()),
        DType::U8 => Data::Int(bits.iter().map(|&b| b as u8 as i64).collect()),
        DType::I16 => Data::Int(bits.iter().map(|&b| b as u16 as i16 as i64).collect()),
        DType::I32 => Data::Int(bits.iter().map(|&b| b as u32 as i32 as i64).collect()),
        DType::U32 => Data::Int(bits.iter().map(|&b| b as u32 as i64).collect()),
        DType::I64 => Data::Int(bits.iter().map(|&b| b as i64).collect()),
        DType::F16 => Data::F32(bits.iter().map(|&b| f16::from_bits(b as u16).to_f32()).collect()),
        DType::BF16 => Data::F32(bits.iter().map(|&b| bf16::from_bits(b as u16).to_f32()).collect()),
        DType::F32 => Data::F32(bits.iter().map(|&b| f32::from_bits(b as u32)).collect()),
        DType::F64 => Data::F64(bits.iter().map(|&b| f64::from_bits(b)).collect()),
        DType::F8E4M3 | DType::F8E5M2 => Data::F32(bits.iter().map(|&b| f8_value(d, b as u8)).collect()),
        DType::I1 => return Err(internal("`bitcast` to i1".into())),
    })
}

/// `bitcast x` to `to` (same width).
pub(crate) fn bitcast(x: &Tile, to: DType) -> Result<Tile, String> {
    let from = x.dtype();
    if from.bits() != to.bits() {
        return Err(internal(format!("`bitcast` from {from} to {to}")));
    }
    let bits = to_bits(from, &x.data)?;
    Ok(Tile::new(Elem::Scalar(to), x.shape.clone(), from_bits(to, &bits)?))
}
