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
//! Thai, Lao, Khmer and Burmese are written without spaces between words
//! too, in letters that carry vowel signs and tone marks, and both
//! parsers read a run of them as one word as well (`ผมไม่ชอบกาแฟ`, "I
//! don't like coffee"). Since Postgres's migration 0030 and SQLite's 0021
//! (`reading 8`) each *cluster* of them (a letter or digit with the
//! combining marks that follow it, [`CLUSTER_MARKS`]: `ไ`, `ม่`, `ช`) is a
//! word of its own in both indexes, and a query's run of them is looked
//! for as all its clusters side by side, in order: `กาแฟ` finds the
//! sentence above, as a search for part of a word finds it. Pairs would
//! not do there: a pair of letters is a syllable's fragment found in
//! most text of the language.
//!
//! Written here rather than taken from a segmenter (jieba, MeCab, lindera,
//! ICU's dictionaries): a dictionary per language would weigh more than
//! the rest of the server, would have to read text the same way in SQL for
//! Postgres's vectors, and would still miss the new words agents write;
//! pairs and clusters need no dictionary and find what a dictionary's
//! words would.

use std::borrow::Cow;
use std::ops::{Range, RangeInclusive};

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
    holds_units(text, Units::Characters)
}

/// The blocks read a cluster at a time: Thai, Lao, Myanmar and Khmer.
pub const CLUSTER_BLOCKS: &[RangeInclusive<char>] = &[
    '\u{0e00}'..='\u{0eff}',
    '\u{1000}'..='\u{109f}',
    '\u{1780}'..='\u{17ff}',
];

/// The combining marks of [`CLUSTER_BLOCKS`] (Unicode's categories Mn and
/// Mc there): vowel signs, tone marks, Khmer's coeng and Burmese's asat
/// and medials. Each belongs to the cluster of the letter before it.
pub const CLUSTER_MARKS: &[RangeInclusive<char>] = &[
    // Thai
    '\u{0e31}'..='\u{0e31}',
    '\u{0e34}'..='\u{0e3a}',
    '\u{0e47}'..='\u{0e4e}',
    // Lao (but U+0ECE, yamakkan, new in Unicode 15: Postgres's parser
    // reads it as a blank, as it does any character its locale does not
    // know)
    '\u{0eb1}'..='\u{0eb1}',
    '\u{0eb4}'..='\u{0ebc}',
    '\u{0ec8}'..='\u{0ecd}',
    // Myanmar
    '\u{102b}'..='\u{103e}',
    '\u{1056}'..='\u{1059}',
    '\u{105e}'..='\u{1060}',
    '\u{1062}'..='\u{1064}',
    '\u{1067}'..='\u{106d}',
    '\u{1071}'..='\u{1074}',
    '\u{1082}'..='\u{108d}',
    '\u{108f}'..='\u{108f}',
    '\u{109a}'..='\u{109d}',
    // Khmer
    '\u{17b4}'..='\u{17d3}',
    '\u{17dd}'..='\u{17dd}',
];

/// Whether `c` is a combining mark of [`CLUSTER_BLOCKS`].
pub fn is_cluster_mark(c: char) -> bool {
    CLUSTER_MARKS.iter().any(|r| r.contains(&c))
}

/// Whether `c` starts a cluster: a letter or digit of [`CLUSTER_BLOCKS`]
/// that is no mark (some vowel signs are letters to Unicode as well), but
/// Khmer's numeric symbols (`៰`…`៹`, U+17F0 to U+17F9), which Postgres's
/// parser reads as blanks.
pub fn is_cluster_start(c: char) -> bool {
    u32::from(c) >= 0x0e00
        && CLUSTER_BLOCKS.iter().any(|r| r.contains(&c))
        && c.is_alphanumeric()
        && !is_cluster_mark(c)
        && !('\u{17f0}'..='\u{17f9}').contains(&c)
}

/// What is read a piece at a time: characters of Chinese, Japanese and
/// Korean alone, or clusters of Thai, Lao, Khmer and Burmese as well
/// (SQLite's tables before `reading 8` read those runs whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Units {
    Characters,
    Clusters,
}

/// The byte ranges of the units of `text` that `units` reads alone, in
/// order: each [`is_cjk`] character, and with [`Units::Clusters`] each
/// cluster (a [`is_cluster_start`] character and the
/// [`is_cluster_mark`]s right after it).
pub fn units(text: &str, units: Units) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    if text.is_ascii() {
        return out;
    }
    let mut open = false;
    for (at, c) in text.char_indices() {
        let end = at + c.len_utf8();
        if is_cjk(c) {
            out.push(at..end);
            open = false;
        } else if units == Units::Clusters && is_cluster_start(c) {
            out.push(at..end);
            open = true;
        } else if open && is_cluster_mark(c) {
            if let Some(last) = out.last_mut() {
                last.end = end;
            }
        } else {
            open = false;
        }
    }
    out
}

/// Whether `text` holds a unit `units` reads alone.
pub fn holds_units(text: &str, units: Units) -> bool {
    !text.is_ascii()
        && text
            .chars()
            .any(|c| is_cjk(c) || (units == Units::Clusters && is_cluster_start(c)))
}

/// Whether `word` is one cluster of [`Units::Clusters`].
pub fn is_cluster(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(is_cluster_start) && chars.all(is_cluster_mark)
}

/// The runs of clusters of a query's words and phrases, as [`apart`] and
/// split at spaces: each run of neighbouring parts that are clusters, in
/// order. A hit's snippet marks its clusters only where such a run stands
/// in it whole, side by side, as the indexes found it.
pub fn cluster_runs<'a>(terms: impl IntoIterator<Item = &'a str>) -> Vec<Vec<String>> {
    let mut runs: Vec<Vec<String>> = Vec::new();
    for term in terms {
        let parts: Vec<&str> = term.split(' ').collect();
        for run in parts.chunk_by(|a, b| is_cluster(a) == is_cluster(b)) {
            if run.first().is_some_and(|part| is_cluster(part)) {
                let run: Vec<String> = run.iter().map(|part| (*part).to_owned()).collect();
                if !runs.contains(&run) {
                    runs.push(run);
                }
            }
        }
    }
    runs
}

/// `text` with a space on each side of every [`is_cjk`] character and
/// every cluster ([`units`]), so that each is a word of its own to
/// whatever splits it at spaces next.
pub fn apart(text: &str) -> Cow<'_, str> {
    rewritten(text, Units::Clusters, |unit, out| {
        out.push(' ');
        out.push_str(unit);
        out.push(' ');
    })
}

/// `text` with each unit `units` reads alone written by `write` in its
/// place, the rest as it is; borrowed when it holds none.
fn rewritten(text: &str, units: Units, write: impl Fn(&str, &mut String)) -> Cow<'_, str> {
    let units = self::units(text, units);
    if units.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + text.len() / 2);
    let mut at = 0;
    for unit in units {
        out.push_str(&text[at..unit.start]);
        write(&text[unit.clone()], &mut out);
        at = unit.end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

/// `text` with every [`is_cjk`] character blanked out (as many spaces as
/// its bytes, so every other byte stays where it was): what numbers are
/// read beside. Postgres's parser reads the text after [`apart`], so
/// `3.5` in `第3.5章` stands between spaces there and is one number,
/// where beside the characters themselves it would be read as part of a
/// word.
///
/// With [`Units::Clusters`] each cluster is blanked too (`3.14` in
/// `ราคา3.14บาท`), as Postgres reads it since its migration 0030.
pub fn blanked(text: &str, units: Units) -> Cow<'_, str> {
    rewritten(text, units, |unit, out| {
        out.extend(std::iter::repeat_n(' ', unit.len()));
    })
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
    super::postgres_class(BLOCKS.iter().flat_map(|r| r.clone()))
}

/// The classes of cluster starts and of marks ([`is_cluster_start`],
/// [`is_cluster_mark`]) in Postgres's regular expressions, as migration
/// 0030 writes them in `engram_search_text`: `starts marks*` is a cluster
/// (a test holds the two alike).
pub fn postgres_cluster_classes() -> (String, String) {
    let class = |wanted: fn(char) -> bool| {
        super::postgres_class(
            CLUSTER_BLOCKS
                .iter()
                .flat_map(|r| r.clone())
                .filter(|&c| wanted(c)),
        )
    };
    (class(is_cluster_start), class(is_cluster_mark))
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
        let blank = blanked(text, Units::Characters);
        assert_eq!(blank, "   3.5   、    1");
        assert_eq!(blank.len(), text.len());
        assert_eq!(blank.find("3.5"), text.find("3.5"));
        assert!(matches!(
            blanked("v1.5 café", Units::Clusters),
            Cow::Borrowed(_)
        ));
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
    fn the_postgres_cluster_classes_are_the_migrations() {
        let (starts, marks) = postgres_cluster_classes();
        assert!(
            starts.starts_with("[\\u0e01-\\u0e30\\u0e32-\\u0e33"),
            "{starts}"
        );
        let migration =
            include_str!("../../migrations/postgres/0030_search_clusters_and_points.sql");
        assert_eq!(migration.matches(&format!("({starts}{marks}*)")).count(), 1);
        assert_eq!(migration.matches(&starts).count(), 5, "{starts}");
    }

    #[test]
    fn clusters_are_a_letter_and_its_marks() {
        fn cut(text: &str) -> Vec<&str> {
            units(text, Units::Clusters)
                .into_iter()
                .map(|r| &text[r])
                .collect()
        }
        assert_eq!(
            cut("ผมไม่ชอบกาแฟ"),
            ["ผ", "ม", "ไ", "ม่", "ช", "อ", "บ", "ก", "า", "แ", "ฟ"]
        );
        assert_eq!(cut("ສະບາຍດີ"), ["ສ", "ະ", "ບ", "າ", "ຍ", "ດີ"]);
        assert_eq!(cut("ខ្ញុំ"), ["ខ្", "ញុំ"]);
        assert_eq!(cut("မြန်မာ"), ["မြ", "န်", "မာ"]);
        // A mark after no letter of its script belongs to no cluster.
        assert_eq!(cut("x\u{0e48}ก"), ["ก"]);
        assert_eq!(apart("ราคา3.14บาท"), " ร  า  ค  า 3.14 บ  า  ท ");
        assert_eq!(blanked("ราคา3.14บาท", Units::Clusters).trim(), "3.14");
        assert_eq!(blanked("ราคา3.14บาท", Units::Characters), "ราคา3.14บาท");
        assert!(is_cluster("ม่") && !is_cluster("มม") && !is_cluster("\u{0e48}"));
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
