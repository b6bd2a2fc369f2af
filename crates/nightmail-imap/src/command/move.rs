//! MOVE and UID MOVE (RFC 6851 §3): an atomic copy and expunge. The COPYUID comes in an untagged
//! OK before the EXPUNGE responses (§4.3; VANISHED once QRESYNC is on, RFC 7162 §3.2.10), then
//! the tagged OK.

use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::StatusKind;
use imap_next::imap_types::sequence::SequenceSet;

use super::{Done, condstore};
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
    let (store, tracking) = (s.shared.store.clone(), s.tracking);
    let selected = s.selected()?;
    if selected.read_only {
        return Err(ImapError::no("the mailbox is read-only (EXAMINE)"));
    }
    let uids = sources(selected, &set, uid)?;
    let from = selected.info.id;
    let filing = Filing { by: &by, ask: ask.as_ref() };
    let copied = store.move_mail(from, &uids, to.id, Some(&filing)).await?;
    let moved: Vec<_> = copied.pairs.iter().map(|(source, _)| *source).collect();
    let expunged = condstore::expunged(selected, &moved, tracking);
    if let Some(code) = copy_uid(&copied) {
        s.untagged(StatusKind::Ok, Some(code), "moved");
    }
    for data in expunged {
        s.data(data);
    }
    Ok(Done::ok(done_text(if uid { "UID MOVE completed" } else { "MOVE completed" }, ask.as_ref(), &copied.jobs)))
}
