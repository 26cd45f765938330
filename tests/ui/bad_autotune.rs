use dsl_macros::kernel;

#[kernel(autotune(configs = [(BLOCK = 64, num_warps = 4), (BLOK = 128)], key = [BLOCK]))]
fn k(x: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
    store(x + arange(0, BLOCK), 1.0);
}

fn main() {}
