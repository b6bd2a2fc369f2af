//! Speculative decoding with prompt-lookup drafts: a verify pass runs the drawn token and its
//! drafts together, accepts the drafts the model agrees with and rolls the state back past the
//! rest. The tokens are those of plain decoding, on every fixture architecture (grouped, latent
//! and KDA recurrent layers; dense and MoE) and on SmolLM2, greedy and sampled; checkpoints,
//! resume and batched steps keep working with drafts.

mod common;

use std::path::Path;

use nightmail_engine::{Completion, DraftLength, Drafting, GenerateRequest, Model, Prompt, Sampling};

/// A prompt that repeats itself, so that lookup finds n-grams to draft from at once, and long
/// enough that the answer runs into its own repetitions too.
fn repetitive_prompt() -> Vec<u32> {
    let phrase = [11u32, 12, 13, 14, 15, 16, 17, 18];
    let mut p = vec![1u32, 5, 9];
    p.extend(phrase);
    p.extend([30, 31]);
    p.extend(phrase);
    p.extend([40]);
    p.extend(&phrase[..4]);
    p
}

fn request(prompt: Prompt, max_new_tokens: usize, sampling: Sampling, draft: Drafting) -> GenerateRequest {
    let mut r = common::draft_request(prompt, max_new_tokens, sampling, draft);
    r.record_logits = true;
    // Single-token matches too: a random-weight fixture rarely repeats a pair of tokens, and
    // both verdicts should be exercised. Each pass guesses all lookup finds
    // (`the_draft_length_follows_the_cost_of_a_row` checks the schedule).
    r.lookup.min_ngram = 1;
    r
}

/// The completion and each token's logits row.
fn run(model: &Model, r: GenerateRequest) -> (Completion, Vec<Vec<f32>>) {
    let mut rows = Vec::new();
    let c = model
        .generate(r, |e| {
            rows.push(e.logits.clone().unwrap());
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    (c, rows)
}

fn worst(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y)).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// Greedy with lookup drafts against plain greedy, on one model file: the same tokens, logits
/// within `tolerance` (0 where every kernel computes each row on its own), fewer passes when
/// drafts were accepted, and rejected drafts rolled back (else the tokens after would differ).
fn same_greedy(path: &Path, tolerance: f32) -> Completion {
    let model = Model::load(path).unwrap();
    let prompt = Prompt::Tokens(repetitive_prompt());
    let (plain, plain_rows) = run(&model, request(prompt.clone(), 24, Sampling::greedy(), Drafting::None));
    let (drafted, drafted_rows) = run(&model, request(prompt, 24, Sampling::greedy(), Drafting::Lookup));
    let name = path.display();
    common::assert_drafts_save_passes(&plain, &drafted, &name.to_string());
    let w = worst(&drafted_rows, &plain_rows);
    assert!(w <= tolerance, "{name}: logits differ by {w:e} with drafts");
    assert_eq!(plain.verify_steps, plain.tokens.len() - 1, "{name}: one pass per token after the first");
    drafted
}

#[test]
fn greedy_with_drafts_gives_the_plain_tokens_on_every_fixture_architecture() {
    // The fixtures' F32 weights go through candle's gemm, which blocks by the number of rows:
    // a verify pass's projections round as a batch does (tests/batch.rs), to within 1e-5.
    let mut rejected = 0;
    let mut accepted = 0;
    // deepseek_v32 and glm_moe_dsa: a verify pass's indexer chooses one position at a time, and
    // GLM's shared layer reads each position's choice.
    let archs = [
        "llama",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "deepseek_v3",
        "gpt_oss",
        "kimi_linear",
        "deepseek_v32",
        "glm_moe_dsa",
    ];
    for arch in archs {
        for file in [common::fixture(arch), common::fixture(arch).join("model.gguf")] {
            let c = same_greedy(&file, 1e-5);
            rejected += c.drafted - c.accepted;
            accepted += c.accepted;
        }
    }
    // MXFP4 experts (our own kernel, each row on its own).
    same_greedy(&common::fixture("gpt_oss_mxfp4").join("model.gguf"), 1e-5);
    assert!(accepted > 0 && rejected > 0, "both verdicts were exercised: {accepted} accepted, {rejected} rejected");
}

#[test]
fn greedy_with_drafts_gives_the_plain_tokens_on_gated_delta_net() {
    // qwen3_next: a verify pass keeps each DeltaNet state it passes, and a rejected draft rolls
    // back to the accepted position's. Its projections round as a batch's (tests/batch.rs),
    // which this fixture amplifies past 1e-5: the logits agree to the reference's 1e-4.
    let (mut drafted, mut accepted) = (0, 0);
    for file in [common::fixture("qwen3_next"), common::fixture("qwen3_next").join("model.gguf")] {
        let c = same_greedy(&file, 1e-4);
        drafted += c.drafted;
        accepted += c.accepted;
    }
    assert!(accepted > 0 && drafted > accepted, "both verdicts: {accepted} of {drafted} drafts accepted");
    resumes_with_drafts_within(&common::fixture("qwen3_next"), 1e-4);
}

#[test]
fn sampled_with_drafts_draws_the_tokens_plain_sampling_draws() {
    // The acceptance rule draws as plain sampling does (see sampling.rs for its statistics):
    // with the same seed the tokens are the same, on attention and on recurrent layers.
    for arch in ["qwen3_moe", "kimi_linear", "deepseek_v3"] {
        let model = Model::load(common::fixture(arch)).unwrap();
        for seed in 0..4 {
            let sampling = Sampling { temperature: 0.8, top_k: Some(40), top_p: Some(0.95), seed };
            let prompt = Prompt::Tokens(repetitive_prompt());
            let (plain, _) = run(&model, request(prompt.clone(), 16, sampling, Drafting::None));
            let (drafted, _) = run(&model, request(prompt, 16, sampling, Drafting::Lookup));
            assert_eq!(drafted.tokens, plain.tokens, "{arch} seed {seed}");
        }
    }
}

#[test]
fn the_draft_length_follows_the_cost_of_a_row() {
    let model = Model::load(common::fixture("qwen3_moe")).unwrap();
    let prompt = Prompt::Tokens(repetitive_prompt());
    let (plain, _) = run(&model, request(prompt.clone(), 24, Sampling::greedy(), Drafting::None));
    assert_eq!(model.pass_costs().line(), None, "plain decoding times one width only");
    // A row that costs a whole pass: no guess can pay for itself, so none is run (lookup still
    // guesses, judged against the drawn tokens), and the tokens are the plain ones.
    let mut dear = request(prompt.clone(), 24, Sampling::greedy(), Drafting::Lookup);
    dear.lookup.length = DraftLength::RowCost(1.0);
    let (c, _) = run(&model, dear);
    assert_eq!(c.tokens, plain.tokens);
    assert_eq!((c.drafted, c.verify_steps), (0, plain.verify_steps));
    // Measured: before a wider pass has been timed the stream guesses (and so times one); after,
    // it guesses as the measured cost allows. The tokens are the plain ones either way.
    let mut measured = request(prompt, 24, Sampling::greedy(), Drafting::Lookup);
    measured.lookup.length = DraftLength::Measured;
    let (m, _) = run(&model, measured);
    assert_eq!(m.tokens, plain.tokens);
    assert!(m.drafted > 0, "no wider pass was timed");
    let line = model.pass_costs().line().expect("one-row and wider passes were timed");
    assert!(line.base_s > 0.0 && line.per_row_s >= 0.0, "{line:?}");
}

#[test]
fn smollm2_quoting_a_question_accepts_drafts_and_gives_the_plain_tokens_bit_for_bit() {
    let model = Model::load(common::smollm2()).unwrap();
    let question = "Can you confirm that the meeting on Thursday at 3pm in room 204 is still on?";
    let prompt = Prompt::Chat(
        vec![nightmail_engine::ChatMessage::new(
            "user",
            format!("Repeat this question word for word, then answer it: \"{question}\""),
        )]
        .into(),
    );
    let (plain, plain_rows) = run(&model, request(prompt.clone(), 40, Sampling::greedy(), Drafting::None));
    let (drafted, drafted_rows) = run(&model, request(prompt, 40, Sampling::greedy(), Drafting::Lookup));
    assert_eq!(drafted.text, plain.text);
    assert_eq!(drafted.tokens, plain.tokens);
    // Q4_1 and f16 attention compute each position on its own: the same bits.
    assert_eq!(worst(&drafted_rows, &plain_rows), 0.0);
    assert!(drafted.accepted >= 5, "quoting accepted only {} drafts", drafted.accepted);
    assert!(drafted.verify_steps < plain.verify_steps);
}

/// Checkpoints land while drafts wait for their verdict (`common::across_crashes`).
fn resumes_with_drafts(path: &Path) {
    resumes_with_drafts_within(path, 1e-5)
}

/// As [`resumes_with_drafts`], the logits within `tolerance`.
fn resumes_with_drafts_within(path: &Path, tolerance: f32) {
    let model = Model::load(path).unwrap();
    let prompt = Prompt::Tokens(repetitive_prompt());
    let (want, want_rows) = run(&model, request(prompt.clone(), 20, Sampling::greedy(), Drafting::None));
    let events = common::across_crashes(
        &model,
        &request(prompt, 20, Sampling::greedy(), Drafting::Lookup),
        &path.display().to_string(),
    );
    let got: Vec<u32> = events.iter().map(|e| e.id).collect();
    let got_rows: Vec<Vec<f32>> = events.into_iter().map(|e| e.logits.unwrap()).collect();
    assert_eq!(got, want.tokens, "{}: tokens across crashes", path.display());
    assert!(worst(&got_rows, &want_rows) <= tolerance);
}

#[test]
fn a_checkpoint_holds_only_accepted_tokens_and_resumes_with_drafts() {
    resumes_with_drafts(&common::fixture("llama"));
    // KDA: the recurrent state saved is the one at the last accepted token.
    resumes_with_drafts(&common::fixture("kimi_linear"));
}

#[test]
fn streams_with_and_without_drafts_batched_together_get_what_they_get_alone() {
    for arch in ["qwen3_moe", "kimi_linear"] {
        let model = Model::load(common::fixture(arch)).unwrap();
        let sampled = Sampling { temperature: 0.9, top_k: Some(20), top_p: Some(0.9), seed: 3 };
        let setups = [
            (repetitive_prompt(), Sampling::greedy(), Drafting::Lookup),
            ((1..20).collect::<Vec<u32>>(), sampled, Drafting::Lookup),
            (repetitive_prompt(), sampled, Drafting::None),
            (vec![7, 8, 9, 7, 8], Sampling::greedy(), Drafting::Lookup),
        ];
        let want: Vec<Vec<u32>> = setups
            .iter()
            .map(|(p, s, _)| run(&model, request(Prompt::Tokens(p.clone()), 12, *s, Drafting::None)).0.tokens)
            .collect();
        let mut streams: Vec<_> = setups
            .iter()
            .map(|(p, s, d)| model.stream_deferred(request(Prompt::Tokens(p.clone()), 12, *s, *d), None).unwrap())
            .collect();
        let got = common::step_together(&model, &mut streams);
        assert_eq!(got, want, "{arch}");
        let completions: Vec<Completion> = streams.into_iter().map(|s| s.into_completion()).collect();
        assert!(completions.iter().any(|c| c.drafted > 0), "{arch}: something was drafted");
    }
}

#[test]
fn drafting_with_deepseek_v4_is_refused_saying_what_to_do() {
    // Its compressors cannot roll a verify pass back.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v4");
    let model = Model::load(&dir).unwrap();
    let Err(err) = model.stream(request(Prompt::Tokens(vec![1, 2, 3]), 4, Sampling::greedy(), Drafting::Lookup)) else {
        panic!("drafting was not refused")
    };
    assert!(
        err.to_string().contains("drafting with a DeepSeek-V4 model") && err.to_string().contains("draft = none"),
        "{err}"
    );
}
