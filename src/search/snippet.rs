//! Snippets of search hits (both stores): the part of an item's text around the
//! query's words, with those words marked `**like this**`, in up to
//! [`FRAGMENTS`] fragments of at most [`FRAGMENT_WORDS`] words.
//!
//! Made here rather than with Postgres's `ts_headline`, which took a second
//! statement per search and ran Postgres's parser over every hit's text
//! again. A word is marked when its lexeme ([`super::english::lexeme`],
//! diacritics removed) is one of the query's. A token Postgres's parser
//! reads as a unit (a URL's path, a hyphenated compound with digits) may
//! go unmarked here; which items are found and how they rank never
//! depends on it. SQLite's hits were marked by FTS5's
//! `snippet()` until that statement proved as dear as the search itself.
//!
//! A character of Chinese, Japanese or Korean is a word of its own, as the
//! indexes read it ([`cjk`]), and is marked when it stands beside another
//! of the query's (the pairs a query looks for), or alone when the query
//! holds only one such character: `的` is marked in `我的` only when the
//! query asked for `我的`. A cluster of Thai, Lao, Khmer or Burmese is a
//! word too, marked only where a run of the query's clusters stands whole
//! (`กาแฟ`, not every `า` of the text).

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

use super::cjk::{self, is_cjk};
use super::english::{lexeme, spaced, turkic_lexeme};
use super::{numbers, spelling};

/// The most words in one fragment.
pub const FRAGMENT_WORDS: usize = 30;

/// The most fragments in a snippet.
pub const FRAGMENTS: usize = 2;

/// Words of context kept before the first marked word of a fragment.
const LEAD: usize = 5;

/// Between two fragments.
const DELIMITER: &str = " … ";

/// How the store that found a hit lowercases the words it indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// As Rust does: SQLite, and Postgres in almost every locale.
    Unicode,
    /// Also with `I` as a dotless `ı`, as Postgres does in a Turkish or
    /// Azerbaijani `LC_CTYPE` ([`super::english::turkic_lexeme`]). A word
    /// is marked when either reading of it is one of the query's: the
    /// query's own terms may have been read either way.
    Turkic,
}

/// A word of the text: its byte range and whether it is marked.
struct Word {
    start: usize,
    end: usize,
    marked: bool,
}

/// The snippet of `text`, as a reader sees it ([`super::Item::visible_text`]:
/// no tags, entities as their characters), for a query whose lexemes are
/// `terms` and whose runs of clusters are `runs` ([`cjk::cluster_runs`]),
/// its words read as `case` says. The text is read and shown composed
/// ([`spelling::composed`]), as the indexes read it.
pub fn snippet(text: &str, terms: &[String], runs: &[Vec<String>], case: Case) -> String {
    let text = spelling::composed(text);
    let text = text.as_ref();
    let terms: HashSet<&str> = terms.iter().map(String::as_str).collect();
    let mut words = words(text, &terms, case);
    mark_runs(text, &mut words, runs);
    if words.is_empty() {
        return String::new();
    }
    let mut fragments: Vec<(usize, usize)> = Vec::new();
    while fragments.len() < FRAGMENTS {
        let Some(fragment) = best_fragment(&words, &fragments) else {
            break;
        };
        fragments.push(fragment);
    }
    if fragments.is_empty() {
        // Nothing marked (the item matched by a token read differently
        // here): its opening words.
        fragments.push((0, words.len().min(FRAGMENT_WORDS)));
    }
    fragments.sort_unstable();
    // Fragments that meet are one run of the text, with no gap to mark.
    fragments.dedup_by(|next, previous| {
        let meet = previous.1 == next.0;
        if meet {
            previous.1 = next.1;
        }
        meet
    });
    fragments
        .iter()
        .map(|&(from, to)| render(text, &words[from..to]))
        .collect::<Vec<_>>()
        .join(DELIMITER)
}

/// The words of `text`, marked when their lexeme is one of `terms` (a
/// character of Chinese, Japanese or Korean only beside another marked
/// one, but when `terms` hold one such character alone).
fn words(text: &str, terms: &HashSet<&str>, case: Case) -> Vec<Word> {
    let marked = |word: &str| {
        terms.contains(lexeme(word).as_str())
            || (case == Case::Turkic
                && word.contains(['I', 'İ'])
                && terms.contains(turkic_lexeme(word).as_str()))
    };
    let mut words: Vec<Word> = word_ranges(text)
        .into_iter()
        .map(|range| Word {
            marked: marked(&text[range.clone()]),
            start: range.start,
            end: range.end,
        })
        .collect();
    if terms.iter().filter(|t| cjk::holds(t)).count() > 1 {
        let cjk_word = |w: &Word| cjk::is_single(&text[w.start..w.end]);
        let marked_beside = |beside: Option<usize>| {
            beside
                .and_then(|at| words.get(at))
                .is_some_and(|w| w.marked && cjk_word(w))
        };
        let lone: Vec<usize> = (0..words.len())
            .filter(|&at| {
                words[at].marked
                    && cjk_word(&words[at])
                    && !marked_beside(at.checked_sub(1))
                    && !marked_beside(Some(at + 1))
            })
            .collect();
        for at in lone {
            words[at].marked = false;
        }
    }
    words
}

/// Marks the clusters of `words` only where they stand as one of `runs`,
/// each of the run's clusters a word, side by side and in order.
fn mark_runs(text: &str, words: &mut [Word], runs: &[Vec<String>]) {
    // Each cluster's lexeme, read once; `None` for other words.
    let clusters: Vec<Option<String>> = words
        .iter()
        .map(|w| {
            let word = &text[w.start..w.end];
            cjk::is_cluster(word).then(|| lexeme(word))
        })
        .collect();
    let any_marked = words
        .iter()
        .zip(&clusters)
        .any(|(w, c)| w.marked && c.is_some());
    if !any_marked {
        return;
    }
    let mut marked = vec![false; words.len()];
    for run in runs.iter().filter(|run| !run.is_empty()) {
        let run: Vec<String> = run.iter().map(|part| lexeme(part)).collect();
        for at in 0..clusters.len().saturating_sub(run.len() - 1) {
            let stands = run
                .iter()
                .zip(&clusters[at..])
                .all(|(part, cluster)| cluster.as_ref() == Some(part));
            if stands {
                marked[at..at + run.len()].fill(true);
            }
        }
    }
    for ((word, cluster), marked) in words.iter_mut().zip(&clusters).zip(marked) {
        if cluster.is_some() {
            word.marked = marked;
        }
    }
}

/// Combining marks (Unicode's category M): part of the word they follow,
/// as Postgres's parser reads them (`कॉफ़ी` is one word there, its vowel
/// signs and nukta included; `e` and U+0301 are `é`), a break where no
/// word precedes them.
static MARK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\p{M}$").unwrap_or_else(|err| panic!("the mark class: {err}")));

/// Whether `c` is a combining mark ([`MARK`]).
fn is_mark(c: char) -> bool {
    !c.is_ascii() && MARK.is_match(c.encode_utf8(&mut [0; 4]))
}

/// Where the words of `text` are, as snippets read them: runs of letters
/// and digits, but a decimal, a version or a signed number whole, as the
/// indexes keep it ([`numbers::whole`]), so that `3.14` is marked when
/// `3.14` is searched, and one right before letters a word apart from
/// them ([`numbers::before_letters`]: `3.21` in `3.21s`), and each
/// character of Chinese, Japanese or Korean alone, and each cluster of
/// Thai, Lao, Khmer or Burmese ([`cjk::units`]), numbers beside them, or
/// beside `<`, `>`, `&` or `@`, read as between spaces (`3.5` in `第3.5章`,
/// `-7` in `<-7>`, as Postgres reads them; [`numbers::in_text`]), the
/// Arabic script's digits read as ASCII ones ([`numbers_in`]).
pub fn word_ranges(text: &str) -> Vec<Range<usize>> {
    let numbers = numbers_in(text);
    let mut numbers = numbers.iter().peekable();
    let mut units = cjk::units(text, cjk::Units::Clusters)
        .into_iter()
        .peekable();
    let mut words = Vec::new();
    let mut start = None;
    let mut skip_to = 0;
    for (at, c) in text.char_indices().chain([(text.len(), ' ')]) {
        if at < skip_to {
            continue;
        }
        if start.is_none()
            && let Some(number) = numbers.next_if(|n| n.start == at)
        {
            words.push(number.clone());
            skip_to = number.end;
            continue;
        }
        while units.next_if(|unit| unit.start < at).is_some() {}
        if let Some(unit) = units.next_if(|unit| unit.start == at) {
            if let Some(from) = start.take() {
                words.push(from..at);
            }
            skip_to = unit.end;
            words.push(unit);
        } else {
            let in_word = c.is_alphanumeric() || (start.is_some() && is_mark(c));
            match (in_word, start) {
                (true, None) => start = Some(at),
                (false, Some(from)) => {
                    words.push(from..at);
                    start = None;
                }
                _ => {}
            }
        }
        // A number inside a run of letters and digits is none of its own.
        while numbers.next_if(|n| n.start < at).is_some() {}
    }
    words
}

/// The numbers of `text` as the indexes read them, at their offsets in
/// `text`: found where its Arabic-script digits are ASCII ones
/// ([`spelling::ascii_digits`]), so that `٣.١٤` is one number, `3.14`, as
/// it is to the search, and not two words split at the point.
fn numbers_in(text: &str) -> Vec<Range<usize>> {
    let spaced = spaced(text);
    let read = |text: &str| numbers::in_text(text, &[], cjk::Units::Clusters);
    let Cow::Owned(ascii) = spelling::ascii_digits(&spaced) else {
        return read(&spaced);
    };
    // Each such digit is two bytes in the text and one in `ascii`: the
    // text's offset of each of `ascii`'s bytes, and of its end.
    let mut at_in_text = Vec::with_capacity(ascii.len() + 1);
    for (at, c) in spaced.char_indices() {
        let bytes = match spelling::ascii_digit(c) {
            Some(_) => 1,
            None => c.len_utf8(),
        };
        at_in_text.extend(std::iter::repeat_n(at, bytes));
    }
    at_in_text.push(spaced.len());
    read(&ascii)
        .into_iter()
        .filter_map(|r| Some(*at_in_text.get(r.start)?..*at_in_text.get(r.end)?))
        .collect()
}

/// The word range of the fragment holding the most marked words not yet
/// shown, starting a little before one of them and overlapping no chosen
/// fragment; `None` when every marked word is shown.
fn best_fragment(words: &[Word], chosen: &[(usize, usize)]) -> Option<(usize, usize)> {
    let shown = |at: usize| chosen.iter().any(|&(from, to)| (from..to).contains(&at));
    let mut best: Option<((usize, usize), usize)> = None;
    for anchor in (0..words.len()).filter(|&at| words[at].marked && !shown(at)) {
        // Not into a fragment already chosen.
        let floor = chosen
            .iter()
            .filter(|(_, to)| *to <= anchor)
            .map(|&(_, to)| to)
            .max()
            .unwrap_or(0);
        let from = anchor.saturating_sub(LEAD).max(floor);
        let mut to = (from + FRAGMENT_WORDS).min(words.len());
        if let Some(&(next, _)) = chosen.iter().filter(|(f, _)| *f > anchor).min() {
            to = to.min(next);
        }
        // Words the end of the text (or the next fragment) leaves unused
        // go before: a short text is shown whole, not from its match on.
        let from = from.saturating_sub(FRAGMENT_WORDS - (to - from)).max(floor);
        let count = (from..to).filter(|&at| words[at].marked).count();
        if best.is_none_or(|(_, most)| count > most) {
            best = Some(((from, to), count));
        }
    }
    best.map(|(fragment, _)| fragment)
}

/// The text from the first word to the last, marked words in `**`, with
/// the punctuation that clings to them (up to the whitespace around, or
/// a character of Chinese, Japanese or Korean, which stands for a word).
fn render(text: &str, words: &[Word]) -> String {
    let (Some(first), Some(last)) = (words.first(), words.last()) else {
        return String::new();
    };
    let edge = |c: char| c.is_whitespace() || is_cjk(c) || cjk::is_cluster_start(c);
    let start = text[..first.start].rfind(edge).map_or(0, |at| {
        at + text[at..].chars().next().map_or(1, char::len_utf8)
    });
    let end = text[last.end..]
        .find(edge)
        .map_or(text.len(), |at| last.end + at);
    let mut out = String::with_capacity(end - start + 16);
    let mut at = start;
    let mut marked = false;
    for word in words {
        let gap = &text[at..word.start];
        if word.marked {
            // Two marked words of one token share one mark: nothing
            // between them (`3.21` and `s` of `3.21s`), or punctuation
            // with no space (`validate.ts`, `user_42`, `auth/login`).
            if marked && !gap.contains(|c: char| c.is_whitespace() || c == '*') {
                out.truncate(out.len() - "**".len());
                out.push_str(gap);
            } else {
                out.push_str(gap);
                out.push_str("**");
            }
            out.push_str(&text[word.start..word.end]);
            out.push_str("**");
        } else {
            out.push_str(gap);
            out.push_str(&text[word.start..word.end]);
        }
        marked = word.marked;
        at = word.end;
    }
    out.push_str(&text[at..end]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| t.to_string()).collect()
    }

    /// A snippet as the stores read words in almost every locale.
    fn snippet(text: &str, terms: &[String]) -> String {
        super::snippet(text, terms, &[], Case::Unicode)
    }

    #[test]
    fn a_turkic_database_marks_words_it_lowercases_with_a_dotless_i() {
        // `INVOICE` and `İNVOİCE` (whose `İ` `unaccent` reads as `I`)
        // are `ınvoıc` there, `İnvoice` is `ınvoic`; the query may also
        // have been read as in any other locale.
        let text = "INVOICE sent, İNVOİCE paid, İnvoice due";
        let turkic = |t: &[&str]| super::snippet(text, &terms(t), &[], Case::Turkic);
        assert_eq!(
            turkic(&["ınvoıc"]),
            "**INVOICE** sent, **İNVOİCE** paid, İnvoice due"
        );
        assert_eq!(
            turkic(&["ınvoic"]),
            "INVOICE sent, İNVOİCE paid, **İnvoice** due"
        );
        assert_eq!(
            turkic(&["invoic"]),
            "**INVOICE** sent, **İNVOİCE** paid, **İnvoice** due"
        );
        assert_eq!(snippet(text, &terms(&["ınvoıc"])), text);
    }

    #[test]
    fn a_short_text_is_whole_with_its_words_marked() {
        assert_eq!(
            snippet(
                "Our deployment setup, documented (deploys: 3).",
                &terms(&["deploy", "setup"])
            ),
            "Our **deployment** **setup**, documented (**deploys**: 3)."
        );
    }

    #[test]
    fn a_long_text_shows_the_fragments_around_its_matches() {
        let filler = |from: usize, n: usize| -> Vec<String> {
            (from..from + n).map(|i| format!("f{i}")).collect()
        };
        let mut words = filler(0, 200);
        words[50] = "kubernetes".into();
        words[52] = "cluster".into();
        words[190] = "clusters".into();
        let text = words.join(" ");
        let got = snippet(&text, &terms(&["kubernet", "cluster"]));
        let fragments: Vec<&str> = got.split(DELIMITER).collect();
        assert_eq!(fragments.len(), 2, "{got}");
        assert!(fragments[0].starts_with("f45 "), "{got}");
        assert!(
            fragments[0].contains("**kubernetes** f51 **cluster**"),
            "{got}"
        );
        assert_eq!(fragments[0].split(' ').count(), FRAGMENT_WORDS);
        // Near the end, the fragment takes its words from before the match.
        assert!(fragments[1].starts_with("f170 "), "{got}");
        assert!(fragments[1].contains("**clusters**"), "{got}");
        assert!(fragments[1].ends_with("f199"), "{got}");
        assert_eq!(fragments[1].split(' ').count(), FRAGMENT_WORDS);

        // Two fragments that meet are one run of the text, no ellipsis.
        let mut words = filler(0, 100);
        words[50] = "kubernetes".into();
        words[90] = "clusters".into();
        let got = snippet(&words.join(" "), &terms(&["kubernet", "cluster"]));
        assert!(!got.contains(DELIMITER), "{got}");
        assert!(got.starts_with("f45 ") && got.ends_with("f99"), "{got}");
    }

    #[test]
    fn a_short_text_matched_late_is_whole() {
        assert_eq!(
            snippet(
                "notes/deploy we deploy with argo to the staging cluster",
                &terms(&["stage"])
            ),
            "notes/deploy we deploy with argo to the **staging** cluster"
        );
    }

    #[test]
    fn without_a_marked_word_the_opening_words() {
        let text = (0..50)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let got = snippet(&text, &terms(&["absent"]));
        assert!(got.starts_with("w0 w1"), "{got}");
        assert_eq!(got.split(' ').count(), FRAGMENT_WORDS);
        assert_eq!(snippet("", &terms(&["x"])), "");
        assert_eq!(snippet(" … ", &terms(&["x"])), "");
    }

    #[test]
    fn numbers_are_marked_whole() {
        assert_eq!(
            snippet(
                "pi is 3.14 (not 3), -5 at 10.0.0.1.",
                &terms(&["3.14", "-5", "10.0.0.1"])
            ),
            "pi is **3.14** (not 3), **-5** at **10.0.0.1**."
        );
        // Before letters too, as the indexes read it, but not before an
        // `e` (a number in scientific notation, maybe) or after a letter.
        assert_eq!(snippet("3.14pm", &terms(&["3.14"])), "**3.14**pm");
        assert_eq!(
            snippet("3.14pm, 3.14e5, v3.14x", &terms(&["3.14", "pm"])),
            "**3.14pm**, 3.14e5, v3.14x"
        );
        // The Arabic script's digits are numbers by their value: `٣.١٤` is
        // `3.14` whole, not `٣` and `١٤`, in either set of digits and
        // beside other text.
        assert_eq!(
            snippet("السعر ٣.١٤ و ۲.۵ و 3.14", &terms(&["3.14", "2.5"])),
            "السعر **٣.١٤** و **۲.۵** و **3.14**"
        );
        assert_eq!(
            snippet("السعر ٣.١٤ دينار", &terms(&["3"])),
            "السعر ٣.١٤ دينار"
        );
        assert_eq!(snippet("v٣.١٤ (٣٤)", &terms(&["34"])), "v٣.١٤ (**٣٤**)");
    }

    #[test]
    fn the_marked_words_of_one_token_share_a_mark() {
        assert_eq!(
            snippet(
                "see src/auth/validate.ts for user_42, then validate ts",
                &[
                    lexeme("validate"),
                    lexeme("ts"),
                    lexeme("user"),
                    lexeme("42")
                ]
            ),
            "see src/auth/**validate.ts** for **user_42**, then **validate** **ts**"
        );
        // A word left unmarked between keeps the marks apart.
        assert_eq!(
            snippet("validate.auth.ts", &[lexeme("validate"), lexeme("ts")]),
            "**validate**.auth.**ts**"
        );
    }

    #[test]
    fn markup_is_left_out() {
        assert_eq!(
            snippet(
                &crate::search::markup::visible(
                    "<p>Read <a href=\"https://example.com/deploy.html\">the guide</a> \
                     before you deploy &amp; roll.</p>"
                ),
                &terms(&["deploy"])
            ),
            "Read the guide before you **deploy** & roll."
        );
    }

    #[test]
    fn cjk_characters_are_words_marked_in_pairs() {
        let query = |text: &str| {
            let q = crate::search::Query::parse("query", text).expect("valid");
            q.words
                .iter()
                .flat_map(|w| w.split(' '))
                .map(lexeme)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            snippet("我喜欢深色模式，不喜欢浅色。", &query("深色")),
            "我喜欢**深色**模式，不喜欢浅色。"
        );
        // A character of the query alone is not marked where it stands
        // apart from the others; a query of one character marks it.
        assert_eq!(snippet("深夜的颜色", &query("深色")), "深夜的颜色");
        assert_eq!(snippet("深夜的颜色", &query("色")), "深夜的颜**色**");
        assert_eq!(
            snippet("GPT模型をデプロイする", &query("gpt モデル デプロイ")),
            "**GPT**模型を**デプロイ**する"
        );
        // A long text without spaces is cut by characters, not whole.
        let long = format!("{}深色模式{}", "甲".repeat(200), "乙".repeat(200));
        let got = snippet(&long, &query("深色"));
        assert_eq!(got.chars().count(), FRAGMENT_WORDS + 4, "{got}");
        assert!(got.contains("甲**深色**模式乙"), "{got}");
        assert_eq!(word_ranges("a深b").len(), 3);
    }

    #[test]
    fn combining_marks_belong_to_the_word_they_follow() {
        let spans = |text: &str| -> Vec<(usize, usize)> {
            word_ranges(text)
                .into_iter()
                .map(|r| (r.start, r.end))
                .collect()
        };
        // A decomposed accent stays on its letter; a mark after no word
        // is none.
        assert_eq!(spans("cafe\u{301} x"), [(0, 6), (7, 8)]);
        assert_eq!(spans("\u{301}ab"), [(2, 4)]);
    }

    #[test]
    fn clusters_are_words_marked_where_the_query_s_run_stands_whole() {
        // Each cluster a word, its tone mark with it, as the indexes read
        // them.
        let words: Vec<&str> = {
            let text = "ผมไม่ชอบกาแฟ";
            word_ranges(text).into_iter().map(|r| &text[r]).collect()
        };
        assert_eq!(
            words,
            ["ผ", "ม", "ไ", "ม่", "ช", "อ", "บ", "ก", "า", "แ", "ฟ"]
        );
        let marked = |text: &str, query: &str| {
            let q = crate::search::Query::parse("query", query).expect("valid");
            let terms: Vec<String> = q
                .words
                .iter()
                .chain(&q.phrases)
                .flat_map(|w| w.split(' '))
                .map(lexeme)
                .collect();
            super::snippet(text, &terms, &q.cluster_runs(), Case::Unicode)
        };
        assert_eq!(marked("ผมไม่ชอบกาแฟ", "กาแฟ"), "ผมไม่ชอบ**กาแฟ**");
        // Not every `า` of the text, nor a run that stands apart.
        assert_eq!(marked("กาแฟ ราคา แฟกา", "กาแฟ"), "**กาแฟ** ราคา แฟกา");
        assert_eq!(marked("ผมไม่ชอบกาแฟ", "ไม่"), "ผม**ไม่**ชอบกาแฟ");
        assert_eq!(marked("ผมไม่ชอบกาแฟ", "\"ผมไม่\""), "**ผมไม่**ชอบกาแฟ");
        assert_eq!(marked("ผมไม่ชอบกาแฟ", "coffee"), "ผมไม่ชอบกาแฟ");
        assert_eq!(
            marked("ราคา3.14บาท and tea", "3.14 tea"),
            "ราคา**3.14**บาท and **tea**"
        );
    }

    #[test]
    fn unicode_words_are_cut_on_character_boundaries() {
        assert_eq!(
            snippet("Café crème — naïve résumé", &terms(&["naiv"])),
            "Café crème — **naïve** résumé"
        );
    }
}
