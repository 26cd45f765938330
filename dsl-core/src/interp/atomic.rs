//! Atomic read-modify-write ops and compare-and-swap.
//!
//! Semantics: lanes are applied one after another in row-major lane order, so
//! lanes of one op that hit the same address see each other's updates (the
//! result equals some serialization, as on the GPU). Each op returns the value
//! in memory before its update; masked-off lanes return 0 and touch nothing.
//! Float `add` rounds to the dtype; float `max`/`min` keep the non-NaN value;
//! signed integer `add` overflow is an error, as for non-atomic `add`;
//! `atomic_cas` compares bit patterns.

use super::memory::{Access, Memory};
use super::tile::{Class, Data, Tile, class_of, internal, lane_str, narrow_f64};
use crate::dtype::{DType, Elem};
use crate::ir::ops::AtomicKind;

/// A number read from memory.
#[derive(Clone, Copy, Debug)]
enum Num {
    I(i64),
    F(f64),
}

/// Decodes one little-endian element of `d`.
fn decode(d: DType, b: &[u8]) -> Num {
    let v = super::buffer::read_f64(d, b);
    match d {
        DType::I64 => {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&b[..8]);
            Num::I(i64::from_le_bytes(raw))
        }
        _ if d.is_int() => Num::I(v as i64),
        _ => Num::F(v),
    }
}

/// Encodes one element of `d` (already in range and rounded) as little-endian bytes.
fn encode(d: DType, n: Num) -> [u8; 8] {
    let mut out = [0u8; 8];
    match (d, n) {
        (DType::F16, Num::F(f)) => out[..2].copy_from_slice(&half::f16::from_f64(f).to_le_bytes()),
        (DType::BF16, Num::F(f)) => out[..2].copy_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
        (DType::F32, Num::F(f)) => out[..4].copy_from_slice(&(f as f32).to_le_bytes()),
        (DType::F64, Num::F(f)) => out.copy_from_slice(&f.to_le_bytes()),
        (_, Num::I(i)) => out.copy_from_slice(&i.to_le_bytes()),
        (_, Num::F(f)) => out.copy_from_slice(&(f as i64).to_le_bytes()),
    }
    out
}

/// Lane `lane` of a value tile as a number (a one-element tile broadcasts).
fn lane_num(t: &Tile, lane: usize) -> Num {
    let i = if t.len() == 1 { 0 } else { lane };
    match &*t.data {
        Data::Int(v) => Num::I(v.get(i).copied().unwrap_or(0)),
        Data::F32(v) => Num::F(v.get(i).map_or(0.0, |&x| x as f64)),
        Data::F64(v) => Num::F(v.get(i).copied().unwrap_or(0.0)),
    }
}

/// The old values as a tile of the pointee dtype (masked-off lanes are 0).
fn olds_tile(d: DType, shape: &crate::dtype::Shape, olds: &[Option<[u8; 8]>]) -> Tile {
    let size = d.size_bytes();
    let num = |o: &Option<[u8; 8]>| o.map(|b| decode(d, &b[..size]));
    let data = match class_of(Elem::Scalar(d)) {
        Class::Int => {
            Data::Int(olds.iter().map(|o| if let Some(Num::I(i)) = num(o) { i } else { 0 }).collect())
        }
        Class::F32 => Data::F32(
            olds.iter().map(|o| if let Some(Num::F(f)) = num(o) { f as f32 } else { 0.0 }).collect(),
        ),
        Class::F64 => {
            Data::F64(olds.iter().map(|o| if let Some(Num::F(f)) = num(o) { f } else { 0.0 }).collect())
        }
    };
    Tile::new(Elem::Scalar(d), shape.clone(), data)
}

/// `atomic_<kind> ptr, val [, mask]`: returns the old values.
pub(crate) fn rmw(
    mem: &mut Memory<'_>,
    kind: AtomicKind,
    ptr: &Tile,
    val: &Tile,
    mask: Option<&Tile>,
) -> Result<Tile, String> {
    let d = ptr.dtype();
    let acc = Access { shape: &ptr.shape, dtype: d };
    let mask = mask.map(|m| m.ints()).transpose()?;
    let (lo, hi) = d.int_range().unwrap_or((i64::MIN, i64::MAX));
    let olds = mem.atomic(&acc, ptr.ints()?, mask, |lane, old| {
        let new = match (decode(d, old), lane_num(val, lane)) {
            (Num::F(o), Num::F(v)) => Num::F(match kind {
                AtomicKind::Add => match d {
                    DType::F64 => o + v,
                    DType::F32 => (o as f32 + v as f32) as f64,
                    _ => narrow_f64(d, o + v) as f64,
                },
                AtomicKind::Max => o.max(v),
                AtomicKind::Min => o.min(v),
                AtomicKind::Xchg => v,
                _ => return Err(internal(format!("`{}` on {d}", kind.name()))),
            }),
            (Num::I(o), Num::I(v)) => Num::I(match kind {
                AtomicKind::Add => {
                    let s = o as i128 + v as i128;
                    if s < lo as i128 || s > hi as i128 {
                        if d.is_signed_int() {
                            return Err(format!(
                                "{d} overflow in `{}`: {o} + {v} = {s} does not fit in {d} (at {})",
                                kind.name(),
                                lane_str(&ptr.shape, lane)
                            ));
                        }
                        d.wrap_int(s as i64)
                    } else {
                        s as i64
                    }
                }
                AtomicKind::Max => o.max(v),
                AtomicKind::Min => o.min(v),
                AtomicKind::And => o & v,
                AtomicKind::Or => o | v,
                AtomicKind::Xor => o ^ v,
                AtomicKind::Xchg => v,
            }),
            _ => return Err(internal("atomic value storage does not match the pointee".into())),
        };
        Ok(Some(encode(d, new)))
    })?;
    Ok(olds_tile(d, &ptr.shape, &olds))
}

/// `atomic_cas ptr, cmp, val`: where memory equals `cmp` bit for bit, stores
/// `val`; returns the old values.
pub(crate) fn cas(mem: &mut Memory<'_>, ptr: &Tile, cmp: &Tile, val: &Tile) -> Result<Tile, String> {
    let d = ptr.dtype();
    let size = d.size_bytes();
    let acc = Access { shape: &ptr.shape, dtype: d };
    let olds = mem.atomic(&acc, ptr.ints()?, None, |lane, old| {
        let want = encode(d, lane_num(cmp, lane));
        Ok((old == &want[..size]).then(|| encode(d, lane_num(val, lane))))
    })?;
    Ok(olds_tile(d, &ptr.shape, &olds))
}
