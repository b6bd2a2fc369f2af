//! Speculative decoding with a draft model: a second model of the same vocabulary guesses the
//! next tokens from its own cache, which is cut back with the target's when a guess is
//! rejected. The tokens are those of plain decoding (greedy and sampled, on attention, latent and
//! recurrent targets, alone, batched and across crashes); a draft model that reads ids
//! differently, or whose state cannot be cut back, is refused at load.

mod common;

use std::path::{Path, PathBuf};

use nightmail_engine::{Completion, DraftLength, Drafting, EngineError, GenerateRequest, Model, Prompt, Sampling};
use nightmail_tools::{SynthArch, SynthDtype, SynthSpec};

/// At most 4 guesses a pass, as many as allowed.
fn request(prompt: Prompt, max_new_tokens: usize, sampling: Sampling, draft: Drafting) -> GenerateRequest {
    let mut r = common::draft_request(prompt, max_new_tokens, sampling, draft);
    r.lookup.max_draft = 4;
    r
}

fn run(model: &Model, r: GenerateRequest) -> Completion {
    model.generate(r, |_| std::ops::ControlFlow::Continue(())).unwrap()
}

fn with_draft(target: &Path, draft: &Path) -> Model {
    let mut model = Model::load(target).unwrap();
    model.attach_draft_model(draft).unwrap();
    model
}

fn prompt() -> Prompt {
    Prompt::Tokens(vec![1, 5, 9, 11, 12, 13, 40, 41, 7])
}

/// Greedy with the draft model against plain greedy: the same tokens, and one pass saved per
/// accepted guess.
fn same_greedy(model: &Model, what: &str) -> Completion {
    let plain = run(model, request(prompt(), 20, Sampling::greedy(), Drafting::None));
    let drafted = run(model, request(prompt(), 20, Sampling::greedy(), Drafting::Model));
    common::assert_drafts_save_passes(&plain, &drafted, what);
    drafted
}

#[test]
fn greedy_with_a_draft_model_gives_the_plain_tokens() {
    let (mut accepted, mut rejected) = (0, 0);
    // Grouped attention, latent attention and KDA recurrent targets; each drafted by itself
    // (its guesses hold; not KDA, refused as a draft model) and by the llama fixture (other
    // random weights: most are rejected, and both caches are cut back).
    for arch in ["llama", "qwen3_moe", "deepseek_v3", "kimi_linear"] {
        let target = common::fixture(arch);
        let mut drafts = vec![common::fixture("llama").join("model.gguf")];
        if arch != "kimi_linear" {
            drafts.push(target.clone());
        }
        for draft in drafts {
            let model = with_draft(&target, &draft);
            let c = same_greedy(&model, &format!("{arch} drafted by {}", draft.display()));
            accepted += c.accepted;
            rejected += c.drafted - c.accepted;
        }
    }
    assert!(accepted > 0 && rejected > 0, "both verdicts: {accepted} accepted, {rejected} rejected");
}

#[test]
fn a_model_drafting_for_itself_has_its_guesses_accepted() {
    let target = common::fixture("llama");
    let model = with_draft(&target, &target);
    let c = same_greedy(&model, "llama drafted by itself");
    // 19 tokens after the first, four guesses a pass: each pass yields five tokens, the last
    // one guesses three (the logits after the last token are not needed) and yields four.
    assert_eq!((c.verify_steps, c.drafted, c.accepted), (4, 15, 15), "{c:?}");
}

#[test]
fn sampled_with_a_draft_model_draws_the_tokens_plain_sampling_draws() {
    // A draft model's greedy guess is a point mass: the acceptance rule draws as plain sampling
    // does, so the same seed gives the same tokens.
    for (arch, draft) in [("qwen3_moe", "qwen3_moe"), ("kimi_linear", "llama")] {
        let model = with_draft(&common::fixture(arch), &common::fixture(draft));
        for seed in 0..3 {
            let sampling = Sampling { temperature: 0.8, top_k: Some(40), top_p: Some(0.95), seed };
            let plain = run(&model, request(prompt(), 16, sampling, Drafting::None));
            let drafted = run(&model, request(prompt(), 16, sampling, Drafting::Model));
            assert_eq!(drafted.tokens, plain.tokens, "{arch} seed {seed}");
        }
    }
}

#[test]
fn a_checkpoint_holds_only_accepted_tokens_and_resumes_with_a_draft_model() {
    // Checkpoints land while guesses wait for their verdict; each run is dropped (a crash) and
    // resumed with a fresh draft cache, which catches up on the whole history.
    for (arch, draft) in [("llama", "llama"), ("kimi_linear", "qwen3_moe")] {
        let model = with_draft(&common::fixture(arch), &common::fixture(draft));
        let want = run(&model, request(prompt(), 20, Sampling::greedy(), Drafting::None));
        let events = common::across_crashes(&model, &request(prompt(), 20, Sampling::greedy(), Drafting::Model), arch);
        let got: Vec<u32> = events.iter().map(|e| e.id).collect();
        assert_eq!(got, want.tokens, "{arch}: tokens across crashes");
    }
}

#[test]
fn streams_drafting_with_a_model_batched_with_others_get_what_they_get_alone() {
    let target = common::fixture("qwen3_moe");
    let model = with_draft(&target, &common::fixture("llama"));
    let sampled = Sampling { temperature: 0.9, top_k: Some(20), top_p: Some(0.9), seed: 3 };
    let setups = [
        (vec![1u32, 5, 9, 11, 12], Sampling::greedy(), Drafting::Model),
        ((1..20).collect::<Vec<u32>>(), sampled, Drafting::Model),
        (vec![7, 8, 9, 7, 8], Sampling::greedy(), Drafting::Lookup),
        (vec![3, 4], sampled, Drafting::None),
    ];
    let want: Vec<Vec<u32>> = setups
        .iter()
        .map(|(p, s, _)| run(&model, request(Prompt::Tokens(p.clone()), 12, *s, Drafting::None)).tokens)
        .collect();
    let mut streams: Vec<_> = setups
        .iter()
        .map(|(p, s, d)| model.stream_deferred(request(Prompt::Tokens(p.clone()), 12, *s, *d), None).unwrap())
        .collect();
    assert_eq!(common::step_together(&model, &mut streams), want);
    let drafted: Vec<usize> = streams.into_iter().map(|s| s.into_completion().drafted).collect();
    assert!(drafted[0] > 0 && drafted[1] > 0, "the draft model guessed: {drafted:?}");
}

#[test]
fn drafting_with_a_model_needs_one_and_a_recurrent_one_is_refused() {
    let model = Model::load(common::fixture("llama")).unwrap();
    match model.stream(request(prompt(), 4, Sampling::greedy(), Drafting::Model)) {
        Err(EngineError::NoDraftModel) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("drafted with no draft model"),
    }
    let mut model = Model::load(common::fixture("llama")).unwrap();
    let e = model.attach_draft_model(common::fixture("kimi_linear")).unwrap_err();
    assert!(matches!(e, EngineError::DraftModel { .. }) && e.to_string().contains("recurrent state"), "{e}");
    assert!(model.draft_model().is_none());
}

/// A tiny random-weight model with the vocabulary (and template) of `tokenizer_from`, or none.
fn tiny(dir: &Path, name: &str, tokenizer_from: Option<PathBuf>) -> PathBuf {
    let out = dir.join(name);
    let spec = SynthSpec {
        arch: SynthArch::Qwen3Moe,
        layers: 1,
        experts: 2,
        top_k: 1,
        hidden: 64,
        expert_ffn: 32,
        dtype: SynthDtype::Q8_0,
        heads: 1,
        kv_heads: 1,
        head_dim: 64,
        vocab: 32000,
        tokenizer_from,
        context_length: 4096,
        seed: 7,
        dense: None,
    };
    nightmail_tools::synth(&spec, &out).unwrap();
    out
}

#[test]
fn smollm2_with_a_draft_model_of_its_tokenizer_gives_the_plain_text() {
    let smollm2 = common::smollm2();
    let dir = tempfile::tempdir().unwrap();
    let question = "Can you confirm that the meeting on Thursday at 3pm in room 204 is still on?";
    let chat = Prompt::Chat(
        vec![nightmail_engine::ChatMessage::new(
            "user",
            format!("Repeat this question word for word, then answer it: \"{question}\""),
        )]
        .into(),
    );
    // Itself as its draft model (every guess holds), and a random one of its vocabulary (few do).
    let random = tiny(dir.path(), "random.gguf", Some(smollm2.clone()));
    for draft in [smollm2.clone(), random] {
        let model = with_draft(&smollm2, &draft);
        let plain = run(&model, request(chat.clone(), 24, Sampling::greedy(), Drafting::None));
        let drafted = run(&model, request(chat.clone(), 24, Sampling::greedy(), Drafting::Model));
        assert_eq!(drafted.text, plain.text, "drafted by {}", draft.display());
        assert_eq!(drafted.tokens, plain.tokens);
        assert_eq!(drafted.verify_steps + drafted.accepted, plain.verify_steps);
        if draft == smollm2 {
            assert!(
                drafted.verify_steps * 3 < plain.verify_steps,
                "{} passes of {}",
                drafted.verify_steps,
                plain.verify_steps
            );
        } else {
            // Guesses that cost a whole pass never pay: none is run (the draft model still
            // guesses now and then, judged against the drawn tokens), one pass per token.
            let mut dear = request(chat.clone(), 24, Sampling::greedy(), Drafting::Model);
            dear.lookup.length = DraftLength::RowCost(1.0);
            let c = run(&model, dear);
            assert_eq!((c.tokens, c.drafted, c.verify_steps), (plain.tokens.clone(), 0, plain.verify_steps));
        }
    }
    // Measured on a fresh load: a draft model always has a guess, so after its first verify pass
    // a plain pass times the one-row cost (else no row's cost would ever be known, and every
    // guess would count as free); the draft model's own pass is timed as it guesses.
    let model = with_draft(&smollm2, &dir.path().join("random.gguf"));
    let mut measured = request(chat.clone(), 24, Sampling::greedy(), Drafting::Model);
    measured.lookup.length = DraftLength::Measured;
    let c = run(&model, measured);
    let plain = run(&model, request(chat, 24, Sampling::greedy(), Drafting::None));
    assert_eq!(c.tokens, plain.tokens);
    assert!(c.drafted > 0, "the first pass guesses, before any cost is known");
    assert!(model.pass_costs().line().is_some(), "one-row and wider passes were timed");
    assert!(model.draft_model().unwrap().pass_costs().one_row_s().is_some());
}

#[test]
fn a_draft_model_whose_tokenizer_differs_is_refused_saying_so() {
    let smollm2 = common::smollm2();
    let dir = tempfile::tempdir().unwrap();
    let spm = common::fixture("spm").join("model.gguf");
    let other = tiny(dir.path(), "spm.gguf", Some(spm));
    let none = tiny(dir.path(), "none.gguf", None);
    let mut model = Model::load(&smollm2).unwrap();
    for (draft, says) in [(&other, "vocabulary holds 49152 tokens"), (&none, "the draft model has no tokenizer")] {
        let e = model.attach_draft_model(draft).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, EngineError::DraftTokenizer { .. }), "{text}");
        assert!(text.contains("does not share the tokenizer") && text.contains(says), "{text}");
    }
    // And the other way round: a target driven by ids takes no draft model that has a tokenizer.
    let mut ids = Model::load(&none).unwrap();
    let e = ids.attach_draft_model(&smollm2).unwrap_err();
    assert!(e.to_string().contains("the target has no tokenizer"), "{e}");
    assert!(model.draft_model().is_none() && ids.draft_model().is_none());
}
