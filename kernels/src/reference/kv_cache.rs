//! Reference for the FP8 KV cache ([`crate::kv_cache`]): the bytes a writer
//! stores for given f32 values, and the values a reader forms from them.

use crate::kv_cache::slot_bytes;
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
    let sb = slot_bytes(h_kv, head_dim);
    let mut out = vec![0u8; slots * sb];
    for slot in 0..slots {
        for h in 0..h_kv {
            let at = (slot * h_kv + h) * head_dim;
            let (codes, s) = quantize_head(&values[at..at + head_dim]);
            let base = slot * sb;
            out[base + h * head_dim..base + (h + 1) * head_dim].copy_from_slice(&codes);
            let sc = base + h_kv * head_dim + 4 * h;
            out[sc..sc + 4].copy_from_slice(&s.to_le_bytes());
        }
    }
    out
}

/// The values a reader forms from an FP8 cache (`[slots, h_kv, head_dim]`,
/// code times its head's scale; exact in f32 and bf16).
pub fn fp8_values(cache: &[u8], slots: usize, h_kv: usize, head_dim: usize) -> Vec<f32> {
    let sb = slot_bytes(h_kv, head_dim);
    let mut out = Vec::with_capacity(slots * h_kv * head_dim);
    for slot in 0..slots {
        let base = slot * sb;
        for h in 0..h_kv {
            let sc = base + h_kv * head_dim + 4 * h;
            let s = f32::from_le_bytes(cache[sc..sc + 4].try_into().expect("four bytes"));
            for d in 0..head_dim {
                out.push(f8_value(DType::F8E4M3, cache[base + h * head_dim + d]) * s);
            }
        }
    }
    out
}
