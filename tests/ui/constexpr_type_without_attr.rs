use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, BLOCK: usize) {}

fn main() {}
