use dsl_macros::kernel;

#[kernel]
fn k(x: Ptr<f32>, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK);
    let a = load(x + offs, eviction_policy = "evict_sometimes");
    let b = load(x + offs, mask = offs < 4, other = 0.0, cache_modifier = "cg");
    store(x + offs, a + b);
}

fn main() {}
