//! BINARY (RFC 3516): FETCH BINARY[section]<partial> and BINARY.SIZE[section] give a part's body
//! with its Content-Transfer-Encoding undone (base64, quoted-printable; 7bit, 8bit and binary as
//! they are), as a literal8 when it holds a NUL (§4.2); an encoding the server does not know gets
//! NO [UNKNOWN-CTE] (§4.3). APPEND takes literal8 (imap-codec parses `~{n}`), and a part sent
//! with Content-Transfer-Encoding binary is stored base64-encoded (§4.4 allows the conversion), so
//! that BODY[] never carries a NUL, which an IMAP4rev1 literal may not.

use std::borrow::Cow;

use base64::Engine;
use imap_next::imap_types::core::{IString, Literal, LiteralMode, NString, NString8};
use imap_next::imap_types::extensions::binary::Literal8;
use mail_parser::decoders::quoted_printable::quoted_printable_decode;

use crate::ImapError;
use crate::error::other_code;
use crate::mime::{self, Part};

/// The body of the part at `section` (empty: the whole message) with its transfer encoding undone.
pub(crate) fn decoded<'r>(raw: &'r [u8], root: &Part, section: &[u32]) -> Result<Cow<'r, [u8]>, ImapError> {
    if section.is_empty() {
        return Ok(Cow::Borrowed(raw));
    }
    let part = mime::find(root, section).ok_or_else(|| ImapError::no("no such part in the message"))?;
    let body = &raw[part.body.clone()];
    if !part.children.is_empty() || part.message.is_some() {
        return Ok(Cow::Borrowed(body));
    }
    match part.encoding.as_str() {
        "7bit" | "8bit" | "binary" => Ok(Cow::Borrowed(body)),
        "base64" => {
            let clean: Vec<u8> = body.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
            base64::engine::general_purpose::STANDARD
                .decode(&clean)
                .map(Cow::Owned)
                .map_err(|_| ImapError::no("the part's base64 is damaged"))
        }
        "quoted-printable" => quoted_printable_decode(body)
            .map(Cow::Owned)
            .ok_or_else(|| ImapError::no("the part's quoted-printable is damaged")),
        _ => Err(ImapError::no_with(other_code("UNKNOWN-CTE"), "unknown Content-Transfer-Encoding")),
    }
}

/// BINARY's value on the wire: a literal8 when a NUL is in it (RFC 3516 §4.2), else a literal.
pub(crate) fn value(bytes: Vec<u8>) -> NString8<'static> {
    if bytes.contains(&0) {
        NString8::Literal8(Literal8 { data: Cow::Owned(bytes), mode: LiteralMode::Sync })
    } else {
        NString8::NString(NString(Some(IString::Literal(Literal::unvalidated(bytes)))))
    }
}

/// The message to store for an APPEND: `raw` itself, unless a leaf part is sent as
/// Content-Transfer-Encoding binary, which is then re-encoded as base64 (RFC 3516 §4.4).
pub(crate) fn for_storage(raw: &[u8]) -> Cow<'_, [u8]> {
    let parsed = mime::parse(raw);
    let mut binary = Vec::new();
    collect_binary(&parsed.root, &mut binary);
    if binary.is_empty() {
        return Cow::Borrowed(raw);
    }
    binary.sort_by_key(|p| p.header.start);
    let mut out = Vec::with_capacity(raw.len() * 4 / 3 + 64);
    let mut at = 0;
    for part in binary {
        if part.header.start < at {
            continue;
        }
        out.extend_from_slice(&raw[at..part.header.start]);
        out.extend_from_slice(&retagged_header(&raw[part.header.clone()]));
        let encoded = base64::engine::general_purpose::STANDARD.encode(&raw[part.body.clone()]);
        for line in encoded.as_bytes().chunks(76) {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
        at = part.body.end;
    }
    out.extend_from_slice(&raw[at..]);
    Cow::Owned(out)
}

fn collect_binary<'p>(part: &'p Part, out: &mut Vec<&'p Part>) {
    if part.children.is_empty() && part.message.is_none() && part.encoding == "binary" {
        out.push(part);
    }
    for child in &part.children {
        collect_binary(child, out);
    }
}

/// `header` with its Content-Transfer-Encoding field saying base64.
fn retagged_header(header: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(header.len());
    let mut skipping = false;
    for line in header.split_inclusive(|&b| b == b'\n') {
        let continuation = matches!(line.first(), Some(b' ' | b'\t'));
        if !continuation {
            skipping = line.len() > 26 && line[..26].eq_ignore_ascii_case(b"content-transfer-encoding:");
            if skipping {
                out.extend_from_slice(b"Content-Transfer-Encoding: base64\r\n");
            }
        }
        if !skipping {
            out.extend_from_slice(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_parts_are_stored_as_base64_and_decoded_back() {
        let raw = b"From: a@b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n\r\n\0-\xe4\r\n";
        let stored = for_storage(raw);
        let text = String::from_utf8(stored.to_vec()).unwrap();
        assert!(text.contains("Content-Transfer-Encoding: base64\r\n\r\nAC3kDQo=\r\n"), "{text}");
        let parsed = mime::parse(&stored);
        assert_eq!(decoded(&stored, &parsed.root, &[1]).unwrap().as_ref(), b"\0-\xe4\r\n");
        assert!(matches!(value(b"\0".to_vec()), NString8::Literal8(_)));
        let plain = b"Subject: x\r\n\r\nhi\r\n";
        assert!(matches!(for_storage(plain), Cow::Borrowed(_)));
    }
}
