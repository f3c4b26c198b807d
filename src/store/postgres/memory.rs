//! Scoped memory on Postgres: the versioned write (one statement per
//! write, or one per group of plain sets of distinct keys), the grouped
//! reads of keys' newest versions, purge and compaction, forks and the
//! audited forgets: [`MemoryWrites`] for [`PgStore`].
//!
//! A plain write is one statement: a CTE bumps the key's head row and inserts
//! the version it numbered, so versions are dense under any number of
//! concurrent writers (the head's row lock orders them) and nothing is read
//! and then written back. Idempotent writes add the request record in the
//! same transaction.

use std::collections::{HashMap, HashSet};

use futures::FutureExt;
use sqlx::{Executor, Postgres, Row};

use super::pool::Lease;
use super::{Alone, InGroup, PgStore, Tsvector, slot_of};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::memory::audit::AuditRecord;
use crate::memory::ports::{
    Compacted, Fence, Fork, Forked, Mutation, Purge, PurgeOutcome, Write, Written,
};
use crate::memory::{Entry, Key, Scope, ScopeType};
use crate::search::vector;
use crate::store::HeadUpdate;
use crate::store::group::{commit_failed, shared_steps};
use crate::store::memory::{
    AuditWrite, MemoryWrites, OwnedWrite, PURGE_COUNTS, current_in, entry_row, fence_moved,
    head_in, key_at, lock_ordered, purge_params, purge_victim, purged_row, version_columns,
    version_in,
};
use crate::store::past;
use crate::store::sql::{Cols, Param, Run, Sql, params};

/// Builds the write statement around one of the head updates. Parameters:
/// $1 tenant, $2 scope_type, $3 scope, $4 key, $5 now, $6 expected version,
/// $7 value (NULL for a tombstone), $8 deleted, $9 execution_id, $10 flow_id,
/// $11 flow_name.
/// $12 change kind. The change row's revision is taken after the head
/// update has given the transaction its id (see migration 0003), and the
/// version carries it (migration 0011).
/// $13 the version's search vector when the server built it
/// ([`vector::memory`]), stored as the key's row of `memory_search`, which
/// the versions' trigger then leaves as it is (migration 0028); NULL for
/// the trigger to build it.
macro_rules! write_statement {
    ($head:literal) => {
        concat!(
            "WITH head AS (",
            $head,
            "), changed AS (INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, \
             create_time) SELECT $1, $2, $3, $4, $12, head.version, $5 FROM head \
             RETURNING version, revision), \
             searched AS (INSERT INTO memory_search AS s (tenant, scope_type, scope, key, version, \
             search) SELECT $1, $2, $3, $4, changed.version, $13::tsvector FROM changed \
             WHERE $13::tsvector IS NOT NULL AND NOT $8 \
             ON CONFLICT (tenant, scope_type, scope, key) DO UPDATE \
             SET version = excluded.version, search = excluded.search \
             WHERE s.version < excluded.version) \
             INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, \
             deleted, execution_id, flow_id, flow_name, create_time, revision) \
             SELECT $1, $2, $3, $4, changed.version, $7::jsonb, $8, $9, $10, $11, $5, changed.revision \
             FROM changed RETURNING version"
        )
    };
}

pub(crate) const SET_ANY: &str = write_statement!(
    "INSERT INTO memory_heads AS h (tenant, scope_type, scope, key, version, deleted, update_time) \
     VALUES ($1, $2, $3, $4, 1, false, $5) \
     ON CONFLICT (tenant, scope_type, scope, key) \
     DO UPDATE SET version = h.version + 1, deleted = false, update_time = EXCLUDED.update_time \
     RETURNING version"
);

const SET_IF_ABSENT: &str = write_statement!(
    "INSERT INTO memory_heads AS h (tenant, scope_type, scope, key, version, deleted, update_time) \
     VALUES ($1, $2, $3, $4, 1, false, $5) \
     ON CONFLICT (tenant, scope_type, scope, key) \
     DO UPDATE SET version = h.version + 1, deleted = false, update_time = EXCLUDED.update_time \
     WHERE h.deleted \
     RETURNING version"
);

const SET_IF_VERSION: &str = write_statement!(
    "UPDATE memory_heads SET version = version + 1, deleted = false, update_time = $5 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 AND version = $6 \
     RETURNING version"
);

const DELETE_ANY: &str = write_statement!(
    "UPDATE memory_heads SET version = version + 1, deleted = true, update_time = $5 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 AND NOT deleted \
     RETURNING version"
);

const DELETE_IF_VERSION: &str = write_statement!(
    "UPDATE memory_heads SET version = version + 1, deleted = true, update_time = $5 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 AND NOT deleted \
     AND version = $6 \
     RETURNING version"
);

/// Locks, in key order, the heads of the keys a purge takes from ($1–$3
/// the scope, $4 the keys [`past::record_purges`] returned) before it
/// deletes any version, as `ForgetUser` and a group of sets take heads
/// before versions, and returns the keys held. `FOR KEY SHARE`: a set,
/// which updates a head but not its key, goes on meanwhile, and a forget,
/// which deletes heads, waits for the purge (or the purge for it). A purge
/// that locked each head as it emptied it deadlocked with forgets; one
/// that went on to a head made again after this statement (an earlier
/// purge had emptied the key), with a set holding it.
static LOCK_RECORDED: Sql = Sql::new(
    "SELECT key FROM memory_heads WHERE tenant = $1 AND scope_type = $2 AND scope = $3 \
     AND key = ANY($4) ORDER BY key FOR KEY SHARE",
);

/// The keys among those a purge of a run recorded but could not hold ($4)
/// that still have changes, which it holds until it commits. A head can
/// go two ways between the purge's statements: another purge emptied the
/// key (its change shows it, and the record stays, so reads at a past
/// point answer that the versions were purged), or a `ForgetUser` deleted
/// the key with its changes, and left the record to the purge holding it
/// (a forget skips those, since the purge may wait for a head the forget
/// holds). Held, the changes keep a forget from deleting them until the
/// purge has committed the record it keeps; a forget deleting them now
/// is waited for. Forgets delete runs only (`scope_type` 3), so a purge of
/// a namespace never looks through its changes here.
static CHANGED: Sql = Sql::new(
    "SELECT key FROM memory_changes WHERE tenant = $1 AND scope_type = $2 AND scope = $3 \
     AND scope_type = 3 AND key = ANY($4) FOR KEY SHARE",
);

/// The records of the keys ($4) a forget took from under the purge.
static DROP_FORGOTTEN: Sql = Sql::new(
    "DELETE FROM memory_purges WHERE tenant = $1 AND scope_type = $2 AND scope = $3 \
     AND key = ANY($4)",
);

/// The purge, in one statement: the versions, the heads left without one
/// (a rule that takes a key's head takes all of it) unless a write moved
/// the head meanwhile, and one change per key ($9 time). Only the keys
/// recorded whose heads the purge holds ($10, see [`LOCK_RECORDED`]).
static PURGE: Sql = Sql::new(concat!(
    "WITH victims AS ( \
       DELETE FROM memory_versions v USING memory_heads h \
       WHERE v.tenant = h.tenant AND v.scope_type = h.scope_type AND v.scope = h.scope \
       AND v.key = h.key AND h.key = ANY($10) AND ",
    purge_victim!(),
    " RETURNING v.key, v.version, h.version AS head_version \
     ), emptied AS ( \
       DELETE FROM memory_heads h USING (SELECT DISTINCT key, head_version FROM victims \
         WHERE version = head_version) e \
       WHERE h.tenant = $1 AND h.scope_type = $2 AND h.scope = $3 \
       AND h.key = e.key AND h.version = e.head_version \
     ), counted AS ( \
       SELECT key, count(*) AS n, max(version) AS newest FROM victims GROUP BY key \
     ), changed AS ( \
       INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, versions_deleted, create_time) \
       SELECT $1, $2, $3, key, 3, newest, n, $9 FROM counted ORDER BY key \
     ) \
     SELECT key, n, newest FROM counted ORDER BY key"
));

/// Locks the heads a compaction reads and writes ($4: the sources and the
/// target) in key order, as every writer of several heads takes them
/// (`store::mod`, step 4), and returns their versions for the fences. `FOR
/// NO KEY UPDATE`: no write of these keys slips in before the summary
/// commits (a set's or delete's head update takes the same lock), while a
/// purge, which holds its keys' heads against deletion only, goes on (it
/// waits only to delete the head of a key it empties). In
/// the order of the request, and `FOR UPDATE`, a compaction of `[b, a]`
/// deadlocked with a purge, a forget or a group of sets holding `a` and
/// waiting for `b`, and Postgres failed one of them.
static LOCK_COMPACTED: Sql = Sql::new(
    "SELECT key, version FROM memory_heads WHERE tenant = $1 AND scope_type = $2 AND scope = $3 \
     AND key = ANY($4) ORDER BY key FOR NO KEY UPDATE",
);

impl PgStore {
    /// Drops the records of the `recorded` keys of a run a purge did not
    /// get to hold whose changes are gone ([`CHANGED`]); `scope` is the
    /// purge's first three parameters.
    async fn drop_forgotten(
        tx: &mut impl Run,
        scope: &[Param<'_>],
        recorded: &[String],
        held: &[String],
    ) -> Result<()> {
        let held: HashSet<&String> = held.iter().collect();
        let lost: Vec<String> = recorded
            .iter()
            .filter(|key| !held.contains(key))
            .cloned()
            .collect();
        let lost_keys: &[Param<'_>] = params![&lost[..]];
        let changed: HashSet<String> = tx
            .all(&CHANGED, &[scope, lost_keys].concat(), |row| row.text(0))
            .await?
            .into_iter()
            .collect();
        let forgotten: Vec<String> = lost
            .into_iter()
            .filter(|key| !changed.contains(key))
            .collect();
        if !forgotten.is_empty() {
            let forgotten: &[Param<'_>] = params![&forgotten[..]];
            tx.exec(&DROP_FORGOTTEN, &[scope, forgotten].concat())
                .await?;
        }
        Ok(())
    }

    /// Runs the write statement; `None` when its condition refused the
    /// write. `search` is the version's vector when the server built it
    /// ([`PgStore::memory_vector`]).
    async fn write_in<'e, E>(
        executor: E,
        tenant: &Tenant,
        write: &Write<'_>,
        search: Option<&[u8]>,
    ) -> Result<Option<i64>>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let update = HeadUpdate::of(write);
        let statement = match update {
            HeadUpdate::SetAny => SET_ANY,
            HeadUpdate::SetIfAbsent => SET_IF_ABSENT,
            HeadUpdate::SetIfVersion(_) => SET_IF_VERSION,
            HeadUpdate::DeleteAny => DELETE_ANY,
            HeadUpdate::DeleteIfVersion(_) => DELETE_IF_VERSION,
        };
        let version = sqlx::query_scalar(statement)
            .bind(tenant.as_str())
            .bind(write.scope.scope_type.as_i16())
            .bind(write.scope.name.as_str())
            .bind(write.key.as_str())
            .bind(write.now)
            .bind(update.expected())
            .bind(write.mutation.value())
            .bind(write.mutation.is_delete())
            .bind(write.provenance.execution_id.as_str())
            .bind(write.provenance.flow_id.as_str())
            .bind(write.provenance.flow_name.as_str())
            .bind(write.change.as_i16())
            .bind(search.map(Tsvector))
            .fetch_optional(executor)
            .await?;
        Ok(version)
    }

    /// The search vector of the version `write` stores, when the server
    /// builds it: a set, where the database reads text as the server does
    /// ([`PgStore::text_in_rust`]) and the text is one it reads
    /// ([`vector::memory`]). Built before the write waits for a group, and
    /// without waiting: until the database has been asked how it reads
    /// text (once, in the background, started here), the trigger builds
    /// the vectors, and each write keeps its place in its group's queue.
    fn memory_vector(&self, write: &Write<'_>) -> Option<Vec<u8>> {
        let Mutation::Set(value) = write.mutation else {
            return None;
        };
        let Some(&reading) = self.rust_text.get() else {
            if !self
                .rust_text_asked
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                let store = self.clone();
                tokio::spawn(async move {
                    if let Err(err) = store.text_in_rust().await {
                        // Asked again by the next write (or search).
                        store
                            .rust_text_asked
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        tracing::debug!(error = %err, "asking how the database reads text failed");
                    }
                });
            }
            return None;
        };
        vector::memory(write.key.as_str(), value.json(), reading?)
    }
}

/// The newest versions of several keys in one statement, for a group of
/// concurrent Gets. Parameters: $1 tenant, then the keys' scope types,
/// scopes and names as arrays; each row ends with its key's place in the
/// arrays (from 1).
const CURRENT_ANY: &str = concat!(
    "SELECT ",
    version_columns!(),
    ", u.ord FROM unnest($2::smallint[], $3::text[], $4::text[]) \
     WITH ORDINALITY AS u(scope_type, scope, key, ord) \
     JOIN memory_heads h ON h.tenant = $1 AND h.scope_type = u.scope_type \
       AND h.scope = u.scope AND h.key = u.key \
     JOIN memory_versions v ON v.tenant = $1 AND v.scope_type = h.scope_type \
       AND v.scope = h.scope AND v.key = h.key AND v.version = h.version"
);

/// Plain sets of distinct keys in one statement, for a group (see
/// `write_group`): the heads bumped in the order given (the group's lock
/// order), then a change and a version per key, as [`SET_ANY`] does for
/// one. Parameters: $1 tenant, then per write (as arrays) scope type,
/// scope, key, time, value, execution id, flow id, flow name, change kind,
/// search vector (NULL where the trigger builds it).
const SET_MANY: &str = "WITH u AS (SELECT * FROM unnest($2::smallint[], $3::text[], \
       $4::text[], $5::timestamptz[], $6::text[], $7::text[], $8::text[], $9::text[], \
       $10::smallint[], $11::tsvector[]) WITH ORDINALITY AS u(scope_type, scope, key, now, value, \
       execution_id, flow_id, flow_name, change, search, ord)), \
     head AS (INSERT INTO memory_heads AS h (tenant, scope_type, scope, key, version, deleted, \
       update_time) SELECT $1, scope_type, scope, key, 1, false, now FROM u ORDER BY ord \
       ON CONFLICT (tenant, scope_type, scope, key) \
       DO UPDATE SET version = h.version + 1, deleted = false, update_time = EXCLUDED.update_time \
       RETURNING scope_type, scope, key, version), \
     changed AS (INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, \
       create_time) SELECT $1, u.scope_type, u.scope, u.key, u.change, head.version, u.now \
       FROM head JOIN u USING (scope_type, scope, key) \
       RETURNING scope_type, scope, key, version, revision), \
     searched AS (INSERT INTO memory_search AS s (tenant, scope_type, scope, key, version, \
       search) SELECT $1, u.scope_type, u.scope, u.key, c.version, u.search \
       FROM changed c JOIN u USING (scope_type, scope, key) WHERE u.search IS NOT NULL \
       ORDER BY u.ord \
       ON CONFLICT (tenant, scope_type, scope, key) DO UPDATE \
       SET version = excluded.version, search = excluded.search \
       WHERE s.version < excluded.version) \
     INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, \
       execution_id, flow_id, flow_name, create_time, revision) \
     SELECT $1, u.scope_type, u.scope, u.key, c.version, u.value::jsonb, false, u.execution_id, \
       u.flow_id, u.flow_name, u.now, c.revision \
     FROM changed c JOIN u USING (scope_type, scope, key) \
     RETURNING scope_type, scope, key, version";

/// Plain sets of distinct keys stored by one statement ([`SET_MANY`]).
async fn set_many_in(
    conn: &mut Lease,
    tenant: &Tenant,
    jobs: &[&OwnedWrite],
) -> Result<Vec<Written>> {
    let writes: Vec<Write<'_>> = jobs.iter().map(|job| job.write()).collect();
    let column =
        |f: &dyn Fn(&Write<'_>) -> String| -> Vec<String> { writes.iter().map(f).collect() };
    let rows = sqlx::query(SET_MANY)
        .bind(tenant.as_str())
        .bind(
            writes
                .iter()
                .map(|w| w.scope.scope_type.as_i16())
                .collect::<Vec<_>>(),
        )
        .bind(column(&|w| w.scope.name.as_str().to_owned()))
        .bind(column(&|w| w.key.as_str().to_owned()))
        .bind(writes.iter().map(|w| w.now).collect::<Vec<_>>())
        .bind(column(&|w| w.mutation.value().unwrap_or("null").to_owned()))
        .bind(column(&|w| w.provenance.execution_id.as_str().to_owned()))
        .bind(column(&|w| w.provenance.flow_id.as_str().to_owned()))
        .bind(column(&|w| w.provenance.flow_name.as_str().to_owned()))
        .bind(writes.iter().map(|w| w.change.as_i16()).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|job| job.search().map(Tsvector))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    let mut versions: Vec<Option<i64>> = writes.iter().map(|_| None).collect();
    for row in &rows {
        let (scope_type, scope, key): (i16, String, String) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        versions[key_at(&writes, scope_type, &scope, &key)?] = Some(row.try_get(3)?);
    }
    writes
        .iter()
        .zip(versions)
        .map(|(write, version)| {
            let version = version.ok_or_else(|| Error::internal("a plain set stored nothing"))?;
            Ok(Written::Stored(write.entry(version)))
        })
        .collect()
}

impl PgStore {
    async fn current_alone(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
    ) -> Result<Option<Entry>> {
        let mut conn = self.session(tenant).await?;
        current_in(&mut conn, tenant, scope, key).await
    }

    /// Gets that arrived while others were being read, in one statement
    /// (the reads' side of `store::group`: one round trip and one
    /// statement for the group instead of one each).
    pub(super) async fn current_group(
        &self,
        tenant: &Tenant,
        keys: Vec<(Scope, Key)>,
    ) -> Vec<Result<Option<Entry>>> {
        if let [(scope, key)] = &keys[..] {
            return vec![self.current_alone(tenant, scope, key).await];
        }
        let read = async {
            let mut conn = self.session(tenant).await?;
            let rows = sqlx::query(CURRENT_ANY)
                .bind(tenant.as_str())
                .bind(
                    keys.iter()
                        .map(|(s, _)| s.scope_type.as_i16())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    keys.iter()
                        .map(|(s, _)| s.name.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(keys.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>())
                .fetch_all(&mut conn)
                .await?;
            let mut found: Vec<(&Scope, Option<Entry>)> =
                keys.iter().map(|(scope, _)| (scope, None)).collect();
            for row in &rows {
                let (scope, entry) = slot_of(&mut found, row.try_get(8)?)
                    .ok_or_else(|| Error::internal("a row for no key asked for"))?;
                *entry = Some(entry_row(row, scope)?);
            }
            Ok::<_, Error>(
                found
                    .into_iter()
                    .map(|(_, entry)| entry)
                    .collect::<Vec<_>>(),
            )
        };
        match read.await {
            Ok(found) => found.into_iter().map(Ok).collect(),
            // Each on its own, so an error reaches its own call only.
            Err(_) => {
                let mut alone = Vec::with_capacity(keys.len());
                for (scope, key) in &keys {
                    alone.push(self.current_alone(tenant, scope, key).await);
                }
                alone
            }
        }
    }

    /// A write in its own transaction: a plain one is one statement,
    /// committed as it returns.
    async fn write_alone(
        &self,
        tenant: &Tenant,
        write: &Write<'_>,
        search: Option<&[u8]>,
    ) -> Result<Written> {
        if write.request.is_none() {
            let mut conn = self.session(tenant).await?;
            return Self::write_one_in(&mut conn, tenant, write, search).await;
        }
        let mut tx = self.scoped(tenant).await?;
        let written = Self::write_one_in(&mut tx, tenant, write, search).await?;
        if matches!(written, Written::Stored(_)) {
            tx.commit().await?;
        }
        // A replay or a refusal wrote nothing to keep: rolled back as the
        // lease goes.
        Ok(written)
    }

    /// A group's jobs in one transaction (see `store::group`), in `steps`
    /// (each one or more jobs, see [`InGroup`]) that take their rows'
    /// locks in one order (every group takes them in the same order, so
    /// two replicas' groups cannot deadlock), committed once. A group of
    /// one runs `alone`, on the plain path. A failed statement rolls the
    /// group back and runs each job `alone`, so the error reaches its own
    /// call only; a failed commit leaves every outcome unknown.
    pub(super) async fn run_group<J: Sync, R: Send>(
        &self,
        tenant: &Tenant,
        jobs: Vec<J>,
        steps: Vec<Vec<usize>>,
        in_group: InGroup<J, R>,
        alone: Alone<J, R>,
    ) -> Vec<Result<R>> {
        if let [job] = &jobs[..] {
            return vec![alone(self, tenant, job).await];
        }
        let mut tx = match self.scoped(tenant).await {
            Ok(tx) => tx,
            Err(err) => return commit_failed(&err, jobs.len()),
        };
        let mut outcomes: Vec<Option<R>> = jobs.iter().map(|_| None).collect();
        for step in steps {
            let taken = step.iter().map(|&at| &jobs[at]).collect();
            match in_group(&mut tx, tenant, taken).await {
                Ok(done) if done.len() == step.len() => {
                    for (at, outcome) in step.into_iter().zip(done) {
                        outcomes[at] = Some(outcome);
                    }
                }
                _ => {
                    // Rolled back as the lease goes.
                    drop(tx);
                    let mut each = Vec::with_capacity(jobs.len());
                    for job in &jobs {
                        each.push(alone(self, tenant, job).await);
                    }
                    return each;
                }
            }
        }
        if let Err(err) = tx.commit().await {
            return commit_failed(&err, jobs.len());
        }
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| Error::internal("a grouped job without an outcome")))
            .collect()
    }

    /// Writes in one transaction (see [`Self::run_group`]), in lock order.
    /// Plain sets of distinct keys next to each other in that order share
    /// one statement ([`SET_MANY`]): a statement costs Postgres far more
    /// than a row does. The others run one by one, each keeping its own
    /// outcome.
    pub(super) async fn write_group(
        &self,
        tenant: &Tenant,
        jobs: Vec<OwnedWrite>,
    ) -> Vec<Result<Written>> {
        let steps = shared_steps(
            lock_ordered(&jobs),
            |at| jobs[at].is_plain_set(),
            |at| jobs[at].lock_order(),
        );
        self.run_group(
            tenant,
            jobs,
            steps,
            |tx, tenant, step| {
                async move {
                    match &step[..] {
                        [job] => Ok(vec![
                            Self::write_one_in(tx, tenant, &job.write(), job.search()).await?,
                        ]),
                        _ => set_many_in(tx, tenant, &step).await,
                    }
                }
                .boxed()
            },
            |store, tenant, job| {
                async move { store.write_alone(tenant, &job.write(), job.search()).await }.boxed()
            },
        )
        .await
    }

    /// One write in the open transaction or session `conn`. With a request
    /// id, the id is claimed first (a concurrent twin waits on that row
    /// until this commits, then replays), and released again when the
    /// write is refused, so a batch that commits keeps no claim of a
    /// refused write.
    async fn write_one_in(
        conn: &mut Lease,
        tenant: &Tenant,
        write: &Write<'_>,
        search: Option<&[u8]>,
    ) -> Result<Written> {
        let Some(stamp) = write.request else {
            return match Self::write_in(&mut *conn, tenant, write, search).await? {
                Some(version) => Ok(Written::Stored(write.entry(version))),
                None => Ok(Written::Refused(
                    head_in(conn, tenant, write.scope, write.key).await?,
                )),
            };
        };
        let claimed = sqlx::query(
            "INSERT INTO memory_request_ids \
             (tenant, request_id, fingerprint, scope_type, scope, key, create_time) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(stamp.id)
        .bind(&stamp.fingerprint[..])
        .bind(write.scope.scope_type.as_i16())
        .bind(write.scope.name.as_str())
        .bind(write.key.as_str())
        .bind(write.now)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        if !claimed {
            let row = sqlx::query(
                "SELECT fingerprint, version FROM memory_request_ids \
                 WHERE tenant = $1 AND request_id = $2",
            )
            .bind(tenant.as_str())
            .bind(stamp.id)
            .fetch_one(&mut *conn)
            .await?;
            let fingerprint: Vec<u8> = row.try_get(0)?;
            let version: Option<i64> = row.try_get(1)?;
            let version =
                version.ok_or_else(|| Error::internal("request record without a version"))?;
            let entry = version_in(conn, tenant, write.scope, write.key, version).await?;
            return Ok(Written::Replayed {
                fingerprint,
                version,
                entry,
            });
        }
        let Some(version) = Self::write_in(&mut *conn, tenant, write, search).await? else {
            sqlx::query("DELETE FROM memory_request_ids WHERE tenant = $1 AND request_id = $2")
                .bind(tenant.as_str())
                .bind(stamp.id)
                .execute(&mut *conn)
                .await?;
            let head = head_in(conn, tenant, write.scope, write.key).await?;
            return Ok(Written::Refused(head));
        };
        sqlx::query(
            "UPDATE memory_request_ids SET version = $3 WHERE tenant = $1 AND request_id = $2",
        )
        .bind(tenant.as_str())
        .bind(stamp.id)
        .bind(version)
        .execute(&mut *conn)
        .await?;
        Ok(Written::Stored(write.entry(version)))
    }
}

impl MemoryWrites for PgStore {
    async fn current(&self, tenant: &Tenant, scope: &Scope, key: &Key) -> Result<Option<Entry>> {
        match &self.gets {
            Some(group) => group.submit(tenant, (scope.clone(), key.clone())).await,
            None => self.current_alone(tenant, scope, key).await,
        }
    }

    async fn write_version(&self, tenant: &Tenant, write: &Write<'_>) -> Result<Written> {
        match &self.writes {
            Some(group) => {
                let search = self.memory_vector(write);
                group
                    .submit(tenant, OwnedWrite::of(write).searched(search))
                    .await
            }
            None => {
                let search = self.memory_vector(write);
                self.write_alone(tenant, write, search.as_deref()).await
            }
        }
    }

    async fn purge_versions(
        &self,
        tenant: &Tenant,
        purge: &Purge<'_>,
        record: AuditRecord,
    ) -> Result<PurgeOutcome> {
        let victims = purge_params(tenant, purge);
        let mut tx = self.scoped(tenant).await?;
        let deleted = if purge.dry_run {
            tx.all(&PURGE_COUNTS, &victims, purged_row).await?
        } else {
            // Purges that share a key take turns at its record; then its
            // head, then its versions (the order of `store::mod`).
            let keys = past::record_purges(&mut tx, tenant, purge, record.timestamp).await?;
            if keys.is_empty() {
                Vec::new()
            } else {
                let recorded: &[Param<'_>] = params![&keys[..]];
                let held = tx
                    .all(&LOCK_RECORDED, &[&victims[..3], recorded].concat(), |row| {
                        row.text(0)
                    })
                    .await?;
                if held.len() < keys.len() && purge.scope.scope_type == ScopeType::Execution {
                    Self::drop_forgotten(&mut tx, &victims[..3], &keys, &held).await?;
                }
                let at: &[Param<'_>] = params![record.timestamp, &held[..]];
                tx.all(&PURGE, &[&victims[..], at].concat(), purged_row)
                    .await?
            }
        };
        let outcome = PurgeOutcome::new(purge, &deleted, record);
        if let Some(record) = &outcome.record {
            let audit = AuditWrite::of(record)?;
            let write = audit.write(purge.scope, record.timestamp);
            Self::write_in(&mut tx, tenant, &write, None).await?;
        }
        tx.commit().await?;
        Ok(outcome)
    }

    async fn fork_scope(
        &self,
        tenant: &Tenant,
        fork: &Fork<'_>,
        mut record: AuditRecord,
    ) -> Result<Forked> {
        let mut tx = self.scoped(tenant).await?;
        let copied = match past::fork_in(&mut tx, tenant, fork).await? {
            Ok(copied) => copied,
            // Rolled back as the lease goes.
            Err(refused) => return Ok(refused),
        };
        record.keys_affected = copied.keys;
        let audit = AuditWrite::of(&record)?;
        Self::write_in(
            &mut tx,
            tenant,
            &audit.write(fork.target, record.timestamp),
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(Forked::Copied(Box::new(record)))
    }

    async fn forget_with_record(
        &self,
        tenant: &Tenant,
        forget: &crate::data::Forgetting,
        mut record: AuditRecord,
    ) -> Result<crate::data::ForgetCounts> {
        let mut tx = self.scoped(tenant).await?;
        let counts = crate::store::forget::forget_in(&mut tx, tenant, forget).await?;
        if forget.dry_run {
            return Ok(counts);
        }
        let (scope, audit) = AuditWrite::forgotten(&mut record, counts)?;
        Self::write_in(
            &mut tx,
            tenant,
            &audit.write(&scope, record.timestamp),
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(counts)
    }

    async fn write_summary(
        &self,
        tenant: &Tenant,
        fences: &[Fence<'_>],
        write: &Write<'_>,
        mut record: AuditRecord,
    ) -> Result<Compacted> {
        let search = self.memory_vector(write);
        let mut tx = self.scoped(tenant).await?;
        let mut keys: Vec<String> = fences.iter().map(|f| f.key.as_str().to_owned()).collect();
        keys.push(write.key.as_str().to_owned());
        let asked = params![
            tenant.as_str(),
            write.scope.scope_type.as_i16(),
            write.scope.name.as_str(),
            &keys[..],
        ];
        let heads: HashMap<String, i64> = tx
            .all(&LOCK_COMPACTED, asked, |row| {
                Ok((row.text(0)?, row.int(1)?))
            })
            .await?
            .into_iter()
            .collect();
        for fence in fences {
            let now = heads.get(fence.key.as_str()).copied();
            if let Some(moved) = fence_moved(fence, now) {
                return Ok(moved);
            }
        }
        let version = Self::write_in(&mut tx, tenant, write, search.as_deref())
            .await?
            .ok_or_else(|| Error::internal("unconditional write refused"))?;
        record.target_version = version;
        let audit = AuditWrite::of(&record)?;
        Self::write_in(
            &mut tx,
            tenant,
            &audit.write(write.scope, record.timestamp),
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(Compacted::Written(Box::new((write.entry(version), record))))
    }
}
