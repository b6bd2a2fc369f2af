//! GLM-4.5 to 4.7 (GLM-4.6.jinja, GLM-4.7-Flash.jinja): `<tool_call>NAME` then
//! `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs and `</tool_call>`, with newlines between
//! the parts in 4.5 and 4.6; a value is bare where it is a string, else `tojson`.

use super::ParsedTurn;
use super::scan::{Piece, Turn, Unread, loose_value, object, pieces, short, unread};
use crate::chat::ToolArguments;

const CLOSE: &str = "</tool_call>";
const EXPECTED: &str = "<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    // The assistant's turn ends where the model writes the next role's token.
    let mut turn = Turn::new(&["<|endoftext|>", "<|user|>", "<|observation|>"], EXPECTED);
    for piece in pieces(text, super::hermes::OPEN, CLOSE) {
        match piece {
            Piece::Text(t) => turn.prose(t),
            Piece::Block { raw, inner, closed } => {
                let read = if closed {
                    read(inner)
                } else {
                    Err(unread(name_in(inner), format!("it has no end marker `{CLOSE}`")))
                };
                turn.call(raw, None, read);
            }
        }
    }
    turn.finish()
}

fn name_in(inner: &str) -> Option<&str> {
    let name = inner.split("<arg_key>").next()?.trim();
    (!name.is_empty() && !name.contains('<') && !name.contains(char::is_whitespace)).then_some(name)
}

fn read(inner: &str) -> Result<(String, ToolArguments), Unread> {
    let name = name_in(inner).ok_or_else(|| unread(None, "it does not begin with the function's name"))?;
    let body = &inner[inner.find("<arg_key>").unwrap_or(inner.len())..];
    let mut pairs = Vec::new();
    let mut key: Option<String> = None;
    for piece in pieces(body, "<arg_", "</arg_") {
        match piece {
            Piece::Text(t) if t.trim().is_empty() || t.trim() == "key>" || t.trim() == "value>" => {}
            Piece::Text(t) => return Err(unread(Some(name), format!("`{}` is not an argument", short(t.trim())))),
            Piece::Block { inner, closed, .. } => {
                if !closed {
                    return Err(unread(Some(name), "an <arg_key> or <arg_value> has no end tag"));
                }
                match (inner.split_once('>'), key.take()) {
                    (Some(("key", k)), None) => key = Some(k.trim().to_string()),
                    (Some(("value", v)), Some(k)) => pairs.push((k, loose_value(v))),
                    (Some(("value", _)), None) => return Err(unread(Some(name), "an <arg_value> has no <arg_key>")),
                    (Some(("key", _)), Some(k)) => {
                        return Err(unread(Some(name), format!("the argument {k} has no <arg_value>")));
                    }
                    _ => return Err(unread(Some(name), "an argument tag is neither <arg_key> nor <arg_value>")),
                }
            }
        }
    }
    match key {
        Some(k) => Err(unread(Some(name), format!("the argument {k} has no <arg_value>"))),
        None => Ok((name.to_string(), object(&pairs))),
    }
}
