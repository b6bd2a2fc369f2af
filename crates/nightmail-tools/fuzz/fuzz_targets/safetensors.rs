//! Arbitrary bytes as a Hugging Face model directory's `model.safetensors` (an 8-byte
//! little-endian header length, a JSON header, the data: huggingface/safetensors `README.md`
//! "Format"), beside the `config.json` of one of the reference fixtures, which the input's first
//! byte picks: the header reader (`nightmail-formats/src/hf.rs`), the spec from `config.json` and the tensor
//! names, `inspect`, loading and a forward pass. Seeds: the fixtures' own weights, each behind the
//! byte that picks its config (`fuzz/seeds.sh`).

#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

/// The fixtures' configs, in the order `fuzz/seeds.sh` numbers them.
pub const CONFIGS: [&str; 9] = [
    include_str!("../../../../tests/fixtures/llama/config.json"),
    include_str!("../../../../tests/fixtures/mixtral/config.json"),
    include_str!("../../../../tests/fixtures/qwen2_moe/config.json"),
    include_str!("../../../../tests/fixtures/qwen3_moe/config.json"),
    include_str!("../../../../tests/fixtures/deepseek_v3/config.json"),
    include_str!("../../../../tests/fixtures/gpt_oss/config.json"),
    include_str!("../../../../tests/fixtures/gpt_oss_mxfp4/config.json"),
    include_str!("../../../../tests/fixtures/kimi_linear/config.json"),
    include_str!("../../../../tests/fixtures/kimi_k3/config.json"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, weights)) = data.split_first() else { return };
    let dir = common::SCRATCH.as_path();
    std::fs::write(dir.join("config.json"), CONFIGS[pick as usize % CONFIGS.len()]).expect("write config.json");
    std::fs::write(dir.join("model.safetensors"), weights).expect("write the input");
    common::exercise(dir);
});
