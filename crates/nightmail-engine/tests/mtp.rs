//! Drafting with the model's own multi-token-prediction layer (`draft = "mtp"`), on the
//! deepseek_v3_mtp and glm4_moe_mtp fixtures (tests/fixtures/generate.py `write_mtp_fixture`:
//! tiny random DeepSeek-V3 and GLM-4.5 models with one MTP layer, the reference built from
//! transformers' own decoder layer and RMSNorm of each, composed as vLLM's deepseek_mtp.py runs
//! it). The layer's logits match the
//! reference at every position, from the safetensors (the layer in a shard of its own, with
//! copies of the embedding and head) and from the GGUF (llama.cpp's `blk.N.nextn.*` names,
//! sharing them); drafting with it gives the plain tokens, greedy and sampled, through
//! checkpoints and in batches; a model without the layer, or with a truncated one, is refused.
//! Its routed experts stream through the model's store and cache (bit-identical), the memory
//! plan and `model inspect` count the layer apart, and `model pack` keeps it.

mod common;

use std::path::{Path, PathBuf};

use nightmail_engine::{
    Completion, Drafting, GenerateRequest, LoadOptions, MemoryBudget, Model, Prompt, Sampling, StreamConfig,
};

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

/// Each fixture's safetensors directory and GGUF, with the fixture's name (the GGUFs keep the
/// layer as blk.N.nextn.*, as llama.cpp's converters do: conversion/qwen.py's _QwenMtpMixin for
/// qwen3next), and the files llama.cpp's converter wrote where it keeps the layer (its deepseek2
/// conversion drops it).
fn files() -> Vec<(&'static str, PathBuf)> {
    let mut files: Vec<_> = FIXTURES.iter().map(|f| (*f, common::fixture(f))).collect();
    files.extend(FIXTURES.iter().map(|f| (*f, common::fixture(f).join("model.gguf"))));
    files.extend(["glm4_moe_mtp", "qwen3_next_mtp"].map(|f| (f, common::fixture(f).join("llama_cpp.gguf"))));
    files.push(("qwen3_next_mtp", common::fixture("qwen3_next_mtp").join("llama_cpp_fused.gguf")));
    files
}

fn with_mtp(path: &Path) -> Model {
    let mut model = Model::load(path).unwrap();
    model.attach_mtp().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    model
}

fn request(prompt: &[u32], tokens: usize, sampling: Sampling, draft: Drafting) -> GenerateRequest {
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
        let plain = run(&model, request(&reference.prompt_tokens, 40, Sampling::greedy(), Drafting::None));
        let drafted = run(&model, request(&reference.prompt_tokens, 40, Sampling::greedy(), Drafting::Mtp));
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
            let plain = run(&model, request(&prompt, 24, sampling, Drafting::None));
            let drafted = run(&model, request(&prompt, 24, sampling, Drafting::Mtp));
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
        let want = run(&model, request(&prompt, 20, Sampling::greedy(), Drafting::None));
        let events = common::across_crashes(&model, &request(&prompt, 20, Sampling::greedy(), Drafting::Mtp), fixture);
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
        (prompt.clone(), Sampling::greedy(), Drafting::Mtp),
        ((1..20).collect::<Vec<u32>>(), sampled, Drafting::Mtp),
        (prompt.clone(), sampled, Drafting::None),
        (vec![7, 8, 9, 7, 8], Sampling::greedy(), Drafting::Lookup),
    ];
    let want: Vec<Vec<u32>> =
        setups.iter().map(|(p, s, _)| run(&model, request(p, 12, *s, Drafting::None)).tokens).collect();
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
        (common::fixture("qwen3_next").join("model.gguf"), "`qwen3next.nextn_predict_layers`"),
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
    let Err(err) = model.stream(request(&[1, 2, 3], 4, Sampling::greedy(), Drafting::Mtp)) else {
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

/// `path` loaded with its routed experts streamed through a cache smaller than one layer's
/// experts (8 of 64 x 32 f32 matrices: 196 KiB), and its MTP layer.
fn streamed_with_mtp(path: &Path) -> Model {
    let stream = StreamConfig { cache_bytes: 16 << 10, ..StreamConfig::with_cache_mb(0) };
    let mut model = Model::load_with(path, &LoadOptions { stream: Some(stream), memory: None }).unwrap();
    model.attach_mtp().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    model
}

#[test]
fn the_mtp_layers_experts_stream_through_the_models_store_and_change_no_bit() {
    for (fixture, path) in files() {
        let name = path.display().to_string();
        let reference = mtp_reference(fixture);
        let mut sequence = reference.prompt_tokens.clone();
        sequence.extend(&reference.greedy_tokens);
        let (resident, streamed) = (with_mtp(&path), streamed_with_mtp(&path));
        assert_eq!(streamed.mtp_logits(&sequence).unwrap(), resident.mtp_logits(&sequence).unwrap(), "{name}");
        // The MTP layer (index 2, past the model's two) asked the model's store for its experts.
        let stats = streamed.streaming().expect("experts streamed").stats();
        let layers: Vec<usize> = stats.distinct_experts.iter().map(|(l, _)| *l).collect();
        assert!(layers.contains(&2), "{name}: {layers:?}");
        assert!(stats.evictions > 0, "{name}: the cache held every expert: {stats:?}");
        let want = run(&resident, request(&reference.prompt_tokens, 24, Sampling::greedy(), Drafting::Mtp));
        let got = run(&streamed, request(&reference.prompt_tokens, 24, Sampling::greedy(), Drafting::Mtp));
        // (How many it guesses per pass follows each model's timed passes.)
        assert_eq!(got.tokens, want.tokens, "{name}");
        assert!(got.drafted > 0, "{name}");
    }
}

/// The byte lengths of a safetensors file's tensors (its JSON header), with their names.
fn safetensors_bytes(path: &Path) -> Vec<(String, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            (k.clone(), o[1].as_u64().unwrap() - o[0].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn inspect_counts_the_mtp_layer_apart_from_the_model() {
    // The fixture's directory keeps the model in model.safetensors and the MTP layer (with
    // copies of the embedding and head) in mtp.safetensors.
    for fixture in FIXTURES {
        let dir = common::fixture(fixture);
        let model: u64 = safetensors_bytes(&dir.join("model.safetensors")).iter().map(|(_, b)| b).sum();
        let mtp = safetensors_bytes(&dir.join("mtp.safetensors"));
        let info = nightmail_tools::inspect(&dir).unwrap();
        assert_eq!(info.dense_bytes + info.expert_bytes, model, "{fixture}");
        assert_eq!(info.parameters * 4, model, "{fixture}: f32");
        let m = info.mtp.as_ref().expect("an MTP layer");
        assert_eq!((m.tensors, m.bytes), (mtp.len(), mtp.iter().map(|(_, b)| b).sum()), "{fixture}");
        let experts: u64 = mtp.iter().filter(|(n, _)| n.contains(".experts.")).map(|(_, b)| b).sum();
        assert_eq!((m.expert_bytes, m.parameters * 4), (experts, m.bytes), "{fixture}");
        assert!(experts > 0, "{fixture}");
    }
    // The GGUF: the same model, and the MTP layer without the copies (llama.cpp shares them;
    // Qwen3-Next's checkpoint holds none).
    for fixture in FIXTURES {
        let (hf, gguf) = (common::fixture(fixture), common::fixture(fixture).join("model.gguf"));
        let (a, b) = (nightmail_tools::inspect(&hf).unwrap(), nightmail_tools::inspect(&gguf).unwrap());
        assert_eq!((b.parameters, b.dense_bytes, b.expert_bytes), (a.parameters, a.dense_bytes, a.expert_bytes));
        let (ma, mb) = (a.mtp.unwrap(), b.mtp.unwrap());
        let copies = safetensors_bytes(&hf.join("mtp.safetensors"))
            .iter()
            .filter(|(n, _)| n.ends_with("embed_tokens.weight") || n.ends_with("shared_head.head.weight"))
            .map(|(_, b)| b / 4)
            .sum::<u64>();
        assert_eq!((mb.parameters, mb.expert_bytes), (ma.parameters - copies, ma.expert_bytes), "{fixture}");
    }
    assert!(nightmail_tools::inspect(&common::fixture("deepseek_v3")).unwrap().mtp.is_none());
}

#[test]
fn the_memory_plan_keeps_the_mtp_layers_dense_weights_and_streams_its_experts() {
    for (fixture, path) in files() {
        let name = path.display().to_string();
        let info = nightmail_tools::inspect(&path).unwrap();
        let m = info.mtp.as_ref().unwrap();
        // Its dense weights, less the copies of the embedding and head that it shares (f32:
        // resident as on disk).
        let copies: u64 = match path.is_dir() {
            true => safetensors_bytes(&path.join("mtp.safetensors"))
                .iter()
                .filter(|(n, _)| n.ends_with("embed_tokens.weight") || n.ends_with("shared_head.head.weight"))
                .map(|(_, b)| b)
                .sum(),
            // llama.cpp's converter keeps GLM's copies as blk.N.nextn.embed_tokens and
            // shared_head_head; our generate.py leaves them out.
            false => nightmail_formats::ModelFile::open(&path)
                .unwrap()
                .all_tensors()
                .unwrap()
                .iter()
                .filter(|t| {
                    t.name.ends_with("nextn.embed_tokens.weight") || t.name.ends_with("nextn.shared_head_head.weight")
                })
                .map(|t| t.dtype.byte_len(t.elem_count()) as u64)
                .sum(),
        };
        let dense = (m.bytes - m.expert_bytes - copies) as usize;
        let ask = |bytes| MemoryBudget { bytes, kv_tokens: 64, batch: 1, verify_rows: 1, stream_layers: None };
        let least = nightmail_engine::memory_plan(&path, ask(usize::MAX / 2)).unwrap();
        assert_eq!(least.mtp_bytes, dense, "{name}");
        let sizes = least.sizes.mtp.as_ref().unwrap();
        assert_eq!((sizes.layer, sizes.expert_bytes), (2, m.expert_bytes as usize), "{name}");
        assert!(least.experts_resident && least.expert_cache_bytes == (info.expert_bytes + m.expert_bytes) as usize);
        // At the least budget the experts stream, the MTP layer's with them, through one cache;
        // a byte less is refused, and the refusal counts the MTP layer.
        let opts = nightmail_tools::PlanOptions {
            model: path.clone(),
            budget: ask(least.minimum_bytes),
            disk_gbps: Some(1.0),
            mem_gbps: None,
            probe_bytes: 0,
            batches: vec![1],
            prompt_tokens: None,
        };
        let plan = nightmail_tools::plan(&opts).unwrap().plan;
        assert!(plan.mtp_bytes == dense, "{name}: {plan:?}");
        assert!(plan.minimum_bytes >= plan.fixed_bytes + dense + plan.kv_bytes, "{name}");
        let err = nightmail_engine::memory_plan(&path, ask(least.minimum_bytes - 1)).unwrap_err().to_string();
        assert!(err.contains("MTP layer"), "{err}");
        // Qwen3-Next's fixture has four tiny experts a layer: the reserve for two in flight
        // (read buffers of 4 KiB blocks) holds them all, so they stay resident.
        let s = &plan.sizes;
        if s.top_k * s.expert_max_bytes >= s.cached_expert_bytes() {
            assert!(plan.experts_resident && fixture == "qwen3_next_mtp", "{name}: {plan:?}");
            continue;
        }
        assert!(!plan.experts_resident, "{name}: {plan:?}");
        let mut model =
            Model::load_with(&path, &LoadOptions { stream: None, memory: Some(ask(least.minimum_bytes)) }).unwrap();
        model.attach_mtp().unwrap();
        let prompt = mtp_reference(fixture).prompt_tokens;
        let got = run(&model, request(&prompt, 12, Sampling::greedy(), Drafting::Mtp));
        assert!(got.drafted > 0, "{name}");
        let layers: Vec<usize> = model.streaming().unwrap().stats().distinct_experts.iter().map(|(l, _)| *l).collect();
        assert!(layers.contains(&2), "{name}: {layers:?}");
    }
}

#[test]
fn a_streamed_model_drafts_with_its_mtp_layer() {
    // Every dense layer streamed and the experts through a small cache: the MTP layer (its dense
    // weights resident, its experts through the same cache) reads the same hidden states, and
    // the tokens are the plain ones.
    let path = common::fixture(FIXTURE);
    let prompt = mtp_reference(FIXTURE).prompt_tokens;
    let want = run(&with_mtp(&path), request(&prompt, 16, Sampling::greedy(), Drafting::None)).tokens;
    let ask = |bytes| MemoryBudget { bytes, kv_tokens: 64, batch: 1, verify_rows: 1, stream_layers: Some(vec![0, 1]) };
    let least = nightmail_engine::memory_plan(&path, ask(usize::MAX / 2)).unwrap().minimum_bytes;
    let mut streamed = Model::load_with(&path, &LoadOptions { stream: None, memory: Some(ask(least)) }).unwrap();
    assert_eq!(streamed.memory_plan().unwrap().streamed_layers.len(), 2);
    streamed.attach_mtp().unwrap();
    let drafted = run(&streamed, request(&prompt, 16, Sampling::greedy(), Drafting::Mtp));
    assert_eq!(drafted.tokens, want);
    assert!(drafted.drafted > 0);
}

#[test]
fn a_packed_model_keeps_its_mtp_layer_and_drafts_with_it() {
    // `model pack` lays the MTP layer's experts out with the others; `--dense` requantizes its
    // dense weights with the model's.
    use nightmail_tools::{DenseQuant, PackOptions};
    let dir = tempfile::tempdir().unwrap();
    for fixture in &FIXTURES[..2] {
        let src = common::fixture(fixture).join("model.gguf");
        let reference = mtp_reference(fixture);
        let mut sequence = reference.prompt_tokens.clone();
        sequence.extend(&reference.greedy_tokens);
        let want = with_mtp(&src).mtp_logits(&sequence).unwrap();
        let scale = want.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
        let argmax = |r: &[f32]| r.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        // Per --dense: the largest |Δlogit| against the source's MTP layer, and the guesses kept.
        let mut errors = Vec::new();
        for dense in [None, Some(DenseQuant::Q8_0), Some(DenseQuant::Q4_0)] {
            let packed = dir.path().join(format!("{fixture}-{dense:?}.gguf"));
            let report = nightmail_tools::pack_with(&src, &packed, &PackOptions { dense, stripe: vec![] }).unwrap();
            let what = format!("{fixture} packed, dense {dense:?}");
            assert!(dense.is_none() || report.requantized > 0, "{what}");
            // The packed file holds the MTP layer's experts, one by one, and its dense matrices
            // requantized with the model's (its norms and router stay f32).
            let (before, after) = (nightmail_tools::inspect(&src).unwrap(), nightmail_tools::inspect(&packed).unwrap());
            let (before, after) = (before.mtp.unwrap(), after.mtp.unwrap());
            assert_eq!(after.expert_bytes, before.expert_bytes, "{what}");
            // Three stacked expert tensors became three per expert.
            assert_eq!(after.tensors, before.tensors - 3 + 3 * 8, "{what}");
            if dense.is_none() {
                assert_eq!(after.bytes, before.bytes, "{what}");
            }
            if let Some(q) = dense {
                let requantized = after.dtypes.get(&format!("{q:?}")).map_or(0, |u| u.tensors);
                assert!(requantized >= 4, "{what}: {:?}", after.dtypes);
            }
            let mut seen = Vec::new();
            for model in [with_mtp(&packed), streamed_with_mtp(&packed)] {
                let got = model.mtp_logits(&sequence).unwrap();
                let err =
                    got.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let kept = got.iter().zip(&want).filter(|(a, b)| argmax(a) == argmax(b)).count();
                seen.push((err, kept));
                let plain = run(&model, request(&reference.prompt_tokens, 24, Sampling::greedy(), Drafting::None));
                let drafted = run(&model, request(&reference.prompt_tokens, 24, Sampling::greedy(), Drafting::Mtp));
                assert_eq!(drafted.tokens, plain.tokens, "{what}");
                assert!(drafted.drafted > 0, "{what}");
            }
            // Streaming the packed experts changes no bit.
            assert_eq!(seen[0], seen[1], "{what}");
            let (err, kept) = seen[0];
            eprintln!(
                "{what}: MTP logits within {err:.3e} ({:.2e} of the largest |logit|), the same guess at {kept}/{}",
                err / scale,
                want.len()
            );
            errors.push((err, kept));
        }
        // Laid out only: bit for bit. Requantized: on these tiny random models (logits of a few
        // units, near ties) the model's own logits move as much (deepseek_v3_mtp: 0.41 of the
        // largest at q8_0, tests/requantize.rs's fixtures stay under 0.25); q8_0 stays within
        // half the largest logit, keeps most guesses and is closer than q4_0.
        assert_eq!(errors[0], (0.0, want.len()), "{fixture}");
        let ((q8, q8_kept), (q4, _)) = (errors[1], errors[2]);
        assert!(q8 < 0.5 * scale && q8 < q4, "{fixture}: q8_0 {q8:e}, q4_0 {q4:e}, largest {scale}");
        assert!(q8_kept * 4 >= want.len() * 3, "{fixture}: q8_0 kept {q8_kept} of {} guesses", want.len());
    }
}
