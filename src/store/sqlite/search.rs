//! Search on SQLite: an FTS5 expression over each source's FTS table
//! (kept by the triggers of migration 0007), scored by BM25 in Rust from
//! each match's counts ([`fts`]'s `engram_hits`) and the
//! statistics of the caller's own items, snippets made in Rust as on
//! Postgres ([`crate::search::snippet`]).
//! FTS5's own `bm25()` counted every tenant's rows in its statistics, so
//! one tenant's scores, and the order of close hits, moved with what other
//! tenants wrote. Unquoted words are alternatives; each pair of
//! neighbouring words is also looked for as a phrase, so an item with the
//! words side by side outranks one with them scattered. Each FTS row also
//! holds its owner as tokens (its tenant, and its user or memory scope;
//! migrations 0011 and 0012), so a search reads only its owner's matches
//! rather than every tenant's.

use std::collections::HashMap;

use super::SqliteStore;
use super::fts::{self, HITS};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::ports::Feed;
use crate::search::english;
use crate::search::ports::SearchStore;
use crate::search::snippet::{Case, snippet, word_ranges};
use crate::search::{Filters, Hit, Item, Query, Source};
use crate::store::search::{
    Bounds, MATCHES, best, bm25, columns, conditions, item, population, width,
};
use crate::store::sql::{Backend, Cols, Dialect, Param, Run, without_casts};

/// How a source is searched: its FTS table, how an FTS row joins the
/// item's tables (at the item's current version), and how an item is read
/// again by the id its FTS row has.
struct Table {
    fts: &'static str,
    joins: &'static str,
    /// The item's tables, for reading the hits by `id`: the table of `id`
    /// first by its row id alone (`NOT INDEXED` leaves SQLite only the row
    /// id), the others joined to it in order. Without planner statistics
    /// SQLite had read a user's episodes by their index on the user and
    /// kept those among the hits: every episode of the user for 10 hits.
    items: &'static str,
    /// The column of `items` that equals an FTS row's `rowid`.
    id: &'static str,
}

fn table(source: Source) -> Table {
    match source {
        Source::Memory => Table {
            fts: "memory_fts",
            joins: "CROSS JOIN memory_search_ids i ON i.id = memory_fts.rowid \
                    CROSS JOIN memory_heads h ON h.tenant = i.tenant AND h.scope_type = i.scope_type \
                    AND h.scope = i.scope AND h.key = i.key AND h.version = memory_fts.version \
                    CROSS JOIN memory_versions v ON v.tenant = h.tenant AND v.scope_type = h.scope_type \
                    AND v.scope = h.scope AND v.key = h.key AND v.version = h.version",
            items: "memory_search_ids i NOT INDEXED \
                    CROSS JOIN memory_heads h ON h.tenant = i.tenant AND h.scope_type = i.scope_type \
                    AND h.scope = i.scope AND h.key = i.key \
                    CROSS JOIN memory_versions v ON v.tenant = h.tenant AND v.scope_type = h.scope_type \
                    AND v.scope = h.scope AND v.key = h.key AND v.version = h.version",
            id: "i.id",
        },
        Source::Facts => Table {
            fts: "facts_fts",
            joins: "CROSS JOIN fact_search_ids i ON i.id = facts_fts.rowid \
                    CROSS JOIN facts f ON f.tenant = i.tenant AND f.id = i.fact_id \
                    AND f.version = facts_fts.version \
                    CROSS JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id \
                    AND v.version = f.version",
            items: "fact_search_ids i NOT INDEXED \
                    CROSS JOIN facts f ON f.tenant = i.tenant AND f.id = i.fact_id \
                    CROSS JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id \
                    AND v.version = f.version",
            id: "i.id",
        },
        Source::Episodes => Table {
            fts: "episodes_fts",
            joins: "CROSS JOIN episodes e ON e.cursor = episodes_fts.rowid",
            items: "episodes e NOT INDEXED",
            id: "e.cursor",
        },
    }
}

impl SearchStore for SqliteStore {
    async fn search(
        &self,
        tenant: &Tenant,
        sources: &[Source],
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let Some(expression) = expression(query) else {
            return Ok(Vec::new()); // only stop words
        };
        let bounds = Bounds::of(filters);
        let ask = Ask {
            expression: &expression,
            terms: &terms(query),
            runs: &query.cluster_runs(),
            bounds: &bounds,
            tenant,
            filters,
        };
        // One snapshot for the matches and the hits read after them, of
        // every source.
        let mut tx = self.reader.begin().await?;
        let mut found = Vec::new();
        for &source in sources {
            found.extend(matches(&mut tx, &ask, source).await?);
        }
        let counts: Vec<(i64, Vec<i64>)> = found.iter().map(|m| (m.n, m.df())).collect();
        let idf = bm25::pooled(&counts);
        let scored: Vec<Vec<(f64, i64)>> = found.iter().map(|m| scored(&m.matches, &idf)).collect();
        let mut hits = Vec::with_capacity(limit);
        for (m, chosen) in found.iter().zip(best(&scored, limit)) {
            if !chosen.is_empty() {
                hits.extend(read(&mut tx, &ask, m.source, chosen).await?);
            }
        }
        tx.rollback().await?;
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(hits)
    }

    /// Merges each FTS table's segments step by step (FTS5's `merge`
    /// command with a negative page count, which merges segments of any
    /// level, [`MERGE_STEPS`]) until a step finds nothing to merge. Each
    /// step is its own write and takes the writer connection only for
    /// itself, so writes go on between steps; once one has, the merge
    /// stops and leaves the rest to the next pause. Returns the rows of FTS
    /// data written.
    async fn merge_search_pending(&self) -> Result<u64> {
        let start = self.search_writes().await?;
        let mut written = 0;
        for merge in MERGE_STEPS {
            loop {
                if self.search_writes().await? != start {
                    return Ok(written);
                }
                let mut conn = self.system_writer().await?;
                let before = total_changes(&mut conn).await?;
                sqlx::query(merge).execute(&mut *conn).await?;
                // FTS5 changes fewer than two rows when there was nothing
                // to merge.
                let changed = total_changes(&mut conn).await? - before;
                if changed < 2 {
                    break;
                }
                written += changed.max(0) as u64;
            }
        }
        Ok(written)
    }

    /// The feeds' committed positions plus the newest fact version's row
    /// id: memory writes and deletes move the change feed, appends the
    /// episode cursor, and every fact written adds a version (one process
    /// owns the file, so the feeds are exact and immediate; the row id is
    /// the b-tree's last key, one page read).
    async fn search_writes(&self) -> Result<i64> {
        let at = |feed: Feed| *self.horizons[feed as usize].borrow();
        let mut conn = self.system().await?;
        let facts: i64 = sqlx::query_scalar(LAST_FACT_VERSION)
            .fetch_one(&mut *conn)
            .await?;
        Ok(at(Feed::Changes) + at(Feed::Episodes) + facts)
    }
}

/// The row id of the newest fact version, 0 with none.
const LAST_FACT_VERSION: &str = "SELECT coalesce(max(rowid), 0) FROM fact_versions";

/// One merge step of each FTS table: about 500 pages (2 MB) of merged
/// data, from segments of any level (the negative count).
const MERGE_STEPS: [&str; 3] = [
    "INSERT INTO episodes_fts (episodes_fts, rank) VALUES ('merge', -500)",
    "INSERT INTO memory_fts (memory_fts, rank) VALUES ('merge', -500)",
    "INSERT INTO facts_fts (facts_fts, rank) VALUES ('merge', -500)",
];

/// `total_changes()` of the connection: every row it has changed.
async fn total_changes(conn: &mut sqlx::SqliteConnection) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT total_changes()")
        .fetch_one(conn)
        .await?)
}

/// A search as each source's statements take it.
#[derive(Clone, Copy)]
struct Ask<'a> {
    /// The FTS5 expression of the query's words ([`expression`]).
    expression: &'a str,
    /// The lexemes snippets mark ([`terms`]).
    terms: &'a [String],
    /// The runs of clusters snippets mark ([`Query::cluster_runs`]).
    runs: &'a [Vec<String>],
    bounds: &'a Bounds,
    tenant: &'a Tenant,
    filters: &'a Filters,
}

/// The lexemes a hit's snippet marks: each word of the query's words and
/// phrases (as snippets read the text: [`word_ranges`]) but the stop
/// words, as the `english` configuration normalises it.
fn terms(query: &Query) -> Vec<String> {
    query
        .words
        .iter()
        .chain(&query.phrases)
        .flat_map(|text| word_ranges(text).into_iter().map(|r| &text[r]))
        .filter(|word| !english::is_stop_word(&word.to_lowercase()))
        .map(english::lexeme)
        .collect()
}

/// One source's matches and BM25's `n` for them ([`bm25::items`]).
struct Matched {
    source: Source,
    matches: Vec<Match>,
    n: i64,
}

impl Matched {
    /// Each phrase's document frequency among the matches, by its place
    /// in the expression (the owner's, phrase 0, included).
    fn df(&self) -> Vec<i64> {
        let phrases = self.matches.iter().map(|m| m.counts.len()).max();
        (0..phrases.unwrap_or(0))
            .map(|p| {
                let df = self
                    .matches
                    .iter()
                    .filter(|m| m.counts.get(p).is_some_and(|c| *c > 0))
                    .count();
                i64::try_from(df).unwrap_or(i64::MAX)
            })
            .collect()
    }
}

/// Every match of one source (up to [`MATCHES`]) with its row id and
/// counts, and the number of items the filters allow (BM25's `n`,
/// [`population`]); `None` when nothing matched.
///
/// A search is two statements per source: this one, after which each
/// match is scored here (a phrase's document frequency is how many of
/// the matches hold it, pooled over the sources searched, as on
/// Postgres), and [`read`], which reads whole only the items returned, of
/// the sources that have any.
async fn matches(
    conn: &mut impl Run<Row = sqlx::sqlite::SqliteRow>,
    ask: &Ask<'_>,
    source: Source,
) -> Result<Option<Matched>> {
    let Ask {
        expression,
        bounds,
        tenant,
        filters,
        ..
    } = *ask;
    let Table { fts, joins, .. } = table(source);
    // Narrowed to the owner by the index (migrations 0011 and 0012). The
    // owner is phrase 0; its tokens are in their own column, which
    // `engram_hits` does not count.
    let expression = format!(
        "owner : \"{}\" AND text : {expression}",
        owner_token(source, tenant, filters)
    );
    let filter = conditions(source, Dialect::Sqlite, tenant, filters, bounds, 2);
    let mut params = vec![Param::Text(&expression)];
    params.extend(filter.params.iter().copied());
    let n = population(source, tenant, filters, &filter.sql, &mut params);
    // One session's episodes lie between its first and last cursor (the
    // FTS rows' ids), a range FTS5 seeks to: the owner token is the
    // tenant's, whose matches in the whole tenant would be read otherwise.
    let within = match (source, &filters.session_id) {
        (Source::Episodes, Some(session)) => {
            params.push(Param::Text(tenant.as_str()));
            params.push(Param::Text(session.as_str()));
            let (t, s) = (params.len() - 1, params.len());
            let end = |f: &str| {
                format!(
                    "(SELECT {f}(cursor) FROM episodes WHERE tenant = ${t} AND session_id = ${s})"
                )
            };
            format!(
                " AND {fts}.rowid >= {} AND {fts}.rowid <= {}",
                end("min"),
                end("max")
            )
        }
        _ => String::new(),
    };
    // The FTS table first, by CROSS JOIN (which SQLite never reorders):
    // without statistics the planner read the filters' rows first (a
    // session's or a user's episodes) and asked FTS5 for each of them
    // again, every time parsing the query and walking the owner's rows
    // to it. A three-word search of a session of 3,000 episodes took
    // 390 ms that way, 3 ms this way.
    let sql = format!(
        "SELECT {n}, {fts}.rowid, {HITS}({fts}) FROM {fts} {joins} \
         WHERE {fts} MATCH $1{within} AND {w} LIMIT {MATCHES}",
        w = filter.sql
    );
    let rows = conn.rows_built(sql, &params).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let n = first.int(0)?;
    let matches: Vec<Match> = rows
        .iter()
        .map(|row| {
            let (length, counts) = fts::decode(&row.bytes(2)?)
                .ok_or_else(|| Error::internal("a match's counts are malformed"))?;
            Ok(Match {
                id: row.int(1)?,
                length,
                counts,
            })
        })
        .collect::<Result<_>>()?;
    Ok(Some(Matched {
        source,
        n: bm25::items(n, matches.len()),
        matches,
    }))
}

/// The `chosen` matches of `source` (each a score and a row id), read
/// whole, those still current and live, in the order given.
async fn read(
    conn: &mut impl Run<Row = sqlx::sqlite::SqliteRow>,
    ask: &Ask<'_>,
    source: Source,
    chosen: Vec<(f64, i64)>,
) -> Result<Vec<Hit>> {
    let Ask {
        terms,
        runs: clusters,
        bounds,
        tenant,
        filters,
        ..
    } = *ask;
    let Table { items, id, .. } = table(source);
    let filter = conditions(source, Dialect::Sqlite, tenant, filters, bounds, 2);
    // The hits whole, by id, with the same conditions (numbered from $2
    // again), in the snapshot the matches were read in, so each is still
    // current and live. Reading them through FTS5 again, for its
    // `snippet()`, cost about as much as finding the matches (the words'
    // lists read a second time); the snippets are made in Rust, as on
    // Postgres. Best first, and only as far as an answer carries
    // (`built_weighed`): a hundred hits of a megabyte are not all held at
    // once. The ids' array drives the join (its columns renamed, since
    // `json_each` has an `id` and a `type` of its own); SQLite's sorter,
    // which puts them back in order, keeps little in memory and spills
    // the rest.
    let ids: Vec<String> = chosen.iter().map(|(_, id)| id.to_string()).collect();
    let ids = format!("[{}]", ids.join(","));
    let sql = format!(
        "SELECT {columns}, {id} \
         FROM (SELECT key AS place, value AS chosen FROM json_each($1)) AS c \
         CROSS JOIN {items} WHERE {id} = c.chosen AND {w} ORDER BY c.place",
        columns = without_casts(columns(source)),
        w = filter.sql
    );
    let mut params = vec![Param::Text(&ids)];
    params.extend(filter.params.iter().copied());
    let at = width(source);
    let read = conn
        .built_weighed(sql, &params, |row| Ok((row.int(at)?, item(source, row)?)))
        .await?;
    let mut found: HashMap<i64, Item> = read.into_iter().collect();
    Ok(chosen
        .into_iter()
        .filter_map(|(score, id)| {
            let item = found.remove(&id)?;
            Some(Hit {
                score,
                snippet: snippet(&item.visible_text(), terms, clusters, Case::Unicode),
                item,
            })
        })
        .collect())
}

/// What `engram_hits` gives of a match: its text's length in tokens and
/// each phrase's occurrences in it, by the phrase's place in the
/// expression.
#[derive(Clone)]
struct Match {
    id: i64,
    length: u32,
    counts: Vec<u32>,
}

/// Each match's BM25 score with its row id, best first (the row id breaks
/// ties, oldest first), with each phrase's weight `idf`
/// ([`bm25::pooled`]). Every phrase but the owner's (phrase 0) is a term:
/// each word, each pair of neighbouring words, each quoted phrase.
fn scored(matches: &[Match], idf: &[f64]) -> Vec<(f64, i64)> {
    let total: f64 = matches.iter().map(|m| f64::from(m.length.max(1))).sum();
    let average = total / matches.len().max(1) as f64;
    let mut scored: Vec<(f64, i64)> = matches
        .iter()
        .map(|m| {
            let saturate = bm25::saturation(m.length.max(1) as usize, average);
            let score = m
                .counts
                .iter()
                .zip(idf)
                .skip(1)
                .filter(|(count, _)| **count > 0)
                .map(|(count, idf)| idf * saturate(f64::from(*count)))
                .sum();
            (score, m.id)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored
}

/// The token of a row's `owner` column (migrations 0011 and 0012) that a
/// search matches: the narrowest its filters name. `t<hex>x` is a
/// tenant's rows; `u<hex>x` one user's episodes or facts (the tenant and
/// the user); `s<hex>x` one memory scope (the tenant, the scope type in
/// decimal and the scope). Hex of the UTF-8 bytes with the parts joined by
/// a NUL, as SQLite's `hex()` writes them.
fn owner_token(source: Source, tenant: &Tenant, filters: &Filters) -> String {
    let token = |kind: char, parts: &[&str]| -> String {
        let hex: String = parts
            .join("\0")
            .bytes()
            .map(|b| format!("{b:02X}"))
            .collect();
        format!("{kind}{hex}x")
    };
    let tenant = tenant.as_str();
    match (source, &filters.user, filters.scope_type, &filters.scope) {
        (Source::Episodes | Source::Facts, Some(user), _, _) => {
            token('u', &[tenant, user.as_str()])
        }
        (Source::Memory, _, Some(scope_type), Some(scope)) => token(
            's',
            &[tenant, &scope_type.as_i16().to_string(), scope.as_str()],
        ),
        _ => token('t', &[tenant]),
    }
}

/// Whether a query word or phrase holds only English stop words
/// (Postgres's `english` list) once split into runs of letters and
/// digits, as Postgres reads it: dropped from a query as Postgres drops
/// it, since FTS5 keeps every word, and "what", "the" and "of" match most
/// turns of a conversation.
fn is_stop_word(text: &str) -> bool {
    runs(text).iter().all(|&(_, _, stop)| stop)
}

/// The runs of letters and digits of `text`: where each starts and ends,
/// and whether it is an English stop word.
fn runs(text: &str) -> Vec<(usize, usize, bool)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (at, c) in text.char_indices().chain([(text.len(), ' ')]) {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(at),
            (false, Some(from)) => {
                let stop = english::is_stop_word(&text[from..at].to_lowercase());
                runs.push((from, at, stop));
                start = None;
            }
            _ => {}
        }
    }
    runs
}

/// An FTS5 string: the text in double quotes, which FTS5 tokenizes into a
/// phrase (so `user_42` is the phrase `user 42`), without the stop words
/// it starts or ends with. Postgres drops those from a phrase, but FTS5
/// indexes every word, so `"Lucia's"` was the phrase `lucia s` and found
/// no "Lucia" without the `'s`, where Postgres looks for `lucia`; a stop
/// word inside stays, where Postgres keeps its place.
fn string(text: &str) -> String {
    format!("\"{}\"", trimmed(text).replace('"', "\"\""))
}

/// `text` without the stop words before its first other word and after
/// its last ([`runs`], as [`is_stop_word`] reads them),
/// cut right after and right before them, so that what clings to a kept
/// word stays (the sign of `-5`); all of it when every word is one.
fn trimmed(text: &str) -> &str {
    let runs = runs(text);
    let (Some(first), Some(last)) = (
        runs.iter().position(|r| !r.2),
        runs.iter().rposition(|r| !r.2),
    ) else {
        return text;
    };
    let from = first.checked_sub(1).map_or(0, |before| runs[before].1);
    let to = runs.get(last + 1).map_or(text.len(), |after| after.0);
    &text[from..to]
}

/// `((w1 OR w2 OR "w1 w2") AND "phrase") NOT "excluded"`, without the
/// stop words, the phrases and the exclusions that hold nothing else;
/// `None` when nothing is left to look for, where Postgres finds nothing.
fn expression(query: &Query) -> Option<String> {
    let words: Vec<&String> = query.words.iter().filter(|w| !is_stop_word(w)).collect();
    let phrases: Vec<&String> = query.phrases.iter().filter(|p| !is_stop_word(p)).collect();
    if words.is_empty() && phrases.is_empty() {
        return None;
    }
    let mut any: Vec<String> = words.iter().map(|w| string(w)).collect();
    // Neighbours in the query (with no stop word between) as phrases.
    any.extend(
        query
            .words
            .windows(2)
            .filter(|pair| !is_stop_word(&pair[0]) && !is_stop_word(&pair[1]))
            .map(|pair| string(&format!("{} {}", pair[0], pair[1]))),
    );
    let mut required: Vec<String> = Vec::new();
    if !any.is_empty() {
        required.push(format!("({})", any.join(" OR ")));
    }
    required.extend(phrases.iter().map(|p| string(p)));
    let mut expression = format!("({})", required.join(" AND "));
    for x in query.excluded.iter().filter(|x| !is_stop_word(x)) {
        expression = format!("({expression} NOT {})", string(x));
    }
    Some(expression)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(id: i64, length: u32, counts: &[u32]) -> Match {
        Match {
            id,
            length,
            counts: counts.to_vec(),
        }
    }

    /// The matches scored as a search of their source alone scores them.
    fn alone(matches: &[Match], n: i64) -> Vec<(f64, i64)> {
        let matched = Matched {
            source: Source::Episodes,
            matches: matches.to_vec(),
            n,
        };
        scored(matches, &bm25::pooled(&[(n, matched.df())]))
    }

    #[test]
    fn matches_score_by_their_own_statistics() {
        // Phrase 0 is the owner's: counted or not, it weighs nothing.
        let matches = [
            at(1, 10, &[0, 1, 0]), // the common word
            at(2, 10, &[5, 1, 0]),
            at(3, 10, &[0, 0, 1]), // the rare one
            at(4, 10, &[0, 1, 1]), // both
        ];
        let ranked = alone(&matches, 100);
        let ids: Vec<i64> = ranked.iter().map(|(_, id)| *id).collect();
        assert_eq!(ids, [4, 3, 1, 2], "both, the rare word, then ties by id");
        assert_eq!(ranked[2].0, ranked[3].0, "the owner's count adds nothing");
        assert!(ranked[1].0 > ranked[2].0, "the rarer word weighs more");
        // More items the filters allow: every word rarer, every score higher.
        let wider = alone(&matches, 1_000);
        assert!(
            wider
                .iter()
                .zip(&ranked)
                .all(|(w, r)| w.1 == r.1 && w.0 > r.0)
        );
        // A shorter item ranks first among equals.
        let short = alone(&[at(1, 20, &[0, 1]), at(2, 5, &[0, 1])], 10);
        assert_eq!(short[0].1, 2);
        assert!(alone(&[], 10).is_empty());
    }

    #[test]
    fn snippet_terms_are_the_words_lexemes() {
        let query = Query::parse(
            "query",
            r#"Deploying the user_42 "blue-green setups" 3.14 -staging"#,
        )
        .expect("valid");
        assert_eq!(
            terms(&query),
            ["deploy", "user", "42", "3.14", "blue", "green", "setup"]
        );
    }

    #[test]
    fn stop_words_go_and_nothing_is_looked_for_without_others() {
        let query = Query::parse("query", "What is the name of Jon's pet?").expect("valid");
        assert_eq!(
            expression(&query).as_deref(),
            Some(r#"(("name" OR "Jon'" OR "pet?" OR "Jon's pet?"))"#)
        );
        for only in ["the who", "don't", r#""of the" -it"#] {
            let query = Query::parse("query", only).expect("valid");
            assert_eq!(expression(&query), None, "{only}");
        }
        let ignored = Query::parse("query", r#"pet "the" -who"#).expect("valid");
        assert_eq!(expression(&ignored).as_deref(), Some(r#"(("pet"))"#));
    }

    #[test]
    fn phrases_lose_the_stop_words_at_their_ends() {
        assert_eq!(trimmed("Lucia's"), "Lucia'");
        assert_eq!(trimmed("the staging cluster"), " staging cluster");
        assert_eq!(trimmed("-5"), "-5");
        assert_eq!(trimmed("it's -5 now"), " -5 ");
        assert_eq!(trimmed("state-of-the-art"), "state-of-the-art");
        assert_eq!(trimmed("user_42"), "user_42");
        assert_eq!(trimmed("of the"), "of the");
        let query = Query::parse("query", r#"Jon's pet "the blue green" -cat's"#).expect("valid");
        assert_eq!(
            expression(&query).as_deref(),
            Some(r#"((("Jon'" OR "pet" OR "Jon's pet") AND " blue green") NOT "cat'")"#)
        );
    }

    #[test]
    fn expressions_quote_every_term() {
        let query = Query::parse("query", r#"deploy setup "blue green" -stag"ing"#).expect("valid");
        assert_eq!(
            expression(&query).as_deref(),
            Some(r#"((("deploy" OR "setup" OR "deploy setup") AND "blue green") NOT "stag""ing")"#)
        );
    }
}
