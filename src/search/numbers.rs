//! Numbers Postgres's parser keeps whole where SQLite's `unicode61`
//! splits them: a decimal (`3.14`), a version (`10.0.0.1`) and a signed
//! number (`-5`, `+2.5`), each one lexeme there (`3.14`, not `3` and
//! `14`), so `14` does not find `3.14`. SQLite's tokenizer (reading 3)
//! hands these on whole ([`whole`]).
//!
//! Only numbers between marks both readers break at are read here:
//! whitespace, the punctuation Postgres always reads as a break, and the
//! `.`, `+` and `-` the rules below take in; and an unsigned decimal or
//! version right before letters ([`before_letters`]: `3.21s` is `3.21` and
//! `s` there, `3` and `21s` to `unicode61`). Beside a letter the parser
//! reads more kinds (`v1.2` as a file name, `1e5x` as `1e5` and `x`),
//! which SQLite still splits as `unicode61` does. A test holds these rules
//! to Postgres's `ts_debug` over generated text of digits, signs, dots,
//! letters and other marks.

use std::borrow::Cow;
use std::ops::Range;

use super::english::Reading;
use super::english::plain::is_break_mark;
use super::{cjk, markup};

/// The marks these rules read themselves; beside them and the
/// punctuation the parser always reads as a break ([`BREAKS`](super::english::plain::BREAKS)), a number
/// stands apart.
const MARKS: &[u8] = b".+-";

/// The byte ranges of `text` (as [`super::english::spaced`] leaves it)
/// that Postgres reads as one number and `unicode61` as several tokens or
/// without its sign, in order:
///
/// - digits, then `.` and digits once (a decimal) or more (a version);
/// - a `+` or `-` right before a number of digits or a decimal (the sign
///   belongs to it; before a version it does not, and the version is read
///   unsigned, as unsigned versions and decimals are).
///
/// A run that starts after a letter or digit (`x1.5`) is not a number of
/// its own, and a number beside anything but whitespace, [`BREAKS`](super::english::plain::BREAKS) and
/// [`MARKS`] is left out.
pub fn whole(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let apart = |at: Option<usize>| {
        at.and_then(|at| bytes.get(at))
            .is_none_or(|&b| b.is_ascii_whitespace() || is_break_mark(b) || MARKS.contains(&b))
    };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        let signed = matches!(b, b'+' | b'-') && bytes.get(at + 1).is_some_and(u8::is_ascii_digit);
        if !b.is_ascii_digit() && !signed {
            at += 1;
            continue;
        }
        // Digits after a letter or digit (or a character of more than one
        // byte) belong to that word.
        if !signed
            && at > 0
            && bytes
                .get(at - 1)
                .is_some_and(|&p| !p.is_ascii() || p.is_ascii_alphanumeric())
        {
            at = word_end(bytes, at);
            continue;
        }
        let first = if signed { at + 1 } else { at };
        let (end, points) = dotted(bytes, first);
        let start = if signed && points >= 2 { first } else { at };
        let kept_whole = points > 0 || start < first;
        if kept_whole
            && apart(start.checked_sub(1))
            && apart(Some(end))
            && !in_file_name(bytes, start)
        {
            out.push(start..end);
            at = end;
        } else if bytes
            .get(end)
            .is_some_and(|&b| !b.is_ascii() || b.is_ascii_alphanumeric())
        {
            // A word that starts with digits (`3é.1.5`, `2x.5`).
            at = word_end(bytes, first);
        } else {
            at = end;
        }
    }
    out
}

/// The byte ranges of `text` (as [`super::english::spaced`] leaves it)
/// that Postgres reads as a number of their own although letters follow
/// them: a decimal or version after whitespace or a
/// [`BREAKS`](super::english::plain::BREAKS) mark (or at the start) and right
/// before an ASCII letter, which starts the next word (`3.21s`,
/// `1.2.3rc1`). Before an `e` it may be a number in scientific notation
/// (`3.14E5`), so none is read there. In order; none overlaps one of
/// [`whole`], which ends apart from letters.
pub fn before_letters(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        if b.is_ascii() && !b.is_ascii_alphanumeric() {
            at += 1;
            continue;
        }
        let after_break = at == 0
            || bytes
                .get(at - 1)
                .is_some_and(|&b| b.is_ascii_whitespace() || is_break_mark(b));
        if after_break
            && let Some(end) = number_before_letters(bytes, at)
            && !in_file_name(bytes, at)
        {
            out.push(at..end);
            at = end;
        } else {
            // Not inside a word either (`s1.5_2.5x` is one file name).
            at = word_end(bytes, at);
        }
    }
    out
}

/// The numbers of `text` (as [`super::english::spaced`] leaves it) that
/// Postgres reads as words of their own, with what its parser ends a
/// word at beside them read as blanks: the markup in `hidden` (of the text
/// as written, [`super::markup::in_text`]; `<td>3.14</td>`), characters of
/// Chinese, Japanese and Korean (`第3.5章`), and the marks
/// [`blanked_marks`] blanks (`a<3.14`, `1@3.14`, `&-5`, `€3.50`), and with
/// [`cjk::Units::Clusters`] clusters of Thai, Lao, Khmer and Burmese
/// (`ราคา3.14บาท`). What SQLite's tokenizer reads from `reading 7` on
/// (clusters from `reading 8`), and snippets.
pub fn in_text(text: &str, hidden: &[Range<usize>], units: cjk::Units) -> Vec<Range<usize>> {
    apart(&blanked_marks(&cjk::blanked(
        &markup::blanked(text, hidden),
        units,
    )))
}

/// `text` with each `<`, `>`, `&` and `@`, and each character of
/// [`PUNCTUATION`](super::english::PUNCTUATION) and
/// [`SYMBOLS`](super::english::SYMBOLS), in spaces, byte for byte. Where
/// such a mark starts no tag and no entity (those are blanked first, by
/// [`super::markup::blanked`]) and no email or host (`spaced` has read
/// an `@` beside a letter as a space), Postgres's parser reads it as a
/// blank, and the number beside it whole (`2<3.5>1`, `5@3.14.5`, `@-5`);
/// so it reads the others in the usual locales (`€3.50`, `“3.14”`,
/// `3.14😀`; in the `C` locale, where it reads them as letters, SQLite
/// and snippets still read them so).
fn blanked_marks(text: &str) -> Cow<'_, str> {
    let blank = |c: char| match c {
        '<' | '>' | '&' | '@' => true,
        c => !c.is_ascii() && Reading::Symbols.breaks_at(c),
    };
    if !text.chars().any(blank) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match blank(c) {
            true => out.extend(std::iter::repeat_n(' ', c.len_utf8())),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`whole`]'s numbers and [`before_letters`]'s together, in order: every
/// number Postgres reads as a word of its own where `unicode61` splits it.
pub fn apart(text: &str) -> Vec<Range<usize>> {
    let mut numbers = whole(text);
    numbers.extend(before_letters(text));
    numbers.sort_unstable_by_key(|n| n.start);
    numbers
}

/// Where the word of letters and digits at `at` ends, as the parser
/// reads it: with points inside it (`s1.5.3`, `x10.0.1` are one word
/// there, a file name; [`super::english::spaced`] has made the point
/// between an ASCII letter and a digit a space) or a run of marks holding
/// `._` (`rc1._x`), and once it is such a file name, with any run of `.`,
/// `_` and `-` before more of it (`s1.5_1.5rc1`, `x1.5--5`).
fn word_end(bytes: &[u8], mut at: usize) -> usize {
    const MARKS: &[u8] = b"._-";
    let in_word = |at: usize| {
        bytes
            .get(at)
            .is_some_and(|&b| !b.is_ascii() || b.is_ascii_alphanumeric())
    };
    let mut file = false;
    while let Some(&b) = bytes.get(at) {
        if in_word(at) {
            at += 1;
            continue;
        }
        if !MARKS.contains(&b) {
            break;
        }
        let mut end = at;
        while bytes.get(end).is_some_and(|b| MARKS.contains(b)) {
            end += 1;
        }
        let run = bytes.get(at..end).unwrap_or_default();
        let joins = file || run == b"." || run.windows(2).any(|pair| pair == b"._");
        if !joins || !in_word(end) {
            break;
        }
        file = true;
        at = end;
    }
    at
}

/// Where the decimal or version starting at `at` ends when an ASCII letter
/// other than `e` follows it: a number of its own to the parser, which
/// reads the letters as the next word (see [`before_letters`]).
pub fn number_before_letters(bytes: &[u8], at: usize) -> Option<usize> {
    if !bytes.get(at).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let (end, points) = dotted(bytes, at);
    let letter = *bytes.get(end)?;
    (points > 0 && letter.is_ascii_alphabetic() && !matches!(letter, b'e' | b'E')).then_some(end)
}

/// Where a number in scientific notation (`1e5`) at the start of a run of
/// letters and digits ends, when more of the run follows it: the parser
/// reads digits, `e` and digits as a number and the rest as another word
/// (`1e5x` is `1e5` and `x`), where the run alone would be one word.
pub fn scientific_end(run: &str) -> Option<usize> {
    let bytes = run.as_bytes();
    let mantissa = digits_from(bytes, 0);
    if !starts_scientific(bytes) {
        return None;
    }
    let end = digits_from(bytes, mantissa + 1);
    (end < bytes.len()).then_some(end)
}

/// Whether `bytes` start with a number in scientific notation: digits,
/// `e` or `E`, and a digit.
pub fn starts_scientific(bytes: &[u8]) -> bool {
    let mantissa = digits_from(bytes, 0);
    mantissa > 0
        && matches!(bytes.get(mantissa), Some(b'e' | b'E'))
        && bytes.get(mantissa + 1).is_some_and(u8::is_ascii_digit)
}

/// Where digits from `at` on, then `.` and digits any number of times,
/// end, and how many such points they hold (one: a decimal; more: a
/// version).
pub fn dotted(bytes: &[u8], at: usize) -> (usize, usize) {
    let mut end = digits_from(bytes, at);
    let mut points = 0;
    while bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end = digits_from(bytes, end + 1);
        points += 1;
    }
    (end, points)
}

/// The end of the digits of `bytes` from `at` on.
pub fn digits_from(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at
}

/// Whether a number starting at `start` ends a file name the parser
/// reads: a word, then marks holding `._` (`x0._-10`, `ab._-1.5` are one
/// token there).
fn in_file_name(bytes: &[u8], start: usize) -> bool {
    let mut from = start;
    while from > 0 && bytes.get(from - 1).is_some_and(|b| b"._+-".contains(b)) {
        from -= 1;
    }
    let marks = bytes.get(from..start).unwrap_or_default();
    from > 0
        && marks.windows(2).any(|pair| pair == b"._")
        && bytes
            .get(from - 1)
            .is_some_and(|&b| !b.is_ascii() || b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Vec<&str> {
        whole(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn decimals_versions_and_signed_numbers_are_whole() {
        let cases: [(&str, &[&str]); 13] = [
            ("pi is 3.14 today", &["3.14"]),
            ("host 10.0.0.1 up", &["10.0.0.1"]),
            ("at -5 or +2.5", &["-5", "+2.5"]),
            // A version takes no sign.
            ("-1.5.3", &["1.5.3"]),
            ("3.14. Then 1..5 and .5", &["3.14"]),
            ("--5 +-5", &["-5", "-5"]),
            // After a digit, a sign is read by other rules.
            ("1+5", &[]),
            // Plain numbers read alike in both.
            ("42 and 2026", &[]),
            // Beside a letter, the parser reads other kinds.
            ("3.14pm v1.2 x-5 a+5 1.5e5", &[]),
            ("(3.14), [2.0]; \"1.5\"", &["3.14", "2.0", "1.5"]),
            ("é1.5 1.5é", &[]),
            // A file name to the parser.
            ("x0._-10 ab._-1.5 x0.-10", &["-10"]),
            ("", &[]),
        ];
        for (text, want) in cases {
            assert_eq!(read(text), want, "{text}");
        }
    }

    #[test]
    fn decimals_and_versions_before_letters_are_numbers_of_their_own() {
        let read = |text: &'static str| -> Vec<&'static str> {
            before_letters(text).into_iter().map(|r| &text[r]).collect()
        };
        let cases: [(&str, &[&str]); 8] = [
            ("took 3.21s", &["3.21"]),
            ("1.2.3rc1 (2.5Gi) \"0.5x\"", &["1.2.3", "2.5", "0.5"]),
            // Apart from letters: [`whole`]'s.
            ("3.14 and 10.0.0.1.", &[]),
            // Not before an `e`, nor after a letter, a digit or a sign.
            ("3.14E5 3.14e5x v1.2x x3.5s -3.5s 1.5-x", &[]),
            // Not a number of digits alone, nor one without its digits.
            ("42nd .5s", &[]),
            ("x._3.5s", &[]),
            ("é1.5x 1.5é", &[]),
            ("", &[]),
        ];
        for (text, want) in cases {
            assert_eq!(read(text), want, "{text}");
        }
    }
}
