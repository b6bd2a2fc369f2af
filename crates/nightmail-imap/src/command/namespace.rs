//! NAMESPACE (RFC 2342 §5): one personal namespace with no prefix and `/` as the delimiter;
//! no other users' or shared namespaces, since a user sees only their own mailboxes.

use imap_next::imap_types::core::QuotedChar;
use imap_next::imap_types::extensions::namespace::Namespace;
use imap_next::imap_types::response::Data;

use super::Done;
use crate::ImapError;
use crate::mime::istring;
use crate::session::Session;

pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    s.user()?;
    let personal =
        Namespace { prefix: istring(String::new()), delimiter: Some(QuotedChar::unvalidated('/')), extensions: vec![] };
    s.data(Data::Namespace { personal: vec![personal], other: vec![], shared: vec![] });
    Ok(Done::ok("NAMESPACE completed"))
}
