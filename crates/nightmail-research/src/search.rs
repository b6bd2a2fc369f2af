//! `web_search`: a SearXNG instance's JSON API, or a command that prints results as JSON.

use std::process::Stdio;

use serde::{Deserialize, Serialize};

use crate::error::{FetchError, SearchError};
use crate::policy::{FetchPolicy, bytes_text, duration_text};
use crate::{hop, redirect};

/// Where searches go.
#[derive(Clone, Debug)]
pub enum SearchService {
    /// A SearXNG instance with the JSON format enabled (`search.formats: [html, json]` in its
    /// settings.yml); usually on loopback, so its "host:port" must be in `allow_private`.
    Searxng { base_url: String },
    /// A program run with the query as its last argument; it prints a JSON array of
    /// `{"title", "url", "snippet"}` objects on stdout.
    Command { argv: Vec<String> },
}

/// One search result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SearchHit {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// Searches for `query`, returning at most `max_results` hits; `policy`'s time limit covers the
/// whole search, and its address checks the request to SearXNG.
pub async fn web_search(
    service: &SearchService,
    query: &str,
    max_results: usize,
    policy: &FetchPolicy,
) -> Result<Vec<SearchHit>, SearchError> {
    let query = query.trim();
    if query.is_empty() {
        return Err(SearchError::EmptyQuery);
    }
    let search = async {
        match service {
            SearchService::Searxng { base_url } => searxng(base_url, query, policy).await,
            SearchService::Command { argv } => command(argv, query).await,
        }
    };
    let mut hits = match tokio::time::timeout(policy.timeout, search).await {
        Ok(hits) => hits?,
        Err(_) => return Err(SearchError::Timeout { after: duration_text(policy.timeout) }),
    };
    hits.truncate(max_results);
    Ok(hits)
}

/// SearXNG's answer: `results[]` with `title`, `url` and `content` (its snippet).
#[derive(Deserialize)]
struct SearxngAnswer {
    results: Vec<SearxngResult>,
}

#[derive(Deserialize)]
struct SearxngResult {
    #[serde(default)]
    title: String,
    url: String,
    #[serde(default)]
    content: String,
}

async fn searxng(base_url: &str, query: &str, policy: &FetchPolicy) -> Result<Vec<SearchHit>, SearchError> {
    let mut url = hop::parse(&format!("{}/search", base_url.trim_end_matches('/')))?;
    url.query_pairs_mut().append_pair("q", query).append_pair("format", "json");
    let mut downloaded = 0;
    // The search API is not crawled, so robots.txt does not apply to it.
    let response = redirect::follow(url, policy, policy.max_redirects, None, &mut downloaded).await?;
    let final_url = response.url().to_string();
    if !response.status().is_success() {
        let status = response.status().to_string();
        let hint = if response.status() == reqwest::StatusCode::FORBIDDEN {
            " (enable the json format in SearXNG's settings.yml)"
        } else {
            ""
        };
        return Err(FetchError::Status { url: final_url, status: format!("{status}{hint}") }.into());
    }
    let (body, cut) = hop::read_capped(response, policy.max_bytes, &mut downloaded).await?;
    if cut {
        return Err(SearchError::TooLarge { limit: bytes_text(policy.max_bytes) });
    }
    let answer: SearxngAnswer =
        serde_json::from_slice(&body).map_err(|e| SearchError::BadJson { reason: e.to_string() })?;
    Ok(answer.results.into_iter().map(|r| SearchHit { title: r.title, url: r.url, snippet: r.content }).collect())
}

async fn command(argv: &[String], query: &str) -> Result<Vec<SearchHit>, SearchError> {
    let (program, args) = argv.split_first().ok_or(SearchError::NoCommand)?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .arg(query)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // The caller's timeout drops this future; the program must not outlive it.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SearchError::Spawn { program: program.clone(), reason: e.to_string() })?;
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| SearchError::Spawn { program: program.clone(), reason: e.to_string() })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first_line = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    if !output.status.success() {
        return Err(SearchError::CommandFailed {
            program: program.clone(),
            status: output.status.to_string(),
            stderr: first_line,
        });
    }
    serde_json::from_slice(&output.stdout).map_err(|e| SearchError::BadJson {
        reason: if first_line.is_empty() { e.to_string() } else { format!("{e} (stderr: {first_line})") },
    })
}
