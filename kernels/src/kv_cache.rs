//! The FP8 KV cache (`KV8`): one OCP E4M3 byte per cached element and one
//! power-of-two f32 scale per (slot, KV head), read back exactly.
//!
//! # Layout
//!
//! A KV8 cache (K and V each) is an array of slots, `slot = block *
//! block_size + offset` as in the 16-bit cache, stored in groups of
//! [`KV8_GROUP`] consecutive slots, each group [`group_bytes`] long: the
//! group's slots' `h_kv * head_dim` E4M3 values one slot after another
//! (head-major within a slot, `h * head_dim + d`), then the group's f32
//! scales head-major (`h * KV8_GROUP + slot % KV8_GROUP`), padded to a
//! multiple of 128 bytes. So every group starts on a 128-byte line, a
//! head's values (`head_dim` bytes) start on a line whenever `h_kv *
//! head_dim` and `head_dim` are multiples of 128 (SmolLM2's and Llama's
//! heads), and one head's scales of a whole group are one 32-byte sector:
//! a reader of one head fetches only that head's bytes, never a
//! neighbour's. Addresses need no block size: the element `(slot, h, d)`
//! is byte `(slot / 8) * group_bytes + (slot % 8) * h_kv * head_dim + h *
//! head_dim + d` ([`kv8_slot`]), its scale the f32 at byte `(slot / 8) *
//! group_bytes + 8 * h_kv * head_dim + 4 * (8 h + slot % 8)`
//! ([`kv8_scale_index`]); [`code_offset`] and [`scale_offset`] are the
//! host's forms. A cache of `n` slots takes [`cache_bytes`] bytes.
//!
//! # Arithmetic
//!
//! A writer takes the f32 values of a slot's head that a 16-bit writer
//! would round to the activation dtype `T` (the rotated key, the value
//! with its bias), finds the largest magnitude `a` and its binary exponent
//! `E` (`2^E <= a < 2^(E+1)`), and
//! stores `s = 2^(E - 7)` and `q = e4m3(x / s)` (round to nearest even;
//! `|x / s| < 256`, inside E4M3's range, so nothing saturates). The scale
//! is a power of two, so `q * s` is exact in f32 and in bf16: a reader that
//! forms `T(q * s)` sees exactly the values a 16-bit cache holding them
//! would, and every attention kernel (prefill, decode, the persistent
//! step) computes from the same values (the fast decode's f16 products
//! only within the range `crate::decode_attention` states, and near them
//! outside it). The batch-invariance guarantee and
//! the agreement of the decode paths carry over unchanged; only the cached
//! values differ from the 16-bit cache's (each by at most half an E4M3
//! unit in the last place of its head's scale: 2^-4 of `a`'s binade for
//! the values near `a`, absolute `2^(E-17)` for the smallest).

use dsl_core::DType;
use dsl_macros::kernel_fn;

/// Slots per group of a KV8 cache (see the module doc). The kernels'
/// [`kv8_slot`] and [`kv8_scale_index`] split a slot with a shift by 3 and
/// a mask of 7.
pub const KV8_GROUP: usize = 8;
const _: () = assert!(KV8_GROUP == 8, "kv8_slot and kv8_scale_index shift by 3 and mask with 7");

/// Bytes of one group of [`KV8_GROUP`] slots of a KV8 cache with `h_kv`
/// heads of `head_dim`: the values, the f32 scales, and padding to 128
/// bytes (see the module doc).
pub const fn group_bytes(h_kv: usize, head_dim: usize) -> usize {
    (KV8_GROUP * h_kv * (head_dim + 4)).div_ceil(128) * 128
}

/// Bytes per slot of a KV8 cache with `h_kv` heads of `head_dim`: a
/// group's bytes over its slots (a multiple of 16; a cache of `n` slots
/// takes [`cache_bytes`]).
pub const fn slot_bytes(h_kv: usize, head_dim: usize) -> usize {
    group_bytes(h_kv, head_dim) / KV8_GROUP
}

/// Bytes of a KV8 cache of `slots` slots (whole groups).
pub const fn cache_bytes(slots: usize, h_kv: usize, head_dim: usize) -> usize {
    slots.div_ceil(KV8_GROUP) * group_bytes(h_kv, head_dim)
}

/// The byte offset of head `h`'s first value in slot `slot` of a KV8
/// cache (the host's [`kv8_slot`] plus the head's row).
pub const fn code_offset(slot: usize, h: usize, h_kv: usize, head_dim: usize) -> usize {
    (slot / KV8_GROUP) * group_bytes(h_kv, head_dim) + (slot % KV8_GROUP * h_kv + h) * head_dim
}

/// The byte offset of head `h`'s f32 scale in slot `slot` of a KV8 cache
/// (the host's [`kv8_scale_index`], in bytes).
pub const fn scale_offset(slot: usize, h: usize, h_kv: usize, head_dim: usize) -> usize {
    (slot / KV8_GROUP) * group_bytes(h_kv, head_dim)
        + KV8_GROUP * h_kv * head_dim
        + 4 * (h * KV8_GROUP + slot % KV8_GROUP)
}

/// The scale `s = 2^(E - 7)` and its reciprocal of rows whose largest
/// magnitude is `amax` (f32, `2^E <= amax < 2^(E+1)`; zero and subnormal
/// rows take the smallest normal exponent): see the module doc.
#[kernel_fn]
pub fn kv8_scale(amax: Tensor) -> (Tensor, Tensor) {
    let e = maximum((amax.bitcast(i32) >> 23 & 255) - 7, 1);
    ((e << 23).bitcast(f32), ((254 - e) << 23).bitcast(f32))
}

/// The E4M3 value of `x` (f32) at the reciprocal scale `inv` (broadcast
/// against `x`).
#[kernel_fn]
pub fn kv8_quantize(x: Tensor, inv: Tensor) -> Tensor {
    (x * inv).to(f8e4m3)
}

/// The byte offset of the values of the slots `slot` (i32, not negative)
/// in a KV8 cache of `h_kv` heads of `head_dim` (see the module doc).
#[kernel_fn]
pub fn kv8_slot(slot: Tensor, h_kv: usize, head_dim: usize) -> Tensor {
    // `group_bytes` spelled out (the kernel macro takes `as` on build-time
    // arithmetic, not on calls); `KV8_GROUP` is 8: a shift and a mask.
    (slot >> 3) * ((KV8_GROUP * h_kv * (head_dim + 4)).div_ceil(128) * 128) as i32
        + (slot & 7) * (h_kv * head_dim) as i32
}

/// The f32 index of head `h`'s scale in the slots `slot` (i32, not
/// negative) of a KV8 cache (see the module doc).
#[kernel_fn]
pub fn kv8_scale_index(slot: Tensor, h: Tensor, h_kv: usize, head_dim: usize) -> Tensor {
    (slot >> 3) * ((KV8_GROUP * h_kv * (head_dim + 4)).div_ceil(128) * 32) as i32
        + (KV8_GROUP * h_kv * head_dim / 4) as i32
        + h * KV8_GROUP as i32
        + (slot & 7)
}

/// Cached values of a KV8 cache (`cache`, any pointer type) in `dt`: the
/// elements `col = h * head_dim + d` of the slots `slot` times the scales
/// of head `h` of their slots, where `ok` (zero elsewhere). Exact: see the
/// module doc.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv8_load(
    cache: Tensor,
    slot: Tensor,
    col: Tensor,
    h: Tensor,
    ok: Tensor,
    h_kv: usize,
    head_dim: usize,
    dt: DType,
) -> Tensor {
    let at = kv8_slot(slot, h_kv, head_dim);
    let q = load(ptrcast(cache, f8e4m3) + at + col, mask = ok, other = 0.0).to(f32);
    let s = load(ptrcast(cache, f32) + kv8_scale_index(slot, h, h_kv, head_dim), mask = ok, other = 0.0);
    (q * s).to(dt)
}

/// A masked load of cached values: with `kv8` [`kv8_load`] of the slots
/// `slot`; otherwise the 16-bit cache's elements at offsets `kv` (zero
/// where not `ok`).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv_load(
    cache: Tensor,
    kv: Tensor,
    slot: Tensor,
    col: Tensor,
    h: Tensor,
    ok: Tensor,
    kv8: bool,
    h_kv: usize,
    head_dim: usize,
    dt: DType,
) -> Tensor {
    if kv8 {
        kv8_load(cache, slot, col, h, ok, h_kv, head_dim, dt)
    } else {
        load(cache + kv, mask = ok, other = 0.0)
    }
}

/// A whole tile (no mask) of cached values: with `kv8` [`kv8_tile`] of the
/// slots `slot`; otherwise the 16-bit cache's elements at offsets `kv`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv_tile(
    cache: Tensor,
    kv: Tensor,
    slot: Tensor,
    col: Tensor,
    h: Tensor,
    kv8: bool,
    h_kv: usize,
    head_dim: usize,
    dt: DType,
) -> Tensor {
    if kv8 { kv8_tile(cache, slot, col, h, h_kv, head_dim, dt) } else { load(cache + kv) }
}

/// [`kv8_load`] of whole tiles (no mask) of the slots `slot` (a tile
/// broadcast against `col`).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv8_tile(
    cache: Tensor,
    slot: Tensor,
    col: Tensor,
    h: Tensor,
    h_kv: usize,
    head_dim: usize,
    dt: DType,
) -> Tensor {
    let at = kv8_slot(slot, h_kv, head_dim);
    let q = load(ptrcast(cache, f8e4m3) + at + col).to(f32);
    let s = load(ptrcast(cache, f32) + kv8_scale_index(slot, h, h_kv, head_dim));
    (q * s).to(dt)
}

/// [`kv8_load`] in f16 arithmetic: each code widened to f16 (one `cvt`
/// per pair) times its scale in f16, exact while the scale lies in
/// `[2^-15, 2^7]` (the values' binade in `[2^-8, 2^15)`), the range
/// where every E4M3 code times the scale is an f16 number (below it the
/// products round to f16's subnormals, above it they overflow); zero where
/// not `ok` (with `masked`; otherwise every element is loaded).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv8_load16(
    cache: Tensor,
    slot: Tensor,
    col: Tensor,
    h: Tensor,
    ok: Tensor,
    masked: bool,
    h_kv: usize,
    head_dim: usize,
) -> Tensor {
    let at = kv8_slot(slot, h_kv, head_dim);
    let codes = ptrcast(cache, f8e4m3) + at + col;
    let scales = ptrcast(cache, f32) + kv8_scale_index(slot, h, h_kv, head_dim);
    if masked {
        load(codes, mask = ok, other = 0.0).to(f16) * load(scales, mask = ok, other = 0.0).to(f16)
    } else {
        load(codes).to(f16) * load(scales).to(f16)
    }
}

/// `x` (`[rows, n]` f32) in f16 for a product whose result is scaled back:
/// each row times the power of two `2^(14 - E)` (`2^E` the binade of the
/// row's largest magnitude, so it lands in `[2^14, 2^15)`, inside f16's
/// range), and those rows' `2^(E - 14)` (`[rows]` f32) to multiply the
/// product's rows by. Every element of a 16-bit (bf16) row whose magnitude
/// is at least `2^-31` of the row's largest is exact in f16 after the
/// scaling (f16 holds 8 significant bits down to `2^-17`); the exponent is
/// clamped so both factors are normal f32 numbers.
#[kernel_fn]
pub fn f16_rows(x: Tensor) -> (Tensor, Tensor) {
    let e = maximum((max(abs(x), 1).bitcast(i32) >> 23) & 255, 15);
    let up = ((268 - e) << 23).bitcast(f32);
    ((x * expand_dims(up, 1)).to(f16), ((e - 14) << 23).bitcast(f32))
}

/// Writes rows of values to a KV8 cache (`cache`, any pointer type): row
/// `r` of `x` (`[rows, head_dim]` f32) is head `h[r]` of slot `slot` (not
/// negative, the same slot for every row); nothing is written unless `ok`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv8_store(
    cache: Tensor,
    slot: Tensor,
    h: Tensor,
    x: Tensor,
    ok: Tensor,
    h_kv: usize,
    head_dim: usize,
) {
    let at = kv8_slot(slot, h_kv, head_dim);
    let (s, inv) = kv8_scale(max(abs(x), 1));
    let col = expand_dims(h * head_dim as i32, 1) + expand_dims(arange(0, head_dim), 0);
    store(ptrcast(cache, f8e4m3) + at + col, kv8_quantize(x, expand_dims(inv, 1)), mask = ok);
    store(ptrcast(cache, f32) + kv8_scale_index(slot, h, h_kv, head_dim), s, mask = ok);
}

/// [`kv8_store`] of rows given as RoPE's pairs: element `first[j]` of row
/// `r` is `a[r, j]` and element `first[j] + step` is `b[r, j]` (`a`, `b`:
/// `[rows, head_dim / 2]` f32; `first`: `[1, head_dim / 2]` columns within
/// a head; adjacent pairs `first = 2 j`, `step = 1`; NEOX `first = j`,
/// `step = head_dim / 2`; `slot` as in [`kv8_store`]).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv8_store_pairs(
    cache: Tensor,
    slot: Tensor,
    h: Tensor,
    a: Tensor,
    b: Tensor,
    first: Tensor,
    step: usize,
    ok: Tensor,
    h_kv: usize,
    head_dim: usize,
) {
    let at = kv8_slot(slot, h_kv, head_dim);
    let (s, inv) = kv8_scale(maximum(max(abs(a), 1), max(abs(b), 1)));
    let inv2 = expand_dims(inv, 1);
    let dst = ptrcast(cache, f8e4m3) + at + expand_dims(h * head_dim as i32, 1) + first;
    store(dst, kv8_quantize(a, inv2), mask = ok);
    store(dst + step as i32, kv8_quantize(b, inv2), mask = ok);
    store(ptrcast(cache, f32) + kv8_scale_index(slot, h, h_kv, head_dim), s, mask = ok);
}

/// The cache write of a token (slot `slot`, nothing unless `ok`) to KV8
/// caches: K given as RoPE's rotated pairs `(a, b)` at columns `first` and
/// `first + step` ([`kv8_store_pairs`]), V as whole rows `v` (f32), heads
/// `h` (`[rows]`).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn kv8_write(
    k_cache: Tensor,
    v_cache: Tensor,
    slot: Tensor,
    h: Tensor,
    a: Tensor,
    b: Tensor,
    v: Tensor,
    first: Tensor,
    step: usize,
    ok: Tensor,
    h_kv: usize,
    head_dim: usize,
) {
    let slot = where_(ok, slot, 0);
    kv8_store_pairs(k_cache, slot, h, a, b, first, step, ok, h_kv, head_dim);
    kv8_store(v_cache, slot, h, v, ok, h_kv, head_dim);
}
