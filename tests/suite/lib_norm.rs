//! Kernel library: add+RMSNorm and RMSNorm on the interpreter against references.
