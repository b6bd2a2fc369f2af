//! A body as text a model reads: HTML through a readability pass (the article without navigation
//! and boilerplate), PDF through pdf-extract, plain text as it is; anything else is refused.

use dom_smoothie::{Config, ParsePolicy, Readability, TextMode};

use crate::error::FetchError;
use crate::policy::bytes_text;

/// The most characters of text a page returns; a model's context is the scarce thing.
pub const TEXT_LIMIT_CHARS: usize = 40_000;

pub(crate) enum Kind {
    Html,
    Pdf,
    Plain,
}

/// What a Content-Type (its media type, RFC 9110 §8.3.1) or, without one, the body's first bytes say.
pub(crate) fn kind(content_type: &str, body: &[u8]) -> Option<Kind> {
    match content_type {
        "text/html" | "application/xhtml+xml" => Some(Kind::Html),
        "application/pdf" => Some(Kind::Pdf),
        "text/plain" | "text/markdown" | "text/csv" => Some(Kind::Plain),
        "" | "application/octet-stream" => {
            let head = String::from_utf8_lossy(&body[..body.len().min(512)]).to_ascii_lowercase();
            if body.starts_with(b"%PDF-") {
                Some(Kind::Pdf)
            } else if head.trim_start().starts_with("<!doctype html") || head.contains("<html") {
                Some(Kind::Html)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Title and text of a body; `cut` says the body stopped at `max_bytes`.
pub(crate) async fn extract(
    kind: Kind,
    url: &str,
    charset: Option<&str>,
    body: Vec<u8>,
    cut: bool,
    max_bytes: u64,
) -> Result<(Option<String>, String), FetchError> {
    let (title, text) = match kind {
        Kind::Html => {
            let html = decode(&body, charset);
            let url = url.to_string();
            // Parsing a large page takes a while: off the async threads.
            tokio::task::spawn_blocking(move || html_text(&html, &url)).await.unwrap_or((None, String::new()))
        }
        Kind::Plain => (None, decode(&body, charset)),
        Kind::Pdf => {
            if cut {
                return Err(FetchError::PdfCut { limit: bytes_text(max_bytes) });
            }
            (None, pdf_text(url, body).await?)
        }
    };
    let mut text = limit(text.trim().to_string());
    if cut {
        text.push_str(&format!("\n\n[cut: the page is over {}]", bytes_text(max_bytes)));
    }
    Ok((title, text))
}

fn decode(body: &[u8], charset: Option<&str>) -> String {
    let encoding =
        charset.and_then(|label| encoding_rs::Encoding::for_label(label.as_bytes())).unwrap_or(encoding_rs::UTF_8);
    encoding.decode(body).0.into_owned()
}

fn html_text(html: &str, url: &str) -> (Option<String>, String) {
    let config = Config { text_mode: TextMode::Formatted, ..Config::default() };
    let Ok(mut readability) = Readability::new(html, Some(url), Some(config)) else {
        return (None, String::new());
    };
    let title = readability.doc.select("title").text().trim().to_string();
    let title = (!title.is_empty()).then_some(title);
    // Strict readability finds no article in short or odd pages; Raw keeps all the body's text.
    let text = readability
        .parse()
        .or_else(|_| readability.parse_with_policy(ParsePolicy::Raw))
        .map(|article| article.text_content.to_string())
        .unwrap_or_default();
    (title, collapse_blank_lines(&text))
}

/// Readability's formatted text keeps runs of blank lines from the markup's layout.
fn collapse_blank_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim().is_empty() {
            blank += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        blank = 0;
        out.push_str(line);
    }
    out
}

async fn pdf_text(url: &str, body: Vec<u8>) -> Result<String, FetchError> {
    // pdf-extract panics on some malformed files; a panic must not take the worker with it.
    let result =
        tokio::task::spawn_blocking(move || std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem(&body)))
            .await;
    match result {
        Ok(Ok(Ok(text))) => Ok(text),
        Ok(Ok(Err(e))) => Err(FetchError::Pdf { url: url.to_string(), reason: e.to_string() }),
        _ => Err(FetchError::Pdf { url: url.to_string(), reason: "the file is malformed".into() }),
    }
}

fn limit(mut text: String) -> String {
    if let Some((at, _)) = text.char_indices().nth(TEXT_LIMIT_CHARS) {
        text.truncate(at);
        text.push_str(&format!("\n\n[cut: the text is over {TEXT_LIMIT_CHARS} characters]"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_over_the_limit_is_cut_with_a_note() {
        let text = limit("é".repeat(TEXT_LIMIT_CHARS + 10));
        assert!(text.starts_with(&"é".repeat(TEXT_LIMIT_CHARS)));
        assert!(text.ends_with(&format!("[cut: the text is over {TEXT_LIMIT_CHARS} characters]")));
    }

    #[test]
    fn untyped_bodies_are_sniffed() {
        assert!(matches!(kind("", b"%PDF-1.4"), Some(Kind::Pdf)));
        assert!(matches!(kind("", b"<!DOCTYPE html><html>"), Some(Kind::Html)));
        assert!(kind("", b"\x89PNG").is_none());
        assert!(kind("image/png", b"").is_none());
    }

    #[test]
    fn latin1_is_decoded_by_its_charset() {
        assert_eq!(decode(b"caf\xe9", Some("iso-8859-1")), "café");
    }
}
