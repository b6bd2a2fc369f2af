//! fetch against a real server on loopback: HTML, PDF, plain text, redirects, robots.txt, and the
//! size and time limits.

mod common;

use std::time::Duration;

use common::{Body, Reply, Server};
use nightmail_research::{FetchError, FetchPolicy, TEXT_LIMIT_CHARS, fetch};

const ARTICLE: &str = r#"<!DOCTYPE html>
<html><head><title>Night Trains of Europe</title></head>
<body>
<nav class="menu"><a href="/">Home</a> <a href="/shop">Shop</a> <a href="/login">Log in to your account</a></nav>
<header class="site-header">Subscribe to our newsletter today</header>
<article>
<h1>Night Trains of Europe</h1>
<p>The sleeper from Vienna to Hamburg leaves at a quarter to nine and arrives before breakfast,
which makes it one of the more civilised ways to cross the continent in a single night.</p>
<p>Couchettes hold six berths; sleeper cabins hold one to three, with a washbasin and, on the newer
carriages, a shower. Tickets open six months ahead and the cheap berths go first.</p>
<p>Most routes were cut in the 2000s, when budget airlines made the long overnight journey look
slow; a decade later several came back, run by the Austrian railways and small private operators.</p>
</article>
<footer class="site-footer">Copyright 2026 Example Media. Cookie settings. Privacy policy.</footer>
</body></html>"#;

const ROBOTS: &str = "User-agent: *\nDisallow: /private/\n";

/// The test site: every route the fetch tests read.
fn site(path: &str) -> Reply {
    if let Some(n) = path.strip_prefix("/hop/") {
        let n: u32 = n.parse().unwrap();
        return if n == 0 {
            Reply::ok("text/plain; charset=utf-8", "the end of the chain")
        } else {
            Reply::redirect(&format!("/hop/{}", n - 1))
        };
    }
    match path {
        "/robots.txt" => Reply::ok("text/plain", ROBOTS),
        "/article" => Reply::ok("text/html; charset=utf-8", ARTICLE),
        "/doc.pdf" => Reply::ok("application/pdf", common::pdf::one_page("Hello from the PDF")),
        "/notes.txt" => Reply::ok("text/plain", "plain notes, kept as they are"),
        "/image.png" => Reply::ok("image/png", b"\x89PNG\r\n\x1a\n".to_vec()),
        "/slow" => Reply { status: 200, headers: vec![], body: Body::Stall(Duration::from_secs(30)) },
        "/huge" => Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: Body::Stream { total: 10 * 1024 * 1024 },
        },
        "/private/secret" => Reply::ok("text/plain", "robots.txt asked crawlers not to read this"),
        "/to-private" => Reply::redirect("/private/secret"),
        "/gone" => Reply::status(410),
        _ => Reply::not_found(),
    }
}

#[tokio::test]
async fn html_keeps_the_article_and_drops_navigation_and_boilerplate() {
    let server = Server::start(site).await;
    let page = fetch(&server.url("/article"), &server.policy()).await.unwrap();
    assert_eq!(page.title.as_deref(), Some("Night Trains of Europe"));
    assert_eq!(page.content_type, "text/html");
    assert!(page.text.contains("The sleeper from Vienna to Hamburg"), "{}", page.text);
    assert!(page.text.contains("run by the Austrian railways"), "{}", page.text);
    for boilerplate in ["Log in to your account", "Subscribe to our newsletter", "Cookie settings"] {
        assert!(!page.text.contains(boilerplate), "{boilerplate:?} left in {}", page.text);
    }
    assert!(!page.cut);
    assert_eq!(page.bytes, (ROBOTS.len() + ARTICLE.len()) as u64, "robots.txt and the page");
}

#[tokio::test]
async fn pdf_text_comes_out() {
    let server = Server::start(site).await;
    let page = fetch(&server.url("/doc.pdf"), &server.policy()).await.unwrap();
    assert_eq!(page.content_type, "application/pdf");
    assert!(page.text.contains("Hello from the PDF"), "{:?}", page.text);
}

#[tokio::test]
async fn plain_text_is_returned_as_it_is() {
    let server = Server::start(site).await;
    let page = fetch(&server.url("/notes.txt"), &server.policy()).await.unwrap();
    assert_eq!(page.text, "plain notes, kept as they are");
    assert_eq!(page.title, None);
}

#[tokio::test]
async fn other_types_are_refused_by_name() {
    let server = Server::start(site).await;
    let err = fetch(&server.url("/image.png"), &server.policy()).await.unwrap_err();
    assert!(matches!(err, FetchError::UnsupportedType { ref content_type, .. } if content_type == "image/png"));
    assert!(err.to_string().contains("fetch reads HTML, PDF and plain text"), "{err}");
}

#[tokio::test]
async fn an_error_status_is_reported() {
    let server = Server::start(site).await;
    let err = fetch(&server.url("/gone"), &server.policy()).await.unwrap_err();
    assert!(err.to_string().contains("answered 410 Gone"), "{err}");
}

#[tokio::test]
async fn three_redirects_are_followed_to_the_final_url_and_robots_is_read_once() {
    let server = Server::start(site).await;
    let page = fetch(&server.url("/hop/3"), &server.policy()).await.unwrap();
    assert_eq!(page.url, server.url("/hop/0"));
    assert_eq!(page.text, "the end of the chain");
    assert_eq!(server.requests(), ["/robots.txt", "/hop/3", "/hop/2", "/hop/1", "/hop/0"]);
}

#[tokio::test]
async fn ten_redirects_stop_at_max_redirects() {
    let server = Server::start(site).await;
    let err = fetch(&server.url("/hop/10"), &server.policy()).await.unwrap_err();
    assert!(matches!(err, FetchError::TooManyRedirects { max: 5, .. }), "{err}");
    assert!(err.to_string().contains(&server.url("/hop/4")), "{err}");
    assert_eq!(server.requests().len(), 1 + 6, "robots.txt, the first request and five hops");
}

#[tokio::test]
async fn robots_txt_disallowing_a_path_refuses_it() {
    let server = Server::start(site).await;
    let err = fetch(&server.url("/private/secret"), &server.policy()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "robots.txt of 127.0.0.1 disallows /private/secret; the site asks crawlers not to read it"
    );
    assert_eq!(server.requests(), ["/robots.txt"], "the disallowed page is never requested");
}

#[tokio::test]
async fn a_redirect_into_a_disallowed_path_is_refused() {
    let server = Server::start(site).await;
    let err = fetch(&server.url("/to-private"), &server.policy()).await.unwrap_err();
    assert!(matches!(err, FetchError::RobotsDisallowed { ref path, .. } if path == "/private/secret"), "{err}");
}

#[tokio::test]
async fn robots_txt_is_ignored_when_the_policy_says_so() {
    let server = Server::start(site).await;
    let policy = FetchPolicy { respect_robots: false, ..server.policy() };
    let page = fetch(&server.url("/private/secret"), &policy).await.unwrap();
    assert!(page.text.contains("robots.txt asked"));
    assert_eq!(server.requests(), ["/private/secret"]);
}

#[tokio::test]
async fn a_missing_robots_txt_allows_everything() {
    let server = Server::start(|path| match path {
        "/private/page" => Reply::ok("text/plain", "no robots.txt here"),
        _ => Reply::not_found(),
    })
    .await;
    let page = fetch(&server.url("/private/page"), &server.policy()).await.unwrap();
    assert_eq!(page.text, "no robots.txt here");
}

#[tokio::test]
async fn an_unreachable_robots_txt_disallows_everything() {
    let server = Server::start(|path| match path {
        "/robots.txt" => Reply::status(503),
        _ => Reply::ok("text/plain", "should not be read"),
    })
    .await;
    let err = fetch(&server.url("/page"), &server.policy()).await.unwrap_err();
    assert!(matches!(err, FetchError::RobotsUnreachable { .. }), "{err}");
}

#[tokio::test]
async fn a_slow_page_times_out_at_the_policy_limit() {
    let server = Server::start(site).await;
    let policy = FetchPolicy { timeout: Duration::from_millis(300), ..server.policy() };
    let err = fetch(&server.url("/slow"), &policy).await.unwrap_err();
    assert_eq!(err.to_string(), "timed out after 300 ms; the site is slow or stalled, try another source");
}

#[tokio::test]
async fn a_huge_page_is_cut_at_max_bytes_while_streaming() {
    let server = Server::start(site).await;
    let policy = server.policy();
    let page = fetch(&server.url("/huge"), &policy).await.unwrap();
    assert!(page.cut);
    // The read that crosses the limit is counted whole: hyper hands over what its buffer holds,
    // some hundreds of KiB. The point is that the other 7 MiB or more are never read.
    let slack = 1024 * 1024;
    let robots = ROBOTS.len() as u64;
    assert!(page.bytes >= policy.max_bytes + robots, "counted {}", page.bytes);
    assert!(page.bytes <= policy.max_bytes + robots + slack, "counted {}", page.bytes);
    assert!(page.text.starts_with("all work and no play"));
    assert!(page.text.ends_with("[cut: the page is over 2 MiB]"), "{}", &page.text[page.text.len() - 200..]);
    assert!(page.text.contains(&format!("[cut: the text is over {TEXT_LIMIT_CHARS} characters]")));
}

#[tokio::test]
async fn a_cut_pdf_is_refused_with_the_limit_named() {
    let server = Server::start(site).await;
    let policy = FetchPolicy { max_bytes: 100, ..server.policy() };
    let err = fetch(&server.url("/doc.pdf"), &policy).await.unwrap_err();
    assert!(err.to_string().starts_with("the PDF is over 100 bytes: cut"), "{err}");
}
