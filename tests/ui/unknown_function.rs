use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) {
    store(x, expp(load(x)));
}

fn main() {}
