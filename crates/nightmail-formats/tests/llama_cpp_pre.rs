//! Every pre-tokenizer nightmail claims gives llama.cpp's ids, checked live against llama.cpp
//! (llama-cpp-python's bindings, which scripts/test.sh installs) on the same files: llama.cpp's
//! Qwen2 and Llama 3 vocabularies (`models/ggml-vocab-{qwen2,llama-bpe}.gguf`, byte-level BPE of
//! 151k and 128k tokens; Llama 3's has multi-digit and cased-word tokens, where splits differ
//! most) with `tokenizer.ggml.pre` rewritten to each name, on texts in many scripts with emoji,
//! digit runs, code and whitespace runs. For names that have no `ggml-vocab` file of their
//! own (kimi-k2, deepseek-v3, gpt-4o, glm4, minimax-m2) this is the check.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use nightmail_formats::gguf_write::write_gguf;
use nightmail_formats::tokenizer::pre::PreTokenizer;
use nightmail_formats::{GgufFile, TextTokenizer};

const TEXTS: &[&str] = &[
    "Hello world",
    "",
    " ",
    "   leading spaces and trailing   ",
    "\n\n\nnewlines\r\n\r\nand\ttabs\t\t\n \n",
    "HelloWorld camelCase snake_case SCREAMING_CASE McDonald's",
    "I'm sure they'll say it's what we've done, DON'T YOU'RE",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 2026-12-06 0x1F",
    "我们明天见。谢谢你的邮件！今天天气很好，我想在apple工作1314151天～",
    "メールをありがとうございます。カタカナとひらがなと漢字。",
    "감사합니다. 한국어 텍스트입니다 123개",
    "مرحبا بالعالم، هذا نص عربي ١٢٣٤٥",
    "Привет, мир! Ελληνικά κείμενα. Ünïcödé àccents: émigré café naïve",
    "e\u{301} combining a\u{308}\u{304} marks; नमस्ते दुनिया; ภาษาไทย; កាន់តែពិសេស",
    "😀 emoji 🎉👍🏽 🦙.cpp 😶\u{200d}🌫\u{fe0f} ✅ 👨‍👩‍👧‍👦 🇫🇷",
    "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    "def f(a, b):\n\treturn a**2 + b // 3  # comment\n\n\n",
    "<html><body class=\"x\">&nbsp;&amp;</body></html> ------======= ...!!! ???",
    "\u{3000}ideographic\u{3000}space\u{a0}nbsp\u{2009}thin\u{85}nel",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "tab\u{b}vt\u{c}ff\u{0}nul\u{7f}del",
    "ﬁ ligature, ＡＢＣ fullwidth, ½ ⅓ ² ³ roman Ⅻ",
];

/// Pieces strung at random into more texts: the seams between scripts and classes are where
/// pre-tokenizers differ.
const PIECES: &[&str] = &[
    "the",
    " The",
    "ABC",
    "aBc",
    "'s",
    "'LL",
    " ",
    "  ",
    "\n",
    "\r\n",
    "\t",
    "1",
    "23",
    "4567",
    "我",
    "们",
    "メ",
    "ー",
    "한",
    "ع",
    "ب",
    "😀",
    "👍🏽",
    "!",
    "...",
    "-",
    "(",
    ")",
    "_",
    "é",
    "\u{301}",
    "Ж",
    "\u{3000}",
    "<|im_end|>",
    "¥",
    "µ",
    "ǅ",
];

fn random_texts(n: usize) -> Vec<String> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n).map(|_| (0..next() % 16).map(|_| PIECES[(next() % PIECES.len() as u64) as usize]).collect()).collect()
}

fn texts() -> Vec<String> {
    TEXTS.iter().map(|t| t.to_string()).chain(random_texts(200)).collect()
}

fn llama_cpp_models() -> PathBuf {
    let dir = std::env::var_os("NIGHTMAIL_LLAMA_CPP_SRC").unwrap_or_else(|| {
        panic!(
            "NIGHTMAIL_LLAMA_CPP_SRC is not set: run `export NIGHTMAIL_LLAMA_CPP_SRC=$(scripts/fetch-llama-cpp-src.sh)` (scripts/test.sh does)"
        )
    });
    PathBuf::from(dir).join("models")
}

/// llama.cpp's `vocab` vocabulary with `tokenizer.ggml.pre` set to `pre`, written to `dir`.
fn vocabulary_named(dir: &Path, vocab: &str, pre: &str) -> PathBuf {
    let base = GgufFile::open(&llama_cpp_models().join(format!("ggml-vocab-{vocab}.gguf"))).unwrap();
    let mut metadata: Vec<(String, Value)> = base
        .metadata()
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "tokenizer.ggml.pre" | "general.alignment"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push(("tokenizer.ggml.pre".into(), Value::String(pre.into())));
    let path = dir.join(format!("{vocab}-as-{pre}.gguf"));
    write_gguf(&path, &metadata, &[], 32, |_, _| Ok(())).unwrap();
    path
}

/// tests/fixtures/llama_cpp_tokens.py: llama_tokenize of each text, with and without BOS/EOS
/// added, special tokens parsed.
fn llama_cpp(model: &Path, texts: &[String]) -> Vec<(Vec<u32>, Vec<u32>)> {
    let request = serde_json::json!({ "model": model, "texts": texts, "ids": [] });
    let v = common::python_json("llama_cpp_tokens.py", &request, "llama-cpp-python[server]==0.3.36");
    let list = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    v["encoded"].as_array().unwrap().iter().map(|e| (list(&e["special"]), list(&e["plain"]))).collect()
}

fn tokenizes_as_llama_cpp(pre: &str) {
    for vocab in ["qwen2", "llama-bpe"] {
        vocabulary_tokenizes_as_llama_cpp(vocab, pre);
    }
}

fn vocabulary_tokenizes_as_llama_cpp(vocab: &str, pre: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = vocabulary_named(dir.path(), vocab, pre);
    let tk = TextTokenizer::from_gguf_file(&path).unwrap().expect("a vocabulary");
    assert_eq!(tk.pre_tokenizer(), Some(PreTokenizer::from_name(pre).unwrap()));
    let texts = texts();
    let reference = llama_cpp(&path, &texts);
    assert_eq!(reference.len(), texts.len());
    let mut failed = Vec::new();
    for (text, (special, plain)) in texts.iter().zip(&reference) {
        let (got_special, got_plain) = (tk.encode(text, true).unwrap(), tk.encode(text, false).unwrap());
        if (&got_special, &got_plain) != (special, plain) {
            failed.push(format!(
                "{text:?}: llama.cpp {special:?} / {plain:?}, nightmail {got_special:?} / {got_plain:?}"
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{vocab} as {pre}: {} of {} texts differ:\n{}",
        failed.len(),
        texts.len(),
        failed.join("\n")
    );
}

macro_rules! pre_tests {
    ($($test:ident: $pre:literal,)*) => {
        $(
            #[test]
            fn $test() {
                tokenizes_as_llama_cpp($pre);
            }
        )*
    };
}

pre_tests! {
    kimi_k2_tokenizes_as_llama_cpp: "kimi-k2",
    deepseek_v3_tokenizes_as_llama_cpp: "deepseek-v3",
    deepseek_llm_tokenizes_as_llama_cpp: "deepseek-llm",
    deepseek_coder_tokenizes_as_llama_cpp: "deepseek-coder",
    gpt_4o_tokenizes_as_llama_cpp: "gpt-4o",
    glm4_tokenizes_as_llama_cpp: "glm4",
    minimax_m2_tokenizes_as_llama_cpp: "minimax-m2",
    qwen2_tokenizes_as_llama_cpp: "qwen2",
    qwen35_tokenizes_as_llama_cpp: "qwen35",
    llama_bpe_tokenizes_as_llama_cpp: "llama-bpe",
    smollm_tokenizes_as_llama_cpp: "smollm",
    gpt_2_tokenizes_as_llama_cpp: "gpt-2",
    falcon_tokenizes_as_llama_cpp: "falcon",
    default_tokenizes_as_llama_cpp: "default",
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_when_the_vocabulary_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = vocabulary_named(dir.path(), "qwen2", "no-such-pre");
    let e = TextTokenizer::from_gguf_file(&path).err().expect("refused").to_string();
    assert!(e.contains("`no-such-pre`") && e.contains("kimi-k2") && e.contains("llama-bpe"), "{e}");
}
