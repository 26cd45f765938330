//! What a kernel is to a backend: the [`Kernel`] trait that `#[kernel]`
//! implements (build a specialization, launch options, declared autotune
//! configs and key) and the [`Backend`] trait that runs kernels (the CPU
//! interpreter here; CUDA in the runtime).
//!
//! Argument passing is typed at the edge (`Args` structs generated per kernel
//! with `B::Ptr<'a, f32>` fields) and erased to [`Arg`]s inside the backend,
//! which validates them against the kernel's parameters before running.

use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{Function, Scalar};
use std::fmt::Debug;

/// Launch options that are not part of the IR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchOptions {
    /// Warps per program (thread block).
    pub num_warps: u32,
    /// Software-pipelining depth of loops feeding `dot`.
    pub num_stages: u32,
    /// Occupancy hint: the compiler keeps registers low enough for this
    /// many programs per SM (`.minnctapersm`, CUDA's `__launch_bounds__`
    /// minimum blocks); 0 leaves the choice to the compiler.
    pub min_programs_per_sm: u32,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions { num_warps: 4, num_stages: 2, min_programs_per_sm: 0 }
    }
}

/// The error of a launch of `f` with `args` arguments, when that is not its
/// parameter count (every backend checks this first): what it takes, with
/// its signature.
pub fn arity_error(f: &Function, args: usize) -> Option<String> {
    let want = f.params.len();
    (args != want).then(|| {
        let sig: Vec<String> = f.params.iter().map(|p| format!("{}: {}", p.name, f.ty(p.value))).collect();
        format!("it takes {want} argument(s) ({}), but {args} were passed", sig.join(", "))
    })
}

/// Rust element types a typed pointer argument may point to.
pub trait PtrElem: 'static {
    /// The dtype, or `None` for [`AnyDType`] (a dtype chosen by a kernel generic).
    const DTYPE: Option<DType>;
}

/// The pointee of a pointer whose dtype is a kernel's dtype generic; checked at launch.
#[derive(Clone, Copy, Debug)]
pub struct AnyDType;

impl PtrElem for AnyDType {
    const DTYPE: Option<DType> = None;
}

macro_rules! ptr_elem {
    ($($t:ty => $d:ident),*) => {$(
        impl PtrElem for $t {
            const DTYPE: Option<DType> = Some(DType::$d);
        }
    )*};
}
ptr_elem!(bool => I1, i8 => I8, u8 => U8, i16 => I16, i32 => I32, u32 => U32, i64 => I64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64, float8::F8E4M3 => F8E4M3,
    float8::F8E5M2 => F8E5M2);

/// A type a `#[constexpr]` kernel parameter can have: the scalars (`usize`,
/// `i32`, `u32`, `i64`, `u64`, `bool`, `f32`) and plain enums of build-time
/// choices, such as a kernel library's quantization format. A value is part
/// of the kernel's `Config`, so it must be copyable, printable (its `Debug`
/// text is part of every cache key of the specialization) and comparable.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[constexpr]` parameter",
    note = "constexprs are usize, i32, u32, i64, u64, bool, f32, or a `Copy + Debug + PartialEq` type that implements `dsl_core::launch::Constexpr`"
)]
pub trait Constexpr: Copy + Debug + PartialEq + 'static {
    /// The value as it appears in a kernel name (`{NAME}` in `#[kernel(name
    /// = "...")]`): a lowercase identifier fragment (`64`, `true`, `q4_1`).
    fn name_part(&self) -> String;
}

macro_rules! constexpr_scalar {
    ($($t:ty),*) => {$(
        impl Constexpr for $t {
            fn name_part(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
constexpr_scalar!(usize, i32, u32, i64, u64, bool, f32);

/// Checks at compile time that `T` can be a constexpr (`#[kernel]` calls it
/// for every constexpr parameter whose type is not a built-in scalar).
pub const fn assert_constexpr<T: Constexpr>() {}

/// One erased launch argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg<P> {
    /// A pointer parameter, as the backend represents it.
    Ptr(P),
    /// A scalar parameter.
    Scalar(Scalar),
}

/// A kernel: what `#[kernel]` generates for each kernel function.
pub trait Kernel {
    /// The kernel's name.
    const NAME: &'static str;
    /// Constexprs and launch options.
    type Config: Clone + Debug + PartialEq;
    /// Typed arguments for backend `B`.
    type Args<'a, B: Backend + 'a>;

    /// Builds the IR of one specialization.
    fn build(config: &Self::Config) -> Result<Function>;
    /// Launch options of a config.
    fn launch_options(config: &Self::Config) -> LaunchOptions;
    /// The declared autotune configs, each applied on top of `base` (which fixes
    /// what the configs leave open, such as dtype generics); empty when the
    /// kernel declares none.
    fn autotune_configs(base: &Self::Config) -> Vec<Self::Config>;
    /// Names of the runtime parameters whose values key autotune results.
    fn autotune_key() -> &'static [&'static str];
    /// Erases typed arguments into launch order.
    fn erase_args<'a, B: Backend + 'a>(args: &Self::Args<'a, B>) -> Vec<Arg<B::Raw<'a>>>;
    /// A stable text key of a config (for caches).
    fn config_key(config: &Self::Config) -> String {
        format!("{config:?}")
    }
}

/// Something that runs kernels.
pub trait Backend {
    /// A typed pointer argument.
    type Ptr<'a, T: PtrElem>: Copy
    where
        Self: 'a;
    /// An erased pointer argument.
    type Raw<'a>: Copy
    where
        Self: 'a;

    /// Erases a typed pointer.
    fn erase<'a, T: PtrElem>(p: Self::Ptr<'a, T>) -> Self::Raw<'a>;

    /// Runs a launch of `K` whose arguments are erased.
    fn launch_erased<'a, K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, Self::Raw<'a>>) -> Result<()>
    where
        Self: 'a;

    /// Runs `K` with `config` over `grid` (programs along x, y, z): erases
    /// `args` and hands them to [`Backend::launch_erased`].
    fn launch<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: Sized + 'a,
    {
        self.launch_erased::<K>(ErasedLaunch { config, grid, args: K::erase_args(args) })
    }
}

/// A launch of `K` as a backend runs it: the config, the grid (programs
/// along x, y, z) and the arguments erased to `Arg<P>`s, in launch order.
pub struct ErasedLaunch<'c, K: Kernel, P> {
    /// The config the specialization is built for.
    pub config: &'c K::Config,
    /// Programs along x, y, z.
    pub grid: [u32; 3],
    /// The arguments, in launch order.
    pub args: Vec<Arg<P>>,
}

/// A backend whose buffers live in host memory and whose pointers are
/// [`BufferPtr`]s (the interpreter's `Cpu`, the native `codegen::host::Host`,
/// the runtime's graph-recording `Emu`). Implementing it implements
/// [`Backend`], with pointers erased to (buffer index, element offset) pairs.
pub trait BufferBackend {
    /// Runs a launch of `K` (see [`Backend::launch_erased`]).
    fn launch_buffers<K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, (usize, usize)>) -> Result<()>;
}

impl<B: BufferBackend + 'static> Backend for B {
    type Ptr<'a, T: PtrElem> = BufferPtr<T>;
    type Raw<'a> = (usize, usize);

    fn erase<'a, T: PtrElem>(p: Self::Ptr<'a, T>) -> Self::Raw<'a> {
        p.raw()
    }

    fn launch_erased<'a, K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, (usize, usize)>) -> Result<()>
    where
        Self: 'a,
    {
        self.launch_buffers(launch)
    }
}

/// Values kept per kernel and config key ([`Kernel::config_key`]): what a
/// backend builds or prepares once per config, such as the built IR.
pub struct PerConfig<V>(rustc_hash::FxHashMap<(&'static str, String), V>);

impl<V> Default for PerConfig<V> {
    fn default() -> Self {
        PerConfig(Default::default())
    }
}

impl<V> PerConfig<V> {
    /// Whether there is a value for `K` with `config`.
    pub fn contains<K: Kernel>(&self, config: &K::Config) -> bool {
        self.0.contains_key(&(K::NAME, K::config_key(config)))
    }

    /// The value for `K` with `config`, made by `make` (and kept) when there
    /// is none yet.
    pub fn get_or_try_insert<K: Kernel, E>(
        &mut self,
        config: &K::Config,
        make: impl FnOnce() -> Result<V, E>,
    ) -> Result<&mut V, E> {
        Ok(match self.0.entry((K::NAME, K::config_key(config))) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(make()?),
        })
    }
}

/// The divisibility the launcher promises when an argument allows it.
pub const SPECIALIZE_DIVISIBILITY: u32 = 16;

/// Triton-style specialization of a kernel to its arguments: a pointer
/// parameter whose address is a multiple of 16 bytes, or an integer parameter
/// whose value is a multiple of 16, gets `divisibility = 16` in its
/// [`crate::ir::ParamHints`], so codegen can prove 16-byte vector accesses and
/// uniform masks. `facts[i]` is the address (pointers) or the value (integers) of
/// argument `i`, `None` for other parameters. Returns the specialized function
/// and a bit mask of the specialized parameters (part of any compile-cache key;
/// the printed IR also shows the hints). The interpreter checks these promises
/// at launch, so a wrong specialization cannot go unnoticed there.
pub fn specialize(f: &Function, facts: &[Option<u64>]) -> (Function, u64) {
    let mut g = f.clone();
    let mut mask = 0u64;
    for (i, (p, fact)) in g.params.iter_mut().zip(facts).enumerate() {
        let ty = &f.values[p.value].ty;
        let eligible = ty.is_ptr() || (ty.is_int() && !ty.is_bool());
        if let Some(v) = fact
            && eligible
            && v % u64::from(SPECIALIZE_DIVISIBILITY) == 0
            && p.hints.divisibility.is_none()
        {
            p.hints.divisibility = Some(SPECIALIZE_DIVISIBILITY);
            if i < 64 {
                mask |= 1 << i;
            }
        }
    }
    (g, mask)
}

/// A typed pointer into a buffer of a backend whose buffers live in host
/// memory (the interpreter's `Cpu`, the native `codegen::host::Host`): the
/// buffer's index and an offset in elements of the buffer's dtype.
pub struct BufferPtr<T> {
    buffer: usize,
    offset: usize,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for BufferPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for BufferPtr<T> {}

impl<T> std::fmt::Debug for BufferPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferPtr(buffer {}, +{})", self.buffer, self.offset)
    }
}

impl<T> BufferPtr<T> {
    /// The start of buffer `buffer`.
    pub fn start(buffer: usize) -> BufferPtr<T> {
        BufferPtr { buffer, offset: 0, _t: std::marker::PhantomData }
    }

    /// The buffer's index.
    pub fn buffer(self) -> usize {
        self.buffer
    }

    /// The (buffer, element offset) pair a launch passes on.
    pub fn raw(self) -> (usize, usize) {
        (self.buffer, self.offset)
    }

    /// The pointer `n` elements (of the buffer's dtype) further.
    pub fn offset(self, n: usize) -> BufferPtr<T> {
        BufferPtr { buffer: self.buffer, offset: self.offset + n, _t: std::marker::PhantomData }
    }

    /// The same address viewed as another element type (as `ptrcast` does).
    pub fn cast<U>(self) -> BufferPtr<U> {
        BufferPtr { buffer: self.buffer, offset: self.offset, _t: std::marker::PhantomData }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::kernel;
    use crate::lang::*;

    #[test]
    fn specialization_marks_aligned_pointers_and_multiples_of_16() {
        let f = kernel("k", || {
            let x = param_ptr("x", DType::F32);
            let n = param_scalar("n", DType::I32);
            let _m = param_scalar("m", DType::I32);
            let _s = param_scalar("s", DType::F32);
            store(x + arange(0, 16), 1.0, Some(arange(0, 16).lt(n)));
        });
        let (g, mask) = specialize(&f, &[Some(4096), Some(48), Some(50), Some(16)]);
        assert_eq!(mask, 0b011);
        let hints: Vec<Option<u32>> = g.params.iter().map(|p| p.hints.divisibility).collect();
        assert_eq!(hints, vec![Some(16), Some(16), None, None]);
        assert!(crate::print::print(&g).contains("%x: ptr<f32> {divisibility = 16}"));
    }
}
