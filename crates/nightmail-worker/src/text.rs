//! Plain text from mail bodies: quoted text that repeats the thread is dropped, signatures are
//! trimmed (RFC 3676 §4.3: the separator line is "-- ").

/// Removes the signature: everything from the last line that is exactly `-- ` (or `--`, as some
/// clients strip the trailing space).
pub fn trim_signature(text: &str) -> &str {
    let mut cut = text.len();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\r', '\n']);
        if bare == "-- " || bare == "--" {
            cut = offset;
        }
        offset += line.len();
    }
    text[..cut].trim_end()
}

/// Collapses whitespace and lower-cases, so quoted text can be compared with its original even
/// after the quoting client rewrapped it.
pub fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// Drops quoted blocks (`>` lines, with the "On ... wrote:" line that introduces them) whose
/// content already appears in `earlier` (normalized texts of the thread's earlier messages).
/// A quote of something not in the thread is kept: it is part of what the user is asking about.
pub fn drop_repeated_quotes(text: &str, earlier: &[String]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<&str> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if !is_quote(lines[i]) {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && (is_quote(lines[i]) || lines[i].trim().is_empty() && next_is_quote(&lines, i)) {
            i += 1;
        }
        let quoted: String = lines[start..i].iter().map(|l| unquote(l)).collect::<Vec<_>>().join("\n");
        let quoted = normalize(&quoted);
        let repeats = !quoted.is_empty()
            && earlier.iter().any(|e| e.contains(&quoted) || quoted.contains(e.as_str()) && !e.is_empty());
        if repeats {
            // Also drop the attribution line ("On Mon, Ann wrote:") and blank lines before it.
            while out.last().is_some_and(|l| l.trim().is_empty()) {
                out.pop();
            }
            if out.last().is_some_and(|l| is_attribution(l)) {
                out.pop();
            }
        } else {
            out.extend_from_slice(&lines[start..i]);
        }
    }
    out.join("\n").trim().to_string()
}

fn is_quote(line: &str) -> bool {
    line.trim_start().starts_with('>')
}

fn next_is_quote(lines: &[&str], i: usize) -> bool {
    lines[i + 1..].iter().find(|l| !l.trim().is_empty()).is_some_and(|l| is_quote(l))
}

fn unquote(line: &str) -> &str {
    let mut rest = line.trim_start();
    while let Some(r) = rest.strip_prefix('>') {
        rest = r.trim_start();
    }
    rest
}

fn is_attribution(line: &str) -> bool {
    let l = line.trim();
    l.ends_with(':') && (l.contains("wrote") || l.contains("schrieb") || l.contains("a écrit") || l.starts_with("On "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_trimmed_at_the_last_separator() {
        assert_eq!(trim_signature("Hello\n\n-- \nAnn\nphone"), "Hello");
        assert_eq!(trim_signature("a\n-- \nmid\nb\n--\nsig"), "a\n-- \nmid\nb");
        assert_eq!(trim_signature("no signature\n--- not one"), "no signature\n--- not one");
    }

    #[test]
    fn repeated_quotes_go_and_new_quotes_stay() {
        let earlier = vec![normalize("What is the capital of France?\nThanks")];
        let reply = "Paris, surely?\n\nOn Mon, 1 Dec 2025, Ann wrote:\n> What is the capital\n> of France?\n> Thanks\n";
        assert_eq!(drop_repeated_quotes(reply, &earlier), "Paris, surely?");
        let fresh = "About this:\n> a line from a book\nwhat does it mean?";
        assert_eq!(drop_repeated_quotes(fresh, &earlier), fresh);
    }
}
