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
    LoadOptions { stream: Some(c), memory: None }
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
                nightmail_tools::pack(&super::fixture(stringify!($arch)).join("model.gguf"), &packed).unwrap();
                super::assert_bit_identical(stringify!($arch), &packed, 8);
            }
        }
    )*};
}

// kimi_linear's routed experts stream while its KDA layers keep their recurrent state; kimi_k3's
// live in the latent width and stream as any others do (its GGUF in llama.cpp's kimi-k3 layout).
streaming_tests!(mixtral, qwen2_moe, qwen3_moe, deepseek_v3, kimi_linear, kimi_k3, deepseek_v32, glm_moe_dsa);
// qwen3_next's and qwen3_5_moe's too, beside their Gated DeltaNet states and shared experts' gates.
streaming_tests!(qwen3_next, qwen3_5_moe);
// GLM-4.5's and MiniMax-M2's rotate part of each head; MiniMax-M2 norms q and k across heads.
streaming_tests!(glm4_moe, minimax_m2);
// DeepSeek-V4's stream beside each layer's window and compressor states; the hash-routed layer's
// experts come from the token id.
streaming_tests!(deepseek_v4);

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
        nightmail_tools::pack(&super::fixture("gpt_oss").join("model.gguf"), &packed).unwrap();
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
    nightmail_tools::pack(&fixture("qwen3_moe").join("model.gguf"), &packed).unwrap();
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
fn a_file_truncated_while_running_fails_the_step_naming_the_expert_or_the_embedding_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = truncated_copy(dir.path(), "qwen3_moe", 0);
    let model = Model::load_with(&path, &tiny_cache(0)).unwrap();
    // Cut the file to its first 4 KiB: every expert read now runs past the end. So do the
    // embedding's rows but the first (the file's first tensor, 256 bytes a row), which a step
    // reads from the file (`nightmail-model/src/parts/embedding.rs`): token 0's row is whole, the prompt's are not.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
    let mut cache = model.new_cache();
    let err = model.logits(&[0], &mut cache).unwrap_err().to_string();
    assert!(err.contains("truncated.gguf") && err.contains("cannot read expert"), "{err}");
    let mut cache = model.new_cache();
    let err = model.logits(&reference("qwen3_moe").prompt_tokens, &mut cache).unwrap_err().to_string();
    assert!(err.contains("truncated.gguf") && err.contains("cannot read the embedding row of token"), "{err}");
    // The model keeps answering errors, not hanging or panicking.
    let mut cache = model.new_cache();
    assert!(model.logits(&[1], &mut cache).is_err());
}

/// Dense layers streamed too: at the least budget that streams every dense layer, no
/// layer is resident, the window holds one layer and the expert cache one step's experts in
/// flight (less than one layer's experts), and the logits stay bit-identical to the resident
/// model's; so they do with one layer resident and the others streamed.
mod dense {
    use super::*;
    use nightmail_engine::{EngineError, MemoryBudget};

    /// The reference prompt and a few greedy steps need far less than the default reservation.
    const KV_TOKENS: usize = 64;

    /// The least budget that streams `streamed` (every layer: `None`).
    fn budget(path: &Path, streamed: Option<Vec<usize>>) -> MemoryBudget {
        let layers = nightmail_tools::inspect(path).unwrap().spec.layers;
        let stream_layers = Some(streamed.unwrap_or_else(|| (0..layers).collect()));
        let ask = |bytes| MemoryBudget {
            bytes,
            kv_tokens: KV_TOKENS,
            batch: 1,
            verify_rows: 1,
            stream_layers: stream_layers.clone(),
        };
        let err = nightmail_engine::memory_plan(path, ask(0)).unwrap_err();
        assert!(matches!(err, EngineError::MemoryBudget { .. }), "{err}");
        ask(nightmail_engine::memory_plan(path, ask(usize::MAX / 2)).unwrap().minimum_bytes)
    }

    pub(super) fn assert_streamed_dense_is_bit_identical(arch: &str, path: &Path, streamed: Option<Vec<usize>>) {
        let r = reference(arch);
        let memory = budget(path, streamed);
        let resident = Model::load(path).unwrap();
        let streamed = Model::load_with(path, &LoadOptions { stream: None, memory: Some(memory) }).unwrap();
        let plan = streamed.memory_plan().expect("loaded with a budget");
        assert!(!plan.streamed_layers.is_empty(), "{arch}: no layer streams under {plan:?}");
        let want = logit_rows(&resident, &r.prompt_tokens, r.greedy_tokens.len());
        let got = logit_rows(&streamed, &r.prompt_tokens, r.greedy_tokens.len());
        for (step, (a, b)) in want.iter().zip(&got).enumerate() {
            let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{arch} {}: step {step} logits differ between resident and streamed", path.display());
        }
        let dense = streamed.dense_stream().expect("dense layers stream").stats();
        let steps = 1 + r.greedy_tokens.len() as u64;
        assert_eq!(dense.requests, steps * plan.streamed_layers.len() as u64, "{arch}: {dense:?}");
        assert!(dense.layer_reads >= dense.requests && dense.disk_bytes > 0, "{arch}: {dense:?}");
        assert!(dense.window_used_bytes <= dense.window_budget_bytes, "{arch}: {dense:?}");
        if streamed.spec().moe.is_some() {
            match streamed.streaming() {
                Some(s) => {
                    let s = s.stats();
                    assert!(s.evictions > 0 && s.misses > 0, "{arch}: the expert cache held a layer's experts ({s:?})");
                }
                // Only where all the experts take less than one step's read buffers in flight
                // (kimi_k3's 40 experts of 1.5 KiB, each read widened to aligned blocks).
                None => {
                    let z = &plan.sizes;
                    let in_flight = z.top_k * z.expert_max_bytes;
                    assert!(
                        plan.experts_resident && z.expert_bytes < in_flight,
                        "{arch}: experts resident in {plan:?}"
                    );
                }
            }
        }
    }

    macro_rules! dense_streaming_tests {
        ($($arch:ident),*) => {$(
            mod $arch {
                #[test]
                fn every_dense_layer_and_expert_streamed_at_the_least_budget_is_bit_identical_to_resident() {
                    let path = super::fixture(stringify!($arch)).join("model.gguf");
                    super::assert_streamed_dense_is_bit_identical(stringify!($arch), &path, None);
                }

                #[test]
                fn one_resident_layer_and_the_last_streamed_are_bit_identical_to_resident() {
                    let path = super::fixture(stringify!($arch)).join("model.gguf");
                    let last = nightmail_tools::inspect(&path).unwrap().spec.layers - 1;
                    super::assert_streamed_dense_is_bit_identical(stringify!($arch), &path, Some(vec![last]));
                }
            }
        )*};
    }

    dense_streaming_tests!(
        llama,
        mixtral,
        qwen2_moe,
        qwen3_moe,
        deepseek_v3,
        gpt_oss,
        kimi_linear,
        deepseek_v32,
        glm_moe_dsa
    );
    // A streamed Gated DeltaNet layer is built from its read buffers as a resident one is.
    dense_streaming_tests!(qwen3_next);
    dense_streaming_tests!(glm4_moe, minimax_m2);

    #[test]
    fn safetensors_and_packed_dense_layers_stream_bit_identical() {
        assert_streamed_dense_is_bit_identical("qwen3_moe", &fixture("qwen3_moe"), None);
        assert_streamed_dense_is_bit_identical("deepseek_v3", &fixture("deepseek_v3"), None);
        assert_streamed_dense_is_bit_identical("kimi_linear", &fixture("kimi_linear"), None);
        // K3's dense layers carry their AttnRes scores and latent projections with them.
        assert_streamed_dense_is_bit_identical("kimi_k3", &fixture("kimi_k3"), None);
        let dir = tempfile::tempdir().unwrap();
        let packed = dir.path().join("packed.gguf");
        nightmail_tools::pack(&fixture("mixtral").join("model.gguf"), &packed).unwrap();
        assert_streamed_dense_is_bit_identical("mixtral", &packed, None);
        // An int8 spine (`pack --dense q8_0`) streams as it computes resident.
        for arch in ["qwen3_moe", "kimi_linear"] {
            let spine = dir.path().join(format!("{arch}-q8_0.gguf"));
            let opts =
                nightmail_tools::PackOptions { dense: Some(nightmail_tools::DenseQuant::Q8_0), ..Default::default() };
            nightmail_tools::pack_with(&fixture(arch).join("model.gguf"), &spine, &opts).unwrap();
            assert_streamed_dense_is_bit_identical(arch, &spine, None);
        }
    }

    #[test]
    fn a_budget_below_one_layer_and_the_cache_is_refused_naming_the_minimum() {
        let path = fixture("qwen3_moe").join("model.gguf");
        let enough = budget(&path, None);
        let short = MemoryBudget { bytes: enough.bytes - 1, ..enough.clone() };
        let err = match Model::load_with(&path, &LoadOptions { stream: None, memory: Some(short) }) {
            Ok(_) => panic!("a model loaded in less than its minimum"),
            Err(e) => e,
        };
        let EngineError::MemoryBudget { minimum_mb, .. } = &err else { panic!("{err}") };
        let text = err.to_string();
        assert!(text.contains(&format!("at least {minimum_mb} MiB")) && text.contains("--memory-mb"), "{text}");
        assert!(*minimum_mb as u64 * (1 << 20) >= enough.bytes as u64, "{text}");
        // The planner's own choice needs no more than streaming every layer.
        let planned = MemoryBudget { stream_layers: None, ..enough };
        assert!(Model::load_with(&path, &LoadOptions { stream: None, memory: Some(planned) }).is_ok());
    }

    #[test]
    fn a_budget_that_holds_everything_streams_nothing() {
        let path = fixture("qwen3_moe").join("model.gguf");
        let all = MemoryBudget { bytes: 1 << 30, kv_tokens: KV_TOKENS, batch: 1, verify_rows: 1, stream_layers: None };
        let model = Model::load_with(&path, &LoadOptions { stream: None, memory: Some(all) }).unwrap();
        assert!(model.dense_stream().is_none() && model.streaming().is_none());
    }
}

/// `model pack --stripe DIR1,DIR2`: the experts in one file per directory (a disk each), the
/// dense tensors in the main file that lists them.
mod stripe {
    use super::*;
    use nightmail_engine::{EngineError, FormatError};
    use nightmail_tools::PackOptions;

    /// `arch`'s fixture packed with its experts striped over two directories: the main file
    /// and the two parts.
    fn striped(arch: &str, root: &Path) -> (PathBuf, [PathBuf; 2]) {
        let dirs = [root.join("disk1"), root.join("disk2")];
        dirs.iter().for_each(|d| std::fs::create_dir_all(d).unwrap());
        let main = root.join("model.gguf");
        let opts = PackOptions { stripe: dirs.to_vec(), ..PackOptions::default() };
        nightmail_tools::pack_with(&fixture(arch).join("model.gguf"), &main, &opts).unwrap();
        let parts = dirs.map(|d| {
            let files: Vec<PathBuf> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).collect();
            assert_eq!(files.len(), 1, "{arch}: {files:?}");
            files[0].clone()
        });
        (main, parts)
    }

    #[test]
    fn a_striped_model_reads_its_experts_from_both_parts_bit_identical_to_the_original() {
        for arch in ["qwen3_moe", "gpt_oss", "kimi_linear"] {
            let dir = tempfile::tempdir().unwrap();
            let (main, parts) = striped(arch, dir.path());
            // The experts left the main file and split about evenly between the parts.
            let plain = dir.path().join("plain.gguf");
            nightmail_tools::pack(&fixture(arch).join("model.gguf"), &plain).unwrap();
            let size = |p: &Path| std::fs::metadata(p).unwrap().len();
            let (a, b) = (size(&parts[0]), size(&parts[1]));
            assert!(a.abs_diff(b) * 4 < a + b, "{arch}: parts of {a} and {b} bytes");
            // Every expert is in one file only: the three files hold what the plain pack does,
            // plus two more headers' padding.
            let (all, plain) = (size(&main) + a + b, size(&plain));
            assert!(all >= plain && all <= plain + 2 * 65536, "{arch}: {all} bytes striped, {plain} plain");
            let r = reference(arch);
            let want = logit_rows(&Model::load(fixture(arch).join("model.gguf")).unwrap(), &r.prompt_tokens, 4);
            let got = logit_rows(&Model::load(&main).unwrap(), &r.prompt_tokens, 4);
            assert!(want == got, "{arch}: the striped model's resident logits differ from the original's");
            // Streamed through a cache smaller than a layer's experts, and with every dense layer
            // streamed too.
            assert_bit_identical(arch, &main, 2);
            dense::assert_streamed_dense_is_bit_identical(arch, &main, None);
            // Each part (disk) is read, by the I/O threads dealt out to it, and counted apart.
            let streamed = Model::load_with(&main, &tiny_cache(2)).unwrap();
            logit_rows(&streamed, &r.prompt_tokens, 4);
            let s = streamed.streaming().unwrap().stats();
            let files: Vec<&Path> = s.files.iter().map(|f| f.path.as_path()).collect();
            let canonical = parts.clone().map(|p| std::fs::canonicalize(p).unwrap());
            assert_eq!(files, canonical.iter().map(PathBuf::as_path).collect::<Vec<_>>(), "{arch}");
            assert!(s.files.iter().all(|f| f.disk_reads > 0 && f.disk_bytes > 0 && f.busy_s > 0.0), "{arch}: {s:?}");
            assert_eq!(s.files.iter().map(|f| f.disk_bytes).sum::<u64>(), s.disk_bytes, "{arch}");
        }
    }

    #[test]
    fn a_missing_part_is_named_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let (main, parts) = striped("qwen3_moe", dir.path());
        std::fs::remove_file(&parts[1]).unwrap();
        let err = match Model::load(&main) {
            Ok(_) => panic!("a striped model without its second part loaded"),
            Err(e) => e,
        };
        assert!(matches!(err, EngineError::Format(FormatError::MissingStripe { .. })), "{err}");
        let text = err.to_string();
        let part = std::fs::canonicalize(dir.path().join("disk2")).unwrap();
        assert!(text.contains(&part.display().to_string()) && text.contains("mount the disk"), "{text}");
    }

    #[test]
    fn striping_a_model_without_experts_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PackOptions { stripe: vec![dir.path().to_path_buf()], ..PackOptions::default() };
        let err = nightmail_tools::pack_with(&fixture("llama").join("model.gguf"), &dir.path().join("x.gguf"), &opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--stripe") && err.contains("none"), "{err}");
    }
}
