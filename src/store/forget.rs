//! Forgetting a user: every row that holds their content, counted and then
//! hard-deleted in one transaction, on both backends with the same
//! statements. Search needs no statement of its own: Postgres keeps the
//! vectors in columns of the rows deleted here (and rows the triggers keep
//! beside them), and SQLite's FTS tables are kept by triggers on them.
//!
//! Every statement takes $1 tenant, $2 app, $3 user and $4 the further
//! execution ids. The order matters: the statements find the user's facts
//! through their episodes' lineage, and everything through their sessions,
//! so lineage goes before episodes and sessions go last.
//!
//! On Postgres the forget first waits out the creation of the user's
//! sessions and keeps new ones from being made ([`LOCK_USER`]), then locks
//! the user's sessions, the row every write to a session takes before its
//! episodes or working memory: taken after those, a write racing the
//! forget deadlocked with it and one of them failed. Between the two it
//! holds the writers of the facts it deletes, as applying deltas does;
//! after them, the heads of the memory keys it deletes, as sets and
//! purges take them before their versions, and once the rest is deleted
//! the heads of keys committed while it waited for those.

use super::sql::{Cols, Dialect, Param, Run, Sql, params};
use crate::context::Tenant;
use crate::data::{ForgetCounts, Forgetting};
use crate::error::Result;

/// The user's session ids, for `concat!`.
macro_rules! user_sessions {
    () => {
        "(SELECT id FROM sessions WHERE tenant = $1 AND app = $2 AND user_id = $3)"
    };
}

/// The user's episode ids, for `concat!`.
macro_rules! user_episodes {
    () => {
        "(SELECT id FROM episodes WHERE tenant = $1 AND app = $2 AND user_id = $3)"
    };
}

/// Rows (with `scope_type` and `scope`) of the execution scopes of the
/// user's runs, for `concat!`.
macro_rules! user_runs {
    () => {
        concat!(
            "scope_type = 3 AND (scope IN ",
            user_sessions!(),
            " OR scope = ANY($4::text[]))"
        )
    };
}

/// Facts the user owns, and app-wide facts derived only from their
/// episodes, for `concat!` in a statement on `facts`.
macro_rules! user_facts {
    () => {
        concat!(
            "tenant = $1 AND app = $2 AND (user_id = $3 OR (user_id = '' \
             AND EXISTS (SELECT 1 FROM fact_sources s WHERE s.tenant = $1 \
               AND s.fact_id = facts.id AND s.episode_id IN ",
            user_episodes!(),
            ") AND NOT EXISTS (SELECT 1 FROM fact_sources s WHERE s.tenant = $1 \
               AND s.fact_id = facts.id AND s.episode_id NOT IN ",
            user_episodes!(),
            ")))"
        )
    };
}

/// The advisory lock on a user of an app, for `concat!`: held shared by
/// whoever creates a session of theirs ([`HOLD_USER`]), alone by a forget.
macro_rules! user_lock {
    () => {
        "hashtextextended('engram.user/' || $1 || '/' || $2 || '/' || $3, 0)"
    };
}

/// Taken by a session's creation on Postgres ($1 tenant, $2 app, $3 user),
/// so that no session of a user being forgotten appears mid-forget.
pub(super) static HOLD_USER: Sql = Sql::new(concat!(
    "SELECT pg_advisory_xact_lock_shared(",
    user_lock!(),
    ")"
));

static LOCK_USER: Sql = Sql::new(concat!(
    "SELECT pg_advisory_xact_lock(",
    user_lock!(),
    ") WHERE cardinality($4::text[]) >= 0"
));

static LOCK_SESSIONS: Sql = Sql::new(
    "SELECT 1 FROM sessions WHERE tenant = $1 AND app = $2 AND user_id = $3 \
     AND cardinality($4::text[]) >= 0 ORDER BY id FOR UPDATE",
);

/// The heads of the user's execution scopes, in the order a group of sets
/// takes them. Taken only as the heads were deleted, after the versions,
/// a set of one of them that committed meanwhile left a version without
/// its head (every later set of the key then failed on it), and a set or
/// a purge holding a head the forget waited for deadlocked with it.
static LOCK_HEADS: Sql = Sql::new(concat!(
    "SELECT scope, key FROM memory_heads WHERE tenant = $1 AND ",
    user_runs!(),
    " ORDER BY scope_type, scope, key FOR UPDATE"
));

/// The heads of the user's runs again, once the rest is deleted: a key
/// whose call committed while the forget waited for [`LOCK_HEADS`] (the
/// audit record of a purge that held the heads before it, a set of a new
/// key) is gone from that statement's snapshot but is the user's all the
/// same. Those another call holds are left to it, as at the start.
static LOCK_LATER_HEADS: Sql = Sql::new(concat!(
    "SELECT scope, key FROM memory_heads WHERE tenant = $1 AND ",
    user_runs!(),
    " ORDER BY scope_type, scope, key FOR UPDATE SKIP LOCKED"
));

static COUNT_SESSIONS: Sql = Sql::new(
    "SELECT count(*) FROM sessions WHERE tenant = $1 AND app = $2 AND user_id = $3 \
     AND cardinality($4::text[]) >= 0",
);

static COUNT_EPISODES: Sql = Sql::new(
    "SELECT count(*) FROM episodes WHERE tenant = $1 AND app = $2 AND user_id = $3 \
     AND cardinality($4::text[]) >= 0",
);

static COUNT_FACTS: Sql = Sql::new(concat!(
    "SELECT count(*) FROM facts WHERE cardinality($4::text[]) >= 0 AND ",
    user_facts!()
));

static COUNT_WORKING: Sql = Sql::new(concat!(
    "SELECT (SELECT count(*) FROM working_memory WHERE tenant = $1 AND session_id IN ",
    user_sessions!(),
    ") + (SELECT count(*) FROM working_tasks WHERE tenant = $1 AND session_id IN ",
    user_sessions!(),
    ") + (SELECT count(*) FROM working_cache WHERE tenant = $1 AND session_id IN ",
    user_sessions!(),
    ") + cardinality($4::text[]) * 0"
));

static COUNT_SCOPES: Sql = Sql::new(concat!(
    "SELECT count(DISTINCT scope) FROM memory_heads WHERE tenant = $1 AND ",
    user_runs!()
));

static COUNT_VERSIONS: Sql = Sql::new(concat!(
    "SELECT count(*) FROM memory_versions WHERE tenant = $1 AND ",
    user_runs!()
));

/// The deletes, in order, before memory's and [`LAST_DELETES`].
static DELETES: [Sql; 8] = [
    Sql::new(concat!(
        "DELETE FROM embedding_outbox WHERE tenant = $1 AND ((source = 3 AND scope IN ",
        user_sessions!(),
        ") OR (source = 2 AND key IN (SELECT id FROM facts WHERE ",
        user_facts!(),
        ")) OR (source = 1 AND ",
        user_runs!(),
        "))"
    )),
    Sql::new(concat!(
        "DELETE FROM facts WHERE cardinality($4::text[]) >= 0 AND ",
        user_facts!()
    )),
    Sql::new(concat!(
        "DELETE FROM fact_sources WHERE tenant = $1 AND cardinality($4::text[]) >= 0 \
         AND episode_id IN ",
        user_episodes!()
    )),
    Sql::new(concat!(
        "DELETE FROM working_tasks WHERE tenant = $1 AND cardinality($4::text[]) >= 0 \
         AND session_id IN ",
        user_sessions!()
    )),
    Sql::new(concat!(
        "DELETE FROM working_cache WHERE tenant = $1 AND cardinality($4::text[]) >= 0 \
         AND session_id IN ",
        user_sessions!()
    )),
    Sql::new(concat!(
        "DELETE FROM working_memory WHERE tenant = $1 AND cardinality($4::text[]) >= 0 \
         AND session_id IN ",
        user_sessions!()
    )),
    // A run's retention policy goes with the run: it would apply to a run
    // made again under the same id. Its runs update it in statements of
    // their own, so this waits for one at most.
    Sql::new(concat!(
        "DELETE FROM memory_retention WHERE tenant = $1 AND ",
        user_runs!()
    )),
    Sql::new(
        "DELETE FROM episodes WHERE tenant = $1 AND app = $2 AND user_id = $3 \
         AND cardinality($4::text[]) >= 0",
    ),
];

/// The records of what happened to the user's keys (changes, request
/// ids, purges), by scope: they outlive a key's head.
macro_rules! memory_record {
    ($table:literal, $row:literal, $held:literal) => {
        Sql::new(concat!(
            "DELETE FROM ",
            $table,
            " WHERE (",
            $row,
            ") IN (SELECT ",
            $row,
            " FROM ",
            $table,
            " WHERE tenant = $1 AND ",
            user_runs!(),
            $held,
            ")"
        ))
    };
}

/// SQLite: memory's rows, after the sessions'. Versions before heads: the
/// search triggers find a version's index row through its key's.
static MEMORY_DELETES: [Sql; 5] = [
    Sql::new(concat!(
        "DELETE FROM memory_versions WHERE tenant = $1 AND ",
        user_runs!()
    )),
    memory_record!("memory_changes", "revision", ""),
    memory_record!("memory_request_ids", "tenant, request_id", ""),
    memory_record!("memory_purges", "tenant, scope_type, scope, key", ""),
    Sql::new(concat!(
        "DELETE FROM memory_heads WHERE tenant = $1 AND ",
        user_runs!()
    )),
];

/// Postgres: the versions and heads of the keys the forget locked
/// ([`LOCK_HEADS`], [`LOCK_LATER_HEADS`]; $2 their scopes, $3 their keys),
/// and the records of the user's scopes but those another call holds. A
/// key a call racing the forget holds is left whole to it rather than
/// waited for: such a call may hold the key's rows while it
/// waits for a head the forget holds (a deadlock, and one of the two
/// failed), and a later statement seeing only part of the key deleted its
/// head and left a version behind, on which every later set of the key
/// failed.
static HELD_VERSIONS: Sql = Sql::new(
    "DELETE FROM memory_versions WHERE tenant = $1 AND scope_type = 3 \
     AND (scope, key) IN (SELECT * FROM unnest($2::text[], $3::text[]))",
);
static HELD_HEADS: Sql = Sql::new(
    "DELETE FROM memory_heads WHERE tenant = $1 AND scope_type = 3 \
     AND (scope, key) IN (SELECT * FROM unnest($2::text[], $3::text[]))",
);
/// The changes are not skipped but waited for: the one call that holds
/// them is a purge that found a key emptied by another and keeps that
/// purge's record, which it holds; once it commits, the record goes too.
static MEMORY_RECORDS_PG: [Sql; 3] = [
    memory_record!("memory_changes", "revision", ""),
    memory_record!(
        "memory_request_ids",
        "tenant, request_id",
        " FOR UPDATE SKIP LOCKED"
    ),
    memory_record!(
        "memory_purges",
        "tenant, scope_type, scope, key",
        " FOR UPDATE SKIP LOCKED"
    ),
];

/// The last deletes: what the ones before find the user's rows through.
static LAST_DELETES: [Sql; 2] = [
    Sql::new(concat!(
        "DELETE FROM memory_executions WHERE tenant = $1 AND (execution_id IN ",
        user_sessions!(),
        " OR execution_id = ANY($4::text[]))"
    )),
    Sql::new(
        "DELETE FROM sessions WHERE tenant = $1 AND app = $2 AND user_id = $3 \
         AND cardinality($4::text[]) >= 0",
    ),
];

/// A locked head's scope and key.
fn scope_key(row: &impl Cols) -> Result<(String, String)> {
    Ok((row.text(0)?, row.text(1)?))
}

/// Counts what forgetting the user deletes and, unless it is a dry run,
/// deletes it, inside the caller's transaction.
pub(super) async fn forget_in<C: Run>(
    conn: &mut C,
    tenant: &Tenant,
    forget: &Forgetting,
) -> Result<ForgetCounts> {
    let params: &[Param<'_>] = params![
        tenant.as_str(),
        forget.app.as_str(),
        forget.user.as_str(),
        forget.execution_ids.as_slice(),
    ];
    // The keys whose heads the forget holds (Postgres).
    let mut held = Vec::new();
    if !forget.dry_run && C::DIALECT == Dialect::Postgres {
        conn.exec(&LOCK_USER, params).await?;
        // The facts go too: their writers are held, the app-wide ones
        // ("") and the user's, as deltas hold them.
        let app = forget.app.as_str();
        super::consolidation::hold_fact_writers(
            conn,
            tenant,
            &[(app, ""), (app, forget.user.as_str())],
        )
        .await?;
        conn.exec(&LOCK_SESSIONS, params).await?;
        held = conn.all(&LOCK_HEADS, params, scope_key).await?;
    }
    let mut counts = ForgetCounts {
        sessions: conn.count(&COUNT_SESSIONS, params).await?,
        episodes: conn.count(&COUNT_EPISODES, params).await?,
        facts: conn.count(&COUNT_FACTS, params).await?,
        working_items: conn.count(&COUNT_WORKING, params).await?,
        execution_scopes: conn.count(&COUNT_SCOPES, params).await?,
        memory_versions: conn.count(&COUNT_VERSIONS, params).await?,
    };
    if !forget.dry_run {
        for sql in &DELETES {
            conn.exec(sql, params).await?;
        }
        match C::DIALECT {
            Dialect::Postgres => {
                held.extend(conn.all(&LOCK_LATER_HEADS, params, scope_key).await?);
                held.sort_unstable();
                held.dedup();
                let (scopes, keys): (Vec<String>, Vec<String>) = held.into_iter().unzip();
                let held = params![tenant.as_str(), scopes.as_slice(), keys.as_slice()];
                // What was deleted: the count before took no lock.
                counts.memory_versions =
                    i64::try_from(conn.exec(&HELD_VERSIONS, held).await?).unwrap_or(i64::MAX);
                for sql in &MEMORY_RECORDS_PG {
                    conn.exec(sql, params).await?;
                }
                conn.exec(&HELD_HEADS, held).await?;
            }
            Dialect::Sqlite => {
                for sql in &MEMORY_DELETES {
                    conn.exec(sql, params).await?;
                }
            }
        }
        for sql in &LAST_DELETES {
            conn.exec(sql, params).await?;
        }
    }
    Ok(counts)
}
