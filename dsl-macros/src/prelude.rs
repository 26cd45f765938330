//! The prelude table: how each kernel-language function is called from a
//! kernel body (positional and named arguments, and the conversion each
//! argument needs), so `load(p, mask = m, other = 0.0)` becomes a call of
//! `::dsl_core::lang::load` with the right Rust types.

/// How one argument is converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conv {
    /// Any tensor-or-literal, made a tensor with `__tensor`.
    Tensor,
    /// Passed through (`impl Into<Operand>`, dtypes, bools).
    Pass,
    /// A build-time integer as i32.
    I32,
    /// A build-time integer as u32.
    U32,
    /// A build-time integer as u8.
    U8,
    /// A shape or permutation: an array literal `[a, b]` of build-time integers.
    Shape,
    /// An optional tensor (`Some(__tensor(x))` or `None`).
    OptTensor,
    /// An optional operand (`Some(x.into())` or `None`).
    OptOperand,
    /// A string literal.
    Str,
    /// A load's `cache_modifier`: the string literal `".ca"`, `".cg"` or
    /// `".cs"` (Triton's spelling), as a `CacheModifier`.
    Cache,
    /// A load's `eviction_policy`: `"evict_first"`, `"evict_last"` or
    /// `"evict_normal"`, as an `EvictionPolicy`.
    Evict,
    /// A memory ordering's `sem`: `"relaxed"`, `"acquire"`, `"release"` or
    /// `"acq_rel"`, as `Some(MemSem)` (`None` when absent: a plain load or
    /// store, an `acq_rel` atomic, an acquiring wait).
    Sem,
    /// A memory ordering's `scope`: `"gpu"`, `"cta"` or `"sys"`, as a `MemScope`.
    Scope,
    /// A comparison: `"eq"`, `"ne"`, `"lt"`, `"le"`, `"gt"` or `"ge"`, as a `CmpPred`.
    Cmp,
    /// All remaining arguments, as a tensor slice.
    Rest,
}

/// Whether an argument must be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Req {
    /// Required.
    Yes,
    /// Optional; the conversion supplies the default (`None`), or the token text here.
    Default(&'static str),
}

/// One prelude function: its name, the `::dsl_core::lang` function it calls,
/// and its arguments in order.
pub struct Entry {
    /// Name in kernels.
    pub name: &'static str,
    /// Name of the builder function.
    pub target: &'static str,
    /// Arguments: name, conversion, requirement.
    pub args: &'static [(&'static str, Conv, Req)],
}

use Conv::*;
use Req::*;

const X: (&str, Conv, Req) = ("x", Tensor, Yes);
const SEM: (&str, Conv, Req) = ("sem", Sem, Default(""));
const SCOPE: (&str, Conv, Req) = ("scope", Scope, Default(""));
const MASK: (&str, Conv, Req) = ("mask", OptTensor, Default(""));
const AXIS0: (&str, Conv, Req) = ("axis", I32, Default("0"));

macro_rules! e {
    ($name:literal => $target:literal, [$($a:expr),*]) => {
        Entry { name: $name, target: $target, args: &[$($a),*] }
    };
}

/// Every prelude function callable from kernels.
pub const PRELUDE: &[Entry] = &[
    e!("program_id" => "program_id", [("axis", U8, Yes)]),
    e!("num_programs" => "num_programs", [("axis", U8, Yes)]),
    e!("globaltimer" => "globaltimer", []),
    e!("barrier" => "barrier", []),
    e!("arange" => "arange", [("start", I32, Yes), ("end", I32, Yes)]),
    e!("zeros" => "zeros", [("shape", Shape, Yes), ("dtype", Pass, Yes)]),
    e!("full" => "full", [("shape", Shape, Yes), ("value", Pass, Yes), ("dtype", Pass, Yes)]),
    e!("load" => "load_opts", [
        ("ptr", Tensor, Yes),
        MASK,
        ("other", OptOperand, Default("")),
        ("cache_modifier", Cache, Default("")),
        ("eviction_policy", Evict, Default("")),
        SEM,
        SCOPE
    ]),
    e!("load_block" => "load_block_hinted", [
        ("ptr", Tensor, Yes),
        ("rows", Pass, Yes),
        ("cols", Pass, Yes),
        ("row_stride", Pass, Yes),
        ("row0", Pass, Yes),
        ("col0", Pass, Yes),
        ("block", Shape, Yes),
        ("cache_modifier", Cache, Default("")),
        ("eviction_policy", Evict, Default(""))
    ]),
    e!("store" => "store_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_add" => "atomic_add_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_max" => "atomic_max_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_min" => "atomic_min_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_and" => "atomic_and_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_or" => "atomic_or_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_xor" => "atomic_xor_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_xchg" => "atomic_xchg_opts", [("ptr", Tensor, Yes), ("value", Pass, Yes), MASK, SEM, SCOPE]),
    e!("atomic_cas" => "atomic_cas_opts", [("ptr", Tensor, Yes), ("cmp", Pass, Yes), ("value", Pass, Yes), SEM, SCOPE]),
    e!("wait_until" => "wait_until_opts", [("ptr", Tensor, Yes), ("cmp", Cmp, Yes), ("value", Pass, Yes), SEM, SCOPE]),
    e!("wait_load" => "wait_load", [("ptr", Tensor, Yes), ("flag", Pass, Yes), MASK, SCOPE]),
    e!("prefetch_l2" => "prefetch_l2", [("ptr", Tensor, Yes), MASK]),
    e!("dot" => "dot", [("a", Tensor, Yes), ("b", Tensor, Yes), ("acc", OptTensor, Default(""))]),
    e!("sum" => "sum", [X, AXIS0]),
    e!("max" => "max", [X, AXIS0]),
    e!("min" => "min", [X, AXIS0]),
    e!("argmax" => "argmax", [X, AXIS0]),
    e!("argmin" => "argmin", [X, AXIS0]),
    e!("cumsum" => "cumsum", [X, AXIS0]),
    e!("cummax" => "cummax", [X, AXIS0]),
    e!("cummin" => "cummin", [X, AXIS0]),
    e!("expand_dims" => "expand_dims", [X, ("axis", I32, Yes)]),
    e!("broadcast_to" => "broadcast_to", [X, ("shape", Shape, Yes)]),
    e!("reshape" => "reshape", [X, ("shape", Shape, Yes)]),
    e!("permute" => "permute", [X, ("order", Shape, Yes)]),
    e!("trans" => "trans", [X]),
    e!("join" => "join", [("a", Tensor, Yes), ("b", Tensor, Yes)]),
    e!("split" => "split", [X]),
    e!("exp" => "exp", [X]),
    e!("exp2" => "exp2", [X]),
    e!("log" => "log", [X]),
    e!("log2" => "log2", [X]),
    e!("sqrt" => "sqrt", [X]),
    e!("rsqrt" => "rsqrt", [X]),
    e!("sin" => "sin", [X]),
    e!("cos" => "cos", [X]),
    e!("tanh" => "tanh", [X]),
    e!("sigmoid" => "sigmoid", [X]),
    e!("abs" => "abs", [X]),
    e!("floor" => "floor", [X]),
    e!("ceil" => "ceil", [X]),
    e!("erf" => "erf", [X]),
    e!("minimum" => "minimum", [("a", Pass, Yes), ("b", Pass, Yes)]),
    e!("maximum" => "maximum", [("a", Pass, Yes), ("b", Pass, Yes)]),
    e!("pow" => "pow", [("a", Pass, Yes), ("b", Pass, Yes)]),
    e!("umulhi" => "umulhi", [("a", Pass, Yes), ("b", Pass, Yes)]),
    e!("fma" => "fma", [("a", Pass, Yes), ("b", Pass, Yes), ("c", Pass, Yes)]),
    e!("dp4a" => "dp4a", [("a", Pass, Yes), ("b", Pass, Yes), ("c", Pass, Yes)]),
    e!("where_" => "where_", [("cond", Tensor, Yes), ("a", Pass, Yes), ("b", Pass, Yes)]),
    e!("select" => "where_", [("cond", Tensor, Yes), ("a", Pass, Yes), ("b", Pass, Yes)]),
    e!("cast" => "cast", [X, ("dtype", Pass, Yes)]),
    e!("bitcast" => "bitcast", [X, ("dtype", Pass, Yes)]),
    e!("ptrcast" => "ptrcast", [X, ("dtype", Pass, Yes)]),
    e!("multiple_of" => "multiple_of", [X, ("n", U32, Yes)]),
    e!("max_contiguous" => "max_contiguous", [X, ("n", U32, Yes)]),
    e!("max_constancy" => "max_constancy", [X, ("n", U32, Yes)]),
    e!("randint4x" => "randint4x", [("seed", Pass, Yes), ("offset", Tensor, Yes)]),
    e!("randint" => "randint", [("seed", Pass, Yes), ("offset", Tensor, Yes)]),
    e!("rand" => "rand", [("seed", Pass, Yes), ("offset", Tensor, Yes)]),
    e!("randn" => "randn", [("seed", Pass, Yes), ("offset", Tensor, Yes)]),
    e!("gdc_wait" => "gdc_wait", []),
    e!("gdc_launch_dependents" => "gdc_launch_dependents", []),
    e!("device_assert" => "device_assert", [("cond", Tensor, Yes), ("msg", Str, Yes)]),
    e!("device_print" => "device_print", [("prefix", Str, Yes), ("values", Rest, Yes)]),
    e!("static_assert" => "static_assert", [("cond", Pass, Yes), ("msg", Str, Yes)]),
];

/// Looks up a prelude entry.
pub fn lookup(name: &str) -> Option<&'static Entry> {
    PRELUDE.iter().find(|e| e.name == name)
}
