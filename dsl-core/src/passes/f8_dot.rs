//! FP8 `dot` operands widened to f16: `dot a, b, acc` with `f8e4m3` or
//! `f8e5m2` inputs becomes `dot (cast a to f16), (cast b to f16), acc`.
//!
//! Every E4M3 and E5M2 value is exactly an f16 (E4M3's 3-bit mantissa and
//! exponents 2^-9..2^8, E5M2's 2-bit mantissa and f16's own exponent range),
//! so the widened product is the FP8 product: products exact, summed in the
//! f32 accumulator. The codegen runs this pass before it plans a kernel,
//! so FP8 operands take the f16 tensor-core paths (`mma.sync`, `wgmma`) on
//! every target; the interpreter runs FP8 `dot`s as they are.

use super::BlockPass;
use crate::dtype::{DType, Elem};
use crate::ir::ops::CastOp;
use crate::ir::{Block, Function, Op};

/// Widens the operands of every FP8 `dot` in `f` (see the module doc).
/// Returns how many `dot`s it rewrote.
pub fn widen(f: &mut Function) -> usize {
    let mut pass = Widen { rewritten: 0 };
    let body = f.body;
    pass.region(f, body);
    pass.rewritten
}

struct Widen {
    rewritten: usize,
}

impl BlockPass for Widen {
    fn block(&mut self, f: &mut Function, b: Block) {
        let old = f.blocks[b].insts.clone();
        let mut insts = Vec::with_capacity(old.len());
        for i in old {
            for r in f.insts[i].regions.clone() {
                self.region(f, r);
            }
            if matches!(f.insts[i].op, Op::Dot(_)) {
                let fp8 = |f: &Function, k: usize| matches!(f.ty(f.insts[i].args[k]).elem, Elem::Scalar(d) if d.is_f8());
                if fp8(f, 0) && fp8(f, 1) {
                    for k in 0..2 {
                        let a = f.insts[i].args[k];
                        let ty = f.ty(a).with_elem(Elem::Scalar(DType::F16));
                        let loc = f.insts[i].loc.clone();
                        let c = f.create_inst(Op::Cast(CastOp::Cast { to: DType::F16 }), &[a], vec![ty], loc);
                        f.insts[c].parent = Some(b);
                        insts.push(c);
                        let widened = f.result(c);
                        f.insts[i].args[k] = widened;
                    }
                    self.rewritten += 1;
                }
            }
            insts.push(i);
        }
        f.blocks[b].insts = insts;
    }
}
