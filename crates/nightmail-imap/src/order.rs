//! What SORT and THREAD compare (RFC 5256): the base subject (§2.1), the sent date (§2.2), the
//! first address of From, To and Cc (§3), the display form of the first From and To (RFC 5957
//! §3, for SORT=DISPLAY), and for threading the Message-ID, References and
//! In-Reply-To. Read from the header with mail-parser under `catch_unwind`, as `mime` does.

use std::panic::{AssertUnwindSafe, catch_unwind};

use mail_parser::{Address, HeaderValue, MessageParser};

use crate::mime;

/// One message's sort and thread keys.
#[derive(Clone, Debug, Default)]
pub struct Keys {
    /// §2.1 base subject, upper-cased for i;ascii-casemap comparison.
    pub subject: String,
    /// Whether extracting the base subject removed a reply or forward marker (§2.1, for
    /// THREAD=REFERENCES §4 step 5).
    pub reply: bool,
    /// §2.2 sent date in seconds since the epoch: the Date header in UTC, else the internal date.
    pub sent: i64,
    /// addr-mailbox of the first From, To and Cc address, upper-cased (§3 FROM, TO, CC).
    pub from: String,
    pub to: String,
    pub cc: String,
    /// RFC 5957 §3: the display name of the first From and To address, else its addr-spec,
    /// upper-cased (§4: compared as FROM and TO are, with i;ascii-casemap).
    pub display_from: String,
    pub display_to: String,
    /// The Message-ID without angle brackets.
    pub message_id: Option<String>,
    /// References, else the first In-Reply-To: the ancestors, oldest first (RFC 5256 §4 step 1A).
    pub references: Vec<String>,
}

/// What `of` takes from the first address (RFC 5256 §3, RFC 5957 §3): a group's first entry is
/// its start marker, whose mailbox is the group's name (RFC 3501 §7.4.2). Upper-cased.
fn first(address: Option<&Address<'_>>, of: impl Fn(&mail_parser::Addr<'_>) -> Option<String>) -> String {
    let first = match address {
        None => None,
        Some(Address::List(list)) => list.first().and_then(&of),
        Some(Address::Group(groups)) => groups.first().and_then(|g| match &g.name {
            Some(name) => Some(name.to_string()),
            None => g.addresses.first().and_then(&of),
        }),
    };
    first.unwrap_or_default().to_ascii_uppercase()
}

/// addr-mailbox of the first address as ENVELOPE gives it (RFC 5256 §3 FROM).
fn first_mailbox(address: Option<&Address<'_>>) -> String {
    first(address, |a| a.address.as_deref().map(|a| a.rsplit_once('@').map_or(a, |(local, _)| local).to_string()))
}

/// RFC 5957 §3: the first address's display-name (RFC 2047-decoded by mail-parser) when it is
/// there and not empty, else its addr-spec.
fn first_display(address: Option<&Address<'_>>) -> String {
    first(address, |a| match a.name.as_deref().map(str::trim) {
        Some(name) if !name.is_empty() => Some(name.to_string()),
        _ => a.address.as_deref().map(str::to_string),
    })
}

fn ids(value: &HeaderValue<'_>) -> Vec<String> {
    match value {
        HeaderValue::Text(t) => vec![t.to_string()],
        HeaderValue::TextList(list) => list.iter().map(|t| t.to_string()).collect(),
        _ => vec![],
    }
}

impl Keys {
    /// The keys of the message whose bytes are `raw`; `internal_secs` stands in for a missing or
    /// unreadable Date.
    pub fn read(raw: &[u8], internal_secs: i64) -> Keys {
        let header = &raw[..mime::header_end(raw)];
        let keys = catch_unwind(AssertUnwindSafe(|| {
            let m = MessageParser::default().parse_headers(header)?;
            let mut references = ids(m.references());
            if references.is_empty() {
                references = ids(m.in_reply_to()).into_iter().take(1).collect();
            }
            let (subject, reply) = base_subject_of(m.subject().unwrap_or_default());
            Some(Keys {
                subject,
                reply,
                sent: m.date().map_or(internal_secs, |d| d.to_timestamp()),
                from: first_mailbox(m.from()),
                to: first_mailbox(m.to()),
                cc: first_mailbox(m.cc()),
                display_from: first_display(m.from()),
                display_to: first_display(m.to()),
                message_id: m.message_id().map(str::to_string),
                references,
            })
        }));
        keys.ok().flatten().unwrap_or(Keys { sent: internal_secs, ..Keys::default() })
    }
}

/// `[` *BLOBCHAR `]` *WSP at the start of `s`: the length taken, if there is one (§5 subj-blob).
fn blob(s: &str) -> Option<usize> {
    let rest = s.strip_prefix('[')?;
    let end = rest.find([']', '['])?;
    if rest.as_bytes()[end] != b']' {
        return None;
    }
    let after = &rest[end + 1..];
    Some(1 + end + 1 + (after.len() - after.trim_start().len()))
}

/// `*subj-blob ("re" / "fw" / "fwd") *WSP [subj-blob] ":"` at the start of `s` (§5 subj-refwd
/// with its leading blobs): the length taken.
fn refwd(s: &str) -> Option<usize> {
    let mut at = 0;
    while let Some(n) = blob(&s[at..]) {
        at += n;
    }
    let lower = s[at..].to_ascii_lowercase();
    let word = ["fwd", "fw", "re"].into_iter().find(|w| lower.starts_with(w))?;
    at += word.len();
    at += s[at..].len() - s[at..].trim_start().len();
    if let Some(n) = blob(&s[at..]) {
        at += n;
    }
    s[at..].starts_with(':').then_some(at + 1)
}

/// RFC 5256 §2.1: the subject without reply and forward markers, list tags and "(fwd)" trailers,
/// whitespace runs folded to one space, upper-cased (the comparison is i;ascii-casemap).
#[cfg(test)]
pub fn base_subject(subject: &str) -> String {
    base_subject_of(subject).0
}

/// The base subject, and whether a reply or forward marker was taken off (§2.1: a subj-refwd in
/// step 3, "(fwd)" in step 2, "[fwd:" in step 6).
pub fn base_subject_of(subject: &str) -> (String, bool) {
    let mut reply = false;
    // (1) mail-parser has decoded the encoded words; fold whitespace.
    let mut s: String = subject.split_whitespace().collect::<Vec<_>>().join(" ");
    loop {
        // (2) trailing "(fwd)" and whitespace.
        loop {
            let trimmed = s.trim_end();
            let cut = trimmed.len() >= 5 && trimmed[trimmed.len() - 5..].eq_ignore_ascii_case("(fwd)");
            reply |= cut;
            let next = if cut { &trimmed[..trimmed.len() - 5] } else { trimmed };
            if next.len() == s.len() {
                break;
            }
            s = next.to_string();
        }
        // (3)-(5) leading "Re:", "Fwd:", blobs, and whitespace.
        loop {
            let trimmed = s.trim_start();
            let mut next = trimmed;
            if let Some(n) = refwd(next) {
                reply = true;
                next = &next[n..];
            } else if let Some(n) = blob(next)
                && !next[n..].is_empty()
            {
                next = &next[n..];
            }
            if next.len() == s.len() {
                break;
            }
            s = next.to_string();
        }
        // (6) "[fwd: ...]" around the rest.
        let lower = s.to_ascii_lowercase();
        if lower.starts_with("[fwd:") && s.ends_with(']') {
            s = s[5..s.len() - 1].to_string();
            reply = true;
            continue;
        }
        break;
    }
    (s.to_ascii_uppercase(), reply)
}

#[cfg(test)]
mod tests {
    use super::base_subject;

    #[test]
    fn base_subjects_per_rfc_5256() {
        assert_eq!(base_subject("Re: hello"), "HELLO");
        assert_eq!(base_subject("RE: Fwd: [list] Re:  hello   world (fwd)"), "HELLO WORLD");
        assert_eq!(base_subject("[fwd: Re: hi]"), "HI");
        assert_eq!(base_subject("Re[2]: hi"), "HI");
        assert_eq!(base_subject("[blob]"), "[BLOB]", "a blob that is all there is stays");
        assert_eq!(base_subject("Reply to this"), "REPLY TO THIS");
        assert_eq!(base_subject(""), "");
    }
}
