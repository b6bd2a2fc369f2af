//! The merge loop llama.cpp's SPM and BPE sessions share (`llm_tokenizer_spm_session` and
//! `llm_tokenizer_bpe_session::tokenize`): start from a word's characters and keep merging the
//! adjacent pair the vocabulary ranks first, the leftmost among equals, until no pair ranks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// The pieces `word` merges into, in order. `rank(left, right, joined)` ranks a pair (the
/// greater pops first), `None` when it does not merge.
pub(super) fn merge<P: PartialOrd>(word: &str, rank: impl Fn(&str, &str, &str) -> Option<P>) -> Vec<&str> {
    let mut symbols: Vec<Symbol> = Vec::new();
    for (start, c) in word.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next: None });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    let pair = |symbols: &[Symbol], left: Option<usize>, right: Option<usize>| -> Option<Pair<P>> {
        let (left, right) = (left?, right?);
        let (l, r) = (&symbols[left], &symbols[right]);
        let at = |s: &Symbol| &word[s.start..s.start + s.len];
        let joined = &word[l.start..l.start + l.len + r.len];
        Some(Pair { rank: rank(at(l), at(r), joined)?, left, right, len: joined.len() })
    };
    let mut queue = BinaryHeap::new();
    for i in 1..symbols.len() {
        queue.extend(pair(&symbols, Some(i - 1), Some(i)));
    }
    while let Some(p) = queue.pop() {
        let (l, r) = (&symbols[p.left], &symbols[p.right]);
        // Stale: one side has been merged away or grown since this pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != p.len || l.next != Some(p.right) {
            continue;
        }
        let right_next = r.next;
        symbols[p.left].len += symbols[p.right].len;
        symbols[p.right].len = 0;
        symbols[p.left].next = right_next;
        if let Some(n) = right_next {
            symbols[n].prev = Some(p.left);
        }
        queue.extend(pair(&symbols, symbols[p.left].prev, Some(p.left)));
        queue.extend(pair(&symbols, Some(p.left), right_next));
    }
    let mut pieces = Vec::new();
    let mut at = (!symbols.is_empty()).then_some(0);
    while let Some(i) = at {
        let s = &symbols[i];
        pieces.push(&word[s.start..s.start + s.len]);
        at = s.next;
    }
    pieces
}

/// A stretch of the word being merged; `len` 0 once merged into its left neighbour.
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Two adjacent symbols whose merge ranks. The queue pops the greatest rank first and, among
/// equal ranks, the leftmost pair (`llm_bigram_spm::comparator`, `llm_bigram_bpe::comparator`).
struct Pair<P> {
    rank: P,
    left: usize,
    right: usize,
    len: usize,
}

impl<P: PartialOrd> Ord for Pair<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank.partial_cmp(&other.rank).unwrap_or(Ordering::Equal).then_with(|| other.left.cmp(&self.left))
    }
}

impl<P: PartialOrd> PartialOrd for Pair<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<P: PartialOrd> PartialEq for Pair<P> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<P: PartialOrd> Eq for Pair<P> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_pop_by_rank_then_leftmost() {
        let a = Pair { rank: -1.0, left: 3, right: 4, len: 2 };
        let b = Pair { rank: -1.0, left: 1, right: 2, len: 2 };
        let c = Pair { rank: -0.5, left: 7, right: 8, len: 2 };
        let mut q: BinaryHeap<Pair<f32>> = [a, b, c].into_iter().collect();
        assert_eq!(q.pop().unwrap().left, 7);
        assert_eq!(q.pop().unwrap().left, 1);
        assert_eq!(q.pop().unwrap().left, 3);
    }

    #[test]
    fn the_best_ranked_pair_merges_first() {
        // "ab" ranks above "bc": a|b|c → ab|c, and "abc" never forms.
        let rank = |_: &str, _: &str, joined: &str| match joined {
            "ab" => Some(2),
            "bc" => Some(1),
            _ => None,
        };
        assert_eq!(merge("abc", rank), ["ab", "c"]);
    }
}
