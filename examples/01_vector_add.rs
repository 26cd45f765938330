//! # Tutorial 1: vector addition
//!
//! The smallest useful kernel, and a tour of how tessera works. Run it with
//! `cargo run --release -p tests --example 01_vector_add`.
//!
//! ## The programming model
//!
//! A kernel is written from the point of view of one *program* (a thread block
//! on the GPU). The launch grid says how many programs run; each asks
//! `program_id(0)` which one it is and works on one *tile* of data: here,
//! `BLOCK` consecutive elements. Tiles are values, not threads: `arange(0,
//! BLOCK)` is a whole vector of offsets, `x_ptr + offs` a vector of pointers,
//! and `load` reads them all at once. The compiler decides how the tile is
//! spread over the threads of the program.
//!
//! ## Compile-time and run-time parameters
//!
//! `BLOCK` is a `#[constexpr]`: a plain Rust value while the kernel is built,
//! so tile shapes are known to the compiler. `n` is a runtime `i32`. Each
//! distinct `Config` is one specialization.
//!
//! ## Masks
//!
//! `n` need not be a multiple of `BLOCK`: the last program masks off the
//! lanes past the end, so they neither read nor write memory.

use dsl_core::interp::Cpu;
use dsl_macros::kernel;
use std::marker::PhantomData;

// `out[i] = x[i] + y[i]` for every `i < n`. dsl-macros snapshots what
// `#[kernel]` expands this very kernel into, so its doc line and `pub` are
// part of that snapshot.
/// Adds two vectors.
#[kernel]
pub fn vector_add(x_ptr: Ptr<f32>, y_ptr: Ptr<f32>, out_ptr: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
    // Which block of `BLOCK` elements this program handles.
    let pid = program_id(0);
    let offs = pid * BLOCK + arange(0, BLOCK);
    // Guard the tail: lanes past `n` are masked off.
    let mask = offs < n;
    let x = load(x_ptr + offs, mask = mask);
    let y = load(y_ptr + offs, mask = mask);
    store(out_ptr + offs, x + y, mask = mask);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The kernel's IR, as the compiler sees it. `build` runs the body with
    //    `BLOCK = 1024` and records every op with its source location.
    let config = vector_add::Config::new(1024);
    let ir = vector_add::build(&config)?;
    println!("{}", dsl_core::print::print(&ir));

    // 2. Run it on the CPU interpreter. It executes the same IR the GPU path
    //    compiles, checks every access against its buffer, and reports races
    //    between programs. Sizes are deliberately not a multiple of BLOCK.
    let n = 98_432 + 17;
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() + 1.5).collect();
    let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() - 0.25).collect();
    let mut cpu = Cpu::new();
    let (xp, yp, out) = (cpu.upload(&x), cpu.upload(&y), cpu.zeros::<f32>(n));
    let grid = [n.div_ceil(1024) as u32, 1, 1];
    let args = vector_add::Args { x_ptr: xp, y_ptr: yp, out_ptr: out, n: n as i32, _marker: PhantomData };
    vector_add::interpret(&mut cpu, grid, &config, &args)?;

    // 3. Check against plain Rust.
    let got = cpu.read(out);
    let bad = (0..n).filter(|&i| got[i] != x[i] + y[i]).count();
    println!("vector_add: n = {n}, {} programs, {bad} mismatches", grid[0]);
    if bad != 0 {
        return Err(format!("{bad} elements differ from the reference").into());
    }
    println!("ok: the interpreter agrees with the reference on every element");
    Ok(())
}
