//! Separating a reasoning model's `<think>…</think>` from its answer (DeepSeek-R1 and Qwen3
//! convention; Qwen3's template may open `<think>` in the prompt, leaving only the close).

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitReply {
    /// The thinking, if the model wrote any.
    pub reasoning: Option<String>,
    /// What to send.
    pub answer: String,
}

pub fn split_reasoning(text: &str) -> SplitReply {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    let (before, after_open) = match text.find(OPEN) {
        Some(i) => (&text[..i], Some(&text[i + OPEN.len()..])),
        None => (text, None),
    };
    match (after_open, text.find(CLOSE)) {
        (Some(inner), _) => match inner.find(CLOSE) {
            Some(j) => SplitReply {
                reasoning: Some(inner[..j].trim().to_string()),
                answer: format!("{}{}", before, &inner[j + CLOSE.len()..]).trim().to_string(),
            },
            // Cut off while thinking: no answer yet.
            None => SplitReply { reasoning: Some(inner.trim().to_string()), answer: before.trim().to_string() },
        },
        (None, Some(j)) => SplitReply {
            reasoning: Some(text[..j].trim().to_string()),
            answer: text[j + CLOSE.len()..].trim().to_string(),
        },
        (None, None) => SplitReply { reasoning: None, answer: text.trim().to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_block_is_split_from_the_answer() {
        let r = split_reasoning("<think>\nsum the digits\n</think>\n\nIt is 42.");
        assert_eq!(r, SplitReply { reasoning: Some("sum the digits".into()), answer: "It is 42.".into() });
    }

    #[test]
    fn close_without_open_is_reasoning_opened_by_the_prompt() {
        let r = split_reasoning("hmm, easy</think>Yes.");
        assert_eq!(r, SplitReply { reasoning: Some("hmm, easy".into()), answer: "Yes.".into() });
    }

    #[test]
    fn unfinished_thinking_has_no_answer() {
        let r = split_reasoning("<think>still going");
        assert_eq!(r, SplitReply { reasoning: Some("still going".into()), answer: String::new() });
    }

    #[test]
    fn plain_text_is_all_answer() {
        assert_eq!(split_reasoning(" Hello "), SplitReply { reasoning: None, answer: "Hello".into() });
    }
}
