//! NVPTX code generation for the tile IR. It depends on `dsl-core` and never on cudarc.
//!
//! Empty until the codegen issue lands: layouts, lowering and PTX emission go here.
