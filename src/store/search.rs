//! Search's shared half: what each source's rows are, the conditions its
//! filters become, and the item a row decodes to. How a backend matches
//! and ranks differs (`postgres/search.rs`: a tsquery over generated
//! tsvectors, BM25 over the candidates; `sqlite/search.rs`: FTS5 and its
//! bm25()), and each joins these.

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
