//! Lowering of a kernel body (Rust syntax) into Rust code that builds tile IR
//! through `::dsl_core::lang`.
//!
//! Every binding is either *static* (a plain Rust value known while the kernel
//! is built: constexprs, literals, values computed from them) or *dynamic* (a
//! `Tensor`, i.e. an IR value). A binding is dynamic when its initializer or any
//! assignment to it is dynamic, or when it is assigned under runtime control
//! flow; the lowering runs to a fixed point to find these kinds. Static code is
//! left as Rust (so `if BLOCK > 64 { .. }` is decided at build time and
//! `static_range` loops unroll); dynamic code becomes IR: comparisons and `&&`
//! become `lt`/`and`/... calls, `if` on a tensor becomes `if_else` with the
//! reassigned outer variables as results, `for i in range(..)` becomes
//! `for_range` with them as loop-carried values, and `while` on a tensor
//! becomes `while_loop`. A block's last expression is its value only where
//! the value is used (a `let` or a `#[kernel_fn]`'s result, a branch of an
//! `if` used as a value); elsewhere (a kernel's body, a loop body, the
//! branches of an `if` used as a statement) it is a statement like the
//! others, semicolon or not.
//!
//! A *group* of tensors is a plain Rust struct or tuple whose fields are
//! tensors, so that values that travel together (a weight matrix's planes
//! and strides, say) pass to a `#[kernel_fn]` as one: a struct literal or a
//! tuple with a dynamic field, a `let` binding of one, or a `#[kernel_fn]`
//! parameter marked `#[tensors]` (or typed as a tuple of `Tensor`s), or a
//! `let` of a dynamic value typed as a struct or tuple (`let p: Planes =
//! helper(..)`: the macro cannot see a call's return type). A
//! group binding is dynamic, bound without the `Tensor` type and never
//! reassigned. A field read (`s.field`, `t.0`) has its base's kind: a field
//! of a dynamic value (a group, or a tuple a helper returns) is a tensor,
//! a field of a build-time value is a build-time value, left as Rust.
//!
//! Unsupported syntax gives a spanned error that says what is allowed; all
//! errors are collected.

use crate::prelude::{self, Conv, Req};
use crate::signature::Errors;
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{BinOp, Block, Expr, Ident, Pat, Stmt, UnOp};

/// A runtime region being lowered (body of a dynamic `if`/`for`/`while`).
struct RegionCtx {
    /// Scope depth at the region's entry: bindings declared below it are outer.
    entry_depth: usize,
    /// Outer bindings assigned inside, in order of first assignment.
    assigned: Vec<(Ident, usize)>,
}

/// The lowering state.
pub struct Lower {
    /// Errors of the final pass.
    pub errors: Errors,
    scopes: Vec<Vec<(String, usize)>>,
    /// Binding id -> dynamic.
    kinds: Vec<bool>,
    /// Binding id -> scope depth of its declaration.
    depths: Vec<usize>,
    next_id: usize,
    changed: bool,
    regions: Vec<RegionCtx>,
    tmp: usize,
    /// Binding ids of the kernel's parameters (never reassigned).
    params: Vec<usize>,
    /// Binding ids that hold a group of tensors (never reassigned).
    groups: Vec<usize>,
}

const TENSOR_METHODS: &[&str] = &[
    "to",
    "sum",
    "max",
    "min",
    "argmax",
    "argmin",
    "cumsum",
    "expand_dims",
    "reshape",
    "broadcast_to",
    "trans",
    "exp",
    "exp2",
    "log",
    "log2",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "abs",
    "floor",
    "ceil",
    "erf",
    "permute",
    "split",
    "bitcast",
    "ptrcast",
];

impl Lower {
    /// A lowering with `params` in scope: `(name, dynamic)`.
    fn new() -> Lower {
        Lower {
            errors: Errors::default(),
            scopes: vec![Vec::new()],
            kinds: Vec::new(),
            depths: Vec::new(),
            next_id: 0,
            changed: false,
            regions: Vec::new(),
            tmp: 0,
            params: Vec::new(),
            groups: Vec::new(),
        }
    }

    fn declare(&mut self, name: &Ident, initially_dynamic: bool) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        if id >= self.kinds.len() {
            self.kinds.push(initially_dynamic);
            self.depths.push(self.scopes.len());
        } else if initially_dynamic && !self.kinds[id] {
            self.kinds[id] = true;
            self.changed = true;
        }
        self.depths[id] = self.scopes.len();
        if let Some(s) = self.scopes.last_mut() {
            s.push((name.to_string(), id));
        }
        id
    }

    fn lookup(&self, name: &str) -> Option<usize> {
        self.scopes.iter().rev().find_map(|s| s.iter().rev().find(|(n, _)| n == name).map(|(_, id)| *id))
    }

    fn is_dyn(&self, id: usize) -> bool {
        self.kinds.get(id).copied().unwrap_or(false)
    }

    fn mark_dyn(&mut self, id: usize) {
        if !self.kinds[id] {
            self.kinds[id] = true;
            self.changed = true;
        }
    }

    /// Records an assignment to binding `id`; makes it dynamic when the value is
    /// dynamic or the assignment happens under runtime control flow the binding is
    /// declared outside of, and registers it with those regions.
    fn note_assign(&mut self, name: &Ident, id: usize, value_dyn: bool) {
        let depth = self.depths[id];
        let mut under_runtime = false;
        for r in self.regions.iter_mut() {
            if depth < r.entry_depth {
                under_runtime = true;
                if !r.assigned.iter().any(|(_, i)| *i == id) {
                    r.assigned.push((name.clone(), id));
                }
            }
        }
        if value_dyn || under_runtime {
            self.mark_dyn(id);
        }
    }

    fn fresh(&mut self, base: &str) -> Ident {
        self.tmp += 1;
        format_ident!("__{}{}", base, self.tmp)
    }

    /// Whether `e`, of kind `dynamic`, is a group of tensors: a struct
    /// literal or a tuple with a dynamic field, or a group binding.
    fn is_group(&self, e: &Expr, dynamic: bool) -> bool {
        match e {
            Expr::Struct(_) | Expr::Tuple(_) => dynamic,
            Expr::Paren(p) => self.is_group(&p.expr, dynamic),
            Expr::Group(g) => self.is_group(&g.expr, dynamic),
            Expr::Path(p) => p
                .path
                .get_ident()
                .and_then(|i| self.lookup(&i.to_string()))
                .is_some_and(|id| self.groups.contains(&id)),
            _ => false,
        }
    }

    /// Whether a `let`'s type names a group of tensors: a tuple, or a
    /// struct (a capitalized path other than `Tensor` that is not a name
    /// bound in the kernel, such as a dtype generic `T`). Scalar and dtype
    /// annotations (`f32`, `T`) on a tensor keep their old meaning.
    fn group_type(&self, ty: &syn::Type) -> bool {
        match ty {
            syn::Type::Tuple(t) => !t.elems.is_empty(),
            syn::Type::Path(p) => {
                let bound = p.path.get_ident().is_some_and(|i| self.lookup(&i.to_string()).is_some());
                p.qself.is_none()
                    && !bound
                    && p.path.segments.last().is_some_and(|s| {
                        s.ident != "Tensor"
                            && s.ident.to_string().starts_with(|c: char| c.is_ascii_uppercase())
                    })
            }
            syn::Type::Paren(p) => self.group_type(&p.elem),
            _ => false,
        }
    }

    fn unsupported(&mut self, tokens: impl ToTokens, msg: &str) -> (TokenStream, bool) {
        self.errors.at(tokens, msg);
        (quote!(()), false)
    }

    // ---- blocks and statements ------------------------------------------

    /// Lowers a block's statements in a new scope; returns the statements and the
    /// lowered tail expression (if the block ends with one) with its kind.
    fn block(&mut self, b: &Block) -> (TokenStream, Option<(TokenStream, bool)>) {
        self.block_as(b, true)
    }

    /// [`Lower::block`] where the block's value is used (`value`) or not: a
    /// block whose value is dropped (a loop body, a kernel's body, a branch
    /// of an `if` used as a statement) has no tail, and its last expression
    /// (a call, or an `if` whose branches end in one) is a statement like
    /// the others.
    fn block_as(&mut self, b: &Block, value: bool) -> (TokenStream, Option<(TokenStream, bool)>) {
        self.scopes.push(Vec::new());
        let mut out = TokenStream::new();
        let mut tail = None;
        let n = b.stmts.len();
        for (i, s) in b.stmts.iter().enumerate() {
            if i + 1 == n
                && value
                && let Stmt::Expr(e, None) = s
                && !matches!(e, Expr::If(_) | Expr::ForLoop(_) | Expr::While(_))
            {
                tail = Some(self.expr(e));
                continue;
            }
            if i + 1 == n
                && value
                && let Stmt::Expr(Expr::If(ei), None) = s
                && matches!(ei.then_branch.stmts.last(), Some(Stmt::Expr(_, None)))
            {
                let (t, d) = self.if_expr(ei, true);
                tail = Some((t, d));
                continue;
            }
            out.extend(self.stmt(s));
        }
        self.scopes.pop();
        (out, tail)
    }

    fn stmt(&mut self, s: &Stmt) -> TokenStream {
        match s {
            Stmt::Local(l) => self.local(l),
            Stmt::Expr(e, _) => {
                let t = self.stmt_expr(e);
                quote!(#t;)
            }
            Stmt::Item(it) => {
                self.errors.at(
                    it,
                    "items cannot be declared inside a kernel; define `#[kernel_fn]` helpers next to it",
                );
                TokenStream::new()
            }
            Stmt::Macro(m) => {
                self.errors.at(&m.mac.path, "macros are not supported inside kernels; use `static_assert(cond, \"msg\")` or `device_print(\"prefix\", x)`");
                TokenStream::new()
            }
        }
    }

    fn local(&mut self, l: &syn::Local) -> TokenStream {
        let Some(init) = &l.init else {
            self.errors.at(l, "a `let` in a kernel needs an initializer");
            return TokenStream::new();
        };
        if let Some((_, div)) = &init.diverge {
            self.errors.at(div, "`let ... else` is not supported in kernels");
        }
        let (value, vdyn) = self.expr(&init.expr);
        let (pat, ty) = match &l.pat {
            Pat::Type(pt) => (&*pt.pat, Some(&pt.ty)),
            p => (p, None),
        };
        match pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                // A helper's result is a group when the `let` names a group
                // type: the macro cannot see a call's return type.
                let group =
                    self.is_group(&init.expr, vdyn) || (vdyn && ty.is_some_and(|t| self.group_type(t)));
                let id = self.declare(&pi.ident, vdyn);
                let name = &pi.ident;
                let mutability = &pi.mutability;
                if group {
                    // A group keeps its own (struct or tuple) type.
                    self.groups.push(id);
                    match ty {
                        Some(ty) => quote!(let #mutability #name: #ty = #value;),
                        None => quote!(let #mutability #name = #value;),
                    }
                } else if self.is_dyn(id) {
                    let value = if vdyn {
                        value
                    } else {
                        quote_spanned!(init.expr.span()=> ::dsl_core::lang::__tensor(#value))
                    };
                    quote!(let #mutability #name: ::dsl_core::lang::Tensor = #value;)
                } else {
                    match ty {
                        Some(ty) => quote!(let #mutability #name: #ty = #value;),
                        None => quote!(let #mutability #name = #value;),
                    }
                }
            }
            Pat::Tuple(t) => {
                let mut names = Vec::new();
                for p in &t.elems {
                    match p {
                        Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                            self.declare(&pi.ident, vdyn);
                            let m = &pi.mutability;
                            let n = &pi.ident;
                            names.push(quote!(#m #n));
                        }
                        Pat::Wild(w) => names.push(w.to_token_stream()),
                        other => {
                            self.errors.at(other, "tuple patterns in kernels hold plain names or `_`");
                        }
                    }
                }
                quote!(let (#(#names),*) = #value;)
            }
            Pat::Wild(w) => quote!(let #w = #value;),
            other => {
                self.errors.at(other, "`let` in a kernel binds a name, a tuple of names, or `_`");
                TokenStream::new()
            }
        }
    }

    /// An expression in statement position (assignments and control flow live here).
    fn stmt_expr(&mut self, e: &Expr) -> TokenStream {
        match e {
            Expr::Assign(a) => self.assign(&a.left, &a.right, None, e),
            Expr::Binary(b) if compound(&b.op).is_some() => {
                self.assign(&b.left, &b.right, compound(&b.op), e)
            }
            Expr::If(ei) => self.if_expr(ei, false).0,
            Expr::ForLoop(f) => self.for_loop(f),
            Expr::While(w) => self.while_loop(w),
            other => self.expr(other).0,
        }
    }

    fn target(&mut self, left: &Expr) -> Option<(Ident, usize)> {
        let Expr::Path(p) = left else {
            self.errors.at(
                left,
                "only plain variables can be assigned in kernels (no fields, indexing or dereferences)",
            );
            return None;
        };
        let Some(id) = p.path.get_ident() else {
            self.errors.at(left, "only plain variables can be assigned in kernels");
            return None;
        };
        match self.lookup(&id.to_string()) {
            Some(b) if self.groups.contains(&b) => {
                self.errors.at(
                    left,
                    format!(
                        "`{id}` is a group of tensors and cannot be reassigned; bind a new one with `let`"
                    ),
                );
                None
            }
            Some(b) if self.params.contains(&b) => {
                self.errors.at(left, format!("`{id}` is a kernel parameter and cannot be reassigned; shadow it with `let mut {id} = {id};`"));
                None
            }
            Some(b) => Some((id.clone(), b)),
            None => {
                self.errors.at(left, format!("`{id}` is not a variable of this kernel (parameters cannot be reassigned; shadow them with `let`)"));
                None
            }
        }
    }

    fn assign(&mut self, left: &Expr, right: &Expr, op: Option<TokenStream>, whole: &Expr) -> TokenStream {
        let (rv, rdyn) = self.expr(right);
        let Some((name, id)) = self.target(left) else { return quote!(()) };
        let dyn_before = self.is_dyn(id);
        self.note_assign(&name, id, rdyn || (op.is_some() && dyn_before));
        let span = whole.span();
        if self.is_dyn(id) {
            let value = match op {
                Some(op) => quote_spanned!(span=> #name #op #rv),
                None if rdyn => rv,
                None => quote_spanned!(span=> ::dsl_core::lang::__tensor(#rv)),
            };
            quote_spanned!(span=> #name = #value)
        } else {
            whole_static(whole, &name, rv, op)
        }
    }

    // ---- control flow ----------------------------------------------------

    fn enter_region(&mut self) {
        self.regions.push(RegionCtx { entry_depth: self.scopes.len() + 1, assigned: Vec::new() });
    }

    fn leave_region(&mut self) -> Vec<(Ident, usize)> {
        let r = self.regions.pop().map(|r| r.assigned).unwrap_or_default();
        // The writes back after the construct are assignments in the enclosing code.
        for (n, id) in &r {
            self.note_assign(n, *id, true);
        }
        r
    }

    /// Lowers an `if`; with `want_value` the result is the branches' tail value.
    fn if_expr(&mut self, ei: &syn::ExprIf, want_value: bool) -> (TokenStream, bool) {
        if let Expr::Let(l) = &*ei.cond {
            return self.unsupported(l, "`if let` is not supported in kernels");
        }
        let (cond, cdyn) = self.expr(&ei.cond);
        let span = ei.if_token.span;
        if !cdyn {
            let (then_s, then_t) = self.block_as(&ei.then_branch, want_value);
            let (else_s, else_t) = match &ei.else_branch {
                Some((_, e)) => self.else_branch(e, want_value),
                None => (TokenStream::new(), None),
            };
            let any_dyn = then_t.as_ref().is_some_and(|t| t.1) || else_t.as_ref().is_some_and(|t| t.1);
            let wrap = |t: Option<(TokenStream, bool)>| match t {
                Some((v, d)) if any_dyn && !d => quote!(::dsl_core::lang::__tensor(#v)),
                Some((v, _)) => v,
                None => TokenStream::new(),
            };
            let (tv, ev) = (wrap(then_t), wrap(else_t));
            let else_part =
                if ei.else_branch.is_some() { quote!(else { #else_s #ev }) } else { TokenStream::new() };
            return (quote_spanned!(span=> if #cond { #then_s #tv } #else_part), any_dyn);
        }
        self.enter_region();
        let (then_s, then_t) = self.block_as(&ei.then_branch, want_value);
        let then_assigned = self.regions.last().map(|r| r.assigned.clone()).unwrap_or_default();
        self.regions.pop();
        self.enter_region();
        let (else_s, else_t) = match &ei.else_branch {
            Some((_, e)) => self.else_branch(e, want_value),
            None => (TokenStream::new(), None),
        };
        if let Some(r) = self.regions.last_mut() {
            for a in then_assigned {
                if !r.assigned.iter().any(|(_, i)| *i == a.1) {
                    r.assigned.insert(0, a);
                }
            }
        }
        let carried = self.leave_region();
        if want_value && (then_t.is_none() || else_t.is_none()) {
            self.errors.at_span(span, "an `if` used as a value needs a value in both branches");
        }
        let names: Vec<&Ident> = carried.iter().map(|(n, _)| n).collect();
        let tensor = |t: Option<(TokenStream, bool)>| -> TokenStream {
            match t {
                Some((v, true)) => quote!(#v,),
                Some((v, false)) => quote!(::dsl_core::lang::__tensor(#v),),
                None => TokenStream::new(),
            }
        };
        let (tv, ev) = if want_value {
            (tensor(then_t), tensor(else_t))
        } else {
            (TokenStream::new(), TokenStream::new())
        };
        let r = self.fresh("r");
        let offset = usize::from(want_value);
        let writes = names.iter().enumerate().map(|(i, n)| {
            let i = i + offset;
            quote!(#n = #r[#i];)
        });
        let value = if want_value { quote!(#r[0]) } else { quote!(()) };
        let call = quote_spanned!(span=> ::dsl_core::lang::if_else(#cond,
            || { #(let mut #names = #names;)* #then_s ::std::vec![#tv #(#names),*] },
            || { #(let mut #names = #names;)* #else_s ::std::vec![#ev #(#names),*] }));
        (quote!({ let #r = #call; #(#writes)* #value }), true)
    }

    fn else_branch(&mut self, e: &Expr, want_value: bool) -> (TokenStream, Option<(TokenStream, bool)>) {
        match e {
            Expr::Block(b) => self.block_as(&b.block, want_value),
            Expr::If(ei) => {
                let (t, d) = self.if_expr(ei, want_value);
                if want_value { (TokenStream::new(), Some((t, d))) } else { (quote!(#t;), None) }
            }
            other => {
                self.errors.at(other, "expected a block after `else`");
                (TokenStream::new(), None)
            }
        }
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> TokenStream {
        let span = f.for_token.span;
        let var = match &*f.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => Some(pi.ident.clone()),
            Pat::Wild(_) => None,
            other => {
                self.errors.at(other, "a `for` loop binds one name or `_`");
                return TokenStream::new();
            }
        };
        let var_tok = var.clone().unwrap_or_else(|| format_ident!("_"));
        // Static loops: `static_range(a, b[, step])` and `a..b` unroll while building.
        let static_args: Option<Vec<Expr>> = match &*f.expr {
            Expr::Call(c) if call_name(c).as_deref() == Some("static_range") => {
                Some(c.args.iter().cloned().collect())
            }
            Expr::Range(r) => match (&r.start, &r.end, &r.limits) {
                (Some(a), Some(b), syn::RangeLimits::HalfOpen(_)) => Some(vec![(**a).clone(), (**b).clone()]),
                _ => {
                    self.errors
                        .at(r, "unrolled loops use a half-open range `a..b` or `static_range(a, b, step)`");
                    return TokenStream::new();
                }
            },
            _ => None,
        };
        if let Some(args) = static_args {
            let lowered: Vec<(TokenStream, bool)> = args.iter().map(|a| self.expr(a)).collect();
            if lowered.iter().any(|(_, d)| *d) {
                self.errors.at(&f.expr, "`static_range` bounds must be known while building (constexprs or literals); use `range(..)` for a runtime loop");
            }
            let (a, b, step) = match lowered.as_slice() {
                [(b, _)] => (quote!(0), b.clone(), quote!(1)),
                [(a, _), (b, _)] => (a.clone(), b.clone(), quote!(1)),
                [(a, _), (b, _), (s, _)] => (a.clone(), b.clone(), s.clone()),
                _ => {
                    self.errors.at(&f.expr, "`static_range` takes (end), (start, end) or (start, end, step)");
                    return TokenStream::new();
                }
            };
            self.scopes.push(Vec::new());
            if let Some(v) = &var {
                self.declare(v, false);
            }
            let (body, tail) = self.block_as(&f.body, false);
            self.scopes.pop();
            let tail = tail.map(|(t, _)| quote!(#t;));
            return quote_spanned!(span=> for #var_tok in (#a..#b).step_by(::dsl_core::lang::__usize(#step)) { #body #tail });
        }
        let args: Vec<Expr> = match &*f.expr {
            Expr::Call(c) if call_name(c).as_deref() == Some("range") => c.args.iter().cloned().collect(),
            other => {
                self.errors.at(other, "`for` loops iterate over `range(start, end[, step])` (a runtime loop) or over `static_range(..)` / `a..b` (unrolled while building)");
                return TokenStream::new();
            }
        };
        let lowered: Vec<TokenStream> = args.iter().map(|a| self.expr(a).0).collect();
        let (lb, ub, step) = match lowered.as_slice() {
            [b] => (quote!(0), b.clone(), quote!(1)),
            [a, b] => (a.clone(), b.clone(), quote!(1)),
            [a, b, s] => (a.clone(), b.clone(), s.clone()),
            _ => {
                self.errors.at(&f.expr, "`range` takes (end), (start, end) or (start, end, step)");
                return TokenStream::new();
            }
        };
        self.enter_region();
        self.scopes.push(Vec::new());
        if let Some(v) = &var {
            let id = self.declare(v, true);
            self.mark_dyn(id);
        }
        let (body, tail) = self.block_as(&f.body, false);
        self.scopes.pop();
        let carried = self.leave_region();
        let (tail, names, r, c) = self.loop_parts(&carried, tail);
        let idx = 0..names.len();
        let idx2 = 0..names.len();
        let call = quote_spanned!(span=> ::dsl_core::lang::for_range(#lb, #ub, #step, &[#(#names),*],
            |#var_tok, #c| { #(let mut #names = #c[#idx];)* #body #tail ::std::vec![#(#names),*] }));
        quote!({ let #r = #call; #(#names = #r[#idx2];)* })
    }

    /// What both runtime loops emit around their carried variables: the
    /// body's tail as a statement, the carried names, and fresh names for
    /// the loop's results (`r`) and its closures' argument (`c`).
    fn loop_parts<'c>(
        &mut self,
        carried: &'c [(Ident, usize)],
        tail: Option<(TokenStream, bool)>,
    ) -> (Option<TokenStream>, Vec<&'c Ident>, Ident, Ident) {
        let tail = tail.map(|(t, _)| quote!(#t;));
        let names = carried.iter().map(|(n, _)| n).collect();
        let r = self.fresh("r");
        let c = self.fresh("c");
        (tail, names, r, c)
    }

    fn while_loop(&mut self, w: &syn::ExprWhile) -> TokenStream {
        let span = w.while_token.span;
        if let Expr::Let(l) = &*w.cond {
            self.errors.at(l, "`while let` is not supported in kernels");
            return TokenStream::new();
        }
        let (cond, cdyn) = self.expr(&w.cond);
        if !cdyn {
            let (body, tail) = self.block_as(&w.body, false);
            let tail = tail.map(|(t, _)| quote!(#t;));
            return quote_spanned!(span=> while #cond { #body #tail });
        }
        self.enter_region();
        let (body, tail) = self.block_as(&w.body, false);
        let carried = self.leave_region();
        if carried.is_empty() {
            self.errors.at(
                &w.cond,
                "this runtime `while` loop never reassigns a variable, so its condition cannot change",
            );
        }
        let (tail, names, r, c) = self.loop_parts(&carried, tail);
        let idx = 0..names.len();
        let idx2 = 0..names.len();
        let idx3 = 0..names.len();
        let call = quote_spanned!(span=> ::dsl_core::lang::while_loop(&[#(#names),*],
            |#c| { #(let #names = #c[#idx];)* ::dsl_core::lang::__tensor(#cond) },
            |#c| { #(let mut #names = #c[#idx2];)* #body #tail ::std::vec![#(#names),*] }));
        quote!({ let #r = #call; #(#names = #r[#idx3];)* })
    }

    // ---- expressions -----------------------------------------------------

    /// Lowers an expression; returns its tokens and whether it is dynamic.
    pub fn expr(&mut self, e: &Expr) -> (TokenStream, bool) {
        let span = e.span();
        match e {
            Expr::Lit(_) => (e.to_token_stream(), false),
            Expr::Path(p) => {
                let d = p.path.get_ident().and_then(|i| self.lookup(&i.to_string())).is_some_and(|id| self.is_dyn(id));
                (e.to_token_stream(), d)
            }
            Expr::Paren(p) => {
                let (t, d) = self.expr(&p.expr);
                (quote_spanned!(span=> (#t)), d)
            }
            Expr::Group(g) => self.expr(&g.expr),
            Expr::Binary(b) => self.binary(b),
            Expr::Unary(u) => match u.op {
                UnOp::Neg(_) | UnOp::Not(_) => {
                    let (t, d) = self.expr(&u.expr);
                    let op = &u.op;
                    (quote_spanned!(span=> #op #t), d)
                }
                _ => self.unsupported(e, "dereferences are not part of the kernel language"),
            },
            Expr::Call(c) => self.call(c),
            Expr::MethodCall(m) => self.method(m),
            Expr::If(ei) => self.if_expr(ei, true),
            Expr::Block(b) if b.label.is_none() => {
                let (s, t) = self.block(&b.block);
                let (tv, d) = t.unwrap_or((quote!(()), false));
                (quote_spanned!(span=> { #s #tv }), d)
            }
            Expr::Tuple(t) => {
                let parts: Vec<(TokenStream, bool)> = t.elems.iter().map(|x| self.expr(x)).collect();
                let d = parts.iter().any(|p| p.1);
                let toks = parts.iter().map(|p| &p.0);
                (quote_spanned!(span=> (#(#toks,)*)), d)
            }
            Expr::Array(a) => {
                let parts: Vec<(TokenStream, bool)> = a.elems.iter().map(|x| self.expr(x)).collect();
                if parts.iter().any(|p| p.1) {
                    return self.unsupported(e, "arrays hold build-time values (shapes); tensors are built with `arange`, `full`, `zeros`");
                }
                let toks = parts.iter().map(|p| &p.0);
                (quote_spanned!(span=> [#(#toks),*]), false)
            }
            Expr::Cast(c) => {
                let (t, d) = self.expr(&c.expr);
                if d {
                    return self.unsupported(e, "`as` converts build-time values only; convert tensors with `x.to(dtype)` or `cast(x, dtype)`");
                }
                let ty = &c.ty;
                (quote_spanned!(span=> (#t as #ty)), false)
            }
            Expr::Assign(_) | Expr::ForLoop(_) | Expr::While(_) => (self.stmt_expr(e), false),
            Expr::Closure(_) => self.unsupported(e, "closures are not part of the kernel language; write a `#[kernel_fn]` helper and call it"),
            Expr::Reference(_) => self.unsupported(e, "references are not part of the kernel language; pass values directly"),
            Expr::Index(_) => self.unsupported(e, "indexing is not supported in kernels; address memory with pointer arithmetic and `load`/`store`, and pick tile elements with `where_` and reductions"),
            Expr::Return(_) => self.unsupported(e, "`return` is not supported in kernels; a kernel ends at the end of its body (use `if` to skip work)"),
            Expr::Break(_) => self.unsupported(e, "`break` is not supported in kernels; use a `while` loop whose condition you update"),
            Expr::Continue(_) => self.unsupported(e, "`continue` is not supported in kernels; guard the rest of the body with `if`"),
            Expr::Loop(_) => self.unsupported(e, "`loop` is not supported in kernels; use `while cond { .. }` or `for i in range(..)`"),
            Expr::Match(_) => self.unsupported(e, "`match` is not supported in kernels; use `if`/`else` (or `where_` on tensors)"),
            Expr::Field(f) => {
                // A field has its base's kind (see the module doc).
                let (base, d) = self.expr(&f.base);
                let member = &f.member;
                (quote_spanned!(span=> #base.#member), d)
            }
            Expr::Struct(s) => self.struct_lit(s),
            Expr::Unsafe(_) => self.unsupported(e, "`unsafe` is not part of the kernel language"),
            Expr::Async(_) | Expr::Await(_) => self.unsupported(e, "`async` is not part of the kernel language"),
            Expr::Try(_) => self.unsupported(e, "the `?` operator is not supported in kernels"),
            Expr::Macro(m) => self.unsupported(&m.mac.path, "macros are not supported inside kernels; use `static_assert(cond, \"msg\")` or `device_print(\"prefix\", x)`"),
            Expr::Range(_) => self.unsupported(e, "ranges appear only in `for` loops"),
            Expr::Let(_) => self.unsupported(e, "`let` expressions are not supported in kernels"),
            _ => self.unsupported(e, "this syntax is not supported in kernels"),
        }
    }

    /// A struct literal: a group of tensors when a field is dynamic (its
    /// build-time fields then become tensors too), otherwise a build-time value.
    fn struct_lit(&mut self, s: &syn::ExprStruct) -> (TokenStream, bool) {
        if let Some(rest) = &s.rest {
            return self.unsupported(
                rest,
                "struct update syntax (`..base`) is not supported in kernels; name every field",
            );
        }
        let fields: Vec<(&syn::Member, TokenStream, bool, Span)> = s
            .fields
            .iter()
            .map(|f| {
                let (t, d) = self.expr(&f.expr);
                (&f.member, t, d, f.expr.span())
            })
            .collect();
        let group = fields.iter().any(|f| f.2);
        let inits = fields.iter().map(|(member, t, d, span)| {
            if group && !d {
                quote_spanned!(*span=> #member: ::dsl_core::lang::__tensor(#t))
            } else {
                quote_spanned!(*span=> #member: #t)
            }
        });
        let path = &s.path;
        (quote_spanned!(s.span()=> #path { #(#inits),* }), group)
    }

    fn binary(&mut self, b: &syn::ExprBinary) -> (TokenStream, bool) {
        let span = b.span();
        if compound(&b.op).is_some() {
            return (self.assign(&b.left, &b.right, compound(&b.op), &Expr::Binary(b.clone())), false);
        }
        let (l, ld) = self.expr(&b.left);
        let (r, rd) = self.expr(&b.right);
        let d = ld || rd;
        let func = match b.op {
            BinOp::Lt(_) => Some("lt"),
            BinOp::Le(_) => Some("le"),
            BinOp::Gt(_) => Some("gt"),
            BinOp::Ge(_) => Some("ge"),
            BinOp::Eq(_) => Some("eq"),
            BinOp::Ne(_) => Some("ne"),
            BinOp::And(_) => Some("and"),
            BinOp::Or(_) => Some("or"),
            _ => None,
        };
        match func {
            Some(f) if d => {
                let f = Ident::new(f, span);
                (quote_spanned!(span=> ::dsl_core::lang::#f(#l, #r)), true)
            }
            _ => {
                let op = &b.op;
                (quote_spanned!(span=> #l #op #r), d)
            }
        }
    }

    fn call(&mut self, c: &syn::ExprCall) -> (TokenStream, bool) {
        let span = c.span();
        let Some(name) = call_name(c) else {
            // A path call such as `helpers::rms(x)`: a `#[kernel_fn]` elsewhere.
            let args: Vec<TokenStream> = c.args.iter().map(|a| self.expr(a).0).collect();
            let func = &c.func;
            return (quote_spanned!(span=> #func(#(#args),*)), true);
        };
        match name.as_str() {
            "range" | "static_range" => {
                return self
                    .unsupported(c, "`range`/`static_range` appear only as the iterator of a `for` loop");
            }
            "cdiv" | "next_power_of_2" => {
                let args: Vec<(TokenStream, bool)> = c.args.iter().map(|a| self.expr(a)).collect();
                let d = args.iter().any(|a| a.1);
                let toks: Vec<&TokenStream> = args.iter().map(|a| &a.0).collect();
                return match (name.as_str(), toks.as_slice(), d) {
                    ("cdiv", [a, b], false) => (quote_spanned!(span=> ((#a) + (#b) - 1) / (#b)), false),
                    ("cdiv", [a, b], true) => (quote_spanned!(span=> ::dsl_core::lang::cdiv(#a, #b)), true),
                    ("next_power_of_2", [a], false) => {
                        (quote_spanned!(span=> (#a).next_power_of_two()), false)
                    }
                    ("next_power_of_2", [_], true) => {
                        self.unsupported(c, "`next_power_of_2` takes a build-time value")
                    }
                    _ => self.unsupported(c, format!("wrong number of arguments to `{name}`").as_str()),
                };
            }
            "reduce" | "scan" => return self.custom_combine(c, &name),
            _ => {}
        }
        match prelude::lookup(&name) {
            Some(entry) => self.prelude_call(entry, c.args.iter().collect(), span, c),
            None => {
                // A `#[kernel_fn]` helper (or a typo, which rustc reports with a
                // suggestion since the prelude is in scope).
                let args: Vec<TokenStream> = c.args.iter().map(|a| self.expr(a).0).collect();
                let func = &c.func;
                (quote_spanned!(span=> #func(#(#args),*)), true)
            }
        }
    }

    fn method(&mut self, m: &syn::ExprMethodCall) -> (TokenStream, bool) {
        let span = m.span();
        let (recv, rd) = self.expr(&m.receiver);
        if !rd {
            let args: Vec<(TokenStream, bool)> = m.args.iter().map(|a| self.expr(a)).collect();
            let d = args.iter().any(|a| a.1);
            let toks = args.iter().map(|a| &a.0);
            let method = &m.method;
            let turbofish = &m.turbofish;
            return (quote_spanned!(span=> #recv.#method #turbofish(#(#toks),*)), d);
        }
        let name = m.method.to_string();
        if !TENSOR_METHODS.contains(&name.as_str()) {
            return self.unsupported(
                &m.method,
                &format!("tensors have no method `{name}`; methods are {}", TENSOR_METHODS.join(", ")),
            );
        }
        let target = if name == "to" { "cast".to_string() } else { name };
        let Some(entry) = prelude::lookup(&target) else {
            return self.unsupported(&m.method, "unknown tensor method");
        };
        let mut args: Vec<&Expr> = vec![&m.receiver];
        args.extend(m.args.iter());
        self.prelude_call(entry, args, span, m)
    }

    /// Lowers a call of a prelude function: matches positional and `name = value`
    /// arguments against the entry and converts each.
    fn prelude_call(
        &mut self,
        entry: &prelude::Entry,
        args: Vec<&Expr>,
        span: Span,
        whole: &dyn ToTokens,
    ) -> (TokenStream, bool) {
        let mut slots: Vec<Option<&Expr>> = vec![None; entry.args.len()];
        let mut rest: Vec<&Expr> = Vec::new();
        let mut named_seen = false;
        for a in args {
            if let Expr::Assign(asg) = a
                && let Expr::Path(p) = &*asg.left
                && let Some(id) = p.path.get_ident()
            {
                named_seen = true;
                match entry.args.iter().position(|(n, _, _)| id == n) {
                    Some(i) if slots[i].is_none() => slots[i] = Some(&asg.right),
                    Some(_) => self.errors.at(id, format!("argument `{id}` is given twice")),
                    None => {
                        let names: Vec<&str> = entry.args.iter().map(|(n, _, _)| *n).collect();
                        self.errors.at(
                            id,
                            format!(
                                "`{}` has no argument `{id}`; its arguments are {}",
                                entry.name,
                                names.join(", ")
                            ),
                        );
                    }
                }
                continue;
            }
            if named_seen {
                self.errors.at(a, "positional arguments must come before named ones");
                continue;
            }
            match slots.iter().position(|s| s.is_none()) {
                Some(i) if entry.args[i].1 != Conv::Rest => slots[i] = Some(a),
                Some(_) => rest.push(a),
                None => {
                    self.errors.at(a, format!("too many arguments to `{}`", entry.name));
                }
            }
        }
        let mut out = Vec::new();
        for (i, (aname, conv, req)) in entry.args.iter().enumerate() {
            let arg = slots[i];
            if arg.is_none() && *req == Req::Yes && *conv != Conv::Rest {
                self.errors.at(whole, format!("`{}` needs the argument `{aname}`", entry.name));
                out.push(quote!(::core::default::Default::default()));
                continue;
            }
            out.push(self.convert(*conv, arg, &rest, *req));
        }
        let target = Ident::new(entry.target, span);
        let dynamic = entry.name != "static_assert";
        (quote_spanned!(span=> ::dsl_core::lang::#target(#(#out),*)), dynamic)
    }

    fn convert(&mut self, conv: Conv, arg: Option<&Expr>, rest: &[&Expr], req: Req) -> TokenStream {
        let lowered = arg.map(|a| (self.expr(a), a.span()));
        match (conv, lowered) {
            (Conv::Tensor, Some(((t, _), s))) => quote_spanned!(s=> ::dsl_core::lang::__tensor(#t)),
            (Conv::Pass, Some(((t, _), _))) => t,
            (Conv::I32, Some(((t, d), s))) => self.static_int(t, d, s, "__i32"),
            (Conv::U32, Some(((t, d), s))) => self.static_int(t, d, s, "__u32"),
            (Conv::U8, Some(((t, d), s))) => self.static_int(t, d, s, "__u8"),
            (Conv::I32, None) => match req {
                Req::Default(v) => v.parse().unwrap_or_else(|_| quote!(0)),
                Req::Yes => quote!(0),
            },
            (Conv::Shape, Some((_, s))) => {
                let Some(Expr::Array(a)) = arg else {
                    self.errors.at_span(
                        s,
                        "shapes are written as arrays of build-time integers: `[BLOCK_M, BLOCK_N]`",
                    );
                    return quote!(&[]);
                };
                let dims: Vec<TokenStream> = a
                    .elems
                    .iter()
                    .map(|d| {
                        let (t, dy) = self.expr(d);
                        self.static_int(t, dy, d.span(), "__usize")
                    })
                    .collect();
                quote_spanned!(s=> &[#(#dims),*])
            }
            (Conv::OptTensor, Some(((t, _), s))) => {
                quote_spanned!(s=> ::core::option::Option::Some(::dsl_core::lang::__tensor(#t)))
            }
            (Conv::OptOperand, Some(((t, _), s))) => {
                quote_spanned!(s=> ::core::option::Option::Some(::core::convert::Into::<::dsl_core::lang::Operand>::into(#t)))
            }
            (Conv::OptTensor | Conv::OptOperand, None) => quote!(::core::option::Option::None),
            (Conv::Str, Some(((t, _), s))) => {
                if !matches!(arg, Some(Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(_), .. }))) {
                    self.errors.at_span(s, "expected a string literal");
                }
                t
            }
            (Conv::Cache | Conv::Evict | Conv::Sem | Conv::Scope | Conv::Cmp, Some((_, s))) => {
                let (what, ty, names): (&str, &str, &[(&str, &str)]) = match conv {
                    Conv::Cache => {
                        ("cache_modifier", "CacheModifier", &[(".ca", "Ca"), (".cg", "Cg"), (".cs", "Cs")])
                    }
                    Conv::Evict => (
                        "eviction_policy",
                        "EvictionPolicy",
                        &[("evict_first", "First"), ("evict_last", "Last"), ("evict_normal", "Normal")],
                    ),
                    Conv::Sem => (
                        "sem",
                        "MemSem",
                        &[
                            ("relaxed", "Relaxed"),
                            ("acquire", "Acquire"),
                            ("release", "Release"),
                            ("acq_rel", "AcqRel"),
                        ],
                    ),
                    Conv::Scope => ("scope", "MemScope", &[("gpu", "Gpu"), ("cta", "Cta"), ("sys", "Sys")]),
                    _ => (
                        "cmp",
                        "CmpPred",
                        &[("eq", "Eq"), ("ne", "Ne"), ("lt", "Lt"), ("le", "Le"), ("gt", "Gt"), ("ge", "Ge")],
                    ),
                };
                let lit = match arg {
                    Some(Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(l), .. })) => Some(l.value()),
                    _ => None,
                };
                let ty = Ident::new(ty, s);
                match names.iter().find(|(n, _)| Some(*n) == lit.as_deref()) {
                    Some((_, v)) => {
                        let v = Ident::new(v, s);
                        if conv == Conv::Sem {
                            quote_spanned!(s=> ::core::option::Option::Some(::dsl_core::ir::ops::#ty::#v))
                        } else {
                            quote_spanned!(s=> ::dsl_core::ir::ops::#ty::#v)
                        }
                    }
                    None => {
                        let allowed: Vec<String> = names.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                        self.errors.at_span(s, format!("`{what}` must be one of {}", allowed.join(", ")));
                        quote!(::core::default::Default::default())
                    }
                }
            }
            (Conv::Rest, _) => {
                let vals: Vec<TokenStream> = rest
                    .iter()
                    .map(|a| {
                        let (t, _) = self.expr(a);
                        quote_spanned!(a.span()=> ::dsl_core::lang::__tensor(#t))
                    })
                    .collect();
                quote!(&[#(#vals),*])
            }
            (_, None) => quote!(::core::default::Default::default()),
        }
    }

    fn static_int(&mut self, t: TokenStream, dynamic: bool, span: Span, f: &str) -> TokenStream {
        if dynamic {
            self.errors.at_span(
                span,
                "this argument must be known while building (a constexpr or a literal), not a tensor",
            );
        }
        let f = Ident::new(f, span);
        quote_spanned!(span=> ::dsl_core::lang::#f(#t))
    }

    /// `reduce(inputs, axis, combine)` and `scan(inputs, axis, combine[, reverse])`:
    /// `inputs` is a tensor or a tuple of tensors; `combine` names a `#[kernel_fn]`
    /// taking the running values then the new values.
    fn custom_combine(&mut self, c: &syn::ExprCall, name: &str) -> (TokenStream, bool) {
        let span = c.span();
        let args: Vec<&Expr> = c.args.iter().collect();
        if args.len() < 3 || args.len() > 4 || (name == "reduce" && args.len() != 3) {
            return self.unsupported(
                c,
                &format!(
                    "`{name}` takes (inputs, axis, combine_fn){}",
                    if name == "scan" { " and an optional reverse flag" } else { "" }
                ),
            );
        }
        let inputs: Vec<&Expr> = match args[0] {
            Expr::Tuple(t) => t.elems.iter().collect(),
            e => vec![e],
        };
        let ins: Vec<TokenStream> = inputs
            .iter()
            .map(|e| {
                let (t, _) = self.expr(e);
                quote!(::dsl_core::lang::__tensor(#t))
            })
            .collect();
        let (axis, ad) = self.expr(args[1]);
        let axis = self.static_int(axis, ad, args[1].span(), "__i32");
        let Expr::Path(f) = args[2] else {
            return self.unsupported(args[2], "the combine function is the name of a `#[kernel_fn]` helper");
        };
        let n = inputs.len();
        let l = (0..n).map(|i| quote!(__l[#i]));
        let r = (0..n).map(|i| quote!(__r[#i]));
        let combine = quote!(|__l: &[::dsl_core::lang::Tensor], __r: &[::dsl_core::lang::Tensor]| ::dsl_core::lang::IntoTensors::into_tensors(#f(#(#l,)* #(#r),*)));
        let call = if name == "reduce" {
            quote_spanned!(span=> ::dsl_core::lang::reduce(&[#(#ins),*], #axis, #combine))
        } else {
            let rev = match args.get(3) {
                Some(e) => self.expr(e).0,
                None => quote!(false),
            };
            quote_spanned!(span=> ::dsl_core::lang::scan(&[#(#ins),*], #axis, #rev, #combine))
        };
        let result = if n == 1 {
            quote!(#call[0])
        } else {
            quote!(<_ as ::dsl_core::lang::FromTensors>::from_tensors(&#call))
        };
        (result, true)
    }
}

/// The operator of a compound assignment (`+=` gives `+`).
fn compound(op: &BinOp) -> Option<TokenStream> {
    Some(match op {
        BinOp::AddAssign(t) => quote_spanned!(t.span()=> +),
        BinOp::SubAssign(t) => quote_spanned!(t.span()=> -),
        BinOp::MulAssign(t) => quote_spanned!(t.span()=> *),
        BinOp::DivAssign(t) => quote_spanned!(t.span()=> /),
        BinOp::RemAssign(t) => quote_spanned!(t.span()=> %),
        BinOp::BitAndAssign(t) => quote_spanned!(t.span()=> &),
        BinOp::BitOrAssign(t) => quote_spanned!(t.span()=> |),
        BinOp::BitXorAssign(t) => quote_spanned!(t.span()=> ^),
        BinOp::ShlAssign(t) => quote_spanned!(t.span()=> <<),
        BinOp::ShrAssign(t) => quote_spanned!(t.span()=> >>),
        _ => return None,
    })
}

/// A static assignment, kept as written (with the lowered right-hand side).
fn whole_static(whole: &Expr, name: &Ident, rv: TokenStream, op: Option<TokenStream>) -> TokenStream {
    let span = whole.span();
    match (whole, op) {
        (Expr::Binary(b), Some(_)) => {
            let op = &b.op;
            quote_spanned!(span=> #name #op #rv)
        }
        _ => quote_spanned!(span=> #name = #rv),
    }
}

/// The single-identifier name of a call's function, if it is one.
fn call_name(c: &syn::ExprCall) -> Option<String> {
    match &*c.func {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    }
}

/// Lowers a function body with the given parameters in scope (`(name,
/// dynamic)`; those named in `groups` hold groups of tensors), running the
/// kind analysis to a fixed point. Returns the statements, the lowered tail
/// expression (if any), and the errors.
pub fn lower_body(
    params: &[(Ident, bool)],
    groups: &[Ident],
    body: &Block,
    value: bool,
) -> (TokenStream, Option<TokenStream>, Errors) {
    let mut kinds: Vec<bool> = Vec::new();
    let mut depths: Vec<usize> = Vec::new();
    for _ in 0..16 {
        let mut l = Lower::new();
        l.kinds = kinds.clone();
        l.depths = depths.clone();
        for (p, d) in params {
            let id = l.declare(p, *d);
            l.params.push(id);
            if *d {
                l.mark_dyn(id);
            }
            if groups.contains(p) {
                l.groups.push(id);
            }
        }
        l.changed = false;
        let (stmts, tail) = l.block_as(body, value);
        if !l.changed {
            return (stmts, tail.map(|t| t.0), l.errors);
        }
        kinds = l.kinds;
        depths = l.depths;
    }
    let mut errors = Errors::default();
    errors.at(body, "internal error: the kind analysis of this kernel did not converge");
    (TokenStream::new(), None, errors)
}
