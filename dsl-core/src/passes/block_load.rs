//! Expansion of `load_block` into the ordinary ops a hand-written kernel
//! uses for the same box: offsets from `arange`, a pointer tile and a
//! bounds mask, then a masked `load` (zero where masked off).
//!
//! Why: `load_block` exists so that the codegen can copy a box with the
//! Tensor Memory Accelerator (sm_90a), which needs the matrix description
//! (base, extents, row stride) that a tile of pointers has lost. Every
//! `load_block` the codegen does not copy that way is lowered as the masked
//! `load` this pass makes, so that one lowering (vectorization, `cp.async`
//! pipelining) serves both. The pass rewrites every `load_block` and returns
//! the original operands keyed by the instruction, so the codegen can still
//! choose TMA for the loads it pipelines.
//!
//! For `load_block ptr, rows, cols, row_stride, row0, col0 {br = BR, bc = BC}`
//! it emits (every `%` value is new; `full` is `[BR, BC]`):
//! ```text
//! // The box's offsets relative to its corner; they depend only on the row
//! // stride, so when that is a kernel parameter they are emitted once at
//! // the top of the kernel (outside every loop), else before the load:
//! %ar  = arange {start = 0, end = BR}       : tensor<BRxi32>
//! %ri  = expand_dims %ar {axis = 1}         : tensor<BRx1xi32>
//! %i   = broadcast %ri {shape = full}       : row index i of each element
//! %ac  = arange {start = 0, end = BC}       : tensor<BCxi32>
//! %cj  = expand_dims %ac {axis = 0}         : tensor<1xBCxi32>
//! %j   = broadcast %cj {shape = full}       : column index j
//! %s   = splat row_stride {shape = full}
//! %is  = mul %i, %s
//! %off = add %is, %j                        : i * row_stride + j
//! // Before the load: scalars of the corner, then full-shape tiles only.
//! %c0  = mul row0, row_stride
//! %c1  = add %c0, col0                      : the corner's offset
//! %p0  = addptr ptr, %c1                    : the corner's address
//! %ps  = splat %p0 {shape = full}
//! %p   = addptr %ps, %off
//! %z   = const 0 : i32
//! %nr  = sub rows, row0 ; %ur = sub %z, row0
//! %nc  = sub cols, col0 ; %uc = sub %z, col0
//! %m   = (%i >= splat %ur) & (%i < splat %nr) & (%j >= splat %uc) & (%j < splat %nc)
//! ```
//! A `[BR, 1]` tile broadcast along the trailing axis moves data between
//! threads (shared memory), so no such broadcast depends on the corner:
//! inside a loop whose induction variable moves the corner, only scalar
//! arithmetic and elementwise ops on full tiles remain.
//!
//! The axis analysis proves the same facts as for hand-written code: with
//! `col0`, `cols` and `row_stride` multiples of 16 and a 16-byte aligned
//! `ptr`, the pointer tile is contiguous and aligned along the columns and
//! the mask constant over 16-element runs (`%i` is constant along a row).
//!
//! Difference from the op: the expansion computes the offsets of every
//! element in `i32`, masked-off ones included, as hand-written code does;
//! a box so far outside the matrix that `(row0 + i) * row_stride` overflows
//! `i32` is then an overflow error in the interpreter, which the op itself
//! does not raise.
//!
//! Invariant: the input is verified; the output verifies and computes what
//! the input computed. A malformed `load_block` (which the verifier rejects)
//! is left alone.

use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::{
    ArithOp, BinaryOp, CacheModifier, CmpPred, CompareOp, CreationOp, EvictionPolicy, MemoryOp, ShapeOp,
};
use crate::ir::{Block, Function, Inst, Op, Region, Scalar, Value};
use crate::loc::Location;
use rustc_hash::FxHashMap;

/// The operands of one expanded `load_block`, as they were before expansion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLoad {
    /// The matrix base (a scalar pointer).
    pub ptr: Value,
    /// Rows of the matrix (`i32`).
    pub rows: Value,
    /// Columns of the matrix (`i32`).
    pub cols: Value,
    /// Elements between the starts of consecutive rows (`i32`).
    pub row_stride: Value,
    /// The box's first row (`i32`).
    pub row0: Value,
    /// The box's first column (`i32`).
    pub col0: Value,
    /// The box shape `[BR, BC]` (the result's shape).
    pub block: [usize; 2],
}

/// Rewrites every `load_block` of `f` (in every region) into a masked
/// `load` that keeps the instruction and its result, preceded by the ops
/// that compute its pointers and mask (see the module documentation).
/// Returns the original operands of each, keyed by the instruction.
pub fn expand(f: &mut Function) -> FxHashMap<Inst, BlockLoad> {
    let mut out = FxHashMap::default();
    let mut top = Vec::new();
    let body = f.body;
    region(f, body, &mut out, &mut top);
    if !top.is_empty() {
        let b = f.body_block();
        top.extend(f.blocks[b].insts.iter().copied());
        f.blocks[b].insts = top;
    }
    out
}

fn region(f: &mut Function, r: Region, out: &mut FxHashMap<Inst, BlockLoad>, top: &mut Vec<Inst>) {
    for b in f.regions[r].blocks.clone() {
        block(f, b, out, top);
    }
}

fn block(f: &mut Function, b: Block, out: &mut FxHashMap<Inst, BlockLoad>, top: &mut Vec<Inst>) {
    let old = f.blocks[b].insts.clone();
    let mut insts = Vec::with_capacity(old.len());
    for i in old {
        for r in f.insts[i].regions.clone() {
            region(f, r, out, top);
        }
        if let Some((bl, cache, evict)) = block_load(f, i) {
            let loc = f.insts[i].loc.clone();
            // The corner-free offsets go to the top of the kernel when the
            // stride is a parameter (defined before everything).
            let hoist = f.params.iter().any(|p| p.value == bl.row_stride);
            let body = f.body_block();
            let off = if hoist {
                Emitter { f, block: body, insts: top, loc: loc.clone() }.relative(&bl)
            } else {
                Emitter { f, block: b, insts: &mut insts, loc: loc.clone() }.relative(&bl)
            };
            let (ptrs, mask) = Emitter { f, block: b, insts: &mut insts, loc }.expand(&bl, off);
            f.insts[i].op = Op::Memory(MemoryOp::Load {
                has_mask: true,
                has_other: false,
                cache,
                evict,
                volatile: false,
                order: None,
            });
            f.insts[i].args = [ptrs, mask].into_iter().collect();
            out.insert(i, bl);
        }
        insts.push(i);
    }
    f.blocks[b].insts = insts;
}

/// The operands and hints of instruction `i` when it is a well-formed `load_block`.
fn block_load(f: &Function, i: Inst) -> Option<(BlockLoad, CacheModifier, EvictionPolicy)> {
    let d = &f.insts[i];
    let Op::Memory(MemoryOp::LoadBlock { rows, cols, cache, evict }) = d.op else { return None };
    let [ptr, nrows, ncols, row_stride, row0, col0] = *d.args.as_slice() else { return None };
    let args: Vec<Type> = d.args.iter().map(|&a| f.ty(a).clone()).collect();
    d.op.infer(&args).ok()?;
    let block = [rows as usize, cols as usize];
    Some((BlockLoad { ptr, rows: nrows, cols: ncols, row_stride, row0, col0, block }, cache, evict))
}

/// Appends new instructions to a block's instruction list under construction.
struct Emitter<'a> {
    f: &'a mut Function,
    block: Block,
    insts: &'a mut Vec<Inst>,
    loc: Location,
}

impl Emitter<'_> {
    /// Appends `op(args)` with one result of type `ty`.
    fn op(&mut self, op: Op, args: &[Value], ty: Type) -> Value {
        let i = self.f.create_inst(op, args, vec![ty], self.loc.clone());
        self.f.insts[i].parent = Some(self.block);
        self.insts.push(i);
        self.f.result(i)
    }

    fn i32_tile(shape: &[usize]) -> Type {
        Type::tile(Elem::Scalar(DType::I32), shape)
    }

    fn arange(&mut self, n: usize) -> Value {
        self.op(Op::Creation(CreationOp::Arange { start: 0, end: n as i32 }), &[], Self::i32_tile(&[n]))
    }

    fn splat(&mut self, x: Value, shape: &[usize]) -> Value {
        let ty = Type::tile(self.f.ty(x).elem, shape);
        self.op(Op::Creation(CreationOp::Splat { shape: shape.into() }), &[x], ty)
    }

    /// An elementwise binary op; the result has `a`'s type.
    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let ty = self.f.ty(a).clone();
        self.op(Op::Arith(ArithOp::Binary(op)), &[a, b], ty)
    }

    fn cmp(&mut self, pred: CmpPred, a: Value, b: Value) -> Value {
        let ty = self.f.ty(a).with_elem(Elem::Scalar(DType::I1));
        self.op(Op::Compare(CompareOp::Cmp(pred)), &[a, b], ty)
    }

    fn expand_dims(&mut self, x: Value, axis: usize) -> Value {
        let mut shape = self.f.ty(x).shape.clone();
        shape.insert(axis, 1);
        let ty = self.f.ty(x).with_shape(&shape);
        self.op(Op::Shape(ShapeOp::ExpandDims { axis }), &[x], ty)
    }

    fn broadcast(&mut self, x: Value, shape: &[usize]) -> Value {
        let ty = self.f.ty(x).with_shape(shape);
        self.op(Op::Shape(ShapeOp::Broadcast { shape: shape.into() }), &[x], ty)
    }

    /// The `[BR, BC]` row and column index tiles of `bl`'s box and the
    /// offsets `i * row_stride + j` of its elements from its corner.
    fn relative(&mut self, bl: &BlockLoad) -> [Value; 3] {
        let [br, bc] = bl.block;
        let full = [br, bc];
        let ar = self.arange(br);
        let ri = self.expand_dims(ar, 1);
        let i = self.broadcast(ri, &full);
        let ac = self.arange(bc);
        let cj = self.expand_dims(ac, 0);
        let j = self.broadcast(cj, &full);
        let s = self.splat(bl.row_stride, &full);
        let is = self.binary(BinaryOp::Mul, i, s);
        let off = self.binary(BinaryOp::Add, is, j);
        [i, j, off]
    }

    /// A scalar `i32` op.
    fn scalar(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        self.op(Op::Arith(ArithOp::Binary(op)), &[a, b], Type::scalar(DType::I32))
    }

    /// `x >= lo & x < hi` on a full tile `x` with scalar bounds.
    fn between(&mut self, x: Value, lo: Value, hi: Value) -> Value {
        let shape = self.f.ty(x).shape.clone();
        let l = self.splat(lo, &shape);
        let ge = self.cmp(CmpPred::Ge, x, l);
        let h = self.splat(hi, &shape);
        let lt = self.cmp(CmpPred::Lt, x, h);
        self.binary(BinaryOp::And, ge, lt)
    }

    /// Emits the pointer tile and the mask of `bl` from its relative index
    /// and offset tiles (see [`Emitter::relative`]).
    fn expand(&mut self, bl: &BlockLoad, [i, j, off]: [Value; 3]) -> (Value, Value) {
        let full = bl.block;
        let c0 = self.scalar(BinaryOp::Mul, bl.row0, bl.row_stride);
        let c1 = self.scalar(BinaryOp::Add, c0, bl.col0);
        let pty = self.f.ty(bl.ptr).clone();
        let p0 = self.op(Op::Arith(ArithOp::AddPtr), &[bl.ptr, c1], pty);
        let ps = self.splat(p0, &full);
        let pty = self.f.ty(ps).clone();
        let ptrs = self.op(Op::Arith(ArithOp::AddPtr), &[ps, off], pty);
        let zero_op = Op::Creation(CreationOp::Const(Scalar::zero(DType::I32)));
        let zero = self.op(zero_op, &[], Type::scalar(DType::I32));
        let nr = self.scalar(BinaryOp::Sub, bl.rows, bl.row0);
        let ur = self.scalar(BinaryOp::Sub, zero, bl.row0);
        let nc = self.scalar(BinaryOp::Sub, bl.cols, bl.col0);
        let uc = self.scalar(BinaryOp::Sub, zero, bl.col0);
        let mr = self.between(i, ur, nr);
        let mc = self.between(j, uc, nc);
        let mask = self.binary(BinaryOp::And, mr, mc);
        (ptrs, mask)
    }
}
