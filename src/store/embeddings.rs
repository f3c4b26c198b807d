//! Embeddings on both backends: the outbox the writing transaction fills
//! (each backend's triggers, migrations `postgres/0010` and `sqlite/0008`),
//! the claims the workers of every replica take on it, the vectors on the
//! items' rows, and the candidates of a semantic search. One statement text
//! each, but where the worker takes rows: Postgres skips rows another
//! transaction has locked (another replica's claim, a purge or a forget
//! deleting an item), so that the worker never waits while it holds rows;
//! SQLite's single writer has no one to skip.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::consolidation::fact_columns;
use super::memory::version_columns;
use super::search::{Bounds, conditions, item};
use super::sessions::episode_columns;
use super::sql::{Backend, Cols, Dialect, Param, Run, Sql, Transaction, params, select};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::search::embedder::input;
use crate::search::ports::{
    Embedded, EmbeddingStore, ItemRef, MAX_VECTORS, Pending, Stored, Vector,
};
use crate::search::{Filters, Item, Source};

static SET_EMBEDDER: Sql = Sql::new(
    "INSERT INTO embedder (singleton, model, update_time) VALUES (true, $1, $2) \
     ON CONFLICT (singleton) DO UPDATE SET model = EXCLUDED.model, \
     update_time = EXCLUDED.update_time",
);

/// Parameters: $1 claim, $2 lease end, $3 now, $4 limit.
static CLAIM_PG: Sql = Sql::new(
    "UPDATE embedding_outbox SET claim = $1, due_time = $2, attempts = attempts + 1 \
     WHERE id IN (SELECT id FROM embedding_outbox WHERE due_time IS NULL OR due_time <= $3 \
     ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED) \
     RETURNING id, tenant, source, scope_type, scope, key, version, attempts",
);

static CLAIM_SQLITE: Sql = Sql::new(
    "UPDATE embedding_outbox SET claim = $1, due_time = $2, attempts = attempts + 1 \
     WHERE id IN (SELECT id FROM embedding_outbox WHERE due_time IS NULL OR due_time <= $3 \
     ORDER BY id LIMIT $4) \
     RETURNING id, tenant, source, scope_type, scope, key, version, attempts",
);

static RELEASE: Sql = Sql::new(
    "UPDATE embedding_outbox SET claim = NULL, due_time = $3 WHERE id = $1 AND claim = $2",
);

static DONE: Sql = Sql::new("DELETE FROM embedding_outbox WHERE id = $1 AND claim = $2");

/// The same, unless another transaction holds the entry (a forget deleting
/// it): the worker waits for no one (see `store_vectors`).
static DONE_PG: Sql = Sql::new(
    "DELETE FROM embedding_outbox WHERE id = \
     (SELECT id FROM embedding_outbox WHERE id = $1 AND claim = $2 FOR UPDATE SKIP LOCKED)",
);

static PENDING_COUNT: Sql = Sql::new("SELECT count(*) FROM embedding_outbox");

/// Parameters: $1 tenant, $2 scope type, $3 scope, $4 key, $5 version, $6
/// the vector, $7 the model.
static STORE_MEMORY: Sql = Sql::new(
    "UPDATE memory_versions SET embedding = $6, embedding_model = $7 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 AND version = $5 \
     AND NOT deleted",
);

macro_rules! older_memory {
    () => {
        "tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 AND version < $5 \
         AND embedding IS NOT NULL"
    };
}

static CLEAR_MEMORY: Sql = Sql::new(concat!(
    "UPDATE memory_versions SET embedding = NULL, embedding_model = NULL WHERE ",
    older_memory!()
));

/// The same, but for the versions another transaction holds (a purge
/// deleting them): the worker waits for no one (see `store_vectors`).
static CLEAR_MEMORY_PG: Sql = Sql::new(concat!(
    "UPDATE memory_versions SET embedding = NULL, embedding_model = NULL \
     WHERE (tenant, scope_type, scope, key, version) IN \
     (SELECT tenant, scope_type, scope, key, version FROM memory_versions WHERE ",
    older_memory!(),
    " FOR UPDATE SKIP LOCKED)"
));

/// Parameters: $1 tenant, $2 fact id, $3 version, $4 the vector, $5 the
/// model.
static STORE_FACT: Sql = Sql::new(
    "UPDATE fact_versions SET embedding = $4, embedding_model = $5 \
     WHERE tenant = $1 AND fact_id = $2 AND version = $3 AND NOT deleted",
);

macro_rules! older_fact {
    () => {
        "tenant = $1 AND fact_id = $2 AND version < $3 AND embedding IS NOT NULL"
    };
}

static CLEAR_FACT: Sql = Sql::new(concat!(
    "UPDATE fact_versions SET embedding = NULL, embedding_model = NULL WHERE ",
    older_fact!()
));

static CLEAR_FACT_PG: Sql = Sql::new(concat!(
    "UPDATE fact_versions SET embedding = NULL, embedding_model = NULL \
     WHERE (tenant, fact_id, version) IN \
     (SELECT tenant, fact_id, version FROM fact_versions WHERE ",
    older_fact!(),
    " FOR UPDATE SKIP LOCKED)"
));

/// Parameters: $1 tenant, $2 session, $3 seq, $4 the vector, $5 the model.
static STORE_EPISODE: Sql = Sql::new(
    "UPDATE episodes SET embedding = $4, embedding_model = $5 \
     WHERE tenant = $1 AND session_id = $2 AND seq = $3",
);

/// The live item a reference names: its columns and where they are read
/// from, so that the locking forms below are the same statements.
macro_rules! memory_item {
    () => {
        concat!(
            "SELECT ",
            version_columns!(),
            ", h.scope_type, h.scope \
             FROM memory_heads h JOIN memory_versions v \
             USING (tenant, scope_type, scope, key, version) \
             WHERE h.tenant = $1 AND h.scope_type = $2 AND h.scope = $3 AND h.key = $4 \
             AND h.version = $5 AND NOT h.deleted"
        )
    };
}

macro_rules! fact_item {
    () => {
        concat!(
            "SELECT ",
            fact_columns!(),
            " FROM facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
             WHERE f.tenant = $1 AND f.id = $2 AND f.version = $3 AND NOT f.deleted"
        )
    };
}

macro_rules! episode_item {
    () => {
        concat!(
            "SELECT ",
            episode_columns!(),
            " FROM episodes e WHERE tenant = $1 AND session_id = $2 AND seq = $3"
        )
    };
}

static MEMORY_ITEM: Sql = Sql::new(memory_item!());
static FACT_ITEM: Sql = Sql::new(fact_item!());
static EPISODE_ITEM: Sql = Sql::new(episode_item!());

/// The same, the row the vector goes on locked until the storing
/// transaction ends (Postgres; SQLite's single writer is alone): a purge
/// or a delete then waits, and a new item cannot take the place between
/// the check of its input and the store. A row another transaction holds
/// is skipped, not waited for (see `store_vectors`).
static MEMORY_ITEM_HELD: Sql = Sql::new(concat!(memory_item!(), " FOR UPDATE OF v SKIP LOCKED"));
static FACT_ITEM_HELD: Sql = Sql::new(concat!(fact_item!(), " FOR UPDATE OF v SKIP LOCKED"));
static EPISODE_ITEM_HELD: Sql = Sql::new(concat!(episode_item!(), " FOR UPDATE SKIP LOCKED"));

/// Unembedded live items after a position, every tenant's. Parameters:
/// $1 model, $2 limit, then the position.
static UNEMBEDDED_MEMORY: Sql = select!(
    concat!(version_columns!(), ", h.scope_type, h.scope, h.tenant"),
    " FROM memory_heads h JOIN memory_versions v USING (tenant, scope_type, scope, key, version) \
     WHERE (h.tenant, h.scope_type, h.scope, h.key) > ($3, $4, $5, $6) \
     AND NOT h.deleted AND substr(h.key, 1, 12) <> '_compaction/' \
     AND (v.embedding_model IS NULL OR v.embedding_model <> $1) \
     AND NOT EXISTS (SELECT 1 FROM embedding_outbox o WHERE o.tenant = h.tenant \
     AND o.source = 1 AND o.scope_type = h.scope_type AND o.scope = h.scope \
     AND o.key = h.key AND o.version = h.version) \
     ORDER BY h.tenant, h.scope_type, h.scope, h.key LIMIT $2"
);

static UNEMBEDDED_FACTS: Sql = select!(
    concat!(fact_columns!(), ", f.tenant"),
    " FROM facts f JOIN fact_versions v \
     ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
     WHERE (f.tenant, f.id) > ($3, $4) AND NOT f.deleted \
     AND (v.embedding_model IS NULL OR v.embedding_model <> $1) \
     AND NOT EXISTS (SELECT 1 FROM embedding_outbox o WHERE o.tenant = f.tenant \
     AND o.source = 2 AND o.key = f.id AND o.version = f.version) \
     ORDER BY f.tenant, f.id LIMIT $2"
);

static UNEMBEDDED_EPISODES: Sql = select!(
    concat!(episode_columns!(), ", tenant"),
    " FROM episodes e WHERE (tenant, session_id, seq) > ($3, $4, $5) \
     AND (embedding_model IS NULL OR embedding_model <> $1) \
     AND NOT EXISTS (SELECT 1 FROM embedding_outbox o WHERE o.tenant = e.tenant \
     AND o.source = 3 AND o.scope = e.session_id AND o.version = e.seq) \
     ORDER BY tenant, session_id, seq LIMIT $2"
);

static COUNT_MEMORY: Sql = Sql::new(
    "SELECT count(*) FROM memory_heads h JOIN memory_versions v \
     USING (tenant, scope_type, scope, key, version) \
     WHERE NOT h.deleted AND substr(h.key, 1, 12) <> '_compaction/' \
     AND (v.embedding_model IS NULL OR v.embedding_model <> $1)",
);

static COUNT_FACTS: Sql = Sql::new(
    "SELECT count(*) FROM facts f JOIN fact_versions v \
     ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
     WHERE NOT f.deleted AND (v.embedding_model IS NULL OR v.embedding_model <> $1)",
);

static COUNT_EPISODES: Sql = Sql::new(
    "SELECT count(*) FROM episodes WHERE embedding_model IS NULL OR embedding_model <> $1",
);

/// A source's vector and model columns, the columns of an [`ItemRef`], and the
/// time its newest items are taken by.
struct Shape {
    vector: &'static str,
    model: &'static str,
    refs: &'static str,
    time: &'static str,
}

fn shape(source: Source) -> Shape {
    match source {
        Source::Memory => Shape {
            vector: "v.embedding",
            model: "v.embedding_model",
            refs: "h.scope_type, h.scope, h.key, h.version",
            time: "h.update_time",
        },
        Source::Facts => Shape {
            vector: "v.embedding",
            model: "v.embedding_model",
            refs: "f.id, f.version",
            time: "f.update_time",
        },
        Source::Episodes => Shape {
            vector: "e.embedding",
            model: "e.embedding_model",
            refs: "e.session_id, e.seq",
            time: "e.timestamp",
        },
    }
}

/// The item reference in a row's first columns (as [`Shape::refs`] lists
/// them), and how many columns it took.
fn item_ref(source: Source, row: &impl Cols) -> Result<(ItemRef, usize)> {
    Ok(match source {
        Source::Memory => (
            ItemRef::Memory {
                scope_type: row.small(0)?,
                scope: row.text(1)?,
                key: row.text(2)?,
                version: row.int(3)?,
            },
            4,
        ),
        Source::Facts => (
            ItemRef::Fact {
                id: row.text(0)?,
                version: row.int(1)?,
            },
            2,
        ),
        Source::Episodes => (
            ItemRef::Episode {
                session_id: row.text(0)?,
                seq: row.int(1)?,
            },
            2,
        ),
    })
}

fn pending_row(row: &impl Cols) -> Result<Pending> {
    let version = row.int(6)?;
    let item = match row.small(2)? {
        1 => ItemRef::Memory {
            scope_type: row.small(3)?,
            scope: row.text(4)?,
            key: row.text(5)?,
            version,
        },
        2 => ItemRef::Fact {
            id: row.text(5)?,
            version,
        },
        3 => ItemRef::Episode {
            session_id: row.text(4)?,
            seq: version,
        },
        other => return Err(Error::internal(format!("unknown outbox source {other}"))),
    };
    Ok(Pending {
        id: row.int(0)?,
        tenant: Tenant::new(row.text(1)?),
        item,
        attempts: i32::try_from(row.int(7)?).unwrap_or(i32::MAX),
    })
}

/// The live item a reference names, if it still is; with `hold`, its row
/// stays locked until the transaction ends (see [`MEMORY_ITEM_HELD`]).
async fn fetch<C: Run>(
    conn: &mut C,
    tenant: &Tenant,
    item: &ItemRef,
    hold: bool,
) -> Result<Option<Item>> {
    let t = tenant.as_str();
    let hold = hold && C::DIALECT == Dialect::Postgres;
    let (source, row) = match item {
        ItemRef::Memory {
            scope_type,
            scope,
            key,
            version,
        } => (
            Source::Memory,
            conn.row(
                if hold {
                    &MEMORY_ITEM_HELD
                } else {
                    &MEMORY_ITEM
                },
                params![t, *scope_type, scope, key, *version],
            )
            .await,
        ),
        ItemRef::Fact { id, version } => (
            Source::Facts,
            conn.row(
                if hold { &FACT_ITEM_HELD } else { &FACT_ITEM },
                params![t, id, *version],
            )
            .await,
        ),
        ItemRef::Episode { session_id, seq } => (
            Source::Episodes,
            conn.row(
                if hold {
                    &EPISODE_ITEM_HELD
                } else {
                    &EPISODE_ITEM
                },
                params![t, session_id, *seq],
            )
            .await,
        ),
    };
    row?.map(|row| self::item(source, &row)).transpose()
}

/// What the storing transaction finds at an item's place.
enum Place {
    /// The live item, read as the embedder's input, its row now held by
    /// this transaction (Postgres).
    Held(String),
    /// Deleted, purged, or no longer the current version.
    Gone,
    /// Live, but another transaction holds its row.
    Busy,
}

/// Takes the item's row if it is live and no one else holds it.
async fn hold<C: Run>(conn: &mut C, tenant: &Tenant, item: &ItemRef) -> Result<Place> {
    if let Some(found) = fetch(conn, tenant, item, true).await? {
        return Ok(Place::Held(self::input(&found)));
    }
    // Skipping a held row reads it as none: read it again, unlocked, to
    // tell the two apart.
    if C::DIALECT == Dialect::Postgres && fetch(conn, tenant, item, false).await?.is_some() {
        return Ok(Place::Busy);
    }
    Ok(Place::Gone)
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Stored,
    /// Gone, or no longer the text the vector was computed from.
    Skipped,
    Busy,
}

/// Stores a vector on its item if that still reads as the vector's input,
/// and clears the vectors of the item's older versions.
async fn store_vector<C: Run>(
    conn: &mut C,
    tenant: &Tenant,
    item: &ItemRef,
    Vector { input, encoded }: &Vector,
    model: &str,
) -> Result<Outcome> {
    let postgres = C::DIALECT == Dialect::Postgres;
    match hold(conn, tenant, item).await? {
        Place::Busy => return Ok(Outcome::Busy),
        Place::Held(read) if read == *input => {}
        Place::Held(_) | Place::Gone => return Ok(Outcome::Skipped),
    }
    let (t, vector) = (tenant.as_str(), encoded.as_slice());
    match item {
        ItemRef::Memory {
            scope_type,
            scope,
            key,
            version,
        } => {
            conn.exec(
                &STORE_MEMORY,
                params![t, *scope_type, scope, key, *version, vector, model],
            )
            .await?;
            let clear = if postgres {
                &CLEAR_MEMORY_PG
            } else {
                &CLEAR_MEMORY
            };
            conn.exec(clear, params![t, *scope_type, scope, key, *version])
                .await?;
        }
        ItemRef::Fact { id, version } => {
            conn.exec(&STORE_FACT, params![t, id, *version, vector, model])
                .await?;
            let clear = if postgres {
                &CLEAR_FACT_PG
            } else {
                &CLEAR_FACT
            };
            conn.exec(clear, params![t, id, *version]).await?;
        }
        ItemRef::Episode { session_id, seq } => {
            conn.exec(&STORE_EPISODE, params![t, session_id, *seq, vector, model])
                .await?;
        }
    }
    Ok(Outcome::Stored)
}

/// The live items named, in order, each kept as `keep` makes it before
/// the next is read.
async fn each_item<T>(
    conn: &mut impl Run,
    tenant: &Tenant,
    refs: &[ItemRef],
    keep: impl Fn(Item) -> T,
) -> Result<Vec<Option<T>>> {
    let mut kept = Vec::with_capacity(refs.len());
    for item in refs {
        kept.push(fetch(conn, tenant, item, false).await?.map(&keep));
    }
    Ok(kept)
}

/// An unembedded item as the backfill reads it: weighed by its input, so
/// a page is its whole `limit` of clipped texts.
struct Unembedded(Tenant, ItemRef, String);

impl crate::paging::Weigh for Unembedded {
    fn weight(&self) -> usize {
        self.2.len()
    }
}

impl<B: Backend> EmbeddingStore for B {
    async fn set_embedder(&self, model: &str) -> Result<()> {
        let mut conn = self.system_writer().await?;
        conn.exec(&SET_EMBEDDER, params![model, Utc::now()]).await?;
        Ok(())
    }

    async fn claim_pending(
        &self,
        claim: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Pending>> {
        let mut conn = self.system_writer().await?;
        let sql = match <B::Conn as Run>::DIALECT {
            Dialect::Postgres => &CLAIM_PG,
            Dialect::Sqlite => &CLAIM_SQLITE,
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut pending = conn
            .all(sql, params![claim, lease_until, now, limit], pending_row)
            .await?;
        pending.sort_by_key(|p| p.id);
        Ok(pending)
    }

    async fn store_vectors(
        &self,
        claim: Option<&str>,
        model: &str,
        done: &[Embedded],
    ) -> Result<Stored> {
        let remove = match <B::Conn as Run>::DIALECT {
            Dialect::Postgres => &DONE_PG,
            Dialect::Sqlite => &DONE,
        };
        let mut stored = Stored::default();
        let mut tenants: Vec<&Tenant> = done.iter().map(|d| &d.tenant).collect();
        tenants.sort();
        tenants.dedup();
        for tenant in tenants {
            let mut tx = self.begin(tenant).await?;
            // Whether each item was busy. An item is written once a batch:
            // a place an evicted episode or a purged version left is taken
            // again with an entry of its own, and both entries read its new
            // text. (Written twice, its row would be one this transaction
            // wrote, which Postgres checks against the session again: a
            // wait while holding rows.)
            let mut handled: HashMap<&ItemRef, bool> = HashMap::new();
            for (at, embedded) in done.iter().enumerate() {
                if &embedded.tenant != tenant {
                    continue;
                }
                if let Some(vector) = &embedded.vector {
                    let busy = match handled.get(&embedded.item) {
                        Some(&busy) => busy,
                        None => {
                            let outcome =
                                store_vector(&mut tx, tenant, &embedded.item, vector, model)
                                    .await?;
                            stored.vectors += usize::from(outcome == Outcome::Stored);
                            let busy = outcome == Outcome::Busy;
                            handled.insert(&embedded.item, busy);
                            busy
                        }
                    };
                    if busy {
                        stored.busy.push(at);
                        continue;
                    }
                }
                if let (Some(id), Some(claim)) = (embedded.outbox, claim) {
                    tx.exec(remove, params![id, claim]).await?;
                }
            }
            tx.commit().await?;
        }
        Ok(stored)
    }

    async fn release_pending(
        &self,
        claim: &str,
        pending: &[Pending],
        due: DateTime<Utc>,
    ) -> Result<()> {
        let mut conn = self.system_writer().await?;
        for entry in pending {
            conn.exec(&RELEASE, params![entry.id, claim, due]).await?;
        }
        Ok(())
    }

    async fn unembedded(
        &self,
        source: Source,
        model: &str,
        after: Option<&(Tenant, ItemRef)>,
        limit: usize,
    ) -> Result<Vec<(Tenant, ItemRef, String)>> {
        let mut conn = self.system().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (sql, params): (&'static Sql, &[Param<'_>]) = match (source, after) {
            (Source::Memory, None) => {
                (&UNEMBEDDED_MEMORY, params![model, limit, "", 0_i16, "", ""])
            }
            (
                Source::Memory,
                Some((
                    tenant,
                    ItemRef::Memory {
                        scope_type,
                        scope,
                        key,
                        ..
                    },
                )),
            ) => (
                &UNEMBEDDED_MEMORY,
                params![model, limit, tenant.as_str(), *scope_type, scope, key],
            ),
            (Source::Facts, None) => (&UNEMBEDDED_FACTS, params![model, limit, "", ""]),
            (Source::Facts, Some((tenant, ItemRef::Fact { id, .. }))) => (
                &UNEMBEDDED_FACTS,
                params![model, limit, tenant.as_str(), id],
            ),
            (Source::Episodes, None) => {
                (&UNEMBEDDED_EPISODES, params![model, limit, "", "", 0_i64])
            }
            (Source::Episodes, Some((tenant, ItemRef::Episode { session_id, seq }))) => (
                &UNEMBEDDED_EPISODES,
                params![model, limit, tenant.as_str(), session_id, *seq],
            ),
            _ => return Err(Error::internal("a position of another source")),
        };
        let tenant_at = super::search::width(source);
        let read = conn
            .all_weighed(sql, params, |row| {
                let item = item(source, row)?;
                Ok(Unembedded(
                    Tenant::new(row.text(tenant_at)?),
                    item.reference(),
                    input(&item),
                ))
            })
            .await?;
        Ok(read
            .into_iter()
            .map(|Unembedded(tenant, item, text)| (tenant, item, text))
            .collect())
    }

    async fn count_unembedded(&self, source: Source, model: &str) -> Result<i64> {
        let mut conn = self.system().await?;
        let sql = match source {
            Source::Memory => &COUNT_MEMORY,
            Source::Facts => &COUNT_FACTS,
            Source::Episodes => &COUNT_EPISODES,
        };
        conn.count(sql, params![model]).await
    }

    async fn pending_count(&self) -> Result<i64> {
        let mut conn = self.system().await?;
        conn.count(&PENDING_COUNT, params![]).await
    }

    async fn vectors(
        &self,
        tenant: &Tenant,
        sources: &[Source],
        model: &str,
        filters: &Filters,
    ) -> Result<Vec<(ItemRef, Vec<u8>)>> {
        let bounds = Bounds::of(filters);
        let mut conn = self.reader(tenant).await?;
        let mut found = Vec::new();
        for &source in sources {
            let from = super::search::from(source);
            let Shape {
                vector,
                model: model_column,
                refs,
                time,
            } = shape(source);
            let filter = conditions(
                source,
                <B::Conn as Run>::DIALECT,
                tenant,
                filters,
                &bounds,
                2,
            );
            let sql = format!(
                "SELECT {refs}, {vector} FROM {from} WHERE {w} AND {model_column} = $1 \
                 AND {vector} IS NOT NULL ORDER BY {time} DESC LIMIT {MAX_VECTORS}",
                w = filter.sql,
            );
            let mut params = vec![Param::Text(model)];
            params.extend(filter.params.iter().copied());
            for row in conn.rows_built(sql, &params).await? {
                let (item, at) = item_ref(source, &row)?;
                found.push((item, row.bytes(at)?));
            }
        }
        Ok(found)
    }

    async fn items(&self, tenant: &Tenant, refs: &[ItemRef]) -> Result<Vec<Option<Item>>> {
        let mut conn = self.reader(tenant).await?;
        each_item(&mut conn, tenant, refs, |item| item).await
    }

    async fn inputs(&self, tenant: &Tenant, refs: &[ItemRef]) -> Result<Vec<Option<String>>> {
        let mut conn = self.reader(tenant).await?;
        each_item(&mut conn, tenant, refs, |item| input(&item)).await
    }
}
