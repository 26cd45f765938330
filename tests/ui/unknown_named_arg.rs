use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK);
    let v = load(x + offs, mask = offs < 4, fill = 0.0);
    store(x + offs, v);
}

fn main() {}
