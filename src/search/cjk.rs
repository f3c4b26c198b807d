//! Chinese, Japanese and Korean text, which is written without spaces
//! between its words: Postgres's parser reads a run of such characters as
//! one word (`我喜欢深色模式`), and so does SQLite's `unicode61`, so a
//! search for `深色` ("dark") found nothing in it but the whole run.
//!
//! Both stores now index each such character as a word of its own, in
//! order (Postgres: `engram_search_text` spaces them apart before the
//! parser reads the text, migration 0029; SQLite: the `engram_english`
//! tokenizer's `reading 5` hands each on as a token, migration 0018, and
//! since `reading 6`, migration 0019, reads a number beside one as
//! between spaces, [`blanked`], as Postgres does: `3.5` in `第3.5章`), and
//! a query looks for the characters of a run two by two, each pair side by
//! side ([`pairs`]): `深色模式` is `深色`, `色模` and `模式`, any of which may
//! match and more of which rank higher. That is what Lucene's
//! `cjk_bigram` filter finds (an item holding a pair of the query's
//! neighbouring characters), without a second index: positions say which
//! characters stand side by side. A quoted phrase needs all its
//! characters side by side, in order; a single character is looked for
//! alone.
//!
//! Written here rather than taken from a segmenter (jieba, MeCab, lindera):
//! a dictionary per language would weigh more than the rest of the
//! server, would have to read text the same way in SQL for Postgres's
//! vectors, and would still miss the new words agents write; pairs need
//! no dictionary and find what a dictionary's words would.

use std::borrow::Cow;
use std::ops::RangeInclusive;

/// The blocks whose letters are read one by one: Hangul Jamo, the
/// ideographic iteration and closing marks (`々`, `〆`, `〇`), Hiragana and
/// Katakana, Hangul's compatibility Jamo, Katakana's phonetic extensions,
/// the CJK Unified Ideographs with extension A, Hangul's extended Jamo
/// and syllables, the compatibility ideographs, halfwidth Katakana, and
/// the ideographs of the supplementary planes (extensions B to H).
/// Postgres's parser reads every letter of them as a word (checked
/// against a live Postgres by the store's tests).
pub const BLOCKS: &[RangeInclusive<char>] = &[
    '\u{1100}'..='\u{11ff}',
    '\u{3005}'..='\u{3007}',
    '\u{3040}'..='\u{30ff}',
    '\u{3130}'..='\u{318f}',
    '\u{31f0}'..='\u{31ff}',
    '\u{3400}'..='\u{4dbf}',
    '\u{4e00}'..='\u{9fff}',
    '\u{a960}'..='\u{a97f}',
    '\u{ac00}'..='\u{d7ff}',
    '\u{f900}'..='\u{faff}',
    '\u{ff66}'..='\u{ff9f}',
    '\u{20000}'..='\u{3134f}',
];

/// Whether `c` is a letter (or number) of [`BLOCKS`]: a word of its own.
/// Marks and punctuation of those blocks (`・`, `゛`) stay what they were:
/// breaks, or part of no word.
pub fn is_cjk(c: char) -> bool {
    // Every such character is outside ASCII and Latin-1.
    u32::from(c) >= 0x1100 && c.is_alphanumeric() && BLOCKS.iter().any(|r| r.contains(&c))
}

/// Whether `text` holds a character read one by one.
pub fn holds(text: &str) -> bool {
    !text.is_ascii() && text.chars().any(is_cjk)
}

/// `text` with a space on each side of every [`is_cjk`] character, so
/// that each is a word of its own to whatever splits it at spaces next.
pub fn apart(text: &str) -> Cow<'_, str> {
    if !holds(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + text.len() / 2);
    for c in text.chars() {
        if is_cjk(c) {
            out.push(' ');
            out.push(c);
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` with every [`is_cjk`] character blanked out (as many spaces as
/// its bytes, so every other byte stays where it was): what numbers are
/// read beside. Postgres's parser reads the text after [`apart`], so
/// `3.5` in `第3.5章` stands between spaces there and is one number,
/// where beside the characters themselves it would be read as part of a
/// word.
pub fn blanked(text: &str) -> Cow<'_, str> {
    if !holds(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_cjk(c) {
            out.extend(std::iter::repeat_n(' ', c.len_utf8()));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `word` is one [`is_cjk`] character: a word of its own.
pub fn is_single(word: &str) -> bool {
    let mut chars = word.chars();
    matches!((chars.next(), chars.next()), (Some(c), None) if is_cjk(c))
}

/// The alternatives a query word stands for, once [`apart`] and split at
/// spaces into `parts`: each run of other parts as one (its parts side by
/// side, as any word of several lexemes), and each run of characters read
/// one by one as its neighbouring pairs (`深 色`, `色 模`, `模 式`), or the
/// character alone when it stands alone; each once, in order.
pub fn pairs<'a>(parts: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let parts: Vec<&str> = parts.into_iter().collect();
    let mut out: Vec<String> = Vec::new();
    for run in parts.chunk_by(|a, b| is_single(a) == is_single(b)) {
        let alternatives = match run {
            [first, _, ..] if is_single(first) => run
                .windows(2)
                .map(|pair| format!("{} {}", pair[0], pair[1]))
                .collect(),
            _ => vec![run.join(" ")],
        };
        for alternative in alternatives {
            if !alternative.is_empty() && !out.contains(&alternative) {
                out.push(alternative);
            }
        }
    }
    out
}

/// The character class of [`BLOCKS`] in Postgres's regular expressions,
/// as migration 0029 writes it in `engram_search_text` (a test holds the
/// two alike).
pub fn postgres_class() -> String {
    let escape = |c: char| {
        let code = u32::from(c);
        if code > 0xffff {
            format!("\\U{code:08x}")
        } else {
            format!("\\u{code:04x}")
        }
    };
    let ranges: String = BLOCKS
        .iter()
        .map(|r| format!("{}-{}", escape(*r.start()), escape(*r.end())))
        .collect();
    format!("[{ranges}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_of_the_blocks_and_only_they_are_read_one_by_one() {
        for c in ['深', 'モ', 'ー', 'ひ', '한', '々', '𠀀', 'ｶ', 'ㄱ', '〇'] {
            assert!(is_cjk(c), "{c}");
        }
        for c in [
            'a', 'é', 'я', '・', '゛', '\u{3099}', '、', '。', '１', 'Ａ', '🙂',
        ] {
            assert!(!is_cjk(c), "{c}");
        }
        assert!(holds("see 深色 mode"));
        assert!(!holds("café・"));
    }

    #[test]
    fn apart_spaces_each_character() {
        assert_eq!(apart("GPT模型、3個"), "GPT 模  型 、3 個 ");
        assert!(matches!(apart("plain café"), Cow::Borrowed(_)));
    }

    #[test]
    fn blanked_keeps_every_other_byte_in_place() {
        let text = "第3.5章、𠀀1";
        let blank = blanked(text);
        assert_eq!(blank, "   3.5   、    1");
        assert_eq!(blank.len(), text.len());
        assert_eq!(blank.find("3.5"), text.find("3.5"));
        assert!(matches!(blanked("v1.5 café"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_run_is_looked_for_by_its_pairs() {
        let parts = |text: &str| {
            let spaced = apart(text).into_owned();
            pairs(spaced.split_whitespace().collect::<Vec<_>>())
        };
        assert_eq!(parts("深色模式"), ["深 色", "色 模", "模 式"]);
        assert_eq!(parts("深"), ["深"]);
        assert_eq!(parts("GPT模型"), ["GPT", "模 型"]);
        assert_eq!(parts("src auth 設定 ts"), ["src auth", "設 定", "ts"]);
        assert_eq!(parts("的的的"), ["的 的"]);
        assert_eq!(parts("한국어"), ["한 국", "국 어"]);
        assert_eq!(pairs(["user", "42"]), ["user 42"]);
    }

    #[test]
    fn the_postgres_class_names_every_block() {
        let class = postgres_class();
        assert!(
            class.starts_with("[\\u1100-\\u11ff\\u3005-\\u3007"),
            "{class}"
        );
        assert!(class.ends_with("\\U00020000-\\U0003134f]"), "{class}");
        let migration = include_str!("../../migrations/postgres/0029_search_cjk_characters.sql");
        assert_eq!(migration.matches(&class).count(), 5, "{class}");
    }
}
