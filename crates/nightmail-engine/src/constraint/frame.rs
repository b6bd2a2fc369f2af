//! A call as each JSON-argument family frames it, from its opener to its closing marker: the
//! literal markers, a function name from the tool list, and the arguments ([`super::json`]).
//! The frames are those `nightmail_formats::ToolSyntax::parse` reads (one file per family in
//! nightmail-formats/src/chat/tool_syntax/), in the canonical spacing the templates write.

use super::json::{ArgsSchema, Json};
use nightmail_formats::ToolSyntax;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Lit(&'static str),
    /// One of the tools' names.
    Name,
    /// A call index (`functions.NAME:0`): one to four digits.
    Digits,
    /// Any text up to and including `end`, beginning with a byte of `first` (harmony's header
    /// after the recipient, which the model writes in more than one order).
    Until {
        end: &'static str,
        first: &'static [u8],
    },
    Args,
}

/// The text that opens a call, and the parts from there to the call's end; `None` for the
/// XML-ish syntaxes (QwenXml, Glm, MiniMaxM2, DeepSeek-V3.2/V4's DSML, Kimi K3), whose values
/// are raw text between tags: their decoding is left free.
pub(crate) fn frame(syntax: ToolSyntax) -> Option<(&'static str, &'static [Part])> {
    use Part::*;
    Some(match syntax {
        ToolSyntax::Hermes => {
            ("<tool_call>", &[Lit("\n{\"name\": \""), Name, Lit("\", \"arguments\": "), Args, Lit("}\n</tool_call>")])
        }
        // Each call inside the section opens with its own marker, so a second call is constrained too.
        ToolSyntax::KimiK2 => (
            "<|tool_call_begin|>",
            &[
                Lit("functions."),
                Name,
                Lit(":"),
                Digits,
                Lit("<|tool_call_argument_begin|>"),
                Args,
                Lit("<|tool_call_end|>"),
            ],
        ),
        ToolSyntax::DeepSeekV31 => {
            ("<｜tool▁call▁begin｜>", &[Name, Lit("<｜tool▁sep｜>"), Args, Lit("<｜tool▁call▁end｜>")])
        }
        ToolSyntax::DeepSeekV3 => (
            "<｜tool▁call▁begin｜>",
            &[Lit("function<｜tool▁sep｜>"), Name, Lit("\n```json\n"), Args, Lit("\n```<｜tool▁call▁end｜>")],
        ),
        ToolSyntax::Harmony => {
            (" to=functions.", &[Name, Until { end: "<|message|>", first: b" <" }, Args, Lit("<|call|>")])
        }
        ToolSyntax::KimiK3
        | ToolSyntax::DeepSeekV32
        | ToolSyntax::DeepSeekV4
        | ToolSyntax::QwenXml
        | ToolSyntax::Glm
        | ToolSyntax::MiniMaxM2 => return None,
    })
}

/// The grammar of one syntax's calls over a tool list.
#[derive(Debug, Clone)]
pub(crate) struct CallGrammar {
    opener: &'static [u8],
    parts: &'static [Part],
    names: Vec<Vec<u8>>,
    schemas: Vec<ArgsSchema>,
}

/// Where the output stands: watching for the opener (`part` 0, `at` its bytes matched), or
/// inside part `part - 1` of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallState {
    part: u8,
    at: u16,
    /// Names still matching, while the name is read.
    names: u64,
    /// The function named, once read.
    function: u8,
    /// Bytes of an `Until` part's end matched.
    end_at: u8,
    json: Json,
}

/// Longest harmony header between the name and `<|message|>`.
const MAX_UNTIL: u16 = 64;

impl CallGrammar {
    pub fn new(
        opener: &'static str,
        parts: &'static [Part],
        names: Vec<Vec<u8>>,
        schemas: Vec<ArgsSchema>,
    ) -> CallGrammar {
        CallGrammar { opener: opener.as_bytes(), parts, names, schemas }
    }

    pub fn start(&self) -> CallState {
        CallState { part: 0, at: 0, names: 0, function: 0, end_at: 0, json: Json::start() }
    }

    /// Takes one byte; false when no call of this grammar goes on with it.
    pub fn feed(&self, s: &mut CallState, b: u8) -> bool {
        if s.part == 0 {
            let o = self.opener;
            // Restarting at the first byte is exact: no opener repeats its first byte.
            s.at = if o[s.at as usize] == b { s.at + 1 } else { (o[0] == b) as u16 };
            if s.at as usize == o.len() {
                self.enter(s, 1);
            }
            return true;
        }
        let at = s.at as usize;
        match self.parts[s.part as usize - 1] {
            Part::Lit(lit) => {
                if lit.as_bytes()[at] != b {
                    return false;
                }
                s.at += 1;
                if s.at as usize == lit.len() {
                    self.enter(s, s.part + 1);
                }
                true
            }
            Part::Name => {
                let go_on = (0..self.names.len())
                    .filter(|&i| s.names & (1 << i) != 0 && self.names[i].get(at) == Some(&b))
                    .fold(0u64, |m, i| m | 1 << i);
                if go_on != 0 {
                    s.names = go_on;
                    s.at += 1;
                    return true;
                }
                // A name ends where no longer one goes on; the byte is the next part's.
                let Some(i) = (0..self.names.len()).find(|&i| s.names & (1 << i) != 0 && self.names[i].len() == at)
                else {
                    return false;
                };
                s.function = i as u8;
                self.enter(s, s.part + 1);
                self.feed(s, b)
            }
            Part::Digits => {
                if b.is_ascii_digit() && at < 4 {
                    s.at += 1;
                    true
                } else if at > 0 {
                    self.enter(s, s.part + 1);
                    self.feed(s, b)
                } else {
                    false
                }
            }
            Part::Until { end, first } => {
                if (at == 0 && !first.contains(&b)) || s.at >= MAX_UNTIL {
                    return false;
                }
                let (end, m) = (end.as_bytes(), s.end_at as usize);
                let m = if end[m] == b { m + 1 } else { (end[0] == b) as usize };
                s.at += 1;
                s.end_at = m as u8;
                if m == end.len() {
                    self.enter(s, s.part + 1);
                }
                true
            }
            Part::Args => {
                if !s.json.feed(b, &self.schemas[s.function as usize]) {
                    return false;
                }
                if s.json.is_done() {
                    self.enter(s, s.part + 1);
                }
                true
            }
        }
    }

    /// Moves to part `part` (1-based); past the last, the call is over and the opener is
    /// watched for again.
    fn enter(&self, s: &mut CallState, part: u8) {
        let all = if self.names.len() == 64 { u64::MAX } else { (1 << self.names.len()) - 1 };
        let function = s.function;
        *s = self.start();
        if (part as usize) <= self.parts.len() {
            *s = CallState { part, names: all, function, ..*s };
        }
    }

    /// Watching for the opener with none of it matched: a text without the opener's first byte
    /// leaves the state as it is.
    pub fn idle(&self, s: &CallState) -> bool {
        s.part == 0 && s.at == 0
    }

    pub fn opener_start(&self) -> u8 {
        self.opener[0]
    }

    /// Whether the output is inside a value string of the arguments ([`Json::in_plain_string`]).
    pub fn in_plain_string(&self, s: &CallState) -> bool {
        s.part != 0 && self.parts[s.part as usize - 1] == Part::Args && s.json.in_plain_string()
    }

    /// Whether the output is inside a call (the opener read, the end not yet).
    pub fn in_call(&self, s: &CallState) -> bool {
        s.part != 0
    }
}
