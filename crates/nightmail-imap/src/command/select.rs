//! SELECT and EXAMINE (RFC 3501 §6.3.1–6.3.2): FLAGS, EXISTS, RECENT, then OK [UNSEEN],
//! [PERMANENTFLAGS], [UIDVALIDITY], [UIDNEXT], and the tagged OK [READ-WRITE] or [READ-ONLY].
//! SELECT claims the messages' `\Recent` for this session (§2.3.2); EXAMINE changes nothing.
//! After ENABLE IMAP4rev2 (RFC 9051 §6.3.2): no RECENT, no UNSEEN, a LIST line of the mailbox.
//! RFC 7162: OK [HIGHESTMODSEQ] always (§3.1.2.1), OK [CLOSED] when another mailbox was
//! selected (§3.2.11), and the CONDSTORE and QRESYNC parameters (`condstore.rs`).

use std::collections::HashSet;
use std::num::NonZeroU32;

use imap_next::imap_types::IntoStatic;
use imap_next::imap_types::command::SelectParameter;
use imap_next::imap_types::flag::{Flag, FlagPerm};
use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::{Code, Data, StatusKind};
use nightmail_store::Uid;

use super::{Done, condstore, mailbox_name};
use crate::ImapError;
use crate::session::{Session, State};
use crate::view::Selected;

pub(crate) const SYSTEM_FLAGS: [Flag<'static>; 5] =
    [Flag::Answered, Flag::Flagged, Flag::Deleted, Flag::Seen, Flag::Draft];

/// FLAGS (the system flags and every keyword in use) and PERMANENTFLAGS (those and `\*`: any
/// new keyword is kept; none in a read-only mailbox), RFC 3501 §7.2.6 and §6.3.1.
pub(crate) fn flags_of(selected: &Selected) -> (Vec<Flag<'static>>, Vec<FlagPerm<'static>>) {
    let keywords =
        selected.keywords.iter().filter_map(|k| Flag::try_from(k.as_str()).ok().map(IntoStatic::into_static));
    let flags: Vec<Flag<'static>> = SYSTEM_FLAGS.iter().cloned().chain(keywords).collect();
    let permanent = if selected.read_only {
        vec![]
    } else {
        flags.iter().cloned().map(FlagPerm::Flag).chain([FlagPerm::Asterisk]).collect()
    };
    (flags, permanent)
}

pub(crate) async fn run(
    s: &mut Session,
    mailbox: Mailbox<'static>,
    read_only: bool,
    parameters: Vec<SelectParameter>,
) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let qresync = condstore::select_parameters(s, parameters)?;
    // RFC 7162 §3.2.11: the responses before CLOSED are the old mailbox's, those after the new one's.
    if matches!(s.state, State::Selected(..)) {
        s.untagged(StatusKind::Ok, Some(Code::Closed), "previous mailbox closed");
    }
    // §6.3.1: SELECT first deselects; a failed SELECT leaves no mailbox selected.
    s.deselect();
    let name = mailbox_name(s, &mailbox)?;
    let store = s.shared.store.clone();
    let info = store.mailbox(&user.name, &name)?.ok_or_else(ImapError::nonexistent)?;
    // RFC 9051 has no `\Recent`: an IMAP4rev2 session claims none (`rev2.rs`).
    let recent: HashSet<Uid> = if s.rev2 {
        HashSet::new()
    } else if read_only {
        store.mail(info.id)?.into_iter().filter(|m| m.flags.iter().any(|f| f == "\\Recent")).map(|m| m.uid).collect()
    } else {
        store.claim_recent(info.id).await?.into_iter().collect()
    };
    let mut selected = Selected::load(&store, info, read_only, recent)?;
    selected.rev2 = s.rev2;
    let (flags, permanent) = flags_of(&selected);
    s.data(Data::Flags(flags));
    s.data(Data::Exists(selected.exists()));
    if !s.rev2 {
        s.data(Data::Recent(selected.recent.len() as u32));
    }
    // RFC 9051 §6.3.2: a rev2 session is told the mailbox's name and attributes in a LIST line
    // (the name as the server spells it) and no UNSEEN code (§7.1, removed).
    if s.rev2 {
        super::rev2::list_selected(s, &selected.info.name)?;
    } else if let Some(first) = selected.messages.iter().position(|m| !m.flags.iter().any(|f| f == "\\Seen")) {
        s.untagged(StatusKind::Ok, Some(Code::Unseen(NonZeroU32::new(first as u32 + 1).expect("+1"))), "first unseen");
    }
    s.untagged(StatusKind::Ok, Some(Code::PermanentFlags(permanent)), "flags kept");
    if let Some(v) = NonZeroU32::new(selected.info.uid_validity) {
        s.untagged(StatusKind::Ok, Some(Code::UidValidity(v)), "UIDs valid");
    }
    if let Some(v) = NonZeroU32::new(selected.info.uid_next.0) {
        s.untagged(StatusKind::Ok, Some(Code::UidNext(v)), "predicted next UID");
    }
    s.untagged(StatusKind::Ok, Some(condstore::highest(&selected.info)), "highest mod-sequence");
    s.state = State::Selected(user, Box::new(selected));
    if let Some(qresync) = qresync {
        condstore::resynchronise(s, qresync)?;
    }
    Ok(if read_only {
        Done::with_code(Code::ReadOnly, "EXAMINE completed")
    } else {
        Done::with_code(Code::ReadWrite, "SELECT completed")
    })
}
