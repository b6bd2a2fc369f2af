//! One request to one checked address: the URL parsed, its host resolved here and every address
//! checked, then a connection pinned to exactly those addresses (a second DNS answer, "DNS
//! rebinding", cannot swap in a private one between the check and the connect).

use std::net::{IpAddr, SocketAddr};

use futures_util::StreamExt;
use url::{Host, Url};

use crate::address;
use crate::error::FetchError;
use crate::policy::{FetchPolicy, HostVerdict};

/// Parses `raw` the way browsers do (the `url` crate follows the WHATWG URL standard), which also
/// turns odd IPv4 spellings ("2130706433", "0x7f.1", "0177.0.0.1") into the address they mean.
pub(crate) fn parse(raw: &str) -> Result<Url, FetchError> {
    let url = Url::parse(raw.trim()).map_err(|e| FetchError::BadUrl { url: raw.to_string(), reason: e.to_string() })?;
    scheme_ok(&url)?;
    Ok(url)
}

pub(crate) fn scheme_ok(url: &Url) -> Result<(), FetchError> {
    match url.scheme() {
        "http" | "https" => Ok(()),
        other => Err(FetchError::Scheme { url: url.to_string(), scheme: other.to_string() }),
    }
}

/// A URL whose host passed the lists and resolved to addresses fetch may reach.
pub(crate) struct Target {
    pub url: Url,
    addrs: Vec<SocketAddr>,
}

/// Checks `url` against the host lists and resolves it; any refused address refuses the URL.
pub(crate) async fn check(url: &Url, policy: &FetchPolicy) -> Result<Target, FetchError> {
    scheme_ok(url)?;
    let host =
        url.host().ok_or_else(|| FetchError::BadUrl { url: url.to_string(), reason: "it has no host".into() })?;
    let port = url.port_or_known_default().unwrap_or(80);
    let name = url.host_str().unwrap_or_default();
    match policy.host_listed(name.trim_start_matches('[').trim_end_matches(']')) {
        HostVerdict::Pass => {}
        HostVerdict::Denied => return Err(FetchError::HostDenied { host: name.to_string() }),
        HostVerdict::NotAllowed => {
            return Err(FetchError::HostNotAllowed { host: name.to_string() });
        }
    }
    let (addrs, literal) = match host {
        Host::Ipv4(ip) => (vec![SocketAddr::new(IpAddr::V4(ip), port)], true),
        Host::Ipv6(ip) => (vec![SocketAddr::new(IpAddr::V6(ip), port)], true),
        Host::Domain(domain) => {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((domain, port))
                .await
                .map_err(|e| FetchError::Resolve { host: domain.to_string(), reason: e.to_string() })?
                .collect();
            if found.is_empty() {
                return Err(FetchError::Resolve { host: domain.to_string(), reason: "no addresses".into() });
            }
            (found, false)
        }
    };
    if let Some(bad) = address::first_refused(name, port, &addrs, &policy.allow_private) {
        return Err(if literal {
            FetchError::PrivateAddress { ip: bad.ip() }
        } else {
            FetchError::PrivateName { host: name.to_string(), ip: bad.ip() }
        });
    }
    Ok(Target { url: url.clone(), addrs })
}

/// GETs the target over a connection to its checked addresses only, following no redirect.
pub(crate) async fn get(target: &Target, policy: &FetchPolicy) -> Result<reqwest::Response, FetchError> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        // A proxy would resolve the name itself, after our check: never use one.
        .no_proxy()
        .user_agent(policy.user_agent.as_str());
    if let Some(Host::Domain(domain)) = target.url.host() {
        builder = builder.resolve_to_addrs(domain, &target.addrs);
    }
    let client = builder.build().map_err(|e| request_error(&target.url, &e))?;
    client.get(target.url.clone()).send().await.map_err(|e| request_error(&target.url, &e))
}

/// Reads at most `max` bytes of the body, adding what arrives to `downloaded`; true if cut.
pub(crate) async fn read_capped(
    response: reqwest::Response,
    max: u64,
    downloaded: &mut u64,
) -> Result<(Vec<u8>, bool), FetchError> {
    let url = response.url().clone();
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| request_error(&url, &e))?;
        *downloaded += chunk.len() as u64;
        let room = max.saturating_sub(body.len() as u64) as usize;
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            // Dropping the stream closes the connection: the rest is never read.
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// reqwest's own message is "error sending request"; the cause a model can act on is below it.
pub(crate) fn request_error(url: &Url, error: &reqwest::Error) -> FetchError {
    let mut reason = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        reason = format!("{reason}: {cause}");
        source = cause.source();
    }
    FetchError::Request { url: url.to_string(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The connection goes to the checked addresses, never to a fresh DNS answer: a name under
    /// `.invalid` (RFC 6761 §6.4) resolves nowhere, yet the request reaches the pinned listener.
    #[tokio::test]
    async fn the_connection_goes_to_the_checked_addresses_without_a_second_lookup() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await.unwrap();
            let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\npinned";
            stream.write_all(reply).await.unwrap();
        });
        let url = Url::parse(&format!("http://rebind.invalid:{}/", addr.port())).unwrap();
        let target = Target { url, addrs: vec![addr] };
        let response = get(&target, &FetchPolicy::default()).await.unwrap();
        assert_eq!(response.text().await.unwrap(), "pinned");
    }
}
