//! The Postgres store: production, shared by every replica. What it shares
//! with SQLite is written once in `store/` (see `sql.rs`); this module keeps
//! what only Postgres does: connecting, migrating and granting, and the
//! leases each call takes; the versioned write, purge and compaction
//! (`memory.rs`), appends and their reads (`sessions.rs`), search
//! (`search.rs`) and the feeds' horizons (`feeds.rs`).

use std::str::FromStr;
use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::encode::IsNull;
use sqlx::postgres::{
    PgArgumentBuffer, PgConnectOptions, PgHasArrayType, PgPool, PgPoolOptions, PgTypeInfo,
};
use sqlx::{Executor, Postgres};
use tokio::sync::{OnceCell, watch};

mod feeds;
mod memory;
pub(crate) mod pool;
mod run;
mod search;
pub(crate) mod sessions;

pub(crate) use memory::SET_ANY;

use super::group::Group;
use super::memory::OwnedWrite;
use super::sql::{Cols, Param, Run, Sql};
use super::{Migrations, StoreOptions, migrate_unless_ahead};
use crate::context::Tenant;
use crate::error::{Error, Reason, Result};
use crate::memory::ports::Written;
use crate::memory::{Entry, Key, Scope};
use crate::metrics::Grouped;
use crate::ports::Database;
use crate::search::english::{self, Reading};
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

/// Checks that the certificate and key files the URL (or libpq's
/// `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`) names can be read, so a wrong
/// path (a Secret mounted elsewhere) is refused naming the file: sqlx reads
/// them only when it connects, and says just "No such file or directory".
/// A value that is a PEM text itself, as sqlx also takes, is not a path.
fn readable_tls_files(url: &str) -> Result<()> {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    let mut named: Vec<(&str, String)> = form_urlencoded::parse(query.as_bytes())
        .filter_map(|(key, value)| {
            let name = match &*key {
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => "sslrootcert",
                "sslcert" | "ssl-cert" => "sslcert",
                "sslkey" | "ssl-key" => "sslkey",
                _ => return None,
            };
            Some((name, value.into_owned()))
        })
        .collect();
    for (name, variable) in [
        ("sslrootcert", "PGSSLROOTCERT"),
        ("sslcert", "PGSSLCERT"),
        ("sslkey", "PGSSLKEY"),
    ] {
        if !named.iter().any(|(given, _)| *given == name)
            && let Ok(value) = std::env::var(variable)
        {
            named.push((variable, value));
        }
    }
    for (name, path) in named {
        if path.trim_start().starts_with("-----BEGIN") {
            continue;
        }
        if let Err(err) = std::fs::File::open(&path) {
            return Err(Error::internal(format!("cannot read {name} {path}: {err}")));
        }
    }
    Ok(())
}

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
        readable_tls_files(url)?;
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

/// The slot of a grouped statement's row, by the 1-based `ord` the
/// statement tagged it with (`WITH ORDINALITY` over the group's inputs).
pub(super) fn slot_of<T>(slots: &mut [T], ord: i64) -> Option<&mut T> {
    let at = usize::try_from(ord.checked_sub(1)?).ok()?;
    slots.get_mut(at)
}

/// Runs one step of a group (one job, or several that share a statement)
/// in the group's open transaction: one outcome per job, in order.
pub(super) type InGroup<J, R> =
    for<'c> fn(&'c mut Lease, &'c Tenant, Vec<&'c J>) -> BoxFuture<'c, Result<Vec<R>>>;

/// Runs one job of a group in a transaction of its own.
pub(super) type Alone<J, R> =
    for<'c> fn(&'c PgStore, &'c Tenant, &'c J) -> BoxFuture<'c, Result<R>>;

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
                applied,
                MIGRATOR.run_direct(None, &mut conn, false),
            )
            .await?;
        }
        sqlx::Connection::close(conn).await?;
        Ok(())
    }

    async fn migrations(&self) -> Result<Migrations> {
        let mut conn = self.pool.system().await?;
        require_utf8(&mut conn).await?;
        Ok(Migrations::of(
            &MIGRATOR,
            applied_migrations(&mut conn).await,
        ))
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
