//! The executor: runs one program of a kernel over its blocks and regions.
//!
//! The environment is a vector indexed by `Value` holding cheap-to-clone
//! [`Tile`] handles (shared storage), so reading an operand never copies its
//! elements; the plan drops each value after its last use. Structured control
//! flow keeps an explicit stack of [`Frame`]s (the block being run, the
//! position in it, and what the owning `for`/`if`/`while` does when it
//! ends); `yield`/`condition` end a block and hand their operands back to
//! the owning op. Because the whole position of a program is that stack and
//! its environment, a program can stop at a `wait_until` that does not hold
//! ([`Run::Blocked`]) and resume later exactly there: `launch.rs` interleaves
//! the programs of a kernel that waits. Custom combine regions run to their
//! end on a stack of their own (the verifier keeps waits out of them).
//!
//! Errors: op kernels report plain messages, which [`Exec::fail`] turns into an
//! [`InterpError`] carrying the op's location, mnemonic and the program id.
//! Errors raised inside a region already carry the inner op's location and are
//! passed through unchanged.
//!
//! Invariant: the function was verified and planned (`plan.rs`), so operand
//! counts and types match each op's rule; violations still surface as
//! internal errors, never as panics.

use super::InterpError;
use super::memory::{Access, BlockBox, Memory};
use super::plan::Plan;
use super::tile::{Class, Data, Tile, class_of, internal, map_data, pid_str};
use super::{arith, atomic, cast, debug, dot, reduce, shape};
use crate::dtype::{Elem, Shape};
use crate::ir::ops::{
    ArithOp, CastOp, CmpPred, CompareOp, ControlOp, CreationOp, DebugOp, MemOrder, MemScope, MemSem,
    MemoryOp, ProgramOp, ReduceKind, ScanKind, ShapeOp,
};
use crate::ir::{Block, EntityRef, Function, Inst, Op, Region, Scalar, Value};
use smallvec::{SmallVec, smallvec};
use std::io::Write;

/// The results of one op.
type Outs = SmallVec<[Tile; 2]>;

/// What the owner of a running block does when the block ends.
#[derive(Clone, Debug)]
enum Then {
    /// The outermost block of the run: its terminator's operands are the result.
    Return,
    /// A `for` body at induction value `iv`; the loop runs while `iv < ub`,
    /// stepping by `step` (stopping before passing `hi`, the dtype's maximum).
    For {
        /// The loop.
        inst: Inst,
        /// The induction variable's type.
        elem: Elem,
        /// This iteration's induction value.
        iv: i64,
        /// The exclusive upper bound.
        ub: i64,
        /// The positive step.
        step: i64,
        /// The largest value of the induction variable's dtype.
        hi: i64,
    },
    /// A branch of an `if`.
    If(Inst),
    /// The condition region of a `while`.
    Before(Inst),
    /// The body region of a `while`.
    After(Inst),
}

/// A block being run: where in it the program is, and what its owner does next.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    block: Block,
    pos: usize,
    then: Then,
}

/// The position of a program: the blocks it is inside, innermost last.
pub(crate) type Stack = SmallVec<[Frame; 4]>;

/// The position of a program about to run block `b` from its start.
pub(crate) fn start(b: Block) -> Stack {
    smallvec![Frame { block: b, pos: 0, then: Then::Return }]
}

/// A `wait_until` that does not hold: what it reads and what it waits for.
#[derive(Clone, Debug)]
pub(crate) struct Blocked {
    /// The wait.
    pub inst: Inst,
    /// The address it reads.
    pub addr: i64,
    /// The comparison.
    pub cmp: CmpPred,
    /// The value it compares with.
    pub want: i64,
    /// The value it read.
    pub seen: i64,
}

/// How a run of a program's stack ended.
pub(crate) enum Run {
    /// The outermost block ended: its terminator's operands (none for the body).
    Done(Vec<Tile>),
    /// The program stopped at a `wait_until` that does not hold; running the
    /// same stack again re-checks it.
    Blocked(Blocked),
}

/// The state of one running program.
pub(crate) struct Exec<'a, 'b> {
    /// The kernel.
    pub f: &'a Function,
    /// Its plan.
    pub plan: &'a Plan,
    /// Values by index.
    pub env: Vec<Option<Tile>>,
    /// Everything else an op may touch (kept apart from `env`, so ops can
    /// borrow their operands from `env` while they write memory).
    pub world: World<'a, 'b>,
}

/// What ops see besides their operands.
pub(crate) struct World<'a, 'b> {
    /// Global memory.
    pub mem: Memory<'b>,
    /// This program's coordinates.
    pub pid: [u32; 3],
    /// The grid.
    pub grid: [u32; 3],
    /// Where `print` writes.
    pub sink: &'a mut dyn Write,
}

/// A tile filled with `n` copies of a constant.
pub(crate) fn fill(s: Scalar, shape: &[usize]) -> Tile {
    let n = shape.iter().product();
    let elem = Elem::Scalar(s.dtype());
    let data = match class_of(elem) {
        Class::Int => Data::Int(vec![s.as_i64(); n]),
        Class::F32 => Data::F32(vec![s.as_f64() as f32; n]),
        Class::F64 => Data::F64(vec![s.as_f64(); n]),
    };
    Tile::new(elem, Shape::from_slice(shape), data)
}

/// The value of a scalar integer tile.
fn scalar_int(t: &Tile) -> Result<i64, String> {
    t.ints()?.first().copied().ok_or_else(|| internal("empty scalar".into()))
}

/// Concatenates flat tiles of one element type.
fn concat(parts: &[Tile]) -> Result<Tile, String> {
    let first = parts.first().ok_or_else(|| internal("nothing to concatenate".into()))?;
    let mut data = Data::zeros(first.elem, 0);
    for p in parts {
        match (&mut data, &*p.data) {
            (Data::Int(d), Data::Int(s)) => d.extend_from_slice(s),
            (Data::F32(d), Data::F32(s)) => d.extend_from_slice(s),
            (Data::F64(d), Data::F64(s)) => d.extend_from_slice(s),
            _ => return Err(internal("combine results of different storage".into())),
        }
    }
    let n = data.len();
    Ok(Tile::new(first.elem, Shape::from_slice(&[n]), data))
}

impl Exec<'_, '_> {
    /// An error of instruction `i` in this program.
    pub(crate) fn fail(&self, i: Inst, message: String) -> InterpError {
        let d = &self.f.insts[i];
        InterpError {
            loc: d.loc.clone(),
            op: d.op.name(),
            message: format!("{}: {message}", pid_str(self.world.pid)),
            program: Some(self.world.pid),
        }
    }

    /// The value of `v` (a cheap handle clone), used by instruction `i`.
    fn get(&self, v: Value, i: Inst) -> Result<Tile, InterpError> {
        match self.env.get(v.index()) {
            Some(Some(t)) => Ok(t.clone()),
            _ => Err(self.fail(i, internal(format!("{v} is used but has no value")))),
        }
    }

    /// Binds `v` to `t`.
    fn set(&mut self, v: Value, t: Tile) {
        if let Some(slot) = self.env.get_mut(v.index()) {
            *slot = Some(t);
        }
    }

    /// Binds block `b`'s arguments to `vals`.
    fn bind_args(&mut self, b: Block, vals: Vec<Tile>, i: Inst) -> Result<(), InterpError> {
        let args = &self.f.blocks[b].args;
        if args.len() != vals.len() {
            return Err(
                self.fail(i, internal(format!("{b} takes {} values, got {}", args.len(), vals.len())))
            );
        }
        for (&a, t) in args.iter().zip(vals) {
            self.set(a, t);
        }
        Ok(())
    }

    /// Drops the values whose last use is instruction `i`.
    fn kill(&mut self, i: Inst) {
        if let Some(ks) = self.plan.kills.get(i.index()) {
            for &v in ks {
                if let Some(slot) = self.env.get_mut(v.index()) {
                    *slot = None;
                }
            }
        }
    }

    /// Runs block `b` to its end; returns the operands of its terminator
    /// (none for the body). A `wait_until` that does not hold is an error
    /// here: kernels that wait run through [`Exec::run`].
    pub(crate) fn run_block(&mut self, b: Block) -> Result<Vec<Tile>, InterpError> {
        let mut stack = start(b);
        match self.run(&mut stack)? {
            Run::Done(vals) => Ok(vals),
            Run::Blocked(w) => {
                Err(self.fail(w.inst, internal("`wait_until` blocked in a run that cannot wait".into())))
            }
        }
    }

    /// Runs the single block of region `r`.
    fn run_region(&mut self, r: Region, args: Vec<Tile>, i: Inst) -> Result<Vec<Tile>, InterpError> {
        let b = self.f.entry(r);
        self.bind_args(b, args, i)?;
        self.run_block(b)
    }

    /// Runs the program from the position `stack` until its outermost block
    /// ends or a `wait_until` does not hold (then `stack` stays at the wait).
    pub(crate) fn run(&mut self, stack: &mut Stack) -> Result<Run, InterpError> {
        let f = self.f;
        loop {
            let Some(top) = stack.last_mut() else {
                return Err(InterpError {
                    loc: f.loc.clone(),
                    op: "kernel",
                    message: internal("an empty stack was run".into()),
                    program: Some(self.world.pid),
                });
            };
            let Some(&i) = f.blocks[top.block].insts.get(top.pos) else {
                // Only the body ends without a terminator (the verifier checks it).
                stack.pop();
                if stack.is_empty() {
                    return Ok(Run::Done(Vec::new()));
                }
                let owner = self.owner(stack);
                return Err(self.fail(owner, internal("a region block without a terminator".into())));
            };
            let d = &f.insts[i];
            match &d.op {
                Op::Control(ControlOp::Yield | ControlOp::Condition) => {
                    let vals = d.args.iter().map(|&a| self.get(a, i)).collect::<Result<Vec<_>, _>>()?;
                    self.kill(i);
                    let Some(frame) = stack.pop() else { continue };
                    if let Some(vals) = self.block_ended(frame, vals, stack)? {
                        return Ok(Run::Done(vals));
                    }
                }
                Op::Control(c) => {
                    let args = d.args.iter().map(|&a| self.get(a, i)).collect::<Result<Vec<_>, _>>()?;
                    self.enter(i, *c, args, stack)?;
                }
                Op::Memory(MemoryOp::WaitUntil { cmp, sem, scope }) => {
                    let order = MemOrder { sem: *sem, scope: *scope };
                    if let Some(w) = self.wait(i, *cmp, order)? {
                        return Ok(Run::Blocked(w));
                    }
                    self.kill(i);
                    top.pos += 1;
                }
                Op::Memory(MemoryOp::WaitLoad { scope, .. }) => {
                    let lines = match self.wait_load(i, *scope)? {
                        Ok(t) => t,
                        Err(w) => return Ok(Run::Blocked(w)),
                    };
                    self.set(d.results[0], lines);
                    self.kill(i);
                    top.pos += 1;
                }
                _ => {
                    let outs = self.inst(i)?;
                    if outs.len() != d.results.len() {
                        return Err(
                            self.fail(i, internal(format!("{} results for {}", outs.len(), d.results.len())))
                        );
                    }
                    for (&r, t) in d.results.iter().zip(outs) {
                        self.set(r, t);
                    }
                    self.kill(i);
                    if let Some(top) = stack.last_mut() {
                        top.pos += 1;
                    }
                }
            }
        }
    }

    /// The instruction owning the innermost frame of `stack` (for messages).
    fn owner(&self, stack: &Stack) -> Inst {
        let f = self.f;
        stack
            .last()
            .and_then(|fr| f.blocks[fr.block].insts.get(fr.pos).copied())
            .unwrap_or_else(|| Inst::new(0))
    }

    /// Binds the results of the control op `i` (whose frame has ended) and
    /// moves its block past it.
    fn complete(&mut self, i: Inst, vals: Vec<Tile>, stack: &mut Stack) -> Result<(), InterpError> {
        let results = &self.f.insts[i].results;
        if vals.len() != results.len() {
            return Err(self.fail(i, internal(format!("{} results for {}", vals.len(), results.len()))));
        }
        for (&r, t) in results.iter().zip(vals) {
            self.set(r, t);
        }
        self.kill(i);
        if let Some(top) = stack.last_mut() {
            top.pos += 1;
        }
        Ok(())
    }

    /// Pushes the frame of region `k` of `i`, its block bound to `args`.
    fn push(
        &mut self,
        i: Inst,
        k: usize,
        args: Vec<Tile>,
        then: Then,
        stack: &mut Stack,
    ) -> Result<(), InterpError> {
        let Some(&r) = self.f.insts[i].regions.get(k) else {
            return Err(self.fail(i, internal(format!("missing region {k}"))));
        };
        let b = self.f.entry(r);
        self.bind_args(b, args, i)?;
        stack.push(Frame { block: b, pos: 0, then });
        Ok(())
    }

    /// Starts `for`, `if` or `while` (instruction `i`) on its operands `args`.
    fn enter(
        &mut self,
        i: Inst,
        c: ControlOp,
        args: Vec<Tile>,
        stack: &mut Stack,
    ) -> Result<(), InterpError> {
        macro_rules! ok {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(m) => return Err(self.fail(i, m)),
                }
            };
        }
        match c {
            ControlOp::For => {
                let (Some(lb), Some(ub), Some(step)) = (args.first(), args.get(1), args.get(2)) else {
                    return Err(self.fail(i, internal("`for` without bounds".into())));
                };
                let (elem, lb, ub, step) =
                    (lb.elem, ok!(scalar_int(lb)), ok!(scalar_int(ub)), ok!(scalar_int(step)));
                if step <= 0 {
                    return Err(
                        self.fail(i, format!("the step of a `for` loop must be positive, found {step}"))
                    );
                }
                let hi = elem.dtype().int_range().map_or(i64::MAX, |r| r.1);
                let carried: Vec<Tile> = args[3..].to_vec();
                if lb >= ub {
                    return self.complete(i, carried, stack);
                }
                let mut vals = Vec::with_capacity(carried.len() + 1);
                vals.push(Tile::int_scalar(elem, lb));
                vals.extend(carried);
                self.push(i, 0, vals, Then::For { inst: i, elem, iv: lb, ub, step, hi }, stack)
            }
            ControlOp::If => {
                let Some(cond) = args.first() else {
                    return Err(self.fail(i, internal("`if` without condition".into())));
                };
                let k = if ok!(scalar_int(cond)) != 0 { 0 } else { 1 };
                self.push(i, k, Vec::new(), Then::If(i), stack)
            }
            ControlOp::While => self.push(i, 0, args, Then::Before(i), stack),
            ControlOp::Yield | ControlOp::Condition => {
                Err(self.fail(i, internal("terminator in the middle of a block".into())))
            }
        }
    }

    /// Continues after `frame`'s block ended with the terminator operands
    /// `vals`: the next iteration, the owner's results, or (for the
    /// outermost block) the run's result.
    fn block_ended(
        &mut self,
        frame: Frame,
        vals: Vec<Tile>,
        stack: &mut Stack,
    ) -> Result<Option<Vec<Tile>>, InterpError> {
        match frame.then {
            Then::Return => return Ok(Some(vals)),
            Then::For { inst, elem, iv, ub, step, hi } => {
                // An induction variable that would pass its type's range is past `ub`.
                match iv.checked_add(step) {
                    Some(n) if n <= hi && n < ub => {
                        let mut next = Vec::with_capacity(vals.len() + 1);
                        next.push(Tile::int_scalar(elem, n));
                        next.extend(vals);
                        self.bind_args(frame.block, next, inst)?;
                        stack.push(Frame {
                            block: frame.block,
                            pos: 0,
                            then: Then::For { inst, elem, iv: n, ub, step, hi },
                        });
                    }
                    _ => self.complete(inst, vals, stack)?,
                }
            }
            Then::If(inst) => self.complete(inst, vals, stack)?,
            Then::Before(inst) => {
                let mut out = vals.into_iter();
                let Some(cond) = out.next() else {
                    return Err(self.fail(inst, internal("`condition` without operands".into())));
                };
                let forwarded: Vec<Tile> = out.collect();
                match scalar_int(&cond) {
                    Ok(0) => self.complete(inst, forwarded, stack)?,
                    Ok(_) => self.push(inst, 1, forwarded, Then::After(inst), stack)?,
                    Err(m) => return Err(self.fail(inst, m)),
                }
            }
            Then::After(inst) => self.push(inst, 0, vals, Then::Before(inst), stack)?,
        }
        Ok(None)
    }

    /// Checks `wait_until` instruction `i`: `None` when it holds (after its
    /// acquire), else what it read.
    fn wait(&mut self, i: Inst, cmp: CmpPred, order: MemOrder) -> Result<Option<Blocked>, InterpError> {
        let d = &self.f.insts[i];
        let (ptr, want) = (self.get(d.args[0], i)?, self.get(d.args[1], i)?);
        let addr =
            ptr.ints().and_then(|p| p.first().copied().ok_or_else(|| internal("empty pointer".into())));
        let addr = addr.map_err(|m| self.fail(i, m))?;
        let want = scalar_int(&want).map_err(|m| self.fail(i, m))?;
        let acc = Access { shape: &[], dtype: ptr.dtype() };
        let seen = self.world.mem.load(&acc, &[addr], None, None).map_err(|m| self.fail(i, m))?;
        let seen = match seen {
            Data::Int(v) => v.first().copied().unwrap_or(0),
            _ => return Err(self.fail(i, internal("`wait_until` on a float".into()))),
        };
        if !cmp.holds(Some(seen.cmp(&want))) {
            return Ok(Some(Blocked { inst: i, addr, cmp, want, seen }));
        }
        self.world.mem.acquire(order, &[addr], None);
        Ok(None)
    }

    /// Reads `wait_load` instruction `i`'s lines: `Ok` with them when every
    /// active lane's flag (the high 32 bits) is the wanted one, else `Err`
    /// with the first lane that is not (its address, the flag wanted and the
    /// flag it holds). The reads are relaxed strong accesses: they order
    /// nothing, and racing with the producer's strong stores is their use.
    fn wait_load(&mut self, i: Inst, scope: MemScope) -> Result<Result<Tile, Blocked>, InterpError> {
        let d = &self.f.insts[i];
        let ptr = self.get(d.args[0], i)?;
        let want = self.get(d.args[1], i)?;
        let mask = match d.args.get(2) {
            Some(&m) => Some(self.get(m, i)?),
            None => None,
        };
        let run = |this: &mut Self| -> Result<Result<Tile, Blocked>, String> {
            let want = scalar_int(&want)? as u32;
            let ptrs = ptr.ints()?;
            let mask = mask.as_ref().map(|m| m.ints()).transpose()?;
            let acc = Access { shape: &ptr.shape, dtype: ptr.dtype() };
            let data = this.world.mem.load(&acc, ptrs, mask, None)?;
            let Data::Int(lines) = &data else { return Err(internal("`wait_load` of a float".into())) };
            for (lane, (&line, &addr)) in lines.iter().zip(ptrs).enumerate() {
                let on = mask.is_none_or(|m| m.get(lane).or(m.first()).is_some_and(|&x| x != 0));
                let flag = (line as u64 >> 32) as u32;
                if on && flag != want {
                    let (want, seen) = (i64::from(want), i64::from(flag));
                    return Ok(Err(Blocked { inst: i, addr, cmp: CmpPred::Eq, want, seen }));
                }
            }
            this.world.mem.acquire(MemOrder { sem: MemSem::Relaxed, scope }, ptrs, mask);
            Ok(Ok(Tile::new(Elem::Scalar(ptr.dtype()), ptr.shape.clone(), data)))
        };
        run(self).map_err(|m| self.fail(i, m))
    }

    /// Runs one instruction.
    fn inst(&mut self, i: Inst) -> Result<Outs, InterpError> {
        let f = self.f;
        let d = &f.insts[i];
        let owned = |this: &Self| -> Result<Vec<Tile>, InterpError> {
            d.args.iter().map(|&a| this.get(a, i)).collect()
        };
        match &d.op {
            // Control flow and waits are run by `run`, which keeps the stack.
            Op::Control(_) | Op::Memory(MemoryOp::WaitUntil { .. } | MemoryOp::WaitLoad { .. }) => {
                Err(self.fail(i, internal("control flow or a wait outside `run`".into())))
            }
            // Ops with regions run other instructions, so they take their operands by value.
            Op::Reduce(r) if r.kind == ReduceKind::Custom => {
                let args = owned(self)?;
                self.custom(i, r.axis, None, &args)
            }
            Op::Scan(s) if s.kind == ScanKind::Custom => {
                let args = owned(self)?;
                self.custom(i, s.axis, Some(s.reverse), &args)
            }
            _ => {
                // Everything else borrows its operands in place.
                let mut refs: SmallVec<[&Tile; 4]> = SmallVec::new();
                for &a in &d.args {
                    match self.env.get(a.index()) {
                        Some(Some(t)) => refs.push(t),
                        _ => return Err(self.fail(i, internal(format!("{a} is used but has no value")))),
                    }
                }
                let res = self.world.simple(f, i, &refs);
                drop(refs);
                res.map_err(|m| self.fail(i, m))
            }
        }
    }
}

impl World<'_, '_> {
    /// Runs an instruction without regions.
    fn simple(&mut self, f: &Function, i: Inst, args: &[&Tile]) -> Result<Outs, String> {
        let d = &f.insts[i];
        let arg = |k: usize| args.get(k).copied().ok_or_else(|| internal(format!("missing operand {k}")));
        let one = |t: Tile| -> Outs { smallvec![t] };
        Ok(match &d.op {
            Op::Creation(c) => one(match c {
                CreationOp::Const(s) => fill(*s, &[]),
                CreationOp::Full { value, shape } => fill(*value, shape),
                CreationOp::Splat { shape } => {
                    let x = arg(0)?;
                    let n = shape.iter().product();
                    let data = map_data!(&*x.data, v => vec![v.first().copied().unwrap_or_default(); n]);
                    Tile::new(x.elem, shape.clone(), data)
                }
                CreationOp::Arange { start, end } => {
                    let v: Vec<i64> = (i64::from(*start)..i64::from(*end)).collect();
                    let n = v.len();
                    Tile::new(Elem::Scalar(crate::DType::I32), Shape::from_slice(&[n]), Data::Int(v))
                }
            }),
            Op::Arith(a) => one(match a {
                ArithOp::Binary(op) => arith::binary(*op, arg(0)?, arg(1)?)?,
                ArithOp::Unary(op) => arith::unary(*op, arg(0)?)?,
                ArithOp::Fma => arith::fma(arg(0)?, arg(1)?, arg(2)?)?,
                ArithOp::Dp4a => arith::dp4a(arg(0)?, arg(1)?, arg(2)?)?,
                ArithOp::AddPtr => arith::addptr(arg(0)?, arg(1)?)?,
            }),
            Op::Compare(c) => one(match c {
                CompareOp::Cmp(p) => arith::cmp(*p, arg(0)?, arg(1)?)?,
                CompareOp::Select => arith::select(arg(0)?, arg(1)?, arg(2)?)?,
            }),
            Op::Cast(c) => one(match c {
                CastOp::Cast { to } => cast::cast(arg(0)?, *to)?,
                CastOp::Bitcast { to } => cast::bitcast(arg(0)?, *to)?,
                CastOp::PtrCast { to } => {
                    let x = arg(0)?;
                    x.view(Elem::Ptr(*to), x.shape.clone())
                }
            }),
            Op::Memory(m) => self.memory(m, args)?,
            Op::Reduce(r) => one(reduce::reduce(arg(0)?, r.axis, r.kind)?),
            Op::Scan(s) => one(reduce::scan(arg(0)?, s.axis, s.kind, s.reverse)?),
            Op::Shape(s) => match s {
                ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. } => {
                    let to = &f.ty(d.results[0]).shape;
                    one(shape::reshape(arg(0)?, to)?)
                }
                ShapeOp::Broadcast { shape: to } => one(shape::broadcast(arg(0)?, to)?),
                ShapeOp::Permute { order } => one(shape::permute(arg(0)?, order)?),
                ShapeOp::Join => one(shape::join(arg(0)?, arg(1)?)?),
                ShapeOp::Split => {
                    let (a, b) = shape::split(arg(0)?)?;
                    smallvec![a, b]
                }
            },
            Op::Dot(o) => one(dot::dot(arg(0)?, arg(1)?, arg(2)?, o.precision)?),
            // Programs run one after another and launches in order: nothing
            // overlaps, so the dependency-control ops have nothing to do.
            // A program's operations run in order here: the barrier's
            // ordering holds already.
            Op::Program(ProgramOp::GdcWait | ProgramOp::GdcLaunchDependents | ProgramOp::Barrier) => {
                smallvec![]
            }
            Op::Program(ProgramOp::GlobalTimer) => {
                static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
                let ns = EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos();
                one(Tile::int_scalar(Elem::Scalar(crate::DType::I64), i64::try_from(ns).unwrap_or(i64::MAX)))
            }
            Op::Program(p) => {
                let axis = usize::from(p.axis().unwrap_or(0));
                let v = match p {
                    ProgramOp::NumPrograms { .. } => self.grid.get(axis),
                    _ => self.pid.get(axis),
                };
                let v = v.ok_or_else(|| internal(format!("grid axis {axis}")))?;
                one(Tile::int_scalar(Elem::Scalar(crate::DType::I32), i64::from(*v)))
            }
            Op::Hint(h) => {
                let x = arg(0)?;
                debug::check_hint(h, x)?;
                one(x.clone())
            }
            Op::Debug(DebugOp::Assert { message }) => {
                debug::check_assert(arg(0)?, message)?;
                Outs::new()
            }
            Op::Debug(DebugOp::Print { prefix }) => {
                let text = debug::format_print(prefix, self.pid, args);
                self.sink.write_all(text.as_bytes()).map_err(|e| format!("print failed: {e}"))?;
                Outs::new()
            }
            Op::Control(_) => return Err(internal("control flow in `simple`".into())),
        })
    }

    /// Runs a load, store or atomic.
    fn memory(&mut self, m: &MemoryOp, args: &[&Tile]) -> Result<Outs, String> {
        let arg = |k: usize| args.get(k).copied().ok_or_else(|| internal(format!("missing operand {k}")));
        let ptr = arg(0)?;
        let acc = Access { shape: &ptr.shape, dtype: ptr.dtype() };
        match *m {
            MemoryOp::LoadBlock { rows: br, cols: bc, .. } => {
                let mut s = [0i64; 6];
                for (k, v) in s.iter_mut().enumerate() {
                    *v = scalar_int(arg(k)?)?;
                }
                let [ptr, rows, cols, row_stride, row0, col0] = s;
                let b = BlockBox { ptr, rows, cols, row_stride, row0, col0 };
                let block = [br as usize, bc as usize];
                let data = self.mem.load_block(acc.dtype, &b, block)?;
                Ok(smallvec![Tile::new(Elem::Scalar(acc.dtype), Shape::from_slice(&block), data)])
            }
            MemoryOp::Load { order, .. } => {
                let ops = m.load_operands(args).ok_or_else(|| internal("load without a pointer".into()))?;
                let mask = ops.mask.map(|t| t.ints()).transpose()?;
                let other = ops.other.map(|t| &*t.data);
                let ptrs = ptr.ints()?;
                let data = self.mem.load(&acc, ptrs, mask, other)?;
                match order {
                    None => self.mem.check_reads(&acc, ptrs, mask)?,
                    Some(o) => self.mem.acquire(o, ptrs, mask),
                }
                Ok(smallvec![Tile::new(Elem::Scalar(ptr.dtype()), ptr.shape.clone(), data)])
            }
            MemoryOp::Store { has_mask, order, .. } => {
                let mask = if has_mask { Some(arg(2)?.ints()?) } else { None };
                let ptrs = ptr.ints()?;
                self.mem.store(&acc, ptrs, &arg(1)?.data, mask, order.is_some())?;
                if let Some(o) = order {
                    self.mem.release(o, ptrs, mask, false);
                }
                Ok(Outs::new())
            }
            MemoryOp::Atomic { kind, has_mask, sem, scope } => {
                let mask = if has_mask { Some(arg(2)?) } else { None };
                let old = atomic::rmw(&mut self.mem, kind, ptr, arg(1)?, mask)?;
                self.sync_atomic(MemOrder { sem, scope }, ptr, mask)?;
                Ok(smallvec![old])
            }
            MemoryOp::AtomicCas { sem, scope } => {
                let old = atomic::cas(&mut self.mem, ptr, arg(1)?, arg(2)?)?;
                self.sync_atomic(MemOrder { sem, scope }, ptr, None)?;
                Ok(smallvec![old])
            }
            // A prefetch changes no value; its addresses are checked like a
            // load's (an out-of-bounds prefetch is a bug in the kernel even
            // though the GPU ignores it).
            MemoryOp::PrefetchL2 { has_mask } => {
                let mask = if has_mask { Some(arg(1)?.ints()?) } else { None };
                self.mem.load(&acc, ptr.ints()?, mask, None)?;
                Ok(Outs::new())
            }
            MemoryOp::WaitUntil { .. } | MemoryOp::WaitLoad { .. } => {
                Err(internal(format!("`{}` outside `run`", m.name())))
            }
        }
    }

    /// The release, then acquire, side of an atomic on `ptr` (see `model.rs`).
    fn sync_atomic(&mut self, o: MemOrder, ptr: &Tile, mask: Option<&Tile>) -> Result<(), String> {
        if !self.mem.checks_order() {
            return Ok(());
        }
        let mask = mask.map(|m| m.ints()).transpose()?;
        self.mem.release(o, ptr.ints()?, mask, true);
        self.mem.acquire(o, ptr.ints()?, mask);
        Ok(())
    }
}

impl Exec<'_, '_> {
    /// A custom reduction (`reverse == None`) or scan along `axis`.
    fn custom(
        &mut self,
        i: Inst,
        axis: usize,
        reverse: Option<bool>,
        args: &[Tile],
    ) -> Result<Outs, InterpError> {
        let f = self.f;
        let Some(&r) = f.insts[i].regions.first() else {
            return Err(self.fail(i, internal("custom combine without a region".into())));
        };
        let vector = self.plan.vector_combine.get(i.index()).copied().unwrap_or(false);
        // Errors inside the region are already located; keep them aside so the
        // combine callback can report through the kernels' string errors.
        let mut inner: Option<InterpError> = None;
        let mut combine = |l: &[Tile], rt: &[Tile]| -> Result<Vec<Tile>, String> {
            self.combine(r, vector, l, rt, i).map_err(|e| {
                let m = e.message.clone();
                inner = Some(e);
                m
            })
        };
        let res = match reverse {
            None => reduce::reduce_custom(args, axis, &mut combine),
            Some(rev) => reduce::scan_custom(args, axis, rev, &mut combine),
        };
        match res {
            Ok(v) => Ok(v.into()),
            Err(m) => Err(inner.take().unwrap_or_else(|| self.fail(i, m))),
        }
    }

    /// Runs the combine region `r` on (running, new) operand slices: once on
    /// the whole slices when `vector`, else once per lane with scalars.
    fn combine(
        &mut self,
        r: Region,
        vector: bool,
        lhs: &[Tile],
        rhs: &[Tile],
        i: Inst,
    ) -> Result<Vec<Tile>, InterpError> {
        if vector {
            let args: Vec<Tile> = lhs.iter().chain(rhs).cloned().collect();
            return self.run_region(r, args, i);
        }
        let n = lhs.first().map_or(0, Tile::len);
        let scalar = |t: &Tile, lane: usize| -> Tile {
            let data = map_data!(&*t.data, v => vec![v.get(lane).or(v.first()).copied().unwrap_or_default()]);
            Tile::new(t.elem, Shape::new(), data)
        };
        let mut per_result: Vec<Vec<Tile>> = Vec::new();
        for lane in 0..n {
            let args: Vec<Tile> = lhs.iter().chain(rhs).map(|t| scalar(t, lane)).collect();
            let out = self.run_region(r, args, i)?;
            if per_result.is_empty() {
                per_result = vec![Vec::with_capacity(n); out.len()];
            }
            for (acc, t) in per_result.iter_mut().zip(out) {
                acc.push(t);
            }
        }
        per_result.iter().map(|parts| concat(parts)).collect::<Result<_, _>>().map_err(|m| self.fail(i, m))
    }
}
