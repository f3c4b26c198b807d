//! Export: one page of one part of the selection at a time.

use super::rows::{
    cached_row, episode_row, execution_row, fact_row, fact_version_row, memory_row, rule_of,
    rule_row, session_row, task_row, working_row,
};
use crate::context::Tenant;
use crate::data::records::{FactSource, Record};
use crate::data::{After, ExportPage, Part, Selection};
use crate::error::Result;
use crate::paging;
use crate::store::sql::{Cols, Param, Run, SENT_WHOLE_BYTES, Sql, page_by_bytes, params};

/// Rows a page of a part asks for at most.
const MOST_ROWS: i64 = 500;

/// Rows the first page of a part asks for. A page also ends at about
/// 2 MiB of records, and the statements of parts with large columns stop
/// sending those past about that (`part_by_bytes!`, [`read_part`]), but
/// Postgres still reads and sends the rest of the rows asked for. So a
/// part starts small and asks for twice what its last page held, up to
/// [`MOST_ROWS`]: rows of a few hundred bytes soon come 500 at a time, and
/// large ones about as many as a page holds.
const FIRST_ROWS: i64 = 64;

/// A page of a part from `$from` (which ends in `ORDER BY $order LIMIT`),
/// its rows sent whole while the stored sizes (`$size`, summed) of the
/// rows before them come to at most `$bytes` ([`SENT_WHOLE_BYTES`]): the
/// columns `$columns`, whose large ones are `past!` (sent as null after
/// that), then whether the row came past it.
///
/// Postgres sends every row a statement was asked for, even once the
/// driver has dropped the stream, and the rest is drained unread before
/// the next statement: the first page of a part of values of a megabyte
/// asked for [`FIRST_ROWS`] and sent 64 MB to keep three. Past what the
/// sockets hold, the statement also stays active, blocked on sending,
/// while the export waits on a slow client, so `statement_timeout` rather
/// than `idle_in_transaction_session_timeout` ends it.
macro_rules! part_by_bytes {
    ($columns:expr, $size:literal, $order:literal, $bytes:literal, $from:expr) => {
        page_by_bytes!($columns, "*", $size, $order, $bytes, $from)
    };
}

/// A large column of a `part_by_bytes!` page: null once the row came past
/// the page's bytes.
macro_rules! past {
    ($column:literal) => {
        concat!("CASE WHEN past THEN NULL ELSE ", $column, " END")
    };
}

// ---- what a selection chooses, for `concat!` (parameters $1..$6) ----

macro_rules! whole_tenant {
    () => {
        "($2 = 0 AND $4 = '' AND $5 = '')"
    };
}

macro_rules! user_sessions {
    () => {
        "(SELECT id FROM sessions WHERE tenant = $1 AND app = $5 AND user_id = $6)"
    };
}

/// Memory of the chosen scope, the session's execution scope or the
/// user's sessions' execution scopes.
macro_rules! chosen_memory {
    () => {
        concat!(
            "(",
            whole_tenant!(),
            " OR (scope_type = $2 AND scope = $3) OR (scope_type = 3 AND scope = $4) \
             OR ($5 <> '' AND scope_type = 3 AND scope IN ",
            user_sessions!(),
            "))"
        )
    };
}

macro_rules! chosen_executions {
    () => {
        concat!(
            "(",
            whole_tenant!(),
            " OR ($2 = 3 AND execution_id = $3) OR execution_id = $4 \
             OR ($5 <> '' AND execution_id IN ",
            user_sessions!(),
            "))"
        )
    };
}

/// Rows of sessions (`id`) or episodes (`session_id`) with their owner.
macro_rules! chosen_sessions {
    ($id:literal) => {
        concat!(
            "($2 = 0 AND length($3) >= 0 AND (($4 = '' AND $5 = '') OR ",
            $id,
            " = $4 OR (app = $5 AND user_id = $6)))"
        )
    };
}

macro_rules! chosen_working {
    () => {
        concat!(
            "($2 = 0 AND length($3) >= 0 AND (($4 = '' AND $5 = '') OR session_id = $4 \
             OR ($5 <> '' AND session_id IN ",
            user_sessions!(),
            ")))"
        )
    };
}

macro_rules! chosen_facts {
    () => {
        "($2 = 0 AND length($3) >= 0 AND $4 = '' AND ($5 = '' OR (app = $5 AND user_id = $6)))"
    };
}

macro_rules! chosen_rules {
    () => {
        "($2 = 0 AND length($3) >= 0 AND $4 = '' AND $5 = '' AND length($6) >= 0)"
    };
}

// ---- export pages ----

static EXPORT_EXECUTIONS: Sql = Sql::new(concat!(
    "SELECT ",
    execution_columns!(),
    " FROM memory_executions WHERE tenant = $1 AND ",
    chosen_executions!(),
    " AND execution_id > $7 ORDER BY execution_id LIMIT $8"
));

/// $7..$10 the last version of the previous page, $11 limit, $12
/// [`SENT_WHOLE_BYTES`].
static EXPORT_MEMORY: Sql = part_by_bytes!(
    concat!(
        "scope_type, scope, key, version, ",
        past!("value::text"),
        ", deleted, execution_id, flow_id, flow_name, create_time"
    ),
    "pg_column_size(value)",
    "scope_type, scope, key, version",
    "$12",
    concat!(
        "FROM memory_versions WHERE tenant = $1 AND ",
        chosen_memory!(),
        " AND (tenant, scope_type, scope, key, version) > ($1, $7, $8, $9, $10) \
         ORDER BY scope_type, scope, key, version LIMIT $11"
    )
);

static EXPORT_SESSIONS: Sql = Sql::new(concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE tenant = $1 AND ",
    chosen_sessions!("id"),
    " AND id > $7 ORDER BY id LIMIT $8"
));

/// $7 the last cursor of the previous page, $8 limit, $9
/// [`SENT_WHOLE_BYTES`].
static EXPORT_EPISODES: Sql = part_by_bytes!(
    concat!(
        "session_id, seq, id, app, user_id, agent, type, ",
        past!("content::text"),
        ", ",
        past!("metadata::text"),
        ", source_node, timestamp, create_time, fingerprint, cursor"
    ),
    "pg_column_size(content) + pg_column_size(metadata)",
    "cursor",
    "$9",
    concat!(
        "FROM episodes WHERE tenant = $1 AND ",
        chosen_sessions!("session_id"),
        " AND cursor > $7 ORDER BY cursor LIMIT $8"
    )
);

/// $7 the last session of the previous page, $8 limit, $9
/// [`SENT_WHOLE_BYTES`].
static EXPORT_WORKING: Sql = part_by_bytes!(
    concat!("session_id, ", past!("goal"), ", next_task, update_time"),
    "pg_column_size(goal)",
    "session_id",
    "$9",
    concat!(
        "FROM working_memory WHERE tenant = $1 AND ",
        chosen_working!(),
        " AND session_id > $7 ORDER BY session_id LIMIT $8"
    )
);

/// $7 and $8 the last task of the previous page, $9 limit, $10
/// [`SENT_WHOLE_BYTES`].
static EXPORT_TASKS: Sql = part_by_bytes!(
    concat!(
        "session_id, number, ",
        past!("subject"),
        ", ",
        past!("description"),
        ", status, create_time, update_time, create_request_id, create_fingerprint"
    ),
    "pg_column_size(subject) + pg_column_size(description)",
    "session_id, number",
    "$10",
    concat!(
        "FROM working_tasks WHERE tenant = $1 AND ",
        chosen_working!(),
        " AND (session_id, number) > ($7, $8) ORDER BY session_id, number LIMIT $9"
    )
);

/// $7 and $8 the last file of the previous page, $9 limit, $10
/// [`SENT_WHOLE_BYTES`].
static EXPORT_CACHE: Sql = part_by_bytes!(
    concat!(
        "session_id, path, ",
        past!("content"),
        ", bytes, update_time"
    ),
    "pg_column_size(content)",
    "session_id, path",
    "$10",
    concat!(
        "FROM working_cache WHERE tenant = $1 AND ",
        chosen_working!(),
        " AND (session_id, path) > ($7, $8) ORDER BY session_id, path LIMIT $9"
    )
);

/// $7 and $8 the last version of the previous page, $9 limit, $10
/// [`SENT_WHOLE_BYTES`].
static EXPORT_FACT_VERSIONS: Sql = part_by_bytes!(
    concat!(
        "fact_id, version, deleted, subject, predicate, object, ",
        past!("content::text"),
        ", confidence, source, ",
        past!("source_episode_ids::text"),
        ", channels::text, create_time"
    ),
    "pg_column_size(content) + pg_column_size(source_episode_ids)",
    "fact_id, version",
    "$10",
    concat!(
        "FROM fact_versions WHERE tenant = $1 AND fact_id IN (SELECT id FROM facts \
         WHERE tenant = $1 AND ",
        chosen_facts!(),
        ") AND (fact_id, version) > ($7, $8) ORDER BY fact_id, version LIMIT $9"
    )
);

static EXPORT_FACT_SOURCES: Sql = Sql::new(concat!(
    "SELECT fact_id, episode_id FROM fact_sources WHERE tenant = $1 AND fact_id IN \
     (SELECT id FROM facts WHERE tenant = $1 AND ",
    chosen_facts!(),
    ") AND (fact_id, episode_id) > ($7, $8) ORDER BY fact_id, episode_id LIMIT $9"
));

static EXPORT_FACTS: Sql = Sql::new(concat!(
    "SELECT ",
    fact_columns!(),
    " FROM facts WHERE tenant = $1 AND ",
    chosen_facts!(),
    " AND id > $7 ORDER BY id LIMIT $8"
));

static EXPORT_RULES: Sql = Sql::new(concat!(
    "SELECT ",
    rule_columns!(),
    " FROM consolidation_rules WHERE tenant = $1 AND ",
    chosen_rules!(),
    " AND id > $7 ORDER BY id LIMIT $8"
));

/// The selection as the six parameters every export statement takes.
fn selection_params<'a>(tenant: &'a Tenant, selection: &'a Selection) -> [Param<'a>; 6] {
    let (scope_type, scope, session, app, user) = match selection {
        Selection::Tenant => (0, "", "", "", ""),
        Selection::Scope(scope) => (scope.scope_type.as_i16(), scope.name.as_str(), "", "", ""),
        Selection::Session(id) => (0, "", id.as_str(), "", ""),
        Selection::User { app, user } => (0, "", "", app.as_str(), user.as_str()),
    };
    [
        Param::Text(tenant.as_str()),
        Param::Small(scope_type),
        Param::Text(scope),
        Param::Text(session),
        Param::Text(app),
        Param::Text(user),
    ]
}

/// The position in a part of numbered items of owners; the start before
/// the first.
fn numbered(after: &After) -> (&str, i64) {
    match after {
        After::Numbered(owner, n) => (owner.as_str(), *n),
        _ => ("", 0),
    }
}

/// The position in a part of named items of owners; the start before
/// the first.
fn named(after: &After) -> (&str, &str) {
    match after {
        After::Named(owner, name) => (owner.as_str(), name.as_str()),
        _ => ("", ""),
    }
}

/// How many rows the page after one that asked for `limit` and `held`
/// records asks for: twice what a page cut by its bytes held, else twice
/// what it asked for, within 2 and [`MOST_ROWS`].
fn next_rows(limit: i64, held: i64, cut: bool) -> i64 {
    if cut { 2 * held } else { 2 * limit }.clamp(2, MOST_ROWS)
}

/// The records of a `part_by_bytes!` page (`past`: the index of its flag
/// column), read up to paging's cut or the first row the statement sent
/// past its bytes, and whether either cut the page.
async fn read_part<R: Run, T: Send + paging::Weigh>(
    conn: &mut R,
    sql: &'static Sql,
    params: &[&[Param<'_>]],
    past: usize,
    decode: impl Fn(&R::Row) -> Result<T> + Send + Sync,
) -> Result<(Vec<T>, bool)> {
    let mut read = paging::Weighed::default();
    let cut = conn
        .weigh_into(sql, &params.concat(), &mut read, |row| {
            if row.boolean(past)? {
                return Ok(None);
            }
            decode(row).map(Some)
        })
        .await?;
    let cut = cut || read.full;
    Ok((read.items, cut))
}

/// One page of a part, and where the next one starts (none after the last).
pub(super) async fn export_page(
    conn: &mut impl Run,
    tenant: &Tenant,
    selection: &Selection,
    part: Part,
    after: &After,
    rows: Option<i64>,
) -> Result<ExportPage> {
    let limit = rows.unwrap_or(FIRST_ROWS).clamp(1, MOST_ROWS);
    let chosen = selection_params(tenant, selection);
    let id_after = match after {
        After::Id(id) => id.as_str(),
        _ => "",
    };
    let at_id: &[Param<'_>] = params![id_after, limit];
    let with_id = [&chosen[..], at_id].concat();
    let (records, next, cut) = match part {
        Part::Executions => {
            let rows = conn
                .all(&EXPORT_EXECUTIONS, &with_id, execution_row)
                .await?;
            let next = rows.last().map(|e| After::Id(e.execution_id.clone()));
            (
                rows.into_iter().map(Record::Execution).collect(),
                next,
                false,
            )
        }
        Part::Memory => {
            let (scope_type, scope, key, version) = match after {
                After::Key {
                    scope_type,
                    scope,
                    key,
                    version,
                } => (*scope_type, scope.as_str(), key.as_str(), *version),
                _ => (0, "", "", 0),
            };
            let at: &[Param<'_>] =
                params![scope_type, scope, key, version, limit, SENT_WHOLE_BYTES];
            let (rows, cut) = read_part(conn, &EXPORT_MEMORY, &[&chosen[..], at], 10, |row| {
                Ok((row.small(0)?, memory_row(row)?))
            })
            .await?;
            let next = rows.last().map(|(scope_type, v)| After::Key {
                scope_type: *scope_type,
                scope: v.scope.clone(),
                key: v.key.clone(),
                version: v.version,
            });
            let records = rows.into_iter().map(|(_, v)| Record::MemoryVersion(v));
            (records.collect(), next, cut)
        }
        Part::Sessions => {
            let rows = conn.all(&EXPORT_SESSIONS, &with_id, session_row).await?;
            let next = rows.last().map(|s| After::Id(s.id.clone()));
            (rows.into_iter().map(Record::Session).collect(), next, false)
        }
        Part::Episodes => {
            let cursor = match after {
                After::Cursor(cursor) => *cursor,
                _ => 0,
            };
            let at: &[Param<'_>] = params![cursor, limit, SENT_WHOLE_BYTES];
            let (rows, cut) =
                read_part(conn, &EXPORT_EPISODES, &[&chosen[..], at], 14, episode_row).await?;
            let next = rows.last().map(|(cursor, _)| After::Cursor(*cursor));
            let records = rows.into_iter().map(|(_, e)| Record::Episode(e));
            (records.collect(), next, cut)
        }
        Part::Working => {
            let bytes: &[Param<'_>] = params![SENT_WHOLE_BYTES];
            let (rows, cut) = read_part(
                conn,
                &EXPORT_WORKING,
                &[&with_id[..], bytes],
                4,
                working_row,
            )
            .await?;
            let next = rows.last().map(|w| After::Id(w.session_id.clone()));
            let records = rows.into_iter().map(Record::WorkingMemory);
            (records.collect(), next, cut)
        }
        Part::Tasks => {
            let (session, number) = numbered(after);
            let at: &[Param<'_>] = params![session, number, limit, SENT_WHOLE_BYTES];
            let (rows, cut) =
                read_part(conn, &EXPORT_TASKS, &[&chosen[..], at], 9, task_row).await?;
            let next = rows
                .last()
                .map(|t| After::Numbered(t.session_id.clone(), t.number));
            (rows.into_iter().map(Record::Task).collect(), next, cut)
        }
        Part::CachedFiles => {
            let (session, path) = named(after);
            let at: &[Param<'_>] = params![session, path, limit, SENT_WHOLE_BYTES];
            let (rows, cut) =
                read_part(conn, &EXPORT_CACHE, &[&chosen[..], at], 5, cached_row).await?;
            let next = rows
                .last()
                .map(|c| After::Named(c.session_id.clone(), c.path.clone()));
            (
                rows.into_iter().map(Record::CachedFile).collect(),
                next,
                cut,
            )
        }
        Part::Facts => {
            // Its versions and sources have lines of their own (the next
            // parts).
            let rows = conn.all_weighed(&EXPORT_FACTS, &with_id, fact_row).await?;
            let cut = paging::filled(&rows);
            let next = rows.last().map(|f| After::Id(f.id.clone()));
            (rows.into_iter().map(Record::Fact).collect(), next, cut)
        }
        Part::FactVersions => {
            let (fact, version) = numbered(after);
            let at: &[Param<'_>] = params![fact, version, limit, SENT_WHOLE_BYTES];
            let (rows, cut) = read_part(
                conn,
                &EXPORT_FACT_VERSIONS,
                &[&chosen[..], at],
                12,
                fact_version_row,
            )
            .await?;
            let next = rows
                .last()
                .map(|v| After::Numbered(v.fact_id.clone(), v.version));
            (
                rows.into_iter().map(Record::FactVersion).collect(),
                next,
                cut,
            )
        }
        Part::FactSources => {
            let (fact, episode) = named(after);
            let at: &[Param<'_>] = params![fact, episode, limit];
            let rows = conn
                .all(&EXPORT_FACT_SOURCES, &[&chosen[..], at].concat(), |row| {
                    Ok(FactSource {
                        fact_id: row.text(0)?,
                        episode_id: row.text(1)?,
                    })
                })
                .await?;
            let next = rows
                .last()
                .map(|s| After::Named(s.fact_id.clone(), s.episode_id.clone()));
            (
                rows.into_iter().map(Record::FactSource).collect(),
                next,
                false,
            )
        }
        Part::Rules => {
            let rows = conn.all(&EXPORT_RULES, &with_id, rule_row).await?;
            let next = rows.last().map(|(r, _)| After::Id(r.id.clone()));
            let mut records = Vec::with_capacity(rows.len());
            for (rule, watermark) in rows {
                records.push(Record::Rule(rule_of(conn, tenant, rule, watermark).await?));
            }
            (records, next, false)
        }
    };
    // A page is followed by another when it was full: of records, or of
    // the bytes a page of large ones holds.
    let held = records.len() as i64;
    let full = cut || held == limit;
    Ok(ExportPage {
        records,
        next: next.filter(|_| full),
        next_rows: next_rows(limit, held, cut),
    })
}

#[cfg(test)]
mod tests {
    use super::{FIRST_ROWS, MOST_ROWS, next_rows};

    #[test]
    fn pages_of_small_rows_grow_to_the_most() {
        let mut rows = FIRST_ROWS;
        let mut asked = vec![rows];
        while rows < MOST_ROWS {
            rows = next_rows(rows, rows, false);
            asked.push(rows);
        }
        assert_eq!(asked, [64, 128, 256, 500]);
        assert_eq!(next_rows(MOST_ROWS, MOST_ROWS, false), MOST_ROWS);
    }

    #[test]
    fn pages_cut_by_their_bytes_ask_for_about_what_they_held() {
        // 128 KiB values: a page of 2 MiB holds 16.
        assert_eq!(next_rows(64, 16, true), 32);
        assert_eq!(next_rows(32, 16, true), 32);
        // Values of a megabyte: one or two a page.
        assert_eq!(next_rows(64, 1, true), 2);
        assert_eq!(next_rows(2, 2, true), 4);
    }
}
