use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) {
    let f = |v| v + 1.0;
    store(x, f(load(x)));
}

fn main() {}
