//! A Kimi K3 file that carries no chat template (the fixtures: a GGUF without
//! `tokenizer.chat_template`, a Hugging Face directory without `chat_template.jinja`) still
//! prompts in K3's own format: the model's template renders every conversation (reasoning, tool
//! declarations, calls and results; thinking on and off) as llama.cpp's
//! `models/templates/Kimi-K3.jinja` does, from the sdist scripts/fetch-llama-cpp-src.sh unpacks to
//! `NIGHTMAIL_LLAMA_CPP_SRC`.

use std::path::PathBuf;

use nightmail_engine::{ChatMessage, ChatTemplate, Model, RenderOptions, ToolArguments, ToolCall};

fn llama_cpp_kimi_k3() -> ChatTemplate {
    let dir = std::env::var_os("NIGHTMAIL_LLAMA_CPP_SRC").unwrap_or_else(|| {
        panic!(
            "NIGHTMAIL_LLAMA_CPP_SRC is not set: run `export NIGHTMAIL_LLAMA_CPP_SRC=$(scripts/fetch-llama-cpp-src.sh)` (scripts/test.sh does)"
        )
    });
    let path = PathBuf::from(dir).join("models/templates/Kimi-K3.jinja");
    ChatTemplate::new(
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-llama-cpp-src.sh again)", path.display())),
    )
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You answer letters for Ada."),
        ChatMessage::new("user", "Weather in Zürich?"),
        ChatMessage::new("assistant", "").with_reasoning("Call the tool.").with_tool_call(ToolCall::function(
            "functions.get_weather:0",
            "get_weather",
            ToolArguments::Object(r#"{"city": "Zürich"}"#.into()),
        )),
        ChatMessage::tool_result("functions.get_weather:0", "get_weather", r#"{"temperature": 21}"#),
        ChatMessage::new("assistant", "21 °C.").with_reasoning("It said 21."),
        ChatMessage::new("user", "Thanks. Tomorrow?"),
    ]
}

fn options(thinking: bool) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: true,
        tools: Some(
            r#"[{"type": "function", "function": {"name": "get_weather", "description": "Weather now.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#
                .into(),
        ),
        kwargs: vec![("thinking".into(), serde_json::json!(thinking))],
        ..RenderOptions::default()
    }
}

fn prompts_as_kimi_k3(path: PathBuf) {
    let model = Model::load(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    let ours = model.chat_template().expect("a K3 file without a template has K3's built in");
    let reference = llama_cpp_kimi_k3();
    assert_eq!(ours.source(), reference.source(), "the built-in template is llama.cpp's Kimi-K3.jinja");
    for thinking in [true, false] {
        let text = ours.render_with(&conversation(), &options(thinking)).unwrap();
        assert_eq!(text, reference.render_with(&conversation(), &options(thinking)).unwrap());
        assert!(text.contains("get_weather") && text.contains("It said 21.") == thinking, "{text}");
    }
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3")
}

#[test]
fn gguf_without_a_template_prompts_as_kimi_k3() {
    prompts_as_kimi_k3(fixture().join("model.gguf"));
}

#[test]
fn hf_directory_without_a_template_prompts_as_kimi_k3() {
    prompts_as_kimi_k3(fixture());
}
