//! Test support: a small reference evaluator for integer IR (one program of
//! the grid) and a random kernel generator, used to check that the passes keep
//! the computed values and that the axis analysis never over-claims.
//!
//! Invariant: the evaluator follows the op semantics through `super::eval`
//! and fails (rather than guessing) on signed overflow, division by zero and
//! anything it does not model (floats, `while`, custom combines). Pointers are
//! byte addresses; a load returns a fixed function of its address.

use super::eval;
use crate::dtype::DType;
use crate::ir::ops::{
    ArithOp, CastOp, CompareOp, ControlOp, CreationOp, MemoryOp, ProgramOp, ReduceKind, ShapeOp,
};
use crate::ir::{Block, Function, Inst, Op, Region, Scalar, Value};
use crate::lang::*;
use rustc_hash::FxHashMap;

/// A row-major tile of integers (a scalar has an empty shape and one element).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Tile {
    pub shape: Vec<usize>,
    pub data: Vec<i64>,
}

/// What one program computed: every value, and the stores in program order.
#[derive(Debug, Default)]
pub(crate) struct Run {
    pub vals: FxHashMap<Value, Tile>,
    pub stores: Vec<Vec<(i64, i64)>>,
}

type R<T> = Result<T, String>;

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// Runs `f` as program `pid` with integer (or address) arguments `params`.
pub(crate) fn run(f: &Function, params: &[i64], pid: i64) -> R<Run> {
    let mut r = Run::default();
    for (p, &v) in f.params.iter().zip(params) {
        r.vals.insert(p.value, Tile { shape: vec![], data: vec![v] });
    }
    let mut e = Evaluator { f, pid, run: r };
    e.region(f.body)?;
    Ok(e.run)
}

struct Evaluator<'a> {
    f: &'a Function,
    pid: i64,
    run: Run,
}

impl Evaluator<'_> {
    fn get(&self, v: Value) -> R<&Tile> {
        self.run.vals.get(&v).ok_or_else(|| format!("{v} has no value"))
    }

    fn region(&mut self, r: Region) -> R<Vec<Value>> {
        let b: Block = self.f.entry(r);
        let mut yielded = Vec::new();
        for &i in &self.f.blocks[b].insts {
            if self.f.insts[i].op.is_terminator() {
                yielded = self.f.insts[i].args.to_vec();
            } else {
                self.inst(i)?;
            }
        }
        Ok(yielded)
    }

    fn inst(&mut self, i: Inst) -> R<()> {
        let f = self.f;
        let data = &f.insts[i];
        let args: Vec<Tile> = data.args.iter().map(|&a| self.get(a).cloned()).collect::<R<_>>()?;
        let out_ty = data.results.first().map(|&r| f.ty(r).clone());
        let dt = out_ty.as_ref().map(|t| t.dtype()).unwrap_or(DType::I32);
        let shape: Vec<usize> = out_ty.as_ref().map(|t| t.shape.to_vec()).unwrap_or_default();
        let numel = shape.iter().product::<usize>();
        let int = |k: usize| -> R<i64> { Ok(args[k].data[0]) };
        let result = match &data.op {
            Op::Creation(CreationOp::Const(s)) | Op::Creation(CreationOp::Full { value: s, .. }) => {
                if s.dtype().is_float() {
                    return Err("float".into());
                }
                Tile { shape, data: vec![s.as_i64(); numel] }
            }
            Op::Creation(CreationOp::Splat { .. }) => Tile { shape, data: vec![int(0)?; numel] },
            Op::Creation(CreationOp::Arange { start, end }) => {
                Tile { shape, data: (i64::from(*start)..i64::from(*end)).collect() }
            }
            Op::Program(ProgramOp::ProgramId { .. }) => Tile { shape, data: vec![self.pid] },
            Op::Program(ProgramOp::NumPrograms { .. }) => Tile { shape, data: vec![64] },
            Op::Program(ProgramOp::GdcWait | ProgramOp::GdcLaunchDependents | ProgramOp::Barrier) => {
                return Ok(());
            }
            Op::Program(ProgramOp::GlobalTimer) => Tile { shape, data: vec![0] },
            Op::Arith(ArithOp::Binary(b)) => {
                let d = f.ty(data.args[0]).dtype();
                if d.is_float() {
                    return Err("float".into());
                }
                let v = args[0]
                    .data
                    .iter()
                    .zip(&args[1].data)
                    .map(|(&x, &y)| {
                        eval::int_binary(*b, d, x, y).ok_or_else(|| format!("{} traps", b.name()))
                    })
                    .collect::<R<_>>()?;
                Tile { shape, data: v }
            }
            Op::Arith(ArithOp::Unary(u)) => {
                let v = args[0]
                    .data
                    .iter()
                    .map(|&x| eval::unary(*u, Scalar::int(dt, x)).map(|s| s.as_i64()).ok_or("unary traps"))
                    .collect::<Result<_, _>>()?;
                Tile { shape, data: v }
            }
            Op::Arith(ArithOp::AddPtr) => {
                let e = dt.size_bytes() as i64;
                let v = args[0].data.iter().zip(&args[1].data).map(|(&p, &o)| p + o * e).collect();
                Tile { shape, data: v }
            }
            Op::Compare(CompareOp::Cmp(p)) => {
                let d = f.ty(data.args[0]).dtype();
                let d = if f.ty(data.args[0]).is_ptr() { DType::I64 } else { d };
                let v = args[0]
                    .data
                    .iter()
                    .zip(&args[1].data)
                    .map(|(&x, &y)| eval::compare(*p, Scalar::int(d, x), Scalar::int(d, y)).unwrap() as i64)
                    .collect();
                Tile { shape, data: v }
            }
            Op::Compare(CompareOp::Select) => {
                let v = (0..numel)
                    .map(|k| if args[0].data[k] != 0 { args[1].data[k] } else { args[2].data[k] })
                    .collect();
                Tile { shape, data: v }
            }
            Op::Cast(CastOp::Cast { to }) | Op::Cast(CastOp::Bitcast { to }) => {
                let from = f.ty(data.args[0]).dtype();
                let is_cast = matches!(data.op, Op::Cast(CastOp::Cast { .. }));
                let v = args[0]
                    .data
                    .iter()
                    .map(|&x| {
                        let s = Scalar::int(from, x);
                        let r = if is_cast { eval::cast(*to, s) } else { eval::bitcast(*to, s) };
                        r.filter(|r| r.dtype().is_int()).map(|r| r.as_i64()).ok_or("cast")
                    })
                    .collect::<Result<_, _>>()?;
                Tile { shape, data: v }
            }
            Op::Cast(CastOp::PtrCast { .. }) | Op::Hint(_) => Tile { shape, data: args[0].data.clone() },
            Op::Shape(ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. }) => {
                Tile { shape, data: args[0].data.clone() }
            }
            Op::Shape(ShapeOp::Join) => {
                let v = args[0].data.iter().zip(&args[1].data).flat_map(|(&x, &y)| [x, y]).collect();
                Tile { shape, data: v }
            }
            Op::Shape(ShapeOp::Split) => {
                for (k, &r) in data.results.iter().enumerate() {
                    let v = args[0].data.iter().skip(k).step_by(2).copied().collect();
                    self.run.vals.insert(r, Tile { shape: shape.clone(), data: v });
                }
                return Ok(());
            }
            Op::Shape(ShapeOp::Broadcast { .. }) => {
                let src = &args[0];
                let ss = strides(&src.shape);
                let v = (0..numel)
                    .map(|k| {
                        let idx = unravel(k, &shape);
                        let off: usize = idx
                            .iter()
                            .enumerate()
                            .map(|(d, &x)| if src.shape[d] == 1 { 0 } else { x * ss[d] })
                            .sum();
                        src.data[off]
                    })
                    .collect();
                Tile { shape, data: v }
            }
            Op::Shape(ShapeOp::Permute { order }) => {
                let src = &args[0];
                let ss = strides(&src.shape);
                let v = (0..numel)
                    .map(|k| {
                        let idx = unravel(k, &shape);
                        src.data[idx.iter().enumerate().map(|(d, &x)| x * ss[order[d]]).sum::<usize>()]
                    })
                    .collect();
                Tile { shape, data: v }
            }
            Op::Memory(m @ MemoryOp::Load { .. }) => {
                let e = dt.size_bytes() as i64;
                let refs: Vec<&Tile> = args.iter().collect();
                let ops = m.load_operands(&refs).ok_or("load without a pointer")?;
                let v = (0..numel)
                    .map(|k| {
                        if ops.mask.is_some_and(|m| m.data[k] == 0) {
                            ops.other.map_or(0, |o| o.data[k])
                        } else {
                            dt.wrap_int((ops.ptr.data[k] / e) * 31 + 7)
                        }
                    })
                    .collect();
                Tile { shape, data: v }
            }
            Op::Memory(MemoryOp::Store { has_mask, .. }) => {
                let n = args[0].data.len();
                let lanes = (0..n)
                    .filter(|&k| !*has_mask || args[2].data[k] != 0)
                    .map(|k| (args[0].data[k], args[1].data[k]))
                    .collect();
                self.run.stores.push(lanes);
                return Ok(());
            }
            Op::Reduce(r) if r.kind != ReduceKind::Custom => {
                let src = &args[0];
                let d = f.ty(data.args[0]).dtype();
                let n = src.shape[r.axis];
                let mut out_shape = src.shape.clone();
                out_shape.remove(r.axis);
                let on = out_shape.iter().product::<usize>();
                let ss = strides(&src.shape);
                let mut v = Vec::with_capacity(on);
                for k in 0..on {
                    let mut idx = unravel(k, &out_shape);
                    idx.insert(r.axis, 0);
                    let base: usize = idx.iter().zip(&ss).map(|(a, b)| a * b).sum();
                    let xs: Vec<i64> = (0..n).map(|j| src.data[base + j * ss[r.axis]]).collect();
                    let x = match r.kind {
                        ReduceKind::Sum => xs.iter().try_fold(0i64, |acc, &x| {
                            eval::int_binary(crate::ir::ops::BinaryOp::Add, d, acc, x).ok_or("sum overflows")
                        })?,
                        ReduceKind::Max => *xs.iter().max().unwrap(),
                        ReduceKind::Min => *xs.iter().min().unwrap(),
                        _ => return Err("arg reduce".into()),
                    };
                    v.push(x);
                }
                Tile { shape, data: v }
            }
            Op::Control(ControlOp::For) => return self.for_op(i, &args),
            Op::Control(ControlOp::If) => {
                let r = data.regions[if args[0].data[0] != 0 { 0 } else { 1 }];
                let ys = self.region(r)?;
                for (&res, y) in data.results.iter().zip(ys) {
                    let t = self.get(y)?.clone();
                    self.run.vals.insert(res, t);
                }
                return Ok(());
            }
            op => return Err(format!("unsupported {}", op.name())),
        };
        if let Some(&r) = data.results.first() {
            self.run.vals.insert(r, result);
        }
        Ok(())
    }

    fn for_op(&mut self, i: Inst, args: &[Tile]) -> R<()> {
        let data = &self.f.insts[i];
        let body = data.regions[0];
        let bargs = self.f.blocks[self.f.entry(body)].args.clone();
        let (lb, ub, step) = (args[0].data[0], args[1].data[0], args[2].data[0]);
        if step <= 0 {
            return Err("step".into());
        }
        let mut carried: Vec<Tile> = args[3..].to_vec();
        let mut iv = lb;
        while iv < ub {
            self.run.vals.insert(bargs[0], Tile { shape: vec![], data: vec![iv] });
            for (&a, t) in bargs[1..].iter().zip(&carried) {
                self.run.vals.insert(a, t.clone());
            }
            let ys = self.region(body)?;
            carried = ys.iter().map(|&y| self.get(y).cloned()).collect::<R<_>>()?;
            iv += step;
        }
        for (&r, t) in data.results.iter().zip(carried) {
            self.run.vals.insert(r, t);
        }
        Ok(())
    }
}

/// A xorshift generator, so random tests are reproducible without a dependency.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Parameter divisibilities of the random kernels: `n` (i32), `m` (i32), and
/// the pointers `p` (to i32) and `out` (to i64).
pub(crate) const RANDOM_PARAM_DIVS: [u32; 4] = [1, 16, 16, 8];

/// Builds a random integer kernel from `seed`: index arithmetic on scalars and
/// tiles of shapes `[16]`, `[8, 1]` and `[8, 16]`, casts, selects, a loop, an
/// `if`, loads and address computations; every value is stored to `out`.
pub(crate) fn random_kernel(seed: u64) -> Function {
    use crate::ir::ParamHints;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    KernelBuilder::new("random")
        .build(|| {
            let hint = |d: u32| ParamHints { divisibility: Some(d) };
            let n = param_with_hints("n", crate::Type::scalar(DType::I32), hint(RANDOM_PARAM_DIVS[0]));
            let m = param_with_hints("m", crate::Type::scalar(DType::I32), hint(RANDOM_PARAM_DIVS[1]));
            let p = param_with_hints("p", crate::Type::ptr(DType::I32), hint(RANDOM_PARAM_DIVS[2]));
            let out = param_with_hints("out", crate::Type::ptr(DType::I64), hint(RANDOM_PARAM_DIVS[3]));
            let consts = [0i64, 1, 2, 3, 4, 8, 16, -1, -4, 7, 64, 5];
            // Runs that may be negative (`m + i`) or wrap around (`u32`) are
            // where truncating division and unsigned arithmetic need care.
            let run = m + arange(0, 16);
            let mut pool: Vec<Tensor> = vec![
                n,
                m,
                program_id(0),
                arange(0, 16),
                arange(0, 8).expand_dims(1),
                run,
                run.to(DType::U32),
            ];
            let leaves = pool.len();
            let mut ptrs: Vec<Tensor> = vec![p];
            for _ in 0..14 {
                let a = pool[rng.below(pool.len())];
                let b = pool[rng.below(pool.len())];
                // Negative literals do not fit unsigned operands (a build error).
                let unsigned = a.dtype().is_unsigned_int();
                let lit = |v: i64| if unsigned { v.abs() } else { v };
                let c = lit(rng.pick(&consts));
                let small = rng.pick(&[1i64, 2, 3, 4, 8, 16]);
                let t = match rng.below(28) {
                    0 | 1 => a + b,
                    2 => a - b,
                    3 | 4 => a * c,
                    5 => a * b,
                    6 => a + c,
                    7 => div(a, small),
                    8 => rem(a, small),
                    9 => shl(a, rng.pick(&[0i64, 1, 3, 4])),
                    10 => shr(a, rng.pick(&[0i64, 1, 2, 4])),
                    11 => and(a, lit(rng.pick(&[1i64, 3, 7, 15, -16, -1]))),
                    12 => or(a, b),
                    13 => where_(a.lt(b), a, b),
                    14 => where_(a.ge(c), b, a + 1),
                    15 => maximum(a, b),
                    16 => cast(a, rng.pick(&[DType::I64, DType::U32, DType::I16, DType::U8, DType::I32])),
                    17 => arange(16 * small as i32, 16 * small as i32 + 16) + a,
                    18 => {
                        let r = for_range(0, 3, 1, &[a], |iv, c| vec![cast(c[0] + iv * small, a.dtype())]);
                        r[0]
                    }
                    19 => {
                        let q = ptrs[rng.below(ptrs.len())] + a;
                        ptrs.push(q);
                        let mask = if rng.below(2) == 0 { Some(b.lt(c.abs())) } else { None };
                        let l = load(q, mask, mask.map(|_| Operand::Int(0)));
                        if rng.below(3) == 0 { l } else { a }
                    }
                    20 => {
                        let r = if_else(n.gt(c), || vec![a + 1], || vec![a * 2]);
                        r[0]
                    }
                    21 => a.expand_dims(0) + b,
                    22 => match a.shape().as_slice() {
                        [8, 16] => a.reshape(&[128]).reshape(&[8, 16]),
                        [16] => a.reshape(&[4, 4]).reshape(&[2, 8]).reshape(&[16]),
                        [8, 1] => a.reshape(&[8]).reshape(&[8, 1]),
                        _ => a,
                    },
                    23 => match a.shape().len() {
                        2 => a.trans().trans() + a.trans().trans().trans().trans(),
                        _ => a,
                    },
                    24 => multiple_of(a * 16, 16),
                    25 => {
                        let (x, y) = split(join(a, a + 1));
                        x + y
                    }
                    26 => {
                        // Comparisons against `m`, a multiple of 16, on both sides.
                        let (x, y) = if rng.below(2) == 0 { (a, m) } else { (m, a) };
                        let mask = match rng.below(6) {
                            0 => x.lt(y),
                            1 => x.ge(y),
                            2 => x.le(y),
                            3 => x.gt(y),
                            4 => x.eq_(y),
                            _ => x.ne_(y),
                        };
                        where_(mask, a, b)
                    }
                    _ => match a.shape().as_slice() {
                        [8, 16] | [16] | [8, 1] => {
                            if rng.below(2) == 0 {
                                sum(a, 0)
                            } else {
                                max(a, 0)
                            }
                        }
                        _ => a,
                    },
                };
                // Keep the shapes in the compatible set.
                let t = if t.shape().len() > 2 { arange(0, 16) + c } else { t };
                pool.push(t);
            }
            for &t in pool.iter().skip(leaves) {
                store(out, t, None);
            }
        })
        .expect("random kernel builds")
}

/// Random arguments for [`random_kernel`] honoring its parameter hints.
pub(crate) fn random_args(rng: &mut Rng) -> (Vec<i64>, i64) {
    let n = rng.pick(&[0i64, 1, 5, 17, 100, 1000, -3]);
    let m = 16 * rng.pick(&[0i64, 1, 3, 40, -2]);
    let p = 16 * (rng.below(1000) as i64 + 1);
    let out = 8 * (rng.below(1000) as i64 + 1);
    (vec![n, m, p, out], rng.below(70) as i64)
}

/// A random kernel with its canonical form and argument lists for both.
pub(crate) struct RandomCase {
    pub seed: u64,
    pub kernel: Function,
    /// `kernel` canonicalized (and verified).
    pub canonical: Function,
    /// Four draws of [`random_args`].
    pub args: Vec<(Vec<i64>, i64)>,
}

/// The random kernels of `seeds` as [`RandomCase`]s, their arguments drawn from `rng`.
pub(crate) fn random_cases(
    rng: &mut Rng,
    seeds: std::ops::Range<u64>,
) -> impl Iterator<Item = RandomCase> + '_ {
    seeds.map(|seed| {
        let kernel = random_kernel(seed);
        let mut canonical = kernel.clone();
        super::canonicalize(&mut canonical);
        crate::verify::verify(&canonical)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", crate::print::print(&canonical)));
        let args = (0..4).map(|_| random_args(rng)).collect();
        RandomCase { seed, kernel, canonical, args }
    })
}
