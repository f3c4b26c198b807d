//! How a query becomes what Postgres searches for: the tsquery that
//! selects candidates and the lexemes BM25 weighs, normalised by the
//! server where the text is plain, else by Postgres (and then kept).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use sqlx::Row;

use super::{ADJACENT_WEIGHT, Doc};
use crate::error::{Error, Result};
use crate::search::english::{self, Reading};
use crate::search::{Query, spelling};
use crate::store::postgres::pool::Lease;
use crate::store::search::bm25;
use crate::store::sql::{Param, Run};

/// The query as Postgres reads it: the tsquery that selects candidates,
/// and the lexemes BM25 weighs.
pub(super) struct Plan {
    /// `(any word) & (each phrase) & !(each exclusion)`.
    pub(super) tsquery: String,
    /// Each distinct lexeme of the words and phrases, in query order.
    pub(super) terms: Vec<String>,
    /// Pairs of terms (indexes into `terms`) next to each other in the
    /// query.
    pairs: Vec<(usize, usize)>,
}

/// Query words and phrases as the `english` configuration normalises them,
/// kept so that a search whose every word and phrase was seen before skips
/// the round trip that asks Postgres. The normalisation depends on the text
/// alone (the configuration is Postgres's built-in one, which the search
/// vectors were made with too), so an entry never goes stale.
///
/// Bounded by [`NORMALIZED`] entries: when full it is emptied and fills
/// again with what is asked next. A hand-rolled map rather than an LRU
/// crate: a refill costs only the round trips the entries saved.
#[derive(Debug, Default)]
pub(in crate::store::postgres) struct Normalized(Mutex<NormalizedMaps>);

#[derive(Debug, Default)]
struct NormalizedMaps {
    /// A word or phrase → its lexemes in order, space-separated (empty for
    /// stop words only).
    lexemes: HashMap<String, String>,
    /// A phrase (or an excluded term) → its `phraseto_tsquery` text.
    tsqueries: HashMap<String, String>,
}

/// The most words and phrases [`Normalized`] keeps of each kind.
const NORMALIZED: usize = 20_000;

/// What [`Plan::build`] takes: each word and phrase's lexemes, each
/// word's, phrase's and exclusion's tsquery, in query order.
struct Normal {
    lexemes: Vec<String>,
    words: Vec<String>,
    phrases: Vec<String>,
    excluded: Vec<String>,
}

impl Normalized {
    fn maps(&self) -> std::sync::MutexGuard<'_, NormalizedMaps> {
        // A panic mid-insert leaves whole entries only.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The query normalised from what is kept, if every part of it is.
    fn get(&self, texts: &[String], query: &Query) -> Option<Normal> {
        let maps = self.maps();
        let look = |map: &HashMap<String, String>, list: &[String]| -> Option<Vec<String>> {
            list.iter().map(|t| map.get(t).cloned()).collect()
        };
        Some(Normal {
            lexemes: look(&maps.lexemes, texts)?,
            words: look(&maps.tsqueries, &query.words)?,
            phrases: look(&maps.tsqueries, &query.phrases)?,
            excluded: look(&maps.tsqueries, &query.excluded)?,
        })
    }

    fn keep(&self, texts: &[String], query: &Query, normal: &Normal) {
        fn put(map: &mut HashMap<String, String>, keys: &[String], values: &[String]) {
            for (key, value) in keys.iter().zip(values) {
                if map.len() >= NORMALIZED {
                    map.clear();
                }
                map.insert(key.clone(), value.clone());
            }
        }
        let mut maps = self.maps();
        put(&mut maps.lexemes, texts, &normal.lexemes);
        put(&mut maps.tsqueries, &query.words, &normal.words);
        put(&mut maps.tsqueries, &query.phrases, &normal.phrases);
        put(&mut maps.tsqueries, &query.excluded, &normal.excluded);
    }
}

/// The query normalised in Rust, when every word and phrase of it is
/// plain text ([`english::plain`]), as Postgres would normalise it. Each
/// text is read once; its lexemes and its phrase both come of that.
fn plain(texts: &[String], query: &Query, reading: Reading) -> Option<Normal> {
    let read = |list: &[String]| -> Option<Vec<Vec<Option<String>>>> {
        list.iter()
            .map(|text| english::plain(text, reading))
            .collect()
    };
    let texts = read(texts)?;
    let mut tsqueries: Vec<String> = texts.iter().map(|w| english::phrase(w)).collect();
    let phrases = tsqueries.split_off(query.words.len().min(tsqueries.len()));
    Some(Normal {
        lexemes: texts.iter().map(|w| english::distinct(w)).collect(),
        words: tsqueries,
        phrases,
        excluded: read(&query.excluded)?
            .iter()
            .map(|w| english::phrase(w))
            .collect(),
    })
}

impl Plan {
    /// Normalises the query's words with the `english` configuration: in
    /// Rust when the query is plain text as the database reads it
    /// (`in_rust`, [`PgStore::text_in_rust`](crate::store::postgres::PgStore::text_in_rust)), else from `normalized` when it
    /// holds every part, else by Postgres (then kept in `normalized`);
    /// `None` when nothing but stop words is left to look for.
    pub(super) async fn prepare(
        conn: &mut Lease,
        normalized: &Normalized,
        query: &Query,
        in_rust: Option<Reading>,
    ) -> Result<Option<Plan>> {
        let texts: Vec<String> = query.words.iter().chain(&query.phrases).cloned().collect();
        let rust = in_rust.and_then(|reading| plain(&texts, query, reading));
        let normal = match rust.or_else(|| normalized.get(&texts, query)) {
            Some(normal) => normal,
            None => {
                let normal = Self::normalize(conn, &texts, query).await?;
                normalized.keep(&texts, query, &normal);
                normal
            }
        };
        Ok(Self::build(query, &normal))
    }

    /// Asks Postgres for the lexemes and the tsquery of each word and
    /// phrase (`texts`, words first) and the tsquery of each exclusion,
    /// read as the vectors are
    /// (`engram_english`, migration 0020: `english`, with diacritics
    /// removed from words that hold a non-ASCII letter).
    async fn normalize(conn: &mut Lease, texts: &[String], query: &Query) -> Result<Normal> {
        // The query is spelt already ([`spelling::plain`]) but for the
        // article, which `engram_search_text` leaves off the indexed text.
        let unprefixed = |list: &[String]| -> Vec<String> {
            list.iter()
                .map(|t| spelling::unprefixed(t).into_owned())
                .collect()
        };
        let (texts, excluded) = (unprefixed(texts), unprefixed(&query.excluded));
        let row = conn
            .rows_built(
                "SELECT ARRAY(SELECT array_to_string(ARRAY(SELECT u.lexeme \
                 FROM unnest(to_tsvector('engram_english', t.w)) u ORDER BY u.positions[1]), ' ') \
                 FROM unnest($1::text[]) WITH ORDINALITY AS t(w, i) ORDER BY t.i), \
                 ARRAY(SELECT phraseto_tsquery('engram_english', t.w)::text \
                 FROM unnest($1::text[]) WITH ORDINALITY AS t(w, i) ORDER BY t.i), \
                 ARRAY(SELECT phraseto_tsquery('engram_english', t.x)::text \
                 FROM unnest($2::text[]) WITH ORDINALITY AS t(x, i) ORDER BY t.i)"
                    .to_owned(),
                &[Param::TextList(&texts), Param::TextList(&excluded)],
            )
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::internal("query normalisation returned no row"))?;
        let mut words: Vec<String> = row.try_get(1)?;
        let phrases = words.split_off(query.words.len().min(words.len()));
        Ok(Normal {
            lexemes: row.try_get(0)?,
            words,
            phrases,
            excluded: row.try_get(2)?,
        })
    }

    /// The plan of a normalised query; `None` when nothing but stop words
    /// is left to look for.
    fn build(query: &Query, normal: &Normal) -> Option<Plan> {
        let Normal {
            lexemes,
            words,
            phrases,
            excluded,
        } = normal;
        let mut terms: Vec<String> = Vec::new();
        let index =
            |lexeme: &str, terms: &mut Vec<String>| match terms.iter().position(|t| t == lexeme) {
                Some(at) => at,
                None => {
                    terms.push(lexeme.to_owned());
                    terms.len() - 1
                }
            };
        let mut pairs = Vec::new();
        // The words' alternatives: a word of one lexeme as itself, a word
        // of several (`user_42`, `validate.ts`) as their phrase, as SQLite
        // reads a quoted word.
        let mut any: Vec<String> = Vec::new();
        let mut previous: Option<usize> = None;
        for (at, text) in lexemes.iter().enumerate() {
            let is_word = at < query.words.len();
            if at == query.words.len() {
                previous = None; // phrases pair only within themselves
            }
            if text.is_empty() {
                previous = None; // a stop word breaks adjacency
                continue;
            }
            let alternative = match (is_word, text.contains(' ')) {
                (false, _) => None,
                (true, false) => Some(quote(text)),
                (true, true) => words.get(at).map(|phrase| format!("({phrase})")),
            };
            if let Some(alternative) = alternative.filter(|a| !any.contains(a)) {
                any.push(alternative);
            }
            for lexeme in text.split(' ') {
                let term = index(lexeme, &mut terms);
                if let Some(before) = previous.filter(|b| *b != term) {
                    pairs.push((before, term));
                }
                previous = Some(term);
            }
            if !is_word {
                previous = None;
            }
        }

        let mut required: Vec<String> = Vec::new();
        if !any.is_empty() {
            required.push(format!("({})", any.join(" | ")));
        }
        required.extend(
            phrases
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| format!("({p})")),
        );
        if required.is_empty() {
            return None;
        }
        let mut tsquery = required.join(" & ");
        for x in excluded.iter().filter(|x| !x.is_empty()) {
            tsquery.push_str(&format!(" & !({x})"));
        }
        Some(Plan {
            tsquery,
            terms,
            pairs,
        })
    }

    /// BM25 of each candidate of one source, plus the adjacency bonus,
    /// with each term's weight `idf` ([`bm25::pooled`]).
    pub(super) fn bm25(&self, docs: &[Doc], idf: &[f64]) -> Vec<f64> {
        let total = docs.iter().map(|d| d.length).sum::<usize>().max(1);
        let average = total as f64 / docs.len().max(1) as f64;
        let idf = |at: usize| idf.get(at).copied().unwrap_or(0.0);
        docs.iter()
            .map(|doc| {
                let saturate = bm25::saturation(doc.length, average);
                let mut score = 0.0;
                for (at, positions) in doc.positions.iter().enumerate() {
                    if !positions.is_empty() {
                        score += idf(at) * saturate(positions.len() as f64);
                    }
                }
                for (a, b) in &self.pairs {
                    let adjacent = doc.adjacent(*a, *b);
                    if adjacent > 0 {
                        score += ADJACENT_WEIGHT * idf(*a).min(idf(*b)) * saturate(adjacent as f64);
                    }
                }
                score
            })
            .collect()
    }
}

/// A tsquery operand: the lexeme in single quotes, taken as is.
fn quote(lexeme: &str) -> String {
    format!("'{}'", lexeme.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(words: &[&str], phrases: &[&str], excluded: &[&str]) -> Query {
        let owned = |list: &[&str]| list.iter().map(|t| t.to_string()).collect();
        Query {
            words: owned(words),
            phrases: owned(phrases),
            excluded: owned(excluded),
            meaning: String::new(),
        }
    }

    #[test]
    fn normalised_queries_are_kept_whole_or_not_at_all() {
        let normalized = Normalized::default();
        let first = query(&["deploying"], &["setup guide"], &["staging"]);
        let texts = vec!["deploying".to_owned(), "setup guide".to_owned()];
        assert!(normalized.get(&texts, &first).is_none());
        normalized.keep(
            &texts,
            &first,
            &Normal {
                lexemes: vec!["deploy".into(), "setup guid".into()],
                words: vec!["'deploy'".into()],
                phrases: vec!["'setup' <-> 'guid'".into()],
                excluded: vec!["'stage'".into()],
            },
        );
        let kept = normalized.get(&texts, &first).expect("all parts kept");
        assert_eq!(kept.lexemes, ["deploy", "setup guid"]);
        assert_eq!(kept.phrases, ["'setup' <-> 'guid'"]);
        assert_eq!(kept.excluded, ["'stage'"]);
        let plan = Plan::build(&first, &kept).expect("words to look for");
        assert_eq!(plan.terms, ["deploy", "setup", "guid"]);
        assert_eq!(
            plan.tsquery,
            "('deploy') & ('setup' <-> 'guid') & !('stage')"
        );

        // One part never seen: the whole query goes to Postgres.
        let second = query(&["deploying", "rollback"], &[], &[]);
        let texts = vec!["deploying".to_owned(), "rollback".to_owned()];
        assert!(normalized.get(&texts, &second).is_none());
        // A word or phrase seen once serves as an exclusion too: each is
        // kept as its phrase.
        for seen in ["setup guide", "deploying"] {
            assert!(normalized.get(&[], &query(&[], &[], &[seen])).is_some());
        }
        assert!(
            normalized
                .get(&[], &query(&[], &[], &["rollback"]))
                .is_none()
        );
    }

    /// A word of several lexemes is one alternative, its phrase, as SQLite
    /// reads a quoted word; its lexemes still score and pair.
    #[test]
    fn a_word_of_several_lexemes_is_its_phrase() {
        let q = query(&["deploy", "user 42"], &[], &[]);
        let normal = Normal {
            lexemes: vec!["deploy".into(), "user 42".into()],
            words: vec!["'deploy'".into(), "'user' <-> '42'".into()],
            phrases: vec![],
            excluded: vec![],
        };
        let plan = Plan::build(&q, &normal).expect("words to look for");
        assert_eq!(plan.tsquery, "('deploy' | ('user' <-> '42'))");
        assert_eq!(plan.terms, ["deploy", "user", "42"]);
        assert_eq!(plan.pairs, [(0, 1), (1, 2)]);
    }

    #[test]
    fn the_normalised_words_kept_are_bounded() {
        let normalized = Normalized::default();
        let empty = query(&[], &[], &[]);
        for n in 0..NORMALIZED + 5 {
            let word = format!("w{n}");
            let normal = Normal {
                lexemes: vec![word.clone()],
                words: vec![],
                phrases: vec![],
                excluded: vec![],
            };
            normalized.keep(&[word], &empty, &normal);
        }
        assert!(normalized.maps().lexemes.len() <= NORMALIZED);
        let last = format!("w{}", NORMALIZED + 4);
        assert!(normalized.get(&[last], &empty).is_some());
    }

    #[test]
    fn quotes_operands() {
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote("a\\b"), "'a\\\\b'");
    }
}
