//! LIST-EXTENDED (RFC 5258) and LIST-STATUS (RFC 5819): the grammar of the extended LIST command.
//!
//! imap-codec 2.0.0-alpha.10 parses only RFC 3501's `LIST mailbox list-mailbox` (its
//! `ext_list_extended` has the response items alone), so a LIST with selection options, several
//! patterns or a RETURN clause reaches the session as a command imap-codec refused. This module
//! takes that command apart along RFC 5258 §6 (with RFC 5819 §4's `status-option` and RFC 6154
//! §6's SPECIAL-USE options):
//!
//! ```abnf
//! list             = "LIST" [SP list-select-opts] SP mailbox SP mbox-or-pat [SP list-return-opts]
//! list-select-opts = "(" [(*(list-select-mod-opt SP) list-select-base-opt *(SP list-select-opt))
//!                         / (list-select-independent-opt *(SP list-select-independent-opt))] ")"
//! list-select-base-opt        = "SUBSCRIBED" / option-extension   ; RFC 6154: "SPECIAL-USE"
//! list-select-mod-opt         = "RECURSIVEMATCH" / option-extension
//! list-select-independent-opt = "REMOTE" / option-extension
//! mbox-or-pat      = list-mailbox / patterns
//! patterns         = "(" list-mailbox *(SP list-mailbox) ")"
//! list-return-opts = "RETURN" SP "(" [return-option *(SP return-option)] ")"
//! return-option    = "SUBSCRIBED" / "CHILDREN" / status-option / option-extension
//! status-option    = "STATUS" SP "(" status-att *(SP status-att) ")"    ; RFC 5819 §4
//! ```
//!
//! and has imap-codec parse every piece it has a grammar for: the reference and each pattern as a
//! plain `LIST reference pattern`, the status items as `STATUS INBOX (items)`. Only the token
//! boundaries (a quoted string, or a run of `list-char`s) are found here. Options this server
//! does not know get BAD, as §3 requires ("MUST return a tagged BAD response"), and so does
//! RECURSIVEMATCH without a base option (§3: it "MUST NOT occur as the only selection option").
//! A literal among the arguments arrives whole: imap-next asks for it and reads it before
//! imap-codec refuses the command.

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_next::imap_types::command::CommandBody;
use imap_next::imap_types::core::Tag;
use imap_next::imap_types::mailbox::{ListMailbox, Mailbox};
use imap_next::imap_types::status::StatusDataItemName;

/// RFC 5258 §3 selection options: which mailboxes are listed. REMOTE is accepted and changes
/// nothing (this server has no remote mailboxes, §3 "REMOTE").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selection {
    /// Only subscribed mailboxes, each with `\Subscribed` (§3 "SUBSCRIBED").
    pub subscribed: bool,
    /// Only mailboxes with a special use (RFC 6154 §3).
    pub special_use: bool,
    /// Also parents that match a pattern and have a descendant meeting the criteria that does
    /// not, with CHILDINFO (§3 "RECURSIVEMATCH"); only with one of the two above.
    pub recursive: bool,
}

impl Selection {
    /// Whether a base option narrows the list (RECURSIVEMATCH needs one).
    pub fn narrows(&self) -> bool {
        self.subscribed || self.special_use
    }
}

/// RFC 5258 §3 return options: what is said about each listed mailbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Returns {
    /// `\Subscribed` on subscribed mailboxes (§3 "SUBSCRIBED").
    pub subscribed: bool,
    /// RFC 5819: a STATUS response after each selectable mailbox listed.
    pub status: Option<Vec<StatusDataItemName>>,
}

/// A LIST command, plain (RFC 3501 §6.3.8) or extended (RFC 5258).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListRequest {
    pub reference: Mailbox<'static>,
    pub patterns: Vec<ListMailbox<'static>>,
    pub select: Selection,
    pub returns: Returns,
    /// RFC 5258 syntax was used: a hierarchy level that is no mailbox is `\NonExistent` (§3),
    /// and CHILDINFO may be sent.
    pub extended: bool,
}

impl ListRequest {
    /// A plain LIST of one pattern (RFC 3501 §6.3.8).
    pub fn plain(reference: Mailbox<'static>, pattern: ListMailbox<'static>) -> ListRequest {
        ListRequest {
            reference,
            patterns: vec![pattern],
            select: Selection::default(),
            returns: Returns::default(),
            extended: false,
        }
    }
}

/// An extended LIST command taken apart, or why it is BAD.
pub(crate) struct ExtendedList {
    pub tag: Tag<'static>,
    pub request: Result<ListRequest, String>,
}

pub(crate) fn strip_prefix_ci<'b>(bytes: &'b [u8], prefix: &[u8]) -> Option<&'b [u8]> {
    (bytes.len() >= prefix.len() && bytes[..prefix.len()].eq_ignore_ascii_case(prefix)).then(|| &bytes[prefix.len()..])
}

/// `tag SP "LIST" SP ...`, or `None` when `bytes` is not a LIST command.
pub(crate) fn recognise(bytes: &[u8]) -> Option<ExtendedList> {
    let space = bytes.iter().position(|&b| b == b' ')?;
    let tag = Tag::try_from(String::from_utf8(bytes[..space].to_vec()).ok()?).ok()?;
    let rest = strip_prefix_ci(&bytes[space + 1..], b"LIST ")?;
    Some(ExtendedList { tag, request: parse(rest) })
}

/// `s` begins with a space; what follows it.
fn sp(s: &[u8]) -> Result<&[u8], String> {
    s.strip_prefix(b" ").ok_or_else(|| "syntax error in LIST: a space was expected".to_string())
}

/// One `mailbox` or `list-mailbox` (RFC 3501 §9): a quoted string or a run of list-chars. Its
/// contents are imap-codec's to judge; here only where it ends.
pub(crate) fn token(s: &[u8]) -> Result<(&[u8], &[u8]), String> {
    match s.first() {
        Some(b'"') => {
            let mut i = 1;
            while let Some(&c) = s.get(i) {
                match c {
                    b'\\' => i += 2,
                    b'"' => return Ok((&s[..=i], &s[i + 1..])),
                    b'\r' | b'\n' => break,
                    _ => i += 1,
                }
            }
            Err("syntax error: an unterminated quoted string".into())
        }
        Some(b'{') => {
            // RFC 3501 §4.3 literal, RFC 7888 `{n+}` / `{n-}`: imap-next has read its bytes.
            let close = s.iter().position(|&c| c == b'}').ok_or("syntax error: a literal's '}' is missing")?;
            let digits = std::str::from_utf8(&s[1..close]).unwrap_or("").trim_end_matches(['+', '-']);
            let n: usize = digits.parse().map_err(|_| "syntax error: a literal's length")?;
            let end = close + 3 + n;
            if s.get(close + 1..close + 3) != Some(&b"\r\n"[..]) || s.len() < end {
                return Err("syntax error: a literal is cut short".into());
            }
            Ok(s.split_at(end))
        }
        _ => {
            let end = s.iter().position(|&c| matches!(c, b' ' | b'(' | b')' | b'\r' | b'\n')).unwrap_or(s.len());
            if end == 0 {
                return Err("syntax error: a mailbox name or pattern was expected".into());
            }
            Ok(s.split_at(end))
        }
    }
}

/// The words of a parenthesised option list up to its `)`, and what follows it. An option with a
/// value (`option-value`, RFC 5258 §6) is only ever an extension this server does not know, so a
/// nested `(` is taken as one (the caller refuses it by name).
fn words(s: &[u8]) -> Result<(Vec<String>, &[u8]), String> {
    let close = s.iter().position(|&c| c == b')').ok_or("syntax error in LIST: a ')' is missing")?;
    let inside = std::str::from_utf8(&s[..close]).map_err(|_| "syntax error in LIST options")?;
    Ok((inside.split_ascii_whitespace().map(str::to_ascii_uppercase).collect(), &s[close + 1..]))
}

fn parse(s: &[u8]) -> Result<ListRequest, String> {
    let mut s = s;
    let mut select = Selection::default();
    if let Some(rest) = s.strip_prefix(b"(") {
        let (options, rest) = words(rest)?;
        for option in options {
            match option.as_str() {
                "SUBSCRIBED" => select.subscribed = true,
                "SPECIAL-USE" => select.special_use = true,
                "RECURSIVEMATCH" => select.recursive = true,
                "REMOTE" => {}
                other => return Err(format!("unknown LIST selection option {other} (RFC 5258 §3)")),
            }
        }
        if select.recursive && !select.narrows() {
            return Err("RECURSIVEMATCH needs SUBSCRIBED or SPECIAL-USE beside it (RFC 5258 §3)".into());
        }
        s = sp(rest)?;
    }
    let (reference, rest) = token(s)?;
    s = sp(rest)?;
    let mut patterns = Vec::new();
    if let Some(rest) = s.strip_prefix(b"(") {
        s = rest;
        loop {
            let (pattern, rest) = token(s)?;
            patterns.push(pattern);
            match rest.first() {
                Some(b' ') => s = &rest[1..],
                Some(b')') => {
                    s = &rest[1..];
                    break;
                }
                _ => return Err("syntax error in LIST: the patterns' ')' is missing".into()),
            }
        }
    } else {
        let (pattern, rest) = token(s)?;
        patterns.push(pattern);
        s = rest;
    }
    let mut returns = Returns::default();
    if let Some(rest) = strip_prefix_ci(s, b" RETURN (") {
        s = return_options(rest, &mut returns)?;
    }
    if s != b"\r\n" {
        return Err("syntax error at the end of LIST".into());
    }
    let patterns = patterns.into_iter().map(|p| codec_list(reference, p)).collect::<Result<Vec<_>, _>>()?;
    let reference = patterns.first().map(|(r, _)| r.clone()).unwrap_or(Mailbox::Inbox);
    Ok(ListRequest {
        reference,
        patterns: patterns.into_iter().map(|(_, p)| p).collect(),
        select,
        returns,
        extended: true,
    })
}

/// RFC 5258 §6 `list-return-opts` after `RETURN (`, up to and including its `)`.
fn return_options<'s>(mut s: &'s [u8], returns: &mut Returns) -> Result<&'s [u8], String> {
    loop {
        s = s.strip_prefix(b" ").unwrap_or(s);
        if let Some(rest) = s.strip_prefix(b")") {
            return Ok(rest);
        }
        let end = s.iter().position(|&c| matches!(c, b' ' | b'(' | b')' | b'\r' | b'\n')).unwrap_or(s.len());
        let option = String::from_utf8_lossy(&s[..end]).to_ascii_uppercase();
        s = &s[end..];
        match option.as_str() {
            // RFC 5258 §3: CHILDREN asks for \HasChildren / \HasNoChildren, which every LIST
            // here gives; RFC 6154 §3: SPECIAL-USE for the use attributes, likewise.
            "CHILDREN" | "SPECIAL-USE" => {}
            "SUBSCRIBED" => returns.subscribed = true,
            "STATUS" => {
                let rest = s.strip_prefix(b" (").ok_or("syntax error in LIST: STATUS needs its items in ( )")?;
                let close = rest.iter().position(|&c| c == b')').ok_or("syntax error in LIST: a ')' is missing")?;
                returns.status = Some(codec_status(&rest[..close])?);
                s = &rest[close + 1..];
            }
            "" => return Err("syntax error in LIST's RETURN options".into()),
            other => return Err(format!("unknown LIST return option {other} (RFC 5258 §3)")),
        }
    }
}

/// The reference and one pattern, as imap-codec reads them in a plain LIST.
fn codec_list(reference: &[u8], pattern: &[u8]) -> Result<(Mailbox<'static>, ListMailbox<'static>), String> {
    let mut line = b"x LIST ".to_vec();
    line.extend_from_slice(reference);
    line.push(b' ');
    line.extend_from_slice(pattern);
    line.extend_from_slice(b"\r\n");
    match CommandCodec::default().decode_static(&line) {
        Ok((_, command)) => match command.body {
            CommandBody::List { reference, mailbox_wildcard } => Ok((reference, mailbox_wildcard)),
            _ => Err("syntax error in LIST's mailbox or pattern".into()),
        },
        Err(_) => Err(format!("syntax error in LIST's mailbox or pattern {}", String::from_utf8_lossy(pattern))),
    }
}

/// RFC 5819 §4 `status-option`'s items, as imap-codec reads them in a STATUS command.
fn codec_status(items: &[u8]) -> Result<Vec<StatusDataItemName>, String> {
    let mut line = b"x STATUS INBOX (".to_vec();
    line.extend_from_slice(items);
    line.extend_from_slice(b")\r\n");
    match CommandCodec::default().decode_static(&line) {
        Ok((_, command)) => match command.body {
            CommandBody::Status { item_names, .. } => Ok(item_names.into_owned()),
            _ => Err("syntax error in LIST's STATUS items".into()),
        },
        Err(_) => Err(format!("unknown or malformed STATUS item in LIST: ({})", String::from_utf8_lossy(items))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Result<ListRequest, String> {
        recognise(line.as_bytes()).expect("a LIST").request
    }

    #[test]
    fn options_patterns_and_return_are_taken_apart() {
        let r = parsed("a list (subscribed RECURSIVEMATCH) \"\" (INBOX \"Sent\" a/%) RETURN (children STATUS (MESSAGES UNSEEN))\r\n")
            .unwrap();
        assert_eq!(r.select, Selection { subscribed: true, special_use: false, recursive: true });
        assert_eq!(r.patterns.len(), 3);
        assert_eq!(r.returns.status, Some(vec![StatusDataItemName::Messages, StatusDataItemName::Unseen]));
        let r = parsed("a LIST \"\" * RETURN (SUBSCRIBED)\r\n").unwrap();
        assert!(r.returns.subscribed && r.select == Selection::default() && r.extended);
        assert!(recognise(b"a LSUB \"\" *\r\n").is_none());
        let r = parsed("a LIST (REMOTE) {0}\r\n {5+}\r\nINBOX\r\n").unwrap();
        assert!(matches!(&r.patterns[..], [ListMailbox::String(p)] if p.as_ref() == b"INBOX"), "{:?}", r.patterns);
    }

    #[test]
    fn unknown_options_and_lone_recursivematch_are_refused() {
        for bad in [
            "a LIST (imaptest) \"\" \"\"\r\n",
            "a LIST (recursivematch) \"\" \"\"\r\n",
            "a LIST (recursivematch remote) \"\" \"\"\r\n",
            "a LIST \"\" \"\" return (imaptest)\r\n",
            "a LIST \"\" * RETURN (STATUS (BOGUS))\r\n",
            "a LIST \"\" * RETURN (STATUS)\r\n",
            "a LIST \"\" (INBOX\r\n",
            "a LIST \"\" {3}\r\nab\r\n",
            "a LIST \"\" * extra\r\n",
        ] {
            assert!(parsed(bad).is_err(), "{bad}");
        }
    }
}
