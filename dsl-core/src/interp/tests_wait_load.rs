//! Tests of `wait_load`, the reader of a flag-in-data hand-over: lines
//! arriving before or after their readers, stale lines of an earlier flag,
//! masked lanes, the deadlock report, the build rules, and printing.

use super::tests::{contains_all, interp_err};
use super::tests_sync::{diagnostics, expect_diagnostics, hand_over};
use super::{Arg, Buffer, launch};
use crate::Function;
use crate::builder::kernel;
use crate::ir::ops::{MemScope, MemSem};
use crate::lang::*;
use std::cell::Cell;

const GPU: MemScope = MemScope::Gpu;

/// A line: `data` in the low 32 bits, `flag` in the high 32.
fn line(data: i32, flag: i32) -> i64 {
    (i64::from(flag) << 32) | i64::from(data as u32)
}

/// Program `producer` stores eight lines `(10 i + 7, flag)` with relaxed
/// stores and nothing else; every other program waits for them with
/// `wait_load` and copies their data to its row of `out`. With `masked`,
/// the readers skip lane 5 (which the producer never writes).
fn ll_handoff(masked: bool) -> Function {
    kernel("ll", || {
        let lines = param_ptr("lines", DType::I64);
        let out = param_ptr("out", DType::I32);
        let flag = param_scalar("flag", DType::I32);
        let keep = |offs: Tensor| if masked { Some(offs.ne_(5)) } else { None };
        hand_over(
            8,
            |offs| {
                let v = (offs * 10 + 7).to(DType::I64) | (flag.to(DType::I64) << 32);
                store_opts(lines + offs, v, keep(offs), Some(MemSem::Relaxed), GPU);
            },
            |pid, offs| {
                let v = wait_load(lines + offs, flag, keep(offs), GPU);
                store(out + pid * 8 + offs, v.to(DType::I32), None);
            },
        );
    })
}

#[test]
fn readers_take_the_lines_whether_they_arrive_before_or_after_them() {
    let f = ll_handoff(false);
    assert!(f.waits_on_programs() && f.synchronizes_programs());
    // The buffer starts with the previous hand-over's lines (flag 4, other
    // data), which no reader may take for this one's (flag 5).
    let stale: Vec<i64> = (0..8).map(|i| line(1000 + i, 4)).collect();
    for producer in [0, 2, 1] {
        let mut bufs = [Buffer::from_slice(&stale), Buffer::zeros(DType::I32, 24)];
        let args = [Arg::ptr(0), Arg::ptr(1), Arg::i32(5), Arg::i32(producer)];
        launch(&f, [3, 1, 1], &mut bufs, &args).unwrap();
        let out = bufs[1].to_vec::<i32>();
        for p in 0..3 {
            let want: Vec<i32> =
                if p == producer as usize { vec![0; 8] } else { (0..8).map(|i| 10 * i + 7).collect() };
            assert_eq!(out[p * 8..p * 8 + 8], want, "producer {producer}, program {p}");
        }
    }
}

#[test]
fn masked_lanes_are_neither_read_nor_waited_for() {
    let f = ll_handoff(true);
    // Lane 5 keeps its stale line: a reader that waited on it would deadlock.
    let stale: Vec<i64> = (0..8).map(|i| line(1000 + i, 4)).collect();
    let mut bufs = [Buffer::from_slice(&stale), Buffer::zeros(DType::I32, 16)];
    launch(&f, [2, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1), Arg::i32(5), Arg::i32(1)]).unwrap();
    let got = bufs[1].to_vec::<i32>();
    assert_eq!(got[..8], [7, 17, 27, 37, 47, 0, 67, 77]);
    assert_eq!(bufs[0].to_vec::<i64>()[5], line(1005, 4));
}

#[test]
fn a_line_nobody_writes_is_a_deadlock_naming_its_flag() {
    // Lane 2 holds flag 5 while the reader waits for flag 6.
    let line_no = Cell::new(0);
    let g = kernel("ll_stuck", || {
        let lines = param_ptr("lines", DType::I64);
        let out = param_ptr("out", DType::I64);
        line_no.set(line!() + 1);
        let v = wait_load(lines + arange(0, 4), 6, None, GPU);
        store(out + arange(0, 4), v, None);
    });
    let stale: Vec<i64> = vec![line(1, 6), line(2, 6), line(3, 5), line(4, 6)];
    let mut bufs = [Buffer::from_slice(&stale), Buffer::zeros(DType::I64, 4)];
    let e = interp_err(&g, [1, 1, 1], &mut bufs, &[Arg::ptr(0), Arg::ptr(1)]);
    assert_eq!((e.op, e.loc.line, e.program), ("wait_load", line_no.get(), Some([0, 0, 0])));
    contains_all(
        &e.to_string(),
        &[
            "deadlock: every live program waits",
            "program (0, 0, 0) waits at ",
            "(`wait_load`) until the flag (high 32 bits) of the line at byte offset 16 of buffer `lines` is 6 (it is 5)",
        ],
    );
}

#[test]
fn wait_load_rejects_what_cannot_carry_a_flag() {
    let d = diagnostics(|| {
        let w = param_ptr("w", DType::I32);
        let l = param_ptr("l", DType::I64);
        let f = param_scalar("f", DType::F32);
        wait_load(w + arange(0, 4), 1, None, GPU);
        wait_load(l + arange(0, 4), f, None, GPU);
        wait_load(l + arange(0, 4), 1, None, MemScope::Cta);
    });
    let want = [
        "`wait_load` reads 64-bit lines (data and flag): its pointee is i64, found i32",
        "`wait_load` compares the lines' flags with an i32 or u32 scalar",
        "`wait_load` waits for another program: its scope is `gpu` or `sys`, not `cta`",
    ];
    expect_diagnostics(&d, &want);
}

#[test]
fn wait_load_prints_and_parses_back() {
    let f = ll_handoff(true);
    let text = crate::print::print(&f);
    assert!(text.contains("wait_load ") && text.contains("{mask, scope = gpu}"), "{text}");
    let back = crate::parse::parse(&text).unwrap();
    assert_eq!(crate::print::print(&back), text);
    let e = crate::parse::parse(&text.replace("scope = gpu}", "scope = cta}")).unwrap_err().to_string();
    assert!(e.contains("its scope is `gpu` or `sys`, not `cta`"), "{e}");
}
