//! ENABLE (RFC 5161 §3.1): UTF8=ACCEPT (RFC 6855 §3), CONDSTORE and QRESYNC (RFC 7162 §3.1,
//! §3.2.3), IMAP4rev2 (RFC 9051 §6.3.1, `rev2.rs`); ENABLED lists those asked for, and unknown capabilities are ignored as the RFC
//! requires.

use imap_next::imap_types::core::Vec1;
use imap_next::imap_types::extensions::enable::CapabilityEnable;
use imap_next::imap_types::extensions::utf8::Utf8Kind;
use imap_next::imap_types::response::Data;

use super::Done;
use super::condstore::{Tracking, qresync_capability};
use crate::ImapError;
use crate::session::{Session, State};

pub(crate) fn run(s: &mut Session, wanted: Vec1<CapabilityEnable<'static>>) -> Result<Done, ImapError> {
    // RFC 5161 §3.1: valid only in the authenticated state.
    if !matches!(s.state, State::Authenticated(_)) {
        return Err(ImapError::bad("ENABLE is only valid after login and before SELECT"));
    }
    let utf8 = CapabilityEnable::Utf8(Utf8Kind::Accept);
    let mut enabled = Vec::new();
    if wanted.as_ref().contains(&utf8) {
        s.utf8 = true;
        enabled.push(utf8);
    }
    // RFC 7162 §3.1 (ENABLE CONDSTORE is a CONDSTORE enabling command) and §3.2.3 (QRESYNC,
    // which implies CONDSTORE); ENABLED names what was asked for.
    let named = |name: &str| wanted.as_ref().iter().any(|c| c.to_string().eq_ignore_ascii_case(name));
    if named("CONDSTORE") {
        s.tracking = s.tracking.max(Tracking::CondStore);
        enabled.push(CapabilityEnable::CondStore);
    }
    if named("QRESYNC") {
        s.tracking = Tracking::QResync;
        enabled.push(qresync_capability());
    }
    if named("IMAP4rev2") {
        enabled.push(super::rev2::enable(s));
    }
    s.data(Data::Enabled { capabilities: enabled });
    Ok(Done::ok("ENABLE completed"))
}
