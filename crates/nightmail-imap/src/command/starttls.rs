//! STARTTLS (RFC 3501 §6.2.1): tagged OK, then the TLS handshake. Offered only on a plain
//! connection when TLS is configured.

use super::Done;
use crate::ImapError;
use crate::session::{Flow, Session};

pub(crate) fn run(s: &mut Session) -> Result<Done, ImapError> {
    if s.tls_active {
        return Err(ImapError::bad("TLS is already active"));
    }
    if s.shared.tls.is_none() {
        return Err(ImapError::bad("STARTTLS is not available (no [tls] in the configuration)"));
    }
    if !matches!(s.state, crate::session::State::NotAuthenticated) {
        return Err(ImapError::bad("STARTTLS is only allowed before login"));
    }
    Ok(Done { flow: Flow::StartTls, ..Done::ok("begin TLS negotiation now") })
}
