//! STORE and UID STORE (RFC 3501 §6.4.6): FLAGS, +FLAGS, -FLAGS, each with .SILENT. Without
//! .SILENT the new flags come back as FETCH responses (with the UID for UID STORE, §6.4.8).
//! `\Recent` cannot be stored (§2.3.2); a read-only mailbox refuses (§6.3.2).

use std::num::NonZeroU32;

use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::fetch::MessageDataItem;
use imap_next::imap_types::flag::{Flag, StoreResponse, StoreType};
use imap_next::imap_types::response::Data;
use imap_next::imap_types::sequence::SequenceSet;
use nightmail_store::FlagUpdate;

use super::fetch::flags_item;
use super::{Done, flag_names};
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
) -> Result<Done, ImapError> {
    let store = s.shared.store.clone();
    let selected = s.selected()?;
    if selected.read_only {
        return Err(ImapError::no("the mailbox is read-only (EXAMINE)"));
    }
    let indices = selected.resolve(&set, Numbers::of(uid))?;
    let uids: Vec<_> = indices.iter().map(|&i| selected.messages[i].uid).collect();
    let update = match kind {
        StoreType::Add => FlagUpdate::Add,
        StoreType::Remove => FlagUpdate::Remove,
        StoreType::Replace => FlagUpdate::Replace,
    };
    let changes = store.update_flags(selected.info.id, &uids, update, &flag_names(&flags)).await?;
    for change in &changes {
        selected.learn_keywords(&change.flags);
    }
    let mut out = Vec::new();
    for change in changes {
        let Some(i) = selected.index_of_uid(change.uid) else { continue };
        selected.messages[i].flags =
            without_recent(nightmail_store::MailEntry { flags: change.flags, ..selected.messages[i].clone() }).flags;
        if response == StoreResponse::Answer {
            let entry = &selected.messages[i];
            let mut items = vec![flags_item(entry, selected.recent.contains(&entry.uid))];
            if uid {
                items.push(MessageDataItem::Uid(NonZeroU32::new(entry.uid.0).unwrap_or(NonZeroU32::MIN)));
            }
            if let Ok(items) = Vec1::try_from(items) {
                out.push(Data::Fetch { seq: selected.seq_of(i).0, items });
            }
        }
    }
    s.announce_new_keywords();
    for data in out {
        s.data(data);
    }
    Ok(Done::ok(if uid { "UID STORE completed" } else { "STORE completed" }))
}
