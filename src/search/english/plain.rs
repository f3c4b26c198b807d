//! Text for Postgres, and every query, is read through [`spaced`] first,
//! which makes the `/` of a path and the `.` and `@` of a file name, host
//! or email spaces (SQLite's tokenizer splits them itself). Text that is
//! not plain then (`@`, `~`, a tag or an entity, a number beside other
//! marks, letters outside ASCII beside digits or hyphens or where the
//! database reads them otherwise: what Postgres's parser may read as an
//! email, a URL, a host, a number, markup or a Unicode word, or reads by
//! the database's locale) is left to Postgres. Where it reads no markup
//! ([`markup::hidden`]), `<`, `>` and `&` are breaks, and so is a `+`
//! before anything but a digit.
//! Plain text is ASCII letters and digits between whitespace and the
//! punctuation the parser always reads as a break ([`BREAKS`], a hyphen
//! not followed by a letter or digit, and a dot that ends a word before
//! whitespace), compounds joined by hyphens (`state-of-the-art`,
//! `gpt-4o-mini`), and decimals, versions and signed numbers standing
//! between such breaks ([`numbers::whole`]) or, unsigned, before letters
//! (`3.21s`, read as `3.21` and `s`). Where the database's locale reads
//! them as neither letters nor digits (which the store checks: a
//! [`Reading`]), the common punctuation outside ASCII ([`PUNCTUATION`]:
//! curly quotes, dashes, the ellipsis, no-break spaces) and emoji
//! ([`SYMBOLS`]) are breaks too, and words of Latin, Greek and Cyrillic
//! letters ([`LETTERS`]) words. Tests compare this with a live Postgres
//! on generated text, on agents' episodes and on this project's README
//! and benchmark log.

use std::borrow::Cow;
use std::ops::RangeInclusive;

use super::{ENGLISH, LONGEST, folded_lowercase, is_stop_word, lexeme, lowercase_lexeme};
use crate::search::{markup, numbers, spelling};

/// A text as Postgres's indexes and every query read it before splitting
/// it into words: `/` is a space (but in `</` and `/>`), and so is a `.` or `@` between letters
/// and digits with a letter on at least one side (`validate.ts`,
/// `ops@example.com`, `file1.txt`), which Postgres's parser would
/// otherwise keep whole as a file name, a host or an email, and a `-`
/// between a letter or digit and a digit (`covid-19`, `2026-11-25`),
/// which it would read as a minus sign (`-19`), so that each part is
/// found on its own, as SQLite's tokenizer finds it. A number's point
/// stays (`3.14`, `v1.2`). Postgres reads text the same way with
/// `engram_search_text` (migrations 0020 and 0027).
pub fn spaced(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let space = |at: usize| -> bool {
        match bytes.get(at) {
            // Not the `/` of a tag (`</p>`, `<br/>`), which the parser
            // then reads as a tag (see `markup`).
            Some(b'/') => {
                at.checked_sub(1).and_then(|i| bytes.get(i)) != Some(&b'<')
                    && bytes.get(at + 1) != Some(&b'>')
            }
            Some(&mark @ (b'.' | b'@' | b'-')) => {
                let before = at.checked_sub(1).and_then(|i| bytes.get(i));
                let after = bytes.get(at + 1);
                matches!((before, after), (Some(b), Some(a))
                if b.is_ascii_alphanumeric() && a.is_ascii_alphanumeric()
                    && if mark == b'-' {
                        a.is_ascii_digit()
                    } else {
                        b.is_ascii_alphabetic() || a.is_ascii_alphabetic()
                    })
            }
            _ => false,
        }
    };
    if !(0..bytes.len()).any(space) {
        return Cow::Borrowed(text);
    }
    // Only ASCII marks are replaced, so every other character stays whole.
    Cow::Owned(
        text.char_indices()
            .map(|(at, c)| if space(at) { ' ' } else { c })
            .collect(),
    )
}

/// Punctuation Postgres's default parser reads as a break between words
/// wherever it stands, alone or beside other such marks.
pub(in crate::search) const BREAKS: &[u8] = b"!\"#$%'()*,;:=?[\\]^_`{|}";

/// [`BREAKS`] by byte: looked up for every byte of a text, where a search
/// of the list was a tenth of building a vector.
static BREAK_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut at = 0;
    while at < BREAKS.len() {
        table[BREAKS[at] as usize] = true;
        at += 1;
    }
    table
};

/// Whether a byte is one of [`BREAKS`].
pub(in crate::search) fn is_break_mark(byte: u8) -> bool {
    BREAK_BYTES[usize::from(byte)]
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Characters outside ASCII that Postgres's parser reads as a break
/// (`blank`) in the usual locales (`C.UTF-8`, `en_US.UTF-8`): common
/// punctuation and spaces of the Latin-1 and General Punctuation blocks
/// and a few symbols. In the `C` locale the parser reads every character
/// outside ASCII as a letter, so a store reads these as breaks only after
/// it has checked that its database reads each of them so
/// ([`Reading::Punctuation`]).
pub const PUNCTUATION: &[RangeInclusive<char>] = &[
    '\u{a0}'..='\u{a1}',     // no-break space, ¡
    '\u{a9}'..='\u{a9}',     // ©
    '\u{ab}'..='\u{ab}',     // «
    '\u{ae}'..='\u{b1}',     // ® ¯ ° ±
    '\u{bb}'..='\u{bb}',     // »
    '\u{bf}'..='\u{bf}',     // ¿
    '\u{d7}'..='\u{d7}',     // ×
    '\u{f7}'..='\u{f7}',     // ÷
    '\u{2002}'..='\u{200a}', // en space … hair space
    '\u{2010}'..='\u{2027}', // hyphens, dashes, quotes, daggers, bullets, …
    '\u{2030}'..='\u{203a}', // ‰ ′ ″ ‹ ›
    '\u{202f}'..='\u{202f}', // narrow no-break space
    '\u{20ac}'..='\u{20ac}', // €
    '\u{2122}'..='\u{2122}', // ™
    '\u{2190}'..='\u{2193}', // arrows
];

/// Emoji and other pictographs, which Postgres's parser reads as breaks
/// where it reads [`PUNCTUATION`] so, checked apart
/// ([`Reading::Symbols`]): Misc Symbols and Pictographs, Emoticons,
/// Transport, Supplemental Symbols, Misc Symbols, Dingbats, stars, and the
/// zero-width joiner of emoji sequences. Emoji's presentation selector
/// (U+FE0F) is a break only after a break ([`EMOJI_SELECTOR`]).
pub const SYMBOLS: &[RangeInclusive<char>] = &[
    '\u{200d}'..='\u{200d}',
    '\u{2600}'..='\u{27bf}',
    '\u{2b50}'..='\u{2b50}',
    '\u{2b55}'..='\u{2b55}',
    '\u{1f300}'..='\u{1f6ff}',
    '\u{1f900}'..='\u{1f9ff}',
    '\u{1fa70}'..='\u{1faff}',
];

/// The emoji presentation selector: a mark, which Postgres's parser reads
/// as part of a letter's or digit's word (`1\u{fe0f}z` is one word) and
/// as a break after a break (`👍\u{fe0f}`).
pub const EMOJI_SELECTOR: char = '\u{fe0f}';

/// Letters outside ASCII that the server reads in words where the
/// database reads each of them as `engram_english` does here
/// ([`Reading::Letters`], checked by the store over every one of them,
/// [`letter_probes`]): the letters of Latin-1, Latin Extended-A and -B,
/// Greek, Cyrillic and Latin Extended Additional, but `ŉ`, which
/// `unaccent` reads as `'n`. A word with one of them is, to Postgres, a
/// word of letters (`café`, `Zürich`, `новый`), folded by `unaccent`
/// before it is stemmed ([`lexeme`]); one with a digit or a hyphen as well
/// is left to Postgres, as is any other letter and any combining mark.
const LETTERS: &[RangeInclusive<char>] = &[
    '\u{c0}'..='\u{24f}',
    '\u{370}'..='\u{4ff}',
    '\u{1e00}'..='\u{1eff}',
];

fn is_letter(c: char) -> bool {
    c != 'ŉ' && c.is_alphabetic() && LETTERS.iter().any(|r| r.contains(&c))
}

/// Whether the server reads `c` as an Arabic letter ([`Reading::Arabic`]):
/// one of [`spelling::ARABIC_LETTERS`],
/// assigned, and not the tatweel (a point, left out).
fn is_read_arabic_letter(c: char) -> bool {
    spelling::is_arabic_letter(c) && c.is_alphabetic() && !spelling::is_point(c)
}

/// Arabic's comma, semicolon and question mark, Urdu's full stop, the
/// zero-width non-joiner Persian writes inside words (`می‌خواهم`), and the
/// marks of writing direction: breaks to the parser where the database
/// reads them so, checked with the Arabic letters ([`Reading::Arabic`],
/// [`arabic_probes`]).
pub const ARABIC_PUNCTUATION: &[RangeInclusive<char>] = &[
    '\u{060c}'..='\u{060c}',
    '\u{061b}'..='\u{061b}',
    '\u{061f}'..='\u{061f}',
    '\u{06d4}'..='\u{06d4}',
    '\u{200c}'..='\u{200c}',
    '\u{200e}'..='\u{200f}',
];

/// The store's check of [`Reading::Arabic`]: a word of each Arabic letter
/// ([`spelling::ARABIC_LETTERS`]) between
/// two `q`s with its lexeme as read here, which the database must give
/// as `to_tsvector('engram_english', engram_search_text(word))` (so as its
/// migration 0031 spells them); then, as [`punctuation_probe`], a text
/// with each of [`ARABIC_PUNCTUATION`] and the same with spaces.
pub fn arabic_probes() -> (Vec<String>, Vec<String>, (String, String)) {
    let (words, lexemes) = letter_words(spelling::ARABIC_LETTERS, is_read_arabic_letter);
    (words, lexemes, probe(ARABIC_PUNCTUATION, ""))
}

/// The store's check of [`Reading::Letters`]: a word of each letter
/// between two `q`s, with its lexeme as read here; the database reads
/// the letters so when `to_tsvector('engram_english', word)` holds that
/// one lexeme for every word.
pub fn letter_probes() -> (Vec<String>, Vec<String>) {
    letter_words(LETTERS, is_letter)
}

/// A word of each letter of `ranges` that `read` reads, between two `q`s,
/// and its lexeme as read here.
fn letter_words(
    ranges: &[RangeInclusive<char>],
    read: fn(char) -> bool,
) -> (Vec<String>, Vec<String>) {
    ranges
        .iter()
        .flat_map(|range| range.clone())
        .filter(|&c| read(c))
        .map(|c| {
            let word = format!("q{c}q");
            let lexeme = lexeme(&word);
            (word, lexeme)
        })
        .unzip()
}

/// The store's check of [`Reading::Punctuation`]: a text that holds each
/// mark of [`PUNCTUATION`] after a letter and after a digit (`a’1’`), and
/// the same text with spaces for the marks. Equal vectors mean that the
/// parser reads each mark as a break.
pub fn punctuation_probe() -> (String, String) {
    probe(PUNCTUATION, "")
}

/// The store's check of [`Reading::Symbols`], as [`punctuation_probe`]
/// for [`SYMBOLS`], and [`EMOJI_SELECTOR`] after an emoji and after
/// punctuation.
pub fn symbol_probe() -> (String, String) {
    probe(SYMBOLS, &format!("👍{EMOJI_SELECTOR}a!{EMOJI_SELECTOR}1"))
}

fn probe(marks: &[RangeInclusive<char>], extra: &str) -> (String, String) {
    let marks: Vec<char> = marks.iter().flat_map(|range| range.clone()).collect();
    let mut written: String = marks.iter().map(|m| format!("a{m}1{m}")).collect();
    let mut spaced = "a 1 ".repeat(marks.len());
    written.push_str(extra);
    spaced.extend(
        extra
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { ' ' }),
    );
    (written, spaced)
}

/// How far a database's parser reads text as [`plain`] does; each level
/// reads what the one before does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reading {
    /// ASCII text alone; any other character leaves the text to
    /// Postgres.
    Ascii,
    /// ASCII text and [`PUNCTUATION`], each of which the database reads as
    /// a break.
    Punctuation,
    /// And [`SYMBOLS`], likewise.
    Symbols,
    /// And words with the letters of [`LETTERS`].
    Letters,
    /// And words of Arabic letters, spelt as
    /// [`spelling::read`] spells them (as
    /// `engram_search_text` does since migration 0031: vowel points left
    /// out, variants alike, the article off), with [`ARABIC_PUNCTUATION`]
    /// as breaks.
    Arabic,
}

impl Reading {
    /// Whether this reading takes `c` for a break.
    pub(in crate::search) fn breaks_at(self, c: char) -> bool {
        let within = |ranges: &[RangeInclusive<char>]| ranges.iter().any(|r| r.contains(&c));
        (self >= Reading::Punctuation && within(PUNCTUATION))
            || (self >= Reading::Symbols && within(SYMBOLS))
            || (self >= Reading::Arabic && within(ARABIC_PUNCTUATION))
    }
}

/// Each word of a plain text (see the module comment), as [`spaced`]
/// leaves it, in order, as its lexeme or `None` for a stop word; `None`
/// when the text is not plain, as `reading` says what the database reads
/// as the server does. A compound joined by hyphens is, as Postgres reads
/// it, the whole compound as one word (stemmed when it is all letters:
/// `state-of-the-art`; as written, lowercased, when it holds a digit:
/// `4o-mini`), then each part as a word of its own; a decimal, version or
/// signed number is one word, as written (`3.14`, `10.0.0.1`, `-5`).
pub fn plain(text: &str, reading: Reading) -> Option<Vec<Option<String>>> {
    // Text not composed is composed by the database before it reads it
    // (since migration 0032); the server leaves it to the database.
    if !spelling::is_composed(text) {
        return None;
    }
    // Where the parser reads no tag and no entity, `<`, `>` and `&` are
    // breaks like any other mark ([`markup::hidden`], over the text as
    // written).
    let no_markup = !text.contains(['<', '&']) || markup::hidden(text).is_empty();
    // A punctuation mark or symbol reads as a space wherever it stands,
    // the emoji selector after a break.
    let text = if reading > Reading::Ascii && !text.is_ascii() {
        let mut out = String::with_capacity(text.len());
        let mut after_break = true;
        for c in text.chars() {
            let read = if reading.breaks_at(c)
                || (c == EMOJI_SELECTOR && reading >= Reading::Symbols && after_break)
            {
                ' '
            } else {
                c
            };
            after_break = u8::try_from(read).is_ok_and(|b| is_space(b) || is_break_mark(b));
            out.push(read);
        }
        Cow::Owned(out)
    } else {
        Cow::Borrowed(text)
    };
    let text = text.as_ref();
    // Past the marks, a character outside ASCII is a letter this reading
    // reads, or the text is left to Postgres.
    let letters = reading >= Reading::Letters && !text.is_ascii();
    let arabic = reading >= Reading::Arabic;
    // Vowel points are left out of a word as `engram_search_text` leaves
    // them out, before its parser reads the text.
    let read_here = |c: char| {
        c.is_ascii()
            || is_letter(c)
            || (arabic && (is_read_arabic_letter(c) || spelling::is_point(c)))
    };
    if letters && !text.chars().all(read_here) {
        return None;
    }
    let bytes = text.as_bytes();
    let is_break = |at: usize| {
        bytes
            .get(at)
            .is_none_or(|&b| is_space(b) || is_break_mark(b))
    };
    let numbers = if bytes.iter().any(|b| matches!(b, b'.' | b'+' | b'-')) {
        numbers::whole(text)
    } else {
        Vec::new()
    };
    let mut numbers = numbers.iter().peekable();
    let mut words = Vec::new();
    let mut start = None;
    let mut skip_to = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        if at < skip_to {
            continue;
        }
        while numbers.next_if(|n| n.start < at).is_some() {}
        // A number whole, between breaks (a sentence's final dot after
        // it included); beside other marks it is left to Postgres.
        if start.is_none()
            && let Some(number) = numbers.next_if(|n| n.start == at)
        {
            let ends = is_break(number.end)
                || (bytes.get(number.end) == Some(&b'.') && is_break(number.end + 1));
            if (at == 0 || is_break(at - 1)) && ends {
                words.push(Some(text[number.clone()].to_owned()));
                skip_to = number.end;
                continue;
            }
            return None;
        }
        // A decimal or version right before letters is a number of its
        // own, and the letters another word (`3.21s`, `1.2.3rc1`), but
        // before an `e` it may be one in scientific notation (`3.14E5`).
        if start.is_none() && byte.is_ascii_digit() && (at == 0 || is_break(at - 1)) {
            if let Some(end) = numbers::number_before_letters(bytes, at) {
                words.push(Some(text[at..end].to_owned()));
                skip_to = end;
                continue;
            }
            let (end, points) = numbers::dotted(bytes, at);
            if points > 0 && matches!(bytes.get(end), Some(b'e' | b'E')) {
                return None;
            }
        }
        if byte.is_ascii_alphanumeric() || (byte >= 0x80 && letters) {
            start.get_or_insert(at);
            continue;
        }
        let next = bytes.get(at + 1).copied();
        if byte == b'-' && next.is_some_and(|b| b.is_ascii_alphanumeric() || b >= 0x80) {
            if start.is_some() {
                continue; // a compound's hyphen
            }
            return None; // a sign (`-5`), or what follows other marks
        }
        let breaks = is_space(byte)
            || is_break_mark(byte)
            || byte == b'-'
            || (byte == b'.' && next.is_none_or(is_space))
            || (byte == b'+' && !next.is_some_and(|b| b.is_ascii_digit()))
            || (matches!(byte, b'<' | b'>' | b'&') && no_markup);
        if !breaks {
            return None;
        }
        if let Some(from) = start.take() {
            read(&text[from..at], &mut words)?;
        }
    }
    if let Some(from) = start {
        read(&text[from..], &mut words)?;
    }
    Some(words)
}

/// Adds a run of letters and digits, maybe joined by hyphens, as
/// [`plain`] reads it; `None` when it is too long to be read here, or a
/// compound that starts with a number (`10-fold`, `1e5-x`), which Postgres
/// reads as a number and what follows.
fn read(run: &str, words: &mut Vec<Option<String>>) -> Option<()> {
    if run.len() > LONGEST {
        return None;
    }
    if !run.is_ascii() {
        // Letters alone ([`LETTERS`], Arabic's): spelt as
        // `engram_search_text` spells them, then `unaccent`, the stop
        // words and the stemmer, as `engram_english` reads a `word`.
        if run.bytes().any(|b| b == b'-' || b.is_ascii_digit()) {
            return None;
        }
        let spelt = spelling::read(run);
        if spelt.is_empty() {
            return Some(()); // points alone, which Postgres never sees
        }
        let lower = folded_lowercase(&spelt).into_owned();
        words.push((!is_stop_word(&lower)).then(|| lowercase_lexeme(lower)));
        return Some(());
    }
    if !run.contains('-') {
        // Digits, `e` and digits are a number in scientific notation to
        // the parser, and what follows it another word (`1e5x` is `1e5`
        // and `x`; `x1e5` is one word).
        let (number, rest) = run.split_at(numbers::scientific_end(run).unwrap_or(run.len()));
        words.push(word(number));
        if !rest.is_empty() {
            words.push(word(rest));
        }
        return Some(());
    }
    // A compound: whole, then each part. With a digit in it (`4o-mini`,
    // `e2e-tests`) the whole is kept as written, lowercased, where one of
    // letters alone is stemmed.
    let lower = run.to_ascii_lowercase();
    if run.bytes().any(|b| b.is_ascii_digit()) {
        let first = run.split('-').next().unwrap_or_default().as_bytes();
        // A part after a hyphen that starts with a digit is a signed
        // number to the parser; `spaced` text has none.
        let signed = run
            .split('-')
            .skip(1)
            .any(|p| p.starts_with(|c: char| c.is_ascii_digit()));
        let number = numbers::digits_from(first, 0) == first.len();
        if number || numbers::starts_scientific(first) || signed {
            return None;
        }
        words.push(Some(lower));
    } else {
        words.push(Some(ENGLISH.stem(&lower).into_owned()));
    }
    words.extend(run.split('-').map(word));
    Some(())
}

/// A word of ASCII letters or digits as its lexeme, `None` for a stop
/// word.
fn word(word: &str) -> Option<String> {
    let lower = word.to_ascii_lowercase();
    (!is_stop_word(&lower)).then(|| lowercase_lexeme(lower))
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
    fn compounds_are_read_by_their_parts() {
        for (text, read) in [
            ("src/auth/validate.ts", "src auth validate ts"),
            (
                "mail ops-team@example.com now",
                "mail ops-team example com now",
            ),
            ("file1.txt v1.2.3 3.14 1.5e3", "file1 txt v1.2.3 3.14 1.5e3"),
            (
                "a.1 1.a a..b .a a. end. Next",
                "a 1 1 a a..b .a a. end. Next",
            ),
            ("é.b x.é", "é.b x.é"),
            ("a.b.c.d 1.a.2 1.2.a", "a b c d 1 a 2 1.2 a"),
            (
                "covid-19 2026-11-25 x1-y state-of-the-art -5 a--5 a.1-2",
                "covid 19 2026 11 25 x1-y state-of-the-art -5 a--5 a 1 2",
            ),
        ] {
            assert_eq!(spaced(text), read, "{text}");
        }
        assert!(matches!(spaced("plain words."), Cow::Borrowed(_)));
        // A tag's slash stays, so that the parser reads the tag.
        assert_eq!(spaced("</p> <br/> a/b </ x/>"), "</p> <br/> a b </ x/>");
    }

    #[test]
    fn plain_text_only() {
        let words = plain("Deployment of the SETUPS w448", Reading::Ascii).expect("plain");
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
            "validate.ts",
            "10-fold",
            "x-1",
            "x -y",
            "naïve",
            "a@b",
            "<b>",
            "&amp;",
            "a+5",
            "R&D <b>",
            "~user",
            "tab\x0bbed",
            "don’t",
        ] {
            assert!(plain(not_plain, Reading::Ascii).is_none(), "{not_plain}");
        }
        let broken = plain(
            "It's user_42's (setup): done.\r\n\"Deployments\"; ok?",
            Reading::Ascii,
        )
        .expect("plain");
        assert_eq!(
            broken,
            [
                None,
                None,
                Some("user".to_owned()),
                Some("42".to_owned()),
                None,
                Some("setup".to_owned()),
                Some("done".to_owned()),
                Some("deploy".to_owned()),
                Some("ok".to_owned())
            ]
        );
        assert!(plain(&"a".repeat(LONGEST + 1), Reading::Ascii).is_none());
        // Where no tag or entity is read, `<`, `>` and `&` are breaks, and
        // so is a `+` that no digit follows.
        let marks = plain("R&D: c++ -> 2 > 1, a <- b", Reading::Ascii).expect("plain");
        assert_eq!(
            marks.into_iter().flatten().collect::<Vec<_>>(),
            ["r", "d", "c", "2", "1", "b"]
        );
        // As Postgres: the compound whole, then its parts; a lone hyphen
        // is a break.
        let compound = plain(
            "go state-of-the-art - Running-Deployments, end-",
            Reading::Ascii,
        )
        .expect("plain");
        assert_eq!(
            compound,
            [
                Some("go".to_owned()),
                Some("state-of-the-art".to_owned()),
                Some("state".to_owned()),
                None,
                None,
                Some("art".to_owned()),
                Some("running-deploy".to_owned()),
                Some("run".to_owned()),
                Some("deploy".to_owned()),
                Some("end".to_owned()),
            ]
        );
        assert_eq!(plain("", Reading::Ascii).expect("plain"), []);
        // With digits, the whole compound is kept as written.
        let compound = plain("gpt 4o-Mini e2e-tests", Reading::Ascii).expect("plain");
        assert_eq!(
            compound,
            [
                Some("gpt".to_owned()),
                Some("4o-mini".to_owned()),
                Some("4o".to_owned()),
                Some("mini".to_owned()),
                Some("e2e-tests".to_owned()),
                Some("e2e".to_owned()),
                Some("test".to_owned()),
            ]
        );
    }

    /// Decimals, versions and signed numbers between breaks are one word
    /// each, as written; beside other marks the text is left to Postgres.
    #[test]
    fn numbers_between_breaks_are_words() {
        let read = |text: &str| {
            plain(text, Reading::Ascii).map(|words| words.into_iter().flatten().collect::<Vec<_>>())
        };
        assert_eq!(
            read("pi is 3.14. Host 10.0.0.1 (-5, +2.5) -0.25"),
            Some(
                ["pi", "3.14", "host", "10.0.0.1", "-5", "+2.5", "-0.25"]
                    .map(String::from)
                    .to_vec()
            )
        );
        for not_plain in [
            "v1.2", "1..5", "--5", "x0._-10", "1.5e3", "3.5-x", ".5", "3.14E5",
        ] {
            assert_eq!(read(not_plain), None, "{not_plain}");
        }
        // Before letters, the number and the letters are two words.
        assert_eq!(
            read("took 3.21s, v 1.2.3rc1 at 3.14pm"),
            Some(
                ["took", "3.21", "v", "1.2.3", "rc1", "3.14", "pm"]
                    .map(String::from)
                    .to_vec()
            )
        );
    }

    /// With [`Reading::Punctuation`], the common punctuation outside ASCII
    /// is read as spaces; letters outside ASCII still leave the text to
    /// Postgres.
    #[test]
    fn punctuation_outside_ascii_breaks_where_the_database_reads_it_so() {
        let words =
            plain("Don’t — “deploy”… it’s 3.5\u{a0}GB", Reading::Punctuation).expect("plain");
        assert_eq!(
            words,
            [
                None,
                None,
                Some("deploy".to_owned()),
                None,
                None,
                Some("3.5".to_owned()),
                Some("gb".to_owned())
            ]
        );
        assert!(plain("naïve", Reading::Punctuation).is_none());
        assert!(plain("🙂", Reading::Punctuation).is_none());
        // Emoji, where the database reads them as breaks too; the
        // selector after a break is one, after a letter it is not.
        let words = plain("great👍\u{fe0f}job 🎉 x\u{200d}y ✅", Reading::Symbols).expect("plain");
        assert_eq!(
            words.into_iter().flatten().collect::<Vec<_>>(),
            ["great", "job", "x", "y"]
        );
        assert!(plain("a\u{fe0f}b", Reading::Symbols).is_none());
        assert!(plain("café", Reading::Symbols).is_none());
    }

    /// With [`Reading::Letters`], words of letters outside ASCII are read
    /// as `engram_english` reads them; with a digit, a hyphen, a combining
    /// mark or another letter the text is left to Postgres.
    #[test]
    fn letters_outside_ascii_where_the_database_reads_them_so() {
        let words =
            plain("Zürich’s café: naïve thé НОВЫЙ Straße", Reading::Letters).expect("plain");
        assert_eq!(
            words,
            [
                Some("zurich".to_owned()),
                None,
                Some("cafe".to_owned()),
                Some("naiv".to_owned()),
                None,
                Some("новый".to_owned()),
                Some("strass".to_owned()),
            ]
        );
        for not_plain in ["café-bar", "é1", "e\u{301}", "ﬁle", "ŉ", "x -é"] {
            assert!(plain(not_plain, Reading::Letters).is_none(), "{not_plain}");
        }
        let (words, lexemes) = letter_probes();
        assert!(words.len() > 900 && words.len() == lexemes.len());
        assert!(plain("1\u{fe0f}", Reading::Symbols).is_none());
        assert!(
            PUNCTUATION
                .iter()
                .flat_map(|r| r.clone())
                .all(|c| !c.is_alphanumeric())
        );
    }

    /// Text not composed (Unicode's NFC) is left to the database, which
    /// composes it before it reads it (migration 0032); composed, the
    /// same words are read here.
    #[test]
    fn text_not_composed_is_left_to_the_database() {
        for reading in [Reading::Letters, Reading::Arabic] {
            assert!(plain("cafe\u{0301} deploy", reading).is_none());
            assert_eq!(
                plain("caf\u{e9} deploy", reading),
                Some(vec![Some("cafe".to_owned()), Some("deploy".to_owned())])
            );
        }
        assert!(plain("ذهب \u{0648}\u{0654}", Reading::Arabic).is_none());
        assert!(plain("ذهب \u{0624}", Reading::Arabic).is_some());
    }

    /// With [`Reading::Arabic`], words of Arabic letters are read spelt
    /// as `engram_search_text` spells them, and Arabic's punctuation is a
    /// break, and vowel points are left out; Arabic digits and other marks
    /// leave the text to Postgres, as does every Arabic letter below that
    /// reading.
    #[test]
    fn arabic_words_where_the_database_reads_them_so() {
        let words = plain("ذهب أحمد، إلى المدرسة؟ کتاب café", Reading::Arabic).expect("plain");
        assert_eq!(
            words.into_iter().flatten().collect::<Vec<_>>(),
            ["ذهب", "احمد", "الي", "مدرسه", "كتاب", "cafe"]
        );
        let persian = plain("می\u{200c}خواهم \u{200f}کتاب", Reading::Arabic).expect("plain");
        assert_eq!(
            persian.into_iter().flatten().collect::<Vec<_>>(),
            ["مي", "خواهم", "كتاب"]
        );
        // Vowel points and the tatweel are left out, alone too.
        let pointed = plain("ذهبتُ إلى المَدْرَسَةِ ـ \u{064e} القـهوة", Reading::Arabic).expect("plain");
        assert_eq!(
            pointed.into_iter().flatten().collect::<Vec<_>>(),
            ["ذهبت", "الي", "مدرسه", "قهوه"]
        );
        for not_plain in ["كتاب٣", "كتاب-جديد", "ؤ\u{0654}", "שָׁלוֹם"] {
            assert!(plain(not_plain, Reading::Arabic).is_none(), "{not_plain}");
        }
        assert!(plain("المدرسة", Reading::Letters).is_none());
        assert!(plain("a،b", Reading::Letters).is_none());
        assert!(plain("a\u{200c}b", Reading::Letters).is_none());
        let (words, lexemes, _) = arabic_probes();
        assert!(words.len() > 200 && words.len() == lexemes.len());
        assert!(lexemes.contains(&"qاq".to_owned()) && !lexemes.contains(&"qأq".to_owned()));
    }

    #[test]
    fn phrases_and_distinct_lexemes_as_postgres_prints_them() {
        let words = plain("deployment of the setup setups guide", Reading::Ascii).expect("plain");
        assert_eq!(
            phrase(&words),
            "'deploy' <3> 'setup' <-> 'setup' <-> 'guid'"
        );
        assert_eq!(distinct(&words), "deploy setup guid");
        let stops = plain("of the", Reading::Ascii).expect("plain");
        assert_eq!(phrase(&stops), "");
        assert_eq!(distinct(&stops), "");
        assert_eq!(
            phrase(&plain("the setup", Reading::Ascii).expect("plain")),
            "'setup'"
        );
    }
}
