//! The builder: what `#[kernel]` expands into, and how tests build IR by hand.
//!
//! A kernel is built inside [`KernelBuilder::build`], which installs a
//! thread-local build context. Inside it, values are [`Tensor`] handles (copyable
//! typed handles to SSA values) and the free functions of [`crate::lang`] plus
//! Rust's operators append ops at the current insertion point. Every op records
//! the `#[track_caller]` location of the expression that created it.
//!
//! Type and shape errors do not stop the build: each is recorded as a
//! [`Diagnostic`] with its location and a placeholder value of a plausible type
//! is returned, so one build reports every error at once.
//!
//! Invariants: handles are only valid inside the build that made them (checked);
//! the context is never borrowed while user code (region closures) runs.

pub(crate) mod padding;
mod promote;

pub use promote::{Operand, broadcast_shapes, computation_type};

use crate::dtype::{DType, Type, fmt_shape};
use crate::error::{Diagnostic, Error, Result};
use crate::ir::ops::{ControlOp, CreationOp};
use crate::ir::{Block, Function, Op, ParamHints, Scalar, Value};
use crate::loc::Location;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// A handle to an SSA value of the kernel being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tensor {
    value: Value,
    build: u32,
}

impl Tensor {
    /// The IR value.
    pub fn value(self) -> Value {
        self.value
    }

    /// The value's type.
    pub fn ty(self) -> Type {
        with_ctx(|c| {
            c.check(self);
            c.func.ty(self.value).clone()
        })
    }

    /// The tile shape (empty for scalars).
    pub fn shape(self) -> Vec<usize> {
        self.ty().shape.to_vec()
    }

    /// The element dtype (the pointee for pointers).
    pub fn dtype(self) -> DType {
        self.ty().dtype()
    }

    /// The constant value, when the handle was made from a constant.
    pub fn constant(self) -> Option<Scalar> {
        with_ctx(|c| c.func.as_constant(self.value))
    }
}

/// Per-build state, kept in a thread-local stack.
pub(crate) struct Ctx {
    pub(crate) id: u32,
    pub(crate) func: Function,
    pub(crate) diags: Vec<Diagnostic>,
    /// Insertion blocks; the last is current.
    pub(crate) insert: Vec<Block>,
    /// Logical extents of values padded to powers of two (see `padding`).
    pub(crate) logical: rustc_hash::FxHashMap<Value, padding::Extents>,
}

thread_local! {
    static CTX: RefCell<Vec<Ctx>> = const { RefCell::new(Vec::new()) };
}

static NEXT_BUILD: AtomicU32 = AtomicU32::new(1);

/// Runs `f` on the current build context.
///
/// # Panics
/// When called outside [`KernelBuilder::build`]: using the kernel language outside
/// a kernel body is a programming error of the caller, like using a closed file.
pub(crate) fn with_ctx<R>(f: impl FnOnce(&mut Ctx) -> R) -> R {
    CTX.with(|stack| {
        let mut stack = stack.borrow_mut();
        let ctx = stack
            .last_mut()
            .expect("kernel-language op used outside KernelBuilder::build (no kernel is being built)");
        f(ctx)
    })
}

impl Ctx {
    /// Checks that a handle belongs to this build.
    pub(crate) fn check(&self, t: Tensor) {
        assert_eq!(t.build, self.id, "a Tensor handle from another kernel build was used");
    }

    /// The values of `ts`, each checked to come from this build.
    pub(crate) fn values(&self, ts: &[Tensor]) -> Vec<Value> {
        ts.iter()
            .map(|t| {
                self.check(*t);
                t.value()
            })
            .collect()
    }

    pub(crate) fn handle(&self, v: Value) -> Tensor {
        Tensor { value: v, build: self.id }
    }

    pub(crate) fn cur_block(&self) -> Block {
        *self.insert.last().expect("insertion stack is never empty during a build")
    }

    /// Reports at `loc` (op `op`) that the types `got` differ from `want`
    /// (a region's results against what the op needs): the message is
    /// `message(want, got)` with both lists formatted.
    pub(crate) fn check_types(
        &mut self,
        loc: &Location,
        op: &'static str,
        want: &[Type],
        got: &[Type],
        message: impl FnOnce(String, String) -> String,
    ) {
        if want != got {
            self.error(loc, Some(op), message(fmt_types(want), fmt_types(got)));
        }
    }

    /// Records a user error.
    pub(crate) fn error(&mut self, loc: &Location, op: Option<&'static str>, message: String) {
        self.diags.push(Diagnostic { loc: loc.clone(), op, message });
    }

    /// Appends an op whose result types are inferred; on an inference error, records
    /// it and returns placeholders of `fallback` types.
    pub(crate) fn push(&mut self, op: Op, args: &[Value], loc: &Location, fallback: &[Type]) -> Vec<Value> {
        let arg_tys: Vec<Type> = args.iter().map(|&a| self.func.ty(a).clone()).collect();
        match op.infer(&arg_tys) {
            Ok(tys) => {
                let results = self.push_typed(op.clone(), args, tys, loc);
                self.propagate_logical(&op, args, &results, loc);
                results
            }
            Err(msg) => {
                let name = op.name();
                self.error(loc, Some(name), msg);
                fallback.iter().map(|t| self.placeholder(t, loc)).collect()
            }
        }
    }

    /// Appends an op with the given result types (no inference).
    pub(crate) fn push_typed(
        &mut self,
        op: Op,
        args: &[Value],
        tys: Vec<Type>,
        loc: &Location,
    ) -> Vec<Value> {
        let inst = self.func.create_inst(op, args, tys, loc.clone());
        let b = self.cur_block();
        self.func.append_inst(b, inst);
        self.func.insts[inst].results.to_vec()
    }

    /// A zero of type `ty`, standing in for a value whose op failed to type-check.
    /// It may be ill-typed (a "zero pointer"): it never escapes, because a build
    /// with diagnostics returns an error instead of the function.
    pub(crate) fn placeholder(&mut self, ty: &Type, loc: &Location) -> Value {
        let zero = Scalar::zero(ty.dtype());
        let op = if ty.is_scalar() {
            Op::Creation(CreationOp::Const(zero))
        } else {
            Op::Creation(CreationOp::Full { value: zero, shape: ty.shape.clone() })
        };
        self.push_typed(op, &[], vec![ty.clone()], loc)[0]
    }

    /// A scalar constant.
    pub(crate) fn constant(&mut self, s: Scalar, loc: &Location) -> Value {
        self.push_typed(Op::Creation(CreationOp::Const(s)), &[], vec![Type::scalar(s.dtype())], loc)[0]
    }
}

/// Builds one kernel: declares parameters and runs the body.
#[derive(Clone, Debug)]
pub struct KernelBuilder {
    name: String,
    loc: Location,
}

impl KernelBuilder {
    /// A builder for the kernel `name`, located at the caller.
    #[track_caller]
    pub fn new(name: impl Into<String>) -> KernelBuilder {
        KernelBuilder { name: name.into(), loc: Location::caller() }
    }

    /// A builder with an explicit definition location.
    pub fn with_location(name: impl Into<String>, loc: Location) -> KernelBuilder {
        KernelBuilder { name: name.into(), loc }
    }

    /// Runs `body` with this kernel as the build context and returns the IR.
    ///
    /// Errors: [`Error::Build`] with every type/shape problem found, in program
    /// order; [`Error::Verify`] if the builder itself produced malformed IR (a bug).
    pub fn build(self, body: impl FnOnce()) -> Result<Function> {
        let id = NEXT_BUILD.fetch_add(1, Ordering::Relaxed);
        let func = Function::new(self.name.clone(), self.loc.clone());
        let entry = func.body_block();
        CTX.with(|s| {
            s.borrow_mut().push(Ctx {
                id,
                func,
                diags: Vec::new(),
                insert: vec![entry],
                logical: Default::default(),
            })
        });
        // Pop the context even if the body panics, so later builds on this thread work.
        struct Pop(u32);
        impl Drop for Pop {
            fn drop(&mut self) {
                CTX.with(|s| {
                    let mut s = s.borrow_mut();
                    if s.last().is_some_and(|c| c.id == self.0) {
                        s.pop();
                    }
                });
            }
        }
        let guard = Pop(id);
        body();
        let ctx = CTX.with(|s| s.borrow_mut().pop()).expect("build context vanished");
        std::mem::forget(guard);
        let mut func = ctx.func;
        if !ctx.diags.is_empty() {
            return Err(Error::Build { kernel: func.name, diagnostics: ctx.diags });
        }
        // The body block of a kernel ends without a terminator: nothing to add.
        func.params.shrink_to_fit();
        crate::verify::verify(&func)?;
        Ok(func)
    }
}

/// The kernel `name` built from `body`, located at the caller (as with
/// [`KernelBuilder::new`]); panics on a build error. For this crate's tests.
#[cfg(test)]
#[track_caller]
pub(crate) fn kernel(name: &str, body: impl FnOnce()) -> Function {
    KernelBuilder::new(name).build(body).unwrap()
}

/// Declares a kernel parameter of type `ty` (a scalar or a scalar pointer).
#[track_caller]
pub fn param(name: &str, ty: Type) -> Tensor {
    param_with_hints(name, ty, ParamHints::default())
}

/// Declares a pointer parameter to `dtype`.
#[track_caller]
pub fn param_ptr(name: &str, dtype: DType) -> Tensor {
    param(name, Type::ptr(dtype))
}

/// Declares a scalar parameter of `dtype`.
#[track_caller]
pub fn param_scalar(name: &str, dtype: DType) -> Tensor {
    param(name, Type::scalar(dtype))
}

/// Declares a parameter with facts the launcher guarantees (alignment/divisibility).
#[track_caller]
pub fn param_with_hints(name: &str, ty: Type, hints: ParamHints) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let ident = name.chars().next().is_some_and(|ch| ch.is_alphabetic() || ch == '_')
            && name.chars().all(|ch| ch.is_alphanumeric() || ch == '_');
        if !ident {
            c.error(
                &loc,
                None,
                format!("parameter name `{name}` must be an identifier (letters, digits, `_`)"),
            );
        } else if c.func.params.iter().any(|p| p.name == name) {
            c.error(&loc, None, format!("parameter `{name}` is declared twice"));
        }
        if !ty.is_scalar() {
            c.error(&loc, None, format!("parameter `{name}` must be a scalar or a pointer, found {ty}"));
        }
        if let Some(d) = hints.divisibility
            && (d == 0 || !d.is_power_of_two())
        {
            c.error(
                &loc,
                None,
                format!("the divisibility hint of `{name}` must be a power of two, found {d}"),
            );
        }
        let v = c.func.add_param(name, ty, hints);
        c.handle(v)
    })
}

/// Records a build error at the caller's location (for front ends and `static_assert`).
#[track_caller]
pub fn report_error(message: impl Into<String>) {
    let loc = Location::caller();
    with_ctx(|c| c.error(&loc, None, message.into()));
}

/// Records a build error at an explicit location.
pub fn report_error_at(loc: Location, message: impl Into<String>) {
    with_ctx(|c| c.error(&loc, None, message.into()));
}

/// Builds a region: pushes a fresh block with arguments of `arg_tys`, runs `f`
/// with handles to them, then appends the terminator `term` with the values `f`
/// returns. Returns the region and the yielded values' types.
pub(crate) fn build_region(
    owner: crate::ir::Inst,
    arg_tys: &[Type],
    loc: &Location,
    term: ControlOp,
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> (crate::ir::Region, Vec<Type>) {
    build_region_padded(owner, arg_tys, &[], loc, term, f)
}

/// [`build_region`] whose block arguments carry the logical extents `arg_logical`
/// (one entry per argument, `None` when unpadded; missing entries are unpadded).
pub(crate) fn build_region_padded(
    owner: crate::ir::Inst,
    arg_tys: &[Type],
    arg_logical: &[Option<padding::Extents>],
    loc: &Location,
    term: ControlOp,
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> (crate::ir::Region, Vec<Type>) {
    let (region, args) = with_ctx(|c| {
        let r = c.func.new_region(Some(owner));
        let b = c.func.entry(r);
        let vals: Vec<Value> = arg_tys.iter().map(|t| c.func.add_block_arg(b, t.clone())).collect();
        for (v, e) in vals.iter().zip(arg_logical) {
            if let Some(e) = e {
                c.set_logical(*v, e.clone());
            }
        }
        let args: Vec<Tensor> = vals.into_iter().map(|v| c.handle(v)).collect();
        c.insert.push(b);
        (r, args)
    });
    let yielded = f(&args);
    with_ctx(|c| {
        for &t in &yielded {
            c.check(t);
        }
        let vals: Vec<Value> = yielded.iter().map(|t| t.value).collect();
        let tys: Vec<Type> = vals.iter().map(|&v| c.func.ty(v).clone()).collect();
        c.push_typed(Op::Control(term), &vals, Vec::new(), loc);
        c.insert.pop();
        (region, tys)
    })
}

/// Formats a type list for messages.
pub(crate) fn fmt_types(tys: &[Type]) -> String {
    let parts: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
    format!("({})", parts.join(", "))
}

/// Formats a shape for messages.
pub(crate) fn shape_str(s: &[usize]) -> String {
    fmt_shape(s)
}
