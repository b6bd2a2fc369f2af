//! Outbound mail. nightmail is its users' submission server, not an MX: mail to outside
//! addresses is handed to one smarthost (`[relay]`), which delivers it and signs it (SPF/DKIM are
//! its job). The store keeps the outbound queue (`nightmail-store`'s `outbound.rs`); this crate
//! works through it:
//!
//! - `route.rs`: a [`Route`] (host, port, TLS, login) and [`send`]: one envelope, one outcome per
//!   recipient, with lettre's async SMTP client over rustls.
//! - `schedule.rs`: retry times (about 1 m, 5 m, 15 m, 1 h, 4 h, then 8 h, jittered) and expiry.
//! - `dsn.rs`: the RFC 3464 delivery-status notice, threaded into the sender's INBOX.
//! - `sender.rs`: the daemon's [`Relay`] task.
//!
//! Like the SMTP server, this crate never sees models.

mod dsn;
mod error;
mod route;
mod schedule;
mod sender;

pub use error::RelayError;
pub use route::{Envelope, Outcome, Route, send};
pub use schedule::backoff;
pub use sender::{OnSent, Relay};
