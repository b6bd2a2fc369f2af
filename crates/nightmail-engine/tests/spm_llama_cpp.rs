//! GGUF SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`) give the same token ids and
//! the same decoded text here as in llama.cpp, checked live against llama-cpp-python (the
//! llama.cpp that scripts/test.sh installs for the end-to-end tests) on the same files:
//! tests/fixtures/spm/, a SentencePiece BPE vocabulary with byte fallback trained by its
//! generate.py, in a tiny llama (llama.cpp's SPM defaults) and in a vocabulary-only file with
//! add_space_prefix and add_bos off and add_eos on.

mod common;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use nightmail_engine::{GenerateRequest, Model, Prompt, TextTokenizer};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/spm").join(name)
}

/// Texts for both tokenizers (and 300 strung at random from [`PIECES`]): spaces where add_space_prefix matters, newlines and tabs (byte
/// tokens in this vocabulary), characters only byte fallback spells, CJK, and special tokens
/// (control, unknown, user-defined, one llama.cpp makes control by name, unused ones that are
/// not matched) next to text and to each other.
const TEXTS: &[&str] = &[
    "Hello world",
    "hello",
    "",
    " ",
    "  ",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple   spaces  inside  ",
    "\n",
    "line one\nline two\n\n",
    "\t tab\tand\r\nCRLF",
    "Numbers 2024 and 3.14159, 1e-5",
    "The json module encodes Python objects; see the documentation of email.parser.",
    "émigré café naïve façade",
    "Liebe Grüße aus München",
    "Мы получили ваше письмо.",
    "我们明天见。谢谢你的邮件。",
    "メールをありがとうございます",
    "감사합니다",
    "😀 emoji 🎉👍🏽 and ǅ plus e\u{301}",
    "a\u{0}b\u{7f}c",
    "\u{2581}already marked",
    "<s>Hello</s>",
    "<s> Hello </s>",
    "[INST] What is 2+2? [/INST]",
    "[INST][/INST]</s>[INST]",
    "Answer.<|im_end|>\n",
    "a<tool>b <tool> c",
    "<unk> and <unk>",
    "<s><s>",
    "text with <s inside and s> too",
    "[PAD5] is unused",
    "<0x41> looks like a byte",
    "mixed: [INST] 我们 <tool>😀</s>  ",
];

/// Pieces that random texts are strung from: words the vocabulary knows, runs of spaces and
/// newlines, characters it spells in bytes, and its special tokens, whole and broken.
const PIECES: &[&str] = &[
    "the",
    " module",
    "ing",
    "Python",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "e",
    "é",
    "ß",
    "我们",
    "见",
    "😀",
    "👍🏽",
    "<s>",
    "</s>",
    "<unk>",
    "[INST]",
    "[/INST]",
    "<|im_end|>",
    "<tool>",
    "<",
    "s>",
    "[INST",
    "\u{2581}",
    "2024",
    ".",
    ",",
    "'s",
    "\u{0}",
    "Ж",
];

/// `n` texts strung from [`PIECES`] by a fixed xorshift, up to 12 pieces each.
fn random_texts(n: usize) -> Vec<String> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n).map(|_| (0..next() % 13).map(|_| PIECES[(next() % PIECES.len() as u64) as usize]).collect()).collect()
}

fn texts() -> Vec<String> {
    TEXTS.iter().map(|t| t.to_string()).chain(random_texts(300)).collect()
}

struct LlamaCpp {
    encoded: Vec<(Vec<u32>, Vec<u32>)>,
    decoded: Vec<Vec<u8>>,
}

/// tests/fixtures/llama_cpp_tokens.py on `model`: llama_tokenize with and without special
/// tokens added for each text, and llama_detokenize of each id list.
fn llama_cpp(model: &Path, ids: &[Vec<u32>]) -> LlamaCpp {
    let request = serde_json::json!({ "model": model, "texts": texts(), "ids": ids });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_cpp_tokens.py");
    let v = common::python_json(&script, &request, "llama.cpp's tokenizer");
    let list = |v: &serde_json::Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    let encoded = v["encoded"].as_array().unwrap().iter().map(|e| (list(&e["special"]), list(&e["plain"]))).collect();
    let decoded = v["decoded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let h = h.as_str().unwrap();
            (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
        })
        .collect();
    LlamaCpp { encoded, decoded }
}

/// Id lists to decode: each text's (with BOS/EOS where the vocabulary adds them), and lists made
/// to reach decoding's edges: BOS first or not, a lone EOS, control, unknown, unused and
/// user-defined tokens, a byte token for a space first, a character cut after its first byte.
fn id_lists(tk: &TextTokenizer) -> Vec<Vec<u32>> {
    let id = |t: &str| tk.token_id(t).unwrap_or_else(|| panic!("{t} is in the vocabulary"));
    let plain = |t: &str| tk.encode(t, false).unwrap();
    let mut lists: Vec<Vec<u32>> = texts().iter().map(|t| tk.encode(t, true).unwrap()).collect();
    let hello = plain("Hello world");
    let emoji = plain("😀");
    lists.extend([
        [vec![id("<s>")], hello.clone()].concat(),
        [vec![id("<s>"), id("<s>")], hello.clone()].concat(),
        [hello.clone(), vec![id("</s>")]].concat(),
        vec![id("</s>")],
        [vec![id("[INST]")], hello.clone(), vec![id("[/INST]")]].concat(),
        vec![id("<unk>"), id("<tool>"), id("<|im_end|>"), id("[PAD2047]")],
        [vec![id("<tool>")], hello.clone()].concat(),
        [vec![id("<0x20>")], hello.clone()].concat(),
        vec![id("<0x20>"), id("<0x20>")],
        emoji[..emoji.len() - 3].to_vec(),
        emoji.clone(),
        (0..tk.vocab_size() as u32).collect(),
        vec![],
    ]);
    lists
}

fn matches_llama_cpp(file: &str) {
    let model = fixture(file);
    let tk = TextTokenizer::from_gguf_file(&model).unwrap().expect("the fixture has a vocabulary");
    let ids = id_lists(&tk);
    let reference = llama_cpp(&model, &ids);
    assert_eq!((reference.encoded.len(), reference.decoded.len()), (texts().len(), ids.len()));
    for (text, (special, plain)) in texts().iter().zip(&reference.encoded) {
        assert_eq!(&tk.encode(text, true).unwrap(), special, "{file}: {text:?} with special tokens added");
        assert_eq!(&tk.encode(text, false).unwrap(), plain, "{file}: {text:?}");
    }
    for (ids, bytes) in ids.iter().zip(&reference.decoded) {
        assert_eq!(tk.decode(ids).unwrap(), String::from_utf8_lossy(bytes), "{file}: decoding {ids:?}");
    }
}

#[test]
fn a_sentencepiece_gguf_tokenizes_and_decodes_as_llama_cpp_does() {
    matches_llama_cpp("model.gguf");
}

#[test]
fn without_space_prefix_or_bos_and_with_eos_it_still_matches_llama_cpp() {
    matches_llama_cpp("no-prefix.gguf");
}

#[test]
fn a_llama_with_a_sentencepiece_vocabulary_loads_and_generates_text() {
    let model = Model::load(fixture("model.gguf")).unwrap();
    let tk = model.tokenizer().expect("the GGUF's SentencePiece vocabulary is read");
    assert_eq!((tk.bos_text(), tk.eos_text()), (Some("<s>"), Some("</s>")));
    let mut request = GenerateRequest::new(Prompt::Text("Hello world".into()));
    request.max_new_tokens = 8;
    request.stop_at_eos = false;
    let completion = model.generate(request, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(completion.prompt_tokens[0], tk.token_id("<s>").unwrap(), "BOS added, as add_bos says");
    assert_eq!(completion.tokens.len(), 8);
    assert_eq!(completion.text, tk.decode(&completion.tokens).unwrap());
}
