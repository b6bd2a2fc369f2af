//! Replies: the code, the enhanced status code (RFC 3463) and the text travel together, so each
//! rejection is a value that says exactly what went wrong on the wire.

use std::borrow::Cow;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub esc: [u8; 3],
    pub text: Cow<'static, str>,
}

impl Reply {
    pub const fn new(code: u16, esc: [u8; 3], text: &'static str) -> Reply {
        Reply { code, esc, text: Cow::Borrowed(text) }
    }

    pub fn owned(code: u16, esc: [u8; 3], text: String) -> Reply {
        Reply { code, esc, text: Cow::Owned(text) }
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        let [a, b, c] = self.esc;
        // Replies are single lines: strip any CR/LF a caller's text might hold.
        let text = self.text.replace(['\r', '\n'], " ");
        if self.esc == [0, 0, 0] {
            // RFC 2034 §3: no enhanced code on the greeting or on 354.
            out.extend_from_slice(format!("{} {text}\r\n", self.code).as_bytes());
        } else {
            smtp_proto::Response::new(self.code, a, b, c, text).write(out).expect("writing to a Vec cannot fail");
        }
    }

    pub fn is_positive(&self) -> bool {
        self.code < 400
    }
}

// RFC 5321 §4.2.2 codes with the RFC 3463 / RFC 4954 enhanced codes servers use for them.
pub const OK: Reply = Reply::new(250, [2, 0, 0], "OK");
pub const BYE: Reply = Reply::new(221, [2, 0, 0], "Bye");
pub const START_DATA: Reply = Reply::new(354, [0, 0, 0], "Start mail input; end with <CRLF>.<CRLF>");
pub const READY_TLS: Reply = Reply::new(220, [2, 0, 0], "Ready to start TLS");
pub const UNRECOGNIZED: Reply = Reply::new(500, [5, 5, 1], "Unrecognized command");
pub const LINE_TOO_LONG: Reply = Reply::new(500, [5, 5, 2], "Line too long");
pub const NOT_IMPLEMENTED: Reply = Reply::new(502, [5, 5, 1], "Command not implemented");
pub const BAD_SEQUENCE_EHLO: Reply = Reply::new(503, [5, 5, 1], "Send EHLO first");
pub const BAD_SEQUENCE_MAIL: Reply = Reply::new(503, [5, 5, 1], "Send MAIL FROM first");
pub const NESTED_MAIL: Reply = Reply::new(503, [5, 5, 1], "A transaction is already open: send RSET first");
pub const NO_RECIPIENTS: Reply = Reply::new(554, [5, 5, 1], "No valid recipients");
pub const ALREADY_AUTHENTICATED: Reply = Reply::new(503, [5, 5, 1], "Already authenticated");
pub const AUTH_REQUIRED: Reply = Reply::new(530, [5, 7, 0], "Authentication required");
pub const AUTH_OK: Reply = Reply::new(235, [2, 7, 0], "Authentication successful");
pub const AUTH_INVALID: Reply = Reply::new(535, [5, 7, 8], "Authentication credentials invalid");
pub const AUTH_CANCELLED: Reply = Reply::new(501, [5, 0, 0], "Authentication cancelled");
pub const AUTH_BAD_BASE64: Reply = Reply::new(501, [5, 5, 2], "Cannot decode the response: expected base64");
pub const AUTH_MECHANISM: Reply =
    Reply::new(504, [5, 5, 4], "Unrecognized authentication mechanism: use PLAIN or LOGIN");
pub const ENCRYPTION_REQUIRED: Reply = Reply::new(538, [5, 7, 11], "Encryption required: send STARTTLS first");
pub const TLS_UNAVAILABLE: Reply = Reply::new(454, [4, 7, 0], "TLS not available");
pub const RELAY_DENIED: Reply = Reply::new(
    550,
    [5, 7, 1],
    "Relaying denied: this server delivers only to its own users and models; add a [relay] smarthost to its configuration to send to outside addresses",
);
pub const NO_SUCH_USER: Reply = Reply::new(550, [5, 1, 1], "No such user or model here");
pub const RELAY_NULL_SENDER: Reply = Reply::new(
    550,
    [5, 7, 1],
    "Relaying needs a sender: use your own address in MAIL FROM, not <>, for mail to outside addresses",
);
pub const TOO_MANY_RECIPIENTS: Reply = Reply::new(452, [4, 5, 3], "Too many recipients");
pub const TOO_BIG: Reply = Reply::new(552, [5, 3, 4], "Message size exceeds the fixed maximum message size");
/// RFC 3463 §3.4 X.3.1 "mail system full", with RFC 5321's 452 (insufficient system storage):
/// temporary, so the client keeps the message and retries.
pub const STORAGE_FULL: Reply =
    Reply::new(452, [4, 3, 1], "Insufficient system storage: the disk is nearly full; try again later");
pub const STORE_FAILED: Reply = Reply::new(451, [4, 3, 0], "Could not store the message; try again later");
pub const TIMEOUT: Reply = Reply::new(421, [4, 4, 2], "Timeout: closing connection");
pub const TOO_MANY_ERRORS: Reply = Reply::new(421, [4, 7, 0], "Too many errors: closing connection");
pub const BUSY: Reply = Reply::new(421, [4, 7, 0], "Too many connections; try again later");
pub const BUSY_CLIENT: Reply =
    Reply::new(421, [4, 7, 0], "Too many connections from your address; close some and try again");
