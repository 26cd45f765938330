//! Tests of the GGUF reader, writer and Llama schema: round trips through the
//! writer, corruption of every kind (each must give its own error kind, never a
//! panic), a proptest of random mutations, and checks of the real SmolLM2 file.

use super::llama::{self, LlamaConfig};
use super::reader::{DEFAULT_ALIGNMENT, Header, MAX_ARRAY_DEPTH};
use super::tiny::{TinyLlama, tiny_vocab};
use super::vocab::{self, Vocab};
use super::*;
use proptest::prelude::*;
use std::path::PathBuf;

/// The path of the real SmolLM2 file (workspace `models/`), or a panic telling
/// how to fetch it. Tests that need it fail rather than skip when it is absent.
pub(crate) fn real_model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run `.ci/fetch-model` from the workspace root to download it",
        path.display()
    );
    path
}

fn tiny_bytes() -> Vec<u8> {
    TinyLlama::default().to_bytes().unwrap()
}

/// Position of the first occurrence of `needle`.
fn find(bytes: &[u8], needle: &[u8]) -> usize {
    bytes.windows(needle.len()).position(|w| w == needle).expect("needle present")
}

/// Position just after the length-prefixed string `s` (the value type of a key,
/// or `n_dims` of a tensor info).
fn after_str(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    find(bytes, &needle) + needle.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Position of the `offset` field of a tensor info (after its dims and type).
fn tensor_offset_pos(bytes: &[u8], name: &str) -> usize {
    let p = after_str(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    p + 4 + 8 * n_dims + 4
}

fn parse_err(bytes: &[u8]) -> GgufError {
    Header::parse(bytes).expect_err("the corrupt file must be rejected")
}

#[test]
fn tiny_model_round_trips() {
    for tiny in [
        TinyLlama::default(),
        TinyLlama { untied_output: true, seed: 7, ..TinyLlama::default() },
        TinyLlama { embedding_type: GgmlType::F16, matrix_type: GgmlType::BF16, ..TinyLlama::default() },
        TinyLlama { embedding_type: GgmlType::F32, matrix_type: GgmlType::Q4_0, ..TinyLlama::default() },
    ] {
        let w = tiny.writer().unwrap();
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.header().version, 3);
        assert_eq!(g.metadata(), w.metadata());
        assert_eq!(g.tensors(), w.tensor_infos().as_slice());
        assert!(g.header().data_offset.is_multiple_of(DEFAULT_ALIGNMENT));
        let config = LlamaConfig::from_metadata(g.metadata()).unwrap();
        assert_eq!(config, tiny.config);
        assert_eq!(config.check_tensors(&g).unwrap(), !tiny.untied_output);
        assert_eq!(Vocab::from_metadata(g.metadata()).unwrap(), tiny_vocab(config.vocab_size).unwrap());
        // Norms are 1 + 0.1 u exactly (F32); the embedding rows dequantize.
        let norm = g.tensor("output_norm.weight").unwrap().to_f32();
        assert!(norm.iter().all(|&x| (0.9..=1.1).contains(&x)), "{norm:?}");
        let emb = g.tensor("token_embd.weight").unwrap();
        let mut row = vec![0.0; config.n_embd];
        emb.dequantize_row(config.vocab_size - 1, &mut row).unwrap();
        assert!(row.iter().all(|x| x.abs() <= 0.51) && row.iter().any(|&x| x != 0.0));
        assert!(matches!(
            emb.dequantize_row(config.vocab_size, &mut row),
            Err(GgufError::RowOutOfRange { .. })
        ));
    }
}

/// The writer's bytes for the same input are identical (deterministic), and
/// different seeds give different weights.
#[test]
fn tiny_model_is_deterministic() {
    assert_eq!(tiny_bytes(), tiny_bytes());
    assert_ne!(tiny_bytes(), TinyLlama { seed: 1, ..TinyLlama::default() }.to_bytes().unwrap());
}

/// The type [`tiny::q4_k_m_types`] gives each tensor of the smollm2-135m
/// synth shape, by name (the tied head: no `output.weight`).
fn smollm2_q4_k_m_types() -> Vec<(String, GgmlType)> {
    let config = tiny::synth_shape("smollm2-135m").unwrap();
    let t = TinyLlama { config: config.clone(), ..TinyLlama::default() }
        .with_mix(tiny::q4_k_m_types(&config, false));
    config.tensors().iter().map(|spec| (spec.name.clone(), t.tensor_type(spec))).collect()
}

/// Q4_K_M on SmolLM2's shape (hidden 576, not whole super-blocks; FFN
/// 1536): Q, K, O, gate and up fall back from Q4_K to Q5_0; V is Q6_K (so
/// Q8_0) and down Q6_K in llama.cpp's `use_more_bits` layers of 30 (the
/// first 3, the last 4 and every third between: 5, 8, .., 23), else Q5_0 and
/// Q4_K; the tied table Q8_0. Norms stay F32.
#[test]
fn q4_k_m_types_of_smollm2() {
    let more_bits = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29];
    for (name, ty) in smollm2_q4_k_m_types() {
        let want = match name.split('.').collect::<Vec<_>>()[..] {
            ["token_embd", "weight"] => GgmlType::Q8_0,
            ["blk", i, "attn_v", "weight"] => {
                if more_bits.contains(&i.parse().unwrap()) {
                    GgmlType::Q8_0
                } else {
                    GgmlType::Q5_0
                }
            }
            ["blk", i, "ffn_down", "weight"] => {
                if more_bits.contains(&i.parse().unwrap()) {
                    GgmlType::Q6_K
                } else {
                    GgmlType::Q4_K
                }
            }
            [.., kind, "weight"] if kind.ends_with("norm") => GgmlType::F32,
            _ => GgmlType::Q5_0,
        };
        assert_eq!(ty, want, "{name}");
    }
}

/// Q4_K_M where every width is whole super-blocks (hidden 256, 4 query heads
/// of 64, FFN 512, 16 layers, untied head): the K-quants themselves, with `use_more_bits` of 16
/// layers (0, 1, 14, 15 and 4, 7, 10, 13), the head in Q6_K and the
/// embedding in Q4_K; the file is written, valid, and has those types.
#[test]
fn q4_k_m_types_of_a_256_wide_model() {
    let base = TinyLlama::default().config;
    let config = LlamaConfig { n_layers: 16, n_embd: 256, n_ff: 512, head_dim: 64, rope_dim: 64, ..base };
    let t = TinyLlama { config: config.clone(), untied_output: true, ..TinyLlama::default() }
        .with_mix(tiny::q4_k_m_types(&config, true));
    let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
    assert!(!config.check_tensors(&g).unwrap(), "untied");
    let ty = |name: &str| g.tensor_info(name).unwrap().ty;
    assert_eq!((ty("token_embd.weight"), ty("output.weight")), (GgmlType::Q4_K, GgmlType::Q6_K));
    for layer in 0..16 {
        let more = [0, 1, 4, 7, 10, 13, 14, 15].contains(&layer);
        let want = if more { GgmlType::Q6_K } else { GgmlType::Q4_K };
        for kind in ["attn_v", "ffn_down"] {
            assert_eq!(ty(&llama::layer_tensor(layer, kind)), want, "{kind} {layer}");
        }
        for kind in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(ty(&llama::layer_tensor(layer, kind)), GgmlType::Q4_K, "{kind} {layer}");
        }
    }
}

/// The Q4_K_M mix of the smollm2-135m synth shape is llama.cpp's: every
/// tensor of SmolLM2's Q4_K_M file has the mix's type, and the file has no
/// other tensors. Skipped without the file (`make kquant-models`).
#[test]
fn q4_k_m_types_match_the_real_file() {
    let Some(path) = crate::check::model::requantized_model("Q4_K_M") else { return };
    let g = Gguf::open(&path).unwrap();
    let mix = smollm2_q4_k_m_types();
    assert_eq!(g.tensors().len(), mix.len());
    for (name, ty) in mix {
        assert_eq!(g.tensor_info(&name).unwrap().ty, ty, "{name}");
    }
}

/// `matrix_types` keys match a kind in every layer or one tensor by name (the
/// first matching entry wins), never a longer name that merely ends the same
/// (`output` is not `attn_output`); norms stay F32.
#[test]
fn matrix_types_match_kinds_and_single_tensors() {
    let t = TinyLlama {
        untied_output: true,
        matrix_types: vec![
            ("blk.1.attn_v".into(), GgmlType::Q8_0),
            ("attn_v".into(), GgmlType::Q5_0),
            ("output".into(), GgmlType::Q5_1),
            ("token_embd".into(), GgmlType::Q4_0),
            ("attn_norm".into(), GgmlType::Q8_0),
        ],
        ..TinyLlama::default()
    };
    let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
    for (name, ty) in [
        ("blk.0.attn_v.weight", GgmlType::Q5_0),
        ("blk.1.attn_v.weight", GgmlType::Q8_0),
        ("blk.1.attn_output.weight", GgmlType::Q4_1),
        ("output.weight", GgmlType::Q5_1),
        ("token_embd.weight", GgmlType::Q4_0),
        ("blk.0.attn_norm.weight", GgmlType::F32),
    ] {
        assert_eq!(g.tensor_info(name).unwrap().ty, ty, "{name}");
    }
}

/// Every metadata value type, nested and empty arrays, non-ASCII strings, a
/// custom alignment and a zero-dimension scalar survive the round trip, through
/// a memory-mapped file too.
#[test]
fn every_value_type_round_trips() {
    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(64)).unwrap();
    let values = [
        Value::U8(200),
        Value::I8(-100),
        Value::U16(60000),
        Value::I16(-30000),
        Value::U32(4_000_000_000),
        Value::I32(-2_000_000_000),
        Value::F32(1.5e-5),
        Value::Bool(true),
        Value::String("héllo, 世界 🙂".into()),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F64(-2.5e300),
        Value::Array(Array::Bool(vec![true, false])),
        Value::Array(Array::String(vec!["a".into(), String::new(), "Ġthe".into()])),
        Value::Array(Array::F64(vec![])),
        Value::Array(Array::Array(vec![Array::U8(vec![1, 2]), Array::String(vec!["x".into()])])),
    ];
    for (i, v) in values.iter().enumerate() {
        w.set(&format!("test.value{i}"), v.clone()).unwrap();
    }
    w.add_f32_tensor("scalar", GgmlType::F32, &[], &[3.25]).unwrap();
    w.add_f32_tensor("vec", GgmlType::F16, &[3], &[1.0, -2.0, 0.5]).unwrap();
    w.add_tensor("empty", GgmlType::Q8_0, &[32, 0], Vec::new()).unwrap();
    let bytes = w.to_bytes();
    let g = Gguf::from_bytes(bytes.clone()).unwrap();
    assert_eq!(g.header().alignment, 64);
    assert_eq!(g.metadata(), w.metadata());
    assert_eq!(g.tensors(), w.tensor_infos().as_slice());
    assert_eq!(g.tensor("scalar").unwrap().to_f32(), vec![3.25]);
    assert_eq!(g.tensor("vec").unwrap().to_f32(), vec![1.0, -2.0, 0.5]);
    assert!(g.tensor("empty").unwrap().data.is_empty());
    assert!(g.tensors().iter().all(|t| t.offset.is_multiple_of(64)));

    let path = std::env::temp_dir().join(format!("tessera-gguf-test-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    let mapped = Gguf::open(&path);
    std::fs::remove_file(&path).unwrap();
    let mapped = mapped.unwrap();
    assert_eq!(mapped.bytes(), bytes.as_slice());
    assert_eq!(mapped.header(), g.header());
}

/// A file without tensors, and one that ends right after its header, parse.
#[test]
fn files_without_tensors_parse() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert!(g.tensors().is_empty());
    assert_eq!(g.metadata().len(), 1);
    let empty = GgufWriter::new().to_bytes();
    assert_eq!(empty.len(), 24);
    assert!(Gguf::from_bytes(empty).is_ok());
}

#[test]
fn version_2_is_read_and_others_are_rejected() {
    let mut w = TinyLlama::default().writer().unwrap();
    w.set_version(2);
    assert_eq!(Gguf::from_bytes(w.to_bytes()).unwrap().header().version, 2);
    for v in [0, 1, 4, u32::MAX] {
        w.set_version(v);
        assert!(matches!(parse_err(&w.to_bytes()), GgufError::UnsupportedVersion(x) if x == v));
    }
}

#[test]
fn bad_magic_is_rejected() {
    let mut b = tiny_bytes();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse_err(&b), GgufError::BadMagic { found } if &found == b"GGML"));
    assert!(matches!(parse_err(b"GGU"), GgufError::Truncated { .. }));
    assert!(matches!(parse_err(b""), GgufError::Truncated { .. }));
}

/// Cutting the file anywhere gives `Truncated` (or `CountTooLarge` right after
/// a count) inside the header, and
/// `TensorOutOfBounds` for the first tensor cut short inside the data; only
/// cuts in the final padding parse.
#[test]
fn truncation_at_every_offset_is_an_error() {
    let b = tiny_bytes();
    let h = Header::parse(&b).unwrap();
    let data_end = h.tensors.iter().map(|t| h.data_offset + t.offset + t.n_bytes().unwrap()).max().unwrap();
    assert!(data_end <= b.len() as u64 && b.len() as u64 - data_end < DEFAULT_ALIGNMENT);
    let header_cuts = 0..h.data_offset as usize;
    let data_cuts = (h.data_offset as usize..b.len()).step_by(61).chain(data_end as usize - 1..b.len());
    for cut in header_cuts.chain(data_cuts) {
        match Header::parse(&b[..cut]) {
            Ok(_) => assert!(cut as u64 >= data_end, "cut at {cut} parsed"),
            Err(GgufError::Truncated { offset, needed, len, .. }) => {
                assert!((cut as u64) < h.data_offset, "cut at {cut}");
                assert_eq!(len, cut as u64);
                assert!(offset + needed > len);
            }
            // A count whose entries cannot fit in what is left is how a cut
            // right after a count shows.
            Err(GgufError::CountTooLarge { count, min_size, remaining, .. }) => {
                assert!((cut as u64) < h.data_offset, "cut at {cut}");
                assert!(count * min_size > remaining);
            }
            Err(GgufError::TensorOutOfBounds { end, len, .. }) => {
                assert!((cut as u64) < data_end, "cut at {cut}");
                assert!(end > len);
            }
            Err(e) => panic!("cut at {cut}: unexpected error {e}"),
        }
    }
    // A cut inside a string names the string.
    let cut = after_str(&b, "tokenizer.chat_template") + 4 + 8 + 10;
    let e = parse_err(&b[..cut]);
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what == "value of metadata key `tokenizer.chat_template`"),
        "{e}"
    );
    // A cut inside an array is caught by the element count.
    let cut = after_str(&b, "<|im_end|>") - 3;
    let e = parse_err(&b[..cut]);
    assert!(
        matches!(&e, GgufError::CountTooLarge { what, .. } if what == "elements of value of metadata key `tokenizer.ggml.tokens`"),
        "{e}"
    );
}

#[test]
fn tensor_data_out_of_bounds_is_rejected() {
    let b = tiny_bytes();
    let h = Header::parse(&b).unwrap();
    let name = "blk.1.attn_v.weight";
    let data_len = h.data_len;
    for offset in [data_len.next_multiple_of(32), u64::MAX - 31, data_len - 32] {
        let mut c = b.clone();
        put_u64(&mut c, tensor_offset_pos(&b, name), offset);
        let e = parse_err(&c);
        assert!(
            matches!(&e, GgufError::TensorOutOfBounds { tensor, start, .. } if tensor == name && *start == offset),
            "{e}"
        );
    }
}

#[test]
fn misaligned_and_overlapping_tensors_are_rejected() {
    let b = tiny_bytes();
    let h = Header::parse(&b).unwrap();
    let mut c = b.clone();
    let at = tensor_offset_pos(&c, "blk.0.ffn_up.weight");
    let off = h.tensor("blk.0.ffn_up.weight").unwrap().offset;
    put_u64(&mut c, at, off + 16);
    assert!(matches!(parse_err(&c),
        GgufError::MisalignedTensor { tensor, offset, alignment: 32 } if tensor == "blk.0.ffn_up.weight" && offset == off + 16));

    let mut c = b.clone();
    let target = h.tensor("blk.0.ffn_gate.weight").unwrap().offset;
    put_u64(&mut c, at, target + 32);
    let e = parse_err(&c);
    assert!(
        matches!(&e, GgufError::OverlappingTensors { first, second }
            if first == "blk.0.ffn_gate.weight" && second == "blk.0.ffn_up.weight"),
        "{e}"
    );
}

#[test]
fn unknown_and_unsupported_tensor_types() {
    let b = tiny_bytes();
    let name = "blk.0.attn_q.weight";
    for id in [4, 31, 40, 1000] {
        let mut c = b.clone();
        put_u32(&mut c, tensor_offset_pos(&b, name) - 4, id);
        assert!(
            matches!(parse_err(&c), GgufError::UnknownTensorType { tensor, id: i } if tensor == name && i == id)
        );
    }
    // A known type the runtime cannot read parses, and is reported when viewed.
    let mut w = GgufWriter::new();
    w.add_tensor("k", GgmlType::Q3_K, &[256, 2], vec![0; 220]).unwrap();
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.tensor_bytes("k").unwrap().len(), 220);
    assert!(
        matches!(g.tensor("k"), Err(GgufError::UnsupportedType { tensor, ty: GgmlType::Q3_K }) if tensor == "k")
    );
    assert!(matches!(g.tensor("nope"), Err(GgufError::MissingTensor(n)) if n == "nope"));
}

/// K-quant tensors: a row length that is not whole 256-value super-blocks
/// is `BadShape`, a file cut inside a K-quant tensor's data is
/// `TensorOutOfBounds`, and a whole one reads back (Q4_K, Q5_K, Q6_K).
#[test]
fn k_quant_tensors_are_checked() {
    for (ty, bytes) in [(GgmlType::Q4_K, 144), (GgmlType::Q5_K, 176), (GgmlType::Q6_K, 210)] {
        let mut w = GgufWriter::new();
        assert!(matches!(
            w.add_tensor("t", ty, &[576, 2], vec![0; 2 * bytes * 2]),
            Err(GgufError::BadShape { .. })
        ));
        w.add_tensor("t", ty, &[512, 2], vec![0; 4 * bytes]).unwrap();
        let full = w.to_bytes();
        let g = Gguf::from_bytes(full.clone()).unwrap();
        assert_eq!(g.tensor("t").unwrap().to_f32().len(), 1024);
        // Past the alignment padding (under 32 bytes), into the data.
        let cut = full[..full.len() - 40].to_vec();
        assert!(
            matches!(parse_err(&cut), GgufError::TensorOutOfBounds { tensor, .. } if tensor == "t"),
            "{ty}"
        );
        // A row length patched to 576 (not whole super-blocks) in a parsed file.
        let mut c = full.clone();
        let dims_at = after_str(&c, "t") + 4;
        put_u64(&mut c, dims_at, 576);
        assert!(
            matches!(parse_err(&c), GgufError::BadShape { tensor, message } if tensor == "t" && message.contains("256"))
        );
    }
}

#[test]
fn bad_shapes_are_rejected() {
    let b = tiny_bytes();
    let name = "blk.0.attn_k.weight"; // Q4_1 [64, 32]
    let dims_at = after_str(&b, name) + 4;
    // First dimension not a whole number of blocks.
    let mut c = b.clone();
    put_u64(&mut c, dims_at, 48);
    assert!(matches!(parse_err(&c), GgufError::BadShape { tensor, .. } if tensor == name));
    // Element count overflow.
    let mut c = b.clone();
    put_u64(&mut c, dims_at, 1 << 40);
    put_u64(&mut c, dims_at + 8, 1 << 40);
    assert!(matches!(parse_err(&c), GgufError::BadShape { tensor, .. } if tensor == name));
    // A dimension that does not fit an i64.
    let mut c = b.clone();
    put_u64(&mut c, dims_at + 8, u64::MAX);
    assert!(matches!(parse_err(&c), GgufError::BadShape { tensor, .. } if tensor == name));
    // Too many dimensions.
    let mut c = b.clone();
    put_u32(&mut c, dims_at - 4, 5);
    assert!(matches!(parse_err(&c), GgufError::BadShape { tensor, .. } if tensor == name));
    // The writer refuses the same shapes.
    let mut w = GgufWriter::new();
    assert!(matches!(w.add_tensor("t", GgmlType::Q4_1, &[48], vec![0; 20]), Err(GgufError::BadShape { .. })));
    assert!(matches!(
        w.add_tensor("t", GgmlType::Q4_1, &[32], vec![0; 19]),
        Err(GgufError::SizeMismatch { .. })
    ));
    w.add_tensor("t", GgmlType::F32, &[1], vec![0; 4]).unwrap();
    assert!(matches!(w.add_tensor("t", GgmlType::F32, &[1], vec![0; 4]), Err(GgufError::DuplicateTensor(_))));
}

#[test]
fn bad_metadata_encodings_are_rejected() {
    let b = tiny_bytes();
    // Unknown value type of a key.
    let mut c = b.clone();
    put_u32(&mut c, after_str(&b, "llama.block_count"), 13);
    assert!(matches!(parse_err(&c),
        GgufError::UnknownValueType { what, id: 13 } if what.contains("`llama.block_count`")));
    // Unknown element type of an array.
    let mut c = b.clone();
    put_u32(&mut c, after_str(&b, "tokenizer.ggml.merges") + 4, 99);
    assert!(matches!(parse_err(&c), GgufError::UnknownValueType { id: 99, .. }));
    // A bool that is not 0 or 1.
    let mut c = b.clone();
    c[after_str(&b, "tokenizer.ggml.add_bos_token") + 4] = 2;
    assert!(matches!(parse_err(&c), GgufError::InvalidBool { byte: 2, .. }));
    // A key that is not UTF-8.
    let mut c = b.clone();
    c[after_str(&b, "general.name") - 1] = 0xFF;
    assert!(matches!(parse_err(&c), GgufError::InvalidUtf8 { what, .. } if what.starts_with("metadata key")));
    // A string value that is not UTF-8 (inside the token list).
    let mut c = b.clone();
    c[after_str(&b, "<|im_start|>") - 1] = 0xC3;
    assert!(
        matches!(parse_err(&c), GgufError::InvalidUtf8 { what, .. } if what.contains("tokenizer.ggml.tokens"))
    );
    // Duplicate keys and tensor names (same-length renames).
    let mut c = b.clone();
    let p = after_str(&b, "general.type") - 4;
    c[p..p + 4].copy_from_slice(b"name");
    assert!(matches!(parse_err(&c), GgufError::DuplicateKey(k) if k == "general.name"));
    let mut c = b.clone();
    let p = after_str(&b, "blk.1.attn_q.weight") - 8;
    c[p] = b'k';
    assert!(matches!(parse_err(&c), GgufError::DuplicateTensor(n) if n == "blk.1.attn_k.weight"));
}

#[test]
fn huge_counts_and_lengths_allocate_nothing() {
    let b = tiny_bytes();
    for (at, what) in [(8, "tensor infos"), (16, "metadata key-value pairs")] {
        for count in [u64::MAX, 1 << 40, b.len() as u64] {
            let mut c = b.clone();
            put_u64(&mut c, at, count);
            let e = parse_err(&c);
            assert!(matches!(&e, GgufError::CountTooLarge { what: w, .. } if w == what), "{e}");
        }
    }
    // A huge array count.
    let mut c = b.clone();
    put_u64(&mut c, after_str(&b, "tokenizer.ggml.tokens") + 8, u64::MAX / 2);
    assert!(matches!(parse_err(&c),
        GgufError::CountTooLarge { what, .. } if what.contains("tokenizer.ggml.tokens")));
    // A huge string length (the key's own length field).
    let mut c = b.clone();
    let p = after_str(&b, "general.name") - "general.name".len() - 8;
    put_u64(&mut c, p, u64::MAX);
    assert!(matches!(parse_err(&c), GgufError::Truncated { needed: u64::MAX, .. }));
    // Arrays nested past the limit.
    let nest = |depth: usize| (1..depth).fold(Array::U8(vec![1]), |a, _| Array::Array(vec![a]));
    let mut w = GgufWriter::new();
    w.set("deep", nest(MAX_ARRAY_DEPTH)).unwrap();
    assert!(Header::parse(&w.to_bytes()).is_ok());
    w.set("deep", nest(MAX_ARRAY_DEPTH + 1)).unwrap();
    assert!(matches!(parse_err(&w.to_bytes()), GgufError::NestingTooDeep { .. }));
}

#[test]
fn bad_alignment_is_rejected() {
    let mut w = GgufWriter::new();
    assert!(matches!(w.set("general.alignment", Value::U32(48)), Err(GgufError::BadAlignment(48))));
    assert!(matches!(w.set("general.alignment", Value::U64(64)), Err(GgufError::WrongType { .. })));
    w.set("general.alignment", Value::U32(64)).unwrap();
    w.add_f32_tensor("t", GgmlType::F32, &[2], &[1.0, 2.0]).unwrap();
    let b = w.to_bytes();
    let at = after_str(&b, "general.alignment");
    for a in [0, 48] {
        let mut c = b.clone();
        put_u32(&mut c, at + 4, a);
        assert!(matches!(parse_err(&c), GgufError::BadAlignment(x) if x == u64::from(a)));
    }
    let mut c = b.clone();
    put_u32(&mut c, at, 5); // i32 instead of u32
    assert!(matches!(parse_err(&c), GgufError::WrongType { key, .. } if key == "general.alignment"));
}

/// Missing, mistyped and invalid hyperparameters name their key.
#[test]
fn llama_config_validation() {
    let base = TinyLlama::default().writer().unwrap().metadata().clone();
    assert!(LlamaConfig::from_metadata(&base).is_ok());
    let with = |key: &str, v: Option<Value>| {
        let mut md = Metadata::new();
        for (k, old) in base.iter() {
            match (&v, k == key) {
                (_, false) => md.insert(k, old.clone()).unwrap(),
                (Some(v), true) => md.insert(k, v.clone()).unwrap(),
                (None, true) => {}
            }
        }
        LlamaConfig::from_metadata(&md).expect_err("must be rejected")
    };
    for key in [
        llama::KEY_BLOCK_COUNT,
        llama::KEY_EMBEDDING_LENGTH,
        llama::KEY_FEED_FORWARD_LENGTH,
        llama::KEY_HEAD_COUNT,
        llama::KEY_CONTEXT_LENGTH,
        llama::KEY_RMS_EPS,
        llama::KEY_ARCHITECTURE,
    ] {
        assert!(matches!(with(key, None), GgufError::MissingKey(k) if k == key), "{key}");
        assert!(
            matches!(with(key, Some(Value::Bool(true))), GgufError::WrongType { key: k, .. } if k == key)
        );
    }
    let invalid = |key: &str, v: Value, expect_key: &str| {
        let e = with(key, Some(v));
        assert!(matches!(&e, GgufError::InvalidValue { key: k, .. } if k == expect_key), "{key}: {e}");
    };
    invalid(llama::KEY_BLOCK_COUNT, Value::U32(0), llama::KEY_BLOCK_COUNT);
    invalid(llama::KEY_BLOCK_COUNT, Value::I32(-1), llama::KEY_BLOCK_COUNT);
    invalid(llama::KEY_HEAD_COUNT, Value::U32(0), llama::KEY_HEAD_COUNT);
    invalid(llama::KEY_HEAD_COUNT, Value::U32(3), llama::KEY_HEAD_COUNT); // 64 / 3
    invalid(llama::KEY_HEAD_COUNT_KV, Value::U32(3), llama::KEY_HEAD_COUNT_KV);
    invalid(llama::KEY_ROPE_DIMENSION_COUNT, Value::U32(17), llama::KEY_ROPE_DIMENSION_COUNT);
    invalid(llama::KEY_ROPE_DIMENSION_COUNT, Value::U32(32), llama::KEY_ROPE_DIMENSION_COUNT);
    invalid(llama::KEY_RMS_EPS, Value::F32(-1e-5), llama::KEY_RMS_EPS);
    invalid(llama::KEY_RMS_EPS, Value::F32(f32::NAN), llama::KEY_RMS_EPS);
    invalid(llama::KEY_ROPE_FREQ_BASE, Value::F32(f32::INFINITY), llama::KEY_ROPE_FREQ_BASE);
    invalid(llama::KEY_CONTEXT_LENGTH, Value::U64(1 << 40), llama::KEY_CONTEXT_LENGTH);
    invalid(llama::KEY_VOCAB_SIZE, Value::U32(1000), llama::KEY_VOCAB_SIZE);
    assert!(matches!(
        with(llama::KEY_ARCHITECTURE, Some(Value::from("gpt2"))),
        GgufError::UnsupportedArchitecture(a) if a == "gpt2"
    ));
    // Optional keys take llama.cpp's defaults (the vocabulary size comes from
    // the token list).
    let optional = [
        llama::KEY_HEAD_COUNT_KV,
        llama::KEY_VOCAB_SIZE,
        llama::KEY_ROPE_FREQ_BASE,
        llama::KEY_ROPE_DIMENSION_COUNT,
    ];
    let mut md = Metadata::new();
    for (k, v) in base.iter().filter(|(k, _)| !optional.contains(k)) {
        md.insert(k, v.clone()).unwrap();
    }
    let c = LlamaConfig::from_metadata(&md).unwrap();
    assert_eq!((c.n_head_kv, c.rope_dim, c.rope_freq_base), (c.n_head, c.head_dim, 10000.0));
    assert_eq!(c.vocab_size, TinyLlama::default().config.vocab_size);
}

/// Tensors of the wrong shape or type, or missing, fail the architecture check.
#[test]
fn llama_tensor_check() {
    let tiny = TinyLlama::default();
    let config = tiny.config.clone();
    let mut w = GgufWriter::new();
    for (k, v) in tiny.writer().unwrap().metadata().iter() {
        w.set(k, v.clone()).unwrap();
    }
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert!(matches!(config.check_tensors(&g), Err(GgufError::MissingTensor(n)) if n == "token_embd.weight"));

    let mut bad = TinyLlama { untied_output: true, ..tiny.clone() };
    bad.config.vocab_size += 1;
    let g = Gguf::from_bytes(bad.to_bytes().unwrap()).unwrap();
    assert!(matches!(config.check_tensors(&g),
        Err(GgufError::TensorMismatch { tensor, .. }) if tensor == "token_embd.weight"));

    let odd = TinyLlama { matrix_type: GgmlType::F16, ..tiny };
    let g = Gguf::from_bytes(odd.to_bytes().unwrap()).unwrap();
    assert!(config.check_tensors(&g).unwrap());
}

#[test]
fn vocab_validation() {
    let base = TinyLlama::default().writer().unwrap().metadata().clone();
    let mut md = base.clone();
    md.set(vocab::KEY_BOS, Value::U32(100_000));
    assert!(
        matches!(Vocab::from_metadata(&md), Err(GgufError::InvalidValue { key, .. }) if key == vocab::KEY_BOS)
    );
    let mut md = base.clone();
    md.set(vocab::KEY_TOKEN_TYPE, Value::Array(Array::I32(vec![1; 3])));
    assert!(
        matches!(Vocab::from_metadata(&md), Err(GgufError::InvalidValue { key, .. }) if key == vocab::KEY_TOKEN_TYPE)
    );
    let mut md = base.clone();
    md.set(vocab::KEY_TOKENS, Value::Array(Array::U32(vec![1])));
    assert!(
        matches!(Vocab::from_metadata(&md), Err(GgufError::WrongType { key, .. }) if key == vocab::KEY_TOKENS)
    );
}

#[test]
fn gpt2_byte_table_is_a_bijection() {
    let chars: Vec<char> = (0..=255u8).map(vocab::gpt2_byte_to_char).collect();
    assert_eq!(chars[b' ' as usize], 'Ġ');
    assert_eq!(chars[b'\n' as usize], 'Ċ');
    assert_eq!(chars[b'a' as usize], 'a');
    for (b, &c) in chars.iter().enumerate() {
        assert_eq!(vocab::gpt2_char_to_byte(c), Some(b as u8));
    }
    assert_eq!(vocab::gpt2_char_to_byte(' '), None);
    assert_eq!(vocab::gpt2_char_to_byte('世'), None);
}

/// Everything the runtime reads from a file: the header, the config, the
/// vocabulary and every supported tensor view.
fn exercise(bytes: &[u8]) {
    if let Ok(g) = Gguf::from_bytes(bytes.to_vec()) {
        let _ = LlamaConfig::from_metadata(g.metadata()).map(|c| c.check_tensors(&g));
        let _ = Vocab::from_metadata(g.metadata());
        for t in g.tensors() {
            if let Ok(v) = g.tensor(&t.name) {
                let _ = v.to_f32();
                // A validated tensor with no rows may claim a huge row length.
                if v.info.row_len() <= 1 << 20 {
                    let _ = v.dequantize_row(0, &mut vec![0.0; v.info.row_len() as usize]);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random byte overwrites (biased to the header) and truncations of a valid
    /// file never panic.
    #[test]
    fn random_mutations_never_panic(
        edits in prop::collection::vec((0usize..9000, any::<u8>()), 1..8),
        cut in prop::option::of(0usize..70_000),
    ) {
        let mut b = tiny_bytes();
        for (at, v) in edits {
            let n = b.len();
            b[at % n] = v;
        }
        if let Some(cut) = cut {
            b.truncate(cut);
        }
        exercise(&b);
    }

    /// Arbitrary bytes after a valid magic and version never panic.
    #[test]
    fn random_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend(body);
        exercise(&b);
    }
}

/// The real SmolLM2 file: counts, types, hyperparameters, vocabulary and the
/// tied LM head, as documented in shared/models.md.
#[test]
fn real_smollm2_file() {
    let g = Gguf::open(real_model_path()).unwrap();
    assert_eq!(g.header().version, 3);
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.metadata().len(), 33);
    let count = |ty| g.tensors().iter().filter(|t| t.ty == ty).count();
    assert_eq!((count(GgmlType::Q4_1), count(GgmlType::F32), count(GgmlType::Q8_0)), (210, 61, 1));
    let c = LlamaConfig::from_metadata(g.metadata()).unwrap();
    let expected = LlamaConfig {
        arch: crate::gguf::Arch::LLAMA,
        n_layers: 30,
        n_embd: 576,
        n_ff: 1536,
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        rope_dim: 64,
        rope_freq_base: 100000.0,
        rope_scaling: crate::gguf::RopeScaling::None,
        rms_norm_eps: 1e-5,
        context_length: 8192,
        vocab_size: 49152,
    };
    assert_eq!(c, expected);
    assert!(c.check_tensors(&g).unwrap(), "SmolLM2 ties its LM head");
    // The tiny model's layout matches: same tensor names, order and types.
    let tiny = Gguf::from_bytes(tiny_bytes()).unwrap();
    let layout = |g: &Gguf| -> Vec<(String, GgmlType)> {
        g.tensors()
            .iter()
            .filter(|t| !t.name.starts_with("blk.") || t.name.starts_with("blk.0."))
            .map(|t| (t.name.clone(), t.ty))
            .collect()
    };
    assert_eq!(layout(&tiny), layout(&g));
    let tiny_keys: Vec<&str> = tiny.metadata().iter().map(|(k, _)| k).collect();
    for (k, v) in g.metadata().iter() {
        if !k.starts_with("general.") || k == "general.architecture" || k == "general.file_type" {
            assert!(tiny_keys.contains(&k), "the tiny model lacks {k}");
            assert_eq!(tiny.metadata().get(k).unwrap().value_type(), v.value_type(), "{k}");
        }
    }

    let v = Vocab::from_metadata(g.metadata()).unwrap();
    assert_eq!((v.tokens.len(), v.merges.len()), (49152, 48900));
    assert_eq!(
        (v.bos, v.eos, v.model.as_str(), v.pre.as_deref()),
        (Some(1), Some(2), "gpt2", Some("smollm"))
    );
    assert_eq!(v.chat_template.as_deref(), Some(tiny::SMOLLM2_CHAT_TEMPLATE));

    // Tensor data: norms are plausible, the Q8_0 embedding and a Q4_1 matrix
    // dequantize to finite values of sensible magnitude.
    let norm = g.tensor("output_norm.weight").unwrap().to_f32();
    assert_eq!(norm.len(), 576);
    assert!(norm.iter().all(|x| x.is_finite()) && norm.iter().any(|&x| x != 0.0));
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.row_bytes(), emb.data.len()), (18 * 34, 49152 * 18 * 34));
    let mut row = vec![0.0; 576];
    emb.dequantize_row(504, &mut row).unwrap();
    assert!(row.iter().all(|x| x.is_finite() && x.abs() < 10.0) && row.iter().any(|&x| x != 0.0));
    let q = g.tensor("blk.29.attn_q.weight").unwrap().to_f32();
    assert!(q.iter().all(|x| x.is_finite() && x.abs() < 10.0));
}

/// `general.architecture` picks the architecture and the prefix of its keys;
/// an unknown one is an error naming every supported architecture.
#[test]
fn architectures_from_metadata() {
    let base = TinyLlama::default();
    for arch in [Arch::LLAMA, Arch::QWEN2, Arch::QWEN3] {
        let t = TinyLlama { config: LlamaConfig { arch, ..base.config.clone() }, ..base.clone() };
        let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
        let key = arch.key(llama::KEY_BLOCK_COUNT);
        assert_eq!(key, format!("{}.block_count", arch.name));
        assert!(g.metadata().get(&key).is_some(), "{key}");
        let c = LlamaConfig::from_metadata(g.metadata()).unwrap();
        assert_eq!(c, t.config);
        // Qwen2's biases and Qwen3's head norms are part of the tensor list.
        assert_eq!(g.tensor_info("blk.1.attn_v.bias").is_ok(), arch.qkv_bias);
        assert_eq!(g.tensor_info("blk.1.attn_k_norm.weight").is_ok(), arch.qk_norm);
        assert!(c.check_tensors(&g).unwrap(), "tied head");
    }
    let mut md = Gguf::from_bytes(tiny_bytes()).unwrap().metadata().clone();
    md.set(llama::KEY_ARCHITECTURE, Value::from("gpt2"));
    let e = LlamaConfig::from_metadata(&md).unwrap_err();
    assert!(matches!(&e, GgufError::UnsupportedArchitecture(a) if a == "gpt2"));
    for name in super::arch::SUPPORTED {
        assert!(e.to_string().contains(name), "{e} does not list {name}");
        assert_eq!(Arch::from_name(name).unwrap().name, name);
    }
}

/// The optional hyperparameters of the other architectures: an explicit head
/// dimension wider than `n_embd / n_head` (Qwen3), a sliding window (capping
/// the context), linear RoPE scaling, and named errors for what is not
/// supported.
#[test]
fn architecture_options_from_metadata() {
    let base = TinyLlama::default();
    // Qwen3-style: 8 heads of 16 on a hidden size of 64.
    let wide = LlamaConfig { arch: Arch::QWEN3, n_head: 8, n_head_kv: 2, ..base.config.clone() };
    let t = TinyLlama { config: wide.clone(), sliding_window: Some(100), ..base.clone() };
    let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
    let c = LlamaConfig::from_metadata(g.metadata()).unwrap();
    assert_eq!((c.head_dim, c.n_embd_q(), c.context_length), (16, 128, 100));
    assert!(c.check_tensors(&g).unwrap(), "tied head");
    assert_eq!(g.tensor_info("blk.0.attn_q.weight").unwrap().dims, [64, 128]);
    assert_eq!(g.tensor_info("blk.0.attn_output.weight").unwrap().dims, [128, 64]);

    let md = g.metadata().clone();
    let with = |key: &str, v: Value| {
        let mut md = md.clone();
        md.set(Arch::QWEN3.key(key), v);
        LlamaConfig::from_metadata(&md)
    };
    let c = with(llama::KEY_ROPE_SCALING_TYPE, Value::from("linear")).unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::None, "no factor: no scaling");
    let mut md2 = md.clone();
    md2.set("qwen3.rope.scaling.type", Value::from("linear"));
    md2.set("qwen3.rope.scaling.factor", Value::F32(4.0));
    let c = LlamaConfig::from_metadata(&md2).unwrap();
    assert_eq!((c.rope_scaling, c.rope_scaling.divisor()), (RopeScaling::Linear(4.0), 4.0));
    let invalid = |r: Result<LlamaConfig>, key: &str| {
        assert!(matches!(&r, Err(GgufError::InvalidValue { key: k, .. }) if k == key), "{key}: {r:?}");
    };
    invalid(with(llama::KEY_ROPE_SCALING_TYPE, Value::from("yarn")), "qwen3.rope.scaling.type");
    invalid(with(llama::KEY_SLIDING_WINDOW, Value::U32(0)), "qwen3.attention.sliding_window");
    invalid(with(llama::KEY_VALUE_LENGTH, Value::U32(8)), "qwen3.attention.value_length");
    // A frequency-factor tensor of the wrong length is a named mismatch.
    let mut w = t.writer().unwrap();
    w.add_f32_tensor(llama::ROPE_FREQS, GgmlType::F32, &[3], &[1.0, 2.0, 3.0]).unwrap();
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    let e = c.check_tensors(&g).unwrap_err();
    assert!(matches!(&e, GgufError::TensorMismatch { tensor, .. } if tensor == llama::ROPE_FREQS), "{e}");
}
