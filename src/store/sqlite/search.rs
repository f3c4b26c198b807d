//! Search on SQLite: an FTS5 expression over each source's FTS table
//! (kept by the triggers of migration 0007), ranked by FTS5's `bm25()`,
//! snippets by its `snippet()`. Unquoted words are alternatives; each pair
//! of neighbouring words is also looked for as a phrase, so an item with
//! the words side by side outranks one with them scattered. Each FTS row
//! also holds its owner as tokens (its tenant, and its user or memory
//! scope; migrations 0011 and 0012), so a search reads only its owner's
//! matches rather than every tenant's.

use super::SqliteStore;
use crate::context::Tenant;
use crate::error::Result;
use crate::ports::Feed;
use crate::search::english;
use crate::search::ports::SearchStore;
use crate::search::{Filters, Hit, Query, Source};
use crate::store::search::{Bounds, columns, conditions, item, width};
use crate::store::sql::{Backend, Cols, Dialect, Param, Run, without_casts};

/// The FTS table of a source and how its rows join the source's tables.
fn table(source: Source) -> (&'static str, &'static str) {
    match source {
        Source::Memory => (
            "memory_fts",
            "JOIN memory_search_ids i ON i.id = memory_fts.rowid \
             JOIN memory_heads h ON h.tenant = i.tenant AND h.scope_type = i.scope_type \
             AND h.scope = i.scope AND h.key = i.key AND h.version = memory_fts.version \
             JOIN memory_versions v ON v.tenant = h.tenant AND v.scope_type = h.scope_type \
             AND v.scope = h.scope AND v.key = h.key AND v.version = h.version",
        ),
        Source::Facts => (
            "facts_fts",
            "JOIN fact_search_ids i ON i.id = facts_fts.rowid \
             JOIN facts f ON f.tenant = i.tenant AND f.id = i.fact_id \
             AND f.version = facts_fts.version \
             JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id \
             AND v.version = f.version",
        ),
        Source::Episodes => (
            "episodes_fts",
            "JOIN episodes e ON e.cursor = episodes_fts.rowid",
        ),
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
        let expression = expression(query);
        let bounds = Bounds::of(filters);
        let mut conn = self.reader(tenant).await?;
        let mut hits = Vec::new();
        for &source in sources {
            hits.extend(
                ranked(
                    &mut conn,
                    &expression,
                    &bounds,
                    tenant,
                    source,
                    filters,
                    limit,
                )
                .await?,
            );
        }
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

/// The best `limit` items of one source, scored by FTS5's bm25().
async fn ranked(
    conn: &mut impl Run<Row = sqlx::sqlite::SqliteRow>,
    expression: &str,
    bounds: &Bounds,
    tenant: &Tenant,
    source: Source,
    filters: &Filters,
    limit: usize,
) -> Result<Vec<Hit>> {
    let filter = conditions(source, Dialect::Sqlite, tenant, filters, bounds, 3);
    let (fts, joins) = table(source);
    // Narrowed to the owner by the index (migrations 0011 and 0012); the
    // owner column weighs nothing in bm25(): its weight is the third
    // column's for memory and facts (after `version`), the second's for
    // episodes.
    let expression = format!(
        "owner : \"{}\" AND text : {expression}",
        owner_token(source, tenant, filters)
    );
    let rank = match source {
        Source::Episodes => format!("bm25({fts}, 1.0, 0.0)"),
        Source::Memory | Source::Facts => format!("bm25({fts}, 1.0, 0.0, 0.0)"),
    };
    let sql = format!(
        "SELECT {columns}, -{rank}, snippet({fts}, 0, '**', '**', '…', 24) \
             FROM {fts} {joins} WHERE {fts} MATCH $1 AND {w} ORDER BY {rank} LIMIT $2",
        columns = without_casts(columns(source)),
        w = filter.sql
    );
    let mut params = vec![
        Param::Text(&expression),
        Param::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
    ];
    params.extend(filter.params.iter().copied());
    let rows = conn.rows_built(sql, &params).await?;
    let at = width(source);
    rows.iter()
        .map(|row| {
            Ok(Hit {
                score: row.float(at)?,
                snippet: row.text(at + 1)?,
                item: item(source, row)?,
            })
        })
        .collect()
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

/// Whether a query word is an English stop word (Postgres's `english`
/// list), dropped from a query's optional words as Postgres drops them:
/// FTS5 keeps every word, and "what", "the" and "of" match most turns of a
/// conversation. Case and surrounding punctuation aside.
fn is_stop_word(word: &str) -> bool {
    let lower = word.to_lowercase();
    english::is_stop_word(lower.trim_matches(|c: char| !c.is_alphanumeric()))
}

/// An FTS5 string: the text in double quotes, which FTS5 tokenizes into a
/// phrase (so `user_42` is the phrase `user 42`).
fn string(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// `((w1 OR w2 OR "w1 w2") AND "phrase") NOT "excluded"`.
fn expression(query: &Query) -> String {
    // Stop words go, unless nothing else is left to look for.
    let words: Vec<&String> = match query
        .words
        .iter()
        .filter(|w| !is_stop_word(w))
        .collect::<Vec<_>>()
    {
        kept if kept.is_empty() && query.phrases.is_empty() => query.words.iter().collect(),
        kept => kept,
    };
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
    required.extend(query.phrases.iter().map(|p| string(p)));
    let mut expression = format!("({})", required.join(" AND "));
    for x in &query.excluded {
        expression = format!("({expression} NOT {})", string(x));
    }
    expression
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_go_unless_nothing_else_is_left() {
        let query = Query::parse("query", "What is the name of Jon's pet?").expect("valid");
        assert_eq!(
            expression(&query),
            r#"(("name" OR "Jon's" OR "pet?" OR "Jon's pet?"))"#
        );
        let only = Query::parse("query", "the who").expect("valid");
        assert_eq!(expression(&only), r#"(("the" OR "who"))"#);
    }

    #[test]
    fn expressions_quote_every_term() {
        let query = Query::parse("query", r#"deploy setup "blue green" -stag"ing"#).expect("valid");
        assert_eq!(
            expression(&query),
            r#"((("deploy" OR "setup" OR "deploy setup") AND "blue green") NOT "stag""ing")"#
        );
    }
}
