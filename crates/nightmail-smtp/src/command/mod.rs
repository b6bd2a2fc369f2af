//! One module per SMTP command, each citing the RFC section it implements.

pub(crate) mod auth;
pub(crate) mod data;
pub(crate) mod ehlo;
pub(crate) mod mail;
pub(crate) mod rcpt;
pub(crate) mod starttls;
