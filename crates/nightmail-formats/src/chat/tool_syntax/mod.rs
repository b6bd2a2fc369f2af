//! Tool calls as each model family writes them, read back from the generated text: the syntax is
//! recognised from the chat template (whose rendering of `tool_calls` is the source of truth; the
//! templates are llama.cpp's copies in `models/templates/`), and `parse` splits a generated turn
//! into its prose and its calls, a call that cannot be read kept as a `MalformedCall` whose message
//! the model can read and correct. One file per syntax; `scan.rs` holds the shared readers.

mod deepseek;
mod dsml;
mod glm;
mod harmony;
mod hermes;
mod kimi_k2;
mod kimi_k3;
mod minimax;
mod qwen_xml;
mod scan;

use super::{ChatTemplate, ToolCall};

/// One family's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolSyntax {
    /// Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
    /// <|tool_call_argument_begin|>{JSON}<|tool_call_end|>...<|tool_calls_section_end|>`.
    KimiK2,
    /// Kimi K3's tagged form: `<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
    /// <|open|>argument key="K" type="string"<|sep|>V<|close|>argument<|sep|>...`.
    KimiK3,
    /// DeepSeek-V3 and R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{JSON}\n```
    /// <｜tool▁call▁end｜>` inside `<｜tool▁calls▁begin｜>..<｜tool▁calls▁end｜>`.
    DeepSeekV3,
    /// DeepSeek-V3.1: as V3 without the type and the fence: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}`.
    DeepSeekV31,
    /// DeepSeek-V3.2's DSML: `<｜DSML｜function_calls>` around `<｜DSML｜invoke name="NAME">` with
    /// `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`.
    DeepSeekV32,
    /// DeepSeek-V4: V3.2's DSML with the block named `tool_calls`.
    DeepSeekV4,
    /// Hermes / Qwen3 / Qwen2.5: `<tool_call>\n{"name": NAME, "arguments": {JSON}}\n</tool_call>`.
    Hermes,
    /// Qwen3-Coder and Qwen3.5: `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n
    /// </function>\n</tool_call>`.
    QwenXml,
    /// GLM-4.5 to 4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`
    /// (4.5 and 4.6 put newlines between the parts, 4.7 none).
    Glm,
    /// MiniMax-M2: `<minimax:tool_call>\n<invoke name="NAME"><parameter name="K">V</parameter>
    /// </invoke>\n</minimax:tool_call>`.
    MiniMaxM2,
    /// gpt-oss's harmony: a message to `functions.NAME` on the commentary channel, its body the JSON
    /// arguments, ended by `<|call|>`.
    Harmony,
}

/// A generated turn taken apart.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedTurn {
    /// The text outside the calls, the family's turn framing (end-of-turn tokens, K3's response
    /// tags, harmony's headers) removed, trimmed.
    pub content: String,
    /// Each call in the order written; one that could not be read is an error the model can read.
    pub calls: Vec<Result<ToolCall, MalformedCall>>,
}

/// A call the model wrote that could not be read, with what to tell it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the call{} could not be read: {reason}; write it as: {expected}", .name.as_ref().map(|n| format!(" to {n}")).unwrap_or_default())]
pub struct MalformedCall {
    /// The function's name, where it could be read.
    pub name: Option<String>,
    /// The call's text as generated.
    pub raw: String,
    /// What was wrong, e.g. `arguments are not JSON: expected value at line 1 column 9`.
    pub reason: String,
    /// The family's form of a call, for the model to copy.
    pub expected: String,
}

impl ToolSyntax {
    /// The syntax a template renders tool calls in, from markers its `tool_calls` rendering writes
    /// (llama.cpp's common/chat.cpp picks its specialised parsers by markers too). None where the
    /// template renders no calls (SmolLM2's, Llama 2's): the worker then asks for `ToolSyntax::Hermes`,
    /// the form most open models were tuned on and the one Qwen's templates describe. (llama.cpp does
    /// not fall back to Hermes: its old generic format was a JSON object answer, and the current
    /// common/chat.cpp derives a parser from the template or refuses.)
    pub fn of_template(template: &ChatTemplate) -> Option<ToolSyntax> {
        let src = template.source();
        let has = |marker: &str| src.contains(marker);
        // Templates whose instructions name `<tool_call>` but whose calls are a form not read here:
        // MiniMax-M3's namespaced tags (common/chat.cpp detects them apart) and Apriel 1.5's
        // `<tool_calls>[...]` list (unsloth-Apriel-1.5.jinja).
        if has("]<]minimax[>[") || has("<tool_calls>[") {
            return None;
        }
        // Harmony headers: only gpt-oss writes `<|channel|>` and ends a call with `<|call|>`.
        if has("<|channel|>") && has("<|call|>") {
            return Some(ToolSyntax::Harmony);
        }
        // K3's `open_tag('call', ...)` macro writes `<|open|>call ...<|sep|>` (Kimi-K3.jinja).
        if has("<|open|>") && has("open_tag('call'") {
            return Some(ToolSyntax::KimiK3);
        }
        if has("<|tool_calls_section_begin|>") {
            return Some(ToolSyntax::KimiK2);
        }
        // V3.2 and V4 build their tags from `dsml_token`; V3.2 names the block `function_calls`,
        // V4 `tool_calls` (as common/chat.cpp's DeepSeek V3.2/V4 detection says).
        if has("dsml_token") && has("DSML") {
            return Some(if has("function_calls>") { ToolSyntax::DeepSeekV32 } else { ToolSyntax::DeepSeekV4 });
        }
        // V3 and R1 write the call's type and a ```json fence; V3.1 neither.
        if has("<｜tool▁call▁begin｜>") {
            return Some(if has("```json") { ToolSyntax::DeepSeekV3 } else { ToolSyntax::DeepSeekV31 });
        }
        if has("<minimax:tool_call>") {
            return Some(ToolSyntax::MiniMaxM2);
        }
        // GLM-4.5..4.7 alone write arguments as `<arg_key>`/`<arg_value>` pairs.
        if has("<arg_key>") && has("<tool_call>") {
            return Some(ToolSyntax::Glm);
        }
        // Qwen3-Coder's and Qwen3.5's `'<function=' + name` and `'<parameter=' + key`.
        if has("<tool_call>") && has("<function=") && has("<parameter=") {
            return Some(ToolSyntax::QwenXml);
        }
        if has("<tool_call>") {
            return Some(ToolSyntax::Hermes);
        }
        None
    }

    /// The literal text that begins a call: a stream holds a call once it holds this. For harmony
    /// it is ` to=functions.`, the part of a call's header common to the template's order
    /// (`<|start|>assistant to=..<|channel|>commentary`) and the model's (`<|channel|>commentary to=..`).
    pub fn call_opener(&self) -> &'static str {
        match self {
            ToolSyntax::KimiK2 => kimi_k2::OPEN,
            ToolSyntax::KimiK3 => kimi_k3::OPEN,
            ToolSyntax::DeepSeekV3 | ToolSyntax::DeepSeekV31 => deepseek::OPEN,
            ToolSyntax::DeepSeekV32 => dsml::V32.open,
            ToolSyntax::DeepSeekV4 => dsml::V4.open,
            ToolSyntax::Hermes | ToolSyntax::QwenXml | ToolSyntax::Glm => hermes::OPEN,
            ToolSyntax::MiniMaxM2 => minimax::OPEN,
            ToolSyntax::Harmony => harmony::OPEN,
        }
    }

    /// Whether the text generated so far has begun a call (the worker stops showing it as prose).
    pub fn holds_call(&self, text_so_far: &str) -> bool {
        text_so_far.contains(self.call_opener())
    }

    /// The turn's prose and calls. Never panics: what cannot be read becomes a `MalformedCall`.
    pub fn parse(&self, generated: &str) -> ParsedTurn {
        match self {
            ToolSyntax::KimiK2 => kimi_k2::parse(generated),
            ToolSyntax::KimiK3 => kimi_k3::parse(generated),
            ToolSyntax::DeepSeekV3 => deepseek::parse(generated, deepseek::Version::V3),
            ToolSyntax::DeepSeekV31 => deepseek::parse(generated, deepseek::Version::V31),
            ToolSyntax::DeepSeekV32 => dsml::parse(generated, &dsml::V32),
            ToolSyntax::DeepSeekV4 => dsml::parse(generated, &dsml::V4),
            ToolSyntax::Hermes => hermes::parse(generated),
            ToolSyntax::QwenXml => qwen_xml::parse(generated),
            ToolSyntax::Glm => glm::parse(generated),
            ToolSyntax::MiniMaxM2 => minimax::parse(generated),
            ToolSyntax::Harmony => harmony::parse(generated),
        }
    }

    /// Every syntax, for tests and fuzzing.
    pub const ALL: [ToolSyntax; 11] = [
        ToolSyntax::KimiK2,
        ToolSyntax::KimiK3,
        ToolSyntax::DeepSeekV3,
        ToolSyntax::DeepSeekV31,
        ToolSyntax::DeepSeekV32,
        ToolSyntax::DeepSeekV4,
        ToolSyntax::Hermes,
        ToolSyntax::QwenXml,
        ToolSyntax::Glm,
        ToolSyntax::MiniMaxM2,
        ToolSyntax::Harmony,
    ];
}

#[cfg(test)]
mod fuzz;
