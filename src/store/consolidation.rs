//! Rules and facts on both backends, one statement text each where the
//! dialects agree. A run on Postgres holds an advisory lock on its rule (so
//! the scheduler on another replica can skip it with a try-lock) and the
//! rule's row lock, and reads the rule's watermark under them; on SQLite
//! the single writer's `BEGIN IMMEDIATE` already excludes every other run.
//! Lists of ids go to Postgres as arrays in one statement, to SQLite one
//! statement per id.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::sessions::{episode_columns, episode_row};
use super::sql::{
    Backend, Cols, Dialect, Param, Run, SENT_WHOLE_BYTES, Sql, Transaction, page_by_bytes, params,
    select,
};
use crate::consolidation::ports::{
    ConsolidationStore, FactFilter, FactTx, Locked, RuleCreation, RuleTx, RunLock,
};
use crate::consolidation::{
    Cadence, Fact, FactKey, FactKind, FactPayload, FactVersion, Provenance, Rule,
};
use crate::context::Tenant;
use crate::error::{Error, Result, request_id_reused};
use crate::memory::ports::RequestStamp;
use crate::paging::Weighed;
use crate::sessions::Episode;

macro_rules! rule_columns {
    () => {
        "id, filter, every_n_episodes, cron, then_emits::text, kind, confidence, enabled, \
         watermark, episodes_promoted, create_time, last_run_time"
    };
}

macro_rules! fact_columns {
    () => {
        "f.id, f.app, f.user_id, f.kind, f.create_time, v.version, v.deleted, v.subject, \
         v.predicate, v.object, v.content::text, v.confidence, v.source, \
         v.source_episode_ids::text, v.channels::text, v.create_time"
    };
}
pub(super) use fact_columns;

static CREATE_RULE: Sql = Sql::new(
    "INSERT INTO consolidation_rules (tenant, id, filter, every_n_episodes, cron, \
     then_emits, kind, confidence, enabled, watermark, create_time) \
     VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11) \
     ON CONFLICT (tenant, id) DO NOTHING",
);

/// A rule created with a request id; what [`CREATE_RULE`] writes, and the
/// request's id and fingerprint. Nothing is written when the rule's id or
/// the request id is taken (no conflict target: either unique index).
static CREATE_KEYED_RULE: Sql = Sql::new(
    "INSERT INTO consolidation_rules (tenant, id, filter, every_n_episodes, cron, \
     then_emits, kind, confidence, enabled, watermark, create_time, create_request_id, \
     create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11, $12, $13) \
     ON CONFLICT DO NOTHING",
);

/// How many columns [`rule_columns`] names.
const RULE_COLUMNS: usize = 12;

/// The rule request `$3` made, else the rule with id `$2`: the rule,
/// whether request `$3` made it (1 or 0), and that request's fingerprint
/// (read only when it did: NULL for a rule made unkeyed).
static RULE_OF_REQUEST: Sql = select!(
    rule_columns!(),
    ", (CASE WHEN create_request_id = $3 THEN 1 ELSE 0 END)::bigint AS repeated, \
     create_fingerprint FROM consolidation_rules \
     WHERE tenant = $1 AND (create_request_id = $3 OR id = $2) \
     ORDER BY repeated DESC LIMIT 1"
);

/// How many times a keyed creation that found nothing to insert looks for
/// what took it, which may be deleted in between (then the insert is
/// tried again).
const CREATE_ATTEMPTS: usize = 3;

static RULE: Sql = select!(
    rule_columns!(),
    " FROM consolidation_rules WHERE tenant = $1 AND id = $2"
);

static RULES: Sql = select!(
    rule_columns!(),
    " FROM consolidation_rules WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3"
);

static DELETE_RULE: Sql = Sql::new("DELETE FROM consolidation_rules WHERE tenant = $1 AND id = $2");

static ENABLED_RULES: Sql = Sql::new(concat!(
    "SELECT tenant, ",
    rule_columns!(),
    " FROM consolidation_rules WHERE enabled ORDER BY tenant, id"
));

static PENDING: Sql = Sql::new(
    "SELECT count(*) FROM (SELECT 1 FROM episodes WHERE tenant = $1 AND cursor > $2 \
     AND cursor <= $3 LIMIT $4) pending",
);

/// Live facts by owner and kind, after (or before) an id. Parameters: $1
/// tenant, $2 app, $3 user, $4 kind (each NULL: any), $5 the bound, $6
/// limit, $7 [`SENT_WHOLE_BYTES`]: the columns of [`fact_row`], a fact
/// past that without its content and source episodes, then whether it
/// came past (column 16), and the store reads on after the last fact it
/// kept. `$from` is `facts_joined!` or `facts_first!` (below); a leading
/// `planned_each_call;` goes to [`page_by_bytes!`].
macro_rules! facts {
    ($($new:ident;)? $order:literal, $from:expr) => {
        page_by_bytes!(
            $($new;)?
            "id, app, user_id, kind, fact_time, version, deleted, subject, predicate, object, \
             CASE WHEN past THEN NULL ELSE content::text END, confidence, source, \
             CASE WHEN past THEN NULL ELSE source_episode_ids::text END, channels::text, \
             create_time",
            "f.id, f.app, f.user_id, f.kind, f.create_time AS fact_time, v.version, v.deleted, \
             v.subject, v.predicate, v.object, v.content, v.confidence, v.source, \
             v.source_episode_ids, v.channels, v.create_time",
            "pg_column_size(v.content) + pg_column_size(v.source_episode_ids)",
            $order,
            "$7",
            $from
        )
    };
}

/// The facts a listing may show, of the owner `$owner` (one of
/// `owner_or_any!` and `owner_exact!`), after (or before, `$bound`) the id
/// $5, for `concat!`.
macro_rules! facts_where {
    ($owner:expr, $bound:literal) => {
        concat!(
            "f.tenant = $1 AND NOT f.deleted AND ",
            $owner,
            " AND ($4::smallint IS NULL OR f.kind = $4) AND f.id ",
            $bound,
            " $5"
        )
    };
}

/// The app $2 and the user $3, either NULL: any.
macro_rules! owner_or_any {
    () => {
        "($2::text IS NULL OR f.app = $2) AND ($3::text IS NULL OR f.user_id = $3)"
    };
}

/// The app $2 and the user $3, both given: read in id order from
/// `facts_owner_id` (migration 0034). Written with `IS NULL OR`, neither
/// backend could use an index for them, and both walked the tenant's facts
/// in id order for the owner's: 37 ms on Postgres and 19 ms on SQLite for
/// an owner with none among 200,000 facts, 0.05 ms now.
macro_rules! owner_exact {
    () => {
        "f.app = $2 AND f.user_id = $3"
    };
}

/// On SQLite: the facts joined to their current versions, then the page.
macro_rules! facts_joined {
    ($order:literal, $bound:literal, $owner:expr) => {
        concat!(
            "FROM facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version WHERE ",
            facts_where!($owner, $bound),
            " ORDER BY f.",
            $order,
            " LIMIT $6"
        )
    };
}

/// On Postgres: the page's facts first, then their versions, as `List`
/// takes a page's heads (`list_pg!` in memory.rs). Joined before the
/// limit, a page after the 150,000th of 200,000 facts was planned as a
/// merge join that read the versions from the tenant's first fact, 38 ms
/// against 0.47 ms.
macro_rules! facts_first {
    ($order:literal, $bound:literal, $owner:expr) => {
        concat!(
            "FROM (SELECT tenant, id, app, user_id, kind, create_time, version FROM facts f WHERE ",
            facts_where!($owner, $bound),
            " ORDER BY f.",
            $order,
            " LIMIT $6) f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version ORDER BY f.",
            $order,
            " LIMIT $6"
        )
    };
}

/// The statements of a listing of facts in one order, by backend and by
/// the owner a call names.
struct FactPages {
    /// SQLite, an app or a user or neither.
    sqlite: Sql,
    /// SQLite, an app and a user.
    sqlite_owner: Sql,
    /// Postgres, neither an app nor a user: the walk in id order.
    postgres: Sql,
    /// Postgres, an app and a user.
    postgres_owner: Sql,
    /// Postgres, an app or a user, not both: planned for each call
    /// ([`Sql::planned_each_call`]), since no generic plan suits both an
    /// app of most facts and one of few.
    postgres_either: Sql,
}

macro_rules! fact_pages {
    ($order:literal, $bound:literal) => {
        FactPages {
            sqlite: facts!($order, facts_joined!($order, $bound, owner_or_any!())),
            sqlite_owner: facts!($order, facts_joined!($order, $bound, owner_exact!())),
            postgres: facts!($order, facts_first!($order, $bound, owner_or_any!())),
            postgres_owner: facts!($order, facts_first!($order, $bound, owner_exact!())),
            postgres_either: facts!(
                planned_each_call;
                $order,
                facts_first!($order, $bound, owner_or_any!())
            ),
        }
    };
}

static FACTS_ASCENDING: FactPages = fact_pages!("id", ">");

static FACTS_DESCENDING: FactPages = fact_pages!("id DESC", "<");

static FACT: Sql = select!(
    fact_columns!(),
    " FROM facts f JOIN fact_versions v \
     ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
     WHERE f.tenant = $1 AND f.id = $2"
);

/// A page of a fact's versions after `$3` and up to `$4` (the version it
/// was read at: versions are never changed, so the page is of that moment
/// of the fact), oldest first, at most `$5`, sent whole up to `$6`
/// ([`SENT_WHOLE_BYTES`]): the columns of [`version_row`], then whether
/// the version came past that, without its content and source episodes
/// (column 11).
static FACT_VERSIONS: Sql = page_by_bytes!(
    "version, deleted, subject, predicate, object, \
     CASE WHEN past THEN NULL ELSE content::text END, confidence, source, \
     CASE WHEN past THEN NULL ELSE source_episode_ids::text END, channels::text, create_time",
    "version, deleted, subject, predicate, object, content, confidence, source, \
     source_episode_ids, channels, create_time",
    "pg_column_size(content) + pg_column_size(source_episode_ids)",
    "version",
    "$6",
    "FROM fact_versions WHERE tenant = $1 AND fact_id = $2 AND version > $3 AND version <= $4 \
     ORDER BY version LIMIT $5"
);

static FACT_VECTORS: Sql = Sql::new(
    "SELECT f.id, v.embedding FROM facts f JOIN fact_versions v \
     ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
     WHERE f.tenant = $1 AND f.app = $2 AND f.user_id = $3 AND f.kind = $4 AND NOT f.deleted \
     AND v.embedding_model = $5 AND v.embedding IS NOT NULL \
     ORDER BY f.update_time DESC LIMIT 20000",
);

static INSERT_FACT: Sql = Sql::new(
    "INSERT INTO facts (tenant, id, app, user_id, kind, subject, predicate, version, \
     deleted, create_time, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, false, $8, $8)",
);

/// The fact a request id created for an owner and kind, with the request's
/// fingerprint. Parameters: $1 tenant, $2 app, $3 user, $4 kind, $5
/// request id.
static FACT_OF_REQUEST: Sql = Sql::new(
    "SELECT id, create_fingerprint FROM facts WHERE tenant = $1 AND app = $2 AND user_id = $3 \
     AND kind = $4 AND create_request_id = $5",
);

/// Keeps the request that created a fact. Parameters: $1 tenant, $2 id,
/// $3 request id, $4 its fingerprint.
static KEEP_FACT_REQUEST: Sql = Sql::new(
    "UPDATE facts SET create_request_id = $3, create_fingerprint = $4 \
     WHERE tenant = $1 AND id = $2",
);

static BUMP_FACT: Sql = Sql::new(
    "UPDATE facts SET version = version + 1, deleted = $3, \
     subject = coalesce($4, subject), predicate = coalesce($5, predicate), update_time = $6 \
     WHERE tenant = $1 AND id = $2 RETURNING version, subject, predicate",
);

static INSERT_FACT_VERSION: Sql = Sql::new(
    "INSERT INTO fact_versions (tenant, fact_id, version, deleted, subject, predicate, object, \
     content, confidence, source, source_episode_ids, channels, create_time) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11::jsonb, $12::jsonb, $13)",
);

static ADVANCE: Sql = Sql::new(
    "UPDATE consolidation_rules SET watermark = $3, \
     episodes_promoted = episodes_promoted + $4, last_run_time = $5 \
     WHERE tenant = $1 AND id = $2",
);

static EPISODES: Sql = select!(
    episode_columns!(),
    " FROM episodes WHERE tenant = $1 AND cursor > $2 AND cursor <= $3 \
     ORDER BY cursor LIMIT $4"
);

/// Per dialect: Postgres takes the lists as arrays, SQLite one row at a
/// time; Postgres locks rows and rules, SQLite's writer is alone anyway.
mod dialect {
    use crate::store::sql::{Sql, select};

    pub(super) static PG_SOURCES: Sql = Sql::new(
        "INSERT INTO fact_sources (tenant, episode_id, fact_id) \
         SELECT $1, e, $3 FROM unnest($2::text[]) AS e ON CONFLICT DO NOTHING",
    );

    pub(super) static SQLITE_SOURCE: Sql = Sql::new(
        "INSERT INTO fact_sources (tenant, episode_id, fact_id) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    );

    /// Locked: a fact deleted meanwhile is read again once its delete
    /// commits, and then is not live.
    pub(super) static PG_RESOLVE: Sql = Sql::new(
        "SELECT f.id FROM unnest($4::text[]) WITH ORDINALITY AS w(id, ord) \
         JOIN facts f ON f.tenant = $1 AND f.app = $2 AND f.user_id = $3 AND NOT f.deleted \
         AND (f.id = w.id COLLATE \"C\" OR f.id IN (SELECT s.fact_id FROM fact_sources s \
              WHERE s.tenant = $1 AND s.episode_id = w.id COLLATE \"C\")) \
         ORDER BY w.ord, f.create_time FOR UPDATE OF f",
    );

    pub(super) static PG_STORED_EPISODES: Sql =
        Sql::new("SELECT id FROM episodes WHERE tenant = $1 AND id = ANY($2::text[])");

    pub(super) static SQLITE_RESOLVE: Sql = Sql::new(
        "SELECT f.id FROM facts f WHERE f.tenant = $1 AND f.app = $2 AND f.user_id = $3 \
         AND NOT f.deleted AND (f.id = $4 OR f.id IN (SELECT s.fact_id FROM fact_sources s \
         WHERE s.tenant = $1 AND s.episode_id = $4)) ORDER BY f.create_time",
    );

    pub(super) static PG_LIVE_FACTS: Sql = Sql::new(
        "SELECT f.app, f.user_id, f.subject, f.predicate, f.id FROM facts f \
         JOIN unnest($2::text[], $3::text[], $4::text[], $5::text[]) \
         AS k(app, user_id, subject, predicate) \
         ON f.app = k.app COLLATE \"C\" AND f.user_id = k.user_id COLLATE \"C\" \
         AND f.subject = k.subject COLLATE \"C\" AND f.predicate = k.predicate COLLATE \"C\" \
         WHERE f.tenant = $1 AND NOT f.deleted ORDER BY f.create_time, f.id",
    );

    pub(super) static SQLITE_LIVE_FACT: Sql = Sql::new(
        "SELECT app, user_id, subject, predicate, id FROM facts WHERE tenant = $1 \
         AND app = $2 AND user_id = $3 AND subject = $4 AND predicate = $5 AND NOT deleted \
         ORDER BY create_time DESC, id DESC LIMIT 1",
    );

    pub(super) static PG_TRY_LOCK_RULE: Sql =
        Sql::new("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))");

    pub(super) static PG_LOCK_RULE: Sql =
        Sql::new("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))");

    pub(super) static PG_RULE_FOR_UPDATE: Sql = select!(
        rule_columns!(),
        " FROM consolidation_rules WHERE tenant = $1 AND id = $2 FOR UPDATE"
    );

    pub(super) static PG_LIVE_FACT_FOR_UPDATE: Sql =
        Sql::new("SELECT id FROM facts WHERE tenant = $1 AND id = $2 AND NOT deleted FOR UPDATE");

    pub(super) static SQLITE_LIVE_FACT_ID: Sql =
        Sql::new("SELECT id FROM facts WHERE tenant = $1 AND id = $2 AND NOT deleted");
}

/// Decodes a JSON array of strings read back from the store.
fn string_list(text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text).map_err(Error::internal)
}

fn string_list_json(items: &[String]) -> String {
    serde_json::Value::from(items.to_vec()).to_string()
}

fn fact_kind(n: i16) -> Result<FactKind> {
    FactKind::from_i16(n).ok_or_else(|| Error::internal(format!("unknown fact kind {n}")))
}

/// A rule whose columns (as `rule_columns!`) start at `at`.
fn rule_row(row: &impl Cols, at: usize) -> Result<Rule> {
    Ok(Rule {
        id: row.text(at)?,
        filter: row.text(at + 1)?,
        cadence: match (row.opt_int(at + 2)?, row.opt_text(at + 3)?) {
            (Some(n), _) => Cadence::EveryNEpisodes(n),
            (None, Some(cron)) => Cadence::Cron(cron),
            (None, None) => return Err(Error::internal("a stored rule has no cadence")),
        },
        then_emits: string_list(&row.text(at + 4)?)?,
        kind: fact_kind(row.small(at + 5)?)?,
        confidence: row.float(at + 6)?,
        enabled: row.boolean(at + 7)?,
        watermark: row.int(at + 8)?,
        episodes_promoted: row.int(at + 9)?,
        create_time: row.time(at + 10)?,
        last_run_time: row.opt_time(at + 11)?,
    })
}

/// A fact version whose columns start at `at` (the `v.` part of
/// `fact_columns!`).
fn version_row(row: &impl Cols, at: usize) -> Result<FactVersion> {
    Ok(FactVersion {
        version: row.int(at)?,
        deleted: row.boolean(at + 1)?,
        subject: row.text(at + 2)?,
        predicate: row.text(at + 3)?,
        object: row.text(at + 4)?,
        content: serde_json::from_str(&row.text(at + 5)?).map_err(Error::internal)?,
        confidence: row.float(at + 6)?,
        source: row.text(at + 7)?,
        source_episode_ids: string_list(&row.text(at + 8)?)?,
        channels: string_list(&row.text(at + 9)?)?,
        create_time: row.time(at + 10)?,
    })
}

pub(super) fn fact_row(row: &impl Cols) -> Result<Fact> {
    Ok(Fact {
        id: row.text(0)?,
        app: row.text(1)?,
        user: row.text(2)?,
        kind: fact_kind(row.small(3)?)?,
        create_time: row.time(4)?,
        current: version_row(row, 5)?,
    })
}

/// A transaction of consolidation work, confined to one tenant; rolled back
/// when dropped uncommitted.
pub struct FactsTx<T>(T);

impl<T: Transaction> FactsTx<T> {
    /// Stores a version of a fact with its lineage.
    async fn insert_version(
        &mut self,
        tenant: &Tenant,
        id: &str,
        version: (i64, &str, &str),
        payload: Option<&FactPayload>,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (version, subject, predicate) = version;
        let content = payload.map_or_else(|| "null".to_owned(), |p| p.content.to_string());
        let channels = string_list_json(payload.map_or(&[][..], |p| &p.channels));
        self.0
            .exec(
                &INSERT_FACT_VERSION,
                params![
                    tenant.as_str(),
                    id,
                    version,
                    payload.is_none(),
                    subject,
                    predicate,
                    payload.map_or("", |p| p.object.as_str()),
                    content.as_str(),
                    provenance.confidence,
                    &provenance.rule_id,
                    string_list_json(&provenance.source_episode_ids).as_str(),
                    channels.as_str(),
                    now,
                ],
            )
            .await?;
        let sources = &provenance.source_episode_ids[..];
        match T::DIALECT {
            Dialect::Postgres => {
                self.0
                    .exec(&dialect::PG_SOURCES, params![tenant.as_str(), sources, id])
                    .await?;
            }
            Dialect::Sqlite => {
                for episode in sources {
                    self.0
                        .exec(
                            &dialect::SQLITE_SOURCE,
                            params![tenant.as_str(), episode, id],
                        )
                        .await?;
                }
            }
        }
        Ok(())
    }
}

static COUNT_OWNED_FACTS: Sql = Sql::new(
    "SELECT count(*) FROM facts WHERE tenant = $1 AND app = $2 AND user_id = $3 \
     AND kind = $4 AND NOT deleted",
);

/// One counter of an owner's facts at a time, until its transaction ends
/// (SQLite's single writer already is one at a time).
static LOCK_FACT_OWNER: Sql = Sql::new(
    "SELECT pg_advisory_xact_lock(hashtextextended('engram.facts/' || $1 || '/' || $2 \
     || '/' || $3 || '/' || $4, 0))",
);

/// How many locks the writers of one tenant's facts are spread over. An
/// owner's writers take one of them ([`writer_bucket`]), so a batch or a
/// rule run over a thousand owners takes at most this many, always in
/// bucket order: Postgres keeps advisory locks in a shared table that its
/// default settings size for 64 per connection, which a lock per owner
/// would run out of. Owners that share a bucket only wait for each other.
const WRITER_BUCKETS: u64 = 64;

/// The bucket of an owner's fact writers: FNV-1a over app and user, the
/// same in every replica and release (the standard library's hashers may
/// change between releases, and replicas must agree).
fn writer_bucket(app: &str, user: &str) -> i64 {
    let hash = app
        .bytes()
        .chain([0])
        .chain(user.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    // Below WRITER_BUCKETS, so it fits.
    (hash % WRITER_BUCKETS) as i64
}

/// Parameters: $1 tenant, $2 bucket.
static HOLD_FACT_WRITERS: Sql = Sql::new(
    "SELECT pg_advisory_xact_lock(hashtextextended('engram.fact-writers/' || $1 || '/' || $2, 0))",
);

/// Keeps every other writer of these owners' stored facts (applying
/// deltas, a rule run, forgetting a user) waiting until the transaction
/// ends, on Postgres; SQLite's single writer is alone. Owners come in any
/// order; their buckets are taken in one.
pub(super) async fn hold_fact_writers<C: Run>(
    conn: &mut C,
    tenant: &Tenant,
    owners: &[(&str, &str)],
) -> Result<()> {
    if C::DIALECT != Dialect::Postgres {
        return Ok(());
    }
    let mut buckets: Vec<i64> = owners
        .iter()
        .map(|(app, user)| writer_bucket(app, user))
        .collect();
    buckets.sort_unstable();
    buckets.dedup();
    for bucket in buckets {
        conn.exec(&HOLD_FACT_WRITERS, params![tenant.as_str(), bucket])
            .await?;
    }
    Ok(())
}

impl<T: Transaction> FactTx for FactsTx<T> {
    async fn hold_owners(&mut self, tenant: &Tenant, owners: &[(&str, &str)]) -> Result<()> {
        hold_fact_writers(&mut self.0, tenant, owners).await
    }

    async fn count_owned_facts(
        &mut self,
        tenant: &Tenant,
        (app, user): (&str, &str),
        kind: FactKind,
    ) -> Result<i64> {
        let owner = params![tenant.as_str(), app, user, kind.as_i16()];
        if T::DIALECT == Dialect::Postgres {
            self.0.exec(&LOCK_FACT_OWNER, owner).await?;
        }
        self.0.count(&COUNT_OWNED_FACTS, owner).await
    }

    async fn resolve(
        &mut self,
        tenant: &Tenant,
        app: &str,
        user: &str,
        ids: &[String],
    ) -> Result<Vec<String>> {
        let text = |row: &T::Row| row.text(0);
        let found = match T::DIALECT {
            Dialect::Postgres => {
                let named = params![tenant.as_str(), app, user, ids];
                self.0.all(&dialect::PG_RESOLVE, named, text).await?
            }
            Dialect::Sqlite => {
                let mut found = Vec::new();
                for wanted in ids {
                    let named = params![tenant.as_str(), app, user, wanted];
                    found.extend(self.0.all(&dialect::SQLITE_RESOLVE, named, text).await?);
                }
                found
            }
        };
        let mut seen = HashSet::new();
        Ok(found
            .into_iter()
            .filter(|id| seen.insert(id.clone()))
            .collect())
    }

    async fn live_facts(
        &mut self,
        tenant: &Tenant,
        keys: &[FactKey],
    ) -> Result<HashMap<FactKey, String>> {
        let mut rows = Vec::new();
        match T::DIALECT {
            _ if keys.is_empty() => {}
            Dialect::Postgres => {
                let column = |f: fn(&FactKey) -> &String| keys.iter().map(f).cloned().collect();
                let columns: [Vec<String>; 4] = [
                    column(|k| &k.0),
                    column(|k| &k.1),
                    column(|k| &k.2),
                    column(|k| &k.3),
                ];
                rows = self
                    .0
                    .rows(
                        &dialect::PG_LIVE_FACTS,
                        params![
                            tenant.as_str(),
                            &columns[0][..],
                            &columns[1][..],
                            &columns[2][..],
                            &columns[3][..],
                        ],
                    )
                    .await?;
            }
            Dialect::Sqlite => {
                for key in keys {
                    let newest = self
                        .0
                        .row(
                            &dialect::SQLITE_LIVE_FACT,
                            params![tenant.as_str(), &key.0, &key.1, &key.2, &key.3],
                        )
                        .await?;
                    rows.extend(newest);
                }
            }
        }
        let mut live = HashMap::new();
        for row in &rows {
            // Oldest first: the newest fact of a key wins.
            live.insert(
                (row.text(0)?, row.text(1)?, row.text(2)?, row.text(3)?),
                row.text(4)?,
            );
        }
        Ok(live)
    }

    async fn fact_vectors(
        &mut self,
        tenant: &Tenant,
        (app, user): (&str, &str),
        kind: FactKind,
        model: &str,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        self.0
            .all(
                &FACT_VECTORS,
                params![tenant.as_str(), app, user, kind.as_i16(), model],
                |row| Ok((row.text(0)?, row.bytes(1)?)),
            )
            .await
    }

    async fn insert_fact(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: &FactPayload,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()> {
        self.0
            .exec(
                &INSERT_FACT,
                params![
                    tenant.as_str(),
                    id,
                    &payload.app,
                    &payload.user,
                    payload.kind.as_i16(),
                    &payload.subject,
                    &payload.predicate,
                    now,
                ],
            )
            .await?;
        let version = (1, payload.subject.as_str(), payload.predicate.as_str());
        self.insert_version(tenant, id, version, Some(payload), provenance, now)
            .await
    }

    async fn write_version(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: Option<&FactPayload>,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let row = self
            .0
            .row(
                &BUMP_FACT,
                params![
                    tenant.as_str(),
                    id,
                    payload.is_none(),
                    payload.map(|p| p.subject.as_str()),
                    payload.map(|p| p.predicate.as_str()),
                    now,
                ],
            )
            .await?
            .ok_or_else(|| Error::internal(format!("fact {id} vanished mid-transaction")))?;
        let (version, subject, predicate) = (row.int(0)?, row.text(1)?, row.text(2)?);
        self.insert_version(
            tenant,
            id,
            (version, &subject, &predicate),
            payload,
            provenance,
            now,
        )
        .await
    }

    async fn lock_live_fact(&mut self, tenant: &Tenant, id: &str) -> Result<bool> {
        let sql = match T::DIALECT {
            Dialect::Postgres => &dialect::PG_LIVE_FACT_FOR_UPDATE,
            Dialect::Sqlite => &dialect::SQLITE_LIVE_FACT_ID,
        };
        Ok(self
            .0
            .row(sql, params![tenant.as_str(), id])
            .await?
            .is_some())
    }

    async fn fact_of_request(
        &mut self,
        tenant: &Tenant,
        (app, user): (&str, &str),
        kind: FactKind,
        request_id: &str,
    ) -> Result<Option<(String, Vec<u8>)>> {
        let owner = params![tenant.as_str(), app, user, kind.as_i16(), request_id];
        self.0
            .first(&FACT_OF_REQUEST, owner, |row| {
                Ok((row.text(0)?, row.bytes(1)?))
            })
            .await
    }

    async fn keep_request(
        &mut self,
        tenant: &Tenant,
        id: &str,
        request: &RequestStamp<'_>,
    ) -> Result<()> {
        let kept = params![tenant.as_str(), id, request.id, &request.fingerprint[..]];
        self.0.exec(&KEEP_FACT_REQUEST, kept).await?;
        Ok(())
    }

    async fn fact(&mut self, tenant: &Tenant, id: &str) -> Result<Option<Fact>> {
        let row = self.0.row(&FACT, params![tenant.as_str(), id]).await?;
        row.as_ref().map(fact_row).transpose()
    }

    async fn commit(self) -> Result<()> {
        self.0.commit().await
    }

    async fn rollback(self) -> Result<()> {
        self.0.rollback().await
    }
}

impl<T: Transaction> RuleTx for FactsTx<T> {
    async fn lock_rule(&mut self, tenant: &Tenant, id: &str, lock: RunLock) -> Result<Locked> {
        let sql = match T::DIALECT {
            Dialect::Postgres => {
                let key = format!("engram.rule/{}/{id}", tenant.as_str());
                let locked = match lock {
                    RunLock::Try => self
                        .0
                        .row(&dialect::PG_TRY_LOCK_RULE, params![key.as_str()])
                        .await?
                        .map_or(Ok(false), |row| row.boolean(0))?,
                    RunLock::Wait => {
                        self.0
                            .exec(&dialect::PG_LOCK_RULE, params![key.as_str()])
                            .await?;
                        true
                    }
                };
                if !locked {
                    return Ok(Locked::Busy);
                }
                &dialect::PG_RULE_FOR_UPDATE
            }
            // The write transaction already excludes every other run.
            Dialect::Sqlite => &RULE,
        };
        match self.0.row(sql, params![tenant.as_str(), id]).await? {
            Some(row) => rule_row(&row, 0).map(Locked::Rule),
            None => Ok(Locked::Missing),
        }
    }

    async fn episodes(
        &mut self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<Episode>> {
        self.0
            .all_weighed(
                &EPISODES,
                params![tenant.as_str(), after, up_to, limit],
                episode_row,
            )
            .await
    }

    async fn still_stored(&mut self, tenant: &Tenant, ids: &[String]) -> Result<HashSet<String>> {
        if T::DIALECT == Dialect::Sqlite || ids.is_empty() {
            return Ok(ids.iter().cloned().collect());
        }
        let found = self
            .0
            .all(
                &dialect::PG_STORED_EPISODES,
                params![tenant.as_str(), ids],
                |row| row.text(0),
            )
            .await?;
        Ok(found.into_iter().collect())
    }

    async fn advance(
        &mut self,
        tenant: &Tenant,
        id: &str,
        watermark: i64,
        promoted: i64,
        now: DateTime<Utc>,
    ) -> Result<()> {
        self.0
            .exec(
                &ADVANCE,
                params![tenant.as_str(), id, watermark, promoted, now],
            )
            .await?;
        Ok(())
    }
}

impl<B: Backend> ConsolidationStore for B {
    type Tx = FactsTx<B::Tx>;

    async fn begin(&self, tenant: &Tenant) -> Result<FactsTx<B::Tx>> {
        Ok(FactsTx(Backend::begin(self, tenant).await?))
    }

    async fn create_rule(
        &self,
        tenant: &Tenant,
        rule: &Rule,
        request: Option<RequestStamp<'_>>,
    ) -> Result<RuleCreation> {
        let (every, cron) = match &rule.cadence {
            Cadence::EveryNEpisodes(n) => (Some(*n), None),
            Cadence::Cron(text) => (None, Some(text.as_str())),
        };
        let then_emits = string_list_json(&rule.then_emits);
        let row: &[Param<'_>] = params![
            tenant.as_str(),
            &rule.id,
            &rule.filter,
            every,
            cron,
            then_emits.as_str(),
            rule.kind.as_i16(),
            rule.confidence,
            rule.enabled,
            rule.watermark,
            rule.create_time,
        ];
        let mut conn = self.writer(tenant).await?;
        let Some(request) = request else {
            return Ok(match conn.exec(&CREATE_RULE, row).await? {
                0 => RuleCreation::Taken,
                _ => RuleCreation::Created,
            });
        };
        let keyed = &[row, params![request.id, &request.fingerprint[..]]].concat();
        for _ in 0..CREATE_ATTEMPTS {
            if conn.exec(&CREATE_KEYED_RULE, keyed).await? > 0 {
                return Ok(RuleCreation::Created);
            }
            // The id or the request id is taken: by this request's first
            // try, or by another request. (A concurrent first try's insert
            // was waited for, so it is seen.)
            let found = conn
                .first(
                    &RULE_OF_REQUEST,
                    params![tenant.as_str(), &rule.id, request.id],
                    |row| {
                        let kept = match row.int(RULE_COLUMNS)? {
                            1 => Some(row.bytes(RULE_COLUMNS + 1)?),
                            _ => None,
                        };
                        Ok((rule_row(row, 0)?, kept))
                    },
                )
                .await?;
            match found {
                Some((first, Some(kept))) if kept[..] == request.fingerprint[..] => {
                    return Ok(RuleCreation::Repeated(first));
                }
                Some((_, Some(_))) => return Err(request_id_reused(request.id)),
                Some((_, None)) => return Ok(RuleCreation::Taken),
                // Deleted since the insert found it: try again.
                None => {}
            }
        }
        Ok(RuleCreation::Taken)
    }

    async fn get_rule(&self, tenant: &Tenant, id: &str) -> Result<Option<Rule>> {
        let mut conn = self.reader(tenant).await?;
        conn.first(&RULE, params![tenant.as_str(), id], |row| rule_row(row, 0))
            .await
    }

    async fn list_rules(
        &self,
        tenant: &Tenant,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Rule>> {
        let mut conn = self.reader(tenant).await?;
        conn.all(
            &RULES,
            params![tenant.as_str(), after.unwrap_or(""), limit],
            |row| rule_row(row, 0),
        )
        .await
    }

    async fn delete_rule(&self, tenant: &Tenant, id: &str) -> Result<bool> {
        let mut conn = self.writer(tenant).await?;
        Ok(conn
            .exec(&DELETE_RULE, params![tenant.as_str(), id])
            .await?
            > 0)
    }

    async fn enabled_rules(&self) -> Result<Vec<(Tenant, Rule)>> {
        let mut conn = self.system().await?;
        conn.all(&ENABLED_RULES, params![], |row| {
            Ok((Tenant::new(row.text(0)?), rule_row(row, 1)?))
        })
        .await
    }

    async fn pending_episodes(
        &self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        at_most: i64,
    ) -> Result<i64> {
        let mut conn = self.reader(tenant).await?;
        conn.count(&PENDING, params![tenant.as_str(), after, up_to, at_most])
            .await
    }

    async fn list_facts(
        &self,
        tenant: &Tenant,
        filter: &FactFilter,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Fact>> {
        let pages = match filter.newest_first {
            true => &FACTS_DESCENDING,
            false => &FACTS_ASCENDING,
        };
        let sql = match (
            <B::Conn as Run>::DIALECT,
            filter.app.is_some(),
            filter.user.is_some(),
        ) {
            (Dialect::Sqlite, true, true) => &pages.sqlite_owner,
            (Dialect::Sqlite, _, _) => &pages.sqlite,
            (Dialect::Postgres, true, true) => &pages.postgres_owner,
            (Dialect::Postgres, false, false) => &pages.postgres,
            (Dialect::Postgres, _, _) => &pages.postgres_either,
        };
        let after = match filter.newest_first {
            true => after.unwrap_or("\u{10ffff}"),
            false => after.unwrap_or(""),
        };
        let mut conn = self.reader(tenant).await?;
        let mut read = Weighed::default();
        loop {
            // Read on after the last fact an earlier part held.
            let after = read
                .items
                .last()
                .map_or_else(|| after.to_owned(), |f: &Fact| f.id.clone());
            let params = params![
                tenant.as_str(),
                filter.app.as_deref(),
                filter.user.as_deref(),
                filter.kind.map(|k| k.as_i16()),
                after.as_str(),
                limit - read.items.len() as i64,
                SENT_WHOLE_BYTES,
            ];
            let cut = conn
                .weigh_into(sql, params, &mut read, |row| {
                    if row.boolean(16)? {
                        return Ok(None);
                    }
                    fact_row(row).map(Some)
                })
                .await?;
            if !cut || read.full {
                return Ok(read.items);
            }
        }
    }

    async fn get_fact(
        &self,
        tenant: &Tenant,
        id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Option<(Fact, Vec<FactVersion>)>> {
        let mut conn = self.reader(tenant).await?;
        let Some(fact) = conn
            .first(&FACT, params![tenant.as_str(), id], fact_row)
            .await?
        else {
            return Ok(None);
        };
        let mut read = Weighed::default();
        loop {
            // Read on after the last version an earlier part held.
            let after = read.items.last().map_or(after, |v: &FactVersion| v.version);
            let params = params![
                tenant.as_str(),
                id,
                after,
                fact.current.version,
                limit - read.items.len() as i64,
                SENT_WHOLE_BYTES,
            ];
            let cut = conn
                .weigh_into(&FACT_VERSIONS, params, &mut read, |row| {
                    if row.boolean(11)? {
                        return Ok(None);
                    }
                    version_row(row, 0).map(Some)
                })
                .await?;
            if !cut || read.full {
                return Ok(Some((fact, read.items)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_buckets_are_fixed_and_in_range() {
        // Fixed values: replicas of any release must agree on them.
        assert_eq!(writer_bucket("app", "alice"), writer_bucket("app", "alice"));
        assert_ne!(writer_bucket("app", "alice"), writer_bucket("appa", "lice"));
        let all: std::collections::HashSet<i64> = (0..1000)
            .map(|n| writer_bucket("app", &format!("user{n}")))
            .collect();
        assert!(all.iter().all(|b| (0..WRITER_BUCKETS as i64).contains(b)));
        assert_eq!(
            all.len(),
            WRITER_BUCKETS as usize,
            "a thousand owners fill every bucket"
        );
    }
}
