//! Launch validation and parameter packing, as pure functions of a kernel's IR,
//! the erased arguments and the grid, so every rule is unit-tested without a GPU.
//!
//! Launch rules (a violation is a user error, reported before anything runs):
//! - one argument per kernel parameter, in IR order; pointer parameters take
//!   pointers, scalar parameters scalars of exactly their dtype;
//! - a `ptr<T>` parameter takes a pointer whose recorded dtype is `T`, or `u8`
//!   (raw bytes, e.g. packed GGUF blocks), or is unknown (a pointer viewed as
//!   [`dsl_core::launch::AnyDType`] keeps its buffer's dtype, so this is rare);
//!   its address must be aligned to `T`, and to the parameter's `divisibility`
//!   hint when it has one (integer scalars must be multiples of theirs);
//! - the 32-bit offset rule, see [`OffsetRule`];
//! - grid: each dimension at most the device limit (x also at most `i32::MAX`,
//!   since `program_id` is `i32`). A grid with a zero dimension runs nothing,
//!   exactly as the CPU interpreter and Triton's launcher do (the driver itself
//!   would reject it, so it never reaches the driver).
//!
//! Kernel ABI (shared with `codegen`): pointers are `u64` device addresses;
//! `i32`, `u32`, `i64` and `f32` scalars are passed as themselves and `i1` as an
//! `i32` (0 or 1). Other scalar dtypes are unsupported.

use dsl_core::dtype::Elem;
use dsl_core::ir::ops::ArithOp;
use dsl_core::launch::Arg;
use dsl_core::{DType, Function, Op, Scalar};

/// An erased device pointer: what the launcher needs to validate an argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDevPtr {
    /// The device address.
    pub addr: u64,
    /// Bytes from `addr` to the end of the allocation it points into.
    pub bytes: u64,
    /// The dtype of the elements it points to, when known.
    pub dtype: Option<DType>,
}

/// One kernel parameter, packed as the kernel ABI passes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelParam {
    /// A pointer: a 64-bit device address.
    Ptr(u64),
    /// A 32-bit signed integer (also `i1`, as 0 or 1).
    I32(i32),
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 64-bit signed integer.
    I64(i64),
    /// A single-precision float.
    F32(f32),
}

impl KernelParam {
    /// The parameter's bytes in an 8-byte slot (native byte order, value first):
    /// the driver reads the parameter's size from the slot's address.
    pub fn slot(self) -> u64 {
        let mut b = [0u8; 8];
        match self {
            KernelParam::Ptr(v) => b.copy_from_slice(&v.to_ne_bytes()),
            KernelParam::I64(v) => b.copy_from_slice(&v.to_ne_bytes()),
            KernelParam::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            KernelParam::U32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            KernelParam::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        }
        u64::from_ne_bytes(b)
    }
}

/// The 32-bit offset rule of a kernel.
///
/// `addptr p, off` moves `p` by `off` elements of its pointee; the code
/// generator sign-extends (or zero-extends, for `u32`) the offset and scales it
/// in 64-bit arithmetic, so the byte offset itself cannot overflow. What can
/// overflow is the element index the kernel computes in its offset dtype. So:
/// when any `addptr` of the kernel takes an offset narrower than 64 bits, every
/// pointer argument may span at most 2^31 elements (2^32 when every such offset
/// is `u32`) of the smallest pointee those `addptr`s move, so that every
/// in-bounds element index fits the offset dtype. Kernels whose offsets are all
/// `i64` take buffers of any size. (Counting bytes instead of elements would
/// reject a 2 GiB f32 copy that i32 offsets address perfectly well.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetRule {
    /// The most elements a pointer argument may span, or `None` without limit.
    pub max_elements: Option<u64>,
    /// The element size, in bytes, the limit counts in.
    pub elem_bytes: u64,
    /// The narrow offset dtype that sets the limit (for messages).
    pub offset_dtype: Option<DType>,
}

impl OffsetRule {
    /// Derives the rule from the `addptr`s of `f`.
    pub fn of(f: &Function) -> OffsetRule {
        let mut rule = OffsetRule { max_elements: None, elem_bytes: u64::MAX, offset_dtype: None };
        f.walk(|i| {
            let inst = &f.insts[i];
            if inst.op != Op::Arith(ArithOp::AddPtr) || inst.args.len() != 2 {
                return;
            }
            let off = f.ty(inst.args[1]).dtype();
            if off.bits() >= 64 {
                return;
            }
            let limit = if off == DType::U32 { 1u64 << 32 } else { 1u64 << 31 };
            if rule.max_elements.is_none_or(|m| limit < m) {
                rule.max_elements = Some(limit);
                rule.offset_dtype = Some(off);
            }
            let pointee = f.ty(inst.args[0]).dtype().size_bytes() as u64;
            rule.elem_bytes = rule.elem_bytes.min(pointee);
        });
        if rule.max_elements.is_none() {
            rule.elem_bytes = 1;
        }
        rule
    }

    /// Checks a pointer spanning `bytes`; the message names the problem.
    pub fn check(&self, bytes: u64) -> Result<(), String> {
        let (Some(max), Some(off)) = (self.max_elements, self.offset_dtype) else {
            return Ok(());
        };
        let elems = bytes / self.elem_bytes.max(1);
        if elems > max {
            return Err(format!(
                "it spans {elems} elements of {} byte(s), but the kernel indexes with {off} offsets, \
                 which reach at most {max} elements; split the buffer or build the kernel with i64 offsets",
                self.elem_bytes
            ));
        }
        Ok(())
    }
}

/// Validates `args` against the parameters of `f` (whose offset rule is `rule`,
/// from [`OffsetRule::of`]) and packs them in launch order.
///
/// Errors are full sentences naming the offending argument (the caller adds the
/// kernel name).
pub fn validate_args(
    f: &Function,
    rule: &OffsetRule,
    args: &[Arg<RawDevPtr>],
) -> Result<Vec<KernelParam>, String> {
    let mut out = vec![KernelParam::I32(0); args.len()];
    let n = validate_args_into(f, rule, args, &mut out)?;
    out.truncate(n);
    Ok(out)
}

/// [`validate_args`] without allocating: packs into `out` (which must have
/// room for one parameter per argument) and returns the count. Messages are
/// only formatted on failure, so a valid launch allocates nothing.
pub fn validate_args_into(
    f: &Function,
    rule: &OffsetRule,
    args: &[Arg<RawDevPtr>],
    out: &mut [KernelParam],
) -> Result<usize, String> {
    if args.len() != f.params.len() {
        let sig: Vec<String> = f.params.iter().map(|p| format!("{}: {}", p.name, f.ty(p.value))).collect();
        return Err(format!(
            "it takes {} argument(s) ({}), but {} were passed",
            f.params.len(),
            sig.join(", "),
            args.len()
        ));
    }
    if out.len() < args.len() {
        return Err(format!("it takes {} arguments; the launcher packs at most {}", args.len(), out.len()));
    }
    for (j, (p, arg)) in f.params.iter().zip(args).enumerate() {
        let ty = f.ty(p.value);
        let what = || format!("argument {j} (`{}`: {ty})", p.name);
        let div = p.hints.divisibility.map(u64::from).filter(|&d| d > 1);
        if !ty.is_scalar() {
            return Err(format!("{} is a tile; kernel parameters must be scalars or pointers", what()));
        }
        out[j] = match (ty.elem, arg) {
            (Elem::Ptr(pointee), Arg::Ptr(raw)) => {
                if let Some(d) = raw.dtype
                    && d != pointee
                    && d != DType::U8
                {
                    return Err(format!(
                        "{} points to {pointee}, but a pointer to {d} was passed (pass a {pointee} \
                         buffer, or a u8 buffer of raw bytes)",
                        what()
                    ));
                }
                let align = pointee.size_bytes() as u64;
                if raw.addr % align != 0 {
                    return Err(format!(
                        "{} has address {:#x}, which is not aligned to {pointee} ({align} bytes)",
                        what(),
                        raw.addr
                    ));
                }
                if let Some(d) = div
                    && raw.addr % d != 0
                {
                    return Err(format!(
                        "{} has address {:#x}, but the kernel was specialized for addresses divisible by {d}",
                        what(),
                        raw.addr
                    ));
                }
                rule.check(raw.bytes).map_err(|m| format!("{}: {m}", what()))?;
                KernelParam::Ptr(raw.addr)
            }
            (Elem::Scalar(d), Arg::Scalar(s)) => {
                if s.dtype() != d {
                    return Err(format!("{} needs a {d} scalar, but a {} was passed", what(), s.dtype()));
                }
                if let Some(k) = div
                    && d.is_int()
                    && s.as_i64().rem_euclid(k as i64) != 0
                {
                    return Err(format!(
                        "{} is {}, but the kernel was specialized for values divisible by {k}",
                        what(),
                        s.as_i64()
                    ));
                }
                pack_scalar(*s).ok_or_else(|| {
                    format!(
                        "{}: {d} scalar parameters are not part of the kernel ABI (use i32, u32, i64, f32 or i1)",
                        what()
                    )
                })?
            }
            (Elem::Ptr(_), Arg::Scalar(_)) => {
                return Err(format!("{} is a pointer, but a scalar was passed", what()));
            }
            (Elem::Scalar(_), Arg::Ptr(_)) => {
                return Err(format!("{} is a scalar, but a pointer was passed", what()));
            }
        };
    }
    Ok(args.len())
}

/// Packs a scalar per the kernel ABI, or `None` for a dtype outside it.
pub fn pack_scalar(s: Scalar) -> Option<KernelParam> {
    Some(match s.dtype() {
        DType::I1 => KernelParam::I32((s.as_i64() != 0) as i32),
        DType::I32 => KernelParam::I32(s.as_i64() as i32),
        DType::U32 => KernelParam::U32(s.as_i64() as u32),
        DType::I64 => KernelParam::I64(s.as_i64()),
        DType::F32 => KernelParam::F32(s.as_f64() as f32),
        _ => return None,
    })
}

/// The largest grid a device accepts, per axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridLimits {
    /// Maximum programs along x, y and z.
    pub max: [u32; 3],
}

impl Default for GridLimits {
    /// The limits of every GPU since compute capability 3.0.
    fn default() -> Self {
        GridLimits { max: [i32::MAX as u32, 65535, 65535] }
    }
}

/// Validates `grid`: `Ok(true)` when it runs programs, `Ok(false)` when a
/// dimension is zero (nothing runs), `Err` when a dimension is too large.
pub fn validate_grid(grid: [u32; 3], limits: GridLimits) -> Result<bool, String> {
    for (axis, (&g, &max)) in grid.iter().zip(&limits.max).enumerate() {
        let max = if axis == 0 { max.min(i32::MAX as u32) } else { max };
        if g > max {
            let name = ["x", "y", "z"][axis];
            return Err(format!(
                "grid dimension {axis} ({name}) is {g}, but the device allows at most {max}"
            ));
        }
    }
    Ok(grid.iter().all(|&g| g > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsl_core::ir::ParamHints;
    use dsl_macros::kernel;

    /// `out[i] = x[i]` with `i32` offsets.
    #[kernel]
    fn copy32(x: Ptr<f32>, out: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
        let offs = program_id(0) * BLOCK + arange(0, BLOCK);
        let mask = offs < n;
        store(out + offs, load(x + offs, mask = mask), mask = mask);
    }

    /// `out[i] = x[i]` with `i64` offsets.
    #[kernel]
    fn copy64(x: Ptr<f32>, out: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
        let offs = (program_id(0) * BLOCK + arange(0, BLOCK)).to(i64);
        let mask = offs < n.to(i64);
        store(out + offs, load(x + offs, mask = mask), mask = mask);
    }

    fn copy_kernel(wide: bool) -> Function {
        let f = if wide {
            copy64::build(&copy64::Config::new(128))
        } else {
            copy32::build(&copy32::Config::new(128))
        };
        f.expect("the test kernel builds")
    }

    fn check(f: &Function, args: &[Arg<RawDevPtr>]) -> Result<Vec<KernelParam>, String> {
        validate_args(f, &OffsetRule::of(f), args)
    }

    fn ptr(addr: u64, bytes: u64, dtype: Option<DType>) -> Arg<RawDevPtr> {
        Arg::Ptr(RawDevPtr { addr, bytes, dtype })
    }

    fn good_args() -> Vec<Arg<RawDevPtr>> {
        vec![
            ptr(0x1000, 4096, Some(DType::F32)),
            ptr(0x2000, 4096, Some(DType::F32)),
            Arg::Scalar(Scalar::int(DType::I32, 1024)),
        ]
    }

    /// `check`'s error on [`good_args`] with argument `i` replaced by `arg`.
    fn error_with(f: &Function, i: usize, arg: Arg<RawDevPtr>) -> String {
        let mut a = good_args();
        a[i] = arg;
        check(f, &a).unwrap_err()
    }

    #[test]
    fn packs_valid_arguments_in_order() {
        let f = copy_kernel(false);
        let p = check(&f, &good_args()).unwrap();
        assert_eq!(p, vec![KernelParam::Ptr(0x1000), KernelParam::Ptr(0x2000), KernelParam::I32(1024)]);
    }

    #[test]
    fn rejects_wrong_count_kind_and_dtype() {
        let f = copy_kernel(false);
        let mut a = good_args();
        a.pop();
        assert!(check(&f, &a).unwrap_err().contains("takes 3 argument(s)"));

        assert!(error_with(&f, 2, ptr(0x3000, 4, Some(DType::I32))).contains("is a scalar, but a pointer"));
        assert!(
            error_with(&f, 0, Arg::Scalar(Scalar::int(DType::I32, 0))).contains("is a pointer, but a scalar")
        );
        let e = error_with(&f, 2, Arg::Scalar(Scalar::int(DType::I64, 1024)));
        assert!(e.contains("needs a i32 scalar, but a i64"));
        let e = error_with(&f, 1, ptr(0x2000, 4096, Some(DType::BF16)));
        assert!(e.contains("points to f32, but a pointer to bf16"));
    }

    #[test]
    fn raw_bytes_and_unknown_dtypes_are_accepted() {
        let f = copy_kernel(false);
        let mut a = good_args();
        a[0] = ptr(0x1000, 4096, Some(DType::U8));
        a[1] = ptr(0x2000, 4096, None);
        assert!(check(&f, &a).is_ok());
    }

    #[test]
    fn rejects_misaligned_pointers_and_broken_hints() {
        let f = copy_kernel(false);
        assert!(error_with(&f, 0, ptr(0x1002, 4096, Some(DType::F32))).contains("not aligned to f32"));

        let mut f = copy_kernel(false);
        f.params[0].hints = ParamHints { divisibility: Some(16) };
        f.params[2].hints = ParamHints { divisibility: Some(8) };
        assert!(error_with(&f, 0, ptr(0x1004, 4096, Some(DType::F32))).contains("addresses divisible by 16"));
        assert!(
            error_with(&f, 2, Arg::Scalar(Scalar::int(DType::I32, 12))).contains("values divisible by 8")
        );
    }

    #[test]
    fn offset_rule_counts_elements_of_the_pointee() {
        let f = copy_kernel(false);
        let rule = OffsetRule::of(&f);
        assert_eq!(rule.max_elements, Some(1 << 31));
        assert_eq!(rule.elem_bytes, 4);
        // 2^29 f32 (2 GiB) is fine with i32 offsets; 2^31 + 1 elements are not.
        let mut a = good_args();
        a[0] = ptr(0x1000, 4 << 29, Some(DType::F32));
        assert!(check(&f, &a).is_ok());
        a[0] = ptr(0x1000, 4 * ((1 << 31) + 1), Some(DType::F32));
        let e = check(&f, &a).unwrap_err();
        assert!(e.contains("i32 offsets"), "{e}");
        // The same buffer is fine when the kernel indexes with i64.
        let f = copy_kernel(true);
        assert_eq!(OffsetRule::of(&f).max_elements, None);
        assert!(check(&f, &a).is_ok());
    }

    #[test]
    fn packing_into_a_slice_matches_and_checks_room() {
        let f = copy_kernel(false);
        let mut out = [KernelParam::I32(0); 4];
        let n = validate_args_into(&f, &OffsetRule::of(&f), &good_args(), &mut out).unwrap();
        assert_eq!(&out[..n], check(&f, &good_args()).unwrap().as_slice());
        let mut small = [KernelParam::I32(0); 2];
        let e = validate_args_into(&f, &OffsetRule::of(&f), &good_args(), &mut small).unwrap_err();
        assert!(e.contains("at most 2"), "{e}");
    }

    #[test]
    fn scalars_follow_the_abi() {
        assert_eq!(pack_scalar(Scalar::bool(true)), Some(KernelParam::I32(1)));
        assert_eq!(pack_scalar(Scalar::int(DType::U32, -1)), Some(KernelParam::U32(u32::MAX)));
        assert_eq!(pack_scalar(Scalar::float(DType::F32, 1.5)), Some(KernelParam::F32(1.5)));
        assert_eq!(pack_scalar(Scalar::float(DType::F64, 1.5)), None);
        assert_eq!(KernelParam::I32(-1).slot().to_ne_bytes()[..4], (-1i32).to_ne_bytes());
        assert_eq!(KernelParam::F32(2.0).slot().to_ne_bytes()[..4], 2.0f32.to_ne_bytes());
        assert_eq!(KernelParam::Ptr(0xdead_beef_0000).slot(), 0xdead_beef_0000);
    }

    #[test]
    fn grid_limits() {
        let l = GridLimits::default();
        assert_eq!(validate_grid([1, 1, 1], l), Ok(true));
        assert_eq!(validate_grid([0, 5, 1], l), Ok(false));
        assert_eq!(validate_grid([i32::MAX as u32, 65535, 65535], l), Ok(true));
        assert!(validate_grid([1 << 31, 1, 1], l).unwrap_err().contains("dimension 0 (x)"));
        assert!(validate_grid([1, 65536, 1], l).unwrap_err().contains("dimension 1 (y)"));
        let small = GridLimits { max: [10, 10, 10] };
        assert!(validate_grid([1, 1, 11], small).unwrap_err().contains("at most 10"));
    }
}
