//! What a NOTIFY (RFC 5465) sets up: a per-user feed of mailbox changes, turned into the
//! unsolicited `* STATUS` and `* LIST` responses the event groups ask for.
//!
//! The store announces every flushed change to a mailbox (its contents, and since NOTIFY its
//! name and subscription) on one broadcast channel (`Store::changes`). A watch takes from it the
//! ids of this user's mailboxes into `dirty`, a set, so however often a mailbox changes it is
//! looked at once: the feed a session holds is bounded by the user's mailboxes, not by how
//! busy they are. Each dirty mailbox is then compared with what the client was last told
//! (`Known`), so what goes out is the difference (§5.2-§5.7), whatever order the changes came
//! in. A session that falls so far behind that the channel dropped announcements for it, or
//! that has more than [`MAX_DIRTY`] mailboxes waiting, gets `* OK [NOTIFICATIONOVERFLOW]`
//! and NOTIFY is off, as if NOTIFY NONE (§5.8).
//!
//! The selected mailbox is not reported here: its changes go through the session's view
//! (`view::Selected::sync`), as EXISTS / EXPUNGE / FETCH, pushed at once when the `selected`
//! group asks for events (`Session::serve`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::num::NonZeroU32;

use imap_codec::ResponseCodec;
use imap_codec::encode::Encoder;
use imap_next::imap_types::core::{Atom, QuotedChar};
use imap_next::imap_types::flag::FlagNameAttribute;
use imap_next::imap_types::response::{Data, Response, StatusKind};
use imap_next::imap_types::status::StatusDataItem;
use nightmail_store::{MailboxChange, MailboxId, MailboxInfo, Store};
use tokio::sync::broadcast;

use crate::ImapError;
use crate::command::notify::{Events, Filter, Group, SelectedEvents};
use crate::command::wire_name;
use crate::error::other_code;
use crate::session::{Session, State};

/// Mailboxes waiting to be told about before the session is declared behind (§5.8).
const MAX_DIRTY: usize = 1024;
/// Other users' mailbox ids remembered so their changes are skipped without a lookup.
const MAX_FOREIGN: usize = 4096;

/// What the client was last told of one of its mailboxes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Known {
    name: String,
    subscribed: bool,
    counts: Counts,
}

/// The STATUS items NOTIFY reports (§5.2-§5.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    messages: u32,
    uid_next: u32,
    uid_validity: u32,
    highest_modseq: u64,
}

pub(crate) struct Watch {
    owner: String,
    pub selected: Option<SelectedEvents>,
    groups: Vec<Group<String>>,
    feed: broadcast::Receiver<MailboxChange>,
    known: HashMap<MailboxId, Known>,
    dirty: BTreeSet<MailboxId>,
    foreign: HashSet<MailboxId>,
    overflow: bool,
}

fn counts(store: &Store, info: &MailboxInfo) -> Result<Counts, ImapError> {
    Ok(Counts {
        messages: store.mail(info.id)?.len() as u32,
        uid_next: info.uid_next.0,
        uid_validity: info.uid_validity,
        highest_modseq: info.highest_modseq.0,
    })
}

impl Watch {
    /// Listens from now on, then reads the user's mailboxes as they are: no change is missed.
    pub fn new(
        store: &Store,
        owner: String,
        selected: Option<SelectedEvents>,
        groups: Vec<Group<String>>,
    ) -> Result<Watch, ImapError> {
        let feed = store.changes();
        let mut watch = Watch {
            owner,
            selected,
            groups,
            feed,
            known: HashMap::new(),
            dirty: BTreeSet::new(),
            foreign: HashSet::new(),
            overflow: false,
        };
        let subscriptions: HashSet<String> = store.subscriptions(&watch.owner)?.into_iter().collect();
        for info in store.mailboxes(&watch.owner)? {
            let subscribed = subscriptions.contains(&info.name);
            let counts = if watch.events_of(&info.name, subscribed).any_message() {
                counts(store, &info)?
            } else {
                Counts::default()
            };
            watch.known.insert(info.id, Known { name: info.name, subscribed, counts });
        }
        Ok(watch)
    }

    /// The events the groups ask for about mailbox `name` (§6; groups add up).
    fn events_of(&self, name: &str, subscribed: bool) -> Events {
        let below =
            |root: &String| name == root || name.strip_prefix(root.as_str()).is_some_and(|r| r.starts_with('/'));
        self.groups
            .iter()
            .filter(|g| match &g.filter {
                Filter::Inboxes => name == "INBOX",
                Filter::Personal => true,
                Filter::Subscribed => subscribed,
                Filter::Subtree(roots) => roots.iter().any(below),
                Filter::Mailboxes(names) => names.iter().any(|n| n == name),
            })
            .fold(Events::default(), |all, g| all.union(g.events))
    }

    /// Whether the selected mailbox's changes are pushed as they happen (§6.1).
    pub fn pushes_selected(&self) -> bool {
        self.selected.as_ref().is_some_and(|s| s.events.any_message())
    }

    /// Takes what the feed has announced into `dirty`. Cheap; never blocks.
    fn drain(&mut self) {
        loop {
            match self.feed.try_recv() {
                Ok(change) => self.note(change.mailbox),
                Err(broadcast::error::TryRecvError::Lagged(_)) => self.overflow = true,
                Err(_) => break,
            }
        }
    }

    fn note(&mut self, mailbox: MailboxId) {
        if !self.foreign.contains(&mailbox) {
            self.dirty.insert(mailbox);
            if self.dirty.len() > MAX_DIRTY {
                self.overflow = true;
            }
        }
    }

    /// Waits for the next announcement that may concern this user.
    pub async fn changed(&mut self) {
        loop {
            match self.feed.recv().await {
                Ok(change) if self.foreign.contains(&change.mailbox) => {}
                Ok(change) => {
                    self.note(change.mailbox);
                    return;
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.overflow = true;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }

    /// Whether anything waits to be told.
    pub fn pending(&mut self) -> bool {
        self.drain();
        self.overflow || !self.dirty.is_empty()
    }
}

/// The STATUS items an event set reports (§5.2: MESSAGES, UIDNEXT (and UIDVALIDITY, so a
/// client can tell a new mailbox under an old name); §5.3: MESSAGES; §5.4: UIDVALIDITY and
/// HIGHESTMODSEQ).
fn status_items(events: Events, c: Counts) -> Vec<StatusDataItem> {
    let one = NonZeroU32::MIN;
    let mut items = Vec::new();
    if events.message_new || events.message_expunge {
        items.push(StatusDataItem::Messages(c.messages));
    }
    if events.message_new {
        items.push(StatusDataItem::UidNext(NonZeroU32::new(c.uid_next).unwrap_or(one)));
    }
    if events.message_new || events.flag_change {
        items.push(StatusDataItem::UidValidity(NonZeroU32::new(c.uid_validity).unwrap_or(one)));
    }
    if events.flag_change {
        items.push(StatusDataItem::HighestModSeq(c.highest_modseq));
    }
    items
}

/// Whether a change from `was` to `now` is one of `events` (§5.2-§5.4).
fn reportable(events: Events, was: Counts, now: Counts) -> bool {
    let new = now.uid_next != was.uid_next || now.uid_validity != was.uid_validity;
    let expunged = now.messages < was.messages || (now.messages != was.messages && !new);
    let flags = now.highest_modseq != was.highest_modseq && !new && !expunged;
    (events.message_new && new) || (events.message_expunge && (expunged || new)) || (events.flag_change && flags)
}

fn attribute(name: &'static str) -> FlagNameAttribute<'static> {
    FlagNameAttribute::from(Atom::unvalidated(name))
}

/// The id of the selected mailbox, whose changes the view reports instead.
fn selected_id(s: &Session) -> Option<MailboxId> {
    match &s.state {
        State::Selected(_, selected) => Some(selected.info.id),
        _ => None,
    }
}

fn status_line(s: &Session, name: &str, items: Vec<StatusDataItem>) -> Option<Vec<u8>> {
    let mailbox = wire_name(s, name)?;
    Some(ResponseCodec::default().encode(&Response::Data(Data::Status { mailbox, items: items.into() })).dump())
}

/// `* LIST (attributes) "/" name`, with RFC 5465 §5.4's `("OLDNAME" (old))` after a rename.
fn list_line(s: &Session, items: Vec<FlagNameAttribute<'static>>, name: &str, old: Option<&str>) -> Option<Vec<u8>> {
    let mailbox = wire_name(s, name)?;
    let data = Data::List { items, delimiter: Some(QuotedChar::unvalidated('/')), mailbox };
    let mut line = ResponseCodec::default().encode(&Response::Data(data)).dump();
    if let Some(old) = old {
        let old = wire_name(s, old)?;
        let old = ResponseCodec::default()
            .encode(&Response::Data(Data::Status { mailbox: old, items: vec![].into() }))
            .dump();
        // `* STATUS name ()`: the name as imap-codec writes a mailbox, between the two spaces.
        let name = &old[b"* STATUS ".len()..old.len() - b" ()\r\n".len()];
        line.truncate(line.len() - 2);
        line.extend_from_slice(b" (\"OLDNAME\" (");
        line.extend_from_slice(name);
        line.extend_from_slice(b"))\r\n");
    }
    Some(line)
}

/// §3.1 STATUS: the current STATUS of every mailbox the groups ask message events of, but the
/// selected one, before the tagged OK.
pub(crate) fn initial_status(s: &mut Session) {
    let Some(watch) = s.notify.take() else { return };
    let selected = selected_id(s);
    let mut known: Vec<(&MailboxId, &Known)> = watch.known.iter().collect();
    known.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    for (id, k) in known {
        let events = watch.events_of(&k.name, k.subscribed);
        if Some(*id) == selected || !events.any_message() {
            continue;
        }
        if let Some(line) = status_line(s, &k.name, status_items(events, k.counts)) {
            s.raw(&line);
        }
    }
    s.notify = Some(watch);
}

/// Tells the client what changed in its mailboxes since it was last told (§5): the session calls
/// this whenever no command is in progress, IDLE included (§3: "at any time").
pub(crate) fn deliver(s: &mut Session) {
    let Some(mut watch) = s.notify.take() else { return };
    if !watch.pending() {
        s.notify = Some(watch);
        return;
    }
    if watch.overflow {
        // §5.8: the session is behind; NOTIFY is off, as after NOTIFY NONE.
        s.untagged(StatusKind::Ok, Some(other_code("NOTIFICATIONOVERFLOW")), "NOTIFY is off: too many changes at once");
        // Out of the flow's queue now: the session waits for input next.
        s.flush_queued();
        return;
    }
    let store = s.shared.store.clone();
    let selected = selected_id(s);
    for id in std::mem::take(&mut watch.dirty) {
        let info = match store.mailbox_by_id(id) {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!("imap: NOTIFY could not read a mailbox: {e}");
                continue;
            }
        };
        let Some(info) = info else {
            // §5.4: a deleted mailbox is `\NonExistent`.
            if let Some(old) = watch.known.remove(&id)
                && watch.events_of(&old.name, old.subscribed).mailbox_name
                && let Some(line) = list_line(s, vec![attribute("NonExistent")], &old.name, None)
            {
                s.raw(&line);
            }
            continue;
        };
        if info.owner != watch.owner {
            if watch.foreign.len() >= MAX_FOREIGN {
                watch.foreign.clear();
            }
            watch.foreign.insert(id);
            continue;
        }
        let is_subscribed = store.is_subscribed(&watch.owner, &info.name).unwrap_or_else(|e| {
            tracing::warn!("imap: NOTIFY could not read a subscription: {e}");
            false
        });
        let events = watch.events_of(&info.name, is_subscribed);
        let now = if events.any_message() { counts(&store, &info).unwrap_or_default() } else { Counts::default() };
        let subscribed = || if is_subscribed { vec![attribute("Subscribed")] } else { vec![] };
        let Some(was) = watch.known.get(&id).cloned() else {
            // §5.4: a new mailbox.
            if events.mailbox_name
                && let Some(line) = list_line(s, subscribed(), &info.name, None)
            {
                s.raw(&line);
            }
            watch.known.insert(id, Known { name: info.name.clone(), subscribed: is_subscribed, counts: now });
            continue;
        };
        if was.name != info.name
            && (events.mailbox_name || watch.events_of(&was.name, was.subscribed).mailbox_name)
            && let Some(line) = list_line(s, subscribed(), &info.name, Some(&was.name))
        {
            s.raw(&line);
        }
        // §5.5: SubscriptionChange, told as LIST with or without `\Subscribed`.
        if was.subscribed != is_subscribed
            && (events.subscription_change || watch.events_of(&was.name, was.subscribed).subscription_change)
            && let Some(line) = list_line(s, subscribed(), &info.name, None)
        {
            s.raw(&line);
        }
        let was_counted = watch.events_of(&was.name, was.subscribed).any_message();
        if Some(id) != selected
            && events.any_message()
            && was_counted
            && reportable(events, was.counts, now)
            && let Some(line) = status_line(s, &info.name, status_items(events, now))
        {
            s.raw(&line);
        }
        watch.known.insert(id, Known { name: info.name, subscribed: is_subscribed, counts: now });
    }
    s.notify = Some(watch);
}

/// Resolves when the watch has something to tell; never without a watch.
pub(crate) async fn changed(watch: &mut Option<Box<Watch>>) {
    match watch {
        Some(watch) => watch.changed().await,
        None => std::future::pending().await,
    }
}
