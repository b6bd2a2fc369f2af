//! The HTML alternative of an answer (RFC 2046 §5.1.4 `multipart/alternative`): models write
//! Markdown, which a phone or web client should show rendered, while mutt keeps the text part as
//! written. CommonMark plus GFM tables and strikethrough (pulldown-cmark), then sanitized by
//! ammonia, since the model's words may carry any HTML (its input is other people's mail). Mail
//! clients drop `<style>` blocks, so styling is inline, added after sanitizing to the bare tags
//! ammonia leaves.

use pulldown_cmark::{Options, Parser, html};

/// Inline styles by element, for the elements Markdown produces.
const STYLES: &[(&str, &str)] = &[
    ("table", "border-collapse:collapse;margin:0.5em 0"),
    ("th", "border:1px solid #999;padding:4px 8px;background:#f0f0f0;text-align:left"),
    ("td", "border:1px solid #999;padding:4px 8px"),
    ("pre", "background:#f6f8fa;padding:8px;overflow-x:auto;font-family:monospace;white-space:pre"),
    ("code", "font-family:monospace;background:#f6f8fa"),
    ("blockquote", "margin:0 0 0 0.8em;border-left:3px solid #ccc;padding-left:0.8em;color:#555"),
];

/// A whole HTML document for `text`: the part before the signature separator (RFC 3676 §4.3)
/// rendered as Markdown, the signature (nightmail's footer) kept as plain preformatted text.
pub fn alternative(text: &str) -> String {
    let (answer, signature) = match text.find("\n-- \n") {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let mut body = markdown(answer);
    if let Some(signature) = signature {
        body.push_str("<div style=\"color:#777;font-size:0.85em;white-space:pre-wrap;font-family:monospace\">");
        body.push_str(&escape(signature));
        body.push_str("</div>");
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head>\
         <body style=\"font-family:sans-serif;line-height:1.4\">\n{body}\n</body></html>\n"
    )
}

/// Markdown to sanitized, inline-styled HTML.
fn markdown(text: &str) -> String {
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    let mut raw = String::new();
    html::push_html(&mut raw, Parser::new_ext(text, options));
    // ammonia's defaults: no scripts, no event handlers, no style, links get rel="noopener noreferrer".
    let mut clean = ammonia::clean(&raw);
    for (tag, style) in STYLES {
        clean = clean.replace(&format!("<{tag}>"), &format!("<{tag} style=\"{style}\">"));
    }
    clean
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_code_and_lists_render_with_inline_styles() {
        let html = alternative(
            "Two options:\n\n| City | Hours |\n|---|---|\n| Porto | 3 |\n\n```rust\nfn main() {}\n```\n\n- one\n- **two**\n",
        );
        assert!(html.contains("<table style=\"border-collapse:collapse"), "{html}");
        assert!(html.contains("<td style=\"border:1px solid #999;padding:4px 8px\">Porto</td>"), "{html}");
        assert!(html.contains("<pre style="), "{html}");
        assert!(html.contains("fn main() {}"), "{html}");
        assert!(html.contains("<li><strong>two</strong></li>"), "{html}");
    }

    #[test]
    fn scripts_handlers_and_styles_from_the_model_are_removed() {
        let html = alternative(
            "Hi <script>alert(1)</script><img src=x onerror=\"alert(2)\"><span style=\"position:fixed\">x</span>\n\n[a](javascript:alert(3))",
        );
        assert!(!html.contains("<script") && !html.contains("alert(1)"), "{html}");
        assert!(!html.contains("onerror") && !html.contains("position:fixed"), "{html}");
        assert!(!html.contains("javascript:"), "{html}");
    }

    #[test]
    fn the_signature_stays_plain_text() {
        let html = alternative("Answer with *stress*.\n\n-- \nnightmail: k@x via <local>\n1 s, 2 tokens\n");
        assert!(html.contains("<em>stress</em>"), "{html}");
        assert!(html.contains("-- \nnightmail: k@x via &lt;local&gt;\n1 s, 2 tokens"), "{html}");
        assert!(!html.contains("<h2>"), "the separator is no setext heading: {html}");
    }
}
