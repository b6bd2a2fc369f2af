//! LIST and LSUB (RFC 3501 §6.3.8–6.3.9) with SPECIAL-USE attributes (RFC 6154 §2) and
//! \HasChildren / \HasNoChildren (RFC 3348). `*` matches anything, `%` anything but the
//! hierarchy delimiter `/`. Only the logged-in user's mailboxes are ever listed. Names are
//! matched as UTF-8 and sent in modified UTF-7 (RFC 3501 §5.1.3); the wildcards are ASCII, so
//! decoding the reference and pattern first matches what the user sees.

use imap_next::imap_types::core::{Atom, QuotedChar};
use imap_next::imap_types::flag::FlagNameAttribute;
use imap_next::imap_types::mailbox::{ListMailbox, Mailbox};
use imap_next::imap_types::response::Data;
use nightmail_store::SpecialUse;
use nightmail_types::utf7;

use super::Done;
use crate::ImapError;
use crate::session::Session;

const DELIMITER: char = '/';

fn attribute(name: &'static str) -> FlagNameAttribute<'static> {
    FlagNameAttribute::from(Atom::unvalidated(name))
}

/// RFC 3501 §6.3.8 wildcard matching, iterative so a hostile pattern costs at most
/// pattern × name steps.
pub(crate) fn matches(pattern: &[u8], name: &[u8]) -> bool {
    // table[j]: pattern[..i] matches name[..j]
    let mut table = vec![false; name.len() + 1];
    table[0] = true;
    for &p in pattern {
        let mut next = vec![false; name.len() + 1];
        match p {
            b'*' | b'%' => {
                for j in 0..=name.len() {
                    next[j] = table[j] || (j > 0 && next[j - 1] && (p == b'*' || name[j - 1] != DELIMITER as u8));
                }
            }
            c => {
                for j in 1..=name.len() {
                    next[j] = table[j - 1] && name[j - 1] == c;
                }
            }
        }
        table = next;
    }
    table[name.len()]
}

/// The pattern as UTF-8; `None` when it is not modified UTF-7, so that it matches no name
/// (every stored name encodes to valid modified UTF-7). Dovecot answers such a LIST with OK.
fn pattern_text(m: &ListMailbox<'_>, utf8: bool) -> Option<Vec<u8>> {
    let wire = match m {
        ListMailbox::Token(t) => t.as_ref(),
        ListMailbox::String(s) => s.as_ref(),
    };
    decode(wire, utf8)
}

/// A name or pattern from the wire as UTF-8 (RFC 6855 §3 once UTF8=ACCEPT is enabled).
fn decode(wire: &[u8], utf8: bool) -> Option<Vec<u8>> {
    match utf8 {
        true => std::str::from_utf8(wire).ok().map(|s| s.as_bytes().to_vec()),
        false => utf7::decode(wire).ok().map(String::into_bytes),
    }
}

/// RFC 3501 §6.3.9: LSUB with `%` names "foo" with \Noselect when "foo/bar" is subscribed but
/// "foo" is not. The ancestors of `name` (at each delimiter) that `pattern` matches.
fn matching_ancestors<'n>(pattern: &[u8], name: &'n str) -> impl Iterator<Item = &'n str> {
    name.match_indices(DELIMITER).map(move |(i, _)| &name[..i]).filter(move |a| matches(pattern, a.as_bytes()))
}

pub(crate) fn run(
    s: &mut Session,
    reference: Mailbox<'static>,
    pattern: ListMailbox<'static>,
    lsub: bool,
) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let done = || Ok(Done::ok(if lsub { "LSUB completed" } else { "LIST completed" }));
    let reference = match &reference {
        Mailbox::Inbox => Some(b"INBOX".to_vec()),
        Mailbox::Other(o) => decode(o.inner().as_ref(), s.utf8),
    };
    let (Some(reference), Some(pattern)) = (reference, pattern_text(&pattern, s.utf8)) else { return done() };
    let make = |items, mailbox| {
        if lsub {
            Data::Lsub { items, delimiter: Some(QuotedChar::unvalidated(DELIMITER)), mailbox }
        } else {
            Data::List { items, delimiter: Some(QuotedChar::unvalidated(DELIMITER)), mailbox }
        }
    };
    if pattern.is_empty() {
        // §6.3.8: an empty pattern asks for the delimiter and the root of the reference.
        let root = Mailbox::try_from(String::new()).unwrap_or(Mailbox::Inbox);
        s.data(make(vec![FlagNameAttribute::Noselect], root));
        return done();
    }
    let mut full = reference;
    full.extend_from_slice(&pattern);
    let mailboxes = s.shared.store.mailboxes(&user.name)?;
    let names: Vec<&str> = mailboxes.iter().map(|m| m.name.as_str()).collect();
    let mut out = Vec::new();
    let mut noselect: Vec<&str> = Vec::new();
    for mailbox in &mailboxes {
        if lsub && mailbox.subscribed && full.contains(&b'%') {
            for ancestor in matching_ancestors(&full, &mailbox.name) {
                let subscribed = mailboxes.iter().any(|m| m.name == ancestor && m.subscribed);
                if !subscribed && !noselect.contains(&ancestor) {
                    noselect.push(ancestor);
                }
            }
        }
        if lsub && !mailbox.subscribed {
            continue;
        }
        let candidate = mailbox.name.as_bytes();
        let hit = if mailbox.name == "INBOX" {
            matches(&full.to_ascii_uppercase(), candidate) || matches(&full, candidate)
        } else {
            matches(&full, candidate)
        };
        if !hit {
            continue;
        }
        let prefix = format!("{}{DELIMITER}", mailbox.name);
        let mut items = vec![if names.iter().any(|n| n.starts_with(&prefix)) {
            attribute("HasChildren")
        } else {
            attribute("HasNoChildren")
        }];
        if let Some(role) = SpecialUse::of_name(&mailbox.name) {
            items.push(attribute(role.name()));
        }
        if let Some(name) = super::wire_name(s, &mailbox.name) {
            out.push(make(items, name));
        }
    }
    for ancestor in noselect {
        if let Some(name) = super::wire_name(s, ancestor) {
            out.push(make(vec![FlagNameAttribute::Noselect], name));
        }
    }
    for data in out {
        s.data(data);
    }
    done()
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn wildcards() {
        assert!(matches(b"*", b"a/b/c"));
        assert!(matches(b"%", b"INBOX"));
        assert!(!matches(b"%", b"a/b"));
        assert!(matches(b"a/%", b"a/b"));
        assert!(matches(b"S*t", b"Sent"));
        assert!(!matches(b"Sent", b"Drafts"));
        let hostile = vec![b'*'; 200];
        assert!(matches(&hostile, &[b'a'; 500]));
    }
}
