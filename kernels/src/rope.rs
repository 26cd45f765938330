//! RoPE and the paged KV-cache write (filled by the kernel-library work).
