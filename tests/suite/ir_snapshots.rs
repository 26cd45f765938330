//! insta snapshots of printed IR for the hand-built reference kernels, raw (as
//! built) and after canonicalization where that is interesting.

use dsl_core::DType;
use dsl_core::print::print;
use tests::hand;

/// Each hand-built kernel's IR, one snapshot per kernel, named by the row.
#[test]
fn hand_built_kernels() {
    let kernels = [
        ("vector_add", hand::vector_add(1024)),
        ("softmax", hand::softmax(1024, DType::BF16)),
        ("matmul", hand::matmul(32, 32, 16, DType::F16)),
        ("argmax_rows", hand::argmax_rows(256)),
        ("cumsum_rows", hand::cumsum_rows(256)),
        ("collatz_if_while", hand::collatz()),
        ("histogram_atomics", hand::histogram(128)),
        ("layer_norm", hand::layer_norm(512)),
    ];
    for (name, f) in kernels {
        insta::assert_snapshot!(name, print(&f.unwrap()));
    }
}
