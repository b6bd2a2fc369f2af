//! Arbitrary bytes as a GGUF model file (llama.cpp `docs/gguf.md`): the header reader
//! (`nightmail-formats/src/gguf.rs`), the model spec read from its metadata (`spec.rs`), `inspect`, loading and a
//! forward pass. Seeds: tiny `model synth` models of each synthesized architecture and the
//! reference fixtures' GGUFs (`fuzz/seeds.sh`).

#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = common::SCRATCH.join("model.gguf");
    std::fs::write(&path, data).expect("write the input");
    common::exercise(&path);
});
