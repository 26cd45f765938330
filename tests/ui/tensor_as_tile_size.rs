use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<i32>) {
    let n = load(x);
    store(x + arange(0, n), 1);
}

fn main() {}
