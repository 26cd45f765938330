//! Fuzz target: the GGUF reader on arbitrary bytes. Parsing, the Llama config,
//! the vocabulary and every supported tensor view must never panic, whatever the
//! input (errors are fine).

#![no_main]

// The reader's own source, compiled here without the rest of the runtime (see
// Cargo.toml). Items the target does not use are expected.
#[allow(dead_code, unused_imports)]
#[path = "../../src/gguf/mod.rs"]
mod gguf;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = gguf::Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = gguf::LlamaConfig::from_metadata(g.metadata()).map(|c| c.check_tensors(&g));
    let _ = gguf::Vocab::from_metadata(g.metadata());
    for t in g.tensors() {
        if let Ok(view) = g.tensor(&t.name) {
            // Validated tensors hold at most a few values per byte of input, but a
            // tensor with no rows may claim a huge row length.
            let _ = view.to_f32();
            if view.info.row_len() <= 1 << 20 {
                let mut row = vec![0.0; view.info.row_len() as usize];
                let _ = view.dequantize_row(0, &mut row);
            }
        }
    }
});
