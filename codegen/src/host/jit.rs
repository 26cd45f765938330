//! Loading compiled host objects into this process: one LLVM ORC `LLJIT`
//! for the whole process links relocatable objects (the compile output,
//! fresh or from the disk cache) and returns the address of their entry
//! function.
//!
//! Why ORC with objects rather than an execution engine over IR: the object
//! is the unit the disk cache stores, so a cached kernel costs a link (about
//! a millisecond) instead of LLVM's optimizer and code generator; LLJIT
//! applies the relocations of every architecture LLVM supports and resolves
//! the objects' external symbols: the C math library of the process (the
//! very functions the interpreter's `f64::exp` and friends call, so both
//! compute the same values) and the helpers registered here.
//!
//! Invariants: the `LLJIT` lives as long as the process (objects are never
//! unloaded, so entry addresses stay valid); an object is added once per
//! entry symbol (later requests return the first address); every `unsafe`
//! call below is an LLVM-C call on handles this module created and owns.

use crate::{Error, Result};
use inkwell::llvm_sys;
use llvm_sys::error::{LLVMErrorRef, LLVMGetErrorMessage};
use llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcCreateLLJITBuilder, LLVMOrcLLJITAddObjectFile, LLVMOrcLLJITGetGlobalPrefix,
    LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITMangleAndIntern, LLVMOrcLLJITRef,
};
use llvm_sys::orc2::{
    LLVMJITEvaluatedSymbol, LLVMJITSymbolFlags, LLVMJITSymbolGenericFlags, LLVMOrcAbsoluteSymbols,
    LLVMOrcCSymbolMapPair, LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess, LLVMOrcJITDylibAddGenerator,
    LLVMOrcJITDylibDefine,
};
use rustc_hash::FxHashMap;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, OnceLock};

/// The error function of the interpreter, for kernels that call `erf`:
/// the same function, so both backends compute the same values.
extern "C" fn tessera_erf(x: f64) -> f64 {
    dsl_core::interp::erf(x)
}

/// Helper symbols the lowering may call, by name.
pub(crate) const ERF_SYMBOL: &str = "tessera_erf";

/// The process-wide JIT.
pub(crate) struct Jit {
    lljit: LLVMOrcLLJITRef,
    /// Entry addresses by symbol (an object is linked once).
    loaded: Mutex<FxHashMap<String, usize>>,
}

// SAFETY: an LLJIT is internally synchronized (ORC's execution session
// serializes linking and lookups); this wrapper additionally adds objects
// under `loaded`'s lock, and the handle is never freed.
unsafe impl Send for Jit {}
// SAFETY: as above.
unsafe impl Sync for Jit {}

/// Turns an LLVM error into ours (and frees it); `None` for success.
fn check(err: LLVMErrorRef, what: &str) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: `err` is a live error LLVM returned; `LLVMGetErrorMessage`
    // consumes it and returns a string we free with the matching call.
    let msg = unsafe {
        let m = LLVMGetErrorMessage(err);
        let s = CStr::from_ptr(m).to_string_lossy().into_owned();
        llvm_sys::error::LLVMDisposeErrorMessage(m);
        s
    };
    Err(Error::Llvm(format!("{what}: {msg}")))
}

impl Jit {
    /// The process's JIT, created on first use.
    pub(crate) fn global() -> Result<&'static Jit> {
        static JIT: OnceLock<std::result::Result<Jit, String>> = OnceLock::new();
        JIT.get_or_init(|| Jit::create().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::Llvm(e.clone()))
    }

    fn create() -> Result<Jit> {
        super::target::HostTarget::native();
        let mut lljit: LLVMOrcLLJITRef = std::ptr::null_mut();
        // SAFETY: the builder is consumed by `LLVMOrcCreateLLJIT`; on success
        // `lljit` holds a live JIT that this process never frees.
        check(
            unsafe { LLVMOrcCreateLLJIT(&mut lljit, LLVMOrcCreateLLJITBuilder()) },
            "creating the host JIT",
        )?;
        // SAFETY: `lljit` is live; the generator and the materialization
        // unit are handed over to the main dylib, which owns them after.
        unsafe {
            let jd = LLVMOrcLLJITGetMainJITDylib(lljit);
            let mut generator = std::ptr::null_mut();
            let prefix = LLVMOrcLLJITGetGlobalPrefix(lljit);
            check(
                LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                    &mut generator,
                    prefix,
                    None,
                    std::ptr::null_mut(),
                ),
                "resolving the process's symbols",
            )?;
            LLVMOrcJITDylibAddGenerator(jd, generator);
            let name = CString::new(ERF_SYMBOL).map_err(|e| Error::Llvm(e.to_string()))?;
            let mut pairs = [LLVMOrcCSymbolMapPair {
                Name: LLVMOrcLLJITMangleAndIntern(lljit, name.as_ptr()),
                Sym: LLVMJITEvaluatedSymbol {
                    Address: tessera_erf as *const () as usize as u64,
                    Flags: LLVMJITSymbolFlags {
                        GenericFlags: LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsExported as u8
                            | LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsCallable as u8,
                        TargetFlags: 0,
                    },
                },
            }];
            let mu = LLVMOrcAbsoluteSymbols(pairs.as_mut_ptr(), pairs.len());
            check(LLVMOrcJITDylibDefine(jd, mu), "registering the host helpers")?;
        }
        Ok(Jit { lljit, loaded: Mutex::new(FxHashMap::default()) })
    }

    /// Links `object` (a relocatable object for this host) unless `symbol`
    /// is already loaded, and returns `symbol`'s address.
    pub(crate) fn load(&self, symbol: &str, object: &[u8]) -> Result<usize> {
        let mut loaded =
            self.loaded.lock().map_err(|_| Error::Llvm("the host JIT lock is poisoned".into()))?;
        if let Some(&addr) = loaded.get(symbol) {
            return Ok(addr);
        }
        let name = CString::new(symbol).map_err(|e| Error::Llvm(e.to_string()))?;
        let buf_name = CString::new("tessera-host-object").map_err(|e| Error::Llvm(e.to_string()))?;
        let mut addr: u64 = 0;
        // SAFETY: the memory buffer copies `object`; `LLVMOrcLLJITAddObjectFile`
        // takes ownership of it (also on failure); the lookup writes the
        // symbol's address into `addr`.
        unsafe {
            let buf = llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy(
                object.as_ptr().cast(),
                object.len(),
                buf_name.as_ptr(),
            );
            let jd = LLVMOrcLLJITGetMainJITDylib(self.lljit);
            check(LLVMOrcLLJITAddObjectFile(self.lljit, jd, buf), "linking a host object")?;
            check(LLVMOrcLLJITLookup(self.lljit, &mut addr, name.as_ptr()), "finding a host kernel")?;
        }
        let addr = usize::try_from(addr).map_err(|_| Error::Llvm("host kernel address overflows".into()))?;
        if addr == 0 {
            return Err(Error::Llvm(format!("host kernel `{symbol}` has a null address")));
        }
        loaded.insert(symbol.to_string(), addr);
        Ok(addr)
    }
}
