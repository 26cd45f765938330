use dsl_macros::kernel;

/// Not a `Constexpr`: no `Debug`, no `PartialEq`, no `name_part`.
#[derive(Clone, Copy)]
enum Mode {
    A,
}

#[kernel(name = "k_{MOD}-x")]
fn k(x: Ptr<f32>, #[constexpr] MODE: Mode, #[constexpr] BLOCK: usize) {
    store(x + arange(0, BLOCK), 1.0);
}

fn main() {}
