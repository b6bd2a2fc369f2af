//! Readers the syntaxes share: marker-delimited blocks, JSON arguments, XML-style attributes and
//! parameters, and the turn being assembled. Everything slices at `find` results, which fall on
//! character boundaries, so no input can make a reader panic.

use serde_json::Value as Json;

use super::{MalformedCall, ParsedTurn};
use crate::chat::{ToolArguments, ToolCall};

/// Generated text cut at a pair of markers.
pub(super) enum Piece<'a> {
    Text(&'a str),
    /// `inner` lies between the markers and `raw` includes them; not `closed` where the text ended
    /// before the closing marker.
    Block {
        raw: &'a str,
        inner: &'a str,
        closed: bool,
    },
}

pub(super) fn pieces<'a>(text: &'a str, open: &str, close: &str) -> Vec<Piece<'a>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(open) {
        if at > 0 {
            out.push(Piece::Text(&rest[..at]));
        }
        let after = &rest[at + open.len()..];
        match after.find(close) {
            Some(end) => {
                let raw = &rest[at..at + open.len() + end + close.len()];
                out.push(Piece::Block { raw, inner: &after[..end], closed: true });
                rest = &after[end + close.len()..];
            }
            None => {
                // A stream cut inside the closing marker: the part written is no content.
                let cut =
                    close.char_indices().map(|(i, _)| &close[..i]).filter(|p| !p.is_empty() && after.ends_with(p));
                let inner = &after[..after.len() - cut.map(str::len).max().unwrap_or(0)];
                out.push(Piece::Block { raw: &rest[at..], inner, closed: false });
                rest = "";
            }
        }
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    out
}

/// Why a call could not be read, and its function's name where that much was.
pub(super) struct Unread {
    pub name: Option<String>,
    pub reason: String,
}

pub(super) fn unread(name: Option<&str>, reason: impl Into<String>) -> Unread {
    Unread { name: name.map(str::to_string), reason: reason.into() }
}

/// A call read: its id where the family writes one (Kimi K2's `functions.NAME:IDX`), its function
/// and arguments.
pub(super) struct Read {
    pub id: Option<String>,
    pub name: String,
    pub arguments: ToolArguments,
}

impl Read {
    pub fn new(name: &str, arguments: ToolArguments) -> Self {
        Read { id: None, name: name.to_string(), arguments }
    }
}

/// Text whose calls sit in `open`..`close` sections: the rest is prose, each section's inside goes
/// to `calls`. A section whose end marker is missing still gives the calls it completed.
pub(super) fn sections(text: &str, open: &str, close: &str, turn: &mut Turn, calls: &dyn Fn(&str, &mut Turn)) {
    for piece in pieces(text, open, close) {
        match piece {
            Piece::Text(t) => turn.prose(t),
            Piece::Block { inner, .. } => calls(inner, turn),
        }
    }
}

/// Calls each in an `open`..`close` block, read by `read` from the block's inside; `name_in` finds
/// the function's name in a block cut off before its end marker. Text between the blocks is
/// prose, or inside a calls section (`in_section`) an error.
pub(super) fn block_calls(
    text: &str,
    (open, close): (&str, &str),
    in_section: bool,
    turn: &mut Turn,
    read: &dyn Fn(&str) -> Result<Read, Unread>,
    name_in: &dyn Fn(&str) -> Option<String>,
) {
    for piece in pieces(text, open, close) {
        match piece {
            Piece::Text(t) if !in_section => turn.prose(t),
            Piece::Text(t) if t.trim().is_empty() => {}
            Piece::Text(t) => turn.stray(t),
            Piece::Block { raw, inner, closed: true } => turn.call(raw, read(inner)),
            Piece::Block { raw, inner, closed: false } => {
                turn.call(raw, Err(unread(name_in(inner).as_deref(), format!("it has no end marker `{close}`"))))
            }
        }
    }
}

/// A turn being assembled: its prose and calls, and the framing tokens its family writes around
/// a turn, which are not prose.
pub(super) struct Turn {
    prose: String,
    calls: Vec<Result<ToolCall, MalformedCall>>,
    framing: &'static [&'static str],
    /// The family's form of a call, `NAME` where the function's name goes.
    expected: &'static str,
}

impl Turn {
    pub fn new(framing: &'static [&'static str], expected: &'static str) -> Self {
        Turn { prose: String::new(), calls: Vec::new(), framing, expected }
    }

    pub fn prose(&mut self, text: &str) {
        self.prose.push_str(text);
    }

    /// A call read (or not) from `raw`; its id is the family's own where it writes one, else
    /// `call_N`, its place in the turn.
    pub fn call(&mut self, raw: &str, read: Result<Read, Unread>) {
        let call = match read {
            Ok(r) => Ok(ToolCall::function(
                r.id.unwrap_or_else(|| format!("call_{}", self.calls.len())),
                r.name,
                r.arguments,
            )),
            Err(u) => Err(self.malformed(raw, u)),
        };
        self.calls.push(call);
    }

    /// Text in a calls section that is no call.
    pub fn stray(&mut self, raw: &str) {
        let reason = format!("`{}` is not a call", short(raw.trim()));
        self.call(raw, Err(unread(None, reason)));
    }

    fn malformed(&self, raw: &str, u: Unread) -> MalformedCall {
        let expected = self.expected.replace("NAME", u.name.as_deref().unwrap_or("NAME"));
        MalformedCall { name: u.name, raw: raw.to_string(), reason: u.reason, expected }
    }

    pub fn finish(self) -> ParsedTurn {
        let mut content = self.prose;
        for token in self.framing {
            content = content.replace(token, "");
        }
        ParsedTurn { content: content.trim().to_string(), calls: self.calls }
    }
}

/// Up to 60 characters of `text`, for a reason.
pub(super) fn short(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// JSON text that must be an object: the call's arguments.
pub(super) fn json_arguments(text: &str) -> Result<ToolArguments, String> {
    let text = text.trim();
    match serde_json::from_str::<Json>(text) {
        Ok(Json::Object(_)) => Ok(ToolArguments::Object(text.to_string())),
        // Arguments held as JSON text reach `tojson` as a string (DeepSeek-V3.1's and gpt-oss's
        // templates): the object inside is meant.
        Ok(Json::String(inner)) if matches!(serde_json::from_str(&inner), Ok(Json::Object(_))) => {
            Ok(ToolArguments::Object(inner))
        }
        Ok(other) => Err(format!("the arguments are {} where a JSON object is needed", kind(&other))),
        Err(e) => Err(format!("the arguments are not JSON ({e}): `{}`", short(text))),
    }
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// An XML-style parameter's value: JSON where it parses, else the text itself, as the templates
/// write strings bare and everything else through `tojson` (GLM-4.6.jinja, MiniMax-M2.jinja,
/// Qwen3-Coder.jinja). llama.cpp decides by the tool's schema instead (common/chat-peg-parser.cpp),
/// which `parse` is not given, so a string that is itself JSON (`"12"`, `"true"`) comes back typed.
pub(super) fn loose_value(text: &str) -> Json {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| Json::String(text.to_string()))
}

/// Arguments from (key, value) pairs, keys in the order written.
pub(super) fn object(pairs: &[(String, Json)]) -> ToolArguments {
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("{}: {v}", Json::from(k.as_str()))).collect();
    ToolArguments::Object(format!("{{{}}}", fields.join(", ")))
}

/// `name="value"` in a tag's header, XML's entities undone (Kimi-K3.jinja's `escape_attr`).
pub(super) fn attr(header: &str, name: &str) -> Option<String> {
    let key = format!("{name}=\"");
    let mut from = 0;
    let start = loop {
        let at = from + header[from..].find(&key)?;
        if header[..at].chars().next_back().is_none_or(char::is_whitespace) {
            break at + key.len();
        }
        from = at + key.len();
    };
    let len = header[start..].find('"')?;
    let value = &header[start..start + len];
    Some(value.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
}

/// The tags of an XML-style call: `{call}` `name_attr="NAME"` `{header_end}` parameters
/// `{call_close}`, each parameter `{param}` `key_attr="K"` ... `{header_end}` V `{param_close}`.
pub(super) struct Tags {
    pub call: &'static str,
    pub call_close: &'static str,
    pub name_attr: &'static str,
    pub param: &'static str,
    pub param_close: &'static str,
    pub key_attr: &'static str,
    pub header_end: &'static str,
}

/// Each call in a section of XML-style calls (MiniMax-M2, DeepSeek's DSML, Kimi K3), its body
/// read by `body` (given the call's name and the text after its header).
pub(super) fn xml_calls(
    section: &str,
    tags: &Tags,
    turn: &mut Turn,
    body: &dyn Fn(&str, &str) -> Result<ToolArguments, String>,
) {
    let read = |inner: &str| {
        let (header, rest) = inner
            .split_once(tags.header_end)
            .ok_or_else(|| unread(None, format!("its opening tag has no `{}`", tags.header_end)))?;
        let name = attr(header, tags.name_attr)
            .ok_or_else(|| unread(None, format!("it names no function ({}=\"...\")", tags.name_attr)))?;
        body(&name, rest).map(|a| Read::new(&name, a)).map_err(|r| unread(Some(&name), r))
    };
    let name_in = |inner: &str| inner.split_once(tags.header_end).and_then(|(h, _)| attr(h, tags.name_attr));
    block_calls(section, (tags.call, tags.call_close), true, turn, &read, &name_in);
}

/// The parameters of an XML-style call, each value read by `value` (given the parameter's header).
pub(super) fn xml_params(
    body: &str,
    tags: &Tags,
    value: &dyn Fn(&str, &str) -> Result<Json, String>,
) -> Result<ToolArguments, String> {
    let mut pairs = Vec::new();
    for piece in pieces(body, tags.param, tags.param_close) {
        match piece {
            Piece::Text(t) if t.trim().is_empty() => {}
            Piece::Text(t) => return Err(format!("`{}` is not a parameter", short(t.trim()))),
            Piece::Block { inner, closed, .. } => {
                let (header, text) = inner
                    .split_once(tags.header_end)
                    .ok_or_else(|| format!("a parameter's tag has no `{}`", tags.header_end))?;
                let key = attr(header, tags.key_attr)
                    .ok_or_else(|| format!("a parameter has no name ({}=\"...\")", tags.key_attr))?;
                if !closed {
                    return Err(format!("the parameter {key} has no end marker `{}`", tags.param_close));
                }
                pairs.push((key.clone(), value(header, text).map_err(|e| format!("the parameter {key}: {e}"))?));
            }
        }
    }
    Ok(object(&pairs))
}
