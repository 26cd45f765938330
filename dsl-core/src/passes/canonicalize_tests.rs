//! Tests of canonicalization, CSE and DCE: snapshots of the printed IR of
//! small kernels, explicit assertions, and a differential test on random
//! kernels against the reference evaluator in `test_eval`.

use super::test_eval::{RandomCase, Rng, random_cases, random_kernel, run};
use super::{canonicalize, cse, dce};
use crate::builder::kernel;
use crate::ir::{Function, Inst};
use crate::lang::*;
use crate::print::print;
use crate::verify::verify;

/// The softmax kernel of `tests/src/hand.rs` (built by the interpreter tests).
fn softmax(block: usize, dtype: DType) -> Function {
    crate::interp::tests::hand::softmax(block, dtype).unwrap()
}

/// Canonicalizes a copy of `f`, checking the verifier accepts the result.
fn canon(f: &Function) -> Function {
    let mut g = f.clone();
    canonicalize(&mut g);
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", print(&g)));
    g
}

/// Number of reachable ops named `name`.
fn count(f: &Function, name: &str) -> usize {
    let mut n = 0;
    f.walk(|i| n += usize::from(f.insts[i].op.name() == name));
    n
}

/// Asserts that `f` has `n` reachable ops named `name` for every `(name, n)` of `want`.
#[track_caller]
fn assert_counts(f: &Function, want: &[(&str, usize)]) {
    for &(name, n) in want {
        assert_eq!(count(f, name), n, "number of `{name}` ops in\n{}", print(f));
    }
}

fn find(f: &Function, pred: impl Fn(Inst) -> bool) -> Option<Inst> {
    let mut found = None;
    f.walk(|i| {
        if found.is_none() && pred(i) {
            found = Some(i);
        }
    });
    found
}

#[test]
fn softmax_cse_merges_row_offset() {
    let f = softmax(128, DType::BF16);
    assert_eq!(count(&f, "mul"), 2);
    let g = canon(&f);
    assert_eq!(count(&g, "mul"), 1, "{}", print(&g));
    // The `-inf` of the masked load became a `full`.
    assert_eq!(count(&g, "full"), 1);
    insta::assert_snapshot!(print(&g));
}

#[test]
fn cse_alone_and_dce_alone() {
    let mut f = softmax(64, DType::F32);
    assert_eq!(cse(&mut f), 1);
    verify(&f).unwrap();
    assert_eq!(dce(&mut f), 0);
    verify(&f).unwrap();
}

/// Each pass on its own leaves valid IR, in any order.
#[test]
fn every_pass_alone_keeps_the_ir_valid() {
    for seed in 0..200 {
        let f = random_kernel(seed);
        let mut g = f.clone();
        dce(&mut g);
        verify(&g).unwrap_or_else(|e| panic!("dce, seed {seed}: {e}"));
        cse(&mut g);
        verify(&g).unwrap_or_else(|e| panic!("cse, seed {seed}: {e}"));
        let mut h = f.clone();
        cse(&mut h);
        verify(&h).unwrap_or_else(|e| panic!("cse, seed {seed}: {e}"));
        canonicalize(&mut h);
        verify(&h).unwrap_or_else(|e| panic!("canonicalize, seed {seed}: {e}"));
    }
}

#[test]
fn folds_two_times_three_plus_x() {
    let line = std::cell::Cell::new(0);
    let f = kernel("fold", || {
        let x_ptr = param_ptr("x_ptr", DType::I32);
        let offs = arange(0, 16);
        let x = load(x_ptr + offs, None, None);
        line.set(line!() + 1);
        let y = constant(2, DType::I32) * 3 + x;
        store(x_ptr + offs, y, None);
    });
    let g = canon(&f);
    assert_eq!(count(&g, "mul"), 0);
    assert_eq!(count(&g, "const"), 0, "the folded scalar is splat into the `full` and dies");
    let six = find(&g, |i| print_op(&g, i).starts_with("full {value = 6")).expect("a `full` of 6");
    // The `full` replaced the `splat` of the folded product, created on that line.
    assert_eq!(g.insts[six].loc.line, line.get());
    insta::assert_snapshot!(print(&g));
}

fn print_op(f: &Function, i: Inst) -> String {
    let attrs: Vec<String> =
        f.insts[i].op.attrs().iter().map(|(k, v)| format!("{k} = {}", crate::print::fmt_attr(v))).collect();
    format!("{} {{{}}}", f.insts[i].op.name(), attrs.join(", "))
}

#[test]
fn dce_removes_unused_loads_but_not_stores() {
    let f = kernel("dead_load", || {
        let x_ptr = param_ptr("x_ptr", DType::F32);
        let y_ptr = param_ptr("y_ptr", DType::F32);
        let offs = program_id(0) * 64 + arange(0, 64);
        let x = load(x_ptr + offs, None, None);
        let _unused = load(y_ptr + offs * 2, Some(offs.lt(7)), None);
        store(x_ptr + offs, x, None);
    });
    let g = canon(&f);
    assert_counts(&g, &[("load", 1), ("store", 1), ("cmp", 0)]);
    insta::assert_snapshot!(print(&g));
}

#[test]
fn dce_removes_pure_loops_and_keeps_effectful_control_flow() {
    let f = kernel("loops", || {
        let p = param_ptr("p", DType::I32);
        let n = param_scalar("n", DType::I32);
        // Pure, result unused: removed with everything it used.
        let _ = for_range(0, n, 1, &[zeros(&[16], DType::I32)], |iv, acc| vec![acc[0] + iv]);
        // Result unused, but the body stores: kept.
        let _ = for_range(0, n, 1, &[constant(0, DType::I32)], |iv, acc| {
            store(p + iv, acc[0], None);
            vec![acc[0] + 1]
        });
        // A runtime `if` whose branch stores and an assert: kept.
        if_then(n.gt(3), || store(p, 1, None));
        device_assert(n.ge(0), "n must be non-negative");
        // A pure `if` without results: removed.
        if_then(n.gt(5), || {
            let _ = n * 2;
        });
    });
    let g = canon(&f);
    assert_counts(&g, &[("for", 1), ("if", 1), ("store", 2), ("assert", 1)]);
    insta::assert_snapshot!(print(&g));
}

#[test]
fn dce_prunes_dead_loop_carried_values() {
    let f = kernel("carried", || {
        let p = param_ptr("p", DType::F32);
        let n = param_scalar("n", DType::I32);
        let offs = arange(0, 32);
        let init = [zeros(&[32], DType::F32), zeros(&[32], DType::I32), constant(0, DType::I32)];
        let r = for_range(0, n, 1, &init, |iv, c| {
            let x = load(p + offs + iv, None, None);
            // c[1] only feeds itself; c[2] is passed through.
            vec![c[0] + x, c[1] * 3 + iv, c[2]]
        });
        store(p + offs, r[0], None);
    });
    let g = canon(&f);
    let for_inst = find(&g, |i| g.insts[i].op.name() == "for").unwrap();
    assert_eq!(g.insts[for_inst].results.len(), 1);
    assert_eq!(g.insts[for_inst].args.len(), 4);
    insta::assert_snapshot!(print(&g));
}

#[test]
fn keeps_carried_values_that_reach_side_effects() {
    let f = kernel("carried_store", || {
        let p = param_ptr("p", DType::I32);
        let n = param_scalar("n", DType::I32);
        let r = for_range(0, n, 1, &[constant(0, DType::I32), constant(1, DType::I32)], |iv, c| {
            store(p + iv, c[1], None);
            vec![c[0] + 1, c[1] * 2]
        });
        store(p, r[0], None);
    });
    let g = canon(&f);
    let for_inst = find(&g, |i| g.insts[i].op.name() == "for").unwrap();
    assert_eq!(g.insts[for_inst].results.len(), 2);
}

#[test]
fn exact_identities() {
    let f = kernel("identities", || {
        let pi = param_ptr("pi", DType::I32);
        let pf = param_ptr("pf", DType::F32);
        let pu = param_ptr("pu", DType::U8);
        let offs = arange(0, 8);
        let x = load(pi + offs, None, None);
        let y = load(pf + offs, None, None);
        let m = offs.lt(5);
        let t = full(&[8], true, DType::I1);
        let z = full(&[8], false, DType::I1);
        // Integers: all fold to `x` or to zero.
        // (The function forms keep clippy from judging the identities.)
        let i = sub(div(mul(add(x, 0), 1), 1), 0);
        let i = or(add(0, i), 0);
        let i = add(add(i, mul(x, 0)), rem(x, 1));
        let i = where_(m, i, i);
        // Masks: `m & true`, `m | false`, `m & false` -> `m`, `m`, false.
        let mm = or(and(m, t), z);
        let dead = and(m, z);
        store(pi + offs, i, Some(or(mm, dead)));
        // Floats: `y * 1.0` and `y + -0.0` fold; `y + 0.0` and `y * 0.0` do not.
        let yf = y * 1.0 + (-0.0f32);
        store(pf + offs, yf + 0.0, None);
        store(pf + offs, yf * 0.0, None);
        // Unsigned: all-ones is 255.
        let u = load(pu + offs, None, None);
        store(pu + offs, and(u, 255) | 0, None);
    });
    let g = canon(&f);
    insta::assert_snapshot!(print(&g));
    assert_counts(&g, &[("select", 0), ("and", 0), ("or", 0), ("div", 0), ("rem", 0)]);
    assert_eq!(count(&g, "add"), 1, "only `yf + 0.0` stays");
    assert_eq!(count(&g, "mul"), 1, "only `yf * 0.0` stays");
}

#[test]
fn constant_folding_respects_numeric_semantics() {
    let f = kernel("numerics", || {
        let pi = param_ptr("pi", DType::I32);
        let pu = param_ptr("pu", DType::U32);
        let pb = param_ptr("pb", DType::BF16);
        let pf = param_ptr("pf", DType::F32);
        // Signed overflow and division by zero stay for the interpreter to report.
        store(pi, constant(i32::MAX, DType::I32) + 1, None);
        store(pi, constant(7, DType::I32) / 0, None);
        store(pi, constant(i32::MIN, DType::I32) / -1, None);
        // Unsigned arithmetic wraps.
        store(pu, constant(0, DType::U32) - 1, None);
        // bf16 rounds to nearest even: 1 + 1/256 is a tie and goes to 1.
        store(pb, constant(1.0, DType::BF16) + constant(1.0 / 256.0, DType::BF16), None);
        // Float to int saturates and truncates toward zero.
        store(pi, cast(constant(3e9, DType::F32), DType::I32), None);
        store(pi, cast(constant(-2.7, DType::F32), DType::I32), None);
        // Comparisons, `select` on a constant, transcendentals are not folded.
        let c = constant(3, DType::I32).lt(4);
        store(pi, where_(c, constant(10, DType::I32), constant(20, DType::I32)), None);
        store(pf, exp(constant(1.0, DType::F32)), None);
        store(pf, fma(constant(2.0, DType::F32), 3.0, 1.0), None);
    });
    let g = canon(&f);
    insta::assert_snapshot!(print(&g));
    assert_counts(&g, &[("add", 1), ("div", 2), ("exp", 1), ("fma", 0), ("cast", 0), ("select", 0)]);
}

#[test]
fn control_flow_with_known_conditions_and_trip_counts() {
    let f = kernel("control", || {
        let p = param_ptr("p", DType::I32);
        let n = param_scalar("n", DType::I32);
        // `if` on a constant: the taken branch is inlined, the other dropped
        // with its store.
        let r = if_else(
            constant(1, DType::I32).gt(0),
            || vec![n + 1],
            || {
                store(p, 0, None);
                vec![n]
            },
        );
        // Zero trips: the result is the initial value and the store never runs.
        let z = for_range(4, 4, 1, &[r[0]], |iv, c| {
            store(p + iv, c[0], None);
            vec![c[0] * 2]
        });
        // One trip: the body runs with iv = 2.
        let o = for_range(2, 3, 8, &[z[0]], |iv, c| vec![c[0] + iv]);
        store(p, o[0], None);
    });
    let g = canon(&f);
    insta::assert_snapshot!(print(&g));
    assert_counts(&g, &[("if", 0), ("for", 0), ("store", 1)]);
}

#[test]
fn cse_respects_dominance_and_purity() {
    let f = kernel("scopes", || {
        let p = param_ptr("p", DType::I32);
        let n = param_scalar("n", DType::I32);
        let a = n * 7;
        let r = if_else(n.gt(0), || vec![n * 9], || vec![n * 9]);
        let l = for_range(0, n, 1, &[a], |iv, c| {
            // Merges with `a` (the outer op dominates the body).
            let b = n * 7;
            vec![c[0] + b + iv]
        });
        // Two equal loads are not merged.
        let x = load(p, None, None);
        let y = load(p, None, None);
        store(p, r[0] + l[0] + x + y, None);
    });
    let g = canon(&f);
    insta::assert_snapshot!(print(&g));
    // `n * 7` once; `n * 9` in each branch (sibling regions do not see each other).
    assert_counts(&g, &[("mul", 3), ("load", 2)]);
}

#[test]
fn canonicalize_is_idempotent() {
    for f in [softmax(256, DType::F16), random_kernel(7), random_kernel(8)] {
        let mut g = canon(&f);
        let before = print(&g);
        let stats = canonicalize(&mut g);
        assert_eq!(stats.folded + stats.simplified + stats.merged + stats.removed, 0, "{stats:?}");
        assert_eq!(stats.rounds, 1);
        assert_eq!(print(&g), before);
    }
}

/// Canonicalization keeps what every random kernel stores, for random arguments.
#[test]
fn random_kernels_compute_the_same_after_canonicalization() {
    let mut rng = Rng(0x5eed);
    let mut compared = 0;
    for RandomCase { seed, kernel: f, canonical: g, args: cases } in random_cases(&mut rng, 0..400) {
        assert!(g.num_live_insts() <= f.num_live_insts());
        for (args, pid) in cases {
            let Ok(before) = run(&f, &args, pid) else { continue };
            let after = run(&g, &args, pid).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", print(&g)));
            assert_eq!(
                before.stores,
                after.stores,
                "seed {seed}, args {args:?}\n{}\n{}",
                print(&f),
                print(&g)
            );
            compared += 1;
        }
    }
    assert!(compared > 400, "too few runs without errors: {compared}");
}
