//! Add+RMSNorm and RMSNorm (filled by the kernel-library work).
