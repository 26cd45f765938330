//! Global loads as inline PTX, for what LLVM's loads cannot say: cache
//! operators and L1 eviction priorities (`hinted_load`), and a predicated
//! load that is not a branch (`predicated_load`).

use super::{Lowerer, mem_type};
use crate::Result;
use crate::lower::memory::vec_type;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::ops::{CacheModifier, EvictionPolicy};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// A global load of `bytes` (1, 2, 4, 8 or 16) at `ptr` as inline PTX with
    /// the qualifiers `q` (cache operator or L1 eviction priority, see
    /// [`load_qualifiers`]), returned as `et` (`w == 1`) or `<w x et>`. The
    /// asm clobbers memory, so LLVM keeps it in program order with other
    /// memory operations and barriers (ptxas still schedules it).
    pub(super) fn hinted_load(
        &self,
        ptr: inkwell::values::PointerValue<'ctx>,
        et: BasicTypeEnum<'ctx>,
        w: usize,
        bytes: usize,
        q: &str,
    ) -> Result<BasicValueEnum<'ctx>> {
        let (i16t, i32t) = (self.ctx.i16_type(), self.ctx.i32_type());
        let a = self.b.build_ptr_to_int(ptr, self.ctx.i64_type(), "")?;
        let words = bytes / 4;
        let raw: BasicValueEnum<'ctx> = if words >= 1 {
            let outs: Vec<String> = (0..words).map(|k| format!("${k}")).collect();
            let (vec, dst) = if words == 1 {
                (String::new(), outs[0].clone())
            } else {
                (format!(".v{words}"), format!("{{{}}}", outs.join(", ")))
            };
            let text = format!("ld.global{q}{vec}.b32 {dst}, [${words}];");
            let cons = format!("{}l,~{{memory}}", "=r,".repeat(words));
            let ret: BasicTypeEnum<'ctx> = if words == 1 {
                i32t.into()
            } else {
                self.ctx.struct_type(&vec![i32t.into(); words], false).into()
            };
            let r = self.asm_value(&text, &cons, ret, &[a.into()], false)?;
            if words == 1 {
                r
            } else {
                let r = r.into_struct_value();
                let mut v = i32t.vec_type(words as u32).get_undef();
                for k in 0..words {
                    let e = self.b.build_extract_value(r, k as u32, "")?;
                    v = self.b.build_insert_element(v, e, i32t.const_int(k as u64, false), "")?;
                }
                v.into()
            }
        } else {
            let ty = if bytes == 2 { "b16" } else { "u8" };
            let text = format!("ld.global{q}.{ty} $0, [$1];");
            let r = self.asm_value(&text, "=h,l,~{memory}", i16t.into(), &[a.into()], false)?;
            if bytes == 1 {
                self.b.build_int_truncate(r.into_int_value(), self.ctx.i8_type(), "")?.into()
            } else {
                r
            }
        };
        let want: BasicTypeEnum<'ctx> = if w == 1 { et } else { vec_type(et, w as u32)?.into() };
        Ok(self.b.build_bit_cast(raw, want, "")?)
    }

    /// Whether a masked scalar load of `d` is a predicated load
    /// ([`Lowerer::predicated_load`]) rather than a branch around it: for
    /// 4-byte elements in a `cp.async` loop's address slice (a block
    /// table's page numbers) or in a row layout (`row`: scales). Behind
    /// branches, ptxas issues those loads one at a time, each waiting for
    /// the one before, and the branches split the block, so math around
    /// them (scaling one product while the next runs) can be moved past
    /// the next `wgmma`; predicated, they all go out before the first is needed.
    pub(super) fn predicate_loads(&self, d: DType, row: bool) -> bool {
        (row || self.loops.extra_pred.is_some() && self.loops.predicated_slice)
            && matches!(d, DType::I32 | DType::F32)
    }

    /// One 4-byte global load at `p` under predicate `on`, `other` where
    /// `on` is false: `@p ld.global` into a register that holds `other`
    /// beforehand (branch-free). Like [`Lowerer::hinted_load`] it clobbers
    /// memory, so LLVM keeps it in order with the other memory operations.
    pub(super) fn predicated_load(
        &self,
        p: BasicValueEnum<'ctx>,
        d: DType,
        on: IntValue<'ctx>,
        other: BasicValueEnum<'ctx>,
        hints: Option<&str>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let i32t = self.ctx.i32_type();
        let a = self.b.build_ptr_to_int(p.into_pointer_value(), self.ctx.i64_type(), "")?;
        let o = self.b.build_bit_cast(self.reg_to_mem(other, d)?, i32t, "")?;
        let text = format!("@$2 ld.global{}.b32 $0, [$1];", hints.unwrap_or(""));
        let r = self.asm_value(&text, "=r,l,b,0,~{memory}", i32t.into(), &[a.into(), on.into(), o], true)?;
        let et = mem_type(self.ctx, Elem::Scalar(d));
        self.mem_to_reg(self.b.build_bit_cast(r, et, "")?, d)
    }
}

/// The PTX qualifiers of a load's hints (`None` without any): the cache
/// operator (`.ca`, `.cg`, `.cs`) or the L1 eviction priority
/// (`.L1::evict_first`, `.L1::evict_last`; PTX has no load with both, the
/// builder rejects that).
pub(super) fn load_qualifiers(cache: CacheModifier, evict: EvictionPolicy) -> Option<&'static str> {
    match (cache, evict) {
        (CacheModifier::Ca, _) => Some(".ca"),
        (CacheModifier::Cg, _) => Some(".cg"),
        (CacheModifier::Cs, _) => Some(".cs"),
        (_, EvictionPolicy::First) => Some(".L1::evict_first"),
        (_, EvictionPolicy::Last) => Some(".L1::evict_last"),
        _ => None,
    }
}
