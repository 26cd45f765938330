//! Macro diagnostics: every unsupported construct gives a spanned error that
//! says what is allowed. The `.stderr` files under `tests/ui/` pin the exact
//! messages and the token each one points at.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}
