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

/// Values per block of the kernels' planes: every format's weights are
/// addressed in blocks of 32 along K (a K-quant super-block of 256 is 8 of
/// them).
pub const BLOCK_VALUES: usize = 32;

/// Values per K-quant super-block.
pub const SUPER_BLOCK: usize = 256;

/// f16-sized scale-plane entries per K-quant super-block (20 bytes; see
/// [`Repacked`]).
pub const K_SCALE_ENTRIES: usize = 10;

/// A GGUF weight format the dequant kernels support.
///
/// The kernels see three families ([`QuantFormat::family`]): nibbles
/// (Q4_0, Q4_1, Q4_K: 16 quant bytes per 32 weights), bytes (Q8_0, Q5_1,
/// Q5_K, Q6_K: one quant byte per weight) and 16-bit floats (F16, BF16: the
/// weights themselves, no scales). Q5_0 is repacked into the Q8_0 planes
/// (`q - 16` fits a signed byte and the scale is the same `d`: exact), so
/// its [`Repacked::format`] is Q8_0.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// `Q4_0`: f16 `d`, 16 bytes of nibbles; `x = d * (q - 8)`. 18 bytes per block.
    Q4_0,
    /// `Q4_1`: f16 `d`, f16 `m`, 16 bytes of nibbles; `x = d * q + m`. 20 bytes per block.
    Q4_1,
    /// `Q8_0`: f16 `d`, 32 signed bytes; `x = d * q`. 34 bytes per block.
    Q8_0,
    /// `Q5_0`: f16 `d`, 4 bytes of high bits, 16 bytes of nibbles; `x = d *
    /// (q - 16)`. 22 bytes per block. Repacked as Q8_0.
    Q5_0,
    /// `Q5_1`: f16 `d`, f16 `m`, 4 bytes of high bits, 16 bytes of nibbles;
    /// `x = d * q + m`. 24 bytes per block.
    Q5_1,
    /// `Q4_K`: super-blocks of 256: f16 `d`, f16 `dmin`, 12 bytes of 6-bit
    /// scales and mins (8 sub-blocks of 32), 128 bytes of nibbles; `x = d *
    /// sc * q - dmin * m`. 144 bytes per super-block.
    Q4_K,
    /// `Q5_K`: as Q4_K plus 32 bytes of high bits. 176 bytes per super-block.
    Q5_K,
    /// `Q6_K`: super-blocks of 256: 128 bytes of low nibbles, 64 bytes of
    /// 2-bit highs, 16 signed 8-bit scales (one per 16 weights), f16 `d`;
    /// `x = d * sc * (q - 32)`. 210 bytes per super-block.
    Q6_K,
    /// IEEE half precision, 2 bytes per weight.
    F16,
    /// bfloat16, 2 bytes per weight.
    BF16,
}

/// How the kernels read a format's quant plane (see [`QuantFormat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Two weights per byte (Q4_0, Q4_1, Q4_K).
    Nibble,
    /// One weight per byte (Q8_0, Q5_1, Q5_K, Q6_K).
    Byte,
    /// One 16-bit float per weight (F16, BF16).
    Float,
}

impl QuantFormat {
    /// Every format, in GGUF id order.
    pub const ALL: [QuantFormat; 10] = [
        QuantFormat::F16,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
        QuantFormat::BF16,
    ];

    /// Values per GGUF block (256 for the K-quants, 1 for the floats, 32
    /// otherwise).
    pub const fn gguf_block_values(self) -> usize {
        match self {
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => SUPER_BLOCK,
            QuantFormat::F16 | QuantFormat::BF16 => 1,
            _ => BLOCK_VALUES,
        }
    }

    /// Bytes of one GGUF block ([`QuantFormat::gguf_block_values`] values).
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q5_K => 176,
            QuantFormat::Q6_K => 210,
            QuantFormat::F16 | QuantFormat::BF16 => 2,
        }
    }

    /// GGUF bytes of a `[n, k]` weight whose `k` is a whole number of blocks.
    pub const fn gguf_bytes(self, n: usize, k: usize) -> usize {
        n * (k / self.gguf_block_values()) * self.block_bytes()
    }

    /// The multiple of which a weight row's length `k` must be: the GGUF
    /// block (256 for the K-quants), at least the kernels' 32.
    pub const fn row_multiple(self) -> usize {
        match self.gguf_block_values() {
            SUPER_BLOCK => SUPER_BLOCK,
            _ => BLOCK_VALUES,
        }
    }

    /// Whether this is a K-quant (super-blocks of 256).
    pub const fn is_k_quant(self) -> bool {
        matches!(self, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K)
    }

    /// The format of the planes [`repack`] makes of this format's bytes
    /// (Q8_0 for Q5_0, itself otherwise).
    pub const fn kernel_format(self) -> QuantFormat {
        match self {
            QuantFormat::Q5_0 => QuantFormat::Q8_0,
            f => f,
        }
    }

    /// How the kernels read the quant plane.
    pub const fn family(self) -> Family {
        match self {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q4_K => Family::Nibble,
            QuantFormat::F16 | QuantFormat::BF16 => Family::Float,
            _ => Family::Byte,
        }
    }

    /// Quant-plane bytes per 32 weights (16 for the nibble formats, 32 for
    /// the byte formats, 64 for the floats).
    pub const fn quant_bytes(self) -> usize {
        match self.family() {
            Family::Nibble => 16,
            Family::Byte => 32,
            Family::Float => 64,
        }
    }

    /// f16-sized scale-plane entries per 32 weights for the formats with
    /// one entry (or pair) per block: 2 for Q4_1 and Q5_1 (`d`, `m`), 1 for
    /// Q4_0 and Q8_0; 0 for the floats. The K-quants' planes are per
    /// super-block ([`K_SCALE_ENTRIES`]); see [`QuantFormat::scale_entries`].
    pub const fn scales_per_block(self) -> usize {
        match self {
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => 2,
            QuantFormat::Q4_0 | QuantFormat::Q8_0 | QuantFormat::Q5_0 => 1,
            _ => 0,
        }
    }

    /// Device bytes of a `[n, k]` weight repacked in this format (its quant
    /// and scale planes; `k` whole blocks of the format).
    pub const fn repacked_bytes(self, n: usize, k: usize) -> usize {
        let (quants, scales) = self.plane_lens(n, k);
        quants + 2 * scales
    }

    /// The quant-plane bytes and scale-plane entries of a `[n, k]` weight
    /// repacked in this format (`k` whole blocks of the format).
    pub const fn plane_lens(self, n: usize, k: usize) -> (usize, usize) {
        (n * (k / BLOCK_VALUES) * self.quant_bytes(), n * self.scale_entries(k))
    }

    /// Scale-plane entries (f16-sized) of one weight row of `k` values.
    pub const fn scale_entries(self, k: usize) -> usize {
        if self.is_k_quant() {
            k / SUPER_BLOCK * K_SCALE_ENTRIES
        } else {
            k / BLOCK_VALUES * self.scales_per_block()
        }
    }

    /// The GGUF name (`Q4_0`, `Q4_K`, `F16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q5_1 => "Q5_1",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q5_K => "Q5_K",
            QuantFormat::Q6_K => "Q6_K",
            QuantFormat::F16 => "F16",
            QuantFormat::BF16 => "BF16",
        }
    }

    /// Whether the quants are nibbles (two weights per byte, the low nibble
    /// of byte `j` of a 32-weight block weight `j`, the high one weight `j +
    /// 16`): Q4_0, Q4_1, Q4_K.
    pub const fn is_q4(self) -> bool {
        matches!(self.family(), Family::Nibble)
    }

    /// Whether the word-tiled GPU dequant bodies (GEMM, stream-K, the Q8
    /// GEMV, the persistent decode step, and `linear`'s vector loads) take
    /// this format's planes: Q4_0, Q4_1, Q8_0 (and Q5_0, repacked as Q8_0).
    /// The GEMV takes more ([`QuantFormat::gemv_kernels`]); the CPU GEMV
    /// ([`crate::cpu_gemv`]) and the batch-invariant product
    /// ([`crate::dequant::linear`], element-wise loads) take every format.
    pub const fn gpu_kernels(self) -> bool {
        matches!(self.kernel_format(), QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q8_0)
    }

    /// Whether the GPU GEMV bodies ([`crate::dequant::gemv::gemv`] and the
    /// fused GEMV) take this format: every block format (the word-tiled
    /// three and Q5_1, Q4_K, Q5_K, Q6_K, whose quant planes have the same
    /// byte layout as Q4_1's or Q8_0's and whose scales the GEMV reads per
    /// scale group, [`QuantFormat::scale_group`]); not the 16-bit floats.
    pub const fn gemv_kernels(self) -> bool {
        !self.is_float()
    }

    /// Weights per scale-plane group: 16 for Q6_K (one signed scale per 16
    /// weights), 32 (one block) for the other block formats.
    pub const fn scale_group(self) -> usize {
        if matches!(self, QuantFormat::Q6_K) { 16 } else { BLOCK_VALUES }
    }

    /// Whether the weights are 16-bit floats (F16, BF16).
    pub const fn is_float(self) -> bool {
        matches!(self.family(), Family::Float)
    }

    /// Whether a block has a min besides its scale (`w = d q + m`): Q4_1
    /// and Q5_1 (the scale plane holds `(d, m)` pairs, which the kernels
    /// read as one 32-bit word), Q4_K and Q5_K (`m = -dmin * m6`).
    pub const fn has_min(self) -> bool {
        matches!(self, QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4_K | QuantFormat::Q5_K)
    }

    /// Whether the byte format's quants are unsigned bytes `q` with a min
    /// (Q5_1, Q5_K), read as `f = 256 + q`; the other byte formats' are
    /// signed bytes (Q8_0, Q6_K's `q - 32`).
    pub const fn unsigned_bytes(self) -> bool {
        matches!(self, QuantFormat::Q5_1 | QuantFormat::Q5_K)
    }

    /// Weights per quant byte (2 for the nibble formats, 1 for the byte
    /// formats; the floats' 2 bytes per weight count as 1 here, see
    /// [`QuantFormat::k_tile`]).
    pub const fn values_per_byte(self) -> usize {
        if self.is_q4() { 2 } else { 1 }
    }

    /// The K tile (in weights) that holds `bytes` quant bytes of a weight
    /// row (at least one 32-weight block): autotune configs size tiles in
    /// bytes, so that one config holds the same data in every format.
    pub const fn k_tile(self, bytes: usize) -> usize {
        let t = bytes * BLOCK_VALUES / self.quant_bytes();
        if t < BLOCK_VALUES { BLOCK_VALUES } else { t }
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
    /// `k` is not a multiple of the format's block (32, or the K-quants'
    /// 256-value super-block).
    #[error("{format} weight has k = {k} columns, not a multiple of {block} (the block size)")]
    RaggedK {
        /// The format.
        format: &'static str,
        /// Columns.
        k: usize,
        /// The block size `k` must be a multiple of.
        block: usize,
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
    #[error(
        "{format} weight of shape [{n}, {k}] is too large for 32-bit offsets (n * k and its quant bytes must be < 2^31)"
    )]
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
/// - `quants`: `n * k / 32 * quant_bytes()` bytes. Row `r` starts at byte
///   `r * quant_row_bytes()`; block `b` (weights `32 b ..32 b + 31`) of the
///   row at `b * quant_bytes()` within it:
///   - nibble formats (Q4_0, Q4_1, Q4_K), 16 bytes: byte `j` has weight
///     `32 b + j` in its low nibble and `32 b + j + 16` in its high nibble
///     (the GGUF bytes unchanged for Q4_0/Q4_1; Q4_K's, which pair weights
///     `j` and `j + 32` of each 64, are regrouped);
///   - byte formats, 32 bytes, byte `j` weight `32 b + j`: Q8_0 the signed
///     byte `q` (and Q5_0 as Q8_0: `q - 16`), Q6_K the signed `q - 32`,
///     Q5_1 and Q5_K the unsigned 5-bit `q`;
///   - F16/BF16, 64 bytes: the 32 weights themselves, little-endian.
/// - `scales`: f16-sized entries, [`QuantFormat::scale_entries`] per row.
///   Q4_0/Q8_0: block `b` of row `r` is entry `r * (k / 32) + b`, `d`;
///   Q4_1/Q5_1: the pair `(d, m)` (two consecutive f16, `d` first) at entry
///   `2 (r * (k / 32) + b)`. K-quants: super-block `s` of row `r` (blocks
///   `8 s .. 8 s + 7`) owns the [`K_SCALE_ENTRIES`] entries from `10 (r * (k
///   / 256) + s)`: Q4_K/Q5_K `d`, `dmin`, then per block one 16-bit entry
///   `sc | m << 8` (the 6-bit scale and min `get_scale_min_k4` unpacks);
///   Q6_K `d`, a zero entry, then the 16 signed 8-bit scales as bytes (two
///   per entry, scale `i` of weights `16 i .. 16 i + 15`). F16/BF16 have
///   none.
#[derive(Clone, Debug, PartialEq)]
pub struct Repacked {
    /// The block format.
    pub format: QuantFormat,
    /// Rows (output features).
    pub n: usize,
    /// Columns (input features), a multiple of [`QuantFormat::row_multiple`].
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

    /// Row `r` dequantized from the planes (exact, in f64), as the layout
    /// above defines it: the specification the kernels implement, which
    /// tests compare with the GGUF reference decoder.
    pub fn dequant_row(&self, r: usize) -> Vec<f64> {
        let f = self.format;
        let q = &self.quants[r * self.quant_row_bytes()..][..self.quant_row_bytes()];
        let se = f.scale_entries(self.k);
        let s = &self.scales[r * se..][..se];
        let e = |i: usize| s[i].to_f64();
        let bits = |i: usize| s[i].to_bits();
        (0..self.k)
            .map(|i| {
                let (b, j) = (i / BLOCK_VALUES, i % BLOCK_VALUES);
                let qb = &q[b * f.quant_bytes()..][..f.quant_bytes()];
                let nib = || f64::from(if j < 16 { qb[j] & 15 } else { qb[j - 16] >> 4 });
                let (sb, sub) = (b / 8 * K_SCALE_ENTRIES, b % 8);
                match f {
                    QuantFormat::Q4_0 => e(b) * (nib() - 8.0),
                    QuantFormat::Q4_1 => e(2 * b) * nib() + e(2 * b + 1),
                    QuantFormat::Q8_0 | QuantFormat::Q5_0 => e(b) * f64::from(qb[j] as i8),
                    QuantFormat::Q5_1 => e(2 * b) * f64::from(qb[j]) + e(2 * b + 1),
                    QuantFormat::Q4_K | QuantFormat::Q5_K => {
                        let sm = bits(sb + 2 + sub);
                        let (sc, m) = (f64::from(sm & 255), f64::from(sm >> 8));
                        let v = if f == QuantFormat::Q4_K { nib() } else { f64::from(qb[j]) };
                        e(sb) * sc * v - e(sb + 1) * m
                    }
                    QuantFormat::Q6_K => {
                        let g = i % SUPER_BLOCK / 16;
                        let sc = bits(sb + 2 + g / 2).to_le_bytes()[g % 2] as i8;
                        e(sb) * f64::from(sc) * f64::from(qb[j] as i8)
                    }
                    QuantFormat::F16 => f16::from_le_bytes([qb[2 * j], qb[2 * j + 1]]).to_f64(),
                    QuantFormat::BF16 => {
                        dsl_core::half::bf16::from_le_bytes([qb[2 * j], qb[2 * j + 1]]).to_f64()
                    }
                }
            })
            .collect()
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
        let q = n * (k / BLOCK_VALUES) * self.format.quant_bytes();
        let s = n * self.format.scale_entries(k);
        if self.quants.len() != q || self.scales.len() != s {
            let (expected, got) = (q + 2 * s, self.quants.len() + 2 * self.scales.len());
            return Err(RepackError::Size { format: name, n, k, expected, got });
        }
        Ok(())
    }
}

/// Checks that `[n, k]` is a shape the kernels take in `format`: not empty,
/// whole blocks along K (super-blocks for the K-quants), 32-bit offsets
/// (elements and quant bytes).
fn check_shape(format: QuantFormat, n: usize, k: usize) -> Result<(), RepackError> {
    let name = format.name();
    if n == 0 || k == 0 {
        return Err(RepackError::Empty { format: name, n, k });
    }
    let block = format.row_multiple();
    if !k.is_multiple_of(block) {
        return Err(RepackError::RaggedK { format: name, k, block });
    }
    let bytes =
        n.checked_mul(k).and_then(|nk| nk.checked_mul(format.quant_bytes())).map(|b| b / BLOCK_VALUES);
    if n.checked_mul(k).is_none_or(|nk| nk >= 1 << 31) || bytes.is_none_or(|b| b >= 1 << 31) {
        return Err(RepackError::TooLarge { format: name, n, k });
    }
    Ok(())
}

/// Checks `raw` against `[n, k]` in `format`.
fn validate(format: QuantFormat, raw: &[u8], n: usize, k: usize) -> Result<(), RepackError> {
    check_shape(format, n, k)?;
    let expected = format.gguf_bytes(n, k);
    if raw.len() != expected {
        return Err(RepackError::Size { format: format.name(), n, k, expected, got: raw.len() });
    }
    Ok(())
}

fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// The 6-bit scale and min of sub-block `j` (0..8) from a Q4_K/Q5_K
/// super-block's 12 scale bytes `q` (ggml's `get_scale_min_k4`): sub-blocks
/// 0..3 in the low 6 bits of bytes `j` and `j + 4`; 4..7 in the nibbles of
/// byte `j + 4` with their top 2 bits in the top bits of bytes `j - 4` and
/// `j`.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 5-bit quants of a Q5_0/Q5_1 block: nibbles `qs` (byte `j`: weights
/// `j`, `j + 16`) and the 32 high bits `qh` (bit `i` of the little-endian
/// word is weight `i`'s).
fn q5_block(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 15) | (((h >> j) & 1) as u8) << 4;
        q[j + 16] = (qs[j] >> 4) | (((h >> (j + 16)) & 1) as u8) << 4;
    }
    q
}

/// Appends a K-quant super-block's scale entries for Q4_K/Q5_K: `d`,
/// `dmin`, then `sc | m << 8` per sub-block.
fn push_k4_scales(block: &[u8], scales: &mut Vec<f16>) {
    scales.push(f16_le(block, 0));
    scales.push(f16_le(block, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &block[4..16]);
        scales.push(f16::from_bits(u16::from(sc) | u16::from(m) << 8));
    }
}

/// Repacks the GGUF bytes `raw` of a weight `[n, k]` in `format` (rows of
/// GGUF blocks, as GGUF stores a tensor whose innermost dimension is `k`).
/// See [`Repacked`] for the result's layout (Q5_0 becomes Q8_0 planes).
pub fn repack(format: QuantFormat, raw: &[u8], n: usize, k: usize) -> Result<Repacked, RepackError> {
    validate(format, raw, n, k)?;
    let kf = format.kernel_format();
    let mut quants = Vec::with_capacity(n * k / BLOCK_VALUES * kf.quant_bytes());
    let mut scales = Vec::with_capacity(n * kf.scale_entries(k));
    let bb = format.block_bytes();
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q8_0 => {
            let spb = format.scales_per_block();
            for block in raw.chunks_exact(bb) {
                for s in 0..spb {
                    scales.push(f16_le(block, 2 * s));
                }
                quants.extend_from_slice(&block[2 * spb..]);
            }
        }
        QuantFormat::Q5_0 => {
            for block in raw.chunks_exact(bb) {
                scales.push(f16_le(block, 0));
                quants.extend(q5_block(&block[2..6], &block[6..]).iter().map(|&q| (q as i8 - 16) as u8));
            }
        }
        QuantFormat::Q5_1 => {
            for block in raw.chunks_exact(bb) {
                scales.extend([f16_le(block, 0), f16_le(block, 2)]);
                quants.extend_from_slice(&q5_block(&block[4..8], &block[8..]));
            }
        }
        QuantFormat::Q4_K => {
            for block in raw.chunks_exact(bb) {
                push_k4_scales(block, &mut scales);
                // qs: 32 bytes per 64 weights, low nibbles weights 0..31,
                // high nibbles 32..63.
                for qs in block[16..].chunks_exact(32) {
                    for shift in [0, 4] {
                        let q = |l: usize| (qs[l] >> shift) & 15;
                        quants.extend((0..16).map(|j| q(j) | q(j + 16) << 4));
                    }
                }
            }
        }
        QuantFormat::Q5_K => {
            for block in raw.chunks_exact(bb) {
                push_k4_scales(block, &mut scales);
                let (qh, qs) = (&block[16..48], &block[48..]);
                for (c, ql) in qs.chunks_exact(32).enumerate() {
                    for (h, shift) in [(2 * c, 0), (2 * c + 1, 4)] {
                        quants.extend((0..32).map(|l| (ql[l] >> shift) & 15 | ((qh[l] >> h) & 1) << 4));
                    }
                }
            }
        }
        QuantFormat::Q6_K => {
            for block in raw.chunks_exact(bb) {
                let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
                scales.extend([f16_le(block, 208), f16::from_bits(0)]);
                scales.extend(sc.chunks_exact(2).map(|p| f16::from_bits(u16::from_le_bytes([p[0], p[1]]))));
                // Per 128 weights: 64 ql bytes, 32 qh bytes; weight 32 i + l
                // (i = 0..4) is ql[l + 32 (i % 2)] nibble i / 2 with qh[l]
                // bits 2 i, 2 i + 1 on top.
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..][..64], &qh[32 * half..][..32]);
                    for i in 0..4 {
                        quants.extend((0..32).map(|l| {
                            let lo = (ql[l + 32 * (i % 2)] >> (4 * (i / 2))) & 15;
                            let q = lo | ((qh[l] >> (2 * i)) & 3) << 4;
                            (q as i8 - 32) as u8
                        }));
                    }
                }
            }
        }
        QuantFormat::F16 | QuantFormat::BF16 => quants.extend_from_slice(raw),
    }
    Ok(Repacked { format: kf, n, k, quants, scales })
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

/// A Q8_0 weight as exact Q5_1 planes (so it can share one product with
/// Q5_1 weights, such as the fused QKV of a file whose V is Q8_0 and Q, K
/// Q5_1): byte `s` becomes the unsigned `s + 128` and the scale pair `(d,
/// -128 d)`, so `d (s + 128) - 128 d = d s`. `None` when a `-128 d`
/// overflows f16 (`|d| > 511.75`) or the weight is not Q8_0.
pub fn q8_0_as_q5_1(r: &Repacked) -> Option<Repacked> {
    if r.format != QuantFormat::Q8_0 {
        return None;
    }
    let mut scales = Vec::with_capacity(2 * r.scales.len());
    for &d in &r.scales {
        let m = f16::from_f64(-128.0 * d.to_f64());
        if !m.is_finite() || m.to_f64() != -128.0 * d.to_f64() {
            return None;
        }
        scales.extend([d, m]);
    }
    let quants = r.quants.iter().map(|&q| q ^ 0x80).collect();
    Some(Repacked { format: QuantFormat::Q5_1, n: r.n, k: r.k, quants, scales })
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
    let sr = gate.format.scale_entries(gate.k);
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
mod tests;
