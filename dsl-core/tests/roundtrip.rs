//! Round-trip tests of the IR text format: `print(parse(print(f))) == print(f)`
//! with and without locations for kernels covering every op family (and
//! `load_block` with its attributes), precise
//! positions of parse errors, and a no-panic check on truncated and mutated text.

use dsl_core::ir::ParamHints;
use dsl_core::ir::ops::{CacheModifier, CmpPred, DotPrecision, EvictionPolicy, MemScope, MemSem};
use dsl_core::lang::*;
use dsl_core::parse::parse;
use dsl_core::print::{print, print_with_locs};
use dsl_core::{Error, Function, Location, Type};
use proptest::prelude::*;

// ---- kernels ----------------------------------------------------------------

/// The hand-built kernels of the `tests` crate (vector add, softmax, ...):
/// included, as this crate cannot depend on `tests`.
#[allow(dead_code)]
#[path = "../../tests/src/hand.rs"]
mod hand;

/// The kernel `name` built from `body`, located at the caller; panics on a
/// build error.
#[track_caller]
fn kernel(name: &str, body: impl FnOnce()) -> Function {
    KernelBuilder::new(name).build(body).unwrap()
}

fn matmul() -> Function {
    const BM: usize = 32;
    const BN: usize = 32;
    const BK: usize = 16;
    kernel("matmul", || {
        let a_ptr = param_ptr("a_ptr", DType::F16);
        let b_ptr = param_ptr("b_ptr", DType::F16);
        let c_ptr = param_ptr("c_ptr", DType::F32);
        let n = param_scalar("n", DType::I32);
        let k = param_scalar("k", DType::I32);
        let rm = program_id(0) * BM as i32 + arange(0, BM as i32);
        let rn = program_id(1) * BN as i32 + arange(0, BN as i32);
        let rk = arange(0, BK as i32);
        let a_ptrs = a_ptr + (rm.expand_dims(1) * k + rk.expand_dims(0));
        let b_ptrs = b_ptr + (rk.expand_dims(1) * n + rn.expand_dims(0));
        let acc = zeros(&[BM, BN], DType::F32);
        let out = for_range(0, k, BK as i32, &[acc, a_ptrs, b_ptrs], |_kk, c| {
            let a = load(c[1], None, None);
            let b = load(c[2], None, None);
            let acc = dot(a, b, Some(c[0]));
            vec![acc, c[1] + BK as i32, c[2] + (BK as i32 * n)]
        });
        let c_ptrs = c_ptr + (rm.expand_dims(1) * n + rn.expand_dims(0));
        store(c_ptrs, out[0], None);
        // A second product without accumulator, in tf32, with an empty-carry loop.
        let a = load(a_ptrs, None, None).to(DType::F32);
        let t = dot_with(a, trans(a), None, DotPrecision::Tf32);
        for_range(0, 4, 1, &[], |i, _| {
            store(c_ptr + i, sum(sum(t, 1), 0), None);
            Vec::new()
        });
    })
}

fn control_flow() -> Function {
    kernel("collatz", || {
        let x = param_scalar("x", DType::I32);
        let out = param_ptr("out", DType::I32);
        let r = while_loop(
            &[x, constant(0, DType::I32)],
            |c| c[0].gt(1),
            |c| {
                let even = (c[0] % 2).eq_(0);
                let next = if_else(even, || vec![c[0] / 2], || vec![c[0] * 3 + 1]);
                vec![next[0], c[1] + 1]
            },
        );
        store(out, r[1], None);
        if_then(r[1].gt(100), || store(out + 1, r[0], None));
        // An integer condition (compared with zero) and an `if` with two results.
        let both = if_else(x, || vec![x, r[0]], || vec![r[1], x]);
        store(out + 2, both[0] + both[1], None);
    })
}

fn reductions() -> Function {
    kernel("reductions", || {
        let p = param_ptr("p", DType::F32);
        let q = param_ptr("q", DType::I32);
        let offs = arange(0, 16).expand_dims(1) * 64 + arange(0, 64).expand_dims(0);
        let x = load(p + offs, None, None);
        let idx = broadcast_to(arange(0, 64).expand_dims(0), &[16, 64]);
        let r = reduce(&[x, idx], 1, |a, b| {
            let take = b[0].gt(a[0]);
            vec![where_(take, b[0], a[0]), where_(take, b[1], a[1])]
        });
        store(p + arange(0, 16), r[0], None);
        store(q + arange(0, 16), r[1], None);
        let s = scan(&[x], 1, false, |a, b| vec![a[0] + b[0]]);
        let rs = scan(&[x, idx], 0, true, |a, b| vec![maximum(a[0], b[0]), a[1] + b[1]]);
        let cs = cumsum(idx, 1);
        let cm = cummax(x, 0);
        let cn = cummin(x, -1);
        store(p + offs, s[0] + rs[0] + cm + cn, None);
        store(q + offs, cs + rs[1], None);
        store(q + arange(0, 16), argmax(x, 1) + argmin(x, 1), None);
        store(p + arange(0, 64), max(x, 0) + min(x, 0) + sum(x, 0), None);
    })
}

fn atomics() -> Function {
    kernel("atomics", || {
        let counts = param_ptr("counts", DType::I32);
        let hist = param_ptr("hist", DType::F32);
        let lock = param_ptr("lock", DType::I32);
        let n = param_scalar("n", DType::I32);
        let offs = arange(0, 128);
        let mask = offs.lt(n);
        let old = atomic_add(counts + offs, 1, Some(mask));
        let m = atomic_max(hist + offs, 2.5f32, None);
        let mn = atomic_min(counts + offs, old, Some(mask));
        let a = atomic_and(counts + offs, 7, None) | atomic_or(counts + offs, 8, None);
        let xo = atomic_xor(counts + offs, mn, Some(mask)) ^ a;
        let prev = atomic_cas(lock, 0, 1);
        let sw = atomic_xchg(lock, prev, None);
        store(hist + offs, m + atomic_add(hist + offs, 1.0f32, None), Some(mask));
        store(counts + offs, xo + sw, None);
    })
}

/// The synchronisation between programs: ordered loads and stores, atomics
/// with explicit orderings, waits inside a persistent loop, prefetches.
fn sync_ops() -> Function {
    kernel("sync_ops", || {
        let flags = param_ptr("flags", DType::I32);
        let counts = param_ptr("counts", DType::U32);
        let w = param_ptr("w", DType::F16);
        let n = param_scalar("n", DType::I32);
        let gpu = MemScope::Gpu;
        for_range(program_id(0), n, num_programs(0), &[], |t, _| {
            wait_until(flags + t, CmpPred::Ge, 1);
            wait_until_opts(counts + t, CmpPred::Ne, 0, Some(MemSem::Relaxed), MemScope::Sys);
            let offs = t * 64 + arange(0, 64);
            prefetch_l2(w + offs + 64, Some(offs.lt(n)));
            prefetch_l2(w + offs, None);
            let f = load_opts(
                flags + t,
                None,
                None,
                CacheModifier::None,
                EvictionPolicy::Normal,
                Some(MemSem::Acquire),
                gpu,
            );
            let c = load_opts(
                counts + arange(0, 4),
                None,
                None,
                CacheModifier::None,
                EvictionPolicy::Normal,
                Some(MemSem::Relaxed),
                MemScope::Cta,
            );
            store_opts(flags + t + 1, f, None, Some(MemSem::Release), gpu);
            store_opts(
                counts + arange(0, 4),
                c,
                Some(arange(0, 4).lt(n)),
                Some(MemSem::Relaxed),
                MemScope::Sys,
            );
            atomic_add_opts(flags + n, 1, None, Some(MemSem::Release), gpu);
            atomic_xchg_opts(counts + t, 0u32, None, Some(MemSem::Relaxed), MemScope::Cta);
            atomic_cas_opts(flags, 0, 1, Some(MemSem::Acquire), MemScope::Sys);
            vec![]
        });
    })
}

fn shapes() -> Function {
    kernel("shapes", || {
        let p = param_ptr("p", DType::F16);
        let a = load(p + arange(0, 64), None, None);
        let b = load(p + arange(64, 128), None, None);
        let j = join(a, b);
        let r = reshape(j, &[8, 16]);
        let t = permute(r, &[1, 0]);
        let (lo, hi) = split(reshape(t, &[64, 2]));
        let e = broadcast_to(lo.expand_dims(0), &[4, 64]);
        let f = reshape(e, &[256]);
        store(p + arange(0, 64), lo * hi, None);
        store(p + arange(0, 256), f, None);
    })
}

fn hints_debug_casts() -> Function {
    kernel("hints_debug_casts", || {
        let x = param_with_hints("x", Type::ptr(DType::F32), ParamHints { divisibility: Some(16) });
        let n = param_with_hints("n", Type::scalar(DType::I32), ParamHints { divisibility: Some(8) });
        let y = param_ptr("y", DType::U8);
        let offs = max_contiguous(multiple_of(program_id(0) * 64 + arange(0, 64), 64), 64);
        let base = max_constancy(multiple_of(n, 16), 1);
        gdc_wait();
        gdc_launch_dependents();
        let v = load_with(
            x + offs,
            Some(offs.lt(base)),
            Some(0.1f32.into()),
            MemOpts { cache: CacheModifier::Cg, evict: EvictionPolicy::First, volatile: true, order: None },
        );
        device_assert(v.ge(0.0f32), "v must be \"non-negative\"\n\t(ünïcødé \\ check) \u{7f}");
        device_print("v = ", &[v, offs]);
        device_print("", &[]);
        let h = v.to(DType::BF16).to(DType::F16);
        let bits = bitcast(h, DType::I16).to(DType::I64);
        let back = bitcast(bits, DType::F64);
        let u = ptrcast(x, DType::U32);
        let w = load(u + offs, None, None).to(DType::U8);
        let flag = cast(w, DType::I1);
        store_with(
            y + offs,
            w,
            Some(flag),
            MemOpts { cache: CacheModifier::Cs, evict: EvictionPolicy::Last, volatile: false, order: None },
        );
        store(x + offs, back.to(DType::F32), None);
    })
}

fn constants_and_math() -> Function {
    kernel("constants_and_math", || {
        let p = param_ptr("p", DType::F32);
        let q = param_ptr("q", DType::I64);
        let r = param_ptr("r", DType::U32);
        let b = param_ptr("b", DType::I1);
        let d = param_ptr("d", DType::F64);
        let x = load(p + arange(0, 32), None, None);
        let consts = [0.1f64, 1e-5, -0.0, 1e300, -2.5e-300, 3.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
        let mut acc = x;
        for c in consts {
            acc = acc + constant(c, DType::F32);
        }
        let wide = [1e300f64, -2.5e-300, 1e-5, 123456789.125, 5e-324, f64::MAX];
        let mut wacc = constant(0.0f64, DType::F64);
        for c in wide {
            wacc = wacc + constant(c, DType::F64);
        }
        store(d + 1, wacc, None);
        let h = constant(65504.0f64, DType::F16) + constant(1.0e-7f64, DType::F16);
        let bf = constant(3.140625f64, DType::BF16) * constant(-1e38f64, DType::BF16);
        let dd = constant(0.1f64, DType::F64) + constant(f64::MIN_POSITIVE, DType::F64);
        store(d, dd + h.to(DType::F64) + bf.to(DType::F64), None);
        store(q, constant(i64::MIN, DType::I64) + constant(i64::MAX, DType::I64), None);
        store(r, constant(u32::MAX as i64, DType::U32), None);
        store(b, constant(true, DType::I1) ^ constant(false, DType::I1), None);
        let m = fma(acc, x, full(&[32], 0.5f64, DType::F32));
        let t = sigmoid(tanh(sin(cos(exp2(log2(log(sqrt(rsqrt(abs(neg(m)))))))))));
        let t = erf(floor(ceil(t))) + pow(t, x);
        let t = minimum(t, x) - maximum(t, x) / t;
        let i = arange(0, 32);
        let bits = (i << 2) >> 1;
        let bits = (bits & 3) | ((bits ^ 5) % 7);
        let bits = umulhi(bits, bits) + not(bits);
        let bits = dp4a(bits, bitcast(bits, DType::U32), dp4a(bits, 0x0101_0101, 7));
        let c = i.le(bits) & i.ge(bits) | i.ne_(bits) ^ i.eq_(bits);
        let sel = where_(c, t, x);
        store(p + i, sel + num_programs(2).to(DType::F32), Some(c));
        store(q + i, cdiv(bits, 3).to(DType::I64), None);
    })
}

fn block_loads() -> Function {
    kernel("block_loads", || {
        let x = param_with_hints("x", Type::ptr(DType::BF16), ParamHints { divisibility: Some(16) });
        let out = param_ptr("out", DType::F32);
        let rows = param_scalar("rows", DType::I32);
        let cols = param_scalar("cols", DType::I32);
        let acc = zeros(&[32, 64], DType::F32);
        let r = for_range(0, cols, 64, &[acc], |k, c| {
            let t = load_block(x, rows, cols, cols, program_id(0) * 32, k, [32, 64]);
            vec![c[0] + t.to(DType::F32)]
        });
        let hinted =
            load_block_hinted(x, 7, 9, 16, -2, -3, [1, 64], CacheModifier::Ca, EvictionPolicy::Normal);
        let last =
            load_block_hinted(x, rows, cols, cols, 0, 0, [1, 64], CacheModifier::None, EvictionPolicy::Last);
        let offs = arange(0, 32).expand_dims(1) * 64 + arange(0, 64).expand_dims(0);
        store(out + offs, r[0] + hinted.to(DType::F32) + last.to(DType::F32), None);
    })
}

fn all_kernels() -> Vec<(&'static str, Function)> {
    vec![
        ("vector_add", hand::vector_add(1024).unwrap()),
        ("softmax_bf16", hand::softmax(256, DType::BF16).unwrap()),
        ("matmul", matmul()),
        ("control_flow", control_flow()),
        ("reductions", reductions()),
        ("atomics", atomics()),
        ("sync_ops", sync_ops()),
        ("shapes", shapes()),
        ("hints_debug_casts", hints_debug_casts()),
        ("constants_and_math", constants_and_math()),
        ("block_loads", block_loads()),
    ]
}

// ---- round trips --------------------------------------------------------------

/// Asserts that `g` (parsed) has the same structure, ops, types and locations as `f`.
fn assert_same(f: &Function, g: &Function, with_locs: bool) {
    assert_eq!(f.name, g.name);
    assert_eq!(f.params.len(), g.params.len());
    for (a, b) in f.params.iter().zip(&g.params) {
        assert_eq!((&a.name, &a.hints, f.ty(a.value)), (&b.name, &b.hints, g.ty(b.value)));
    }
    let (mut fi, mut gi) = (Vec::new(), Vec::new());
    f.walk(|i| fi.push(i));
    g.walk(|i| gi.push(i));
    assert_eq!(fi.len(), gi.len(), "instruction count");
    for (&i, &j) in fi.iter().zip(&gi) {
        let (a, b) = (&f.insts[i], &g.insts[j]);
        assert_eq!(a.op, b.op);
        assert_eq!(a.args.len(), b.args.len());
        assert_eq!(a.regions.len(), b.regions.len());
        let tys = |func: &Function, vs: &[dsl_core::Value]| -> Vec<Type> {
            vs.iter().map(|&v| func.ty(v).clone()).collect()
        };
        assert_eq!(tys(f, &a.args), tys(g, &b.args));
        assert_eq!(tys(f, &a.results), tys(g, &b.results));
        if with_locs {
            assert_eq!(a.loc, b.loc, "location of `{}`", a.op.name());
        }
    }
    if with_locs {
        assert_eq!(f.loc, g.loc);
    }
}

#[test]
fn round_trips_without_locations() {
    for (name, f) in all_kernels() {
        let text = print(&f);
        let g = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(print(&g), text, "{name}");
        assert_same(&f, &g, false);
    }
}

#[test]
fn round_trips_with_locations() {
    for (name, f) in all_kernels() {
        let text = print_with_locs(&f);
        // Located in this file, or in the included `hand.rs`.
        let files = ["loc(\"dsl-core/tests/roundtrip.rs\":", "/tests/src/hand.rs\":"];
        assert!(files.iter().any(|file| text.contains(file)), "{name}:\n{text}");
        let g = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(print_with_locs(&g), text, "{name}");
        assert_eq!(print(&g), print(&f), "{name}");
        assert_same(&f, &g, true);
    }
}

#[test]
fn round_trips_odd_locations_and_names() {
    let weird = Location::new("we\"ird\\dir/ünï\tcødé\n.rs", 4_000_000_000, 0);
    let mut f = KernelBuilder::with_location("odd_locs", weird.clone())
        .build(|| {
            let p = param_ptr("p_ünï", DType::F32);
            store(p, 1.0f32, None);
        })
        .unwrap();
    let first = f.insts.keys().next().unwrap();
    f.insts[first].loc = Location::new("", 7, 9);
    let last = f.insts.keys().last().unwrap();
    f.insts[last].loc = Location::unknown();
    let text = print_with_locs(&f);
    let g = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_with_locs(&g), text);
    assert_eq!(g.loc, weird);
    assert_same(&f, &g, true);
}

#[test]
fn parses_hand_written_text() {
    // Blank lines, comments and CRLF line endings are accepted; numbering need not be dense.
    let text = "// a comment\r\n\r\nkernel @k(%x: ptr<f32> {divisibility = 16}, %n: i32) {  // header\r\n  \
                %7 = const {value = 1} : f32\r\n\r\n  %3 = splat %7 {shape = [4]} : tensor<4xf32>\r\n  \
                %a = arange {start = 0, end = 4} : tensor<4xi32>\r\n  %p = splat %x {shape = [4]} : \
                tensor<4xptr<f32>>\r\n  %q = addptr %p, %a : tensor<4xptr<f32>>\r\n  store %q, %3\r\n}\r\n";
    let f = parse(text).unwrap();
    assert_eq!(print(&parse("kernel @empty() {\n}").unwrap()), "kernel @empty() {\n}\n");
    assert_eq!(
        print(&f),
        "kernel @k(%x: ptr<f32> {divisibility = 16}, %n: i32) {\n  %0 = const {value = 1.0} : f32\n  \
         %1 = splat %0 {shape = [4]} : tensor<4xf32>\n  %2 = arange {start = 0, end = 4} : tensor<4xi32>\n  \
         %3 = splat %x {shape = [4]} : tensor<4xptr<f32>>\n  %4 = addptr %3, %2 : tensor<4xptr<f32>>\n  \
         store %4, %1\n}\n"
    );
}

// ---- errors -------------------------------------------------------------------

/// Parses `text`, expecting a parse error at `line`, `col` (1-based) with a
/// message containing `msg`.
fn expect_error_at(text: &str, line: usize, col: usize, msg: &str) {
    match parse(text) {
        Err(Error::Parse { line: l, col: c, message }) => {
            assert_eq!((l, c), (line, col), "position of error {message:?} in\n{text}");
            assert!(message.contains(msg), "message {message:?} lacks {msg:?}");
        }
        Err(other) => panic!("expected a parse error, got {other}"),
        Ok(f) => panic!("expected a parse error, parsed\n{}", print(&f)),
    }
}

/// Marks in a test text where its parse error is expected: just before the
/// offending token. It is not part of the text that is parsed.
const MARK: char = '$';

/// Parses `marked` without its [`MARK`], expecting a parse error at the line
/// and column of the mark, with a message containing `msg`.
fn expect_error(marked: &str, msg: &str) {
    let at = marked.find(MARK).unwrap_or_else(|| panic!("no error mark in\n{marked}"));
    let before = &marked[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    expect_error_at(&marked.replacen(MARK, "", 1), line, col, msg);
}

const HEADER: &str = "kernel @k(%x: ptr<f32>, %n: i32) {\n";

/// The kernel of [`HEADER`] whose body is the op lines `body`, each indented
/// by two spaces, closed.
fn in_kernel(body: &str) -> String {
    let ops: String = body.lines().map(|l| format!("  {l}\n")).collect();
    format!("{HEADER}{ops}}}\n")
}

/// Errors in the body of a [`HEADER`] kernel, as `(body, msg)`: `body` holds the
/// op lines for [`in_kernel`] with the [`MARK`] where the error is expected,
/// `msg` is part of the expected message. In order: unknown ops, undefined and
/// redefined values, bad types, regions, attributes, `load_block` operands and
/// structure.
const BODY_ERRORS: &[(&str, &str)] = &[
    ("%0 = program_id {axis = 0} : i32\n%1 = $frobnicate %0 : i32", "unknown op `frobnicate`"),
    ("%0 = program_id {axis = 0} : i32\n%1 = add %0, $%9 : i32", "undefined value `%9`"),
    ("%0 = program_id {axis = 0} : i32\n$%0 = add %0, %0 : i32", "already defined at line 2, column 3"),
    ("$%n = program_id {axis = 0} : i32", "already defined at line 1"),
    ("%0 = add $%0, %n : i32", "used by the op that defines it"),
    // A block argument is not visible after its region.
    (
        "%0 = const {value = 0} : i32\n%1 = const {value = 1} : i32\nfor %0, %n, %1 {\n^(%2: i32):\n  yield\n}\n%3 = add $%2, %2 : i32",
        "not visible here",
    ),
    ("%0 = arange {start = 0, end = 16} : tensor<16x$f33>", "unknown element type `f33`"),
    ("%0 = program_id {axis = 0} : $int", "unknown type `int`"),
    ("%0 = arange {start = 0, end = 16} : tensor<16$f32>", "expected `x`"),
    ("%0 = arange {start = 0, end = 16} : $tensor<16xi32", "unterminated type"),
    ("%0 = splat %n {shape = [65536, 65536, 2]} : tensor<65536x65536x$2xi32>", "larger than"),
    (
        "%0 = arange {start = 0, end = 4} : tensor<4xi32>\n%1 = reshape %0 {shape = $[65536, 65536, 2]} : tensor<4xi32>",
        "more than 4294967296 elements",
    ),
    // Types are checked against the op by the verifier, reported at the op.
    ("%0 = $program_id {axis = 0} : f32", "do not match the inferred (i32)"),
    ("%0 = $arange {start = 0, end = 12} : tensor<12xi32>", "not a power of two"),
    ("%0 = program_id {axis = 0} $: i32, i32", "1 result name(s) but 2 result type(s)"),
    // A region's `{` must end its line.
    ("%0 = const : i32 {$value = 0}", "a region's ops start on the next line"),
    ("%0 = program_id {axis = 0, $foo = 1} : i32", "unexpected attribute `foo` on `program_id`"),
    ("%0 = program_id {axis = 0, $axis = 1} : i32", "duplicate attribute `axis`"),
    ("%0 = $program_id : i32", "missing attribute `axis`"),
    ("%0 = program_id {axis = $lots} : i32", "must be an integer"),
    ("%0 = cmp %n, %n {pred = $lq} : i1", "unknown predicate `lq`"),
    ("%0 = load %x {mask = $1} : f32", "is a flag and takes no value"),
    ("%0 = load %x {$cache = none} : f32", "default values are written by leaving the attribute out"),
    ("%0 = const {value = $300} : i8", "300 does not fit in i8"),
    ("%0 = const {value = $1.5} : i32", "expected an integer constant"),
    ("%0 = const {value = $maybe} : i1", "expected a number"),
    ("assert %n {message = \"bad $\\q escape\"}", "unknown escape `\\q`"),
    ("print %n {prefix = $\"open}", "unterminated string"),
    (
        "%0 = $load_block %x, %n, %n, %n, %n {br = 4, bc = 8} : tensor<4x8xf32>",
        "`load_block` takes 6 operand(s), found 5",
    ),
    (
        "%0 = $load_block %n, %n, %n, %n, %n, %n {br = 4, bc = 8} : tensor<4x8xf32>",
        "needs a scalar pointer (the matrix base) as operand 0 (`ptr`), found i32",
    ),
    (
        "%0 = const {value = 1.0} : f32\n%1 = $load_block %x, %n, %n, %0, %n, %n {br = 4, bc = 8} : tensor<4x8xf32>",
        "operand 3 (`row_stride`) must be an i32 scalar, found f32",
    ),
    (
        "%0 = $load_block %x, %n, %n, %n, %n, %n {br = 4, bc = 6} : tensor<4x6xf32>",
        "block dimensions must be powers of two, found [4, 6]",
    ),
    (
        "%0 = $load_block %x, %n, %n, %n, %n, %n {br = 4, bc = 8} : tensor<8x4xf32>",
        "do not match the inferred (tensor<4x8xf32>)",
    ),
    ("%0 = $load_block %x, %n, %n, %n, %n, %n {br = 4} : tensor<4x8xf32>", "missing attribute `bc`"),
    // A `for` whose body does not yield its carried value: a verifier finding.
    (
        "%0 = const {value = 0} : i32\n%1 = const {value = 1.0} : f32\n%2 = $for %0, %n, %0, %1 : f32 {\n^(%3: i32, %4: f32):\n  yield\n}",
        "invalid IR: in `for`: region 0 ends with `yield`",
    ),
    ("$yield", "must not end with a terminator"),
];

/// Every case of [`BODY_ERRORS`]: unknown ops, undefined and redefined values,
/// bad types and attributes, malformed `load_block`s and bad structure.
#[test]
fn error_positions_in_kernel_bodies() {
    // The well-formed `load_block` that the `load_block` cases break.
    let ok = in_kernel("%0 = load_block %x, %n, %n, %n, %n, %n {br = 4, bc = 8} : tensor<4x8xf32>");
    assert!(parse(&ok).is_ok());
    for &(body, msg) in BODY_ERRORS {
        expect_error(&in_kernel(body), msg);
    }
}

#[test]
fn error_bad_types() {
    expect_error("kernel @k(%x: ptr<$q8>) {\n}\n", "unknown pointee type `q8`");
}

#[test]
fn error_unterminated_region() {
    let text = format!(
        "{HEADER}  %0 = const {{value = 0}} : i32\n  %1 = const {{value = 1}} : i32\n  \
         for %0, %n, %1 {{\n  ^(%2: i32):\n    yield\n"
    );
    expect_error_at(&text, 7, 1, "the region opened at line 4, column 18 is not closed");
    let text = format!("{HEADER}  %0 = program_id {{axis = 0}} : i32\n");
    expect_error_at(&text, 3, 1, "the kernel body opened at line 1, column 34");
}

#[test]
fn error_wrong_attributes() {
    expect_error("kernel @k(%x: ptr<f32> {$align = 16}) {\n}\n", "unknown parameter hint `align`");
}

#[test]
fn error_structure_reported_at_op() {
    expect_error("$kernel @k(%x: tensor<4xf32>) {\n}\n", "parameter `x` must be a scalar or pointer");
    expect_error(&format!("{HEADER}}}\n{MARK}trailing\n"), "expected the end of the input");
    expect_error("$", "expected `kernel`");
}

// ---- robustness ---------------------------------------------------------------

/// Nested `if`s `depth` deep, each branch yielding nothing.
fn nested_ifs(depth: usize) -> String {
    let mut text = String::from("kernel @deep(%c: i1) {\n");
    for d in 1..=depth {
        text.push_str(&format!("{}if %c {{\n", "  ".repeat(d)));
    }
    for d in (1..=depth).rev() {
        let pad = "  ".repeat(d);
        text.push_str(&format!("{pad}  yield\n{pad}}} {{\n{pad}  yield\n{pad}}}\n"));
    }
    text.push_str("}\n");
    text
}

#[test]
fn nesting_is_bounded() {
    let text = nested_ifs(100);
    assert_eq!(print(&parse(&text).unwrap()), text);
    expect_error_at(&nested_ifs(1000), 130, 2 * 129 + 7, "nested more than 128 deep");
}

#[test]
fn every_truncation_is_an_error() {
    for (name, f) in all_kernels() {
        let text = print_with_locs(&f);
        let end = text.rfind('}').unwrap();
        // Every prefix of the kernels with nested regions and escapes; a sample of the others.
        let step = if matches!(name, "control_flow" | "hints_debug_casts") { 1 } else { 11 };
        for (i, _) in text.char_indices().filter(|&(i, _)| i <= end).step_by(step) {
            let r = parse(&text[..i]);
            assert!(matches!(r, Err(Error::Parse { .. })), "{name}: prefix of {i} bytes gave {r:?}");
        }
    }
}

/// A byte that often matters to the grammar, or any byte.
fn mutation_byte() -> impl Strategy<Value = u8> {
    prop_oneof![prop::sample::select(b"%{}()[]<>,:=^\"\\-+.0123456789xeianf \n@_".to_vec()), any::<u8>(),]
}

fn fuzz_cases() -> u32 {
    std::env::var("ROUNDTRIP_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases()))]

    /// Replacing, inserting or deleting a few bytes never panics; whatever still
    /// parses prints to text that parses back to the same text.
    #[test]
    fn mutations_never_panic(
        kernel in 0usize..9,
        edits in prop::collection::vec((any::<prop::sample::Index>(), mutation_byte(), 0u8..3), 1..5),
    ) {
        let f = &all_kernels()[kernel].1;
        let mut bytes = print_with_locs(f).into_bytes();
        for (at, b, kind) in edits {
            let i = at.index(bytes.len() + 1);
            match kind {
                0 if i < bytes.len() => bytes[i] = b,
                1 => bytes.insert(i, b),
                _ if i < bytes.len() => {
                    bytes.remove(i);
                }
                _ => {}
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let parsed = parse(&text);
        prop_assert!(matches!(parsed, Ok(_) | Err(Error::Parse { .. })), "{:?}", parsed.err());
        if let Ok(g) = parsed {
            let again = print_with_locs(&g);
            let h = parse(&again).map_err(|e| TestCaseError::fail(format!("{e}\n{again}")))?;
            prop_assert_eq!(print_with_locs(&h), again);
        }
    }
}
