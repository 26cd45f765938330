use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) -> f32 {
    1.0
}

fn main() {}
