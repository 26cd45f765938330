//! References for RMSNorm and add+RMSNorm (see `crate::rmsnorm`).
