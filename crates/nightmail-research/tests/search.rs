//! web_search through a SearXNG-compatible JSON endpoint on loopback, and through a command.

mod common;

use std::time::Duration;

use common::{Reply, Server};
use nightmail_research::{FetchError, FetchPolicy, SearchError, SearchService, web_search};

/// Answers /search?q=...&format=json as SearXNG does, echoing the query into three results.
async fn searxng() -> Server {
    Server::start(|path| {
        let url = url::Url::parse(&format!("http://x{path}")).unwrap();
        if url.path() != "/search" {
            return Reply::not_found();
        }
        let pairs: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        if pairs.get("format").map(String::as_str) != Some("json") {
            return Reply::status(403);
        }
        let q = &pairs["q"];
        let results: Vec<_> = (1..=3)
            .map(|i| {
                serde_json::json!({
                    "title": format!("{q} result {i}"),
                    "url": format!("https://example.org/{i}"),
                    "content": format!("snippet {i} about {q}"),
                    "engine": "duckduckgo",
                })
            })
            .collect();
        let body = serde_json::json!({ "query": q, "results": results });
        Reply::ok("application/json", body.to_string())
    })
    .await
}

#[tokio::test]
async fn searxng_results_become_hits_cut_to_max_results() {
    let server = searxng().await;
    let service = SearchService::Searxng { base_url: server.url("/") };
    let hits = web_search(&service, "night trains", 2, &server.policy()).await.unwrap();
    assert_eq!(hits.len(), 2);
    assert_eq!(hits[0].title, "night trains result 1");
    assert_eq!(hits[0].url, "https://example.org/1");
    assert_eq!(hits[1].snippet, "snippet 2 about night trains");
    assert_eq!(server.requests(), ["/search?q=night+trains&format=json"]);
}

#[tokio::test]
async fn searxng_on_loopback_needs_allow_private() {
    let server = searxng().await;
    let service = SearchService::Searxng { base_url: server.url("") };
    let err = web_search(&service, "night trains", 5, &FetchPolicy::default()).await.unwrap_err();
    assert!(matches!(err, SearchError::Fetch(FetchError::PrivateAddress { .. })), "{err}");
    assert!(server.requests().is_empty());
}

fn script(dir: &tempfile::TempDir, body: &str) -> Vec<String> {
    let path = dir.path().join("search.sh");
    std::fs::write(&path, body).unwrap();
    vec!["sh".into(), path.display().to_string(), "--engine=test".into()]
}

#[tokio::test]
async fn a_command_gets_the_query_as_its_last_argument_and_its_json_becomes_hits() {
    let dir = tempfile::tempdir().unwrap();
    let argv = script(
        &dir,
        r#"printf '[{"title":"%s","url":"https://example.org/?a=%s","snippet":"from %s"}]' "$2" "$1" "$0""#,
    );
    let service = SearchService::Command { argv: argv.clone() };
    let hits = web_search(&service, "sleeper cabins", 5, &FetchPolicy::default()).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].title, "sleeper cabins");
    assert_eq!(hits[0].url, "https://example.org/?a=--engine=test");
    assert_eq!(hits[0].snippet, format!("from {}", argv[1]));
}

#[tokio::test]
async fn a_failing_command_reports_its_exit_and_the_first_line_of_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let argv = script(&dir, "echo 'no API key: set SEARCH_KEY' >&2\necho 'second line' >&2\nexit 3\n");
    let err = web_search(&SearchService::Command { argv }, "q", 5, &FetchPolicy::default()).await.unwrap_err();
    let SearchError::CommandFailed { stderr, status, .. } = &err else { panic!("{err}") };
    assert_eq!(stderr, "no API key: set SEARCH_KEY");
    assert!(status.contains('3'), "{status}");
}

#[tokio::test]
async fn a_command_printing_bad_json_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let argv = script(&dir, "echo 'results: none'\n");
    let err = web_search(&SearchService::Command { argv }, "q", 5, &FetchPolicy::default()).await.unwrap_err();
    assert!(matches!(err, SearchError::BadJson { .. }), "{err}");
}

#[tokio::test]
async fn a_command_past_the_timeout_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let argv = script(&dir, "exec sleep 30\n");
    let policy = FetchPolicy { timeout: Duration::from_millis(300), ..FetchPolicy::default() };
    let err = web_search(&SearchService::Command { argv }, "q", 5, &policy).await.unwrap_err();
    assert_eq!(err.to_string(), "the search timed out after 300 ms; try again later or with a simpler query");
}

#[tokio::test]
async fn an_empty_query_is_refused() {
    let service = SearchService::Command { argv: vec!["true".into()] };
    let err = web_search(&service, "  ", 5, &FetchPolicy::default()).await.unwrap_err();
    assert!(matches!(err, SearchError::EmptyQuery));
}
