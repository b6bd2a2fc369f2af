//! EXPUNGE (RFC 3501 §6.4.3) and UID EXPUNGE (RFC 4315 §2.1): removes `\Deleted` messages and
//! reports each with an EXPUNGE response. They are sent highest sequence number first, so every
//! number is right at the moment it is sent (each EXPUNGE renumbers the messages after it).

use imap_next::imap_types::response::Data;
use imap_next::imap_types::sequence::SequenceSet;

use super::Done;
use crate::ImapError;
use crate::session::Session;
use crate::view::Numbers;

pub(crate) async fn run(s: &mut Session, uids: Option<SequenceSet>) -> Result<Done, ImapError> {
    let store = s.shared.store.clone();
    let selected = s.selected()?;
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
    let mut out = Vec::new();
    for uid in removed.into_iter().rev() {
        if let Some(i) = selected.index_of_uid(uid) {
            out.push(Data::Expunge(selected.seq_of(i).0));
            selected.messages.remove(i);
            selected.recent.remove(&uid);
        }
    }
    for data in out {
        s.data(data);
    }
    Ok(Done::ok(if uids.is_some() { "UID EXPUNGE completed" } else { "EXPUNGE completed" }))
}
