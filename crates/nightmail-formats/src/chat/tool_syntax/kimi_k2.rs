//! Kimi K2 (moonshotai-Kimi-K2.jinja): `<|tool_calls_section_begin|>` around
//! `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>`;
//! `functions.NAME:IDX` is the call's id, which the `tool` turn answers.

use super::ParsedTurn;
use super::scan::{Piece, Turn, Unread, json_arguments, pieces, unread};
use crate::chat::ToolArguments;

pub(super) const OPEN: &str = "<|tool_calls_section_begin|>";
const CLOSE: &str = "<|tool_calls_section_end|>";
const CALL: &str = "<|tool_call_begin|>";
const CALL_END: &str = "<|tool_call_end|>";
const ARGUMENTS: &str = "<|tool_call_argument_begin|>";
const EXPECTED: &str = "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{\"KEY\": \"VALUE\"}<|tool_call_end|><|tool_calls_section_end|>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(&["<|im_end|>"], EXPECTED);
    // A section whose end marker is missing still gives the calls it completed.
    for piece in pieces(text, OPEN, CLOSE) {
        match piece {
            Piece::Text(t) => turn.prose(t),
            Piece::Block { inner, .. } => {
                for call in pieces(inner, CALL, CALL_END) {
                    match call {
                        Piece::Text(t) if t.trim().is_empty() => {}
                        Piece::Text(t) => turn.stray(t),
                        Piece::Block { raw, inner, closed } => {
                            let id = inner.split_once(ARGUMENTS).map(|(id, _)| id.trim().to_string());
                            let read = if closed {
                                read(inner)
                            } else {
                                Err(unread(id.as_deref().map(name_of), format!("it has no end marker `{CALL_END}`")))
                            };
                            turn.call(raw, id, read);
                        }
                    }
                }
            }
        }
    }
    turn.finish()
}

/// `functions.NAME:IDX` to `NAME`.
fn name_of(id: &str) -> &str {
    let id = id.strip_prefix("functions.").unwrap_or(id);
    id.rsplit_once(':').map_or(id, |(name, _)| name)
}

fn read(inner: &str) -> Result<(String, ToolArguments), Unread> {
    let (id, arguments) =
        inner.split_once(ARGUMENTS).ok_or_else(|| unread(None, format!("it has no `{ARGUMENTS}`")))?;
    let name = name_of(id.trim());
    if name.is_empty() {
        return Err(unread(None, "it names no function (functions.NAME:0)"));
    }
    let arguments = json_arguments(arguments).map_err(|r| unread(Some(name), r))?;
    Ok((name.to_string(), arguments))
}
