//! Expansion snapshots: what `#[kernel]` and `#[kernel_fn]` turn four
//! representative kernels into, pretty-printed. A change here is a change in
//! what every kernel author's code compiles to; review it as such.

use quote::quote;

fn pretty(ts: proc_macro2::TokenStream) -> String {
    match syn::parse2::<syn::File>(ts.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(e) => panic!("expansion does not parse as a file: {e}\n{ts}"),
    }
}

/// What `#[kernel_fn]` makes of `helper` and what `#[kernel]` makes of
/// `kernel` (without attribute arguments): a kernel with the helper it calls.
fn expand_helper_and_kernel(
    helper: proc_macro2::TokenStream,
    kernel: proc_macro2::TokenStream,
) -> (proc_macro2::TokenStream, proc_macro2::TokenStream) {
    (crate::expand_kernel_fn(quote!(), helper), crate::expand_kernel(quote!(), kernel))
}

/// The item `#[kernel] fn name` of the Rust file `source`, without its
/// `#[kernel]` attribute: a kernel as the macro receives it.
fn kernel_item(source: &str, name: &str) -> syn::ItemFn {
    let file = syn::parse_file(source).expect("the source parses");
    let mut item = file
        .items
        .into_iter()
        .find_map(|item| match item {
            syn::Item::Fn(f) if f.sig.ident == name => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no fn {name} in the source"));
    item.attrs.retain(|a| !a.path().is_ident("kernel"));
    item
}

/// The first tutorial's kernel, so that what the tutorial shows is what this
/// snapshot pins.
#[test]
fn vector_add_expansion() {
    let item = kernel_item(include_str!("../../examples/01_vector_add.rs"), "vector_add");
    let out = crate::expand_kernel(quote!(), quote!(#item));
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn matmul_expansion_with_loop_and_autotune() {
    let out = crate::expand_kernel(
        quote!(autotune(
            configs =
                [(BM = 32, BN = 32, BK = 16, num_warps = 4), (BM = 64, BN = 64, BK = 32, num_warps = 8)],
            key = [m, n, k]
        )),
        quote! {
            fn matmul<T: Float>(a_ptr: Ptr<T>, b_ptr: Ptr<T>, c_ptr: Ptr<f32>, m: i32, n: i32, k: i32,
                                #[constexpr] BM: usize, #[constexpr] BN: usize, #[constexpr] BK: usize) {
                let rm = program_id(0) * BM + arange(0, BM);
                let rn = program_id(1) * BN + arange(0, BN);
                let mut acc = zeros([BM, BN], f32);
                for k0 in range(0, k, BK) {
                    let ks = k0 + arange(0, BK);
                    let a = load(a_ptr + expand_dims(rm, 1) * k + expand_dims(ks, 0),
                                 mask = expand_dims(rm, 1) < m && expand_dims(ks, 0) < k, other = 0.0);
                    let b = load(b_ptr + expand_dims(ks, 1) * n + expand_dims(rn, 0),
                                 mask = expand_dims(ks, 1) < k && expand_dims(rn, 0) < n, other = 0.0);
                    acc += dot(a, b);
                }
                store(c_ptr + expand_dims(rm, 1) * n + expand_dims(rn, 0), acc,
                      mask = expand_dims(rm, 1) < m && expand_dims(rn, 0) < n);
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn helper_and_runtime_if_while_expansion() {
    let (helper, kernel) = expand_helper_and_kernel(
        quote! {
            fn collatz_step(x: Tensor) -> Tensor {
                if x % 2 == 0 { x / 2 } else { x * 3 + 1 }
            }
        },
        quote! {
            fn collatz(x_ptr: Ptr<i32>, out_ptr: Ptr<i32>, #[constexpr] CHECK: bool) {
                let pid = program_id(0);
                let mut x = load(x_ptr + pid);
                let mut steps = 0;
                while x > 1 {
                    x = collatz_step(x);
                    steps += 1;
                }
                if CHECK {
                    device_assert(steps >= 0, "steps are never negative");
                }
                store(out_ptr + pid, steps);
            }
        },
    );
    insta::assert_snapshot!(pretty(quote!(#helper #kernel)));
}

#[test]
fn persistent_task_loop_expansion_with_orderings() {
    let out = crate::expand_kernel(
        quote!(),
        quote! {
            /// Runs tasks `pid, pid + G, ...`; each waits for its dependencies.
            pub fn tasks(out_ptr: Ptr<f32>, w_ptr: Ptr<f16>, done_ptr: Ptr<i32>, need_ptr: Ptr<i32>, n: i32,
                         #[constexpr] BLOCK: usize) {
                for t in range(program_id(0), n, num_programs(0)) {
                    let offs = arange(0, BLOCK);
                    prefetch_l2(w_ptr + (t + 1) * BLOCK + offs, mask = t + 1 < n);
                    wait_until(done_ptr + t, "ge", load(need_ptr + t), scope = "gpu");
                    let flag = load(done_ptr + n + t, sem = "relaxed");
                    let x = load(w_ptr + t * BLOCK + offs).to(f32);
                    store(out_ptr + t * BLOCK + offs, x + flag);
                    store(done_ptr + n + t, 1, sem = "release", scope = "sys");
                    atomic_add(done_ptr + t + 1, 1, sem = "release");
                }
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

/// Groups of tensors: a struct literal (its build-time field made a tensor)
/// and a tuple bound in a kernel, passed to a helper that takes them as a
/// `#[tensors]` struct and a tuple of `Tensor`s and reads their fields
/// (tensors), next to a build-time struct and its field.
#[test]
fn tensor_group_expansion() {
    let (helper, kernel) = expand_helper_and_kernel(
        quote! {
            fn layer_words(#[tensors] p: Planes, pair: (Tensor, Tensor), l: Tensor, cfg: Cfg) -> Tensor {
                let (a, b) = pair;
                let q = p.q + l * p.qs;
                if cfg.wide { q + a * b } else { q + pair.1 }
            }
        },
        quote! {
            fn words(q_ptr: Ptr<u8>, out_ptr: Ptr<i32>, #[constexpr] WIDE: bool) {
                let l = program_id(0);
                let p = Planes { q: load(ptrcast(q_ptr, i32)), qs: 4 };
                let pair = (l, l + 1);
                let cfg = Cfg { wide: WIDE };
                store(out_ptr + l, layer_words(p, pair, l, cfg));
            }
        },
    );
    insta::assert_snapshot!(pretty(quote!(#helper #kernel)));
}

/// A group is never reassigned, `..base` is refused, and `#[tensors]` marks
/// groups only.
#[test]
fn tensor_group_rules() {
    let (helper, kernel) = expand_helper_and_kernel(
        quote! { fn f(#[tensors] x: Tensor) {} },
        quote! {
            fn groups(x_ptr: Ptr<i32>, n: i32) {
                let g = Pair { a: n, b: 1 };
                let h = Pair { b: 2, ..g };
                g = h;
                store(x_ptr, g.a + g.b);
            }
        },
    );
    let (helper, kernel) = (helper.to_string(), kernel.to_string());
    assert!(kernel.contains("`g` is a group of tensors and cannot be reassigned"), "{kernel}");
    assert!(kernel.contains("struct update syntax (`..base`) is not supported in kernels"), "{kernel}");
    assert!(helper.contains("a `Tensor` parameter is a tensor already"), "{helper}");
}

/// A `let` typed as a struct binds a helper's group (the macro cannot see
/// the call's return type); typed as a scalar or a dtype generic it stays
/// a tensor.
#[test]
fn a_typed_let_binds_a_helpers_group() {
    let (helper, kernel) = expand_helper_and_kernel(
        quote! {
            fn at(#[tensors] p: Planes, l: Tensor) -> Planes {
                Planes { q: p.q + l * p.qs, qs: p.qs }
            }
        },
        quote! {
            fn words<T: Float>(q_ptr: Ptr<i32>, out_ptr: Ptr<i32>) {
                let l = program_id(0);
                let p: Planes = at(Planes { q: load(q_ptr), qs: 4 }, l);
                let x: f32 = p.q.to(f32);
                let y: T = p.q.to(T);
                store(out_ptr + l, p.q + p.qs);
            }
        },
    );
    let (helper, kernel) = (helper.to_string(), kernel.to_string());
    assert!(!helper.contains("compile_error") && !kernel.contains("compile_error"), "{helper}\n{kernel}");
    assert!(kernel.contains("let p : Planes = at"), "{kernel}");
    assert!(kernel.contains("let x : :: dsl_core :: lang :: Tensor"), "{kernel}");
    assert!(kernel.contains("let y : :: dsl_core :: lang :: Tensor"), "{kernel}");
}
