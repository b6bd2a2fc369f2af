//! A call's arguments as a byte-level pushdown automaton: a JSON object (RFC 8259 §4) whose
//! keys are the tool schema's properties, each at most once, the required ones before it closes,
//! and whose string-typed properties have string values (§7); nested values are any JSON value
//! (§3, numbers as §6, strings as §7). The state is `Copy`, so checking a candidate token is
//! copying it and feeding the token's bytes.

use crate::error::GrammarError;
use serde_json::Value;

/// Most properties a schema may list (one bit each in the automaton's state).
const MAX_KEYS: usize = 64;
/// Deepest nesting (one bit per level in the automaton's state).
const MAX_DEPTH: u8 = 63;
/// Whitespace bytes in a row: RFC 8259 allows any run, a model in a loop would write one forever.
const MAX_WS: u8 = 32;

/// What the arguments of one function may be.
#[derive(Debug, Clone)]
pub(crate) struct ArgsSchema {
    /// The properties' names as a JSON string writes them, without the quotes; `None` when the
    /// schema lists no properties (any key then).
    keys: Option<Vec<Vec<u8>>>,
    required: u64,
    strings: u64,
}

impl ArgsSchema {
    /// From a JSON Schema object (`{"type": "object", "properties": {..}, "required": [..]}`).
    pub fn new(function: &str, schema: &Value) -> Result<ArgsSchema, GrammarError> {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return Ok(ArgsSchema { keys: None, required: 0, strings: 0 });
        };
        if properties.len() > MAX_KEYS {
            return Err(GrammarError::TooManyProperties { function: function.into(), max: MAX_KEYS });
        }
        let names: Vec<&String> = properties.keys().collect();
        let mut schema_out = ArgsSchema { keys: None, required: 0, strings: 0 };
        for (i, (_, p)) in properties.iter().enumerate() {
            if p.get("type").and_then(Value::as_str) == Some("string") {
                schema_out.strings |= 1 << i;
            }
        }
        for r in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            let i = names
                .iter()
                .position(|n| Some(n.as_str()) == r.as_str())
                .ok_or_else(|| GrammarError::UnknownRequired { function: function.into(), key: r.to_string() })?;
            schema_out.required |= 1 << i;
        }
        let quoted = |k: &String| serde_json::to_string(k).map(|q| q.as_bytes()[1..q.len() - 1].to_vec());
        schema_out.keys = Some(names.into_iter().map(quoted).collect::<Result<_, _>>().expect("a string serializes"));
        Ok(schema_out)
    }

    fn all(&self) -> u64 {
        self.keys.as_ref().map_or(0, |k| if k.len() == 64 { u64::MAX } else { (1 << k.len()) - 1 })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The opening `{` of the arguments.
    Start,
    /// A value; `strict`: only a string (a string property's), `close`: `]` may end an empty array.
    Value {
        strict: bool,
        close: bool,
    },
    /// A key's opening quote, or (`close`) the `}` of an empty object.
    Key {
        close: bool,
    },
    Colon,
    /// `,` or the closer of the innermost container.
    Comma,
    Str {
        key: bool,
        esc: Esc,
    },
    Number(Num),
    /// `true`, `false` or `null`: which, and the bytes matched.
    Literal {
        word: u8,
        at: u8,
    },
    Done,
}

/// Inside a string, after a backslash: RFC 8259 §7's escapes, and a high surrogate's `\u` that
/// must be followed by a low one (serde_json refuses a lone surrogate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Slash,
    Hex {
        left: u8,
        value: u16,
        low: bool,
    },
    /// After a high surrogate: the `\` and then the `u` of its low half.
    LowSlash,
    LowU,
}

/// RFC 8259 §6: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    EDigits,
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// Where the arguments' text has got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Json {
    expect: Expect,
    /// Bit `d` set when the container at depth `d` is an array.
    arrays: u64,
    depth: u8,
    ws: u8,
    /// The top-level keys written, the candidates for the one being written and its bytes so far.
    seen: u64,
    keys: u64,
    key_len: u16,
}

impl Json {
    pub fn start() -> Json {
        Json { expect: Expect::Start, arrays: 0, depth: 0, ws: 0, seen: 0, keys: 0, key_len: 0 }
    }

    /// Inside a value string, past any escape: a byte other than `"`, `\\` and a control
    /// character leaves the state as it is.
    pub fn in_plain_string(&self) -> bool {
        self.expect == (Expect::Str { key: false, esc: Esc::None })
    }

    pub fn is_done(&self) -> bool {
        self.expect == Expect::Done
    }

    /// Takes one byte; false when it cannot continue arguments of `schema`.
    pub fn feed(&mut self, b: u8, schema: &ArgsSchema) -> bool {
        let is_ws = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        let spacing = matches!(self.expect, Expect::Value { .. } | Expect::Key { .. } | Expect::Colon | Expect::Comma);
        if spacing && is_ws {
            self.ws += 1;
            return self.ws <= MAX_WS;
        }
        self.ws = 0;
        match self.expect {
            Expect::Start => b == b'{' && self.open(false),
            Expect::Done => false,
            Expect::Value { strict, close } => match b {
                b']' if close => self.close(),
                b'"' => {
                    self.expect = Expect::Str { key: false, esc: Esc::None };
                    true
                }
                _ if strict => false,
                b'{' => self.open(false),
                b'[' => self.open(true),
                b'-' => self.number(Num::Minus),
                b'0' => self.number(Num::Zero),
                b'1'..=b'9' => self.number(Num::Int),
                b't' | b'f' | b'n' => {
                    let word = WORDS.iter().position(|w| w[0] == b).unwrap_or(0) as u8;
                    self.expect = Expect::Literal { word, at: 1 };
                    true
                }
                _ => false,
            },
            Expect::Key { close } => match b {
                b'}' if close => self.close_object(schema),
                b'"' => self.begin_key(schema),
                _ => false,
            },
            Expect::Colon => {
                let strict = self.depth == 1 && self.keys & schema.strings != 0;
                self.expect = Expect::Value { strict, close: false };
                b == b':'
            }
            Expect::Comma => match b {
                b',' if self.in_array() => {
                    self.expect = Expect::Value { strict: false, close: false };
                    true
                }
                // At the top, a `,` only while a property is left to write.
                b',' if self.depth > 1 || schema.keys.is_none() || schema.all() & !self.seen != 0 => {
                    self.expect = Expect::Key { close: false };
                    true
                }
                b']' if self.in_array() => self.close(),
                b'}' if !self.in_array() => self.close_object(schema),
                _ => false,
            },
            Expect::Str { key, esc } => self.string(b, key, esc, schema),
            Expect::Number(n) => self.number_byte(n, b, schema),
            Expect::Literal { word, at } => {
                let w = WORDS[word as usize];
                if w[at as usize] != b {
                    return false;
                }
                if at as usize + 1 == w.len() {
                    self.expect = Expect::Comma;
                } else {
                    self.expect = Expect::Literal { word, at: at + 1 };
                }
                true
            }
        }
    }

    fn in_array(&self) -> bool {
        self.arrays & (1 << self.depth) != 0
    }

    fn open(&mut self, array: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        self.depth += 1;
        self.arrays = (self.arrays & !(1 << self.depth)) | ((array as u64) << self.depth);
        self.expect = if array { Expect::Value { strict: false, close: true } } else { Expect::Key { close: true } };
        true
    }

    /// A `}`: at the top only once every required property is written.
    fn close_object(&mut self, schema: &ArgsSchema) -> bool {
        (self.depth != 1 || schema.required & !self.seen == 0) && self.close()
    }

    fn close(&mut self) -> bool {
        self.depth -= 1;
        self.expect = if self.depth == 0 { Expect::Done } else { Expect::Comma };
        true
    }

    fn begin_key(&mut self, schema: &ArgsSchema) -> bool {
        self.expect = Expect::Str { key: true, esc: Esc::None };
        if self.depth == 1 && schema.keys.is_some() {
            self.keys = schema.all() & !self.seen;
            self.key_len = 0;
            return self.keys != 0;
        }
        true
    }

    fn string(&mut self, b: u8, key: bool, esc: Esc, schema: &ArgsSchema) -> bool {
        if key
            && self.depth == 1
            && let Some(keys) = &schema.keys
        {
            return self.schema_key(b, keys);
        }
        let next = match (esc, b) {
            (Esc::None, b'"') => {
                self.expect = if key { Expect::Colon } else { Expect::Comma };
                return true;
            }
            (Esc::None, b'\\') => Esc::Slash,
            // §7: control characters must be escaped.
            (Esc::None, 0..=0x1f) => return false,
            (Esc::None, _) => Esc::None,
            (Esc::Slash, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Esc::None,
            (Esc::Slash, b'u') => Esc::Hex { left: 4, value: 0, low: false },
            (Esc::LowSlash, b'\\') => Esc::LowU,
            (Esc::LowU, b'u') => Esc::Hex { left: 4, value: 0, low: true },
            (Esc::Hex { left, value, low }, _) if b.is_ascii_hexdigit() => {
                let value = value << 4 | (b as char).to_digit(16).unwrap_or(0) as u16;
                if left > 1 {
                    Esc::Hex { left: left - 1, value, low }
                } else {
                    let high = (0xD800..0xDC00).contains(&value);
                    let is_low = (0xDC00..0xE000).contains(&value);
                    match (low, high, is_low) {
                        (false, true, _) => Esc::LowSlash,
                        (false, false, false) | (true, _, true) => Esc::None,
                        _ => return false,
                    }
                }
            }
            _ => return false,
        };
        self.expect = Expect::Str { key, esc: next };
        true
    }

    /// A top-level key's byte, against the properties not yet written.
    fn schema_key(&mut self, b: u8, keys: &[Vec<u8>]) -> bool {
        let at = self.key_len as usize;
        let go_on = (0..keys.len())
            .filter(|&i| self.keys & (1 << i) != 0 && keys[i].get(at) == Some(&b))
            .fold(0u64, |m, i| m | 1 << i);
        if go_on != 0 {
            self.keys = go_on;
            self.key_len += 1;
            return true;
        }
        // The closing quote picks the one candidate written whole.
        let whole = (0..keys.len()).find(|&i| self.keys & (1 << i) != 0 && keys[i].len() == at);
        match (b, whole) {
            (b'"', Some(i)) => {
                self.keys = 1 << i;
                self.seen |= 1 << i;
                self.expect = Expect::Colon;
                true
            }
            _ => false,
        }
    }

    fn number(&mut self, n: Num) -> bool {
        self.expect = Expect::Number(n);
        true
    }

    fn number_byte(&mut self, n: Num, b: u8, schema: &ArgsSchema) -> bool {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, _) if digit => Num::Int,
            (Num::Int, _) if digit => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, _) if digit => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
            (Num::E, b'+' | b'-') => Num::ESign,
            (Num::E | Num::ESign | Num::EDigits, _) if digit => Num::EDigits,
            // The number ended: the byte belongs to what follows it.
            (Num::Zero | Num::Int | Num::Frac | Num::EDigits, _) => {
                self.expect = Expect::Comma;
                return self.feed(b, schema);
            }
            _ => return false,
        };
        self.expect = Expect::Number(next);
        true
    }
}
