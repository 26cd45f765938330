//! The op set of the tile IR, grouped by family (one file each). The codegen
//! crate mirrors this split with one lowering file per family.
//!
//! Every family provides, for its ops: the mnemonic, the attributes (for the
//! printer and parser), result-type inference from operand types (shared by
//! the builder, which reports errors to the kernel author, and the verifier,
//! which re-checks finished IR), and whether the op has side effects.
//!
//! Invariants: elementwise ops take operands of identical shape (the builder
//! inserts `splat`/`broadcast` first, as Triton's front end does); operand
//! positions are fixed per op and documented on the variant.

/// Implements `name` (the spelling in the IR text) and `from_name` (its
/// inverse) for a fieldless enum from one list of `Variant = "spelling"`.
macro_rules! spellings {
    ($ty:ident: $($variant:ident = $spelling:literal),+ $(,)?) => {
        impl $ty {
            /// The spelling in the IR text.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $spelling,)+
                }
            }

            /// The variant spelled `s`, if any.
            pub fn from_name(s: &str) -> Option<$ty> {
                match s {
                    $($spelling => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

/// Implements `name` (the mnemonic) for an op enum from one list of
/// `Variant = "mnemonic"`, whatever fields the variants carry; after a `;`,
/// whole match arms for variants whose mnemonic is another enum's spelling.
macro_rules! mnemonics {
    ($ty:ident: $($variant:ident = $name:literal),+ $(; $($pat:pat => $spelled:expr),+)? $(,)?) => {
        impl $ty {
            /// The mnemonic.
            pub fn name(&self) -> &'static str {
                match self {
                    $($ty::$variant { .. } => $name,)+
                    $($($pat => $spelled,)+)?
                }
            }
        }
    };
}

pub mod arith;
pub mod cast;
pub mod compare;
pub mod control;
pub mod creation;
pub mod debug;
pub mod dot;
pub mod hint;
pub mod memory;
pub mod program;
pub mod reduce;
pub mod shape;

pub use arith::{ArithOp, BinaryOp, UnaryOp};
pub use cast::CastOp;
pub use compare::{CmpPred, CompareOp};
pub use control::ControlOp;
pub use creation::CreationOp;
pub use debug::DebugOp;
pub use dot::{DotOp, DotPrecision};
pub use hint::HintOp;
pub use memory::{
    AtomicKind, CacheModifier, EvictionPolicy, LoadOperands, MemOrder, MemScope, MemSem, MemoryOp,
};
pub use program::ProgramOp;
pub use reduce::{ReduceKind, ReduceOp, ScanKind, ScanOp};
pub use shape::ShapeOp;

use crate::dtype::{DType, Type, fmt_shape};
use crate::ir::constant::Scalar;

/// An op: a family and the op within it, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Constants, `full`, `splat`, `arange`.
    Creation(CreationOp),
    /// Elementwise arithmetic, math and pointer offsets.
    Arith(ArithOp),
    /// Comparisons and `select`.
    Compare(CompareOp),
    /// Numeric casts, bitcasts and pointer casts.
    Cast(CastOp),
    /// Loads, stores and atomics.
    Memory(MemoryOp),
    /// Reductions and scans.
    Reduce(ReduceOp),
    /// Scans (prefix sums and friends).
    Scan(ScanOp),
    /// Shape manipulation.
    Shape(ShapeOp),
    /// Matrix product with accumulator.
    Dot(DotOp),
    /// Structured control flow and terminators.
    Control(ControlOp),
    /// Program ids and grid size.
    Program(ProgramOp),
    /// Value annotations for the axis analysis.
    Hint(HintOp),
    /// Device assert and print.
    Debug(DebugOp),
}

/// An attribute value, as the printer writes and the parser reads it.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A list of integers, written `[a, b]`.
    Ints(Vec<i64>),
    /// A bare word such as `lt` or `sum`.
    Word(String),
    /// A quoted string.
    Str(String),
    /// A constant whose dtype is the op's result dtype.
    Const(Scalar),
    /// A flag: present means true.
    Flag,
}

/// Attributes by name, in print order.
pub type Attrs = Vec<(&'static str, Attr)>;

/// Looks up an attribute by name.
pub fn attr<'a>(attrs: &'a [(String, Attr)], name: &str) -> Option<&'a Attr> {
    attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// An integer attribute, or an error naming it.
pub fn attr_int(attrs: &[(String, Attr)], name: &str) -> Result<i64, String> {
    match attr(attrs, name) {
        Some(Attr::Int(v)) => Ok(*v),
        Some(other) => Err(format!("attribute `{name}` must be an integer, found {other:?}")),
        None => Err(format!("missing attribute `{name}`")),
    }
}

/// An integer-list attribute, or an error naming it.
pub fn attr_ints(attrs: &[(String, Attr)], name: &str) -> Result<Vec<i64>, String> {
    match attr(attrs, name) {
        Some(Attr::Ints(v)) => Ok(v.clone()),
        Some(other) => Err(format!("attribute `{name}` must be a list, found {other:?}")),
        None => Err(format!("missing attribute `{name}`")),
    }
}

/// A word attribute, or an error naming it.
pub fn attr_word<'a>(attrs: &'a [(String, Attr)], name: &str) -> Result<&'a str, String> {
    match attr(attrs, name) {
        Some(Attr::Word(v)) => Ok(v),
        Some(other) => Err(format!("attribute `{name}` must be a word, found {other:?}")),
        None => Err(format!("missing attribute `{name}`")),
    }
}

/// A string attribute, or an error naming it.
pub fn attr_str(attrs: &[(String, Attr)], name: &str) -> Result<String, String> {
    match attr(attrs, name) {
        Some(Attr::Str(v)) => Ok(v.clone()),
        Some(other) => Err(format!("attribute `{name}` must be a string, found {other:?}")),
        None => Err(format!("missing attribute `{name}`")),
    }
}

/// True when the flag attribute is present.
pub fn attr_flag(attrs: &[(String, Attr)], name: &str) -> bool {
    attr(attrs, name).is_some()
}

/// Converts an attribute integer into a shape dimension or axis.
pub fn to_usize(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} must be non-negative, found {v}"))
}

impl Op {
    /// The mnemonic printed for this op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Creation(o) => o.name(),
            Op::Arith(o) => o.name(),
            Op::Compare(o) => o.name(),
            Op::Cast(o) => o.name(),
            Op::Memory(o) => o.name(),
            Op::Reduce(o) => o.name(),
            Op::Scan(o) => o.name(),
            Op::Shape(o) => o.name(),
            Op::Dot(o) => o.name(),
            Op::Control(o) => o.name(),
            Op::Program(o) => o.name(),
            Op::Hint(o) => o.name(),
            Op::Debug(o) => o.name(),
        }
    }

    /// The attributes printed for this op.
    pub fn attrs(&self) -> Attrs {
        match self {
            Op::Creation(o) => o.attrs(),
            Op::Arith(_) => Vec::new(),
            Op::Compare(o) => o.attrs(),
            Op::Cast(_) => Vec::new(),
            Op::Memory(o) => o.attrs(),
            Op::Reduce(o) => o.attrs(),
            Op::Scan(o) => o.attrs(),
            Op::Shape(o) => o.attrs(),
            Op::Dot(o) => o.attrs(),
            Op::Control(_) => Vec::new(),
            Op::Program(o) => o.attrs(),
            Op::Hint(o) => o.attrs(),
            Op::Debug(o) => o.attrs(),
        }
    }

    /// Rebuilds an op from its mnemonic, attributes and result types (the parser's
    /// entry point). Returns `Ok(None)` for an unknown mnemonic.
    pub fn from_parts(name: &str, attrs: &[(String, Attr)], results: &[Type]) -> Result<Option<Op>, String> {
        type Parse = fn(&str, &[(String, Attr)], &[Type]) -> Result<Option<Op>, String>;
        // Each family's parser in turn; the first that knows `name` builds the op.
        const FAMILIES: [Parse; 13] = [
            |n, a, r| Ok(CreationOp::parse(n, a, r)?.map(Op::Creation)),
            |n, _, _| Ok(ArithOp::parse(n).map(Op::Arith)),
            |n, a, _| Ok(CompareOp::parse(n, a)?.map(Op::Compare)),
            |n, _, r| Ok(CastOp::parse(n, r)?.map(Op::Cast)),
            |n, a, _| Ok(MemoryOp::parse(n, a)?.map(Op::Memory)),
            |n, a, _| Ok(ReduceOp::parse(n, a)?.map(Op::Reduce)),
            |n, a, _| Ok(ScanOp::parse(n, a)?.map(Op::Scan)),
            |n, a, _| Ok(ShapeOp::parse(n, a)?.map(Op::Shape)),
            |n, a, _| Ok(DotOp::parse(n, a)?.map(Op::Dot)),
            |n, _, _| Ok(ControlOp::parse(n).map(Op::Control)),
            |n, a, _| Ok(ProgramOp::parse(n, a)?.map(Op::Program)),
            |n, a, _| Ok(HintOp::parse(n, a)?.map(Op::Hint)),
            |n, a, _| Ok(DebugOp::parse(n, a)?.map(Op::Debug)),
        ];
        for parse in FAMILIES {
            if let Some(op) = parse(name, attrs, results)? {
                return Ok(Some(op));
            }
        }
        Ok(None)
    }

    /// Infers result types from operand types. Control-flow ops whose results are
    /// fixed by their regions (`if`, `while`) and ops with regions are checked by the
    /// verifier instead; for them this returns the types it can derive.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        match self {
            Op::Creation(o) => o.infer(args),
            Op::Arith(o) => o.infer(args),
            Op::Compare(o) => o.infer(args),
            Op::Cast(o) => o.infer(args),
            Op::Memory(o) => o.infer(args),
            Op::Reduce(o) => o.infer(args),
            Op::Scan(o) => o.infer(args),
            Op::Shape(o) => o.infer(args),
            Op::Dot(o) => o.infer(args),
            Op::Control(o) => o.infer(args),
            Op::Program(o) => o.infer(args),
            Op::Hint(o) => o.infer(args),
            Op::Debug(o) => o.infer(args),
        }
    }

    /// True when the op writes memory, asserts, prints or orders the kernel
    /// against its stream neighbours (`gdc_wait`): such ops are never
    /// removed or merged, and neither is control flow that contains them.
    pub fn has_side_effects(&self) -> bool {
        match self {
            Op::Memory(o) => o.has_side_effects(),
            Op::Program(o) => o.has_side_effects(),
            Op::Debug(_) => true,
            _ => false,
        }
    }

    /// True when two instances with equal operands always produce equal results,
    /// so CSE may merge them (no memory reads, no side effects, no regions).
    pub fn is_pure(&self) -> bool {
        !matches!(self, Op::Memory(_) | Op::Debug(_) | Op::Control(_))
            && !self.has_side_effects()
            && !matches!(self, Op::Reduce(r) if r.kind == ReduceKind::Custom)
            && !matches!(self, Op::Scan(s) if s.kind == ScanKind::Custom)
    }

    /// True for block terminators (`yield`, `condition`).
    pub fn is_terminator(&self) -> bool {
        matches!(self, Op::Control(ControlOp::Yield | ControlOp::Condition))
    }

    /// Number of regions this op owns.
    pub fn num_regions(&self) -> usize {
        match self {
            Op::Control(ControlOp::For) => 1,
            Op::Control(ControlOp::If | ControlOp::While) => 2,
            Op::Reduce(r) if r.kind == ReduceKind::Custom => 1,
            Op::Scan(s) if s.kind == ScanKind::Custom => 1,
            _ => 0,
        }
    }
}

/// Checks the operand count.
pub(crate) fn expect_args(name: &str, args: &[Type], n: usize) -> Result<(), String> {
    if args.len() != n {
        return Err(format!("`{name}` takes {n} operand(s), found {}", args.len()));
    }
    Ok(())
}

/// Checks that all operands have the shape of the first.
pub(crate) fn same_shapes(name: &str, args: &[Type]) -> Result<(), String> {
    if let Some(first) = args.first() {
        for (i, a) in args.iter().enumerate().skip(1) {
            if a.shape != first.shape {
                return Err(format!(
                    "`{name}` operands must have the same shape: operand 0 is {} but operand {i} is {}",
                    fmt_shape(&first.shape),
                    fmt_shape(&a.shape)
                ));
            }
        }
    }
    Ok(())
}

/// Checks that operand `i` is a number (not a pointer) satisfying `pred`.
pub(crate) fn expect_num(
    name: &str,
    t: &Type,
    what: &str,
    pred: impl Fn(DType) -> bool,
) -> Result<DType, String> {
    match t.elem {
        crate::dtype::Elem::Scalar(d) if d.is_f8() => Err(f8_arith(name, t)),
        crate::dtype::Elem::Scalar(d) if pred(d) => Ok(d),
        _ => Err(format!("`{name}` needs {what}, found {t}")),
    }
}

/// The error of an operation that computes on 8-bit floats, which are
/// storage and `dot` operand types only.
pub(crate) fn f8_arith(name: &str, t: &Type) -> String {
    format!("`{name}` does not compute on 8-bit floats (storage types): cast {t} to f32 first")
}
