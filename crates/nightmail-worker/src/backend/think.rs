//! Splits `<think>...</think>` reasoning out of streamed text (DeepSeek-R1, Qwen3 and SmolLM3
//! write their reasoning inline), even when a tag is cut across chunks.

use super::Event;

#[derive(Default)]
pub struct ThinkSplitter {
    in_think: bool,
    /// Text held back because it may be the start of a tag.
    pending: String,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkSplitter {
    /// Feeds a chunk; returns the events it completes.
    pub fn push(&mut self, chunk: &str) -> Vec<Event> {
        self.pending.push_str(chunk);
        let mut events = Vec::new();
        loop {
            let tag = if self.in_think { CLOSE } else { OPEN };
            if let Some(pos) = self.pending.find(tag) {
                let before: String = self.pending[..pos].to_string();
                self.emit(&mut events, before);
                self.pending.drain(..pos + tag.len());
                self.in_think = !self.in_think;
                continue;
            }
            // Keep back a suffix that could still become the tag.
            let keep = (1..tag.len()).rev().find(|&n| self.pending.ends_with(&tag[..n])).unwrap_or(0);
            let cut = self.pending.len() - keep;
            let ready: String = self.pending.drain(..cut).collect();
            self.emit(&mut events, ready);
            return events;
        }
    }

    /// Flushes what is held back at the end of the stream.
    pub fn finish(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        self.emit(&mut events, rest);
        events
    }

    fn emit(&self, events: &mut Vec<Event>, text: String) {
        if text.is_empty() {
            return;
        }
        events.push(if self.in_think { Event::Reasoning(text) } else { Event::Content(text) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&str]) -> (String, String) {
        let mut s = ThinkSplitter::default();
        let mut events: Vec<Event> = chunks.iter().flat_map(|c| s.push(c)).collect();
        events.extend(s.finish());
        let mut content = String::new();
        let mut reasoning = String::new();
        for e in events {
            match e {
                Event::Content(t) => content.push_str(&t),
                Event::Reasoning(t) => reasoning.push_str(&t),
                Event::Checkpoint { .. } | Event::Engine(_) | Event::Prompt { .. } | Event::Restarted => {}
            }
        }
        (content, reasoning)
    }

    #[test]
    fn tags_split_across_chunks() {
        assert_eq!(run(&["<thi", "nk>hmm, 2+2", "</th", "ink>4"]), ("4".into(), "hmm, 2+2".into()));
        assert_eq!(run(&["no tags <b>here</b>"]), ("no tags <b>here</b>".into(), String::new()));
        assert_eq!(run(&["a <", "thinker"]), ("a <thinker".into(), String::new()));
    }
}
