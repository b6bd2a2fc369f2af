//! FETCH and UID FETCH (RFC 3501 §6.4.5, §6.4.8; response items §7.4.2). A non-PEEK BODY[],
//! RFC822 or RFC822.TEXT sets `\Seen` (unless the mailbox is read-only), and the new FLAGS are
//! returned with the data. Message structure comes from `mime` (mail-parser, panic-safe); the
//! header-only items mutt fetches for its index skip the MIME parse altogether.
//! RFC 7162: the MODSEQ item (§3.1.4.2) and the CHANGEDSINCE and VANISHED modifiers (§3.1.4.1,
//! §3.2.6), checked in `condstore.rs`.

use std::borrow::Cow;
use std::num::NonZeroU32;

use imap_codec::ResponseCodec;
use imap_codec::encode::Encoder;
use imap_next::imap_types::IntoStatic;
use imap_next::imap_types::command::FetchModifier;
use imap_next::imap_types::core::{IString, Literal, NString, Vec1};
use imap_next::imap_types::datetime::DateTime;
use imap_next::imap_types::fetch::{MacroOrMessageDataItemNames, MessageDataItem, MessageDataItemName, Section};
use imap_next::imap_types::flag::{Flag, FlagFetch};
use imap_next::imap_types::response::{Data, Response};
use imap_next::imap_types::sequence::SequenceSet;
use nightmail_store::{FlagUpdate, MailEntry};
use nightmail_types::Timestamp;

use super::{Done, binary, condstore};
use crate::ImapError;
use crate::error::other_code;
use crate::mime::{self, Part};
use crate::session::Session;
use crate::view::Numbers;

/// `FLAGS (...)` of a message, `\Recent` included when it is recent to this session.
pub(crate) fn flags_item(entry: &MailEntry, recent: bool) -> MessageDataItem<'static> {
    let mut flags: Vec<FlagFetch<'static>> = entry
        .flags
        .iter()
        .filter_map(|f| Flag::try_from(f.as_str()).ok().map(IntoStatic::into_static))
        .map(FlagFetch::Flag)
        .collect();
    if recent {
        flags.push(FlagFetch::Recent);
    }
    MessageDataItem::Flags(flags)
}

/// RFC 3501 §2.3.3 INTERNALDATE has whole seconds, and imap-types refuses a time with a fraction:
/// the milliseconds APPEND's clock reading carries are dropped here.
pub(crate) fn internal_date(t: Timestamp) -> DateTime {
    let utc = chrono::DateTime::from_timestamp((t.0 / 1000) as i64, 0).unwrap_or_default();
    let fixed = utc.fixed_offset();
    DateTime::try_from(fixed).unwrap_or_else(|_| DateTime::unvalidated(chrono::DateTime::UNIX_EPOCH.fixed_offset()))
}

/// Message bytes for the wire: always a literal, so any octet but NUL survives. A literal may not
/// hold a NUL (RFC 3501 §4.3, CHAR8 is %x01-ff; RFC 3516 §4.2 sends such data only as BINARY's
/// literal8), so bytes with one are [`HoldsNul`].
fn literal(bytes: Cow<'_, [u8]>) -> Result<NString<'static>, HoldsNul> {
    match Literal::try_from(bytes.into_owned()) {
        Ok(literal) => Ok(NString(Some(IString::Literal(literal)))),
        Err(_) => Err(HoldsNul),
    }
}

/// A message whose asked-for item holds a NUL outside BINARY: it is left out of the answer.
struct HoldsNul;

/// RFC 3501 §6.4.5 `<origin.octets>`: a slice, empty past the end; to the end without a count
/// (RFC 5092 `partial-range`, for CATENATE's URLs).
pub(crate) fn partial(data: Cow<'_, [u8]>, origin: u32, count: Option<u32>) -> Cow<'_, [u8]> {
    let start = (origin as usize).min(data.len());
    let end = count.map_or(data.len(), |n| start.saturating_add(n as usize).min(data.len()));
    match data {
        Cow::Borrowed(b) => Cow::Borrowed(&b[start..end]),
        Cow::Owned(v) => Cow::Owned(v[start..end].to_vec()),
    }
}

fn sets_seen(name: &MessageDataItemName<'_>) -> bool {
    matches!(
        name,
        MessageDataItemName::BodyExt { peek: false, .. }
            | MessageDataItemName::Binary { peek: false, .. }
            | MessageDataItemName::Rfc822
            | MessageDataItemName::Rfc822Text
    )
}

fn needs_bytes(name: &MessageDataItemName<'_>) -> bool {
    !matches!(
        name,
        MessageDataItemName::Uid
            | MessageDataItemName::Flags
            | MessageDataItemName::InternalDate
            | MessageDataItemName::Rfc822Size
            | MessageDataItemName::ModSeq
    )
}

/// Whether the item needs the MIME tree, rather than just the header/body split.
fn needs_structure(name: &MessageDataItemName<'_>) -> bool {
    match name {
        MessageDataItemName::Body | MessageDataItemName::BodyStructure | MessageDataItemName::Envelope => true,
        MessageDataItemName::BodyExt { section, .. } => match section {
            None | Some(Section::Header(None) | Section::Text(None)) => false,
            Some(Section::HeaderFields(part, _) | Section::HeaderFieldsNot(part, _)) => part.is_some(),
            _ => true,
        },
        MessageDataItemName::Binary { section, .. } | MessageDataItemName::BinarySize { section } => {
            !section.is_empty()
        }
        _ => false,
    }
}

/// The items of one message's FETCH response, in the order asked; with the new FLAGS when this
/// FETCH set `\Seen` and did not ask for them (RFC 3501 §6.4.5).
fn fetch_items(
    names: &[MessageDataItemName<'static>],
    entry: &MailEntry,
    recent: bool,
    raw: &[u8],
    structure: bool,
    newly_seen: bool,
) -> Result<(Vec<MessageDataItem<'static>>, Vec<PartialBinary>), Unfetchable> {
    let mut partials = Vec::new();
    let parsed = structure.then(|| mime::parse(raw));
    let split = mime::header_end(raw);
    let flat = mime::opaque(0..split, split..raw.len());
    let root: &Part = parsed.as_ref().map_or(&flat, |p| &p.root);
    let mut items = Vec::with_capacity(names.len() + 1);
    for name in names {
        items.push(match name {
            MessageDataItemName::Uid => MessageDataItem::Uid(NonZeroU32::new(entry.uid.0).unwrap_or(NonZeroU32::MIN)),
            MessageDataItemName::Flags => flags_item(entry, recent),
            MessageDataItemName::InternalDate => MessageDataItem::InternalDate(internal_date(entry.internal_date)),
            MessageDataItemName::Rfc822Size => MessageDataItem::Rfc822Size(entry.size as u32),
            MessageDataItemName::Rfc822 => MessageDataItem::Rfc822(literal(Cow::Borrowed(raw))?),
            MessageDataItemName::Rfc822Header => MessageDataItem::Rfc822Header(literal(Cow::Borrowed(&raw[..split]))?),
            MessageDataItemName::Rfc822Text => MessageDataItem::Rfc822Text(literal(Cow::Borrowed(&raw[split..]))?),
            MessageDataItemName::Envelope => MessageDataItem::Envelope(
                parsed.as_ref().map(|p| p.envelope.clone()).unwrap_or_else(mime::empty_envelope),
            ),
            MessageDataItemName::Body => MessageDataItem::Body(mime::body_structure(raw, root, false)),
            MessageDataItemName::BodyStructure => MessageDataItem::BodyStructure(mime::body_structure(raw, root, true)),
            MessageDataItemName::BodyExt { section, partial, .. } => {
                let data = mime::section(raw, root, section.as_ref()).unwrap_or(Cow::Borrowed(&[]));
                let data = match partial {
                    Some((origin, count)) => self::partial(data, *origin, Some(count.get())),
                    None => data,
                };
                MessageDataItem::BodyExt {
                    section: section.clone(),
                    origin: partial.map(|(origin, _)| origin),
                    data: literal(data)?,
                }
            }
            MessageDataItemName::Binary { section, partial, .. } => {
                let path: Vec<u32> = section.iter().map(|n| n.get()).collect();
                let data = binary::decoded(raw, root, &path).map_err(Unfetchable::Imap)?;
                match partial {
                    Some((origin, count)) => {
                        let start = (*origin as usize).min(data.len());
                        let end = start.saturating_add(count.get() as usize).min(data.len());
                        let item = MessageDataItem::Binary {
                            section: section.clone(),
                            value: binary::value(data[start..end].to_vec()),
                        };
                        partials.push(PartialBinary { origin: *origin, section: path, item });
                        continue;
                    }
                    None => {
                        MessageDataItem::Binary { section: section.clone(), value: binary::value(data.into_owned()) }
                    }
                }
            }
            MessageDataItemName::BinarySize { section } => {
                let path: Vec<u32> = section.iter().map(|n| n.get()).collect();
                let size = binary::decoded(raw, root, &path).map_err(Unfetchable::Imap)?.len() as u32;
                MessageDataItem::BinarySize { section: section.clone(), size }
            }
            MessageDataItemName::ModSeq => condstore::modseq_item(entry.modseq),
        });
    }
    if newly_seen && !names.contains(&MessageDataItemName::Flags) {
        items.push(flags_item(entry, recent));
    }
    Ok((items, partials))
}

/// Why one message's items cannot be sent.
enum Unfetchable {
    /// The whole FETCH fails (RFC 3516 §4.3 UNKNOWN-CTE, a part that does not exist).
    Imap(ImapError),
    /// This message is left out and the FETCH answers NO at the end (RFC 2180 §4.1.3's way).
    Nul,
}

impl From<HoldsNul> for Unfetchable {
    fn from(_: HoldsNul) -> Unfetchable {
        Unfetchable::Nul
    }
}

/// A `BINARY[section]<origin>` item (RFC 3516 §4.2). imap-types' item has no origin, so each is
/// sent as a FETCH response of its own and the origin written in after the section (`encode`).
struct PartialBinary {
    origin: u32,
    section: Vec<u32>,
    item: MessageDataItem<'static>,
}

impl PartialBinary {
    /// With the UID after it for UID FETCH (RFC 3501 §6.4.8: every response carries it).
    fn encode(self, seq: NonZeroU32, uid: Option<NonZeroU32>) -> Vec<u8> {
        let section: Vec<String> = self.section.iter().map(u32::to_string).collect();
        let prefix = format!("* {seq} FETCH (BINARY[{}]", section.join("."));
        let mut items = vec![self.item];
        items.extend(uid.map(MessageDataItem::Uid));
        let items = Vec1::try_from(items).expect("one item at least");
        let mut encoded = ResponseCodec::default().encode(&Response::Data(Data::Fetch { seq, items })).dump();
        if encoded.starts_with(prefix.as_bytes()) {
            let origin = format!("<{}>", self.origin);
            encoded.splice(prefix.len()..prefix.len(), origin.into_bytes());
        }
        encoded
    }
}

pub(crate) async fn run(
    s: &mut Session,
    set: SequenceSet,
    items: MacroOrMessageDataItemNames<'static>,
    uid: bool,
    modifiers: &[FetchModifier],
) -> Result<Done, ImapError> {
    let store = s.shared.store.clone();
    s.selected()?;
    let changed = condstore::fetch_modifiers(s, modifiers, uid)?;
    let mut names: Vec<MessageDataItemName<'static>> = match items {
        MacroOrMessageDataItemNames::Macro(m) => m.expand().into_iter().map(|n| n.into_static()).collect(),
        MacroOrMessageDataItemNames::MessageDataItemNames(names) => names,
    };
    // §6.4.8: UID FETCH always returns the UID.
    if uid && !names.contains(&MessageDataItemName::Uid) {
        names.insert(0, MessageDataItemName::Uid);
    }
    if names.contains(&MessageDataItemName::ModSeq) {
        condstore::enable_condstore(s);
    }
    // RFC 7162 §3.1.4.1: CHANGEDSINCE implies MODSEQ; once CONDSTORE is on, flags come with it.
    let with_modseq = changed.is_some()
        || (s.tracking.condstore() && names.iter().any(|n| *n == MessageDataItemName::Flags || sets_seen(n)));
    if with_modseq && !names.contains(&MessageDataItemName::ModSeq) {
        names.push(MessageDataItemName::ModSeq);
    }
    // §3.1: a flag change this FETCH makes (`\Seen`) is told with the UID too.
    if s.tracking.condstore() && names.iter().any(sets_seen) && !names.contains(&MessageDataItemName::Uid) {
        names.insert(0, MessageDataItemName::Uid);
    }
    let mut indices = s.selected()?.resolve(&set, Numbers::of(uid))?;
    if changed.is_some() {
        // The messages this FETCH answers with their flags need no FETCH of their own.
        let flags = names.contains(&MessageDataItemName::Flags);
        condstore::catch_up_flags(s, |i| flags && indices.binary_search(&i).is_ok())?;
    }
    let selected = s.selected()?;
    let mut vanished_uids = Vec::new();
    if let Some(changed) = &changed {
        indices.retain(|&i| selected.messages[i].modseq > changed.since);
        if changed.vanished {
            vanished_uids = store.expunged_since(selected.info.id, changed.since)?;
            vanished_uids.retain(|&u| condstore::set_contains(&set, u));
        }
    }
    let mut newly_seen = std::collections::HashSet::new();
    if !selected.read_only && names.iter().any(sets_seen) {
        let unseen: Vec<_> = indices
            .iter()
            .map(|&i| &selected.messages[i])
            .filter(|m| !m.flags.iter().any(|f| f == "\\Seen"))
            .map(|m| m.uid)
            .collect();
        if !unseen.is_empty() {
            for change in
                store.update_flags(selected.info.id, &unseen, FlagUpdate::Add, &["\\Seen".to_string()]).await?
            {
                if let Some(i) = selected.index_of_uid(change.uid) {
                    selected.messages[i].flags = change.flags.into_iter().filter(|f| f != "\\Recent").collect();
                    selected.messages[i].modseq = change.modseq;
                    newly_seen.insert(change.uid);
                }
            }
        }
    }
    let bytes = names.iter().any(needs_bytes);
    let structure = names.iter().any(needs_structure);
    let recent: Vec<bool> = indices.iter().map(|&i| selected.recent.contains(&selected.messages[i].uid)).collect();
    let entries: Vec<MailEntry> = indices.iter().map(|&i| selected.messages[i].clone()).collect();
    // §3.2.6: the UIDs expunged since, before the FETCH responses.
    if let Some(known_uids) = condstore::uid_set(&vanished_uids) {
        s.data(Data::Vanished { earlier: true, known_uids });
    }
    let mut vanished = false;
    let mut with_nul = Vec::new();
    // One message at a time: its bytes are read, its response encoded and added to the session's
    // output, which is written whenever it is large (`Session::stream`); a mailbox is never held
    // in memory whole.
    for ((i, entry), recent) in indices.into_iter().zip(entries).zip(recent) {
        let raw = match bytes {
            false => Vec::new(),
            true => match store.message(entry.message)? {
                Some(raw) => raw,
                // Expunged by another session and collected; this view hears of it after the
                // command (RFC 3501 §7.4.1). RFC 2180 §4.1.3: send the rest, answer NO.
                None => {
                    vanished = true;
                    continue;
                }
            },
        };
        let (items, partials) =
            match fetch_items(&names, &entry, recent, &raw, structure, newly_seen.contains(&entry.uid)) {
                Ok(fetched) => fetched,
                Err(Unfetchable::Imap(e)) => return Err(e),
                Err(Unfetchable::Nul) => {
                    with_nul.push(entry.uid.0);
                    continue;
                }
            };
        let seq = NonZeroU32::new(i as u32 + 1).expect("+1");
        let mut responses = Vec::with_capacity(1 + partials.len());
        if let Ok(items) = Vec1::try_from(items) {
            responses.push(ResponseCodec::default().encode(&Response::Data(Data::Fetch { seq, items })).dump());
        }
        let uid = NonZeroU32::new(entry.uid.0).filter(|_| names.contains(&MessageDataItemName::Uid));
        responses.extend(partials.into_iter().map(|p| p.encode(seq, uid)));
        for encoded in responses {
            if !s.stream(&encoded).await {
                break;
            }
        }
    }
    if let Some(first) = with_nul.first() {
        let text = format!(
            "{} message(s) (UID {first}{}) hold a NUL byte, which only BINARY[] can send (RFC 3516 §4.2): fetch them with BINARY[]",
            with_nul.len(),
            if with_nul.len() > 1 { ", ..." } else { "" }
        );
        return Err(ImapError::no(text));
    }
    if vanished {
        // RFC 5530 §3 EXPUNGEISSUED: a NOOP will tell the client what went.
        return Err(ImapError::no_with(other_code("EXPUNGEISSUED"), "some of the messages no longer exist"));
    }
    Ok(Done::ok(if uid { "UID FETCH completed" } else { "FETCH completed" }))
}
