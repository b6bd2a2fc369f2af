//! GLM-4.5 to 4.7 (GLM-4.6.jinja, GLM-4.7-Flash.jinja): `<tool_call>NAME` then
//! `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs and `</tool_call>`, with newlines between
//! the parts in 4.5 and 4.6; a value is bare where it is a string, else `tojson`.

use super::ParsedTurn;
use super::scan::{Read, Turn, Unread, block_calls, loose_value, object, short, unread};

const CLOSE: &str = "</tool_call>";
const EXPECTED: &str = "<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    // The assistant's turn ends where the model writes the next role's token.
    let mut turn = Turn::new(&["<|endoftext|>", "<|user|>", "<|observation|>"], EXPECTED);
    block_calls(text, (super::hermes::OPEN, CLOSE), false, &mut turn, &read, &|inner| {
        name_in(inner).map(str::to_string)
    });
    turn.finish()
}

fn name_in(inner: &str) -> Option<&str> {
    let name = inner.split("<arg_key>").next()?.trim();
    (!name.is_empty() && !name.contains('<') && !name.contains(char::is_whitespace)).then_some(name)
}

fn read(inner: &str) -> Result<Read, Unread> {
    let name = name_in(inner).ok_or_else(|| unread(None, "it does not begin with the function's name"))?;
    let mut rest = &inner[inner.find("<arg_key>").unwrap_or(inner.len())..];
    let mut pairs = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Ok(Read::new(name, object(&pairs)));
        }
        let pair = (|| {
            let r = rest.strip_prefix("<arg_key>").ok_or_else(|| format!("`{}` is not an argument", short(rest)))?;
            let (key, r) = r.split_once("</arg_key>").ok_or("an <arg_key> has no </arg_key>")?;
            let key = key.trim();
            let r =
                r.trim_start().strip_prefix("<arg_value>").ok_or(format!("the argument {key} has no <arg_value>"))?;
            let (value, r) = r.split_once("</arg_value>").ok_or(format!("the argument {key} has no </arg_value>"))?;
            Ok::<_, String>(((key.to_string(), loose_value(value)), r))
        })();
        let (pair, r) = pair.map_err(|reason| unread(Some(name), reason))?;
        pairs.push(pair);
        rest = r;
    }
}
