//! fetch's refusal of private addresses (server-side request forgery), however the address is
//! spelled, and through redirects; allow_private and deny_hosts.

mod common;

use std::net::IpAddr;

use common::{Reply, Server};
use nightmail_research::{FetchError, FetchPolicy, fetch};

fn refused_ip(err: &FetchError) -> Option<IpAddr> {
    match err {
        FetchError::PrivateAddress { ip } | FetchError::PrivateName { ip, .. } => Some(*ip),
        _ => None,
    }
}

async fn page_server() -> Server {
    Server::start(|path| match path {
        "/page" => Reply::ok("text/plain", "a page on loopback"),
        _ => Reply::not_found(),
    })
    .await
}

#[tokio::test]
async fn loopback_is_refused_without_allow_private_in_every_spelling() {
    let server = page_server().await;
    let port = server.port;
    let policy = FetchPolicy::default();
    for url in [
        format!("http://127.0.0.1:{port}/page"),
        format!("http://[::1]:{port}/page"),
        format!("http://localhost:{port}/page"),
        format!("http://2130706433:{port}/page"),
        format!("http://0x7f.1:{port}/page"),
        format!("http://0177.0.0.1:{port}/page"),
        format!("http://[::ffff:127.0.0.1]:{port}/page"),
    ] {
        let err = fetch(&url, &policy).await.unwrap_err();
        let ip = refused_ip(&err).unwrap_or_else(|| panic!("{url}: {err}"));
        assert!(ip.is_loopback() || ip.to_string() == "::ffff:127.0.0.1", "{url}: {ip}");
        assert!(err.to_string().contains("fetch reaches only public hosts"), "{err}");
    }
    assert!(server.requests().is_empty(), "no request reached the server");
}

#[tokio::test]
async fn the_refusal_names_the_address_as_a_model_reads_it() {
    let err = fetch("http://10.0.0.5/", &FetchPolicy::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "refused: 10.0.0.5 is a private address; fetch reaches only public hosts");
}

#[tokio::test]
async fn cloud_metadata_and_private_ranges_are_refused() {
    for (url, ip) in [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://10.1.2.3/", "10.1.2.3"),
        ("http://192.168.0.1/", "192.168.0.1"),
        ("http://100.64.0.1/", "100.64.0.1"),
        ("http://[fd00::1]/", "fd00::1"),
        ("http://[fe80::1]/", "fe80::1"),
        ("http://0.0.0.0/", "0.0.0.0"),
    ] {
        let err = fetch(url, &FetchPolicy::default()).await.unwrap_err();
        assert_eq!(refused_ip(&err), Some(ip.parse().unwrap()), "{url}: {err}");
    }
}

#[tokio::test]
async fn schemes_other_than_http_and_https_are_refused() {
    for url in ["file:///etc/passwd", "ftp://example.org/", "gopher://127.0.0.1:25/"] {
        let err = fetch(url, &FetchPolicy::default()).await.unwrap_err();
        assert!(matches!(err, FetchError::Scheme { .. }), "{url}: {err}");
    }
}

#[tokio::test]
async fn allow_private_with_the_servers_port_reaches_it() {
    let server = page_server().await;
    let page = fetch(&server.url("/page"), &server.policy()).await.unwrap();
    assert_eq!(page.text, "a page on loopback");
}

#[tokio::test]
async fn allow_private_by_name_reaches_localhost() {
    let server = page_server().await;
    let policy = FetchPolicy { allow_private: vec![format!("localhost:{}", server.port)], ..FetchPolicy::default() };
    // localhost resolves to ::1 as well, where nothing listens: the connection falls back to
    // 127.0.0.1, both pinned.
    let page = fetch(&format!("http://localhost:{}/page", server.port), &policy).await.unwrap();
    assert_eq!(page.text, "a page on loopback");
}

#[tokio::test]
async fn allow_private_for_one_port_does_not_open_another() {
    let server = page_server().await;
    let policy = FetchPolicy {
        allow_private: vec![format!("127.0.0.1:{}", server.port.wrapping_add(1))],
        ..FetchPolicy::default()
    };
    let err = fetch(&server.url("/page"), &policy).await.unwrap_err();
    assert!(matches!(err, FetchError::PrivateAddress { .. }), "{err}");
}

#[tokio::test]
async fn a_redirect_to_a_private_address_not_allowed_is_refused() {
    let other = page_server().await;
    let other_port = other.port;
    let server = Server::start(move |path| match path {
        "/away" => Reply::redirect(&format!("http://127.0.0.1:{other_port}/page")),
        _ => Reply::not_found(),
    })
    .await;
    let err = fetch(&server.url("/away"), &server.policy()).await.unwrap_err();
    assert_eq!(refused_ip(&err), Some("127.0.0.1".parse().unwrap()), "{err}");
    assert!(other.requests().is_empty(), "the redirect target was never contacted");
}

#[tokio::test]
async fn a_redirect_to_another_scheme_is_refused() {
    let server = Server::start(|path| match path {
        "/away" => Reply::redirect("file:///etc/passwd"),
        _ => Reply::not_found(),
    })
    .await;
    let err = fetch(&server.url("/away"), &server.policy()).await.unwrap_err();
    assert!(matches!(err, FetchError::Scheme { .. }), "{err}");
}

#[tokio::test]
async fn deny_hosts_wins_over_allow_private_and_allow_hosts() {
    let server = page_server().await;
    let policy =
        FetchPolicy { allow_hosts: vec!["127.0.0.1".into()], deny_hosts: vec!["127.0.0.1".into()], ..server.policy() };
    let err = fetch(&server.url("/page"), &policy).await.unwrap_err();
    assert_eq!(err.to_string(), "refused: 127.0.0.1 is on the deny list of hosts");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn allow_hosts_refuses_hosts_not_on_it() {
    let server = page_server().await;
    let policy = FetchPolicy { allow_hosts: vec!["*.example.org".into()], ..server.policy() };
    let err = fetch(&server.url("/page"), &policy).await.unwrap_err();
    assert!(matches!(err, FetchError::HostNotAllowed { .. }), "{err}");
}
