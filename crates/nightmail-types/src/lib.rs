//! Domain types every nightmail crate shares. Values are checked when they are made, so the
//! rest of the code holds typed values and never re-validates strings.

mod address;
mod header_text;
mod timestamp;
pub mod utf7;

pub use address::{Address, AddressError};
pub use header_text::{HeaderText, is_msg_id};
pub use timestamp::Timestamp;
