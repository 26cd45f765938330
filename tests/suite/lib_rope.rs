//! Kernel library: RoPE + paged KV write on the interpreter against references.
