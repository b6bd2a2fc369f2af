//! Drafting with the model's own multi-token-prediction layer (`draft = "mtp"`), on the
//! deepseek_v3_mtp and glm4_moe_mtp fixtures (tests/fixtures/generate.py `write_mtp_fixture`:
//! tiny random DeepSeek-V3 and GLM-4.5 models with one MTP layer, the reference built from
//! transformers' own decoder layer and RMSNorm of each, composed as vLLM's deepseek_mtp.py runs
//! it). The layer's logits match the
//! reference at every position, from the safetensors (the layer in a shard of its own, with
//! copies of the embedding and head) and from the GGUF (llama.cpp's `blk.N.nextn.*` names,
//! sharing them); drafting with it gives the plain tokens, greedy and sampled, through
//! checkpoints and in batches; a model without the layer, or with a truncated one, is refused.

mod common;

use std::path::{Path, PathBuf};

use nightmail_engine::{Completion, Draft, GenerateRequest, LoadOptions, MemoryBudget, Model, Prompt, Sampling};

const FIXTURE: &str = "deepseek_v3_mtp";

/// Every fixture with an MTP layer: DeepSeek-V3's (latent attention) and GLM-4.5's NextN layer
/// (grouped-query attention with biases, q/k norms and partial rotary), same names, same parts;
/// Qwen3-Next's (`mtp.*`: gated full attention, (1 + w) norms, a chained guess reading the
/// normed output).
const FIXTURES: [&str; 3] = [FIXTURE, "glm4_moe_mtp", "qwen3_next_mtp"];

#[derive(serde::Deserialize)]
struct MtpReference {
    prompt_tokens: Vec<u32>,
    greedy_tokens: Vec<u32>,
    mtp_logits: Vec<Vec<f32>>,
}

fn mtp_reference(fixture: &str) -> MtpReference {
    let text = std::fs::read_to_string(common::fixture(fixture).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Each fixture's safetensors directory and GGUF, with the fixture's name (llama.cpp's qwen3next
/// converter drops the MTP layer, so that GGUF has none: see the refusal test).
fn files() -> Vec<(&'static str, PathBuf)> {
    let mut files: Vec<_> = FIXTURES.iter().map(|f| (*f, common::fixture(f))).collect();
    files.extend(FIXTURES[..2].iter().map(|f| (*f, common::fixture(f).join("model.gguf"))));
    files
}

fn with_mtp(path: &Path) -> Model {
    let mut model = Model::load(path).unwrap();
    model.attach_mtp().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    model
}

fn request(prompt: &[u32], tokens: usize, sampling: Sampling, draft: Draft) -> GenerateRequest {
    let mut r = common::draft_request(Prompt::Tokens(prompt.to_vec()), tokens, sampling, draft);
    r.record_logits = true;
    r
}

fn run(model: &Model, r: GenerateRequest) -> Completion {
    model.generate(r, |_| std::ops::ControlFlow::Continue(())).unwrap()
}

#[test]
fn the_mtp_layers_logits_match_the_reference_at_every_position() {
    for (fixture, path) in files() {
        let reference = mtp_reference(fixture);
        let mut sequence = reference.prompt_tokens.clone();
        sequence.extend(&reference.greedy_tokens);
        let model = with_mtp(&path);
        let rows = model.mtp_logits(&sequence).unwrap();
        assert_eq!(rows.len(), reference.mtp_logits.len(), "{}: one row per position but the last", path.display());
        let mut worst = 0f32;
        for (i, (ours, theirs)) in rows.iter().zip(&reference.mtp_logits).enumerate() {
            let err = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4, "{} position {i}: max |Δlogit| = {err:e}", path.display());
            worst = worst.max(err);
        }
        eprintln!("{}: MTP logits within {worst:.3e} over {} positions", path.display(), rows.len());
    }
}

#[test]
fn greedy_with_mtp_drafts_gives_the_plain_tokens() {
    for (fixture, path) in files() {
        let reference = mtp_reference(fixture);
        let model = with_mtp(&path);
        let name = path.display().to_string();
        let plain = run(&model, request(&reference.prompt_tokens, 40, Sampling::greedy(), Draft::None));
        let drafted = run(&model, request(&reference.prompt_tokens, 40, Sampling::greedy(), Draft::Mtp));
        common::assert_drafts_save_passes(&plain, &drafted, &name);
        assert_eq!(plain.tokens[..16], reference.greedy_tokens[..], "{name}: the reference's tokens");
        eprintln!(
            "{name}: {} of {} MTP guesses held, {} passes for {} tokens (random weights)",
            drafted.accepted,
            drafted.drafted,
            drafted.verify_steps,
            drafted.tokens.len()
        );
    }
}

#[test]
fn sampled_with_mtp_drafts_draws_the_tokens_plain_sampling_draws() {
    for fixture in FIXTURES {
        let model = with_mtp(&common::fixture(fixture));
        let prompt = mtp_reference(fixture).prompt_tokens;
        for seed in 0..4 {
            let sampling = Sampling { temperature: 0.8, top_k: Some(40), top_p: Some(0.95), seed };
            let plain = run(&model, request(&prompt, 24, sampling, Draft::None));
            let drafted = run(&model, request(&prompt, 24, sampling, Draft::Mtp));
            assert_eq!(drafted.tokens, plain.tokens, "{fixture} seed {seed}");
            assert!(drafted.drafted > 0, "{fixture} seed {seed}: nothing drafted");
        }
    }
}

#[test]
fn a_checkpoint_holds_only_accepted_tokens_and_resumes_with_mtp_drafts() {
    // A resumed stream's MTP layer starts at the restored position (no hidden states before it).
    for fixture in FIXTURES {
        let model = with_mtp(&common::fixture(fixture));
        let prompt = mtp_reference(fixture).prompt_tokens;
        let want = run(&model, request(&prompt, 20, Sampling::greedy(), Draft::None));
        let events = common::across_crashes(&model, &request(&prompt, 20, Sampling::greedy(), Draft::Mtp), fixture);
        let got: Vec<u32> = events.iter().map(|e| e.id).collect();
        assert_eq!(got, want.tokens, "{fixture}");
    }
}

#[test]
fn streams_with_mtp_lookup_and_no_drafts_batched_together_get_what_they_get_alone() {
    let model = with_mtp(&common::fixture(FIXTURE));
    let sampled = Sampling { temperature: 0.9, top_k: Some(20), top_p: Some(0.9), seed: 3 };
    let prompt = mtp_reference(FIXTURE).prompt_tokens;
    let setups = [
        (prompt.clone(), Sampling::greedy(), Draft::Mtp),
        ((1..20).collect::<Vec<u32>>(), sampled, Draft::Mtp),
        (prompt.clone(), sampled, Draft::None),
        (vec![7, 8, 9, 7, 8], Sampling::greedy(), Draft::Lookup),
    ];
    let want: Vec<Vec<u32>> =
        setups.iter().map(|(p, s, _)| run(&model, request(p, 12, *s, Draft::None)).tokens).collect();
    let mut streams: Vec<_> =
        setups.iter().map(|(p, s, d)| model.stream_deferred(request(p, 12, *s, *d), None).unwrap()).collect();
    let got = common::step_together(&model, &mut streams);
    assert_eq!(got, want);
    let completions: Vec<Completion> = streams.into_iter().map(|s| s.into_completion()).collect();
    assert!(completions[..2].iter().all(|c| c.drafted > 0), "the MTP streams drafted");
}

#[test]
fn mtp_drafting_on_a_model_without_the_layer_is_refused_naming_the_model_and_the_key() {
    // No count at all: the key is named, in config.json's spelling or the GGUF's.
    for (path, key) in [
        (common::fixture("llama"), "`num_nextn_predict_layers`"),
        (common::fixture("llama").join("model.gguf"), "`llama.nextn_predict_layers`"),
        (common::fixture("deepseek_v3").join("model.gguf"), "`deepseek2.nextn_predict_layers`"),
        (common::fixture("qwen3_next_mtp").join("model.gguf"), "`qwen3next.nextn_predict_layers`"),
    ] {
        let err = Model::load(&path).unwrap().attach_mtp().unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains(key), "{err}");
        assert!(err.contains("no multi-token-prediction layer"), "{err}");
    }
    // transformers' DeepseekV3Config counts one by default: the weights are looked for, and the
    // first missing one is named with the directory.
    let dir = common::fixture("deepseek_v3");
    let err = Model::load(&dir).unwrap().attach_mtp().unwrap_err().to_string();
    assert!(err.contains("`model.layers.3.eh_proj.weight`") && err.contains(&dir.display().to_string()), "{err}");
    // Drafting with the layer not loaded says how to load it.
    let model = Model::load(common::fixture(FIXTURE)).unwrap();
    let Err(err) = model.stream(request(&[1, 2, 3], 4, Sampling::greedy(), Draft::Mtp)) else {
        panic!("drafting without the layer was not refused")
    };
    assert!(err.to_string().contains("draft = \"mtp\""), "{err}");
}

#[test]
fn a_truncated_mtp_tensor_is_named_with_its_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["config.json", "model.safetensors", "mtp.safetensors"] {
        std::fs::copy(common::fixture(FIXTURE).join(name), dir.path().join(name)).unwrap();
    }
    let shard = dir.path().join("mtp.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len - 100).unwrap();
    let Err(err) = Model::load(dir.path()) else { panic!("a truncated shard loaded") };
    let err = err.to_string();
    assert!(err.contains("model.layers.2.") && err.contains(&shard.display().to_string()), "{err}");
    // The GGUF, read in place, checks a tensor's extent when it is used: its last tensor is
    // the MTP layer's.
    let gguf = dir.path().join("model.gguf");
    std::fs::copy(common::fixture(FIXTURE).join("model.gguf"), &gguf).unwrap();
    let len = std::fs::metadata(&gguf).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&gguf).unwrap().set_len(len - 100).unwrap();
    // The model's own layers load; the MTP layer's load reads the cut tensor.
    let err = Model::load(&gguf).unwrap().attach_mtp().unwrap_err().to_string();
    assert!(err.contains("blk.2.") && err.contains(&gguf.display().to_string()), "{err}");
}

#[test]
fn a_streamed_model_drafts_with_its_resident_mtp_layer() {
    // Every dense layer streamed and the experts through a small cache: the MTP layer (loaded
    // resident beside them) reads the same hidden states, and the tokens are the plain ones.
    let path = common::fixture(FIXTURE);
    let prompt = mtp_reference(FIXTURE).prompt_tokens;
    let want = run(&with_mtp(&path), request(&prompt, 16, Sampling::greedy(), Draft::None)).tokens;
    let ask = |bytes| MemoryBudget { bytes, kv_tokens: 64, batch: 1, stream_layers: Some(vec![0, 1]) };
    let least = nightmail_engine::memory_plan(&path, ask(usize::MAX / 2)).unwrap().minimum_bytes;
    let mut streamed = Model::load_with(&path, &LoadOptions { stream: None, memory: Some(ask(least)) }).unwrap();
    assert_eq!(streamed.memory_plan().unwrap().streamed_layers.len(), 2);
    streamed.attach_mtp().unwrap();
    let drafted = run(&streamed, request(&prompt, 16, Sampling::greedy(), Draft::Mtp));
    assert_eq!(drafted.tokens, want);
    assert!(drafted.drafted > 0);
}
