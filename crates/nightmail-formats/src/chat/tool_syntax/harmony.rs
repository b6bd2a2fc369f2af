//! gpt-oss's harmony (openai-gpt-oss-120b.jinja): a call is a message addressed to
//! `functions.NAME`, written by the template as `<|start|>assistant to=functions.NAME<|channel|>
//! commentary json<|message|>{..}<|call|>` and by the model also as `<|channel|>commentary
//! to=functions.NAME <|constrain|>json<|message|>{..}<|call|>`; generation begins after the
//! prompt's `<|start|>assistant`, so the first message may lack its `<|start|>`. The prose is the
//! bodies of the messages addressed to no function.

use super::ParsedTurn;
use super::scan::{Read, Turn, json_arguments, unread};

pub(super) const OPEN: &str = " to=functions.";
const EXPECTED: &str = "<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{\"KEY\": \"VALUE\"}<|call|>";

pub(super) fn parse(text: &str) -> ParsedTurn {
    let mut turn = Turn::new(&[], EXPECTED);
    for message in text.split("<|start|>") {
        let (header, body, ended) = match message.split_once("<|message|>") {
            Some((header, rest)) => {
                let end = ["<|end|>", "<|call|>", "<|return|>"].iter().filter_map(|e| rest.find(e)).min();
                (header, end.map_or(rest, |e| &rest[..e]), end.is_some())
            }
            // Text before any header: prose, its end token dropped.
            None => (message, "", true),
        };
        let Some((_, recipient)) = header.split_once("to=functions.") else {
            if message.contains("<|message|>") {
                if !body.trim().is_empty() {
                    turn.prose(body);
                    turn.prose("\n\n");
                }
            } else {
                let prose =
                    ["<|end|>", "<|return|>", "<|call|>"].iter().fold(message.to_string(), |t, e| t.replace(e, ""));
                turn.prose(&prose);
            }
            continue;
        };
        let name = recipient.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or("");
        let read = if name.is_empty() {
            Err(unread(None, "it names no function after to=functions."))
        } else if !message.contains("<|message|>") {
            Err(unread(Some(name), "its header has no <|message|>"))
        } else if !ended {
            Err(unread(Some(name), "it has no end marker `<|call|>`"))
        } else {
            json_arguments(body).map(|a| Read::new(name, a)).map_err(|r| unread(Some(name), r))
        };
        turn.call(message, read);
    }
    turn.finish()
}
