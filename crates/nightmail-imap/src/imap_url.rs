//! IMAP URLs (RFC 5092) that name one message, or one part of it: what CATENATE's `URL` parts
//! (RFC 4469 §3) point at. The URL is only taken apart here; `command/catenate.rs` checks that it
//! names this server and this user, and reads the message.
//!
//! RFC 5092 §11 (the forms that name a message part; URLAUTH, RFC 4467, is not offered):
//!
//! ```abnf
//! imapurl        = "imap://" iserver ipath-query
//! iserver        = [iuserinfo "@"] host [":" port]
//! iuserinfo      = enc-user [iauth] / [enc-user] iauth
//! iauth          = ";AUTH=" ( "*" / enc-auth-type )
//! imessagepart   = imailbox-ref iuid [isection] [ipartial] [iurlauth]
//! imailbox-ref   = enc-mailbox [uidvalidity]
//! uidvalidity    = ";UIDVALIDITY=" nz-number
//! iuid           = "/" iuid-only           iuid-only     = ";UID=" nz-number
//! isection       = "/" isection-only       isection-only = ";SECTION=" enc-section
//! ipartial       = "/" ipartial-only       ipartial-only = ";PARTIAL=" partial-range
//! partial-range  = number ["." nz-number]
//! imapurl-rel    = inetwork-path / iabsolute-path / irelative-path
//! inetwork-path  = "//" iserver [ipath-query]
//! iabsolute-path = "/" [icommand]
//! irelative-path = imsg-or-part / ...      ; iuid-only ["/" isection-only] ["/" ipartial-only]
//! ```
//!
//! A relative URL is resolved against the session's server (`imap://user@host/`, RFC 4469 §3),
//! and one that starts at `;UID=` against the selected mailbox (RFC 5092 §7.2). Keywords are
//! matched without regard to case (RFC 5092 §4, as in every IMAP keyword); `enc-*` parts are
//! percent-decoded (RFC 3986 §2.1) and mailbox names are UTF-8 (RFC 5092 §3.2).

use std::num::NonZeroU32;

use percent_encoding::percent_decode_str;

/// The server part of an absolute URL (`iserver`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Server {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

/// RFC 5092 `partial-range`: `origin` octets skipped, then at most `length` (to the end without).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Partial {
    pub origin: u32,
    pub length: Option<NonZeroU32>,
}

/// An IMAP URL naming one message (`;UID=`) and perhaps a section and a range of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MessageUrl {
    /// `None`: a relative URL, on the session's own server and user.
    pub server: Option<Server>,
    /// `None`: the selected mailbox (`irelative-path` from `;UID=`).
    pub mailbox: Option<String>,
    pub uid_validity: Option<NonZeroU32>,
    pub uid: NonZeroU32,
    /// The `section-text` of a BODY[section] (RFC 3501 §6.4.5), decoded; imap-codec parses it.
    pub section: Option<String>,
    pub partial: Option<Partial>,
}

fn strip_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes()))
        .then(|| &s[prefix.len()..])
}

fn find_ci(s: &str, needle: &str) -> Option<usize> {
    s.as_bytes().windows(needle.len()).position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// RFC 3986 §2.1: `%XX` escapes undone; the result must be UTF-8 (RFC 5092 §3.2).
fn decode(s: &str) -> Result<String, &'static str> {
    percent_decode_str(s).decode_utf8().map(|d| d.into_owned()).map_err(|_| "a percent-encoded part is not UTF-8")
}

/// RFC 5092 `nz-number`: digits, no leading zero, within 32 bits.
fn nz_number(s: &str) -> Result<NonZeroU32, &'static str> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.starts_with('0') {
        return Err("a UID or UIDVALIDITY is not a positive number");
    }
    s.parse().map_err(|_| "a number is too large")
}

/// Takes `url` apart; the error says why it names no message part.
pub(crate) fn parse(url: &str) -> Result<MessageUrl, &'static str> {
    if find_ci(url, ";URLAUTH=").is_some() || find_ci(url, ";EXPIRE=").is_some() {
        return Err("URLAUTH (RFC 4467) is not offered");
    }
    let (server, path) = if let Some(rest) = strip_ci(url, "imap://").or_else(|| url.strip_prefix("//")) {
        let (authority, path) = rest.split_once('/').ok_or("the URL names no message")?;
        (Some(server(authority)?), Some(path))
    } else if let Some(path) = url.strip_prefix('/') {
        (None, Some(path))
    } else {
        (None, None)
    };
    let (mailbox, uid_validity, tail) = match path {
        // Relative to the selected mailbox: the URL starts at `;UID=`.
        None => (None, None, url),
        Some(path) => {
            let at = find_ci(path, "/;UID=").ok_or("the URL names no message (;UID= is missing)")?;
            let (mailbox_ref, tail) = (&path[..at], &path[at + 1..]);
            let (enc_mailbox, uid_validity) = match find_ci(mailbox_ref, ";UIDVALIDITY=") {
                Some(i) => (&mailbox_ref[..i], Some(nz_number(&mailbox_ref[i + ";UIDVALIDITY=".len()..])?)),
                None => (mailbox_ref, None),
            };
            // `bchar` has no ";": a mailbox name's own semicolons are percent-encoded.
            if enc_mailbox.is_empty() || enc_mailbox.contains(';') {
                return Err("the URL's mailbox name is missing or malformed");
            }
            (Some(decode(enc_mailbox)?), uid_validity, tail)
        }
    };
    let mut segments = tail.strip_prefix(';').ok_or("the URL names no message (;UID= is missing)")?.split("/;");
    let uid = strip_ci(segments.next().unwrap_or_default(), "UID=").ok_or("the URL names no message")?;
    let mut found = MessageUrl { server, mailbox, uid_validity, uid: nz_number(uid)?, section: None, partial: None };
    for segment in segments {
        if let Some(section) =
            strip_ci(segment, "SECTION=").filter(|_| found.section.is_none() && found.partial.is_none())
        {
            let section = decode(section)?;
            if section.is_empty() {
                return Err("an empty ;SECTION=");
            }
            found.section = Some(section);
        } else if let Some(range) = strip_ci(segment, "PARTIAL=").filter(|_| found.partial.is_none()) {
            let (origin, length) = match range.split_once('.') {
                Some((origin, length)) => (origin, Some(nz_number(length)?)),
                None => (range, None),
            };
            if origin.is_empty() || !origin.bytes().all(|b| b.is_ascii_digit()) {
                return Err("a ;PARTIAL= origin is not a number");
            }
            found.partial = Some(Partial { origin: origin.parse().map_err(|_| "a number is too large")?, length });
        } else {
            return Err("the URL has a part other than ;SECTION= and ;PARTIAL= after ;UID=, or one twice");
        }
    }
    Ok(found)
}

/// `iserver`: `[enc-user [";AUTH=" type] "@"] host [":" port]`.
fn server(authority: &str) -> Result<Server, &'static str> {
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => (Some(userinfo), hostport),
        None => (None, authority),
    };
    let user = match userinfo {
        None => None,
        Some(info) => {
            let (user, auth) = match find_ci(info, ";AUTH=") {
                Some(i) => (&info[..i], Some(&info[i + ";AUTH=".len()..])),
                None => (info, None),
            };
            if auth.is_some_and(str::is_empty) || (user.is_empty() && auth.is_none()) {
                return Err("the URL's user part is malformed");
            }
            (!user.is_empty()).then(|| decode(user)).transpose()?
        }
    };
    // An IPv6 literal keeps its brackets off; its colons are not the port's.
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']').ok_or("the URL's host is malformed")?;
            (host, rest.strip_prefix(':'))
        }
        None => match hostport.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        },
    };
    if host.is_empty() {
        return Err("the URL names no host");
    }
    let port = port.map(|p| p.parse::<u16>().map_err(|_| "the URL's port is not a number")).transpose()?;
    Ok(Server { user, host: decode(host)?, port })
}

#[cfg(test)]
mod tests {
    use super::{Partial, Server, parse};

    #[test]
    fn relative_and_absolute_forms() {
        let url = parse("/INBOX;UIDVALIDITY=385759045/;UID=20/;SECTION=1.2.HEADER/;PARTIAL=3.10").unwrap();
        assert_eq!(url.server, None);
        assert_eq!(url.mailbox.as_deref(), Some("INBOX"));
        assert_eq!(url.uid_validity.map(|v| v.get()), Some(385759045));
        assert_eq!((url.uid.get(), url.section.as_deref()), (20, Some("1.2.HEADER")));
        assert_eq!(url.partial, Some(Partial { origin: 3, length: std::num::NonZeroU32::new(10) }));
        let url = parse("/Entw%C3%BCrfe/a%3Bb/;uid=7/;section=HEADER.FIELDS%20(FROM)").unwrap();
        assert_eq!(url.mailbox.as_deref(), Some("Entwürfe/a;b"));
        assert_eq!(url.section.as_deref(), Some("HEADER.FIELDS (FROM)"));
        let url = parse("imap://me;AUTH=*@[::1]:1143/Sent/;UID=3").unwrap();
        assert_eq!(url.server, Some(Server { user: Some("me".into()), host: "::1".into(), port: Some(1143) }));
        let url = parse(";UID=4/;PARTIAL=100000").unwrap();
        assert_eq!((url.mailbox, url.uid.get()), (None, 4));
        assert_eq!(url.partial, Some(Partial { origin: 100000, length: None }));
    }

    #[test]
    fn urls_that_name_no_message_part_are_refused() {
        for bad in [
            "/INBOX",
            "/INBOX/;UID=0",
            "/INBOX;UIDVALIDITY=x/;UID=1",
            "/;UID=1",
            "/IN;BOX/;UID=1",
            "/INBOX/;UID=1/;SECTION=",
            "/INBOX/;UID=1/;PARTIAL=1/;SECTION=1",
            "/INBOX/;UID=1/;BOGUS=1",
            "/INBOX/;UID=1/;SECTION=1;URLAUTH=anonymous:internal:0123",
            "/INBOX/;UID=1/;PARTIAL=1.0",
            "imap://me@/INBOX/;UID=1",
            "imap://me@host:port/INBOX/;UID=1",
            "imap://host",
            "/%FF/;UID=1",
            "INBOX/;UID=1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
