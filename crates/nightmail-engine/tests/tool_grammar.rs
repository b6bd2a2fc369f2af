//! Tool-call grammars with the demo model (SmolLM2-135M-Instruct Q4_1, whose template renders no
//! tools: the worker asks it for Hermes calls). The prompt ends with a forced `<tool_call>\n`;
//! with the grammar the continuation is one well-formed call to a listed tool, and a checkpoint
//! taken mid-call resumes to the same tokens.

mod common;

use std::sync::OnceLock;

use nightmail_engine::{Completion, GenerateRequest, Model, Prompt, Sampling, StopReason, ToolCallGrammar, ToolSyntax};

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load(common::smollm2()).expect("loading SmolLM2"))
}

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "web_search", "description": "Search the web", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}}, "required": ["query"]}}},
{"type": "function", "function": {"name": "fetch_page", "description": "Fetch a web page", "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}}]"#;

/// SmolLM2's ChatML with the tools told in the system turn (as the worker tells them), and the
/// assistant's turn opened on a call.
fn prompt() -> String {
    format!(
        "<|im_start|>system\nYou may call these functions:\n{TOOLS}\nCall one as <tool_call>\n{{\"name\": NAME, \"arguments\": ARGS}}\n</tool_call><|im_end|>\n<|im_start|>user\nSearch the web for the euro to dollar exchange rate.<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
    )
}

fn request(sampling: Sampling, grammar: bool) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Text(prompt()));
    r.max_new_tokens = 160;
    r.sampling = sampling;
    r.tool_calls = grammar.then(|| ToolCallGrammar::from_openai_tools(ToolSyntax::Hermes, TOOLS).unwrap());
    r
}

fn generate(sampling: Sampling, grammar: bool) -> Completion {
    model().generate(request(sampling, grammar), |_| std::ops::ControlFlow::Continue(())).unwrap()
}

/// The call the completion holds, if it is one well-formed call to a listed tool with its
/// required string argument; else what is wrong.
fn the_call(generated: &str) -> Result<(String, String), String> {
    let text = format!("<tool_call>\n{generated}");
    let turn = ToolSyntax::Hermes.parse(&text);
    let [Ok(call)] = &turn.calls[..] else { return Err(format!("{:?}", turn.calls)) };
    let nightmail_engine::ToolArguments::Object(json) = &call.function.arguments else {
        return Err(format!("arguments are not an object: {:?}", call.function.arguments));
    };
    let args: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let required = match call.function.name.as_str() {
        "web_search" => "query",
        "fetch_page" => "url",
        other => return Err(format!("no tool {other}")),
    };
    let value = args.get(required).and_then(|v| v.as_str()).ok_or(format!("no string {required}: {args}"))?;
    Ok((call.function.name.clone(), value.to_string()))
}

#[test]
fn greedy_decoding_with_the_grammar_writes_one_well_formed_call_and_without_it_does_not() {
    let free = generate(Sampling::greedy(), false);
    let constrained = generate(Sampling::greedy(), true);
    eprintln!("free: {:?}\nconstrained: {:?}", free.text, constrained.text);
    let call = the_call(&constrained.text);
    assert!(call.is_ok(), "{call:?}: {:?}", constrained.text);
    assert_ne!(free.tokens, constrained.tokens);
    let free_call = the_call(&free.text);
    eprintln!("without the grammar: {free_call:?}");
    assert!(free_call.is_err(), "SmolLM2 wrote a well-formed call unaided: {:?}", free.text);
}

/// Sampled: each call the model closes is well-formed; one it has not closed when the tokens
/// run out is cut, which no grammar prevents (all seeds but none closing would fail).
#[test]
fn sampled_decoding_with_the_grammar_writes_well_formed_calls() {
    let mut closed = 0;
    for seed in [1, 2, 3, 4] {
        let sampling = Sampling { temperature: 1.0, top_k: None, top_p: Some(0.95), seed };
        let c = generate(sampling, true);
        match c.text.find("</tool_call>") {
            Some(end) => {
                let call = the_call(&c.text[..end + "</tool_call>".len()]);
                assert!(call.is_ok(), "seed {seed}: {call:?}: {:?}", c.text);
                closed += 1;
            }
            None => assert_eq!(c.stop, StopReason::MaxTokens, "seed {seed}: {:?}", c.text),
        }
    }
    assert!(closed > 0);
}

/// A checkpoint mid-call: the grammar's state is rebuilt from the restored tokens, so the
/// tokens after a crash are those of an uninterrupted run (greedy and sampled).
#[test]
fn a_constrained_generation_resumed_mid_call_gives_the_uninterrupted_tokens() {
    for sampling in [Sampling::greedy(), Sampling { temperature: 0.8, top_k: Some(40), top_p: None, seed: 7 }] {
        let want = generate(sampling, true);
        let got = common::across_crashes(model(), &request(sampling, true), "constrained");
        assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), want.tokens, "{sampling:?}");
    }
}

/// What a masked step costs: sampling at a temperature masks the whole vocabulary each step.
/// Prints the decode time per token with and without the grammar (the difference is the mask).
#[test]
fn the_mask_costs_are_reported() {
    let sampling = Sampling { temperature: 1.0, top_k: None, top_p: None, seed: 4 };
    let _ = generate(sampling, true); // the token pieces are read once per model
    let per_token = |c: &Completion| c.decode.as_secs_f64() * 1e6 / c.tokens.len() as f64;
    let (free, constrained) = (generate(sampling, false), generate(sampling, true));
    eprintln!(
        "decode per token: {:.0} µs free, {:.0} µs constrained ({} vocabulary entries)",
        per_token(&free),
        per_token(&constrained),
        model().spec().vocab_size
    );
    assert!(constrained.tokens.len() > 1);
}

/// Drafting is off while a grammar constrains the stream (a verify pass would judge guesses by
/// unmasked logits): a drafted request gives the undrafted tokens and drafts nothing. A syntax
/// decoded freely (Qwen's XML form) leaves the tokens as without a grammar.
#[test]
fn drafting_is_off_under_a_grammar_and_free_syntaxes_change_nothing() {
    let plain = generate(Sampling::greedy(), true);
    let mut drafted = request(Sampling::greedy(), true);
    drafted.draft = nightmail_engine::Drafting::Lookup;
    let drafted = model().generate(drafted, |_| std::ops::ControlFlow::Continue(())).unwrap();
    assert_eq!((drafted.tokens, drafted.drafted), (plain.tokens, 0));
    let mut xml = request(Sampling::greedy(), false);
    xml.max_new_tokens = 24;
    xml.tool_calls = Some(ToolCallGrammar::from_openai_tools(ToolSyntax::QwenXml, TOOLS).unwrap());
    let free = GenerateRequest { tool_calls: None, ..xml.clone() };
    let run = |r| model().generate(r, |_| std::ops::ControlFlow::Continue(())).unwrap().tokens;
    assert_eq!(run(xml), run(free));
}
