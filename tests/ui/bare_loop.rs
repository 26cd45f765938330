use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>) {
    loop {
        store(x, 1.0);
    }
}

fn main() {}
