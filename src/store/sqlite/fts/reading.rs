//! How a search table's text is read: the `reading N` argument each table
//! of the `engram_english` tokenizer is made with ([`Reading`]), and what a
//! reading finds in a text before its tokens are handed on ([`read`],
//! [`cjk_pieces`]).
//!
//! Tables made with `reading 1` (migration 0014) hold `unicode61`'s tokens,
//! stemmed ([`super::tokenizer`]). Tables made with `reading 2` (migration
//! 0015) read text as Postgres does where the two had still differed: the
//! tokens that fall in what Postgres's parser reads as markup are left out
//! ([`crate::search::markup`]: tags, entities, script and style bodies),
//! and each token's letters are folded as Postgres's `unaccent` folds them
//! ([`english::folded`]: `ß` as `ss`, `ł` as `l`). Tables made with
//! `reading 3` (migration 0016) also read each string of an item alone, as
//! Postgres's `jsonb_to_tsvector` does: the triggers join an item's strings
//! with [`STRING`] (a JSON value's strings, which Postgres keeps a position
//! apart) and [`PART`] (a key and its value, say, which it does not),
//! markup is read string by string, and after a [`STRING`] that held a word
//! the next word is a position further on ([`GAP`]). They fold a word's
//! letters as written (`unaccent` sees them before the stemmer lowercases
//! them) with `unaccent`'s table alone (`unicode61` made with
//! `remove_diacritics 0`, whose own folding reads `ǣ` as `æ` where
//! `unaccent` keeps it), and keep combining marks in their word
//! (`categories 'L* N* Co M*'`) but not before it, as Postgres's parser
//! does; and a decimal, a version or a signed number that `unicode61`
//! splits is handed on whole, as the parser keeps it ([`numbers::whole`]).
//! A table keeps the reading it was made with, since FTS5 removes a row's
//! tokens by reading its text again. Tables made with `reading 4`
//! (migration 0017) also read an unsigned decimal or version right before
//! letters as a word of its own and the letters as the next
//! ([`numbers::before_letters`]: `3.21s` is `3.21` and `s`, where
//! `unicode61` reads `3` and `21s`), as the parser does. (With it,
//! [`numbers::whole`] came to read a file name's numbers as the parser
//! does, `s1.5_2.5` one word; tables of `reading 3` now read so too, but a
//! server of this release writes to none: it migrates a database at 0016
//! before it writes, and 0017 drops those tables whole, so no row is
//! removed with other tokens than it was added with.) Tables made with
//! `reading 5` (migration 0018) hand each character of Chinese, Japanese or
//! Korean on as a token of its own; with `reading 6` (0019) a token holding
//! one is cut into its pieces before numbers are read, each piece read as a
//! token, and numbers are looked for with those characters blanked out, so
//! that one beside them is whole (`3.5` in `第3.5章`); with `reading 7`
//! (0020) markup and the marks `<`, `>`, `&` and `@` are blanked out too
//! (`3.14` in `<td>3.14</td>` and in `a<3.14`); with `reading 8` (0021)
//! each cluster of Thai, Lao, Khmer or Burmese is a token of its own and
//! blanked out likewise, as the characters of `reading 5` and `6` are
//! (`กาแฟ` in `ผมไม่ชอบกาแฟ`, `3.14` in `ราคา3.14บาท`); `reading 8` leaves
//! Arabic's and Hebrew's vowel points out of lexemes, and `reading 9`
//! (0022) spells each token as Postgres spells text since its 0031, before
//! folding it: letter variants alike (`أحمد` as `احمد`) and the article
//! left off (`المدرسة` as `مدرسه`; [`crate::search::spelling::read`]);
//! `reading 10` (0023) reads the text composed first (Unicode's NFC), with
//! the Arabic script's digits as ASCII ones
//! ([`crate::search::spelling::normalized`]), as Postgres does since its
//! 0032.

use std::ffi::{CStr, c_int};
use std::ops::Range;

use crate::search::{cjk, english, markup, numbers};

/// How a table's text is read, chosen by its `reading` argument (a table
/// keeps the reading it was made with, so that FTS5 removes a row's
/// tokens as it added them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Reading {
    /// Migration 0014: `unicode61`'s tokens, stemmed.
    Stemmed,
    /// Migration 0015 (`reading 2`): also without what Postgres's parser
    /// reads as markup ([`crate::search::markup`]), and letters folded as
    /// Postgres's `unaccent` folds them ([`english::folded`]).
    AsPostgres,
    /// Migration 0016 (`reading 3`): as `reading 2`, each string read
    /// alone (split at [`STRING`] and [`PART`]), a word's letters folded
    /// as written, and numbers whole.
    StringsAlone,
    /// Migration 0017 (`reading 4`): as `reading 3`, and a decimal or
    /// version right before letters a word apart from them.
    NumbersBeforeLetters,
    /// Migration 0018 (`reading 5`): as `reading 4`, and each character
    /// of Chinese, Japanese or Korean a token of its own
    /// ([`crate::search::cjk`]), as Postgres reads it since its migration
    /// 0029.
    CharactersAlone,
    /// Migration 0019 (`reading 6`): as `reading 5`, and a number beside
    /// such a character read as Postgres reads it there, between the
    /// spaces its migration 0029 puts around the character: `第3.5章` is
    /// `第`, `3.5` and `章` (reading 5 read `第`, `3`, `5` and `章`, so
    /// `3.5` and the quoted `"第3.5章"` did not find it).
    NumbersBesideCharacters,
    /// Migration 0020 (`reading 7`): as `reading 6`, and a number beside
    /// markup, or beside a `<`, `>`, `&` or `@` that starts none, read as
    /// Postgres reads it there, as beside a blank (a tag or an entity
    /// ends a word to its parser; those marks are blanks):
    /// `<td>3.14</td>` and `a<3.14` hold `3.14` ([`numbers::in_text`];
    /// reading 6 read `3` and `14`, so `3.14` did not find them).
    NumbersBesideMarkup,
    /// Migration 0021 (`reading 8`): as `reading 7`, and each cluster of
    /// Thai, Lao, Khmer or Burmese (a letter and the marks after it) a
    /// token of its own, as Postgres reads it since its migration 0030
    /// ([`crate::search::cjk`]): `กาแฟ` in `ผมไม่ชอบกาแฟ` is found. Reading
    /// 7 read the run as one token. And Arabic's and Hebrew's vowel points
    /// left out of lexemes ([`crate::search::spelling::without`]): `القَهْوَة` is
    /// `القهوة`.
    ClustersAlone,
    /// Migration 0022 (`reading 9`): as `reading 8`, and Arabic words
    /// read as Postgres reads them since its migration 0031
    /// ([`crate::search::spelling::read`]): letter variants as the letters they stand
    /// for (`أحمد` is `احمد`, `کتاب` is `كتاب`), the article left off
    /// (`المدرسة` is `مدرسه`).
    ArabicWords,
    /// Migration 0023 (`reading 10`): as `reading 9`, the text read
    /// composed (Unicode's NFC) and with the Arabic script's digits as
    /// ASCII ones ([`crate::search::spelling::normalized`]), as Postgres reads it since
    /// its migration 0032: a Korean syllable written as its jamo is the
    /// syllable, `か` and a combining voiced mark is `が`, `٣٤` is `34`.
    /// Reading 9 read the jamo as letters of a word of their own, left
    /// the mark out and kept the digits as written.
    Normalized,
}

impl Reading {
    /// Whether markup is left out and letters folded.
    pub(super) fn as_postgres(self) -> bool {
        self != Reading::Stemmed
    }

    /// What this reading reads a piece at a time.
    pub(super) fn units(self) -> cjk::Units {
        if self >= Reading::ClustersAlone {
            cjk::Units::Clusters
        } else {
            cjk::Units::Characters
        }
    }
}

/// What the triggers of `reading 3` tables put between two strings of one
/// JSON value (ASCII's record separator): Postgres reads each alone, and
/// puts a position between the last word of one and the first of the next,
/// so that no phrase runs from one into the other.
pub(super) const STRING: u8 = 0x1e;

/// What they put between two parts of an item (a key and its value, an
/// episode's content and its metadata; ASCII's unit separator): each read
/// alone, with no position between.
pub(super) const PART: u8 = 0x1f;

/// The token a `reading 3` table stores for the position after a
/// [`STRING`]. `unicode61` splits text at the byte, so no word of a text or
/// a query is this token.
pub(super) const GAP: &[u8] = &[STRING];

/// The tokenizer's own argument, taken out of those handed to `unicode61`.
const READING: &[u8] = b"reading";

/// The arguments without `reading N`, and the reading they ask for; `None`
/// for a reading this server does not know.
///
/// # Safety
/// `args` holds `count` NUL-terminated strings (or `count` is 0).
pub(super) unsafe fn reading_of(
    args: *mut *const std::ffi::c_char,
    count: c_int,
) -> Option<(Vec<*const std::ffi::c_char>, Reading)> {
    let count = usize::try_from(count).unwrap_or(0);
    let all: &[*const std::ffi::c_char] = if count == 0 || args.is_null() {
        &[]
    } else {
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts(args, count) }
    };
    let mut rest = Vec::with_capacity(all.len());
    let mut reading = Reading::Stemmed;
    let mut i = 0;
    while let Some(&arg) = all.get(i) {
        // SAFETY: each argument is a NUL-terminated string FTS5 holds.
        let name = unsafe { CStr::from_ptr(arg) }.to_bytes();
        if name == READING {
            // SAFETY: as above.
            let value = all
                .get(i + 1)
                .map(|&v| unsafe { CStr::from_ptr(v) }.to_bytes());
            reading = match value {
                Some(b"1") => Reading::Stemmed,
                Some(b"2") => Reading::AsPostgres,
                Some(b"3") => Reading::StringsAlone,
                Some(b"4") => Reading::NumbersBeforeLetters,
                Some(b"5") => Reading::CharactersAlone,
                Some(b"6") => Reading::NumbersBesideCharacters,
                Some(b"7") => Reading::NumbersBesideMarkup,
                Some(b"8") => Reading::ClustersAlone,
                Some(b"9") => Reading::ArabicWords,
                Some(b"10") => Reading::Normalized,
                _ => return None,
            };
            i += 2;
        } else {
            rest.push(arg);
            i += 1;
        }
    }
    Some((rest, reading))
}

/// How Postgres's parser reads `text` where `unicode61` reads it
/// otherwise: its markup, and from reading 3 on the numbers it keeps whole
/// ([`numbers::whole`]; from reading 4 on also those before letters,
/// [`numbers::before_letters`]), each string read alone (split at
/// [`STRING`] and [`PART`]), with the offset and kind of each split.
#[derive(Default)]
pub(super) struct Read {
    pub(super) hidden: Vec<Range<usize>>,
    pub(super) numbers: Vec<Range<usize>>,
    pub(super) ends: Vec<(usize, bool)>,
}

pub(super) fn read(text: &[u8], reading: Reading) -> Read {
    let alone = reading >= Reading::StringsAlone;
    let ends: Vec<(usize, bool)> = if alone {
        (0..)
            .zip(text)
            .filter(|(_, b)| **b == STRING || **b == PART)
            .map(|(at, b)| (at, *b == STRING))
            .collect()
    } else {
        Vec::new()
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return Read {
            ends,
            ..Read::default()
        };
    };
    let (hidden, numbers) = std::panic::catch_unwind(|| {
        let mut hidden = Vec::new();
        let mut numbers = Vec::new();
        let mut from = 0;
        // The splits are ASCII, so each piece is whole UTF-8.
        for to in ends.iter().map(|(at, _)| *at).chain([text.len()]) {
            let piece = text.get(from..to).unwrap_or_default();
            let shifted = |r: Range<usize>| r.start + from..r.end + from;
            let markup = markup::in_text(piece);
            if alone {
                // `spaced` keeps every byte where it was, and so do the
                // blanks put for markup and for CJK characters.
                let spaced = english::spaced(piece);
                let read = if reading >= Reading::NumbersBesideMarkup {
                    numbers::in_text(&spaced, &markup, reading.units())
                } else if reading >= Reading::NumbersBesideCharacters {
                    numbers::apart(&cjk::blanked(&spaced, cjk::Units::Characters))
                } else if reading >= Reading::NumbersBeforeLetters {
                    numbers::apart(&spaced)
                } else {
                    numbers::whole(&spaced)
                };
                numbers.extend(read.into_iter().map(shifted));
            }
            hidden.extend(markup.into_iter().map(shifted));
            from = to + 1;
        }
        (hidden, numbers)
    })
    .unwrap_or_default();
    Read {
        hidden,
        numbers,
        ends,
    }
}

/// The pieces of a token of `unicode61` that reading 5 hands on: each
/// character of Chinese, Japanese or Korean alone (reading 8: each cluster
/// of Thai, Lao, Khmer or Burmese too, [`cjk::units`]), and each run of
/// other characters between them with the marks that follow none (`゙`
/// after a character read alone) taken off its start, as Postgres's parser
/// drops them; empty runs left out.
pub(super) fn cjk_pieces(text: &str, units: cjk::Units) -> Vec<Range<usize>> {
    let mut pieces = Vec::new();
    let mut units = cjk::units(text, units).into_iter().peekable();
    let mut run: Option<usize> = None;
    let close = |run: &mut Option<usize>, to: usize, pieces: &mut Vec<Range<usize>>| {
        if let Some(from) = run.take() {
            let rest = &text[from..to];
            let from = to
                - rest
                    .trim_start_matches(|c: char| !c.is_alphanumeric())
                    .len();
            if from < to {
                pieces.push(from..to);
            }
        }
    };
    let mut skip_to = 0;
    for (at, _) in text.char_indices() {
        if at < skip_to {
            continue;
        }
        if let Some(unit) = units.next_if(|unit| unit.start == at) {
            close(&mut run, at, &mut pieces);
            skip_to = unit.end;
            pieces.push(unit);
        } else if run.is_none() {
            run = Some(at);
        }
    }
    close(&mut run, text.len(), &mut pieces);
    pieces
}
