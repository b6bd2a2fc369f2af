//! NOTIFY (RFC 5465): the grammar of the command and its checks; what it sets up is
//! `crate::notify::Watch`, which turns the store's change feed into the unsolicited responses.
//!
//! imap-codec 2.0.0-alpha.10 has no NOTIFY grammar, so the command reaches the session as one
//! imap-codec refused. This module takes it apart along RFC 5465 §8:
//!
//! ```abnf
//! notify           = "NOTIFY" SP (notify-set / notify-none)
//! notify-none      = "NONE"
//! notify-set       = "SET" [status-indicator] SP event-groups
//! status-indicator = SP "STATUS"
//! event-groups     = event-group *(SP event-group)
//! event-group      = "(" filter-mailboxes SP events ")"
//! filter-mailboxes = filter-mailboxes-selected / filter-mailboxes-other
//! filter-mailboxes-selected = "selected" / "selected-delayed"
//! filter-mailboxes-other    = "inboxes" / "personal" / "subscribed" /
//!                             ("subtree" SP one-or-more-mailbox) / ("mailboxes" SP one-or-more-mailbox)
//! one-or-more-mailbox = mailbox / many-mailboxes
//! many-mailboxes   = "(" mailbox *(SP mailbox) ")"
//! events           = ("(" event *(SP event) ")") / "NONE"
//! message-event    = ("MessageNew" [SP "(" fetch-att *(SP fetch-att) ")"]) / "MessageExpunge"
//!                    / "FlagChange" / "AnnotationChange"
//! mailbox-event    = "MailboxName" / "SubscriptionChange" / "MailboxMetadataChange" / "ServerMetadataChange"
//! ```
//!
//! Each mailbox name is imap-codec's to read (as the mailbox of a STATUS command) and the
//! fetch-atts are read as a FETCH command's; only the token boundaries are found here.

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_next::imap_types::command::CommandBody;
use imap_next::imap_types::core::Tag;
use imap_next::imap_types::fetch::MacroOrMessageDataItemNames;
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::{Code, CodeOther};
use imap_next::imap_types::sequence::SequenceSet;

use super::list_extended::{strip_prefix_ci, token};
use super::{Done, mailbox_name};
use crate::ImapError;
use crate::notify::Watch;
use crate::session::{Session, State};

/// The events of one event group (RFC 5465 §5). AnnotationChange and the METADATA events are
/// never set: they are refused with BADEVENT, since this server has no METADATA (RFC 5464).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Events {
    pub message_new: bool,
    pub message_expunge: bool,
    pub flag_change: bool,
    pub mailbox_name: bool,
    pub subscription_change: bool,
}

impl Events {
    pub fn any_message(&self) -> bool {
        self.message_new || self.message_expunge || self.flag_change
    }

    pub fn union(self, other: Events) -> Events {
        Events {
            message_new: self.message_new || other.message_new,
            message_expunge: self.message_expunge || other.message_expunge,
            flag_change: self.flag_change || other.flag_change,
            mailbox_name: self.mailbox_name || other.mailbox_name,
            subscription_change: self.subscription_change || other.subscription_change,
        }
    }
}

/// RFC 5465 §6: which mailboxes an event group speaks of, other than the selected one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Filter<M> {
    /// §6 inboxes: mailboxes mail is delivered to; here, INBOX.
    Inboxes,
    /// §6 personal: every mailbox of the user.
    Personal,
    /// §6 subscribed: the subscribed mailboxes.
    Subscribed,
    /// §6 subtree: each named mailbox and every mailbox below it.
    Subtree(Vec<M>),
    /// §6 mailboxes: exactly the named mailboxes.
    Mailboxes(Vec<M>),
}

/// §6.1: the events of the selected mailbox, and whether expunges wait for a command that
/// allows them (`selected-delayed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SelectedEvents {
    pub delayed: bool,
    pub events: Events,
    /// §5.2: what to FETCH of each new message, told right after its EXISTS.
    pub fetch: Option<MacroOrMessageDataItemNames<'static>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group<M> {
    pub filter: Filter<M>,
    pub events: Events,
}

/// A NOTIFY command as parsed, with mailbox names still in wire form (`Mailbox`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// §3.2: no more notifications.
    None,
    /// §3.1.
    Set { status: bool, selected: Option<SelectedEvents>, groups: Vec<Group<Mailbox<'static>>> },
}

/// Why a NOTIFY is refused: BAD for what the grammar or §5/§6.1 forbid, NO [BADEVENT] for an
/// event this server does not offer (§3.1, §8 `unsupported-events-code`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Bad(String),
    BadEvent(String),
}

/// A NOTIFY command taken apart, or why it is refused.
pub(crate) struct Notify {
    pub tag: Tag<'static>,
    pub request: Result<Request, Refusal>,
}

/// The events this server can report, as the BADEVENT code lists them (RFC 5465 §8).
const BADEVENT: &[u8] = b"BADEVENT (MessageNew MessageExpunge FlagChange MailboxName SubscriptionChange)";

/// `tag SP "NOTIFY" SP ...`, or `None` when `bytes` is not a NOTIFY command.
pub(crate) fn recognise(bytes: &[u8]) -> Option<Notify> {
    let space = bytes.iter().position(|&b| b == b' ')?;
    let tag = Tag::try_from(String::from_utf8(bytes[..space].to_vec()).ok()?).ok()?;
    let rest = strip_prefix_ci(&bytes[space + 1..], b"NOTIFY ")?;
    Some(Notify { tag, request: parse(rest) })
}

/// Response text is ASCII (RFC 3501 §9 TEXT-CHAR): the messages say "section", not "§".
fn bad(why: impl Into<String>) -> Refusal {
    Refusal::Bad(why.into())
}

fn parse(s: &[u8]) -> Result<Request, Refusal> {
    if s.eq_ignore_ascii_case(b"NONE\r\n") {
        return Ok(Request::None);
    }
    let mut s = strip_prefix_ci(s, b"SET ").ok_or_else(|| bad("NOTIFY takes SET or NONE (RFC 5465 section 3)"))?;
    let status = match strip_prefix_ci(s, b"STATUS ") {
        Some(rest) => {
            s = rest;
            true
        }
        None => false,
    };
    let mut selected = None;
    let mut groups = Vec::new();
    loop {
        let rest = s.strip_prefix(b"(").ok_or_else(|| bad("an event group must be in ( ) (RFC 5465 section 8)"))?;
        s = event_group(rest, &mut selected, &mut groups)?;
        match s {
            b"\r\n" => break,
            _ => s = s.strip_prefix(b" ").ok_or_else(|| bad("syntax error after an event group"))?,
        }
    }
    Ok(Request::Set { status, selected, groups })
}

/// One word up to a space or parenthesis.
fn word(s: &[u8]) -> (String, &[u8]) {
    let end = s.iter().position(|&c| matches!(c, b' ' | b'(' | b')' | b'\r' | b'\n')).unwrap_or(s.len());
    (String::from_utf8_lossy(&s[..end]).to_ascii_lowercase(), &s[end..])
}

/// The inside of `event-group` after its `(`, up to and including its `)`.
fn event_group<'s>(
    s: &'s [u8],
    selected: &mut Option<SelectedEvents>,
    groups: &mut Vec<Group<Mailbox<'static>>>,
) -> Result<&'s [u8], Refusal> {
    let (filter, s) = word(s);
    let delayed = filter == "selected-delayed";
    let mut s = s.strip_prefix(b" ").ok_or_else(|| bad("an event group needs a filter and its events"))?;
    let filter = match filter.as_str() {
        "selected" | "selected-delayed" => None,
        "inboxes" => Some(Filter::Inboxes),
        "personal" => Some(Filter::Personal),
        "subscribed" => Some(Filter::Subscribed),
        "subtree" | "mailboxes" => {
            let (names, rest) = mailboxes(s)?;
            s = rest.strip_prefix(b" ").ok_or_else(|| bad("the mailboxes need their events after them"))?;
            Some(if filter == "subtree" { Filter::Subtree(names) } else { Filter::Mailboxes(names) })
        }
        other => return Err(bad(format!("unknown NOTIFY filter {other:?} (RFC 5465 section 6)"))),
    };
    let (events, fetch, s) = events(s)?;
    let s = s.strip_prefix(b")").ok_or_else(|| bad("an event group's ')' is missing"))?;
    match filter {
        Some(filter) => {
            if fetch.is_some() {
                // §8: fetch-atts are for the selected mailbox, whose messages have numbers.
                return Err(bad("MessageNew's FETCH items are only for the selected mailbox (RFC 5465 section 5.2)"));
            }
            groups.push(Group { filter, events });
        }
        None => {
            if selected.is_some() {
                return Err(bad("only one selected or selected-delayed event group (RFC 5465 section 6.1)"));
            }
            if events.mailbox_name || events.subscription_change {
                return Err(bad("the selected mailbox has only message events (RFC 5465 section 6.1)"));
            }
            // §5: "If one of MessageNew or MessageExpunge is specified, then both events MUST be
            // specified", and FlagChange needs both. Enforced where sequence numbers depend on
            // it, the selected mailbox, as Dovecot does: for other mailboxes a STATUS is sent
            // either way, and imaptest's `notify` script asks for MessageNew alone there.
            if events.message_new != events.message_expunge {
                return Err(bad("MessageNew and MessageExpunge go together (RFC 5465 section 5)"));
            }
            if events.flag_change && !events.message_new {
                return Err(bad("FlagChange needs MessageNew and MessageExpunge (RFC 5465 section 5)"));
            }
            *selected = Some(SelectedEvents { delayed, events, fetch });
        }
    }
    Ok(s)
}

/// `one-or-more-mailbox`, each read by imap-codec.
fn mailboxes(s: &[u8]) -> Result<(Vec<Mailbox<'static>>, &[u8]), Refusal> {
    let mut names = Vec::new();
    if let Some(mut s) = s.strip_prefix(b"(") {
        loop {
            let (name, rest) = token(s).map_err(bad)?;
            names.push(codec_mailbox(name)?);
            match rest.first() {
                Some(b' ') => s = &rest[1..],
                Some(b')') => return Ok((names, &rest[1..])),
                _ => return Err(bad("the mailboxes' ')' is missing")),
            }
        }
    }
    let (name, rest) = token(s).map_err(bad)?;
    names.push(codec_mailbox(name)?);
    Ok((names, rest))
}

/// `events`: the parenthesised list or NONE, and MessageNew's fetch-atts.
#[allow(clippy::type_complexity)]
fn events(s: &[u8]) -> Result<(Events, Option<MacroOrMessageDataItemNames<'static>>, &[u8]), Refusal> {
    if let Some(rest) = strip_prefix_ci(s, b"NONE") {
        return Ok((Events::default(), None, rest));
    }
    let mut s = s.strip_prefix(b"(").ok_or_else(|| bad("events are a list in ( ) or NONE (RFC 5465 section 8)"))?;
    let mut events = Events::default();
    let mut fetch = None;
    let mut unsupported = false;
    loop {
        let (name, rest) = word(s);
        s = rest;
        match name.as_str() {
            "messagenew" => {
                events.message_new = true;
                if let Some(rest) = s.strip_prefix(b" (") {
                    let close = closing(rest).ok_or_else(|| bad("MessageNew's FETCH items: a ')' is missing"))?;
                    fetch = Some(codec_fetch(&rest[..close])?);
                    s = &rest[close + 1..];
                }
            }
            "messageexpunge" => events.message_expunge = true,
            "flagchange" => events.flag_change = true,
            "mailboxname" => events.mailbox_name = true,
            "subscriptionchange" => events.subscription_change = true,
            "" => return Err(bad("an event was expected (RFC 5465 section 8)")),
            // AnnotationChange (§5.1) and the METADATA events need METADATA (RFC 5464), and an unknown `event-ext` is not ours
            // either: both are answered NO [BADEVENT] once the whole command is read.
            _ => unsupported = true,
        }
        match s.first() {
            Some(b' ') => s = &s[1..],
            Some(b')') => break,
            _ => return Err(bad("the events' ')' is missing")),
        }
    }
    if unsupported {
        return Err(Refusal::BadEvent("event not supported".into()));
    }
    Ok((events, fetch, &s[1..]))
}

/// The position of the `)` that closes a list whose `(` was just taken, past nested lists
/// (`BODY[HEADER.FIELDS (FROM)]`) and quoted strings.
fn closing(s: &[u8]) -> Option<usize> {
    let (mut depth, mut quoted, mut i) = (0usize, false, 0);
    while let Some(&c) = s.get(i) {
        match (quoted, c) {
            (true, b'\\') => i += 1,
            (true, b'"') => quoted = false,
            (false, b'"') => quoted = true,
            (false, b'(') => depth += 1,
            (false, b')') if depth == 0 => return Some(i),
            (false, b')') => depth -= 1,
            (_, b'\r' | b'\n') => return None,
            _ => {}
        }
        i += 1;
    }
    None
}

/// A mailbox name as imap-codec reads the mailbox of a STATUS command.
fn codec_mailbox(name: &[u8]) -> Result<Mailbox<'static>, Refusal> {
    let mut line = b"x STATUS ".to_vec();
    line.extend_from_slice(name);
    line.extend_from_slice(b" (MESSAGES)\r\n");
    match CommandCodec::default().decode_static(&line) {
        Ok((_, command)) => match command.body {
            CommandBody::Status { mailbox, .. } => Ok(mailbox),
            _ => Err(bad("syntax error in a NOTIFY mailbox name")),
        },
        Err(_) => Err(bad(format!("syntax error in the NOTIFY mailbox name {}", String::from_utf8_lossy(name)))),
    }
}

/// MessageNew's fetch-atts (RFC 5465 §5.2), as imap-codec reads a FETCH command's.
fn codec_fetch(items: &[u8]) -> Result<MacroOrMessageDataItemNames<'static>, Refusal> {
    let mut line = b"x FETCH 1 (".to_vec();
    line.extend_from_slice(items);
    line.extend_from_slice(b")\r\n");
    match CommandCodec::default().decode_static(&line) {
        Ok((_, command)) => match command.body {
            CommandBody::Fetch { macro_or_item_names, .. } => Ok(macro_or_item_names),
            _ => Err(bad("syntax error in MessageNew's FETCH items")),
        },
        Err(_) => {
            Err(bad(format!("unknown or malformed FETCH item in MessageNew: ({})", String::from_utf8_lossy(items))))
        }
    }
}

/// Runs a NOTIFY: §3.1 replaces whatever was set before (and §3.2 NONE drops it); with STATUS,
/// the current STATUS of every mailbox the groups name goes out before the tagged OK.
pub(crate) fn run(s: &mut Session, request: Result<Request, Refusal>) -> Result<Done, ImapError> {
    let user = s.user()?.name.clone();
    let request = match request {
        Ok(request) => request,
        Err(Refusal::Bad(why)) => return Err(ImapError::bad(why)),
        Err(Refusal::BadEvent(why)) => {
            return Err(ImapError::no_with(Code::Other(CodeOther::unvalidated(BADEVENT)), why));
        }
    };
    // §5.1: FlagChange not asked for the selected mailbox (NONE asks for nothing): its flag
    // changes by others are no longer told.
    s.selected_flag_changes = matches!(&request, Request::Set { selected: Some(sel), .. } if sel.events.flag_change);
    let Request::Set { status, selected, groups } = request else {
        s.notify = None;
        return Ok(Done::ok("NOTIFY NONE completed"));
    };
    let groups = groups
        .into_iter()
        .map(|g| {
            let names =
                |list: Vec<Mailbox<'static>>| list.iter().map(|m| mailbox_name(s, m)).collect::<Result<Vec<_>, _>>();
            let filter = match g.filter {
                Filter::Inboxes => Filter::Inboxes,
                Filter::Personal => Filter::Personal,
                Filter::Subscribed => Filter::Subscribed,
                Filter::Subtree(list) => Filter::Subtree(names(list)?),
                Filter::Mailboxes(list) => Filter::Mailboxes(names(list)?),
            };
            Ok(Group { filter, events: g.events })
        })
        .collect::<Result<Vec<_>, ImapError>>()?;
    let watch = Watch::new(&s.shared.store, user, selected, groups)?;
    s.notify = Some(Box::new(watch));
    if status {
        crate::notify::initial_status(s);
    }
    Ok(Done::ok("NOTIFY completed"))
}

/// §6.1: the selected mailbox changed and the `selected` group asks for its events, so they go
/// out now rather than after the next command: EXPUNGE only with `selected` (with
/// `selected-delayed` at the next command that allows expunges), and after EXISTS a FETCH of
/// MessageNew's items for each new message (§5.2).
pub(crate) async fn push_selected(s: &mut Session) {
    let Some(events) = s.notify.as_ref().and_then(|n| n.selected.clone()) else { return };
    let last_uid = s.selected().ok().and_then(|v| v.messages.last().map(|m| m.uid));
    let (store, tracking, flags) = (s.shared.store.clone(), s.tracking, s.selected_flag_changes);
    let updates = match &mut s.state {
        State::Selected(_, view) if events.delayed => view.sync_holding_expunges(&store, tracking, flags),
        State::Selected(_, view) => view.sync(&store, true, tracking, flags),
        _ => return,
    };
    match updates {
        Ok(updates) => {
            s.announce_new_keywords();
            for data in updates {
                s.data(data);
            }
        }
        Err(e) => {
            tracing::warn!("imap: NOTIFY update failed: {e}");
            return;
        }
    }
    let Some(items) = events.fetch else { return };
    let Ok(view) = s.selected() else { return };
    let first = view.messages.partition_point(|m| Some(m.uid) <= last_uid);
    if first == view.messages.len() {
        return;
    }
    let Ok(set) = SequenceSet::try_from(format!("{}:{}", first + 1, view.messages.len()).as_str()) else { return };
    if let Err(e) = super::fetch::run(s, set, items, false, &[]).await {
        tracing::warn!("imap: NOTIFY's FETCH of new mail failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Result<Request, Refusal> {
        recognise(line.as_bytes()).expect("a NOTIFY").request
    }

    #[test]
    fn groups_filters_and_fetch_items_are_taken_apart() {
        let Request::Set { status, selected, groups } = parsed(
            "a notify set status (SELECTED-delayed (MessageNew (UID BODY.PEEK[HEADER.FIELDS (FROM)]) messageexpunge)) \
             (subtree (INBOX {3+}\r\nA b) (MailboxName)) (mailboxes \"Sent\" (MessageNew)) (subscribed NONE)\r\n",
        )
        .unwrap() else {
            panic!("SET")
        };
        assert!(status);
        let selected = selected.unwrap();
        assert!(selected.delayed && selected.events.message_new && selected.events.message_expunge);
        assert!(
            matches!(selected.fetch, Some(MacroOrMessageDataItemNames::MessageDataItemNames(ref n)) if n.len() == 2)
        );
        assert_eq!(groups.len(), 3);
        assert!(matches!(&groups[0].filter, Filter::Subtree(m) if m.len() == 2 && m[0] == Mailbox::Inbox));
        assert!(groups[0].events.mailbox_name && !groups[0].events.any_message());
        assert!(matches!(&groups[1].filter, Filter::Mailboxes(m) if m.len() == 1));
        assert_eq!(groups[2].events, Events::default());
        assert_eq!(parsed("a NOTIFY NONE\r\n").unwrap(), Request::None);
        assert!(recognise(b"a NOOP\r\n").is_none());
    }

    #[test]
    fn what_the_rfc_forbids_is_bad_and_what_we_lack_is_badevent() {
        for bad in [
            "a NOTIFY SET\r\n",
            "a NOTIFY SET (personal (MessageNew)\r\n",
            "a NOTIFY SET (personal ())\r\n",
            "a NOTIFY SET (anywhere (MessageNew))\r\n",
            "a NOTIFY SET (selected (MessageExpunge))\r\n",
            "a NOTIFY SET (selected (FlagChange MessageNew))\r\n",
            "a NOTIFY SET (selected (MessageNew MessageExpunge SubscriptionChange))\r\n",
            "a NOTIFY SET (selected NONE) (selected-delayed NONE)\r\n",
            "a NOTIFY SET (inboxes (MessageNew (UID) MessageExpunge))\r\n",
            "a NOTIFY SET (mailboxes () (MessageNew))\r\n",
            "a NOTIFY NONE (personal (MessageNew))\r\n",
        ] {
            assert!(matches!(parsed(bad), Err(Refusal::Bad(_))), "{bad}");
        }
        for unsupported in [
            "a NOTIFY SET (personal (AnnotationChange))\r\n",
            "a NOTIFY SET (personal (MailboxName ServerMetadataChange))\r\n",
        ] {
            assert!(matches!(parsed(unsupported), Err(Refusal::BadEvent(_))), "{unsupported}");
        }
    }
}
