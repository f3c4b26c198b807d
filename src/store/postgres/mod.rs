//! The Postgres store: production, shared by every replica. What it shares
//! with SQLite is written once in `store/` (see `sql.rs`); this module keeps
//! what only Postgres does: the versioned write, purge and compaction, the
//! feeds' horizons (`feeds.rs`), connecting, migrating and granting.
//!
//! A plain write is one statement: a CTE bumps the key's head row and inserts
//! the version it numbered, so versions are dense under any number of
//! concurrent writers (the head's row lock orders them) and nothing is read
//! and then written back. Idempotent writes add the request record in the
//! same transaction.

use std::str::FromStr;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use sqlx::encode::IsNull;
use sqlx::postgres::{
    PgArgumentBuffer, PgConnectOptions, PgHasArrayType, PgPool, PgPoolOptions, PgTypeInfo,
};
use sqlx::{Executor, Postgres, Row};
use tokio::sync::{OnceCell, watch};

mod feeds;
pub(crate) mod pool;
mod run;
mod search;
pub(crate) mod sessions;

use super::group::{Group, commit_failed, shared_steps};
use super::memory::{
    AuditWrite, MemoryWrites, OwnedWrite, current_in, entry_row, fence_moved, head_in, key_at,
    lock_ordered, purge_params, purge_victim, purged_row, version_columns, version_in,
};
use super::past;
use super::sql::{Cols, Param, Run, Sql, params};
use super::{HeadUpdate, StoreOptions, migrate_unless_ahead, schema_is_current};
use crate::context::Tenant;
use crate::error::{Error, Reason, Result};
use crate::memory::audit::AuditRecord;
use crate::memory::ports::{
    Compacted, Fence, Fork, Forked, Mutation, Purge, PurgeOutcome, Write, Written,
};
use crate::memory::{Entry, Key, Scope};
use crate::metrics::Grouped;
use crate::ports::Database;
use crate::search::english::{self, Reading};
use crate::search::vector;
use crate::sessions::{Episode, RecentQuery};
use pool::{Lease, Pool};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// Append groups of one tenant in flight at once on Postgres (writes and
/// Gets have one). An append's statement is mostly per-row work (its text
/// vector and the GIN entries), so a second group keeps the other core
/// busy, and a GIN pending-list merge stalls only one of them: `engram
/// bench` at 16 clients went from 1,218 to 1,698 appends/s, p99 79 to 21
/// ms. Sets and Gets lost with two (5,817 to 4,913 and 11,730 to 7,756):
/// their statements are cheap per row, so smaller groups only add
/// statements.
const APPEND_FLUSHERS: usize = 2;

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

/// What a purge would delete, per key (see `purge_victim!`).
static PURGE_COUNTS: Sql = Sql::new(concat!(
    "SELECT v.key, count(*), max(v.version) FROM memory_versions v \
     JOIN memory_heads h USING (tenant, scope_type, scope, key) WHERE ",
    purge_victim!(),
    " GROUP BY v.key ORDER BY v.key"
));

/// The purge, in one statement: the versions, the heads left without one
/// (a rule that takes a key's head takes all of it) unless a write moved
/// the head meanwhile, and one change per key ($9 time).
static PURGE: Sql = Sql::new(concat!(
    "WITH victims AS ( \
       DELETE FROM memory_versions v USING memory_heads h \
       WHERE v.tenant = h.tenant AND v.scope_type = h.scope_type AND v.scope = h.scope \
       AND v.key = h.key AND ",
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

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: Pool,
    /// Where the horizon tasks' LISTEN connections come from (sqlx's
    /// listener reconnects through a pool of its own kind).
    listen: PgPool,
    /// The settled horizon of each feed, computed by one background task
    /// per feed and store, started by the first reader.
    horizons: Arc<[OnceCell<watch::Receiver<i64>>; 2]>,
    /// What the feeds' settles share ([`feeds`]).
    settles: Arc<feeds::Settles>,
    /// Memory writes committed together (none when group commit is off,
    /// and in the store the batcher itself writes with).
    writes: Option<Group<OwnedWrite, Written>>,
    /// Concurrent reads of keys' newest versions, read together.
    gets: Option<Group<(Scope, Key), Option<Entry>>>,
    /// Appends' writes committed together, likewise.
    appends: Option<Group<sessions::AppendWrite, Option<sessions::Inserted>>>,
    /// Concurrent `Recent` reads, read together.
    recents: Option<Group<RecentQuery, Vec<Episode>>>,
    /// Query words as Postgres normalised them, shared by the searches.
    normalized: Arc<search::Normalized>,
    /// How far the database reads text as the server does
    /// ([`PgStore::text_in_rust`]), once asked.
    rust_text: Arc<OnceCell<Option<Reading>>>,
    /// Whether a write has started asking it in the background
    /// ([`PgStore::memory_vector`]).
    rust_text_asked: Arc<std::sync::atomic::AtomicBool>,
}

/// Whether text search lowercases every ASCII letter to its ASCII
/// lowercase (the positions stripped: a vector with them never equals one
/// without), whether it reads each of [`english::PUNCTUATION`] as a break,
/// and each of [`english::SYMBOLS`]: `$1` and `$3` are texts that hold the
/// marks, `$2` and `$4` the same texts with spaces for them
/// ([`PgStore::text_in_rust`], [`english::punctuation_probe`],
/// [`english::symbol_probe`]); and whether each word of `$5`
/// is read as the one lexeme of `$6` beside it
/// ([`english::letter_probes`]; false before migration 0020 made
/// `engram_english`).
static TEXT_READING: Sql = Sql::new(
    "SELECT strip(to_tsvector('simple', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ')) \
     = 'abcdefghijklmnopqrstuvwxyz'::tsvector, \
     to_tsvector('simple', $1) = to_tsvector('simple', $2), \
     to_tsvector('simple', $3) = to_tsvector('simple', $4), \
     (SELECT coalesce(bool_and(array_to_string(tsvector_to_array( \
         to_tsvector(c.oid::regconfig, t.w)), ' ') = t.l), false) \
      FROM unnest($5::text[], $6::text[]) AS t(w, l) \
      JOIN pg_ts_config c ON c.cfgname = 'engram_english' \
       AND pg_ts_config_is_visible(c.oid))",
);

/// Whether the database reads each word of `$1` (an Arabic letter
/// between two `q`s) as the one lexeme of `$2` beside it once
/// `engram_search_text` has spelt it (so from migration 0031 on), and
/// each mark of `$3` as `$4` reads the spaces for them
/// ([`english::arabic_probes`]). Asked where [`TEXT_READING`] found
/// [`Reading::Letters`], so `engram_english` is there.
static ARABIC_READING: Sql = Sql::new(
    "SELECT (SELECT coalesce(bool_and(array_to_string(tsvector_to_array( \
         to_tsvector('engram_english', engram_search_text(t.w))), ' ') = t.l), false) \
      FROM unnest($1::text[], $2::text[]) AS t(w, l)), \
     to_tsvector('simple', $3) = to_tsvector('simple', $4)",
);

impl PgStore {
    /// The options every connection of the store opens with: the URL's
    /// (and libpq's `PG*` variables'), named `engram`, with JIT off unless
    /// the URL's `options` (or `PGOPTIONS`) set it. Postgres JIT-compiles a
    /// plan whose estimated cost passes `jit_above_cost`, which takes 100 ms
    /// and more on every call, and Engram's statements are short: a search
    /// whose never-run branch had a large estimate once spent 180–270 ms
    /// compiling for 4 ms of work.
    pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(|err| Error::internal(format!("invalid postgres URL: {err}")))?
            .application_name("engram");
        if connect.get_options().is_some_and(|set| set.contains("jit")) {
            return Ok(connect);
        }
        Ok(connect.options([("jit", "off")]))
    }

    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self> {
        let connect = Self::connect_options(url)?;
        let pool = Pool::connect(
            connect.clone(),
            options.max_connections,
            options.acquire_timeout,
        )
        .await?;
        let listen = PgPoolOptions::new()
            // One LISTEN connection per feed.
            .max_connections(2)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        let mut store = PgStore {
            pool,
            listen,
            horizons: Arc::default(),
            settles: Arc::new(feeds::Settles::new(options.feed_wait_warn)),
            writes: None,
            appends: None,
            gets: None,
            recents: None,
            normalized: Arc::default(),
            rust_text: Arc::default(),
            rust_text_asked: Arc::default(),
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
            store.gets = Some(Group::on(
                Grouped::Get,
                &store,
                max,
                1,
                |store: Self, tenant, keys| async move { store.current_group(&tenant, keys).await },
            ));
            store.appends = Some(Group::on(
                Grouped::Append,
                &store,
                max,
                APPEND_FLUSHERS,
                |store: Self, tenant, jobs| async move { store.append_group(&tenant, jobs).await },
            ));
            store.recents = Some(Group::on(
                Grouped::Recent,
                &store,
                max,
                1,
                |store: Self, tenant, queries| async move { store.recent_group(&tenant, queries).await },
            ));
        }
        Ok(store)
    }

    /// Grants a role the use (not the ownership) of every table and
    /// sequence, which is all `engram serve` needs; row-level security
    /// then binds it. Run by the owner after migrating.
    pub async fn grant_to(&self, role: &str) -> Result<()> {
        let plain = (1..=63).contains(&role.len())
            && role.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && role
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !plain {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "grant_to",
                "a role name of lower-case letters, digits and '_'",
            ));
        }
        // One simple query: its statements run as one transaction.
        self.pool
            .dedicated()
            .await?
            .execute(sqlx::AssertSqlSafe(format!(
                "GRANT USAGE ON SCHEMA public TO \"{role}\"; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO \"{role}\"; \
                 GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO \"{role}\""
            )))
            .await?;
        Ok(())
    }

    /// A transaction row-level security confines to one tenant: every
    /// tenant table's policy compares its rows with `engram.tenant`.
    /// Dropped uncommitted, it is rolled back.
    async fn scoped(&self, tenant: &Tenant) -> Result<Lease> {
        self.pool.transaction(tenant).await
    }

    /// A connection in autocommit confined to one tenant, for an operation
    /// that is one statement (or several that need no common snapshot):
    /// one round trip each.
    async fn session(&self, tenant: &Tenant) -> Result<Lease> {
        self.pool.session(tenant).await
    }

    /// A connection in autocommit that row-level security lets see every
    /// tenant, for the server's own cross-tenant work (the scheduler's rule
    /// list, pruning).
    async fn system(&self) -> Result<Lease> {
        self.pool.system().await
    }

    /// Whether the server may normalise plain text itself, as Postgres's
    /// `english` configuration would (episodes' search vectors, search
    /// queries; [`crate::search::english`]), and how far: `None` when the
    /// database lowercases ASCII letters otherwise than Rust does. Text
    /// search lowercases by the database's `LC_CTYPE`, and in a Turkish or
    /// Azerbaijani one `I` becomes a dotless `ı` (`INVOICE` is indexed as
    /// `ınvoıc`): there Postgres does all of it, or the vectors the server
    /// built and those Postgres built (memory, facts, queries that are not
    /// plain) would not meet. [`Reading::Punctuation`] when the database
    /// also reads the common punctuation outside ASCII as breaks (not in
    /// the `C` locale, where every such character is a letter), and
    /// [`Reading::Symbols`] when it reads emoji so too, and
    /// [`Reading::Letters`] when it reads each letter the server would
    /// read outside ASCII as the server does. Asked once per store (after
    /// the migrations: it reads with `engram_english`), on a connection of
    /// its own: call it holding none.
    pub async fn text_in_rust(&self) -> Result<Option<Reading>> {
        let ask = async {
            let punctuation = english::punctuation_probe();
            let symbols = english::symbol_probe();
            let (words, lexemes) = english::letter_probes();
            let mut conn = self.system().await?;
            let row = conn
                .row(
                    &TEXT_READING,
                    &[
                        Param::Text(&punctuation.0),
                        Param::Text(&punctuation.1),
                        Param::Text(&symbols.0),
                        Param::Text(&symbols.1),
                        Param::TextList(&words),
                        Param::TextList(&lexemes),
                    ],
                )
                .await?
                .ok_or_else(|| Error::internal("the text reading check returned no row"))?;
            let passed = [1, 2, 3]
                .into_iter()
                .map(|at| row.boolean(at))
                .collect::<Result<Vec<bool>>>()?;
            let levels = [Reading::Punctuation, Reading::Symbols, Reading::Letters];
            let mut reading = row.boolean(0)?.then(|| {
                // The highest level whose check and every one below passed.
                levels
                    .iter()
                    .zip(&passed)
                    .take_while(|(_, passed)| **passed)
                    .last()
                    .map_or(Reading::Ascii, |(level, _)| *level)
            });
            if reading == Some(Reading::Letters) {
                let (words, lexemes, marks) = english::arabic_probes();
                let row = conn
                    .row(
                        &ARABIC_READING,
                        &[
                            Param::TextList(&words),
                            Param::TextList(&lexemes),
                            Param::Text(&marks.0),
                            Param::Text(&marks.1),
                        ],
                    )
                    .await?
                    .ok_or_else(|| Error::internal("the Arabic reading check returned no row"))?;
                if row.boolean(0)? && row.boolean(1)? {
                    reading = Some(Reading::Arabic);
                }
            }
            // Once per store: whether appends leave text to Postgres's
            // parser, which costs them (see docs/benchmarks.md, "Search").
            match reading {
                Some(Reading::Arabic) => {
                    tracing::info!(reading = ?reading, "the server reads episodes' text for search")
                }
                _ => tracing::warn!(
                    reading = ?reading,
                    "the database's LC_CTYPE reads some text otherwise than the server: \
                     Postgres parses such episodes for search, which slows appends"
                ),
            }
            Ok::<_, Error>(reading)
        };
        self.rust_text.get_or_try_init(|| ask).await.copied()
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

/// A `tsvector` in its binary form (`tsvectorsend`'s, as `vector` builds
/// it), bound as itself: a type sqlx does not know. Borrowed, so binding
/// an episode's or a memory version's vector copies it only into the
/// statement's buffer.
pub(super) struct Tsvector<'a>(pub(super) &'a [u8]);

/// `tsvector` and `tsvector[]`, fixed in Postgres's catalog.
const TSVECTOR_OID: sqlx::postgres::types::Oid = sqlx::postgres::types::Oid(3614);
const TSVECTOR_ARRAY_OID: sqlx::postgres::types::Oid = sqlx::postgres::types::Oid(3643);

impl sqlx::Type<Postgres> for Tsvector<'_> {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(TSVECTOR_OID)
    }
}

impl PgHasArrayType for Tsvector<'_> {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(TSVECTOR_ARRAY_OID)
    }
}

impl sqlx::Encode<'_, Postgres> for Tsvector<'_> {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> std::result::Result<IsNull, sqlx::error::BoxDynError> {
        buf.extend_from_slice(self.0);
        Ok(IsNull::No)
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

/// The slot of a grouped statement's row, by the 1-based `ord` the
/// statement tagged it with (`WITH ORDINALITY` over the group's inputs).
pub(super) fn slot_of<T>(slots: &mut [T], ord: i64) -> Option<&mut T> {
    usize::try_from(ord - 1)
        .ok()
        .and_then(|at| slots.get_mut(at))
}

/// Runs one step of a group (one job, or several that share a statement)
/// in the group's open transaction: one outcome per job, in order.
pub(super) type InGroup<J, R> =
    for<'c> fn(&'c mut Lease, &'c Tenant, Vec<&'c J>) -> BoxFuture<'c, Result<Vec<R>>>;

/// Runs one job of a group in a transaction of its own.
pub(super) type Alone<J, R> =
    for<'c> fn(&'c PgStore, &'c Tenant, &'c J) -> BoxFuture<'c, Result<R>>;

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
    async fn current_group(
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
            let mut found: Vec<Option<Entry>> = keys.iter().map(|_| None).collect();
            for row in &rows {
                let ord: i64 = row.try_get(8)?;
                let at = usize::try_from(ord - 1).map_err(Error::internal)?;
                let (scope, _) = keys
                    .get(at)
                    .ok_or_else(|| Error::internal("a row for no key asked for"))?;
                found[at] = Some(entry_row(row, scope)?);
            }
            Ok::<_, Error>(found)
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
    async fn write_group(&self, tenant: &Tenant, jobs: Vec<OwnedWrite>) -> Vec<Result<Written>> {
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

/// The versions of the migrations applied to the database (none before
/// the first).
async fn applied_migrations<'c>(conn: impl Executor<'c, Database = Postgres>) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(conn)
        .await
        .unwrap_or_default()
}

/// Refuses a database whose encoding is not UTF8, saying so. Engram keeps
/// text of every script, and its search migrations read it with Unicode
/// classes and normalisation: in another encoding one failed deep in
/// migration 0031, "conversion between UTF8 and SQL_ASCII is not
/// supported", and a write of a character the encoding lacks would fail
/// at that write.
async fn require_utf8<'c>(conn: impl Executor<'c, Database = Postgres>) -> Result<()> {
    let encoding: String = sqlx::query_scalar("SELECT current_setting('server_encoding')")
        .fetch_one(conn)
        .await?;
    if encoding == "UTF8" {
        return Ok(());
    }
    Err(Error::FailedPrecondition {
        reason: Reason::Internal,
        message: format!(
            "the database's encoding is {encoding}, and Engram needs UTF8 (it keeps text of \
             every script): create the database with ENCODING 'UTF8' (from template0 where \
             template1 is not UTF8) and point --database-url at it"
        ),
    })
}

impl Database for PgStore {
    async fn migrate_through(&self, version: Option<i64>) -> Result<()> {
        // On a connection of its own that sees every tenant's rows, so a
        // data migration under forced row-level security touches them all.
        let mut conn = self.pool.dedicated().await?;
        require_utf8(&mut conn).await?;
        if version.is_some() {
            MIGRATOR.run_direct(version, &mut conn, false).await?;
        } else {
            let applied = applied_migrations(&mut conn).await;
            migrate_unless_ahead(
                &MIGRATOR,
                &applied,
                MIGRATOR.run_direct(None, &mut conn, false),
            )
            .await?;
        }
        sqlx::Connection::close(conn).await?;
        Ok(())
    }

    async fn check_schema(&self) -> Result<()> {
        let mut conn = self.pool.system().await?;
        require_utf8(&mut conn).await?;
        let applied = applied_migrations(&mut conn).await;
        schema_is_current(&MIGRATOR, &applied)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&mut self.pool.system().await?)
            .await?;
        Ok(())
    }

    async fn analyze_grown(&self) -> Result<u64> {
        let analyzed: i32 = sqlx::query_scalar("SELECT engram_analyze_grown()")
            .fetch_one(&mut self.pool.system().await?)
            .await?;
        Ok(analyzed.max(0) as u64)
    }

    fn pool_status(&self) -> crate::metrics::PoolStatus {
        crate::metrics::PoolStatus {
            open: self.pool.open(),
            idle: self.pool.idle(),
            max: self.pool.max(),
            queued_writes: (self.writes.as_ref().map_or(0, Group::queued)
                + self.appends.as_ref().map_or(0, Group::queued)) as u32,
        }
    }

    async fn close(&self) {
        self.pool.close().await;
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
        if !purge.dry_run {
            past::record_purges(&mut tx, tenant, purge, record.timestamp).await?;
        }
        let deleted = if purge.dry_run {
            tx.all(&PURGE_COUNTS, &victims, purged_row).await?
        } else {
            let at: &[Param<'_>] = params![record.timestamp];
            tx.all(&PURGE, &[&victims[..], at].concat(), purged_row)
                .await?
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
        let counts = super::forget::forget_in(&mut tx, tenant, forget).await?;
        if forget.dry_run {
            return Ok(counts);
        }
        crate::data::complete(&mut record, counts);
        let scope = record
            .scope_of()
            .ok_or_else(|| Error::internal("a forget record without its scope"))?;
        let audit = AuditWrite::of(&record)?;
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
        for fence in fences {
            // Lock each source's head so no write slips in before commit.
            let now: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM memory_heads \
                 WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 FOR UPDATE",
            )
            .bind(tenant.as_str())
            .bind(write.scope.scope_type.as_i16())
            .bind(write.scope.name.as_str())
            .bind(fence.key.as_str())
            .fetch_optional(&mut tx)
            .await?;
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
