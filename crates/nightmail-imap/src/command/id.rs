//! ID (RFC 2971 §3.1): the server's name and version, whatever the client sent.

use imap_next::imap_types::core::{IString, NString};
use imap_next::imap_types::response::Data;

use super::Done;
use crate::ImapError;
use crate::mime::istring;
use crate::session::Session;

type Parameters = Option<Vec<(IString<'static>, NString<'static>)>>;

pub(crate) fn run(s: &mut Session, _client: Parameters) -> Result<Done, ImapError> {
    let pair = |k: &str, v: &str| (istring(k.to_string()), NString(Some(istring(v.to_string()))));
    s.data(Data::Id { parameters: Some(vec![pair("name", "nightmail"), pair("version", env!("CARGO_PKG_VERSION"))]) });
    Ok(Done::ok("ID completed"))
}
