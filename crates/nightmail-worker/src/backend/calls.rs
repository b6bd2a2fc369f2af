//! A local model's tool calls: read from the text it wrote, in the syntax its chat template
//! renders calls in (nightmail-formats' `ToolSyntax`). A template that renders no calls (SmolLM2's)
//! gets the tools described in the system turn in the Hermes form, which is then what is read.

use nightmail_engine::{ChatMessage, ChatTemplate, ToolArguments, ToolSyntax};

use super::CallRequest;

/// How a model's calls are written, and whether its template tells it of its tools itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSyntax {
    pub syntax: ToolSyntax,
    /// The template renders `tools` itself; otherwise the system turn describes them.
    pub native: bool,
}

impl CallSyntax {
    pub fn of(template: Option<&ChatTemplate>) -> CallSyntax {
        match template.and_then(ToolSyntax::of_template) {
            Some(syntax) => CallSyntax { syntax, native: true },
            None => CallSyntax { syntax: ToolSyntax::Hermes, native: false },
        }
    }

    /// For a template that renders no tools: the tools (`tools`, OpenAI's JSON array) and the
    /// Hermes call form told in the system turn, as Qwen's and Hermes' templates tell them.
    pub fn describe(&self, messages: &mut Vec<ChatMessage>, tools: &str) {
        if self.native {
            return;
        }
        let text = format!(
            "# Tools\n\nYou may call one or more functions. The functions:\n<tools>\n{tools}\n</tools>\n\n\
             To call a function, write a JSON object with its name and arguments between tags:\n\
             <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
        );
        match messages.first_mut() {
            Some(first) if first.role == "system" => {
                first.content.push_str("\n\n");
                first.content.push_str(&text);
            }
            _ => messages.insert(0, ChatMessage::new("system", text)),
        }
    }

    /// The answer text without its calls, and the calls, each read or told why not.
    pub fn read(&self, text: &str) -> (String, Vec<CallRequest>) {
        let parsed = self.syntax.parse(text);
        let calls = parsed
            .calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| match call {
                Ok(call) => CallRequest {
                    id: call.id.unwrap_or_else(|| format!("call_{i}")),
                    name: call.function.name,
                    arguments: match call.function.arguments {
                        ToolArguments::Object(text) | ToolArguments::Text(text) => text,
                    },
                    malformed: None,
                },
                Err(bad) => CallRequest {
                    id: format!("call_{i}"),
                    name: bad.name.clone().unwrap_or_default(),
                    arguments: bad.raw.clone(),
                    malformed: Some(bad.to_string()),
                },
            })
            .collect();
        (parsed.content, calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_without_tools_is_told_them_and_read_in_the_hermes_form() {
        let plain = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
        );
        let syntax = CallSyntax::of(Some(&plain));
        assert_eq!(syntax, CallSyntax { syntax: ToolSyntax::Hermes, native: false });
        let mut messages = vec![ChatMessage::new("user", "Rates?")];
        syntax.describe(&mut messages, r#"[{"type":"function","function":{"name":"fetch"}}]"#);
        assert_eq!(messages[0].role, "system");
        assert!(messages[0].content.contains("<tool_call>") && messages[0].content.contains("\"fetch\""));
        let (content, calls) = syntax.read(
            "Let me look.\n<tool_call>\n{\"name\": \"fetch\", \"arguments\": {\"url\": \"https://b.example/\"}}\n</tool_call>",
        );
        assert_eq!(content, "Let me look.");
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].name.as_str(), calls[0].malformed.as_ref()), ("fetch", None));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&calls[0].arguments).unwrap()["url"],
            "https://b.example/"
        );
        let (_, bad) = syntax.read("<tool_call>\n{\"name\": \"fetch\", \"arguments\": {\"url\": }\n</tool_call>");
        assert!(bad[0].malformed.as_ref().is_some_and(|why| why.contains("fetch")), "{bad:?}");
    }
}
