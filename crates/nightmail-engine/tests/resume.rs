//! Checkpoints: a generation stopped at any point (the process "crashes": the stream is dropped
//! without a word) and resumed from its checkpoint file gives the tokens and logits of an
//! uninterrupted run, greedy and sampled, from safetensors and GGUF, and survives a torn write.

use std::path::{Path, PathBuf};

use nightmail_engine::{GenerateRequest, Model, Prompt, Sampling};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

fn request(sampling: Sampling) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(vec![1, 2, 3, 4, 5]));
    r.max_new_tokens = 24;
    r.sampling = sampling;
    r.record_logits = true;
    r
}

fn sampled() -> Sampling {
    Sampling { temperature: 1.0, top_k: Some(40), top_p: Some(0.95), seed: 11 }
}

/// (token, logits) of every step.
type Steps = Vec<(u32, Vec<f32>)>;

fn uninterrupted(model: &Model, sampling: Sampling) -> Steps {
    let stream = model.stream(request(sampling)).unwrap();
    stream.map(|e| e.unwrap()).map(|e| (e.id, e.logits.unwrap())).collect()
}

/// Runs a resumable stream from `path` for `steps` more tokens, checkpointing after each token
/// listed in `checkpoint_at` (counted in generated tokens), then drops it: a crash. Returns the
/// tokens it restored and the steps it ran.
fn run_until_crash(
    model: &Model,
    sampling: Sampling,
    path: &Path,
    steps: usize,
    checkpoint_at: &[usize],
) -> (Vec<u32>, Steps) {
    let mut stream = model.stream_resumable(request(sampling), path).unwrap();
    let restored = stream.take_replay().iter().map(|e| e.id).collect();
    let mut ran = Vec::new();
    for _ in 0..steps {
        let Some(e) = stream.next_token().unwrap() else { break };
        ran.push((e.id, e.logits.unwrap()));
        if checkpoint_at.contains(&stream.generated()) {
            assert_eq!(stream.checkpoint().unwrap(), Some(stream.generated()));
        }
    }
    (restored, ran)
}

fn check_resumes_identically(model: &Model, sampling: Sampling) {
    let want = uninterrupted(model, sampling);
    assert_eq!(want.len(), 24);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    // Crash 1 after 7 tokens, having checkpointed at 5: tokens 6 and 7 are redone.
    let (restored, ran) = run_until_crash(model, sampling, &path, 7, &[5]);
    assert!(restored.is_empty());
    assert_eq!(ran, want[..7]);
    // Crash 2: resumes at 5, checkpoints at 9 and 12, crashes at 13.
    let (restored, ran) = run_until_crash(model, sampling, &path, 8, &[9, 12]);
    let ids: Vec<u32> = want.iter().map(|s| s.0).collect();
    assert_eq!(restored, ids[..5]);
    assert_eq!(ran, want[5..13], "the steps after a resume are those of the uninterrupted run");
    // Then to the end.
    let (restored, ran) = run_until_crash(model, sampling, &path, 100, &[]);
    assert_eq!(restored, ids[..12]);
    assert_eq!(ran, want[12..]);
}

#[test]
fn a_greedy_generation_resumes_where_its_checkpoint_left_it() {
    check_resumes_identically(&Model::load(fixture("llama")).unwrap(), Sampling::greedy());
}

#[test]
fn a_sampled_generation_resumes_with_the_same_draws() {
    check_resumes_identically(&Model::load(fixture("llama")).unwrap(), sampled());
}

#[test]
fn a_moe_model_from_gguf_resumes_identically() {
    check_resumes_identically(&Model::load(fixture("qwen3_moe/model.gguf")).unwrap(), Sampling::greedy());
}

#[test]
fn a_latent_attention_cache_checkpoints_and_resumes_identically() {
    // deepseek_v3's cache holds MLA latents and rotary keys, not per-head keys and values; the
    // DSA models' the indexer's keys beside them.
    for path in ["deepseek_v3", "deepseek_v3/model.gguf", "deepseek_v32", "glm_moe_dsa/model.gguf"] {
        check_resumes_identically(&Model::load(fixture(path)).unwrap(), Sampling::greedy());
    }
}

#[test]
fn a_recurrent_kda_state_checkpoints_and_resumes_identically() {
    // kimi_linear: three KDA layers whose state (convolution tail and delta-rule state) is
    // replaced, not appended, by each record, beside a latent-attention layer's rows.
    for path in ["kimi_linear", "kimi_linear/model.gguf"] {
        let model = Model::load(fixture(path)).unwrap();
        check_resumes_identically(&model, Sampling::greedy());
        check_resumes_identically(&model, sampled());
    }
    // A checkpoint at every token: the replaced states soon outweigh the rest and the file is
    // compacted to one record, from which the generation resumes as well.
    let model = Model::load(fixture("kimi_linear")).unwrap();
    let want = uninterrupted(&model, Sampling::greedy());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    run_until_crash(&model, Sampling::greedy(), &path, 1, &[1]);
    let one = std::fs::metadata(&path).unwrap().len();
    std::fs::remove_file(&path).unwrap();
    let every: Vec<usize> = (1..=24).collect();
    let (_, ran) = run_until_crash(&model, Sampling::greedy(), &path, 10, &every);
    assert_eq!(ran, want[..10]);
    let (restored, ran) = run_until_crash(&model, Sampling::greedy(), &path, 5, &every);
    assert_eq!((restored.len(), &ran[..]), (10, &want[10..15]));
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len < 6 * one, "15 checkpoints kept in {len} bytes; the first alone took {one}");
    let (restored, ran) = run_until_crash(&model, Sampling::greedy(), &path, 100, &[]);
    assert_eq!((restored, &ran[..]), (want[..15].iter().map(|s| s.0).collect(), &want[15..]));
}

#[test]
fn a_gated_delta_net_state_checkpoints_and_resumes_identically() {
    // qwen3_next: three Gated DeltaNet layers (convolution tail and a k_dim × v_dim state per
    // value head) beside a gated full-attention layer's rows, from both of its files.
    for path in ["qwen3_next", "qwen3_next/model.gguf"] {
        let model = Model::load(fixture(path)).unwrap();
        check_resumes_identically(&model, Sampling::greedy());
        check_resumes_identically(&model, sampled());
    }
}

#[test]
fn a_kimi_k3_generation_resumes_identically() {
    // kimi_k3: KDA states and gated-MLA latents in the checkpoint; AttnRes and Stable LatentMoE
    // keep nothing across tokens, so the same records resume it.
    let model = Model::load(fixture("kimi_k3")).unwrap();
    check_resumes_identically(&model, Sampling::greedy());
    check_resumes_identically(&model, sampled());
}

#[test]
fn a_deepseek_v4_window_and_compressor_state_checkpoints_and_resumes_identically() {
    // deepseek_v4: each layer's window of keys, its compressors' waiting positions, overlap series
    // and entries (29 positions: past the window of 8, across 7 CSA and 3 HCA windows) are
    // replaced by each record; the hyper-connection streams keep nothing across tokens.
    let model = Model::load(fixture("deepseek_v4")).unwrap();
    check_resumes_identically(&model, Sampling::greedy());
    check_resumes_identically(&model, sampled());
}

#[test]
fn a_sliding_window_model_with_sinks_checkpoints_and_resumes_identically() {
    // gpt_oss: the 24 positions run past its window of 5 on the sliding layers.
    for path in ["gpt_oss", "gpt_oss/model.gguf"] {
        check_resumes_identically(&Model::load(fixture(path)).unwrap(), Sampling::greedy());
    }
}

#[test]
fn a_torn_last_checkpoint_falls_back_to_the_one_before() {
    let model = Model::load(fixture("llama")).unwrap();
    let want = uninterrupted(&model, Sampling::greedy());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    run_until_crash(&model, Sampling::greedy(), &path, 10, &[4, 10]);
    // The crash tore the second checkpoint's write.
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 9).unwrap();
    let (restored, ran) = run_until_crash(&model, Sampling::greedy(), &path, 100, &[]);
    assert_eq!(restored, want[..4].iter().map(|s| s.0).collect::<Vec<_>>());
    assert_eq!(ran, want[4..]);
}

#[test]
fn a_checkpoint_of_another_prompt_is_not_used() {
    let model = Model::load(fixture("llama")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    run_until_crash(&model, Sampling::greedy(), &path, 6, &[6]);
    let mut other = request(Sampling::greedy());
    other.prompt = Prompt::Tokens(vec![9, 8, 7]);
    let mut stream = model.stream_resumable(other.clone(), &path).unwrap();
    assert!(stream.take_replay().is_empty(), "a checkpoint of another prompt is discarded");
    let resumed: Vec<u32> = stream.map(|e| e.unwrap().id).collect();
    let fresh: Vec<u32> = model.stream(other).unwrap().map(|e| e.unwrap().id).collect();
    assert_eq!(resumed, fresh);
}

/// A 40-token prompt run 6 tokens a pass: saved after passes 2 and 4 of the first attempt, which
/// is dropped during pass 5; the second attempt restores 24 prompt tokens and computes the other
/// 16; then it crashes mid-answer, and the third resumes the answer. Every token and logit is the
/// uninterrupted run's.
fn check_prompt_resumes_between_passes(model: &Model) {
    let request = || {
        let mut r = GenerateRequest::new(Prompt::Tokens((1..=40).map(|t| t * 7 % 50 + 1).collect()));
        r.max_new_tokens = 12;
        r.record_logits = true;
        r
    };
    // A pass's width may change the last bits (the matmul blocks the rows): the run to match
    // prefills in the same passes.
    let mut whole = model.stream_deferred(request(), None).unwrap();
    while whole.is_prefilling() {
        model.step(&mut [&mut whole], 6).unwrap();
    }
    let want: Steps = whole.map(|e| e.unwrap()).map(|e| (e.id, e.logits.unwrap())).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let attempt = |passes: usize, save_after: &[usize], tokens: usize| {
        let mut stream = model.stream_deferred(request(), Some(&path)).unwrap();
        let restored = (stream.prompt_tokens().len() - stream.prefilled_tokens(), stream.take_replay().len());
        let mut ran = Vec::new();
        for pass in 1..=passes {
            assert!(stream.is_prefilling());
            assert!(model.step(&mut [&mut stream], 6).unwrap()[0].is_none());
            if save_after.contains(&pass) {
                assert_eq!(stream.checkpoint().unwrap(), Some(0));
            }
        }
        while ran.len() < tokens {
            let Some(e) = stream.next_token().unwrap() else { break };
            ran.push((e.id, e.logits.unwrap()));
            if ran.len() == 5 {
                stream.checkpoint().unwrap();
            }
        }
        (restored, stream.checkpoint_prompt_tokens(), stream.prefilled_tokens(), ran)
    };
    let (restored, saved, _, ran) = attempt(5, &[2, 4], 0);
    assert_eq!((restored, saved, ran.len()), ((0, 0), 24, 0));
    // 24 restored, 16 left: passes of 6, 6 and 4.
    let (restored, saved, prefilled, ran) = attempt(3, &[], 7);
    assert_eq!((restored, saved, prefilled), ((24, 0), 40, 16));
    assert_eq!(ran, want[..7], "the answer after a prompt resumed mid-way is the uninterrupted one");
    let (restored, _, prefilled, ran) = attempt(0, &[], 100);
    assert_eq!((restored, prefilled), ((40, 5), 0));
    assert_eq!(ran, want[5..]);
}

#[test]
fn a_prompt_stopped_between_prefill_passes_resumes_after_the_last_saved_pass() {
    // Attention rows (llama), streamed-format experts (qwen3_moe), and KDA layers whose whole
    // recurrent state each record replaces (kimi_linear).
    for path in ["llama", "qwen3_moe/model.gguf", "kimi_linear"] {
        check_prompt_resumes_between_passes(&Model::load(fixture(path)).unwrap());
    }
}
