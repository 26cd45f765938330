use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<i32>) {
    let mut i = load(x);
    while i > 0 {
        i = i - 1;
        break;
    }
    store(x, i);
}

fn main() {}
