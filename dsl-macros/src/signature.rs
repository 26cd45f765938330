//! Parsing of the kernel's signature and `#[kernel(...)]` attribute into a
//! [`KernelSig`]: runtime pointer/scalar parameters, `#[constexpr]` parameters,
//! dtype generics, and declared autotune configs. Every problem becomes a
//! spanned `syn::Error`; all are collected.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, GenericParam, Ident, ItemFn, Pat, Token, Type};

/// The element dtype of a pointer parameter.
#[derive(Clone, Debug)]
pub enum DTypeSpec {
    /// A fixed dtype, named as in the IR (`f32`, `bf16`, ...).
    Fixed(&'static str),
    /// A dtype generic of the kernel (`T` in `<T: Float>`).
    Generic(Ident),
}

/// What a parameter is.
#[derive(Clone, Debug)]
pub enum ParamKind {
    /// A global pointer, `Ptr<T>`.
    Ptr(DTypeSpec),
    /// A runtime scalar of the given IR dtype, with its Rust type.
    Scalar(&'static str, Type),
    /// A compile-time value of the given Rust type.
    Constexpr(Type),
}

/// One parameter.
#[derive(Clone, Debug)]
pub struct Param {
    /// Its name.
    pub name: Ident,
    /// Its kind.
    pub kind: ParamKind,
}

/// One declared autotune config: constexpr or launch-option assignments,
/// and an optional `when = cond` on the base config's constexprs.
#[derive(Clone, Debug, Default)]
pub struct TuneConfig {
    /// `(name, value)` pairs in source order.
    pub values: Vec<(Ident, Expr)>,
    /// The condition under which the config is a candidate (`when = ..`).
    pub when: Option<Expr>,
}

impl TuneConfig {
    /// Whether the config needs the base config's constexprs in scope: a
    /// `when`, or a value that is not a literal.
    pub fn reads_base(&self) -> bool {
        let literal = |e: &Expr| match e {
            Expr::Lit(_) => true,
            Expr::Unary(u) => matches!(&*u.expr, Expr::Lit(_)),
            _ => false,
        };
        self.when.is_some() || self.values.iter().any(|(_, v)| !literal(v))
    }
}

/// `autotune(configs = [...], key = [...])`.
#[derive(Clone, Debug, Default)]
pub struct Autotune {
    /// The configs to time.
    pub configs: Vec<TuneConfig>,
    /// Runtime parameters whose values select a cached winner.
    pub key: Vec<Ident>,
}

/// Everything the expansion needs about a kernel.
pub struct KernelSig {
    /// The function as written.
    pub item: ItemFn,
    /// Parameters in order.
    pub params: Vec<Param>,
    /// Dtype generics (compile-time `DType` values).
    pub dtype_generics: Vec<Ident>,
    /// Declared autotuning.
    pub autotune: Option<Autotune>,
    /// The IR name template (`name = "gemv_{QUANT}"`): literal text and
    /// constexpr names; `None` names the IR function after the kernel.
    pub name: Option<Vec<NamePart>>,
}

/// A piece of a kernel name template.
#[derive(Clone, Debug)]
pub enum NamePart {
    /// Literal text.
    Text(String),
    /// A constexpr's value (`{QUANT}`), through `Constexpr::name_part`.
    Constexpr(Ident),
}

const SCALARS: [(&str, &str); 5] =
    [("i32", "i32"), ("i64", "i64"), ("u32", "u32"), ("f32", "f32"), ("bool", "i1")];
const CONSTEXPR_TYPES: [&str; 7] = ["usize", "i32", "u32", "i64", "u64", "bool", "f32"];
const DTYPES: [(&str, &str); 14] = [
    ("bool", "i1"),
    ("i8", "i8"),
    ("u8", "u8"),
    ("i16", "i16"),
    ("i32", "i32"),
    ("u32", "u32"),
    ("i64", "i64"),
    ("f16", "f16"),
    ("bf16", "bf16"),
    ("f32", "f32"),
    ("f64", "f64"),
    ("i1", "i1"),
    ("f8e4m3", "f8e4m3"),
    ("f8e5m2", "f8e5m2"),
];

/// Collects errors.
#[derive(Default)]
pub struct Errors(Vec<syn::Error>);

impl Errors {
    /// Records an error spanning `tokens`.
    pub fn at(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.0.push(syn::Error::new_spanned(tokens, msg));
    }

    /// Records an error at `span`.
    pub fn at_span(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.0.push(syn::Error::new(span, msg));
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// All errors as `compile_error!` invocations.
    pub fn to_compile_errors(&self) -> TokenStream {
        self.0.iter().map(|e| e.to_compile_error()).collect()
    }

    /// Moves the errors of `other` into `self`.
    pub fn extend(&mut self, other: Errors) {
        self.0.extend(other.0);
    }
}

fn last_ident(ty: &Type) -> Option<(String, &syn::PathSegment)> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| (s.ident.to_string(), s)),
        _ => None,
    }
}

const PARAM_HELP: &str = "kernel parameters are `Ptr<T>` (T a dtype such as f32, bf16, i32, or a dtype generic), \
runtime scalars (i32, i64, u32, f32, bool), or `#[constexpr]` values (usize, i32, u32, i64, u64, bool, f32, \
or an enum that implements `dsl_core::launch::Constexpr`)";

/// Parses the function signature and the attribute arguments.
pub fn parse(attr: TokenStream, item: ItemFn, errors: &mut Errors) -> KernelSig {
    let mut dtype_generics = Vec::new();
    for g in &item.sig.generics.params {
        match g {
            GenericParam::Type(t) => {
                for b in &t.bounds {
                    let ok = matches!(b, syn::TypeParamBound::Trait(tb)
                        if tb.path.get_ident().is_some_and(|i| i == "Float" || i == "Int" || i == "DType" || i == "Num"));
                    if !ok {
                        errors.at(b, "dtype generics take one bound: `Float`, `Int`, `Num` or `DType`");
                    }
                }
                dtype_generics.push(t.ident.clone());
            }
            other => errors.at(other, "kernels take only dtype generics such as `<T: Float>`"),
        }
    }
    if let Some(w) = &item.sig.generics.where_clause {
        errors.at(w, "kernels do not take `where` clauses");
    }
    if let syn::ReturnType::Type(_, t) = &item.sig.output {
        errors.at(t, "kernels return nothing: results are written through `Ptr` parameters with `store`");
    }
    if let Some(a) = &item.sig.asyncness {
        errors.at(a, "kernels cannot be `async`");
    }
    if let Some(u) = &item.sig.unsafety {
        errors.at(u, "kernels cannot be `unsafe`: the language has no unsafe operations");
    }
    let mut params = Vec::new();
    for arg in &item.sig.inputs {
        let FnArg::Typed(pt) = arg else {
            errors.at(arg, "kernels are free functions: `self` parameters are not allowed");
            continue;
        };
        let name = match &*pt.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => pi.ident.clone(),
            other => {
                errors.at(other, "kernel parameters must be plain names");
                continue;
            }
        };
        let constexpr = pt.attrs.iter().any(|a| a.path().is_ident("constexpr"));
        for a in &pt.attrs {
            if !a.path().is_ident("constexpr") {
                errors.at(a, "the only parameter attribute is `#[constexpr]`");
            }
        }
        let ty = &*pt.ty;
        if constexpr {
            // A built-in scalar, or a plain type path (an enum of build-time
            // choices; the expansion checks that it implements `Constexpr`).
            let ok = last_ident(ty).is_some_and(|(n, s)| {
                s.arguments.is_none() && (CONSTEXPR_TYPES.contains(&n.as_str()) || !is_builtin_type(&n))
            });
            if !ok {
                errors.at(ty, format!("unsupported constexpr type; {PARAM_HELP}"));
            }
            params.push(Param { name, kind: ParamKind::Constexpr(ty.clone()) });
            continue;
        }
        match last_ident(ty) {
            Some((n, seg)) if n == "Ptr" => {
                let inner = match &seg.arguments {
                    syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
                        syn::GenericArgument::Type(t) => Some(t.clone()),
                        _ => None,
                    },
                    _ => None,
                };
                let Some(inner) = inner else {
                    errors.at(ty, "write pointer parameters as `Ptr<T>` with one dtype, e.g. `Ptr<f32>`");
                    continue;
                };
                match last_ident(&inner) {
                    Some((d, _)) if dtype_generics.iter().any(|g| g == d.as_str()) => {
                        let id = dtype_generics.iter().find(|g| *g == d.as_str()).cloned();
                        params.push(Param { name, kind: ParamKind::Ptr(DTypeSpec::Generic(id.unwrap_or_else(|| Ident::new(&d, inner.span())))) });
                    }
                    Some((d, _)) => match DTYPES.iter().find(|(r, _)| *r == d) {
                        Some((_, ir)) => params.push(Param { name, kind: ParamKind::Ptr(DTypeSpec::Fixed(ir)) }),
                        None => errors.at(&inner, format!("`{d}` is not a dtype; use one of bool, i8, u8, i16, i32, u32, i64, f16, bf16, f32, f64, f8e4m3, f8e5m2 or a dtype generic")),
                    },
                    None => errors.at(&inner, "the pointee of `Ptr` must be a dtype such as f32 or bf16"),
                }
            }
            Some((n, seg)) if seg.arguments.is_none() && SCALARS.iter().any(|(r, _)| *r == n) => {
                let ir = SCALARS.iter().find(|(r, _)| *r == n).map(|(_, i)| *i).unwrap_or("i32");
                params.push(Param { name, kind: ParamKind::Scalar(ir, ty.clone()) });
            }
            Some((n, _)) if CONSTEXPR_TYPES.contains(&n.as_str()) => {
                errors.at(ty, format!("`{n}` is a compile-time type: mark the parameter `#[constexpr]`, or use a runtime scalar (i32, i64, u32, f32, bool)"));
            }
            _ => errors.at(ty, format!("unsupported parameter type; {PARAM_HELP}")),
        }
    }
    let (autotune, name) = parse_attr(attr, &params, errors);
    KernelSig { item, params, dtype_generics, autotune, name }
}

/// Whether a constexpr's type is one of the built-in scalars (the others
/// must implement `dsl_core::launch::Constexpr`).
pub fn is_scalar_constexpr(ty: &Type) -> bool {
    last_ident(ty).is_some_and(|(n, _)| CONSTEXPR_TYPES.contains(&n.as_str()))
}

/// Whether `name` is a language type that is not a constexpr scalar (a
/// pointer, a tensor or a dtype), which a `#[constexpr]` cannot have.
fn is_builtin_type(name: &str) -> bool {
    name == "Ptr" || name == "Tensor" || DTYPES.iter().any(|(r, _)| *r == name)
}

/// Whether `id` names a constexpr parameter.
fn is_constexpr(params: &[Param], id: &Ident) -> bool {
    params.iter().any(|q| q.name == *id && matches!(q.kind, ParamKind::Constexpr(_)))
}

/// Parses a name template: `{NAME}` pieces name constexprs.
fn parse_name(lit: &syn::LitStr, params: &[Param], errors: &mut Errors) -> Vec<NamePart> {
    let text = lit.value();
    let mut parts = Vec::new();
    let mut rest = text.as_str();
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(NamePart::Text(rest[..open].to_string()));
        }
        let Some(close) = rest[open..].find('}') else {
            errors.at(lit, "unclosed `{` in the kernel name: write constexprs as `{NAME}`");
            return parts;
        };
        let name = &rest[open + 1..open + close];
        match syn::parse_str::<Ident>(name) {
            Ok(id) if is_constexpr(params, &id) => {
                parts.push(NamePart::Constexpr(Ident::new(name, lit.span())))
            }
            _ => errors.at(lit, format!("`{{{name}}}` in the kernel name is not a constexpr parameter")),
        }
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(NamePart::Text(rest.to_string()));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let literal_ok = parts.iter().all(|p| match p {
        NamePart::Text(t) => t.chars().all(valid),
        NamePart::Constexpr(_) => true,
    });
    if !literal_ok || parts.is_empty() {
        errors.at(lit, "a kernel name is an identifier, with `{NAME}` for constexpr values");
    }
    parts
}

/// Parses `name = "gemv_{QUANT}"` and `autotune(configs = [(A = 1,
/// num_warps = 4), ...], key = [n])`.
fn parse_attr(
    attr: TokenStream,
    params: &[Param],
    errors: &mut Errors,
) -> (Option<Autotune>, Option<Vec<NamePart>>) {
    if attr.is_empty() {
        return (None, None);
    }
    let metas = match syn::parse::Parser::parse2(Punctuated::<syn::Meta, Token![,]>::parse_terminated, attr) {
        Ok(m) => m,
        Err(e) => {
            errors.0.push(e);
            return (None, None);
        }
    };
    let mut out = None;
    let mut name = None;
    for meta in metas {
        match &meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("name") => match &nv.value {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => {
                    name = Some(parse_name(s, params, errors))
                }
                other => errors.at(other, "`name` is a string: `name = \"gemv_{QUANT}\"`"),
            },
            syn::Meta::List(l) if l.path.is_ident("autotune") => {
                let inner = syn::parse::Parser::parse2(
                    Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated,
                    l.tokens.clone(),
                );
                let inner = match inner {
                    Ok(i) => i,
                    Err(e) => {
                        errors.0.push(e);
                        continue;
                    }
                };
                let mut at = Autotune::default();
                for nv in inner {
                    if nv.path.is_ident("configs") {
                        let Expr::Array(arr) = &nv.value else {
                            errors.at(
                                &nv.value,
                                "`configs` is a list: `configs = [(BLOCK = 64, num_warps = 4), ...]`",
                            );
                            continue;
                        };
                        for e in &arr.elems {
                            at.configs.push(parse_config(e, params, errors));
                        }
                    } else if nv.path.is_ident("key") {
                        let Expr::Array(arr) = &nv.value else {
                            errors.at(&nv.value, "`key` is a list of runtime parameters: `key = [n_cols]`");
                            continue;
                        };
                        for e in &arr.elems {
                            match e {
                                Expr::Path(p) if p.path.get_ident().is_some() => {
                                    let id = p.path.get_ident().cloned();
                                    let id = id.unwrap_or_else(|| Ident::new("_", e.span()));
                                    let ok = params
                                        .iter()
                                        .any(|q| q.name == id && matches!(q.kind, ParamKind::Scalar(..)));
                                    if !ok {
                                        errors.at(
                                            e,
                                            format!("autotune key `{id}` must be a runtime scalar parameter"),
                                        );
                                    }
                                    at.key.push(id);
                                }
                                other => errors.at(other, "autotune keys are parameter names"),
                            }
                        }
                    } else {
                        errors.at(&nv.path, "`autotune` takes `configs = [...]` and `key = [...]`");
                    }
                }
                if at.configs.is_empty() {
                    errors.at(l, "`autotune` needs at least one config");
                }
                out = Some(at);
            }
            other => errors.at(
                other,
                "`#[kernel]` takes an optional `name = \"..\"` and `autotune(configs = [...], key = [...])`",
            ),
        }
    }
    (out, name)
}

fn parse_config(e: &Expr, params: &[Param], errors: &mut Errors) -> TuneConfig {
    let items: Vec<&Expr> = match e {
        Expr::Tuple(t) => t.elems.iter().collect(),
        Expr::Paren(p) => vec![&*p.expr],
        other => {
            errors
                .at(other, "a config is a parenthesized list of assignments: `(BLOCK = 64, num_warps = 4)`");
            return TuneConfig::default();
        }
    };
    let mut cfg = TuneConfig::default();
    for it in items {
        let Expr::Assign(a) = it else {
            errors.at(it, "write config entries as `NAME = value`");
            continue;
        };
        let Expr::Path(p) = &*a.left else {
            errors.at(
                &a.left,
                "config entries name a constexpr, `num_warps`, `num_stages` or `min_programs_per_sm`",
            );
            continue;
        };
        let Some(id) = p.path.get_ident().cloned() else {
            errors.at(
                &a.left,
                "config entries name a constexpr, `num_warps`, `num_stages` or `min_programs_per_sm`",
            );
            continue;
        };
        if id == "when" {
            cfg.when = Some((*a.right).clone());
            continue;
        }
        let known = id == "num_warps"
            || id == "num_stages"
            || id == "min_programs_per_sm"
            || is_constexpr(params, &id);
        if !known {
            errors.at(
                &id,
                format!("`{id}` is not a constexpr parameter of this kernel (nor `num_warps`, `num_stages` or `min_programs_per_sm`)"),
            );
            continue;
        }
        cfg.values.push((id, (*a.right).clone()));
    }
    cfg
}
