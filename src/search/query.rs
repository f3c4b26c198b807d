//! The query language both stores share: words (any may match, more
//! matches rank higher), "quoted phrases" (each must appear) and -words
//! (must not appear). Parsing is the domain's; each store turns the parsed
//! query into its own syntax (a `tsquery`, an FTS5 expression) from these
//! parts only, never from the raw text. A word of Chinese, Japanese or
//! Korean characters stands for each pair of its neighbouring characters
//! ([`cjk::pairs`]), one of Thai, Lao, Khmer or Burmese for all its
//! clusters side by side ([`cjk::units`]).

use super::cjk;
use crate::error::{Error, Reason, Result};

/// The longest query accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;

/// The most words and phrases one query may hold.
pub const MAX_TERMS: usize = 64;

/// A parsed query. Every word and phrase has at least one letter or digit,
/// and `/`, and a `.` or `@` inside a compound, are read as spaces
/// ([`english::spaced`](super::english::spaced)), so `src/auth/validate.ts` is found by its parts
/// as the indexes store them. So is a hyphen between letters or digits
/// ([`apart`]): `state-of-the-art` looks for its words side by side.
/// Characters of Chinese, Japanese and Korean are words of their own
/// ([`cjk::apart`]), and an unquoted run of them stands for its pairs of
/// neighbours ([`cjk::pairs`]); so are clusters of Thai, Lao, Khmer and
/// Burmese, and a run of them stands for all its clusters side by side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Optional words: an item matching any is a candidate.
    pub words: Vec<String>,
    /// Phrases an item must contain, words in order.
    pub phrases: Vec<String>,
    /// Words or phrases an item must not contain.
    pub excluded: Vec<String>,
    /// What a semantic search embeds: the phrases and the words as
    /// written (but for spacing), in that order, without the exclusions.
    pub meaning: String,
}

impl Query {
    pub fn parse(field: &str, text: &str) -> Result<Query> {
        let invalid =
            |description: String| Error::invalid(Reason::InvalidQuery, field, description);
        if text.trim().is_empty() {
            return Err(invalid("a query is required".to_owned()));
        }
        if text.len() > MAX_QUERY_BYTES {
            return Err(invalid(format!(
                "a query may hold at most {MAX_QUERY_BYTES} bytes, this one has {}",
                text.len()
            )));
        }
        if text.contains('\0') {
            // Postgres's text cannot hold it, nor FTS5's query syntax.
            return Err(invalid(
                "a query may not hold the NUL character (U+0000)".to_owned(),
            ));
        }
        // Read composed, with ASCII digits, as the indexes read text (and
        // so the meaning a semantic search embeds, and the words snippets
        // mark).
        let text = super::spelling::normalized(text);
        let mut query = Query {
            words: Vec::new(),
            phrases: Vec::new(),
            excluded: Vec::new(),
            meaning: String::new(),
        };
        let mut meant = Vec::new();
        let mut rest = text.as_ref();
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                break;
            }
            let excluded = rest.starts_with('-') && rest.len() > 1;
            if excluded {
                rest = &rest[1..];
            }
            let (term, quoted, after) = match rest.strip_prefix('"') {
                Some(inner) => match inner.find('"') {
                    Some(end) => (&inner[..end], true, &inner[end + 1..]),
                    None => (inner, true, ""),
                },
                None => {
                    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                    (&rest[..end], false, &rest[end..])
                }
            };
            rest = after;
            let written = term;
            let term = normalize(term);
            if !term.chars().any(char::is_alphanumeric) {
                continue;
            }
            match (excluded, quoted) {
                (true, _) => query.excluded.push(term),
                (false, true) => {
                    let phrase = written.split_whitespace().collect::<Vec<_>>().join(" ");
                    meant.insert(query.phrases.len(), phrase);
                    query.phrases.push(term);
                }
                (false, false) => {
                    meant.push(written.to_owned());
                    query.words.extend(cjk::pairs(term.split(' ')));
                }
            }
        }
        query.meaning = meant.join(" ");
        if query.words.len() + query.phrases.len() + query.excluded.len() > MAX_TERMS {
            return Err(invalid(format!(
                "a query may hold at most {MAX_TERMS} words and phrases (a run of Chinese, \
                 Japanese or Korean characters holds a word for each pair of neighbours)"
            )));
        }
        if query.words.is_empty() && query.phrases.is_empty() {
            return Err(invalid(
                "the query has nothing to look for: give at least one word or \"phrase\" \
                 (-words only exclude)"
                    .to_owned(),
            ));
        }
        Ok(query)
    }
}

impl Query {
    /// The runs of clusters of Thai, Lao, Khmer or Burmese among the
    /// words and phrases ([`cjk::cluster_runs`]), which snippets mark.
    pub fn cluster_runs(&self) -> Vec<Vec<String>> {
        cjk::cluster_runs(self.words.iter().chain(&self.phrases).map(String::as_str))
    }

    /// Whether a text holds one of the excluded words or phrases (compared
    /// in lower case): a semantic hit with one is dropped.
    pub fn excludes(&self, text: &str) -> bool {
        if self.excluded.is_empty() {
            return false;
        }
        let text = normalize(&super::spelling::normalized(text).to_lowercase());
        self.excluded
            .iter()
            .any(|term| text.contains(&term.to_lowercase()))
    }
}

/// Collapses whitespace and reads compounds as the indexes do
/// ([`english::spaced`](super::english::spaced)), hyphenated words as their parts ([`apart`]),
/// Chinese, Japanese and Korean characters and clusters of Thai, Lao,
/// Khmer and Burmese one by one ([`cjk::apart`]), and spellings of one
/// word alike ([`super::spelling`]).
fn normalize(term: &str) -> String {
    let term = super::spelling::plain(term);
    apart(&cjk::apart(&super::english::spaced(&term)))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A query's hyphens between letters or digits as spaces, so that a
/// hyphenated word looks for its parts side by side. Postgres indexes
/// `state-of-the-art` as the whole compound followed by its parts, and
/// SQLite as its parts alone; asked for the parts, both find the
/// compound and the words written apart ("the state of the art"), as
/// SQLite always did, where a query for the compound found only the
/// compound on Postgres. Only queries are read this way: the indexes
/// keep the compound.
fn apart(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    chars
        .iter()
        .enumerate()
        .map(|(at, &c)| {
            let joins = c == '-'
                && at > 0
                && chars[at - 1].is_alphanumeric()
                && chars.get(at + 1).is_some_and(|next| next.is_alphanumeric());
            if joins { ' ' } else { c }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_character_is_refused() {
        for text in ["a\0b", "deploy \0x", "\"a\0\""] {
            let err = Query::parse("query", text).expect_err(text);
            assert!(err.to_string().contains("NUL"), "{err}");
        }
    }

    #[test]
    fn words_phrases_and_exclusions() {
        let q = Query::parse(
            "query",
            r#"deploy "blue green" -staging src/auth/validate.ts -"old cluster""#,
        )
        .expect("valid");
        assert_eq!(q.words, vec!["deploy", "src auth validate ts"]);
        assert_eq!(q.phrases, vec!["blue green"]);
        assert_eq!(q.excluded, vec!["staging", "old cluster"]);
        assert_eq!(q.meaning, "blue green deploy src/auth/validate.ts");
        let unclosed = Query::parse("query", r#"say "hello there"#).expect("valid");
        assert_eq!(unclosed.phrases, vec!["hello there"]);
        let dash = Query::parse("query", "state-of-the-art - x").expect("valid");
        assert_eq!(dash.words, vec!["state of the art", "x"]);
        let hyphens =
            Query::parse("query", r#"-well-known "e-mail café-bar" v2-beta a- -b"#).expect("valid");
        assert_eq!(hyphens.words, vec!["v2 beta", "a-"]);
        assert_eq!(hyphens.phrases, vec!["e mail café bar"]);
        assert_eq!(hyphens.excluded, vec!["well known", "b"]);
    }

    /// A run of Chinese, Japanese or Korean characters looks for its pairs
    /// of neighbours; quoted, for all of them side by side.
    #[test]
    fn cjk_runs_are_looked_for_by_their_pairs() {
        let q = Query::parse("query", r#"深色模式 GPT模型 "部署 设置" -旧版 深"#).expect("valid");
        assert_eq!(q.words, ["深 色", "色 模", "模 式", "GPT", "模 型", "深"]);
        assert_eq!(q.phrases, ["部 署 设 置"]);
        assert_eq!(q.excluded, ["旧 版"]);
        // Embedded as written, phrases first.
        assert_eq!(q.meaning, "部署 设置 深色模式 GPT模型 深");
        assert!(q.excludes("我们的旧版本"));
        assert!(!q.excludes("旧的版本"));
        let korean = Query::parse("query", "한국어 검색").expect("valid");
        assert_eq!(korean.words, ["한 국", "국 어", "검 색"]);
        // Each pair is a word: a run longer than the bound is refused by it.
        let long = "深".repeat(MAX_TERMS + 2);
        assert_eq!(
            Query::parse("query", &long).expect("one pair").words,
            ["深 深"]
        );
        let long: String = ('\u{4e00}'..).take(MAX_TERMS + 2).collect();
        let err = Query::parse("query", &long).expect_err("too many pairs");
        assert!(err.to_string().contains("each pair of neighbours"), "{err}");
    }

    #[test]
    fn cluster_runs_are_looked_for_whole() {
        let q = Query::parse("query", r#"กาแฟ "ไม่ชอบ" -ราคา helmด้วย"#).expect("valid");
        assert_eq!(q.words, ["ก า แ ฟ", "helm ด้ ว ย"]);
        assert_eq!(q.phrases, ["ไ ม่ ช อ บ"]);
        assert_eq!(q.excluded, ["ร า ค า"]);
        assert_eq!(q.meaning, "ไม่ชอบ กาแฟ helmด้วย");
        assert_eq!(
            q.cluster_runs(),
            [
                vec!["ก", "า", "แ", "ฟ"],
                vec!["ด้", "ว", "ย"],
                vec!["ไ", "ม่", "ช", "อ", "บ"]
            ]
        );
        assert!(q.excludes("ราคาสูง"));
        assert!(!q.excludes("คาร"));
    }

    #[test]
    fn refusals_name_the_problem() {
        for (text, says) in [
            ("", "required"),
            ("   ", "required"),
            ("-only -exclusions", "nothing to look for"),
            ("!!! ...", "nothing to look for"),
        ] {
            let err = Query::parse("query", text).expect_err(text);
            assert_eq!(err.reason(), Reason::InvalidQuery);
            assert!(err.to_string().contains(says), "{text:?}: {err}");
        }
        let long = "a".repeat(MAX_QUERY_BYTES + 1);
        assert!(Query::parse("query", &long).is_err());
        let many = vec!["w"; MAX_TERMS + 1].join(" ");
        assert!(Query::parse("query", &many).is_err());
    }
}
