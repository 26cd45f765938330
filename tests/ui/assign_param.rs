use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, n: i32) {
    n = 3;
    store(x, 1.0);
}

fn main() {}
