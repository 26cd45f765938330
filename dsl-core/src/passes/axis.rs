//! Axis analysis (Triton's `AxisInfo`): per value and per dimension, what is
//! guaranteed about runs of consecutive elements. Codegen uses it to choose
//! 16-byte vectorized, coalesced loads and stores.
//!
//! For a value of shape `S` and a dimension `d` (a scalar has one entry):
//! - `contiguity[d] = c`: along `d`, the elements split into aligned runs of
//!   `c` (index `k*c .. k*c+c`) whose values are `x, x+1, ..., x+c-1`.
//!   Pointers count in elements of their pointee.
//! - `divisibility[d] = v`: the first element of every such run (every element
//!   when `c == 1`) is a multiple of `v`; for pointers, the address in bytes.
//! - `constancy[d] = k`: along `d`, aligned runs of `k` elements are equal.
//! - `constant`: every element equals this integer.
//!
//! All three are powers of two (`contiguity` and `constancy` at most the
//! dimension's size, `divisibility` at most [`MAX_DIVISIBILITY`]).
//!
//! Invariant: the analysis is sound, never over-claiming, for executions the
//! interpreter accepts: it assumes signed integers do not overflow (the
//! interpreter reports it) and that hints and `ParamHints` are kept (the
//! interpreter and launcher check them); unsigned arithmetic may wrap, so
//! unsigned runs are only claimed where no wrap can split them. Where no rule
//! applies a value gets contiguity 1 and divisibility 1; elementwise ops
//! still propagate constancy (equal inputs give equal outputs). Loops are
//! solved to a fixed point from their initial values (with a pessimistic
//! fallback), so loop-carried facts hold on every iteration.

use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::{
    ArithOp, BinaryOp, CastOp, CmpPred, CompareOp, ControlOp, CreationOp, HintOp, MemoryOp, ReduceKind,
    ShapeOp, UnaryOp,
};
use crate::ir::{EntityRef, Function, Inst, Op, Region, Value};
use smallvec::{SmallVec, smallvec};

mod rules;

use rules::{add, div, elementwise, mul, rem, shl, shr, sub};

/// Divisibility claimed for zero (and the cap on every divisibility).
pub const MAX_DIVISIBILITY: u64 = 1 << 30;

/// Rounds of a loop's fixed-point iteration before falling back to no facts.
const MAX_LOOP_ROUNDS: usize = 10;

/// Per-dimension facts.
type Dims = SmallVec<[u64; 4]>;

/// What is known about one value; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisInfo {
    /// Length of the aligned runs of consecutive (+1) values, per dimension.
    pub contiguity: Dims,
    /// Power of two dividing the first value of each run (bytes for pointers).
    pub divisibility: Dims,
    /// Length of the aligned runs of equal values, per dimension.
    pub constancy: Dims,
    /// The value of every element, when it is a known integer.
    pub constant: Option<i64>,
}

/// The greatest power of two dividing `v`, capped ([`MAX_DIVISIBILITY`] for 0).
fn pow2_divisor(v: i64) -> u64 {
    if v == 0 { MAX_DIVISIBILITY } else { (1u64 << v.trailing_zeros()).min(MAX_DIVISIBILITY) }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn mul_div(a: u64, b: u64) -> u64 {
    a.saturating_mul(b).min(MAX_DIVISIBILITY)
}

/// The sizes the entries describe: the shape, or `[1]` for a scalar.
fn dims(t: &Type) -> Dims {
    if t.shape.is_empty() { smallvec![1] } else { t.shape.iter().map(|&d| d as u64).collect() }
}

impl AxisInfo {
    /// No facts: every entry 1, for a value of rank `rank`.
    pub fn unknown(rank: usize) -> AxisInfo {
        let n = rank.max(1);
        AxisInfo {
            contiguity: smallvec![1; n],
            divisibility: smallvec![1; n],
            constancy: smallvec![1; n],
            constant: None,
        }
    }

    /// Every element equal to the integer `v`, for a value of type `t`.
    fn splat_int(t: &Type, v: i64) -> AxisInfo {
        let d = dims(t);
        AxisInfo {
            contiguity: smallvec![1; d.len()],
            divisibility: smallvec![pow2_divisor(v); d.len()],
            constancy: d,
            constant: Some(v),
        }
    }

    /// The number of entries (the rank, or 1 for a scalar).
    pub fn len(&self) -> usize {
        self.contiguity.len()
    }

    /// Always false: a value has at least one entry.
    pub fn is_empty(&self) -> bool {
        self.contiguity.is_empty()
    }

    /// A power of two dividing every element.
    pub fn all_divisibility(&self) -> u64 {
        if let Some(v) = self.constant {
            return pow2_divisor(v);
        }
        (0..self.len()).filter(|&d| self.contiguity[d] == 1).map(|d| self.divisibility[d]).max().unwrap_or(1)
    }

    /// A power of two dividing the elements at positions `k*c` along `d` (the
    /// run starts if runs were cut to length `c`, a power of two).
    fn div_at(&self, d: usize, c: u64) -> u64 {
        let own = if c.is_multiple_of(self.contiguity[d]) {
            self.divisibility[d]
        } else {
            // Inside a run starting at a multiple of v, position j*c holds
            // start + j*c: a multiple of gcd(v, c).
            gcd(self.divisibility[d], c)
        };
        own.max(self.all_divisibility())
    }

    /// Cuts runs so that no value wraps inside one: afterwards every run starts
    /// at a multiple of its length, which is at most `limit`.
    fn no_wrap(&mut self, limit: u64) {
        for d in 0..self.len() {
            let c = self.contiguity[d].min(self.divisibility[d]).min(limit).max(1);
            if c < self.contiguity[d] {
                self.divisibility[d] = self.div_at(d, c);
                self.contiguity[d] = c;
            }
        }
    }

    /// Facts that hold for both `self` and `other` (same rank).
    fn meet(&self, other: &AxisInfo) -> AxisInfo {
        let mut out = AxisInfo::unknown(self.len());
        for d in 0..self.len().min(other.len()) {
            let c = gcd(self.contiguity[d], other.contiguity[d]);
            out.contiguity[d] = c;
            out.divisibility[d] = gcd(self.div_at(d, c), other.div_at(d, c));
            out.constancy[d] = gcd(self.constancy[d], other.constancy[d]);
        }
        out.constant = if self.constant == other.constant { self.constant } else { None };
        out
    }
}

/// Facts about one value: its axis info and whether it is known non-negative.
type Fact = (AxisInfo, bool);

/// The result of [`analyze`]: an [`AxisInfo`] for every value of the function.
#[derive(Clone, Debug)]
pub struct AxisAnalysis {
    infos: Vec<AxisInfo>,
    nonneg: Vec<bool>,
}

impl AxisAnalysis {
    /// The facts about `v` (no facts for values unreachable from the body).
    ///
    /// # Panics
    /// When `v` does not belong to the analyzed function.
    pub fn get(&self, v: Value) -> &AxisInfo {
        &self.infos[v.index()]
    }

    /// True when every element of the integer `v` is known to be `>= 0`.
    pub fn is_non_negative(&self, v: Value) -> bool {
        self.nonneg.get(v.index()).copied().unwrap_or(false)
    }

    /// The most elements of `elem_bytes` each (the pointee size of `ptr`) one
    /// vector access along `dim` may cover: the runs of `ptr` must be that long
    /// and aligned to the vector's size, and a vector is at most 16 bytes.
    pub fn vector_width(&self, ptr: Value, dim: usize, elem_bytes: u32) -> u32 {
        if elem_bytes == 0 || !elem_bytes.is_power_of_two() || elem_bytes > 16 {
            return 1;
        }
        let info = self.get(ptr);
        let (Some(&c), Some(&v)) = (info.contiguity.get(dim), info.divisibility.get(dim)) else {
            return 1;
        };
        let e = u64::from(elem_bytes);
        let n = c.min(v / e).min(16 / e).max(1);
        // All terms are powers of two; round down defensively all the same.
        (1u64 << n.ilog2()) as u32
    }

    /// [`AxisAnalysis::vector_width`] for a masked access: a vector also needs
    /// its mask lanes equal, so the width is capped by the mask's constancy.
    pub fn masked_vector_width(&self, ptr: Value, mask: Option<Value>, dim: usize, elem_bytes: u32) -> u32 {
        let w = self.vector_width(ptr, dim, elem_bytes);
        match mask {
            Some(m) => {
                let k = self.get(m).constancy.get(dim).copied().unwrap_or(1).max(1);
                w.min((1u64 << k.ilog2()).min(u64::from(u32::MAX)) as u32)
            }
            None => w,
        }
    }
}

/// Runs the axis analysis on `f`.
pub fn analyze(f: &Function) -> AxisAnalysis {
    let infos = f.values.iter().map(|(_, d)| AxisInfo::unknown(d.ty.rank())).collect();
    let mut a = Analyzer { f, infos, nonneg: vec![false; f.values.len()] };
    for p in &f.params {
        let mut info = AxisInfo::unknown(0);
        if let Some(d) = p.hints.divisibility.filter(|&d| d > 0) {
            info.divisibility[0] = pow2_divisor(i64::from(d));
        }
        a.set(p.value, (info, false));
    }
    a.region(f.body);
    AxisAnalysis { infos: a.infos, nonneg: a.nonneg }
}

struct Analyzer<'a> {
    f: &'a Function,
    infos: Vec<AxisInfo>,
    nonneg: Vec<bool>,
}

impl Analyzer<'_> {
    fn set(&mut self, v: Value, (info, nonneg): Fact) {
        let unsigned = matches!(self.f.ty(v).elem, Elem::Scalar(d) if d.is_unsigned_int());
        self.infos[v.index()] = info;
        self.nonneg[v.index()] = nonneg || unsigned;
    }

    fn info(&self, v: Value) -> &AxisInfo {
        &self.infos[v.index()]
    }

    fn fact(&self, v: Value) -> Fact {
        (self.infos[v.index()].clone(), self.nonneg[v.index()])
    }

    fn nonneg(&self, v: Value) -> bool {
        self.nonneg[v.index()]
    }

    fn region(&mut self, r: Region) {
        for &b in &self.f.regions[r].blocks {
            for &i in &self.f.blocks[b].insts {
                self.inst(i);
            }
        }
    }

    fn inst(&mut self, i: Inst) {
        let f = self.f;
        let data = &f.insts[i];
        match data.op {
            Op::Control(ControlOp::For) => self.for_op(i),
            Op::Control(ControlOp::If) => self.if_op(i),
            Op::Control(ControlOp::While) => self.while_op(i),
            Op::Control(_) => {}
            _ => {
                // Combine regions of custom reductions and scans: no facts about
                // their arguments.
                for &r in &data.regions {
                    for &a in &f.blocks[f.entry(r)].args {
                        self.set(a, (AxisInfo::unknown(0), false));
                    }
                    self.region(r);
                }
                if data.results.len() == 1 {
                    let fact = self.transfer(i);
                    self.set(data.results[0], fact);
                } else if let (Op::Shape(ShapeOp::Split), [x]) = (&data.op, data.args.as_slice()) {
                    let (mut info, nn) = self.fact(*x);
                    for v in [&mut info.contiguity, &mut info.divisibility, &mut info.constancy] {
                        v.pop();
                        if v.is_empty() {
                            v.push(1);
                        }
                    }
                    for &r in &data.results {
                        self.set(r, (info.clone(), nn));
                    }
                }
            }
        }
    }

    /// The facts about the single result of instruction `i`.
    fn transfer(&self, i: Inst) -> Fact {
        let f = self.f;
        let data = &f.insts[i];
        let args = &data.args;
        let out = f.ty(data.results[0]);
        match &data.op {
            Op::Creation(c) => self.creation(c, args, out),
            Op::Arith(ArithOp::AddPtr) => {
                let e = out.dtype().size_bytes() as u64;
                (add(self.info(args[0]), self.info(args[1]), e), false)
            }
            Op::Arith(ArithOp::Binary(b)) if out.is_int() => self.int_binary(*b, args[0], args[1], out),
            Op::Arith(ArithOp::Unary(u)) if out.is_int() => {
                let a = self.info(args[0]);
                let mut info = elementwise(out, &[a]);
                if matches!(u, UnaryOp::Neg | UnaryOp::Abs) {
                    let all = a.all_divisibility();
                    info.divisibility.iter_mut().for_each(|v| *v = all);
                }
                info.constant = a.constant.and_then(|v| {
                    crate::passes::eval::unary(*u, crate::ir::Scalar::int(out.dtype(), v)).map(|s| s.as_i64())
                });
                (info, *u == UnaryOp::Abs)
            }
            Op::Compare(CompareOp::Cmp(p)) => (self.cmp(*p, args[0], args[1], out), false),
            Op::Compare(CompareOp::Select) => self.select(args[0], args[1], args[2]),
            Op::Cast(c) => self.cast(*c, args[0], out),
            Op::Hint(h) => {
                let (mut info, nn) = self.fact(args[0]);
                let sizes = dims(out);
                for (d, &v) in h.values().iter().enumerate().take(info.len()) {
                    let v = u64::from(v);
                    match h {
                        HintOp::MultipleOf(_) => {
                            info.divisibility[d] = info.divisibility[d].max(v.min(MAX_DIVISIBILITY))
                        }
                        HintOp::MaxContiguous(_) => {
                            info.contiguity[d] = info.contiguity[d].max(v.min(sizes[d]))
                        }
                        HintOp::MaxConstancy(_) => info.constancy[d] = info.constancy[d].max(v.min(sizes[d])),
                    }
                }
                (info, nn)
            }
            Op::Shape(s) => self.shape(s, args, out),
            Op::Program(_) => (AxisInfo::unknown(0), true),
            Op::Reduce(r) if r.kind != ReduceKind::Custom => {
                let (a, nn) = self.fact(args[0]);
                let mut info = AxisInfo::unknown(out.rank());
                let keeps_div = matches!(r.kind, ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min);
                let all = if keeps_div && !out.is_float() { a.all_divisibility() } else { 1 };
                info.divisibility.iter_mut().for_each(|v| *v = all);
                if out.rank() > 0 {
                    // Equal slices reduce to equal values.
                    let kept = (0..a.len()).filter(|&d| d != r.axis);
                    for (o, d) in kept.enumerate() {
                        info.constancy[o] = a.constancy[d];
                    }
                }
                let arg = matches!(r.kind, ReduceKind::Argmax | ReduceKind::Argmin);
                (info, nn || arg)
            }
            Op::Arith(_) => {
                let ins: Vec<&AxisInfo> = args.iter().map(|&a| self.info(a)).collect();
                (elementwise(out, &ins), false)
            }
            // A load reads equal values where its addresses (and masks and
            // `other`s) are equal: one instruction sees one memory state.
            // Nothing is known about the values themselves.
            Op::Memory(MemoryOp::Load { volatile: false, order: None, .. }) => {
                let mut info = AxisInfo::unknown(out.rank());
                info.constancy = dims(out);
                for &a in args {
                    for (c, &k) in info.constancy.iter_mut().zip(&self.info(a).constancy) {
                        *c = (*c).min(k);
                    }
                }
                (info, false)
            }
            // A block load's elements come from distinct addresses: it is data,
            // with no facts (the codegen analyzes its expansion instead).
            Op::Memory(MemoryOp::LoadBlock { .. }) => (AxisInfo::unknown(out.rank()), false),
            // Atomics read memory another lane may change; scans, dots and
            // custom reductions mix elements: no facts.
            _ => (AxisInfo::unknown(out.rank()), false),
        }
    }

    fn creation(&self, c: &CreationOp, args: &[Value], out: &Type) -> Fact {
        match c {
            CreationOp::Const(s) | CreationOp::Full { value: s, .. } => {
                if s.dtype().is_int() {
                    (AxisInfo::splat_int(out, s.as_i64()), s.as_i64() >= 0)
                } else {
                    let mut info = AxisInfo::unknown(out.rank());
                    info.constancy = dims(out);
                    (info, false)
                }
            }
            CreationOp::Splat { .. } => {
                let (x, nn) = self.fact(args[0]);
                let d = dims(out);
                let info = AxisInfo {
                    contiguity: smallvec![1; d.len()],
                    divisibility: smallvec![x.divisibility[0]; d.len()],
                    constancy: d,
                    constant: x.constant,
                };
                (info, nn)
            }
            CreationOp::Arange { start, end } => {
                let n = (i64::from(*end) - i64::from(*start)).max(1) as u64;
                let info = AxisInfo {
                    contiguity: smallvec![n],
                    divisibility: smallvec![pow2_divisor(i64::from(*start))],
                    constancy: smallvec![1],
                    constant: (n == 1).then_some(i64::from(*start)),
                };
                (info, *start >= 0)
            }
        }
    }

    fn int_binary(&self, op: BinaryOp, x: Value, y: Value, out: &Type) -> Fact {
        let (a, b) = (self.info(x), self.info(y));
        let (na, nb) = (self.nonneg(x), self.nonneg(y));
        let d = out.dtype();
        let unsigned = !d.is_signed_int();
        // Non-negative dividends make truncating division behave like floor division.
        let a_pos = na || unsigned;
        let (mut info, nonneg) = match op {
            BinaryOp::Add => (add(a, b, 1), na && nb),
            BinaryOp::Sub => (sub(a, b), false),
            BinaryOp::Mul => (mul(a, b, out), na && nb),
            BinaryOp::Div => (div(a, b, a_pos, out), a_pos && b.constant.is_some_and(|v| v > 0)),
            BinaryOp::Rem => (rem(a, b, a_pos, out), a_pos),
            BinaryOp::Shl => (shl(a, b, d, out), false),
            BinaryOp::Shr => (shr(a, b, d, out), a_pos),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Min | BinaryOp::Max => {
                let mut info = elementwise(out, &[a, b]);
                let (da, db) = (a.all_divisibility(), b.all_divisibility());
                let v = if op == BinaryOp::And { da.max(db) } else { gcd(da, db) };
                info.divisibility.iter_mut().for_each(|x| *x = v);
                let nn = match op {
                    BinaryOp::And | BinaryOp::Max => na || nb,
                    _ => na && nb,
                };
                (info, nn)
            }
            _ => (elementwise(out, &[a, b]), false),
        };
        if unsigned && matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Shl) {
            // Values wrap modulo 2^bits: keep only runs that cannot straddle a wrap.
            info.no_wrap(1u64.checked_shl(d.bits()).unwrap_or(u64::MAX));
        }
        if let (Some(p), Some(q)) = (a.constant, b.constant) {
            if let Some(v) = crate::passes::eval::int_binary(op, d, p, q) {
                return (AxisInfo::splat_int(out, v), v >= 0);
            }
            info.constant = None;
        }
        (info, nonneg)
    }

    fn cmp(&self, p: CmpPred, x: Value, y: Value, out: &Type) -> AxisInfo {
        let (a, b) = (self.info(x), self.info(y));
        let mut info = elementwise(out, &[a, b]);
        if let (Some(u), Some(v)) = (a.constant, b.constant) {
            let ty = self.f.ty(x).dtype();
            let s = |w| crate::ir::Scalar::int(ty, w);
            if let Some(r) = crate::passes::eval::compare(p, s(u), s(v)) {
                return AxisInfo::splat_int(out, r as i64);
            }
        }
        if !self.f.ty(x).is_int() {
            return info;
        }
        // Over an aligned window of g elements where one side is s, s+1, ...,
        // s+g-1 with g | s and the other a constant multiple of g, `<` and `>=`
        // (contiguous side on the left) or `<=` and `>` (on the right) are constant.
        for d in 0..info.len() {
            let window = |run: &AxisInfo, cst: &AxisInfo| {
                if run.contiguity[d] == 1 {
                    return 1;
                }
                run.contiguity[d].min(run.divisibility[d]).min(cst.constancy[d]).min(cst.div_at(d, 1))
            };
            let g = match p {
                CmpPred::Lt | CmpPred::Ge => window(a, b),
                CmpPred::Le | CmpPred::Gt => window(b, a),
                _ => 1,
            };
            info.constancy[d] = info.constancy[d].max(g);
        }
        info
    }

    fn select(&self, c: Value, x: Value, y: Value) -> Fact {
        let (ci, a, b) = (self.info(c), self.info(x), self.info(y));
        if let Some(v) = ci.constant {
            return self.fact(if v != 0 { x } else { y });
        }
        let mut info = AxisInfo::unknown(a.len());
        for d in 0..info.len() {
            // Where the condition is constant the result is one operand's run.
            let run = gcd(ci.constancy[d], gcd(a.contiguity[d], b.contiguity[d]));
            info.contiguity[d] = run;
            info.divisibility[d] = gcd(a.div_at(d, run), b.div_at(d, run));
            info.constancy[d] = gcd(ci.constancy[d], gcd(a.constancy[d], b.constancy[d]));
        }
        info.constant = if a.constant == b.constant { a.constant } else { None };
        (info, self.nonneg(x) && self.nonneg(y))
    }

    fn cast(&self, c: CastOp, x: Value, out: &Type) -> Fact {
        let (a, nn) = self.fact(x);
        let from_ty = self.f.ty(x);
        let from = from_ty.dtype();
        match c {
            CastOp::PtrCast { to } => {
                let mut info = a;
                if to.size_bytes() != from.size_bytes() {
                    info.contiguity.iter_mut().for_each(|v| *v = 1);
                }
                (info, false)
            }
            CastOp::Cast { to } | CastOp::Bitcast { to }
                if from_ty.is_int() && from != DType::I1 && to.is_int() && to != DType::I1 =>
            {
                let (lo, hi) = from.int_range().unwrap_or((0, 0));
                let (tlo, thi) = to.int_range().unwrap_or((0, 0));
                let is_cast = matches!(c, CastOp::Cast { .. });
                // A numeric cast keeps the value when `to` holds every value of
                // `from` (or every non-negative one, for a non-negative input).
                let keeps = is_cast && thi >= hi && (tlo <= lo || nn);
                if keeps {
                    return (a, nn);
                }
                // Otherwise values are taken modulo 2^bits (reinterpreted as
                // signed for signed targets): divisibility survives, runs must
                // not cross a multiple of 2^(bits-1).
                let mut info = a;
                info.no_wrap(1u64 << (to.bits() - 1));
                info.constant = info.constant.and_then(|v| {
                    let s = crate::ir::Scalar::int(from, v);
                    let r = if is_cast {
                        crate::passes::eval::cast(to, s)
                    } else {
                        crate::passes::eval::bitcast(to, s)
                    };
                    r.map(|r| r.as_i64())
                });
                (info, false)
            }
            CastOp::Cast { to } => {
                let mut info = elementwise(out, &[&a]);
                if to.is_int() && !from_ty.is_float() {
                    info.constant = a.constant.and_then(|v| {
                        crate::passes::eval::cast(to, crate::ir::Scalar::int(from, v)).map(|s| s.as_i64())
                    });
                }
                (info, false)
            }
            CastOp::Bitcast { .. } => (elementwise(out, &[&a]), false),
        }
    }

    fn shape(&self, s: &ShapeOp, args: &[Value], out: &Type) -> Fact {
        let (a, nn) = self.fact(args[0]);
        if let (Some(v), false) = (a.constant, matches!(s, ShapeOp::Join)) {
            return (AxisInfo::splat_int(out, v), nn);
        }
        let src = self.f.ty(args[0]);
        let all = a.all_divisibility();
        let unit = |info: &mut AxisInfo, d: usize| {
            info.contiguity[d] = 1;
            info.constancy[d] = 1;
            info.divisibility[d] = all;
        };
        let info = match s {
            ShapeOp::ExpandDims { axis } if src.rank() > 0 => {
                let mut info = a.clone();
                info.contiguity.insert(*axis, 1);
                info.divisibility.insert(*axis, all);
                info.constancy.insert(*axis, 1);
                info
            }
            ShapeOp::ExpandDims { .. } => a.clone(),
            ShapeOp::Broadcast { shape } => {
                let mut info = a.clone();
                for d in 0..shape.len().min(info.len()) {
                    if src.shape[d] == 1 && shape[d] > 1 {
                        info.contiguity[d] = 1;
                        info.constancy[d] = shape[d] as u64;
                    }
                }
                info
            }
            ShapeOp::Permute { order } => {
                let pick = |v: &Dims| -> Dims { order.iter().map(|&o| v[o]).collect() };
                AxisInfo {
                    contiguity: pick(&a.contiguity),
                    divisibility: pick(&a.divisibility),
                    constancy: pick(&a.constancy),
                    constant: a.constant,
                }
            }
            ShapeOp::Reshape { shape } => {
                let mut info = AxisInfo::unknown(shape.len());
                info.constant = a.constant;
                let nonunit = |s: &[usize]| -> Vec<usize> { (0..s.len()).filter(|&d| s[d] > 1).collect() };
                let (from_dims, to_dims) = (nonunit(&src.shape), nonunit(shape));
                let same = from_dims.len() == to_dims.len()
                    && from_dims.iter().zip(&to_dims).all(|(&p, &q)| src.shape[p] == shape[q]);
                for d in 0..shape.len() {
                    unit(&mut info, d);
                }
                if same {
                    // Only unit dimensions are inserted or removed.
                    for (&p, &q) in from_dims.iter().zip(&to_dims) {
                        info.contiguity[q] = a.contiguity[p];
                        info.divisibility[q] = a.divisibility[p];
                        info.constancy[q] = a.constancy[p];
                    }
                } else if let (Some(&last_to), Some(ls)) = (shape.last(), src.rank().checked_sub(1)) {
                    // Row-major order keeps aligned runs of the source's last
                    // dimension (they divide it) as long as they fit the new one.
                    let q = shape.len() - 1;
                    let c = a.contiguity[ls].min(last_to as u64);
                    info.contiguity[q] = c;
                    info.divisibility[q] = a.div_at(ls, c);
                    info.constancy[q] = a.constancy[ls].min(last_to as u64);
                }
                info
            }
            ShapeOp::Join => {
                let b = self.info(args[1]);
                let mut info = AxisInfo::unknown(out.rank());
                let both = gcd(all, b.all_divisibility());
                for d in 0..a.len().min(b.len()).min(out.rank().saturating_sub(1)) {
                    let c = gcd(a.contiguity[d], b.contiguity[d]);
                    info.contiguity[d] = c;
                    info.divisibility[d] = gcd(a.div_at(d, c), b.div_at(d, c));
                    info.constancy[d] = gcd(a.constancy[d], b.constancy[d]);
                }
                if let Some(last) = out.rank().checked_sub(1) {
                    info.divisibility[last] = both;
                }
                info.constant = if a.constant == b.constant { a.constant } else { None };
                return (info, nn && self.nonneg(args[1]));
            }
            ShapeOp::Split => AxisInfo::unknown(out.rank()),
        };
        (info, nn)
    }

    /// Solves loop-carried facts: starting from `init`, re-analyzes with
    /// `run(carried)` (which returns the facts flowing back) until they are
    /// stable, falling back to no facts after [`MAX_LOOP_ROUNDS`].
    fn fixpoint(
        &mut self,
        init: Vec<Fact>,
        mut run: impl FnMut(&mut Self, &[Fact]) -> Vec<Fact>,
    ) -> Vec<Fact> {
        let mut carried = init;
        for _ in 0..MAX_LOOP_ROUNDS {
            let back = run(self, &carried);
            let next: Vec<Fact> =
                carried.iter().zip(&back).map(|((a, na), (b, nb))| (a.meet(b), *na && *nb)).collect();
            if next == carried {
                return carried;
            }
            carried = next;
        }
        let pessimistic: Vec<Fact> =
            carried.iter().map(|(a, _)| (AxisInfo::unknown(a.len()), false)).collect();
        run(self, &pessimistic);
        pessimistic
    }

    fn yielded(&self, r: Region, skip: usize) -> Vec<Fact> {
        let b = self.f.entry(r);
        match self.f.blocks[b].insts.last() {
            Some(&t) => self.f.insts[t].args.iter().skip(skip).map(|&v| self.fact(v)).collect(),
            None => Vec::new(),
        }
    }

    fn for_op(&mut self, i: Inst) {
        let f = self.f;
        let data = &f.insts[i];
        let body = data.regions[0];
        let bargs = &f.blocks[f.entry(body)].args;
        let (lb, step) = (self.info(data.args[0]), self.info(data.args[2]));
        let mut iv = AxisInfo::unknown(0);
        iv.divisibility[0] = gcd(lb.all_divisibility(), step.all_divisibility());
        // The step is positive, so the induction variable never goes below the lower bound.
        let iv_nonneg = self.nonneg(data.args[0]);
        self.set(bargs[0], (iv, iv_nonneg));
        let init: Vec<Fact> = data.args[3..].iter().map(|&v| self.fact(v)).collect();
        let carried = self.fixpoint(init, |s, carried| {
            for (&a, fact) in bargs[1..].iter().zip(carried) {
                s.set(a, fact.clone());
            }
            s.region(body);
            s.yielded(body, 0)
        });
        for (&r, fact) in data.results.iter().zip(carried) {
            self.set(r, fact);
        }
    }

    fn if_op(&mut self, i: Inst) {
        let data = &self.f.insts[i];
        let (then_r, else_r) = (data.regions[0], data.regions[1]);
        self.region(then_r);
        self.region(else_r);
        let (t, e) = (self.yielded(then_r, 0), self.yielded(else_r, 0));
        for ((&r, (a, na)), (b, nb)) in data.results.iter().zip(t).zip(e) {
            self.set(r, (a.meet(&b), na && nb));
        }
    }

    fn while_op(&mut self, i: Inst) {
        let f = self.f;
        let data = &f.insts[i];
        let (before, after) = (data.regions[0], data.regions[1]);
        let before_args = &f.blocks[f.entry(before)].args;
        let after_args = &f.blocks[f.entry(after)].args;
        let init: Vec<Fact> = data.args.iter().map(|&v| self.fact(v)).collect();
        self.fixpoint(init, |s, carried| {
            for (&a, fact) in before_args.iter().zip(carried) {
                s.set(a, fact.clone());
            }
            s.region(before);
            for (&a, fact) in after_args.iter().zip(s.yielded(before, 1)) {
                s.set(a, fact);
            }
            s.region(after);
            s.yielded(after, 0)
        });
        for (&r, fact) in data.results.iter().zip(self.yielded(before, 1)) {
            self.set(r, fact);
        }
    }
}
