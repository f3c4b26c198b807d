//! Arabic's and Hebrew's vowel points, read as if not written.
//!
//! Both scripts are usually written without their short vowels, and
//! sometimes with them: the Quran, poetry, children's books, a word a
//! writer wants read one way (`القَهْوَة` for `القهوة`, "coffee"; `שָׁלוֹם`
//! for `שלום`). Postgres's parser keeps each such mark in its word and
//! `unaccent` leaves it there, so the two spellings were two words and
//! neither found the other. Since Postgres's migration 0030 and SQLite's
//! 0021 (`reading 8`), the indexes and queries leave the marks of
//! [`POINTS`] out, as Lucene's Arabic normalisation leaves the harakat
//! and the tatweel out: `engram_search_text` removes them before the
//! parser reads the text, the SQLite tokenizer from each token's lexeme,
//! and a query's words and snippets' lexemes lose them likewise.
//!
//! The marks that make letters (`U+0653`–`U+0655`, madda and hamza above
//! and below, which a decomposed `أ` holds) are kept: removing them would
//! make another letter.

use std::borrow::Cow;
use std::ops::RangeInclusive;

/// Hebrew's cantillation marks and vowel points, and Arabic's Quranic
/// signs, harakat (tanwin, fatha, damma, kasra, shadda, sukun), the
/// superscript alef and the Quranic annotation signs, and the tatweel (a
/// stroke that only lengthens a letter).
pub const POINTS: &[RangeInclusive<char>] = &[
    '\u{0591}'..='\u{05bd}',
    '\u{05bf}'..='\u{05bf}',
    '\u{05c1}'..='\u{05c2}',
    '\u{05c4}'..='\u{05c5}',
    '\u{05c7}'..='\u{05c7}',
    '\u{0610}'..='\u{061a}',
    '\u{0640}'..='\u{0640}',
    '\u{064b}'..='\u{0652}',
    '\u{0656}'..='\u{065f}',
    '\u{0670}'..='\u{0670}',
    '\u{06d6}'..='\u{06dc}',
    '\u{06df}'..='\u{06e4}',
    '\u{06e7}'..='\u{06e8}',
    '\u{06ea}'..='\u{06ed}',
];

/// Whether `c` is one of [`POINTS`].
pub fn is_point(c: char) -> bool {
    ('\u{0591}'..='\u{06ed}').contains(&c) && POINTS.iter().any(|r| r.contains(&c))
}

/// `text` without its [`POINTS`].
pub fn without(text: &str) -> Cow<'_, str> {
    if text.is_ascii() || !text.chars().any(is_point) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().filter(|&c| !is_point(c)).collect())
}

/// The class of [`POINTS`] in Postgres's regular expressions, as
/// migration 0030 writes it in `engram_search_text` (a test holds the two
/// alike).
pub fn postgres_class() -> String {
    super::postgres_class(POINTS.iter().flat_map(|r| r.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_left_out_and_letters_kept() {
        assert_eq!(without("القَهْوَة"), "القهوة");
        assert_eq!(without("القـهوة"), "القهوة");
        assert_eq!(without("שָׁלוֹם"), "שלום");
        assert!(matches!(without("القهوة café"), Cow::Borrowed(_)));
        // A decomposed hamza makes a letter: it stays.
        assert_eq!(without("\u{0627}\u{0654}"), "\u{0627}\u{0654}");
    }

    #[test]
    fn the_postgres_class_is_the_migrations() {
        let class = postgres_class();
        assert!(class.starts_with("[\\u0591-\\u05bd\\u05bf"), "{class}");
        let migration =
            include_str!("../../migrations/postgres/0030_search_clusters_and_points.sql");
        assert_eq!(migration.matches(&class).count(), 5, "{class}");
    }
}
