//! The append on Postgres.
//!
//! An append is first tried blind, as one statement (`APPEND_SQL`) that
//! checks what the reads would: the session is live and the caller's, and
//! none of the ids is stored yet. That is every append of a running agent,
//! and it costs one statement where reading first costs three. When the
//! statement matches nothing (no session yet, someone else's, ended, a
//! retried id) the append reads the session and its ids and writes again,
//! so creating, refusing and replaying work as they always did.
//!
//! The write bumps the session's counter first, which locks its row and
//! gives the transaction its id, and only then are the episodes inserted,
//! their `seq` values taken from the counter and their cursors from an
//! identity. So every cursor is taken by a transaction that already has an
//! id, which is what the settled horizon of the tail needs (see
//! `horizon_candidate`), and the transaction holds its id for one
//! statement, which is how long a tail waits for it to settle.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::{FutureExt, TryStreamExt as _};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use super::pool::Lease;
use super::{PgStore, Tsvector, slot_of};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::paging::Weighed;
use crate::search::english::Reading;
use crate::search::vector;
use crate::sessions::ports::{Append, Appended};
use crate::sessions::{Episode, NewEpisode, RecentQuery, Session, session_changed};
use crate::store::group::shared_steps;
use crate::store::sessions::{
    AppendEpisodes, RecentEpisodes, episode_ids, episode_row, filled, insert_session_in,
    missing_session, recent_alone, recent_columns, recent_level, recent_row_bytes, recent_whole,
    session_in, session_row, sort_out, stored_episodes, stored_size, type_names,
};

/// How often an append is retried when a concurrent append to another
/// session took one of its episode ids first (the retry then sees it).
const APPEND_ATTEMPTS: usize = 3;

/// An append's write, one statement: bump the session's counters (which
/// locks its row and gives the transaction its id), then insert the
/// episodes numbered from the counter, their cursors taken from an identity
/// only as each row is inserted, after the update. The update matches only
/// a live session of the owner given (a part left NULL matches any) that
/// holds none of the ids yet; no row means one of those does not hold.
/// Ids the server generated are not looked for ($16 true): no episode can
/// hold one yet (the unique index still stands behind them), and the
/// lookup's generic plan, made while the table was new and nearly empty,
/// read every episode of the tenant until the table was next analyzed
/// (appends on a fresh database fell to a fifth within ten seconds).
/// Parameters: $1 tenant, $2 session, $3 count, $4 now, $5 app or NULL,
/// $6 user or NULL, $7..$15 the episodes' columns as arrays (a NULL agent
/// is the session's app; a NULL vector is built by Postgres, migration
/// 0017), $16 whether the server generated every id. Returns the session
/// as updated (its columns first) with each episode's seq and cursor.
/// (`engram bench` runs the same text through pgbench.)
pub(crate) const APPEND_SQL: &str = "WITH bumped AS (\
       UPDATE sessions SET last_seq = last_seq + $3, episode_count = episode_count + $3, \
       update_time = $4 WHERE tenant = $1 AND id = $2 AND ($5::text IS NULL OR app = $5) \
       AND ($6::text IS NULL OR user_id = $6) AND end_time IS NULL \
       AND ($16::boolean OR NOT EXISTS (SELECT 1 FROM episodes WHERE tenant = $1 \
         AND id = ANY($7::text[]))) \
       RETURNING id, app, user_id, metadata::text AS metadata, create_time, update_time, \
       end_time, episode_count, last_seq, episodes_evicted), \
     inserted AS (\
       INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, \
       content, metadata, source_node, timestamp, create_time, fingerprint, search) \
       SELECT $1, $2, b.last_seq - $3 + u.ord, u.id, b.app, b.user_id, \
       coalesce(u.agent, b.app), u.type, u.content::jsonb, u.metadata::jsonb, u.source_node, \
       u.ts, $4, u.fp, u.search \
       FROM bumped b, unnest($7::text[], $8::text[], $9::text[], $10::text[], $11::text[], \
       $12::text[], $13::timestamptz[], $14::bytea[], $15::tsvector[]) \
       WITH ORDINALITY AS u(id, agent, type, content, metadata, source_node, ts, fp, search, ord) \
       RETURNING seq, cursor) \
     SELECT b.id, b.app, b.user_id, b.metadata, b.create_time, b.update_time, b.end_time, \
       b.episode_count, b.last_seq, b.episodes_evicted, i.seq, i.cursor \
     FROM inserted i, bumped b";

/// Appends' writes to distinct sessions in one statement, for a group:
/// [`APPEND_SQL`] for many. The sessions' rows are locked first, in id
/// order (an `UPDATE … FROM` takes them in whatever order its plan
/// joins), so concurrent groups take them in one order, and by their key
/// (`= ANY`: even the generic plan made on a new, empty table reads that
/// through the primary key, where it hashed a join with the appends
/// against every session of the tenant). Parameters:
/// $1 tenant; per append (as arrays) $2 session, $3 count, $4 app or
/// NULL, $5 user or NULL, $6 now, $18 whether the server generated every
/// id (as `APPEND_SQL`'s $16); per episode $7 its append (from 1), $8 its
/// place in the append (from 1), then $9..$17 its columns as in
/// `APPEND_SQL`. Returns, per episode stored, its append's session as
/// updated, the append, the seq and the cursor.
const APPEND_MANY: &str = "WITH a AS (SELECT * FROM unnest($2::text[], $3::bigint[], \
       $4::text[], $5::text[], $6::timestamptz[], $18::boolean[]) \
       WITH ORDINALITY AS a(session_id, n, app, user_id, now, ids_new, ord)), \
     u AS (SELECT * FROM unnest($7::bigint[], $8::bigint[], $9::text[], $10::text[], \
       $11::text[], $12::text[], $13::text[], $14::text[], $15::timestamptz[], $16::bytea[], \
       $17::tsvector[]) \
       AS u(append, place, id, agent, type, content, metadata, source_node, ts, fp, search)), \
     locked AS (SELECT s.id FROM sessions s WHERE s.tenant = $1 AND s.id = ANY($2::text[]) \
       ORDER BY s.id FOR UPDATE OF s), \
     bumped AS (\
       UPDATE sessions s SET last_seq = s.last_seq + a.n, episode_count = s.episode_count + a.n, \
       update_time = a.now FROM a JOIN locked l ON l.id = a.session_id \
       WHERE s.tenant = $1 AND s.id = a.session_id \
       AND (a.app IS NULL OR s.app = a.app) AND (a.user_id IS NULL OR s.user_id = a.user_id) \
       AND s.end_time IS NULL AND (a.ids_new OR NOT EXISTS (SELECT 1 FROM u JOIN episodes e \
         ON e.tenant = $1 AND e.id = u.id WHERE u.append = a.ord)) \
       RETURNING s.id, s.app, s.user_id, s.metadata::text AS metadata, s.create_time, \
       s.update_time, s.end_time, s.episode_count, s.last_seq, s.episodes_evicted, \
       a.ord, a.n, a.now), \
     inserted AS (\
       INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, \
       content, metadata, source_node, timestamp, create_time, fingerprint, search) \
       SELECT $1, b.id, b.last_seq - b.n + u.place, u.id, b.app, b.user_id, \
       coalesce(u.agent, b.app), u.type, u.content::jsonb, u.metadata::jsonb, u.source_node, \
       u.ts, b.now, u.fp, u.search \
       FROM bumped b JOIN u ON u.append = b.ord \
       RETURNING session_id, seq, cursor) \
     SELECT b.id, b.app, b.user_id, b.metadata, b.create_time, b.update_time, b.end_time, \
       b.episode_count, b.last_seq, b.episodes_evicted, b.ord, i.seq, i.cursor \
     FROM inserted i JOIN bumped b ON b.id = i.session_id";

/// Past the per-session limit, the oldest episodes go, counted on the
/// session. Parameters: $1 tenant, $2 session, $3 the newest seq to go.
///
/// The session's row is locked before any episode's (`held`, which the
/// delete reads as a one-time filter, so before its scan), the order an
/// append takes them in. Taken the other way, an eviction committing on
/// its own (an append alone) and a group of appends holding the session
/// each waited for the other: a deadlock, and an append failed.
const EVICT_EPISODES: &str = "WITH held AS (SELECT 1 FROM sessions \
       WHERE tenant = $1 AND id = $2 FOR NO KEY UPDATE), \
     gone AS (DELETE FROM episodes \
       WHERE tenant = $1 AND session_id = $2 AND seq <= $3 AND EXISTS (SELECT FROM held) \
       RETURNING 1), \
     counted AS (SELECT count(*) AS n FROM gone) \
     UPDATE sessions SET episode_count = episode_count - counted.n, \
       episodes_evicted = episodes_evicted + counted.n \
     FROM counted WHERE tenant = $1 AND id = $2 RETURNING counted.n";

fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

/// An append's write, owning what it writes so it can wait in a group
/// commit's queue (see `store::group`): the session and the owner it must
/// have, the episodes not stored yet.
pub(super) struct AppendWrite {
    session_id: String,
    app: Option<String>,
    user: Option<String>,
    fresh: Vec<NewEpisode>,
    /// Each fresh episode's search vector, when the server builds it
    /// ([`vector::episode`]); built before the write waits for a group, and
    /// once for all of an append's tries.
    vectors: Vec<Option<Vec<u8>>>,
    now: DateTime<Utc>,
    max_events: i64,
}

impl AppendWrite {
    /// The write of an append's `fresh` episodes (those whose slot is
    /// empty; `vectors` are all of the append's) to `session`, read first.
    fn of(
        session: &Session,
        append: &Append<'_>,
        fresh: Vec<&NewEpisode>,
        vectors: &[Option<Vec<u8>>],
        slots: &[Option<(Episode, bool)>],
    ) -> AppendWrite {
        AppendWrite {
            session_id: session.id.clone(),
            app: Some(session.app.clone()),
            user: Some(session.user.clone()),
            fresh: fresh.into_iter().cloned().collect(),
            vectors: vectors
                .iter()
                .zip(slots)
                .filter(|(_, slot)| slot.is_none())
                .map(|(vector, _)| vector.clone())
                .collect(),
            now: append.now,
            max_events: append.max_events,
        }
    }

    /// Whether the server generated every id of the episodes, which then
    /// need no lookup before they are stored.
    fn ids_new(&self) -> bool {
        self.fresh.iter().all(|e| e.id_generated)
    }
}

/// The search vectors of `fresh`, as [`AppendWrite::vectors`]; none when
/// the database lowercases otherwise ([`PgStore::text_in_rust`]).
fn vectors(fresh: &[NewEpisode], reading: Option<Reading>) -> Vec<Option<Vec<u8>>> {
    fresh
        .iter()
        .map(|e| reading.and_then(|reading| vector::episode(&e.content, &e.metadata, reading)))
        .collect()
}

/// What an append's write stored: the session after it, and the cursor of
/// each new seq.
pub(super) struct Inserted {
    session: Session,
    cursors: HashMap<i64, i64>,
}

impl PgStore {
    /// The blind first try (see the module comment): `None` when the
    /// statement matched nothing and the append must read first. `vectors`
    /// are the episodes' ([`vectors`]), built once for every try.
    async fn try_blind(
        &self,
        tenant: &Tenant,
        append: &Append<'_>,
        vectors: &[Option<Vec<u8>>],
    ) -> Result<Option<Appended>> {
        let write = AppendWrite {
            session_id: append.session_id.as_str().to_owned(),
            app: append.owner.app.as_ref().map(|a| a.as_str().to_owned()),
            user: append.owner.user.as_ref().map(|u| u.as_str().to_owned()),
            fresh: append.episodes.to_vec(),
            vectors: vectors.to_vec(),
            now: append.now,
            max_events: append.max_events,
        };
        let Some(inserted) = self.write_append(tenant, write).await? else {
            return Ok(None);
        };
        let slots = append.episodes.iter().map(|_| None).collect();
        fill(append, slots, inserted).map(Some)
    }

    /// One attempt at an append after reading; `None` when a concurrent
    /// writer took one of the ids (or the session id) first and the whole
    /// append should rerun.
    async fn try_append(
        &self,
        tenant: &Tenant,
        append: &Append<'_>,
        vectors: &[Option<Vec<u8>>],
    ) -> Result<Option<Appended>> {
        // Reads first, each its own statement: the session, and which of
        // the ids are already stored (a retried append replays those).
        let mut conn = self.session(tenant).await?;
        let session = match session_in(&mut conn, tenant, append.session_id.as_str()).await? {
            Some(session) => session,
            None => {
                let Some(new) = missing_session(append) else {
                    return Ok(Some(Appended::NoSession));
                };
                // A clashing id refuses the append before its session is
                // created, so a refused append leaves nothing behind.
                let stored =
                    stored_episodes(&mut conn, tenant, &episode_ids(append.episodes)).await?;
                let (slots, fresh) = match sort_out(append.episodes, stored) {
                    Ok(sorted) => sorted,
                    Err(id) => return Ok(Some(Appended::Conflict(id))),
                };
                drop(conn);
                // The session and its first episodes commit together:
                // apart, creators at the tenant's session limit evict the
                // new session before its episodes are written, and again
                // on each rerun.
                let mut tx = self.scoped(tenant).await?;
                let Some(session) = insert_session_in(&mut tx, tenant, &new).await? else {
                    return Ok(None);
                };
                if fresh.is_empty() {
                    tx.commit().await?;
                    return filled(slots).map(|done| Some(Appended::Stored(done)));
                }
                let write = AppendWrite::of(&session, append, fresh, vectors, &slots);
                return match append_in(&mut tx, tenant, &write).await {
                    Ok(Some(inserted)) => {
                        tx.commit().await?;
                        fill(append, slots, inserted).map(Some)
                    }
                    // Rolled back with the session: rerun, and replay.
                    Ok(None) => Ok(None),
                    Err(err) if is_unique_violation(&err) => Ok(None),
                    Err(err) => Err(err.into()),
                };
            }
        };
        if !append.owner.admits(&session) || session.end_time.is_some() {
            return Ok(Some(Appended::Refused(session)));
        }

        let stored = stored_episodes(&mut conn, tenant, &episode_ids(append.episodes)).await?;
        // The write may wait for a group commit: it must not hold a
        // connection the group needs meanwhile.
        drop(conn);
        let (slots, fresh) = match sort_out(append.episodes, stored) {
            Ok(sorted) => sorted,
            Err(id) => return Ok(Some(Appended::Conflict(id))),
        };
        if fresh.is_empty() {
            return filled(slots).map(|done| Some(Appended::Stored(done)));
        }
        let write = AppendWrite::of(&session, append, fresh, vectors, &slots);
        // Nothing: the session ended, went or changed hands since it was
        // read, or another append took one of the ids; the rerun reads
        // again and says which.
        match self.write_append(tenant, write).await? {
            Some(inserted) => fill(append, slots, inserted).map(Some),
            None => Ok(None),
        }
    }

    /// Runs an append's write, in a group commit when there is one.
    async fn write_append(&self, tenant: &Tenant, write: AppendWrite) -> Result<Option<Inserted>> {
        match &self.appends {
            Some(group) => group.submit(tenant, write).await,
            None => self.append_alone(tenant, &write).await,
        }
    }

    /// An append's write on its own: the insert, then the eviction, each a
    /// statement committed as it returns.
    async fn append_alone(&self, tenant: &Tenant, write: &AppendWrite) -> Result<Option<Inserted>> {
        let mut conn = self.session(tenant).await?;
        match append_in(&mut conn, tenant, write).await {
            Ok(inserted) => Ok(inserted),
            // Another append took one of the ids first: rerun, and replay it.
            Err(err) if is_unique_violation(&err) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Appends' writes in one transaction (see [`PgStore::run_group`]),
    /// each with its own outcome; sessions' rows are locked in id order.
    pub(super) async fn append_group(
        &self,
        tenant: &Tenant,
        writes: Vec<AppendWrite>,
    ) -> Vec<Result<Option<Inserted>>> {
        let mut order: Vec<usize> = (0..writes.len()).collect();
        order.sort_by(|&a, &b| writes[a].session_id.cmp(&writes[b].session_id));
        let steps = shared_steps(order, |_| true, |at| writes[at].session_id.as_str());
        self.run_group(
            tenant,
            writes,
            steps,
            |tx, tenant, step| {
                async move {
                    match &step[..] {
                        [write] => Ok(vec![append_in(tx, tenant, write).await?]),
                        _ => append_many_in(tx, tenant, &step).await,
                    }
                }
                .boxed()
            },
            |store, tenant, write| store.append_alone(tenant, write).boxed(),
        )
        .await
    }
}

/// The append's answer: the slots already replayed, and the episodes
/// the write numbered (the empty slots, in order, up to the session's
/// newest seq).
fn fill(
    append: &Append<'_>,
    mut slots: Vec<Option<(Episode, bool)>>,
    inserted: Inserted,
) -> Result<Appended> {
    let Inserted { session, cursors } = inserted;
    let n = slots.iter().filter(|slot| slot.is_none()).count() as i64;
    let mut seq = session.last_seq - n;
    for (slot, new) in slots.iter_mut().zip(append.episodes) {
        if slot.is_some() {
            continue;
        }
        seq += 1;
        let cursor = *cursors
            .get(&seq)
            .ok_or_else(|| Error::internal("an inserted episode was not returned"))?;
        *slot = Some((new.stored(&session, seq, cursor, append.now), false));
    }
    filled(slots).map(Appended::Stored)
}

/// Binds the episodes of `writes`, one array per column, in the order
/// both append statements take them: id, agent (NULL: the session's app),
/// type, content, metadata, source node, timestamp (the append's time when
/// not given), fingerprint, search vector (NULL: Postgres builds it).
fn bind_episodes<'q>(
    query: Query<'q, Postgres, PgArguments>,
    writes: &[&AppendWrite],
) -> Query<'q, Postgres, PgArguments> {
    let episodes = || {
        writes
            .iter()
            .flat_map(|w| w.fresh.iter().map(move |e| (w, e)))
    };
    let column = |f: &dyn Fn(&NewEpisode) -> String| -> Vec<String> {
        episodes().map(|(_, e)| f(e)).collect()
    };
    query
        .bind(column(&|e| e.id.as_str().to_owned()))
        .bind(
            episodes()
                .map(|(_, e)| e.agent.as_ref().map(|a| a.as_str().to_owned()))
                .collect::<Vec<_>>(),
        )
        .bind(column(&|e| e.kind.as_str().to_owned()))
        .bind(column(&|e| e.content_json.clone()))
        .bind(column(&|e| e.metadata_json.clone()))
        .bind(column(&|e| e.source_node.clone()))
        .bind(
            episodes()
                .map(|(w, e)| e.timestamp.unwrap_or(w.now))
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(
            episodes()
                .map(|(_, e)| e.fingerprint.to_vec())
                .collect::<Vec<_>>(),
        )
        .bind(
            writes
                .iter()
                .flat_map(|w| w.vectors.iter().map(|v| v.as_deref().map(Tsvector)))
                .collect::<Vec<_>>(),
        )
}

/// An append's write in `conn`: the episodes, then, past the per-session
/// limit, the eviction of the oldest (a reader outside the transaction may
/// glimpse the log over its limit for that long, never under it). `None`
/// when the session no longer matched.
async fn append_in(
    conn: &mut Lease,
    tenant: &Tenant,
    write: &AppendWrite,
) -> std::result::Result<Option<Inserted>, sqlx::Error> {
    let inserted = bind_episodes(
        sqlx::query(APPEND_SQL)
            .bind(tenant.as_str())
            .bind(&write.session_id)
            .bind(write.fresh.len() as i64)
            .bind(write.now)
            .bind(&write.app)
            .bind(&write.user),
        &[write],
    )
    .bind(write.ids_new())
    .fetch_all(&mut *conn)
    .await?;
    let Some(first) = inserted.first() else {
        return Ok(None);
    };
    let session = session_row(first).map_err(|err| sqlx::Error::Protocol(err.to_string()))?;
    let mut cursors = HashMap::with_capacity(inserted.len());
    for row in &inserted {
        cursors.insert(row.try_get::<i64, _>(10)?, row.try_get::<i64, _>(11)?);
    }
    evict_past_limit(conn, tenant, write, &session).await?;
    Ok(Some(Inserted { session, cursors }))
}

/// Appends' writes to distinct sessions in `conn`, one statement
/// ([`APPEND_MANY`]), then each eviction past its session's limit. `None`
/// for an append whose session no longer matched.
async fn append_many_in(
    conn: &mut Lease,
    tenant: &Tenant,
    writes: &[&AppendWrite],
) -> Result<Vec<Option<Inserted>>> {
    let (mut append, mut place) = (Vec::new(), Vec::new());
    for (at, write) in (1i64..).zip(writes) {
        for n in 1..=write.fresh.len() as i64 {
            append.push(at);
            place.push(n);
        }
    }
    let query = sqlx::query(APPEND_MANY)
        .bind(tenant.as_str())
        .bind(
            writes
                .iter()
                .map(|w| w.session_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            writes
                .iter()
                .map(|w| w.fresh.len() as i64)
                .collect::<Vec<_>>(),
        )
        .bind(writes.iter().map(|w| w.app.as_deref()).collect::<Vec<_>>())
        .bind(writes.iter().map(|w| w.user.as_deref()).collect::<Vec<_>>())
        .bind(writes.iter().map(|w| w.now).collect::<Vec<_>>())
        .bind(append)
        .bind(place);
    let rows = bind_episodes(query, writes)
        .bind(writes.iter().map(|w| w.ids_new()).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    let mut inserted: Vec<Option<Inserted>> = writes.iter().map(|_| None).collect();
    for row in &rows {
        let ord: i64 = row.try_get(10)?;
        let slot = slot_of(&mut inserted, ord)
            .ok_or_else(|| Error::internal("an episode stored for no append"))?;
        let done = match slot {
            Some(done) => done,
            None => slot.insert(Inserted {
                session: session_row(row)?,
                cursors: HashMap::new(),
            }),
        };
        done.cursors
            .insert(row.try_get::<i64, _>(11)?, row.try_get::<i64, _>(12)?);
    }
    for (write, done) in writes.iter().zip(&inserted) {
        if let Some(done) = done {
            evict_past_limit(conn, tenant, write, &done.session).await?;
        }
    }
    Ok(inserted)
}

/// Past the session's limit, the oldest episodes go (a reader outside the
/// transaction may glimpse the log over its limit for that long, never
/// under it).
async fn evict_past_limit(
    conn: &mut Lease,
    tenant: &Tenant,
    write: &AppendWrite,
    session: &Session,
) -> std::result::Result<(), sqlx::Error> {
    if write.max_events > 0 && session.episode_count > write.max_events {
        let evicted: i64 = sqlx::query_scalar(EVICT_EPISODES)
            .bind(tenant.as_str())
            .bind(&write.session_id)
            .bind(session.last_seq - write.max_events)
            .fetch_optional(&mut *conn)
            .await?
            .unwrap_or(0);
        crate::metrics::global().evicted(crate::metrics::Evicted::Episodes, evicted as u64);
    }
    Ok(())
}

/// Several `Recent` reads of one level (session given, agent given) as
/// one statement: each query's newest episodes through the same index
/// scan it would run alone (`LATERAL`), tagged with the query's place.
/// Types travel comma-joined (a type name is lowercase letters, digits
/// and `_`), empty for any type. An episode larger than its query's
/// [`recent_row_bytes`] comes without its content and metadata, as
/// `recent_alone`'s first statement sends it.
macro_rules! recent_many {
    ($level:literal) => {
        concat!(
            "SELECT e.*, q.ord FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], \
             $6::bigint[], $7::bigint[]) WITH ORDINALITY AS q(u, s, a, t, n, w, ord) \
             CROSS JOIN LATERAL (SELECT ",
            recent_columns!("q.w"),
            " FROM episodes WHERE tenant = $1 AND ",
            $level,
            " AND (q.t = '' OR type = ANY(string_to_array(q.t, ','))) \
             ORDER BY timestamp DESC, cursor DESC LIMIT q.n) e \
             ORDER BY q.ord, e.timestamp DESC, e.cursor DESC"
        )
    };
}

static RECENT_MANY: [&str; 4] = [
    recent_many!("user_id = q.u"),
    recent_many!("user_id = q.u AND agent = q.a"),
    recent_many!("session_id = q.s AND user_id = q.u"),
    recent_many!("session_id = q.s AND user_id = q.u AND agent = q.a"),
];

impl RecentEpisodes for PgStore {
    async fn recent_episodes(&self, tenant: &Tenant, query: &RecentQuery) -> Result<Vec<Episode>> {
        match &self.recents {
            Some(group) => group.submit(tenant, query.clone()).await,
            None => recent_alone(self, tenant, query).await,
        }
    }
}

impl PgStore {
    /// Concurrent `Recent` reads of a tenant: those of one level share a
    /// statement ([`RECENT_MANY`]), a level asked once runs its own. When
    /// a shared statement fails, its queries run alone, so an error
    /// reaches only its own call.
    pub(super) async fn recent_group(
        &self,
        tenant: &Tenant,
        queries: Vec<RecentQuery>,
    ) -> Vec<Result<Vec<Episode>>> {
        let mut outcomes: Vec<Option<Result<Vec<Episode>>>> =
            queries.iter().map(|_| None).collect();
        for at_level in 0..RECENT_MANY.len() {
            let asked: Vec<usize> = (0..queries.len())
                .filter(|at| {
                    let q = &queries[*at];
                    recent_level(q.session_id.is_some(), q.agent.is_some()) == at_level
                })
                .collect();
            match asked[..] {
                [] => continue,
                [one] => {
                    outcomes[one] = Some(recent_alone(self, tenant, &queries[one]).await);
                    continue;
                }
                _ => {}
            }
            let shared: Vec<&RecentQuery> = asked.iter().map(|at| &queries[*at]).collect();
            match self.recent_many(tenant, at_level, &shared).await {
                Ok(found) => {
                    for (at, episodes) in asked.iter().zip(found) {
                        outcomes[*at] = Some(Ok(episodes));
                    }
                }
                Err(_) => {
                    for at in asked {
                        outcomes[at] = Some(recent_alone(self, tenant, &queries[at]).await);
                    }
                }
            }
        }
        outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| Err(Error::internal("a recent read without an outcome")))
            })
            .collect()
    }

    /// The episodes of each of `queries` (all of one level), in order.
    async fn recent_many(
        &self,
        tenant: &Tenant,
        level: usize,
        queries: &[&RecentQuery],
    ) -> Result<Vec<Vec<Episode>>> {
        let texts =
            |get: fn(&RecentQuery) -> String| queries.iter().map(|q| get(q)).collect::<Vec<_>>();
        let mut conn = self.session(tenant).await?;
        let mut rows = sqlx::query(RECENT_MANY[level])
            .bind(tenant.as_str())
            .bind(texts(|q| q.user.as_str().to_owned()))
            .bind(texts(|q| {
                q.session_id
                    .as_ref()
                    .map_or(String::new(), |s| s.as_str().to_owned())
            }))
            .bind(texts(|q| {
                q.agent
                    .as_ref()
                    .map_or(String::new(), |a| a.as_str().to_owned())
            }))
            .bind(texts(|q| type_names(&q.types).join(",")))
            .bind(queries.iter().map(|q| q.limit).collect::<Vec<i64>>())
            .bind(
                queries
                    .iter()
                    .map(|q| recent_row_bytes(q.limit))
                    .collect::<Vec<i64>>(),
            )
            .fetch(&mut conn);
        // Each query's episodes only as far as its answer carries, as
        // `recent_alone` reads them: the rows past that are passed over
        // undecoded, so a thousand episodes of a megabyte are not all held.
        // A query that came to an episode sent without its content is read
        // again alone, by the statement that sends what a page holds.
        let mut found: Vec<Weighed<Episode>> = queries.iter().map(|_| Weighed::default()).collect();
        let mut again = vec![false; queries.len()];
        while let Some(row) = rows.try_next().await? {
            let ord: i64 = row.try_get(14)?;
            let at = usize::try_from(ord - 1)
                .ok()
                .filter(|at| *at < found.len())
                .ok_or_else(|| Error::internal("a row for no query asked"))?;
            let slot = &mut found[at];
            if slot.full {
                continue;
            }
            if row.try_get::<bool, _>(13)? {
                again[at] = true;
                slot.full = true;
            } else {
                slot.push(episode_row(&row)?);
            }
            if slot.full && found.iter().all(|slot| slot.full) {
                break;
            }
        }
        drop(rows);
        drop(conn);
        let mut answers = Vec::with_capacity(queries.len());
        for ((query, slot), again) in queries.iter().zip(found).zip(again) {
            answers.push(if again {
                recent_whole(self, tenant, query).await?
            } else {
                slot.items
            });
        }
        Ok(answers)
    }
}

impl AppendEpisodes for PgStore {
    async fn append_episodes(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Appended> {
        let vectors = vectors(append.episodes, self.text_in_rust().await?);
        if let Some(done) = self.try_blind(tenant, append, &vectors).await? {
            return Ok(done);
        }
        for _ in 0..APPEND_ATTEMPTS {
            if let Some(done) = self.try_append(tenant, append, &vectors).await? {
                return Ok(done);
            }
        }
        Err(session_changed(append.session_id.as_str()))
    }
}
