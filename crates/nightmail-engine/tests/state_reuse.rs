//! Thread state reuse ([`StateCache`]): a follow-up whose prompt starts with what an earlier
//! generation ran restores that state and prefills only the rest. The restored state is the
//! saved one bit for bit (the follow-up's logits are those of the same passes run without a save
//! and restore), and the answer is that of a full prefill, for attention, latent attention and
//! recurrent (KDA) layers; a damaged, truncated or foreign state is reported and never used; the
//! states of a model stay within its budget, least recently used out first.

use std::path::{Path, PathBuf};

use nightmail_engine::{GenerateRequest, Model, Prompt, Sampling, StateCache, TokenStream};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

fn request(prompt: Vec<u32>, max_new_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(prompt));
    r.max_new_tokens = max_new_tokens;
    r.sampling = Sampling::greedy();
    r.record_logits = true;
    r.stop_at_eos = false;
    r
}

type Steps = Vec<(u32, Vec<f32>)>;

/// Runs `stream` to its end through the engine thread's step API (prefill 5 tokens a step, so
/// a restored prefix leaves chunks that start elsewhere than a full prefill's).
fn run<'m>(model: &'m Model, mut stream: TokenStream<'m>) -> (Steps, TokenStream<'m>) {
    let mut out = Vec::new();
    while stream.stop_reason().is_none() {
        for e in model.step(&mut [&mut stream], 5).unwrap().into_iter().flatten() {
            out.push((e.id, e.logits.unwrap()));
        }
    }
    (out, stream)
}

/// Asserts a run reusing a saved state gives the tokens of a full prefill, with logits as close
/// as the engine's own prefill is to itself: a prefill run in other chunks sums in another order
/// (candle's matmul blocks by the number of rows), which moves logits by ~1e-6.
fn same(got: &Steps, want: &Steps, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (i, ((gt, gl), (wt, wl))) in got.iter().zip(want).enumerate() {
        let worst = gl.iter().zip(wl).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(gt == wt && worst < 1e-4, "{what}: step {i}: token {gt} vs {wt}, logits differ by up to {worst:e}");
    }
}

/// The first logits of `next` computed without saving or restoring anything, in the same
/// passes as the first generation and the follow-up ran: the first prompt in chunks of 5 from
/// position 0, each answer token alone, then the rest of `next` in chunks of 5 from `held`.
fn same_passes(model: &Model, first: &[u32], next: &[u32], held: usize) -> Vec<f32> {
    let mut cache = model.new_cache();
    for chunk in first.chunks(5) {
        model.logits(chunk, &mut cache).unwrap();
    }
    for t in &next[first.len()..held] {
        model.logits(&[*t], &mut cache).unwrap();
    }
    let mut last = Vec::new();
    for chunk in next[held..].chunks(5) {
        last = model.logits(chunk, &mut cache).unwrap();
    }
    last
}

/// A full prefill of `prompt`, nothing reused.
fn fresh(model: &Model, prompt: &[u32], max: usize) -> Steps {
    run(model, model.stream_deferred(request(prompt.to_vec(), max), None).unwrap()).0
}

/// Generates from `prompt` and keeps the state in `states`; returns the tokens generated.
fn answer_and_keep(model: &Model, states: &StateCache, prompt: &[u32]) -> Vec<u32> {
    let mut stream = model.stream_deferred(request(prompt.to_vec(), 6), None).unwrap();
    assert_eq!(stream.reuse(states).restored, 0, "nothing saved yet for this prompt");
    let (steps, mut stream) = run(model, stream);
    assert!(stream.keep(states).unwrap().is_some(), "the state was saved");
    steps.iter().map(|s| s.0).collect()
}

/// Generates from `prompt` reusing what `states` holds; returns the steps, the positions
/// restored and the prompt tokens prefilled.
fn follow_up(model: &Model, states: &StateCache, prompt: &[u32]) -> (Steps, usize, usize) {
    let mut stream = model.stream_deferred(request(prompt.to_vec(), 6), None).unwrap();
    let reuse = stream.reuse(states);
    assert!(reuse.ignored.is_empty(), "{:?}", reuse.ignored);
    let (steps, stream) = run(model, stream);
    (steps, reuse.restored, stream.prefilled_tokens())
}

fn first_prompt() -> Vec<u32> {
    (3..40).collect()
}

/// The follow-up of a thread: the first prompt, the answer as generated, a new turn.
fn thread_follow_up(first: &[u32], answer: &[u32]) -> Vec<u32> {
    [first, answer, &[11, 12, 13, 14]].concat()
}

fn check_follow_up_matches_full_prefill(path: &str) {
    let model = Model::load(fixture(path)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let states = StateCache::open(&model, dir.path(), 1 << 30).unwrap();
    let first = first_prompt();
    let answer = answer_and_keep(&model, &states, &first);
    let next = thread_follow_up(&first, &answer);
    let (steps, restored, prefilled) = follow_up(&model, &states, &next);
    // Everything the first generation ran: its prompt and its answer but the last token drawn.
    let held = first.len() + answer.len() - 1;
    assert_eq!((restored, prefilled), (held, next.len() - held), "{path}");
    // The restored state is the state saved, bit for bit: the follow-up's first logits are
    // those of the same passes run without a save and restore between them.
    let want = same_passes(&model, &first, &next, held);
    assert!(steps[0].1.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{path}: restored state differs");
    same(&steps, &fresh(&model, &next, 6), path);
}

#[test]
fn a_follow_up_restores_the_exact_state_and_answers_as_a_full_prefill() {
    for path in [
        "llama",
        "qwen3_moe/model.gguf",
        "deepseek_v3",
        "deepseek_v3/model.gguf",
        "deepseek_v32",
        "glm_moe_dsa/model.gguf",
    ] {
        check_follow_up_matches_full_prefill(path);
    }
}

#[test]
fn a_recurrent_state_is_restored_exactly_and_answers_as_a_full_prefill() {
    // kimi_linear: three KDA layers (convolution tail and delta-rule state) beside a
    // latent-attention layer.
    for path in ["kimi_linear", "kimi_linear/model.gguf"] {
        check_follow_up_matches_full_prefill(path);
    }
}

#[test]
fn a_follow_up_that_differs_inside_the_answer_restores_the_common_part_only() {
    // An answer the template renders other than it was generated: attention rows (and latent
    // attention's latents) are cut back to the first difference.
    let dir = tempfile::tempdir().unwrap();
    let first = first_prompt();
    for path in ["llama", "deepseek_v3", "glm_moe_dsa"] {
        let model = Model::load(fixture(path)).unwrap();
        let states = StateCache::open(&model, dir.path().join(path), 1 << 30).unwrap();
        let answer = answer_and_keep(&model, &states, &first);
        let mut edited = answer.clone();
        edited[2] = edited[2].wrapping_add(1) % 50 + 1;
        let next = thread_follow_up(&first, &edited);
        let (steps, restored, _) = follow_up(&model, &states, &next);
        assert_eq!(restored, first.len() + 2, "{path}");
        same(&steps, &fresh(&model, &next, 6), path);
    }

    // A recurrent state holds the last position only: nothing is reused.
    let model = Model::load(fixture("kimi_linear")).unwrap();
    let states = StateCache::open(&model, dir.path().join("kimi"), 1 << 30).unwrap();
    let answer = answer_and_keep(&model, &states, &first);
    let mut edited = answer.clone();
    edited[2] = edited[2].wrapping_add(1) % 50 + 1;
    let next = thread_follow_up(&first, &edited);
    let (steps, restored, prefilled) = follow_up(&model, &states, &next);
    assert_eq!((restored, prefilled), (0, next.len()));
    same(&steps, &fresh(&model, &next, 6), "follow-up");
}

#[test]
fn an_edited_start_of_the_thread_reuses_nothing() {
    // An edited system prompt changes the first tokens: no saved state's key matches.
    let model = Model::load(fixture("llama")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let states = StateCache::open(&model, dir.path(), 1 << 30).unwrap();
    let first = first_prompt();
    let answer = answer_and_keep(&model, &states, &first);
    let mut next = thread_follow_up(&first, &answer);
    next[0] += 1;
    let (steps, restored, prefilled) = follow_up(&model, &states, &next);
    assert_eq!((restored, prefilled), (0, next.len()));
    same(&steps, &fresh(&model, &next, 6), "follow-up");
}

/// The one saved state file in `dir`.
fn state_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// What is done to a saved state's bytes.
type Damage = fn(&mut Vec<u8>);

#[test]
fn a_damaged_or_truncated_state_is_reported_removed_and_never_used() {
    let model = Model::load(fixture("llama")).unwrap();
    let first = first_prompt();
    let damages: [(&str, Damage); 3] = [
        ("a flipped byte", |b| {
            let at = b.len() - 100;
            b[at] ^= 0x40;
        }),
        ("truncated", |b| b.truncate(b.len() - 37)),
        ("bytes after the record", |b| b.extend_from_slice(b"more")),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        let states = StateCache::open(&model, dir.path(), 1 << 30).unwrap();
        let answer = answer_and_keep(&model, &states, &first);
        let next = thread_follow_up(&first, &answer);
        let file = state_file(dir.path());
        let mut bytes = std::fs::read(&file).unwrap();
        damage(&mut bytes);
        std::fs::write(&file, &bytes).unwrap();

        let mut stream = model.stream_deferred(request(next.clone(), 6), None).unwrap();
        let reuse = stream.reuse(&states);
        assert_eq!(reuse.restored, 0, "{what}: a damaged state was restored");
        assert_eq!(reuse.ignored.len(), 1, "{what}: {:?}", reuse.ignored);
        let reason = reuse.ignored[0].to_string();
        assert!(reason.contains(&file.display().to_string()), "{what}: the report names the file: {reason}");
        assert!(!file.exists(), "{what}: the damaged file was kept");
        let (steps, stream) = run(&model, stream);
        assert_eq!(stream.prefilled_tokens(), next.len(), "{what}");
        same(&steps, &fresh(&model, &next, 6), what);
    }
}

#[test]
fn a_state_of_other_weights_at_the_same_path_is_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    std::fs::create_dir(&model_dir).unwrap();
    for entry in std::fs::read_dir(fixture("llama")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model_dir.join(entry.file_name())).unwrap();
    }
    let states_dir = dir.path().join("states");
    let first = first_prompt();
    let next = {
        let model = Model::load(&model_dir).unwrap();
        let states = StateCache::open(&model, &states_dir, 1 << 30).unwrap();
        let answer = answer_and_keep(&model, &states, &first);
        let next = thread_follow_up(&first, &answer);
        assert!(follow_up(&model, &states, &next).1 > 0, "the same weights reuse the state");
        next
    };
    // The weights rewritten in place (a re-download): another model to the cache.
    let weights = model_dir.join("model.safetensors");
    let f = std::fs::OpenOptions::new().write(true).open(&weights).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60)).unwrap();
    drop(f);
    let model = Model::load(&model_dir).unwrap();
    let states = StateCache::open(&model, &states_dir, 1 << 30).unwrap();
    let (_, restored, prefilled) = follow_up(&model, &states, &next);
    assert_eq!((restored, prefilled), (0, next.len()));
}

#[test]
fn states_stay_within_the_budget_least_recently_used_out_first() {
    let model = Model::load(fixture("llama")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| (10 * i + 1..10 * i + 30).collect()).collect();
    // One state's size, from a cache with room for it alone.
    let probe = StateCache::open(&model, dir.path().join("probe"), 1 << 30).unwrap();
    answer_and_keep(&model, &probe, &prompts[0]);
    let one = probe.bytes();
    assert!(one > 0);
    // Room for two states of these lengths, not three.
    let states = StateCache::open(&model, dir.path().join("states"), one * 5 / 2).unwrap();
    let answers: Vec<Vec<u32>> = prompts[..2].iter().map(|p| answer_and_keep(&model, &states, p)).collect();
    assert!(states.bytes() <= one * 5 / 2);
    // Using the first makes the second the least recently used.
    let (_, restored, _) = follow_up(&model, &states, &thread_follow_up(&prompts[0], &answers[0]));
    assert!(restored > 0);
    answer_and_keep(&model, &states, &prompts[2]);
    assert!(states.bytes() <= one * 5 / 2, "{} bytes kept, budget {}", states.bytes(), one * 5 / 2);
    let reused = |i: usize, answer: &[u32]| follow_up(&model, &states, &thread_follow_up(&prompts[i], answer)).1;
    assert_eq!(reused(1, &answers[1]), 0, "the least recently used state was evicted");
    assert!(reused(0, &answers[0]) > 0, "the recently used state was kept");

    // A state larger than the whole budget is not saved.
    let tiny = StateCache::open(&model, dir.path().join("tiny"), one / 2).unwrap();
    let mut stream = model.stream_deferred(request(prompts[3].clone(), 6), None).unwrap();
    stream.reuse(&tiny);
    let (_, mut stream) = run(&model, stream);
    assert_eq!(stream.keep(&tiny).unwrap(), None);
    assert_eq!(tiny.bytes(), 0);
}

#[test]
fn a_state_write_leaves_no_temporary_file() {
    let model = Model::load(fixture("llama")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let states = StateCache::open(&model, dir.path(), 1 << 30).unwrap();
    answer_and_keep(&model, &states, &first_prompt());
    let name = state_file(dir.path()).file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with(".state"), "{name}");
}
