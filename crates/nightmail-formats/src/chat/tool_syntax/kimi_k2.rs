//! Kimi K2 (moonshotai-Kimi-K2.jinja): `<|tool_calls_section_begin|>` around
//! `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>`;
//! `functions.NAME:IDX` is the call's id, which the `tool` turn answers.

use super::ParsedTurn;
use super::scan::{Read, Turn, Unread, block_calls, json_arguments, sections, unread};

pub(super) const OPEN: &str = "<|tool_calls_section_begin|>";
const CLOSE: &str = "<|tool_calls_section_end|>";
const CALL: &str = "<|tool_call_begin|>";
const CALL_END: &str = "<|tool_call_end|>";
const ARGUMENTS: &str = "<|tool_call_argument_begin|>";
const EXPECTED: &str = "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{\"KEY\": \"VALUE\"}<|tool_call_end|><|tool_calls_section_end|>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(&["<|im_end|>"], EXPECTED);
    sections(text, OPEN, CLOSE, &mut turn, &|section, turn| {
        let name_in = |inner: &str| inner.split_once(ARGUMENTS).map(|(id, _)| name_of(id.trim()).to_string());
        block_calls(section, (CALL, CALL_END), true, turn, &read, &name_in);
    });
    turn.finish()
}

/// `functions.NAME:IDX` to `NAME`.
fn name_of(id: &str) -> &str {
    let id = id.strip_prefix("functions.").unwrap_or(id);
    id.rsplit_once(':').map_or(id, |(name, _)| name)
}

fn read(inner: &str) -> Result<Read, Unread> {
    let (id, arguments) =
        inner.split_once(ARGUMENTS).ok_or_else(|| unread(None, format!("it has no `{ARGUMENTS}`")))?;
    let name = name_of(id.trim());
    if name.is_empty() {
        return Err(unread(None, "it names no function (functions.NAME:0)"));
    }
    let arguments = json_arguments(arguments).map_err(|r| unread(Some(name), r))?;
    Ok(Read { id: Some(id.trim().to_string()), ..Read::new(name, arguments) })
}

#[cfg(test)]
mod tests {
    /// The `tool` turn answers `functions.NAME:IDX`, so the call keeps it as its id.
    #[test]
    fn a_call_keeps_its_kimi_id() {
        let turn = super::parse(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.send_mail:3<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
        );
        let [Ok(call)] = &turn.calls[..] else { panic!("{turn:?}") };
        assert_eq!((call.id.as_deref(), call.function.name.as_str()), (Some("functions.send_mail:3"), "send_mail"));
    }
}
