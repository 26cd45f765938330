//! `#[kernel]` and `#[kernel_fn]`: write tile kernels in Rust syntax.
//!
//! The crate is split as parse (`signature`), check-and-lower (`lower`, with the
//! `prelude` table of the kernel language) and generate (`generate`). The
//! expansion is a plain function of token streams ([`expand_kernel`],
//! [`expand_kernel_fn`]) so it can be snapshot-tested.
//!
//! Invariants: macro output names only `::dsl_core` paths; every error is
//! spanned and all errors are reported at once; when the body has errors the
//! kernel's module (`Config`, `Args`, `build`, ...) is still emitted so IDEs and
//! the rest of the crate keep resolving names.

mod generate;
mod lower;
mod prelude;
mod shapes;
mod signature;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

/// Turns a function into a tile kernel. See the crate docs of `dsl_core::lang`
/// for the language and `examples/` for a tutorial.
///
/// ```ignore
/// #[kernel]
/// fn vector_add(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
///     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
///     let mask = offs < n;
///     store(out + offs, load(x + offs, mask = mask) + load(y + offs, mask = mask), mask = mask);
/// }
/// ```
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_kernel(attr.into(), item.into()).into()
}

/// Marks a helper callable from kernels; it is inlined into the caller's IR.
/// Parameters of type `Tensor` are runtime values; so are groups of tensors,
/// a parameter marked `#[tensors]` (a struct whose fields are `Tensor`s) or
/// typed as a tuple of `Tensor`s, whose fields read as `s.field` / `t.0`.
/// Others are build-time values.
///
/// ```ignore
/// #[derive(Clone, Copy)]
/// struct Planes { q: Tensor, qs: Tensor }
///
/// #[kernel_fn]
/// fn layer_words(#[tensors] p: Planes, l: Tensor) -> Tensor {
///     p.q + l * p.qs
/// }
/// ```
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_kernel_fn(attr.into(), item.into()).into()
}

/// Parses the item an attribute is on as a function; on a parse error, the
/// expansion is the error followed by the item as written (so the rest of
/// the crate still sees it).
fn parse_fn(item: TokenStream2) -> Result<syn::ItemFn, TokenStream2> {
    syn::parse2(item.clone()).map_err(|e| {
        let err = e.to_compile_error();
        quote::quote!(#err #item)
    })
}

/// The expansion of `#[kernel]`, as a function of token streams.
fn expand_kernel(attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let func = match parse_fn(item) {
        Ok(f) => f,
        Err(out) => return out,
    };
    let mut errors = signature::Errors::default();
    let sig = signature::parse(attr, func, &mut errors);
    generate::kernel(sig, errors)
}

/// The expansion of `#[kernel_fn]`.
fn expand_kernel_fn(attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let func = match parse_fn(item) {
        Ok(f) => f,
        Err(out) => return out,
    };
    if !attr.is_empty() {
        let err = syn::Error::new_spanned(attr, "`#[kernel_fn]` takes no arguments").to_compile_error();
        return quote::quote!(#err #func);
    }
    generate::kernel_fn(func)
}

#[cfg(test)]
mod tests;
