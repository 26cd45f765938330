use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, #[constexpr] BLOCK: usize) {
    let v = load(x + arange(0, BLOCK));
    store(x, v[0]);
}

fn main() {}
