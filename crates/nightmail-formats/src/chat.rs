//! Chat prompts through the model's own Jinja template (the Hugging Face chat-template convention:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`; Jinja with trim_blocks and
//! lstrip_blocks), rendered by minijinja with Python-compatible string methods.

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{Environment, ErrorKind, context};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

pub struct ChatTemplate {
    source: String,
}

impl ChatTemplate {
    pub fn new(source: impl Into<String>) -> Self {
        ChatTemplate { source: source.into() }
    }

    /// The template's Jinja text.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn from_gguf(g: &GgufFile) -> Option<Self> {
        g.string("tokenizer.chat_template").map(ChatTemplate::new)
    }

    /// `chat_template.jinja` (transformers 5), else `tokenizer_config.json`'s `chat_template` (a
    /// string, or a list of named templates of which we take `default`).
    pub fn from_hf_dir(dir: &Path) -> Option<Self> {
        if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
            return Some(ChatTemplate::new(s));
        }
        let config = crate::hf::read_json_opt(&dir.join("tokenizer_config.json"))?;
        match config.get("chat_template")? {
            Json::String(s) => Some(ChatTemplate::new(s.clone())),
            Json::Array(list) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .map(ChatTemplate::new),
            _ => None,
        }
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| FormatError::ChatTemplate(e.to_string()))?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |format: String| strftime_today(&format));
        env.render_str(
            &self.source,
            context! { messages => Value::from(Serde(messages)), add_generation_prompt => add_generation_prompt, bos_token => bos, eos_token => eos },
        )
        .map_err(|e| FormatError::ChatTemplate(e.to_string()))
    }
}

/// Today's date for templates that print it (Llama 3's `strftime_now("%d %b %Y")`): the date
/// directives only, in UTC.
fn strftime_today(format: &str) -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() / 86400).unwrap_or(0)
            as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    format
        .replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_template_renders_messages_and_generation_prompt() {
        let t = ChatTemplate::new(
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        );
        let out = t.render(&[ChatMessage::new("user", " Hi ")], true, "", "").unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn raise_exception_in_a_template_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}");
        assert!(
            matches!(t.render(&[], true, "", ""), Err(FormatError::ChatTemplate(m)) if m.contains("no system role"))
        );
    }
}
