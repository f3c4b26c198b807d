//! Persistence: the ports of `crate::ports` implemented by a Postgres
//! backend (production) and a SQLite backend (the embedded default), each
//! with its own migrations. The URL scheme chooses one at start-up. Nothing
//! here knows about gRPC, and nothing here decides a domain rule: the store
//! reports what it found and the domain says what that means.
//!
//! # Lock order on Postgres
//!
//! SQLite's single writer runs one transaction at a time. On Postgres the
//! writers that take more than one lock take them in one order, so that
//! two never each hold what the other waits for (Postgres then fails one
//! of them; see [`TRANSACTION_CONFLICTS`]):
//!
//! 1. advisory locks, in this order: an import of the tenant
//!    (`transfer::import`), a user being forgotten (`forget`), the tenant's
//!    session creators, a rule, the writers of owners' facts (in bucket
//!    order, `consolidation::hold_fact_writers`), the counter of an owner's
//!    facts;
//! 2. sessions' rows, in id order, before anything of theirs (episodes,
//!    working memory): appends and their groups, evictions, ends, deletes,
//!    cleanups and forgets all lock the session first;
//! 3. a purge's records of what its keys lose (`memory_purges`), in key
//!    order, so that purges sharing a key take turns (a forget skips those
//!    held);
//! 4. then the rows a statement changes: memory heads in key order before
//!    anything of their keys (a group of sets; a purge, those of the keys
//!    it recorded, against deletion only; a forget, those of the user's
//!    runs; a compaction, its sources' and its target's, against writes
//!    only), facts as their deltas resolve them (under their owner's
//!    lock);
//! 5. after its heads, the changes of the keys a purge of a run recorded
//!    but found gone (`FOR KEY SHARE`): a key another purge emptied keeps
//!    its record, and a forget deleting the run's changes waits for the
//!    purge and then deletes that record too; a key a forget deleted has
//!    no changes left, and the purge drops its record itself.
//!
//! One writer takes its rows in an order it is given: an import, in its
//! file's (`transfer::import`). An export's file is in the order above;
//! a file in another order can deadlock with writers of its keys, and
//! the import is then refused as raced (`SOURCE_CHANGED`), while a group
//! of sets that Postgres failed instead runs its writes again one by one.
//!
//! A fork creates its target's keys in key order, as a group of sets does
//! (`time_travel::a_fork_creates_its_keys_in_the_order_sets_do`).
//!
//! A row that does not exist yet cannot be taken in order: a compaction
//! into a new key holds its sources and then creates the key, so a group
//! of sets that created the key first and waits for a source deadlocks
//! with it (`compaction_races.rs`). Whichever Postgres fails, nothing is
//! lost: the sets run again one by one, and a compaction answers
//! `TRANSACTION_CONFLICT`, as any call Postgres fails for another does.
//!
//! The embedding worker, in the background, waits for no one: it skips
//! rows another transaction holds (`SKIP LOCKED`) and tries those items
//! again later, and it writes each row once a transaction (a row it wrote
//! itself would be checked against its session again, a wait).
//!
//! A write that reads before it writes locks what it read (`FOR UPDATE`,
//! or `FOR KEY SHARE` where it only needs the row to stay) or rechecks it
//! in the writing statement, and a key another writer took meanwhile is a
//! retry or a reason (`SESSION_CHANGED`, `SOURCE_CHANGED`), not an internal
//! error. `tests/api/races.rs` and the `*_races.rs` files race these.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, Reason, Result};
use crate::memory::ports::{Mutation, Write};

mod consolidation;
mod embeddings;
mod forget;
mod group;
mod memory;
mod past;
mod postgres;
mod retention;
mod search;
mod sessions;
mod sql;
mod sqlite;
mod transfer;
mod working;

pub use postgres::PgStore;

/// The Postgres statements `engram bench` runs through pgbench as its
/// baseline, taken from the store itself so the two cannot drift apart.
pub(crate) mod pg_statements {
    pub(crate) use super::postgres::SET_ANY;
    pub(crate) use super::postgres::sessions::APPEND_SQL;

    /// `Get`: the newest version of a key, through its head.
    pub(crate) fn get_current_sql() -> &'static str {
        super::memory::CURRENT.postgres()
    }

    /// `Recent` at one level (session given, agent given).
    pub(crate) fn recent_sql(session: bool, agent: bool) -> &'static str {
        super::sessions::recent_sql(session, agent).postgres()
    }

    /// The bytes parameter of [`recent_sql`] for a read of `limit`.
    pub(crate) fn recent_row_bytes(limit: i64) -> i64 {
        super::sessions::recent_row_bytes(limit)
    }
}
pub use sqlite::backup::{Copied, backup as sqlite_backup};
pub use sqlite::{SqliteStore, SqliteSynchronous, WAL_LIMIT_BYTES};

/// Settings shared by both backends.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    /// How long a call waits for a connection before it fails with
    /// `UNAVAILABLE`: the bound on how long a call hangs when the database
    /// is gone.
    pub acquire_timeout: Duration,
    pub sqlite_synchronous: SqliteSynchronous,
    /// The most memory writes one transaction commits together (group
    /// commit, see `group.rs`); 1 commits every write on its own.
    pub group_commit_max: usize,
    /// How long a feed's horizon waits for transactions to end before the
    /// log names them (Postgres; see `postgres::feeds`).
    pub feed_wait_warn: Duration,
}

/// Which backend a database URL selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn of(url: &str) -> Result<Self, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else {
            Err("the database URL must start with sqlite:// or postgres://".to_owned())
        }
    }
}

/// Whether an error says the connection itself broke (a reset, a restart
/// during the handshake): a protocol or I/O error, and on Postgres the
/// connection exceptions (08) and operator intervention such as a
/// shutdown (57P). The Postgres pool watches for these to re-check its
/// idle connections.
fn connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}

/// Whether an error says the database refused a write as read-only
/// (`25006`): Engram's own reads never write, so its database is a
/// standby (after a failover, while the address still names the old
/// primary) or was set `default_transaction_read_only` by an operator. The
/// call hears `UNAVAILABLE` (retry), and the Postgres pool reopens its
/// connections.
fn read_only_server(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(READ_ONLY))
}

/// Postgres's `read_only_sql_transaction`.
const READ_ONLY: &str = "25006";

/// Whether a store error is a unique key's violation: a row written by
/// another transaction between a read that found none and the insert.
pub(crate) fn unique_violation(err: &Error) -> bool {
    database_error(err, |db| db.is_unique_violation())
}

/// Whether a store error is Postgres ending a session whose transaction
/// stayed idle past `idle_in_transaction_session_timeout` (`25P03`). Only
/// an export's snapshot waits between statements, on its client.
pub(crate) fn idle_too_long(err: &Error) -> bool {
    database_error(err, |db| db.code().as_deref() == Some("25P03"))
}

/// Whether a store error is a transaction Postgres rolled back for the
/// sake of another (see [`TRANSACTION_CONFLICTS`]).
pub(crate) fn conflicted(err: &Error) -> bool {
    matches!(
        err,
        Error::Conflict {
            reason: Reason::TransactionConflict,
            ..
        }
    )
}

/// The SQLSTATEs of a transaction rolled back because of another one, not
/// because of anything wrong with it: a deadlock (`40P01`: this transaction
/// and another each waited for a row the other held) and a serialization
/// failure (`40001`). Writers take rows in one order (the lock order
/// above), so neither should happen; where one still does (a row that does
/// not exist yet cannot be locked in order), the caller hears `ABORTED`,
/// retry, and not `INTERNAL`, which would say Engram has a bug it cannot
/// name.
const TRANSACTION_CONFLICTS: [&str; 2] = ["40P01", "40001"];

/// The SQLSTATEs of a statement the database gave up on: canceled
/// (`57014`: `statement_timeout`, or an operator's `pg_cancel_backend`) or
/// refused a lock it waited for too long (`55P03`: `lock_timeout`). Both
/// are the operator's settings, not Engram's (it sets neither), and the
/// caller hears which, with nothing of the transaction written, not
/// `INTERNAL`.
const DATABASE_TIMEOUTS: [&str; 2] = ["57014", "55P03"];

/// The codes of a database whose storage is full: Postgres's `disk_full`
/// (`53100`, a table or index that cannot grow) and SQLite's `SQLITE_FULL`
/// (`13`, the file or its write-ahead log). The statement or transaction
/// failed whole, and reads go on: the caller hears `RESOURCE_EXHAUSTED`,
/// which a retry does not cure, not `UNAVAILABLE` or `INTERNAL`, and the
/// log says why.
const DATABASE_FULL: [&str; 2] = ["53100", "13"];

fn database_error(err: &Error, is: impl Fn(&dyn sqlx::error::DatabaseError) -> bool) -> bool {
    matches!(err, Error::Internal { source }
    if source.downcast_ref::<sqlx::Error>().is_some_and(|err| {
        matches!(err, sqlx::Error::Database(db) if is(db.as_ref()))
    }))
}

/// Database errors are classified once: connection trouble is `Unavailable`
/// (retryable), a statement the database gave up on `DependencyUnavailable`
/// (retry), a transaction rolled back for another `Conflict` (retry),
/// everything else `Internal`. Neither shows SQL to a client.
impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        let code = match &err {
            sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
            _ => None,
        };
        let code = code.as_deref().unwrap_or("");
        // Also retryable: a pool with no connection to spare, insufficient
        // resources (53), SQLite's SQLITE_BUSY / SQLITE_LOCKED past the busy
        // timeout.
        if DATABASE_FULL.contains(&code) {
            tracing::error!(error = %err, "the database's storage is full");
            return Error::ResourceExhausted {
                reason: Reason::DatabaseFull,
                message: "the database's storage is full and the call wrote nothing; free \
                          space for the database, or purge what it need not keep, and retry"
                    .to_owned(),
                limit: "",
                value: 0,
            };
        }
        let unavailable = connection_lost(&err)
            || read_only_server(&err)
            || matches!(err, sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
            || code.starts_with("53")
            || code == "5"
            || code == "6";
        if unavailable {
            Error::Unavailable { source: err.into() }
        } else if DATABASE_TIMEOUTS.contains(&code) {
            tracing::warn!(error = %err, "the database gave up on a statement");
            Error::DependencyUnavailable {
                reason: Reason::DatabaseTimeout,
                message: "the database gave up on the call's statement (its statement_timeout \
                          or lock_timeout, or an operator's cancel) and its transaction was \
                          rolled back; retry, or raise the setting for Engram's database role"
                    .to_owned(),
            }
        } else if TRANSACTION_CONFLICTS.contains(&code) {
            // The detail (which rows, which other process) is for the log.
            tracing::warn!(error = %err, "a transaction was rolled back for a concurrent one");
            Error::Conflict {
                reason: Reason::TransactionConflict,
                message: "the call conflicted with a concurrent call and its transaction was \
                          rolled back; retry"
                    .to_owned(),
            }
        } else {
            Error::internal(err)
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        match err {
            sqlx::migrate::MigrateError::Execute(err) => err.into(),
            other => Error::internal(other),
        }
    }
}

/// Microseconds since the epoch, as SQLite stores timestamps.
fn to_micros(time: DateTime<Utc>) -> i64 {
    time.timestamp_micros()
}

fn from_micros(micros: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| Error::internal(format!("timestamp out of range: {micros}")))
}

/// What a database holds of the migrations embedded in this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrations {
    /// The versions applied to the database, oldest first (none before the
    /// first migration).
    pub applied: Vec<i64>,
    /// The embedded migrations not applied yet, `(version, description)`,
    /// in the order they run.
    pub pending: Vec<(i64, String)>,
    /// The newest migration this binary has.
    pub newest_known: i64,
}

impl Migrations {
    fn of(migrator: &sqlx::migrate::Migrator, mut applied: Vec<i64>) -> Migrations {
        applied.sort_unstable();
        let ups = migrator
            .iter()
            .filter(|m| m.migration_type.is_up_migration());
        Migrations {
            pending: ups
                .clone()
                .filter(|m| applied.binary_search(&m.version).is_err())
                .map(|m| (m.version, m.description.to_string()))
                .collect(),
            newest_known: ups.map(|m| m.version).max().unwrap_or(0),
            applied,
        }
    }

    /// The newest version applied when the database is ahead of this
    /// binary: every embedded migration is applied, and so is at least one
    /// newer (a later release migrated it). Each migration keeps the
    /// release before it working (a rolling upgrade runs both), so a
    /// server of the older release may serve such a database; the
    /// migrator, which refuses migrations it does not know, is then not
    /// run.
    pub fn ahead(&self) -> Option<i64> {
        let newest = self.applied.last().copied()?;
        (self.pending.is_empty() && newest > self.newest_known).then_some(newest)
    }

    /// Fails when migrations are pending (for `--migrate=off`).
    pub fn require_current(&self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let missing: Vec<String> = self
            .pending
            .iter()
            .map(|(version, description)| format!("{version} ({description})"))
            .collect();
        Err(Error::FailedPrecondition {
            reason: Reason::Internal,
            message: format!(
                "the database schema is behind: migrations {} are not applied; run `engram migrate` \
                 or start with --migrate=auto",
                missing.join(", ")
            ),
        })
    }
}

/// Applies the pending migrations unless the database is ahead of this
/// binary ([`Migrations::ahead`]), which it says in a warning.
async fn migrate_unless_ahead<F>(
    migrator: &sqlx::migrate::Migrator,
    applied: Vec<i64>,
    run: F,
) -> Result<()>
where
    F: std::future::Future<Output = std::result::Result<(), sqlx::migrate::MigrateError>>,
{
    let migrations = Migrations::of(migrator, applied);
    if let Some(newest) = migrations.ahead() {
        tracing::warn!(
            newest,
            "the database schema is newer than this release (a later one migrated it); \
             serving it without migrating"
        );
        return Ok(());
    }
    let pending: Vec<String> = migrations
        .pending
        .iter()
        .map(|(version, description)| format!("{version:04} {description}"))
        .collect();
    if !pending.is_empty() {
        // A migration's statements are not logged (they would be, whole,
        // as slow statements): this says what is running while it runs.
        tracing::info!(
            migrations = %pending.join(", "),
            "applying migrations (on large tables some take minutes: see the README)"
        );
    }
    Ok(run.await?)
}

/// The shape of the head update a write needs: unconditional, "no live
/// value" (expected version 0) or "newest version is n".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadUpdate {
    SetAny,
    SetIfAbsent,
    SetIfVersion(i64),
    DeleteAny,
    DeleteIfVersion(i64),
}

impl HeadUpdate {
    fn of(write: &Write<'_>) -> Self {
        match (write.mutation, write.expected_version) {
            (Mutation::Set(_), None) => HeadUpdate::SetAny,
            (Mutation::Set(_), Some(0)) => HeadUpdate::SetIfAbsent,
            (Mutation::Set(_), Some(n)) => HeadUpdate::SetIfVersion(n),
            (Mutation::Delete, None) => HeadUpdate::DeleteAny,
            (Mutation::Delete, Some(n)) => HeadUpdate::DeleteIfVersion(n),
        }
    }

    /// The version the statement compares against (unused by the others).
    fn expected(self) -> i64 {
        match self {
            HeadUpdate::SetIfVersion(n) | HeadUpdate::DeleteIfVersion(n) => n,
            HeadUpdate::SetAny | HeadUpdate::SetIfAbsent | HeadUpdate::DeleteAny => 0,
        }
    }
}
