//! Generation of the per-kernel API: a module named after the kernel holding
//! `Config` (constexprs, dtype generics, launch options), `Args` (typed launch
//! arguments for a backend), `build(&Config)`, the `Kernel` trait
//! implementation, declared autotune metadata, and `interpret(..)`.
//!
//! Generated code names only `::dsl_core` paths.

use crate::lower::lower_body;
use crate::signature::{DTypeSpec, Errors, KernelSig, NamePart, ParamKind};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn};

/// The Rust type a pointer argument points to, for an IR dtype name.
fn rust_elem(spec: &DTypeSpec) -> TokenStream {
    match spec {
        DTypeSpec::Generic(_) => quote!(::dsl_core::launch::AnyDType),
        DTypeSpec::Fixed(d) => match *d {
            "i1" => quote!(bool),
            "f16" => quote!(::dsl_core::half::f16),
            "bf16" => quote!(::dsl_core::half::bf16),
            "f8e4m3" => quote!(::dsl_core::float8::F8E4M3),
            "f8e5m2" => quote!(::dsl_core::float8::F8E5M2),
            other => {
                let id = Ident::new(other, proc_macro2::Span::call_site());
                quote!(#id)
            }
        },
    }
}

/// The `::dsl_core::DType` expression of an IR dtype name.
fn dtype_expr(name: &str) -> TokenStream {
    let v = match name {
        "i1" => "I1",
        "i8" => "I8",
        "u8" => "U8",
        "i16" => "I16",
        "i32" => "I32",
        "u32" => "U32",
        "i64" => "I64",
        "f16" => "F16",
        "bf16" => "BF16",
        "f32" => "F32",
        "f64" => "F64",
        "f8e4m3" => "F8E4M3",
        "f8e5m2" => "F8E5M2",
        other => unreachable!("`{other}` is not a dtype name (the signature parser checked it)"),
    };
    let id = Ident::new(v, proc_macro2::Span::call_site());
    quote!(::dsl_core::DType::#id)
}

/// Expands a `#[kernel]` function.
pub fn kernel(sig: KernelSig, mut errors: Errors) -> TokenStream {
    let item: &ItemFn = &sig.item;
    let name = &item.sig.ident;
    let name_str = name.to_string().trim_start_matches("r#").to_string();
    let vis = &item.vis;
    let docs: Vec<&syn::Attribute> = item.attrs.iter().filter(|a| a.path().is_ident("doc")).collect();

    // Config fields: dtype generics, then constexprs, in declaration order.
    let mut cfg_fields = Vec::new();
    let mut cfg_names = Vec::new();
    for g in &sig.dtype_generics {
        let doc = format!("Dtype generic `{g}`.");
        cfg_fields.push(quote!(#[doc = #doc] pub #g: ::dsl_core::DType));
        cfg_names.push(g.clone());
    }
    // Constexprs of a type other than the built-in scalars (enums) must
    // implement `Constexpr`; this states it where rustc can point at the type.
    let mut constexpr_checks = Vec::new();
    for p in &sig.params {
        if let ParamKind::Constexpr(ty) = &p.kind {
            let n = &p.name;
            let doc = format!("Constexpr `{n}`.");
            cfg_fields.push(quote!(#[doc = #doc] pub #n: #ty));
            cfg_names.push(n.clone());
            if !crate::signature::is_scalar_constexpr(ty) {
                constexpr_checks.push(
                    quote_spanned!(ty.span()=> const _: () = ::dsl_core::launch::assert_constexpr::<#ty>();),
                );
            }
        }
    }
    let cfg_params: Vec<TokenStream> = sig
        .dtype_generics
        .iter()
        .map(|g| quote!(#g: ::dsl_core::DType))
        .chain(sig.params.iter().filter_map(|p| match &p.kind {
            ParamKind::Constexpr(ty) => {
                let n = &p.name;
                Some(quote!(#n: #ty))
            }
            _ => None,
        }))
        .collect();

    // Args fields and their erasure, in parameter order.
    let mut arg_fields = Vec::new();
    let mut erase = Vec::new();
    let mut declare = Vec::new();
    let mut lower_params = Vec::new();
    for p in &sig.params {
        let n = &p.name;
        let n_str = n.to_string().trim_start_matches("r#").to_string();
        match &p.kind {
            ParamKind::Ptr(spec) => {
                let elem = rust_elem(spec);
                let doc = format!("Pointer argument `{n_str}`.");
                arg_fields.push(quote!(#[doc = #doc] pub #n: B::Ptr<'a, #elem>));
                erase.push(quote!(::dsl_core::launch::Arg::Ptr(B::erase(args.#n))));
                let d = match spec {
                    DTypeSpec::Generic(g) => quote!(#g),
                    DTypeSpec::Fixed(d) => dtype_expr(d),
                };
                declare.push(quote_spanned!(n.span()=> let #n = ::dsl_core::lang::param_ptr(#n_str, #d);));
                lower_params.push((n.clone(), true));
            }
            ParamKind::Scalar(ir, ty) => {
                let doc = format!("Scalar argument `{n_str}`.");
                arg_fields.push(quote!(#[doc = #doc] pub #n: #ty));
                let d = dtype_expr(ir);
                let scalar = match *ir {
                    "f32" => quote!(::dsl_core::Scalar::float(#d, args.#n as f64)),
                    "i1" => quote!(::dsl_core::Scalar::bool(args.#n)),
                    _ => quote!(::dsl_core::Scalar::int(#d, args.#n as i64)),
                };
                erase.push(quote!(::dsl_core::launch::Arg::Scalar(#scalar)));
                declare.push(quote_spanned!(n.span()=> let #n = ::dsl_core::lang::param_scalar(#n_str, #d);));
                lower_params.push((n.clone(), true));
            }
            ParamKind::Constexpr(_) => lower_params.push((n.clone(), false)),
        }
    }
    for g in &sig.dtype_generics {
        lower_params.push((g.clone(), false));
    }

    // Shapes fixed by literals are checked now, at `cargo build`.
    let runtime: Vec<String> = sig
        .params
        .iter()
        .filter(|p| !matches!(p.kind, ParamKind::Constexpr(_)))
        .map(|p| p.name.to_string())
        .collect();
    crate::shapes::check(&item.block, &runtime, &mut errors);
    // A kernel returns nothing: its body's last expression (a call, or an
    // `if` whose branches end in one) is a statement whose IR is built.
    let (body, _, body_errors) = lower_body(&lower_params, &[], &item.block, false);
    let body_ok = body_errors.is_empty();
    errors.extend(body_errors);

    // Autotune metadata.
    let key: Vec<String> =
        sig.autotune.as_ref().map(|a| a.key.iter().map(|k| k.to_string()).collect()).unwrap_or_default();
    let configs = sig.autotune.as_ref().map(|a| a.configs.as_slice()).unwrap_or_default();
    let tune_configs: Vec<TokenStream> = configs
        .iter()
        .map(|c| {
            let sets = c.values.iter().map(|(k, v)| quote!(c.#k = #v;));
            quote!({ let mut c = base.clone(); #(#sets)* c })
        })
        .collect();
    // Configs that read the base config's constexprs (a `when`, or values
    // computed from them) see them as locals; the others are plain lists.
    let autotune_body = if configs.iter().any(|c| c.reads_base()) {
        let pushes = configs.iter().zip(&tune_configs).map(|(c, t)| match &c.when {
            Some(w) => quote!(if #w { out.push(#t); }),
            None => quote!(out.push(#t);),
        });
        quote! {
            let Config { #(#cfg_names,)* num_warps: _, num_stages: _, min_programs_per_sm: _ } = base.clone();
            let mut out = ::std::vec::Vec::new();
            #(#pushes)*
            out
        }
    } else {
        quote! {
            let _ = base;
            ::std::vec![#(#tune_configs),*]
        }
    };
    // The IR function's name: the kernel's, or its template with the
    // constexprs' values.
    let ir_name = match &sig.name {
        None => quote!(#name_str),
        Some(parts) => {
            let mut fmt = String::new();
            let mut vals = Vec::new();
            for p in parts {
                match p {
                    NamePart::Text(t) => fmt.push_str(t),
                    NamePart::Constexpr(id) => {
                        fmt.push_str("{}");
                        vals.push(quote!(::dsl_core::launch::Constexpr::name_part(&#id)));
                    }
                }
            }
            quote!(::std::format!(#fmt, #(#vals),*))
        }
    };

    let loc = quote_spanned!(name.span()=> ::dsl_core::Location::new(file!(), line!(), column!()));
    let build_body = if body_ok {
        quote! {
            let Config { #(#cfg_names,)* num_warps: _, num_stages: _, min_programs_per_sm: _ } = config.clone();
            ::dsl_core::lang::KernelBuilder::with_location(#ir_name, #loc).build(|| {
                #[allow(unused_imports)]
                use ::dsl_core::lang::*;
                #[allow(unused_imports)]
                use ::dsl_core::lang::dtypes::*;
                #(#declare)*
                #body
            })
        }
    } else {
        quote! {
            let _ = config;
            ::core::result::Result::Err(::dsl_core::Error::Unsupported(
                ::std::format!("kernel `{}` did not compile", #name_str)))
        }
    };
    let compile_errors = errors.to_compile_errors();
    let n_cfg = cfg_names.len();
    let _ = n_cfg;

    quote! {
        #compile_errors
        #(#docs)*
        #[allow(non_snake_case, unused_mut, unused_variables, unused_assignments, unused_parens, unused_braces, clippy::all)]
        #vis mod #name {
            #[allow(unused_imports)]
            use super::*;
            #(#constexpr_checks)*

            /// The kernel's compile-time parameters (constexprs and dtype generics)
            /// and launch options. Each distinct config is one specialization.
            #[derive(Clone, Debug, PartialEq)]
            pub struct Config {
                #(#cfg_fields,)*
                /// Warps per program.
                pub num_warps: u32,
                /// Software-pipelining depth.
                pub num_stages: u32,
                /// Occupancy hint: programs per SM the compiler must leave
                /// registers for (0: its own choice).
                pub min_programs_per_sm: u32,
            }

            impl Config {
                /// A config with these compile-time values, 4 warps, 2 stages
                /// and no occupancy hint.
                pub fn new(#(#cfg_params),*) -> Config {
                    Config { #(#cfg_names,)* num_warps: 4, num_stages: 2, min_programs_per_sm: 0 }
                }
                /// The same config with `n` warps per program.
                pub fn with_warps(mut self, n: u32) -> Config {
                    self.num_warps = n;
                    self
                }
                /// The same config with `n` pipeline stages.
                pub fn with_stages(mut self, n: u32) -> Config {
                    self.num_stages = n;
                    self
                }
                /// The same config with registers left for `n` programs per
                /// SM (0: the compiler's choice).
                pub fn with_min_programs(mut self, n: u32) -> Config {
                    self.min_programs_per_sm = n;
                    self
                }
            }

            /// Typed launch arguments for backend `B`, one field per runtime parameter.
            pub struct Args<'a, B: ::dsl_core::launch::Backend + 'a> {
                #(#arg_fields,)*
                /// Ties the lifetime to the backend's buffers.
                pub _marker: ::core::marker::PhantomData<&'a B>,
            }

            /// The kernel's name.
            pub const NAME: &str = #name_str;
            /// Runtime parameters whose values key autotune results.
            pub const AUTOTUNE_KEY: &[&str] = &[#(#key),*];

            /// The declared autotune configs, each applied on top of `base`.
            pub fn autotune_configs(base: &Config) -> ::std::vec::Vec<Config> {
                #autotune_body
            }

            /// Builds the tile IR of the specialization `config`.
            pub fn build(config: &Config) -> ::dsl_core::Result<::dsl_core::Function> {
                #build_body
            }

            /// The kernel as a type, for backends.
            pub struct Kernel;

            impl ::dsl_core::launch::Kernel for Kernel {
                const NAME: &'static str = #name_str;
                type Config = Config;
                type Args<'a, B: ::dsl_core::launch::Backend + 'a> = Args<'a, B>;
                fn build(config: &Config) -> ::dsl_core::Result<::dsl_core::Function> {
                    build(config)
                }
                fn launch_options(config: &Config) -> ::dsl_core::launch::LaunchOptions {
                    ::dsl_core::launch::LaunchOptions {
                        num_warps: config.num_warps,
                        num_stages: config.num_stages,
                        min_programs_per_sm: config.min_programs_per_sm,
                    }
                }
                fn autotune_configs(base: &Config) -> ::std::vec::Vec<Config> {
                    autotune_configs(base)
                }
                fn autotune_key() -> &'static [&'static str] {
                    AUTOTUNE_KEY
                }
                fn erase_args<'a, B: ::dsl_core::launch::Backend + 'a>(
                    args: &Args<'a, B>,
                ) -> ::std::vec::Vec<::dsl_core::launch::Arg<B::Raw<'a>>> {
                    ::std::vec![#(#erase),*]
                }
            }

            /// Builds `config` (cached per config) and runs it on the CPU
            /// interpreter `cpu`, which owns the buffers `args` point into.
            pub fn interpret<'a>(
                cpu: &mut ::dsl_core::interp::Cpu,
                grid: [u32; 3],
                config: &Config,
                args: &Args<'a, ::dsl_core::interp::Cpu>,
            ) -> ::dsl_core::Result<()> {
                ::dsl_core::launch::Backend::launch::<Kernel>(cpu, grid, config, args)
            }
        }
    }
}

/// Expands a `#[kernel_fn]` helper: a Rust function that appends IR when called
/// from a kernel body (so it is inlined). `Tensor` parameters are dynamic; other
/// parameters are build-time values.
pub fn kernel_fn(item: ItemFn) -> TokenStream {
    let mut errors = Errors::default();
    let mut params = Vec::new();
    let mut groups = Vec::new();
    for arg in &item.sig.inputs {
        match arg {
            syn::FnArg::Typed(pt) => match &*pt.pat {
                syn::Pat::Ident(pi) => {
                    let is_tensor = is_tensor_type(&pt.ty);
                    let marked = pt.attrs.iter().find(|a| a.path().is_ident("tensors"));
                    if let (Some(a), true) = (marked, is_tensor) {
                        errors.at(a, "`#[tensors]` marks a group of tensors (a struct or tuple of them); a `Tensor` parameter is a tensor already");
                    }
                    let group = marked.is_some()
                        || matches!(&*pt.ty, syn::Type::Tuple(t) if !t.elems.is_empty() && t.elems.iter().all(is_tensor_type));
                    if group {
                        groups.push(pi.ident.clone());
                    }
                    params.push((pi.ident.clone(), is_tensor || group));
                }
                other => errors.at(other, "kernel_fn parameters must be plain names"),
            },
            syn::FnArg::Receiver(r) => errors.at(r, "kernel_fn helpers are free functions"),
        }
    }
    // A helper that returns nothing ends in a statement, as a kernel does.
    let value = !matches!(item.sig.output, syn::ReturnType::Default);
    let (body, tail, body_errors) = lower_body(&params, &groups, &item.block, value);
    errors.extend(body_errors);
    let compile_errors = errors.to_compile_errors();
    let attrs = &item.attrs;
    let vis = &item.vis;
    // `Tensor` in the helper's signature means the kernel language's tensor handle.
    // `#[tensors]` is the macro's marker, not an attribute of the function.
    let mut sig = item.sig.clone();
    for arg in sig.inputs.iter_mut() {
        if let syn::FnArg::Typed(pt) = arg {
            pt.attrs.retain(|a| !a.path().is_ident("tensors"));
            qualify_tensor(&mut pt.ty);
        }
    }
    if let syn::ReturnType::Type(_, t) = &mut sig.output {
        qualify_tensor(t);
    }
    let tail = tail.unwrap_or_default();
    let span = item.block.span();
    let block = quote_spanned!(span=> {
        #[allow(unused_imports)]
        use ::dsl_core::lang::*;
        #[allow(unused_imports)]
        use ::dsl_core::lang::dtypes::*;
        #body
        #tail
    });
    quote! {
        #compile_errors
        #(#attrs)*
        #[allow(unused_mut, unused_variables, unused_assignments, unused_parens, unused_braces, clippy::all)]
        #vis #sig #block
    }
}

/// Whether `ty` names the kernel language's tensor handle (`Tensor`, by any path).
fn is_tensor_type(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Tensor"))
}

/// Rewrites `Tensor` (alone or inside a tuple) to `::dsl_core::lang::Tensor`.
fn qualify_tensor(ty: &mut syn::Type) {
    match ty {
        syn::Type::Path(p) if p.qself.is_none() && p.path.is_ident("Tensor") => {
            *ty = syn::parse_quote!(::dsl_core::lang::Tensor);
        }
        syn::Type::Tuple(t) => t.elems.iter_mut().for_each(qualify_tensor),
        _ => {}
    }
}
