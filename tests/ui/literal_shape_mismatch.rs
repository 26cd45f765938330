use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, y: Ptr<f32>) {
    let a = load(x + arange(0, 64));
    let b = load(y + arange(0, 32));
    let c = a + b;
    let m = zeros([16, 32], f32);
    let n = zeros([16, 16], f32);
    let p = dot(m, n);
    let q = reshape(m, [8, 8]);
    store(x + arange(0, 64), c);
}

fn main() {}
