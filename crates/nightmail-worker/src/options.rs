//! Options a user sets from their mail client: lines at the very top of the body, each `@name
//! value`, e.g. `@reasoning off`, `@max-tokens 4000`. They are removed from the prompt.
//! Documented in docs/MAIL.md.

/// Per-message settings; `None` keeps the model's default from the configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MailOptions {
    pub reasoning: Option<bool>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    /// Asks an OpenAI-compatible backend for another of its models.
    pub model: Option<String>,
    /// Option lines that were not understood, to be mentioned in the reply.
    pub unknown: Vec<String>,
}

/// The biggest answer a mail may ask for.
pub const MAX_TOKENS_LIMIT: u32 = 65_536;

/// Splits the leading option lines off `body`.
pub fn parse(body: &str) -> (MailOptions, String) {
    let mut options = MailOptions::default();
    let mut rest_start = 0;
    for line in body.split_inclusive('\n') {
        let bare = line.trim();
        if bare.is_empty() && rest_start == 0 {
            rest_start += line.len();
            continue;
        }
        let Some(option) = bare.strip_prefix('@') else { break };
        let (name, value) = option.split_once(char::is_whitespace).unwrap_or((option, ""));
        let value = value.trim();
        let name = name.to_ascii_lowercase().replace('_', "-");
        let on_off = match value.to_ascii_lowercase().as_str() {
            "" | "on" | "yes" | "true" => Some(true),
            "off" | "no" | "false" => Some(false),
            _ => None,
        };
        let understood = match name.as_str() {
            "reasoning" | "think" | "thinking" => on_off.map(|on| options.reasoning = Some(on)).is_some(),
            "no-reasoning" | "no-think" => {
                options.reasoning = Some(false);
                true
            }
            "max-tokens" | "max" | "length" => match value.parse::<u32>() {
                Ok(n) if n > 0 => {
                    options.max_tokens = Some(n.min(MAX_TOKENS_LIMIT));
                    true
                }
                _ => false,
            },
            "temperature" => match value.parse::<f32>() {
                Ok(t) if (0.0..=2.0).contains(&t) => {
                    options.temperature = Some(t);
                    true
                }
                _ => false,
            },
            "model" if !value.is_empty() => {
                options.model = Some(value.to_string());
                true
            }
            _ => false,
        };
        if !understood {
            options.unknown.push(bare.to_string());
        }
        rest_start += line.len();
    }
    (options, body[rest_start..].trim_start().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_option_lines_are_read_and_removed() {
        let (o, rest) =
            parse("\n@reasoning off\n@max-tokens 200\n@temperature 0\n@model qwen3\nWhat is 2+2?\n@not an option here");
        assert_eq!(o.reasoning, Some(false));
        assert_eq!(o.max_tokens, Some(200));
        assert_eq!(o.temperature, Some(0.0));
        assert_eq!(o.model.as_deref(), Some("qwen3"));
        assert!(o.unknown.is_empty());
        assert_eq!(rest, "What is 2+2?\n@not an option here");
    }

    #[test]
    fn bad_options_are_reported_not_applied() {
        let (o, rest) = parse("@max-tokens lots\n@colour blue\n@think\nHi");
        assert_eq!(o.max_tokens, None);
        assert_eq!(o.reasoning, Some(true));
        assert_eq!(o.unknown, vec!["@max-tokens lots", "@colour blue"]);
        assert_eq!(rest, "Hi");
        assert_eq!(parse("@max 999999999\nx").0.max_tokens, Some(MAX_TOKENS_LIMIT));
    }
}
