//! Transfer rules of the axis analysis for elementwise integer arithmetic
//! (`add`/`addptr`, `sub`, `mul`, `div`, `rem`, `shl`, `shr`), kept apart from
//! the traversal in `axis.rs`.
//!
//! Invariant: each rule only claims what holds for every input satisfying the
//! operands' facts (see the parent module for the meaning of the facts and the
//! no-signed-overflow assumption); operands have the result's shape.

use super::{AxisInfo, MAX_DIVISIBILITY, gcd, mul_div, pow2_divisor};
use crate::dtype::{DType, Type};

/// No facts except constancy, which every elementwise op keeps (equal inputs
/// give equal outputs). `ins` have the shape of `out`.
pub(super) fn elementwise(out: &Type, ins: &[&AxisInfo]) -> AxisInfo {
    let mut info = AxisInfo::unknown(out.rank());
    for d in 0..info.len() {
        info.constancy[d] = ins.iter().map(|a| a.constancy.get(d).copied().unwrap_or(1)).fold(0, gcd).max(1);
    }
    info
}

/// `a + b`, or `addptr a, b` with `e`-byte elements (`e = 1` for integers).
pub(super) fn add(a: &AxisInfo, b: &AxisInfo, e: u64) -> AxisInfo {
    let mut info = AxisInfo::unknown(a.len());
    for d in 0..a.len() {
        // A run plus a constant stretch is a run.
        let c = gcd(a.contiguity[d], b.constancy[d]).max(gcd(a.constancy[d], b.contiguity[d]));
        info.contiguity[d] = c;
        info.divisibility[d] = gcd(a.div_at(d, c), mul_div(b.div_at(d, c), e));
        info.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
    }
    info
}

/// `a - b`.
pub(super) fn sub(a: &AxisInfo, b: &AxisInfo) -> AxisInfo {
    let mut info = AxisInfo::unknown(a.len());
    for d in 0..a.len() {
        let c = gcd(a.contiguity[d], b.constancy[d]);
        info.contiguity[d] = c;
        info.divisibility[d] = gcd(a.div_at(d, c), b.div_at(d, c));
        // A run minus a run of the same alignment is constant.
        let runs = if a.contiguity[d] > 1 && b.contiguity[d] > 1 {
            gcd(a.contiguity[d], b.contiguity[d])
        } else {
            1
        };
        info.constancy[d] = gcd(a.constancy[d], b.constancy[d]).max(runs);
    }
    info
}

/// `a * b`.
pub(super) fn mul(a: &AxisInfo, b: &AxisInfo, out: &Type) -> AxisInfo {
    if b.constant == Some(1) {
        return a.clone();
    }
    if a.constant == Some(1) {
        return b.clone();
    }
    let mut info = elementwise(out, &[a, b]);
    let v = mul_div(a.all_divisibility(), b.all_divisibility());
    info.divisibility.iter_mut().for_each(|x| *x = v);
    info
}

/// Windows of `g` (a power of two) elements of `a` along `d` that stay inside
/// one block of a floor division by a multiple of `g`: runs of `a` whose
/// starts are multiples of `g`. Returns the window length, or 1.
fn floor_window(a: &AxisInfo, d: usize, g: u64) -> u64 {
    if a.contiguity[d] == 1 { 1 } else { a.contiguity[d].min(a.divisibility[d]).min(g) }
}

/// `a / b`, constant positive `b` only; `a_pos` when `a` is known `>= 0`.
pub(super) fn div(a: &AxisInfo, b: &AxisInfo, a_pos: bool, out: &Type) -> AxisInfo {
    let mut info = elementwise(out, &[a, b]);
    let Some(q) = b.constant.filter(|&q| q > 0) else { return info };
    if q == 1 {
        return a.clone();
    }
    let p2 = pow2_divisor(q);
    for d in 0..info.len() {
        if a_pos {
            info.constancy[d] = info.constancy[d].max(floor_window(a, d, p2));
        }
    }
    // Exact division by a power of two divides the divisibility.
    let all = a.all_divisibility();
    if p2 == q as u64 && all >= p2 {
        info.divisibility.iter_mut().for_each(|x| *x = all / p2);
    }
    info
}

/// `a % b`, constant positive `b` only.
pub(super) fn rem(a: &AxisInfo, b: &AxisInfo, a_pos: bool, out: &Type) -> AxisInfo {
    let mut info = elementwise(out, &[a, b]);
    let Some(q) = b.constant.filter(|&q| q > 0) else { return info };
    let p2 = pow2_divisor(q);
    if q == 1 || (p2 == q as u64 && a.all_divisibility() >= p2) {
        return AxisInfo::splat_int(out, 0);
    }
    for d in 0..info.len() {
        let c = if a_pos { floor_window(a, d, p2) } else { 1 };
        info.contiguity[d] = c;
        info.divisibility[d] = gcd(a.div_at(d, c), p2);
    }
    info
}

/// `a << b`, constant `b` only.
pub(super) fn shl(a: &AxisInfo, b: &AxisInfo, d: DType, out: &Type) -> AxisInfo {
    let mut info = elementwise(out, &[a, b]);
    let Some(s) = b.constant.filter(|&s| s >= 0) else { return info };
    if s == 0 {
        return a.clone();
    }
    if s >= i64::from(d.bits()) {
        return AxisInfo::splat_int(out, 0);
    }
    let v = mul_div(a.all_divisibility(), if s >= 30 { MAX_DIVISIBILITY } else { 1 << s });
    info.divisibility.iter_mut().for_each(|x| *x = v);
    info
}

/// `a >> b`, constant `b` only: floor division by `2^b` for both signednesses.
pub(super) fn shr(a: &AxisInfo, b: &AxisInfo, d: DType, out: &Type) -> AxisInfo {
    let mut info = elementwise(out, &[a, b]);
    let Some(s) = b.constant.filter(|&s| s >= 0 && s < i64::from(d.bits())) else { return info };
    if s == 0 {
        return a.clone();
    }
    let p = if s >= 62 { 1u64 << 62 } else { 1u64 << s };
    for k in 0..info.len() {
        info.constancy[k] = info.constancy[k].max(floor_window(a, k, p));
    }
    let all = a.all_divisibility();
    if all >= p {
        info.divisibility.iter_mut().for_each(|x| *x = all / p);
    }
    info
}
