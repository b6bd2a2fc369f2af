//! STATUS (RFC 3501 §6.3.10): counts of a mailbox without selecting it, its HIGHESTMODSEQ
//! (RFC 7162 §3.1.6) and SIZE (RFC 8438).

use std::num::NonZeroU32;

use imap_next::imap_types::mailbox::Mailbox;
use imap_next::imap_types::response::Data;
use imap_next::imap_types::status::{StatusDataItem, StatusDataItemName};

use super::{Done, condstore, mailbox_name};
use crate::ImapError;
use crate::session::Session;

pub(crate) fn run(s: &mut Session, mailbox: Mailbox<'static>, names: &[StatusDataItemName]) -> Result<Done, ImapError> {
    let user = s.user()?.clone();
    let name = mailbox_name(s, &mailbox)?;
    let items = items(s, &user.name, &name, names)?;
    s.data(Data::Status { mailbox, items: items.into() });
    // RFC 7162 §3.1: STATUS (HIGHESTMODSEQ) is a CONDSTORE enabling command.
    if names.contains(&StatusDataItemName::HighestModSeq) {
        condstore::enable_condstore(s);
    }
    Ok(Done::ok("STATUS completed"))
}

/// The items STATUS reports for `owner`'s mailbox `name` (also LIST-STATUS's, `list.rs`).
pub(crate) fn items(
    s: &Session,
    owner: &str,
    name: &str,
    names: &[StatusDataItemName],
) -> Result<Vec<StatusDataItem>, ImapError> {
    let store = &s.shared.store;
    let info = store.mailbox(owner, name)?.ok_or_else(ImapError::nonexistent)?;
    let mail = store.mail(info.id)?;
    let count =
        |flag: &str| mail.iter().filter(|m| m.flags.iter().any(|f| f.eq_ignore_ascii_case(flag))).count() as u32;
    let one = NonZeroU32::MIN;
    let items: Vec<StatusDataItem> = names
        .iter()
        .filter_map(|n| {
            Some(match n {
                StatusDataItemName::Messages => StatusDataItem::Messages(mail.len() as u32),
                StatusDataItemName::Recent => StatusDataItem::Recent(count("\\Recent")),
                StatusDataItemName::UidNext => StatusDataItem::UidNext(NonZeroU32::new(info.uid_next.0).unwrap_or(one)),
                StatusDataItemName::UidValidity => {
                    StatusDataItem::UidValidity(NonZeroU32::new(info.uid_validity).unwrap_or(one))
                }
                StatusDataItemName::Unseen => StatusDataItem::Unseen(mail.len() as u32 - count("\\Seen")),
                StatusDataItemName::Deleted => StatusDataItem::Deleted(count("\\Deleted")),
                StatusDataItemName::DeletedStorage => StatusDataItem::DeletedStorage(
                    mail.iter().filter(|m| m.flags.iter().any(|f| f == "\\Deleted")).map(|m| m.size).sum(),
                ),
                // RFC 8438 (RFC 9051 §6.3.11): the octets of every message, as RFC822.SIZE counts.
                StatusDataItemName::Size => StatusDataItem::Size(mail.iter().map(|m| m.size).sum()),
                // RFC 7162 §3.1.6.
                StatusDataItemName::HighestModSeq => StatusDataItem::HighestModSeq(info.highest_modseq.0),
                #[allow(unreachable_patterns)]
                _ => return None,
            })
        })
        .collect();
    Ok(items)
}
