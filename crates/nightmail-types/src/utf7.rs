//! Modified UTF-7, the wire form of IMAP mailbox names (RFC 3501 §5.1.3). The store keeps names
//! as UTF-8, as Dovecot does; IMAP converts at the edge, and the store's schema 5 migration
//! converted the names earlier builds kept in wire form.
//!
//! Printable US-ASCII other than `&` stands for itself; `&-` is `&`; any other run of characters
//! is `&`, their UTF-16 in modified base64 (RFC 2152 base64 with `,` for `/`, no padding), `-`.
//! Decoding is strict: a name is accepted only in the one form [`encode`] writes, so wire names
//! and stored names correspond one to one (no ASCII in base64, no two shifted runs in a row, no
//! stray bits, no unpaired surrogates, no 8-bit or control octets).

/// A mailbox name that is not valid modified UTF-7.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mailbox name is not valid modified UTF-7 (RFC 3501 §5.1.3)")]
pub struct InvalidUtf7;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+,";

fn stands_for_itself(c: char) -> bool {
    (' '..='~').contains(&c) && c != '&'
}

fn sextet(b: u8) -> Option<u32> {
    ALPHABET.iter().position(|&a| a == b).map(|p| p as u32)
}

/// The wire form of a UTF-8 mailbox name.
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut shifted: Vec<u16> = Vec::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '&' {
            out.push_str("&-");
        } else if stands_for_itself(c) {
            out.push(c);
        } else {
            shifted.clear();
            let mut units = [0u16; 2];
            shifted.extend_from_slice(c.encode_utf16(&mut units));
            while let Some(&next) = chars.peek() {
                if next == '&' || stands_for_itself(next) {
                    break;
                }
                shifted.extend_from_slice(next.encode_utf16(&mut units));
                chars.next();
            }
            out.push('&');
            base64(&shifted, &mut out);
            out.push('-');
        }
    }
    out
}

fn base64(units: &[u16], out: &mut String) {
    let (mut bits, mut count) = (0u32, 0u32);
    for &unit in units {
        bits = (bits << 16) | u32::from(unit);
        count += 16;
        while count >= 6 {
            count -= 6;
            out.push(ALPHABET[((bits >> count) & 63) as usize] as char);
        }
        bits &= (1 << count) - 1;
    }
    if count > 0 {
        out.push(ALPHABET[((bits << (6 - count)) & 63) as usize] as char);
    }
}

/// The UTF-8 name a wire-form mailbox name stands for.
pub fn decode(wire: &[u8]) -> Result<String, InvalidUtf7> {
    let mut out = String::with_capacity(wire.len());
    let mut i = 0;
    while i < wire.len() {
        let b = wire[i];
        if b != b'&' {
            if !stands_for_itself(b as char) {
                return Err(InvalidUtf7);
            }
            out.push(b as char);
            i += 1;
            continue;
        }
        let end = i + 1 + wire[i + 1..].iter().position(|&b| b == b'-').ok_or(InvalidUtf7)?;
        let run = &wire[i + 1..end];
        if run.is_empty() {
            out.push('&');
        } else {
            let (mut bits, mut count, mut units) = (0u32, 0u32, Vec::with_capacity(run.len() * 6 / 16));
            for &b in run {
                bits = (bits << 6) | sextet(b).ok_or(InvalidUtf7)?;
                count += 6;
                if count >= 16 {
                    count -= 16;
                    units.push((bits >> count) as u16);
                    bits &= (1 << count) - 1;
                }
            }
            // Fewer than six bits may be left over, and they must be zero (RFC 2152).
            if count >= 6 || bits != 0 {
                return Err(InvalidUtf7);
            }
            for c in char::decode_utf16(units) {
                out.push(c.map_err(|_| InvalidUtf7)?);
            }
        }
        i = end + 1;
    }
    // Only the form `encode` writes: this rejects ASCII in base64 and two shifted runs in a row.
    if encode(&out).as_bytes() != wire {
        return Err(InvalidUtf7);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_3501_examples_and_common_names_round_trip() {
        for (utf8, wire) in [
            // RFC 3501 §5.1.3's own example.
            ("~peter/mail/台北/日本語", "~peter/mail/&U,BTFw-/&ZeVnLIqe-"),
            ("Entwürfe", "Entw&APw-rfe"),
            ("Ä", "&AMQ-"),
            ("&", "&-"),
            ("Tom & Jerry", "Tom &- Jerry"),
            ("Отправленные", "&BB4EQgQ,BEAEMAQyBDsENQQ9BD0ESwQ1-"),
            ("théâtre", "th&AOkA4g-tre"),
            ("📬 post", "&2D3c7A- post"),
            ("INBOX", "INBOX"),
            ("", ""),
        ] {
            assert_eq!(encode(utf8), wire, "{utf8}");
            assert_eq!(decode(wire.as_bytes()).as_deref(), Ok(utf8), "{wire}");
        }
    }

    #[test]
    fn invalid_modified_utf7_is_refused() {
        for wire in [
            &b"&"[..],          // no end of the shift
            b"&AMQ",            // no '-'
            b"&Jjo!-",          // '!' is not modified base64
            b"&AGE-",           // ASCII 'a' in base64
            b"&AOQ-&APY-",      // two shifted runs in a row ("&AOQA9g-" is the form)
            b"&AMQA-",          // eight bits left over
            b"&AMR-",           // non-zero leftover bits
            b"&2D0-",           // an unpaired high surrogate
            b"&3cQ-",           // an unpaired low surrogate
            b"&A-",             // six bits: no whole UTF-16 unit
            b"Entw\xc3\xbcrfe", // 8-bit UTF-8 on the wire
            b"tab\there",       // a control character must be shifted
            b"a/b/c&",
        ] {
            assert_eq!(decode(wire), Err(InvalidUtf7), "{}", String::from_utf8_lossy(wire));
        }
    }

    #[test]
    fn every_name_round_trips() {
        let samples = ["a\u{0}b", "\u{7f}", "-&-", "&&", "ü&ü", "a,b+c", "日本&語", "\u{10FFFF}", "x\r\ny"];
        for name in samples {
            let wire = encode(name);
            assert!(wire.bytes().all(|b| (0x20..0x7f).contains(&b)), "{wire}");
            assert_eq!(decode(wire.as_bytes()).as_deref(), Ok(name), "{wire}");
        }
        // Every character below U+0800 and a stride above, alone and between ASCII.
        for code in (0..0x800).chain((0x800..0x11_0000).step_by(97)) {
            let Some(c) = char::from_u32(code) else { continue };
            for name in [c.to_string(), format!("a{c}{c}b")] {
                assert_eq!(decode(encode(&name).as_bytes()).as_deref(), Ok(name.as_str()));
            }
        }
    }
}
