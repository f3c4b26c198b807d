//! English words as Postgres's built-in `english` text search
//! configuration indexes them, for text it reads word by word: a word of
//! letters is lowercased and stemmed with Snowball's English stemmer
//! (unless it is a stop word, which is not indexed), a word with digits is
//! lowercased and kept whole. `rust-stemmers` runs the same Snowball
//! algorithm as Postgres 15's `english_stem`: all 29,290 non-stop words of
//! its English test vocabulary stem alike (checked with `ts_lexize`), and a
//! test against a live Postgres checks the normalisation below.
//!
//! Which text the server reads itself, and how it reads it into words, is
//! [`plain`](mod@plain)'s part; this module is what each word becomes.

pub(super) mod plain;

pub use plain::{
    ARABIC_PUNCTUATION, EMOJI_SELECTOR, PUNCTUATION, Reading, SYMBOLS, arabic_probes, distinct,
    letter_probes, phrase, plain, punctuation_probe, spaced, symbol_probe,
};

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};

static ENGLISH: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// The stop words of the `english` configuration (Snowball's English
/// list, Postgres's `english.stop`): never indexed, never searched.
#[rustfmt::skip]
const STOP_WORDS: [&str; 127] = [
    "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
    "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
    "by", "can", "did", "do", "does", "doing", "don", "down", "during", "each", "few", "for",
    "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself",
    "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just",
    "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once",
    "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "s", "same", "she",
    "should", "so", "some", "such", "t", "than", "that", "the", "their", "theirs", "them",
    "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too",
    "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while",
    "who", "whom", "why", "will", "with", "you", "your", "yours", "yourself", "yourselves",
];

/// Whether a lowercase word is one of the `english` configuration's stop
/// words.
pub fn is_stop_word(word: &str) -> bool {
    packed(word).is_some_and(|key| PACKED_STOP_WORDS.binary_search(&key).is_ok())
}

/// The stop words as [`packed`] keys, sorted: a search compares integers,
/// where comparing strings was most of the cost of building an episode's
/// vector.
static PACKED_STOP_WORDS: LazyLock<Vec<u128>> = LazyLock::new(|| {
    let mut keys: Vec<u128> = STOP_WORDS.iter().filter_map(|w| packed(w)).collect();
    keys.sort_unstable();
    keys
});

/// A word of up to 15 bytes as one integer: its bytes, then its length.
fn packed(word: &str) -> Option<u128> {
    let bytes = word.as_bytes();
    let mut key = [0u8; 16];
    key.get_mut(..bytes.len())?.copy_from_slice(bytes);
    key[15] = u8::try_from(bytes.len()).ok().filter(|&n| n < 16)?;
    Some(u128::from_be_bytes(key))
}

/// The longest word read here; longer ones are left to Postgres.
const LONGEST: usize = 256;

/// The lexeme a word of letters or digits is indexed under, stop words
/// aside: its letters folded as `engram_english`'s `unaccent` reads a
/// word with a non-ASCII letter (and SQLite's tokenizer any word; see
/// [`folded`]), lowercased, and stemmed when it is all letters.
/// Spelt first as the indexes spell text since Postgres's 0031 and
/// SQLite's 0022 ([`super::spelling::read`]): Arabic's and Hebrew's vowel
/// points left out, Arabic's letter variants read alike and its article
/// left off.
pub fn lexeme(word: &str) -> String {
    let word = spelt(word);
    lowercase_lexeme(folded_lowercase(&word).into_owned())
}

/// A word as the indexes spell it before folding its letters: the
/// Arabic script's digits as ASCII ones, then
/// [`spelling::read`](super::spelling::read).
fn spelt(word: &str) -> Cow<'_, str> {
    use super::spelling;
    spelling::then(spelling::ascii_digits(word), spelling::read)
}

/// [`lexeme`] as a database whose `LC_CTYPE` is Turkish or Azerbaijani
/// reads a word: its lowercasing takes `I` to a dotless `ı` (`INVOICE` is
/// `ınvoıc` there). `unaccent` runs first, as it does there, so `İ` is
/// read as `I` and lowercased the same way. Only snippets on such a
/// database use it; the server leaves every other reading to Postgres
/// there ([`crate::store::PgStore::text_in_rust`]).
pub fn turkic_lexeme(word: &str) -> String {
    let word = spelt(word);
    let mut lower = String::with_capacity(word.len() + 1);
    for c in folded(&word).chars() {
        match c {
            'I' => lower.push('ı'),
            c => lower.extend(c.to_lowercase()),
        }
    }
    lowercase_lexeme(lower)
}

/// The table of Postgres's `unaccent` dictionary, the file it reads
/// (`unaccent.rules` of PostgreSQL 15's contrib module, © The PostgreSQL
/// Global Development Group, under the PostgreSQL License): a character,
/// a tab and what it is read as (nothing, for a combining mark), one per
/// line.
const UNACCENT_RULES: &str = include_str!("unaccent.rules");

/// [`UNACCENT_RULES`] by character.
static UNACCENT: LazyLock<HashMap<char, &'static str>> = LazyLock::new(|| {
    UNACCENT_RULES
        .lines()
        .filter_map(|line| {
            let (from, to) = line.split_once('\t').unwrap_or((line, ""));
            let mut chars = from.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Some((c, to)),
                _ => None,
            }
        })
        .collect()
});

/// A word as `engram_english`'s `unaccent` reads it, before the stemmer
/// lowercases it: each character `unaccent`'s table holds replaced as the
/// table says (`é` → `e`, `ß` → `ss`, `ł` → `l`, `ﬁ` → `fi`, `ᴀ` → `A`, a
/// combining mark taken off) and every other character kept (`й` stays,
/// as it does there). Postgres applies no Unicode normalisation, so
/// neither does this: a decomposition it lacks would read `й` as `и` here
/// and not there. A test holds this to a live Postgres over every letter
/// of the Latin, Greek and Cyrillic blocks.
pub fn folded(word: &str) -> Cow<'_, str> {
    if word.is_ascii() || !word.chars().any(|c| UNACCENT.contains_key(&c)) {
        return Cow::Borrowed(word);
    }
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        match UNACCENT.get(&c) {
            Some(to) => out.push_str(to),
            None => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`folded`], then lowercased, as Postgres reads a word: `unaccent` sees
/// the word as written (`Ɩ` → `I` → `i`, where `ɩ` stays).
pub fn folded_lowercase(word: &str) -> Cow<'_, str> {
    match folded(word) {
        Cow::Borrowed(w) if w.chars().all(is_lowercase) => Cow::Borrowed(w),
        // Character by character, as Postgres lowercases (`Σ` is `σ` at
        // a word's end too).
        f => Cow::Owned(f.chars().flat_map(char::to_lowercase).collect()),
    }
}

/// Whether a character is its own lowercase.
fn is_lowercase(c: char) -> bool {
    let mut lower = c.to_lowercase();
    lower.next() == Some(c) && lower.next().is_none()
}

/// [`lexeme`] of a word already lowercase.
fn lowercase_lexeme(lower: String) -> String {
    match stem_lowercase(&lower) {
        Cow::Borrowed(_) => lower,
        Cow::Owned(stem) => stem,
    }
}

thread_local! {
    /// Each thread's stems of the words it read lately (`None`: the word
    /// is its own stem): text repeats its words, and Snowball's stemmer
    /// was a third of building a vector (about 80 µs for a kilobyte of
    /// agents' prose, 47 with this). Emptied when it holds
    /// [`MOST_STEMS`]; a refill costs only the stemming it saved.
    static STEMS: RefCell<HashMap<String, Option<String>>> = RefCell::new(HashMap::new());
}

/// The most words [`STEMS`] keeps per thread (about 100 bytes each).
const MOST_STEMS: usize = 4_096;

/// Snowball's English stem of a lowercase word of letters, `None` when it
/// is the word itself ([`STEMS`]).
fn stem(lower: &str) -> Option<String> {
    STEMS.with_borrow_mut(|stems| {
        if let Some(stem) = stems.get(lower) {
            return stem.clone();
        }
        let stem = match ENGLISH.stem(lower) {
            Cow::Owned(stem) if stem != lower => Some(stem),
            _ => None,
        };
        if stems.len() >= MOST_STEMS {
            stems.clear();
        }
        stems.insert(lower.to_owned(), stem.clone());
        stem
    })
}

/// The lexeme of a word already lowercase and without diacritics (as
/// SQLite's tokenizer hands them over): stemmed when it is all letters,
/// else itself.
pub fn stem_lowercase(lower: &str) -> Cow<'_, str> {
    if !lower.chars().all(char::is_alphabetic) {
        return Cow::Borrowed(lower);
    }
    match stem(lower) {
        Some(stem) => Cow::Owned(stem),
        None => Cow::Borrowed(lower),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_and_only_they_are_found() {
        assert_eq!(PACKED_STOP_WORDS.len(), STOP_WORDS.len());
        assert!(STOP_WORDS.iter().all(|w| is_stop_word(w)));
        for word in [
            "",
            "deploy",
            "th",
            "thes",
            "a\0",
            "themselvesx",
            "x".repeat(40).as_str(),
        ] {
            assert!(!is_stop_word(word), "{word:?}");
        }
    }

    #[test]
    fn words_stem_and_identifiers_stay_whole() {
        assert_eq!(lexeme("Deployments"), "deploy");
        assert_eq!(lexeme("running"), "run");
        assert_eq!(lexeme("user42"), "user42");
        assert_eq!(lexeme("W448"), "w448");
        assert_eq!(lexeme("Café"), "cafe");
        assert_eq!(lexeme("naïve"), lexeme("naive"));
    }

    #[test]
    fn letters_fold_as_unaccent_reads_them() {
        for (word, read) in [
            ("straße", "strass"),
            ("æsir", "aesir"),
            ("søren", "soren"),
            ("łódź", "lodz"),
            ("þing", "thing"),
            ("ﬁle", "file"),
            ("ｆｕｌｌ", "full"),
            ("œuvre", "oeuvr"),
        ] {
            assert_eq!(lexeme(word), read, "{word}");
        }
        assert!(matches!(folded("plain"), Cow::Borrowed(_)));
    }
}
