//! Chat prompts through the model's own Jinja template (the Hugging Face chat-template convention:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`; Jinja with trim_blocks and
//! lstrip_blocks), rendered by minijinja with Python-compatible string methods, set up to give the
//! text transformers' `apply_chat_template` gives (tests/chat_templates.rs checks each family's).

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

mod tool_syntax;

pub use tool_syntax::{MalformedCall, ParsedTurn, ToolSyntax};

/// One turn, in the OpenAI / transformers message shape that chat templates read: an assistant
/// turn may carry its reasoning and tool calls, a `tool` turn answers a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The called function's name, on a `tool` turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning_content = Some(reasoning.into());
        self
    }

    pub fn with_tool_call(mut self, call: ToolCall) -> Self {
        self.tool_calls.push(call);
        self
    }

    /// A `tool` turn: what the call `id` to function `name` returned.
    pub fn tool_result(id: impl Into<String>, name: impl Into<String>, content: impl Into<String>) -> Self {
        let mut m = ChatMessage::new("tool", content);
        m.tool_call_id = Some(id.into());
        m.name = Some(name.into());
        m
    }
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: ToolArguments,
}

/// A call's arguments as the caller has them, which templates tell apart (`arguments is string`):
/// an object (transformers' usual form), or the JSON text of one (the OpenAI API's form).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToolArguments {
    /// JSON text of an object, given to the template as that object, its keys in their order.
    Object(String),
    /// Given to the template as this string.
    Text(String),
}

impl ToolCall {
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: ToolArguments) -> Self {
        ToolCall {
            id: Some(id.into()),
            kind: "function".into(),
            function: FunctionCall { name: name.into(), arguments },
        }
    }
}

/// What a template is rendered with besides the messages (transformers' `apply_chat_template`
/// arguments).
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    pub bos_token: String,
    pub eos_token: String,
    /// JSON text of the array of callable functions' schemas (`[{"type": "function", "function":
    /// {..}}]`), read with its keys in their order as Python's `json` would.
    pub tools: Option<String>,
    /// Template switches passed as variables, e.g. `enable_thinking` (Qwen3) or `thinking`.
    pub kwargs: Vec<(String, Json)>,
}

/// The template variables that turn a model's thinking on or off, set together: each family
/// reads one (`enable_thinking`: Qwen3, GLM-4.5..4.7, SmolLM3; `thinking`: DeepSeek V3.1..V4 and
/// Kimi K3). gpt-oss cannot stop thinking; off asks it for its least (`reasoning_effort`,
/// harmony's "low").
pub fn thinking_switches(on: bool) -> Vec<(String, Json)> {
    let mut switches = vec![("enable_thinking".to_string(), Json::Bool(on)), ("thinking".to_string(), Json::Bool(on))];
    if !on {
        switches.push(("reasoning_effort".to_string(), Json::String("low".into())));
    }
    switches
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

    /// Kimi K3's own prompt format, for K3 files that carry no template: the template Moonshot
    /// ships with K3 (system and user turns, reasoning, tool declarations, calls and results), as
    /// llama.cpp keeps it in `models/templates/Kimi-K3.jinja`, byte for byte.
    pub fn kimi_k3() -> Self {
        ChatTemplate::new(include_str!("chat/kimi_k3.jinja"))
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
        let options = RenderOptions {
            add_generation_prompt,
            bos_token: bos.into(),
            eos_token: eos.into(),
            ..RenderOptions::default()
        };
        self.render_with(messages, &options)
    }

    /// Renders as transformers' `render_jinja_template` does (transformers/utils/
    /// chat_template_utils.py): its globals and `tojson`, `tools` and `documents` always defined
    /// (none when absent), and a message's reasoning also given as `thinking`, which gpt-oss's
    /// template reads.
    pub fn render_with(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String> {
        let env = environment()?;
        let json = |text: &str| -> Result<Value> {
            serde_json::from_str(text).map_err(|e| FormatError::ChatTemplate(format!("not JSON: {e}: {text}")))
        };
        let messages = messages.iter().map(|m| template_message(m, &json)).collect::<Result<Vec<_>>>()?;
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), options.tools.as_deref().map(json).transpose()?.unwrap_or(Value::from(()))),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(options.add_generation_prompt)),
            ("bos_token".into(), Value::from(options.bos_token.as_str())),
            ("eos_token".into(), Value::from(options.eos_token.as_str())),
        ];
        vars.extend(options.kwargs.iter().map(|(k, v)| (k.clone(), Value::from(Serde(v)))));
        let ctx = map(vars.iter().map(|(k, v)| (k.as_str(), v.clone())).collect());
        env.render_str(&without_generation_tags(&self.source), ctx).map_err(render_error)
    }
}

/// transformers' `{% generation %}...{% endgeneration %}` (its AssistantTracker extension) marks
/// the assistant's span and renders its body unchanged; minijinja has no such tag, so each becomes
/// an `if true` block with the same whitespace control, which renders the same.
fn without_generation_tags(source: &str) -> std::borrow::Cow<'_, str> {
    static TAG: std::sync::OnceLock<fancy_regex::Regex> = std::sync::OnceLock::new();
    let tag = TAG.get_or_init(|| {
        fancy_regex::Regex::new(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}").expect("a valid pattern")
    });
    tag.replace_all(source, |c: &fancy_regex::Captures| {
        let (open, close) = (&c[1], &c[3]);
        match c.get(2) {
            Some(_) => format!("{{%{open} endif {close}%}}"),
            None => format!("{{%{open} if true {close}%}}"),
        }
    })
}

/// The message as transformers hands it to the template, keys in the order of the OpenAI message
/// (role, content, reasoning_content, tool_calls, ...); the reasoning is given as `thinking` too,
/// first (transformers' `_alias_reasoning_fields`: `{"thinking": r, **message, "reasoning_content": r}`).
fn template_message(m: &ChatMessage, json: &dyn Fn(&str) -> Result<Value>) -> Result<Value> {
    let mut fields: Vec<(&str, Value)> = Vec::new();
    if let Some(r) = &m.reasoning_content {
        fields.push(("thinking", Value::from(r.as_str())));
    }
    fields.push(("role", Value::from(m.role.as_str())));
    fields.push(("content", Value::from(m.content.as_str())));
    if let Some(r) = &m.reasoning_content {
        fields.push(("reasoning_content", Value::from(r.as_str())));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = match &c.function.arguments {
                    ToolArguments::Object(text) => json(text)?,
                    ToolArguments::Text(text) => Value::from(text.as_str()),
                };
                let function = map(vec![("name", Value::from(c.function.name.as_str())), ("arguments", arguments)]);
                let mut call: Vec<(&str, Value)> = Vec::new();
                if let Some(id) = &c.id {
                    call.push(("id", Value::from(id.as_str())));
                }
                call.push(("type", Value::from(c.kind.as_str())));
                call.push(("function", function));
                Ok(map(call))
            })
            .collect::<Result<Vec<Value>>>()?;
        fields.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &m.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &m.name {
        fields.push(("name", Value::from(name.as_str())));
    }
    Ok(map(fields))
}

/// A Jinja mapping with its keys in this order (as a Python dict keeps them).
fn map(entries: Vec<(&str, Value)>) -> Value {
    struct Ordered<'a>(Vec<(&'a str, Value)>);
    impl Serialize for Ordered<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(self.0.len()))?;
            for (k, v) in &self.0 {
                m.serialize_entry(k, v)?;
            }
            m.end()
        }
    }
    Value::from(Serde(Ordered(entries)))
}

/// A template's own `raise_exception` (it refuses the conversation) told apart from a template
/// this Jinja cannot run.
fn render_error(e: minijinja::Error) -> FormatError {
    let unsupported = matches!(
        e.kind(),
        ErrorKind::SyntaxError
            | ErrorKind::UnknownFilter
            | ErrorKind::UnknownTest
            | ErrorKind::UnknownFunction
            | ErrorKind::UnknownMethod
    );
    if unsupported {
        FormatError::ChatTemplate(format!("{e}: the template uses a feature nightmail's Jinja does not have"))
    } else {
        FormatError::ChatTemplate(e.to_string())
    }
}

fn environment() -> Result<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| FormatError::ChatTemplate(e.to_string()))?;
    env.set_syntax(syntax);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |format: String| strftime_today(&format));
    env.add_filter("tojson", tojson);
    // Jinja2's tests ask Python: `iter(none)` fails (minijinja iterates none as empty), and a
    // string or dict has `len` and `[]`, so it is a sequence (jinja2/tests.py).
    env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
    env.add_test("sequence", |v: &Value| matches!(v.kind(), ValueKind::Seq | ValueKind::String | ValueKind::Map));
    Ok(env)
}

/// transformers' `tojson` filter: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, no HTML escaping, arguments by position or name.
fn tojson(value: &Value, args: &[Value], kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let arg = |i: usize, name: &str| -> std::result::Result<Option<Value>, minijinja::Error> {
        Ok(match kwargs.get::<Option<Value>>(name)? {
            Some(v) => Some(v),
            None => args.get(i).cloned(),
        })
        .map(|v| v.filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = arg(1, "indent")?.map(|v| match v.as_str() {
        Some(s) => s.to_string(),
        None => " ".repeat(usize::try_from(v.as_i64().unwrap_or(0)).unwrap_or(0)),
    });
    let (item_sep, key_sep) = match arg(2, "separators")? {
        Some(v) => {
            let sep = |i: usize| -> std::result::Result<String, minijinja::Error> {
                Ok(v.get_item(&Value::from(i))?.as_str().unwrap_or_default().to_string())
            };
            (sep(0)?, sep(1)?)
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let sort_keys = arg(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(Value::from(out))
}

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, out: &mut String, v: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match v.as_i64() {
                Some(i) if v.is_integer() => out.push_str(&i.to_string()),
                _ => out.push_str(&python_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
            },
            ValueKind::String => self.write_str(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.write_container(out, '[', ']', &items, depth, |out, item, depth| self.write(out, item, depth))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
                }
                self.write_container(out, '{', '}', &keys, depth, |out, key, depth| {
                    match key.as_str() {
                        Some(k) => self.write_str(out, k),
                        None => self.write_str(out, &key.to_string()),
                    }
                    out.push_str(&self.key_sep);
                    self.write(out, &v.get_item(key)?, depth)
                })?;
            }
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {} is not JSON serializable", v.kind()),
                ));
            }
        }
        Ok(())
    }

    fn write_container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[Value],
        depth: usize,
        mut item: impl FnMut(&mut String, &Value, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, v) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            if let Some(ind) = &self.indent {
                out.push('\n');
                out.push_str(&ind.repeat(depth + 1));
            }
            item(out, v, depth + 1)?;
        }
        if let Some(ind) = &self.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: shortest round trip, `.0` on whole numbers, exponent form below 1e-4
/// and from 1e16.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let e = format!("{x:e}");
        let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        return format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    if x.fract() == 0.0 { format!("{x:.1}") } else { format!("{x}") }
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

    /// Python's `json.dumps` texts for these values (transformers' `tojson`), not minijinja's.
    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let render = |source: &str| {
            ChatTemplate::new(source)
                .render_with(&[ChatMessage::new("user", "é <b> \"q\"\n")], &RenderOptions::default())
                .unwrap()
        };
        assert_eq!(render("{{ messages[0] | tojson }}"), r#"{"role": "user", "content": "é <b> \"q\"\n"}"#);
        assert_eq!(
            render("{{ messages[0] | tojson(ensure_ascii=true, separators=[',', ':']) }}"),
            r#"{"role":"user","content":"\u00e9 <b> \"q\"\n"}"#
        );
        assert_eq!(
            render("{{ {'b': [1, 2.5, none, true], 'a': {}} | tojson(indent=2) }}"),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": {}\n}"
        );
        assert_eq!(render("{{ {'b': 1.0, 'a': 1e20} | tojson(sort_keys=true) }}"), r#"{"a": 1e+20, "b": 1.0}"#);
    }

    #[test]
    fn tool_calls_and_reasoning_reach_the_template() {
        let m = ChatMessage::new("assistant", "").with_reasoning("think").with_tool_call(ToolCall::function(
            "c1",
            "f",
            ToolArguments::Object(r#"{"z": 1, "a": 2}"#.into()),
        ));
        let out = ChatTemplate::new(
            "{% for m in messages %}{{ m.thinking }}|{{ m.reasoning_content }}|{% for c in m.tool_calls %}{{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}{% endfor %}|{{ tools is none }}",
        )
        .render_with(&[m], &RenderOptions::default())
        .unwrap();
        assert_eq!(out, r#"think|think|c1 f {"z": 1, "a": 2}|True"#);
    }

    #[test]
    fn a_generation_block_renders_its_body() {
        let t = ChatTemplate::new(
            "a\n  {%- generation -%}\n  b {% generation %}c{% endgeneration %}\n  {%- endgeneration %}\nd",
        );
        assert_eq!(t.render(&[], false, "", "").unwrap(), "ab cd");
    }

    #[test]
    fn raise_exception_in_a_template_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}");
        assert!(matches!(t.render(&[], true, "", ""), Err(FormatError::ChatTemplate(m))
            if m.contains("no system role") && !m.contains("does not have")));
    }

    #[test]
    fn a_template_this_jinja_cannot_run_says_so() {
        let t = ChatTemplate::new("{{ messages | no_such_filter }}");
        assert!(matches!(t.render(&[], true, "", ""), Err(FormatError::ChatTemplate(m))
            if m.contains("no_such_filter") && m.contains("does not have")));
    }
}
