//! Schema 5: mailbox names are kept as UTF-8, no longer in their IMAP wire form (modified UTF-7,
//! RFC 3501 §5.1.3); IMAP converts at the edge. Each stored name that is valid modified UTF-7 and
//! stands for another text is renamed to that text. A name that is not (an earlier build kept any
//! name it was sent) stays as it is and is listed in its encoded form from now on; so does one
//! whose UTF-8 form is taken by another mailbox of the same user.
//!
//! Decoding twice could change a name again, so the renames and the new schema version are
//! written in one transaction: the migration runs completely or not at all.

use nightmail_types::utf7;
use sled::Transactional;
use sled::transaction::ConflictableTransactionError;

use crate::StoreError;
use crate::mailbox::{MailboxInfo, name_key};
use crate::schema::{KEY_SCHEMA_VERSION, MAILBOX_NAMES, MAILBOXES, META, decode, encode};

pub fn apply(db: &sled::Db) -> Result<(), StoreError> {
    let mailboxes = db.open_tree(MAILBOXES)?;
    let names = db.open_tree(MAILBOX_NAMES)?;
    let mut renames: Vec<(MailboxInfo, String)> = Vec::new();
    for record in mailboxes.iter().values() {
        let info: MailboxInfo = decode(MAILBOXES, &record?)?;
        let Ok(utf8) = utf7::decode(info.name.as_bytes()) else { continue };
        let taken = names.get(name_key(&info.owner, &utf8))?.is_some()
            || renames.iter().any(|(other, to)| other.owner == info.owner && *to == utf8);
        if utf8 != info.name && !taken {
            renames.push((info, utf8));
        }
    }
    let meta = db.open_tree(META)?;
    (&meta, &mailboxes, &names)
        .transaction(|(meta, mailboxes, names)| {
            for (info, utf8) in &renames {
                names.remove(name_key(&info.owner, &info.name))?;
                names.insert(name_key(&info.owner, utf8), &info.id.to_be_bytes())?;
                let renamed = MailboxInfo { name: utf8.clone(), ..info.clone() };
                mailboxes.insert(&info.id.to_be_bytes(), encode(&renamed))?;
            }
            meta.insert(KEY_SCHEMA_VERSION, &5u32.to_be_bytes())?;
            Ok::<(), ConflictableTransactionError<StoreError>>(())
        })
        .map_err(StoreError::from)
}
