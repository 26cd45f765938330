use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<i32>) {
    let n = load(x);
    let mut acc = 0;
    for i in static_range(0, n) {
        acc = acc + i;
    }
    store(x, acc);
}

fn main() {}
