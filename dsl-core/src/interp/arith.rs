//! Elementwise ops: binary and unary arithmetic and math, `fma`, `addptr`,
//! comparisons and `select`.
//!
//! Every op runs one loop over typed slices with the dtype dispatch hoisted out
//! of it. Semantics follow `ir/ops/arith.rs` and `ir/ops/compare.rs`:
//! - floats are computed in f32 (f16/bf16/f32 storage) or f64 and rounded to
//!   their dtype after every op; basic ops (`+ - * /`, `sqrt`) on halves are
//!   computed in f32 and rounded once more, which is exact (f32 has more than
//!   twice their precision plus two bits); transcendentals are computed in f64
//!   and rounded once (see `tile::narrow_f64`);
//! - signed integer `add`/`sub`/`mul`/`div`/`neg`/`abs` overflow is an error,
//!   unsigned arithmetic wraps; division and remainder by zero are errors;
//! - shift amounts are clamped to the bit width (negative amounts count as
//!   huge, as the unsigned PTX shift operand does);
//! - float `min`/`max` return the non-NaN operand.
//!
//! Invariant: operands have equal lengths, except that a one-element operand is
//! broadcast (this only happens inside vectorized combine regions); the result
//! takes the longer operand's shape.

use super::memory::region_of;
use super::tile::{Data, Tile, expand, internal, lane_str, narrow_f64, round_f32_slice};
use crate::dtype::{DType, Shape};
use crate::ir::ops::{BinaryOp, CmpPred, UnaryOp};

/// Maps two slices elementwise, broadcasting a one-element side.
pub(crate) fn zip_map<A: Copy, B: Copy, R>(a: &[A], b: &[B], mut f: impl FnMut(A, B) -> R) -> Vec<R> {
    if a.len() == b.len() {
        a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
    } else if a.len() == 1 {
        let x = a[0];
        b.iter().map(|&y| f(x, y)).collect()
    } else {
        let y = b.first().copied();
        match y {
            Some(y) => a.iter().map(|&x| f(x, y)).collect(),
            None => Vec::new(),
        }
    }
}

/// The result shape and length of an elementwise op over `tiles`, or an internal
/// error when lengths are incompatible.
fn out_shape(tiles: &[&Tile]) -> Result<(Shape, usize), String> {
    let longest = tiles.iter().max_by_key(|t| t.len()).ok_or_else(|| internal("no operands".into()))?;
    let n = longest.len();
    if tiles.iter().any(|t| t.len() != n && t.len() != 1) {
        return Err(internal("elementwise operands of different lengths".into()));
    }
    Ok((longest.shape.clone(), n))
}

/// The index into a possibly broadcast (one-element) slice of length `len`.
fn at(len: usize, lane: usize) -> usize {
    if len == 1 { 0 } else { lane }
}

/// Wraps integers to `d` in place (two's complement; `i1` keeps bit 0).
pub(crate) fn wrap_all(d: DType, v: &mut [i64]) {
    match d {
        DType::I64 => {}
        DType::I8 => v.iter_mut().for_each(|x| *x = *x as i8 as i64),
        DType::U8 => v.iter_mut().for_each(|x| *x = *x as u8 as i64),
        DType::I16 => v.iter_mut().for_each(|x| *x = *x as i16 as i64),
        DType::I32 => v.iter_mut().for_each(|x| *x = *x as i32 as i64),
        DType::U32 => v.iter_mut().for_each(|x| *x = *x as u32 as i64),
        DType::I1 => v.iter_mut().for_each(|x| *x &= 1),
        _ => {}
    }
}

/// The advice appended to an overflow message.
fn overflow_advice(d: DType) -> &'static str {
    if d == DType::I32 { "use i64 offsets" } else { "use a wider integer type" }
}

/// `a op b` for integers with overflow checking: `f` returns the i64 result and
/// whether i64 itself overflowed; results outside `d`'s range are errors for
/// signed dtypes and wrap for unsigned ones.
fn checked(
    op: BinaryOp,
    d: DType,
    (a, b): (&[i64], &[i64]),
    shape: &[usize],
    sym: &str,
    f: impl Fn(i64, i64) -> (i64, bool),
) -> Result<Vec<i64>, String> {
    let (lo, hi) = d.int_range().unwrap_or((i64::MIN, i64::MAX));
    let mut bad = false;
    let mut out = zip_map(a, b, |x, y| {
        let (v, o) = f(x, y);
        bad |= o | (v < lo) | (v > hi);
        v
    });
    if bad {
        if !d.is_signed_int() {
            wrap_all(d, &mut out);
            return Ok(out);
        }
        for lane in 0..out.len() {
            let (x, y) = (a[at(a.len(), lane)], b[at(b.len(), lane)]);
            let (v, o) = f(x, y);
            if o || v < lo || v > hi {
                let exact = match op {
                    BinaryOp::Add => (x as i128 + y as i128).to_string(),
                    BinaryOp::Sub => (x as i128 - y as i128).to_string(),
                    BinaryOp::Mul => (x as i128 * y as i128).to_string(),
                    BinaryOp::Div if y != 0 => (x as i128 / y as i128).to_string(),
                    _ => "?".to_string(),
                };
                return Err(format!(
                    "{d} overflow in `{}`: {x} {sym} {y} = {exact} does not fit in {d} (at {}); {}",
                    op.name(),
                    lane_str(shape, lane),
                    overflow_advice(d)
                ));
            }
        }
    }
    Ok(out)
}

/// The shift amount clamped to `bits` (negative amounts count as huge).
fn shift_amount(y: i64, bits: u32) -> u32 {
    if y < 0 || y >= i64::from(bits) { bits } else { y as u32 }
}

/// `a op b` for integers of dtype `d` (see the module doc for the rules).
fn int_binary(op: BinaryOp, d: DType, a: &[i64], b: &[i64], shape: &[usize]) -> Result<Vec<i64>, String> {
    let bits = d.bits();
    let signed = d.is_signed_int();
    Ok(match op {
        BinaryOp::Add => checked(op, d, (a, b), shape, "+", i64::overflowing_add)?,
        BinaryOp::Sub => checked(op, d, (a, b), shape, "-", i64::overflowing_sub)?,
        BinaryOp::Mul => checked(op, d, (a, b), shape, "*", i64::overflowing_mul)?,
        BinaryOp::Div | BinaryOp::Rem => {
            if let Some(lane) = (0..a.len().max(b.len())).find(|&l| b[at(b.len(), l)] == 0) {
                return Err(format!(
                    "integer division by zero in `{}`: {} {} 0 (at {})",
                    op.name(),
                    a[at(a.len(), lane)],
                    if op == BinaryOp::Div { "/" } else { "%" },
                    lane_str(shape, lane)
                ));
            }
            if op == BinaryOp::Div {
                checked(op, d, (a, b), shape, "/", i64::overflowing_div)?
            } else {
                zip_map(a, b, i64::wrapping_rem)
            }
        }
        BinaryOp::Min => zip_map(a, b, i64::min),
        BinaryOp::Max => zip_map(a, b, i64::max),
        BinaryOp::And => zip_map(a, b, |x, y| x & y),
        BinaryOp::Or => zip_map(a, b, |x, y| x | y),
        BinaryOp::Xor => zip_map(a, b, |x, y| x ^ y),
        BinaryOp::Shl => {
            let mut v = zip_map(a, b, |x, y| {
                let s = shift_amount(y, bits);
                if s >= 64 { 0 } else { ((x as u64) << s) as i64 }
            });
            wrap_all(d, &mut v);
            v
        }
        BinaryOp::Shr => {
            if signed {
                zip_map(a, b, |x, y| x >> shift_amount(y, bits).min(63))
            } else {
                zip_map(a, b, |x, y| {
                    let s = shift_amount(y, bits);
                    if s >= 64 { 0 } else { ((x as u64) >> s) as i64 }
                })
            }
        }
        BinaryOp::MulHi => {
            let mut v = zip_map(a, b, |x, y| ((x as i128 * y as i128) >> bits) as i64);
            wrap_all(d, &mut v);
            v
        }
        BinaryOp::Pow => return Err(internal(format!("`pow` on {d}"))),
    })
}

macro_rules! float_binary {
    ($name:ident, $t:ty) => {
        fn $name(op: BinaryOp, a: &[$t], b: &[$t]) -> Result<Vec<$t>, String> {
            Ok(match op {
                BinaryOp::Add => zip_map(a, b, |x, y| x + y),
                BinaryOp::Sub => zip_map(a, b, |x, y| x - y),
                BinaryOp::Mul => zip_map(a, b, |x, y| x * y),
                BinaryOp::Div => zip_map(a, b, |x, y| x / y),
                BinaryOp::Rem => zip_map(a, b, |x, y| x % y),
                // `min`/`max` of Rust floats return the non-NaN operand.
                BinaryOp::Min => zip_map(a, b, <$t>::min),
                BinaryOp::Max => zip_map(a, b, <$t>::max),
                _ => return Err(internal(format!("`{}` on floats", op.name()))),
            })
        }
    };
}
float_binary!(f32_binary, f32);
float_binary!(f64_binary, f64);

/// `a op b` elementwise.
pub(crate) fn binary(op: BinaryOp, a: &Tile, b: &Tile) -> Result<Tile, String> {
    let (shape, _) = out_shape(&[a, b])?;
    let d = a.dtype();
    let data = match (&*a.data, &*b.data) {
        (Data::Int(x), Data::Int(y)) => Data::Int(int_binary(op, d, x, y, &shape)?),
        (Data::F32(x), Data::F32(y)) => {
            if op == BinaryOp::Pow {
                Data::F32(zip_map(x, y, |p, q| narrow_f64(d, (p as f64).powf(q as f64))))
            } else {
                let mut v = f32_binary(op, x, y)?;
                round_f32_slice(d, &mut v);
                Data::F32(v)
            }
        }
        (Data::F64(x), Data::F64(y)) => {
            if op == BinaryOp::Pow {
                Data::F64(zip_map(x, y, f64::powf))
            } else {
                Data::F64(f64_binary(op, x, y)?)
            }
        }
        _ => return Err(internal(format!("`{}` operands of different storage", op.name()))),
    };
    Ok(Tile::new(a.elem, shape, data))
}

/// A transcendental (or other float-only) unary function, computed in f64.
fn float_fn(op: UnaryOp) -> Option<fn(f64) -> f64> {
    Some(match op {
        UnaryOp::Exp => f64::exp,
        UnaryOp::Exp2 => f64::exp2,
        UnaryOp::Log => f64::ln,
        UnaryOp::Log2 => f64::log2,
        UnaryOp::Sqrt => f64::sqrt,
        UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
        UnaryOp::Sin => f64::sin,
        UnaryOp::Cos => f64::cos,
        UnaryOp::Tanh => f64::tanh,
        UnaryOp::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Erf => erf,
        _ => return None,
    })
}

/// `op` on every lane of the float vector `$x`, wrapped in `$data`, when
/// it is exact in every float type (neg, abs, floor, ceil: no rounding, so
/// f32 and f64 lanes alike); `None` for the other ops.
macro_rules! exact_float_unary {
    ($op:expr, $x:expr, $data:path) => {
        match $op {
            UnaryOp::Neg => Some($data($x.iter().map(|&v| -v).collect())),
            UnaryOp::Abs => Some($data($x.iter().map(|&v| v.abs()).collect())),
            UnaryOp::Floor => Some($data($x.iter().map(|&v| v.floor()).collect())),
            UnaryOp::Ceil => Some($data($x.iter().map(|&v| v.ceil()).collect())),
            _ => None,
        }
    };
}

/// `op a` elementwise.
pub(crate) fn unary(op: UnaryOp, a: &Tile) -> Result<Tile, String> {
    let d = a.dtype();
    let data = match &*a.data {
        Data::Int(x) => {
            let (lo, hi) = d.int_range().unwrap_or((i64::MIN, i64::MAX));
            let mut v: Vec<i64> = match op {
                UnaryOp::Neg => x.iter().map(|&v| v.wrapping_neg()).collect(),
                UnaryOp::Not => x.iter().map(|&v| !v).collect(),
                UnaryOp::Abs => x.iter().map(|&v| v.wrapping_abs()).collect(),
                _ => return Err(internal(format!("`{}` on {d}", op.name()))),
            };
            if op != UnaryOp::Not && d.is_signed_int() {
                // Only the most negative value overflows `neg` and `abs`.
                if let Some(lane) = x.iter().position(|&v| v == lo) {
                    return Err(format!(
                        "{d} overflow in `{}`: the result for {lo} is {} which does not fit in {d} (at {}); {}",
                        op.name(),
                        -(lo as i128),
                        lane_str(&a.shape, lane),
                        overflow_advice(d)
                    ));
                }
            } else if v.iter().any(|&r| r < lo || r > hi) {
                wrap_all(d, &mut v);
            }
            Data::Int(v)
        }
        Data::F32(x) => match exact_float_unary!(op, x, Data::F32) {
            Some(r) => r,
            None => {
                let f = float_fn(op).ok_or_else(|| internal(format!("`{}` on {d}", op.name())))?;
                if d == DType::F32 {
                    Data::F32(x.iter().map(|&v| f(v as f64) as f32).collect())
                } else {
                    Data::F32(x.iter().map(|&v| narrow_f64(d, f(v as f64))).collect())
                }
            }
        },
        Data::F64(x) => match exact_float_unary!(op, x, Data::F64) {
            Some(r) => r,
            None => {
                let f = float_fn(op).ok_or_else(|| internal(format!("`{}` on {d}", op.name())))?;
                Data::F64(x.iter().map(|&v| f(v)).collect())
            }
        },
    };
    Ok(Tile::new(a.elem, a.shape.clone(), data))
}

/// `a * b + c` with one rounding.
pub(crate) fn fma(a: &Tile, b: &Tile, c: &Tile) -> Result<Tile, String> {
    let (shape, n) = out_shape(&[a, b, c])?;
    let d = a.dtype();
    let data = match (&*a.data, &*b.data, &*c.data) {
        (Data::F32(x), Data::F32(y), Data::F32(z)) => {
            let (x, y, z) = (expand(x, n), expand(y, n), expand(z, n));
            let it = x.iter().zip(y.iter()).zip(z.iter());
            if d == DType::F32 {
                Data::F32(it.map(|((&p, &q), &r)| p.mul_add(q, r)).collect())
            } else {
                Data::F32(
                    it.map(|((&p, &q), &r)| narrow_f64(d, (p as f64).mul_add(q as f64, r as f64))).collect(),
                )
            }
        }
        (Data::F64(x), Data::F64(y), Data::F64(z)) => {
            let (x, y, z) = (expand(x, n), expand(y, n), expand(z, n));
            Data::F64(x.iter().zip(y.iter()).zip(z.iter()).map(|((&p, &q), &r)| p.mul_add(q, r)).collect())
        }
        _ => return Err(internal(format!("`fma` on {d}"))),
    };
    Ok(Tile::new(a.elem, shape, data))
}

/// `c + sum_{i<4} byte_i(a) * byte_i(b)` elementwise; bytes of `i32`
/// operands are signed, of `u32` operands unsigned; the sum wraps to `c`'s
/// dtype (see `ArithOp::Dp4a`).
pub(crate) fn dp4a(a: &Tile, b: &Tile, c: &Tile) -> Result<Tile, String> {
    let (shape, n) = out_shape(&[a, b, c])?;
    let (sa, sb) = (a.dtype() == DType::I32, b.dtype() == DType::I32);
    let d = c.dtype();
    let byte = |w: i64, i: u32, signed: bool| -> i64 {
        let v = (w as u32 >> (8 * i)) & 0xff;
        if signed { i64::from(v as u8 as i8) } else { i64::from(v) }
    };
    let data = match (&*a.data, &*b.data, &*c.data) {
        (Data::Int(x), Data::Int(y), Data::Int(z)) => {
            let (x, y, z) = (expand(x, n), expand(y, n), expand(z, n));
            let mut out: Vec<i64> = x
                .iter()
                .zip(y.iter())
                .zip(z.iter())
                .map(|((&p, &q), &r)| r + (0..4).map(|i| byte(p, i, sa) * byte(q, i, sb)).sum::<i64>())
                .collect();
            wrap_all(d, &mut out);
            Data::Int(out)
        }
        _ => return Err(internal(format!("`dp4a` on {}", a.dtype()))),
    };
    Ok(Tile::new(c.elem, shape, data))
}

/// `p + off * sizeof(pointee)`; refuses offsets that leave the buffer's address
/// region (more than 2^43 bytes), which no real offset does.
pub(crate) fn addptr(p: &Tile, off: &Tile) -> Result<Tile, String> {
    let (shape, _) = out_shape(&[p, off])?;
    let size = p.dtype().size_bytes() as i64;
    let (pv, ov) = (p.ints()?, off.ints()?);
    // Offsets below 2^40 elements move a pointer by less than 2^43 bytes, which
    // cannot overflow (addresses stay below 2^63 - 2^44), so the common case is
    // a plain vectorizable loop followed by one region check.
    if ov.iter().fold(0u64, |m, &o| m.max(o.unsigned_abs())) < 1 << 40 {
        let out = zip_map(pv, ov, |a, o| a.wrapping_add(o.wrapping_mul(size)));
        let moved = if pv.len() == out.len() {
            out.iter().zip(pv).fold(0, |acc, (&r, &a)| acc | (region_of(r) ^ region_of(a)))
        } else {
            out.iter().fold(0, |acc, &r| acc | (region_of(r) ^ region_of(pv[0])))
        };
        if moved == 0 {
            return Ok(Tile::new(p.elem, shape, Data::Int(out)));
        }
    }
    let step = |a: i64, o: i64| -> (i64, bool) {
        let (bytes, o1) = o.overflowing_mul(size);
        let (r, o2) = a.overflowing_add(bytes);
        (r, o1 | o2 | (region_of(r) != region_of(a)))
    };
    let n = pv.len().max(ov.len());
    let lane = (0..n).find(|&l| step(pv[at(pv.len(), l)], ov[at(ov.len(), l)]).1).unwrap_or(0);
    Err(format!(
        "pointer offset {} (x {size} bytes) at {} moves the pointer out of its buffer's address range; \
         no buffer is that large",
        ov[at(ov.len(), lane)],
        lane_str(&shape, lane)
    ))
}

/// Compares two slices elementwise with `pred`, giving 0 or 1 per lane.
fn cmp_slices<T: Copy + PartialOrd>(pred: CmpPred, a: &[T], b: &[T]) -> Vec<i64> {
    match pred {
        CmpPred::Eq => zip_map(a, b, |x, y| (x == y) as i64),
        CmpPred::Ne => zip_map(a, b, |x, y| (x != y) as i64),
        CmpPred::Lt => zip_map(a, b, |x, y| (x < y) as i64),
        CmpPred::Le => zip_map(a, b, |x, y| (x <= y) as i64),
        CmpPred::Gt => zip_map(a, b, |x, y| (x > y) as i64),
        CmpPred::Ge => zip_map(a, b, |x, y| (x >= y) as i64),
    }
}

/// `cmp pred a, b`: an `i1` tile (floats compare ordered; NaN is unequal to all).
pub(crate) fn cmp(pred: CmpPred, a: &Tile, b: &Tile) -> Result<Tile, String> {
    let (shape, _) = out_shape(&[a, b])?;
    let v = match (&*a.data, &*b.data) {
        (Data::Int(x), Data::Int(y)) => cmp_slices(pred, x, y),
        (Data::F32(x), Data::F32(y)) => cmp_slices(pred, x, y),
        (Data::F64(x), Data::F64(y)) => cmp_slices(pred, x, y),
        _ => return Err(internal("`cmp` operands of different storage".into())),
    };
    Ok(Tile::new(crate::dtype::Elem::Scalar(DType::I1), shape, Data::Int(v)))
}

/// Picks `a` where `c` is non-zero and `b` elsewhere.
fn select_slices<T: Copy>(c: &[i64], a: &[T], b: &[T], n: usize) -> Vec<T> {
    let (c, a, b) = (expand(c, n), expand(a, n), expand(b, n));
    c.iter().zip(a.iter()).zip(b.iter()).map(|((&c, &x), &y)| if c != 0 { x } else { y }).collect()
}

/// `select c, a, b`.
pub(crate) fn select(c: &Tile, a: &Tile, b: &Tile) -> Result<Tile, String> {
    let (shape, n) = out_shape(&[c, a, b])?;
    let cv = c.ints()?;
    let data = match (&*a.data, &*b.data) {
        (Data::Int(x), Data::Int(y)) => Data::Int(select_slices(cv, x, y, n)),
        (Data::F32(x), Data::F32(y)) => Data::F32(select_slices(cv, x, y, n)),
        (Data::F64(x), Data::F64(y)) => Data::F64(select_slices(cv, x, y, n)),
        _ => return Err(internal("`select` branches of different storage".into())),
    };
    Ok(Tile::new(a.elem, shape, data))
}

/// The error function, to about 1e-15 relative error: a Taylor series with
/// positive terms (no cancellation) below |x| = 3, the continued fraction of
/// erfc above. Public so that compiled host code calls this very function
/// and computes the interpreter's values.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    if ax >= 6.0 {
        return 1.0f64.copysign(x);
    }
    let two_over_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI;
    if ax < 3.0 {
        // erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n (2x^2)^n x / (1*3*...*(2n+1)).
        let x2 = ax * ax;
        let (mut term, mut sum, mut n) = (ax, ax, 0.0);
        while term > sum * 1e-17 {
            n += 1.0;
            term *= 2.0 * x2 / (2.0 * n + 1.0);
            sum += term;
        }
        return (two_over_sqrt_pi * (-x2).exp() * sum).copysign(x);
    }
    // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + 1/2/(x + 1/(x + 3/2/(x + ...)))),
    // evaluated bottom-up with enough terms for x >= 3.
    let mut f = ax;
    for k in (1..=60).rev() {
        f = ax + (k as f64 / 2.0) / f;
    }
    let erfc = (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * f);
    (1.0 - erfc).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
            (-1.0, -0.842_700_792_949_714_9),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {} vs {want}", erf(x));
        }
    }
}
