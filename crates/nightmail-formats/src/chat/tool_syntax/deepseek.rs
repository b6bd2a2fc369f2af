//! DeepSeek-V3/R1 and V3.1 calls, in `<｜tool▁calls▁begin｜>..<｜tool▁calls▁end｜>`, each
//! `<｜tool▁call▁begin｜>..<｜tool▁call▁end｜>`: V3 and R1 write `function<｜tool▁sep｜>NAME\n```json\n{..}\n````
//! (deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja), V3.1 `NAME<｜tool▁sep｜>{..}`
//! (deepseek-ai-DeepSeek-V3.1.jinja).

use super::ParsedTurn;
use super::scan::{Read, Turn, Unread, block_calls, json_arguments, sections, unread};

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
    sections(text, OPEN, CLOSE, &mut turn, &|section, turn| {
        let name_in = |inner: &str| split(inner, version).map(|(name, _)| name.to_string()).filter(|n| !n.is_empty());
        block_calls(section, (CALL, CALL_END), true, turn, &|inner| read(inner, version), &name_in);
    });
    turn.finish()
}

/// The call's name and the text of its arguments (V3's still fenced).
fn split(inner: &str, version: Version) -> Option<(&str, &str)> {
    let (head, rest) = inner.split_once(SEP)?;
    Some(match version {
        Version::V31 => (head.trim(), rest),
        Version::V3 => rest.split_once('\n').map_or((rest.trim(), ""), |(name, fenced)| (name.trim(), fenced)),
    })
}

fn read(inner: &str, version: Version) -> Result<Read, Unread> {
    let (name, arguments) = split(inner, version).ok_or_else(|| unread(None, format!("it has no `{SEP}`")))?;
    if name.is_empty() {
        return Err(unread(None, "it names no function"));
    }
    let arguments = match version {
        Version::V31 => arguments,
        Version::V3 => arguments
            .trim()
            .strip_prefix("```json")
            .and_then(|a| a.trim_end().strip_suffix("```"))
            .ok_or_else(|| unread(Some(name), "its arguments are not in a ```json fence"))?,
    };
    let arguments = json_arguments(arguments).map_err(|r| unread(Some(name), r))?;
    Ok(Read::new(name, arguments))
}
