//! References for RoPE and the paged KV-cache write (see `crate::rope`).
