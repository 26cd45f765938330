//! insta snapshots of printed IR for the hand-built reference kernels.

use dsl_core::DType;
use dsl_core::print::print;
use tests::hand;

#[test]
fn vector_add() {
    insta::assert_snapshot!(print(&hand::vector_add(1024).unwrap()));
}

#[test]
fn softmax() {
    insta::assert_snapshot!(print(&hand::softmax(1024, DType::BF16).unwrap()));
}
