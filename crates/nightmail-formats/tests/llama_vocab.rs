//! llama.cpp's own tokenizer tests, run on nightmail's tokenizer: `models/ggml-vocab-*.gguf`
//! (vocabulary-only files) with their `.inp` texts and the ids llama.cpp gives them in `.out`
//! (`tests/test-tokenizer-0.cpp`: no BOS/EOS added, control tokens in the text read as text).
//! The files are in the llama-cpp-python sdist; scripts/fetch-llama-cpp-src.sh unpacks them and
//! scripts/test.sh points `NIGHTMAIL_LLAMA_CPP_SRC` at them.

use std::path::PathBuf;

use nightmail_formats::TextTokenizer;

fn llama_cpp_models() -> PathBuf {
    let dir = std::env::var_os("NIGHTMAIL_LLAMA_CPP_SRC").unwrap_or_else(|| {
        panic!(
            "NIGHTMAIL_LLAMA_CPP_SRC is not set: run `export NIGHTMAIL_LLAMA_CPP_SRC=$(scripts/fetch-llama-cpp-src.sh)` (scripts/test.sh does)"
        )
    });
    PathBuf::from(dir).join("models")
}

/// Each `.inp` case with its `.out` ids, as test-tokenizer-0.cpp reads them.
fn cases(vocab: &str) -> Vec<(String, Vec<u32>)> {
    let base = llama_cpp_models().join(format!("ggml-vocab-{vocab}.gguf"));
    let read = |ext: &str| {
        let path = base.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    // Cases end with the separator; the last one may not.
    let raw = read("inp");
    let mut inputs: Vec<String> = raw.split("\n__ggml_vocab_test__\n").map(str::to_string).collect();
    if raw.ends_with("\n__ggml_vocab_test__\n") {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> =
        read("out").lines().map(|l| l.split_whitespace().map(|id| id.parse().expect("an id")).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{vocab}: .inp and .out hold different numbers of cases");
    inputs.into_iter().zip(outputs).collect()
}

fn passes_llama_cpp_cases(vocab: &str) {
    let path = llama_cpp_models().join(format!("ggml-vocab-{vocab}.gguf"));
    let tk = TextTokenizer::from_gguf_file(&path).unwrap().expect("a vocabulary");
    let cases = cases(vocab);
    assert!(cases.len() > 10, "{vocab}: only {} cases", cases.len());
    let failed: Vec<String> = cases
        .iter()
        .filter_map(|(text, ids)| {
            let got = tk.encode_with(text, false, false).unwrap();
            (&got != ids).then(|| format!("{text:?}: llama.cpp {ids:?}, nightmail {got:?}"))
        })
        .collect();
    assert!(failed.is_empty(), "{vocab}: {} of {} cases differ:\n{}", failed.len(), cases.len(), failed.join("\n"));
}

macro_rules! vocab_tests {
    ($($test:ident: $vocab:literal,)*) => {
        $(
            #[test]
            fn $test() {
                passes_llama_cpp_cases($vocab);
            }
        )*
    };
}

vocab_tests! {
    gpt_2_passes_llama_cpp_cases: "gpt-2",
    mpt_gpt2_split_passes_llama_cpp_cases: "mpt",
    llama_bpe_passes_llama_cpp_cases: "llama-bpe",
    qwen2_passes_llama_cpp_cases: "qwen2",
    qwen35_passes_llama_cpp_cases: "qwen35",
    deepseek_llm_passes_llama_cpp_cases: "deepseek-llm",
    deepseek_coder_passes_llama_cpp_cases: "deepseek-coder",
    starcoder_digit_split_passes_llama_cpp_cases: "starcoder",
    refact_digit_split_passes_llama_cpp_cases: "refact",
    command_r_digit_split_passes_llama_cpp_cases: "command-r",
    falcon_passes_llama_cpp_cases: "falcon",
    llama_spm_passes_llama_cpp_cases: "llama-spm",
}
