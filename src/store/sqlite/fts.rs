//! `engram_hits(fts)`, an FTS5 auxiliary function: for the current match,
//! the size of the text column (its tokens) and how often each phrase of
//! the query occurs in that column. It is what BM25 needs of a match and
//! what FTS5's own `bm25()` reads too, but that function takes its
//! statistics (the number of rows, the average length, how many rows hold
//! each phrase) from the whole table, every tenant's rows together, so one
//! tenant's scores moved with what another tenant wrote. With these counts
//! the search ranks in Rust with statistics of the caller's own items
//! ([`super::search`]), as the Postgres store does.
//!
//! `engram_english`, an FTS5 tokenizer (migration 0014): SQLite's
//! `unicode61` splits, lowercases and takes off diacritics, and each word
//! of letters is then stemmed with Snowball's English stemmer, the one
//! Postgres's `english` configuration and this server's snippets use
//! ([`crate::search::english::stem_lowercase`]). FTS5's own `porter`
//! tokenizer runs the original Porter algorithm, which stems `deploy` to
//! `deploi` but `deployment` to `deploy`, so on SQLite a search for a
//! "deployment setup" missed "we deploy with Argo" that Postgres found,
//! and marked words in snippets that its matching had not used. Tables
//! made with the argument `reading 2` (migration 0015) read text as
//! Postgres does where the two had still differed: the tokens that fall
//! in what Postgres's parser reads as markup are left out
//! ([`crate::search::markup`]: tags, entities, script and style bodies),
//! and each token's letters are folded as Postgres's `unaccent` folds
//! them ([`english::folded`]: `ß` as `ss`, `ł` as `l`). Tables made with
//! `reading 3` (migration 0016) also read each string of an item alone, as
//! Postgres's `jsonb_to_tsvector` does: the triggers join an item's
//! strings with [`STRING`] (a JSON value's strings, which Postgres keeps a
//! position apart) and [`PART`] (a key and its value, say, which it does
//! not), markup is read string by string, and after a [`STRING`] that
//! held a word the next word is a position further on ([`GAP`]). They
//! fold a word's letters as written (`unaccent` sees them before the
//! stemmer lowercases them) with `unaccent`'s table alone (`unicode61`
//! made with `remove_diacritics 0`, whose own folding reads `ǣ` as `æ`
//! where `unaccent` keeps it), and keep combining marks in their word
//! (`categories 'L* N* Co M*'`) but not before it, as Postgres's parser
//! does; and a decimal, a version or a signed number that `unicode61`
//! splits is handed on whole, as the parser keeps it
//! ([`numbers::whole`]). A table keeps the reading it was made with,
//! since FTS5 removes a row's tokens by reading its text again. Tables
//! made with `reading 4` (migration 0017) also read an unsigned decimal or
//! version right before letters as a word of its own and the letters as
//! the next ([`numbers::before_letters`]: `3.21s` is `3.21` and `s`, where
//! `unicode61` reads `3` and `21s`), as the parser does. (With it,
//! [`numbers::whole`] came to read a file name's numbers as the parser
//! does, `s1.5_2.5` one word; tables of `reading 3` now read so too, but
//! a server of this release writes to none: it migrates a database at
//! 0016 before it writes, and 0017 drops those tables whole, so no row is
//! removed with other tokens than it was added with.) Tables made with
//! `reading 5` (migration 0018) hand each character of Chinese, Japanese
//! or Korean on as a token of its own; with `reading 6` (0019) a token
//! holding one is cut into its pieces before numbers are read, each piece
//! read as a token, and numbers are looked for with those characters
//! blanked out, so that one beside them is whole (`3.5` in `第3.5章`);
//! with `reading 7` (0020) markup and the marks `<`, `>`, `&` and `@`
//! are blanked out too (`3.14` in `<td>3.14</td>` and in `a<3.14`); with
//! `reading 8` (0021) each cluster of Thai, Lao, Khmer or Burmese is a
//! token of its own and blanked out likewise, as the characters of
//! `reading 5` and `6` are (`กาแฟ` in `ผมไม่ชอบกาแฟ`, `3.14` in `ราคา3.14บาท`);
//! `reading 8` leaves Arabic's and Hebrew's vowel points out of lexemes,
//! and `reading 9` (0022) spells each token as Postgres spells text since
//! its 0031, before folding it: letter variants alike (`أحمد` as `احمد`)
//! and the article left off (`المدرسة` as `مدرسه`; [`spelling::read`]);
//! `reading 10` (0023) reads the text composed first (Unicode's NFC),
//! with the Arabic script's digits as ASCII ones
//! ([`spelling::normalized`]), as Postgres does since its 0032.
//!
//! The one module with `unsafe` code: FTS5 takes auxiliary functions and
//! tokenizers only through the C API's `fts5_api` pointer, which sqlx does
//! not wrap and no maintained crate exposes for a connection sqlx owns.
//! The code keeps to what the API documents: it asks the connection for
//! the pointer with `SELECT fts5(?1)` and a bound pointer, registers one
//! function and one tokenizer; the function reads the match through
//! `Fts5ExtensionApi` and returns a blob SQLite copies, and the tokenizer
//! wraps an instance of `unicode61` (found with `xFindTokenizer`, as
//! FTS5's `porter` wraps its parent) and hands each of its tokens on,
//! stemmed. Nothing in it can panic across the C boundary (no indexing,
//! no unwrapping, the stemmer called under `catch_unwind`; a failed call
//! answers an SQLite error code).
//!
//! The owner tokens of migrations 0011 and 0012 (`t…x`, `u…x`, `s…x`, hex
//! between) pass through unchanged: most hold digits, and a word ending
//! in `x` is left as it is by every rule of the English stemmer.

use std::borrow::Cow;
use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::ops::Range;
use std::ptr;

use libsqlite3_sys as ffi;
use sqlx::SqliteConnection;

use crate::search::{cjk, english, markup, numbers, spelling};

/// The function's SQL name, as FTS5 takes it (NUL-terminated).
const NAME: &CStr = c"engram_hits";

/// The tokenizer's name, as FTS5 takes it.
const TOKENIZER: &CStr = c"engram_english";

/// The tokenizer it wraps.
const PARENT: &CStr = c"unicode61";

/// The function's SQL name, for statements.
pub(super) const HITS: &str = match NAME.to_str() {
    Ok(name) => name,
    Err(_) => panic!("the name is ASCII"),
};

/// Registers [`HITS`] on a connection (each connection of a pool, when it
/// opens).
pub(super) async fn register(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the connection's open handle, and the lock held on it
    // keeps sqlx's worker from using it meanwhile.
    let rc = unsafe { register_on(db) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Configuration(
            format!("registering the FTS5 function {HITS} and tokenizer engram_english failed (SQLite code {rc})").into(),
        ))
    }
}

/// # Safety
/// `db` is an open connection no other thread uses during the call.
unsafe fn register_on(db: *mut ffi::sqlite3) -> c_int {
    // SAFETY: as the caller promises.
    let api = match unsafe { fts5_api(db) } {
        Ok(api) => api,
        Err(rc) => return rc,
    };
    // SAFETY: `api` is the connection's FTS5 API, valid while it is open.
    let Some(create) = (unsafe { (*api).xCreateFunction }) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: the name is NUL-terminated and copied by FTS5; the function
    // has the documented signature and needs no user data.
    let rc = unsafe { create(api, NAME.as_ptr(), ptr::null_mut(), Some(hits), None) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: `api` as above.
    let Some(create_tokenizer) = (unsafe { (*api).xCreateTokenizer }) else {
        return ffi::SQLITE_ERROR;
    };
    let mut methods = ffi::fts5_tokenizer {
        xCreate: Some(tokenizer_create),
        xDelete: Some(tokenizer_delete),
        xTokenize: Some(tokenize),
    };
    // SAFETY: FTS5 copies the name and the methods; the user data is the
    // connection's own `fts5_api`, which lives as long as the tokenizer
    // can be used, and needs no destructor.
    unsafe {
        create_tokenizer(
            api,
            TOKENIZER.as_ptr(),
            api.cast::<c_void>(),
            &mut methods,
            None,
        )
    }
}

/// One instance of the tokenizer: the `unicode61` instance it wraps, and
/// the reading it was made with.
struct Stemming {
    parent: ffi::fts5_tokenizer,
    instance: *mut ffi::Fts5Tokenizer,
    reading: Reading,
}

/// How a table's text is read, chosen by its `reading` argument (a table
/// keeps the reading it was made with, so that FTS5 removes a row's
/// tokens as it added them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reading {
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
    /// left out of lexemes ([`spelling::without`]): `القَهْوَة` is
    /// `القهوة`.
    ClustersAlone,
    /// Migration 0022 (`reading 9`): as `reading 8`, and Arabic words
    /// read as Postgres reads them since its migration 0031
    /// ([`spelling::read`]): letter variants as the letters they stand
    /// for (`أحمد` is `احمد`, `کتاب` is `كتاب`), the article left off
    /// (`المدرسة` is `مدرسه`).
    ArabicWords,
    /// Migration 0023 (`reading 10`): as `reading 9`, the text read
    /// composed (Unicode's NFC) and with the Arabic script's digits as
    /// ASCII ones ([`spelling::normalized`]), as Postgres reads it since
    /// its migration 0032: a Korean syllable written as its jamo is the
    /// syllable, `か` and a combining voiced mark is `が`, `٣٤` is `34`.
    /// Reading 9 read the jamo as letters of a word of their own, left
    /// the mark out and kept the digits as written.
    Normalized,
}

impl Reading {
    /// Whether markup is left out and letters folded.
    fn as_postgres(self) -> bool {
        self != Reading::Stemmed
    }

    /// What this reading reads a piece at a time.
    fn units(self) -> cjk::Units {
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
const GAP: &[u8] = &[STRING];

/// The tokenizer's own argument, taken out of those handed to `unicode61`.
const READING: &[u8] = b"reading";

/// The arguments without `reading N`, and the reading they ask for; `None`
/// for a reading this server does not know.
///
/// # Safety
/// `args` holds `count` NUL-terminated strings (or `count` is 0).
unsafe fn reading_of(
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

/// `xCreate`: a `unicode61` instance made with the same arguments (e.g.
/// `remove_diacritics 2`) but `reading`, wrapped.
unsafe extern "C" fn tokenizer_create(
    api: *mut c_void,
    args: *mut *const std::ffi::c_char,
    count: c_int,
    out: *mut *mut ffi::Fts5Tokenizer,
) -> c_int {
    let api = api.cast::<ffi::fts5_api>();
    // SAFETY: the user data registered with the tokenizer is the
    // connection's `fts5_api`.
    let Some(find) = (unsafe { (*api).xFindTokenizer }) else {
        return ffi::SQLITE_ERROR;
    };
    let mut user: *mut c_void = ptr::null_mut();
    let mut parent = ffi::fts5_tokenizer {
        xCreate: None,
        xDelete: None,
        xTokenize: None,
    };
    // SAFETY: a NUL-terminated name; FTS5 writes the module's user data and
    // copies its methods into the two places given.
    let rc = unsafe { find(api, PARENT.as_ptr(), &mut user, &mut parent) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let (Some(create), Some(_), Some(_)) = (parent.xCreate, parent.xDelete, parent.xTokenize)
    else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: the arguments FTS5 gave this call.
    let Some((mut rest, reading)) = (unsafe { reading_of(args, count) }) else {
        return ffi::SQLITE_ERROR;
    };
    let Ok(rest_count) = c_int::try_from(rest.len()) else {
        return ffi::SQLITE_ERROR;
    };
    let mut instance: *mut ffi::Fts5Tokenizer = ptr::null_mut();
    // SAFETY: the arguments FTS5 gave this call but `reading`, which live
    // as long as the call.
    let rc = unsafe { create(user, rest.as_mut_ptr(), rest_count, &mut instance) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let wrapped = Box::new(Stemming {
        parent,
        instance,
        reading,
    });
    // SAFETY: FTS5 keeps the pointer until it calls `tokenizer_delete`.
    unsafe { *out = Box::into_raw(wrapped).cast::<ffi::Fts5Tokenizer>() };
    ffi::SQLITE_OK
}

/// `xDelete`: the wrapped instance, then this one.
unsafe extern "C" fn tokenizer_delete(tokenizer: *mut ffi::Fts5Tokenizer) {
    if tokenizer.is_null() {
        return;
    }
    // SAFETY: `tokenizer` is what `tokenizer_create` boxed, deleted once.
    let wrapped = unsafe { Box::from_raw(tokenizer.cast::<Stemming>()) };
    if let Some(delete) = wrapped.parent.xDelete {
        // SAFETY: the parent's instance, made by its own `xCreate`.
        unsafe { delete(wrapped.instance) };
    }
}

/// The callback FTS5 gave a tokenize call, with its context.
type Emit =
    unsafe extern "C" fn(*mut c_void, c_int, *const std::ffi::c_char, c_int, c_int, c_int) -> c_int;

struct Caller {
    context: *mut c_void,
    emit: Emit,
    reading: Reading,
    /// Whether a query is read (no [`GAP`] is stored for it).
    query: bool,
    /// The text read (reading 3), for a token's letters as written.
    text: *const u8,
    length: usize,
    /// The text's markup (reading 2 and 3).
    hidden: Ranges,
    /// The numbers Postgres keeps whole (reading 3), and the last one
    /// handed on.
    numbers: Ranges,
    number_given: Cell<Option<usize>>,
    /// Where the text's strings end (reading 3): the offset of each
    /// [`STRING`] or [`PART`], and whether it is a [`STRING`]; the first
    /// not yet passed.
    ends: Vec<(usize, bool)>,
    next_end: Cell<usize>,
    /// Whether a word was handed on since the last end passed, and whether
    /// a [`GAP`] is owed before the next one.
    worded: Cell<bool>,
    owed: Cell<bool>,
}

/// Sorted ranges of a text, and the first a token may still fall in
/// (tokens come in order, so each call starts where the last stopped).
#[derive(Default)]
struct Ranges {
    list: Vec<Range<usize>>,
    next: Cell<usize>,
}

impl Ranges {
    /// The range holding the token starting at `start`, and its index.
    fn holding(&self, start: c_int) -> Option<(usize, &Range<usize>)> {
        let start = usize::try_from(start).ok()?;
        let mut next = self.next.get();
        while self.list.get(next).is_some_and(|r| r.end <= start) {
            next += 1;
        }
        self.next.set(next);
        let range = self.list.get(next).filter(|r| r.contains(&start))?;
        Some((next, range))
    }
}

impl Caller {
    /// Whether the token starting at `start` lies in the markup.
    fn hides(&self, start: c_int) -> bool {
        self.hidden.holding(start).is_some()
    }

    /// The text of a token as written, before `unicode61` lowercased it
    /// (reading 3): `unaccent` reads a word as written.
    fn written(&self, start: c_int, end: c_int) -> Option<&str> {
        self.slice(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    /// Part of the text read.
    fn slice(&self, range: Range<usize>) -> Option<&str> {
        if self.text.is_null() || range.start > range.end || range.end > self.length {
            return None;
        }
        // SAFETY: `text` is the text of the tokenize call, `length` bytes,
        // alive while this caller is.
        let bytes = unsafe { std::slice::from_raw_parts(self.text, self.length) };
        std::str::from_utf8(bytes.get(range)?).ok()
    }

    /// The number Postgres keeps whole that the token starting at `start`
    /// is part of, and whether it is the number's first token (the one
    /// that hands the number on; the others are dropped).
    fn number_at(&self, start: c_int) -> Option<(Range<usize>, bool)> {
        let (at, number) = self.numbers.holding(start)?;
        let first = self.number_given.replace(Some(at)) != Some(at);
        Some((number.clone(), first))
    }

    /// Passes the ends of strings before `start`, and answers whether a
    /// [`GAP`] goes before the word there: as Postgres does, after a
    /// string that held a word (stop words do not count), and never
    /// between two parts.
    fn gap_before(&self, start: c_int) -> bool {
        let Ok(start) = usize::try_from(start) else {
            return false;
        };
        let mut next = self.next_end.get();
        while let Some(&(_, string)) = self.ends.get(next).filter(|(end, _)| *end < start) {
            self.owed
                .set(string && (self.owed.get() || self.worded.get()));
            self.worded.set(false);
            next += 1;
        }
        self.next_end.set(next);
        !self.query && self.owed.replace(false)
    }
}

/// The text FTS5 hands a tokenize call.
///
/// # Safety
/// `text` points at `length` bytes, alive for the call.
unsafe fn text_of<'a>(text: *const std::ffi::c_char, length: c_int) -> &'a [u8] {
    match usize::try_from(length) {
        // SAFETY: as the caller promises.
        Ok(n) if n > 0 && !text.is_null() => unsafe {
            std::slice::from_raw_parts(text.cast::<u8>(), n)
        },
        _ => &[],
    }
}

/// How Postgres's parser reads `text` where `unicode61` reads it
/// otherwise: its markup, and from reading 3 on the numbers it keeps whole
/// ([`numbers::whole`]; from reading 4 on also those before letters,
/// [`numbers::before_letters`]), each string read alone (split at
/// [`STRING`] and [`PART`]), with the offset and kind of each split.
#[derive(Default)]
struct Read {
    hidden: Vec<Range<usize>>,
    numbers: Vec<Range<usize>>,
    ends: Vec<(usize, bool)>,
}

fn read(text: &[u8], reading: Reading) -> Read {
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

/// `xTokenize`: `unicode61`'s tokens, each handed to FTS5's callback as
/// its lexeme (with reading 2, those outside markup, folded).
unsafe extern "C" fn tokenize(
    tokenizer: *mut ffi::Fts5Tokenizer,
    context: *mut c_void,
    flags: c_int,
    text: *const std::ffi::c_char,
    length: c_int,
    emit: Option<Emit>,
) -> c_int {
    let Some(emit) = emit else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: `tokenizer` is what `tokenizer_create` boxed, alive for the call.
    let wrapped = unsafe { &*tokenizer.cast::<Stemming>() };
    let Some(parent) = wrapped.parent.xTokenize else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: the text FTS5 gave this call.
    let source = unsafe { text_of(text, length) };
    // Reading 10 reads the text composed, with ASCII digits: the parent
    // tokenizes that copy, and the offsets handed to FTS5 are within it
    // (FTS5 stores positions, not offsets; only `highlight()` and
    // `snippet()` would read offsets, and the search uses neither).
    let composed = if wrapped.reading >= Reading::Normalized {
        std::str::from_utf8(source)
            .ok()
            .and_then(|text| match spelling::normalized(text) {
                Cow::Owned(normalized) => Some(normalized),
                Cow::Borrowed(_) => None,
            })
    } else {
        None
    };
    let (source, text, length) = match &composed {
        Some(composed) => {
            let Ok(length) = c_int::try_from(composed.len()) else {
                return ffi::SQLITE_ERROR;
            };
            (composed.as_bytes(), composed.as_ptr().cast(), length)
        }
        None => (source, text, length),
    };
    let Read {
        hidden,
        numbers,
        ends,
    } = if wrapped.reading.as_postgres() {
        read(source, wrapped.reading)
    } else {
        Read::default()
    };
    let mut caller = Caller {
        context,
        emit,
        reading: wrapped.reading,
        query: flags & ffi::FTS5_TOKENIZE_QUERY != 0,
        text: source.as_ptr(),
        length: source.len(),
        hidden: Ranges {
            list: hidden,
            ..Ranges::default()
        },
        numbers: Ranges {
            list: numbers,
            ..Ranges::default()
        },
        number_given: Cell::new(None),
        ends,
        next_end: Cell::new(0),
        worded: Cell::new(false),
        owed: Cell::new(false),
    };
    // SAFETY: the parent tokenizes the text FTS5 gave, calling `stemmed`
    // with `caller`, which outlives the call.
    unsafe {
        parent(
            wrapped.instance,
            (&mut caller as *mut Caller).cast::<c_void>(),
            flags,
            text,
            length,
            Some(stemmed),
        )
    }
}

/// Hands on a [`GAP`] before the word at `start` when one is owed.
fn gap(caller: &Caller, start: c_int) -> c_int {
    if !caller.gap_before(start) {
        return ffi::SQLITE_OK;
    }
    let Ok(n) = c_int::try_from(GAP.len()) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: FTS5 copies the token before the callback returns.
    unsafe { (caller.emit)(caller.context, 0, GAP.as_ptr().cast(), n, start, start) }
}

/// The parent's callback: a token, handed on as its lexeme.
unsafe extern "C" fn stemmed(
    caller: *mut c_void,
    flags: c_int,
    token: *const std::ffi::c_char,
    length: c_int,
    start: c_int,
    end: c_int,
) -> c_int {
    // SAFETY: `caller` is the `Caller` of `tokenize`, alive for its call.
    let caller = unsafe { &*caller.cast::<Caller>() };
    if caller.hides(start) {
        return ffi::SQLITE_OK;
    }
    // Reading 6: a token holding a character of Chinese, Japanese or
    // Korean is cut into its pieces first, and each piece read as a token
    // of its own, so that a number beside such a character is read whole.
    if caller.reading >= Reading::NumbersBesideCharacters {
        // SAFETY: the parent's token, `length` bytes, alive for this call.
        let bytes = unsafe { text_of(token, length) };
        if let Ok(word) = std::str::from_utf8(bytes)
            && cjk::holds_units(word, caller.reading.units())
        {
            return beside_characters(caller, flags, word, start, end);
        }
    }
    // SAFETY: as this function's.
    unsafe { word_of(caller, flags, token, length, start, end) }
}

/// Reading 6: the pieces of a token that holds a character of Chinese,
/// Japanese or Korean ([`cjk_pieces`]), each read by [`word_of`] as a
/// token of its own at its own offsets: each character alone, and a
/// number among the rest whole ([`read`] blanked the characters out
/// before it looked for numbers).
fn beside_characters(caller: &Caller, flags: c_int, word: &str, start: c_int, end: c_int) -> c_int {
    each_piece(
        caller,
        word,
        start,
        end,
        |piece, _, piece_start, piece_end| {
            // Lowercased, as the parent hands its tokens.
            let lower = piece.to_lowercase();
            let Ok(n) = c_int::try_from(lower.len()) else {
                return ffi::SQLITE_ERROR;
            };
            // SAFETY: `caller` is alive for this call, and `lower` (the
            // token, `n` bytes) until the call returns.
            unsafe {
                word_of(
                    caller,
                    flags,
                    lower.as_ptr().cast(),
                    n,
                    piece_start,
                    piece_end,
                )
            }
        },
    )
}

/// Hands each piece of a token holding a character of Chinese, Japanese
/// or Korean ([`cjk_pieces`]) to `each`, until one fails: the piece, cut
/// from the text as written (untrimmed, so that each piece's offsets are
/// its own) when the text is at hand, else from the parent's token;
/// whether it was the text; and the piece's offsets (the token's when it
/// was not).
fn each_piece(
    caller: &Caller,
    word: &str,
    start: c_int,
    end: c_int,
    mut each: impl FnMut(&str, bool, c_int, c_int) -> c_int,
) -> c_int {
    let (text, offsets) = match caller.written(start, end) {
        Some(written) => (written, true),
        None => (word, false),
    };
    for piece in cjk_pieces(text, caller.reading.units()) {
        let from = usize::try_from(start).unwrap_or(0) + piece.start;
        let (piece_start, piece_end) =
            match (c_int::try_from(from), c_int::try_from(from + piece.len())) {
                (Ok(s), Ok(e)) if offsets => (s, e),
                _ => (start, end),
            };
        let rc = each(
            text.get(piece).unwrap_or_default(),
            offsets,
            piece_start,
            piece_end,
        );
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    ffi::SQLITE_OK
}

/// A token (or, reading 6, a piece of one) handed on as its lexemes.
///
/// # Safety
/// `token` points at `length` bytes, alive for the call.
unsafe fn word_of(
    caller: &Caller,
    flags: c_int,
    token: *const std::ffi::c_char,
    length: c_int,
    start: c_int,
    end: c_int,
) -> c_int {
    // Reading 3: a number Postgres keeps whole (`3.14`, `-5`) is handed on
    // whole, at its first token; the others are dropped. Reading 4: but the
    // letters a number runs into (`unicode61`'s `21s` of `3.21s`) are the
    // next word, read below (a number of reading 3 ends apart from any
    // token, so none runs past it there).
    let (mut token, mut length, mut start) = (token, length, start);
    if let Some((number, first)) = caller.number_at(start) {
        if !first {
            let cut = usize::try_from(start)
                .ok()
                .and_then(|from| number.end.checked_sub(from))
                .and_then(|cut| Some((cut, c_int::try_from(cut).ok()?)));
            match cut {
                Some((cut, n)) if n > 0 && n < length && !token.is_null() => {
                    // SAFETY: `cut` is within the parent's token, `length`
                    // bytes: its first bytes are the number's digits and
                    // points, one byte each as in the text.
                    token = unsafe { token.add(cut) };
                    length -= n;
                    start += n;
                }
                _ => return ffi::SQLITE_OK,
            }
        } else {
            let rc = gap(caller, start);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            caller.worded.set(true);
            let (Some(text), Ok(n), Ok(from), Ok(to)) = (
                caller.slice(number.clone()),
                c_int::try_from(number.len()),
                c_int::try_from(number.start),
                c_int::try_from(number.end),
            ) else {
                return ffi::SQLITE_ERROR;
            };
            // SAFETY: FTS5 copies the token before the callback returns.
            return unsafe {
                (caller.emit)(caller.context, flags, text.as_ptr().cast(), n, from, to)
            };
        }
    }
    let bytes: &[u8] = match usize::try_from(length) {
        // SAFETY: the parent's token, `length` bytes, alive for this call.
        Ok(n) if n > 0 && !token.is_null() => unsafe {
            std::slice::from_raw_parts(token.cast::<u8>(), n)
        },
        // SAFETY: handed on as the parent gave it.
        _ => return unsafe { (caller.emit)(caller.context, flags, token, length, start, end) },
    };
    let Ok(word) = std::str::from_utf8(bytes) else {
        // SAFETY: handed on as the parent gave it.
        return unsafe { (caller.emit)(caller.context, flags, token, length, start, end) };
    };
    // Reading 3: a word is read as written, as `unaccent` reads it (`Ɩ` is
    // `I` there, its lowercase `ɩ` itself; `unicode61` hands it
    // lowercased), and its marks belong to it, but marks before any letter
    // (the `U+FE0F` of an emoji) to no word, as Postgres's parser reads
    // them.
    let mut written = None;
    let mut word = word;
    if caller.reading >= Reading::StringsAlone && !word.is_ascii() {
        let not_a_letter = |c: char| !c.is_alphanumeric();
        word = word.trim_start_matches(not_a_letter);
        if word.is_empty() {
            return ffi::SQLITE_OK;
        }
        written = caller
            .written(start, end)
            .map(|w| w.trim_start_matches(not_a_letter));
    }
    let rc = gap(caller, start);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // Reading 5: each character of Chinese, Japanese or Korean a token
    // of its own, the rest of the token read as any other around them.
    if caller.reading >= Reading::CharactersAlone && cjk::holds_units(word, caller.reading.units())
    {
        // The pieces take their own marks off.
        return each_piece(caller, word, start, end, |piece, offsets, s, e| {
            let written = offsets.then_some(piece);
            hand_on(caller, flags, &piece.to_lowercase(), written, s, e)
        });
    }
    hand_on(caller, flags, word, written, start, end)
}

/// The pieces of a token of `unicode61` that reading 5 hands on: each
/// character of Chinese, Japanese or Korean alone (reading 8: each cluster
/// of Thai, Lao, Khmer or Burmese too, [`cjk::units`]), and each run of
/// other characters between them with the marks that follow none (`゙`
/// after a character read alone) taken off its start, as Postgres's parser
/// drops them; empty runs left out.
fn cjk_pieces(text: &str, units: cjk::Units) -> Vec<Range<usize>> {
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

/// Hands a word on as its lexeme: `word` as the parent gave it (or a piece
/// of it), `written` the same word as the text has it (reading 3).
fn hand_on(
    caller: &Caller,
    flags: c_int,
    word: &str,
    written: Option<&str>,
    start: c_int,
    end: c_int,
) -> c_int {
    if !english::is_stop_word(word) {
        caller.worded.set(true);
    }
    let fold = written.is_some() || caller.reading.as_postgres();
    let reading = caller.reading;
    let lexeme = std::panic::catch_unwind(|| {
        // From reading 9 a word is spelt as Postgres's `engram_search_text`
        // spells the text, before its letters are folded; reading 8 left
        // the points out after.
        let source = Cow::Borrowed(written.unwrap_or(word));
        let spelt = match reading {
            r if r >= Reading::ArabicWords => spelling::then(source, spelling::read),
            _ => source,
        };
        let folded = match fold {
            true => spelling::then(spelt, english::folded_lowercase),
            false => spelt,
        };
        let folded = match reading {
            Reading::ClustersAlone => spelling::then(folded, spelling::without),
            _ => folded,
        };
        // The lexeme, where it is not the word handed.
        match english::stem_lowercase(&folded) {
            Cow::Owned(stem) => Some(stem),
            Cow::Borrowed(same) => (same != word).then(|| same.to_owned()),
        }
    })
    .ok()
    .flatten();
    let lexeme = lexeme.as_deref().unwrap_or(word);
    if lexeme.is_empty() {
        return ffi::SQLITE_OK; // nothing but points (a tatweel alone)
    }
    let Ok(n) = c_int::try_from(lexeme.len()) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: FTS5 copies the token before the callback returns.
    unsafe { (caller.emit)(caller.context, flags, lexeme.as_ptr().cast(), n, start, end) }
}

/// The connection's `fts5_api` pointer, as FTS5 documents getting it.
///
/// # Safety
/// As [`register_on`].
unsafe fn fts5_api(db: *mut ffi::sqlite3) -> Result<*mut ffi::fts5_api, c_int> {
    let mut stmt: *mut ffi::sqlite3_stmt = ptr::null_mut();
    // SAFETY: a NUL-terminated statement text on an open connection.
    let rc = unsafe {
        ffi::sqlite3_prepare_v2(
            db,
            c"SELECT fts5(?1)".as_ptr(),
            -1,
            &mut stmt,
            ptr::null_mut(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    let mut api: *mut ffi::fts5_api = ptr::null_mut();
    // SAFETY: FTS5 writes its API pointer through the bound pointer during
    // the step; `api` outlives the statement, which is finalized here.
    let rc = unsafe {
        ffi::sqlite3_bind_pointer(
            stmt,
            1,
            (&mut api as *mut *mut ffi::fts5_api).cast::<c_void>(),
            c"fts5_api_ptr".as_ptr(),
            None,
        );
        ffi::sqlite3_step(stmt);
        ffi::sqlite3_finalize(stmt)
    };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    if api.is_null() {
        return Err(ffi::SQLITE_ERROR);
    }
    Ok(api)
}

/// The function itself: the blob [`encode`] writes, or an error code.
unsafe extern "C" fn hits(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    _count: c_int,
    _values: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: FTS5 calls this with its API and the current match.
    match unsafe { counts(api, fts) } {
        Ok((size, counts)) => {
            let blob = encode(size, &counts);
            let Ok(length) = c_int::try_from(blob.len()) else {
                // SAFETY: `ctx` is this call's context.
                unsafe { ffi::sqlite3_result_error_code(ctx, ffi::SQLITE_TOOBIG) };
                return;
            };
            // SAFETY: SQLite copies the blob (`SQLITE_TRANSIENT`) before
            // this returns and `blob` is dropped.
            unsafe {
                ffi::sqlite3_result_blob(
                    ctx,
                    blob.as_ptr().cast::<c_void>(),
                    length,
                    ffi::SQLITE_TRANSIENT(),
                )
            };
        }
        // SAFETY: as above.
        Err(rc) => unsafe { ffi::sqlite3_result_error_code(ctx, rc) },
    }
}

/// The text column's size and each phrase's occurrences in it.
///
/// # Safety
/// `api` and `fts` are what FTS5 passed to an auxiliary function.
unsafe fn counts(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
) -> Result<(u32, Vec<u32>), c_int> {
    // SAFETY: FTS5's API outlives the call.
    let api = unsafe { &*api };
    let (Some(phrase_count), Some(inst_count), Some(inst), Some(column_size)) =
        (api.xPhraseCount, api.xInstCount, api.xInst, api.xColumnSize)
    else {
        return Err(ffi::SQLITE_ERROR);
    };
    let check = |rc: c_int| {
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(rc)
        }
    };
    // SAFETY (all four calls): the documented functions on the current
    // match, writing only through the pointers given.
    let phrases = usize::try_from(unsafe { phrase_count(fts) }).unwrap_or(0);
    let mut size: c_int = 0;
    check(unsafe { column_size(fts, 0, &mut size) })?;
    let mut instances: c_int = 0;
    check(unsafe { inst_count(fts, &mut instances) })?;
    let mut counts = vec![0u32; phrases];
    for at in 0..instances {
        let (mut phrase, mut column, mut offset) = (0, 0, 0);
        check(unsafe { inst(fts, at, &mut phrase, &mut column, &mut offset) })?;
        if column != 0 {
            continue; // the owner's tokens, not the text
        }
        if let Some(count) = usize::try_from(phrase).ok().and_then(|p| counts.get_mut(p)) {
            *count += 1;
        }
    }
    Ok((u32::try_from(size).unwrap_or(0), counts))
}

/// The blob: the text column's size, then each phrase's count, each a
/// little-endian `u32`.
fn encode(size: u32, counts: &[u32]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(4 * (counts.len() + 1));
    blob.extend(size.to_le_bytes());
    for count in counts {
        blob.extend(count.to_le_bytes());
    }
    blob
}

/// Reads [`encode`]'s blob: the size and the counts, `None` when it is not
/// whole.
pub(super) fn decode(blob: &[u8]) -> Option<(u32, Vec<u32>)> {
    let mut words = blob.chunks_exact(4);
    if !words.remainder().is_empty() {
        return None;
    }
    let mut next = || {
        words
            .next()
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    let size = next()?;
    let mut counts = Vec::new();
    while let Some(count) = next() {
        counts.push(count);
    }
    Some((size, counts))
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Row};

    use super::*;

    /// The arguments of migration 0016's tables.
    const READING_3: &str = "remove_diacritics 0 categories ''L* N* Co M*'' reading 3";

    /// The lexemes the tokenizer stores for `text`, in order.
    async fn lexemes(conn: &mut SqliteConnection, text: &str) -> Vec<String> {
        sqlx::query("DELETE FROM t")
            .execute(&mut *conn)
            .await
            .expect("clear");
        sqlx::query("INSERT INTO t (text) VALUES (?1)")
            .bind(text)
            .execute(&mut *conn)
            .await
            .expect("insert");
        sqlx::query("SELECT term FROM v ORDER BY offset")
            .fetch_all(&mut *conn)
            .await
            .expect("vocabulary")
            .iter()
            .map(|row| row.get::<String, _>(0))
            .collect()
    }

    /// How many rows of `t` the FTS5 query `query` matches.
    async fn matches(conn: &mut SqliteConnection, query: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH ?1")
            .bind(query)
            .fetch_one(&mut *conn)
            .await
            .expect("match")
    }

    /// A connection with the tokenizer, a table `t` read with `arguments`
    /// and its vocabulary `v`.
    async fn table(arguments: &str) -> SqliteConnection {
        let mut conn = SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("connect");
        register(&mut conn).await.expect("register");
        for statement in [
            format!(
                "CREATE VIRTUAL TABLE t USING fts5(text, tokenize = 'engram_english {arguments}')"
            ),
            "CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)".to_owned(),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut conn)
                .await
                .expect("create");
        }
        conn
    }

    #[tokio::test]
    async fn the_tokenizer_stems_as_postgres_and_leaves_the_rest_whole() {
        let mut conn = table("remove_diacritics 2").await;
        let cases: [(&str, &[&str]); 5] = [
            // Porter read `deploy` as `deploi` but `deployment` as `deploy`.
            ("We deploy Deployments", &["we", "deploy", "deploy"]),
            ("https and http", &["https", "and", "http"]),
            (
                "the Café's naïve résumé",
                &["the", "cafe", "s", "naiv", "resum"],
            ),
            (
                "user_42 v1.2 covid-19",
                &["user", "42", "v1", "2", "covid", "19"],
            ),
            // Owner tokens (hex between a letter and `x`) pass whole.
            (
                "tEAAAAAx u64656661756C7400616C696365x",
                &["teaaaaax", "u64656661756c7400616c696365x"],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text}");
        }
        // A query is read by the same tokenizer.
        let found: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"deployed\"'")
            .fetch_one(&mut conn)
            .await
            .expect("match");
        assert_eq!(found, 0, "the last row holds no form of deploy");
        lexemes(&mut conn, "we deploy").await;
        let found: i64 =
            sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"deployment\"'")
                .fetch_one(&mut conn)
                .await
                .expect("match");
        assert_eq!(found, 1);
    }

    #[tokio::test]
    async fn reading_2_leaves_markup_out_and_folds_letters() {
        let mut conn = table("remove_diacritics 2 reading 2").await;
        let cases: [(&str, &[&str]); 4] = [
            (
                "<p class=\"x\">Deploy &amp; roll</p><br/>",
                &["deploy", "roll"],
            ),
            (
                "<style>p {}</style>after <script>x()</script>end",
                &["after", "end"],
            ),
            (
                "Straße Søren ﬁle café",
                &["strass", "soren", "file", "cafe"],
            ),
            (
                "tEAAAAAx u64656661756C7400616C696365x",
                &["teaaaaax", "u64656661756c7400616c696365x"],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text}");
        }
        // The query is read alike: `strasse` finds `Straße`.
        lexemes(&mut conn, "Straße").await;
        let found: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"strasse\"'")
            .fetch_one(&mut conn)
            .await
            .expect("match");
        assert_eq!(found, 1);
        // A reading this server does not know is refused.
        let unknown = sqlx::query(
            "CREATE VIRTUAL TABLE u USING fts5(text, tokenize = 'engram_english reading 11')",
        )
        .execute(&mut conn)
        .await;
        assert!(unknown.is_err(), "{unknown:?}");
    }

    #[tokio::test]
    async fn reading_3_reads_each_string_alone() {
        let mut conn = table(READING_3).await;
        let gap = "\u{1e}";
        let cases: [(&str, &[&str]); 7] = [
            // An open `<script>` hides the rest of its own string only, and
            // a string without words leaves no gap.
            ("<script>x()\u{1e}canary", &["canari"]),
            // A tag is not begun in one string and ended in the next.
            (
                "<b\u{1e}kestrel=x> zebra",
                &["b", gap, "kestrel", "x", "zebra"],
            ),
            ("<b\u{1f}kestrel=x> zebra", &["b", "kestrel", "x", "zebra"]),
            // A gap after a string with a word, not after stop words, and
            // one for several strings without words.
            (
                "deploy\u{1e}\u{1e}<br>\u{1e}notes",
                &["deploy", gap, "note"],
            ),
            ("the\u{1e}notes", &["the", "note"]),
            ("deploy\u{1f}notes\u{1e}", &["deploy", "note"]),
            // Combining marks belong to their word, as Postgres reads
            // them; `unaccent` takes the accents off.
            (
                "cafe\u{301}s x\u{363}y \u{2764}\u{fe0f}you",
                &["cafe", "x\u{363}i", "you"],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
        }
        // Numbers Postgres keeps whole are one token, found whole.
        for (text, want) in [
            ("pi is 3.14 today", &["pi", "is", "3.14", "today"][..]),
            (
                "at -5 on 10.0.0.1, 3.14pm",
                &["at", "-5", "on", "10.0.0.1", "3", "14pm"],
            ),
        ] {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
        }
        lexemes(&mut conn, "pi is 3.14 today").await;
        for (query, found) in [("3.14", 1), ("14", 0), ("3", 0)] {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH ?1")
                .bind(format!("\"{query}\""))
                .fetch_one(&mut conn)
                .await
                .expect("match");
            assert_eq!(n, found, "{query}");
        }
        // A phrase runs between parts, not between strings.
        for (text, found) in [("deploy\u{1f}notes", 1), ("deploy\u{1e}notes", 0)] {
            lexemes(&mut conn, text).await;
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"deploy notes\"'")
                    .fetch_one(&mut conn)
                    .await
                    .expect("match");
            assert_eq!(n, found, "{text:?}");
        }
    }

    #[tokio::test]
    async fn reading_4_reads_a_number_before_letters_apart_from_them() {
        let mut conn = table(&READING_3.replace("reading 3", "reading 4")).await;
        let cases: [(&str, &[&str]); 3] = [
            (
                "took 3.21s, then 1.2.3rc1",
                &["took", "3.21", "s", "then", "1.2.3", "rc1"],
            ),
            // Not before an `e` (`3.14E5` may be a number there), nor
            // after a letter; numbers apart from letters as in reading 3.
            (
                "3.14E5 x3.5s (2.5Gi) -5 10.0.0.1",
                &["3", "14e5", "x3", "5s", "2.5", "gi", "-5", "10.0.0.1"],
            ),
            // The letters are a word as any other: folded and stemmed.
            ("4.5Bugs 2.0Units", &["4.5", "bug", "2.0", "unit"]),
        ];
        for (text, want) in cases {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
        }
        lexemes(&mut conn, "the build took 3.21s").await;
        for (query, found) in [("3.21", 1), ("\"3.21s\"", 1), ("21s", 0), ("3", 0)] {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH ?1")
                .bind(if query.starts_with('"') {
                    query.to_owned()
                } else {
                    format!("\"{query}\"")
                })
                .fetch_one(&mut conn)
                .await
                .expect("match");
            assert_eq!(n, found, "{query}");
        }
        // A table of reading 3 reads as it always did.
        let mut old = table(READING_3).await;
        assert_eq!(lexemes(&mut old, "took 3.21s").await, ["took", "3", "21s"]);
    }

    #[tokio::test]
    async fn reading_5_reads_each_cjk_character_alone() {
        let mut conn = table(&READING_3.replace("reading 3", "reading 5")).await;
        let cases: [(&str, &[&str]); 4] = [
            (
                "我喜欢深色模式",
                &["我", "喜", "欢", "深", "色", "模", "式"],
            ),
            // The letters beside them are words as any other: folded and
            // stemmed; punctuation of the blocks is a break, a lone mark
            // is no word.
            (
                "GPT模型をDeployments、Café・ｶﾀ\u{3099}",
                &["gpt", "模", "型", "を", "deploy", "cafe", "ｶ", "ﾀ"],
            ),
            ("한국어 검색", &["한", "국", "어", "검", "색"]),
            // Numbers as before.
            ("第3章 v2 3.5", &["第", "3", "章", "v2", "3.5"]),
        ];
        for (text, want) in cases {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
        }
        lexemes(&mut conn, "我喜欢深色模式").await;
        for (query, found) in [
            ("\"深 色\"", 1),
            ("\"深色\"", 1),
            ("\"色 深\"", 0),
            ("深", 1),
        ] {
            assert_eq!(matches(&mut conn, query).await, found, "{query}");
        }
        // A table of reading 4 reads as it always did.
        let mut old = table(&READING_3.replace("reading 3", "reading 4")).await;
        assert_eq!(lexemes(&mut old, "深色 模式").await, ["深色", "模式"]);
    }

    #[tokio::test]
    async fn reading_8_reads_each_cluster_alone() {
        let mut conn = table(&READING_3.replace("reading 3", "reading 8")).await;
        let cases: [(&str, &[&str]); 4] = [
            (
                "ผมไม่ชอบกาแฟ",
                &["ผ", "ม", "ไ", "ม่", "ช", "อ", "บ", "ก", "า", "แ", "ฟ"],
            ),
            // Words beside them as any other, a number whole.
            (
                "Deployments ด้วย ราคา3.14บาท",
                &[
                    "deploy", "ด้", "ว", "ย", "ร", "า", "ค", "า", "3.14", "บ", "า", "ท",
                ],
            ),
            ("ខ្ញុំ မြန်", &["ខ្", "ញុំ", "မြ", "န်"]),
            // Chinese as before.
            ("深色", &["深", "色"]),
        ];
        for (text, want) in cases {
            assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
        }
        // Every letter and digit of the four scripts with each mark of its
        // script is one cluster, as `cjk::units` cuts it.
        let scripts = [
            '\u{0e00}'..='\u{0e7f}',
            '\u{0e80}'..='\u{0eff}',
            '\u{1000}'..='\u{109f}',
            '\u{1780}'..='\u{17ff}',
        ];
        let mut differ = Vec::new();
        for script in scripts {
            let starts = script.clone().filter(|&c| cjk::is_cluster_start(c));
            for c in starts {
                let marks = script.clone().filter(|&m| cjk::is_cluster_mark(m));
                let text: String = std::iter::once(format!("x{c}9 "))
                    .chain(marks.map(|m| format!("{c}{m}{m} ")))
                    .collect();
                let want: Vec<String> = cjk::units(&text, cjk::Units::Clusters)
                    .into_iter()
                    .map(|r| text[r].to_owned())
                    .collect();
                let mut got = lexemes(&mut conn, &text).await;
                got.retain(|l| l != "x" && l != "9");
                if got != want {
                    differ.push(format!("{text:?}: {got:?}"));
                }
            }
        }
        assert!(differ.is_empty(), "{} differ: {differ:#?}", differ.len());
        lexemes(&mut conn, "ผมไม่ชอบกาแฟ").await;
        for (query, found) in [
            ("\"ก า แ ฟ\"", 1),
            ("\"กาแฟ\"", 1),
            ("\"แ ฟ ก า\"", 0),
            ("ม่", 1),
            ("ม", 1),
        ] {
            assert_eq!(matches(&mut conn, query).await, found, "{query}");
        }
        // Arabic's and Hebrew's vowel points are left out of lexemes, a
        // tatweel alone is no word.
        assert_eq!(
            lexemes(&mut conn, "القَهْوَة القـهوة ـ שָׁלוֹם").await,
            ["القهوة", "القهوة", "שלום"]
        );
        // A table of reading 7 reads as it always did.
        let mut old = table(&READING_3.replace("reading 3", "reading 7")).await;
        assert_eq!(lexemes(&mut old, "ผมไม่ชอบ กาแฟ").await, ["ผมไม่ชอบ", "กาแฟ"]);
        assert_eq!(lexemes(&mut old, "שָׁלוֹם").await, ["שָׁלוֹם"]);
    }

    #[tokio::test]
    async fn reading_9_reads_arabic_words_as_postgres_does() {
        let mut conn = table(&READING_3.replace("reading 3", "reading 9")).await;
        // Each lexeme as `spelling::read` reads it, points left out first,
        // then letters folded.
        let text = "أحمد إلى المدرسة على کتاب خانۀ ٱلْحَمْدُ \u{0627}\u{0654}حمد ؤ \
                    وبالمدرسة الالتزام e\u{0301}الكتاب";
        let want = [
            "احمد",
            "الي",
            "مدرسه",
            "علي",
            "كتاب",
            "خانه",
            "حمد",
            "احمد",
            "ؤ",
            "وبالمدرسه",
            "تزام",
            "eكتاب",
        ];
        let read = spelling::read(text);
        let read: Vec<&str> = read.split_whitespace().collect();
        assert_eq!(read.len(), want.len(), "{read:?}");
        assert_eq!(lexemes(&mut conn, text).await, want);
        for (query, found) in [
            ("احمد", 1),
            ("أحمد", 1),
            ("\"الى المدرسه\"", 1),
            ("كتاب", 1),
            ("مدرسة", 1),
            ("بالمدرسة", 1),
            ("التزام", 1),
        ] {
            assert_eq!(matches(&mut conn, query).await, found, "{query}");
        }
        // Thai as reading 8 reads it.
        assert_eq!(lexemes(&mut conn, "กาแฟ").await, ["ก", "า", "แ", "ฟ"]);
        // A table of reading 8 reads as it always did.
        let mut old = table(&READING_3.replace("reading 3", "reading 8")).await;
        assert_eq!(lexemes(&mut old, "أحمد کتاب").await, ["أحمد", "کتاب"]);
    }

    /// Reading 10 reads text composed: a Korean syllable written as its
    /// jamo, a kana and its combining voiced mark, a letter and its
    /// accent, a waw and its hamza are the characters they make, in text
    /// and in queries; and the Arabic script's digits as ASCII ones, a
    /// decimal whole. Reading 9 read them as written.
    #[tokio::test]
    async fn reading_10_reads_text_composed_with_ascii_digits() {
        use unicode_normalization::UnicodeNormalization;

        let mut conn = table(&READING_3.replace("reading 3", "reading 10")).await;
        let composed = "한국 がっこう café \u{0624} ٣٤ ۱.۵";
        let decomposed: String = composed.nfd().collect();
        assert_ne!(decomposed, composed);
        let want = [
            "한", "국", "が", "っ", "こ", "う", "cafe", "\u{0624}", "34", "1.5",
        ];
        assert_eq!(lexemes(&mut conn, composed).await, want);
        assert_eq!(lexemes(&mut conn, &decomposed).await, want);
        for query in [
            "한국",
            "\"がっこう\"",
            "café",
            "\u{0624}",
            "34",
            "٣٤",
            "\"1.5\"",
            "\"۱.۵\"",
        ] {
            assert_eq!(matches(&mut conn, query).await, 1, "{query}");
            let query: String = query.nfd().collect();
            assert_eq!(matches(&mut conn, &query).await, 1, "{query}");
        }
        let mut old = table(&READING_3.replace("reading 3", "reading 9")).await;
        assert_ne!(lexemes(&mut old, &decomposed).await, want);
    }

    /// Reading 3 folds each letter of the blocks the API tests hold to
    /// Postgres (`letters_fold_as_unaccent_folds_them`) as
    /// [`english::lexeme`] does, upper and lower case alike.
    #[tokio::test]
    async fn reading_3_folds_letters_as_lexeme_does() {
        let mut conn = table(READING_3).await;
        let blocks = [
            '\u{c0}'..='\u{4ff}',
            '\u{1d00}'..='\u{1dbf}',
            '\u{1e00}'..='\u{1eff}',
            '\u{2c60}'..='\u{2c7f}',
            '\u{a720}'..='\u{a7ff}',
            '\u{fb00}'..='\u{fb06}',
            '\u{ff21}'..='\u{ff5a}',
        ];
        let mut differ = Vec::new();
        for c in blocks.into_iter().flatten().filter(|c| c.is_alphabetic()) {
            let word = format!("q{c}q");
            let got = lexemes(&mut conn, &word).await.join(" ");
            if got != english::lexeme(&word) {
                differ.push(format!("{word}: {got} against {}", english::lexeme(&word)));
            }
        }
        assert!(differ.is_empty(), "{} differ: {differ:#?}", differ.len());
    }

    #[test]
    fn blobs_read_back_and_cut_ones_do_not() {
        let blob = encode(12, &[0, 3, 1]);
        assert_eq!(decode(&blob), Some((12, vec![0, 3, 1])));
        assert_eq!(decode(&encode(5, &[])), Some((5, vec![])));
        assert_eq!(decode(&blob[..7]), None);
        assert_eq!(decode(&[]), None);
    }
}
