use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) {
    println!("hello");
    store(x, 1.0);
}

fn main() {}
