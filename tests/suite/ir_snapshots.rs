//! insta snapshots of printed IR for the hand-built reference kernels, raw (as
//! built) and after canonicalization where that is interesting.

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

#[test]
fn matmul() {
    insta::assert_snapshot!(print(&hand::matmul(32, 32, 16, DType::F16).unwrap()));
}

#[test]
fn argmax_rows() {
    insta::assert_snapshot!(print(&hand::argmax_rows(256).unwrap()));
}

#[test]
fn cumsum_rows() {
    insta::assert_snapshot!(print(&hand::cumsum_rows(256).unwrap()));
}

#[test]
fn collatz_if_while() {
    insta::assert_snapshot!(print(&hand::collatz().unwrap()));
}

#[test]
fn histogram_atomics() {
    insta::assert_snapshot!(print(&hand::histogram(128).unwrap()));
}

#[test]
fn layer_norm() {
    insta::assert_snapshot!(print(&hand::layer_norm(512).unwrap()));
}
