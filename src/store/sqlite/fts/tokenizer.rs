//! `engram_english`, an FTS5 tokenizer (migration 0014): SQLite's
//! `unicode61` splits, lowercases and takes off diacritics, and each word
//! of letters is then stemmed with Snowball's English stemmer, the one
//! Postgres's `english` configuration and this server's snippets use
//! ([`crate::search::english::stem_lowercase`]). FTS5's own `porter`
//! tokenizer runs the original Porter algorithm, which stems `deploy` to
//! `deploi` but `deployment` to `deploy`, so on SQLite a search for a
//! "deployment setup" missed "we deploy with Argo" that Postgres found,
//! and marked words in snippets that its matching had not used. What
//! each table's `reading` argument adds is in [`super::reading`].
//!
//! The owner tokens of migrations 0011 and 0012 (`t…x`, `u…x`, `s…x`, hex
//! between) pass through unchanged: most hold digits, and a word ending
//! in `x` is left as it is by every rule of the English stemmer.

use std::borrow::Cow;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::ptr;

use libsqlite3_sys as ffi;

use super::PARENT;
use super::reading::{GAP, Read, Reading, cjk_pieces, read, reading_of};
use crate::search::{cjk, english, spelling};

/// One instance of the tokenizer: the `unicode61` instance it wraps, and
/// the reading it was made with.
struct Stemming {
    parent: ffi::fts5_tokenizer,
    instance: *mut ffi::Fts5Tokenizer,
    reading: Reading,
}

/// `xCreate`: a `unicode61` instance made with the same arguments (e.g.
/// `remove_diacritics 2`) but `reading`, wrapped.
pub(super) unsafe extern "C" fn create(
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
pub(super) unsafe extern "C" fn delete(tokenizer: *mut ffi::Fts5Tokenizer) {
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
    /// [`STRING`](super::reading::STRING) or [`PART`](super::reading::PART), and whether it is a [`STRING`](super::reading::STRING); the first
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

/// `xTokenize`: `unicode61`'s tokens, each handed to FTS5's callback as
/// its lexeme (with reading 2, those outside markup, folded).
pub(super) unsafe extern "C" fn tokenize(
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
