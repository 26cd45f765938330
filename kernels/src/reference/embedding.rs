//! Reference for the Q8_0 embedding gather (see `crate::embedding`): parses the
//! same bytes in plain Rust, computes `d * q` in f64 (exact) and rounds once to
//! the output dtype. Ids outside `[0, vocab)` give rows of zeros.

use crate::embedding::{Q8_0_BLOCK_BYTES, Q8_0_BLOCK_VALUES};
use dsl_core::DType;
use dsl_core::half::f16;

/// Value `c` of row `id` of a Q8_0 table with `hidden` columns, exact.
pub fn q8_0_value(table: &[u8], hidden: usize, id: usize, c: usize) -> f64 {
    let nb = hidden / Q8_0_BLOCK_VALUES;
    let base = (id * nb + c / Q8_0_BLOCK_VALUES) * Q8_0_BLOCK_BYTES;
    let d = f16::from_le_bytes([table[base], table[base + 1]]).to_f64();
    let q = table[base + 2 + c % Q8_0_BLOCK_VALUES] as i8;
    d * q as f64
}

/// `[ids.len(), hidden]` row-major: row `t` is row `ids[t]` of the table,
/// dequantized and rounded to `dtype` (zeros for invalid ids).
pub fn embedding_q8_0(table: &[u8], ids: &[i32], hidden: usize, vocab: usize, dtype: DType) -> Vec<f64> {
    assert_eq!(hidden % Q8_0_BLOCK_VALUES, 0);
    assert_eq!(table.len(), vocab * hidden / Q8_0_BLOCK_VALUES * Q8_0_BLOCK_BYTES);
    let mut out = vec![0.0; ids.len() * hidden];
    for (t, &id) in ids.iter().enumerate() {
        if id < 0 || id as usize >= vocab {
            continue;
        }
        for c in 0..hidden {
            out[t * hidden + c] = dtype.round_float(q8_0_value(table, hidden, id as usize, c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scale_then_quants() {
        // Two rows of one block; row 1: d = 0.5, q = [-128, 3, 0, ...].
        let mut table = vec![0u8; 2 * 34];
        table[34..36].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        table[36] = 0x80;
        table[37] = 3;
        let out = embedding_q8_0(&table, &[1, 7, -1], 32, 2, DType::F32);
        assert_eq!(&out[..3], &[-64.0, 1.5, 0.0]);
        assert!(out[32..].iter().all(|&v| v == 0.0));
    }
}
