//! Search on Postgres: a tsquery over the `search` vectors (GIN; a
//! column of episodes, built by the server or a trigger (migration 0017,
//! [`crate::search::vector`]), and for memory and facts one row per live
//! key or fact in `memory_search` and `fact_search`, kept by triggers,
//! migration 0016), BM25 in Rust over the matches, snippets of the
//! hits returned made in Rust ([`crate::search::snippet`]).
//!
//! Why BM25 here rather than `ts_rank`: `ts_rank` counts how often the
//! words occur but not how rare they are, so a common word repeated
//! outranks the one rare word the question is about; it is also the costly
//! part of a search over many matches. BM25 needs document frequencies.
//! Keeping term statistics on every write would cost the append path, and
//! Postgres's own (`pg_stats`) are hidden under row-level security, so the
//! search statement takes them from what it reads anyway: a word's
//! document frequency is how many of the matches hold it (matches are
//! bounded by [`MATCHES`], the bound on a query with no narrowing filter),
//! and the number of items the filters allow is counted without reading
//! any vector (for episodes, from their sessions' counts; see
//! [`population`]). Every match is scored with BM25 from its vector (cut
//! down to the query's terms by Postgres), plus a bonus for query words
//! that stand next to each other in the item (so an exact phrase beats the
//! same words scattered), and only the best `limit` are then read whole
//! ([`Matches::read`]).
//!
//! How a query becomes the tsquery that selects the matches and the
//! lexemes BM25 weighs is [`plan`]'s part.

use std::collections::HashMap;

use sqlx::Row;

mod plan;

pub(super) use plan::Normalized;
use plan::Plan;

use super::PgStore;
use super::pool::Lease;
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::search::ports::SearchStore;
use crate::search::snippet::{Case, snippet};
use crate::search::{Filters, Hit, Item, Query, Source};
use crate::store::search::{
    Bounds, MATCHES, best, bm25, columns, conditions, from, item, population, width,
};
use crate::store::sql::{Backend, Cols, Dialect, Param, Run, Sql};

/// How much a pair of query words found side by side adds, relative to
/// the rarer word's weight.
const ADJACENT_WEIGHT: f64 = 0.5;

/// How a source is searched: the tables and conditions' aliases, the
/// vector column, and the columns that name an item, with their types.
struct Table {
    from: &'static str,
    vector: &'static str,
    /// The item's identity: each column and its Postgres type.
    keys: &'static [(&'static str, &'static str)],
}

/// A memory item's identity, under the heads' alias. Without the version:
/// the hits are read whole by a second statement, which sees what was
/// committed since the matches were read, and a key written in between
/// is its current version there. With the version in its identity such
/// a key was not found again and dropped from the hits, although live
/// (the robustness test's searches missed keys written just before them,
/// under concurrent writes to the same keys). A key deleted in between is
/// dropped, as it is no longer live.
const MEMORY_KEYS: &[(&str, &str)] = &[
    ("h.scope_type", "int2"),
    ("h.scope", "text"),
    ("h.key", "text"),
];

fn table(source: Source, filters: &Filters) -> Table {
    match source {
        // memory_search holds exactly the live keys, each at its current
        // version with that version's vector (migration 0016), so the
        // matches are read from it alone, under the heads' alias and with
        // the heads' `deleted` false: the filters' conditions name the
        // same columns. Joined to the heads, a generic plan looked up each
        // match's head by its key, whatever the number of matches: a word
        // held by all 10,002 keys took 43 ms (`EXPLAIN ANALYZE`), against
        // 16 from memory_search alone. A time filter names the head's
        // update time, so it keeps the join.
        Source::Memory if filters.start.is_none() && filters.end.is_none() => Table {
            from: "(SELECT *, false AS deleted FROM memory_search) h",
            vector: "h.search",
            keys: MEMORY_KEYS,
        },
        // The current versions' vectors (migration 0016): older versions
        // are not read.
        Source::Memory => Table {
            from: "memory_heads h JOIN memory_search s USING (tenant, scope_type, scope, key, version)",
            vector: "s.search",
            keys: MEMORY_KEYS,
        },
        Source::Facts => Table {
            from: "facts f JOIN fact_search s \
                   ON s.tenant = f.tenant AND s.fact_id = f.id AND s.version = f.version",
            vector: "s.search",
            // By id alone, for the reason given at [`MEMORY_KEYS`].
            keys: &[("f.id", "text")],
        },
        Source::Episodes => Table {
            from: from(Source::Episodes),
            vector: "e.search",
            keys: &[("e.cursor", "int8")],
        },
    }
}

impl SearchStore for PgStore {
    async fn search(
        &self,
        tenant: &Tenant,
        sources: &[Source],
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let in_rust = self.text_in_rust().await?;
        let mut conn = self.reader(tenant).await?;
        let Some(plan) = Plan::prepare(&mut conn, &self.normalized, query, in_rust).await? else {
            return Ok(Vec::new()); // only stop words
        };
        let bounds = Bounds::of(filters);
        let ask = (tenant, filters, &bounds);
        let mut found = Vec::new();
        for &source in sources {
            found.extend(matches(&mut conn, &plan, ask, source).await?);
        }
        let counts: Vec<(i64, Vec<i64>)> = found.iter().map(|m| (m.n, m.df.clone())).collect();
        let idf = bm25::pooled(&counts);
        // Each match's score with its place among its source's matches.
        let scored: Vec<Vec<(f64, usize)>> = found
            .iter()
            .map(|m| plan.bm25(&m.docs, &idf).into_iter().zip(0..).collect())
            .collect();
        let mut items = Vec::with_capacity(limit);
        for (m, chosen) in found.iter().zip(best(&scored, limit)) {
            if !chosen.is_empty() {
                items.extend(m.read(&mut conn, ask, &chosen).await?);
            }
        }
        items.sort_by(|a, b| b.0.total_cmp(&a.0));
        // Where the database lowercases ASCII otherwise (`I` to `ı`), the
        // terms are its own lexemes, and so must the hits' words be.
        let case = match in_rust {
            Some(_) => Case::Unicode,
            None => Case::Turkic,
        };
        let runs = query.cluster_runs();
        Ok(items
            .into_iter()
            .map(|(score, item)| Hit {
                score,
                snippet: snippet(&item.visible_text(), &plan.terms, &runs, case),
                item,
            })
            .collect())
    }

    async fn merge_search_pending(&self) -> Result<u64> {
        Ok(self.system_count(&MERGE_PENDING).await?.max(0) as u64)
    }

    async fn search_writes(&self) -> Result<i64> {
        self.system_count(&SEARCH_WRITES).await
    }
}

/// Merges the search indexes' pending lists (migration 0014); returns the
/// pages merged.
static MERGE_PENDING: Sql = Sql::new("SELECT engram_merge_search_pending()");

/// Rows written to the searchable tables, as Postgres's statistics count
/// them.
static SEARCH_WRITES: Sql = Sql::new(
    "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint \
     FROM pg_stat_user_tables \
     WHERE relid IN ('episodes'::regclass, 'memory_search'::regclass, \
     'fact_search'::regclass)",
);

impl PgStore {
    /// The one number a statement of the server's own work returns.
    async fn system_count(&self, sql: &'static Sql) -> Result<i64> {
        let mut conn = self.system().await?;
        conn.row(sql, &[])
            .await?
            .ok_or_else(|| Error::internal("a count returned no row"))?
            .int(0)
    }
}

/// Whose items a search reads, within which filters: the tenant, the
/// filters and their bounds, made once for every source.
type Ask<'a> = (&'a Tenant, &'a Filters, &'a Bounds);

/// One source's matches, each one's terms and identity, and their
/// statistics: BM25's `n` and each term's document frequency among them.
struct Matches {
    source: Source,
    keys: &'static [(&'static str, &'static str)],
    docs: Vec<Doc>,
    /// One list per key column, a match's identity at its index.
    identities: Vec<Vec<String>>,
    n: i64,
    df: Vec<i64>,
}

/// The matches of one source (bounded by [`MATCHES`]), each one's
/// identity, length and vector cut down to the query's terms, with the
/// number of items the filters allow; `None` when nothing matched.
///
/// A search is two statements per source: this one, after which BM25
/// scores every match here (a term's document frequency is how many of
/// the matches hold it, pooled over the sources searched), and
/// [`Matches::read`], which reads whole only the items returned, of the
/// sources that have any. Reading all candidates whole in the first cost
/// Postgres a second visit of each row and the printing of each one's
/// JSON, for most of them to be dropped (alternating runs of the bench's
/// `search`: 16 clients 810–956 → 873–934 ops/s, p99 58–75 → 53–55 ms;
/// one client p50 2.96, 3.14 → 2.31, 2.60 ms). The second reads by
/// identity and checks the filters and that the item is live again: an
/// item changed in between (a new version of a key or a fact, an
/// episode's embedding written) keeps its identity and is read as it is
/// now, and one removed in between is left out, as a search a moment
/// later would leave it.
async fn matches(
    conn: &mut Lease,
    plan: &Plan,
    (tenant, filters, bounds): Ask<'_>,
    source: Source,
) -> Result<Option<Matches>> {
    let Table { from, vector, keys } = table(source, filters);
    // Parameters: $1 the tsquery, $2 the terms, then the filters' and the
    // population's.
    let filter = conditions(source, Dialect::Postgres, tenant, filters, bounds, 3);
    let named: Vec<String> = (1..)
        .zip(keys)
        .map(|(at, (column, _))| format!("{column}::text AS i{at}"))
        .collect();
    let lists: Vec<String> = (1..=keys.len())
        .map(|at| format!("array_agg(i{at})"))
        .collect();
    let mut params = vec![Param::Text(&plan.tsquery), Param::TextList(&plan.terms)];
    params.extend(filter.params.iter().copied());
    let n = population(source, tenant, filters, &filter.sql, &mut params);
    // One session's episodes are read through the session's index and
    // each checked for the words, since a conversation is short: as an
    // index condition the words' entries of every session of every tenant
    // were read first (a generic plan ANDed the session's 50 episodes with
    // 112,960 matches: 24 ms, against 0.35 as a filter). `IS TRUE` keeps
    // the words' condition out of the index and means the same here.
    let matched = if source == Source::Episodes && filters.session_id.is_some() {
        format!("({vector} @@ $1::tsquery) IS TRUE")
    } else {
        format!("{vector} @@ $1::tsquery")
    };
    // The episodes' index holds the tenant, the user and the words
    // (migration 0023). A search by user reads the user's entry and the
    // words' and leaves the tenant's out: in a server of one tenant its
    // entry lists every episode (0.51 against 0.13 ms of index scan when
    // 0009's index read it). A search of a whole tenant reads its entry,
    // so that it never visits other tenants' episodes: a tenant of 50
    // episodes searching two common words read 75,352 of another
    // tenant's from the table on a generic plan, 6.7 s, when the index
    // held only the user and the words.
    let narrowed = if source == Source::Episodes && filters.user.is_some() {
        filter.tenant_unindexed()
    } else {
        filter.sql.clone()
    };
    // Each match's vector is cut down to the query's terms as it is read
    // (the terms marked with weight A, then only what weighs A kept): a few
    // bytes where a 30-word episode's whole vector is about 400. Ranking
    // in the statement instead (document frequencies, then the 200 best
    // by the idf-weighted terms they hold, sent with their whole vectors)
    // cost Postgres a third more (pgbench, one client, three words over
    // 393 matches: 1.13–1.26 ms, against 0.79–0.83 for the matches as
    // rows). They come back as one row of arrays: a row per match cost the
    // server more than the aggregation costs Postgres (CPU a search at 16
    // clients, server and Postgres: 447–504 and 1,231–1,327 µs as rows,
    // 352–422 and 1,213–1,378 as arrays).
    let sql = format!(
        "SELECT {n}::bigint, array_agg(v), array_agg(l), {lists} FROM (SELECT {named}, \
         tsvectorsend(ts_filter(setweight({vector}, 'A', $2::text[]), '{{a}}')) AS v, \
         length({vector}) AS l FROM {from} WHERE {narrowed} AND {matched} LIMIT {MATCHES}) m",
        named = named.join(", "),
        lists = lists.join(", "),
    );
    let row = conn
        .rows_built(sql, &params)
        .await?
        .pop()
        .ok_or_else(|| Error::internal("the matches returned no row"))?;
    let Some(vectors) = row.try_get::<Option<Vec<Vec<u8>>>, _>(1)? else {
        return Ok(None); // no match
    };
    let n: i64 = row.try_get(0)?;
    let lengths: Vec<i32> = row.try_get(2)?;
    let identities: Vec<Vec<String>> = (0..keys.len())
        .map(|at| row.try_get(3 + at))
        .collect::<std::result::Result<_, _>>()?;
    if lengths.len() != vectors.len() || identities.iter().any(|i| i.len() != vectors.len()) {
        return Err(Error::internal("the matches' lists differ in length"));
    }
    let docs: Vec<Doc> = vectors
        .iter()
        .zip(&lengths)
        .map(|(vector, &length)| Doc::decode(vector, &plan.terms, length))
        .collect::<Result<_>>()?;
    let df: Vec<i64> = (0..plan.terms.len())
        .map(|at| docs.iter().filter(|d| !d.positions[at].is_empty()).count() as i64)
        .collect();
    Ok(Some(Matches {
        source,
        keys,
        n: bm25::items(n, docs.len()),
        docs,
        identities,
        df,
    }))
}

impl Matches {
    /// The `chosen` matches (each a score and an index into the matches)
    /// read whole, those still live and within the filters, in the
    /// order given.
    async fn read(
        &self,
        conn: &mut Lease,
        (tenant, filters, bounds): Ask<'_>,
        chosen: &[(f64, usize)],
    ) -> Result<Vec<(f64, Item)>> {
        let (source, keys) = (self.source, self.keys);
        let mut lists = vec![Vec::with_capacity(chosen.len()); keys.len()];
        let mut best = Vec::with_capacity(chosen.len());
        for &(score, at) in chosen {
            let identity: Vec<String> = self
                .identities
                .iter()
                .map(|list| list[at].clone())
                .collect();
            for (list, part) in lists.iter_mut().zip(&identity) {
                list.push(part.clone());
            }
            best.push((score, identity));
        }
        let found = whole(conn, source, keys, tenant, filters, bounds, &lists).await?;
        let mut by_identity: HashMap<Vec<String>, Item> = found.into_iter().collect();
        Ok(best
            .into_iter()
            .filter_map(|(score, identity)| Some((score, by_identity.remove(&identity)?)))
            .collect())
    }
}

/// The select list of an item's identity: its key columns as text.
fn identity(keys: &[(&str, &str)]) -> String {
    let columns: Vec<String> = keys.iter().map(|(c, _)| format!("{c}::text")).collect();
    columns.join(", ")
}

/// The identity of an item: its `width` key columns (as text) from
/// `first` on.
fn identity_at(row: &impl Cols, first: usize, width: usize) -> Result<Vec<String>> {
    (first..first + width).map(|at| row.text(at)).collect()
}

/// The items named by `lists` (one list per column of `keys`, the
/// source's identity), still live and still within the filters, each with
/// its identity. They are read in the order named, and only as far as an
/// answer carries ([`Run::built_weighed`]): a hundred hits of a megabyte
/// are not all held at once.
async fn whole(
    conn: &mut Lease,
    source: Source,
    keys: &[(&str, &str)],
    tenant: &Tenant,
    filters: &Filters,
    bounds: &Bounds,
    lists: &[Vec<String>],
) -> Result<Vec<(Vec<String>, Item)>> {
    let filter = conditions(
        source,
        Dialect::Postgres,
        tenant,
        filters,
        bounds,
        keys.len() + 1,
    );
    let arrays: Vec<String> = (1..)
        .zip(keys)
        .map(|(at, (_, kind))| format!("(SELECT ${at}::text[]::{kind}[])"))
        .collect();
    let names: Vec<String> = (1..=keys.len()).map(|at| format!("k{at}")).collect();
    let matches: Vec<String> = (1..)
        .zip(keys)
        .map(|(at, (column, _))| format!("{column} = k.k{at}"))
        .collect();
    // A lateral subquery behind `OFFSET 0`, so that each item is looked up
    // by its keys' index whatever the plan's estimates: a generic plan of
    // the plain join hashed every live key of the tenant (6 ms for 10,000
    // memory keys, against 0.3). The arrays in subqueries, so that no plan
    // knows their length: Postgres then keeps the generic plan, where a
    // custom plan's better estimate for fewer than about ten hits had it
    // plan every call again (0.21–0.25 against 0.15–0.19 ms for three).
    let sql = format!(
        "SELECT i.* FROM unnest({arrays}) WITH ORDINALITY AS k({names}, ord) CROSS JOIN LATERAL \
         (SELECT {columns}, {identity} FROM {from} WHERE {matches} AND {w} OFFSET 0) i \
         ORDER BY k.ord",
        columns = columns(source),
        identity = identity(keys),
        from = from(source),
        arrays = arrays.join(", "),
        names = names.join(", "),
        matches = matches.join(" AND "),
        w = filter.sql,
    );
    let mut params: Vec<Param> = lists.iter().map(|list| Param::TextList(list)).collect();
    params.extend(filter.params.iter().copied());
    let at = width(source);
    conn.built_weighed(sql, &params, |row| {
        Ok((identity_at(row, at, keys.len())?, item(source, row)?))
    })
    .await
}

/// What BM25 needs of a candidate: the positions of each query term (by
/// its index in the plan's terms) and the item's length, in distinct
/// lexemes (`length(tsvector)`: what Postgres counts without reading the
/// positions; an item's words rarely repeat enough for its words and its
/// lexemes to rank differently).
#[derive(Debug)]
struct Doc {
    positions: Vec<Vec<u16>>,
    length: usize,
}

impl Doc {
    /// Reads a vector in Postgres's binary form (`tsvectorsend`): the
    /// number of lexemes, then each lexeme as a NUL-terminated string, its
    /// number of positions and the positions (16 bits each, the weight in
    /// the top two). The vector is the candidate's cut down to the query's
    /// terms (and any other lexeme the item itself weighs A, which is
    /// skipped); `length` is the whole vector's.
    fn decode(bytes: &[u8], terms: &[String], length: i32) -> Result<Doc> {
        let malformed = || Error::internal("a search vector is malformed");
        let mut positions = vec![Vec::new(); terms.len()];
        let (count, mut rest) = bytes.split_first_chunk::<4>().ok_or_else(malformed)?;
        for _ in 0..u32::from_be_bytes(*count) {
            let end = rest.iter().position(|b| *b == 0).ok_or_else(malformed)?;
            let lexeme = &rest[..end];
            let term = terms.iter().position(|t| t.as_bytes() == lexeme);
            let (npos, after) = rest[end + 1..]
                .split_first_chunk::<2>()
                .ok_or_else(malformed)?;
            let npos = usize::from(u16::from_be_bytes(*npos));
            let list = after.get(..2 * npos).ok_or_else(malformed)?;
            if let Some(term) = term {
                positions[term] = list
                    .chunks_exact(2)
                    .map(|p| u16::from_be_bytes([p[0], p[1]]) & 0x3fff)
                    .collect();
            }
            rest = &after[2 * npos..];
        }
        Ok(Doc {
            positions,
            length: usize::try_from(length).unwrap_or(0).max(1),
        })
    }

    /// How often term `b` stands right after term `a`.
    fn adjacent(&self, a: usize, b: usize) -> usize {
        let (a, b) = (&self.positions[a], &self.positions[b]);
        a.iter().filter(|p| b.contains(&(*p + 1))).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tsvectorsend` of `'deploy':1,7A 'it''s':3 'other':4,5 'setup':2 'bare'`.
    fn binary() -> Vec<u8> {
        let mut out = 5u32.to_be_bytes().to_vec();
        let entries: [(&str, &[u16]); 5] = [
            ("bare", &[]),
            ("deploy", &[1, 7 | 0xc000]),
            ("it's", &[3]),
            ("other", &[4, 5]),
            ("setup", &[2]),
        ];
        for (lexeme, positions) in entries {
            out.extend(lexeme.as_bytes());
            out.push(0);
            out.extend((positions.len() as u16).to_be_bytes());
            for p in positions {
                out.extend(p.to_be_bytes());
            }
        }
        out
    }

    #[test]
    fn reads_vectors_in_their_binary_form() {
        let terms: Vec<String> = ["deploy", "it's", "setup", "bare", "absent"]
            .map(String::from)
            .to_vec();
        let doc = Doc::decode(&binary(), &terms, 5).expect("well-formed");
        assert_eq!(doc.positions[0], vec![1, 7], "the weight bits are dropped");
        assert_eq!(doc.positions[1], vec![3]);
        assert_eq!(doc.positions[2], vec![2]);
        assert!(doc.positions[3].is_empty());
        assert!(doc.positions[4].is_empty());
        assert_eq!(doc.length, 5, "the length is the one Postgres gave");
        assert_eq!(doc.adjacent(0, 2), 1);
        assert_eq!(doc.adjacent(2, 0), 0);
    }

    #[test]
    fn a_cut_vector_is_an_error_not_a_panic() {
        let whole = binary();
        for end in 0..whole.len() {
            assert!(
                Doc::decode(&whole[..end], &["deploy".to_owned()], 5).is_err(),
                "cut at {end}"
            );
        }
    }
}
