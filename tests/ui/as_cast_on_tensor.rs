use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, y: Ptr<i32>) {
    let v = load(x);
    store(y, v as i32);
}

fn main() {}
