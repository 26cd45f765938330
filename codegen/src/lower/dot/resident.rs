//! Loop-invariant `mma.sync` A operands that reside in shared memory
//! instead of A-fragment registers (FlashAttention-2's `q`).
//!
//! A hoisted `a` ([`MmaPlan::hoisted`]) normally becomes A fragments before
//! each loop that uses it, and they stay live across the loop; the tile
//! itself stays live too when a later loop hoists it again. When a loop's
//! register demand is high (its carried values, the products it computes
//! and those fragments together take at least [`RESIDENT_REGS`] registers
//! per thread), the operand is instead written once, right after its
//! definition, into the resident region at the bottom of shared memory
//! (row-major with [`ROW_PAD`] elements of padding per row, the layout
//! `mma.rs` stages `a` in), and every product reloads its fragments with
//! `ldmatrix` in its k steps. That costs one more `ldmatrix.x4` per m tile
//! and k step and frees the fragments and the tile: what lets a warp own
//! 32 rows of FlashAttention's scores (two m tiles, so each B fragment of
//! `k` and `v` feeds two `mma`s) at head dim 128, as FlashAttention-2 does
//! (128 x 64 tiles of 4 warps).
//!
//! The region is shared with the `wgmma` resident operands
//! (`pipeline::Pipeline::resident`), whose offsets come first; it stays a
//! multiple of 1024 bytes, so the rings above it keep their alignment.

use super::super::pipeline::{Pipeline, derives_from_dot};
use super::plan::MmaPlan;
use crate::fragment::ROW_PAD;
use dsl_core::Function;
use dsl_core::dtype::DType;
use dsl_core::ir::{Inst, Op, Value};

/// Estimated registers per thread of a loop above which its hoisted `a`
/// operands reside in shared memory (see the module documentation). On
/// sm_80, FlashAttention's 128 x 64 tile of 4 warps at head dim 64 (64
/// accumulator registers, 64 of scores, 32 of `q` fragments: 160) spills
/// 56-84 bytes with `q` in registers; 16-row warp tiles (at most 128) and
/// the 64 x 128 tile at head dim 64 (about 100) keep their fragments.
pub(crate) const RESIDENT_REGS: usize = 160;

/// Adds to `pipe` the loop-invariant A operands of `mma.sync` products that
/// reside in shared memory (see the module documentation).
pub(crate) fn plan(f: &Function, mma: &MmaPlan, pipe: &mut Pipeline, threads: usize) {
    let users = f.users();
    let mut loops: Vec<(&Inst, &Vec<_>)> = mma.hoisted.iter().collect();
    loops.sort_by_key(|(i, _)| **i);
    for (&fi, hoisted) in loops {
        let frags: usize = hoisted.iter().map(|(v, l)| l.tiles_m() * (f.ty(*v).shape[1] / 16) * 4).sum();
        if loop_regs(f, mma, fi, threads) + frags < RESIDENT_REGS {
            continue;
        }
        for &(v, _) in hoisted {
            let ty = f.ty(v);
            let only_mma = users.get(&v).is_some_and(|us| {
                us.iter().all(|u| {
                    mma.dots.contains_key(u)
                        && !pipe.wgmma.contains(u)
                        && f.insts[*u].args[0] == v
                        && f.insts[*u].args[1] != v
                })
            });
            if !only_mma
                || pipe.resident.contains_key(&v)
                || pipe.mma_resident.contains_key(&v)
                || ty.rank() != 2
                || !matches!(ty.dtype(), DType::F16 | DType::BF16)
                || derives_from_dot(f, v)
            {
                continue;
            }
            pipe.mma_resident.insert(v, pipe.resident_bytes);
            let bytes = (ty.shape[0] * (ty.shape[1] + ROW_PAD) * 2) as u64;
            pipe.resident_bytes = (pipe.resident_bytes + bytes).next_multiple_of(1024);
        }
    }
}

/// Registers per thread that loop `fi` holds besides hoisted fragments: its
/// carried values, and the results of its planned products that are not
/// carried (FlashAttention's scores).
fn loop_regs(f: &Function, mma: &MmaPlan, fi: Inst, threads: usize) -> usize {
    let body = f.entry(f.insts[fi].regions[0]);
    let regs = |v: Value| {
        let ty = f.ty(v);
        (ty.numel() * ty.dtype().size_bytes()).div_ceil(4 * threads)
    };
    let carried: usize = f.blocks[body].args.iter().skip(1).map(|&a| regs(a)).sum();
    let yielded: Vec<Value> = f.blocks[body]
        .insts
        .last()
        .filter(|&&t| f.insts[t].op.is_terminator())
        .map(|&t| f.insts[t].args.to_vec())
        .unwrap_or_default();
    let products: usize = f.blocks[body]
        .insts
        .iter()
        .filter(|&&i| matches!(f.insts[i].op, Op::Dot(_)) && mma.dots.contains_key(&i))
        .map(|&i| f.insts[i].results[0])
        .filter(|r| !yielded.contains(r))
        .map(regs)
        .sum();
    carried + products
}
