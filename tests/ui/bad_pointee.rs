use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<String>) {}

fn main() {}
