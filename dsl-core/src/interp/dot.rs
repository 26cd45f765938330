//! `dot a, b, acc`: `acc + a @ b` for 2-D tiles.
//!
//! What the interpreter computes (the oracle the GPU path is compared with):
//! - float inputs (f16, bf16, f32; f32 rounded to tf32 first when the op asks
//!   for tf32 precision, ties away from zero as `cvt.rna.tf32` does): every
//!   product is exact in f64, each row of `a @ b` is accumulated in f64, added
//!   to the f32 accumulator in f64 and rounded to f32 once. The GPU rounds
//!   after every MMA step instead, so it may differ by a few f32 ulps per
//!   K-step; compare with a tolerance.
//! - i8 inputs with an i32 accumulator: exact integer products and sums; a
//!   result outside the i32 range is an overflow error, like signed `add`.
//!
//! The float kernel takes two rows of `a` and a strip of 8 columns of `b` at a
//! time and keeps the 16 sums in registers over the whole K loop (the compiler
//! vectorizes the strip), so every loaded element of `b` feeds two products.

use super::tile::{Data, Tile, internal, lane_str, round_tf32};
use crate::ir::ops::DotPrecision;

/// Columns accumulated together in registers.
const W: usize = 8;

/// `acc + a @ b`.
pub(crate) fn dot(a: &Tile, b: &Tile, acc: &Tile, precision: DotPrecision) -> Result<Tile, String> {
    let (&[m, k], &[k2, n], &[m2, n2]) = (a.shape.as_slice(), b.shape.as_slice(), acc.shape.as_slice())
    else {
        return Err(internal("`dot` operands must be 2-D".into()));
    };
    if k != k2 || m != m2 || n != n2 || a.len() != m * k || b.len() != k * n || acc.len() != m * n {
        return Err(internal("`dot` shapes do not match".into()));
    }
    let data = match (&*a.data, &*b.data, &*acc.data) {
        (Data::F32(x), Data::F32(y), Data::F32(c)) => {
            let tf32 = precision == DotPrecision::Tf32 && a.dtype() == crate::DType::F32;
            let conv = |v: &f32| if tf32 { round_tf32(*v) as f64 } else { *v as f64 };
            let af: Vec<f64> = x.iter().map(conv).collect();
            let bf: Vec<f64> = y.iter().map(conv).collect();
            let mut out = vec![0.0f32; m * n];
            for i in (0..m).step_by(2) {
                // Two rows at a time share every load of `b`.
                let rows = if i + 1 < m { 2 } else { 1 };
                let a0 = &af[i * k..(i + 1) * k];
                let a1 = &af[(i + rows - 1) * k..(i + rows) * k];
                let mut emit = |row: usize, j: usize, sums: &[f64]| {
                    let base = (i + row) * n + j;
                    for (t, &s) in sums.iter().enumerate() {
                        out[base + t] = (c[base + t] as f64 + s) as f32;
                    }
                };
                let mut j = 0;
                // Strips of W columns accumulate in registers over the whole K loop.
                while j + W <= n {
                    let (mut s0, mut s1) = ([0.0f64; W], [0.0f64; W]);
                    for ((brow, &p), &q) in bf.chunks_exact(n).zip(a0).zip(a1) {
                        let b = &brow[j..j + W];
                        for t in 0..W {
                            s0[t] += p * b[t];
                            s1[t] += q * b[t];
                        }
                    }
                    emit(0, j, &s0);
                    if rows == 2 {
                        emit(1, j, &s1);
                    }
                    j += W;
                }
                for jj in j..n {
                    let (mut s0, mut s1) = (0.0f64, 0.0f64);
                    for ((brow, &p), &q) in bf.chunks_exact(n).zip(a0).zip(a1) {
                        s0 += p * brow[jj];
                        s1 += q * brow[jj];
                    }
                    emit(0, jj, &[s0]);
                    if rows == 2 {
                        emit(1, jj, &[s1]);
                    }
                }
            }
            Data::F32(out)
        }
        (Data::Int(x), Data::Int(y), Data::Int(c)) => {
            let mut out = Vec::with_capacity(m * n);
            let mut row = vec![0i64; n];
            for i in 0..m {
                row.fill(0);
                for (kk, &av) in x[i * k..(i + 1) * k].iter().enumerate() {
                    // |a*b| <= 2^14 and K is far below 2^40, so i64 cannot overflow.
                    for (r, &bv) in row.iter_mut().zip(&y[kk * n..(kk + 1) * n]) {
                        *r = r.wrapping_add(av.wrapping_mul(bv));
                    }
                }
                for (j, (&cv, &r)) in c[i * n..(i + 1) * n].iter().zip(&row).enumerate() {
                    let v = cv.saturating_add(r);
                    if i32::try_from(v).is_err() {
                        return Err(format!(
                            "i32 overflow in `dot`: the accumulator {cv} plus the product sum {r} does not \
                             fit in i32 (at {})",
                            lane_str(&acc.shape, i * n + j)
                        ));
                    }
                    out.push(v);
                }
            }
            Data::Int(out)
        }
        _ => return Err(internal("`dot` operand storage".into())),
    };
    Ok(Tile::new(acc.elem, acc.shape.clone(), data))
}
