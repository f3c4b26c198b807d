//! The SQLite store: the embedded default, one file, one process.
//!
//! All writes go through a single connection (SQLite admits one writer at a
//! time anyway; queueing in the pool instead of on the file lock keeps
//! `SQLITE_BUSY` away), each in a `BEGIN IMMEDIATE` transaction so another
//! process sharing the file waits its turn. Reads use a separate pool and
//! run beside the writer thanks to WAL.

use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
};
use sqlx::{Executor, Row, Sqlite, SqliteConnection};
use tokio::sync::watch;

mod consolidation;
mod run;
mod sessions;

use super::{
    ChangeRow, HeadUpdate, StoreOptions, VersionRow, from_micros, schema_is_current, to_micros,
};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::memory::audit::AuditRecord;
use crate::memory::ports::{
    Compacted, Fence, Head, ListQuery, MemoryStore, Purge, PurgeOutcome, Purged, ReindexOutcome,
    ScopeFilter, Write, Written,
};
use crate::memory::{
    Change, ChangeKind, Entry, Key, KeyPrefix, Provenance, Scope, ScopeSummary, ScopeType,
};
use crate::ports::{Database, Feed, Feeds};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// How hard SQLite syncs to disk. `Full` (the default) makes every commit
/// durable across power loss; `Normal` may lose the last commits then, but
/// never corrupts the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    Normal,
    #[default]
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

const VERSION_COLUMNS: &str = "v.key, v.version, v.value, v.deleted, v.execution_id, v.flow_id, \
                               v.flow_name, v.create_time";

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    /// The newest committed position of each feed. With a single writer
    /// connection positions commit in order, so the newest is settled.
    horizons: Arc<[watch::Sender<i64>; 2]>,
}

impl SqliteStore {
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|err| Error::internal(format!("invalid sqlite URL: {err}")))?;
        if connect.get_filename().as_os_str() == ":memory:" || url.contains("mode=memory") {
            return Err(Error::internal(
                "in-memory SQLite is not supported (each connection would see its own database); \
                 use a file such as sqlite://engram.db",
            ));
        }
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.sqlite_synchronous {
                SqliteSynchronous::Normal => sqlx::sqlite::SqliteSynchronous::Normal,
                SqliteSynchronous::Full => sqlx::sqlite::SqliteSynchronous::Full,
            })
            .busy_timeout(options.acquire_timeout)
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        Ok(SqliteStore {
            writer,
            reader,
            horizons: Arc::new([watch::channel(0).0, watch::channel(0).0]),
        })
    }

    async fn head_in<'e, E>(
        executor: E,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
    ) -> Result<Option<Head>>
    where
        E: Executor<'e, Database = Sqlite>,
    {
        let row = sqlx::query(
            "SELECT version, deleted FROM memory_heads \
             WHERE tenant = ?1 AND scope_type = ?2 AND scope = ?3 AND key = ?4",
        )
        .bind(tenant.as_str())
        .bind(scope.scope_type.as_i16())
        .bind(scope.name.as_str())
        .bind(key.as_str())
        .fetch_optional(executor)
        .await?;
        row.map(|row| {
            Ok(Head {
                version: row.try_get(0)?,
                deleted: row.try_get(1)?,
            })
        })
        .transpose()
    }

    async fn version_in<'e, E>(
        executor: E,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        version: i64,
    ) -> Result<Option<Entry>>
    where
        E: Executor<'e, Database = Sqlite>,
    {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM memory_versions v \
             WHERE v.tenant = ?1 AND v.scope_type = ?2 AND v.scope = ?3 AND v.key = ?4 \
             AND v.version = ?5"
        )))
        .bind(tenant.as_str())
        .bind(scope.scope_type.as_i16())
        .bind(scope.name.as_str())
        .bind(key.as_str())
        .bind(version)
        .fetch_optional(executor)
        .await?;
        row.map(|row| version_row(&row)?.into_entry(scope))
            .transpose()
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

        sqlx::query(
            "INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, \
             execution_id, flow_id, flow_name, create_time) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
        .execute(&mut *conn)
        .await?;

        // The change feed entry; with one writer, revisions commit in order.
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

fn version_row(row: &SqliteRow) -> Result<VersionRow> {
    Ok(VersionRow {
        key: row.try_get(0)?,
        version: row.try_get(1)?,
        value: row.try_get(2)?,
        deleted: row.try_get(3)?,
        execution_id: row.try_get(4)?,
        flow_id: row.try_get(5)?,
        flow_name: row.try_get(6)?,
        create_time: from_micros(row.try_get(7)?)?,
    })
}

impl Database for SqliteStore {
    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    async fn check_schema(&self) -> Result<()> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.reader)
                .await
                .unwrap_or_default();
        schema_is_current(&MIGRATOR, &applied)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    fn pool_status(&self) -> crate::metrics::PoolStatus {
        let [writer, reader] = [&self.writer, &self.reader];
        crate::metrics::PoolStatus {
            open: writer.size() + reader.size(),
            idle: (writer.num_idle() + reader.num_idle()) as u32,
            max: writer.options().get_max_connections() + reader.options().get_max_connections(),
        }
    }

    async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }
}

impl MemoryStore for SqliteStore {
    async fn write(&self, tenant: &Tenant, write: &Write<'_>) -> Result<Written> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(stamp) = write.request {
            let existing = sqlx::query(
                "SELECT fingerprint, version FROM memory_request_ids \
                 WHERE tenant = ?1 AND request_id = ?2",
            )
            .bind(tenant.as_str())
            .bind(stamp.id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                let fingerprint: Vec<u8> = row.try_get(0)?;
                let version: Option<i64> = row.try_get(1)?;
                let version =
                    version.ok_or_else(|| Error::internal("request record without a version"))?;
                let entry =
                    Self::version_in(&mut *tx, tenant, write.scope, write.key, version).await?;
                return Ok(Written::Replayed {
                    fingerprint,
                    version,
                    entry,
                });
            }
        }

        let Some((version, revision)) = Self::write_in(&mut tx, tenant, write).await? else {
            let head = Self::head_in(&mut *tx, tenant, write.scope, write.key).await?;
            return Ok(Written::Refused(head));
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
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.committed(revision);
        Ok(Written::Stored(write.entry(version)))
    }

    async fn get(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        version: Option<i64>,
    ) -> Result<Option<Entry>> {
        if let Some(version) = version {
            return Self::version_in(&self.reader, tenant, scope, key, version).await;
        }
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM memory_heads h \
             JOIN memory_versions v USING (tenant, scope_type, scope, key, version) \
             WHERE h.tenant = ?1 AND h.scope_type = ?2 AND h.scope = ?3 AND h.key = ?4"
        )))
        .bind(tenant.as_str())
        .bind(scope.scope_type.as_i16())
        .bind(scope.name.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.map(|row| version_row(&row)?.into_entry(scope))
            .transpose()
    }

    async fn head(&self, tenant: &Tenant, scope: &Scope, key: &Key) -> Result<Option<Head>> {
        Self::head_in(&self.reader, tenant, scope, key).await
    }

    async fn list(&self, tenant: &Tenant, query: &ListQuery<'_>) -> Result<Vec<Entry>> {
        let (low, high) = query.prefix.range();
        let (bound, order) = if query.descending {
            (
                query.after.map_or(high.clone(), str::to_owned),
                "h.key < ?6 ORDER BY h.key DESC",
            )
        } else {
            (
                query.after.unwrap_or("").to_owned(),
                "h.key > ?6 ORDER BY h.key",
            )
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM memory_heads h \
             JOIN memory_versions v USING (tenant, scope_type, scope, key, version) \
             WHERE h.tenant = ?1 AND h.scope_type = ?2 AND h.scope = ?3 AND h.deleted = 0 \
             AND h.key >= ?4 AND h.key < ?5 \
             AND (?7 OR substr(h.key, 1, 12) <> '_compaction/') \
             AND {order} LIMIT ?8"
        )))
        .bind(tenant.as_str())
        .bind(query.scope.scope_type.as_i16())
        .bind(query.scope.name.as_str())
        .bind(low)
        .bind(high)
        .bind(bound)
        .bind(query.include_reserved)
        .bind(query.limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| version_row(row)?.into_entry(query.scope))
            .collect()
    }

    async fn history(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        from_version: i64,
        limit: i64,
    ) -> Result<Vec<Entry>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM memory_versions v \
             WHERE v.tenant = ?1 AND v.scope_type = ?2 AND v.scope = ?3 AND v.key = ?4 \
             AND v.version >= ?5 ORDER BY v.version LIMIT ?6"
        )))
        .bind(tenant.as_str())
        .bind(scope.scope_type.as_i16())
        .bind(scope.name.as_str())
        .bind(key.as_str())
        .bind(from_version)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| version_row(row)?.into_entry(scope))
            .collect()
    }

    async fn list_scopes(
        &self,
        tenant: &Tenant,
        filter: ScopeFilter<'_>,
        after: Option<&Scope>,
        limit: i64,
    ) -> Result<Vec<ScopeSummary>> {
        let rows = sqlx::query(
            "SELECT scope_type, scope, \
             count(*) FILTER (WHERE deleted = 0 AND substr(key, 1, 12) <> '_compaction/') \
             FROM memory_heads \
             WHERE tenant = ?1 AND (?2 = 0 OR scope_type = ?2) AND (scope_type, scope) > (?3, ?4) \
             AND (?6 = '' OR (scope_type = 3 AND scope IN (SELECT scope FROM memory_versions \
                 WHERE tenant = ?1 AND scope_type = 3 AND flow_id <> '' AND flow_id = ?6))) \
             AND (?7 = '' OR (scope_type = 3 AND scope IN (SELECT scope FROM memory_versions \
                 WHERE tenant = ?1 AND scope_type = 3 AND flow_name <> '' AND flow_name = ?7))) \
             GROUP BY scope_type, scope ORDER BY scope_type, scope LIMIT ?5",
        )
        .bind(tenant.as_str())
        .bind(filter.scope_type.map_or(0, ScopeType::as_i16))
        .bind(after.map_or(0, |scope| scope.scope_type.as_i16()))
        .bind(after.map_or("", |scope| scope.name.as_str()))
        .bind(limit)
        .bind(filter.flow_id.unwrap_or(""))
        .bind(filter.flow_name.unwrap_or(""))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(scope_summary).collect()
    }

    async fn purge(
        &self,
        tenant: &Tenant,
        purge: &Purge<'_>,
        record: AuditRecord,
    ) -> Result<PurgeOutcome> {
        // See the Postgres store: all but the newest `keep` versions of each
        // target key. The writer transaction is exclusive, so the count and
        // the deletes see the same data.
        const TARGETS: &str = "h.tenant = ?1 AND h.scope_type = ?2 AND h.scope = ?3 \
             AND (?4 IS NULL OR h.key = ?4) AND substr(h.key, 1, 12) <> '_compaction/' \
             AND (?5 OR h.deleted = 0)";
        let keep = purge.keep.unwrap_or(0);
        let include_deleted = purge.include_deleted || purge.key.is_some();
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT v.key, count(*), max(v.version) FROM memory_versions v \
             JOIN memory_heads h USING (tenant, scope_type, scope, key) \
             WHERE {TARGETS} AND v.version <= h.version - ?6 GROUP BY v.key ORDER BY v.key"
        )))
        .bind(tenant.as_str())
        .bind(purge.scope.scope_type.as_i16())
        .bind(purge.scope.name.as_str())
        .bind(purge.key.map(Key::as_str))
        .bind(include_deleted)
        .bind(keep)
        .fetch_all(&mut *tx)
        .await?;
        let deleted = rows
            .iter()
            .map(|row| {
                Ok(Purged {
                    key: row.try_get(0)?,
                    versions: row.try_get(1)?,
                    newest: row.try_get(2)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let outcome = PurgeOutcome::new(purge, &deleted, record);
        let mut newest_revision = 0;
        if let Some(record) = &outcome.record {
            // One change per purged key, in one statement; revisions are
            // rowids, so the last one inserted is the newest.
            newest_revision = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, versions_deleted, create_time) \
                 SELECT ?1, ?2, ?3, v.key, ?7, max(v.version), count(*), ?8 FROM memory_versions v \
                 JOIN memory_heads h USING (tenant, scope_type, scope, key) \
                 WHERE {TARGETS} AND v.version <= h.version - ?6 GROUP BY v.key ORDER BY v.key"
            )))
            .bind(tenant.as_str())
            .bind(purge.scope.scope_type.as_i16())
            .bind(purge.scope.name.as_str())
            .bind(purge.key.map(Key::as_str))
            .bind(include_deleted)
            .bind(keep)
            .bind(ChangeKind::Purge.as_i16())
            .bind(to_micros(record.timestamp))
            .execute(&mut *tx)
            .await?
            .last_insert_rowid();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM memory_versions AS v WHERE v.tenant = ?1 AND v.scope_type = ?2 \
                 AND v.scope = ?3 AND EXISTS (SELECT 1 FROM memory_heads h \
                   WHERE h.tenant = v.tenant AND h.scope_type = v.scope_type AND h.scope = v.scope \
                   AND h.key = v.key AND {TARGETS} AND v.version <= h.version - ?6)"
            )))
            .bind(tenant.as_str())
            .bind(purge.scope.scope_type.as_i16())
            .bind(purge.scope.name.as_str())
            .bind(purge.key.map(Key::as_str))
            .bind(include_deleted)
            .bind(keep)
            .execute(&mut *tx)
            .await?;
            if keep == 0 {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM memory_heads AS h WHERE {TARGETS} AND NOT EXISTS ( \
                       SELECT 1 FROM memory_versions v WHERE v.tenant = h.tenant \
                       AND v.scope_type = h.scope_type AND v.scope = h.scope AND v.key = h.key)"
                )))
                .bind(tenant.as_str())
                .bind(purge.scope.scope_type.as_i16())
                .bind(purge.scope.name.as_str())
                .bind(purge.key.map(Key::as_str))
                .bind(include_deleted)
                .execute(&mut *tx)
                .await?;
            }
            let value = record.to_value()?;
            let key = record.key();
            let provenance = Provenance::default();
            let write = Write::audit(purge.scope, &key, &value, &provenance, record.timestamp);
            if let Some((_, revision)) = Self::write_in(&mut tx, tenant, &write).await? {
                newest_revision = revision;
            }
        }
        tx.commit().await?;
        self.committed(newest_revision);
        Ok(outcome)
    }

    async fn compact(
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
            let now = Self::head_in(&mut *tx, tenant, write.scope, fence.key)
                .await?
                .map(|head| head.version);
            if now != Some(fence.version) {
                return Ok(Compacted::SourceChanged {
                    key: fence.key.clone(),
                    read: fence.version,
                    now,
                });
            }
        }
        let (version, _) = Self::write_in(&mut tx, tenant, write)
            .await?
            .ok_or_else(|| Error::internal("unconditional write refused"))?;
        record.target_version = version;
        let value = record.to_value()?;
        let key = record.key();
        let provenance = Provenance::default();
        let audit = Write::audit(write.scope, &key, &value, &provenance, record.timestamp);
        let revision = Self::write_in(&mut tx, tenant, &audit)
            .await?
            .map_or(0, |(_, revision)| revision);
        tx.commit().await?;
        self.committed(revision);
        Ok(Compacted::Written(Box::new((write.entry(version), record))))
    }

    async fn register_execution(
        &self,
        tenant: &Tenant,
        execution_id: &str,
        flow_id: &str,
        flow_name: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO memory_executions (tenant, execution_id, flow_id, flow_name, create_time) \
             VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (tenant, execution_id) DO UPDATE SET \
               flow_id = CASE WHEN flow_id = '' THEN excluded.flow_id ELSE flow_id END, \
               flow_name = CASE WHEN flow_name = '' THEN excluded.flow_name ELSE flow_name END \
             WHERE (flow_id = '' AND excluded.flow_id <> '') OR (flow_name = '' AND excluded.flow_name <> '')",
        )
        .bind(tenant.as_str())
        .bind(execution_id)
        .bind(flow_id)
        .bind(flow_name)
        .bind(to_micros(now))
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn execution_flow(
        &self,
        tenant: &Tenant,
        execution_id: &str,
    ) -> Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT flow_id, flow_name FROM memory_executions WHERE tenant = ?1 AND execution_id = ?2")
            .bind(tenant.as_str())
            .bind(execution_id)
            .fetch_optional(&self.reader)
            .await?;
        row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .transpose()
    }

    async fn reindex(&self, tenant: &Tenant, apply: bool) -> Result<ReindexOutcome> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let versions_scanned: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memory_versions \
             WHERE tenant = ?1 AND scope_type = 3 AND flow_id = '' AND flow_name = ''",
        )
        .bind(tenant.as_str())
        .fetch_one(&mut *tx)
        .await?;
        const KNOWN: &str = "SELECT e.flow_id, e.flow_name FROM memory_executions e \
             WHERE e.tenant = v.tenant AND e.execution_id = v.scope AND (e.flow_id <> '' OR e.flow_name <> '')";
        const UNTAGGED: &str =
            "v.tenant = ?1 AND v.scope_type = 3 AND v.flow_id = '' AND v.flow_name = ''";
        let tags_added = if apply {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE memory_versions AS v SET (flow_id, flow_name) = ({KNOWN}) \
                 WHERE {UNTAGGED} AND EXISTS ({KNOWN})"
            )))
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected() as i64
        } else {
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM memory_versions v WHERE {UNTAGGED} AND EXISTS ({KNOWN})"
            )))
            .bind(tenant.as_str())
            .fetch_one(&mut *tx)
            .await?
        };
        let unknown = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT v.scope, count(*) FROM memory_versions v WHERE {UNTAGGED} AND NOT EXISTS ({KNOWN}) \
             GROUP BY v.scope ORDER BY v.scope LIMIT 100"
        )))
        .bind(tenant.as_str())
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(ReindexOutcome {
            versions_scanned,
            tags_added,
            unknown,
        })
    }

    async fn changes(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        prefix: &KeyPrefix,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<Change>> {
        let (low, high) = prefix.range();
        let rows = sqlx::query(
            "SELECT c.revision, c.kind, c.key, c.version, c.versions_deleted, \
             CASE WHEN c.kind IN (1, 4) THEN v.value END, c.create_time \
             FROM memory_changes c LEFT JOIN memory_versions v ON v.tenant = c.tenant \
               AND v.scope_type = c.scope_type AND v.scope = c.scope AND v.key = c.key AND v.version = c.version \
             WHERE c.tenant = ?1 AND c.scope_type = ?2 AND c.scope = ?3 \
             AND c.revision > ?4 AND c.revision <= ?5 AND c.key >= ?6 AND c.key < ?7 \
             ORDER BY c.revision LIMIT ?8",
        )
        .bind(tenant.as_str())
        .bind(scope.scope_type.as_i16())
        .bind(scope.name.as_str())
        .bind(after)
        .bind(up_to)
        .bind(low)
        .bind(high)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                ChangeRow {
                    revision: row.try_get(0)?,
                    kind: row.try_get(1)?,
                    key: row.try_get(2)?,
                    version: row.try_get(3)?,
                    versions_deleted: row.try_get(4)?,
                    value: row.try_get(5)?,
                    create_time: from_micros(row.try_get(6)?)?,
                }
                .into_change()
            })
            .collect()
    }

    async fn oldest_revision(&self) -> Result<Option<i64>> {
        Ok(
            sqlx::query_scalar("SELECT min(revision) FROM memory_changes")
                .fetch_one(&self.reader)
                .await?,
        )
    }

    async fn prune_changes(&self, before: DateTime<Utc>) -> Result<u64> {
        let done = sqlx::query("DELETE FROM memory_changes WHERE create_time < ?1")
            .bind(to_micros(before))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }

    async fn prune_request_ids(&self, before: DateTime<Utc>) -> Result<u64> {
        let done = sqlx::query("DELETE FROM memory_request_ids WHERE create_time < ?1")
            .bind(to_micros(before))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }
}

fn scope_summary(row: &SqliteRow) -> Result<ScopeSummary> {
    super::scope_summary(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)
}

impl Feeds for SqliteStore {
    async fn horizon(&self, feed: Feed) -> Result<watch::Receiver<i64>> {
        self.settled(feed).await?;
        Ok(self.horizons[feed as usize].subscribe())
    }

    async fn settled(&self, feed: Feed) -> Result<i64> {
        // One writer: every committed position is final once read.
        let sql = match feed {
            Feed::Changes => "SELECT coalesce(max(revision), 0) FROM memory_changes",
            Feed::Episodes => "SELECT coalesce(max(cursor), 0) FROM episodes",
        };
        let newest: i64 = sqlx::query_scalar(sql).fetch_one(&self.reader).await?;
        self.advance(feed, newest);
        Ok(newest)
    }
}
