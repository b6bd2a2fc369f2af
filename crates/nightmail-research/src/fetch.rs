//! `fetch`: one URL to readable text, inside the policy's limits.

use serde::{Deserialize, Serialize};

use crate::error::FetchError;
use crate::policy::FetchPolicy;
use crate::robots::Robots;
use crate::{hop, redirect, text};

/// A fetched page as a model reads it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Page {
    /// The URL after redirects.
    pub url: String,
    /// The HTML `<title>`, if the page is HTML and has one.
    pub title: Option<String>,
    /// Readable text, at most `TEXT_LIMIT_CHARS` characters (with a note when cut).
    pub text: String,
    /// Body bytes downloaded, robots.txt included (redirects' bodies are never read).
    pub bytes: u64,
    /// The media type, without parameters ("text/html").
    pub content_type: String,
    /// The body was over `max_bytes`: only its first `max_bytes` were read.
    pub cut: bool,
}

/// Fetches `url` as readable text, within `policy`'s hosts, addresses, size and time.
pub async fn fetch(url: &str, policy: &FetchPolicy) -> Result<Page, FetchError> {
    let url = hop::parse(url)?;
    match tokio::time::timeout(policy.timeout, fetch_page(url, policy)).await {
        Ok(result) => result,
        Err(_) => Err(FetchError::Timeout { after: policy.timeout_text() }),
    }
}

async fn fetch_page(url: url::Url, policy: &FetchPolicy) -> Result<Page, FetchError> {
    let mut downloaded = 0u64;
    let mut robots = Robots::default();
    let robots = policy.respect_robots.then_some(&mut robots as &mut dyn redirect::HopPermission);
    let response = redirect::follow(url, policy, policy.max_redirects, robots, &mut downloaded).await?;
    let final_url = response.url().to_string();
    if !response.status().is_success() {
        return Err(FetchError::Status { url: final_url, status: response.status().to_string() });
    }
    let (content_type, charset) = media_type(&response);
    // A declared type we cannot read is refused before its body is downloaded.
    let untyped = matches!(content_type.as_str(), "" | "application/octet-stream");
    if !untyped && text::kind(&content_type, &[]).is_none() {
        return Err(FetchError::UnsupportedType { url: final_url, content_type });
    }
    let (body, cut) = hop::read_capped(response, policy.max_bytes, &mut downloaded).await?;
    let Some(kind) = text::kind(&content_type, &body) else {
        return Err(FetchError::UnsupportedType { url: final_url, content_type });
    };
    let (title, text) = text::extract(kind, &final_url, charset.as_deref(), body, cut, policy.max_bytes).await?;
    Ok(Page { url: final_url, title, text, bytes: downloaded, content_type, cut })
}

/// The Content-Type's media type, lower-cased, and its charset parameter (RFC 9110 §8.3).
fn media_type(response: &reqwest::Response) -> (String, Option<String>) {
    let Some(value) = response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return (String::new(), None);
    };
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let charset = parts.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim().eq_ignore_ascii_case("charset").then(|| value.trim().trim_matches('"').to_string())
    });
    (essence, charset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_survives_the_workers_journal_as_json() {
        let page = Page {
            url: "https://example.org/".into(),
            title: Some("Example".into()),
            text: "text".into(),
            bytes: 4,
            content_type: "text/plain".into(),
            cut: false,
        };
        let json = serde_json::to_string(&page).unwrap();
        assert_eq!(serde_json::from_str::<Page>(&json).unwrap(), page);
    }
}
