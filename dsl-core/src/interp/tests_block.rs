//! Tests of `load_block` on the interpreter: against a plain reference of its
//! definition (random non-zero data, ragged matrices, boxes partly or fully
//! outside, negative origins, padded rows), against its expansion into a
//! masked `load` (`passes::block_load`), and its out-of-bounds errors.

use super::tests::Rng;
use super::{Arg, Buffer, launch};
use crate::builder::kernel;
use crate::lang::*;
use crate::passes::block_load;
use crate::verify::verify;
use crate::{Error, Function};
use proptest::prelude::*;

/// Program `(p0, p1)` copies the boxes at `(row0 + p0 BR, col0 + (2 p1 + t) BC)`
/// for `t` in 0..2 to `out`, a row-major `[grid0 BR, out_stride]` matrix at
/// `(p0 BR, (2 p1 + t) BC)`. With `in_loop` the two boxes are loaded in a `for`
/// loop over `t`, otherwise in straight-line code.
fn block_copy(dtype: DType, block: [usize; 2], in_loop: bool) -> Function {
    let [br, bc] = block;
    kernel("block_copy", || {
        let x = param_ptr("x", dtype);
        let out = param_ptr("out", dtype);
        let rows = param_scalar("rows", DType::I32);
        let cols = param_scalar("cols", DType::I32);
        let stride = param_scalar("stride", DType::I32);
        let row0 = param_scalar("row0", DType::I32);
        let col0 = param_scalar("col0", DType::I32);
        let out_stride = param_scalar("out_stride", DType::I32);
        let (p0, p1) = (program_id(0), program_id(1));
        let r = p0 * br as i32 + arange(0, br as i32);
        let box_row = row0 + p0 * br as i32;
        let copy = |t: Tensor| {
            let box_col = (p1 * 2 + t) * bc as i32;
            let tile = load_block(x, rows, cols, stride, box_row, col0 + box_col, [br, bc]);
            let c = box_col + arange(0, bc as i32);
            store(out + (r.expand_dims(1) * out_stride + c.expand_dims(0)), tile, None);
        };
        if in_loop {
            for_range(0, 2, 1, &[], |t, _| {
                copy(t);
                vec![]
            });
        } else {
            copy(constant(0, DType::I32));
            copy(constant(1, DType::I32));
        }
    })
}

/// One test case: the matrix, the box origin and the grid.
#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    block: [usize; 2],
    rows: usize,
    cols: usize,
    stride: usize,
    row0: i32,
    col0: i32,
    grid: [usize; 2],
    seed: u64,
}

impl Case {
    /// A dense `rows x cols` matrix (`stride = cols`), the box at the
    /// origin, one program, seed 0.
    fn dense(dtype: DType, block: [usize; 2], rows: usize, cols: usize) -> Case {
        Case { dtype, block, rows, cols, stride: cols, row0: 0, col0: 0, grid: [1, 1], seed: 0 }
    }

    /// The matrix data: the smallest buffer holding it, random and non-zero.
    fn input(&self) -> Vec<f64> {
        let n = if self.rows == 0 { 0 } else { (self.rows - 1) * self.stride + self.cols };
        let mut rng = Rng::new(self.seed);
        (0..n.max(1))
            .map(|_| match self.dtype {
                DType::I32 => {
                    let v = rng.below(2000) as f64 - 1000.0;
                    if v == 0.0 { 7.0 } else { v }
                }
                _ => rng.float() * 8.0,
            })
            .collect()
    }

    fn out_shape(&self) -> [usize; 2] {
        [self.grid[0] * self.block[0], self.grid[1] * 2 * self.block[1]]
    }

    /// The reference: `out[R][C]` is matrix element `(row0 + R, col0 + C)`, or zero.
    fn reference(&self, x: &[f64]) -> Vec<f64> {
        let [h, w] = self.out_shape();
        let mut out = vec![0.0; h * w];
        for (rr, row) in out.chunks_mut(w).enumerate() {
            for (cc, v) in row.iter_mut().enumerate() {
                let (r, c) = (i64::from(self.row0) + rr as i64, i64::from(self.col0) + cc as i64);
                if (0..self.rows as i64).contains(&r) && (0..self.cols as i64).contains(&c) {
                    *v = x[r as usize * self.stride + c as usize];
                }
            }
        }
        out
    }

    /// Runs `f` on this case; returns the output (exactly as stored).
    fn run(&self, f: &Function) -> crate::Result<Vec<f64>> {
        let x = self.input();
        let [h, w] = self.out_shape();
        let mut bufs = [Buffer::from_f64(self.dtype, &x), Buffer::from_f64(self.dtype, &vec![-3.0; h * w])];
        let args = [
            Arg::ptr(0),
            Arg::ptr(1),
            Arg::i32(self.rows as i32),
            Arg::i32(self.cols as i32),
            Arg::i32(self.stride as i32),
            Arg::i32(self.row0),
            Arg::i32(self.col0),
            Arg::i32(w as i32),
        ];
        launch(f, [self.grid[0] as u32, self.grid[1] as u32, 1], &mut bufs, &args)?;
        Ok(bufs[1].to_f64())
    }

    /// Checks the op against the reference (inputs as stored, so bf16 is exact).
    fn check_reference(&self, in_loop: bool) {
        let f = block_copy(self.dtype, self.block, in_loop);
        let stored = Buffer::from_f64(self.dtype, &self.input()).to_f64();
        let got = self.run(&f).unwrap();
        let want = self.reference(&stored);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w && g.is_sign_negative() == w.is_sign_negative(),
                "{self:?}: element {k}: {g} vs {w}"
            );
        }
    }
}

/// `f` with its `load_block`s expanded (two in straight-line code, one in a loop).
fn expanded(f: &Function) -> Function {
    let mut g = f.clone();
    let map = block_load::expand(&mut g);
    assert!((1..=2).contains(&map.len()));
    verify(&g).unwrap();
    g
}

#[test]
fn load_block_matches_reference_on_edge_cases() {
    let base = Case { grid: [2, 1], seed: 1, ..Case::dense(DType::F32, [8, 4], 13, 7) };
    let cases = [
        // Ragged: rows and columns not multiples of the block.
        base.clone(),
        // Padded rows (`row_stride > cols`), bf16 and i32.
        Case { dtype: DType::BF16, stride: 12, ..base.clone() },
        Case { dtype: DType::I32, stride: 9, block: [4, 16], ..base.clone() },
        // Negative origins: the leading rows and columns are zero.
        Case { row0: -3, col0: -5, ..base.clone() },
        Case { dtype: DType::BF16, row0: -8, col0: -16, grid: [3, 2], ..base.clone() },
        // Boxes fully outside the matrix, on every side.
        Case { row0: 40, ..base.clone() },
        Case { col0: 30, ..base.clone() },
        Case { row0: -100, col0: -100, ..base.clone() },
        // A single-element matrix and 1-wide blocks.
        Case { rows: 1, cols: 1, stride: 1, block: [1, 1], grid: [2, 2], row0: -1, col0: -1, ..base.clone() },
        // An empty matrix reads nothing.
        Case { rows: 0, cols: 5, ..base.clone() },
    ];
    for case in cases {
        for in_loop in [false, true] {
            case.check_reference(in_loop);
        }
    }
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec![DType::F32, DType::BF16, DType::I32]),
        (0u32..6, 0u32..6),
        (0usize..40, 1usize..40, 0usize..9),
        (-40i32..40, -40i32..40),
        (1usize..3, 1usize..3),
        any::<u64>(),
    )
        .prop_map(|(dtype, (lr, lc), (rows, cols, pad), (row0, col0), (g0, g1), seed)| Case {
            dtype,
            block: [1 << lr, 1 << lc],
            rows,
            cols,
            stride: cols + pad,
            row0,
            col0,
            grid: [g0, g1],
            seed,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// The interpreter executes `load_block` as defined.
    #[test]
    fn prop_load_block_matches_reference(case in arb_case(), in_loop in any::<bool>()) {
        case.check_reference(in_loop);
    }

    /// The expansion into a masked `load` computes exactly what the op does.
    #[test]
    fn prop_expansion_matches_load_block(case in arb_case(), in_loop in any::<bool>()) {
        let f = block_copy(case.dtype, case.block, in_loop);
        let g = expanded(&f);
        let (a, b) = (case.run(&f).unwrap(), case.run(&g).unwrap());
        prop_assert_eq!(a.len(), b.len());
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            prop_assert!(x.to_bits() == y.to_bits(), "element {}: {} vs {}", k, x, y);
        }
    }
}

/// An element inside the matrix whose address is outside the buffer is an
/// out-of-bounds read (reported, never read), for the op and its expansion alike.
#[test]
fn in_matrix_element_outside_the_buffer_is_an_error() {
    let case = Case { seed: 3, ..Case::dense(DType::F32, [4, 4], 4, 4) };
    let f = block_copy(DType::F32, [4, 4], false);
    // The buffer holds 15 of the 16 elements the matrix needs.
    let mut bufs = [Buffer::from_f64(DType::F32, &[1.0; 15]), Buffer::zeros(DType::F32, 4 * 8)];
    let mut args: Vec<Arg> = [0, 1, 4, 4, 4, 0, 0, 8].map(Arg::i32).to_vec();
    args[0] = Arg::ptr(0);
    args[1] = Arg::ptr(1);
    for (g, op) in [(f.clone(), "load_block"), (expanded(&f), "load")] {
        match launch(&g, [1, 1, 1], &mut bufs, &args) {
            Err(Error::Interp(e)) => {
                assert_eq!(e.op, op);
                assert!(
                    e.message.contains("out-of-bounds read at lane 15 [3, 3]")
                        && e.message.contains("byte offset 60 of buffer `x` (60 bytes, 15 x f32)"),
                    "{e}"
                );
            }
            other => panic!("expected an out-of-bounds error from `{op}`, got {other:?}"),
        }
    }
    // With the last element outside the matrix instead (3 columns), nothing
    // reads it and the copy succeeds.
    let mut narrow = case.clone();
    narrow.cols = 3;
    narrow.check_reference(false);
}

/// An element offset no buffer can reach is refused like `addptr` refuses it.
#[test]
fn offsets_beyond_any_buffer_are_errors() {
    let f = block_copy(DType::F32, [1, 1], false);
    let mut bufs = [Buffer::from_f64(DType::F32, &[1.0; 4]), Buffer::zeros(DType::F32, 2)];
    let mut args: Vec<Arg> = [0, 0, i32::MAX, 4, 1 << 30, 1 << 30, 0, 2].map(Arg::i32).to_vec();
    args[0] = Arg::ptr(0);
    args[1] = Arg::ptr(1);
    match launch(&f, [1, 1, 1], &mut bufs, &args) {
        Err(Error::Interp(e)) => {
            assert_eq!(e.op, "load_block");
            assert!(e.message.contains("moves the pointer out of its buffer's address range"), "{e}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
}
