//! Each family's tool calls read back by `ToolSyntax`: the family's shipped template (llama.cpp's
//! copy in `models/templates/`) renders an assistant turn with one call and with two, and the
//! syntax `ToolSyntax::of_template` picks must give back the same names and arguments and the
//! turn's words. Then malformed calls in each syntax must come back as `MalformedCall`s that say
//! what was wrong.

mod common;

use common::template;
use nightmail_formats::{ChatMessage, ChatTemplate, MalformedCall, RenderOptions, ToolArguments, ToolCall, ToolSyntax};
use serde_json::Value as Json;

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "options": {"type": "object"}, "note": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "send_mail", "description": "Send a letter.", "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}}}]"#;

/// A string, a number, a nested object with a list, and text with quotes, a dash, an emoji and
/// angle brackets. (No string that is itself JSON, such as "12": the XML forms write strings bare,
/// so such a value reads back typed; see `scan::loose_value`.)
const WEATHER: &str = r#"{"city": "Zürich", "days": 3, "options": {"unit": "celsius", "hours": [6, 12.5]}, "note": "say \"hi\" — it's ☀️ <ok>"}"#;
const MAIL: &str = r#"{"to": "ada@example.org", "body": "Grüße, Ada!\nLine two: 'single' & \"double\""}"#;

/// What the assistant says before its calls: unique, so its place in the rendering marks where
/// the turn's generated text begins.
const SAID: &str = "I'll look that up for you.";

fn calls(n: usize) -> Vec<(&'static str, &'static str)> {
    [("get_weather", WEATHER), ("send_mail", MAIL)].into_iter().take(n).collect()
}

/// The conversation ending in the assistant's turn that makes `calls`. gpt-oss's template renders
/// only a turn's first call ("We assume max 1 tool call per message", openai-gpt-oss-120b.jinja),
/// as harmony sends each call as its own message, so there a second call is a second turn.
fn conversation(calls: &[(&str, &str)], one_call_per_turn: bool) -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::new("user", "What is the weather in Zürich? Then mail Ada about it.")];
    let mut turn = ChatMessage::new("assistant", SAID);
    for (i, (name, arguments)) in calls.iter().enumerate() {
        if one_call_per_turn && i > 0 {
            messages.push(turn);
            turn = ChatMessage::new("assistant", "");
        }
        turn = turn.with_tool_call(ToolCall::function(
            format!("call{i}"),
            *name,
            ToolArguments::Object(arguments.to_string()),
        ));
    }
    messages.push(turn);
    messages
}

/// The conversation rendered whole, as transformers would with no generation prompt.
fn rendering(t: &ChatTemplate, messages: &[ChatMessage], bos: &str, eos: &str) -> String {
    let options = RenderOptions {
        add_generation_prompt: false,
        bos_token: bos.into(),
        eos_token: eos.into(),
        tools: Some(TOOLS.into()),
        kwargs: vec![],
    };
    t.render_with(messages, &options).unwrap_or_else(|e| panic!("rendering failed: {e}"))
}

/// The assistant's turn as the model generates it: the rendering from the turn's words on (what
/// precedes them is the header the prompt gives), to its end; the conversation has no turn after.
fn generated(t: &ChatTemplate, messages: &[ChatMessage], bos: &str, eos: &str) -> String {
    let text = rendering(t, messages, bos, eos);
    let at = text.rfind(SAID).unwrap_or_else(|| panic!("the turn's words are not in the rendering:\n{text}"));
    text[at..].to_string()
}

/// The template's syntax is `expected`, and each rendered turn (one call, two calls) reads back.
fn reads_back(name: &str, t: &ChatTemplate, expected: ToolSyntax, bos: &str, eos: &str) {
    let syntax = ToolSyntax::of_template(t);
    assert_eq!(syntax, Some(expected), "{name}: the syntax recognised");
    let one_call_per_turn = expected == ToolSyntax::Harmony;
    for n in [1, 2] {
        let want = calls(n);
        let text = generated(t, &conversation(&want, one_call_per_turn), bos, eos);
        assert!(expected.holds_call(&text), "{name}: {n} calls: no {:?} in {text:?}", expected.call_opener());
        let turn = expected.parse(&text);
        assert_eq!(turn.content, SAID, "{name}: {n} calls: the prose of {text:?}");
        let got = read_calls(&turn.calls, &format!("{name}: {n} calls, in {text:?}"));
        assert_eq!(got, wanted(&want), "{name}: {n} calls read from {text:?}");
    }
}

/// Each call's name and arguments; `context` says where, should one be malformed.
fn read_calls(calls: &[Result<ToolCall, MalformedCall>], context: &str) -> Vec<(String, Json)> {
    calls
        .iter()
        .map(|c| {
            let c = c.as_ref().unwrap_or_else(|e| panic!("{context}: {e}"));
            let ToolArguments::Object(args) = &c.function.arguments else {
                panic!("{context}: arguments not an object: {c:?}")
            };
            (c.function.name.clone(), serde_json::from_str(args).unwrap())
        })
        .collect()
}

fn wanted(calls: &[(&str, &str)]) -> Vec<(String, Json)> {
    calls.iter().map(|(n, a)| (n.to_string(), serde_json::from_str(a).unwrap())).collect()
}

macro_rules! reads_back {
    ($test:ident, $file:expr, $syntax:expr, $bos:expr, $eos:expr) => {
        #[test]
        fn $test() {
            reads_back($file, &ChatTemplate::new(template($file)), $syntax, $bos, $eos);
        }
    };
}

reads_back!(kimi_k2, "moonshotai-Kimi-K2.jinja", ToolSyntax::KimiK2, "[BOS]", "[EOS]");
reads_back!(kimi_k3, "Kimi-K3.jinja", ToolSyntax::KimiK3, "[BOS]", "[EOS]");
reads_back!(
    deepseek_v3_1,
    "deepseek-ai-DeepSeek-V3.1.jinja",
    ToolSyntax::DeepSeekV31,
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>"
);
reads_back!(
    deepseek_v3_2,
    "deepseek-ai-DeepSeek-V3.2.jinja",
    ToolSyntax::DeepSeekV32,
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>"
);
reads_back!(
    deepseek_v4,
    "deepseek-ai-DeepSeek-V4.jinja",
    ToolSyntax::DeepSeekV4,
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>"
);
reads_back!(qwen3, "Qwen-Qwen3-0.6B.jinja", ToolSyntax::Hermes, "", "<|im_end|>");
reads_back!(qwen3_coder, "Qwen3-Coder.jinja", ToolSyntax::QwenXml, "", "<|im_end|>");
reads_back!(qwen3_5, "Qwen3.5-4B.jinja", ToolSyntax::QwenXml, "", "<|im_end|>");
reads_back!(glm_4_6, "GLM-4.6.jinja", ToolSyntax::Glm, "", "<|endoftext|>");
reads_back!(glm_4_7, "GLM-4.7-Flash.jinja", ToolSyntax::Glm, "", "<|endoftext|>");
reads_back!(minimax_m2, "MiniMax-M2.jinja", ToolSyntax::MiniMaxM2, "]~!b[", "[e~[");
reads_back!(gpt_oss, "openai-gpt-oss-120b.jinja", ToolSyntax::Harmony, "<|startoftext|>", "<|return|>");

#[test]
fn kimi_k3_built_in() {
    reads_back("ChatTemplate::kimi_k3()", &ChatTemplate::kimi_k3(), ToolSyntax::KimiK3, "[BOS]", "[EOS]");
}

/// Templates that render no tool calls have no syntax; the worker asks for Hermes then.
#[test]
fn templates_without_tool_calls_have_no_syntax() {
    // Apriel 1.5 and MiniMax-M3 name `<tool_call>` but write calls in forms of their own.
    for file in [
        "google-gemma-2-2b-it.jinja",
        "microsoft-Phi-3.5-mini-instruct.jinja",
        "unsloth-Apriel-1.5.jinja",
        "MiniMax-M3.jinja",
    ] {
        assert_eq!(ToolSyntax::of_template(&ChatTemplate::new(template(file))), None, "{file}");
    }
    let smollm2 = nightmail_formats::GgufFile::open(&common::smollm2_gguf()).unwrap();
    let smollm2 = ChatTemplate::from_gguf(&smollm2).expect("SmolLM2's GGUF carries a chat template");
    assert_eq!(ToolSyntax::of_template(&smollm2), None, "SmolLM2");
    let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    assert_eq!(ToolSyntax::of_template(&ChatTemplate::new(chatml)), None);
}

/// DeepSeek-V3's form, from R1's template, which renders an assistant's words as a turn of their
/// own after its calls (deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja), so the calls' turn is
/// taken from the calls' opener to its `<｜end▁of▁sentence｜>`, and has no words.
#[test]
fn deepseek_r1_calls_in_v3_form() {
    let file = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja";
    let t = ChatTemplate::new(template(file));
    assert_eq!(ToolSyntax::of_template(&t), Some(ToolSyntax::DeepSeekV3));
    let text = rendering(&t, &conversation(&calls(2), false), "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    let start = text.find(ToolSyntax::DeepSeekV3.call_opener()).expect("the calls are rendered");
    let end = start + text[start..].find("<｜end▁of▁sentence｜>").expect("the turn ends");
    let turn = ToolSyntax::DeepSeekV3.parse(&text[start..end]);
    assert_eq!(turn.content, "");
    let got = read_calls(&turn.calls, file);
    assert_eq!(got, wanted(&calls(2)), "{file}: calls read from {:?}", &text[start..end]);
}

/// Malformed calls in each syntax: (syntax, generated text, the function's name where it is
/// readable, a phrase the reason must hold). Per syntax: arguments that do not parse, a call cut
/// off before its end marker, and text of no known structure where a call belongs.
fn malformed_cases() -> Vec<(ToolSyntax, &'static str, Option<&'static str>, &'static str)> {
    use ToolSyntax::*;
    vec![
        (
            KimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": Zürich}<|tool_call_end|><|tool_calls_section_end|>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            KimiK2,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\"}",
            Some("get_weather"),
            "no end marker `<|tool_call_end|>`",
        ),
        (
            KimiK2,
            "<|tool_calls_section_begin|>get_weather(city=\"Zürich\")<|tool_calls_section_end|>",
            None,
            "is not a call",
        ),
        (
            KimiK3,
            "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"days\" type=\"number\"<|sep|>three<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            KimiK3,
            "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Zürich<|close|>argument<|sep|>",
            Some("get_weather"),
            "no end marker `<|close|>call<|sep|>`",
        ),
        (KimiK3, "<|open|>tools<|sep|>{\"name\": \"get_weather\"}<|close|>tools<|sep|>", None, "is not a call"),
        (
            DeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": }\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            DeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Zürich\"}",
            Some("get_weather"),
            "no end marker",
        ),
        (
            DeepSeekV3,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather {\"city\": \"Zürich\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            None,
            "has no `<｜tool▁sep｜>`",
        ),
        (
            DeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{city: \"Zürich\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            DeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zür",
            Some("get_weather"),
            "no end marker",
        ),
        (
            DeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[\"Zürich\"]<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            Some("get_weather"),
            "an array where a JSON object is needed",
        ),
        (
            DeepSeekV32,
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"days\" string=\"false\">three</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            DeepSeekV32,
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Zürich</｜DSML｜parameter>\n",
            Some("get_weather"),
            "no end marker `</｜DSML｜invoke>`",
        ),
        (
            DeepSeekV32,
            "<｜DSML｜function_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            None,
            "names no function",
        ),
        (
            DeepSeekV4,
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"days\" string=\"false\">{3}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            DeepSeekV4,
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Zürich",
            Some("get_weather"),
            "no end marker",
        ),
        (DeepSeekV4, "<｜DSML｜tool_calls>\nget_weather(\"Zürich\")\n</｜DSML｜tool_calls>", None, "is not a call"),
        (
            Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\",}}\n</tool_call>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}",
            Some("get_weather"),
            "no end marker `</tool_call>`",
        ),
        (
            Hermes,
            "<tool_call>\n{\"function\": \"get_weather\", \"city\": \"Zürich\"}\n</tool_call>",
            None,
            "no \"name\"",
        ),
        (
            QwenXml,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
            None,
            "does not begin with <function=NAME>",
        ),
        (
            QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n</function>\n",
            Some("get_weather"),
            "no end marker `</tool_call>`",
        ),
        (
            QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</function>\n</tool_call>",
            Some("get_weather"),
            "no end marker `</parameter>`",
        ),
        (
            Glm,
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
            Some("get_weather"),
            "the argument city has no <arg_value>",
        ),
        (
            Glm,
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n",
            Some("get_weather"),
            "no end marker `</tool_call>`",
        ),
        (
            Glm,
            "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",
            None,
            "does not begin with the function's name",
        ),
        (
            MiniMaxM2,
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Zürich</parameter>\n</minimax:tool_call>",
            Some("get_weather"),
            "no end marker `</invoke>`",
        ),
        (
            MiniMaxM2,
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Zürich\n</invoke>\n</minimax:tool_call>",
            Some("get_weather"),
            "no end marker `</parameter>`",
        ),
        (MiniMaxM2, "<minimax:tool_call>\n{\"name\": \"get_weather\"}\n</minimax:tool_call>", None, "is not a call"),
        (
            Harmony,
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": Zürich}<|call|>",
            Some("get_weather"),
            "not JSON",
        ),
        (
            Harmony,
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Zürich\"}",
            Some("get_weather"),
            "no end marker `<|call|>`",
        ),
        (Harmony, "<|channel|>commentary to=functions. <|message|>{}<|call|>", None, "names no function"),
    ]
}

#[test]
fn malformed_calls_are_errors_that_say_what_is_wrong() {
    for (syntax, text, name, phrase) in malformed_cases() {
        let turn = syntax.parse(text);
        let [Err(e)] = &turn.calls[..] else { panic!("{syntax:?}: one malformed call expected in {text:?}: {turn:?}") };
        assert_eq!(e.name.as_deref(), name, "{syntax:?}: {e}");
        assert!(e.reason.contains(phrase), "{syntax:?}: {:?} does not say {phrase:?}", e.reason);
        let message = e.to_string();
        let opening =
            name.map_or("the call could not be read: ".into(), |n| format!("the call to {n} could not be read: "));
        assert!(message.starts_with(&opening), "{message}");
        assert!(message.contains("; write it as: "), "{message}");
        assert!(message.contains(syntax.call_opener().trim()), "{message}: the form to copy");
    }
}
