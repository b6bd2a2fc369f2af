//! Each family's own chat template gives the text transformers gives: the templates the models
//! ship with (llama.cpp's copies in `models/templates/*.jinja`, from the llama-cpp-python sdist
//! that scripts/fetch-llama-cpp-src.sh unpacks to `NIGHTMAIL_LLAMA_CPP_SRC`), rendered by
//! nightmail and by transformers' `render_jinja_template` (tests/fixtures/transformers_chat.py,
//! run live) on conversations with system, user and assistant turns, reasoning, tool calls and
//! tool results, with and without a generation prompt.

mod common;

use common::template;
use nightmail_formats::chat::thinking_switches;
use nightmail_formats::{ChatMessage, ChatTemplate, RenderOptions, ToolArguments, ToolCall};
use serde_json::{Value as Json, json};

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, now.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "send_mail", "description": "Send a letter.", "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}}}]"#;

struct Case {
    what: &'static str,
    messages: Vec<ChatMessage>,
    tools: bool,
    add_generation_prompt: bool,
}

fn weather_call(arguments: ToolArguments) -> ToolCall {
    // Mistral's template takes only 9-character alphanumeric ids.
    ToolCall::function("call0wx7q", "get_weather", arguments)
}

fn cases() -> Vec<Case> {
    let system = ChatMessage::new("system", "You answer letters for Ada. Be brief.");
    let ask = ChatMessage::new("user", "What is the weather in Zürich? Answer in \"°C\" <please>.");
    let object = r#"{"city": "Zürich", "unit": "celsius"}"#;
    let called = |arguments: ToolArguments| {
        ChatMessage::new("assistant", "")
            .with_reasoning("The user wants the weather; call get_weather.")
            .with_tool_call(weather_call(arguments))
    };
    let result = ChatMessage::tool_result("call0wx7q", "get_weather", r#"{"temperature": 21, "sky": "clear"}"#);
    let answer = ChatMessage::new("assistant", "It is 21 °C and clear in Zürich.").with_reasoning("21 degrees, clear.");
    let thanks = ChatMessage::new("user", "Thanks!\nAnd tomorrow?");
    vec![
        Case {
            what: "one user turn",
            messages: vec![ChatMessage::new("user", "Hello, 世界 👋")],
            tools: false,
            add_generation_prompt: true,
        },
        Case {
            what: "system, user, assistant, user",
            messages: vec![
                system.clone(),
                ChatMessage::new("user", "Hi"),
                ChatMessage::new("assistant", "Hello! How can I help?"),
                ChatMessage::new("user", "  Summarise my inbox.  "),
            ],
            tools: false,
            add_generation_prompt: true,
        },
        Case {
            what: "an assistant turn with reasoning, last (no generation prompt)",
            messages: vec![
                ChatMessage::new("user", "2+2?"),
                ChatMessage::new("assistant", "4").with_reasoning("Two and two."),
            ],
            tools: false,
            add_generation_prompt: false,
        },
        Case {
            what: "reasoning in an earlier turn",
            messages: vec![
                system.clone(),
                ChatMessage::new("user", "2+2?"),
                ChatMessage::new("assistant", "4").with_reasoning("Two and two."),
                thanks.clone(),
            ],
            tools: false,
            add_generation_prompt: true,
        },
        Case {
            what: "tools offered",
            messages: vec![system.clone(), ask.clone()],
            tools: true,
            add_generation_prompt: true,
        },
        Case {
            what: "a tool call (arguments an object), its result, the answer, a new question",
            messages: vec![
                system.clone(),
                ask.clone(),
                called(ToolArguments::Object(object.into())),
                result.clone(),
                answer.clone(),
                thanks.clone(),
            ],
            tools: true,
            add_generation_prompt: true,
        },
        Case {
            what: "a tool call (arguments JSON text) and its result, awaiting the answer",
            messages: vec![ask.clone(), called(ToolArguments::Text(object.into())), result.clone()],
            tools: true,
            add_generation_prompt: true,
        },
    ]
}

/// Template switches each case is also rendered with: none, and the ones the families read
/// (Qwen3's `enable_thinking`, DeepSeek-V3.1's and Kimi K3's `thinking`, K3's `thinking_effort`,
/// gpt-oss's `reasoning_effort`), each way, and the sets a mail's thinking switch sets.
fn switches() -> Vec<Vec<(String, Json)>> {
    vec![
        vec![],
        thinking_switches(true),
        thinking_switches(false),
        vec![
            ("enable_thinking".into(), json!(false)),
            ("thinking".into(), json!(true)),
            ("reasoning_effort".into(), json!("high")),
        ],
        vec![
            ("enable_thinking".into(), json!(true)),
            ("thinking".into(), json!(false)),
            ("thinking_effort".into(), json!("low")),
            ("reasoning_effort".into(), json!("low")),
        ],
    ]
}

struct Rendered {
    label: String,
    ours: Result<String, String>,
}

/// tests/fixtures/transformers_chat.py on every request.
fn transformers(requests: &[Json]) -> Vec<Result<String, String>> {
    let answers = common::python_json("transformers_chat.py", &Json::Array(requests.to_vec()), "transformers==5.24.0");
    let answers: Vec<Json> = serde_json::from_value(answers).unwrap();
    answers
        .into_iter()
        .map(|a| match a.get("text") {
            Some(t) => Ok(t.as_str().unwrap().to_string()),
            None => Err(a["error"].as_str().unwrap_or("?").to_string()),
        })
        .collect()
}

/// The message as JSON text with its keys in the OpenAI order nightmail hands the template (a
/// `serde_json::Value` would sort them, and templates print dicts with `tojson`).
fn message_json(m: &ChatMessage) -> String {
    let text = |s: &str| Json::from(s).to_string();
    let object = |fields: Vec<(&str, String)>| {
        let inner: Vec<String> = fields.into_iter().map(|(k, v)| format!("{}: {v}", text(k))).collect();
        format!("{{{}}}", inner.join(", "))
    };
    let mut fields = vec![("role", text(&m.role)), ("content", text(&m.content))];
    if let Some(r) = &m.reasoning_content {
        fields.push(("reasoning_content", text(r)));
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<String> = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = match &c.function.arguments {
                    ToolArguments::Object(json) => json.clone(),
                    ToolArguments::Text(s) => text(s),
                };
                let function = object(vec![("name", text(&c.function.name)), ("arguments", arguments)]);
                object(vec![("id", text(c.id.as_deref().unwrap())), ("type", text(&c.kind)), ("function", function)])
            })
            .collect();
        fields.push(("tool_calls", format!("[{}]", calls.join(", "))));
    }
    if let Some(id) = &m.tool_call_id {
        fields.push(("tool_call_id", text(id)));
    }
    if let Some(n) = &m.name {
        fields.push(("name", text(n)));
    }
    object(fields)
}

/// Every case and switch through each template by both renderers (transformers started once); the
/// texts must be equal, and a conversation one refuses (`raise_exception`, or a method the
/// sandbox forbids) the other must refuse too. The failures, described.
fn renders_as_transformers(templates: &[(&str, String)], bos: &str, eos: &str) -> Vec<String> {
    let mut ours = Vec::new();
    let mut requests = Vec::new();
    for (name, source) in templates {
        let t = ChatTemplate::new(source.as_str());
        let before = requests.len();
        render_cases(name, source, &t, bos, eos, &mut ours, &mut requests);
        assert!(requests.len() > before);
    }
    let theirs = transformers(&requests);
    let mut failures = Vec::new();
    for (r, reference) in ours.iter().zip(&theirs) {
        match (&r.ours, reference) {
            (Ok(a), Ok(b)) if a == b => {}
            (Err(_), Err(_)) => {}
            (a, b) => failures.push(format!("{}\n  nightmail:    {a:?}\n  transformers: {b:?}", r.label)),
        }
    }
    for (name, _) in templates {
        let prefix = format!("{name}:");
        if !ours.iter().zip(&theirs).any(|(r, t)| r.label.starts_with(&prefix) && t.is_ok()) {
            failures.push(format!("{name}: transformers rendered no case"));
        }
    }
    failures
}

fn render_cases(
    name: &str,
    source: &str,
    t: &ChatTemplate,
    bos: &str,
    eos: &str,
    ours: &mut Vec<Rendered>,
    requests: &mut Vec<Json>,
) {
    for case in cases() {
        for kwargs in switches() {
            let options = RenderOptions {
                add_generation_prompt: case.add_generation_prompt,
                bos_token: bos.into(),
                eos_token: eos.into(),
                tools: case.tools.then(|| TOOLS.to_string()),
                kwargs: kwargs.clone(),
            };
            let mut py_kwargs: serde_json::Map<String, Json> = kwargs.into_iter().collect();
            py_kwargs.insert("bos_token".into(), json!(bos));
            py_kwargs.insert("eos_token".into(), json!(eos));
            requests.push(json!({
                "template": source,
                "messages_json": format!("[{}]", case.messages.iter().map(message_json).collect::<Vec<_>>().join(", ")),
                "tools_json": options.tools,
                "add_generation_prompt": case.add_generation_prompt,
                "kwargs": py_kwargs,
            }));
            ours.push(Rendered {
                label: format!("{name}: {} {:?}", case.what, options.kwargs),
                ours: t.render_with(&case.messages, &options).map_err(|e| e.to_string()),
            });
        }
    }
}

macro_rules! family {
    ($test:ident, $bos:expr, $eos:expr, [$($file:expr),+]) => {
        #[test]
        fn $test() {
            let templates: Vec<(&str, String)> = [$($file),+].into_iter().map(|f| (f, template(f))).collect();
            let failures = renders_as_transformers(&templates, $bos, $eos);
            assert!(failures.is_empty(), "{} renderings differ:\n{}", failures.len(), failures.join("\n"));
        }
    };
}

family!(kimi_k2, "[BOS]", "[EOS]", ["moonshotai-Kimi-K2.jinja", "Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja"]);
family!(kimi_k3, "[BOS]", "[EOS]", ["Kimi-K3.jinja"]);
family!(
    deepseek_v3,
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    ["deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-ai-DeepSeek-V3.2.jinja"]
);
family!(
    deepseek_v4,
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    ["deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja"]
);
family!(glm4_moe, "", "<|endoftext|>", ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja"]);
family!(gpt_oss, "<|startoftext|>", "<|return|>", ["openai-gpt-oss-120b.jinja"]);
family!(minimax_m2, "]~!b[", "[e~[", ["MiniMax-M2.jinja"]);
family!(qwen3_moe, "", "<|im_end|>", ["Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja"]);
family!(qwen3_next_and_qwen3_5, "", "<|im_end|>", ["Qwen3.5-4B.jinja"]);
family!(qwen2_moe, "", "<|im_end|>", ["Qwen-Qwen2.5-7B-Instruct.jinja"]);
family!(
    llama,
    "<|begin_of_text|>",
    "<|eot_id|>",
    [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "meta-llama-Llama-3.3-70B-Instruct.jinja"
    ]
);
family!(mixtral, "<s>", "</s>", ["mistralai-Mistral-Nemo-Instruct-2407.jinja"]);
// Not families nightmail runs: templates with transformers' `{% generation %}` block.
family!(generation_blocks, "<s>", "</s>", ["LFM2.5-8B-A1B.jinja", "poolside-Laguna-XS.2.jinja"]);

/// A mail's thinking switch, on and off, changes the prompt of every family that can be told
/// (what each text is, transformers' rendering with the same variables checks above).
#[test]
fn thinking_switch_reaches_each_family() {
    let families = [
        "Qwen-Qwen3-0.6B.jinja",
        "Qwen3.5-4B.jinja",
        "GLM-4.6.jinja",
        "GLM-4.7-Flash.jinja",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "deepseek-ai-DeepSeek-V3.2.jinja",
        "deepseek-ai-DeepSeek-V4.jinja",
        "Kimi-K3.jinja",
        "openai-gpt-oss-120b.jinja",
    ];
    let ask = [ChatMessage::new("user", "Is it going to rain?")];
    for file in families {
        let t = ChatTemplate::new(template(file));
        let render = |on: bool| {
            let options = RenderOptions {
                add_generation_prompt: true,
                kwargs: thinking_switches(on),
                ..RenderOptions::default()
            };
            t.render_with(&ask, &options).unwrap()
        };
        assert_ne!(render(true), render(false), "{file}: thinking on and off render the same prompt");
    }
}

/// The demo model's own template, read from its GGUF (scripts/fetch-model.sh fetches it).
#[test]
fn smollm2_gguf() {
    let path = common::smollm2_gguf();
    let g = nightmail_formats::GgufFile::open(&path).unwrap();
    let template = ChatTemplate::from_gguf(&g).expect("SmolLM2's GGUF carries a chat template");
    let tk = nightmail_formats::TextTokenizer::from_gguf(&g).unwrap().expect("SmolLM2's GGUF carries a vocabulary");
    let failures = renders_as_transformers(
        &[("SmolLM2-135M-Instruct.Q4_1.gguf", template.source().to_string())],
        tk.bos_text().unwrap_or(""),
        tk.eos_text().unwrap_or(""),
    );
    assert!(failures.is_empty(), "{} renderings differ:\n{}", failures.len(), failures.join("\n"));
}
