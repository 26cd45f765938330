//! Target-independent passes: canonicalization (constant folding, DCE, CSE)
//! and the axis analysis codegen uses to vectorize and coalesce accesses.
