//! Tests of the `load_block` expansion: the rewritten instruction and its
//! new operands (a snapshot of the printed IR), the axis facts codegen needs
//! for 16-byte accesses, and how canonicalization treats `load_block` (like
//! a non-volatile `load`). The differential tests against the interpreter are
//! in `interp/tests_block.rs`.

use super::block_load::{BlockLoad, expand};
use super::{analyze, canonicalize};
use crate::builder::kernel;
use crate::ir::ops::{CacheModifier, EvictionPolicy, MemoryOp};
use crate::ir::{Function, Inst, Op, ParamHints, Value};
use crate::lang::*;
use crate::print::print;
use crate::verify::verify;
use crate::{DType, Type};
use std::cell::Cell;

/// The instruction defining `v`.
fn def(f: &Function, v: Value) -> Inst {
    f.def_inst(v).expect("an op result")
}

/// Number of reachable ops named `name`.
fn count(f: &Function, name: &str) -> usize {
    let mut n = 0;
    f.walk(|i| n += usize::from(f.insts[i].op.name() == name));
    n
}

fn hinted(name: &str, ty: Type, div: u32) -> Tensor {
    param_with_hints(name, ty, ParamHints { divisibility: Some(div) })
}

/// A bf16 GEMM-style operand loop: `[64, 64]` boxes at `(pid * 64, k)` for
/// `k` in `0, 64, ..` below `cols`, summed; the matrix is described by
/// parameters with the launcher's specialization hints (`hints`) or without.
/// Returns the function and the value of the `load_block`.
fn operand_loop(hints: bool) -> (Function, Value) {
    let tile = Cell::new(None);
    let f = kernel("operand_loop", || {
        let div = |name: &str, ty: Type| if hints { hinted(name, ty, 16) } else { param(name, ty) };
        let x = div("x", Type::ptr(DType::BF16));
        let out = param_ptr("out", DType::F32);
        let rows = div("rows", Type::scalar(DType::I32));
        let cols = div("cols", Type::scalar(DType::I32));
        let stride = div("stride", Type::scalar(DType::I32));
        let row0 = program_id(0) * 64;
        let acc = zeros(&[64, 64], DType::F32);
        let r = for_range(0, cols, 64, &[acc], |k, c| {
            let t = load_block_hinted(
                x,
                rows,
                cols,
                stride,
                row0,
                k,
                [64, 64],
                CacheModifier::None,
                EvictionPolicy::First,
            );
            tile.set(Some(t.value()));
            vec![c[0] + t.to(DType::F32)]
        });
        let offs = arange(0, 64).expand_dims(1) * 64 + arange(0, 64).expand_dims(0);
        store(out + offs, r[0], None);
    });
    (f, tile.get().unwrap())
}

#[test]
fn expansion_keeps_the_instruction_and_its_result() {
    let (mut f, t) = operand_loop(true);
    let inst = def(&f, t);
    let before = f.insts[inst].args.clone();
    let map = expand(&mut f);
    verify(&f).unwrap_or_else(|e| panic!("{e}\n{}", print(&f)));
    assert_eq!(map.len(), 1);
    let bl = map[&inst];
    assert_eq!(
        bl,
        BlockLoad {
            ptr: before[0],
            rows: before[1],
            cols: before[2],
            row_stride: before[3],
            row0: before[4],
            col0: before[5],
            block: [64, 64],
        }
    );
    // The same instruction, now a masked load with the same hints and result.
    assert_eq!(def(&f, t), inst);
    assert_eq!(
        f.insts[inst].op,
        Op::Memory(MemoryOp::Load {
            has_mask: true,
            has_other: false,
            cache: CacheModifier::None,
            evict: EvictionPolicy::First,
            volatile: false,
            order: None,
        })
    );
    assert_eq!(count(&f, "load_block"), 0);
    // Still in the loop body, after the ops computing its operands.
    let body = f.insts[inst].parent.unwrap();
    let insts = &f.blocks[body].insts;
    let at = insts.iter().position(|&i| i == inst).unwrap();
    for &a in &f.insts[inst].args {
        let d = def(&f, a);
        assert!(insts[..at].contains(&d), "operand {a} is computed before the load in its block");
    }
    // Expanding again finds nothing.
    assert!(expand(&mut f).is_empty());
    insta::assert_snapshot!(print(&f));
}

/// The expansion gets the facts hand-written code gets: with a 16-byte
/// aligned base, `cols` and `row_stride` multiples of 16 and 64-aligned box
/// origins, the pointer tile allows full 16-byte (8 x bf16) vectors along the
/// columns and the mask is constant over them, `>= 0` bounds included.
#[test]
fn expansion_vectorizes_like_hand_written_code() {
    for canonicalize_first in [false, true] {
        let (mut f, t) = operand_loop(true);
        if canonicalize_first {
            // What the codegen does: canonicalize, then expand.
            canonicalize(&mut f);
        }
        expand(&mut f);
        let a = analyze(&f);
        let load = def(&f, t);
        let (ptrs, mask) = (f.insts[load].args[0], f.insts[load].args[1]);
        assert_eq!(a.vector_width(ptrs, 1, 2), 8, "{}", print(&f));
        assert!(a.get(mask).constancy[1] >= 8, "{:?}", a.get(mask));
        assert_eq!(a.masked_vector_width(ptrs, Some(mask), 1, 2), 8);
        // Each half of the column bound alone: `j >= -col0` (col0 = k, a
        // multiple of 64) is constant over the 64-aligned runs of `j`,
        // `j < cols - col0` over runs of 16 (the divisibility of `cols`).
        let col_mask = f.insts[def(&f, mask)].args[1];
        let col_mask = f.insts[def(&f, col_mask)].args.clone();
        let (ge, lt) = (def(&f, col_mask[0]), def(&f, col_mask[1]));
        assert_eq!(f.insts[ge].op.attrs(), vec![("pred", crate::ir::ops::Attr::Word("ge".into()))]);
        assert_eq!(a.get(f.insts[ge].results[0]).constancy[1], 64);
        assert_eq!(a.get(f.insts[lt].results[0]).constancy[1], 16);
    }
    // Without the hints nothing is known: element-wise accesses.
    let (mut f, t) = operand_loop(false);
    expand(&mut f);
    let a = analyze(&f);
    let load = def(&f, t);
    let (ptrs, mask) = (f.insts[load].args[0], f.insts[load].args[1]);
    assert_eq!(a.masked_vector_width(ptrs, Some(mask), 1, 2), 1);
}

/// Canonicalization treats `load_block` like a non-volatile `load`: an unused
/// one is removed, equal ones are not merged, and nothing folds it.
#[test]
fn canonicalization_treats_load_block_like_load() {
    let f = kernel("k", || {
        let x = param_ptr("x", DType::F32);
        let n = param_scalar("n", DType::I32);
        let _unused = load_block(x, n, n, n, 0, 0, [4, 4]);
        let a = load_block(x, n, n, n, 1, 0, [4, 4]);
        // The store may change what the next (equal) box reads.
        store(x + arange(0, 4), sum(a, 0), None);
        let b = load_block(x, n, n, n, 1, 0, [4, 4]);
        let c = load_block(x, n, n, n, 1, 0, [4, 4]);
        store(x + arange(0, 4), sum(b + c, 1), None);
    });
    assert_eq!(count(&f, "load_block"), 4);
    let mut g = f.clone();
    canonicalize(&mut g);
    verify(&g).unwrap();
    assert_eq!(count(&g, "load_block"), 3, "{}", print(&g));
    assert_eq!(count(&g, "store"), 2);
}
