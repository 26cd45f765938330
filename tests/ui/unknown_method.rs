use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) {
    let v = load(x);
    store(x, v.softplus());
}

fn main() {}
