//! Kimi K3's tagged calls (Kimi-K3.jinja, `render_assistant`): after the
//! `<|open|>response<|sep|>..<|close|>response<|sep|>` part, `<|open|>tools<|sep|>` around
//! `<|open|>call tool="NAME" index="1"<|sep|>` elements, each holding
//! `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>` (V bare where T is
//! `string`, else JSON) or one `<|open|>json type="object"<|sep|>{..}<|close|>json<|sep|>`.

use serde_json::Value as Json;

use super::ParsedTurn;
use super::scan::{Tags, Turn, attr, json_arguments, sections, xml_calls, xml_params};

pub(super) const OPEN: &str = "<|open|>tools<|sep|>";
const CLOSE: &str = "<|close|>tools<|sep|>";
const EXPECTED: &str = "<|open|>tools<|sep|><|open|>call tool=\"NAME\" index=\"1\"<|sep|><|open|>argument key=\"KEY\" type=\"string\"<|sep|>VALUE<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
const TAGS: Tags = Tags {
    call: "<|open|>call",
    call_close: "<|close|>call<|sep|>",
    name_attr: "tool",
    param: "<|open|>argument",
    param_close: "<|close|>argument<|sep|>",
    key_attr: "key",
    header_end: "<|sep|>",
};

/// The turn's own tags around its prose (`render_assistant`, and the message it sits in).
const FRAMING: &[&str] =
    &["<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>"];

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(FRAMING, EXPECTED);
    sections(text, OPEN, CLOSE, &mut turn, &|section, turn| xml_calls(section, &TAGS, turn, &body));
    turn.finish()
}

fn body(_name: &str, body: &str) -> Result<crate::chat::ToolArguments, String> {
    let Some(json) = body.trim_start().strip_prefix("<|open|>json") else {
        return xml_params(body, &TAGS, &value);
    };
    let (_, rest) = json.split_once("<|sep|>").ok_or("the <|open|>json tag has no <|sep|>")?;
    let text = rest.trim_end().strip_suffix("<|close|>json<|sep|>").ok_or("the JSON has no <|close|>json<|sep|>")?;
    json_arguments(text)
}

fn value(header: &str, text: &str) -> Result<Json, String> {
    match attr(header, "type").as_deref() {
        Some("string") | None => Ok(Json::String(text.to_string())),
        Some(t) => serde_json::from_str(text.trim())
            .map_err(|e| format!("its type is {t} but it is not JSON ({e}); give text type=\"string\"")),
    }
}
