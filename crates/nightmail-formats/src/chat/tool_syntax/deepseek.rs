//! DeepSeek-V3/R1 and V3.1 calls, in `<｜tool▁calls▁begin｜>..<｜tool▁calls▁end｜>`, each
//! `<｜tool▁call▁begin｜>..<｜tool▁call▁end｜>`: V3 and R1 write `function<｜tool▁sep｜>NAME\n```json\n{..}\n````
//! (deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja), V3.1 `NAME<｜tool▁sep｜>{..}`
//! (deepseek-ai-DeepSeek-V3.1.jinja).

use super::ParsedTurn;
use super::scan::{Piece, Turn, Unread, json_arguments, pieces, unread};
use crate::chat::ToolArguments;

pub(super) const OPEN: &str = "<｜tool▁calls▁begin｜>";
const CLOSE: &str = "<｜tool▁calls▁end｜>";
const CALL: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V3,
    V31,
}

pub(super) fn parse(text: &str, version: Version) -> ParsedTurn {
    let expected = match version {
        Version::V3 => {
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{\"KEY\": \"VALUE\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        }
        Version::V31 => {
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{\"KEY\": \"VALUE\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        }
    };
    let mut turn = Turn::new(&["<｜end▁of▁sentence｜>"], expected);
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
                            let read = match read(inner, version) {
                                Ok(call) if closed => Ok(call),
                                Ok((name, _)) => Err(unread(Some(&name), format!("it has no end marker `{CALL_END}`"))),
                                Err(u) if closed => Err(u),
                                Err(u) => Err(Unread { reason: format!("it has no end marker `{CALL_END}`"), ..u }),
                            };
                            turn.call(raw, None, read);
                        }
                    }
                }
            }
        }
    }
    turn.finish()
}

fn read(inner: &str, version: Version) -> Result<(String, ToolArguments), Unread> {
    let (head, rest) = inner.split_once(SEP).ok_or_else(|| unread(None, format!("it has no `{SEP}`")))?;
    let (name, arguments) = match version {
        Version::V31 => (head.trim(), rest),
        Version::V3 => {
            let (name, fenced) = rest.split_once('\n').unwrap_or((rest, ""));
            let name = name.trim();
            let arguments = fenced
                .trim()
                .strip_prefix("```json")
                .and_then(|a| a.trim_end().strip_suffix("```"))
                .ok_or_else(|| unread(Some(name), "its arguments are not in a ```json fence"))?;
            (name, arguments)
        }
    };
    if name.is_empty() {
        return Err(unread(None, "it names no function"));
    }
    let arguments = json_arguments(arguments).map_err(|r| unread(Some(name), r))?;
    Ok((name.to_string(), arguments))
}
