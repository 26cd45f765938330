//! Reference for the FP8 KV cache ([`crate::kv_cache`]): the bytes a writer
//! stores for given f32 values, and the values a reader forms from them.

use crate::kv_cache::{cache_bytes, code_offset, scale_offset};
use dsl_core::DType;
use dsl_core::dtype::{f8_bits, f8_value};

/// The scale `2^(E - 7)` of a head whose largest magnitude is `amax`
/// (`2^E <= amax < 2^(E+1)`; below the smallest normal f32, `2^-126`'s
/// exponent), as [`crate::kv_cache::kv8_scale`] forms it from the bits.
pub fn head_scale(amax: f32) -> f32 {
    let e = (((amax.to_bits() >> 23) & 255) as i32 - 7).max(1);
    f32::from_bits((e as u32) << 23)
}

/// The E4M3 codes and the scale of one head's values `x` (f32).
pub fn quantize_head(x: &[f32]) -> (Vec<u8>, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = head_scale(amax);
    let inv = f32::from_bits((254 - ((s.to_bits() >> 23) as i32)) as u32 * (1 << 23));
    (x.iter().map(|&v| f8_bits(DType::F8E4M3, v * inv)).collect(), s)
}

/// An FP8 cache of `slots` slots of `h_kv` heads of `head_dim` holding
/// `values` (`[slots, h_kv, head_dim]` f32, the 16-bit cache's layout),
/// byte for byte as the writers store it (padding zero).
pub fn fp8_cache(values: &[f32], slots: usize, h_kv: usize, head_dim: usize) -> Vec<u8> {
    let mut out = vec![0u8; cache_bytes(slots, h_kv, head_dim)];
    for slot in 0..slots {
        for h in 0..h_kv {
            let at = (slot * h_kv + h) * head_dim;
            let (codes, s) = quantize_head(&values[at..at + head_dim]);
            let c = code_offset(slot, h, h_kv, head_dim);
            out[c..c + head_dim].copy_from_slice(&codes);
            let sc = scale_offset(slot, h, h_kv, head_dim);
            out[sc..sc + 4].copy_from_slice(&s.to_le_bytes());
        }
    }
    out
}

/// The byte ranges of slot `slot` in an FP8 cache: its values (all heads,
/// contiguous) and each head's scale.
pub fn slot_ranges(slot: usize, h_kv: usize, head_dim: usize) -> Vec<std::ops::Range<usize>> {
    let c = code_offset(slot, 0, h_kv, head_dim);
    let scales = (0..h_kv).map(|h| scale_offset(slot, h, h_kv, head_dim)).map(|s| s..s + 4);
    std::iter::once(c..c + h_kv * head_dim).chain(scales).collect()
}

/// The values a reader forms from an FP8 cache (`[slots, h_kv, head_dim]`,
/// code times its head's scale; exact in f32 and bf16).
pub fn fp8_values(cache: &[u8], slots: usize, h_kv: usize, head_dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(slots * h_kv * head_dim);
    for slot in 0..slots {
        for h in 0..h_kv {
            let sc = scale_offset(slot, h, h_kv, head_dim);
            let s = f32::from_le_bytes(cache[sc..sc + 4].try_into().expect("four bytes"));
            let c = code_offset(slot, h, h_kv, head_dim);
            for d in 0..head_dim {
                out.push(f8_value(DType::F8E4M3, cache[c + d]) * s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KV8_GROUP, group_bytes, slot_bytes};

    /// Every byte of a cache belongs to at most one slot's value or scale,
    /// the groups are whole lines, SmolLM2's head rows start on a line,
    /// and a group's scales of one head are one 32-byte sector.
    #[test]
    fn slots_tile_the_cache_without_overlap() {
        for (h_kv, d) in [(8usize, 128usize), (3, 64), (1, 4), (5, 36), (32, 128)] {
            let slots = 3 * KV8_GROUP + 5;
            let mut owner = vec![usize::MAX; cache_bytes(slots, h_kv, d)];
            for slot in 0..slots {
                for r in slot_ranges(slot, h_kv, d) {
                    for b in r {
                        assert_eq!(owner[b], usize::MAX, "h_kv {h_kv} d {d}: byte {b} twice");
                        owner[b] = slot;
                    }
                }
            }
            assert_eq!(group_bytes(h_kv, d) % 128, 0);
            assert!(slot_bytes(h_kv, d) * KV8_GROUP >= KV8_GROUP * h_kv * (d + 4));
            assert!(slot_bytes(h_kv, d) <= (h_kv * (d + 4)).div_ceil(16) * 16, "no larger than whole slots");
            for slot in 0..slots {
                let first = scale_offset(slot - slot % KV8_GROUP, h_kv - 1, h_kv, d);
                assert_eq!(first / 32, (first + 4 * (KV8_GROUP - 1)) / 32, "one sector of scales");
            }
        }
        for slot in 0..40 {
            for h in 0..8 {
                assert_eq!(code_offset(slot, h, 8, 128) % 128, 0);
            }
        }
    }
}
