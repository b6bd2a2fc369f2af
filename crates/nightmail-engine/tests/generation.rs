//! The streaming API on the tiny llama fixture: stopping between tokens, token limits, EOS,
//! and that a stream and the callback API produce the same tokens.

use std::ops::ControlFlow;
use std::path::PathBuf;

use nightmail_engine::{GenerateRequest, Model, Prompt, Sampling, StopReason};

fn llama() -> Model {
    Model::load(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama")).unwrap()
}

fn request(max_new_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(vec![1, 2, 3, 4]));
    r.max_new_tokens = max_new_tokens;
    r
}

#[test]
fn breaking_from_the_callback_stops_between_tokens() {
    let model = llama();
    let mut seen = 0;
    let c = model
        .generate(request(16), |_| {
            seen += 1;
            if seen == 3 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap();
    assert_eq!(c.tokens.len(), 3);
    assert_eq!(c.stop, StopReason::Cancelled);
}

#[test]
fn dropping_a_stream_early_leaves_the_model_usable() {
    let model = llama();
    let first: Vec<u32> = model.stream(request(16)).unwrap().take(2).map(|e| e.unwrap().id).collect();
    let full = model.generate(request(16), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(first, full.tokens[..2]);
}

#[test]
fn max_new_tokens_limits_the_completion() {
    let c = llama().generate(request(5), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(c.tokens.len(), 5);
    assert_eq!(c.stop, StopReason::MaxTokens);
}

#[test]
fn progress_counts_each_token() {
    let mut progress = Vec::new();
    llama()
        .generate(request(4), |e| {
            progress.push((e.index, e.progress.generated, e.progress.prompt_tokens, e.progress.max_new_tokens));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(progress, vec![(0, 1, 4, 4), (1, 2, 4, 4), (2, 3, 4, 4), (3, 4, 4, 4)]);
}

#[test]
fn seeded_sampling_is_reproducible_and_differs_from_greedy() {
    let model = llama();
    let sample = |seed| {
        let mut r = request(16);
        r.sampling = Sampling { temperature: 1.5, top_k: None, top_p: None, seed };
        model.generate(r, |_| ControlFlow::Continue(())).unwrap().tokens
    };
    let greedy = model.generate(request(16), |_| ControlFlow::Continue(())).unwrap().tokens;
    assert_eq!(sample(7), sample(7));
    assert_ne!(sample(7), greedy);
}

#[test]
fn a_token_outside_the_vocabulary_is_an_error() {
    let r = GenerateRequest::new(Prompt::Tokens(vec![1, 9999]));
    assert!(llama().generate(r, |_| ControlFlow::Continue(())).is_err());
}

#[test]
fn text_prompts_need_a_tokenizer() {
    let r = GenerateRequest::new(Prompt::Text("hello".into()));
    let err = llama().generate(r, |_| ControlFlow::Continue(())).unwrap_err();
    assert!(matches!(err, nightmail_engine::EngineError::NoTokenizer), "{err}");
}

#[test]
fn zero_new_tokens_returns_the_prompt_and_nothing_else() {
    let c = llama().generate(request(0), |_| ControlFlow::Break(())).unwrap();
    assert_eq!(c.prompt_tokens, vec![1, 2, 3, 4]);
    assert!(c.tokens.is_empty());
    assert_eq!(c.stop, StopReason::MaxTokens);
}
