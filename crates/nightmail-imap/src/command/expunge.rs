//! EXPUNGE (RFC 3501 §6.4.3) and UID EXPUNGE (RFC 4315 §2.1): removes `\Deleted` messages and
//! reports each with an EXPUNGE response. They are sent highest sequence number first, so every
//! number is right at the moment it is sent (each EXPUNGE renumbers the messages after it); once
//! QRESYNC is enabled, one VANISHED instead (RFC 7162 §3.2.10).

use imap_next::imap_types::sequence::SequenceSet;

use super::{Done, condstore, context};
use crate::ImapError;
use crate::session::Session;
use crate::view::Numbers;

pub(crate) async fn run(s: &mut Session, uids: Option<SequenceSet>) -> Result<Done, ImapError> {
    let (store, tracking) = (s.shared.store.clone(), s.tracking);
    let selected = s.selected()?;
    let info_id = selected.info.id;
    if selected.read_only {
        return Err(ImapError::no("the mailbox is read-only (EXAMINE)"));
    }
    let only = match &uids {
        Some(set) => {
            Some(selected.resolve(set, Numbers::Uid)?.into_iter().map(|i| selected.messages[i].uid).collect::<Vec<_>>())
        }
        None => None,
    };
    let removed = store.expunge(selected.info.id, only.as_deref()).await?;
    // RFC 5267 §4.3.4: live searches lose them by the numbers they had, before the EXPUNGEs.
    let lines = context::before_expunge(s, &removed);
    s.write_raw(&lines);
    let selected = s.selected()?;
    let out = condstore::expunged(selected, &removed, tracking);
    for data in out {
        s.data(data);
    }
    let text = if uids.is_some() { "UID EXPUNGE completed" } else { "EXPUNGE completed" };
    // RFC 7162 §3.2.10 (as Dovecot does): the mod-sequence the expunges reached, once it matters.
    match store.mailbox_by_id(info_id)? {
        Some(info) if tracking.condstore() => Ok(Done::with_code(condstore::highest(&info), text)),
        _ => Ok(Done::ok(text)),
    }
}
