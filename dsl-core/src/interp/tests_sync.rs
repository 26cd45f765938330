//! Tests of the synchronisation between programs: interleaved runs of
//! kernels that wait (hand-overs in both program orders, chains, a
//! persistent loop over a task list with dependency counters), the
//! deadlock and happens-before errors, prefetch bounds, and the build-time
//! rules of the ordered ops.

use super::tests::{contains_all, interp_err};
use super::{Arg, Buffer, launch};
use crate::builder::kernel;
use crate::ir::ops::{CacheModifier, CmpPred, EvictionPolicy, MemScope, MemSem};
use crate::lang::*;
use crate::{Error, Function};
use std::cell::Cell;

const GPU: MemScope = MemScope::Gpu;

/// One program (`producer`) writes four values, then sets `flag` with a
/// store of semantics `publish` (a plain store when `None`); every other
/// program waits for the flag with `wait` semantics and copies the values.
fn handoff(publish: Option<MemSem>, wait: MemSem) -> Function {
    kernel("handoff", || {
        let data = param_ptr("data", DType::I32);
        let flag = param_ptr("flag", DType::I32);
        let out = param_ptr("out", DType::I32);
        hand_over(
            4,
            |offs| {
                store(data + offs, offs * 10 + 7, None);
                store_opts(flag, 1, None, publish, GPU);
            },
            |pid, offs| {
                wait_until_opts(flag, CmpPred::Ge, 1, Some(wait), GPU);
                store(out + pid * 4 + offs, load(data + offs, None, None), None);
            },
        );
    })
}

/// The hand-over between programs of the kernels of these tests: declares
/// the `producer` parameter (after the caller's), then runs `produce(offs)`
/// on program `producer` and `consume(pid, offs)` on every other program,
/// with `pid = program_id(0)` and `offs` the lanes `[0, lanes)`.
pub(super) fn hand_over(lanes: i32, produce: impl FnOnce(Tensor), consume: impl FnOnce(Tensor, Tensor)) {
    let producer = param_scalar("producer", DType::I32);
    let pid = program_id(0);
    let offs = arange(0, lanes);
    if_else(
        pid.eq_(producer),
        || {
            produce(offs);
            vec![]
        },
        || {
            consume(pid, offs);
            vec![]
        },
    );
}

/// [`handoff`] with fresh buffers for it.
fn handoff_case(publish: Option<MemSem>, wait: MemSem) -> (Function, [Buffer; 3]) {
    (handoff(publish, wait), handoff_bufs())
}

/// The arguments of [`handoff`] on [`handoff_bufs`] with program `producer` producing.
fn handoff_args(producer: i32) -> [Arg; 4] {
    [Arg::ptr(0), Arg::ptr(1), Arg::ptr(2), Arg::i32(producer)]
}

fn handoff_bufs() -> [Buffer; 3] {
    [Buffer::zeros(DType::I32, 4), Buffer::zeros(DType::I32, 1), Buffer::zeros(DType::I32, 12)]
}

#[test]
fn consumers_wait_for_the_producer_before_or_after_them() {
    let f = handoff(Some(MemSem::Release), MemSem::Acquire);
    // Producer first (no wait blocks), last (both consumers block first), and in the middle.
    for producer in [0, 2, 1] {
        let mut bufs = handoff_bufs();
        let args = handoff_args(producer);
        launch(&f, [3, 1, 1], &mut bufs, &args).unwrap();
        let out = bufs[2].to_vec::<i32>();
        for p in 0..3 {
            let want: Vec<i32> = if p == producer as usize { vec![0; 4] } else { vec![7, 17, 27, 37] };
            assert_eq!(out[p * 4..p * 4 + 4], want, "producer {producer}, program {p}");
        }
    }
}

#[test]
fn a_relaxed_flag_is_a_missing_release() {
    // The flag is set with a relaxed store (and, second, a plain one): the
    // consumer sees the flag but nothing orders the data before its read.
    for publish in [Some(MemSem::Relaxed), None] {
        let (f, mut bufs) = handoff_case(publish, MemSem::Acquire);
        let args = handoff_args(1);
        let e = interp_err(&f, [2, 1, 1], &mut bufs, &args);
        assert_eq!(e.op, "load");
        assert_eq!(e.program, Some([0, 0, 0]));
        contains_all(
            &e.to_string(),
            &[
                "missing release: program (0, 0, 0) reads byte offset 0 of buffer `data`",
                "which program (1, 0, 0) stored and has not released since",
                "`sem = release`",
            ],
        );
    }
}

#[test]
fn a_relaxed_wait_is_a_missing_acquire() {
    let (f, mut bufs) = handoff_case(Some(MemSem::Release), MemSem::Relaxed);
    let args = handoff_args(0);
    let e = interp_err(&f, [2, 1, 1], &mut bufs, &args);
    contains_all(
        &e.to_string(),
        &[
            "missing acquire: program (1, 0, 0) reads byte offset 0 of buffer `data`",
            "which program (0, 0, 0) stored and then released",
        ],
    );
    // Without race detection nothing is checked and the values arrive.
    let mut bufs = handoff_bufs();
    let k = super::Kernel::new(&f).unwrap();
    super::Interpreter::new().with_race_detection(false).launch(&k, [2, 1, 1], &mut bufs, &args).unwrap();
    assert_eq!(bufs[2].to_vec::<i32>()[4..8], [7, 17, 27, 37]);
}

/// A chain: the program of rank `r` waits for `flags[r]`, adds one to the
/// value of rank `r - 1` and releases `flags[r + 1]`. With `rev` the ranks
/// run backwards over the grid, so every program but the last waits first.
fn chain() -> Function {
    kernel("chain", || {
        let vals = param_ptr("vals", DType::I32);
        let flags = param_ptr("flags", DType::I32);
        let rev = param_scalar("rev", DType::I32);
        let pid = program_id(0);
        let n = num_programs(0);
        let r = where_(rev.ne_(0), n - 1 - pid, pid);
        let prev = if_else(
            r.gt(0),
            || {
                wait_until(flags + r, CmpPred::Ge, 1);
                vec![load(vals + r - 1, None, None)]
            },
            || vec![zeros(&[], DType::I32)],
        );
        store(vals + r, prev[0] + 1, None);
        store_opts(flags + r + 1, 1, None, Some(MemSem::Release), GPU);
    })
}

#[test]
fn a_chain_of_programs_runs_in_either_grid_order() {
    let f = chain();
    for rev in [0, 1] {
        let mut bufs = [Buffer::zeros(DType::I32, 8), Buffer::zeros(DType::I32, 9)];
        launch(&f, [8, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(rev)]).unwrap();
        assert_eq!(bufs[0].to_vec::<i32>(), (1..=8).collect::<Vec<i32>>(), "rev {rev}");
        assert_eq!(bufs[1].to_vec::<i32>()[1..], [1; 8]);
    }
}

/// A persistent kernel: program `p` runs tasks `p, p + G, ...` of a task
/// list in which task `t` needs tasks `t - 1` and `t - 2`; `done[t]` counts
/// the finished dependencies (`atomic_add` with `sem`), the task waits until
/// it reaches its number of dependencies, then
/// `out[t] = 1 + out[t - 1] + out[t - 2]`.
fn task_list(sem: MemSem) -> Function {
    kernel("task_list", || {
        let out = param_ptr("out", DType::I32);
        let done = param_ptr("done", DType::I32);
        let n = param_scalar("n", DType::I32);
        for_range(program_id(0), n, num_programs(0), &[], |t, _| {
            wait_until(done + t, CmpPred::Ge, minimum(t, 2));
            let a = load(out + t - 1, Some(t.ge(1)), Some(0.into()));
            let b = load(out + t - 2, Some(t.ge(2)), Some(0.into()));
            store(out + t, a + b + 1, None);
            atomic_add_opts(done + t + 1, 1, None, Some(sem), GPU);
            atomic_add_opts(done + t + 2, 1, None, Some(sem), GPU);
            vec![]
        });
    })
}

#[test]
fn a_persistent_loop_over_a_task_list_follows_its_dependency_counters() {
    let f = task_list(MemSem::Release);
    for programs in [1, 2, 3, 8, 11] {
        let mut bufs = [Buffer::zeros(DType::I32, 8), Buffer::zeros(DType::I32, 10)];
        launch(&f, [programs, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(8)]).unwrap();
        assert_eq!(bufs[0].to_vec::<i32>(), [1, 2, 4, 7, 12, 20, 33, 54], "{programs} programs");
        assert_eq!(bufs[1].to_vec::<i32>(), [0, 1, 2, 2, 2, 2, 2, 2, 2, 1]);
    }
    // Relaxed counters order the waits but publish nothing.
    let f = task_list(MemSem::Relaxed);
    let mut bufs = [Buffer::zeros(DType::I32, 8), Buffer::zeros(DType::I32, 10)];
    let e = interp_err(&f, [3, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(8)]);
    contains_all(&e.to_string(), &["missing release: program (1, 0, 0) reads byte offset 0 of buffer `out`"]);
}

#[test]
fn two_programs_waiting_on_each_other_are_a_deadlock_naming_both_waits() {
    let line = Cell::new(0);
    let f = kernel("deadlock", || {
        let flags = param_ptr("flags", DType::I32);
        let pid = program_id(0);
        line.set(line!() + 1);
        wait_until(flags + (1 - pid), CmpPred::Eq, 1);
        store_opts(flags + pid, 1, None, Some(MemSem::Release), GPU);
    });
    let mut bufs = [Buffer::zeros(DType::I32, 2)];
    let e = interp_err(&f, [2, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    assert_eq!((e.op, e.loc.line, e.program), ("wait_until", line.get(), Some([0, 0, 0])));
    let at = format!("tests_sync.rs:{}:", line.get());
    contains_all(
        &e.to_string(),
        &[
            "deadlock: every live program waits",
            "(2 program(s) waiting, 0 finished)",
            "program (0, 0, 0) waits at ",
            "until the i32 at byte offset 4 of buffer `flags` eq 1 (it holds 0)",
            "program (1, 0, 0) waits at ",
            "until the i32 at byte offset 0 of buffer `flags` eq 1 (it holds 0)",
            &at,
        ],
    );
    // One program of three finishes; the two others wait for a flag nobody sets.
    let f = kernel("stuck", || {
        let flags = param_ptr("flags", DType::I32);
        let pid = program_id(0);
        if_else(
            pid.gt(0),
            || {
                wait_until(flags + 2, CmpPred::Gt, pid);
                vec![]
            },
            Vec::new,
        );
    });
    let mut bufs = [Buffer::zeros(DType::I32, 3)];
    let e = interp_err(&f, [3, 1, 1], &mut bufs, &[Arg::ptr(0)]);
    contains_all(
        &e.to_string(),
        &[
            "(2 program(s) waiting, 1 finished)",
            "gt 1 (it holds 0)",
            "program (2, 0, 0) waits",
            "gt 2 (it holds 0)",
        ],
    );
}

#[test]
fn waits_on_host_data_and_ordered_handovers_need_no_interleaving() {
    // The flag is already set by the host: nothing blocks, nothing races.
    let (f, mut bufs) = handoff_case(Some(MemSem::Release), MemSem::Acquire);
    bufs[1] = Buffer::from_slice(&[1i32]);
    launch(&f, [1, 1, 1], &mut bufs, &handoff_args(5)).unwrap();
    // An ordered hand-over of a buffer that the consumer then overwrites is
    // not a write-write race.
    let f = kernel("overwrite", || {
        let data = param_ptr("data", DType::I32);
        let flag = param_ptr("flag", DType::I32);
        let pid = program_id(0);
        if_else(
            pid.eq_(0),
            || {
                store(data, 5, None);
                atomic_xchg_opts(flag, 1, None, Some(MemSem::Release), GPU);
                vec![]
            },
            || {
                wait_until(flag, CmpPred::Eq, 1);
                store(data, load(data, None, None) * 2, None);
                vec![]
            },
        );
    });
    let mut bufs = [Buffer::zeros(DType::I32, 1), Buffer::zeros(DType::I32, 1)];
    launch(&f, [2, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]).unwrap();
    assert_eq!(bufs[0].to_vec::<i32>(), [10]);
}

#[test]
fn prefetches_are_bounds_checked_like_loads() {
    let f = kernel("prefetch", || {
        let w = param_ptr("w", DType::F16);
        let n = param_scalar("n", DType::I32);
        let offs = program_id(0) * 64 + arange(0, 64);
        prefetch_l2(w + offs, Some(offs.lt(n)));
        prefetch_l2(w + offs, None);
    });
    let mut bufs = [Buffer::zeros(DType::F16, 100)];
    launch(&f, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(100)]).unwrap();
    let e = interp_err(&f, [2, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::i32(100)]);
    assert_eq!(e.op, "prefetch_l2");
    contains_all(&e.to_string(), &["out-of-bounds read at lane 36 [36]", "buffer `w`"]);
}

/// The diagnostics of a build that must fail, as messages.
pub(super) fn diagnostics(body: impl FnOnce()) -> Vec<String> {
    match KernelBuilder::new("k").build(body) {
        Err(Error::Build { diagnostics, .. }) => diagnostics.into_iter().map(|d| d.message).collect(),
        other => panic!("expected build errors, got {other:?}"),
    }
}

#[test]
fn ordered_ops_reject_semantics_they_cannot_have() {
    let (cache, evict) = (CacheModifier::None, EvictionPolicy::Normal);
    let d = diagnostics(|| {
        let p = param_ptr("p", DType::I32);
        let h = param_ptr("h", DType::F16);
        let f = param_ptr("f", DType::F32);
        store_opts(p, 1, None, Some(MemSem::Acquire), GPU);
        load_opts(p, None, None, cache, evict, Some(MemSem::Release), GPU);
        store_opts(p, 1, None, Some(MemSem::AcqRel), GPU);
        load_opts(h, None, None, cache, evict, Some(MemSem::Acquire), GPU);
        load_opts(p, None, None, CacheModifier::Cg, evict, Some(MemSem::Acquire), GPU);
        store_opts(p, 1, None, None, MemScope::Sys);
        wait_until(f, CmpPred::Ge, 1.0f32);
        wait_until(p + arange(0, 4), CmpPred::Ge, 1);
        wait_until_opts(p, CmpPred::Ge, 1, Some(MemSem::Release), GPU);
        wait_until_opts(p, CmpPred::Ge, 1, None, MemScope::Cta);
    });
    let want = [
        "`store` is a write: its semantics are `relaxed` or `release`, not `acquire` (only atomics are both)",
        "`load` is a read: its semantics are `relaxed` or `acquire`, not `release` (only atomics are both)",
        "`store` is a write: its semantics are `relaxed` or `release`, not `acq_rel`",
        "an ordered `load` moves 32- or 64-bit elements (flags and counters), found f16",
        "an ordered `load` takes no cache modifier or eviction policy",
        "`store` with a `scope` needs a `sem`",
        "`wait_until` waits on a scalar pointer to i32, u32 or i64 (a flag or counter), found ptr<f32>",
        "`wait_until` waits on a scalar pointer to i32, u32 or i64 (a flag or counter), found tensor<4xptr<i32>>",
        "`wait_until` is a read: its semantics are `acquire` or `relaxed`, not `release`",
        "`wait_until` waits for another program: its scope is `gpu` or `sys`, not `cta`",
    ];
    expect_diagnostics(&d, &want);
}

/// Asserts that the messages `d` are, in order, ones containing `want`.
pub(super) fn expect_diagnostics(d: &[String], want: &[&str]) {
    assert_eq!(d.len(), want.len(), "{d:#?}");
    for (got, want) in d.iter().zip(want) {
        assert!(got.contains(want), "`{got}` lacks `{want}`");
    }
}

#[test]
fn the_verifier_rejects_ordered_ops_in_text_and_waits_in_combines() {
    let f = kernel("k", || {
        let p = param_ptr("p", DType::I32);
        store_opts(p, 1, None, Some(MemSem::Release), GPU);
    });
    let text = crate::print::print(&f);
    assert!(text.contains("store %p, %0 {sem = release, scope = gpu}"), "{text}");
    // The parser checks every op's rule as it reads it.
    let e = crate::parse::parse(&text.replace("sem = release", "sem = acquire")).unwrap_err().to_string();
    assert!(e.contains("`store` is a write: its semantics are `relaxed` or `release`, not `acquire`"), "{e}");
    let e = KernelBuilder::new("k")
        .build(|| {
            let p = param_ptr("p", DType::I32);
            let x = load(p + arange(0, 4), None, None);
            let r = reduce(&[x], 0, |a, b| {
                wait_until(p, CmpPred::Ge, 1);
                vec![a[0] + b[0]]
            });
            store(p, r[0], None);
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("`wait_until` cannot be inside a reduction's or scan's combine function"), "{e}");
}

#[test]
fn kernels_report_whether_they_wait_and_synchronise() {
    let f = chain();
    assert!(f.waits_on_programs() && f.synchronizes_programs());
    let f = kernel("flag", || {
        let p = param_ptr("p", DType::I32);
        store_opts(p, 1, None, Some(MemSem::Release), GPU);
    });
    assert!(!f.waits_on_programs() && f.synchronizes_programs());
    let f = kernel("plain", || {
        let p = param_ptr("p", DType::I32);
        atomic_add(p, 1, None);
    });
    assert!(!f.waits_on_programs() && !f.synchronizes_programs());
}

/// `globaltimer` reads a clock that never runs backwards: each program
/// stores two readings around a loop and a `barrier`, and the second is not
/// before the first; both ops print and parse back.
#[test]
fn globaltimer_reads_a_monotonic_clock() {
    let f = kernel("clock", || {
        let out = param_ptr("out", DType::I64);
        let pid = program_id(0);
        store(out + pid * 2, globaltimer(), None);
        let spin = for_range(0, 1000, 1, &[full(&[], 0, DType::I32)], |i, acc| vec![acc[0] + i]);
        barrier();
        store(out + pid * 2 + 1, globaltimer() + (spin[0] - spin[0]).to(DType::I64), None);
    });
    let text = crate::print::print(&f);
    assert!(text.contains("globaltimer") && text.contains("barrier"), "{text}");
    let back = crate::parse::parse(&text).unwrap();
    assert_eq!(crate::print::print(&back), text);
    let mut bufs = [Buffer::zeros(DType::I64, 6)];
    launch(&f, [3, 1, 1], &mut bufs, &[Arg::ptr(0)]).unwrap();
    let t = bufs[0].to_vec::<i64>();
    for p in 0..3 {
        assert!(t[2 * p] > 0 && t[2 * p + 1] >= t[2 * p], "{t:?}");
    }
}
