use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, n: i32) {
    if program_id(0) >= n {
        return;
    }
    store(x + program_id(0), 1.0);
}

fn main() {}
