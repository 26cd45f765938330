//! Shape ops: `expand_dims`, `broadcast`, `reshape`, `permute`, `join`, `split`.
//!
//! Element order is row-major everywhere: `reshape` never reorders elements,
//! `join` adds a trailing dimension of 2 holding (a, b), `split` undoes it.

use super::{Attr, Attrs, attr_int, attr_ints, expect_args, to_usize};
use crate::dtype::{Shape, Type, fmt_shape};

/// The shape family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShapeOp {
    /// Inserts a dimension of size 1 at `axis`.
    ExpandDims {
        /// Position of the new dimension (0..=rank).
        axis: usize,
    },
    /// Broadcasts size-1 dimensions to `shape` (same rank).
    Broadcast {
        /// Target shape.
        shape: Shape,
    },
    /// Reinterprets the row-major elements with another shape of equal size.
    Reshape {
        /// Target shape.
        shape: Shape,
    },
    /// Permutes dimensions: result dimension `i` is operand dimension `order[i]`.
    Permute {
        /// The permutation.
        order: Vec<usize>,
    },
    /// Two tiles of one type become one with a trailing dimension of 2.
    Join,
    /// A tile whose last dimension is 2 becomes two tiles.
    Split,
}

fn ints(v: &[usize]) -> Attr {
    Attr::Ints(v.iter().map(|&d| d as i64).collect())
}

mnemonics! { ShapeOp:
    ExpandDims = "expand_dims", Broadcast = "broadcast", Reshape = "reshape", Permute = "permute",
    Join = "join", Split = "split",
}

impl ShapeOp {
    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        match self {
            ShapeOp::ExpandDims { axis } => vec![("axis", Attr::Int(*axis as i64))],
            ShapeOp::Broadcast { shape } | ShapeOp::Reshape { shape } => vec![("shape", ints(shape))],
            ShapeOp::Permute { order } => vec![("order", ints(order))],
            ShapeOp::Join | ShapeOp::Split => Vec::new(),
        }
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<ShapeOp>, String> {
        let list = |key: &str| -> Result<Vec<usize>, String> {
            attr_ints(attrs, key)?.into_iter().map(|d| to_usize(d, key)).collect()
        };
        Ok(Some(match name {
            "expand_dims" => ShapeOp::ExpandDims { axis: to_usize(attr_int(attrs, "axis")?, "axis")? },
            "broadcast" => ShapeOp::Broadcast { shape: list("shape")?.into_iter().collect() },
            "reshape" => ShapeOp::Reshape { shape: list("shape")?.into_iter().collect() },
            "permute" => ShapeOp::Permute { order: list("order")? },
            "join" => ShapeOp::Join,
            "split" => ShapeOp::Split,
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        let name = self.name();
        match self {
            ShapeOp::ExpandDims { axis } => {
                expect_args(name, args, 1)?;
                let a = &args[0];
                if *axis > a.rank() {
                    return Err(format!("`expand_dims` axis {axis} is out of range for rank {}", a.rank()));
                }
                let mut s = a.shape.clone();
                s.insert(*axis, 1);
                Ok(vec![a.with_shape(&s)])
            }
            ShapeOp::Broadcast { shape } => {
                expect_args(name, args, 1)?;
                let a = &args[0];
                if a.rank() != shape.len() {
                    return Err(format!(
                        "`broadcast` keeps the rank: cannot broadcast {} to {}",
                        fmt_shape(&a.shape),
                        fmt_shape(shape)
                    ));
                }
                for (i, (&from, &to)) in a.shape.iter().zip(shape.iter()).enumerate() {
                    if from != to && from != 1 {
                        return Err(format!(
                            "cannot broadcast {} to {}: dimension {i} is {from}, not 1 or {to}",
                            fmt_shape(&a.shape),
                            fmt_shape(shape)
                        ));
                    }
                }
                Ok(vec![a.with_shape(shape)])
            }
            ShapeOp::Reshape { shape } => {
                expect_args(name, args, 1)?;
                let a = &args[0];
                let want = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
                if want.is_none() || a.numel() == usize::MAX {
                    return Err(format!("`reshape` to {} has too many elements", fmt_shape(shape)));
                }
                if Some(a.numel()) != want {
                    return Err(format!(
                        "`reshape` keeps the element count: {} has {} elements but {} has {}",
                        fmt_shape(&a.shape),
                        a.numel(),
                        fmt_shape(shape),
                        want.unwrap_or(0)
                    ));
                }
                Ok(vec![a.with_shape(shape)])
            }
            ShapeOp::Permute { order } => {
                expect_args(name, args, 1)?;
                let a = &args[0];
                let mut seen = vec![false; a.rank()];
                if order.len() != a.rank() {
                    return Err(format!("`permute` order {order:?} does not match rank {}", a.rank()));
                }
                for &o in order {
                    if o >= a.rank() || std::mem::replace(&mut seen[o], true) {
                        return Err(format!("`permute` order {order:?} is not a permutation"));
                    }
                }
                let s: Vec<usize> = order.iter().map(|&o| a.shape[o]).collect();
                Ok(vec![a.with_shape(&s)])
            }
            ShapeOp::Join => {
                expect_args(name, args, 2)?;
                if args[0] != args[1] {
                    return Err(format!("`join` needs two operands of one type: {} vs {}", args[0], args[1]));
                }
                let mut s = args[0].shape.clone();
                s.push(2);
                Ok(vec![args[0].with_shape(&s)])
            }
            ShapeOp::Split => {
                expect_args(name, args, 1)?;
                let a = &args[0];
                if a.shape.last() != Some(&2) {
                    return Err(format!(
                        "`split` needs a last dimension of 2, found {}",
                        fmt_shape(&a.shape)
                    ));
                }
                let s = &a.shape[..a.rank() - 1];
                Ok(vec![a.with_shape(s), a.with_shape(s)])
            }
        }
    }
}
