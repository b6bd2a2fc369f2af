//! COPY and UID COPY (RFC 3501 §6.4.7) with the COPYUID response code (RFC 4315 §3). A missing
//! destination gets NO [TRYCREATE]. The copies share the stored message bytes.
//!
//! COPY, MOVE and APPEND file mail as the logged-in user (`Filing`): the user joins each message's
//! participants in the thread index, and a message filed into an `Ask/<model>` folder becomes a
//! job for that model in the same store transaction; the tagged OK names the jobs.

use std::num::NonZeroU32;

use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::extensions::uidplus::{UidElement, UidSet};
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::Code;
use imap_next::imap_types::sequence::SequenceSet;
use nightmail_store::{Copied, Filing, JobId, MailboxInfo, Uid};
use nightmail_types::Address;

use super::{Done, mailbox_name};
use crate::ImapError;
use crate::session::Session;
use crate::view::{Numbers, Selected};

/// `uids` as a UID set, with runs of consecutive UIDs as ranges.
pub(crate) fn uid_set(uids: impl Iterator<Item = Uid>) -> Option<UidSet> {
    let mut elements: Vec<UidElement> = Vec::new();
    for uid in uids {
        let n = NonZeroU32::new(uid.0)?;
        match elements.last_mut() {
            Some(UidElement::Single(a)) if a.get() + 1 == n.get() => *elements.last_mut()? = UidElement::Range(*a, n),
            Some(UidElement::Range(_, b)) if b.get() + 1 == n.get() => *b = n,
            _ => elements.push(UidElement::Single(n)),
        }
    }
    Vec1::try_from(elements).ok().map(UidSet)
}

/// COPYUID for what a COPY or MOVE made, if anything.
pub(crate) fn copy_uid(copied: &Copied) -> Option<Code<'static>> {
    Some(Code::CopyUid {
        uid_validity: NonZeroU32::new(copied.uid_validity)?,
        source: uid_set(copied.pairs.iter().map(|p| p.0))?,
        destination: uid_set(copied.pairs.iter().map(|p| p.1))?,
    })
}

/// The destination of a COPY, MOVE or APPEND: one of the user's own mailboxes.
pub(crate) fn destination(s: &Session, mailbox: &Mailbox<'_>) -> Result<MailboxInfo, ImapError> {
    let user = s.user()?;
    let name = mailbox_name(s, mailbox)?;
    s.shared.store.mailbox(&user.name, &name)?.ok_or_else(ImapError::try_create)
}

/// Who files into `to`: the user's address, and the model whose Ask folder `to` is, if it is one.
pub(crate) fn filer(s: &Session, to: &MailboxInfo) -> Result<(Address, Option<Address>), ImapError> {
    let by = s.user()?.address.clone();
    Ok((by, s.shared.config.ask_folder(&to.name).map(|m| m.address.clone())))
}

/// The tagged OK's text: `done`, and what was asked of whom.
pub(crate) fn done_text(done: &'static str, model: Option<&Address>, jobs: &[JobId]) -> String {
    match (model, jobs) {
        (Some(model), [_, ..]) => {
            let ids: Vec<String> = jobs.iter().map(|j| j.to_string()).collect();
            format!("{done}; asked {model} (job {}); the answer will arrive in INBOX", ids.join(", "))
        }
        _ => done.to_string(),
    }
}

/// The UIDs a COPY or MOVE names in the selected mailbox.
pub(crate) fn sources(selected: &Selected, set: &SequenceSet, uid: bool) -> Result<Vec<Uid>, ImapError> {
    Ok(selected.resolve(set, Numbers::of(uid))?.into_iter().map(|i| selected.messages[i].uid).collect())
}

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
    let uids = sources(selected, &set, uid)?;
    let filing = Filing { by: &by, ask: ask.as_ref() };
    let copied = store.copy_mail(selected.info.id, &uids, to.id, Some(&filing)).await?;
    let text = done_text(if uid { "UID COPY completed" } else { "COPY completed" }, ask.as_ref(), &copied.jobs);
    Ok(match copy_uid(&copied) {
        Some(code) => Done::with_code(code, text),
        None => Done::ok(text),
    })
}
