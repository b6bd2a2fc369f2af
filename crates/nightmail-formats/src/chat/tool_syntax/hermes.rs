//! Hermes, as Qwen3's and Qwen2.5's templates write it (Qwen-Qwen3-0.6B.jinja):
//! `<tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>`, one block per call.

use serde_json::Value as Json;

use super::ParsedTurn;
use super::scan::{Read, Turn, Unread, block_calls, json_arguments, short, unread};

pub(super) const OPEN: &str = "<tool_call>";
pub(super) const CLOSE: &str = "</tool_call>";
const EXPECTED: &str = "<tool_call>\n{\"name\": \"NAME\", \"arguments\": {\"KEY\": \"VALUE\"}}\n</tool_call>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(&["<|im_end|>", "<|endoftext|>"], EXPECTED);
    block_calls(text, (OPEN, CLOSE), false, &mut turn, &read, &name_in);
    turn.finish()
}

fn read(inner: &str) -> Result<Read, Unread> {
    let call: Json = serde_json::from_str(inner.trim())
        .map_err(|e| unread(name_in(inner).as_deref(), format!("it is not JSON ({e}): `{}`", short(inner.trim()))))?;
    let name = call.get("name").and_then(Json::as_str).ok_or_else(|| unread(None, "it has no \"name\" string"))?;
    // llama.cpp's Hermes parser takes `parameters` as well (common/chat-peg-parser.cpp).
    let arguments = call
        .get("arguments")
        .or_else(|| call.get("parameters"))
        .ok_or_else(|| unread(Some(name), "it has no \"arguments\" object"))?;
    let arguments = json_arguments(&arguments.to_string()).map_err(|r| unread(Some(name), r))?;
    Ok(Read::new(name, arguments))
}

/// The `"name"` of a call whose JSON does not parse, for the message to the model.
fn name_in(inner: &str) -> Option<String> {
    let after = inner.split_once("\"name\"")?.1.trim_start().strip_prefix(':')?.trim_start();
    let name = after.strip_prefix('"')?.split('"').next()?;
    (!name.is_empty()).then(|| name.to_string())
}
