//! The runtime's error type. Every variant says whether it is a user error, a
//! bug (in tessera or in a kernel's IR), an unsupported request, or the
//! environment (no driver, no GPU, a failing driver call).
//!
//! Invariant: nothing in this crate panics or aborts on a missing driver or
//! GPU; those are [`Error::NoDriver`] and [`Error::NoDevice`].

use cudarc::driver::DriverError;

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Environment: the CUDA driver library (`libcuda.so.1`) could not be loaded,
    /// so no GPU can be used on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// Environment or user error: the driver loaded, but there is no GPU with the
    /// requested ordinal (or the driver could not initialize).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// Environment or bug: a CUDA driver call failed (out of memory, a kernel
    /// fault reported at the next synchronization, an invalid PTX image, ...).
    #[error("CUDA driver call `{call}` failed: {source}")]
    Driver {
        /// The operation that failed, in words.
        call: String,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// User error: the launch is invalid (argument count, kinds or dtypes, a
    /// buffer too large for the kernel's 32-bit offsets, a bad grid).
    #[error("invalid launch of `{kernel}`: {message}")]
    Launch {
        /// Name of the kernel.
        kernel: String,
        /// What is wrong, as a full sentence.
        message: String,
    },
    /// User error or bug: building, verifying or interpreting a kernel failed
    /// (the wrapped error says which).
    #[error(transparent)]
    Dsl(#[from] dsl_core::Error),
    /// Bug or unsupported: the code generator could not compile a kernel.
    #[error("compiling a kernel to PTX failed: {0}")]
    Compile(#[from] codegen::Error),
    /// Unsupported: valid, but not implemented by the runtime (a scalar dtype
    /// outside the kernel ABI, more shared memory than the device offers).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// User error: invalid command-line input (unknown kernel, malformed file).
    #[error("{0}")]
    Usage(String),
    /// User error, unsupported or environment: reading, validating or writing a
    /// GGUF model file failed (the wrapped error says which).
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// User error or unsupported: the model's tokenizer cannot be built (an
    /// unsupported tokenizer model or pre-tokenizer, malformed merges), text
    /// cannot be encoded, or a token id is outside the vocabulary.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// User error: the chat template does not compile or fails to render (the
    /// message includes minijinja's location and reason).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// User error or bug: KV-cache bookkeeping, scheduling or the memory plan
    /// failed (the wrapped error says which).
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    /// User error or environment: a file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A driver-call failure, naming the call.
    pub(crate) fn driver(call: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
        let call = call.into();
        move |source| Error::Driver { call, source }
    }

    /// Converts this error into the `dsl_core` error that [`dsl_core::launch::Backend`]
    /// returns, keeping the kernel name: launch errors stay launch errors, DSL errors
    /// pass through, and the rest become launch errors whose message is this error.
    pub fn into_dsl(self, kernel: &str) -> dsl_core::Error {
        match self {
            Error::Dsl(e) => e,
            Error::Launch { kernel, message } => dsl_core::Error::Launch { kernel, message },
            Error::Unsupported(m) => dsl_core::Error::Unsupported(m),
            other => dsl_core::Error::Launch { kernel: kernel.to_string(), message: other.to_string() },
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
