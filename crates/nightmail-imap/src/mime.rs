//! A message's MIME structure, as IMAP addresses it (RFC 3501 §6.4.5 section numbers, §7.4.2
//! BODYSTRUCTURE and ENVELOPE), built from mail-parser.
//!
//! mail-parser has panicked on crafted input before (its issue #145), so every call into it runs
//! under `catch_unwind`: a message it cannot handle is served as an opaque `text/plain` body and
//! the session goes on. Nesting is cut at [`MAX_DEPTH`] so a hostile message cannot make the
//! BODYSTRUCTURE (or the encoder's recursion over it) arbitrarily deep.

use std::borrow::Cow;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};

use base64::Engine;
#[cfg(test)]
use imap_codec::decode::Decoder;
use imap_next::imap_types::body::{
    BasicFields, Body, BodyStructure, Disposition, Language, Location, MultiPartExtensionData, SinglePartExtensionData,
    SpecificFields,
};
use imap_next::imap_types::core::{IString, Literal, NString, Vec1};
use imap_next::imap_types::envelope::{Address as ImapAddress, Envelope};
use imap_next::imap_types::fetch::Section;
use mail_parser::{Address, HeaderValue, Message, MessageParser, MimeHeaders, PartType};

/// Deepest nesting of multiparts and attached messages described; deeper parts are opaque.
pub const MAX_DEPTH: usize = 24;

/// One MIME part, with byte ranges into the whole raw message.
#[derive(Clone, Debug)]
pub struct Part {
    /// The part's own header (for the root: the message header), blank line included.
    pub header: Range<usize>,
    pub body: Range<usize>,
    pub ctype: String,
    pub subtype: String,
    pub params: Vec<(String, String)>,
    pub id: Option<String>,
    pub description: Option<String>,
    pub encoding: String,
    pub disposition: Option<(String, Vec<(String, String)>)>,
    pub language: Vec<String>,
    pub location: Option<String>,
    pub children: Vec<Part>,
    /// For `message/rfc822`: the attached message.
    pub message: Option<Box<Nested>>,
}

#[derive(Clone, Debug)]
pub struct Nested {
    pub envelope: Envelope<'static>,
    pub root: Part,
}

/// A parsed message: its envelope and part tree.
pub struct Parsed {
    pub envelope: Envelope<'static>,
    pub root: Part,
}

/// Parses `raw`. Never panics and never fails: unparseable input is one opaque text part.
pub fn parse(raw: &[u8]) -> Parsed {
    match catch_unwind(AssertUnwindSafe(|| parse_at(raw, 0..raw.len(), 0))) {
        Ok(Some((envelope, root))) => Parsed { envelope, root },
        Ok(None) | Err(_) => {
            tracing::debug!("mail-parser could not parse a stored message; serving it as text/plain");
            let split = header_end(raw);
            Parsed { envelope: empty_envelope(), root: opaque(0..split, split..raw.len()) }
        }
    }
}

/// The offset just past the header block (past the empty line), or the end if there is none.
pub fn header_end(raw: &[u8]) -> usize {
    let mut i = 0;
    while i < raw.len() {
        let line_end = raw[i..].iter().position(|&b| b == b'\n').map_or(raw.len(), |p| i + p + 1);
        let line = &raw[i..line_end];
        if line == b"\r\n" || line == b"\n" {
            return line_end;
        }
        i = line_end;
    }
    raw.len()
}

/// A part known only as header and body bytes: `text/plain`, no structure.
pub fn opaque(header: Range<usize>, body: Range<usize>) -> Part {
    Part {
        header,
        body,
        ctype: "text".into(),
        subtype: "plain".into(),
        params: vec![("charset".into(), "us-ascii".into())],
        id: None,
        description: None,
        encoding: "7bit".into(),
        disposition: None,
        language: vec![],
        location: None,
        children: vec![],
        message: None,
    }
}

fn parse_at(raw: &[u8], range: Range<usize>, depth: usize) -> Option<(Envelope<'static>, Part)> {
    let bytes = raw.get(range.clone())?;
    let message = MessageParser::default().parse(bytes)?;
    let envelope = envelope(&message);
    let root = part(raw, &message, 0, range.start, depth, false, &mut 0)?;
    Some((envelope, root))
}

fn clamp(r: Range<usize>, len: usize) -> Range<usize> {
    let start = r.start.min(len);
    start..r.end.clamp(start, len)
}

/// The part `id` of `message`; `in_digest` when its parent is a multipart/digest.
fn part(
    raw: &[u8],
    message: &Message<'_>,
    id: usize,
    base: usize,
    depth: usize,
    in_digest: bool,
    budget: &mut usize,
) -> Option<Part> {
    *budget += 1;
    let p = message.parts.get(id)?;
    let header = clamp(base + p.offset_header as usize..base + p.offset_body as usize, raw.len());
    let body = clamp(base + p.offset_body as usize..base + p.offset_end as usize, raw.len());
    let (ctype, subtype, params) = match p.content_type() {
        Some(ct) => (
            ct.ctype().to_ascii_lowercase(),
            ct.subtype()
                .unwrap_or(if ct.ctype().eq_ignore_ascii_case("text") { "plain" } else { "octet-stream" })
                .to_ascii_lowercase(),
            ct.attributes().unwrap_or_default().iter().map(|a| (a.name.to_string(), a.value.to_string())).collect(),
        ),
        // RFC 2046 §5.1.5: in a multipart/digest the default is message/rfc822.
        None if in_digest => ("message".into(), "rfc822".into(), vec![]),
        None => ("text".into(), "plain".into(), vec![("charset".into(), "us-ascii".into())]),
    };
    let disposition = p.content_disposition().map(|d| {
        (
            d.ctype().to_string(),
            d.attributes().unwrap_or_default().iter().map(|a| (a.name.to_string(), a.value.to_string())).collect(),
        )
    });
    let language = match p.content_language() {
        HeaderValue::Text(t) => vec![t.to_string()],
        HeaderValue::TextList(list) => list.iter().map(|t| t.to_string()).collect(),
        _ => vec![],
    };
    let encoding = p.content_transfer_encoding().unwrap_or("7bit").to_ascii_lowercase();
    let mut out = Part {
        header,
        body: body.clone(),
        ctype,
        subtype,
        params,
        id: p.content_id().map(|s| format!("<{s}>")),
        description: p.content_description().map(str::to_string),
        encoding,
        disposition,
        language,
        location: p.content_location().map(str::to_string),
        children: vec![],
        message: None,
    };
    if depth >= MAX_DEPTH || *budget > 10_000 {
        out.ctype = "application".into();
        out.subtype = "octet-stream".into();
        return Some(out);
    }
    match &p.body {
        PartType::Multipart(ids) => {
            let digest = out.ctype == "multipart" && out.subtype == "digest";
            for &child in ids {
                if let Some(c) = part(raw, message, child as usize, base, depth + 1, digest, budget) {
                    out.children.push(c);
                }
            }
            if out.children.is_empty() {
                // A multipart with no parts cannot be described as one (RFC 3501 body-type-mpart
                // needs at least one body): describe it as the opaque bytes it is.
                out.ctype = "text".into();
                out.subtype = "plain".into();
            }
        }
        _ if out.ctype == "message"
            && out.subtype == "rfc822"
            && matches!(out.encoding.as_str(), "7bit" | "8bit" | "binary") =>
        {
            if let Some((envelope, root)) = parse_at(raw, body, depth + 1) {
                out.message = Some(Box::new(Nested { envelope, root }));
            }
        }
        _ => {}
    }
    Some(out)
}

fn unfold(s: &str) -> String {
    s.replace("\r\n", "").replace('\n', "").trim().to_string()
}

fn nstring(s: Option<String>) -> NString<'static> {
    match s {
        None => NString(None),
        Some(s) => NString(Some(istring(s))),
    }
}

/// An IMAP string for any text: quoted when possible, a literal otherwise. A NUL, which no IMAP
/// string may hold (RFC 3501 §4.3 CHAR8 is %x01-ff), becomes U+FFFD.
pub fn istring(s: String) -> IString<'static> {
    let s = if s.contains('\0') { s.replace('\0', "\u{FFFD}") } else { s };
    IString::try_from(s.clone()).unwrap_or_else(|_| IString::Literal(Literal::unvalidated(s.into_bytes())))
}

/// RFC 2047 encoded-word for a display name that is not ASCII: envelope strings are 7-bit.
fn encode_word(s: &str) -> String {
    if s.is_ascii() {
        s.to_string()
    } else {
        format!("=?utf-8?b?{}?=", base64::engine::general_purpose::STANDARD.encode(s))
    }
}

/// One address of an ENVELOPE list (RFC 3501 §7.4.2): a source route `@a,@b:user@host`
/// (RFC 5322 §4.4 obs-route) goes to the at-domain-list, not the mailbox name.
fn address(a: &mail_parser::Addr<'_>) -> Option<ImapAddress<'static>> {
    let address = a.address.as_deref()?;
    let (route, address) = match address.strip_prefix('@').and_then(|_| address.split_once(':')) {
        Some((route, rest)) => (Some(route.to_string()), rest),
        None => (None, address),
    };
    let (mailbox, host) = address.rsplit_once('@').unwrap_or((address, ""));
    Some(ImapAddress {
        name: nstring(a.name.as_deref().map(encode_word)),
        adl: nstring(route),
        mailbox: nstring(Some(mailbox.to_string())),
        host: nstring(Some(host.to_string())),
    })
}

/// An address list for ENVELOPE. A group (RFC 5322 §3.4 `name: members;`) is kept as RFC 3501
/// §7.4.2 marks it: (NIL NIL "name" NIL), its members, then (NIL NIL NIL NIL), so an empty group
/// is two markers, not NIL. mail-parser gives addresses outside any group as a group without a
/// name.
fn addresses(value: Option<&Address<'_>>) -> Vec<ImapAddress<'static>> {
    let marker = |name: Option<String>| ImapAddress {
        name: NString(None),
        adl: NString(None),
        mailbox: nstring(name),
        host: NString(None),
    };
    match value {
        None => vec![],
        Some(Address::List(list)) => list.iter().filter_map(address).collect(),
        Some(Address::Group(groups)) => {
            let mut out = Vec::new();
            for group in groups {
                match &group.name {
                    Some(name) => {
                        out.push(marker(Some(encode_word(name))));
                        out.extend(group.addresses.iter().filter_map(address));
                        out.push(marker(None));
                    }
                    None => out.extend(group.addresses.iter().filter_map(address)),
                }
            }
            out
        }
    }
}

pub fn empty_envelope() -> Envelope<'static> {
    Envelope {
        date: NString(None),
        subject: NString(None),
        from: vec![],
        sender: vec![],
        reply_to: vec![],
        to: vec![],
        cc: vec![],
        bcc: vec![],
        in_reply_to: NString(None),
        message_id: NString(None),
    }
}

/// RFC 3501 §7.4.2 ENVELOPE: raw header strings, parsed address lists; Sender and Reply-To
/// default to From.
fn envelope(m: &Message<'_>) -> Envelope<'static> {
    let raw = |name: &str| m.header_raw(name).map(unfold);
    let from = addresses(m.from());
    let sender = match addresses(m.sender()) {
        v if v.is_empty() => from.clone(),
        v => v,
    };
    let reply_to = match addresses(m.reply_to()) {
        v if v.is_empty() => from.clone(),
        v => v,
    };
    Envelope {
        date: nstring(raw("Date")),
        subject: nstring(raw("Subject")),
        from,
        sender,
        reply_to,
        to: addresses(m.to()),
        cc: addresses(m.cc()),
        bcc: addresses(m.bcc()),
        in_reply_to: nstring(raw("In-Reply-To")),
        message_id: nstring(raw("Message-ID")),
    }
}

fn params(list: &[(String, String)]) -> Vec<(IString<'static>, IString<'static>)> {
    list.iter().map(|(k, v)| (istring(k.to_ascii_uppercase()), istring(v.clone()))).collect()
}

fn lines(raw: &[u8], r: &Range<usize>) -> u32 {
    raw[r.clone()].iter().filter(|&&b| b == b'\n').count() as u32
}

/// BODYSTRUCTURE (`extended`) or BODY of a part (RFC 3501 §7.4.2).
pub fn body_structure(raw: &[u8], p: &Part, extended: bool) -> BodyStructure<'static> {
    let disposition = || {
        Some(Disposition {
            disposition: p.disposition.as_ref().map(|(d, ps)| (istring(d.to_ascii_uppercase()), params(ps))),
            tail: Some(Language {
                language: p.language.iter().map(|l| istring(l.clone())).collect(),
                tail: Some(Location { location: nstring(p.location.clone()), extensions: vec![] }),
            }),
        })
    };
    if !p.children.is_empty() {
        let bodies: Vec<BodyStructure<'static>> = p.children.iter().map(|c| body_structure(raw, c, extended)).collect();
        if let Ok(bodies) = Vec1::try_from(bodies) {
            return BodyStructure::Multi {
                bodies,
                subtype: istring(p.subtype.to_ascii_uppercase()),
                extension_data: extended
                    .then(|| MultiPartExtensionData { parameter_list: params(&p.params), tail: disposition() }),
            };
        }
    }
    let specific = if let Some(nested) = &p.message {
        SpecificFields::Message {
            envelope: Box::new(nested.envelope.clone()),
            body_structure: Box::new(body_structure(raw, &nested.root, extended)),
            number_of_lines: lines(raw, &p.body),
        }
    } else if p.ctype == "text" {
        SpecificFields::Text { subtype: istring(p.subtype.to_ascii_uppercase()), number_of_lines: lines(raw, &p.body) }
    } else {
        SpecificFields::Basic {
            r#type: istring(p.ctype.to_ascii_uppercase()),
            subtype: istring(p.subtype.to_ascii_uppercase()),
        }
    };
    let body = Body {
        basic: BasicFields {
            parameter_list: params(&p.params),
            id: nstring(p.id.clone()),
            description: nstring(p.description.clone()),
            content_transfer_encoding: istring(p.encoding.to_ascii_uppercase()),
            size: p.body.len() as u32,
        },
        specific,
    };
    BodyStructure::Single {
        body,
        extension_data: extended.then(|| SinglePartExtensionData { md5: NString(None), tail: disposition() }),
    }
}

/// The part that section number `path` names (RFC 3501 §6.4.5): numbers step into multiparts,
/// and into the message inside a message/rfc822 part; a non-multipart body is part 1 of its
/// message.
pub fn find<'p>(root: &'p Part, path: &[u32]) -> Option<&'p Part> {
    let mut current: Option<&Part> = None;
    for &n in path {
        let body = match current {
            None => root,
            Some(p) => match &p.message {
                Some(nested) => &nested.root,
                None => p,
            },
        };
        current = Some(if body.children.is_empty() {
            if n != 1 {
                return None;
            }
            body
        } else {
            body.children.get(n as usize - 1)?
        });
    }
    current
}

/// The message a section's HEADER/TEXT speak of: the whole message, or the one attached at `path`.
fn message_root<'p>(root: &'p Part, path: Option<&[u32]>) -> Option<&'p Part> {
    match path {
        None => Some(root),
        Some(path) => find(root, path)?.message.as_ref().map(|n| &n.root),
    }
}

/// Header fields of `block` whose names are (or with `not`, are not) in `names`, then the empty line.
pub fn header_fields(block: &[u8], names: &[String], not: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut keep = false;
    for line in block.split_inclusive(|&b| b == b'\n') {
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        if !matches!(line.first(), Some(b' ' | b'\t')) {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            let name = String::from_utf8_lossy(name);
            let name = name.trim();
            keep = names.iter().any(|n| n.eq_ignore_ascii_case(name)) != not;
        }
        if keep {
            out.extend_from_slice(line);
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn path_of(part: &imap_next::imap_types::fetch::Part) -> Vec<u32> {
    part.0.as_ref().iter().map(|n| n.get()).collect()
}

/// The bytes a BODY[section] names, or `None` when the section does not exist.
pub fn section<'r>(raw: &'r [u8], root: &Part, section: Option<&Section<'_>>) -> Option<Cow<'r, [u8]>> {
    let slice = |r: &Range<usize>| Cow::Borrowed(&raw[r.clone()]);
    Some(match section {
        None => Cow::Borrowed(raw),
        Some(Section::Part(part)) => {
            let p = find(root, &path_of(part))?;
            slice(&p.body)
        }
        Some(Section::Header(part)) => {
            let path = part.as_ref().map(path_of);
            slice(&message_root(root, path.as_deref())?.header)
        }
        Some(Section::Text(part)) => {
            let path = part.as_ref().map(path_of);
            slice(&message_root(root, path.as_deref())?.body)
        }
        Some(Section::Mime(part)) => slice(&find(root, &path_of(part))?.header),
        Some(Section::HeaderFields(part, names) | Section::HeaderFieldsNot(part, names)) => {
            let not = matches!(section, Some(Section::HeaderFieldsNot(..)));
            let path = part.as_ref().map(path_of);
            let header = &message_root(root, path.as_deref())?.header;
            let names: Vec<String> =
                names.as_ref().iter().map(|n| String::from_utf8_lossy(n.as_ref()).into_owned()).collect();
            Cow::Owned(header_fields(&raw[header.clone()], &names, not))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MULTI: &[u8] = b"From: Ann <ann@x.org>\r\nTo: me@y.org\r\nSubject: hi\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\npreamble\r\n--b\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n\
hello\r\n--b\r\nContent-Type: message/rfc822\r\n\r\nFrom: bob@z.org\r\nSubject: inner\r\n\r\ninner body\r\n--b--\r\n";

    #[test]
    fn sections_find_parts_headers_and_nested_messages() {
        let parsed = parse(MULTI);
        let root = &parsed.root;
        assert_eq!(root.children.len(), 2);
        let sec = |s: &str| {
            let cmd = format!("a FETCH 1 BODY[{s}]\r\n");
            let (_, c) = imap_codec::CommandCodec::default().decode(cmd.as_bytes()).map_err(|_| s.to_string()).unwrap();
            let imap_next::imap_types::command::CommandBody::Fetch { macro_or_item_names, .. } = c.body else {
                panic!()
            };
            let imap_next::imap_types::fetch::MacroOrMessageDataItemNames::MessageDataItemNames(items) =
                macro_or_item_names
            else {
                panic!()
            };
            let imap_next::imap_types::fetch::MessageDataItemName::BodyExt { section: sct, .. } = &items[0] else {
                panic!()
            };
            section(MULTI, root, sct.as_ref()).map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        assert_eq!(sec("1").unwrap(), "hello");
        assert_eq!(sec("2.HEADER").unwrap(), "From: bob@z.org\r\nSubject: inner\r\n\r\n");
        assert_eq!(sec("2.TEXT").unwrap(), "inner body");
        assert_eq!(sec("2.1").unwrap(), "inner body");
        assert_eq!(sec("1.MIME").unwrap(), "Content-Type: text/plain; charset=utf-8\r\n\r\n");
        assert_eq!(sec("HEADER.FIELDS (SUBJECT TO)").unwrap(), "To: me@y.org\r\nSubject: hi\r\n\r\n");
        assert!(sec("TEXT").unwrap().starts_with("preamble"));
        assert!(sec("3").is_none());
        assert_eq!(parsed.envelope.subject, nstring(Some("hi".into())));
    }

    #[test]
    fn garbage_and_deep_nesting_do_not_panic() {
        for input in [&b""[..], b"\0\0\xff\xfe", b"Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\n--x--"] {
            let p = parse(input);
            let _ = body_structure(input, &p.root, true);
        }
        let mut deep = String::new();
        for i in 0..200 {
            deep.push_str(&format!("Content-Type: multipart/mixed; boundary=\"b{i}\"\r\n\r\n--b{i}\r\n"));
        }
        deep.push_str("Content-Type: text/plain\r\n\r\nleaf\r\n");
        let p = parse(deep.as_bytes());
        let mut depth = 0;
        let mut part = &p.root;
        while let Some(child) = part.children.first() {
            part = child;
            depth += 1;
        }
        assert!(depth <= MAX_DEPTH, "depth {depth}");
        let _ = body_structure(deep.as_bytes(), &p.root, true);
    }
}
