use std::sync::Arc;

use serde_json::json;

use super::frame::{CallGrammar, frame};
use super::json::{ArgsSchema, Json};
use super::*;
use crate::sampling::{Sampler, Sampling};

fn tools(syntax: ToolSyntax) -> ToolCallGrammar {
    ToolCallGrammar {
        syntax,
        tools: vec![
            (
                "fetch".into(),
                json!({"type": "object", "properties": {"url": {"type": "string"}, "max_bytes": {"type": "integer"}}, "required": ["url"]}),
            ),
            ("fetch_all".into(), json!({"type": "object", "properties": {"urls": {"type": "array"}}})),
            (
                "search".into(),
                json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
            ),
        ],
    }
}

fn grammar(syntax: ToolSyntax) -> CallGrammar {
    tools(syntax).compile().unwrap().unwrap()
}

/// Feeds `text`: whether every byte was allowed, and whether the output is inside a call after it.
fn run(g: &CallGrammar, text: &str) -> (bool, bool) {
    let mut s = g.start();
    let ok = text.bytes().all(|b| g.feed(&mut s, b));
    (ok, g.in_call(&s))
}

/// Whether `text` is a whole call: every byte allowed and the call closed at its end.
fn whole(g: &CallGrammar, text: &str) -> bool {
    run(g, text) == (true, false)
}

#[test]
fn a_hermes_call_to_a_listed_tool_is_taken_whole_and_parses() {
    let g = grammar(ToolSyntax::Hermes);
    let call = "Looking.\n<tool_call>\n{\"name\": \"fetch\", \"arguments\": {\"url\": \"https://a.example/\", \"max_bytes\": 4096}}\n</tool_call>";
    assert!(whole(&g, call));
    let turn = ToolSyntax::Hermes.parse(call);
    assert!(matches!(&turn.calls[..], [Ok(c)] if c.function.name == "fetch"), "{turn:?}");
    // A second call after the first is constrained again.
    assert!(!run(&g, &format!("{call}\n<tool_call>\n{{\"name\": \"nope")).0);
}

#[test]
fn a_name_must_be_one_of_the_tools_and_the_longest_wins() {
    let g = grammar(ToolSyntax::Hermes);
    assert!(!run(&g, "<tool_call>\n{\"name\": \"delete_all").0);
    assert!(!run(&g, "<tool_call>\n{\"name\": \"fetc\"").0);
    assert!(whole(&g, "<tool_call>\n{\"name\": \"fetch_all\", \"arguments\": {}}\n</tool_call>"));
    // Text before the opener is free.
    assert_eq!(run(&g, "{not json at all} <tool"), (true, false));
}

#[test]
fn required_keys_must_come_before_the_object_closes() {
    let g = grammar(ToolSyntax::Hermes);
    let head = "<tool_call>\n{\"name\": \"search\", \"arguments\": ";
    assert!(!run(&g, &format!("{head}{{}}")).0);
    assert!(!run(&g, &format!("{head}{{\"q\": 1")).0, "unknown key");
    assert!(!run(&g, &format!("{head}{{\"query\": 3")).0, "a string property's value is a string");
    assert!(!run(&g, &format!("{head}{{\"query\": \"a\", \"query\"")).0, "no key twice");
    // Every property written: no `,` is left to write.
    assert!(!run(&g, &format!("{head}{{\"query\": \"a\",")).0);
    assert!(whole(&g, &format!("{head}{{\"query\": \"a\"}}}}\n</tool_call>")));
}

/// The arguments automaton against serde_json (RFC 8259) on whole objects, with a schema that
/// lists no properties (any key).
#[test]
fn the_json_automaton_accepts_what_serde_json_accepts() {
    let open = ArgsSchema::new("f", &json!({})).unwrap();
    let cases = [
        r#"{}"#,
        r#"{"a": 1, "b": [true, false, null, -0.5e+3, 0, 12.25E-2], "c": {"d": []}}"#,
        r#"{"s": "tab\tescaped \" \\ \/ \b\f\n\r\t \u00e9 \uD83D\uDE00 ünï"}"#,
        r#"{"a": 01}"#,
        r#"{"a": -}"#,
        r#"{"a": 1.}"#,
        r#"{"a": 1e}"#,
        r#"{"a": .5}"#,
        r#"{"a": tru}"#,
        r#"{"a": [1,]}"#,
        r#"{"a": 1,}"#,
        r#"{"a" 1}"#,
        r#"{a: 1}"#,
        r#"{"a": "\x"}"#,
        r#"{"a": "\u12G4"}"#,
        r#"{"a": "\uD83D"}"#,
        r#"{"a": "\uDE00"}"#,
        r#"{"a": "\uD83D\u0041"}"#,
        "{\"a\": \"raw\nnewline\"}",
        r#"{"a": [[[]]], "b": {"c": {"d": "e"}}}"#,
        r#"[1]"#,
        r#"{"a": 1}}"#,
    ];
    for case in cases {
        let mut s = Json::start();
        let ok = case.bytes().all(|b| s.feed(b, &open)) && s.is_done();
        let serde_ok = serde_json::from_str::<Value>(case).map(|v| v.is_object()).unwrap_or(false);
        assert_eq!(ok, serde_ok, "{case}");
    }
}

#[test]
fn the_json_argument_families_frame_calls_their_parsers_read() {
    let calls = [
        (
            ToolSyntax::KimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"query\": \"x\"}<|tool_call_end|><|tool_calls_section_end|>",
        ),
        (
            ToolSyntax::DeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": \"x\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolSyntax::DeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"x\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolSyntax::Harmony,
            "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"query\": \"x\"}<|call|>",
        ),
        (
            ToolSyntax::Harmony,
            "<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{\"query\": \"x\"}<|call|>",
        ),
    ];
    for (syntax, call) in calls {
        assert!(whole(&grammar(syntax), call), "{syntax:?}: {call}");
        let turn = syntax.parse(call);
        assert!(matches!(&turn.calls[..], [Ok(c)] if c.function.name == "search"), "{syntax:?}: {turn:?}");
    }
    // Harmony's name ends at a space or `<`, as its parser reads it.
    assert!(!run(&grammar(ToolSyntax::Harmony), " to=functions.searchX").0);
    assert!(!run(&grammar(ToolSyntax::KimiK2), "<|tool_call_begin|>functions.search:<").0);
}

#[test]
fn xml_syntaxes_are_left_free() {
    for syntax in
        [ToolSyntax::QwenXml, ToolSyntax::Glm, ToolSyntax::MiniMaxM2, ToolSyntax::KimiK3, ToolSyntax::DeepSeekV32]
    {
        assert!(tools(syntax).compile().unwrap().is_none(), "{syntax:?}");
    }
}

/// Watching for the opener restarts at its first byte on a mismatch: exact only while no opener
/// (nor harmony's `<|message|>`) holds its first byte again.
#[test]
fn no_marker_repeats_its_first_byte() {
    let mut markers = vec!["<|message|>"];
    markers.extend(ToolSyntax::ALL.iter().filter_map(|s| frame(*s)).map(|(o, _)| o));
    for m in markers {
        assert!(!m.as_bytes()[1..].contains(&m.as_bytes()[0]), "{m}");
    }
    let g = grammar(ToolSyntax::Hermes);
    assert_eq!(run(&g, "<<tool_call>"), (true, true));
}

#[test]
fn bad_tool_lists_are_refused_with_what_to_fix() {
    let bad = ToolCallGrammar { syntax: ToolSyntax::Hermes, tools: vec![("a b".into(), json!({}))] };
    assert_eq!(bad.compile().unwrap_err(), GrammarError::BadName("a b".into()));
    let req = json!({"properties": {"a": {}}, "required": ["b"]});
    let bad = ToolCallGrammar { syntax: ToolSyntax::Hermes, tools: vec![("f".into(), req)] };
    assert!(matches!(bad.compile(), Err(GrammarError::UnknownRequired { .. })));
    let openai = r#"[{"type":"function","function":{"name":"search","parameters":{"type":"object"}}}]"#;
    let g = ToolCallGrammar::from_openai_tools(ToolSyntax::Hermes, openai).unwrap();
    assert_eq!(g.tools[0].0, "search");
}

/// A vocabulary of whole pieces: the mask refuses what leaves the grammar, greedy takes the best
/// allowed token, and a temperature never draws a refused one.
#[test]
fn masking_keeps_to_the_grammar_greedy_and_sampled() {
    let words = ["<tool_call>", "\n{\"name\": \"", "delete", "search", "\"", "x", "<|eos|>"];
    let (mut bytes, mut starts) = (Vec::new(), vec![0]);
    for w in words {
        let w = if w == "<|eos|>" { "" } else { w };
        bytes.extend_from_slice(w.as_bytes());
        starts.push(bytes.len() as u32);
    }
    let pieces = TokenPieces::laid(bytes, starts);
    let mut c = Constraint::new(&tools(ToolSyntax::Hermes), Arc::new(pieces), &[6]).unwrap().unwrap();
    let mut greedy = Sampler::new(Sampling::greedy()).unwrap();
    // Outside a call everything is allowed, the end of sequence included.
    let mut row = vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0];
    c.mask(&mut row);
    assert!(row.iter().all(|l| l.is_finite()));
    for id in [0, 1] {
        c.advance(id).unwrap();
    }
    let in_name = c.state;
    let mut row = vec![1.0, 1.0, 9.0, 2.0, 1.0, 1.0, 8.0];
    assert_eq!(c.pick(&mut row.clone(), &mut greedy).unwrap(), 3, "delete is no tool; eos ends no call");
    c.state = in_name;
    c.mask(&mut row);
    assert_eq!(row.iter().filter(|l| l.is_finite()).count(), 1);
    let mut hot = Sampler::new(Sampling { temperature: 2.0, top_k: None, top_p: None, seed: 5 }).unwrap();
    for _ in 0..50 {
        let mut c2 = Constraint {
            state: c.state,
            grammar: c.grammar.clone(),
            opening: c.opening.clone(),
            pieces: c.pieces.clone(),
            eos: vec![6],
        };
        assert_eq!(c2.pick(&mut [1.0, 1.0, 9.0, 2.0, 1.0, 3.0, 8.0], &mut hot).unwrap(), 3);
    }
}

/// The mask over SmolLM2's real vocabulary (49,152 pieces): in each state, what it allows is what
/// the grammar allows, and its cost per step is printed (`cargo test -p nightmail-engine --lib
/// mask_over_smollm2 -- --nocapture`).
#[test]
fn mask_over_smollm2s_vocabulary() {
    let path = std::env::var_os("NIGHTMAIL_SMOLLM2").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    let tok = TextTokenizer::from_gguf_file(&path).unwrap().unwrap();
    let t0 = std::time::Instant::now();
    let pieces = Arc::new(TokenPieces::new(&tok, tok.vocab_size()).unwrap());
    eprintln!("token pieces read in {:?}", t0.elapsed());
    // The pieces laid end to end are the decoded text (a multi-byte character split across tokens included).
    let ids = tok.encode("Grüße, 東京 {\"a\": 1}\n", false).unwrap();
    let laid: Vec<u8> = ids.iter().flat_map(|&id| pieces.piece(id).to_vec()).collect();
    assert_eq!(String::from_utf8(laid).unwrap(), tok.decode(&ids).unwrap());
    let eos = tok.token_id("<|im_end|>").unwrap();
    let mut c = Constraint::new(&tools(ToolSyntax::Hermes), pieces, &[eos]).unwrap().unwrap();
    for (at, text) in [
        ("free", "The rate is"),
        ("name", "<tool_call>\n{\"name\": \"fetch"),
        ("key", "\", \"arguments\": {\""),
        ("string", "url\": \"https://a.example/"),
    ] {
        c.prime(&tok.encode(text, false).unwrap());
        let mut row = vec![0.0f32; tok.vocab_size()];
        let runs = 20;
        let t0 = std::time::Instant::now();
        for _ in 0..runs {
            row.iter_mut().for_each(|l| *l = 0.0);
            c.mask(&mut row);
        }
        let allowed = row.iter().filter(|l| l.is_finite()).count();
        // The shortcuts (a plain string, an idle watch) give what feeding every byte gives.
        for id in 0..row.len() as u32 {
            let mut s = c.state;
            let fed = c.pieces.piece(id).iter().all(|&b| c.grammar.feed(&mut s, b)).then_some(s);
            let in_call = c.grammar.in_call(&c.state);
            let fed = fed.filter(|_| !in_call || !(c.pieces.piece(id).is_empty() || id == eos));
            assert_eq!(c.after(id), fed, "{at}: token {id}");
        }
        eprintln!(
            "{at}: {allowed} tokens allowed, {:.0} µs per masked step",
            t0.elapsed().as_secs_f64() * 1e6 / runs as f64
        );
        match at {
            // Outside a call only a token that would open one and break it is refused.
            "free" => assert_eq!(allowed, row.len()),
            "name" => assert!(allowed > 0 && allowed < 50, "{allowed}"),
            _ => assert!(allowed > 0 && allowed < row.len()),
        }
        assert!(!row[eos as usize].is_finite() || at == "free");
    }
}
