//! Checked promises and debugging ops: hints (`multiple_of`, `max_contiguous`,
//! `max_constancy`), `assert` and `print`.
//!
//! Hints return their operand unchanged, but the interpreter checks the
//! promise, because codegen vectorizes on it and a false promise would make the
//! GPU read the wrong addresses silently. Per dimension `d` with value `n`
//! (a step of one element along `d`; for pointers "contiguous" means the
//! address grows by the pointee size, and addresses count in bytes):
//! - `max_contiguous`: in every aligned group of `n` elements along `d`, each
//!   element is the previous one plus one;
//! - `max_constancy`: in every aligned group of `n` elements along `d`, all
//!   elements are equal;
//! - `multiple_of`: the first element of every contiguous run along `d` is a
//!   multiple of `n` (Triton's divisibility; for a scalar, the value itself).
//!
//! Groups never extend past the dimension (a hint larger than the dimension
//! covers the whole dimension).

use super::shape::strides_of;
use super::tile::{Data, Tile, lane_str};
use crate::ir::ops::HintOp;
use std::fmt::Write as _;

/// Checks the promise of `hint` on `x`.
pub(crate) fn check_hint(hint: &HintOp, x: &Tile) -> Result<(), String> {
    let v = x.ints()?;
    let unit = if x.elem.is_ptr() { x.dtype().size_bytes() as i64 } else { 1 };
    let vals = hint.values();
    if x.shape.is_empty() {
        if let (HintOp::MultipleOf(_), Some(&n), Some(&s)) = (hint, vals.first(), v.first())
            && s.rem_euclid(i64::from(n.max(1))) != 0
        {
            return Err(format!("the value {s} is not a multiple of {n}, as `multiple_of` promised"));
        }
        return Ok(());
    }
    let strides = strides_of(&x.shape);
    for (d, (&dim, &n)) in x.shape.iter().zip(vals).enumerate() {
        // Verified hints are powers of two; `max(1)` only guards the divisions.
        let n = (n as usize).max(1);
        let stride = strides[d];
        for lane in 0..v.len() {
            let pos = (lane / stride) % dim;
            let prev = if pos > 0 { v.get(lane - stride).copied() } else { None };
            let cur = v[lane];
            let err = |what: String| {
                Err(format!(
                    "{what} at {} (along dimension {d}), breaking the `{}` promise of {n}",
                    lane_str(&x.shape, lane),
                    hint.name()
                ))
            };
            match hint {
                HintOp::MaxContiguous(_) => {
                    if !pos.is_multiple_of(n)
                        && let Some(p) = prev
                        && p.wrapping_add(unit) != cur
                    {
                        return err(format!("{cur} does not follow {p}"));
                    }
                }
                HintOp::MaxConstancy(_) => {
                    if !pos.is_multiple_of(n)
                        && let Some(p) = prev
                        && p != cur
                    {
                        return err(format!("{cur} differs from {p}"));
                    }
                }
                HintOp::MultipleOf(_) => {
                    let run_start = prev.is_none_or(|p| p.wrapping_add(unit) != cur);
                    if run_start && cur.rem_euclid(n as i64) != 0 {
                        let what = if x.elem.is_ptr() {
                            format!(
                                "the pointer at byte offset {} is not a multiple of {n}",
                                super::memory::byte_offset(cur)
                            )
                        } else {
                            format!("{cur} (the start of a run) is not a multiple of {n}")
                        };
                        return err(what);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks a device assertion: every element of `cond` must be true.
pub(crate) fn check_assert(cond: &Tile, message: &str) -> Result<(), String> {
    let v = cond.ints()?;
    let failed = v.iter().filter(|&&c| c == 0).count();
    match v.iter().position(|&c| c == 0) {
        None => Ok(()),
        Some(lane) => Err(format!(
            "device assertion failed: {message} ({failed} of {} element(s) false, first at {})",
            v.len(),
            lane_str(&cond.shape, lane)
        )),
    }
}

/// Formats the operands of a `print` for program `pid`, one line per operand.
pub(crate) fn format_print(prefix: &str, pid: [u32; 3], vals: &[&Tile]) -> String {
    let mut s = String::new();
    if vals.is_empty() {
        let _ = writeln!(s, "pid ({}, {}, {}) {prefix}", pid[0], pid[1], pid[2]);
    }
    for (i, t) in vals.iter().enumerate() {
        let _ = write!(s, "pid ({}, {}, {}) {prefix}", pid[0], pid[1], pid[2]);
        if vals.len() > 1 {
            let _ = write!(s, " #{i}");
        }
        let _ = write!(s, " {}", t.elem);
        if !t.shape.is_empty() {
            let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
            let _ = write!(s, "[{}]", dims.join("x"));
        }
        let _ = write!(s, ": ");
        if t.shape.is_empty() {
            let _ = writeln!(s, "{}", fmt_value(t, 0));
        } else {
            let elems: Vec<String> = (0..t.len()).map(|i| fmt_value(t, i)).collect();
            let _ = writeln!(s, "[{}]", elems.join(", "));
        }
    }
    s
}

/// One element for `print`: integers and booleans exactly, floats shortest
/// round-trip, pointers as hexadecimal addresses.
fn fmt_value(t: &Tile, i: usize) -> String {
    match &*t.data {
        Data::Int(v) if t.elem.is_ptr() => v.get(i).map_or("?".into(), |a| format!("0x{a:x}")),
        Data::Int(v) if t.dtype().is_bool() => v.get(i).map_or("?".into(), |&b| (b != 0).to_string()),
        data => data.fmt_elem(i),
    }
}
