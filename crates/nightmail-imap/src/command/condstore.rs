//! CONDSTORE and QRESYNC (RFC 7162): what a session has enabled, and the pieces the commands
//! share: the MODSEQ item and codes, UID sets, VANISHED, the SELECT and FETCH modifiers.
//!
//! The grammar is imap-codec's (`ext_condstore_qresync`): SELECT/EXAMINE parameters, FETCH and
//! STORE modifiers, the MODSEQ search key and fetch item, STATUS HIGHESTMODSEQ, and the VANISHED,
//! HIGHESTMODSEQ, MODIFIED and CLOSED responses. The store keeps the mod-sequences
//! (`nightmail-store`'s `modseq.rs`): persistent, so NOMODSEQ is never sent.

use std::num::{NonZeroU32, NonZeroU64};

use imap_next::imap_types::command::{FetchModifier, SelectParameter, StoreModifier};
use imap_next::imap_types::core::Atom;
use imap_next::imap_types::extensions::enable::CapabilityEnable;
use imap_next::imap_types::fetch::MessageDataItem;
use imap_next::imap_types::response::{Code, Data, StatusKind};
use imap_next::imap_types::sequence::{SeqOrUid, Sequence, SequenceSet};
use nightmail_store::{MailboxInfo, ModSeq, Uid};

use crate::ImapError;
use crate::command::fetch::flags_item;
use crate::session::{Session, State};
use crate::view::{Selected, without_recent};

/// How much of RFC 7162 the client has turned on. QRESYNC includes CONDSTORE (§3.2.3), so the
/// two are one ordered state, never two flags that could disagree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tracking {
    #[default]
    Off,
    /// §3.1: after a "CONDSTORE enabling command", every untagged FETCH of flags carries UID and
    /// MODSEQ, and SELECT's HIGHESTMODSEQ matters to the client.
    CondStore,
    /// §3.2.3 ENABLE QRESYNC: also VANISHED instead of EXPUNGE (§3.2.10), and SELECT's QRESYNC
    /// parameter and UID FETCH's VANISHED modifier are allowed.
    QResync,
}

impl Tracking {
    pub fn condstore(self) -> bool {
        self >= Tracking::CondStore
    }

    pub fn qresync(self) -> bool {
        self == Tracking::QResync
    }
}

/// The QRESYNC capability, as ENABLE names it (imap-types has no variant for it).
pub(crate) fn qresync_capability() -> CapabilityEnable<'static> {
    CapabilityEnable::from(Atom::unvalidated("QRESYNC"))
}

/// A mod-sequence for the wire: the store's start at 1 (RFC 7162 §7 `mod-sequence-value`).
pub(crate) fn wire(modseq: ModSeq) -> NonZeroU64 {
    NonZeroU64::new(modseq.0).unwrap_or(NonZeroU64::MIN)
}

pub(crate) fn modseq_item(modseq: ModSeq) -> MessageDataItem<'static> {
    MessageDataItem::ModSeq(wire(modseq))
}

/// §3.1.2.1: `OK [HIGHESTMODSEQ n]`.
pub(crate) fn highest(info: &MailboxInfo) -> Code<'static> {
    Code::HighestModSeq(wire(info.highest_modseq))
}

/// A "CONDSTORE enabling command" ran (§3.1). The first one while a mailbox is selected tells the
/// client that mailbox's HIGHESTMODSEQ, which it may not have taken note of at SELECT.
pub(crate) fn enable_condstore(s: &mut Session) {
    if s.tracking.condstore() {
        return;
    }
    s.tracking = Tracking::CondStore;
    let store = s.shared.store.clone();
    if let State::Selected(_, selected) = &s.state
        && let Ok(Some(info)) = store.mailbox_by_id(selected.info.id)
    {
        s.untagged(StatusKind::Ok, Some(highest(&info)), "highest mod-sequence");
    }
}

/// UIDs, ascending, as the shortest sequence set (`1:3,7`); `None` for none.
pub(crate) fn uid_set(uids: &[Uid]) -> Option<SequenceSet> {
    number_set(uids.iter().map(|u| u.0))
}

/// Numbers (UIDs or sequence numbers), ascending, as the shortest sequence set.
pub(crate) fn number_set(numbers: impl IntoIterator<Item = u32>) -> Option<SequenceSet> {
    let mut sequences = Vec::new();
    let mut iter = numbers.into_iter().filter_map(NonZeroU32::new).peekable();
    while let Some(first) = iter.next() {
        let mut last = first;
        while let Some(&next) = iter.peek() {
            if next.get() != last.get() + 1 {
                break;
            }
            last = next;
            iter.next();
        }
        sequences.push(if first == last {
            Sequence::Single(SeqOrUid::Value(first))
        } else {
            Sequence::Range(SeqOrUid::Value(first), SeqOrUid::Value(last))
        });
    }
    SequenceSet::try_from(sequences).ok()
}

/// Whether `uid` is in `set`, `*` standing for every UID above the others (known-uids and a UID
/// FETCH's set speak of UIDs the client saw, which may lie above the highest one left).
pub(crate) fn set_contains(set: &SequenceSet, uid: Uid) -> bool {
    let value = |s: &SeqOrUid| match s {
        SeqOrUid::Value(v) => v.get(),
        SeqOrUid::Asterisk => u32::MAX,
    };
    set.0.as_ref().iter().any(|seq| match seq {
        Sequence::Single(s) => value(s) == uid.0,
        Sequence::Range(a, b) => (value(a).min(value(b))..=value(a).max(value(b))).contains(&uid.0),
    })
}

/// Takes `uids` out of the view and says so: one `VANISHED` once QRESYNC is on (§3.2.10), else an
/// EXPUNGE each, highest first, so every number is right when sent (RFC 3501 §7.4.1).
pub(crate) fn expunged(selected: &mut Selected, uids: &[Uid], tracking: Tracking) -> Vec<Data<'static>> {
    let mut gone = Vec::new();
    let mut out = Vec::new();
    let mut indices: Vec<usize> = uids.iter().filter_map(|&u| selected.index_of_uid(u)).collect();
    indices.sort_unstable();
    indices.dedup();
    for &i in indices.iter().rev() {
        if !tracking.qresync() {
            out.push(Data::Expunge(selected.seq_of(i).0));
        }
        let uid = selected.messages.remove(i).uid;
        selected.recent.remove(&uid);
        gone.push(uid);
    }
    gone.reverse();
    if tracking.qresync()
        && let Some(known_uids) = uid_set(&gone)
    {
        out.push(Data::Vanished { earlier: false, known_uids });
    }
    out
}

/// The untagged FETCH that tells of a message's new flags: with UID and MODSEQ once CONDSTORE is
/// on (§3.1: "both UID and mod-sequence data in all subsequent untagged FETCH responses").
pub(crate) fn flags_fetch(selected: &Selected, index: usize, tracking: Tracking) -> Option<Data<'static>> {
    let entry = &selected.messages[index];
    let mut items = vec![flags_item(entry, selected.recent.contains(&entry.uid))];
    if tracking.condstore() {
        items.push(MessageDataItem::Uid(NonZeroU32::new(entry.uid.0)?));
        items.push(modseq_item(entry.modseq));
    }
    Data::fetch(selected.seq_of(index).0, items).ok()
}

/// Takes the flag changes other sessions made into the view, telling each with an untagged FETCH,
/// before CHANGEDSINCE or MODSEQ is weighed against it: the view otherwise learns of them only
/// after the command, and a change since the client's mod-sequence would go unanswered. Only
/// flags: messages come and go at the usual points (RFC 3501 §7.4.1), so numbers stay valid.
/// The view positions `covered` tells are left to the command's own responses.
pub(crate) fn catch_up_flags(s: &mut Session, covered: impl Fn(usize) -> bool) -> Result<(), ImapError> {
    let (store, tracking) = (s.shared.store.clone(), s.tracking);
    let selected = s.selected()?;
    let mut out = Vec::new();
    for entry in store.mail(selected.info.id)?.into_iter().map(without_recent) {
        let Some(i) = selected.index_of_uid(entry.uid) else { continue };
        if selected.messages[i].modseq != entry.modseq {
            selected.learn_keywords(&entry.flags);
            selected.messages[i].flags = entry.flags;
            selected.messages[i].modseq = entry.modseq;
            if !covered(i) {
                out.extend(flags_fetch(selected, i, tracking));
            }
        }
    }
    s.announce_new_keywords();
    for data in out {
        s.data(data);
    }
    Ok(())
}

/// SELECT/EXAMINE's QRESYNC parameter (§3.2.5), checked.
pub(crate) struct QResyncParameter {
    uid_validity: NonZeroU32,
    modseq: ModSeq,
    known_uids: Option<SequenceSet>,
}

/// Reads SELECT/EXAMINE parameters: CONDSTORE enables CONDSTORE (§3.1.8); QRESYNC without a
/// prior ENABLE QRESYNC is BAD (§3.2.5, "MUST respond with the tagged BAD").
pub(crate) fn select_parameters(
    s: &mut Session,
    parameters: Vec<SelectParameter>,
) -> Result<Option<QResyncParameter>, ImapError> {
    let mut qresync = None;
    for parameter in parameters {
        match parameter {
            SelectParameter::CondStore => {
                if !s.tracking.condstore() {
                    s.tracking = Tracking::CondStore;
                }
            }
            SelectParameter::QResync { uid_validity, mod_sequence_value, known_uids, .. } => {
                if !s.tracking.qresync() {
                    return Err(ImapError::bad(
                        "QRESYNC must be enabled first (ENABLE QRESYNC, RFC 7162 section 3.2.5)",
                    ));
                }
                // seq-match-data (§3.2.5.2) helps servers that forget expunges; this one keeps
                // every expunge with its mod-sequence, so the UIDs alone answer exactly.
                qresync = Some(QResyncParameter { uid_validity, modseq: ModSeq(mod_sequence_value.get()), known_uids });
            }
        }
    }
    Ok(qresync)
}

/// After SELECT's usual responses: if the client's UIDVALIDITY still holds, the UIDs expunged
/// since its mod-sequence (`VANISHED (EARLIER)`) and the FETCH of every message changed since
/// (§3.2.5), both limited to its known UIDs when it gave them.
pub(crate) fn resynchronise(s: &mut Session, qresync: QResyncParameter) -> Result<(), ImapError> {
    let store = s.shared.store.clone();
    let tracking = s.tracking;
    let selected = s.selected()?;
    if qresync.uid_validity.get() != selected.info.uid_validity {
        return Ok(());
    }
    let known = |uid: Uid| qresync.known_uids.as_ref().is_none_or(|set| set_contains(set, uid));
    let vanished: Vec<Uid> =
        store.expunged_since(selected.info.id, qresync.modseq)?.into_iter().filter(|&u| known(u)).collect();
    let mut out = Vec::new();
    if let Some(known_uids) = uid_set(&vanished) {
        out.push(Data::Vanished { earlier: true, known_uids });
    }
    for (i, entry) in selected.messages.iter().enumerate() {
        if entry.modseq > qresync.modseq && known(entry.uid) {
            out.extend(flags_fetch(selected, i, tracking));
        }
    }
    for data in out {
        s.data(data);
    }
    Ok(())
}

/// FETCH's modifiers (§3.1.4.1 CHANGEDSINCE, §3.2.6 VANISHED): the mod-sequence to report
/// changes after, and whether to report the UIDs expunged since it too.
pub(crate) struct ChangedSince {
    pub since: ModSeq,
    pub vanished: bool,
}

pub(crate) fn fetch_modifiers(
    s: &mut Session,
    modifiers: &[FetchModifier],
    uid: bool,
) -> Result<Option<ChangedSince>, ImapError> {
    let mut since = None;
    let mut vanished = false;
    for modifier in modifiers {
        match modifier {
            FetchModifier::ChangedSince(n) => since = Some(ModSeq(n.get())),
            FetchModifier::Vanished => vanished = true,
        }
    }
    if vanished {
        // §3.2.6: only in UID FETCH, only with CHANGEDSINCE, only once QRESYNC is enabled; BAD
        // otherwise.
        if !uid {
            return Err(ImapError::bad("VANISHED is only allowed in UID FETCH (RFC 7162 section 3.2.6)"));
        }
        if !s.tracking.qresync() {
            return Err(ImapError::bad("VANISHED needs ENABLE QRESYNC first (RFC 7162 section 3.2.6)"));
        }
        if since.is_none() {
            return Err(ImapError::bad("VANISHED needs CHANGEDSINCE (RFC 7162 section 3.2.6)"));
        }
    }
    let Some(since) = since else { return Ok(None) };
    enable_condstore(s);
    Ok(Some(ChangedSince { since, vanished }))
}

/// STORE's UNCHANGEDSINCE (§3.1.3), a CONDSTORE enabling command.
pub(crate) fn unchanged_since(s: &mut Session, modifiers: &[StoreModifier]) -> Option<ModSeq> {
    let since = modifiers.iter().map(|StoreModifier::UnchangedSince(n)| ModSeq(*n)).next_back()?;
    enable_condstore(s);
    Some(since)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_sets_are_ranges() {
        let uids: Vec<Uid> = [1, 2, 3, 5, 7, 8].into_iter().map(Uid).collect();
        let set = uid_set(&uids).unwrap();
        assert_eq!(set, SequenceSet::try_from("1:3,5,7:8").unwrap());
        assert!(uid_set(&[]).is_none());
        assert!(set_contains(&SequenceSet::try_from("4:*").unwrap(), Uid(90)));
        assert!(!set_contains(&set, Uid(4)));
    }
}
