//! Reductions and scans along one axis: the built-in kinds, and the drivers of
//! custom combine regions.
//!
//! A tile is viewed as `[outer, n, inner]` around the axis. Built-in kinds run
//! loops over that view with the accumulator row innermost:
//! - `sum` of floats accumulates in f64 and rounds to the dtype once per result
//!   (scans: once per output element); integer sums are exact (i128) and a
//!   signed result outside the dtype is an overflow error, unsigned wraps;
//! - `max`/`min` ignore NaN unless every element is NaN;
//! - `argmax`/`argmin` return the `i32` index; ties pick the smallest index and
//!   NaN is ignored unless every element is NaN (then the index is 0).
//!
//! Custom combines run the region on whole slices at a time (the executor
//! decides whether the region can run vectorized or lane by lane): reductions
//! combine adjacent pairs in a tree (`log2 n` region runs; the order of the
//! operands is kept, so an associative, non-commutative combine is fine), and
//! scans use Hillis-Steele doubling (`log2 n` runs). The IR allows the GPU to
//! apply the combine in tree order, so both are faithful.
//!
//! Invariant: the reduced or scanned axis has a power-of-two length (verified
//! tile shapes), which the pairwise tree relies on.

use super::tile::{Data, Tile, internal, lane_str, map_data, narrow_f64, narrow_vec};
use crate::dtype::{DType, Elem, Shape};
use crate::ir::ops::{ReduceKind, ScanKind};

/// The `[outer, n, inner]` view of `shape` around `axis`.
fn split_axis(shape: &[usize], axis: usize) -> Result<(usize, usize, usize), String> {
    crate::dtype::split_axis(shape, axis)
        .ok_or_else(|| internal(format!("axis {axis} of a rank-{} tile", shape.len())))
}

/// Folds each `[o, :, i]` line of `x` with `f`, starting from the line's first element.
fn fold_lines<T: Copy>(x: &[T], (outer, n, inner): (usize, usize, usize), f: impl Fn(T, T) -> T) -> Vec<T> {
    if inner == 1 {
        // Contiguous lines (the last axis): one tight loop per line.
        return x.chunks_exact(n).map(|line| line[1..].iter().fold(line[0], |a, &v| f(a, v))).collect();
    }
    let mut acc = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = o * n * inner;
        acc.extend_from_slice(&x[base..base + inner]);
        let a = &mut acc[o * inner..(o + 1) * inner];
        for k in 1..n {
            let row = &x[base + k * inner..base + (k + 1) * inner];
            for (s, &v) in a.iter_mut().zip(row) {
                *s = f(*s, v);
            }
        }
    }
    acc
}

/// Index of the best element of each line (`better(v, best)` is strict, so ties
/// keep the smallest index; `skip` elements are ignored; none found -> 0).
fn arg_lines<T: Copy>(
    x: &[T],
    (outer, n, inner): (usize, usize, usize),
    skip: impl Fn(T) -> bool,
    better: impl Fn(T, T) -> bool,
) -> Vec<i64> {
    let mut idx = vec![-1i64; outer * inner];
    let mut best: Vec<Option<T>> = vec![None; outer * inner];
    for o in 0..outer {
        for k in 0..n {
            let row = &x[(o * n + k) * inner..(o * n + k + 1) * inner];
            for (i, &v) in row.iter().enumerate() {
                let j = o * inner + i;
                if skip(v) {
                    continue;
                }
                if best[j].is_none_or(|b| better(v, b)) {
                    best[j] = Some(v);
                    idx[j] = k as i64;
                }
            }
        }
    }
    idx.iter_mut().for_each(|i| *i = (*i).max(0));
    idx
}

/// Sums each line in f64.
fn sum_lines_f64<T: Copy>(
    x: &[T],
    (outer, n, inner): (usize, usize, usize),
    to: impl Fn(T) -> f64,
) -> Vec<f64> {
    if inner == 1 {
        // Contiguous lines: four partial sums per line let the loop pipeline.
        return x
            .chunks_exact(n)
            .map(|line| {
                let mut s = [0.0f64; 4];
                let mut it = line.chunks_exact(4);
                for c in &mut it {
                    for t in 0..4 {
                        s[t] += to(c[t]);
                    }
                }
                it.remainder().iter().fold((s[0] + s[1]) + (s[2] + s[3]), |a, &v| a + to(v))
            })
            .collect();
    }
    let mut acc = vec![0.0f64; outer * inner];
    for o in 0..outer {
        let a = &mut acc[o * inner..(o + 1) * inner];
        for k in 0..n {
            let row = &x[(o * n + k) * inner..(o * n + k + 1) * inner];
            for (s, &v) in a.iter_mut().zip(row) {
                *s += to(v);
            }
        }
    }
    acc
}

/// Checks integer results against `d`'s range: signed overflow is an error,
/// unsigned results wrap.
fn fit_ints(d: DType, vals: Vec<i128>, shape: &[usize], what: &str) -> Result<Vec<i64>, String> {
    let (lo, hi) = d.int_range().unwrap_or((i64::MIN, i64::MAX));
    let mut out = Vec::with_capacity(vals.len());
    for (lane, &v) in vals.iter().enumerate() {
        if v < lo as i128 || v > hi as i128 {
            if d.is_signed_int() {
                let advice = if d == DType::I32 { "use i64" } else { "use a wider integer type" };
                return Err(format!(
                    "{d} overflow in `{what}`: the sum {v} does not fit in {d} (at {} of the result); {advice}",
                    lane_str(shape, lane)
                ));
            }
            out.push(d.wrap_int(v as i64));
        } else {
            out.push(v as i64);
        }
    }
    Ok(out)
}

/// A built-in reduction of `x` along `axis`.
pub(crate) fn reduce(x: &Tile, axis: usize, kind: ReduceKind) -> Result<Tile, String> {
    let dims = split_axis(&x.shape, axis)?;
    if dims.0 * dims.1 * dims.2 != x.len() || dims.1 == 0 {
        return Err(internal("`reduce` of a tile whose length does not match its shape".into()));
    }
    let mut shape = x.shape.clone();
    shape.remove(axis);
    let d = x.dtype();
    let (elem, data) = match kind {
        ReduceKind::Sum => (
            x.elem,
            match &*x.data {
                Data::F32(v) => Data::F32(narrow_vec(d, &sum_lines_f64(v, dims, |t| t as f64))),
                Data::F64(v) => Data::F64(sum_lines_f64(v, dims, |t| t)),
                Data::Int(v) => {
                    let wide: Vec<i128> = v.iter().map(|&t| t as i128).collect();
                    Data::Int(fit_ints(d, fold_lines(&wide, dims, |a, b| a + b), &shape, "reduce")?)
                }
            },
        ),
        ReduceKind::Max | ReduceKind::Min => {
            let max = kind == ReduceKind::Max;
            let data = match &*x.data {
                Data::F32(v) => Data::F32(fold_lines(v, dims, |a, b| if max { a.max(b) } else { a.min(b) })),
                Data::F64(v) => Data::F64(fold_lines(v, dims, |a, b| if max { a.max(b) } else { a.min(b) })),
                Data::Int(v) => Data::Int(fold_lines(v, dims, |a, b| if max { a.max(b) } else { a.min(b) })),
            };
            (x.elem, data)
        }
        ReduceKind::Argmax | ReduceKind::Argmin => {
            let max = kind == ReduceKind::Argmax;
            let idx = match &*x.data {
                Data::F32(v) => arg_lines(v, dims, f32::is_nan, |a, b| if max { a > b } else { a < b }),
                Data::F64(v) => arg_lines(v, dims, f64::is_nan, |a, b| if max { a > b } else { a < b }),
                Data::Int(v) => arg_lines(v, dims, |_| false, |a, b| if max { a > b } else { a < b }),
            };
            (Elem::Scalar(DType::I32), Data::Int(idx))
        }
        ReduceKind::Custom => return Err(internal("custom reduce without its region".into())),
    };
    Ok(Tile::new(elem, shape, data))
}

/// Runs `step(state, v)` along each line in scan order, writing each state.
fn scan_lines<T: Copy, S: Copy>(
    x: &[T],
    (outer, n, inner): (usize, usize, usize),
    reverse: bool,
    init: impl Fn(T) -> S,
    mut step: impl FnMut(S, T) -> S,
    mut emit: impl FnMut(usize, S),
) {
    let mut state: Vec<Option<S>> = vec![None; inner];
    for o in 0..outer {
        state.fill(None);
        for kk in 0..n {
            let k = if reverse { n - 1 - kk } else { kk };
            let base = (o * n + k) * inner;
            for (i, s) in state.iter_mut().enumerate() {
                let v = x[base + i];
                let next = match *s {
                    None => init(v),
                    Some(prev) => step(prev, v),
                };
                *s = Some(next);
                emit(base + i, next);
            }
        }
    }
}

/// A built-in inclusive scan of `x` along `axis`.
pub(crate) fn scan(x: &Tile, axis: usize, kind: ScanKind, reverse: bool) -> Result<Tile, String> {
    let dims = split_axis(&x.shape, axis)?;
    if dims.0 * dims.1 * dims.2 != x.len() {
        return Err(internal("`scan` of a tile whose length does not match its shape".into()));
    }
    let d = x.dtype();
    let len = x.len();
    let data = match (kind, &*x.data) {
        (ScanKind::Sum, Data::F32(v)) => {
            let mut out = vec![0.0f32; len];
            scan_lines(v, dims, reverse, |t| t as f64, |s, t| s + t as f64, |i, s| out[i] = narrow_f64(d, s));
            Data::F32(out)
        }
        (ScanKind::Sum, Data::F64(v)) => {
            let mut out = vec![0.0f64; len];
            scan_lines(v, dims, reverse, |t| t, |s, t| s + t, |i, s| out[i] = s);
            Data::F64(out)
        }
        (ScanKind::Sum, Data::Int(v)) => {
            let mut wide = vec![0i128; len];
            scan_lines(v, dims, reverse, |t| t as i128, |s, t| s + t as i128, |i, s| wide[i] = s);
            Data::Int(fit_ints(d, wide, &x.shape, "scan")?)
        }
        (ScanKind::Max | ScanKind::Min, data) => {
            let max = kind == ScanKind::Max;
            map_data!(data, v => {
                let mut out = v.clone();
                scan_lines(
                    v,
                    dims,
                    reverse,
                    |t| t,
                    |s, t| nan_aware_pick(s, t, max),
                    |i, s| out[i] = s,
                );
                out
            })
        }
        (ScanKind::Custom, _) => return Err(internal("custom scan without its region".into())),
    };
    Ok(Tile::new(x.elem, x.shape.clone(), data))
}

/// `max(a, b)` or `min(a, b)` returning the non-NaN operand when one is NaN
/// (`b != b` is only true for NaN; integers never take that branch).
#[allow(clippy::eq_op)]
fn nan_aware_pick<T: Copy + PartialOrd>(a: T, b: T, max: bool) -> T {
    if b != b {
        return a;
    }
    if a != a {
        return b;
    }
    if max == (b > a) { b } else { a }
}

// ---- custom combines ------------------------------------------------------

/// Runs a combine region on (running values, new values), one tile per operand.
pub(crate) type Combine<'a> = dyn FnMut(&[Tile], &[Tile]) -> Result<Vec<Tile>, String> + 'a;

/// The slices `idx` (positions along the axis) of each line, as a flat tile.
fn take_axis(t: &Tile, (outer, m, inner): (usize, usize, usize), idx: &[usize]) -> Tile {
    let data = map_data!(&*t.data, v => {
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &k in idx {
                let s = (o * m + k) * inner;
                out.extend_from_slice(&v[s..s + inner]);
            }
        }
        out
    });
    let len = data.len();
    Tile::new(t.elem, Shape::from_slice(&[len]), data)
}

/// Copies `src` (laid out like [`take_axis`] output) into positions `idx` of `dst`.
fn put_axis(
    dst: &mut Data,
    (outer, m, inner): (usize, usize, usize),
    idx: &[usize],
    src: &Data,
) -> Result<(), String> {
    macro_rules! put {
        ($d:expr, $s:expr) => {{
            let mut j = 0;
            for o in 0..outer {
                for &k in idx {
                    let s = (o * m + k) * inner;
                    $d[s..s + inner].copy_from_slice(&$s[j..j + inner]);
                    j += inner;
                }
            }
        }};
    }
    match (dst, src) {
        (Data::Int(d), Data::Int(s)) => put!(d, s),
        (Data::F32(d), Data::F32(s)) => put!(d, s),
        (Data::F64(d), Data::F64(s)) => put!(d, s),
        _ => return Err(internal("combine result has the wrong storage".into())),
    }
    Ok(())
}

/// Checks a combine's results: one per operand, each `len` long (a one-element
/// result, from a region yielding a constant, is broadcast).
fn fit_results(res: Vec<Tile>, n_ops: usize, len: usize) -> Result<Vec<Tile>, String> {
    if res.len() != n_ops {
        return Err(internal("combine region yields the wrong number of values".into()));
    }
    res.into_iter()
        .map(|t| {
            if t.len() == len {
                Ok(t)
            } else if t.len() == 1 {
                let data = map_data!(&*t.data, v => vec![v[0]; len]);
                Ok(Tile::new(t.elem, Shape::from_slice(&[len]), data))
            } else {
                Err(internal("combine result has the wrong length".into()))
            }
        })
        .collect()
}

/// A custom reduction of `xs` (one shape) along `axis` by a pairwise tree.
pub(crate) fn reduce_custom(
    xs: &[Tile],
    axis: usize,
    combine: &mut Combine<'_>,
) -> Result<Vec<Tile>, String> {
    let first = xs.first().ok_or_else(|| internal("`reduce` without operands".into()))?;
    let (outer, n, inner) = split_axis(&first.shape, axis)?;
    if !n.is_power_of_two() || xs.iter().any(|t| t.len() != outer * n * inner) {
        return Err(internal("custom `reduce` needs operands of one power-of-two shape".into()));
    }
    let mut out_shape = first.shape.clone();
    out_shape.remove(axis);
    let mut cur: Vec<Tile> = xs.to_vec();
    let mut m = n;
    while m > 1 {
        let half = m / 2;
        let even: Vec<usize> = (0..half).map(|j| 2 * j).collect();
        let odd: Vec<usize> = (0..half).map(|j| 2 * j + 1).collect();
        let left: Vec<Tile> = cur.iter().map(|t| take_axis(t, (outer, m, inner), &even)).collect();
        let right: Vec<Tile> = cur.iter().map(|t| take_axis(t, (outer, m, inner), &odd)).collect();
        cur = fit_results(combine(&left, &right)?, xs.len(), outer * half * inner)?;
        m = half;
    }
    Ok(cur.iter().map(|t| t.view(t.elem, out_shape.clone())).collect())
}

/// A custom inclusive scan of `xs` along `axis` by Hillis-Steele doubling.
pub(crate) fn scan_custom(
    xs: &[Tile],
    axis: usize,
    reverse: bool,
    combine: &mut Combine<'_>,
) -> Result<Vec<Tile>, String> {
    let first = xs.first().ok_or_else(|| internal("`scan` without operands".into()))?;
    let dims = split_axis(&first.shape, axis)?;
    let (outer, n, inner) = dims;
    if xs.iter().any(|t| t.len() != outer * n * inner) {
        return Err(internal("custom `scan` needs operands of one shape".into()));
    }
    let mut cur: Vec<Tile> = xs.to_vec();
    let mut d = 1;
    while d < n {
        // Lane k takes combine(earlier partial, its own partial); "earlier" is
        // k - d forward and k + d in reverse.
        let (ks, partners): (Vec<usize>, Vec<usize>) = if reverse {
            ((0..n - d).collect(), (d..n).collect())
        } else {
            ((d..n).collect(), (0..n - d).collect())
        };
        let left: Vec<Tile> = cur.iter().map(|t| take_axis(t, dims, &partners)).collect();
        let right: Vec<Tile> = cur.iter().map(|t| take_axis(t, dims, &ks)).collect();
        let res = fit_results(combine(&left, &right)?, xs.len(), outer * ks.len() * inner)?;
        let mut next = Vec::with_capacity(cur.len());
        for (t, r) in cur.iter().zip(&res) {
            let mut data = (*t.data).clone();
            put_axis(&mut data, dims, &ks, &r.data)?;
            next.push(Tile::new(t.elem, t.shape.clone(), data));
        }
        cur = next;
        d *= 2;
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_tile(shape: &[usize], v: &[f32]) -> Tile {
        Tile::new(Elem::Scalar(DType::F32), Shape::from_slice(shape), Data::F32(v.to_vec()))
    }

    #[test]
    fn builtin_kinds() {
        let x = f32_tile(&[2, 3], &[1.0, f32::NAN, 3.0, 3.0, 3.0, -1.0]);
        let m = reduce(&x, 1, ReduceKind::Max).unwrap();
        assert_eq!(*m.data, Data::F32(vec![3.0, 3.0]));
        let a = reduce(&x, 1, ReduceKind::Argmax).unwrap();
        assert_eq!(*a.data, Data::Int(vec![2, 0]));
        let s = reduce(&x, 0, ReduceKind::Sum).unwrap();
        assert_eq!(format!("{:?}", s.data), "F32([4.0, NaN, 2.0])");
        let c = scan(&f32_tile(&[4], &[1.0, 2.0, 3.0, 4.0]), 0, ScanKind::Sum, true).unwrap();
        assert_eq!(*c.data, Data::F32(vec![10.0, 9.0, 7.0, 4.0]));
        let all_nan = f32_tile(&[2], &[f32::NAN, f32::NAN]);
        assert_eq!(*reduce(&all_nan, 0, ReduceKind::Argmin).unwrap().data, Data::Int(vec![0]));
        assert!(
            matches!(&*reduce(&all_nan, 0, ReduceKind::Max).unwrap().data, Data::F32(v) if v[0].is_nan())
        );
    }
}
