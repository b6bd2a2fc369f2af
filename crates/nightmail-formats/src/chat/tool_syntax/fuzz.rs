//! No input makes `parse` panic: each syntax reads random strings built from every family's
//! markers, and every truncation and many mutations of well-formed turns (a seeded xorshift, so a
//! failure repeats).

use super::ToolSyntax;

/// One well-formed turn with two calls per syntax.
fn valid(syntax: ToolSyntax) -> &'static str {
    match syntax {
        ToolSyntax::KimiK2 => {
            "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": \"é\"}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
        }
        ToolSyntax::KimiK3 => {
            "<|open|>response<|sep|>Sure.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"b\": [1]}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        }
        ToolSyntax::DeepSeekV3 => {
            "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        }
        ToolSyntax::DeepSeekV31 => {
            "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        }
        ToolSyntax::DeepSeekV32 => {
            "Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"b\" string=\"false\">{\"c\": 2}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"
        }
        ToolSyntax::DeepSeekV4 => {
            "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
        }
        ToolSyntax::Hermes => {
            "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call><|im_end|>"
        }
        ToolSyntax::QwenXml => {
            "Sure.\n<tool_call>\n<function=f>\n<parameter=a>\nx y\n</parameter>\n<parameter=b>\n{\"c\": 2}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>"
        }
        ToolSyntax::Glm => {
            "Sure.\n<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>x</arg_value>\n</tool_call><tool_call>g<arg_key>b</arg_key><arg_value>2</arg_value></tool_call>"
        }
        ToolSyntax::MiniMaxM2 => {
            "Sure.\n<minimax:tool_call>\n<invoke name=\"f\"><parameter name=\"a\">x</parameter>\n</invoke>\n<invoke name=\"g\"></invoke>\n</minimax:tool_call>[e~["
        }
        ToolSyntax::Harmony => {
            "<|channel|>analysis<|message|>Sure.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|><|start|>assistant to=functions.g<|channel|>commentary json<|message|>{}<|call|>"
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Every marker of every syntax, cut into the parts a mutation splices in.
fn alphabet() -> Vec<String> {
    let mut parts: Vec<String> = ToolSyntax::ALL.iter().map(|s| s.call_opener().to_string()).collect();
    for s in ToolSyntax::ALL {
        let v = valid(s);
        let mut start = 0;
        for (i, c) in v.char_indices() {
            if matches!(c, '<' | '>' | '"' | '\n' | '{' | '}' | '=') {
                parts.push(v[start..i].to_string());
                parts.push(c.to_string());
                start = i + c.len_utf8();
            }
        }
    }
    parts.extend(["é", "｜", "▁", "\\", "\"", "null", "[", "]", ":", " "].map(String::from));
    parts
}

#[test]
fn truncations_of_well_formed_turns_never_panic_nor_add_calls() {
    for syntax in ToolSyntax::ALL {
        let text = valid(syntax);
        let whole = syntax.parse(text);
        assert!(whole.calls.iter().all(Result::is_ok), "{syntax:?}: {whole:?}");
        assert_eq!(whole.content, "Sure.", "{syntax:?}");
        for (at, _) in text.char_indices() {
            let cut = syntax.parse(&text[..at]);
            assert!(cut.calls.len() <= whole.calls.len(), "{syntax:?} cut at {at}: {cut:?}");
        }
    }
}

#[test]
fn random_and_mutated_text_never_panics() {
    let parts = alphabet();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let text = if round % 2 == 0 {
            (0..rng.below(40)).map(|_| parts[rng.below(parts.len())].as_str()).collect::<String>()
        } else {
            let mut text = valid(ToolSyntax::ALL[rng.below(ToolSyntax::ALL.len())]).to_string();
            for _ in 0..1 + rng.below(4) {
                let at = text.char_indices().map(|(i, _)| i).nth(rng.below(text.chars().count())).unwrap_or(0);
                match rng.below(3) {
                    0 => text.insert_str(at, &parts[rng.below(parts.len())]),
                    1 => {
                        let end = text[at..].char_indices().nth(rng.below(8)).map_or(text.len(), |(i, _)| at + i);
                        text.replace_range(at..end, "");
                    }
                    _ => text.truncate(at),
                }
            }
            text
        };
        for syntax in ToolSyntax::ALL {
            let turn = syntax.parse(&text);
            for call in turn.calls.iter().filter_map(|c| c.as_ref().err()) {
                assert!(!call.to_string().is_empty());
            }
            let _ = syntax.holds_call(&text);
        }
    }
}
