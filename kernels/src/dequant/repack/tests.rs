//! Tests of the repacking: plane layouts, decoding against the GGUF
//! reference, K-quant blocks, conversions, the gate/up interleave and the
//! shape errors.

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
    assert!(matches!(repack_q4_1(&raw, 1, 48), Err(RepackError::RaggedK { k: 48, block: 32, .. })));
    let e = repack_q4_0(&raw, 1, 32).unwrap_err();
    assert_eq!(e, RepackError::Size { format: "Q4_0", n: 1, k: 32, expected: 18, got: 20 });
    assert!(e.to_string().contains("needs 18 bytes, got 20"));
    assert!(matches!(repack_q8_0(&[], 1 << 20, 1 << 12), Err(RepackError::TooLarge { .. })));
    assert!(matches!(repack_q8_0(&[], usize::MAX, 64), Err(RepackError::TooLarge { .. })));
}

/// Random GGUF bytes of a `[n, k]` weight in `format`: random quants
/// and scale bytes, finite f16 `d`/`dmin`/`m` in [-2, 2] (and finite
/// 16-bit floats for F16/BF16).
pub(crate) fn random_gguf(format: QuantFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut raw: Vec<u8> = (0..format.gguf_bytes(n, k)).map(|_| (next() >> 32) as u8).collect();
    let mut half = |v: &mut [u8]| {
        let h = f16::from_f64((next() % 4001) as f64 / 1000.0 - 2.0);
        v.copy_from_slice(&h.to_le_bytes());
    };
    let bb = format.block_bytes();
    for blk in raw.chunks_exact_mut(bb) {
        match format {
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4_K | QuantFormat::Q5_K => {
                half(&mut blk[0..2]);
                half(&mut blk[2..4]);
            }
            QuantFormat::Q6_K => half(&mut blk[208..210]),
            QuantFormat::BF16 => {
                half(blk);
                let v = dsl_core::half::bf16::from_f32(f16::from_le_bytes([blk[0], blk[1]]).to_f32());
                blk.copy_from_slice(&v.to_le_bytes());
            }
            _ => half(&mut blk[0..2]),
        }
    }
    raw
}

/// Every format: the planes decode (the kernels' contract) to exactly
/// the reference's values from the GGUF bytes.
#[test]
fn planes_decode_to_the_reference() {
    for format in QuantFormat::ALL {
        let (n, k) = (3, if format.is_k_quant() { 512 } else { 96 });
        let raw = random_gguf(format, n, k, format as u64 + 7);
        let r = repack(format, &raw, n, k).unwrap();
        assert_eq!(r.format, format.kernel_format());
        r.validate().unwrap();
        for row in 0..n {
            let (want, _) = crate::reference::quant::dequant_row(format, &raw, k, row);
            assert_eq!(r.dequant_row(row), want, "{format:?} row {row}");
            assert!(want.iter().any(|&v| v != 0.0));
        }
    }
}

/// Hand-built K-quant blocks decode to the values of the format's
/// definition (one sub-block checked by hand each).
#[test]
fn k_quant_known_blocks() {
    // Q4_K: d = 0.5, dmin = 0.25, sub-block 5: scale bits from byte 9's
    // low nibble and byte 1's top bits, min from byte 9's high nibble
    // and byte 5's top bits; nibble 3 at weight 32 * 5 + 2.
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    b[4 + 9] = 0x7 << 4 | 0x3; // sc low 3, m low 7
    b[4 + 1] = 0b10 << 6; // sc high 2 -> sc = 35
    b[4 + 5] = 0b01 << 6; // m high 1 -> m = 23
    b[16 + 64 + 2] = 0x3 << 4; // sub-block 5 = chunk 2, high nibbles
    let r = repack(QuantFormat::Q4_K, &b, 1, 256).unwrap();
    let w = r.dequant_row(0);
    assert_eq!(w[160 + 2], 0.5 * 35.0 * 3.0 - 0.25 * 23.0);
    assert_eq!(w[160], -0.25 * 23.0);
    // Q6_K: d = 2, scale 9 of weights 144..160 = -3; weight 150 = 128 +
    // 22 (i = 0, l = 22): ql[64 + 22] low nibble 5, qh[32 + 22] bits 0,1 = 2
    // -> q = 37 - 32 = 5.
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    b[192 + 9] = (-3i8) as u8;
    b[64 + 22] = 5;
    b[128 + 32 + 22] = 2;
    let w = repack(QuantFormat::Q6_K, &b, 1, 256).unwrap().dequant_row(0);
    assert_eq!(w[150], 2.0 * -3.0 * 5.0);
    assert_eq!(w[151], 2.0 * -3.0 * -32.0);
}

/// K-quant rows must be whole super-blocks; sizes must match.
#[test]
fn k_quant_shapes_are_checked() {
    let e = repack(QuantFormat::Q4_K, &[0; 144 * 3], 1, 576).unwrap_err();
    assert_eq!(e, RepackError::RaggedK { format: "Q4_K", k: 576, block: 256 });
    assert!(e.to_string().contains("not a multiple of 256"));
    let e = repack(QuantFormat::Q6_K, &[0; 209], 1, 256).unwrap_err();
    assert_eq!(e, RepackError::Size { format: "Q6_K", n: 1, k: 256, expected: 210, got: 209 });
    assert!(matches!(repack(QuantFormat::F16, &[], 1 << 15, 1 << 15), Err(RepackError::TooLarge { .. })));
}

/// A Q8_0 weight converted to Q5_1 planes decodes to the same values.
#[test]
fn q8_0_converts_to_q5_1_exactly() {
    let raw = random_gguf(QuantFormat::Q8_0, 2, 64, 3);
    let r = repack(QuantFormat::Q8_0, &raw, 2, 64).unwrap();
    let c = q8_0_as_q5_1(&r).unwrap();
    c.validate().unwrap();
    for row in 0..2 {
        assert_eq!(c.dequant_row(row), r.dequant_row(row));
    }
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
