//! What a research answer cites: each page, search result and message the model was shown, with
//! the number it was shown under, and the Sources section the reply ends with.

use serde::{Deserialize, Serialize};

/// One thing the model read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    Web { url: String, title: String },
    Mail { date: String, from: String, subject: String },
}

impl Source {
    /// The Sources line for it (Markdown, read as plain text too).
    fn line(&self) -> String {
        match self {
            Source::Web { url, title } if title.trim().is_empty() => format!("<{url}>"),
            Source::Web { url, title } => format!("{} <{url}>", one_line(title)),
            Source::Mail { date, from, subject } => {
                format!("your mail: \"{}\" from {}, {}", one_line(subject), one_line(from), one_line(date))
            }
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Sources numbered in the order the job met them; the same source keeps its number.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    seen: Vec<Source>,
}

impl Sources {
    /// The number `source` is cited by (from 1).
    pub fn number(&mut self, source: &Source) -> usize {
        match self.seen.iter().position(|s| s == source) {
            Some(i) => i + 1,
            None => {
                self.seen.push(source.clone());
                self.seen.len()
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The reply's Sources section: the sources the answer cites by number (`[2]`), in the
    /// answer's numbering; when it cites none, every source it was shown, as consulted.
    pub fn section(&self, answer: &str) -> Option<String> {
        if self.seen.is_empty() {
            return None;
        }
        let cited: Vec<usize> = (1..=self.seen.len()).filter(|n| answer.contains(&format!("[{n}]"))).collect();
        let (heading, numbers) = if cited.is_empty() {
            ("Sources consulted (the answer cites none by number):", (1..=self.seen.len()).collect())
        } else {
            ("Sources:", cited)
        };
        let mut text = format!("{heading}\n\n");
        for n in numbers {
            text.push_str(&format!("[{n}] {}  \n", self.seen[n - 1].line()));
        }
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web(n: u32) -> Source {
        Source::Web { url: format!("https://bank.example/{n}"), title: format!("Offer {n}") }
    }

    #[test]
    fn a_source_keeps_its_number_and_the_section_lists_what_is_cited() {
        let mut s = Sources::default();
        assert_eq!(s.number(&web(1)), 1);
        assert_eq!(s.number(&web(2)), 2);
        assert_eq!(s.number(&web(1)), 1);
        let mail =
            Source::Mail { date: "2 Dec 2026".into(), from: "Ada <ada@x>".into(), subject: "Rates\r\nBcc: x".into() };
        assert_eq!(s.number(&mail), 3);
        let section = s.section("The rate is advertised [2] and hard to get [3].").unwrap();
        assert!(section.starts_with("Sources:\n\n"), "{section}");
        assert!(section.contains("[2] Offer 2 <https://bank.example/2>"), "{section}");
        assert!(section.contains("[3] your mail: \"Rates Bcc: x\" from Ada <ada@x>, 2 Dec 2026"), "{section}");
        assert!(!section.contains("[1]"), "{section}");
        let all = s.section("No numbers here.").unwrap();
        assert!(all.starts_with("Sources consulted"), "{all}");
        assert!(all.contains("[1] ") && all.contains("[2] ") && all.contains("[3] "), "{all}");
        assert_eq!(Sources::default().section("x"), None);
    }
}
