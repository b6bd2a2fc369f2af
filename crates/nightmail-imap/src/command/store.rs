//! STORE and UID STORE (RFC 3501 §6.4.6): FLAGS, +FLAGS, -FLAGS, each with .SILENT. Without
//! .SILENT the new flags come back as FETCH responses (with the UID for UID STORE, §6.4.8).
//! `\Recent` cannot be stored (§2.3.2); a read-only mailbox refuses (§6.3.2). RFC 7162 §3.1.3
//! UNCHANGEDSINCE: messages changed since are left alone and named in OK [MODIFIED].

use std::num::NonZeroU32;

use imap_next::imap_types::command::StoreModifier;
use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::fetch::MessageDataItem;
use imap_next::imap_types::flag::{Flag, StoreResponse, StoreType};
use imap_next::imap_types::response::Code;
use imap_next::imap_types::response::Data;
use imap_next::imap_types::sequence::SequenceSet;
use nightmail_store::FlagUpdate;

use super::fetch::flags_item;
use super::{Done, condstore, flag_names};
use crate::ImapError;
use crate::session::Session;
use crate::view::{Numbers, without_recent};

pub(crate) async fn run(
    s: &mut Session,
    set: SequenceSet,
    kind: StoreType,
    response: StoreResponse,
    flags: Vec<Flag<'static>>,
    uid: bool,
    modifiers: &[StoreModifier],
) -> Result<Done, ImapError> {
    let store = s.shared.store.clone();
    if s.selected()?.read_only {
        return Err(ImapError::no("the mailbox is read-only (EXAMINE)"));
    }
    let unchanged_since = condstore::unchanged_since(s, modifiers);
    let tracking = s.tracking;
    let selected = s.selected()?;
    let indices = selected.resolve(&set, Numbers::of(uid))?;
    let uids: Vec<_> = indices.iter().map(|&i| selected.messages[i].uid).collect();
    let update = match kind {
        StoreType::Add => FlagUpdate::Add,
        StoreType::Remove => FlagUpdate::Remove,
        StoreType::Replace => FlagUpdate::Replace,
    };
    let stored = store
        .update_flags_unchanged_since(selected.info.id, &uids, update, &flag_names(&flags), unchanged_since)
        .await?;
    for change in &stored.changes {
        selected.learn_keywords(&change.flags);
    }
    let mut out = Vec::new();
    for change in stored.changes {
        let Some(i) = selected.index_of_uid(change.uid) else { continue };
        let moved = selected.messages[i].modseq != change.modseq;
        selected.messages[i].flags =
            without_recent(nightmail_store::MailEntry { flags: change.flags, ..selected.messages[i].clone() }).flags;
        selected.messages[i].modseq = change.modseq;
        let entry = &selected.messages[i];
        let mut items = Vec::new();
        if response == StoreResponse::Answer {
            items.push(flags_item(entry, selected.recent.contains(&entry.uid)));
        }
        if uid || (tracking.condstore() && (moved || !items.is_empty())) {
            items.push(MessageDataItem::Uid(NonZeroU32::new(entry.uid.0).unwrap_or(NonZeroU32::MIN)));
        }
        // RFC 7162 §3.1.3: once CONDSTORE is on, each message stored to is told with its new
        // MODSEQ, even with .SILENT.
        if tracking.condstore() && (moved || response == StoreResponse::Answer) {
            items.push(condstore::modseq_item(entry.modseq));
        }
        let told = response == StoreResponse::Answer || (tracking.condstore() && moved);
        if told && let Ok(items) = Vec1::try_from(items) {
            out.push(Data::Fetch { seq: selected.seq_of(i).0, items });
        }
    }
    // §3.1.3: the messages that changed after UNCHANGEDSINCE, by the numbers the command used.
    let modified: Vec<u32> = match uid {
        true => stored.modified.iter().map(|u| u.0).collect(),
        false => stored.modified.iter().filter_map(|&u| selected.index_of_uid(u)).map(|i| i as u32 + 1).collect(),
    };
    s.announce_new_keywords();
    for data in out {
        s.data(data);
    }
    let text = if uid { "UID STORE completed" } else { "STORE completed" };
    Ok(match condstore::number_set(modified) {
        Some(set) => Done::with_code(Code::Modified(set), "conditional STORE failed for some messages"),
        None => Done::ok(text),
    })
}
