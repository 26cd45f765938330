use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) {
    let v = load(x);
    let r = &v;
    store(x, v);
}

fn main() {}
