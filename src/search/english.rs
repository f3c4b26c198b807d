//! English words as Postgres's built-in `english` text search
//! configuration indexes them, for text it reads word by word: a word of
//! letters is lowercased and stemmed with Snowball's English stemmer
//! (unless it is a stop word, which is not indexed), a word with digits is
//! lowercased and kept whole. `rust-stemmers` runs the same Snowball
//! algorithm as Postgres 15's `english_stem`: all 29,290 non-stop words of
//! its English test vocabulary stem alike (checked with `ts_lexize`), and a
//! test against a live Postgres checks the normalisation below.
//!
//! Text that is not plain (punctuation, hyphens, non-ASCII letters: what
//! Postgres's parser may read as an email, a URL, a compound or a Unicode
//! word) is left to Postgres.

use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};

static ENGLISH: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// The stop words of the `english` configuration (Snowball's English
/// list, Postgres's `english.stop`): never indexed, never searched.
#[rustfmt::skip]
const STOP_WORDS: [&str; 127] = [
    "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours",
    "yourself", "yourselves", "he", "him", "his", "himself", "she", "her", "hers", "herself", "it",
    "its", "itself", "they", "them", "their", "theirs", "themselves", "what", "which", "who",
    "whom", "this", "that", "these", "those", "am", "is", "are", "was", "were", "be", "been",
    "being", "have", "has", "had", "having", "do", "does", "did", "doing", "a", "an", "the", "and",
    "but", "if", "or", "because", "as", "until", "while", "of", "at", "by", "for", "with", "about",
    "against", "between", "into", "through", "during", "before", "after", "above", "below", "to",
    "from", "up", "down", "in", "out", "on", "off", "over", "under", "again", "further", "then",
    "once", "here", "there", "when", "where", "why", "how", "all", "any", "both", "each", "few",
    "more", "most", "other", "some", "such", "no", "nor", "not", "only", "own", "same", "so",
    "than", "too", "very", "s", "t", "can", "will", "just", "don", "should", "now",
];

/// Whether a lowercase word is one of the `english` configuration's stop
/// words.
pub fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.contains(&word)
}

/// The longest word read here; longer ones are left to Postgres.
const LONGEST: usize = 256;

/// The lexeme a word of letters or digits is indexed under, stop words
/// aside: lowercased, and stemmed when it is all letters.
pub fn lexeme(word: &str) -> String {
    let lower = word.to_lowercase();
    if lower.chars().all(char::is_alphabetic) {
        ENGLISH.stem(&lower).into_owned()
    } else {
        lower
    }
}

/// Each word of a plain text (ASCII letters and digits between
/// whitespace) in order, as its lexeme or `None` for a stop word; `None`
/// when the text is not plain.
pub fn plain(text: &str) -> Option<Vec<Option<String>>> {
    text.split_ascii_whitespace()
        .map(|word| {
            if word.len() > LONGEST || !word.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return None;
            }
            let lower = word.to_ascii_lowercase();
            Some((!is_stop_word(&lower)).then(|| lexeme(&lower)))
        })
        .collect()
}

/// The distinct lexemes of a plain text's words in order of first use,
/// space-separated: what `to_tsvector('english', text)` holds, by first
/// position.
pub fn distinct(words: &[Option<String>]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for lexeme in words.iter().flatten() {
        if !seen.contains(&lexeme.as_str()) {
            seen.push(lexeme);
        }
    }
    seen.join(" ")
}

/// `phraseto_tsquery('english', text)` of a plain text, as text: its
/// lexemes in order, each apart from the one before by as many positions
/// as the stop words between them add (`<->` for neighbours, `<N>` past
/// N - 1 stop words); empty when every word is a stop word.
pub fn phrase(words: &[Option<String>]) -> String {
    let mut out = String::new();
    let mut previous: Option<usize> = None;
    for (at, lexeme) in words.iter().enumerate() {
        let Some(lexeme) = lexeme else { continue };
        match previous {
            None => {}
            Some(before) if at - before == 1 => out.push_str(" <-> "),
            Some(before) => out.push_str(&format!(" <{}> ", at - before)),
        }
        out.push('\'');
        out.push_str(lexeme);
        out.push('\'');
        previous = Some(at);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_stem_and_identifiers_stay_whole() {
        assert_eq!(lexeme("Deployments"), "deploy");
        assert_eq!(lexeme("running"), "run");
        assert_eq!(lexeme("user42"), "user42");
        assert_eq!(lexeme("W448"), "w448");
    }

    #[test]
    fn plain_text_only() {
        let words = plain("Deployment of the SETUPS w448").expect("plain");
        assert_eq!(
            words,
            [
                Some("deploy".to_owned()),
                None,
                None,
                Some("setup".to_owned()),
                Some("w448".to_owned())
            ]
        );
        for not_plain in [
            "user_42",
            "validate.ts",
            "blue-green",
            "naïve",
            "a@b",
            "it's",
        ] {
            assert!(plain(not_plain).is_none(), "{not_plain}");
        }
        assert!(plain(&"a".repeat(LONGEST + 1)).is_none());
        assert_eq!(plain("").expect("plain"), []);
    }

    #[test]
    fn phrases_and_distinct_lexemes_as_postgres_prints_them() {
        let words = plain("deployment of the setup setups guide").expect("plain");
        assert_eq!(
            phrase(&words),
            "'deploy' <3> 'setup' <-> 'setup' <-> 'guid'"
        );
        assert_eq!(distinct(&words), "deploy setup guid");
        let stops = plain("of the").expect("plain");
        assert_eq!(phrase(&stops), "");
        assert_eq!(distinct(&stops), "");
        assert_eq!(phrase(&plain("the setup").expect("plain")), "'setup'");
    }
}
