//! Export and import on both backends, one statement text each.
//!
//! An export reads one part of the tenant at a time ([`Part`]), a page at
//! a time, in an order that does not depend on server-assigned numbers
//! except where the numbers are the order (episodes, by cursor). Every
//! export statement takes the same six selection parameters: $1 tenant,
//! $2 scope type (0 for none), $3 scope, $4 session id, $5 app, $6 user,
//! and then its page position.
//!
//! An import stages checked lines in `import_lines` (short transactions,
//! while the client streams), then applies them in one transaction that
//! issues revisions and cursors as it goes and deletes the staged lines;
//! see migration 0012 for why.
//!
//! `export` reads the pages, `import` stages and applies the lines, and
//! `rows` turns a row into its record for both (an import compares what
//! it brings with what is there, read the same way).

use chrono::{DateTime, Utc};

use super::memory::MemoryWrites;
use super::sql::{Backend, Cols, Run, Sql, Transaction, params};
use crate::context::Tenant;
use crate::data::{After, DataStore, ExportPage, ImportCounts, Part, Selection};
use crate::error::{Error, Reason, Result};
use crate::ports::{Feed, Feeds};

// ---- the columns each record is read from, for `concat!` ----

macro_rules! execution_columns {
    () => {
        "execution_id, flow_id, flow_name, create_time"
    };
}

macro_rules! memory_columns {
    () => {
        "scope_type, scope, key, version, value::text, deleted, execution_id, flow_id, \
         flow_name, create_time"
    };
}

macro_rules! session_columns {
    () => {
        "id, app, user_id, metadata::text, create_time, update_time, end_time, last_seq, \
         episode_count, episodes_evicted, create_request_id, create_fingerprint"
    };
}

macro_rules! episode_columns {
    () => {
        "session_id, seq, id, app, user_id, agent, type, content::text, metadata::text, \
         source_node, timestamp, create_time, fingerprint, cursor"
    };
}

macro_rules! working_columns {
    () => {
        "session_id, goal, next_task, update_time"
    };
}

macro_rules! task_columns {
    () => {
        "session_id, number, subject, description, status, create_time, update_time, \
         create_request_id, create_fingerprint"
    };
}

macro_rules! cached_columns {
    () => {
        "session_id, path, content, bytes, update_time"
    };
}

macro_rules! fact_version_columns {
    () => {
        "fact_id, version, deleted, subject, predicate, object, content::text, confidence, \
         source, source_episode_ids::text, channels::text, create_time"
    };
}

macro_rules! fact_columns {
    () => {
        "id, app, user_id, kind, subject, predicate, version, deleted, create_time, update_time, \
         create_request_id, create_fingerprint"
    };
}

macro_rules! rule_columns {
    () => {
        "id, filter, every_n_episodes, cron, then_emits::text, kind, confidence, enabled, \
         watermark, episodes_promoted, create_time, last_run_time, create_request_id, \
         create_fingerprint"
    };
}

mod export;
mod import;
mod rows;

/// The limit Postgres (not Engram) puts on a transaction waiting between
/// statements, in milliseconds (0: none).
static IDLE_LIMIT: Sql = Sql::new(
    "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'",
);

/// What an export's client hears when Postgres ended the export's
/// snapshot because the client took longer than
/// `idle_in_transaction_session_timeout` to read: the same as a `Watch`
/// consumer that reads too slowly, with the setting named, and not
/// `INTERNAL`. The setting is the operator's (it keeps forgotten
/// transactions from holding back vacuum), so the export keeps to it
/// rather than turning it off for itself.
async fn too_slow<B: Backend>(store: &B, tenant: &Tenant) -> Error {
    let limit = match store.reader(tenant).await {
        Ok(mut conn) => conn.first(&IDLE_LIMIT, params![], |row| row.int(0)).await,
        Err(err) => Err(err),
    };
    let limit = limit.ok().flatten().unwrap_or(0);
    tracing::warn!(
        idle_in_transaction_session_timeout_ms = limit,
        "an export's client read too slowly, and Postgres ended its snapshot"
    );
    Error::ResourceExhausted {
        reason: Reason::ConsumerTooSlow,
        message: format!(
            "the client read the export too slowly: Postgres ended its snapshot after waiting \
             {limit} ms for it (idle_in_transaction_session_timeout); export again reading \
             faster, or raise that setting for Engram's database role"
        ),
        limit: "idle_in_transaction_session_timeout",
        value: limit,
    }
}

use export::export_page;
use import::{DISCARD, PRUNE_IMPORTS, STAGE, apply_in};

impl<B: Backend + MemoryWrites + Feeds> DataStore for B {
    async fn forget_user(
        &self,
        tenant: &Tenant,
        forget: &crate::data::Forgetting,
        record: crate::memory::audit::AuditRecord,
    ) -> Result<crate::data::ForgetCounts> {
        self.forget_with_record(tenant, forget, record).await
    }

    type Snapshot = B::Tx;

    async fn export_snapshot(&self, tenant: &Tenant) -> Result<B::Tx> {
        self.snapshot(tenant).await
    }

    async fn export_page(
        &self,
        snapshot: &mut B::Tx,
        tenant: &Tenant,
        selection: &Selection,
        part: Part,
        after: &After,
        rows: Option<i64>,
    ) -> Result<ExportPage> {
        match export_page(snapshot, tenant, selection, part, after, rows).await {
            Err(err) if crate::store::idle_too_long(&err) => Err(too_slow(self, tenant).await),
            page => page,
        }
    }

    async fn export_done(&self, snapshot: B::Tx) -> Result<()> {
        // It wrote nothing: ending it either way only lets go of it.
        snapshot.rollback().await
    }

    async fn stage_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
        lines: &[(i64, String)],
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self.begin(tenant).await?;
        for (line, body) in lines {
            tx.exec(
                &STAGE,
                params![tenant.as_str(), import_id, *line, body.as_str(), now],
            )
            .await?;
        }
        tx.commit().await
    }

    async fn apply_import(&self, tenant: &Tenant, import_id: &str) -> Result<ImportCounts> {
        let mut tx = self.begin(tenant).await?;
        let counts = apply_in(&mut tx, tenant, import_id).await?;
        tx.commit().await?;
        // Wakes this store's feeds now rather than at their next poll.
        self.settled(Feed::Changes).await?;
        self.settled(Feed::Episodes).await?;
        Ok(counts)
    }

    async fn discard_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
        stale_before: DateTime<Utc>,
    ) -> Result<()> {
        let mut conn = self.writer(tenant).await?;
        conn.exec(&DISCARD, params![tenant.as_str(), import_id, stale_before])
            .await?;
        Ok(())
    }

    async fn prune_imports(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut conn = self.system_writer().await?;
        conn.exec(&PRUNE_IMPORTS, params![before]).await
    }
}
