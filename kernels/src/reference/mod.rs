//! Plain references for the kernel library, in f64 (one module per kernel
//! family). Tests compare every kernel against these on random inputs.

pub mod attention;
pub mod embedding;
pub mod fp8;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod sampling;
pub mod scan;
pub mod softmax;
