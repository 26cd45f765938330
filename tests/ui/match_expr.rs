use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, #[constexpr] MODE: i32) {
    let v = match MODE {
        0 => 1.0,
        _ => 2.0,
    };
    store(x, v);
}

fn main() {}
