//! Negative tests: every runtime problem is an error that names the op, its
//! source location and the program, and invalid launches are rejected before
//! anything runs.

use super::tests::{assert_raised, contains_all, interp_err};
use super::{Arg, Buffer, launch};
use crate::builder::kernel;
use crate::ir::ParamHints;
use crate::lang::*;
use crate::{Error, Function, Type};
use std::cell::Cell;

/// Runs `f` and returns its launch error message.
fn launch_err(f: &Function, bufs: &mut [Buffer], args: &[Arg]) -> String {
    match launch(f, [1, 1, 1], bufs, args) {
        Err(e @ Error::Launch { .. }) => e.to_string(),
        other => panic!("expected a launch error, got {other:?}"),
    }
}

#[test]
fn unmasked_out_of_bounds_read_names_op_location_and_buffer() {
    let line = Cell::new(0);
    let f = kernel("oob", || {
        let x = param_ptr("x", DType::F32);
        let out = param_ptr("out", DType::F32);
        let offs = program_id(0) * 16 + arange(0, 16);
        line.set(line!() + 1);
        let v = load(x + offs, None, None);
        store(out + offs, v, Some(offs.lt(20)));
    });
    let mut bufs = [Buffer::zeros(DType::F32, 20), Buffer::zeros(DType::F32, 20)];
    let e = interp_err(&f, [2, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]);
    assert_eq!(e.op, "load");
    assert_eq!(e.loc.line, line.get());
    assert!(e.loc.file.ends_with("tests_errors.rs"), "{}", e.loc);
    assert_eq!(e.program, Some([1, 0, 0]));
    contains_all(
        &e.to_string(),
        &[
            &format!("tests_errors.rs:{}:", line.get()),
            "in `load`",
            "program (1, 0, 0)",
            "out-of-bounds read at lane 4 [4]",
            "byte offset 80 of buffer `x` (80 bytes, 20 x f32)",
        ],
    );
}

#[test]
fn out_of_bounds_write_and_atomic_name_aliased_buffers() {
    let f = kernel("oob_write", || {
        let a = param_ptr("a", DType::I32);
        let b = param_ptr("b", DType::I32);
        store(a + arange(0, 4), 1, None);
        atomic_add(b + arange(0, 4) - 3, 1, None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 8)];
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr_at(0, 4), Arg::ptr_at(0, 2)]);
    assert_raised(&e, "atomic_add", &["byte offset -4 of buffer `a/b`"]);
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr_at(0, 5), Arg::ptr_at(0, 3)]);
    assert_raised(&e, "store", &["out-of-bounds write at lane 3 [3]"]);
}

#[test]
fn cross_program_write_race() {
    let f = kernel("race", || {
        let out = param_ptr("out", DType::I32);
        store(out + 1, program_id(0), None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 4)];
    let e = interp_err(&f, [3, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_eq!(e.op, "store");
    assert_eq!(e.program, Some([1, 0, 0]));
    contains_all(
        &e.message,
        &[
            "write-write race",
            "program (1, 0, 0) stores 1 to byte offset 4 of buffer `out`",
            "program (0, 0, 0) already stored a different value there (0)",
        ],
    );

    // Atomics never race, and race detection can be turned off.
    let g = kernel("no_race", || {
        let out = param_ptr("out", DType::I32);
        atomic_add(out, program_id(0), None);
    });
    launch(&g, [3, 1, 1], &mut bufs, &[Arg::ptr(0)]).unwrap();
    assert_eq!(bufs[0].to_vec::<i32>()[0], 3);
    let k = super::Kernel::new(&f).unwrap();
    super::Interpreter::new()
        .with_race_detection(false)
        .launch(&k, [3, 1, 1], &mut bufs, &[Arg::ptr(0)])
        .unwrap();
    assert_eq!(bufs[0].to_vec::<i32>()[1], 2);
}

#[test]
fn i32_offset_overflow() {
    let f = kernel("overflow", || {
        let x = param_ptr("x", DType::F32);
        let stride = param_scalar("stride", DType::I32);
        let v = load(x + program_id(0) * stride, None, None);
        store(x, v, None);
    });
    let mut bufs = [Buffer::zeros(DType::F32, 4)];
    let e = interp_err(&f, [3, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(1 << 30)]);
    // Program 1 loads x[2^30] first, far out of bounds.
    assert_eq!(e.op, "load");
    // With the load masked off for program 1, program 2's offset overflows.
    let g = kernel("overflow2", || {
        let x = param_ptr("x", DType::F32);
        let stride = param_scalar("stride", DType::I32);
        let off = program_id(0) * stride;
        let v = load(x + off, Some(off.lt(0)), Some(1.0.into()));
        store(x, v, Some(off.lt(0)));
    });
    let e = interp_err(&g, [3, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(1 << 30)]);
    assert_eq!(e.op, "mul");
    assert_eq!(e.program, Some([2, 0, 0]));
    contains_all(
        &e.message,
        &["i32 overflow in `mul`: 2 * 1073741824 = 2147483648 does not fit in i32", "use i64 offsets"],
    );
}

#[test]
fn failed_device_assert() {
    let f = kernel("asserts", || {
        let x = param_ptr("x", DType::F32);
        let v = load(x + arange(0, 8), None, None);
        device_assert(v.gt(0.0), "inputs must be positive");
    });
    let mut bufs = [Buffer::from_slice(&[1.0f32, 2.0, 3.0, -4.0, 5.0, 6.0, -7.0, 8.0])];
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_raised(
        &e,
        "assert",
        &["device assertion failed: inputs must be positive (2 of 8 element(s) false, first at lane 3 [3])"],
    );
}

#[test]
fn integer_division_by_zero() {
    let f = kernel("div0", || {
        let x = param_ptr("x", DType::I32);
        let d = param_scalar("d", DType::I32);
        let v = load(x + arange(0, 4), None, None);
        store(x + arange(0, 4), v / d, None);
    });
    let mut bufs = [Buffer::from_slice(&[1i32, 2, 3, 4])];
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(0)]);
    assert_raised(&e, "div", &["integer division by zero in `div`: 1 / 0 (at lane 0 [0])"]);
}

#[test]
fn launch_validation() {
    let f = kernel("k", || {
        let x = param_ptr("x", DType::F32);
        let n = param_scalar("n", DType::I32);
        store(x, n.to(DType::F32), None);
    });
    let mut bufs = [Buffer::zeros(DType::F32, 4), Buffer::zeros(DType::BF16, 4), Buffer::zeros(DType::U8, 9)];
    let m = launch_err(&f, &mut bufs, &[Arg::ptr(0)]);
    assert!(
        m.contains("invalid launch of `k`: it takes 2 argument(s) (x: ptr<f32>, n: i32), but 1 were passed"),
        "{m}"
    );
    let m = launch_err(&f, &mut bufs, &[Arg::i32(0), Arg::i32(0)]);
    assert!(m.contains("argument 0 (`x`: ptr<f32>) is a pointer; pass Arg::Ptr"), "{m}");
    let m = launch_err(&f, &mut bufs, &[Arg::ptr(0), Arg::ptr(0)]);
    assert!(m.contains("argument 1 (`n`: i32) is a scalar"), "{m}");
    let m = launch_err(&f, &mut bufs, &[Arg::ptr(1), Arg::i32(0)]);
    assert!(m.contains("points to f32, but buffer 1 holds bf16"), "{m}");
    let m = launch_err(&f, &mut bufs, &[Arg::ptr(0), Arg::i64(0)]);
    assert!(m.contains("needs a i32 scalar, but a i64 was passed"), "{m}");
    let m = launch_err(&f, &mut bufs, &[Arg::ptr(7), Arg::i32(0)]);
    assert!(m.contains("names buffer 7, but 3 buffer(s) were passed"), "{m}");
    let m = launch_err(&f, &mut bufs, &[Arg::ptr_at(2, 1), Arg::i32(0)]);
    assert!(m.contains("starts at byte 1, which is not aligned to f32"), "{m}");
    let m = launch_err(&f, &mut bufs, &[Arg::ptr_at(0, 5), Arg::i32(0)]);
    assert!(m.contains("starts at element 5 of buffer 0, which has 4 elements"), "{m}");
    // A u8 buffer may back any pointer.
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr_at(2, 4), Arg::i32(3)]).unwrap();
    assert_eq!(&bufs[2].as_bytes()[4..8], &3.0f32.to_le_bytes());
    let m = match launch(&f, [1u32 << 31, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(0)]) {
        Err(e) => e.to_string(),
        Ok(()) => String::new(),
    };
    assert!(m.contains("grid dimension 0 is 2147483648"), "{m}");

    let g = kernel("hinted", || {
        let hints = ParamHints { divisibility: Some(16) };
        let x = param_with_hints("x", Type::ptr(DType::F32), hints.clone());
        let n = param_with_hints("n", Type::scalar(DType::I32), hints);
        store(x, n.to(DType::F32), None);
    });
    let m = launch_err(&g, &mut bufs, &[Arg::ptr_at(0, 1), Arg::i32(16)]);
    assert!(m.contains("specialized for addresses divisible by 16"), "{m}");
    let m = launch_err(&g, &mut bufs, &[Arg::ptr(0), Arg::i32(12)]);
    assert!(m.contains("is 12, but the kernel was specialized for values divisible by 16"), "{m}");
}

#[test]
fn misaligned_access_and_broken_hints() {
    let f = kernel("misaligned", || {
        let raw = param_ptr("raw", DType::U8);
        let v = load(ptrcast(raw + 1, DType::F32), None, None);
        store(ptrcast(raw, DType::F32), v, None);
    });
    let mut bufs = [Buffer::zeros(DType::U8, 16)];
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    contains_all(&e.message, &["misaligned read at the scalar: byte offset 1 of buffer `raw`"]);

    let g = kernel("bad_hints", || {
        let x = param_ptr("x", DType::I32);
        let offs = multiple_of(arange(0, 16) + 1, 16);
        store(x + offs, 0, None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 32)];
    let e = interp_err(&g, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_raised(&e, "multiple_of", &["1 (the start of a run) is not a multiple of 16 at lane 0 [0]"]);

    let h = kernel("bad_contiguity", || {
        let x = param_ptr("x", DType::I32);
        let offs = max_contiguous(arange(0, 16) * 2, 4);
        store(x + offs, 0, None);
    });
    let e = interp_err(&h, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_raised(&e, "max_contiguous", &["2 does not follow 0 at lane 1 [1]"]);
}

#[test]
fn runtime_loop_step_and_wild_pointers() {
    let f = kernel("steps", || {
        let x = param_ptr("x", DType::I32);
        let step = param_scalar("step", DType::I32);
        let r = for_range(0, 10, step, &[constant(0, DType::I32)], |i, c| vec![c[0] + i]);
        store(x, r[0], None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 1)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(3)]).unwrap();
    assert_eq!(bufs[0].to_vec::<i32>(), vec![18]);
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(0)]);
    assert_raised(&e, "for", &["the step of a `for` loop must be positive, found 0"]);

    let g = kernel("wild", || {
        let x = param_ptr("x", DType::I32);
        let far = constant(1i64 << 50, DType::I64);
        store(x + far, 0, Some(arange(0, 1).lt(0)));
    });
    let e = interp_err(&g, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_raised(&e, "addptr", &["out of its buffer's address range"]);
}

#[test]
fn signed_overflow_in_reductions_and_malformed_ir() {
    let f = kernel("sum_overflow", || {
        let x = param_ptr("x", DType::I32);
        store(x, sum(full(&[4], 1 << 30, DType::I32), 0), None);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 1)];
    let e = interp_err(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_raised(&e, "reduce", &["i32 overflow in `reduce`: the sum 4294967296"]);

    // Malformed IR is rejected by the verifier before it runs.
    let mut bad = Function::new("bad", crate::Location::unknown());
    let add = crate::Op::Arith(crate::ir::ops::ArithOp::Binary(crate::ir::ops::BinaryOp::Add));
    let i = bad.create_inst(add, &[], vec![Type::scalar(DType::I32)], crate::Location::unknown());
    let b = bad.body_block();
    bad.append_inst(b, i);
    assert!(matches!(launch(&bad, [1, 1, 1], &mut bufs, &[]), Err(Error::Verify { .. })));
}
