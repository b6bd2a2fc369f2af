//! Qwen3-Coder's and Qwen3.5's XML calls (Qwen3-Coder.jinja, Qwen3.5-4B.jinja):
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`,
//! a value written bare where it is a string and through `tojson` where it is an object or list.

use serde_json::Value as Json;

use super::ParsedTurn;
use super::scan::{Piece, Read, Turn, Unread, block_calls, loose_value, object, pieces, short, unread};

const CLOSE: &str = "</tool_call>";
const EXPECTED: &str = "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(&["<|im_end|>", "<|endoftext|>"], EXPECTED);
    block_calls(text, (super::hermes::OPEN, CLOSE), false, &mut turn, &read, &|inner| {
        name_in(inner).map(str::to_string)
    });
    turn.finish()
}

fn name_in(inner: &str) -> Option<&str> {
    let after = inner.trim_start().strip_prefix("<function=")?;
    after.split_once('>').map(|(name, _)| name.trim()).filter(|n| !n.is_empty())
}

fn read(inner: &str) -> Result<Read, Unread> {
    let name = name_in(inner).ok_or_else(|| unread(None, "it does not begin with <function=NAME>"))?;
    let body = inner.trim_start().split_once('>').map_or("", |(_, b)| b);
    let body = body
        .trim_end()
        .strip_suffix("</function>")
        .ok_or_else(|| unread(Some(name), "its <function=...> has no end marker `</function>`"))?;
    let mut pairs = Vec::new();
    for piece in pieces(body, "<parameter=", "</parameter>") {
        match piece {
            Piece::Text(t) if t.trim().is_empty() => {}
            Piece::Text(t) => return Err(unread(Some(name), format!("`{}` is not a parameter", short(t.trim())))),
            Piece::Block { inner, closed, .. } => {
                let (key, value) =
                    inner.split_once('>').ok_or_else(|| unread(Some(name), "a <parameter=...> tag has no `>`"))?;
                if !closed {
                    return Err(unread(Some(name), format!("the parameter {key} has no end marker `</parameter>`")));
                }
                // The template puts a newline on each side of the value.
                let value = value.strip_prefix('\n').unwrap_or(value);
                let value = value.strip_suffix('\n').unwrap_or(value);
                pairs.push((key.trim().to_string(), python_scalar(value).unwrap_or_else(|| loose_value(value))));
            }
        }
    }
    Ok(Read::new(name, object(&pairs)))
}

/// The template writes a scalar with Jinja's `| string`, which in transformers is Python's `str`:
/// `True`, `False`, `None` (llama.cpp reads them so too, common/chat-peg-parser.cpp).
fn python_scalar(value: &str) -> Option<Json> {
    match value.trim() {
        "True" => Some(Json::Bool(true)),
        "False" => Some(Json::Bool(false)),
        "None" => Some(Json::Null),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolArguments;

    /// Qwen3-Coder's template writes booleans through Python's `str`; JSON's spelling reads too.
    #[test]
    fn qwen_xml_reads_python_and_json_booleans() {
        let turn = parse(
            "<tool_call>\n<function=f>\n<parameter=a>\nTrue\n</parameter>\n<parameter=b>\nfalse\n</parameter>\n<parameter=c>\nNone\n</parameter>\n</function>\n</tool_call>",
        );
        let [Ok(call)] = &turn.calls[..] else { panic!("{turn:?}") };
        assert_eq!(call.function.arguments, ToolArguments::Object(r#"{"a": true, "b": false, "c": null}"#.into()));
    }
}
