use dsl_macros::kernel;

#[kernel]
fn k(x: &f32, n: i32) {}

fn main() {}
