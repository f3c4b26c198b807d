//! Search's shared half: what each source's rows are, the conditions its
//! filters become, the item a row decodes to, and how matches are scored
//! (BM25, with statistics of the caller's own items: the number the
//! filters allow and how many of the matches hold each term). How a
//! backend matches differs (`postgres/search/`: a tsquery over stored
//! tsvectors; `sqlite/search.rs`: FTS5 expressions), and each joins these.

use super::consolidation::{fact_columns, fact_row};
use super::memory::{entry_row, scope_at, version_columns};
use super::sessions::{episode_columns, episode_row};
use super::sql::{Cols, Dialect, Param};
use crate::context::Tenant;
use crate::error::Result;
use crate::search::{Filters, Item, Source};

/// A source's item columns (Postgres casts; SQLite drops them), read by
/// [`item`]: memory through `h` (heads) and `v` (versions), facts through
/// `f` and `v`, episodes through `e` (the only table with their names).
pub(super) fn columns(source: Source) -> &'static str {
    match source {
        Source::Memory => concat!(version_columns!(), ", h.scope_type, h.scope"),
        Source::Facts => fact_columns!(),
        Source::Episodes => episode_columns!(),
    }
}

/// A source's tables, with the aliases [`columns`] and [`conditions`]
/// read: `h` and `v` for memory, `f` and `v` for facts, `e` for episodes.
pub(super) fn from(source: Source) -> &'static str {
    match source {
        Source::Memory => {
            "memory_heads h JOIN memory_versions v USING (tenant, scope_type, scope, key, version)"
        }
        Source::Facts => {
            "facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version"
        }
        Source::Episodes => "episodes e",
    }
}

/// How many columns [`columns`] lists: a backend's own columns follow.
pub(super) fn width(source: Source) -> usize {
    match source {
        Source::Memory => 10,
        Source::Facts => 16,
        Source::Episodes => 13,
    }
}

/// The item of a row whose first columns are [`columns`].
pub(super) fn item(source: Source, row: &impl Cols) -> Result<Item> {
    Ok(match source {
        Source::Memory => Item::Entry(entry_row(row, &scope_at(row, 8)?)?),
        Source::Facts => Item::Fact(fact_row(row)?),
        Source::Episodes => Item::Episode(episode_row(row)?),
    })
}

/// What a filter binds that the request does not hold as text: a key
/// prefix's range and the episode types.
pub(super) struct Bounds {
    prefix: Option<(String, String)>,
    scope_prefix: Option<(String, String)>,
    types: Vec<String>,
}

impl Bounds {
    pub(super) fn of(filters: &Filters) -> Bounds {
        Bounds {
            prefix: filters.key_prefix.as_ref().map(|p| p.range()),
            scope_prefix: filters.scope_prefix.as_ref().map(|p| p.range()),
            types: filters
                .types
                .iter()
                .map(|t| t.as_str().to_owned())
                .collect(),
        }
    }
}

/// The `WHERE` conditions of a source's filters, joined by `AND`, with
/// their parameters numbered after those the statement binds first.
pub(super) struct Conditions<'a> {
    pub(super) sql: String,
    pub(super) params: Vec<Param<'a>>,
    first: usize,
}

impl<'a> Conditions<'a> {
    /// Adds `condition`, whose `$` stands for the next parameter.
    fn push(&mut self, condition: &str, param: Param<'a>) {
        let placeholder = format!("${}", self.first + self.params.len());
        self.add(&condition.replace('$', &placeholder));
        self.params.push(param);
    }

    /// `sql` with the episodes' tenant condition kept out of the plan's
    /// index conditions (`IS TRUE` means the same here), for a search by
    /// user: the episodes' search index holds the tenant too (Postgres
    /// migration 0023), and a tenant's entry there lists every episode of
    /// the tenant, which a user's search has no need to read.
    /// The tenant's condition is the first an episode's conditions hold.
    pub(super) fn tenant_unindexed(&self) -> String {
        let tenant = format!("e.tenant = ${}", self.first);
        match self.sql.strip_prefix(&tenant) {
            Some(rest) => format!("({tenant}) IS TRUE{rest}"),
            None => self.sql.clone(),
        }
    }

    fn add(&mut self, condition: &str) {
        if !self.sql.is_empty() {
            self.sql.push_str(" AND ");
        }
        self.sql.push_str(condition);
    }
}

/// The one table, with its alias, whose columns [`conditions`] names for
/// `source`: a memory key's head, a fact's row, an episode.
pub(super) fn filtered(source: Source) -> &'static str {
    match source {
        Source::Memory => "memory_heads h",
        Source::Facts => "facts f",
        Source::Episodes => "episodes e",
    }
}

/// The conditions that confine `source` to the tenant's live items and to
/// the filters that apply to it, on the columns of [`filtered`]'s table;
/// its parameters start at `$first`.
pub(super) fn conditions<'a>(
    source: Source,
    dialect: Dialect,
    tenant: &'a Tenant,
    filters: &'a Filters,
    bounds: &'a Bounds,
    first: usize,
) -> Conditions<'a> {
    let mut c = Conditions {
        sql: String::new(),
        params: Vec::new(),
        first,
    };
    let time = match source {
        Source::Memory => {
            c.push("h.tenant = $", tenant.as_str().into());
            c.add("NOT h.deleted AND substr(h.key, 1, 12) <> '_compaction/'");
            if let Some(scope_type) = filters.scope_type {
                c.push("h.scope_type = $", scope_type.as_i16().into());
            }
            if let Some(scope) = &filters.scope {
                c.push("h.scope = $", scope.as_str().into());
            }
            if let Some((low, high)) = &bounds.scope_prefix {
                c.push("h.scope >= $", low.as_str().into());
                c.push("h.scope < $", high.as_str().into());
            }
            if let Some((low, high)) = &bounds.prefix {
                c.push("h.key >= $", low.as_str().into());
                c.push("h.key < $", high.as_str().into());
            }
            "h.update_time"
        }
        Source::Facts => {
            c.push("f.tenant = $", tenant.as_str().into());
            c.add("NOT f.deleted");
            if let Some(app) = &filters.app {
                c.push("f.app = $", app.as_str().into());
            }
            if let Some(user) = &filters.user {
                c.push("f.user_id = $", user.as_str().into());
            }
            if let Some(kind) = filters.kind {
                c.push("f.kind = $", kind.as_i16().into());
            }
            "f.update_time"
        }
        Source::Episodes => {
            c.push("e.tenant = $", tenant.as_str().into());
            if let Some(app) = &filters.app {
                c.push("e.app = $", app.as_str().into());
            }
            if let Some(user) = &filters.user {
                c.push("e.user_id = $", user.as_str().into());
            }
            if let Some(session) = &filters.session_id {
                c.push("e.session_id = $", session.as_str().into());
            }
            if let Some(agent) = &filters.agent {
                c.push("e.agent = $", agent.as_str().into());
            }
            if !bounds.types.is_empty() {
                let condition = match dialect {
                    Dialect::Postgres => "e.type = ANY($::text[])",
                    Dialect::Sqlite => "e.type IN (SELECT value FROM json_each($))",
                };
                c.push(condition, Param::TextList(&bounds.types));
            }
            "e.timestamp"
        }
    };
    if let Some(start) = filters.start {
        c.push(&format!("{time} >= $"), start.into());
    }
    if let Some(end) = filters.end {
        c.push(&format!("{time} < $"), end.into());
    }
    c
}

/// At most this many matching items are looked at: the bound on a query
/// whose words match a large part of what the filters allow (a common
/// word, no user filter). Past it, the items the index yields first are
/// ranked and the rest are not seen.
pub(super) const MATCHES: usize = 20_000;

/// The number of items the filters allow counts at most this many
/// sessions' episodes (episodes) or this many items (memory and facts).
pub(super) const POPULATION: usize = 20_000;

/// The number of items the filters allow, BM25's `n`, as a scalar
/// subquery that reads no vector. Episodes narrowed only by app, user or
/// session are counted from their sessions' live counts (one row per
/// session, however long the conversation); other filters count the
/// items themselves, from the one table the filters name (a memory key's
/// head, a fact's row: joining each to its version row cost about 9 µs an
/// item, 92 ms of a search over 10,000 keys). Either stops at
/// [`POPULATION`]. Parameters it needs are appended to `params`.
pub(super) fn population<'a>(
    source: Source,
    tenant: &'a Tenant,
    filters: &'a Filters,
    filter: &str,
    params: &mut Vec<Param<'a>>,
) -> String {
    let by_session = source == Source::Episodes
        && filters.agent.is_none()
        && filters.types.is_empty()
        && filters.start.is_none()
        && filters.end.is_none();
    if !by_session {
        return format!(
            "(SELECT count(*) FROM (SELECT 1 FROM {live} WHERE {filter} LIMIT {POPULATION}) a)",
            live = filtered(source),
        );
    }
    let bind = |column: &str, value: &'a str, params: &mut Vec<Param<'a>>| {
        params.push(Param::Text(value));
        format!(" AND s.{column} = ${}", params.len())
    };
    let mut conditions = bind("tenant", tenant.as_str(), params);
    for (column, value) in [
        ("app", filters.app.as_ref().map(|a| a.as_str())),
        ("user_id", filters.user.as_ref().map(|u| u.as_str())),
        ("id", filters.session_id.as_ref().map(|s| s.as_str())),
    ] {
        if let Some(value) = value {
            conditions.push_str(&bind(column, value, params));
        }
    }
    format!(
        "(SELECT coalesce(sum(c), 0) FROM (SELECT s.episode_count AS c FROM sessions s \
         WHERE true{conditions} LIMIT {POPULATION}) a)"
    )
}

/// The best `limit` of every source's scored matches (`scored[s]` holds
/// source `s`'s, each a score and what names the match), as each source's
/// chosen ones, best first: the list at `s` is source `s`'s, empty when
/// none of its matches made the cut. A store then reads whole only these.
pub(super) fn best<T: Copy>(scored: &[Vec<(f64, T)>], limit: usize) -> Vec<Vec<(f64, T)>> {
    let mut all: Vec<(f64, usize, T)> = (0..)
        .zip(scored)
        .flat_map(|(at, list)| list.iter().map(move |&(score, m)| (score, at, m)))
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    all.truncate(limit);
    let mut chosen = vec![Vec::new(); scored.len()];
    for (score, at, m) in all {
        chosen[at].push((score, m));
    }
    chosen
}

/// BM25, the one formula both stores score with: Lucene's form of the idf
/// (never negative, so a word in most items still counts a little) and
/// the usual k1 and b. Its inputs differ a little: an item's length is
/// its distinct lexemes on Postgres and its words on SQLite, and words
/// side by side weigh through Postgres's positions or SQLite's phrase
/// counts, so close hits may rank in another order (the best hit of 7 of
/// the labeled set's 40 questions, 2026-11-27); which items are found is
/// the same (a test holds the two to it).
pub(super) mod bm25 {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;

    /// The weight of a term `df` of the `n` items the filters allow hold
    /// (`n` is raised to `df` when bounds cut it shorter).
    pub(in crate::store) fn idf(n: i64, df: i64) -> f64 {
        let df = df.max(0) as f64;
        let n = (n as f64).max(df);
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// BM25's `n` for a search that read `matched` matches of the `n`
    /// items the filters allow (each bounded). When the matches reached
    /// [`MATCHES`](super::MATCHES), only those were read and each term's
    /// document frequency counts them alone, so `n` becomes their number:
    /// the frequencies and `n` then describe the same items. Against the
    /// whole population a word in most of a large tenant's items counted
    /// as rare (a frequency of at most 20,000 against an `n` of a
    /// million), weighing 3.9 where a word in one item in 400 weighs 6.
    pub(in crate::store) fn items(n: i64, matched: usize) -> i64 {
        if matched >= super::MATCHES {
            i64::try_from(matched).unwrap_or(i64::MAX)
        } else {
            n
        }
    }

    /// Each term's weight in a search of several sources at once, as if
    /// they were one index: `counts` holds each source's `n` (from
    /// [`items`]) and each term's document frequency among its matches,
    /// and a term's idf comes from their sums, as Elasticsearch's
    /// `dfs_query_then_fetch` pools the statistics of the shards it asks.
    /// A source's own statistics put its scores on a scale of its own: a
    /// word in 5 of a user's 20 facts weighed 1.3 there and 4.6 in 10 of
    /// the user's 1,000 episodes, so a fact holding every word of the
    /// question ranked below an episode holding one. A source with no
    /// match adds nothing (the matches' statement is what counts its
    /// items). Each source keeps its own average length.
    pub(in crate::store) fn pooled(counts: &[(i64, Vec<i64>)]) -> Vec<f64> {
        let terms = counts.iter().map(|(_, df)| df.len()).max().unwrap_or(0);
        let n = counts.iter().map(|(n, _)| *n).sum();
        (0..terms)
            .map(|at| {
                let df = counts
                    .iter()
                    .map(|(_, df)| df.get(at).copied().unwrap_or(0))
                    .sum();
                idf(n, df)
            })
            .collect()
    }

    /// How a term's count in an item of `length` (where the matches
    /// average `average`) saturates: the factor its idf is multiplied by.
    pub(in crate::store) fn saturation(length: usize, average: f64) -> impl Fn(f64) -> f64 {
        let norm = K1 * (1.0 - B + B * length as f64 / average);
        move |tf| tf * (K1 + 1.0) / (tf + norm)
    }
}

#[cfg(test)]
mod tests {
    use super::{Bounds, MATCHES, best, bm25, conditions};
    use crate::context::Tenant;
    use crate::search::{Filters, Source};
    use crate::sessions::Name;
    use crate::store::sql::Dialect;

    /// A search of episodes by user keeps its tenant out of the index
    /// scan; only the tenant's condition is rewritten.
    #[test]
    fn the_episodes_tenant_condition_can_be_kept_out_of_the_index() {
        let tenant = Tenant::new("t1");
        let filters = Filters {
            user: Some(Name::parse("user", "alice").expect("name")),
            ..Filters::default()
        };
        let bounds = Bounds::of(&filters);
        let c = conditions(
            Source::Episodes,
            Dialect::Postgres,
            &tenant,
            &filters,
            &bounds,
            3,
        );
        assert_eq!(c.sql, "e.tenant = $3 AND e.user_id = $4");
        assert_eq!(
            c.tenant_unindexed(),
            "(e.tenant = $3) IS TRUE AND e.user_id = $4"
        );
        let memory = conditions(
            Source::Memory,
            Dialect::Postgres,
            &tenant,
            &filters,
            &bounds,
            3,
        );
        assert_eq!(memory.tenant_unindexed(), memory.sql);
    }

    #[test]
    fn cut_matches_are_their_own_population() {
        assert_eq!(bm25::items(500, 30), 500);
        assert_eq!(bm25::items(1_000_000, MATCHES), MATCHES as i64);
        // A word in every match read and one in 50 of them: the common
        // word weighs next to nothing, as it would counted in full.
        let n = bm25::items(1_000_000, MATCHES);
        let (common, rare) = (bm25::idf(n, MATCHES as i64), bm25::idf(n, 50));
        assert!(common < 0.001 && rare > 5.0, "{common} {rare}");
        // Against the whole population it seemed rare.
        assert!(bm25::idf(1_000_000, MATCHES as i64) > 3.9);
    }

    #[test]
    fn the_best_of_every_source_are_chosen_together() {
        let scored = [
            vec![(0.5, 'a'), (2.0, 'b')],
            vec![(1.0, 'x')],
            vec![(0.1, 'p')],
        ];
        let chosen = best(&scored, 3);
        assert_eq!(
            chosen,
            [vec![(2.0, 'b'), (0.5, 'a')], vec![(1.0, 'x')], vec![]]
        );
        assert_eq!(best(&scored, 1), [vec![(2.0, 'b')], vec![], vec![]]);
        assert!(best::<char>(&[], 10).is_empty());
    }

    #[test]
    fn sources_searched_together_weigh_a_term_alike() {
        // One source alone: its own idf.
        assert_eq!(
            bm25::pooled(&[(20, vec![5, 1])]),
            [bm25::idf(20, 5), bm25::idf(20, 1)]
        );
        // A word in 5 of 20 facts and 10 of 1,000 episodes weighs as in
        // 15 of 1,020 items, for both; a term a source's matches lack
        // (a shorter list) counts none there.
        let facts = (20, vec![5, 1]);
        let episodes = (1_000, vec![10]);
        let pooled = bm25::pooled(&[facts, episodes]);
        assert_eq!(pooled, [bm25::idf(1_020, 15), bm25::idf(1_020, 1)]);
        assert!(bm25::idf(20, 5) < 1.4 && bm25::idf(1_000, 10) > 4.5);
        assert!(pooled[0] > 4.0, "{pooled:?}");
        assert!(bm25::pooled(&[]).is_empty());
    }
}
