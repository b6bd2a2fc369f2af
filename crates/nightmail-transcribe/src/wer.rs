//! Word error rate, the measure speech recognition is scored by (Radford et al. 2022 §3.2 report it
//! after text normalisation): word-level Levenshtein distance (substitutions + deletions +
//! insertions) divided by the number of reference words.

/// Lowercase words with punctuation removed, so "Fox," and "fox" are one word.
pub fn normalized_words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| w.chars().filter(|c| c.is_alphanumeric() || *c == '\'').collect::<String>().to_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Edit distance between the normalised words over the reference's word count (1.0 when the
/// reference is empty and the hypothesis is not).
pub fn word_error_rate(reference: &str, hypothesis: &str) -> f32 {
    let (r, h) = (normalized_words(reference), normalized_words(hypothesis));
    if r.is_empty() {
        return if h.is_empty() { 0.0 } else { 1.0 };
    }
    // One row of the dynamic-programming table at a time.
    let mut previous: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut current = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            let substitute = previous[j] + usize::from(rw != hw);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[h.len()] as f32 / r.len() as f32
}

#[cfg(test)]
mod tests {
    use super::word_error_rate;

    #[test]
    fn counts_substitutions_deletions_insertions() {
        assert_eq!(word_error_rate("the quick brown fox", "The quick, brown fox."), 0.0);
        assert_eq!(word_error_rate("the quick brown fox", "the quick red fox"), 0.25);
        assert_eq!(word_error_rate("the quick brown fox", "the brown fox"), 0.25);
        assert_eq!(word_error_rate("the quick brown fox", "the very quick brown fox jumps"), 0.5);
        assert_eq!(word_error_rate("a b", ""), 1.0);
        assert_eq!(word_error_rate("", ""), 0.0);
    }
}
