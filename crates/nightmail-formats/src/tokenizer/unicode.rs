//! Code points as llama.cpp's pre-tokenizers see them (`src/unicode.cpp`): a general category
//! (letter, number, punctuation, mark, symbol or other), whether it is whitespace, and whether it
//! lies in the Han blocks of `unicode_cpt_is_han`. The category tables are the `regex-syntax`
//! crate's (its Unicode version), not a copy of llama.cpp's.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Letter,
    Number,
    Punctuation,
    /// `\p{M}`, llama.cpp's "accent mark".
    Mark,
    Symbol,
    /// Separators, controls, unassigned: none of the classes a pre-tokenizer's regex names.
    Other,
}

/// Sorted, disjoint code point ranges with their category.
fn ranges() -> &'static [(u32, u32, Category)] {
    static TABLE: OnceLock<Vec<(u32, u32, Category)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Vec::new();
        for (class, category) in [
            (r"\p{L}", Category::Letter),
            (r"\p{N}", Category::Number),
            (r"\p{P}", Category::Punctuation),
            (r"\p{M}", Category::Mark),
            (r"\p{S}", Category::Symbol),
        ] {
            let hir = regex_syntax::parse(class).expect("a Unicode general category parses");
            let HirKind::Class(Class::Unicode(set)) = hir.kind() else { unreachable!("{class} is a class") };
            table.extend(set.ranges().iter().map(|r| (r.start() as u32, r.end() as u32, category)));
        }
        table.sort_by_key(|r| r.0);
        table
    })
}

pub fn category(c: char) -> Category {
    let c = c as u32;
    let table = ranges();
    let i = table.partition_point(|r| r.1 < c);
    match table.get(i) {
        Some(&(start, _, category)) if start <= c => category,
        _ => Category::Other,
    }
}

/// llama.cpp's whitespace set is Unicode's White_Space property, as `char::is_whitespace`.
pub fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// `unicode_cpt_is_han`: the CJK Unified Ideographs blocks (with extensions A to F) and the
/// CJK Compatibility Ideographs, which Kimi K2's pre-tokenizer keeps apart from other letters.
pub fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0x2CEB0..=0x2EBEF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_unicode() {
        assert_eq!(category('a'), Category::Letter);
        assert_eq!(category('我'), Category::Letter);
        assert_eq!(category('٣'), Category::Number);
        assert_eq!(category('、'), Category::Punctuation);
        assert_eq!(category('\u{301}'), Category::Mark);
        assert_eq!(category('😀'), Category::Symbol);
        assert_eq!(category(' '), Category::Other);
        assert_eq!(category('\u{10FFFF}'), Category::Other);
        assert!(is_han('我') && !is_han('メ') && !is_han('가'));
        assert!(is_whitespace('\u{3000}') && !is_whitespace('\u{200B}'));
    }
}
