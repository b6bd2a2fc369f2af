//! What the engine's test files share: the fixtures of `tests/fixtures` (generate.py) and their
//! transformers references.
// Each test binary compiles this and uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use nightmail_engine::{
    Completion, DraftLength, Drafting, GenerateRequest, Model, Prompt, PromptLookup, Sampling, TokenEvent, TokenStream,
};

/// The demo model (SmolLM2-135M-Instruct Q4_1): `NIGHTMAIL_SMOLLM2`, or what
/// `scripts/fetch-model.sh` fetches.
pub fn smollm2() -> PathBuf {
    if let Some(p) = std::env::var_os("NIGHTMAIL_SMOLLM2") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("bash").arg(root.join("scripts/fetch-model.sh")).output().unwrap();
    assert!(out.status.success(), "scripts/fetch-model.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim())
}

/// `script` (a python3 program of tests/fixtures, run by the `python3` on PATH: scripts/test.sh
/// puts llama-cpp-python's environment first) fed `request` as JSON, its JSON answer; `what`
/// names the work in the panic if it fails.
pub fn python_json(script: &std::path::Path, request: &serde_json::Value, what: &str) -> serde_json::Value {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 is needed to run llama-cpp-python");
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed (llama-cpp-python is needed: see scripts/test.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(arch)
}

#[derive(serde::Deserialize)]
pub struct Reference {
    pub prompt_tokens: Vec<u32>,
    pub greedy_tokens: Vec<u32>,
    /// transformers' logits after the prompt and after each greedy token but the last.
    pub logits: Vec<Vec<f32>>,
}

pub fn reference(arch: &str) -> Reference {
    serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("reference.json")).unwrap()).unwrap()
}

/// Logits after `prompt` and after each of `then`, fed whatever the model would pick (so that
/// two models compare step by step on the same inputs).
pub fn fed_logit_rows(model: &Model, prompt: &[u32], then: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let mut rows = vec![model.logits(prompt, &mut cache).unwrap()];
    for &t in then {
        rows.push(model.logits(&[t], &mut cache).unwrap());
    }
    rows
}

/// `drafted` gives the tokens of `plain` (the same request without drafts), drafted something,
/// and ran one pass fewer per accepted guess.
pub fn assert_drafts_save_passes(plain: &Completion, drafted: &Completion, what: &str) {
    assert_eq!(drafted.tokens, plain.tokens, "{what}: greedy tokens with drafts");
    assert!(drafted.drafted > 0, "{what}: nothing drafted");
    assert_eq!(
        drafted.verify_steps + drafted.accepted,
        plain.verify_steps,
        "{what}: each accepted guess saves one pass"
    );
}

/// Runs `request` (with a checkpoint file) through crashes: checkpoints after every other
/// token, which land while guesses wait for their verdict; each run is dropped after 3, 5, 7
/// tokens and resumed. Returns the events of the tokens a client keeps (those checkpointed,
/// then the last run's to the end). A checkpoint that held a guess not yet accepted would
/// restore a state ahead of its tokens, and what follows would differ.
pub fn across_crashes(model: &Model, request: &GenerateRequest, what: &str) -> Vec<TokenEvent> {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("job.ckpt");
    let mut got: Vec<TokenEvent> = Vec::new();
    for crash_after in [3usize, 5, 7, 100] {
        let mut s = model.stream_resumable(request.clone(), &ckpt).unwrap();
        let restored: Vec<u32> = s.take_replay().iter().map(|e| e.id).collect();
        assert_eq!(restored, got.iter().map(|e| e.id).collect::<Vec<_>>(), "{what}: restored what was checkpointed");
        for _ in 0..crash_after {
            let Some(e) = s.next_token().unwrap() else { break };
            got.push(e);
            // Checkpoint every other token; the last ones before the crash are redone.
            if s.generated().is_multiple_of(2) && s.stop_reason().is_none() {
                assert_eq!(s.checkpoint().unwrap(), Some(s.generated()));
            }
        }
        let kept = if s.stop_reason().is_some() { got.len() } else { got.len() / 2 * 2 };
        got.truncate(kept);
    }
    got
}

/// A request for the drafting tests: no stop at EOS, and every pass guesses as many as allowed,
/// whatever a guess costs on this machine (the tests check what drafts do, not the schedule).
pub fn draft_request(prompt: Prompt, max_new_tokens: usize, sampling: Sampling, draft: Drafting) -> GenerateRequest {
    let mut r = GenerateRequest::new(prompt);
    r.max_new_tokens = max_new_tokens;
    r.sampling = sampling;
    r.stop_at_eos = false;
    r.draft = draft;
    r.lookup = PromptLookup { length: DraftLength::RowCost(0.0), ..PromptLookup::default() };
    r
}

/// Steps `streams` of `model` together (prompts in chunks of 8) until each has stopped; returns
/// each one's tokens.
pub fn step_together(model: &Model, streams: &mut [TokenStream<'_>]) -> Vec<Vec<u32>> {
    let mut got = vec![Vec::new(); streams.len()];
    while streams.iter().any(|s| s.stop_reason().is_none()) {
        let mut batch: Vec<_> = streams.iter_mut().collect();
        for (i, e) in model.step(&mut batch, 8).unwrap().into_iter().enumerate() {
            got[i].extend(e.map(|e| e.id));
        }
    }
    got
}
