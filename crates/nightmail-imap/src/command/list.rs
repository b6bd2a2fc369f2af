//! LIST and LSUB (RFC 3501 §6.3.8–6.3.9) with SPECIAL-USE attributes (RFC 6154 §2) and
//! \HasChildren / \HasNoChildren (RFC 3348). `*` matches anything, `%` anything but the
//! hierarchy delimiter `/`. Only the logged-in user's mailboxes are ever listed. Names are
//! matched as UTF-8 and sent in modified UTF-7 (RFC 3501 §5.1.3); the wildcards are ASCII, so
//! decoding the reference and pattern first matches what the user sees.

use std::collections::BTreeMap;
use std::ops::Bound;

use imap_codec::ResponseCodec;
use imap_codec::encode::Encoder;
use imap_next::imap_types::core::{Atom, QuotedChar};
use imap_next::imap_types::flag::FlagNameAttribute;
use imap_next::imap_types::mailbox::{ListMailbox, Mailbox};
use imap_next::imap_types::response::{Data, Response};
use nightmail_store::{MailboxInfo, SpecialUse};
use nightmail_types::utf7;

use super::Done;
use super::list_extended::{ListRequest, Selection};
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

/// LIST (RFC 3501 §6.3.8) or LSUB (§6.3.9), as imap-codec parsed them.
pub(crate) fn run(
    s: &mut Session,
    reference: Mailbox<'static>,
    pattern: ListMailbox<'static>,
    lsub: bool,
) -> Result<Done, ImapError> {
    if !lsub {
        return list(s, &ListRequest::plain(reference, pattern));
    }
    let user = s.user()?.clone();
    let done = || Ok(Done::ok("LSUB completed"));
    let reference = match &reference {
        Mailbox::Inbox => Some(b"INBOX".to_vec()),
        Mailbox::Other(o) => decode(o.inner().as_ref(), s.utf8),
    };
    let (Some(reference), Some(pattern)) = (reference, pattern_text(&pattern, s.utf8)) else { return done() };
    let make = |items, mailbox| Data::Lsub { items, delimiter: Some(QuotedChar::unvalidated(DELIMITER)), mailbox };
    if pattern.is_empty() {
        let root = Mailbox::try_from(String::new()).unwrap_or(Mailbox::Inbox);
        s.data(make(vec![FlagNameAttribute::Noselect], root));
        return done();
    }
    let mut full = reference;
    full.extend_from_slice(&pattern);
    let mailboxes = s.shared.store.mailboxes(&user.name)?;
    let subscribed = s.shared.store.subscriptions(&user.name)?;
    let is_subscribed = |name: &str| subscribed.iter().any(|n| n == name);
    let mut out = Vec::new();
    let mut noselect: Vec<&str> = Vec::new();
    for name in &subscribed {
        if full.contains(&b'%') {
            for ancestor in matching_ancestors(&full, name) {
                if !is_subscribed(ancestor) && !noselect.contains(&ancestor) {
                    noselect.push(ancestor);
                }
            }
        }
        if !name_matches(&full, name) {
            continue;
        }
        // A subscription outlives its mailbox (RFC 9051 §6.3.7); LSUB names it \Noselect.
        let items = match mailboxes.iter().any(|m| m.name == *name) {
            false => vec![FlagNameAttribute::Noselect],
            true if has_children(mailboxes.iter().map(|m| m.name.as_str()), name) => vec![attribute("HasChildren")],
            true => vec![attribute("HasNoChildren")],
        };
        if let Some(wire) = super::wire_name(s, name) {
            out.push(make(items, wire));
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

/// RFC 3501 §6.3.8: INBOX is matched case-insensitively.
fn name_matches(pattern: &[u8], name: &str) -> bool {
    if name == "INBOX" {
        matches(&pattern.to_ascii_uppercase(), name.as_bytes()) || matches(pattern, name.as_bytes())
    } else {
        matches(pattern, name.as_bytes())
    }
}

fn has_children<'n>(mut names: impl Iterator<Item = &'n str>, name: &str) -> bool {
    names.any(|n| n.len() > name.len() + 1 && n.starts_with(name) && n.as_bytes()[name.len()] == DELIMITER as u8)
}

/// A name in the user's hierarchy: a mailbox, a level above one that is no mailbox, or a
/// subscribed name (which may outlive its mailbox, RFC 9051 §6.3.7) and the levels above it.
#[derive(Default)]
struct Node<'m> {
    mailbox: Option<&'m MailboxInfo>,
    /// Some mailbox lies below it.
    level: bool,
    subscribed: bool,
}

impl Node<'_> {
    fn subscribed(&self) -> bool {
        self.subscribed
    }

    /// The RFC 5258 §3 base options (as CHILDINFO names them) this name meets.
    fn meets(&self, name: &str, select: &Selection) -> Vec<&'static str> {
        let mut met = Vec::new();
        if select.subscribed && self.subscribed() {
            met.push("SUBSCRIBED");
        }
        if select.special_use && self.mailbox.is_some() && SpecialUse::of_name(name).is_some() {
            met.push("SPECIAL-USE");
        }
        met
    }

    /// Whether it passes the selection options themselves (every base option given).
    fn selected(&self, name: &str, select: &Selection) -> bool {
        let met = self.meets(name, select);
        (!select.subscribed || met.contains(&"SUBSCRIBED")) && (!select.special_use || met.contains(&"SPECIAL-USE"))
    }
}

/// LIST, plain (RFC 3501 §6.3.8) or extended (RFC 5258 §3, RFC 5819 LIST-STATUS). Every pattern
/// is matched against the user's mailboxes and the hierarchy levels above them that are no
/// mailbox; such a level is listed only for a `%` pattern (§6.3.8: "\Noselect"; RFC 5258 §3:
/// `\NonExistent`). Responses are encoded by imap-codec and written in order, since CHILDINFO
/// (RFC 5258 §3.5), which imap-types cannot carry, is added to the encoded line.
pub(crate) fn list(s: &mut Session, request: &ListRequest) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let done = || Ok(Done::ok("LIST completed"));
    let reference = match &request.reference {
        Mailbox::Inbox => Some(b"INBOX".to_vec()),
        Mailbox::Other(o) => decode(o.inner().as_ref(), s.utf8),
    };
    let Some(reference) = reference else { return done() };
    let patterns: Vec<Vec<u8>> = request.patterns.iter().filter_map(|p| pattern_text(p, s.utf8)).collect();
    if patterns.len() == 1 && patterns[0].is_empty() {
        // §6.3.8: an empty pattern asks for the delimiter and the root of the reference.
        let root = Mailbox::try_from(String::new()).unwrap_or(Mailbox::Inbox);
        s.data(Data::List {
            items: vec![FlagNameAttribute::Noselect],
            delimiter: Some(QuotedChar::unvalidated(DELIMITER)),
            mailbox: root,
        });
        return done();
    }
    let full: Vec<Vec<u8>> = patterns
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut full = reference.clone();
            full.extend_from_slice(&p);
            full
        })
        .collect();
    let mailboxes = s.shared.store.mailboxes(&user.name)?;
    let subscribed = s.shared.store.subscriptions(&user.name)?;
    let mut tree: BTreeMap<&str, Node> = BTreeMap::new();
    for mailbox in &mailboxes {
        for (i, _) in mailbox.name.match_indices(DELIMITER) {
            tree.entry(&mailbox.name[..i]).or_default().level = true;
        }
        tree.entry(&mailbox.name).or_default().mailbox = Some(mailbox);
    }
    for name in &subscribed {
        for (i, _) in name.match_indices(DELIMITER) {
            tree.entry(&name[..i]).or_default();
        }
        tree.entry(name).or_default().subscribed = true;
    }
    let hit = |name: &str| full.iter().any(|p| name_matches(p, name));
    let level_hit = |name: &str| full.iter().any(|p| p.contains(&b'%') && name_matches(p, name));
    let select = &request.select;
    let codec = ResponseCodec::default();
    for (&name, node) in &tree {
        let exists = node.mailbox.is_some();
        if !hit(name) {
            continue;
        }
        let prefix = format!("{name}{DELIMITER}");
        let below = || {
            tree.range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(&prefix))
        };
        // RFC 5258 §3 RECURSIVEMATCH: the base options some descendant meets that no pattern names.
        let mut childinfo: Vec<&'static str> = Vec::new();
        if select.recursive {
            for (&child, child_node) in below().filter(|(child, _)| !hit(child)) {
                for option in child_node.meets(child, select) {
                    if !childinfo.contains(&option) {
                        childinfo.push(option);
                    }
                }
            }
        }
        let selected =
            if select.narrows() { node.selected(name, select) } else { exists || (node.level && level_hit(name)) };
        if !selected && childinfo.is_empty() {
            continue;
        }
        // A subscription to a name that is gone makes no child (RFC 3348 counts mailboxes).
        let children = below().any(|(_, n)| n.mailbox.is_some());
        let mut items = Vec::new();
        if !exists {
            items.push(if request.extended { attribute("NonExistent") } else { FlagNameAttribute::Noselect });
        }
        if (select.subscribed || request.returns.subscribed) && node.subscribed() {
            items.push(attribute("Subscribed"));
        }
        items.push(if children { attribute("HasChildren") } else { attribute("HasNoChildren") });
        if exists && let Some(role) = SpecialUse::of_name(name) {
            items.push(attribute(role.name()));
        }
        let Some(wire) = super::wire_name(s, name) else { continue };
        let data = Data::List { items, delimiter: Some(QuotedChar::unvalidated(DELIMITER)), mailbox: wire.clone() };
        let mut line = codec.encode(&Response::Data(data)).dump();
        if request.extended && !childinfo.is_empty() {
            line.truncate(line.len() - 2);
            let options: Vec<String> = childinfo.iter().map(|o| format!("\"{o}\"")).collect();
            line.extend_from_slice(format!(" (\"CHILDINFO\" ({}))\r\n", options.join(" ")).as_bytes());
        }
        s.raw(&line);
        // RFC 5819 §2: STATUS for each listed mailbox that can be selected, right after its LIST.
        if exists
            && let Some(names) = &request.returns.status
            && let Ok(items) = super::status::items(s, &user.name, name, names)
        {
            s.raw(&codec.encode(&Response::Data(Data::Status { mailbox: wire, items: items.into() })).dump());
        }
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
