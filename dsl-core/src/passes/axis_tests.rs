//! Tests of the axis analysis: the facts codegen relies on for the reference
//! access patterns, and a soundness check of every fact against values
//! computed by the reference evaluator on random kernels.

use super::axis::MAX_DIVISIBILITY;
use super::test_eval::{RandomCase, Rng, Tile, random_cases, run};
use super::{AxisAnalysis, AxisInfo, analyze};
use crate::builder::kernel;
use crate::ir::{Function, ParamHints, Value};
use crate::lang::*;
use crate::{Type, print::print};
use std::cell::RefCell;

/// Builds a kernel with `body`, which returns the values to inspect.
fn build(body: impl FnOnce() -> Vec<Tensor>) -> (Function, Vec<Value>) {
    let out = RefCell::new(Vec::new());
    let f = kernel("k", || {
        let vals = body();
        *out.borrow_mut() = vals.iter().map(|t| t.value()).collect();
    });
    (f, out.into_inner())
}

fn hinted(name: &str, ty: Type, div: u32) -> Tensor {
    param_with_hints(name, ty, ParamHints { divisibility: Some(div) })
}

fn info(c: &[u64], d: &[u64], k: &[u64]) -> AxisInfo {
    AxisInfo { contiguity: c.into(), divisibility: d.into(), constancy: k.into(), constant: None }
}

#[test]
fn vector_add_offsets_and_pointers() {
    let (f, v) = build(|| {
        let x_ptr = hinted("x_ptr", Type::ptr(DType::F32), 16);
        let y_ptr = param_ptr("y_ptr", DType::F32);
        let h_ptr = hinted("h_ptr", Type::ptr(DType::F16), 32);
        let n = param_scalar("n", DType::I32);
        let n16 = hinted("n16", Type::scalar(DType::I32), 16);
        let pid = program_id(0);
        let offs = pid * 256 + arange(0, 256);
        vec![pid, offs, x_ptr + offs, y_ptr + offs, h_ptr + offs, offs.lt(n), offs.lt(n16)]
    });
    let a = analyze(&f);
    assert_eq!(a.get(v[0]), &info(&[1], &[1], &[1]));
    assert!(a.is_non_negative(v[0]));
    assert_eq!(a.get(v[1]), &info(&[256], &[256], &[1]));
    assert_eq!(a.get(v[2]), &info(&[256], &[16], &[1]));
    assert_eq!(a.vector_width(v[2], 0, 4), 4);
    // Without an alignment hint the pointer is only known to be byte-aligned.
    assert_eq!(a.get(v[3]).divisibility[0], 1);
    assert_eq!(a.vector_width(v[3], 0, 4), 1);
    // f16 with 32-byte alignment: 8 halves per 16-byte vector.
    assert_eq!(a.vector_width(v[4], 0, 2), 8);
    // `offs < n`: nothing known about `n`, so lanes may differ.
    assert_eq!(a.get(v[5]).constancy[0], 1);
    // With `n` a multiple of 16, aligned runs of 16 lanes agree.
    assert_eq!(a.get(v[6]).constancy[0], 16);
    assert_eq!(a.masked_vector_width(v[2], Some(v[6]), 0, 4), 4);
    assert_eq!(a.masked_vector_width(v[2], Some(v[5]), 0, 4), 1);
}

#[test]
fn two_dimensional_offsets() {
    let (f, v) = build(|| {
        let base = hinted("base", Type::ptr(DType::F16), 16);
        let stride = param_scalar("stride", DType::I32);
        let n = hinted("n", Type::scalar(DType::I32), 16);
        let m = param_scalar("m", DType::I32);
        let stride = multiple_of(stride, 16);
        let rows = arange(0, 32);
        let cols = arange(0, 64);
        let offs = rows.expand_dims(1) * stride + cols.expand_dims(0);
        let col_mask = cols.expand_dims(0).lt(n).broadcast_to(&[32, 64]);
        let row_mask = rows.expand_dims(1).lt(m).broadcast_to(&[32, 64]);
        vec![offs, base + offs, col_mask, row_mask, and(col_mask, row_mask)]
    });
    let a = analyze(&f);
    assert_eq!(a.get(v[0]), &info(&[1, 64], &[1, 16], &[1, 1]));
    // Along rows every address is an f16 element address: a multiple of 2.
    assert_eq!(a.get(v[1]), &info(&[1, 64], &[2, 16], &[1, 1]));
    assert_eq!(a.vector_width(v[1], 1, 2), 8);
    assert_eq!(a.vector_width(v[1], 0, 2), 1);
    assert_eq!(a.get(v[2]).constancy.as_slice(), &[32, 16]);
    assert_eq!(a.get(v[3]).constancy.as_slice(), &[1, 64]);
    assert_eq!(a.get(v[4]).constancy.as_slice(), &[1, 16]);
}

#[test]
fn division_remainder_and_shifts() {
    let (f, v) = build(|| {
        let offs = program_id(0) * 128 + arange(0, 128);
        let signed = param_scalar("s", DType::I32) + arange(0, 128);
        vec![
            div(offs, 8),
            rem(offs, 8),
            shr(offs, 2),
            shl(offs, 2),
            offs * 4,
            rem(program_id(0) * 16, 8),
            div(signed, 8),
            rem(signed, 8),
            shr(signed * 16, 2),
        ]
    });
    let a = analyze(&f);
    assert_eq!(a.get(v[0]), &info(&[1], &[1], &[8]));
    assert_eq!(a.get(v[1]), &info(&[8], &[8], &[1]));
    assert_eq!(a.get(v[2]), &info(&[1], &[1], &[4]));
    assert_eq!(a.get(v[3]).divisibility[0], 4);
    assert_eq!(a.get(v[4]).divisibility[0], 4);
    assert_eq!(a.get(v[5]).constant, Some(0));
    // Possibly negative dividends: truncating division does not give aligned
    // runs, so only the sign-independent facts remain.
    assert_eq!(a.get(v[6]), &info(&[1], &[1], &[1]));
    assert_eq!(a.get(v[7]), &info(&[1], &[1], &[1]));
    assert_eq!(a.get(v[8]).divisibility[0], 4);
}

#[test]
fn hints_loads_and_shapes() {
    let (f, v) = build(|| {
        let p = hinted("p", Type::ptr(DType::I32), 4);
        let x = load(p + arange(0, 64), None, None);
        let hinted_x = max_constancy(max_contiguous(multiple_of(x, 8), 4), 2);
        let grid = arange(0, 16).expand_dims(0).broadcast_to(&[4, 16]) + arange(0, 4).expand_dims(1) * 16;
        vec![x, hinted_x, grid, grid.reshape(&[64]), grid.trans(), grid.reshape(&[8, 8])]
    });
    let a = analyze(&f);
    assert_eq!(a.get(v[0]), &info(&[1], &[1], &[1]));
    assert_eq!(a.get(v[1]), &info(&[4], &[8], &[2]));
    assert_eq!(a.get(v[2]), &info(&[1, 16], &[1, 16], &[1, 1]));
    // Flattening keeps the runs of the last dimension (not more: that would
    // need to know that rows continue each other).
    assert_eq!(a.get(v[3]), &info(&[16], &[16], &[1]));
    assert_eq!(a.get(v[4]), &info(&[16, 1], &[16, 1], &[1, 1]));
    assert_eq!(a.get(v[5]).contiguity.as_slice(), &[1, 8]);
}

#[test]
fn loads_keep_the_constancy_of_their_addresses() {
    let (f, v) = build(|| {
        let p = hinted("p", Type::ptr(DType::I32), 16);
        // A gather whose address repeats along the last axis (a page table
        // entry per row, broadcast over the row), then one that does not.
        let rows = arange(0, 8).expand_dims(1).broadcast_to(&[8, 16]);
        let cols = arange(0, 16).expand_dims(0).broadcast_to(&[8, 16]);
        let m = cols.lt(12);
        let page = load(p + rows, None, None);
        let each = load(p + cols, None, None);
        let masked = load(p + rows, Some(m), Some(0.into()));
        vec![page, each, masked, page * 64 + cols]
    });
    let a = analyze(&f);
    assert_eq!(a.get(v[0]), &info(&[1, 1], &[1, 1], &[1, 16]));
    assert_eq!(a.get(v[1]), &info(&[1, 1], &[1, 1], &[8, 1]));
    // The mask is constant over runs of 4 along the last axis only.
    assert_eq!(a.get(v[2]).constancy.as_slice(), &[1, 4]);
    // Equal rows of pages plus contiguous columns: contiguous rows.
    assert_eq!(a.get(v[3]).contiguity.as_slice(), &[1, 16]);
}

#[test]
fn loops_reach_a_fixed_point() {
    let (f, v) = build(|| {
        let p = hinted("p", Type::ptr(DType::F32), 16);
        let n = param_scalar("n", DType::I32);
        let offs = arange(0, 64);
        let mut out = Vec::new();
        let r = for_range(0, n, 32, &[p + offs, offs, zeros(&[64], DType::F32)], |iv, c| {
            out.push(iv);
            out.push(c[0]);
            let x = load(c[0], None, None);
            vec![c[0] + 64, c[1] + 1, c[2] + x]
        });
        out.extend(r);
        out
    });
    let a = analyze(&f);
    // iv = 0, 32, 64, ...
    assert_eq!(a.get(v[0]).divisibility[0], 32);
    assert!(a.is_non_negative(v[0]));
    // The pointer advances by whole 256-byte blocks: contiguity and alignment hold.
    assert_eq!(a.get(v[1]), &info(&[64], &[16], &[1]));
    assert_eq!(a.get(v[2]), &info(&[64], &[16], &[1]));
    // `offs + 1` per iteration: still contiguous, alignment lost.
    assert_eq!(a.get(v[3]), &info(&[64], &[1], &[1]));
    assert_eq!(a.get(v[4]), &AxisInfo::unknown(1));
}

#[test]
fn constants_and_unsigned_wrap() {
    let (f, v) = build(|| {
        let u = param_scalar("u", DType::U32);
        let base = param_scalar("b", DType::U32);
        vec![
            constant(0, DType::I32),
            constant(48, DType::I64),
            full(&[8], -4, DType::I32),
            u * 16 + arange(0, 16).to(DType::U32),
            base + arange(0, 16).to(DType::U32),
            (u * 4).to(DType::U8) + arange(0, 16).to(DType::U8),
        ]
    });
    let a = analyze(&f);
    assert_eq!(a.get(v[0]).divisibility[0], MAX_DIVISIBILITY);
    assert_eq!(a.get(v[0]).constant, Some(0));
    assert_eq!(a.get(v[1]).divisibility[0], 16);
    assert_eq!(a.get(v[2]), &AxisInfo { constant: Some(-4), ..info(&[1], &[4], &[8]) });
    assert_eq!(a.get(v[3]).contiguity[0], 16);
    // `b + i` may wrap around 2^32 in the middle of a run.
    assert_eq!(a.get(v[4]).contiguity[0], 1);
    assert_eq!(a.get(v[5]).contiguity[0], 4);
}

/// Checks every claim of `info` against the concrete tile `t`, whose
/// consecutive elements differ by `step` (the pointee size for pointers).
fn check(info: &AxisInfo, nonneg: bool, t: &Tile, step: i64) -> Result<(), String> {
    let dims: Vec<usize> = if t.shape.is_empty() { vec![1] } else { t.shape.clone() };
    if info.len() != dims.len() {
        return Err(format!("rank {} for shape {:?}", info.len(), t.shape));
    }
    for (d, &size) in dims.iter().enumerate() {
        for (what, v, bound) in [
            ("contiguity", info.contiguity[d], size as u64),
            ("constancy", info.constancy[d], size as u64),
            ("divisibility", info.divisibility[d], MAX_DIVISIBILITY),
        ] {
            if !v.is_power_of_two() || v > bound {
                return Err(format!("{what} {v} along {d} is not a power of two up to {bound}"));
            }
        }
    }
    let strides: Vec<usize> = (0..dims.len()).map(|d| dims[d + 1..].iter().product()).collect();
    for (k, &x) in t.data.iter().enumerate() {
        if info.constant.is_some_and(|c| c != x) {
            return Err(format!("element {k} is {x}, not the constant"));
        }
        if nonneg && x < 0 {
            return Err(format!("element {k} is negative"));
        }
        for d in 0..dims.len() {
            let i = (k / strides[d]) % dims[d];
            let (c, v, kk) = (info.contiguity[d], info.divisibility[d], info.constancy[d]);
            let prev = (i > 0).then(|| t.data[k - strides[d]]);
            if !(i as u64).is_multiple_of(c) && prev != Some(x - step) {
                return Err(format!("element {k} ({x}) breaks a run of {c} along {d}"));
            }
            if (i as u64).is_multiple_of(c) && i128::from(x).rem_euclid(i128::from(v)) != 0 {
                return Err(format!("element {k} ({x}) starts a run along {d} but is not a multiple of {v}"));
            }
            if !(i as u64).is_multiple_of(kk) && prev != Some(x) {
                return Err(format!("element {k} ({x}) breaks a constant run of {kk} along {d}"));
            }
        }
    }
    Ok(())
}

fn check_all(f: &Function, a: &AxisAnalysis, args: &[i64], pid: i64) -> usize {
    let Ok(r) = run(f, args, pid) else { return 0 };
    for (&v, t) in &r.vals {
        let ty = f.ty(v);
        let step = if ty.is_ptr() { ty.dtype().size_bytes() as i64 } else { 1 };
        if let Err(e) = check(a.get(v), a.is_non_negative(v), t, step) {
            panic!("{v}: {e}\nfacts {:?}\nvalue {t:?}\nargs {args:?}, pid {pid}\n{}", a.get(v), print(f));
        }
    }
    1
}

/// Every fact the analysis states holds for the values random kernels compute,
/// before and after canonicalization.
#[test]
fn random_kernels_never_over_claim() {
    let mut rng = Rng(0xa515);
    let mut runs = 0;
    for RandomCase { kernel: f, canonical: g, args: cases, .. } in random_cases(&mut rng, 1000..1400) {
        let (af, ag) = (analyze(&f), analyze(&g));
        for (args, pid) in cases {
            runs += check_all(&f, &af, &args, pid);
            runs += check_all(&g, &ag, &args, pid);
        }
    }
    assert!(runs > 800, "too few runs without errors: {runs}");
}
