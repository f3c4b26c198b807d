//! The SQLite store: the embedded default, one file, one process. What it
//! shares with Postgres is written once in `store/` (see `sql.rs`); this
//! module keeps the versioned write, purge and compaction on the single
//! writer, the feeds' horizons, connecting and migrating.
//!
//! All writes go through a single connection (SQLite admits one writer at a
//! time anyway; queueing in the pool instead of on the file lock keeps
//! `SQLITE_BUSY` away), each in a `BEGIN IMMEDIATE` transaction so another
//! process sharing the file waits its turn. Reads use a separate pool and
//! run beside the writer thanks to WAL.

use std::str::FromStr;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, Row, SqliteConnection};
use tokio::sync::watch;

pub mod backup;
mod fts;
mod run;
mod search;
mod sessions;
mod statistics;

use super::group::{Group, commit_failed, shared_steps};
use super::memory::{
    AuditWrite, MemoryWrites, OwnedWrite, PURGE_COUNTS, current_in, fence_moved, head_in, key_at,
    lock_ordered, purge_keys, purge_params, purge_victim, purged_row, version_in,
};
use super::past;
use super::sql::{Cols, Run, Sql, params};
use super::{HeadUpdate, Migrations, StoreOptions, migrate_unless_ahead, to_micros};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::memory::audit::AuditRecord;
use crate::memory::ports::{Compacted, Fence, Fork, Forked, Purge, PurgeOutcome, Write, Written};
use crate::memory::{ChangeKind, Entry, Key, Scope};
use crate::metrics::Grouped;
use crate::ports::{Database, Feed, Feeds};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// How hard SQLite syncs to disk. `Full` makes every commit
/// durable across power loss; `Normal` may lose the last commits then, but
/// never corrupts the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    Normal,
    Full,
}

// Parameters of the head statements: ?1 tenant, ?2 scope_type, ?3 scope,
// ?4 key, ?5 now, and ?6 the expected version where there is one.
const SET_ANY: &str = "INSERT INTO memory_heads (tenant, scope_type, scope, key, version, deleted, update_time) \
     VALUES (?1, ?2, ?3, ?4, 1, 0, ?5) \
     ON CONFLICT (tenant, scope_type, scope, key) \
     DO UPDATE SET version = version + 1, deleted = 0, update_time = excluded.update_time \
     RETURNING version";

const SET_IF_ABSENT: &str = "INSERT INTO memory_heads (tenant, scope_type, scope, key, version, deleted, update_time) \
     VALUES (?1, ?2, ?3, ?4, 1, 0, ?5) \
     ON CONFLICT (tenant, scope_type, scope, key) \
     DO UPDATE SET version = version + 1, deleted = 0, update_time = excluded.update_time \
     WHERE deleted = 1 \
     RETURNING version";

const SET_IF_VERSION: &str = "UPDATE memory_heads SET version = version + 1, deleted = 0, update_time = ?5 \
     WHERE tenant = ?1 AND scope_type = ?2 AND scope = ?3 AND key = ?4 AND version = ?6 \
     RETURNING version";

const DELETE_ANY: &str = "UPDATE memory_heads SET version = version + 1, deleted = 1, update_time = ?5 \
     WHERE tenant = ?1 AND scope_type = ?2 AND scope = ?3 AND key = ?4 AND deleted = 0 \
     RETURNING version";

const DELETE_IF_VERSION: &str = "UPDATE memory_heads SET version = version + 1, deleted = 1, update_time = ?5 \
     WHERE tenant = ?1 AND scope_type = ?2 AND scope = ?3 AND key = ?4 AND deleted = 0 \
     AND version = ?6 \
     RETURNING version";

/// Plain sets of distinct keys in three statements, for a group (see
/// `write_group`): the heads bumped, then a change per key, then a
/// version per key, as [`SET_ANY`] and `write_in` do for one. `?2` holds
/// the writes as a JSON array of rows `[scope_type, scope, key, time,
/// value, execution_id, flow_id, flow_name, change]`, to which each
/// statement's results are added (the version taken, then the revision),
/// so no statement joins: a join of `json_each` with a table is planned
/// from the table's statistics as a scan of the table (100 ms a
/// statement).
const HEADS_MANY: &str = "INSERT INTO memory_heads \
     (tenant, scope_type, scope, key, version, deleted, update_time) \
     SELECT ?1, w.value ->> 0, w.value ->> 1, w.value ->> 2, 1, 0, w.value ->> 3 \
     FROM json_each(?2) w WHERE true \
     ON CONFLICT (tenant, scope_type, scope, key) \
     DO UPDATE SET version = version + 1, deleted = 0, update_time = excluded.update_time \
     RETURNING scope_type, scope, key, version";

const CHANGES_MANY: &str = "INSERT INTO memory_changes \
     (tenant, scope_type, scope, key, kind, version, create_time) \
     SELECT ?1, w.value ->> 0, w.value ->> 1, w.value ->> 2, w.value ->> 8, w.value ->> 9, \
       w.value ->> 3 \
     FROM json_each(?2) w ORDER BY w.key \
     RETURNING scope_type, scope, key, revision";

const VERSIONS_MANY: &str = "INSERT INTO memory_versions (tenant, scope_type, scope, key, \
     version, value, deleted, execution_id, flow_id, flow_name, create_time, revision) \
     SELECT ?1, w.value ->> 0, w.value ->> 1, w.value ->> 2, w.value ->> 9, w.value ->> 4, 0, \
       w.value ->> 5, w.value ->> 6, w.value ->> 7, w.value ->> 3, w.value ->> 10 \
     FROM json_each(?2) w";

/// Plain sets of distinct keys stored together (see [`HEADS_MANY`]): each
/// one's outcome and revision, in the step's order.
async fn set_many_in(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    jobs: &[&OwnedWrite],
) -> Result<Vec<(Written, i64)>> {
    let writes: Vec<Write<'_>> = jobs.iter().map(|job| job.write()).collect();
    let mut rows: Vec<Vec<serde_json::Value>> = writes
        .iter()
        .map(|w| {
            vec![
                w.scope.scope_type.as_i16().into(),
                w.scope.name.as_str().into(),
                w.key.as_str().into(),
                to_micros(w.now).into(),
                w.mutation.value().unwrap_or("null").into(),
                w.provenance.execution_id.as_str().into(),
                w.provenance.flow_id.as_str().into(),
                w.provenance.flow_name.as_str().into(),
                w.change.as_i16().into(),
            ]
        })
        .collect();
    let versions = returned_in(conn, tenant, HEADS_MANY, &mut rows, &writes).await?;
    let revisions = returned_in(conn, tenant, CHANGES_MANY, &mut rows, &writes).await?;
    sqlx::query(VERSIONS_MANY)
        .bind(tenant.as_str())
        .bind(serde_json::Value::from(rows).to_string())
        .execute(&mut *conn)
        .await?;
    Ok(writes
        .iter()
        .zip(versions.into_iter().zip(revisions))
        .map(|(write, (version, revision))| (Written::Stored(write.entry(version)), revision))
        .collect())
}

/// Runs one of [`set_many_in`]'s statements over `rows`, which returns
/// one number per key (after the key's scope type, scope and name), and
/// adds that number to the key's row: the numbers in the writes' order.
async fn returned_in(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    statement: &'static str,
    rows: &mut [Vec<serde_json::Value>],
    writes: &[Write<'_>],
) -> Result<Vec<i64>> {
    let returned = sqlx::query(statement)
        .bind(tenant.as_str())
        .bind(serde_json::Value::from(rows.to_vec()).to_string())
        .fetch_all(&mut *conn)
        .await?;
    let mut taken: Vec<Option<i64>> = writes.iter().map(|_| None).collect();
    for row in &returned {
        let (scope_type, scope, key): (i16, String, String) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        taken[key_at(writes, scope_type, &scope, &key)?] = Some(row.try_get(3)?);
    }
    let taken: Vec<i64> = taken
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| Error::internal("a plain set stored nothing"))?;
    for (row, &number) in rows.iter_mut().zip(&taken) {
        row.push(number.into());
    }
    Ok(taken)
}

#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The database file.
    path: Arc<std::path::PathBuf>,
    /// How the pools' connections are opened; migrations open one more.
    connect: Arc<SqliteConnectOptions>,
    writer: SqlitePool,
    reader: SqlitePool,
    /// When the writer last took planner statistics, which the readers'
    /// connections opened before then lack.
    analyzed: Arc<statistics::Analyzed>,
    /// The newest committed position of each feed. With a single writer
    /// connection positions commit in order, so the newest is settled.
    horizons: Arc<[watch::Sender<i64>; 2]>,
    /// Memory writes committed together (none when group commit is off,
    /// and in the store the batcher itself writes with).
    writes: Option<Group<OwnedWrite, Written>>,
    /// Appends committed together, likewise.
    appends: Option<Group<super::sessions::OwnedAppend, crate::sessions::ports::Appended>>,
}

/// The size the write-ahead log is cut back to when it starts over after a
/// checkpoint. SQLite reuses the file rather than truncate it, so without
/// a limit one large transaction (an import, a purge, a fork) left it at
/// its largest for as long as the server ran: 139 MB beside a 171 MB
/// database after importing 120,000 versions, where a checkpoint cycle
/// needs about 4 MB (1,000 pages).
pub const WAL_LIMIT_BYTES: u64 = 16 * 1024 * 1024;

/// Whether a pooled connection comes back still counting a transaction,
/// which it can never leave: the next `BEGIN` on it fails. sqlx counts a
/// transaction until its `COMMIT` or `ROLLBACK` succeeds, but SQLite rolls
/// a transaction back by itself on some errors (a full disk at `COMMIT`,
/// `SQLITE_FULL`), after which its `ROLLBACK` fails too. Such a connection
/// is closed and another opened in its place; before this, a full disk
/// left the writer refusing every write until the server restarted, even
/// once space was freed. (The pool sends a ping on release, which the
/// connection's thread runs after the rollback queued before it, so the
/// count read here is the one that rollback left.)
fn stuck_in_transaction(conn: &sqlx::SqliteConnection) -> bool {
    use sqlx::Connection;
    conn.is_in_transaction()
}

impl SqliteStore {
    /// A pool on a SQLite file whose connections are set up as the
    /// store's are (the FTS5 function and tokenizer that its triggers and
    /// searches need), for writing straight into the tables: the bench's
    /// loaders, tests.
    pub async fn direct_pool(url: &str) -> Result<SqlitePool> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|err| Error::internal(format!("invalid sqlite URL: {err}")))?;
        Ok(SqlitePoolOptions::new()
            .after_connect(|conn, _| Box::pin(fts::register(conn)))
            .connect_with(connect)
            .await?)
    }

    /// When no file is at `url` yet: its migrations, every one pending,
    /// learnt without making it (`engram migrate --check`). `None` when the
    /// file exists, or the URL is not one of a file.
    pub fn migrations_if_missing(url: &str) -> Option<Migrations> {
        let connect = SqliteConnectOptions::from_str(url).ok()?;
        let missing = !connect.get_filename().exists();
        missing.then(|| Migrations::of(&MIGRATOR, Vec::new()))
    }

    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|err| Error::internal(format!("invalid sqlite URL: {err}")))?;
        if connect.get_filename().as_os_str() == ":memory:" || url.contains("mode=memory") {
            return Err(Error::internal(
                "in-memory SQLite is not supported (each connection would see its own database); \
                 use a file such as sqlite://engram.db",
            ));
        }
        let path = Arc::new(connect.get_filename().to_path_buf());
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.sqlite_synchronous {
                SqliteSynchronous::Normal => sqlx::sqlite::SqliteSynchronous::Normal,
                SqliteSynchronous::Full => sqlx::sqlite::SqliteSynchronous::Full,
            })
            .busy_timeout(options.acquire_timeout)
            .foreign_keys(true)
            .pragma("analysis_limit", statistics::ANALYSIS_LIMIT.to_string())
            .pragma("journal_size_limit", WAL_LIMIT_BYTES.to_string());
        // Every connection gets the FTS5 function search scores with.
        let pool = |max: u32| {
            SqlitePoolOptions::new()
                .max_connections(max)
                .acquire_timeout(options.acquire_timeout)
                .after_connect(|conn, _| Box::pin(fts::register(conn)))
        };
        let writer = pool(1)
            .before_acquire(|conn, _| {
                let stuck = stuck_in_transaction(conn);
                Box::pin(async move { Ok(!stuck) })
            })
            .connect_with(connect.clone())
            .await?;
        let analyzed = Arc::new(statistics::Analyzed::new());
        let reader = pool(options.max_connections.max(1))
            .before_acquire({
                let analyzed = analyzed.clone();
                move |conn, meta| {
                    let current = !analyzed.is_older(meta.age) && !stuck_in_transaction(conn);
                    Box::pin(async move { Ok(current) })
                }
            })
            .connect_with(connect.clone())
            .await?;
        let mut store = SqliteStore {
            path,
            connect: Arc::new(connect),
            writer,
            reader,
            analyzed,
            horizons: Arc::new([watch::channel(0).0, watch::channel(0).0]),
            writes: None,
            appends: None,
        };
        if options.group_commit_max > 1 {
            let max = options.group_commit_max;
            store.writes = Some(Group::on(
                Grouped::Write,
                &store,
                max,
                1,
                |store: Self, tenant, jobs| async move { store.write_group(&tenant, jobs).await },
            ));
            store.appends = Some(Group::on(
                Grouped::Append,
                &store,
                max,
                1,
                |store: Self, tenant, jobs| async move { store.append_group(&tenant, jobs).await },
            ));
        }
        Ok(store)
    }

    /// Makes this process the one that serves the file: an exclusive lock
    /// on `<file>-serve.lock`, held while the returned handle lives (the
    /// operating system drops it if the process dies). The embedded store
    /// is one process by design: its tails and watches follow the writes of
    /// their own process, so a second server on the file would miss the
    /// first one's. One-off commands (`migrate`, `reembed`) take no lock.
    pub fn lock_for_serving(&self) -> Result<std::fs::File> {
        let mut name = self.path.as_os_str().to_owned();
        name.push("-serve.lock");
        let lock_path = std::path::PathBuf::from(name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|err| {
                Error::internal(format!("cannot open {}: {err}", lock_path.display()))
            })?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::FailedPrecondition {
                reason: crate::error::Reason::DatabaseUnavailable,
                message: format!(
                    "another engram server is already serving {} (the embedded SQLite store is \
                     served by one process; stop it first, or use Postgres for several replicas)",
                    self.path.display()
                ),
            }),
            Err(std::fs::TryLockError::Error(err)) => Err(Error::internal(format!(
                "cannot lock {}: {err}",
                lock_path.display()
            ))),
        }
    }

    /// Bumps the head and inserts the version; `None` when the write's
    /// condition refused it. Runs inside the caller's transaction.
    async fn write_in(
        conn: &mut SqliteConnection,
        tenant: &Tenant,
        write: &Write<'_>,
    ) -> Result<Option<(i64, i64)>> {
        let update = HeadUpdate::of(write);
        let statement = match update {
            HeadUpdate::SetAny => SET_ANY,
            HeadUpdate::SetIfAbsent => SET_IF_ABSENT,
            HeadUpdate::SetIfVersion(_) => SET_IF_VERSION,
            HeadUpdate::DeleteAny => DELETE_ANY,
            HeadUpdate::DeleteIfVersion(_) => DELETE_IF_VERSION,
        };
        let mut head = sqlx::query_scalar(statement)
            .bind(tenant.as_str())
            .bind(write.scope.scope_type.as_i16())
            .bind(write.scope.name.as_str())
            .bind(write.key.as_str())
            .bind(to_micros(write.now));
        if let HeadUpdate::SetIfVersion(expected) | HeadUpdate::DeleteIfVersion(expected) = update {
            head = head.bind(expected);
        }
        let version: Option<i64> = head.fetch_optional(&mut *conn).await?;
        let Some(version) = version else {
            return Ok(None);
        };

        // The change feed entry first, so the version carries its revision;
        // with one writer, revisions commit in order.
        let revision = sqlx::query_scalar(
            "INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, create_time) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING revision",
        )
        .bind(tenant.as_str())
        .bind(write.scope.scope_type.as_i16())
        .bind(write.scope.name.as_str())
        .bind(write.key.as_str())
        .bind(write.change.as_i16())
        .bind(version)
        .bind(to_micros(write.now))
        .fetch_one(&mut *conn)
        .await?;

        sqlx::query(
            "INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, \
             execution_id, flow_id, flow_name, create_time, revision) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )
        .bind(tenant.as_str())
        .bind(write.scope.scope_type.as_i16())
        .bind(write.scope.name.as_str())
        .bind(write.key.as_str())
        .bind(version)
        .bind(write.mutation.value())
        .bind(write.mutation.is_delete())
        .bind(write.provenance.execution_id.as_str())
        .bind(write.provenance.flow_id.as_str())
        .bind(write.provenance.flow_name.as_str())
        .bind(to_micros(write.now))
        .bind(revision)
        .execute(&mut *conn)
        .await?;
        Ok(Some((version, revision)))
    }

    /// Tells watchers a revision has committed.
    fn committed(&self, revision: i64) {
        self.advance(Feed::Changes, revision);
    }

    /// Tells the readers of a feed a position has committed.
    fn advance(&self, feed: Feed, position: i64) {
        self.horizons[feed as usize].send_if_modified(|horizon| {
            let newer = position > *horizon;
            if newer {
                *horizon = position;
            }
            newer
        });
    }
}

/// The versions of the migrations applied to the database (none before
/// the first).
async fn applied_migrations<'c>(
    conn: impl sqlx::Executor<'c, Database = sqlx::Sqlite>,
) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(conn)
        .await
        .unwrap_or_default()
}

impl Database for SqliteStore {
    async fn migrate_through(&self, version: Option<i64>) -> Result<()> {
        // On a connection of its own whose statements are not logged: a
        // migration that takes a while (0017 rebuilds the search tables,
        // about 2 s per 100,000 episodes) would otherwise be printed whole,
        // every line of it, as a slow statement. It has the tokenizer the
        // search tables are rebuilt with.
        let mut conn =
            SqliteConnection::connect_with(&(*self.connect).clone().disable_statement_logging())
                .await?;
        fts::register(&mut conn).await?;
        match version {
            None => {
                let applied = applied_migrations(&mut conn).await;
                migrate_unless_ahead(
                    &MIGRATOR,
                    applied,
                    MIGRATOR.run_direct(None, &mut conn, false),
                )
                .await?
            }
            Some(version) => MIGRATOR.run_direct(Some(version), &mut conn, false).await?,
        }
        conn.close().await?;
        Ok(())
    }

    async fn migrations(&self) -> Result<Migrations> {
        Ok(Migrations::of(
            &MIGRATOR,
            applied_migrations(&self.reader).await,
        ))
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn analyze_grown(&self) -> Result<u64> {
        let mut conn = self.writer.acquire().await?;
        statistics::analyze_grown(&mut conn, &self.analyzed).await
    }

    fn pool_status(&self) -> crate::metrics::PoolStatus {
        let [writer, reader] = [&self.writer, &self.reader];
        crate::metrics::PoolStatus {
            open: writer.size() + reader.size(),
            idle: (writer.num_idle() + reader.num_idle()) as u32,
            max: writer.options().get_max_connections() + reader.options().get_max_connections(),
            queued_writes: (self.writes.as_ref().map_or(0, Group::queued)
                + self.appends.as_ref().map_or(0, Group::queued)) as u32,
        }
    }

    async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }
}

/// Also $9 change kind, $10 time.
static PURGE_CHANGES: Sql = Sql::new(concat!(
    "INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, \
     versions_deleted, create_time) \
     SELECT $1, $2, $3, v.key, $9, max(v.version), count(*), $10 FROM memory_versions v \
     JOIN memory_heads h USING (tenant, scope_type, scope, key) WHERE ",
    purge_victim!(),
    " GROUP BY v.key ORDER BY v.key RETURNING revision"
));

static PURGE_VERSIONS: Sql = Sql::new(concat!(
    "DELETE FROM memory_versions AS v WHERE v.tenant = $1 AND v.scope_type = $2 \
     AND v.scope = $3 AND ",
    purge_keys!("v"),
    " AND EXISTS (SELECT 1 FROM memory_heads h \
     WHERE h.tenant = v.tenant AND h.scope_type = v.scope_type AND h.scope = v.scope \
     AND h.key = v.key AND ",
    purge_victim!(),
    ")"
));

/// Heads of the purged scope (or key) left without a version: $1 tenant,
/// $2 scope_type, $3 scope, $4 key or NULL.
static PURGE_HEADS: Sql = Sql::new(concat!(
    "DELETE FROM memory_heads AS h WHERE h.tenant = $1 AND h.scope_type = $2 \
     AND h.scope = $3 AND ",
    purge_keys!("h"),
    " AND NOT EXISTS (SELECT 1 FROM memory_versions v WHERE v.tenant = h.tenant \
     AND v.scope_type = h.scope_type AND v.scope = h.scope AND v.key = h.key)"
));

/// Runs one step of a group in the writer's open transaction (one job, or
/// several that share statements): each job's outcome and the feed
/// position it took (0: none), in the step's order.
pub(super) type RunStep<J, R> = for<'c> fn(
    &'c mut SqliteConnection,
    &'c Tenant,
    Vec<&'c J>,
) -> BoxFuture<'c, Result<Vec<(R, i64)>>>;

impl SqliteStore {
    /// A group's jobs in one transaction on the single writer, step by
    /// step (`steps` holds every job once; one writer has no locks to
    /// order, so any order will do), committed once and announced on
    /// `feed`; `run` runs one step. A failed statement rolls the group back
    /// and runs each job in a transaction of its own, so the error reaches
    /// its own call only.
    pub(super) async fn run_group<J: Sync, R: Send>(
        &self,
        tenant: &Tenant,
        feed: Feed,
        jobs: Vec<J>,
        steps: Vec<Vec<usize>>,
        run: RunStep<J, R>,
    ) -> Vec<Result<R>> {
        let grouped = async {
            let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
            let mut outcomes: Vec<Option<R>> = jobs.iter().map(|_| None).collect();
            let mut newest = 0;
            for step in &steps {
                let done = run(&mut tx, tenant, step.iter().map(|&at| &jobs[at]).collect()).await?;
                if done.len() != step.len() {
                    return Err(Error::internal("a step of a group lost an outcome"));
                }
                for (&at, (outcome, position)) in step.iter().zip(done) {
                    newest = newest.max(position);
                    outcomes[at] = Some(outcome);
                }
            }
            let outcomes: Option<Vec<R>> = outcomes.into_iter().collect();
            let outcomes =
                outcomes.ok_or_else(|| Error::internal("a grouped job without an outcome"))?;
            Ok::<_, Error>((tx, outcomes, newest))
        };
        let (tx, outcomes, newest) = match grouped.await {
            Ok(done) => done,
            Err(err) if jobs.len() == 1 => return vec![Err(err)],
            Err(_) => {
                let mut alone = Vec::with_capacity(jobs.len());
                for job in jobs {
                    let group = self.run_group(tenant, feed, vec![job], vec![vec![0]], run);
                    alone.extend(Box::pin(group).await);
                }
                return alone;
            }
        };
        if let Err(err) = tx.commit().await {
            return commit_failed(&err.into(), jobs.len());
        }
        self.advance(feed, newest);
        outcomes.into_iter().map(Ok).collect()
    }

    /// Writes in one transaction (see [`Self::run_group`]). Plain sets of
    /// distinct keys next to each other in lock order share three
    /// statements ([`set_many_in`]): every statement is a round trip to
    /// the connection's thread, and those hops, not SQLite's work, were
    /// most of a group's time. The others run one by one, each keeping
    /// its own outcome.
    async fn write_group(&self, tenant: &Tenant, jobs: Vec<OwnedWrite>) -> Vec<Result<Written>> {
        let steps = shared_steps(
            lock_ordered(&jobs),
            |at| jobs[at].is_plain_set(),
            |at| jobs[at].lock_order(),
        );
        self.run_group(tenant, Feed::Changes, jobs, steps, |conn, tenant, step| {
            async move {
                match &step[..] {
                    [job] => {
                        let (written, revision) =
                            Self::write_one_in(conn, tenant, &job.write()).await?;
                        Ok(vec![(written, revision.unwrap_or(0))])
                    }
                    _ => set_many_in(conn, tenant, &step).await,
                }
            }
            .boxed()
        })
        .await
    }

    /// One write in the writer's open transaction, and the revision it
    /// took when it stored something.
    async fn write_one_in(
        conn: &mut SqliteConnection,
        tenant: &Tenant,
        write: &Write<'_>,
    ) -> Result<(Written, Option<i64>)> {
        if let Some(stamp) = write.request {
            let existing = sqlx::query(
                "SELECT fingerprint, version FROM memory_request_ids \
                 WHERE tenant = ?1 AND request_id = ?2",
            )
            .bind(tenant.as_str())
            .bind(stamp.id)
            .fetch_optional(&mut *conn)
            .await?;
            if let Some(row) = existing {
                let fingerprint: Vec<u8> = row.try_get(0)?;
                let version: Option<i64> = row.try_get(1)?;
                let version =
                    version.ok_or_else(|| Error::internal("request record without a version"))?;
                let entry = version_in(&mut *conn, tenant, write.scope, write.key, version).await?;
                let replayed = Written::Replayed {
                    fingerprint,
                    version,
                    entry,
                };
                return Ok((replayed, None));
            }
        }

        let Some((version, revision)) = Self::write_in(conn, tenant, write).await? else {
            let head = head_in(&mut *conn, tenant, write.scope, write.key).await?;
            return Ok((Written::Refused(head), None));
        };

        if let Some(stamp) = write.request {
            sqlx::query(
                "INSERT INTO memory_request_ids \
                 (tenant, request_id, fingerprint, scope_type, scope, key, version, create_time) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .bind(tenant.as_str())
            .bind(stamp.id)
            .bind(&stamp.fingerprint[..])
            .bind(write.scope.scope_type.as_i16())
            .bind(write.scope.name.as_str())
            .bind(write.key.as_str())
            .bind(version)
            .bind(to_micros(write.now))
            .execute(&mut *conn)
            .await?;
        }
        Ok((Written::Stored(write.entry(version)), Some(revision)))
    }
}

impl MemoryWrites for SqliteStore {
    async fn current(&self, tenant: &Tenant, scope: &Scope, key: &Key) -> Result<Option<Entry>> {
        // Reads run in process on their own connections: nothing to group.
        let mut conn = self.reader.acquire().await?;
        current_in(&mut conn, tenant, scope, key).await
    }

    async fn write_version(&self, tenant: &Tenant, write: &Write<'_>) -> Result<Written> {
        match &self.writes {
            Some(group) => group.submit(tenant, OwnedWrite::of(write)).await,
            None => self
                .write_group(tenant, vec![OwnedWrite::of(write)])
                .await
                .pop()
                .unwrap_or_else(|| Err(Error::internal("a write without an outcome"))),
        }
    }

    async fn purge_versions(
        &self,
        tenant: &Tenant,
        purge: &Purge<'_>,
        record: AuditRecord,
    ) -> Result<PurgeOutcome> {
        // See the Postgres store: all but the newest `keep` versions of each
        // target key. The writer transaction is exclusive, so the count and
        // the deletes see the same data.
        let targets = purge_params(tenant, purge);
        let targets = &targets[..];
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let deleted = tx.all(&PURGE_COUNTS, targets, purged_row).await?;
        let outcome = PurgeOutcome::new(purge, &deleted, record);
        let mut newest_revision = 0;
        if let Some(record) = &outcome.record {
            // One change per purged key, in one statement; revisions are
            // rowids, so the last one inserted is the newest.
            let (kind, at) = (ChangeKind::Purge.as_i16(), record.timestamp);
            newest_revision = tx
                .all(
                    &PURGE_CHANGES,
                    &[targets, params![kind, at]].concat(),
                    |row| row.int(0),
                )
                .await?
                .into_iter()
                .max()
                .unwrap_or(0);
            past::record_purges(&mut *tx, tenant, purge, record.timestamp).await?;
            tx.exec(&PURGE_VERSIONS, targets).await?;
            tx.exec(&PURGE_HEADS, &targets[..4]).await?;
            let audit = AuditWrite::of(record)?;
            let write = audit.write(purge.scope, record.timestamp);
            if let Some((_, revision)) = Self::write_in(&mut tx, tenant, &write).await? {
                newest_revision = revision;
            }
        }
        tx.commit().await?;
        self.committed(newest_revision);
        Ok(outcome)
    }

    async fn fork_scope(
        &self,
        tenant: &Tenant,
        fork: &Fork<'_>,
        mut record: AuditRecord,
    ) -> Result<Forked> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let copied = match past::fork_in(&mut *tx, tenant, fork).await? {
            Ok(copied) => copied,
            Err(refused) => return Ok(refused),
        };
        record.keys_affected = copied.keys;
        let audit = AuditWrite::of(&record)?;
        let revision = Self::write_in(&mut tx, tenant, &audit.write(fork.target, record.timestamp))
            .await?
            .map_or(copied.newest_revision, |(_, revision)| revision);
        tx.commit().await?;
        self.committed(revision);
        Ok(Forked::Copied(Box::new(record)))
    }

    async fn forget_with_record(
        &self,
        tenant: &Tenant,
        forget: &crate::data::Forgetting,
        mut record: AuditRecord,
    ) -> Result<crate::data::ForgetCounts> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let counts = super::forget::forget_in(&mut *tx, tenant, forget).await?;
        if forget.dry_run {
            return Ok(counts);
        }
        let (scope, audit) = AuditWrite::forgotten(&mut record, counts)?;
        let revision = Self::write_in(&mut tx, tenant, &audit.write(&scope, record.timestamp))
            .await?
            .map_or(0, |(_, revision)| revision);
        tx.commit().await?;
        self.committed(revision);
        Ok(counts)
    }

    async fn write_summary(
        &self,
        tenant: &Tenant,
        fences: &[Fence<'_>],
        write: &Write<'_>,
        mut record: AuditRecord,
    ) -> Result<Compacted> {
        // The writer transaction is exclusive: no write can slip in between
        // the fence check and the commit.
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        for fence in fences {
            let now = head_in(&mut *tx, tenant, write.scope, fence.key)
                .await?
                .map(|head| head.version);
            if let Some(moved) = fence_moved(fence, now) {
                return Ok(moved);
            }
        }
        let (version, _) = Self::write_in(&mut tx, tenant, write)
            .await?
            .ok_or_else(|| Error::internal("unconditional write refused"))?;
        record.target_version = version;
        let audit = AuditWrite::of(&record)?;
        let revision = Self::write_in(&mut tx, tenant, &audit.write(write.scope, record.timestamp))
            .await?
            .map_or(0, |(_, revision)| revision);
        tx.commit().await?;
        self.committed(revision);
        Ok(Compacted::Written(Box::new((write.entry(version), record))))
    }
}

impl Feeds for SqliteStore {
    async fn horizon(&self, feed: Feed) -> Result<watch::Receiver<i64>> {
        self.settled(feed).await?;
        Ok(self.horizons[feed as usize].subscribe())
    }

    async fn settled(&self, feed: Feed) -> Result<i64> {
        // One writer: every committed position is final once read. The
        // revision is AUTOINCREMENT's high-water mark, not max() over rows
        // that pruning or forgetting a user may have deleted.
        let sql = match feed {
            Feed::Changes => {
                "SELECT max(coalesce((SELECT max(revision) FROM memory_changes), 0), \
                 coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'memory_changes'), 0))"
            }
            Feed::Episodes => "SELECT coalesce(max(cursor), 0) FROM episodes",
        };
        let newest: i64 = sqlx::query_scalar(sql).fetch_one(&self.reader).await?;
        self.advance(feed, newest);
        Ok(newest)
    }
}
