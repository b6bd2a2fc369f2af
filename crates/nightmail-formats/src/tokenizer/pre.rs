//! The pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`: how a text is cut into words
//! before BPE merges inside each (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`), and the
//! vocabulary settings that come with the name (`llama_vocab::impl::load`).
//!
//! Words are cut as `unicode_regex_split` (`src/unicode.cpp`) cuts them: each regex in turn
//! splits the pieces the previous one left (a match is a piece, and so is the text between
//! matches), and a regex that names Unicode classes runs on a "collapsed" text where every
//! non-ASCII code point stands for its class and non-ASCII whitespace is a vertical tab. The
//! regexes llama.cpp hand-codes (GPT-2, Llama 3, Qwen2, Qwen3.5) run here as the regexes their
//! handlers implement; Kimi K2's handler merges upper and lower case letters into one run and
//! keeps Han apart, and its regex here says so.

use fancy_regex::Regex;

use super::unicode::{Category, category, is_han, is_whitespace};
use crate::error::{FormatError, Result};

/// The llama.cpp pre-tokenizer types nightmail reads; each name llama.cpp maps to one of them is
/// in [`NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// No `tokenizer.ggml.pre`, or `default`: llama.cpp's fallback split.
    Default,
    Gpt2,
    /// SmolLM, StarCoder and their kin: every digit alone, then GPT-2's split.
    StarCoder,
    Llama3,
    /// Llama 3's split without its `ignore_merges` and BOS (DBRX, Smaug).
    Dbrx,
    Qwen2,
    Qwen35,
    DeepseekLlm,
    DeepseekCoder,
    DeepseekV3,
    Falcon,
    /// GLM-4's split (Llama 3's) with merges ignored for whole-word tokens and no BOS.
    Glm4,
    /// gpt-oss, Llama 4, MiniMax-M2: cased words split at case changes (o200k).
    Gpt4o,
    KimiK2,
}

/// `tokenizer.ggml.pre` names and the type llama.cpp gives each (`llama_vocab::impl::load`).
pub const NAMES: &[(&str, PreTokenizer)] = &[
    ("default", PreTokenizer::Default),
    ("gpt-2", PreTokenizer::Gpt2),
    ("phi-2", PreTokenizer::Gpt2),
    ("gigachat", PreTokenizer::Gpt2),
    ("a.x-4.0", PreTokenizer::Gpt2),
    ("mellum", PreTokenizer::Gpt2),
    ("exaone4", PreTokenizer::Gpt2),
    ("mpt", PreTokenizer::Gpt2),
    ("olmo", PreTokenizer::Gpt2),
    ("jais", PreTokenizer::Gpt2),
    ("trillion", PreTokenizer::Gpt2),
    ("granite-docling", PreTokenizer::Gpt2),
    ("smollm", PreTokenizer::StarCoder),
    ("starcoder", PreTokenizer::StarCoder),
    ("refact", PreTokenizer::StarCoder),
    ("command-r", PreTokenizer::StarCoder),
    ("codeshell", PreTokenizer::StarCoder),
    ("exaone", PreTokenizer::StarCoder),
    ("minerva-7b", PreTokenizer::StarCoder),
    ("mellum2", PreTokenizer::StarCoder),
    ("llama3", PreTokenizer::Llama3),
    ("llama-v3", PreTokenizer::Llama3),
    ("llama-bpe", PreTokenizer::Llama3),
    ("falcon3", PreTokenizer::Llama3),
    ("falcon-h1", PreTokenizer::Llama3),
    ("pixtral", PreTokenizer::Llama3),
    ("midm-2.0", PreTokenizer::Llama3),
    ("lfm2", PreTokenizer::Llama3),
    ("dbrx", PreTokenizer::Dbrx),
    ("smaug-bpe", PreTokenizer::Dbrx),
    ("qwen2", PreTokenizer::Qwen2),
    ("deepseek-r1-qwen", PreTokenizer::Qwen2),
    ("megrez", PreTokenizer::Qwen2),
    ("stablelm2", PreTokenizer::Qwen2),
    ("hunyuan", PreTokenizer::Qwen2),
    ("solar-open", PreTokenizer::Qwen2),
    ("qwen35", PreTokenizer::Qwen35),
    ("deepseek-llm", PreTokenizer::DeepseekLlm),
    ("deepseek-coder", PreTokenizer::DeepseekCoder),
    ("deepseek-v3", PreTokenizer::DeepseekV3),
    ("hunyuan-dense", PreTokenizer::DeepseekV3),
    ("joyai-llm", PreTokenizer::DeepseekV3),
    ("hy_v4", PreTokenizer::DeepseekV3),
    ("falcon", PreTokenizer::Falcon),
    ("glm4", PreTokenizer::Glm4),
    ("glm5", PreTokenizer::Glm4),
    ("gpt-4o", PreTokenizer::Gpt4o),
    ("llama4", PreTokenizer::Gpt4o),
    ("kanana2", PreTokenizer::Gpt4o),
    ("talkie", PreTokenizer::Gpt4o),
    ("minimax-m2", PreTokenizer::Gpt4o),
    ("kimi-k2", PreTokenizer::KimiK2),
];

/// The contractions as llama.cpp spells `(?i:'s|'t|'re|'ve|'m|'ll|'d)` for std::regex.
macro_rules! contractions {
    () => {
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    };
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const QWEN2: &str =
    concat!(contractions!(), r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+");
const QWEN35: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// o200k's case-split words, with llama.cpp's lookaheads for std::regex's lack of `\p{Lu}`.
const GPT4O: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
    contractions!(),
    r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// `unicode_regex_split_custom_kimi_k2`: Han runs alone; other letters in one run whatever their
/// case (unlike `tokenization_kimi.py`'s regex, which splits at case changes), then Llama 3's.
const KIMI_K2: &str = concat!(
    r"\p{Han}+|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})\p{L})+",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_V3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

impl PreTokenizer {
    /// The type of a `tokenizer.ggml.pre` name; an unknown name is refused with the list of
    /// known ones, as llama.cpp refuses it, rather than tokenized with a guess.
    pub fn from_name(name: &str) -> Result<Self> {
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, p)| *p).ok_or_else(|| FormatError::Unsupported {
            what: format!("the pre-tokenizer `{name}` (tokenizer.ggml.pre)"),
            hint: format!(
                "nightmail tokenizes as llama.cpp for {}; convert the model with a llama.cpp whose convert_hf_to_gguf.py names one of these, or use its Hugging Face directory",
                NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
        })
    }

    /// llama.cpp's regexes, in the order it applies them.
    fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            PreTokenizer::Gpt2 => &[GPT2],
            PreTokenizer::StarCoder => &[r"\p{N}", GPT2],
            PreTokenizer::Llama3 | PreTokenizer::Dbrx | PreTokenizer::Glm4 => &[LLAMA3],
            PreTokenizer::Qwen2 => &[QWEN2],
            PreTokenizer::Qwen35 => &[QWEN35],
            PreTokenizer::DeepseekLlm => &[
                r"[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                r"\s+$",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+",
            ],
            PreTokenizer::DeepseekCoder => &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
            PreTokenizer::DeepseekV3 => &[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK_V3_WORDS],
            PreTokenizer::Falcon => &[
                r"[\p{P}\$\+<=>\^~\|`]+",
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                r"[0-9][0-9][0-9]",
            ],
            PreTokenizer::Gpt4o => &[GPT4O],
            PreTokenizer::KimiK2 => &[KIMI_K2],
        }
    }

    /// A word that is a token is that token, merges or not (llama.cpp's `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Glm4)
    }

    /// Whether BOS is added when the file does not say (`tokenizer.ggml.add_bos_token`).
    pub fn adds_bos(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// GLM's vocabularies have no BOS token, whatever the file names.
    pub fn has_bos(self) -> bool {
        self != PreTokenizer::Glm4
    }

    pub fn splitter(self) -> Result<Splitter> {
        let steps = self
            .regexes()
            .iter()
            .map(|re| {
                let collapsed = CLASSES.iter().any(|(name, _)| re.contains(name));
                let source = if collapsed { collapse_regex(re) } else { (*re).to_string() };
                Regex::new(&source)
                    .map(|regex| Step { regex, collapsed })
                    .map_err(|e| FormatError::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Splitter { steps })
    }
}

/// Stand-ins for non-ASCII code points in the collapsed text (private-use characters, which no
/// regex names and `\s` does not match).
const OTHER: char = '\u{E000}';
const NUMBER: char = '\u{E001}';
const LETTER: char = '\u{E002}';
const PUNCTUATION: char = '\u{E003}';
const MARK: char = '\u{E004}';
const SYMBOL: char = '\u{E005}';
/// A Han letter: a letter to every class but `\p{Han}`.
const HAN: char = '\u{E006}';

/// Each class a regex may name, and what it becomes inside a character class of the collapsed
/// regex: its stand-in and the ASCII characters of that class (`k_ucat_map`).
const CLASSES: &[(&str, &str)] = &[
    (r"\p{N}", "\u{E001}0-9"),
    (r"\p{L}", "\u{E002}\u{E006}A-Za-z"),
    (r"\p{Lu}", "\u{E002}\u{E006}A-Za-z"),
    (r"\p{Ll}", "\u{E002}\u{E006}A-Za-z"),
    (r"\p{Lt}", "\u{E002}\u{E006}A-Za-z"),
    (r"\p{Lm}", "\u{E002}\u{E006}A-Za-z"),
    (r"\p{Lo}", "\u{E002}\u{E006}A-Za-z"),
    (r"\p{P}", "\u{E003}!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    (r"\p{M}", "\u{E004}"),
    (r"\p{S}", "\u{E005}\\$\\+<->\\^`\\|~"),
    (r"\p{Han}", "\u{E006}"),
];

/// The collapsed text's stand-in for `c`.
fn collapse(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    if is_whitespace(c) {
        return '\x0B';
    }
    match category(c) {
        Category::Letter if is_han(c) => HAN,
        Category::Letter => LETTER,
        Category::Number => NUMBER,
        Category::Punctuation => PUNCTUATION,
        Category::Mark => MARK,
        Category::Symbol => SYMBOL,
        Category::Other => OTHER,
    }
}

/// The regex for the collapsed text: each `\p{..}` becomes its stand-ins, bracketed unless it
/// is already inside brackets.
fn collapse_regex(re: &str) -> String {
    let mut out = String::with_capacity(re.len() * 2);
    let mut inside = false;
    let mut rest = re;
    let mut prev = '\0';
    while let Some(c) = rest.chars().next() {
        if let Some((name, members)) = CLASSES.iter().find(|(name, _)| rest.starts_with(name)) {
            if inside {
                out.push_str(members);
            } else {
                out.push('[');
                out.push_str(members);
                out.push(']');
            }
            rest = &rest[name.len()..];
            prev = '}';
            continue;
        }
        match c {
            '[' if prev != '\\' => inside = true,
            ']' if inside && prev != '\\' => inside = false,
            _ => {}
        }
        out.push(c);
        // An escaped backslash escapes nothing after it.
        prev = if c == '\\' && prev == '\\' { '\0' } else { c };
        rest = &rest[c.len_utf8()..];
    }
    out
}

struct Step {
    regex: Regex,
    /// Runs on the collapsed text; else on the text with non-ASCII whitespace as a vertical tab,
    /// as llama.cpp's std::wregex sees it.
    collapsed: bool,
}

/// A pre-tokenizer's compiled regexes.
pub struct Splitter {
    steps: Vec<Step>,
}

impl Splitter {
    /// The words of `text`, in order; together they are the whole text.
    pub fn split<'t>(&self, text: &'t str) -> Result<Vec<&'t str>> {
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let collapsed: Vec<char> = chars.iter().map(|&(_, c)| collapse(c)).collect();
        let wide: Vec<char> =
            chars.iter().map(|&(_, c)| if !c.is_ascii() && is_whitespace(c) { '\x0B' } else { c }).collect();
        // Pieces as lengths in code points.
        let mut pieces = vec![chars.len()];
        for step in &self.steps {
            let source = if step.collapsed { &collapsed } else { &wide };
            let mut next = Vec::with_capacity(pieces.len());
            let mut start = 0;
            for &len in &pieces {
                let chunk: String = source[start..start + len].iter().collect();
                let mut at = 0; // code points of the chunk consumed
                let mut at_byte = 0;
                for m in step.regex.find_iter(&chunk) {
                    let m = m.map_err(|e| FormatError::Tokenizer(format!("pre-tokenizer: {e}")))?;
                    if m.start() == m.end() {
                        continue;
                    }
                    let begin = at + chunk[at_byte..m.start()].chars().count();
                    let end = begin + m.as_str().chars().count();
                    if begin > at {
                        next.push(begin - at);
                    }
                    next.push(end - begin);
                    at = end;
                    at_byte = m.end();
                }
                if at < len {
                    next.push(len - at);
                }
                start += len;
            }
            pieces = next;
        }
        let byte_at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
        let mut words = Vec::with_capacity(pieces.len());
        let mut start = 0;
        for len in pieces {
            words.push(&text[byte_at(start)..byte_at(start + len)]);
            start += len;
        }
        Ok(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<String> {
        pre.splitter().unwrap().split(text).unwrap().into_iter().map(str::to_string).collect()
    }

    #[test]
    fn every_name_compiles() {
        for (name, pre) in NAMES {
            pre.splitter().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let e = PreTokenizer::from_name("tekken").unwrap_err().to_string();
        assert!(e.contains("`tekken`") && e.contains("kimi-k2") && e.contains("qwen35"), "{e}");
    }

    #[test]
    fn llama3_splits_digits_in_threes_and_keeps_a_leading_space() {
        assert_eq!(words(PreTokenizer::Llama3, "Hello world 12345"), ["Hello", " world", " ", "123", "45"]);
    }

    #[test]
    fn kimi_keeps_han_apart_and_cased_words_together() {
        assert_eq!(words(PreTokenizer::KimiK2, "我们HelloWorld好"), ["我们", "HelloWorld", "好"]);
    }

    #[test]
    fn gpt4o_splits_at_a_case_change() {
        assert_eq!(words(PreTokenizer::Gpt4o, "HelloWorld"), ["Hello", "World"]);
    }

    #[test]
    fn collapsing_brackets_a_class_outside_brackets_only() {
        assert_eq!(collapse_regex(r"\p{M}+[^\s\p{M}]"), "[\u{E004}]+[^\\s\u{E004}]");
    }
}
