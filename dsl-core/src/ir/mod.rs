//! The tile IR: SSA values, ops with structured regions, functions.
//!
//! A `Function` owns arenas of values, instructions (op instances), blocks and
//! regions, all referenced by typed index newtypes. The body is a region with
//! one block whose arguments are the kernel parameters. Ops with regions
//! (`for`, `if`, `while`, custom `reduce`/`scan`) own single-block regions that
//! end in a terminator.
//!
//! Invariants (checked by `verify`): every value is defined once, before its
//! uses, in the same or an enclosing region; operand and result types satisfy
//! the op's inference rule; tile dimensions are powers of two.

pub mod constant;
pub mod entity;
pub mod ops;

pub use constant::Scalar;
pub use entity::{Block, EntityRef, EntityVec, Inst, Region, SecondaryMap, Value};
pub use ops::Op;

use crate::dtype::Type;
use crate::loc::Location;
use smallvec::SmallVec;

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// Result `index` of an instruction.
    Result(Inst, u32),
    /// Argument `index` of a block.
    BlockArg(Block, u32),
}

/// Data of one SSA value.
#[derive(Clone, Debug)]
pub struct ValueData {
    /// Its type.
    pub ty: Type,
    /// Its definition.
    pub def: ValueDef,
}

/// Data of one op instance.
#[derive(Clone, Debug)]
pub struct InstData {
    /// The op and its attributes.
    pub op: Op,
    /// Operands, in the op's documented order.
    pub args: SmallVec<[Value; 4]>,
    /// Results.
    pub results: SmallVec<[Value; 2]>,
    /// Owned regions.
    pub regions: SmallVec<[Region; 2]>,
    /// The kernel source location that created it.
    pub loc: Location,
    /// The block that contains it (`None` once detached).
    pub parent: Option<Block>,
}

/// Data of one block.
#[derive(Clone, Debug, Default)]
pub struct BlockData {
    /// Block arguments.
    pub args: Vec<Value>,
    /// Instructions in order; the last is a terminator in op regions.
    pub insts: Vec<Inst>,
    /// The region that contains it.
    pub parent: Option<Region>,
}

/// Data of one region.
#[derive(Clone, Debug, Default)]
pub struct RegionData {
    /// Blocks; exactly one today (room for unstructured control flow later).
    pub blocks: Vec<Block>,
    /// The instruction owning the region (`None` for the function body).
    pub parent: Option<Inst>,
}

/// Compile-time facts about a parameter that the launcher guarantees
/// (Triton's specialization: pointer alignment, integer divisibility).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ParamHints {
    /// The value (an integer, or a pointer's address in bytes) is a multiple of this.
    pub divisibility: Option<u32>,
}

/// One kernel parameter.
#[derive(Clone, Debug)]
pub struct Param {
    /// The author's name for it.
    pub name: String,
    /// Its value in the body (an argument of the entry block).
    pub value: Value,
    /// Facts for the axis analysis.
    pub hints: ParamHints,
}

/// A kernel in tile IR.
#[derive(Clone, Debug)]
pub struct Function {
    /// The kernel's name.
    pub name: String,
    /// Parameters in order.
    pub params: Vec<Param>,
    /// The body region (one block whose arguments are the parameters).
    pub body: Region,
    /// Where the kernel was defined.
    pub loc: Location,
    /// Value arena.
    pub values: EntityVec<Value, ValueData>,
    /// Instruction arena.
    pub insts: EntityVec<Inst, InstData>,
    /// Block arena.
    pub blocks: EntityVec<Block, BlockData>,
    /// Region arena.
    pub regions: EntityVec<Region, RegionData>,
}

impl Function {
    /// An empty function with a body region and entry block and no parameters.
    pub fn new(name: impl Into<String>, loc: Location) -> Function {
        let mut f = Function {
            name: name.into(),
            params: Vec::new(),
            body: Region(0),
            loc,
            values: EntityVec::new(),
            insts: EntityVec::new(),
            blocks: EntityVec::new(),
            regions: EntityVec::new(),
        };
        f.body = f.new_region(None);
        f
    }

    /// Creates a region (with one empty block) owned by `parent`.
    pub fn new_region(&mut self, parent: Option<Inst>) -> Region {
        let r = self.regions.push(RegionData { blocks: Vec::new(), parent });
        let b = self.blocks.push(BlockData { args: Vec::new(), insts: Vec::new(), parent: Some(r) });
        self.regions[r].blocks.push(b);
        r
    }

    /// The single block of a region.
    pub fn entry(&self, r: Region) -> Block {
        self.regions[r].blocks[0]
    }

    /// The body's block.
    pub fn body_block(&self) -> Block {
        self.entry(self.body)
    }

    /// True when the kernel calls `gdc_wait` (at its top level, where the
    /// verifier keeps it): a launch may then overlap the previous kernel of
    /// the stream (programmatic dependent launch, see
    /// [`ops::program`](crate::ir::ops::program)).
    pub fn waits_on_grid(&self) -> bool {
        self.blocks[self.body_block()]
            .insts
            .iter()
            .any(|&i| self.insts[i].op == Op::Program(ops::ProgramOp::GdcWait))
    }

    /// True when the kernel calls `wait_until` or `wait_load`: its programs wait for each
    /// other, so on the GPU every program of a launch must be resident at
    /// once (the grid at most the programs that fit the device), or a wait
    /// may never end. The interpreter runs such kernels' programs
    /// interleaved (see [`crate::interp`]).
    pub fn waits_on_programs(&self) -> bool {
        let mut any = false;
        self.walk(|i| {
            any |= matches!(
                self.insts[i].op,
                Op::Memory(ops::MemoryOp::WaitUntil { .. } | ops::MemoryOp::WaitLoad { .. })
            )
        });
        any
    }

    /// True when the kernel synchronises its programs through `wait_until`,
    /// `wait_load` or ordered loads and stores (the interpreter then checks that every
    /// plain read of another program's write is ordered after it).
    pub fn synchronizes_programs(&self) -> bool {
        let mut any = false;
        self.walk(|i| {
            any |= matches!(
                self.insts[i].op,
                Op::Memory(
                    ops::MemoryOp::WaitUntil { .. }
                        | ops::MemoryOp::WaitLoad { .. }
                        | ops::MemoryOp::Load { order: Some(_), .. }
                        | ops::MemoryOp::Store { order: Some(_), .. }
                )
            )
        });
        any
    }

    /// Appends an argument of type `ty` to block `b`.
    pub fn add_block_arg(&mut self, b: Block, ty: Type) -> Value {
        let idx = self.blocks[b].args.len() as u32;
        let v = self.values.push(ValueData { ty, def: ValueDef::BlockArg(b, idx) });
        self.blocks[b].args.push(v);
        v
    }

    /// Adds a kernel parameter.
    pub fn add_param(&mut self, name: impl Into<String>, ty: Type, hints: ParamHints) -> Value {
        let b = self.body_block();
        let v = self.add_block_arg(b, ty);
        self.params.push(Param { name: name.into(), value: v, hints });
        v
    }

    /// Creates an instruction with results of `result_types`, not yet placed in a block.
    pub fn create_inst(&mut self, op: Op, args: &[Value], result_types: Vec<Type>, loc: Location) -> Inst {
        let inst = self.insts.push(InstData {
            op,
            args: SmallVec::from_slice(args),
            results: SmallVec::new(),
            regions: SmallVec::new(),
            loc,
            parent: None,
        });
        for (i, ty) in result_types.into_iter().enumerate() {
            let v = self.values.push(ValueData { ty, def: ValueDef::Result(inst, i as u32) });
            self.insts[inst].results.push(v);
        }
        inst
    }

    /// Adds one more result of type `ty` to an instruction (for ops such as `if`
    /// whose result types are known only after their regions are built).
    pub fn add_inst_result(&mut self, inst: Inst, ty: Type) -> Value {
        let idx = self.insts[inst].results.len() as u32;
        let v = self.values.push(ValueData { ty, def: ValueDef::Result(inst, idx) });
        self.insts[inst].results.push(v);
        v
    }

    /// Appends a detached instruction to block `b`.
    pub fn append_inst(&mut self, b: Block, inst: Inst) {
        self.insts[inst].parent = Some(b);
        self.blocks[b].insts.push(inst);
    }

    /// The type of a value.
    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v].ty
    }

    /// The single result of an instruction.
    pub fn result(&self, inst: Inst) -> Value {
        self.insts[inst].results[0]
    }

    /// The instruction defining `v`, if it is an op result.
    pub fn def_inst(&self, v: Value) -> Option<Inst> {
        match self.values[v].def {
            ValueDef::Result(i, _) => Some(i),
            ValueDef::BlockArg(..) => None,
        }
    }

    /// The constant `v` is, when it is defined by `const` or `full`.
    pub fn as_constant(&self, v: Value) -> Option<Scalar> {
        let i = self.def_inst(v)?;
        match &self.insts[i].op {
            Op::Creation(ops::CreationOp::Const(s)) => Some(*s),
            Op::Creation(ops::CreationOp::Full { value, .. }) => Some(*value),
            _ => None,
        }
    }

    /// Calls `f` on every instruction reachable from the body, in program order,
    /// entering regions before the instructions that follow their owner.
    pub fn walk(&self, mut f: impl FnMut(Inst)) {
        fn go(func: &Function, r: Region, f: &mut dyn FnMut(Inst)) {
            for &b in &func.regions[r].blocks {
                for &i in &func.blocks[b].insts {
                    f(i);
                    for &sub in &func.insts[i].regions {
                        go(func, sub, f);
                    }
                }
            }
        }
        go(self, self.body, &mut f);
    }

    /// The users of every value: the reachable instructions that take it as
    /// an operand, in [`Function::walk`] order, once per operand slot.
    pub fn users(&self) -> rustc_hash::FxHashMap<Value, Vec<Inst>> {
        let mut users: rustc_hash::FxHashMap<Value, Vec<Inst>> = rustc_hash::FxHashMap::default();
        self.walk(|i| {
            for &a in &self.insts[i].args {
                users.entry(a).or_default().push(i);
            }
        });
        users
    }

    /// Replaces every use of `from` with `to` in all reachable instructions.
    pub fn replace_all_uses(&mut self, from: Value, to: Value) {
        let mut all = Vec::new();
        self.walk(|i| all.push(i));
        for i in all {
            for a in self.insts[i].args.iter_mut() {
                if *a == from {
                    *a = to;
                }
            }
        }
    }

    /// Counts the number of reachable instructions.
    pub fn num_live_insts(&self) -> usize {
        let mut n = 0;
        self.walk(|_| n += 1);
        n
    }
}
