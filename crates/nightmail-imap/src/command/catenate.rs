//! CATENATE (RFC 4469): an APPEND whose message is put together from literal text and IMAP URLs
//! (RFC 5092, `imap_url.rs`) naming messages, or sections of messages, in the user's own
//! mailboxes; with MULTIAPPEND (RFC 3502) several messages, each catenated or a plain literal.
//!
//! RFC 4469 §6, with RFC 3502 §6:
//!
//! ```abnf
//! append          = "APPEND" SP mailbox 1*append-message
//! append-message  = append-opts SP append-data
//! append-opts     = [SP flag-list] [SP date-time] *(SP append-ext)
//! append-data     = literal / literal8 / append-data-ext
//! append-data     =/ "CATENATE" SP "(" cat-part *(SP cat-part) ")"
//! cat-part        = text-literal / url
//! text-literal    = "TEXT" SP literal
//! url             = "URL" SP astring
//! ```
//!
//! imap-codec 2.0.0-alpha.10 has no grammar for it, so the command reaches the session whole,
//! refused (imap-next read each literal with its own continuation request and size check). Only
//! token boundaries are found here, with imap-codec's `Fragmentizer` telling where the literals
//! are; imap-codec parses the rest: each message's mailbox, flags and date as a one-message
//! APPEND (a stand-in literal in place of CATENATE's list, see `multiappend::parse`), each URL's
//! astring as a LOGIN's user name (the one command whose argument is a bare astring), and each
//! URL's section as a `FETCH BODY.PEEK[section]`. The section's bytes come from `mime::section`,
//! as FETCH's do.
//!
//! Every part of every message is resolved before anything is stored, and `append::run_all`
//! stores all the messages in one transaction: a URL that fails, or a message too big, stores
//! none. A missing destination is reported first (`NO [TRYCREATE]`, as RFC 3501 §6.3.11 says
//! for every APPEND), then each URL that names nothing this user may read gets `NO [BADURL url]`
//! and a message over `smtp.max_message_bytes` `NO [TOOBIG]` (RFC 4469 §5).

use std::borrow::Cow;
use std::ops::Range;

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_codec::fragmentizer::{FragmentInfo, Fragmentizer};
use imap_next::imap_types::IntoStatic;
use imap_next::imap_types::command::CommandBody;
use imap_next::imap_types::core::{Literal, LiteralMode, Tag, Vec1};
use imap_next::imap_types::datetime::DateTime;
use imap_next::imap_types::extensions::binary::{Literal8, LiteralOrLiteral8};
use imap_next::imap_types::fetch::{MacroOrMessageDataItemNames, MessageDataItemName, Section};
use imap_next::imap_types::flag::Flag;
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::{Code, CodeOther};
use nightmail_store::Uid;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use super::append::{self, AppendMessage};
use super::copy::destination;
use super::{Done, fetch, mailbox_name, multiappend, wire_name};
use crate::error::other_code;
use crate::imap_url::{self, MessageUrl};
use crate::session::{Session, State};
use crate::{ImapError, mime};

/// RFC 4469 `cat-part`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CatPart {
    Text(Vec<u8>),
    /// The URL as the client wrote it (the `astring`'s contents).
    Url(String),
}

/// RFC 4469 `append-data`: a literal, or the parts CATENATE joins.
pub(crate) enum Data {
    Literal(LiteralOrLiteral8<'static>),
    Catenate(Vec1<CatPart>),
}

/// One `append-message`.
pub(crate) struct Message {
    pub flags: Vec<Flag<'static>>,
    pub date: Option<DateTime>,
    pub data: Data,
}

pub(crate) struct Catenate {
    pub mailbox: Mailbox<'static>,
    pub messages: Vec1<Message>,
}

/// An APPEND with CATENATE taken apart, or why it is BAD.
pub(crate) struct Recognised {
    pub tag: Tag<'static>,
    pub request: Result<Catenate, String>,
}

/// A literal in the command: where its announcement (`{n}`, `{n+}`, `~{n}`) starts, and its bytes.
struct Lit {
    announce: usize,
    data: Range<usize>,
    eight: bool,
}

/// The command's bytes and its literals, as imap-codec's `Fragmentizer` finds them.
struct Scan<'c> {
    bytes: &'c [u8],
    literals: Vec<Lit>,
}

const KEYWORD: &[u8] = b"CATENATE (";

impl<'c> Scan<'c> {
    fn of(command: &'c [u8]) -> Option<Scan<'c>> {
        let mut fragments = Fragmentizer::without_max_message_size();
        fragments.enqueue_bytes(command);
        let mut literals = Vec::new();
        let mut announce = None;
        loop {
            match fragments.progress()? {
                FragmentInfo::Line { start, end, announcement: Some(_), .. } => {
                    announce = command[start..end].iter().rposition(|&b| b == b'{').map(|i| start + i);
                }
                FragmentInfo::Line { .. } => announce = None,
                FragmentInfo::Literal { start, end } => {
                    let at = announce.take()?;
                    let eight = at > 0 && command.get(at - 1) == Some(&b'~');
                    literals.push(Lit { announce: at - usize::from(eight), data: start..end, eight });
                }
            }
            if fragments.is_message_complete() {
                break;
            }
        }
        // One whole command, so its positions are `command`'s.
        (fragments.message_bytes().len() == command.len()).then_some(Scan { bytes: command, literals })
    }

    fn literal_at(&self, at: usize) -> Option<&Lit> {
        self.literals.iter().find(|l| l.announce == at)
    }

    /// The position after `keyword` if it is at `at` (any case).
    fn keyword(&self, at: usize, keyword: &[u8]) -> Option<usize> {
        let end = at + keyword.len();
        self.bytes.get(at..end).filter(|b| b.eq_ignore_ascii_case(keyword)).map(|_| end)
    }

    /// Past a quoted string that opens at `at` (RFC 3501 §4.3: `\` escapes the next octet).
    fn quoted_end(&self, at: usize) -> Option<usize> {
        let mut i = at + 1;
        loop {
            match *self.bytes.get(i)? {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                b'\r' | b'\n' => return None,
                _ => i += 1,
            }
        }
    }

    /// Where the next `append-data` starts, from `at` on: a literal or ` CATENATE (` outside
    /// quoted strings, parentheses (a flag list) and literals; `true` for CATENATE.
    fn data_start(&self, mut at: usize) -> Option<(usize, bool)> {
        let mut depth = 0usize;
        while at < self.bytes.len() {
            if let Some(lit) = self.literal_at(at) {
                if depth == 0 {
                    return Some((at, false));
                }
                at = lit.data.end;
                continue;
            }
            match self.bytes[at] {
                b'"' => {
                    at = self.quoted_end(at)?;
                    continue;
                }
                b'(' => depth += 1,
                b')' => depth = depth.checked_sub(1)?,
                b' ' if depth == 0 && self.keyword(at + 1, KEYWORD).is_some() => return Some((at + 1, true)),
                b'\r' => return None,
                _ => {}
            }
            at += 1;
        }
        None
    }

    /// Whether ` CATENATE (` appears anywhere outside a literal: only then is this our command.
    fn mentions_catenate(&self) -> bool {
        (0..self.bytes.len()).any(|at| {
            self.bytes[at] == b' '
                && self.keyword(at + 1, KEYWORD).is_some()
                && !self.literals.iter().any(|l| l.data.contains(&at))
        })
    }

    /// The `cat-part`s from `at` (just past `CATENATE (`) to the closing `)`, and what follows it.
    fn cat_parts(&self, mut at: usize) -> Result<(Vec1<CatPart>, usize), String> {
        let mut parts = Vec::new();
        loop {
            if let Some(after) = self.keyword(at, b"TEXT ") {
                let lit = self.literal_at(after).ok_or("CATENATE's TEXT takes a literal (RFC 4469 §6)")?;
                if lit.eight {
                    return Err("CATENATE's TEXT takes a literal, not a literal8 (RFC 4469 §6)".into());
                }
                parts.push(CatPart::Text(self.bytes[lit.data.clone()].to_vec()));
                at = lit.data.end;
            } else if let Some(after) = self.keyword(at, b"URL ") {
                let end = match (self.literal_at(after), self.bytes.get(after)) {
                    (Some(lit), _) => lit.data.end,
                    (None, Some(b'"')) => self.quoted_end(after).ok_or("CATENATE: an unterminated quoted URL")?,
                    (None, _) => {
                        let atom = self.bytes[after..].iter().position(|&b| matches!(b, b' ' | b')' | b'\r' | b'\n'));
                        after + atom.unwrap_or(0)
                    }
                };
                parts.push(CatPart::Url(url_text(&self.bytes[after..end]).ok_or("CATENATE: a URL is not an astring")?));
                at = end;
            } else {
                return Err("CATENATE takes TEXT literals and URLs (RFC 4469 §6)".into());
            }
            match self.bytes.get(at) {
                Some(b' ') => at += 1,
                Some(b')') => return Ok((Vec1::try_from(parts).expect("one part at least"), at + 1)),
                _ => return Err("syntax error in CATENATE: ')' expected".into()),
            }
        }
    }
}

/// An `astring` as imap-codec reads it: a LOGIN's user name.
fn url_text(astring: &[u8]) -> Option<String> {
    let mut login = b"x LOGIN ".to_vec();
    login.extend_from_slice(astring);
    login.extend_from_slice(b" x\r\n");
    match CommandCodec::default().decode(&login) {
        Ok(([], command)) => match command.body {
            CommandBody::Login { username, .. } => String::from_utf8(username.as_ref().to_vec()).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// `bytes` (a whole command imap-codec refused) as an APPEND with CATENATE, if it is one.
pub(crate) fn recognise(bytes: &[u8]) -> Option<Recognised> {
    // A cheap look first: every MULTIAPPEND passes here.
    if !bytes.windows(KEYWORD.len()).any(|w| w.eq_ignore_ascii_case(KEYWORD)) {
        return None;
    }
    let space = bytes.iter().position(|&b| b == b' ')?;
    let tag = Tag::try_from(String::from_utf8(bytes[..space].to_vec()).ok()?).ok()?;
    let scan = Scan::of(bytes)?;
    let after = scan.keyword(space + 1, b"APPEND ")?;
    if !scan.mentions_catenate() {
        return None;
    }
    let request =
        messages(&scan, after).ok_or_else(|| "syntax error in APPEND with CATENATE (RFC 4469 §6)".to_string());
    Some(Recognised { tag, request: request.and_then(|r| r) })
}

/// The messages of the APPEND whose mailbox starts at `after`. `None` for a syntax error that
/// imap-codec found, `Some(Err)` for one found here.
fn messages(scan: &Scan<'_>, after: usize) -> Option<Result<Catenate, String>> {
    let bytes = scan.bytes;
    // A literal mailbox name is not the message.
    let mut from = scan.literal_at(after).map_or(after, |l| l.data.end);
    let mut mailbox = None;
    let mut messages = Vec::new();
    loop {
        let (start, catenated) = scan.data_start(from)?;
        // The message as a one-message APPEND: the first with the command's own start, the
        // others after a stand-in `APPEND INBOX`.
        let mut one = match mailbox {
            None => Vec::new(),
            Some(_) => b"x APPEND INBOX".to_vec(),
        };
        one.extend_from_slice(&bytes[if mailbox.is_none() { 0 } else { from }..start]);
        let (parts, end) = match catenated {
            true => match scan.cat_parts(start + KEYWORD.len()) {
                Ok((parts, end)) => {
                    one.extend_from_slice(b"{1}\r\nx");
                    (Some(parts), end)
                }
                Err(e) => return Some(Err(e)),
            },
            false => {
                let end = scan.literal_at(start)?.data.end;
                one.extend_from_slice(&bytes[start..end]);
                (None, end)
            }
        };
        let CommandBody::Append { mailbox: to, flags, date, message } = multiappend::parse(&one)?.body else {
            return None;
        };
        let data = match parts {
            Some(parts) => Data::Catenate(parts),
            None => Data::Literal(message),
        };
        mailbox.get_or_insert(to);
        messages.push(Message { flags, date, data });
        match &bytes[end..] {
            b"\r\n" => break,
            [b' ', ..] => from = end,
            _ => return None,
        }
    }
    Some(Ok(Catenate { mailbox: mailbox?, messages: Vec1::try_from(messages).ok()? }))
}

/// RFC 4469 §5 `[BADURL url]`: `url-resp-text` has no `]`, controls or 8-bit octets, so those are
/// percent-encoded.
fn bad_url(url: &str, why: &str) -> ImapError {
    const ESCAPE: &AsciiSet = &CONTROLS.add(b' ').add(b']');
    let shown = match url {
        "" => "\"\"".to_string(),
        url => utf8_percent_encode(url, ESCAPE).to_string(),
    };
    let code = Code::Other(CodeOther::unvalidated(format!("BADURL {shown}").into_bytes()));
    ImapError::no_with(code, format!("CATENATE: {why}"))
}

/// RFC 4469 §5 `[TOOBIG]`.
fn too_big(limit: usize) -> ImapError {
    ImapError::no_with(other_code("TOOBIG"), format!("the message would be larger than {limit} octets"))
}

/// The section text of a URL, parsed by imap-codec as `BODY.PEEK[section]`.
fn section(text: &str) -> Option<Section<'static>> {
    let fetch = format!("x FETCH 1 BODY.PEEK[{text}]\r\n");
    let (rest, command) = CommandCodec::default().decode(fetch.as_bytes()).ok()?;
    match (rest.is_empty(), command.body) {
        (
            true,
            CommandBody::Fetch {
                macro_or_item_names: MacroOrMessageDataItemNames::MessageDataItemNames(names), ..
            },
        ) => match names.as_slice() {
            [MessageDataItemName::BodyExt { section: Some(section), partial: None, .. }] => {
                Some(section.clone().into_static())
            }
            _ => None,
        },
        _ => None,
    }
}

/// Whether `server` is this session's own server and user (RFC 4469 §3: URLs name messages on
/// the server the client is talking to; another user's needs URLAUTH, which is not offered).
fn own_server(s: &Session, server: &imap_url::Server) -> Result<(), &'static str> {
    let user = &s.user().map_err(|_| "not logged in")?.name;
    match &server.user {
        Some(named) if named == user => {}
        Some(_) => return Err("the URL names another user's mailbox (URLAUTH, RFC 4467, is not offered)"),
        None => return Err("the URL names no user (anonymous access, RFC 5092 §3.1, is not offered)"),
    }
    let host = server.host.to_ascii_lowercase();
    let ours = host == s.shared.config.hostname.to_ascii_lowercase()
        || host == "localhost"
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip == s.local.ip());
    if !ours || server.port.is_some_and(|p| p != s.local.port()) {
        return Err("the URL names another server");
    }
    Ok(())
}

/// The bytes a URL names, as `FETCH BODY.PEEK[section]<partial>` would give them (RFC 4469 §3).
fn resolve(s: &mut Session, text: &str) -> Result<Vec<u8>, ImapError> {
    let url: MessageUrl = imap_url::parse(text).map_err(|why| bad_url(text, why))?;
    if let Some(server) = &url.server {
        own_server(s, server).map_err(|why| bad_url(text, why))?;
    }
    let store = s.shared.store.clone();
    let info = match &url.mailbox {
        Some(name) => {
            // The store's form of the name (INBOX in any case, no trailing delimiter), through the
            // same decoding as a mailbox argument.
            let name = wire_name(s, name).and_then(|wire| mailbox_name(s, &wire).ok());
            let user = s.user()?.name.clone();
            match name {
                Some(name) => store.mailbox(&user, &name)?,
                None => None,
            }
            .ok_or_else(|| bad_url(text, "no such mailbox"))?
        }
        None => match &s.state {
            State::Selected(_, selected) => selected.info.clone(),
            _ => return Err(bad_url(text, "a URL without a mailbox needs a selected mailbox")),
        },
    };
    if url.uid_validity.is_some_and(|v| v.get() != info.uid_validity) {
        return Err(bad_url(text, "the mailbox's UIDVALIDITY is not the URL's"));
    }
    let entry = store.mail_entry(info.id, Uid(url.uid.get()))?;
    let raw = match entry {
        Some(entry) => store.message(entry.message)?,
        None => None,
    }
    .ok_or_else(|| bad_url(text, "no message with that UID"))?;
    let data = match &url.section {
        None => Cow::Borrowed(&raw[..]),
        Some(text_section) => {
            let section = section(text_section).ok_or_else(|| bad_url(text, "not a section (RFC 3501 §6.4.5)"))?;
            let parsed = mime::parse(&raw);
            mime::section(&raw, &parsed.root, Some(&section)).ok_or_else(|| bad_url(text, "no such section"))?
        }
    };
    Ok(match url.partial {
        Some(p) => fetch::partial(data, p.origin, p.length.map(|n| n.get())).into_owned(),
        None => data.into_owned(),
    })
}

pub(crate) async fn run(s: &mut Session, catenate: Catenate) -> Result<Done, ImapError> {
    destination(s, &catenate.mailbox)?;
    let limit = s.shared.config.smtp.max_message_bytes;
    // The whole command's bound, as for a MULTIAPPEND of literals (`docs/IMAP.md`).
    let command_limit = limit + 8 * 1024;
    let mut total = 0usize;
    let mut messages = Vec::with_capacity(catenate.messages.as_ref().len());
    for message in catenate.messages.into_iter() {
        let data = match message.data {
            Data::Literal(literal) => {
                total += match &literal {
                    LiteralOrLiteral8::Literal(l) => l.data().len(),
                    LiteralOrLiteral8::Literal8(l) => l.data.len(),
                };
                literal
            }
            Data::Catenate(parts) => {
                let mut joined = Vec::new();
                for part in parts.into_iter() {
                    match part {
                        CatPart::Text(text) => joined.extend_from_slice(&text),
                        CatPart::Url(url) => joined.extend_from_slice(&resolve(s, &url)?),
                    }
                    if joined.len() > limit {
                        return Err(too_big(limit));
                    }
                }
                total += joined.len();
                literal_or_8(joined)
            }
        };
        if total > command_limit {
            return Err(too_big(limit));
        }
        messages.push(AppendMessage { flags: message.flags, date: message.date, message: data });
    }
    let messages = Vec1::try_from(messages).map_err(|_| ImapError::bad("APPEND without a message"))?;
    append::run_all(s, catenate.mailbox, messages).await
}

/// The joined bytes as an APPEND's literal; with a NUL, which a literal cannot carry, as a
/// literal8, which `append::run_all` stores the way RFC 3516 §4.4 asks (`binary::for_storage`).
fn literal_or_8(bytes: Vec<u8>) -> LiteralOrLiteral8<'static> {
    match Literal::validate(&bytes) {
        Ok(()) => LiteralOrLiteral8::Literal(Literal::unvalidated(bytes)),
        Err(_) => LiteralOrLiteral8::Literal8(Literal8 { data: bytes.into(), mode: LiteralMode::Sync }),
    }
}

#[cfg(test)]
mod tests {
    use super::{CatPart, Data, recognise};

    fn parts(data: &Data) -> &[CatPart] {
        match data {
            Data::Catenate(parts) => parts.as_ref(),
            Data::Literal(_) => &[],
        }
    }

    #[test]
    fn text_and_url_parts_are_taken_apart() {
        let cmd = b"a1 APPEND Drafts (\\Seen) \"24-Mar-2007 23:00:00 +0200\" CATENATE (TEXT {6}\r\nab) cd URL \"/INBOX;UIDVALIDITY=3/;UID=2/;SECTION=1\" URL /Sent/;UID=1 TEXT {2+}\r\n\r\n)\r\n";
        let found = recognise(cmd).unwrap();
        assert_eq!(found.tag.as_ref(), "a1");
        let request = found.request.unwrap();
        let [message] = request.messages.as_ref() else { panic!("one message") };
        assert_eq!((message.flags.len(), message.date.is_some()), (1, true));
        assert_eq!(
            parts(&message.data),
            [
                CatPart::Text(b"ab) cd".to_vec()),
                CatPart::Url("/INBOX;UIDVALIDITY=3/;UID=2/;SECTION=1".into()),
                CatPart::Url("/Sent/;UID=1".into()),
                CatPart::Text(b"\r\n".to_vec()),
            ]
        );
    }

    #[test]
    fn multiappend_mixes_catenated_and_literal_messages() {
        let cmd = b"a2 append {6}\r\nDrafts catenate (url {12}\r\n/Sent/;UID=1) (\\Answered) {3}\r\nabc CATENATE (TEXT {1}\r\nx)\r\n";
        let request = recognise(cmd).unwrap().request.unwrap();
        let messages = request.messages.as_ref();
        assert_eq!(messages.len(), 3);
        assert_eq!(parts(&messages[0].data), [CatPart::Url("/Sent/;UID=1".into())]);
        assert!(matches!(&messages[1].data, Data::Literal(l) if messages[1].flags.len() == 1 && match l {
            imap_next::imap_types::extensions::binary::LiteralOrLiteral8::Literal(l) => l.data() == b"abc",
            _ => false,
        }));
        assert_eq!(parts(&messages[2].data), [CatPart::Text(b"x".to_vec())]);
    }

    #[test]
    fn broken_catenate_is_bad_and_others_are_not_ours() {
        for bad in [
            &b"a APPEND INBOX CATENATE ()\r\n"[..],
            b"a APPEND INBOX CATENATE (TEXT \"x\")\r\n",
            b"a APPEND INBOX CATENATE (TEXT ~{1}\r\nx)\r\n",
            b"a APPEND INBOX CATENATE (URL \"/INBOX/;UID=1\"\r\n",
            b"a APPEND INBOX CATENATE (BODY \"x\")\r\n",
            b"a APPEND INBOX (\\Seen CATENATE (URL x)\r\n",
        ] {
            let found = recognise(bad).expect("ours");
            assert!(found.request.is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(recognise(b"a APPEND INBOX {3}\r\nabc {2}\r\nde\r\n").is_none());
        assert!(recognise(b"a APPEND INBOX {12}\r\n CATENATE (x\r\n").is_none());
        assert!(recognise(b"a SEARCH CATENATE (TEXT x)\r\n").is_none());
    }

    /// Positions come from the client's bytes: every cut and every swap of a byte for one that
    /// matters to the grammar is refused or read, never a panic (the fuzz target covers more).
    #[test]
    fn cut_or_changed_commands_never_panic() {
        let commands: [&[u8]; 2] = [
            b"a1 APPEND {6}\r\nDrafts (\\Seen) CATENATE (TEXT {3}\r\nabc URL \"/INBOX/;UID=1\" URL x) {2+}\r\nde\r\n",
            b"a2 APPEND \"a b\" \"24-Mar-2007 23:00:00 +0200\" CATENATE (URL {5}\r\n;UID=1) CATENATE (TEXT ~{1}\r\nx)\r\n",
        ];
        for command in commands {
            for cut in 0..command.len() {
                let _ = recognise(&command[..cut]);
                for b in *b"{}\"() \r\n~\\+" {
                    let mut changed = command.to_vec();
                    changed[cut] = b;
                    let _ = recognise(&changed);
                }
            }
        }
    }
}
