//! Errors a model reads: each says what happened and, where there is one, what to try instead.

use std::net::IpAddr;

#[derive(Clone, Debug, thiserror::Error)]
pub enum FetchError {
    #[error("not a URL: {url} ({reason}); give an absolute http:// or https:// URL")]
    BadUrl { url: String, reason: String },
    #[error("refused: {url} is a {scheme}: URL; fetch reads only http and https")]
    Scheme { url: String, scheme: String },
    #[error("refused: {ip} is a private address; fetch reaches only public hosts")]
    PrivateAddress { ip: IpAddr },
    #[error("refused: {host} resolves to {ip}, a private address; fetch reaches only public hosts")]
    PrivateName { host: String, ip: IpAddr },
    #[error("refused: {host} is on the deny list of hosts")]
    HostDenied { host: String },
    #[error("refused: {host} is not on the list of hosts fetch may reach")]
    HostNotAllowed { host: String },
    #[error("could not resolve {host}: {reason}; check the spelling of the host")]
    Resolve { host: String, reason: String },
    #[error("could not fetch {url}: {reason}")]
    Request { url: String, reason: String },
    #[error("{url} answered {status}; the page cannot be read")]
    Status { url: String, status: String },
    #[error("stopped after {max} redirects (the last pointed to {next}); fetch that URL directly if it is needed")]
    TooManyRedirects { max: u8, next: String },
    #[error("{url} answered a redirect ({status}) without a usable Location: {reason}")]
    BadRedirect { url: String, status: u16, reason: String },
    #[error("timed out after {after}; the site is slow or stalled, try another source")]
    Timeout { after: String },
    #[error("robots.txt of {host} disallows {path}; the site asks crawlers not to read it")]
    RobotsDisallowed { host: String, path: String },
    #[error(
        "robots.txt of {host} could not be read ({reason}), which RFC 9309 treats as disallowing everything; try later or another source"
    )]
    RobotsUnreachable { host: String, reason: String },
    #[error("cannot read {content_type} from {url}; fetch reads HTML, PDF and plain text")]
    UnsupportedType { url: String, content_type: String },
    #[error("the PDF is over {limit}: cut, and a cut PDF cannot be read; ask for a smaller document")]
    PdfCut { limit: String },
    #[error("could not read the text of the PDF at {url}: {reason}")]
    Pdf { url: String, reason: String },
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum SearchError {
    #[error("the search query is empty; give some words to search for")]
    EmptyQuery,
    #[error("the search service: {0}")]
    Fetch(#[from] FetchError),
    #[error("the search service's answer is over {limit}; ask for fewer results")]
    TooLarge { limit: String },
    #[error("the search service answered JSON that is not a list of results: {reason}")]
    BadJson { reason: String },
    #[error("the search command is empty; configure its argv")]
    NoCommand,
    #[error("could not run the search command {program}: {reason}")]
    Spawn { program: String, reason: String },
    #[error("the search command {program} failed ({status}): {stderr}")]
    CommandFailed { program: String, status: String, stderr: String },
    #[error("the search timed out after {after}; try again later or with a simpler query")]
    Timeout { after: String },
}
