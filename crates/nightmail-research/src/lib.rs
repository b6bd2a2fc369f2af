//! The research tools a model calls while it works overnight: `fetch` (a web page, PDF or text file
//! as readable text) and `web_search` (a SearXNG instance or a command). Nothing here knows of mail
//! or models; the worker passes plain option structs and journals the `Page`s and `SearchHit`s.
//!
//! Every request goes through one gate (`hop.rs`): the URL's host is resolved here, refused if any
//! address is not global (the server-side request forgery hole), and the connection is pinned to
//! the addresses checked, so a second DNS answer cannot swap them.

mod address;
mod error;
mod fetch;
mod hop;
mod policy;
mod redirect;
mod robots;
mod search;
mod text;

pub use error::{FetchError, SearchError};
pub use fetch::{Page, fetch};
pub use policy::FetchPolicy;
pub use search::{SearchHit, SearchService, web_search};
pub use text::TEXT_LIMIT_CHARS;
