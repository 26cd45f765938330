//! `dot` on Hopper's warpgroup tensor cores: `wgmma.mma_async` (sm_90a).
//!
//! Used for the `dot`s the pipeline confirmed (`pipeline.rs`): both operands
//! are `cp.async`-pipelined into ring stages of 128-byte swizzle atoms
//! (`pipeline::atom_index`), which is the canonical `wgmma` shared-memory
//! layout with 128-byte swizzling, so the tensor cores read them in place
//! through matrix descriptors: no `ldmatrix`, no operand registers.
//!
//! Shapes (`plan::wgmma_shape`): warpgroup `g` (warps `4g..4g+3`) computes
//! rows `64g..64g+63` of the `[M, N]` accumulator with one
//! `wgmma.mma_async.sync.aligned.m64nNk16` per 16-wide `k` step. Its D
//! fragment is the `mma.sync` C fragment repeated over `N / 8` column tiles,
//! warp `w` holding rows `16w..16w+15`: exactly the [`MmaLayout`] with every
//! warp along `M` (`tile_m = 16`, register `4j + r` of column tile `j`), so
//! the accumulator's conversions, elementwise math and stores are shared
//! with the `mma.sync` path.
//!
//! Operands:
//! - `a` (`[M, K]`, K-major): the warpgroup's 64 rows start `64g * 128`
//!   bytes into each 64-column block; k step `kk` is 32 bytes into block
//!   `kk / 4` (`kk mod 4` of the four k steps of a 128-byte row). The
//!   hardware applies the swizzle to the final address bits, which is why
//!   stages are 1024-byte aligned. Stride between 8-row atoms (SBO): 1024.
//! - `b` staged `[K, N]` (N-major, `imm-trans-b = 1`): k step `kk` starts
//!   at row `16 kk` (`kk * 2048` bytes); the 64-column blocks of `N` are
//!   `K * 128` bytes apart (LBO), 8-row atoms along `K` 1024 (SBO).
//! - `b = permute(x)` with `x` staged `[N, K]` (K-major, like `a`).
//!
//! Synchronisation per `dot`: `wgmma.fence` (the accumulator registers
//! were last written by ordinary instructions), the k steps, one
//! `commit_group`, and `wait_group 0` before the result is used, or
//! `wait_group 1` for a deferred loop-carried accumulator (`pipeline.rs`):
//! its group runs on while the next iteration waits for its copies, and the
//! loop waits for the last one at its exit. The fence
//! and the wait take the accumulator registers as tied operands, so LLVM
//! cannot move a read or write of them across either. The copies that filled
//! the stage are ordered before the async-proxy reads by a
//! `fence.proxy.async` ahead of the loop's barrier (`control.rs`).
//!
//! Numerics: as `mma.sync` (exact products, f32 accumulation in the tensor
//! core's order).

use super::super::Lowerer;
use crate::Result;
use crate::mma::{Lay, MmaLayout};
use dsl_core::dtype::DType;
use dsl_core::ir::Inst;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};

/// The swizzle-mode field of a matrix descriptor: 128-byte swizzling.
const SWIZZLE_128B: u64 = 1;

/// Bytes between consecutive 8-row swizzle atoms along a block's rows.
const ATOM_BYTES: u64 = 1024;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Lowers a `dot` the pipeline confirmed for `wgmma`, with accumulator layout `l`.
    pub(super) fn lower_dot_wgmma(&mut self, inst: Inst, l: MmaLayout) -> Result<()> {
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        let aty = self.f.ty(args[0]).clone();
        let (m, k, n) = (l.m, aty.shape[1], l.n);
        if l.warps_m * 16 != m || l.warps_n != 1 || n > 256 || !k.is_multiple_of(64) {
            return Err(self.bug(inst, "wgmma layout"));
        }
        let d = aty.dtype();
        let b_nk = self.mma.b_trans.contains_key(&inst);
        let acc = self.regs_as(args[2], Lay::Mma(l))?;
        let (Some((a_ring, _)), Some((b_ring, _))) =
            (self.pipe_operand(inst, 0)?, self.pipe_operand(inst, 1)?)
        else {
            return Err(self.bug(inst, "wgmma operands are not pipelined"));
        };
        // This warpgroup's 64 rows of `a`.
        let wg = self.b.build_right_shift(self.tid, self.i32c(7), false, "")?;
        let a_rows = self.b.build_int_mul(wg, self.i32c(64 * 128), "")?;
        let a_addr = self.shared_addr(a_ring)?;
        let a_addr = self.b.build_int_add(a_addr, a_rows, "")?;
        let a_desc = self.matrix_desc(a_addr, 16, ATOM_BYTES)?;
        let b_addr = self.shared_addr(b_ring)?;
        let b_desc = if b_nk {
            self.matrix_desc(b_addr, 16, ATOM_BYTES)?
        } else {
            self.matrix_desc(b_addr, (k * 128) as u64, ATOM_BYTES)?
        };
        // Byte offset of k step `kk` in a K-major operand of `rows` rows.
        let k_major = |kk: usize, rows: usize| ((kk / 4) * rows * 128 + (kk % 4) * 32) as u64;
        let mut acc = self.wgmma_fence(&acc)?;
        for kk in 0..k / 16 {
            let ad = self.desc_add(a_desc, k_major(kk, m))?;
            let bd = self.desc_add(b_desc, if b_nk { k_major(kk, n) } else { (kk * 16 * 128) as u64 })?;
            acc = self.wgmma(d, n, ad, bd, !b_nk, &acc)?;
        }
        self.asm("wgmma.commit_group.sync.aligned;", "~{memory}", None, &[])?;
        // A deferred group keeps running into the next iteration; the one
        // before it must be done (its stage is refilled next, `pipeline.rs`).
        let pending = if self.pipe.deferred.contains(&inst) { 1 } else { 0 };
        let acc = self.wgmma_tied(&format!("wgmma.wait_group.sync.aligned {pending};"), &acc)?;
        self.set(res, acc);
        Ok(())
    }

    /// The 32-bit shared-window address of `p`.
    fn shared_addr(&self, p: PointerValue<'ctx>) -> Result<IntValue<'ctx>> {
        Ok(self.b.build_ptr_to_int(p, self.ctx.i32_type(), "")?)
    }

    /// A `wgmma` matrix descriptor (i64) for the operand at shared address
    /// `addr`: start address, leading and stride byte offsets (all in
    /// 16-byte units), 128-byte swizzling, base offset 0.
    fn matrix_desc(&self, addr: IntValue<'ctx>, lbo: u64, sbo: u64) -> Result<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let start = self.b.build_right_shift(addr, self.i32c(4), false, "")?;
        let start = self.b.build_and(start, self.i32c(0x3fff), "")?;
        let start = self.b.build_int_z_extend(start, i64t, "")?;
        let fields = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (SWIZZLE_128B << 62);
        Ok(self.b.build_or(start, i64t.const_int(fields, false), "")?)
    }

    /// `desc` with its start address advanced by `bytes` (shared memory is
    /// below 256 KiB, so the 14-bit field never carries).
    fn desc_add(&self, desc: IntValue<'ctx>, bytes: u64) -> Result<IntValue<'ctx>> {
        if bytes == 0 {
            return Ok(desc);
        }
        Ok(self.b.build_int_add(desc, self.ctx.i64_type().const_int(bytes >> 4, false), "")?)
    }

    /// `wgmma.fence.sync.aligned` with the accumulator registers tied through it.
    fn wgmma_fence(&self, acc: &[BasicValueEnum<'ctx>]) -> Result<Vec<BasicValueEnum<'ctx>>> {
        self.wgmma_tied("wgmma.fence.sync.aligned;", acc)
    }

    /// The inline-assembly statement `text` (with side effects and a memory
    /// clobber) taking the f32 registers `acc` as tied in/out operands.
    pub(crate) fn wgmma_tied(
        &self,
        text: &str,
        acc: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let r = acc.len();
        let cons = tied_constraints(r, "");
        let st = self.acc_struct(r);
        let v = self.asm_value(text, &cons, st, acc)?;
        self.unpack(v, r)
    }

    /// One `wgmma.mma_async.sync.aligned.m64n{n}k16.f32` on descriptors
    /// `a` and `b` (`trans_b`: `b` is N-major), accumulating into `acc`.
    fn wgmma(
        &self,
        d: DType,
        n: usize,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
        trans_b: bool,
        acc: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let r = acc.len();
        debug_assert_eq!(r, n / 2);
        let ab = if d == DType::BF16 { "bf16" } else { "f16" };
        let regs: Vec<String> = (0..r).map(|i| format!("${i}")).collect();
        let text = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${s}, 0;\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} \
             {{{}}}, ${da}, ${db}, p, 1, 1, 0, {tb};\n}}",
            regs.join(", "),
            da = 2 * r,
            db = 2 * r + 1,
            s = 2 * r + 2,
            tb = u8::from(trans_b),
        );
        let cons = tied_constraints(r, ",l,l,r");
        let mut ops: Vec<BasicValueEnum<'ctx>> = acc.to_vec();
        ops.extend::<[BasicValueEnum<'ctx>; 3]>([a.into(), b.into(), self.i32c(1).into()]);
        let v = self.asm_value(&text, &cons, self.acc_struct(r), &ops)?;
        self.unpack(v, r)
    }

    /// `{f32 x r}`.
    fn acc_struct(&self, r: usize) -> BasicTypeEnum<'ctx> {
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
        self.ctx.struct_type(&vec![f32t; r], false).into()
    }

    /// Inline assembly with side effects returning `ret`.
    fn asm_value(
        &self,
        text: &str,
        cons: &str,
        ret: BasicTypeEnum<'ctx>,
        ops: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        self.asm_with(text, cons, Some(ret), ops, true)?
            .ok_or_else(|| crate::Error::Llvm("inline assembly returned no value".into()))
    }

    /// The `r` fields of the struct `v`.
    fn unpack(&self, v: BasicValueEnum<'ctx>, r: usize) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let s = v.into_struct_value();
        (0..r).map(|i| Ok(self.b.build_extract_value(s, i as u32, "")?)).collect()
    }
}

/// `=f` x `r`, the `r` inputs tied to them, then `extra`, and a memory clobber.
fn tied_constraints(r: usize, extra: &str) -> String {
    let outs = vec!["=f"; r].join(",");
    let ins: Vec<String> = (0..r).map(|i| i.to_string()).collect();
    format!("{outs},{}{extra},~{{memory}}", ins.join(","))
}
