//! Host-side repacking of GGUF block-quantized weights into the planar layout
//! the dequant kernels read (plain safe Rust, run once at model load).
//!
//! The repacked tensor stays quantized: the quant bytes are copied unchanged
//! (same nibble order), only the per-block scales (and mins) move out of the
//! blocks into their own plane, so that the quant rows are contiguous,
//! 16-byte aligned and read with wide coalesced loads. See the parent module
//! for the layout contract; [`Repacked`] documents the planes.
//!
//! Invariants: a [`Repacked`] always satisfies `k % 32 == 0`, `n >= 1`,
//! plane sizes matching `(format, n, k)`, and every byte offset the kernels
//! form (`n * k` quant bytes at most) below `2^31`. Inputs that would break
//! them are rejected with a [`RepackError`], never a panic.

use dsl_core::half::f16;

/// Values per block in every supported format.
pub const BLOCK_VALUES: usize = 32;

/// A GGUF block format the dequant kernels support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// `Q4_0`: f16 `d`, 16 bytes of nibbles; `x = d * (q - 8)`. 18 bytes per block.
    Q4_0,
    /// `Q4_1`: f16 `d`, f16 `m`, 16 bytes of nibbles; `x = d * q + m`. 20 bytes per block.
    Q4_1,
    /// `Q8_0`: f16 `d`, 32 signed bytes; `x = d * q`. 34 bytes per block.
    Q8_0,
}

impl QuantFormat {
    /// Bytes of one GGUF block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q8_0 => 34,
        }
    }

    /// Quant bytes per block (16 for the 4-bit formats, 32 for Q8_0).
    pub fn quant_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => 16,
            QuantFormat::Q8_0 => 32,
        }
    }

    /// f16 values per block in the scale plane (2 for Q4_1: `d`, `m`).
    pub fn scales_per_block(self) -> usize {
        match self {
            QuantFormat::Q4_1 => 2,
            QuantFormat::Q4_0 | QuantFormat::Q8_0 => 1,
        }
    }

    /// The GGUF name (`Q4_0`, `Q4_1`, `Q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q8_0 => "Q8_0",
        }
    }

    /// Whether the quants are nibbles (two weights per byte, the low nibble
    /// of byte `j` of a block weight `j`, the high one weight `j + 16`):
    /// Q4_0 and Q4_1. Otherwise each byte is one weight (Q8_0).
    pub const fn is_q4(self) -> bool {
        matches!(self, QuantFormat::Q4_0 | QuantFormat::Q4_1)
    }

    /// Whether a block has a min besides its scale (`w = d q + m`; the scale
    /// plane holds `(d, m)` pairs, which the kernels read as one 32-bit
    /// word): Q4_1.
    pub const fn has_min(self) -> bool {
        matches!(self, QuantFormat::Q4_1)
    }

    /// Weights per quant byte (2 for the nibble formats, 1 for Q8_0): a K
    /// tile of `b` quant bytes per weight row is `b * values_per_byte()`
    /// weights wide.
    pub const fn values_per_byte(self) -> usize {
        if self.is_q4() { 2 } else { 1 }
    }

    /// The K tile (in weights) that holds `bytes` quant bytes of a weight
    /// row: autotune configs size tiles in bytes, so that one config holds
    /// the same data in every format.
    pub const fn k_tile(self, bytes: usize) -> usize {
        bytes * self.values_per_byte()
    }
}

/// The format is a kernel constexpr (`#[constexpr] QUANT: QuantFormat`):
/// each format is its own specialization, named with its lowercase GGUF name
/// (`gemv_q4_1`).
impl dsl_core::launch::Constexpr for QuantFormat {
    fn name_part(&self) -> String {
        self.name().to_ascii_lowercase()
    }
}

/// Why a weight cannot be repacked. All variants are user errors (a tensor
/// whose shape or size does not fit the format or the kernels' limits).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RepackError {
    /// `n` or `k` is zero.
    #[error("{format} weight of shape [{n}, {k}] is empty")]
    Empty {
        /// The format.
        format: &'static str,
        /// Rows.
        n: usize,
        /// Columns.
        k: usize,
    },
    /// `k` is not a multiple of the 32-value block.
    #[error("{format} weight has k = {k} columns, not a multiple of 32 (the block size)")]
    RaggedK {
        /// The format.
        format: &'static str,
        /// Columns.
        k: usize,
    },
    /// The byte length does not match `[n, k]` in this format (GGUF bytes,
    /// or the planes of a repacked weight).
    #[error("{format} weight of shape [{n}, {k}] needs {expected} bytes, got {got}")]
    Size {
        /// The format.
        format: &'static str,
        /// Rows.
        n: usize,
        /// Columns.
        k: usize,
        /// The bytes the shape needs.
        expected: usize,
        /// The given length.
        got: usize,
    },
    /// The kernels' 32-bit offsets cannot address this tensor.
    #[error("{format} weight of shape [{n}, {k}] is too large for 32-bit offsets (n * k must be < 2^31)")]
    TooLarge {
        /// The format.
        format: &'static str,
        /// Rows.
        n: usize,
        /// Columns.
        k: usize,
    },
    /// Gate and up weights to interleave differ in format or shape.
    #[error("cannot interleave {gate} and {up}: gate and up must have the same format and shape")]
    Mismatch {
        /// The gate weight, in words.
        gate: String,
        /// The up weight, in words.
        up: String,
    },
}

/// A weight `W[n, k]` repacked for the dequant kernels: planes of quants and
/// scales, each row-major over `n` rows.
///
/// - `quants`: `n * k / 2` bytes (Q4) or `n * k` bytes (Q8_0). Row `r`
///   starts at byte `r * quant_row_bytes()`; block `b` of the row at
///   `b * 16` (Q4) or `b * 32` (Q8_0) within it, holding the GGUF block's
///   quant bytes unchanged: Q4 byte `j` has weight `32 b + j` in its low
///   nibble and weight `32 b + j + 16` in its high nibble; Q8_0 byte `j` is
///   weight `32 b + j` as a signed byte.
/// - `scales`: f16, `n * (k / 32) * scales_per_block()` values. Block `b` of
///   row `r` is entry `r * (k / 32) + b`: `d` for Q4_0/Q8_0, the pair `(d,
///   m)` (two consecutive f16, `d` first) for Q4_1.
#[derive(Clone, Debug, PartialEq)]
pub struct Repacked {
    /// The block format.
    pub format: QuantFormat,
    /// Rows (output features).
    pub n: usize,
    /// Columns (input features), a multiple of 32.
    pub k: usize,
    /// The quant plane (see the type docs).
    pub quants: Vec<u8>,
    /// The scale plane (see the type docs).
    pub scales: Vec<f16>,
}

impl Repacked {
    /// Bytes of one row of the quant plane.
    pub fn quant_row_bytes(&self) -> usize {
        self.k / BLOCK_VALUES * self.format.quant_bytes()
    }

    /// Blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.k / BLOCK_VALUES
    }

    /// Bytes the kernels read for the whole weight (quants plus scales).
    pub fn bytes(&self) -> usize {
        self.quants.len() + 2 * self.scales.len()
    }

    /// The weight as a short description (`Q4_1 [1536, 576]`).
    pub fn describe(&self) -> String {
        format!("{} [{}, {}]", self.format.name(), self.n, self.k)
    }

    /// Checks the invariants (the fields are public, so a value built by
    /// hand may break them): shape as [`repack`] requires, plane sizes
    /// matching the shape.
    pub fn validate(&self) -> Result<(), RepackError> {
        let (n, k) = (self.n, self.k);
        check_shape(self.format, n, k)?;
        let name = self.format.name();
        let blocks = n * (k / BLOCK_VALUES);
        let (q, s) = (blocks * self.format.quant_bytes(), blocks * self.format.scales_per_block());
        if self.quants.len() != q || self.scales.len() != s {
            let (expected, got) = (q + 2 * s, self.quants.len() + 2 * self.scales.len());
            return Err(RepackError::Size { format: name, n, k, expected, got });
        }
        Ok(())
    }
}

/// Checks that `[n, k]` is a shape the kernels take in `format`: not empty,
/// whole blocks along K, 32-bit offsets.
fn check_shape(format: QuantFormat, n: usize, k: usize) -> Result<(), RepackError> {
    let name = format.name();
    if n == 0 || k == 0 {
        return Err(RepackError::Empty { format: name, n, k });
    }
    if !k.is_multiple_of(BLOCK_VALUES) {
        return Err(RepackError::RaggedK { format: name, k });
    }
    if n.checked_mul(k).is_none_or(|nk| nk >= 1 << 31) {
        return Err(RepackError::TooLarge { format: name, n, k });
    }
    Ok(())
}

/// Checks `raw` against `[n, k]` in `format`.
fn validate(format: QuantFormat, raw: &[u8], n: usize, k: usize) -> Result<(), RepackError> {
    check_shape(format, n, k)?;
    let expected = n * (k / BLOCK_VALUES) * format.block_bytes();
    if raw.len() != expected {
        return Err(RepackError::Size { format: format.name(), n, k, expected, got: raw.len() });
    }
    Ok(())
}

/// Repacks the GGUF bytes `raw` of a weight `[n, k]` in `format` (rows of
/// `k / 32` blocks, as GGUF stores a tensor whose innermost dimension is
/// `k`). See [`Repacked`] for the result's layout.
pub fn repack(format: QuantFormat, raw: &[u8], n: usize, k: usize) -> Result<Repacked, RepackError> {
    validate(format, raw, n, k)?;
    let blocks = n * (k / BLOCK_VALUES);
    let (bb, qb, spb) = (format.block_bytes(), format.quant_bytes(), format.scales_per_block());
    let mut quants = Vec::with_capacity(blocks * qb);
    let mut scales = Vec::with_capacity(blocks * spb);
    for block in raw.chunks_exact(bb) {
        for s in 0..spb {
            scales.push(f16::from_le_bytes([block[2 * s], block[2 * s + 1]]));
        }
        quants.extend_from_slice(&block[2 * spb..]);
    }
    Ok(Repacked { format, n, k, quants, scales })
}

/// [`repack`] of a Q4_0 weight.
pub fn repack_q4_0(raw: &[u8], n: usize, k: usize) -> Result<Repacked, RepackError> {
    repack(QuantFormat::Q4_0, raw, n, k)
}

/// [`repack`] of a Q4_1 weight.
pub fn repack_q4_1(raw: &[u8], n: usize, k: usize) -> Result<Repacked, RepackError> {
    repack(QuantFormat::Q4_1, raw, n, k)
}

/// [`repack`] of a Q8_0 weight.
pub fn repack_q8_0(raw: &[u8], n: usize, k: usize) -> Result<Repacked, RepackError> {
    repack(QuantFormat::Q8_0, raw, n, k)
}

/// Interleaves the rows of a gate and an up weight (same format and shape
/// `[n, k]`) into one `[2n, k]` weight for the fused SiLU-mul kernels: row
/// `2i` is gate row `i`, row `2i + 1` is up row `i`.
pub fn interleave_gate_up(gate: &Repacked, up: &Repacked) -> Result<Repacked, RepackError> {
    gate.validate()?;
    up.validate()?;
    if gate.format != up.format || gate.n != up.n || gate.k != up.k {
        return Err(RepackError::Mismatch { gate: gate.describe(), up: up.describe() });
    }
    let n2 = gate.n.checked_mul(2).filter(|n2| n2.checked_mul(gate.k).is_some_and(|nk| nk < 1 << 31));
    let Some(n2) = n2 else {
        return Err(RepackError::TooLarge { format: gate.format.name(), n: 2 * gate.n, k: gate.k });
    };
    let qr = gate.quant_row_bytes();
    let sr = gate.blocks_per_row() * gate.format.scales_per_block();
    let mut quants = Vec::with_capacity(2 * gate.quants.len());
    let mut scales = Vec::with_capacity(2 * gate.scales.len());
    for i in 0..gate.n {
        quants.extend_from_slice(&gate.quants[i * qr..(i + 1) * qr]);
        quants.extend_from_slice(&up.quants[i * qr..(i + 1) * qr]);
        scales.extend_from_slice(&gate.scales[i * sr..(i + 1) * sr]);
        scales.extend_from_slice(&up.scales[i * sr..(i + 1) * sr]);
    }
    Ok(Repacked { format: gate.format, n: n2, k: gate.k, quants, scales })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Q4_1 block: d = 1.5, m = -2, byte j = j | (15 - j) << 4.
    fn q4_1_block() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&f16::from_f32(1.5).to_le_bytes());
        b.extend_from_slice(&f16::from_f32(-2.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | (15 - j) << 4));
        b
    }

    #[test]
    fn splits_scales_and_quants() {
        let raw: Vec<u8> = [q4_1_block(), q4_1_block()].concat();
        let r = repack_q4_1(&raw, 1, 64).unwrap();
        assert_eq!(
            r.scales,
            vec![f16::from_f32(1.5), f16::from_f32(-2.0), f16::from_f32(1.5), f16::from_f32(-2.0)]
        );
        assert_eq!(r.quants.len(), 32);
        assert_eq!(&r.quants[..16], &raw[4..20]);
        assert_eq!(r.bytes(), 32 + 8);
        let q8: Vec<u8> = (0..34).collect();
        let r8 = repack_q8_0(&q8, 1, 32).unwrap();
        assert_eq!((r8.scales.len(), &r8.quants[..], r8.quant_row_bytes()), (1, &q8[2..], 32));
    }

    #[test]
    fn rejects_bad_shapes_without_panicking() {
        let raw = q4_1_block();
        assert!(matches!(repack_q4_1(&raw, 0, 32), Err(RepackError::Empty { .. })));
        assert!(matches!(repack_q4_1(&raw, 1, 48), Err(RepackError::RaggedK { k: 48, .. })));
        let e = repack_q4_0(&raw, 1, 32).unwrap_err();
        assert_eq!(e, RepackError::Size { format: "Q4_0", n: 1, k: 32, expected: 18, got: 20 });
        assert!(e.to_string().contains("needs 18 bytes, got 20"));
        assert!(matches!(repack_q8_0(&[], 1 << 20, 1 << 12), Err(RepackError::TooLarge { .. })));
        assert!(matches!(repack_q8_0(&[], usize::MAX, 64), Err(RepackError::TooLarge { .. })));
    }

    #[test]
    fn interleaves_rows() {
        let g = repack_q4_1(&[q4_1_block(), q4_1_block()].concat(), 2, 32).unwrap();
        let mut u = g.clone();
        u.quants.iter_mut().for_each(|b| *b = !*b);
        u.scales.iter_mut().for_each(|s| *s = -*s);
        let gu = interleave_gate_up(&g, &u).unwrap();
        assert_eq!((gu.n, gu.k), (4, 32));
        assert_eq!(&gu.quants[16..32], &u.quants[..16]);
        assert_eq!(&gu.quants[32..48], &g.quants[16..32]);
        assert_eq!(&gu.scales[2..4], &u.scales[..2]);
        let q8 = repack_q8_0(&[0; 34], 1, 32).unwrap();
        assert!(matches!(interleave_gate_up(&g, &q8), Err(RepackError::Mismatch { .. })));
        let mut short = g.clone();
        short.scales.pop();
        assert!(matches!(interleave_gate_up(&short, &g), Err(RepackError::Size { .. })));
    }
}
