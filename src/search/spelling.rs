//! Spellings of one word read alike: Arabic's and Hebrew's vowel points,
//! and the Arabic script's letters written more than one way.
//!
//! Both scripts are usually written without their short vowels, and
//! sometimes with them: the Quran, poetry, children's books, a word a
//! writer wants read one way (`القَهْوَة` for `القهوة`, "coffee"; `שָׁלוֹם`
//! for `שלום`). Postgres's parser keeps each such mark in its word and
//! `unaccent` leaves it there, so the two spellings were two words and
//! neither found the other. Since Postgres's migration 0030 and SQLite's
//! 0021 (`reading 8`), the indexes and queries leave the marks of
//! [`POINTS`] out, as Lucene's Arabic normalisation leaves the harakat
//! and the tatweel out.
//!
//! Some letters are written one way by one writer and another by the
//! next: an alef with or without its hamza or madda (`أحمد`, `احمد`), a
//! final teh marbuta written as a heh (`مدرسة`, `مدرسه`), an alef maksura
//! as a yeh (`على`, `علي`), and the Persian and Urdu keyboards' yeh, kaf
//! and heh for the Arabic ones (`کتاب`, `كتاب`). Since Postgres's 0031 and
//! SQLite's 0022 (`reading 9`) each of [`VARIANTS`] is read as the letter
//! it stands for, as Lucene's Arabic and Persian normalisers read them
//! (the Urdu yeh barree `ے` aside: Urdu tells it from `ی`, `ہے` from
//! `ہی`), and a madda or hamza written as a mark after a bare alef or heh
//! (a decomposed `أ` or `ۀ`) is left out with it.
//!
//! Arabic writes its article, and the conjunction or preposition before
//! it, as part of the next word: "the school" is `المدرسة`, "and the
//! school" `والمدرسة`, "in the school" `بالمدرسة`. A search for `مدرسة`
//! found none of them. [`unprefixed`] leaves those prefixes off a word
//! (`ال`, `وال`, `بال`, `كال`, `فال`, `لل`) where at least two letters
//! follow, as the prefix step of Lucene's Arabic light stemmer does; a
//! lone `و` ("and") stays, since many words start with it as a letter of
//! their root (`وزير`, `وصول`). No suffix is taken off.
//!
//! [`read`] is how every reader reads a word now: `engram_search_text`
//! (through `engram_arabic_text`) before Postgres's parser reads the
//! text, the server's own reader of Arabic words
//! ([`english::Reading::Arabic`](super::english::Reading::Arabic)), the
//! SQLite tokenizer for each token's lexeme, snippets' lexemes. A query's
//! words are [`plain`] and left to the store, which leaves the prefixes
//! off (Postgres: [`unprefixed`] before its parser reads them; SQLite: the
//! tokenizer). Reading twice reads as once, so the order does not matter.
//! [`without`] is `reading 8`'s, for tables not yet made again.
//!
//! The marks that make letters (`U+0653`–`U+0655`, madda and hamza above
//! and below) are otherwise kept: removing them would make another letter
//! (a decomposed `ؤ` is `و` and its hamza).
//!
//! Before all of that, text is read [`composed`]: in the form Unicode
//! calls NFC, where a letter and the marks it combines with are the one
//! character they make. The same text reaches Engram in either form: a
//! Korean syllable as one character (`한`) or as the three jamo it is
//! made of (`ᄒ`, `ᅡ`, `ᆫ`), as macOS writes file names and some keyboards and
//! converters write text; `が` as one kana or as `か` and a combining
//! voiced mark. Postgres's parser read the decomposed Korean as a word of
//! jamo and dropped the Japanese mark (`か`), so neither found the
//! composed text a query holds. Since Postgres's migration 0032 and
//! SQLite's 0023 (`reading 10`), every reader composes text first (as
//! Lucene's and Elasticsearch's ICU normaliser does), queries are
//! composed as they are parsed, and snippets are made of the composed
//! text. The server builds no vector of a text that is not composed: it
//! leaves that text to the database, which composes it. The Arabic
//! script's [`DIGITS`] are read as ASCII digits then ([`normalized`]), as
//! Lucene's decimal digit filter reads them (`٣٤` finds `34`); snippets
//! show them as written and mark them by their value.

use std::borrow::Cow;
use std::ops::RangeInclusive;

use unicode_normalization::UnicodeNormalization;

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

/// The Arabic script's letters read as another, each with the one it is
/// read as: alef with madda, hamza above or below, and alef wasla as
/// alef; teh marbuta, heh with yeh above, heh goal (with and without its
/// hamza) and teh marbuta goal as heh; alef maksura and the Persian yeh
/// as yeh; keheh (the Persian and Urdu kaf) as kaf.
pub const VARIANTS: &[(char, char)] = &[
    ('\u{0622}', ALEF),
    ('\u{0623}', ALEF),
    ('\u{0625}', ALEF),
    ('\u{0629}', HEH),
    ('\u{0649}', YEH),
    ('\u{0671}', ALEF),
    ('\u{06a9}', '\u{0643}'),
    ('\u{06c0}', HEH),
    ('\u{06c1}', HEH),
    ('\u{06c2}', HEH),
    ('\u{06c3}', HEH),
    ('\u{06cc}', YEH),
];

const ALEF: char = '\u{0627}';
const HEH: char = '\u{0647}';
const YEH: char = '\u{064a}';

/// The letters a madda or hamza mark after is left out with it: the
/// bare alef and heh every variant of theirs is read as.
pub const BEARERS: &[char] = &[ALEF, HEH];

/// Madda above, hamza above and hamza below, as combining marks.
pub const SEATED: RangeInclusive<char> = '\u{0653}'..='\u{0655}';

/// The letters of the Arabic script: those a prefix is followed by, and
/// not preceded by, to be left off.
pub const ARABIC_LETTERS: &[RangeInclusive<char>] = &[
    '\u{0620}'..='\u{064a}',
    '\u{066e}'..='\u{066f}',
    '\u{0671}'..='\u{06d3}',
    '\u{06d5}'..='\u{06d5}',
    '\u{06ee}'..='\u{06ef}',
    '\u{06fa}'..='\u{06fc}',
    '\u{06ff}'..='\u{06ff}',
    '\u{0750}'..='\u{077f}',
    '\u{08a0}'..='\u{08c8}',
];

/// What [`unprefixed`] leaves off a word: the article, alone and after
/// "and" (`و`), "with" (`ب`), "like" (`ك`) and "so" (`ف`), and "for the"
/// (`لل`). No two start with the same letter, so which one a word starts
/// with is never in doubt.
pub const PREFIXES: &[&str] = &["وال", "بال", "كال", "فال", "ال", "لل"];

/// How many letters must follow a prefix for it to be left off.
const LEFT: usize = 2;

/// Every text whose characters are all below this one is [`composed`]
/// already: each of them is its own composition (Unicode's NFC quick
/// check says yes) and combines with no mark (its combining class is 0),
/// the first combining marks standing at `U+0300`. In UTF-8 such a text
/// has no byte at or above `0xCC`, the lead byte of `U+0300`.
/// `engram_search_text` reads text without a character from it on with
/// its ASCII expressions alone (no composing, no script's expression can
/// change it), and every character that [`may_decompose`] stands from it
/// on.
pub const COMPOSED_BELOW: char = '\u{0300}';

/// Whether `c` can make a text not composed: Unicode's NFC quick check
/// does not pass it alone (a character NFC reads as another, such as the
/// ohm sign; a mark or jamo that may compose with what stands before
/// it), or it is a combining mark (marks out of their canonical order are
/// not composed). A text without such a character is composed, so
/// `engram_composed_text` checks the form of the others only
/// ([`postgres_composing_class`]); all of them stand from
/// [`COMPOSED_BELOW`] on.
pub fn may_decompose(c: char) -> bool {
    use unicode_normalization::char::canonical_combining_class;
    use unicode_normalization::{IsNormalized, is_nfc_quick};

    canonical_combining_class(c) != 0 || is_nfc_quick(std::iter::once(c)) != IsNormalized::Yes
}

/// The class of the characters that [`may_decompose`] in Postgres's
/// regular expressions, as migration 0032 writes it in
/// `engram_composed_text` (a test holds them alike).
pub fn postgres_composing_class() -> String {
    super::postgres_class((COMPOSED_BELOW..=char::MAX).filter(|&c| may_decompose(c)))
}

/// Whether `text` is in Unicode's composed form (NFC) already.
pub fn is_composed(text: &str) -> bool {
    text.bytes().all(|b| b < 0xcc) || unicode_normalization::is_nfc(text)
}

/// `text` in Unicode's composed form (NFC), as every reader reads it
/// first (see the module comment).
pub fn composed(text: &str) -> Cow<'_, str> {
    if is_composed(text) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.nfc().collect())
    }
}

/// The Arabic script's digits: the Arabic-Indic ones (`٠`–`٩`) and the
/// extended ones Persian and Urdu write (`۰`–`۹`). Each is read as the
/// ASCII digit of its value, as Lucene's decimal digit filter reads it, so
/// `٣٤` and `۳۴` find `34` and `34` finds them.
pub const DIGITS: [RangeInclusive<char>; 2] = ['\u{0660}'..='\u{0669}', '\u{06f0}'..='\u{06f9}'];

/// The ASCII digit `c` is read as, when it is one of [`DIGITS`].
pub fn ascii_digit(c: char) -> Option<char> {
    let range = DIGITS.iter().find(|r| r.contains(&c))?;
    char::from_digit(u32::from(c) - u32::from(*range.start()), 10)
}

/// `text` with each of [`DIGITS`] as its ASCII digit.
pub fn ascii_digits(text: &str) -> Cow<'_, str> {
    if text.is_ascii() || !text.chars().any(|c| ascii_digit(c).is_some()) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().map(|c| ascii_digit(c).unwrap_or(c)).collect())
}

/// `text` in the one form every reader reads it in before anything else:
/// [`composed`], with the Arabic script's digits as ASCII ones
/// ([`ascii_digits`]).
pub fn normalized(text: &str) -> Cow<'_, str> {
    then(composed(text), ascii_digits)
}

/// Whether `c` is one of [`ARABIC_LETTERS`].
pub fn is_arabic_letter(c: char) -> bool {
    ('\u{0620}'..='\u{08c8}').contains(&c) && ARABIC_LETTERS.iter().any(|r| r.contains(&c))
}

/// Whether `c` is one of [`POINTS`].
pub fn is_point(c: char) -> bool {
    ('\u{0591}'..='\u{06ed}').contains(&c) && POINTS.iter().any(|r| r.contains(&c))
}

/// `text` without its [`POINTS`] (`reading 8`).
pub fn without(text: &str) -> Cow<'_, str> {
    if text.is_ascii() || !text.chars().any(is_point) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().filter(|&c| !is_point(c)).collect())
}

/// `text` as every reader reads it: without its [`POINTS`], each of
/// [`VARIANTS`] as the letter it stands for, and the [`SEATED`] marks
/// right after an alef or heh (once so read) left out.
pub fn plain(text: &str) -> Cow<'_, str> {
    let touched = |c: char| {
        ('\u{0591}'..='\u{06ed}').contains(&c)
            && (is_point(c) || SEATED.contains(&c) || variant(c).is_some())
    };
    if text.is_ascii() || !text.chars().any(touched) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut last = None;
    for c in text.chars().filter(|&c| !is_point(c)) {
        if SEATED.contains(&c) && last.is_some_and(|l| BEARERS.contains(&l)) {
            continue;
        }
        let read = variant(c).unwrap_or(c);
        out.push(read);
        last = Some(read);
    }
    Cow::Owned(out)
}

/// `text` with each of [`PREFIXES`] left off where it starts a run of
/// [`ARABIC_LETTERS`] (no such letter before it) and two such letters
/// follow it, and again while what is left starts with one so followed:
/// `الالتزام` ("the commitment") is read as `التزام` ("commitment") is,
/// `تزام`. So a text is read alike however often it is read.
pub fn unprefixed(text: &str) -> Cow<'_, str> {
    if text.is_ascii() || !text.contains('\u{0644}') {
        return Cow::Borrowed(text);
    }
    let mut out = String::new();
    let mut kept = 0;
    let mut before: Option<char> = None;
    let mut at = 0;
    while let Some(c) = text[at..].chars().next() {
        // A prefix starts a word, or follows one just left off.
        if (at == kept || before.is_none_or(|b| !is_arabic_letter(b)))
            && let Some(prefix) = PREFIXES.iter().find(|p| text[at..].starts_with(**p))
        {
            let after = at + prefix.len();
            if text[after..]
                .chars()
                .take(LEFT)
                .filter(|&c| is_arabic_letter(c))
                .count()
                == LEFT
            {
                out.push_str(&text[kept..at]);
                kept = after;
                at = after;
                continue;
            }
        }
        before = Some(c);
        at += c.len_utf8();
    }
    if kept == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[kept..]);
    Cow::Owned(out)
}

/// A word (or a text) as every reader reads it: [`plain`], then
/// [`unprefixed`].
pub fn read(text: &str) -> Cow<'_, str> {
    then(plain(text), unprefixed)
}

/// `f` over `text`, borrowing from what `text` borrows from where `f`
/// changes nothing: readings chained without copying what they leave.
pub fn then<'a>(text: Cow<'a, str>, f: for<'b> fn(&'b str) -> Cow<'b, str>) -> Cow<'a, str> {
    match text {
        Cow::Borrowed(text) => f(text),
        Cow::Owned(text) => Cow::Owned(f(&text).into_owned()),
    }
}

/// The letter `c` is read as, when it is one of [`VARIANTS`].
fn variant(c: char) -> Option<char> {
    VARIANTS
        .iter()
        .find_map(|&(from, to)| (from == c).then_some(to))
}

/// The class of [`POINTS`] in Postgres's regular expressions, as
/// migrations 0030 and 0031 write it in `engram_search_text` (a test
/// holds them alike).
pub fn postgres_class() -> String {
    super::postgres_class(POINTS.iter().flat_map(|r| r.clone()))
}

/// The body of migration 0031's `engram_arabic_text(t)`, which
/// `engram_search_text` calls with its text without the points: text
/// without an Arabic letter as it is (none of what follows could change
/// it, and `translate` costs), else `translate` to [`VARIANTS`]' letters,
/// the [`SEATED`] marks after a [`BEARERS`] letter left out, then the
/// [`PREFIXES`] (a test holds the migration to it).
pub fn postgres_arabic_text() -> String {
    let escape = super::postgres_escape;
    let letters = arabic_class();
    let from: String = VARIANTS.iter().map(|&(from, _)| escape(from)).collect();
    let to: String = VARIANTS.iter().map(|&(_, to)| escape(to)).collect();
    let bearers = super::postgres_class(BEARERS.iter().copied());
    let seated = super::postgres_class(SEATED);
    let prefixes: Vec<String> = PREFIXES
        .iter()
        .map(|p| p.chars().map(escape).collect())
        .collect();
    let prefixes = prefixes.join("|");
    let respelled = format!(
        "regexp_replace(translate(t, E'{from}', E'{to}'), '({bearers}){seated}+', '\\1', 'g')"
    );
    format!(
        "CASE WHEN t !~ '{letters}' THEN t ELSE regexp_replace({respelled}, \
         '(?<!{letters})(?:(?:{prefixes})(?={letters}{{{LEFT}}}))+', '', 'g') END"
    )
}

/// The class of [`ARABIC_LETTERS`] in Postgres's regular expressions.
fn arabic_class() -> String {
    super::postgres_class(ARABIC_LETTERS.iter().flat_map(|r| r.clone()))
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
        // A decomposed hamza makes a letter: reading 8 keeps it.
        assert_eq!(without("\u{0627}\u{0654}"), "\u{0627}\u{0654}");
    }

    #[test]
    fn variants_are_read_as_the_letter_they_stand_for() {
        assert_eq!(plain("أحمد إلى آخر"), "احمد الي اخر");
        assert_eq!(plain("مدرسة على"), "مدرسه علي");
        assert_eq!(plain("کتاب یک خانۀ"), "كتاب يك خانه");
        assert_eq!(plain("ٱلْحَمْدُ"), "الحمد");
        assert_eq!(plain("القَهْوَة"), "القهوه");
        // A decomposed `أ` or `ۀ` reads as its composed form does, marks
        // and all; a hamza on another letter stays (`ؤ` decomposed).
        assert_eq!(plain("\u{0627}\u{0654}\u{0653}حمد"), "احمد");
        assert_eq!(plain("خانه\u{0654}"), "خانه");
        assert_eq!(plain("\u{0648}\u{0654}"), "\u{0648}\u{0654}");
        // A point between the alef and its hamza goes first.
        assert_eq!(plain("\u{0627}\u{064e}\u{0654}"), "\u{0627}");
        // The Urdu yeh barree and the do-chashmi heh are letters of their own.
        assert_eq!(plain("ہے بھی"), "هے بھي");
        assert!(matches!(plain("שלום café"), Cow::Borrowed(_)));
        for (from, _) in VARIANTS {
            let once = plain(&from.to_string()).into_owned();
            assert_eq!(plain(&once), once, "{from}");
        }
    }

    #[test]
    fn the_article_is_left_off_where_two_letters_follow() {
        assert_eq!(
            unprefixed("المدرسة والمدرسة بالمدرسة كالبحر فالكتاب للمدرسة"),
            "مدرسة مدرسة مدرسة بحر كتاب مدرسة"
        );
        // Two letters must follow; a word of the script that holds the
        // letters later keeps them.
        assert_eq!(unprefixed("الم الله لله وال"), "الم له لله وال");
        assert_eq!(unprefixed("سالم المال"), "سالم مال");
        // A word that starts with the letters of one reads as it does
        // after the article: `التزام` and `الالتزام` are one word.
        assert_eq!(unprefixed("الالتزام التزام"), "تزام تزام");
        assert_eq!(unprefixed("للالتزام والاله"), "تزام اله");
        // Anything but an Arabic letter before it starts a word.
        assert_eq!(unprefixed("xالكتاب 3الكتاب «الكتاب»"), "xكتاب 3كتاب «كتاب»");
        // A lone `و` stays.
        assert_eq!(unprefixed("وزير وكتاب"), "وزير وكتاب");
        assert!(matches!(unprefixed("شكرا café"), Cow::Borrowed(_)));
        assert_eq!(read("بالمَدْرَسَةِ أحمد"), "مدرسه احمد");
    }

    #[test]
    fn text_below_the_first_combining_mark_is_composed() {
        use unicode_normalization::char::canonical_combining_class;
        use unicode_normalization::{IsNormalized, is_nfc_quick};

        for c in ('\0'..COMPOSED_BELOW).filter(|&c| c != '\0') {
            assert_eq!(is_nfc_quick([c].into_iter()), IsNormalized::Yes, "{c:?}");
            assert_eq!(canonical_combining_class(c), 0, "{c:?}");
            let mut utf8 = [0; 4];
            assert!(c.encode_utf8(&mut utf8).bytes().all(|b| b < 0xcc), "{c:?}");
        }
        assert!(COMPOSED_BELOW.to_string().as_bytes()[0] == 0xcc);
        assert!(('\0'..COMPOSED_BELOW).all(|c| !may_decompose(c)));
        for c in [
            '\u{0301}', '\u{1161}', '\u{11ab}', '\u{3099}', '\u{0654}', '\u{2126}',
        ] {
            assert!(may_decompose(c), "{c:?}");
        }
        for c in ['한', 'が', 'é', '\u{0624}', 'ب', '東'] {
            assert!(!may_decompose(c), "{c:?}");
        }
        assert!(!is_composed("cafe\u{0301}"));
        assert_eq!(composed("cafe\u{0301}"), "caf\u{e9}");
        // Korean jamo, a kana and its voiced mark, a waw and its hamza.
        assert_eq!(composed("\u{1112}\u{1161}\u{11ab}"), "\u{d55c}");
        assert_eq!(composed("\u{304b}\u{3099}"), "\u{304c}");
        assert_eq!(composed("\u{0648}\u{0654}"), "\u{0624}");
        for text in ["plain ascii", "naïve café ß", "한국어 がっこう ؤ"] {
            assert!(matches!(composed(text), Cow::Borrowed(_)), "{text}");
        }
    }

    #[test]
    fn arabic_digits_are_read_as_ascii_ones() {
        assert_eq!(
            ascii_digits("٠١٢٣٤٥٦٧٨٩ ۰۱۲۳۴۵۶۷۸۹"),
            "0123456789 0123456789"
        );
        assert_eq!(ascii_digits("صفحة ٣٤، ۱.۵"), "صفحة 34، 1.5");
        assert!(matches!(ascii_digits("page 34 ٫ صفحة"), Cow::Borrowed(_)));
        assert_eq!(normalized("\u{1112}\u{1161}\u{11ab} ٣"), "\u{d55c} 3");
    }

    #[test]
    fn the_postgres_readings_are_the_migrations() {
        let class = postgres_class();
        assert!(class.starts_with("[\\u0591-\\u05bd\\u05bf"), "{class}");
        let clusters =
            include_str!("../../migrations/postgres/0030_search_clusters_and_points.sql");
        assert_eq!(clusters.matches(&class).count(), 5, "{class}");
        let letters = include_str!("../../migrations/postgres/0031_search_arabic_words.sql");
        let arabic = postgres_arabic_text();
        assert!(
            letters.contains(&format!("AS $$ SELECT {arabic} $$;")),
            "{arabic}"
        );
        let called = format!("engram_arabic_text(regexp_replace(t, '{class}', '', 'g'))");
        assert!(letters.contains(&called), "{called}");
        // The items 0031 reads again, those with an Arabic letter, and the
        // text `engram_arabic_text` leaves as it is, without one.
        let arabic = arabic_class();
        assert_eq!(
            letters.matches(&format!("~ '{arabic}'")).count(),
            5,
            "{arabic}"
        );
        // 0032 composes text holding a character from `COMPOSED_BELOW` on
        // before the rest reads it, and reads the items holding such text
        // again; below it, the expressions of the scripts above are left
        // out.
        let composed = include_str!("../../migrations/postgres/0032_search_composed_text.sql");
        let from = super::super::postgres_escape(COMPOSED_BELOW);
        let below = format!("'[{from}-\\U0010ffff]'");
        assert_eq!(composed.matches(&format!("!~ {below}")).count(), 1);
        assert_eq!(composed.matches(&format!("~ {below}")).count(), 5);
        let composing = format!(
            "t !~ '{}' OR t IS NFC NORMALIZED",
            postgres_composing_class()
        );
        assert!(composed.contains(&composing), "{composing}");
        let called = format!(
            "engram_arabic_text(regexp_replace(engram_normalized_text(t), '{class}', '', 'g'))"
        );
        assert!(composed.contains(&called), "{called}");
        // And reads the Arabic script's digits as ASCII ones, as
        // `ascii_digits` does, in the text and in the items read again.
        let digits = super::super::postgres_class(DIGITS.iter().flat_map(|r| r.clone()));
        let from: String = DIGITS
            .iter()
            .flat_map(|r| r.clone())
            .map(super::super::postgres_escape)
            .collect();
        let to: String = DIGITS
            .iter()
            .flat_map(|r| r.clone())
            .filter_map(ascii_digit)
            .collect();
        let folded = format!(
            "CASE WHEN t ~ '{digits}' THEN translate(engram_composed_text(t), E'{from}', '{to}') \
             ELSE engram_composed_text(t) END"
        );
        assert!(composed.contains(&folded), "{folded}");
        assert_eq!(composed.matches(&format!("~ '{digits}'")).count(), 5);
        assert!(DIGITS.iter().all(|r| *r.start() > COMPOSED_BELOW));
        assert!(POINTS.iter().all(|r| *r.start() > COMPOSED_BELOW));
    }
}
