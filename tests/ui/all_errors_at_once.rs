use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, #[constexpr] BLOCK: usize) {
    let v = load(x + arange(0, BLOCK));
    let w = v[1];
    let f = |a| a;
    unsafe {
        store(x, w);
    }
}

fn main() {}
