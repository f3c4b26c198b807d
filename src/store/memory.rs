//! Scoped memory on both backends, one statement text each for every read
//! and for the execution registry, reindexing and pruning. The writes
//! differ ([`MemoryWrites`], in each backend's `mod.rs`): Postgres numbers
//! a version and records its change in one statement, SQLite in a few on
//! its single writer.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::sql::{
    Backend, Cols, Dialect, Param, Run, SENT_WHOLE_BYTES, Sql, Transaction, page_by_bytes,
    page_by_row, params, row_share, select,
};
use super::{past, retention};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::memory::audit::AuditRecord;
use crate::memory::ports::{
    Compacted, Fence, Fork, Forked, Head, ListQuery, MemoryStore, Mutation, Past, Point, Purge,
    PurgeOutcome, Purged, ReindexOutcome, RequestStamp, Retention, RetentionPolicy, ScopeFilter,
    Write, Written,
};
use crate::memory::{
    Change, ChangeKind, ChangePage, Entry, Key, KeyPrefix, Provenance, Scope, ScopeName,
    ScopeSummary, ScopeType, Value,
};
use crate::paging::Weighed;

/// The columns [`entry_row`] reads, in order, for `concat!`.
macro_rules! version_columns {
    () => {
        "v.key, v.version, v.value::text, v.deleted, v.execution_id, v.flow_id, v.flow_name, \
         v.create_time"
    };
}
pub(super) use version_columns;

/// Reads the newest version of a key through its head. Parameters: $1
/// tenant, $2 scope_type, $3 scope, $4 key. (`engram bench` runs the same
/// text through pgbench.)
pub(super) static CURRENT: Sql = select!(
    version_columns!(),
    " FROM memory_heads h JOIN memory_versions v USING (tenant, scope_type, scope, key, version) \
     WHERE h.tenant = $1 AND h.scope_type = $2 AND h.scope = $3 AND h.key = $4"
);

static VERSION: Sql = select!(
    version_columns!(),
    " FROM memory_versions v WHERE v.tenant = $1 AND v.scope_type = $2 AND v.scope = $3 \
     AND v.key = $4 AND v.version = $5"
);

static HEAD: Sql = Sql::new(
    "SELECT version, deleted FROM memory_heads \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4",
);

/// Versions in `$order` from `$from` (which ends in `ORDER BY $order`,
/// limited there or before), sent in full up to [`SENT_WHOLE_BYTES`] of stored values
/// (parameter `$bytes`): the columns of [`entry_row`], then whether the
/// row came past that, without its value ([`sent_whole_row`]).
macro_rules! sent_whole {
    ($order:literal, $bytes:literal, $($from:tt)+) => {
        sent_whole!(page_by_bytes, $order, $bytes, $($from)+)
    };
    ($page:ident, $order:literal, $bytes:literal, $($from:tt)+) => {
        $page!(
            "key, version, CASE WHEN past THEN NULL ELSE value::text END, deleted, \
             execution_id, flow_id, flow_name, create_time",
            "v.key, v.version, v.value, v.deleted, v.execution_id, v.flow_id, v.flow_name, \
             v.create_time",
            "pg_column_size(v.value)",
            $order,
            $bytes,
            $($from)+
        )
    };
}

/// The live heads of a page, for `concat!`: $1 tenant, $2 scope type, $3
/// scope, $4 and $5 the key range, $6 the last key of the previous page,
/// $7 whether reserved keys count.
macro_rules! list_heads {
    ($after:literal) => {
        concat!(
            "h.tenant = $1 AND h.scope_type = $2 AND h.scope = $3 AND NOT h.deleted \
             AND h.key >= $4 AND h.key < $5 \
             AND ($7 OR substr(h.key, 1, 12) <> '_compaction/') AND h.key ",
            $after,
            " $6"
        )
    };
}

/// A page of `List`: [`list_heads!`], $8 limit, $9 [`SENT_WHOLE_BYTES`].
macro_rules! list {
    ($order:literal, $after:literal) => {
        sent_whole!(
            $order,
            "$9",
            concat!(
                "FROM memory_heads h \
                 JOIN memory_versions v USING (tenant, scope_type, scope, key, version) WHERE ",
                list_heads!($after),
                " ORDER BY ",
                $order,
                " LIMIT $8"
            )
        )
    };
}

/// [`list!`] as Postgres runs it: the page's heads are taken first and
/// their versions joined to them. Joined before the limit, a scope of
/// 200,000 keys was planned as a merge join that read the versions from
/// the scope's first key, 30 ms for a page past the 150,000th (Postgres
/// scales a merge join's cost by the share of rows a limit keeps, as if
/// they came from its start); taken first, each head's version is one
/// index probe, 0.25 ms. The join's own limit keeps no fewer rows; it
/// keeps Postgres on its generic plan, which it then costs at a tenth of
/// a planned call's (without it, a fifth of the bench's lists were planned
/// again, a tenth more of Postgres's time). SQLite probes the versions
/// head by head either way, and a subquery first costs it a sort.
macro_rules! list_pg {
    ($order:literal, $after:literal) => {
        sent_whole!(
            $order,
            "$9",
            concat!(
                "FROM (SELECT tenant, scope_type, scope, key, version FROM memory_heads h WHERE ",
                list_heads!($after),
                " ORDER BY ",
                $order,
                " LIMIT $8) h \
                 JOIN memory_versions v USING (tenant, scope_type, scope, key, version) \
                 ORDER BY ",
                $order,
                " LIMIT $8"
            )
        )
    };
}

static LIST_ASCENDING: Sql = list!("key", ">");

static LIST_DESCENDING: Sql = list!("key DESC", "<");

static LIST_ASCENDING_PG: Sql = list_pg!("key", ">");

static LIST_DESCENDING_PG: Sql = list_pg!("key DESC", "<");

/// The versions of a history, for `concat!`: $1 tenant, $2 scope type, $3
/// scope, $4 key, $5 the first version, $6 limit.
macro_rules! history_from {
    () => {
        "FROM memory_versions v WHERE v.tenant = $1 AND v.scope_type = $2 AND v.scope = $3 \
         AND v.key = $4 AND v.version >= $5 ORDER BY v.version LIMIT $6"
    };
}

/// A history's first statement, each version sent whole up to its share
/// ($7, [`row_share`]) of twice a page's bytes.
static HISTORY_BY_ROW: Sql = sent_whole!(page_by_row, "version", "$7", history_from!());

/// The rest of a history after a version past its share: $7
/// [`SENT_WHOLE_BYTES`] in all.
static HISTORY: Sql = sent_whole!("version", "$7", history_from!());

/// Flow filters of the scope listings ($6 flow_id, $7 flow_name, either
/// blank) on the scope `k`, for `concat!`.
macro_rules! flow_filters {
    () => {
        "($6 = '' OR (k.scope_type = 3 AND k.scope IN (SELECT scope FROM memory_versions \
             WHERE tenant = $1 AND scope_type = 3 AND flow_id <> '' AND flow_id = $6))) \
         AND ($7 = '' OR (k.scope_type = 3 AND k.scope IN (SELECT scope FROM memory_versions \
             WHERE tenant = $1 AND scope_type = 3 AND flow_name <> '' AND flow_name = $7)))"
    };
}
pub(super) use flow_filters;

/// $1 tenant, $2 scope type (0: any), $3 and $4 the last scope of the
/// previous page, $5 limit, $6 and $7 flow filters.
static SCOPES: Sql = Sql::new(concat!(
    "SELECT k.scope_type, k.scope, \
     count(*) FILTER (WHERE NOT k.deleted AND substr(k.key, 1, 12) <> '_compaction/'), \
     0::bigint FROM memory_heads k \
     WHERE k.tenant = $1 AND ($2 = 0 OR k.scope_type = $2) AND (k.scope_type, k.scope) > ($3, $4) \
     AND ",
    flow_filters!(),
    " GROUP BY k.scope_type, k.scope ORDER BY k.scope_type, k.scope LIMIT $5"
));

static REGISTER_EXECUTION: Sql = Sql::new(
    "INSERT INTO memory_executions AS e (tenant, execution_id, flow_id, flow_name, create_time) \
     VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (tenant, execution_id) DO UPDATE SET \
       flow_id = CASE WHEN e.flow_id = '' THEN EXCLUDED.flow_id ELSE e.flow_id END, \
       flow_name = CASE WHEN e.flow_name = '' THEN EXCLUDED.flow_name ELSE e.flow_name END \
     WHERE (e.flow_id = '' AND EXCLUDED.flow_id <> '') \
        OR (e.flow_name = '' AND EXCLUDED.flow_name <> '')",
);

static EXECUTION_FLOW: Sql = Sql::new(
    "SELECT flow_id, flow_name FROM memory_executions WHERE tenant = $1 AND execution_id = $2",
);

static UNTAGGED: Sql = Sql::new(
    "SELECT count(*) FROM memory_versions \
     WHERE tenant = $1 AND scope_type = 3 AND flow_id = '' AND flow_name = ''",
);

/// An untagged execution-scoped version `v` whose execution's flow is
/// known as `e`, for `concat!`.
macro_rules! fixable {
    () => {
        "e.tenant = v.tenant AND e.execution_id = v.scope AND v.tenant = $1 \
         AND v.scope_type = 3 AND v.flow_id = '' AND v.flow_name = '' \
         AND (e.flow_id <> '' OR e.flow_name <> '')"
    };
}

static TAG: Sql = Sql::new(concat!(
    "UPDATE memory_versions AS v SET flow_id = e.flow_id, flow_name = e.flow_name \
     FROM memory_executions e WHERE ",
    fixable!()
));

static COUNT_TAGGABLE: Sql = Sql::new(concat!(
    "SELECT count(*) FROM memory_versions v JOIN memory_executions e ON ",
    fixable!()
));

static UNKNOWN_FLOWS: Sql = Sql::new(
    "SELECT v.scope, count(*) FROM memory_versions v \
     WHERE v.tenant = $1 AND v.scope_type = 3 AND v.flow_id = '' AND v.flow_name = '' \
     AND NOT EXISTS (SELECT 1 FROM memory_executions e WHERE e.tenant = v.tenant \
         AND e.execution_id = v.scope AND (e.flow_id <> '' OR e.flow_name <> '')) \
     GROUP BY v.scope ORDER BY v.scope LIMIT 100",
);

/// A page of a scope's feed, each row also carrying the prune mark (one
/// row of NULL change columns when the page is empty), so the page and the
/// mark come from one snapshot.
static CHANGES: Sql = Sql::new(
    "WITH feed AS (SELECT max(pruned_through) AS pruned FROM memory_feed) \
     SELECT page.revision, page.kind, page.key, page.version, page.versions_deleted, \
       CASE WHEN page.past THEN NULL ELSE page.value::text END, page.create_time, feed.pruned, \
       page.past \
     FROM feed LEFT JOIN ( \
       SELECT c.revision, c.kind, c.key, c.version, c.versions_deleted, c.create_time, \
         CASE WHEN c.kind IN (1, 4) THEN v.value END AS value, \
         coalesce(sum(CASE WHEN c.kind IN (1, 4) THEN pg_column_size(v.value) END) \
           OVER (ORDER BY c.revision ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) \
           > $9 AS past \
       FROM memory_changes c LEFT JOIN memory_versions v ON v.tenant = c.tenant \
         AND v.scope_type = c.scope_type AND v.scope = c.scope AND v.key = c.key \
         AND v.version = c.version AND v.revision = c.revision \
       WHERE c.tenant = $1 AND c.scope_type = $2 AND c.scope = $3 \
       AND c.revision > $4 AND c.revision <= $5 AND c.key >= $6 AND c.key < $7 \
       ORDER BY c.revision LIMIT $8 \
     ) page ON true \
     ORDER BY page.revision",
);

static PRUNED_THROUGH: Sql = Sql::new("SELECT pruned_through FROM memory_feed");

/// The newest revision that expired before $1 with nothing kept below it:
/// the feed is pruned as a prefix. Times need not follow revisions (an
/// import's changes carry the file's times; replicas' clocks differ), and
/// pruning past a change that is kept would refuse every watcher behind it
/// as pruned while what it missed is still there.
static NEWEST_EXPIRED: Sql = Sql::new(
    "SELECT max(revision) FROM memory_changes WHERE create_time < $1 \
     AND revision < coalesce((SELECT min(revision) FROM memory_changes \
       WHERE create_time >= $1), 9223372036854775807)",
);

/// Up to $1, the newest revision that expired at $2, and no further, so the
/// watermark below covers every row deleted.
static PRUNE_CHANGES: Sql =
    Sql::new("DELETE FROM memory_changes WHERE revision <= $1 AND create_time < $2");

static PRUNED_TO: Sql = Sql::new(
    "INSERT INTO memory_feed (singleton, pruned_through) VALUES (1, $1) \
     ON CONFLICT (singleton) DO UPDATE SET pruned_through = CASE \
       WHEN EXCLUDED.pruned_through > memory_feed.pruned_through \
       THEN EXCLUDED.pruned_through ELSE memory_feed.pruned_through END",
);

static PRUNE_REQUEST_IDS: Sql = Sql::new("DELETE FROM memory_request_ids WHERE create_time < $1");

/// The purge's key $4 among the rows of `$table`, or every key when $4 is
/// NULL, for `concat!`: a range of the table's index either way. Written `$4 IS
/// NULL OR h.key = $4`, SQLite read no index for it, and a purge of one
/// key read every head and version of its scope: 263–279 ms for a key of
/// a scope of 200,000, 7–9 ms in a scope of 20. Every key sorts below `~`
/// (keys are ASCII letters and digits, `.`, `_`, `/` and `-`).
macro_rules! purge_keys {
    ($table:literal) => {
        concat!(
            $table,
            ".key >= coalesce($4::text, '') AND ",
            $table,
            ".key <= coalesce($4::text, '~')"
        )
    };
}
pub(super) use purge_keys;

/// Whether version `v` of the key whose head is `h` goes in a purge (see
/// [`Purge`]), for `concat!`. Parameters: $1 tenant, $2 scope_type, $3
/// scope, $4 key (or NULL: every key), $5 whether tombstoned keys count for
/// `keep`, $6 versions to keep (or NULL), $7 older-than time (or NULL), $8
/// tombstones-before time (or NULL). A key's versions are a contiguous
/// range ending at its head, and each rule takes the oldest first, so what
/// is left stays one. The key is a range of the heads' and the versions'
/// indexes ([`purge_keys!`]), so either table may lead.
macro_rules! purge_victim {
    () => {
        concat!(
            "h.tenant = $1 AND h.scope_type = $2 AND h.scope = $3 AND ",
            $crate::store::memory::purge_keys!("h"),
            " AND ",
            $crate::store::memory::purge_keys!("v"),
            " AND substr(h.key, 1, 12) <> '_compaction/' \
         AND (($6::bigint IS NOT NULL AND ($5 OR NOT h.deleted) AND v.version <= h.version - $6) \
           OR ($7::timestamptz IS NOT NULL AND v.create_time < $7 AND v.version < h.version) \
           OR ($8::timestamptz IS NOT NULL AND h.deleted AND h.update_time < $8))"
        )
    };
}
pub(super) use purge_victim;

/// What a purge would delete, per key (see [`purge_victim!`]): the same
/// statement on both stores.
pub(super) static PURGE_COUNTS: Sql = Sql::new(concat!(
    "SELECT v.key, count(*), max(v.version) FROM memory_versions v \
     JOIN memory_heads h USING (tenant, scope_type, scope, key) WHERE ",
    purge_victim!(),
    " GROUP BY v.key ORDER BY v.key"
));

/// The parameters of [`purge_victim!`].
pub(super) fn purge_params<'a>(tenant: &'a Tenant, purge: &'a Purge<'_>) -> [Param<'a>; 8] {
    [
        Param::from(tenant.as_str()),
        Param::from(purge.scope.scope_type.as_i16()),
        Param::from(purge.scope.name.as_str()),
        Param::from(purge.key.map(Key::as_str)),
        Param::from(purge.include_deleted || purge.key.is_some()),
        Param::from(purge.keep),
        Param::from(purge.older_than),
        Param::from(purge.tombstones_before),
    ]
}

/// A version of a key (columns as `version_columns!`) in `scope`.
pub(super) fn entry_row(row: &impl Cols, scope: &Scope) -> Result<Entry> {
    Ok(Entry {
        scope: scope.clone(),
        key: Key::from_store(row.text(0)?),
        version: row.int(1)?,
        value: row.opt_text(2)?.map(Value::from_store).transpose()?,
        deleted: row.boolean(3)?,
        provenance: Provenance {
            execution_id: row.text(4)?,
            flow_id: row.text(5)?,
            flow_name: row.text(6)?,
        },
        create_time: row.time(7)?,
    })
}

/// A row of a statement that cuts by bytes itself ([`sent_whole`]): the
/// entry, or `None` once the statement sent it without its value.
fn sent_whole_row(row: &impl Cols, scope: &Scope) -> Result<Option<Entry>> {
    if row.boolean(8)? {
        return Ok(None);
    }
    entry_row(row, scope).map(Some)
}

fn change_row(row: &impl Cols) -> Result<Change> {
    let kind = row.small(1)?;
    Ok(Change {
        revision: row.int(0)?,
        kind: ChangeKind::from_i16(kind)
            .ok_or_else(|| Error::internal(format!("unknown change kind {kind}")))?,
        key: Key::from_store(row.text(2)?),
        version: row.int(3)?,
        versions_deleted: row.int(4)?,
        value: row.opt_text(5)?.map(Value::from_store).transpose()?,
        create_time: row.time(6)?,
    })
}

pub(super) fn scope_summary(row: &impl Cols) -> Result<ScopeSummary> {
    Ok(ScopeSummary {
        scope: scope_at(row, 0)?,
        entry_count: row.int(2)?,
        purged_count: row.int(3)?,
    })
}

/// A scope whose type and name are the columns at `at` and `at + 1`.
pub(super) fn scope_at(row: &impl Cols, at: usize) -> Result<Scope> {
    let scope_type = row.small(at)?;
    Ok(Scope {
        scope_type: ScopeType::from_i32(scope_type.into())
            .ok_or_else(|| Error::internal(format!("unknown scope type {scope_type} in store")))?,
        name: ScopeName::parse("scope", row.text(at + 1)?).map_err(Error::internal)?,
    })
}

/// The newest version number of a key and whether it is a tombstone.
pub(super) async fn head_in(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    key: &Key,
) -> Result<Option<Head>> {
    let row = conn
        .row(
            &HEAD,
            params![
                tenant.as_str(),
                scope.scope_type.as_i16(),
                scope.name.as_str(),
                key.as_str(),
            ],
        )
        .await?;
    row.map(|row| {
        Ok(Head {
            version: row.int(0)?,
            deleted: row.boolean(1)?,
        })
    })
    .transpose()
}

/// The newest version of a key (a tombstone too), if it has one.
pub(super) async fn current_in(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    key: &Key,
) -> Result<Option<Entry>> {
    conn.first(
        &CURRENT,
        params![
            tenant.as_str(),
            scope.scope_type.as_i16(),
            scope.name.as_str(),
            key.as_str(),
        ],
        |row| entry_row(row, scope),
    )
    .await
}

/// One version of a key, if it is stored.
pub(super) async fn version_in(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    key: &Key,
    version: i64,
) -> Result<Option<Entry>> {
    conn.first(
        &VERSION,
        params![
            tenant.as_str(),
            scope.scope_type.as_i16(),
            scope.name.as_str(),
            key.as_str(),
            version,
        ],
        |row| entry_row(row, scope),
    )
    .await
}

/// A row of what a purge deleted: key, versions, newest version.
pub(super) fn purged_row(row: &impl Cols) -> Result<Purged> {
    Ok(Purged {
        key: row.text(0)?,
        versions: row.int(1)?,
        newest: row.int(2)?,
    })
}

/// What the compaction fence says of a source now at head `now`: nothing
/// when it still has the version it was read at.
pub(super) fn fence_moved(fence: &Fence<'_>, now: Option<i64>) -> Option<Compacted> {
    (now != Some(fence.version)).then(|| Compacted::SourceChanged {
        key: fence.key.clone(),
        read: fence.version,
        now,
    })
}

/// An audit record with what its write borrows.
pub(super) struct AuditWrite {
    key: Key,
    value: Value,
    provenance: Provenance,
}

impl AuditWrite {
    pub(super) fn of(record: &AuditRecord) -> Result<Self> {
        Ok(AuditWrite {
            key: record.key(),
            value: record.to_value()?,
            provenance: Provenance::default(),
        })
    }

    /// A forget's record completed with what it deleted, and the scope
    /// that keeps it.
    pub(super) fn forgotten(
        record: &mut AuditRecord,
        counts: crate::data::ForgetCounts,
    ) -> Result<(Scope, Self)> {
        crate::data::complete(record, counts);
        let scope = record
            .scope_of()
            .ok_or_else(|| Error::internal("a forget record without its scope"))?;
        Ok((scope, Self::of(record)?))
    }

    /// The unconditional write that stores the record in `scope`.
    pub(super) fn write<'a>(&'a self, scope: &'a Scope, now: DateTime<Utc>) -> Write<'a> {
        Write::audit(scope, &self.key, &self.value, &self.provenance, now)
    }
}

/// A [`Write`] that owns what it names, so it can wait in a group commit's
/// queue (see `group.rs`) while its caller waits for the outcome.
pub(super) struct OwnedWrite {
    scope: Scope,
    key: Key,
    value: Option<Value>,
    expected_version: Option<i64>,
    request: Option<(String, [u8; 32])>,
    provenance: Provenance,
    now: DateTime<Utc>,
    change: crate::memory::ChangeKind,
    /// The version's search vector, when the store built it before the
    /// write waited (Postgres, `vector::memory`).
    search: Option<Vec<u8>>,
}

impl OwnedWrite {
    pub(super) fn of(write: &Write<'_>) -> Self {
        OwnedWrite {
            scope: write.scope.clone(),
            key: write.key.clone(),
            value: match write.mutation {
                Mutation::Set(value) => Some(value.clone()),
                Mutation::Delete => None,
            },
            expected_version: write.expected_version,
            request: write.request.map(|r| (r.id.to_owned(), r.fingerprint)),
            provenance: write.provenance.clone(),
            now: write.now,
            change: write.change,
            search: None,
        }
    }

    /// With the version's search vector.
    pub(super) fn searched(mut self, search: Option<Vec<u8>>) -> Self {
        self.search = search;
        self
    }

    pub(super) fn search(&self) -> Option<&[u8]> {
        self.search.as_deref()
    }

    pub(super) fn write(&self) -> Write<'_> {
        Write {
            scope: &self.scope,
            key: &self.key,
            mutation: self.value.as_ref().map_or(Mutation::Delete, Mutation::Set),
            expected_version: self.expected_version,
            request: self.request.as_ref().map(|(id, fingerprint)| RequestStamp {
                id,
                fingerprint: *fingerprint,
            }),
            provenance: &self.provenance,
            now: self.now,
            change: self.change,
        }
    }

    /// An unconditional set without a request id: it always stores, so
    /// several of distinct keys can share one statement.
    pub(super) fn is_plain_set(&self) -> bool {
        self.value.is_some() && self.expected_version.is_none() && self.request.is_none()
    }

    /// The order a batch takes its keys' row locks in: every batch the
    /// same, so two batches (of two replicas) cannot deadlock each other.
    pub(super) fn lock_order(&self) -> (i16, &str, &str) {
        (
            self.scope.scope_type.as_i16(),
            self.scope.name.as_str(),
            self.key.as_str(),
        )
    }
}

/// The place in `writes` (of distinct keys) of the key a statement shared
/// by a group's sets returned a row for.
pub(super) fn key_at(
    writes: &[Write<'_>],
    scope_type: i16,
    scope: &str,
    key: &str,
) -> Result<usize> {
    writes
        .iter()
        .position(|w| {
            w.scope.scope_type.as_i16() == scope_type
                && w.scope.name.as_str() == scope
                && w.key.as_str() == key
        })
        .ok_or_else(|| Error::internal("a set stored a key not asked for"))
}

/// Runs a batch's writes in the order their locks are taken (see
/// [`OwnedWrite::lock_order`]), and gives the outcomes back in the batch's
/// order. `run` writes one in the open transaction.
pub(super) fn lock_ordered(jobs: &[OwnedWrite]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    // Stable: two writes of one key keep their order.
    order.sort_by(|&a, &b| jobs[a].lock_order().cmp(&jobs[b].lock_order()));
    order
}

/// What differs between the backends: the writes, and how a key's newest
/// version is read (Postgres reads concurrent ones together).
pub(super) trait MemoryWrites {
    /// See [`MemoryStore::get`] without a version.
    fn current(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Entry>>> + Send;

    /// See [`MemoryStore::write`].
    fn write_version(
        &self,
        tenant: &Tenant,
        write: &Write<'_>,
    ) -> impl Future<Output = Result<Written>> + Send;

    /// See [`MemoryStore::purge`].
    fn purge_versions(
        &self,
        tenant: &Tenant,
        purge: &Purge<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<PurgeOutcome>> + Send;

    /// See [`MemoryStore::fork`]: [`past::fork_in`] and the audit record
    /// in one transaction.
    fn fork_scope(
        &self,
        tenant: &Tenant,
        fork: &Fork<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<Forked>> + Send;

    /// See [`DataStore::forget_user`](crate::data::DataStore::forget_user):
    /// [`forget::forget_in`](super::forget::forget_in) and the audit
    /// skeleton in one transaction.
    fn forget_with_record(
        &self,
        tenant: &Tenant,
        forget: &crate::data::Forgetting,
        record: AuditRecord,
    ) -> impl Future<Output = Result<crate::data::ForgetCounts>> + Send;

    /// See [`MemoryStore::compact`].
    fn write_summary(
        &self,
        tenant: &Tenant,
        fences: &[Fence<'_>],
        write: &Write<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<Compacted>> + Send;
}

impl<B: Backend + MemoryWrites> MemoryStore for B {
    async fn write(&self, tenant: &Tenant, write: &Write<'_>) -> Result<Written> {
        self.write_version(tenant, write).await
    }

    async fn get(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        version: Option<i64>,
    ) -> Result<Option<Entry>> {
        match version {
            Some(version) => {
                let mut conn = self.reader(tenant).await?;
                version_in(&mut conn, tenant, scope, key, version).await
            }
            None => self.current(tenant, scope, key).await,
        }
    }

    async fn head(&self, tenant: &Tenant, scope: &Scope, key: &Key) -> Result<Option<Head>> {
        let mut conn = self.reader(tenant).await?;
        head_in(&mut conn, tenant, scope, key).await
    }

    async fn list(&self, tenant: &Tenant, query: &ListQuery<'_>) -> Result<Vec<Entry>> {
        let (low, high) = query.prefix.range();
        let sql = match (query.descending, <B::Conn as Run>::DIALECT) {
            (false, Dialect::Postgres) => &LIST_ASCENDING_PG,
            (false, Dialect::Sqlite) => &LIST_ASCENDING,
            (true, Dialect::Postgres) => &LIST_DESCENDING_PG,
            (true, Dialect::Sqlite) => &LIST_DESCENDING,
        };
        let bound = match query.descending {
            true => query.after.map_or(high.clone(), str::to_owned),
            false => query.after.unwrap_or("").to_owned(),
        };
        let mut conn = self.reader(tenant).await?;
        let mut read = Weighed::default();
        loop {
            // Read on after the last item an earlier part held.
            let after = read
                .items
                .last()
                .map_or_else(|| bound.clone(), |e: &Entry| e.key.as_str().to_owned());
            let params = params![
                tenant.as_str(),
                query.scope.scope_type.as_i16(),
                query.scope.name.as_str(),
                low.as_str(),
                high.as_str(),
                after.as_str(),
                query.include_reserved,
                query.limit - read.items.len() as i64,
                SENT_WHOLE_BYTES,
            ];
            let cut = conn
                .weigh_into(sql, params, &mut read, |row| {
                    sent_whole_row(row, query.scope)
                })
                .await?;
            if !cut || read.full {
                return Ok(read.items);
            }
        }
    }

    async fn history(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        from_version: i64,
        limit: i64,
    ) -> Result<Vec<Entry>> {
        let mut conn = self.reader(tenant).await?;
        let mut read = Weighed::default();
        // First by each version's share, then, past a version larger than
        // its share, by the running sum from that version on.
        let mut part = (&HISTORY_BY_ROW, row_share(limit));
        loop {
            let params = params![
                tenant.as_str(),
                scope.scope_type.as_i16(),
                scope.name.as_str(),
                key.as_str(),
                read.items
                    .last()
                    .map_or(from_version, |e: &Entry| e.version + 1),
                limit - read.items.len() as i64,
                part.1,
            ];
            let cut = conn
                .weigh_into(part.0, params, &mut read, |row| sent_whole_row(row, scope))
                .await?;
            if !cut || read.full {
                return Ok(read.items);
            }
            part = (&HISTORY, SENT_WHOLE_BYTES);
        }
    }

    async fn list_scopes(
        &self,
        tenant: &Tenant,
        filter: ScopeFilter<'_>,
        after: Option<&Scope>,
        limit: i64,
    ) -> Result<Vec<ScopeSummary>> {
        let mut conn = self.reader(tenant).await?;
        if let Some(at) = filter.at {
            return past::list_scopes_at(&mut conn, tenant, &filter, after, limit, at).await;
        }
        let params = params![
            tenant.as_str(),
            filter.scope_type.map_or(0, ScopeType::as_i16),
            after.map_or(0, |scope| scope.scope_type.as_i16()),
            after.map_or("", |scope| scope.name.as_str()),
            limit,
            filter.flow_id.unwrap_or(""),
            filter.flow_name.unwrap_or(""),
        ];
        conn.all(&SCOPES, params, scope_summary).await
    }

    async fn get_at(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        at: Point,
    ) -> Result<Option<Past>> {
        let mut conn = self.reader(tenant).await?;
        past::get_at(&mut conn, tenant, scope, key, at).await
    }

    async fn list_at(
        &self,
        tenant: &Tenant,
        query: &ListQuery<'_>,
        at: Point,
    ) -> Result<Vec<Past>> {
        let mut conn = self.reader(tenant).await?;
        past::list_at(&mut conn, tenant, query, at).await
    }

    async fn fork(&self, tenant: &Tenant, fork: &Fork<'_>, record: AuditRecord) -> Result<Forked> {
        self.fork_scope(tenant, fork, record).await
    }

    // Purge and compaction differ per backend (MemoryWrites).
    async fn purge(&self, t: &Tenant, p: &Purge<'_>, r: AuditRecord) -> Result<PurgeOutcome> {
        self.purge_versions(t, p, r).await
    }

    async fn compact(
        &self,
        tenant: &Tenant,
        fences: &[Fence<'_>],
        write: &Write<'_>,
        record: AuditRecord,
    ) -> Result<Compacted> {
        self.write_summary(tenant, fences, write, record).await
    }

    async fn set_retention(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        policy: Option<RetentionPolicy>,
        next_run_time: DateTime<Utc>,
    ) -> Result<Option<Retention>> {
        let mut conn = self.writer(tenant).await?;
        retention::set(&mut conn, tenant, scope, policy, next_run_time).await
    }

    async fn retention(&self, tenant: &Tenant, scope: &Scope) -> Result<Option<Retention>> {
        let mut conn = self.reader(tenant).await?;
        retention::get(&mut conn, tenant, scope).await
    }

    async fn due_retentions(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<(Tenant, Retention)>> {
        let mut conn = self.system().await?;
        retention::due(&mut conn, now, limit).await
    }

    async fn claim_retention(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        seen: DateTime<Utc>,
        next: DateTime<Utc>,
    ) -> Result<bool> {
        let mut conn = self.writer(tenant).await?;
        retention::claim(&mut conn, tenant, scope, seen, next).await
    }

    async fn retention_ran(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        at: DateTime<Utc>,
        versions_deleted: i64,
    ) -> Result<()> {
        let mut conn = self.writer(tenant).await?;
        retention::ran(&mut conn, tenant, scope, at, versions_deleted).await
    }

    async fn register_execution(
        &self,
        tenant: &Tenant,
        execution_id: &str,
        flow_id: &str,
        flow_name: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut conn = self.writer(tenant).await?;
        conn.exec(
            &REGISTER_EXECUTION,
            params![tenant.as_str(), execution_id, flow_id, flow_name, now],
        )
        .await?;
        Ok(())
    }

    async fn execution_flow(
        &self,
        tenant: &Tenant,
        execution_id: &str,
    ) -> Result<Option<(String, String)>> {
        let mut conn = self.reader(tenant).await?;
        let row = conn
            .row(&EXECUTION_FLOW, params![tenant.as_str(), execution_id])
            .await?;
        row.map(|row| Ok((row.text(0)?, row.text(1)?))).transpose()
    }

    async fn reindex(&self, tenant: &Tenant, apply: bool) -> Result<ReindexOutcome> {
        let mut tx = self.begin(tenant).await?;
        let versions_scanned = tx.count(&UNTAGGED, params![tenant.as_str()]).await?;
        let tags_added = if apply {
            tx.exec(&TAG, params![tenant.as_str()]).await? as i64
        } else {
            tx.count(&COUNT_TAGGABLE, params![tenant.as_str()]).await?
        };
        let unknown = tx
            .rows(&UNKNOWN_FLOWS, params![tenant.as_str()])
            .await?
            .iter()
            .map(|row| Ok((row.text(0)?, row.int(1)?)))
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
    ) -> Result<ChangePage> {
        let (low, high) = prefix.range();
        let mut conn = self.reader(tenant).await?;
        // Only as far as a page carries (the feed then reads on from the
        // last change read): a page of values of a megabyte is not held
        // whole, nor sent (see `SENT_WHOLE_BYTES`).
        let mut read = Weighed::default();
        let mut pruned_through = None;
        loop {
            // A part after the first reads on after the last change held;
            // the first row of a part always comes whole.
            let from = read
                .items
                .last()
                .and_then(|row: &FeedRow| row.change.as_ref())
                .map_or(after, |last| last.revision);
            let cut = conn
                .weigh_into(
                    &CHANGES,
                    params![
                        tenant.as_str(),
                        scope.scope_type.as_i16(),
                        scope.name.as_str(),
                        from,
                        up_to,
                        low.as_str(),
                        high.as_str(),
                        limit - read.items.len() as i64,
                        SENT_WHOLE_BYTES,
                    ],
                    &mut read,
                    |row| {
                        let change = match row.opt_int(0)? {
                            Some(_) if row.boolean(8)? => return Ok(None),
                            Some(_) => Some(change_row(row)?),
                            None => None,
                        };
                        Ok(Some(FeedRow {
                            pruned_through: row.opt_int(7)?,
                            change,
                        }))
                    },
                )
                .await?;
            // The feed's mark as the newest part read it: pruning that came
            // between two parts refuses the page rather than skip a change.
            let Some(newest) = read.items.last() else {
                return Err(Error::internal("the change feed page returned no row"));
            };
            pruned_through = pruned_through.max(newest.pruned_through);
            if !cut || read.full {
                break;
            }
        }
        let changes = read
            .items
            .into_iter()
            .filter_map(|row| row.change)
            .collect();
        Ok(ChangePage {
            changes,
            pruned_through,
        })
    }

    async fn pruned_through(&self) -> Result<Option<i64>> {
        let mut conn = self.system().await?;
        conn.row(&PRUNED_THROUGH, params![])
            .await?
            .map_or(Ok(None), |row| row.opt_int(0))
    }

    async fn prune_changes(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut conn = self.system_writer().await?;
        let Some(newest) = conn
            .row(&NEWEST_EXPIRED, params![before])
            .await?
            .map_or(Ok(None), |row| row.opt_int(0))?
        else {
            return Ok(0);
        };
        // The mark first: a feed page that misses a deleted row then sees
        // it (see CHANGES), and a crash in between only leaves rows no
        // watcher can be after.
        conn.exec(&PRUNED_TO, params![newest]).await?;
        conn.exec(&PRUNE_CHANGES, params![newest, before]).await
    }

    async fn prune_request_ids(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut conn = self.system_writer().await?;
        conn.exec(&PRUNE_REQUEST_IDS, params![before]).await
    }
}
/// A row of [`CHANGES`]: how far the feed was pruned, and a change (none
/// on the one row of an empty page).
struct FeedRow {
    pruned_through: Option<i64>,
    change: Option<Change>,
}

impl crate::paging::Weigh for FeedRow {
    fn weight(&self) -> usize {
        self.change.as_ref().map_or(0, |change| change.weight())
    }
}
