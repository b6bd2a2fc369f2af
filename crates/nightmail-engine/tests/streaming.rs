//! Streaming routed experts from disk (through a cache smaller than one layer's experts, so
//! every step evicts) gives bit-identical logits to the fully resident path, for every MoE
//! fixture, from safetensors, GGUF and an expert-major pack; a truncated file fails with an error
//! that names the file and the expert.

use std::path::{Path, PathBuf};

use nightmail_engine::{LoadOptions, Model, StreamConfig};

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(arch)
}

#[derive(serde::Deserialize)]
struct Reference {
    prompt_tokens: Vec<u32>,
    greedy_tokens: Vec<u32>,
}

fn reference(arch: &str) -> Reference {
    serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("reference.json")).unwrap()).unwrap()
}

/// A cache of two 4 KiB blocks: every tiny fixture expert takes at least one, and each layer has
/// at least four experts, so each layer's experts overflow it.
fn tiny_cache(prefetch: usize) -> LoadOptions {
    let mut c = StreamConfig::with_cache_mb(0);
    c.cache_bytes = 2 * 4096;
    c.prefetch_depth = prefetch;
    LoadOptions { stream: Some(c) }
}

/// The logits of every step of a greedy run of `steps` tokens after the prompt.
fn logit_rows(model: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let mut rows = vec![model.logits(prompt, &mut cache).unwrap()];
    for _ in 0..steps {
        let last = rows.last().unwrap();
        let next = last.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0))).unwrap().0 as u32;
        rows.push(model.logits(&[next], &mut cache).unwrap());
    }
    rows
}

fn assert_bit_identical(arch: &str, path: &Path, prefetch: usize) {
    let r = reference(arch);
    let resident = Model::load(path).unwrap();
    let streamed = Model::load_with(path, &tiny_cache(prefetch)).unwrap();
    let want = logit_rows(&resident, &r.prompt_tokens, r.greedy_tokens.len());
    let got = logit_rows(&streamed, &r.prompt_tokens, r.greedy_tokens.len());
    for (step, (a, b)) in want.iter().zip(&got).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{arch} {}: step {step} logits differ between resident and streamed", path.display());
    }
    let stats = streamed.streaming().expect("experts are streamed").stats();
    assert!(stats.evictions > 0, "{arch}: the cache never evicted ({stats:?})");
    assert!(stats.disk_bytes > 0 && stats.misses > 0, "{arch}: nothing was read from disk ({stats:?})");
}

macro_rules! streaming_tests {
    ($($arch:ident),*) => {$(
        mod $arch {
            #[test]
            fn streamed_safetensors_logits_are_bit_identical_to_resident() {
                super::assert_bit_identical(stringify!($arch), &super::fixture(stringify!($arch)), 0);
            }

            #[test]
            fn streamed_gguf_logits_are_bit_identical_to_resident_with_and_without_prefetch() {
                let path = super::fixture(stringify!($arch)).join("model.gguf");
                super::assert_bit_identical(stringify!($arch), &path, 0);
                super::assert_bit_identical(stringify!($arch), &path, 8);
            }

            #[test]
            fn packed_gguf_logits_are_bit_identical_to_resident() {
                let dir = tempfile::tempdir().unwrap();
                let packed = dir.path().join("packed.gguf");
                nightmail_engine::pack(&super::fixture(stringify!($arch)).join("model.gguf"), &packed).unwrap();
                super::assert_bit_identical(stringify!($arch), &packed, 8);
            }
        }
    )*};
}

// kimi_linear's routed experts stream while its KDA layers keep their recurrent state.
streaming_tests!(mixtral, qwen2_moe, qwen3_moe, deepseek_v3, kimi_linear);

/// gpt-oss's experts carry biases, read with their matrices. Its Hugging Face experts are stored
/// fused and rebuilt at load, so only its GGUF streams.
mod gpt_oss {
    #[test]
    fn streamed_gguf_logits_with_expert_biases_are_bit_identical_to_resident() {
        let path = super::fixture("gpt_oss").join("model.gguf");
        super::assert_bit_identical("gpt_oss", &path, 0);
        super::assert_bit_identical("gpt_oss", &path, 8);
    }

    #[test]
    fn packed_gguf_logits_with_expert_biases_are_bit_identical_to_resident() {
        let dir = tempfile::tempdir().unwrap();
        let packed = dir.path().join("packed.gguf");
        nightmail_engine::pack(&super::fixture("gpt_oss").join("model.gguf"), &packed).unwrap();
        super::assert_bit_identical("gpt_oss", &packed, 8);
    }

    #[test]
    fn streamed_mxfp4_gguf_logits_are_bit_identical_to_resident() {
        // The reference prompt is the twin's (gpt_oss_mxfp4/f32).
        let path = super::fixture("gpt_oss_mxfp4").join("model.gguf");
        super::assert_bit_identical("gpt_oss_mxfp4/f32", &path, 8);
    }

    #[test]
    fn fused_safetensors_experts_are_refused_for_streaming_saying_what_to_do() {
        for dir in ["gpt_oss", "gpt_oss_mxfp4"] {
            let err = match nightmail_engine::Model::load_with(super::fixture(dir), &super::tiny_cache(0)) {
                Ok(_) => panic!("{dir}: fused experts were streamed"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains("convert") && err.contains("GGUF"), "{dir}: {err}");
        }
    }
}

#[test]
fn a_packed_expert_is_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let packed = dir.path().join("packed.gguf");
    nightmail_engine::pack(&fixture("qwen3_moe").join("model.gguf"), &packed).unwrap();
    let model = Model::load_with(&packed, &tiny_cache(0)).unwrap();
    let r = reference("qwen3_moe");
    logit_rows(&model, &r.prompt_tokens, 2);
    let s = model.streaming().unwrap().stats();
    assert_eq!(s.disk_reads, s.misses, "one read per expert read on demand: {s:?}");
    let stacked = Model::load_with(fixture("qwen3_moe").join("model.gguf"), &tiny_cache(0)).unwrap();
    assert!(stacked.streaming().unwrap().stats().disk_reads == 0);
}

/// A copy of a fixture's GGUF cut `cut` bytes before its end.
fn truncated_copy(dir: &Path, arch: &str, cut: u64) -> PathBuf {
    let src = fixture(arch).join("model.gguf");
    let dst = dir.join("truncated.gguf");
    std::fs::copy(&src, &dst).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&dst).unwrap();
    f.set_len(f.metadata().unwrap().len() - cut).unwrap();
    dst
}

#[test]
fn a_truncated_file_fails_at_load_naming_the_file_and_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    // The GGUF ends with the last layer's experts (down projections): cutting 1 KiB loses part
    // of an expert, which resident loading would also refuse.
    let path = truncated_copy(dir.path(), "qwen3_moe", 1024);
    let err = match Model::load_with(&path, &tiny_cache(0)) {
        Ok(_) => panic!("a truncated model loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("truncated.gguf"), "{err}");
    assert!(err.contains("expert") && err.contains("layer"), "{err}");
}

#[test]
fn a_file_truncated_while_running_fails_the_step_naming_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let path = truncated_copy(dir.path(), "qwen3_moe", 0);
    let model = Model::load_with(&path, &tiny_cache(0)).unwrap();
    // Cut the file to its first 4 KiB: every expert read now runs past the end.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
    let mut cache = model.new_cache();
    let err = model.logits(&reference("qwen3_moe").prompt_tokens, &mut cache).unwrap_err().to_string();
    assert!(err.contains("truncated.gguf") && err.contains("cannot read expert"), "{err}");
    // The model keeps answering errors, not hanging or panicking.
    let mut cache = model.new_cache();
    assert!(model.logits(&[1], &mut cache).is_err());
}
