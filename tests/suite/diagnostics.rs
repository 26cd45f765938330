//! Build-time errors (type/shape problems in a kernel body, reported together
//! with the author's source locations) and verifier findings on malformed IR.

use dsl_core::ir::ops::{ArithOp, BinaryOp, ControlOp, CreationOp};
use dsl_core::ir::{Function, Op, Scalar};
use dsl_core::lang::*;
use dsl_core::{Error, Location, Type, verify};

/// Builds a kernel with three independent mistakes and checks that all three are
/// reported, in order, each at the line and column of the offending expression.
#[test]
fn build_errors_are_collected_with_locations() {
    let mut lines = Vec::new();
    let err = KernelBuilder::new("bad").build(|| {
        let x = param_ptr("x", DType::F32);
        let a = load(x + arange(0, 64), None, None);
        let b = load(x + arange(0, 32), None, None);
        lines.push((line!() + 1, 18));
        let _c = a + b;
        let m = reshape(a, &[8, 8]);
        let k = reshape(b, &[4, 8]);
        lines.push((line!() + 1, 18));
        let _d = dot(m, k, None);
        lines.push((line!() + 1, 18));
        let _e = exp(arange(0, 16));
    });
    let Err(Error::Build { kernel, diagnostics }) = err else {
        panic!("expected a build error, got {err:?}")
    };
    assert_eq!(kernel, "bad");
    assert_eq!(diagnostics.len(), 3, "{diagnostics:#?}");
    for (d, (line, col)) in diagnostics.iter().zip(&lines) {
        assert!(d.loc.file.ends_with("diagnostics.rs"), "{d}");
        assert_eq!((d.loc.line, d.loc.col), (*line, *col), "{d}");
    }
    assert!(diagnostics[0].message.contains("cannot be broadcast"), "{}", diagnostics[0]);
    assert!(diagnostics[1].message.contains("inner dimensions differ"), "{}", diagnostics[1]);
    assert!(diagnostics[2].message.contains("floating-point"), "{}", diagnostics[2]);
    assert_eq!(diagnostics[2].op, Some("exp"));
}

/// `gdc_wait` must run in every thread before any write: once, at the top
/// level, after no store. Loads may precede it; such a kernel is marked as
/// one that may overlap its predecessor.
#[test]
fn gdc_wait_placement_is_checked() {
    let build = |name: &str, body: fn(Tensor)| {
        KernelBuilder::new(name).build(|| {
            let x = param_ptr("x", DType::F32);
            body(x)
        })
    };
    let ok = build("ok", |x| {
        let v = load(x + arange(0, 32), None, None);
        gdc_wait();
        gdc_launch_dependents();
        store(x + arange(0, 32), v + 1.0f32, None);
    })
    .unwrap();
    assert!(ok.waits_on_grid());
    let plain = build("plain", |x| store(x + arange(0, 32), 1.0f32, None)).unwrap();
    assert!(!plain.waits_on_grid());

    type Case = (&'static str, fn(Tensor), &'static str);
    let cases: [Case; 4] = [
        (
            "after_store",
            |x| {
                store(x + arange(0, 32), 1.0f32, None);
                gdc_wait();
            },
            "`gdc_wait` must come before every store, atomic and volatile load, but `store` at",
        ),
        (
            "after_atomic_in_if",
            |x| {
                if_then(program_id(0).gt(0), || {
                    let _ = atomic_add(x + arange(0, 32), 1.0f32, None);
                });
                gdc_wait();
            },
            "but `if` at",
        ),
        (
            "in_if",
            |_| if_then(program_id(0).gt(0), || gdc_wait()),
            "must be at the top level of the kernel body",
        ),
        (
            "twice",
            |_| {
                gdc_wait();
                gdc_wait();
            },
            "`gdc_wait` may appear only once",
        ),
    ];
    for (name, body, want) in cases {
        let msg = build(name, body).unwrap_err().to_string();
        assert!(msg.contains(want), "{name}: {msg}");
        assert!(msg.contains("diagnostics.rs"), "{name}: the error names the source: {msg}");
    }
}

#[test]
fn non_power_of_two_shapes_are_rejected_where_padding_cannot_apply() {
    let err = KernelBuilder::new("np2").build(|| {
        let x = arange(0, 64);
        let _ = reshape(x, &[8, 6]);
    });
    let msg = err.unwrap_err().to_string();
    assert!(msg.contains("powers of two, found 6") && msg.contains("pad to 8"), "{msg}");
    let err = KernelBuilder::new("np2_reshape").build(|| {
        let _ = reshape(arange(0, 100), &[128]);
    });
    assert!(err.unwrap_err().to_string().contains("cannot reshape a tile padded to a power of two"));
}

/// `arange(0, 100)` is padded to 128 lanes and every memory access through it is
/// masked to the first 100, with no mask written by the author.
#[test]
fn non_power_of_two_aranges_are_padded_and_masked() {
    let f = KernelBuilder::new("padded")
        .build(|| {
            let x = param_ptr("x", DType::F32);
            let offs = arange(0, 100);
            store(x + offs, load(x + offs, None, None) * 2.0, None);
        })
        .unwrap();
    let text = dsl_core::print::print(&f);
    assert!(text.contains("arange {start = 0, end = 128}"), "{text}");
    assert!(text.contains("full {value = 100, shape = [128]}"), "{text}");
    assert_eq!(text.matches("{mask}").count(), 2, "{text}");
}

#[test]
fn loop_carried_type_change_is_an_error() {
    let err = KernelBuilder::new("carry").build(|| {
        let acc = zeros(&[16], DType::F32);
        for_range(0, 4, 1, &[acc], |_, c| vec![c[0].to(DType::F16)]);
    });
    let msg = err.unwrap_err().to_string();
    assert!(
        msg.contains("loop-carried values start as (tensor<16xf32>) but the body yields (tensor<16xf16>)"),
        "{msg}"
    );
}

#[test]
fn if_branches_must_agree() {
    let err = KernelBuilder::new("branches").build(|| {
        let p = program_id(0);
        if_else(p.gt(0), || vec![p], || vec![p.to(DType::F32)]);
    });
    assert!(err.unwrap_err().to_string().contains("branches of an `if` must produce the same types"));
}

#[test]
fn pointer_misuse_is_an_error() {
    let err = KernelBuilder::new("ptrs").build(|| {
        let x = param_ptr("x", DType::F32);
        let y = param_ptr("y", DType::F32);
        let _ = x * 2;
        store(y, x, None);
        let _ = load(program_id(0), None, None);
    });
    let Err(Error::Build { diagnostics, .. }) = err else { panic!() };
    let msgs: Vec<String> = diagnostics.iter().map(|d| d.to_string()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(msgs[0].contains("not defined on pointers"));
    assert!(msgs[2].contains("`load` needs a pointer, found i32"));
}

fn loc() -> Location {
    Location::new("malformed.rs", 1, 1)
}

/// An unplaced binary `op` of `v` with itself, declared to give a `result` scalar.
fn square(f: &mut Function, op: BinaryOp, v: dsl_core::ir::Value, result: DType) -> dsl_core::ir::Inst {
    f.create_inst(Op::Arith(ArithOp::Binary(op)), &[v, v], vec![Type::scalar(result)], loc())
}

/// Malformed IR made directly through the arena API: every violation is listed.
#[test]
fn verifier_collects_all_violations() {
    let mut f = Function::new("malformed", loc());
    let body = f.body_block();
    let c = f.create_inst(
        Op::Creation(CreationOp::Const(Scalar::int(DType::I32, 1))),
        &[],
        vec![Type::scalar(DType::I32)],
        loc(),
    );
    let cv = f.result(c);
    // 1. A use before the definition: the add is placed before the const.
    let add = square(&mut f, BinaryOp::Add, cv, DType::I32);
    f.append_inst(body, add);
    f.append_inst(body, c);
    // 2. A wrong declared result type.
    let bad = square(&mut f, BinaryOp::Mul, cv, DType::F32);
    f.append_inst(body, bad);
    // 3. A non-power-of-two tile.
    let full =
        Op::Creation(CreationOp::Full { value: Scalar::int(DType::I32, 0), shape: [3].as_slice().into() });
    let np2 = f.create_inst(full, &[], vec![Type::tile(dsl_core::Elem::Scalar(DType::I32), &[3])], loc());
    f.append_inst(body, np2);
    // 4. A terminator in the kernel body.
    let y = f.create_inst(Op::Control(ControlOp::Yield), &[], vec![], loc());
    f.append_inst(body, y);
    let diags = verify::verify_collect(&f);
    let text: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
    assert!(text.iter().any(|t| t.contains("used before its definition")), "{text:#?}");
    assert!(text.iter().any(|t| t.contains("do not match the inferred")), "{text:#?}");
    assert!(text.iter().any(|t| t.contains("not a power of two")), "{text:#?}");
    assert!(text.iter().any(|t| t.contains("must not end with a terminator")), "{text:#?}");
    assert!(text.iter().all(|t| t.starts_with("malformed.rs:1:1")), "{text:#?}");
    assert!(matches!(verify::verify(&f), Err(Error::Verify { .. })));
}

/// A `for` whose body yields the wrong type and lacks nothing else.
#[test]
fn verifier_checks_region_terminators() {
    let mut f = Function::new("loop", loc());
    let body = f.body_block();
    let mk = |f: &mut Function, v: i64, d: DType| {
        let i = f.create_inst(
            Op::Creation(CreationOp::Const(Scalar::int(d, v))),
            &[],
            vec![Type::scalar(d)],
            loc(),
        );
        f.append_inst(body, i);
        f.result(i)
    };
    let lb = mk(&mut f, 0, DType::I32);
    let ub = mk(&mut f, 8, DType::I32);
    let init = mk(&mut f, 0, DType::F32);
    let for_ = f.create_inst(
        Op::Control(ControlOp::For),
        &[lb, ub, ub, init],
        vec![Type::scalar(DType::F32)],
        loc(),
    );
    f.append_inst(body, for_);
    let r = f.new_region(Some(for_));
    f.insts[for_].regions.push(r);
    let rb = f.entry(r);
    let iv = f.add_block_arg(rb, Type::scalar(DType::I32));
    f.add_block_arg(rb, Type::scalar(DType::F32));
    let y = f.create_inst(Op::Control(ControlOp::Yield), &[iv], vec![], loc());
    f.append_inst(rb, y);
    let text = verify::verify(&f).unwrap_err().to_string();
    assert!(text.contains("region 0 ends with `yield` of (i32) but must give (f32)"), "{text}");
}
