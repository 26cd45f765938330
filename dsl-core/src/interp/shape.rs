//! Shape ops: `expand_dims` and `reshape` (views of the same storage),
//! `broadcast` and `permute` (strided gathers), `join` and `split`
//! (interleave and de-interleave along a new trailing dimension of 2).
//!
//! Invariant: element order is row-major everywhere, as `ir/ops/shape.rs`
//! specifies; every gather checks its largest source index once up front, so
//! the copy loops cannot index out of bounds.

use super::tile::{Data, Tile, internal, map_data};
use crate::dtype::Shape;

/// Row-major strides of `shape`, in elements.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Copies `src` into a new row-major tile of `shape`, where output index `i`
/// reads `src[sum(i[d] * strides[d])]` (a stride of 0 broadcasts).
pub(crate) fn gather<T: Copy>(src: &[T], shape: &[usize], strides: &[usize]) -> Result<Vec<T>, String> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(Vec::new());
    }
    let max_index: usize = shape.iter().zip(strides).map(|(&d, &s)| (d - 1) * s).sum();
    if max_index >= src.len() || strides.len() != shape.len() {
        return Err(internal(format!(
            "gather of {shape:?} with strides {strides:?} from {} elements",
            src.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    let Some((&inner_n, outer_shape)) = shape.split_last() else {
        out.push(src[0]);
        return Ok(out);
    };
    let inner_s = strides[shape.len() - 1];
    let outer_strides = &strides[..shape.len() - 1];
    let mut idx = vec![0usize; outer_shape.len()];
    let mut base = 0usize;
    loop {
        match inner_s {
            1 => out.extend_from_slice(&src[base..base + inner_n]),
            0 => out.extend(std::iter::repeat_n(src[base], inner_n)),
            s => out.extend((0..inner_n).map(|i| src[base + i * s])),
        }
        // Advance the outer index like an odometer.
        let mut d = outer_shape.len();
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            idx[d] += 1;
            base += outer_strides[d];
            if idx[d] < outer_shape[d] {
                break;
            }
            base -= outer_strides[d] * outer_shape[d];
            idx[d] = 0;
        }
    }
}

/// `broadcast x` to `shape` (size-1 dimensions repeat).
pub(crate) fn broadcast(x: &Tile, shape: &[usize]) -> Result<Tile, String> {
    if x.shape.len() != shape.len() {
        return Err(internal("`broadcast` changes the rank".into()));
    }
    if x.shape.as_slice() == shape {
        return Ok(x.clone());
    }
    let src_strides = strides_of(&x.shape);
    let strides: Vec<usize> =
        x.shape.iter().zip(&src_strides).map(|(&d, &s)| if d == 1 { 0 } else { s }).collect();
    let data = map_data!(&*x.data, v => gather(v, shape, &strides)?);
    Ok(Tile::new(x.elem, Shape::from_slice(shape), data))
}

/// `reshape x` to `shape` (or `expand_dims`): the same storage, another shape.
pub(crate) fn reshape(x: &Tile, shape: &[usize]) -> Result<Tile, String> {
    if shape.iter().product::<usize>() != x.len() {
        return Err(internal("`reshape` changes the element count".into()));
    }
    Ok(x.view(x.elem, Shape::from_slice(shape)))
}

/// `permute x` with `order`: result dimension `i` is `x`'s dimension `order[i]`.
pub(crate) fn permute(x: &Tile, order: &[usize]) -> Result<Tile, String> {
    let src_strides = strides_of(&x.shape);
    let mut shape = Shape::new();
    let mut strides = Vec::with_capacity(order.len());
    for &o in order {
        let (Some(&d), Some(&s)) = (x.shape.get(o), src_strides.get(o)) else {
            return Err(internal(format!("`permute` order {order:?} for shape {:?}", x.shape)));
        };
        shape.push(d);
        strides.push(s);
    }
    let data = map_data!(&*x.data, v => gather(v, &shape, &strides)?);
    Ok(Tile::new(x.elem, shape, data))
}

/// `join a, b`: a new trailing dimension of 2 holding `(a, b)`.
pub(crate) fn join(a: &Tile, b: &Tile) -> Result<Tile, String> {
    fn interleave<T: Copy>(x: &[T], y: &[T]) -> Vec<T> {
        x.iter().zip(y).flat_map(|(&p, &q)| [p, q]).collect()
    }
    let data = match (&*a.data, &*b.data) {
        (Data::Int(x), Data::Int(y)) if x.len() == y.len() => Data::Int(interleave(x, y)),
        (Data::F32(x), Data::F32(y)) if x.len() == y.len() => Data::F32(interleave(x, y)),
        (Data::F64(x), Data::F64(y)) if x.len() == y.len() => Data::F64(interleave(x, y)),
        _ => return Err(internal("`join` operands differ".into())),
    };
    let mut shape = a.shape.clone();
    shape.push(2);
    Ok(Tile::new(a.elem, shape, data))
}

/// `split x`: the two halves of a trailing dimension of 2.
pub(crate) fn split(x: &Tile) -> Result<(Tile, Tile), String> {
    if x.shape.last() != Some(&2) {
        return Err(internal("`split` needs a trailing dimension of 2".into()));
    }
    let shape = Shape::from_slice(&x.shape[..x.shape.len() - 1]);
    let lo = map_data!(&*x.data, v => v.iter().step_by(2).copied().collect());
    let hi = map_data!(&*x.data, v => v.iter().skip(1).step_by(2).copied().collect());
    Ok((Tile::new(x.elem, shape.clone(), lo), Tile::new(x.elem, shape, hi)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_broadcasts_and_transposes() {
        let src = [1, 2, 3, 4, 5, 6];
        // A [2, 3] matrix transposed to [3, 2].
        assert_eq!(gather(&src, &[3, 2], &[1, 3]).unwrap(), vec![1, 4, 2, 5, 3, 6]);
        // A [1, 3] row broadcast to [2, 3].
        assert_eq!(gather(&src[..3], &[2, 3], &[0, 1]).unwrap(), vec![1, 2, 3, 1, 2, 3]);
        assert!(gather(&src, &[4, 2], &[2, 1]).is_err());
        assert_eq!(strides_of(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
