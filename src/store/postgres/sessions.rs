//! The append on Postgres.
//!
//! An append reads the session and looks for its episode ids, then writes
//! in one statement (`APPEND_SQL`): bumping the session's counter locks its
//! row, which gives the transaction its id, and only then are the episodes
//! inserted, their `seq` values taken from the counter and their cursors
//! from an identity. So every cursor is taken by a transaction that already
//! has an id, which is what the settled horizon of the tail needs (see
//! `horizon_candidate`), and the transaction holds its id for one
//! statement, which is how long a tail waits for it to settle.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use sqlx::Row;

use super::PgStore;
use super::pool::Lease;
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::sessions::ports::{Append, Appended};
use crate::sessions::{NewEpisode, Session};
use crate::store::sessions::{
    AppendEpisodes, episode_ids, filled, insert_session_in, missing_session, session_in, sort_out,
    stored_episodes,
};

/// How often an append is retried when a concurrent append to another
/// session took one of its episode ids first (the retry then sees it).
const APPEND_ATTEMPTS: usize = 3;

/// An append's write, one statement: bump the session's counters (which
/// locks its row and gives the transaction its id), then insert the
/// episodes numbered from the counter, their cursors taken from an identity
/// only as each row is inserted, after the update. The update matches only
/// the live session of the owner that was read; no row means it changed
/// since. Parameters: $1 tenant, $2 session, $3 count, $4 now, $5 app,
/// $6 user, $7.. the episodes' columns as arrays. (`engram bench` runs the
/// same text through pgbench.)
pub(crate) const APPEND_SQL: &str = "WITH bumped AS (\
       UPDATE sessions SET last_seq = last_seq + $3, episode_count = episode_count + $3, \
       update_time = $4 WHERE tenant = $1 AND id = $2 AND app = $5 AND user_id = $6 \
       AND end_time IS NULL RETURNING last_seq, episode_count), \
     inserted AS (\
       INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, \
       content, metadata, source_node, timestamp, create_time, fingerprint) \
       SELECT $1, $2, b.last_seq - $3 + u.ord, u.id, $5, $6, u.agent, u.type, \
       u.content::jsonb, u.metadata::jsonb, u.source_node, u.ts, $4, u.fp \
       FROM bumped b, unnest($7::text[], $8::text[], $9::text[], $10::text[], $11::text[], \
       $12::text[], $13::timestamptz[], $14::bytea[]) \
       WITH ORDINALITY AS u(id, agent, type, content, metadata, source_node, ts, fp, ord) \
       RETURNING seq, cursor) \
     SELECT i.seq, i.cursor, b.last_seq, b.episode_count FROM inserted i, bumped b";

/// Past the per-session limit, the oldest episodes go, counted on the
/// session. Parameters: $1 tenant, $2 session, $3 the newest seq to go.
const EVICT_EPISODES: &str = "WITH gone AS (DELETE FROM episodes \
       WHERE tenant = $1 AND session_id = $2 AND seq <= $3 RETURNING 1), \
     counted AS (SELECT count(*) AS n FROM gone) \
     UPDATE sessions SET episode_count = episode_count - counted.n, \
       episodes_evicted = episodes_evicted + counted.n \
     FROM counted WHERE tenant = $1 AND id = $2 RETURNING counted.n";

fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

/// An append's write, owning what it writes so it can wait in a group
/// commit's queue (see `store::group`): the session as read, the episodes
/// not stored yet.
pub(super) struct AppendWrite {
    session: Session,
    fresh: Vec<NewEpisode>,
    now: DateTime<Utc>,
    max_events: i64,
}

/// What an append's write stored: the session's newest seq and episode
/// count after it, and the cursor of each new seq.
pub(super) struct Inserted {
    last_seq: i64,
    cursors: HashMap<i64, i64>,
}

impl PgStore {
    /// One attempt at an append; `None` when a concurrent writer took one of
    /// the ids (or the session id) first and the whole append should rerun.
    async fn try_append(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Option<Appended>> {
        // Reads first, each its own statement: the session, and which of
        // the ids are already stored (a retried append replays those).
        let mut conn = self.session(tenant).await?;
        let session = match session_in(&mut conn, tenant, append.session_id.as_str()).await? {
            Some(session) => session,
            None => {
                let Some(new) = missing_session(append) else {
                    return Ok(Some(Appended::NoSession));
                };
                drop(conn);
                let mut tx = self.scoped(tenant).await?;
                let Some(session) = insert_session_in(&mut tx, tenant, &new).await? else {
                    return Ok(None);
                };
                tx.commit().await?;
                conn = self.session(tenant).await?;
                session
            }
        };
        if !append.owner.admits(&session) || session.end_time.is_some() {
            return Ok(Some(Appended::Refused(session)));
        }

        let stored = stored_episodes(&mut conn, tenant, &episode_ids(append.episodes)).await?;
        // The write may wait for a group commit: it must not hold a
        // connection the group needs meanwhile.
        drop(conn);
        let (mut slots, fresh) = match sort_out(append.episodes, stored) {
            Ok(sorted) => sorted,
            Err(id) => return Ok(Some(Appended::Conflict(id))),
        };
        if fresh.is_empty() {
            return filled(slots).map(|done| Some(Appended::Stored(done)));
        }
        let write = AppendWrite {
            fresh: fresh.into_iter().cloned().collect(),
            session: session.clone(),
            now: append.now,
            max_events: append.max_events,
        };
        let n = write.fresh.len() as i64;
        let inserted = match &self.appends {
            Some(group) => group.submit(tenant, write).await?,
            None => self.append_alone(tenant, &write).await?,
        };
        // Nothing: the session ended, went or changed hands since it was
        // read, or another append took one of the ids; the rerun reads
        // again and says which.
        let Some(Inserted { last_seq, cursors }) = inserted else {
            return Ok(None);
        };
        let mut seq = last_seq - n;
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
        filled(slots).map(|done| Some(Appended::Stored(done)))
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
        order.sort_by(|&a, &b| writes[a].session.id.cmp(&writes[b].session.id));
        self.run_group(
            tenant,
            writes,
            order.into_iter().map(|at| vec![at]).collect(),
            |tx, tenant, step| {
                async move {
                    let mut done = Vec::with_capacity(step.len());
                    for write in step {
                        done.push(append_in(tx, tenant, write).await?);
                    }
                    Ok(done)
                }
                .boxed()
            },
            |store, tenant, write| store.append_alone(tenant, write).boxed(),
        )
        .await
    }
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
    let (session, fresh) = (&write.session, &write.fresh);
    let n = fresh.len() as i64;
    let column =
        |f: &dyn Fn(&NewEpisode) -> String| -> Vec<String> { fresh.iter().map(f).collect() };
    let inserted = sqlx::query(APPEND_SQL)
        .bind(tenant.as_str())
        .bind(&session.id)
        .bind(n)
        .bind(write.now)
        .bind(&session.app)
        .bind(&session.user)
        .bind(column(&|e| e.id.as_str().to_owned()))
        .bind(column(&|e| {
            e.agent
                .as_ref()
                .map_or(session.app.clone(), |a| a.as_str().to_owned())
        }))
        .bind(column(&|e| e.kind.as_str().to_owned()))
        .bind(column(&|e| e.content_json.clone()))
        .bind(column(&|e| e.metadata_json.clone()))
        .bind(column(&|e| e.source_node.clone()))
        .bind(
            fresh
                .iter()
                .map(|e| e.timestamp.unwrap_or(write.now))
                .collect::<Vec<DateTime<Utc>>>(),
        )
        .bind(
            fresh
                .iter()
                .map(|e| e.fingerprint.to_vec())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    let Some(first) = inserted.first() else {
        return Ok(None);
    };
    let (last_seq, present): (i64, i64) = (first.try_get(2)?, first.try_get(3)?);
    let mut cursors = HashMap::with_capacity(inserted.len());
    for row in &inserted {
        cursors.insert(row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?);
    }
    if write.max_events > 0 && present > write.max_events {
        let evicted: i64 = sqlx::query_scalar(EVICT_EPISODES)
            .bind(tenant.as_str())
            .bind(&session.id)
            .bind(last_seq - write.max_events)
            .fetch_optional(&mut *conn)
            .await?
            .unwrap_or(0);
        crate::metrics::global().evicted(crate::metrics::Evicted::Episodes, evicted as u64);
    }
    Ok(Some(Inserted { last_seq, cursors }))
}

impl AppendEpisodes for PgStore {
    async fn append_episodes(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Appended> {
        for _ in 0..APPEND_ATTEMPTS {
            if let Some(done) = self.try_append(tenant, append).await? {
                return Ok(done);
            }
        }
        Err(Error::internal(
            "append kept racing with appends of the same ids",
        ))
    }
}
