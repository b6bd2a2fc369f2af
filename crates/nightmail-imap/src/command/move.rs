//! MOVE and UID MOVE (RFC 6851 §3): an atomic copy and expunge. The COPYUID comes in an untagged
//! OK before the EXPUNGE responses (§4.3), then the tagged OK.

use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::{Data, StatusKind};
use imap_next::imap_types::sequence::SequenceSet;

use super::Done;
use nightmail_store::Filing;

use super::copy::{copy_uid, destination, done_text, filer, sources};
use crate::ImapError;
use crate::session::Session;

pub(crate) async fn run(
    s: &mut Session,
    set: SequenceSet,
    mailbox: Mailbox<'static>,
    uid: bool,
) -> Result<Done, ImapError> {
    let to = destination(s, &mailbox)?;
    let (by, ask) = filer(s, &to)?;
    let store = s.shared.store.clone();
    let selected = s.selected()?;
    if selected.read_only {
        return Err(ImapError::no("the mailbox is read-only (EXAMINE)"));
    }
    let uids = sources(selected, &set, uid)?;
    let from = selected.info.id;
    let filing = Filing { by: &by, ask: ask.as_ref() };
    let copied = store.move_mail(from, &uids, to.id, Some(&filing)).await?;
    let mut expunged = Vec::new();
    for (source, _) in copied.pairs.iter().rev() {
        if let Some(i) = selected.index_of_uid(*source) {
            expunged.push(Data::Expunge(selected.seq_of(i).0));
            selected.messages.remove(i);
            selected.recent.remove(source);
        }
    }
    if let Some(code) = copy_uid(&copied) {
        s.untagged(StatusKind::Ok, Some(code), "moved");
    }
    for data in expunged {
        s.data(data);
    }
    Ok(Done::ok(done_text(if uid { "UID MOVE completed" } else { "MOVE completed" }, ask.as_ref(), &copied.jobs)))
}
