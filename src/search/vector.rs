//! An episode's search vector built by the server, as Postgres would build
//! it (`engram_episode_vector`, migration 0020):
//! `jsonb_to_tsvector('engram_english', content, '["string", "numeric"]') ||
//! jsonb_to_tsvector('engram_english', metadata, …)`, each JSON's text read as
//! [`english::spaced`] reads it (`/` and compounds' `.` and `@` as spaces;
//! migration 0020's `engram_search_text`), in `tsvector`'s binary form (what
//! `tsvectorsend` writes and `tsvectorrecv` reads).
//!
//! Why here: building the vector was Postgres's largest cost of an append
//! (about 160 µs of parsing for a 1 KB episode; see docs/benchmarks.md, "Search").
//! Built here, Postgres only reads it. It is built only when every string
//! is plain text ([`english::plain`](fn@english::plain)), every JSON number is printed
//! without an exponent, and Postgres would cap nothing; for anything else
//! (a URL, an email, a number a letter runs into (`v1.2`), letters
//! outside ASCII beside a digit or hyphen, a key holding `/`, `.` or `@`
//! in a compound; see [`english::plain`](fn@english::plain)) the append
//! sends no vector and Postgres builds it (migration 0017's trigger), so
//! the stored vector is the same either way. A test against a live Postgres compares the two on generated
//! episodes.
//!
//! A memory version's vector likewise (`engram_memory_vector`): the key's
//! words by `to_tsvector`, weighted `A`, then the value's as an episode's
//! content ([`memory`]).
//!
//! How `jsonb_to_tsvector` numbers words: it reads the strings in jsonb's
//! order (an object's keys shortest first, then bytewise), one position per
//! word, stop words included, and one more after each string that gave a
//! lexeme, so a phrase never spans two strings. `||` then moves the
//! metadata's positions past the content's highest.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::english;

/// Postgres keeps at most this many positions of a lexeme
/// (`MAXNUMPOS - 1` in `to_tsvector`).
const MOST_POSITIONS: usize = 255;

/// Positions from this one on are all stored as this one (`MAXENTRYPOS -
/// 1`): past it the vector is left to Postgres.
const LAST_POSITION: u32 = 16_383;

/// The most bytes of distinct lexemes a vector holds (`MAXSTRPOS`): past
/// it Postgres refuses the vector, and its functions build one of the
/// item's leading text instead (migration 0033), so it is left to them.
const MOST_LEXEME_BYTES: usize = (1 << 20) - 1;

/// Each word kept, as its lexeme and position, in the order read.
type Words = Vec<(String, u32)>;

/// The episode's vector in binary form, or `None` when Postgres must build
/// it (see the module comment); `reading` is how far the database's parser
/// reads text as the server does.
pub fn episode(
    content: &Value,
    metadata: &Map<String, Value>,
    reading: english::Reading,
) -> Option<Vec<u8>> {
    let mut reader = Reader::new(reading);
    reader.value(content)?;
    let content = reader.words;
    let mut reader = Reader::new(reading);
    reader.object(metadata)?;
    let (words, _) = concat(content, reader.words);
    send(&words, 0)
}

/// `left || right` of two vectors' words, sorted, and where `left`'s
/// positions end: `||` moves `right`'s positions past `left`'s highest
/// (the last word's, since positions only grow as words are read).
fn concat(mut left: Words, right: Words) -> (Words, u32) {
    let shift = left.last().map_or(0, |(_, at)| *at);
    left.extend(right.into_iter().map(|(lexeme, at)| (lexeme, at + shift)));
    left.sort_unstable();
    (left, shift)
}

/// A memory version's vector in binary form (`engram_memory_vector(key,
/// value)`: `setweight(to_tsvector(key), 'A') || jsonb_to_tsvector(value)`),
/// or `None` when Postgres must build it, as for [`episode`].
pub fn memory(key: &str, value: &Value, reading: english::Reading) -> Option<Vec<u8>> {
    // The key is text, not JSON: one string, numbered from 1, with no gap
    // after it.
    let mut words = Words::new();
    for (at, word) in (1..).zip(english::plain(&english::spaced(key), reading)?) {
        if let Some(lexeme) = word {
            words.push((lexeme, at));
        }
    }
    let mut reader = Reader::new(reading);
    reader.value(value)?;
    // Only the key's positions are weighted `A`.
    let (words, key_end) = concat(words, reader.words);
    send(&words, key_end)
}

struct Reader {
    words: Words,
    /// The last position given.
    at: u32,
    reading: english::Reading,
}

impl Reader {
    fn new(reading: english::Reading) -> Self {
        Reader {
            words: Words::new(),
            at: 0,
            reading,
        }
    }

    fn value(&mut self, value: &Value) -> Option<()> {
        match value {
            Value::String(text) => self.text(text),
            // Postgres reads a number as jsonb prints it, and jsonb prints
            // what it was sent: the server sends serde_json's text, so
            // that is the text read, but in exponent form (`1e21`), which
            // jsonb prints in full.
            Value::Number(number) => {
                let text = number.to_string();
                if text.contains(['e', 'E']) {
                    return None;
                }
                self.text(&text)
            }
            Value::Array(items) => items.iter().try_for_each(|item| self.value(item)),
            Value::Object(object) => self.object(object),
            Value::Bool(_) | Value::Null => Some(()),
        }
    }

    fn object(&mut self, object: &Map<String, Value>) -> Option<()> {
        // Postgres reads the keys as spaced too, which could make two keys
        // one or change their order.
        if object
            .keys()
            .any(|key| matches!(english::spaced(key), Cow::Owned(_)) || escape_before_mark(key))
        {
            return None;
        }
        let mut keys: Vec<&String> = object.keys().collect();
        keys.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        keys.into_iter()
            .try_for_each(|key| self.value(object.get(key)?))
    }

    fn text(&mut self, text: &str) -> Option<()> {
        if escape_before_mark(text) {
            return None;
        }
        let words = english::plain(&english::spaced(text), self.reading)?;
        let kept = self.words.len();
        for word in words {
            self.at += 1;
            if let Some(lexeme) = word {
                self.words.push((lexeme, self.at));
            }
        }
        if self.words.len() > kept {
            self.at += 1;
        }
        Some(())
    }
}

/// Whether a control character, which the JSON's text writes as an escape
/// ending in a letter or digit (`\n`, `\u001f`), stands before a mark
/// that Postgres's spacing of the JSON's text (`engram_search_text` over
/// `content::text`) then reads as following a letter or digit: a `-`
/// before a digit (`\n-5` loses its sign there), a `.` or `@` before a
/// letter or digit. A list's `\n- item` reads alike in both.
fn escape_before_mark(text: &str) -> bool {
    text.as_bytes().windows(3).any(|w| {
        w[0] < 0x20
            && match w[1] {
                b'-' => w[2].is_ascii_digit(),
                b'.' | b'@' => w[2].is_ascii_alphanumeric(),
                _ => false,
            }
    })
}

/// `tsvectorsend`'s form of `words` sorted by lexeme, then position: the
/// number of lexemes, then each lexeme (in bytewise order) NUL-terminated,
/// its number of positions and each position, big-endian, with its weight
/// in the top two bits: `A` up to `weighted_to`, `D` (none) after.
/// `None` past what Postgres would keep.
fn send(words: &[(String, u32)], weighted_to: u32) -> Option<Vec<u8>> {
    const WEIGHT_A: u16 = 3 << 14;
    let mut out = Vec::with_capacity(4 + words.len() * 12);
    out.extend_from_slice(&[0; 4]);
    let mut lexemes: i32 = 0;
    let mut lexeme_bytes = 0;
    for group in words.chunk_by(|a, b| a.0 == b.0) {
        if group.len() > MOST_POSITIONS || group.iter().any(|(_, at)| *at >= LAST_POSITION) {
            return None;
        }
        lexeme_bytes += group[0].0.len();
        if lexeme_bytes > MOST_LEXEME_BYTES {
            return None;
        }
        out.extend_from_slice(group[0].0.as_bytes());
        out.push(0);
        out.extend_from_slice(&(group.len() as u16).to_be_bytes());
        for (_, at) in group {
            let weight = if *at <= weighted_to { WEIGHT_A } else { 0 };
            out.extend_from_slice(&(*at as u16 | weight).to_be_bytes());
        }
        lexemes += 1;
    }
    out[..4].copy_from_slice(&lexemes.to_be_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The vector as `(lexeme, positions)`, decoded back from its binary
    /// form.
    fn decoded(bytes: &[u8]) -> Vec<(String, Vec<u16>)> {
        let count = i32::from_be_bytes(bytes[..4].try_into().expect("count")) as usize;
        let mut rest = &bytes[4..];
        let mut out = Vec::new();
        for _ in 0..count {
            let end = rest.iter().position(|&b| b == 0).expect("NUL");
            let lexeme = String::from_utf8(rest[..end].to_vec()).expect("utf-8");
            let n = u16::from_be_bytes([rest[end + 1], rest[end + 2]]) as usize;
            let positions = (0..n)
                .map(|i| u16::from_be_bytes([rest[end + 3 + 2 * i], rest[end + 4 + 2 * i]]))
                .collect();
            rest = &rest[end + 3 + 2 * n..];
            out.push((lexeme, positions));
        }
        assert!(rest.is_empty());
        out
    }

    #[test]
    fn a_memory_vector_weights_the_key_and_moves_the_value_past_it() {
        let built = memory(
            "deploy/notes the",
            &json!({"text": "notes on deploy", "n": 2}),
            english::Reading::Punctuation,
        )
        .map(|bytes| decoded(&bytes));
        // `A` is the top two bits of a position: the key's `deploy` 1 and
        // `note` 2, then the value's strings (shortest key first: `2` at
        // 1, then `note` 3 and `deploy` 5), each moved past 2.
        let a = |at: u16| at | 3 << 14;
        assert_eq!(
            built,
            Some(vec![
                entry("2", &[3]),
                entry("deploy", &[a(1), 7]),
                entry("note", &[a(2), 5]),
            ])
        );
        // A key with no lexeme moves nothing and weighs nothing.
        assert_eq!(
            memory("the", &json!("w1"), english::Reading::Ascii).map(|b| decoded(&b)),
            Some(vec![entry("w1", &[1])])
        );
        // What the server leaves to Postgres in a value, it leaves in a key.
        assert!(memory("release v1.2", &json!("w1"), english::Reading::Ascii).is_none());
    }

    fn vector(content: Value, metadata: Value) -> Option<Vec<(String, Vec<u16>)>> {
        let Value::Object(metadata) = metadata else {
            panic!("metadata is an object")
        };
        episode(&content, &metadata, english::Reading::Punctuation).map(|bytes| decoded(&bytes))
    }

    fn entry(lexeme: &str, positions: &[u16]) -> (String, Vec<u16>) {
        (lexeme.to_owned(), positions.to_vec())
    }

    #[test]
    fn strings_are_numbered_in_jsonb_order_with_a_gap_after_each() {
        // As Postgres numbers them: "deploy b1" 1-2, "c1 d1" 4-5, "the"
        // gives no lexeme and no gap, "e1" 8, "f1" 10.
        assert_eq!(
            vector(
                json!(["deploy b1", "c1 d1", "the", "e1", "", "f1"]),
                json!({})
            ),
            Some(vec![
                entry("b1", &[2]),
                entry("c1", &[4]),
                entry("d1", &[5]),
                entry("deploy", &[1]),
                entry("e1", &[8]),
                entry("f1", &[10]),
            ])
        );
        // Keys shortest first, then bytewise; booleans and nulls skipped.
        assert_eq!(
            vector(
                json!({"bb": "x2", "a": "x1", "ccc": {"z": "x3", "y": ["x4", true, null, "x5"]}}),
                json!({})
            ),
            Some(vec![
                entry("x1", &[1]),
                entry("x2", &[3]),
                entry("x3", &[9]),
                entry("x4", &[5]),
                entry("x5", &[7]),
            ])
        );
    }

    #[test]
    fn metadata_follows_the_contents_highest_position() {
        assert_eq!(
            vector(json!("the a1"), json!({"k": "b1 the a1"})),
            Some(vec![entry("a1", &[2, 5]), entry("b1", &[3])])
        );
        assert_eq!(
            vector(json!("the"), json!({"k": "src/auth/b1"})),
            Some(vec![
                entry("auth", &[2]),
                entry("b1", &[3]),
                entry("src", &[1])
            ])
        );
    }

    #[test]
    fn what_postgres_reads_otherwise_is_left_to_it() {
        for content in [
            json!(1e21),
            json!({"n": 1.5e-7}),
            json!("10-fold cases"),
            json!("naïve"),
            json!("3.14E5 units"),
            json!("a\n-5"),
            json!({"k\t.x": "w1"}),
            json!({"a/b": "x"}),
            json!("w1 ".repeat(MOST_POSITIONS + 1)),
            json!(format!("{}w1", "the ".repeat(LAST_POSITION as usize - 1))),
        ] {
            assert_eq!(vector(content.clone(), json!({})), None, "{content}");
        }
        assert!(vector(json!("w1 ".repeat(MOST_POSITIONS)), json!({})).is_some());
        assert!(vector(json!("list:\n- w1\n- w2"), json!({})).is_some());
        let last = vector(
            json!(format!("{}w1", "the ".repeat(LAST_POSITION as usize - 2))),
            json!({}),
        );
        assert_eq!(last, Some(vec![entry("w1", &[16_382])]));
    }

    /// More than a megabyte of distinct lexemes is past what a vector
    /// holds: Postgres's functions build that one (of the leading text).
    #[test]
    fn a_megabyte_of_distinct_words_is_left_to_postgres() {
        let words = |n: u32| {
            let mut text = String::new();
            for i in 0..n {
                let mut word: String = (0..4)
                    .map(|d| char::from(b'a' + (i / 26u32.pow(d) % 26) as u8))
                    .collect();
                word.push_str(&"q".repeat(116));
                text.push_str(&word);
                text.push(' ');
            }
            json!(text)
        };
        assert_eq!(vector(words(9_000), json!({})), None);
        assert!(vector(words(8_000), json!({})).is_some());
    }

    /// A JSON number is read as the text serde_json prints, which is what
    /// jsonb keeps: one word, then a gap, as a string of it would be.
    #[test]
    fn numbers_are_read_as_printed() {
        assert_eq!(
            vector(json!([42, -5, 2.5, "w1"]), json!({"n": -0.25})),
            Some(vec![
                entry("-0.25", &[8]),
                entry("-5", &[3]),
                entry("2.5", &[5]),
                entry("42", &[1]),
                entry("w1", &[7]),
            ])
        );
    }

    /// Curly quotes and dashes are breaks where the database reads them
    /// so, and leave the episode to Postgres where it does not.
    #[test]
    fn punctuation_follows_the_reading() {
        let text = json!("Don’t deploy — it’s 3.5 “late”");
        assert_eq!(
            vector(text.clone(), json!({})),
            Some(vec![
                entry("3.5", &[6]),
                entry("deploy", &[3]),
                entry("late", &[7]),
            ])
        );
        let metadata = Map::new();
        assert!(episode(&text, &metadata, english::Reading::Ascii).is_none());
    }
}
