//! Storage behind one interface, with a Postgres backend (production) and a
//! SQLite backend (the embedded default), each with its own migrations. The
//! URL scheme chooses one at start-up. Nothing here knows about gRPC.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::context::Tenant;
use crate::error::{Error, Reason, Result};
use crate::memory::audit::{AuditRecord, MAX_RECORDED_KEYS};
use crate::memory::{
    Change, ChangeKind, Entry, Key, KeyPrefix, Provenance, Scope, ScopeSummary, ScopeType, Value,
};

pub mod consolidation;
mod postgres;
mod sessions;
mod sqlite;
pub mod working;

pub use consolidation::{ConsolidationStore, FactFilter, RunLock, RunRequest};
pub use postgres::PgStore;

/// The Postgres statements `engram bench` runs through pgbench as its
/// baseline, taken from the store itself so the two cannot drift apart.
pub(crate) mod pg_statements {
    pub(crate) use super::postgres::sessions::{
        APPEND_SQL, episodes_by_id_sql, recent_sql, session_sql,
    };
    pub(crate) use super::postgres::{SET_ANY, get_current_sql};
}
pub use sessions::{Append, CreateMode, EpisodeQuery, NewSession, SessionStore};
pub use sqlite::{SqliteStore, SqliteSynchronous};
pub use working::{CachePut, WorkingStore};

/// The ordered feeds readers follow: each position is final once it is at
/// or below the feed's settled horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Memory changes, by revision (`MemoryService.Watch`).
    Changes = 0,
    /// Episodes, by cursor (`EpisodeService.TailEpisodes`).
    Episodes = 1,
}

/// Settings shared by both backends.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    /// How long a call waits for a connection before it fails with
    /// `UNAVAILABLE`: the bound on how long a call hangs when the database
    /// is gone.
    pub acquire_timeout: Duration,
    pub sqlite_synchronous: SqliteSynchronous,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            sqlite_synchronous: SqliteSynchronous::Full,
        }
    }
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

/// What a write does to a key.
#[derive(Debug, Clone, Copy)]
pub enum Mutation<'a> {
    Set(&'a Value),
    Delete,
}

/// Marks a write as idempotent: a repeat with the same id and fingerprint
/// returns the first result.
#[derive(Debug, Clone, Copy)]
pub struct RequestStamp<'a> {
    pub id: &'a str,
    pub fingerprint: [u8; 32],
}

/// One write of a key: a new version, or a tombstone.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    pub scope: &'a Scope,
    pub key: &'a Key,
    pub mutation: Mutation<'a>,
    /// Compare-and-set: the newest version must be this one; 0 means the key
    /// must have no live value.
    pub expected_version: Option<i64>,
    pub request: Option<RequestStamp<'a>>,
    pub provenance: &'a Provenance,
    pub now: DateTime<Utc>,
    /// How the change feed reports this write.
    pub change: ChangeKind,
}

/// The newest version of a key and whether it is a tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub version: i64,
    pub deleted: bool,
}

#[derive(Debug, Clone)]
pub struct ListQuery<'a> {
    pub scope: &'a Scope,
    pub prefix: &'a KeyPrefix,
    /// Only keys after this one (the last key of the previous page).
    pub after: Option<&'a str>,
    pub limit: i64,
    pub include_reserved: bool,
    /// Newest key first (the audit trail); `after` then means "before".
    pub descending: bool,
}

/// Which scopes `list_scopes` returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScopeFilter<'a> {
    pub scope_type: Option<ScopeType>,
    /// Only execution scopes holding a version tagged with this flow id.
    pub flow_id: Option<&'a str>,
    /// Only execution scopes holding a version tagged with this flow name.
    pub flow_name: Option<&'a str>,
}

/// A purge of one key, or of every key of a scope.
#[derive(Debug, Clone)]
pub struct Purge<'a> {
    pub scope: &'a Scope,
    /// One key, or every key of the scope (audit keys never).
    pub key: Option<&'a Key>,
    /// Versions to keep per key; `None` deletes them all.
    pub keep: Option<i64>,
    /// Also purge keys whose newest version is a tombstone.
    pub include_deleted: bool,
    pub dry_run: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PurgeOutcome {
    pub versions_deleted: i64,
    pub keys_affected: i64,
    /// The audit record written, when anything was deleted for real.
    pub record: Option<AuditRecord>,
}

/// A source of a compaction and the head version it had when it was read;
/// the summary is only written if every source still has that version.
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    pub key: &'a Key,
    pub version: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReindexOutcome {
    pub versions_scanned: i64,
    pub tags_added: i64,
    /// Execution scopes whose flow is unknown, with their untagged versions.
    pub unknown: Vec<(String, i64)>,
}

/// The storage interface. Every method is scoped to one tenant, and every
/// write is one short transaction.
pub trait Store: SessionStore + ConsolidationStore + WorkingStore {
    /// Applies the pending migrations.
    fn migrate(&self) -> impl Future<Output = Result<()>> + Send;

    /// Fails when migrations are pending (for `--migrate=off`).
    fn check_schema(&self) -> impl Future<Output = Result<()>> + Send;

    /// A cheap round trip to the database, for health checks.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// Writes a new version of a key (or a tombstone) and returns it. Versions
    /// are dense under concurrent writers.
    fn write(
        &self,
        tenant: &Tenant,
        write: &Write<'_>,
    ) -> impl Future<Output = Result<Entry>> + Send;

    /// The newest version of a key, or a given one.
    fn get(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        version: Option<i64>,
    ) -> impl Future<Output = Result<Entry>> + Send;

    /// The newest version number of a key, if it has any version.
    fn head(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Head>>> + Send;

    /// Live entries of a scope in key order.
    fn list(
        &self,
        tenant: &Tenant,
        query: &ListQuery<'_>,
    ) -> impl Future<Output = Result<Vec<Entry>>> + Send;

    /// Up to `limit` versions of a key from `from_version` on, oldest first.
    fn history(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        from_version: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Entry>>> + Send;

    /// Scopes ordered by type then name, after the given one.
    fn list_scopes(
        &self,
        tenant: &Tenant,
        filter: ScopeFilter<'_>,
        after: Option<&Scope>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ScopeSummary>>> + Send;

    /// Hard-deletes old versions (see [`Purge`]) and, unless it is a dry run
    /// or nothing was deleted, writes `record` (completed with the counts) in
    /// the same transaction.
    fn purge(
        &self,
        tenant: &Tenant,
        purge: &Purge<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<PurgeOutcome>> + Send;

    /// Writes a compaction summary and its audit record in one transaction,
    /// only if every fenced source still has the version it was read at
    /// (else `Conflict`, reason `SOURCE_CHANGED`).
    fn compact(
        &self,
        tenant: &Tenant,
        fences: &[Fence<'_>],
        write: &Write<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<(Entry, AuditRecord)>> + Send;

    /// Records which flow an execution belongs to (first one wins; blanks
    /// are filled in later).
    fn register_execution(
        &self,
        tenant: &Tenant,
        execution_id: &str,
        flow_id: &str,
        flow_name: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The `(flow_id, flow_name)` of a known execution.
    fn execution_flow(
        &self,
        tenant: &Tenant,
        execution_id: &str,
    ) -> impl Future<Output = Result<Option<(String, String)>>> + Send;

    /// Backfills missing flow tags of execution-scoped versions from the
    /// registry (or only counts them when `apply` is false).
    fn reindex(
        &self,
        tenant: &Tenant,
        apply: bool,
    ) -> impl Future<Output = Result<ReindexOutcome>> + Send;

    /// Changes of a scope with `after < revision <= up_to`, oldest first.
    fn changes(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        prefix: &KeyPrefix,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Change>>> + Send;

    /// The settled horizon of a feed: every position at or below it is
    /// final (committed or never to appear), so readers may read up to it
    /// without missing a late commit. Updated as writes commit.
    fn horizon(
        &self,
        feed: Feed,
    ) -> impl Future<Output = Result<tokio::sync::watch::Receiver<i64>>> + Send;

    /// A horizon covering every write committed before the call: waits
    /// until nothing at or below the feed's newest position can still
    /// appear, then returns that position. For reads that must see the
    /// caller's own writes (a `RunRule` right after an append), where the
    /// shared [`horizon`](Self::horizon) may still be catching up.
    fn settled(&self, feed: Feed) -> impl Future<Output = Result<i64>> + Send;

    /// The connection pool now, for the metrics.
    fn pool_status(&self) -> crate::metrics::PoolStatus;

    /// The oldest revision still kept (older ones were pruned), if any.
    fn oldest_revision(&self) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Forgets changes written before `before`; returns how many.
    fn prune_changes(&self, before: DateTime<Utc>) -> impl Future<Output = Result<u64>> + Send;

    /// Forgets idempotency records written before `before`; returns how many.
    fn prune_request_ids(&self, before: DateTime<Utc>) -> impl Future<Output = Result<u64>> + Send;
}

/// Why a conditional write changed nothing, told from the key's head.
fn write_refused(write: &Write<'_>, head: Option<Head>) -> Error {
    let live = head.filter(|head| !head.deleted);
    match (write.mutation, write.expected_version) {
        (Mutation::Delete, _) if live.is_none() => match head {
            Some(head) => key_deleted(write.key, head.version),
            None => crate::memory::key_not_found_error(write.key),
        },
        (_, Some(expected)) => Error::VersionMismatch {
            expected,
            current: live.map_or(0, |head| head.version),
        },
        // An unconditional set always writes; reaching here means the head
        // changed under us in a way the statement did not expect.
        (_, None) => Error::internal("conditional write refused without a condition"),
    }
}

pub fn key_deleted(key: &Key, version: i64) -> Error {
    Error::NotFound {
        reason: Reason::KeyDeleted,
        message: format!("key {:?} was deleted at version {version}", key.as_str()),
        metadata: vec![
            ("key", key.as_str().to_owned()),
            ("version", version.to_string()),
        ],
    }
}

fn version_not_found(key: &Key, version: i64) -> Error {
    Error::NotFound {
        reason: Reason::VersionNotFound,
        message: format!("key {:?} has no version {version}", key.as_str()),
        metadata: vec![
            ("key", key.as_str().to_owned()),
            ("version", version.to_string()),
        ],
    }
}

/// Checks a replayed request against the first one with the same id.
fn check_replay(stamp: &RequestStamp<'_>, stored_fingerprint: &[u8]) -> Result<()> {
    if stored_fingerprint == stamp.fingerprint {
        Ok(())
    } else {
        Err(Error::invalid(
            Reason::RequestIdReused,
            "request_id",
            format!(
                "{:?} was already used for a different request; use a new id for a new request",
                stamp.id
            ),
        ))
    }
}

/// Builds an entry of a replayed request whose version has since been purged.
fn ensure_found(entry: Option<Entry>, key: &Key, version: i64) -> Result<Entry> {
    entry.ok_or_else(|| version_not_found(key, version))
}

/// Database errors are classified once: connection trouble is `Unavailable`
/// (retryable), everything else `Internal`. Neither shows SQL to a client.
impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        // A protocol error is a connection that broke mid-conversation (a
        // restart during the handshake, a reset). Postgres: connection
        // exceptions (08), operator intervention such as a shutdown (57P).
        let broken = match &err {
            sqlx::Error::Io(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
            _ => false,
        };
        // Every sqlx error passes here, so this is where the Postgres pool
        // learns of a broken connection (a SQLite I/O error costs it no more
        // than a ping of each idle connection).
        if broken {
            postgres::pool::connection_broke();
        }
        // Also retryable: a pool with no connection to spare, insufficient
        // resources (53), SQLite's SQLITE_BUSY / SQLITE_LOCKED past the busy
        // timeout.
        let unavailable = broken
            || match &err {
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                sqlx::Error::Database(db) => db
                    .code()
                    .is_some_and(|code| code.starts_with("53") || code == "5" || code == "6"),
                _ => false,
            };
        if unavailable {
            Error::Unavailable { source: err.into() }
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

/// A row of the versions table as both backends read it.
struct VersionRow {
    key: String,
    version: i64,
    value: Option<String>,
    deleted: bool,
    execution_id: String,
    flow_id: String,
    flow_name: String,
    create_time: DateTime<Utc>,
}

impl VersionRow {
    fn into_entry(self, scope: &Scope) -> Result<Entry> {
        Ok(Entry {
            scope: scope.clone(),
            key: Key::from_store(self.key),
            version: self.version,
            value: self.value.map(Value::from_store).transpose()?,
            deleted: self.deleted,
            provenance: Provenance {
                execution_id: self.execution_id,
                flow_id: self.flow_id,
                flow_name: self.flow_name,
            },
            create_time: self.create_time,
        })
    }
}

/// Checks the applied migrations of a database against the embedded ones.
fn schema_is_current(migrator: &sqlx::migrate::Migrator, applied: &[i64]) -> Result<()> {
    let missing: Vec<String> = migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration() && !applied.contains(&m.version))
        .map(|m| format!("{} ({})", m.version, m.description))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
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

impl Mutation<'_> {
    fn value(&self) -> Option<&str> {
        match self {
            Mutation::Set(value) => Some(value.encoded()),
            Mutation::Delete => None,
        }
    }

    fn is_delete(&self) -> bool {
        matches!(self, Mutation::Delete)
    }
}

impl Write<'_> {
    /// The entry this write creates once the store has assigned `version`.
    fn entry(&self, version: i64) -> Entry {
        Entry {
            scope: self.scope.clone(),
            key: self.key.clone(),
            version,
            value: match self.mutation {
                Mutation::Set(value) => Some(value.clone()),
                Mutation::Delete => None,
            },
            deleted: self.mutation.is_delete(),
            provenance: self.provenance.clone(),
            create_time: self.now,
        }
    }
}

/// Turns a version row read for `Get` into the answer: a tombstone is
/// `NOT_FOUND` (reason `KEY_DELETED`).
fn live_entry(entry: Entry) -> Result<Entry> {
    if entry.deleted {
        Err(key_deleted(&entry.key, entry.version))
    } else {
        Ok(entry)
    }
}

/// Completes a purge record from the per-key counts of deleted versions.
fn purge_outcome(
    purge: &Purge<'_>,
    deleted: &[(String, i64, i64)],
    mut record: AuditRecord,
) -> PurgeOutcome {
    let versions_deleted = deleted.iter().map(|(_, n, _)| n).sum();
    let keys_affected = deleted.len() as i64;
    let wrote = !purge.dry_run && versions_deleted > 0;
    record.versions_deleted = versions_deleted;
    record.keys_affected = keys_affected;
    record.keep = purge.keep;
    record.source_keys = deleted
        .iter()
        .take(MAX_RECORDED_KEYS)
        .map(|(k, _, _)| k.clone())
        .collect();
    PurgeOutcome {
        versions_deleted,
        keys_affected,
        record: wrote.then_some(record),
    }
}

/// The write that stores an audit record.
fn audit_write<'a>(
    scope: &'a Scope,
    key: &'a Key,
    value: &'a Value,
    provenance: &'a Provenance,
    now: DateTime<Utc>,
) -> Write<'a> {
    Write {
        scope,
        key,
        mutation: Mutation::Set(value),
        expected_version: None,
        request: None,
        provenance,
        now,
        change: ChangeKind::Set,
    }
}

fn source_changed(key: &Key, read: i64, now: Option<i64>) -> Error {
    Error::Conflict {
        reason: Reason::SourceChanged,
        message: match now {
            Some(now) => format!(
                "{:?} changed while it was being summarised (read at version {read}, now {now}); nothing was written, compact again",
                key.as_str()
            ),
            None => format!(
                "{:?} was purged while it was being summarised; nothing was written",
                key.as_str()
            ),
        },
    }
}

/// A row of the change feed as both backends read it.
struct ChangeRow {
    revision: i64,
    kind: i16,
    key: String,
    version: i64,
    versions_deleted: i64,
    value: Option<String>,
    create_time: DateTime<Utc>,
}

impl ChangeRow {
    fn into_change(self) -> Result<Change> {
        Ok(Change {
            revision: self.revision,
            kind: ChangeKind::from_i16(self.kind)
                .ok_or_else(|| Error::internal(format!("unknown change kind {}", self.kind)))?,
            key: Key::from_store(self.key),
            version: self.version,
            versions_deleted: self.versions_deleted,
            value: self.value.map(Value::from_store).transpose()?,
            create_time: self.create_time,
        })
    }
}

/// A row of `list_scopes` as both backends read it.
fn scope_summary(scope_type: i16, name: String, entry_count: i64) -> Result<ScopeSummary> {
    Ok(ScopeSummary {
        scope: Scope {
            scope_type: ScopeType::from_i32(scope_type.into()).ok_or_else(|| {
                Error::internal(format!("unknown scope type {scope_type} in store"))
            })?,
            name: crate::memory::ScopeName::parse("scope", name).map_err(Error::internal)?,
        },
        entry_count,
    })
}
