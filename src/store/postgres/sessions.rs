//! Sessions and episodes on Postgres.
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
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::pool::Lease;

use super::PgStore;
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::sessions::ports::{Append, Appended, EpisodeQuery, NewSession, SessionStore};
use crate::sessions::{
    Episode, Id, Owner, RecentQuery, Session, SessionFilter, SessionStats, TailFilter,
};
use crate::store::sessions::{json_object, types_vec};

const SESSION_COLUMNS: &str = "id, app, user_id, metadata::text, create_time, update_time, \
                               end_time, episode_count, last_seq, episodes_evicted";

pub(super) const EPISODE_COLUMNS: &str = "id, session_id, seq, cursor, app, user_id, agent, type, \
                               content::text, metadata::text, source_node, timestamp, create_time";

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

fn session_row(row: &PgRow) -> Result<Session> {
    Ok(Session {
        id: row.try_get(0)?,
        app: row.try_get(1)?,
        user: row.try_get(2)?,
        metadata: json_object(row.try_get(3)?)?,
        create_time: row.try_get(4)?,
        update_time: row.try_get(5)?,
        end_time: row.try_get(6)?,
        episode_count: row.try_get(7)?,
        last_seq: row.try_get(8)?,
        episodes_evicted: row.try_get(9)?,
    })
}

pub(super) fn episode_row(row: &PgRow) -> Result<Episode> {
    let content: String = row.try_get(8)?;
    Ok(Episode {
        id: row.try_get(0)?,
        session_id: row.try_get(1)?,
        seq: row.try_get(2)?,
        cursor: row.try_get(3)?,
        app: row.try_get(4)?,
        user: row.try_get(5)?,
        agent: row.try_get(6)?,
        kind: row.try_get(7)?,
        content: serde_json::from_str(&content).map_err(Error::internal)?,
        metadata: json_object(row.try_get(9)?)?,
        source_node: row.try_get(10)?,
        timestamp: row.try_get(11)?,
        create_time: row.try_get(12)?,
    })
}

/// The widening read: one statement per level, each matching its own index
/// exactly. Parameters: $1 tenant, $2 user, $3 session, $4 agent, $5 types,
/// $6 limit. (`engram bench` runs the same text through pgbench.) Built once
/// per level, not per call.
pub(crate) fn recent_sql(session: bool, agent: bool) -> &'static str {
    static SQL: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
        [
            "user_id = $2",
            "user_id = $2 AND agent = $4",
            "session_id = $3 AND user_id = $2",
            "session_id = $3 AND user_id = $2 AND agent = $4",
        ]
        .map(|level| {
            format!(
                "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = $1 AND {level} \
                 AND (cardinality($5::text[]) = 0 OR type = ANY($5)) \
                 ORDER BY timestamp DESC, cursor DESC LIMIT $6"
            )
        })
    });
    SQL[usize::from(session) * 2 + usize::from(agent)].as_str()
}

fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

/// Reads one session. Parameters: $1 tenant, $2 id. (`engram bench` runs
/// the same text through pgbench, as the first statement of an append.)
pub(crate) fn session_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 AND id = $2")
    });
    SQL.as_str()
}

/// Finds the stored episodes among an append's ids, with the fingerprints
/// a replay is checked against. Parameters: $1 tenant, $2 ids. (Also run
/// by `engram bench` as an append's second statement.)
pub(crate) fn episodes_by_id_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT {EPISODE_COLUMNS}, fingerprint FROM episodes WHERE tenant = $1 AND id = ANY($2)"
        )
    });
    SQL.as_str()
}

async fn session_in(conn: &mut Lease, tenant: &Tenant, id: &str) -> Result<Option<Session>> {
    let row = sqlx::query(session_sql())
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(session_row).transpose()
}

/// Inserts a session, evicting the tenant's oldest first when it is at its
/// limit. `None` when the id was taken meanwhile.
async fn insert_session_in(
    conn: &mut Lease,
    tenant: &Tenant,
    session: &NewSession<'_>,
) -> Result<Option<Session>> {
    if session.max_sessions > 0 {
        // One creator per tenant at a time while a limit is set, so the
        // count is exact and two creators never both evict.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('engram.sessions/' || $1, 0))")
            .bind(tenant.as_str())
            .execute(&mut *conn)
            .await?;
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE tenant = $1")
            .bind(tenant.as_str())
            .fetch_one(&mut *conn)
            .await?;
        let evict = session.to_evict(count);
        if evict > 0 {
            let evicted = sqlx::query(
                "DELETE FROM sessions WHERE tenant = $1 AND id IN \
                 (SELECT id FROM sessions WHERE tenant = $1 ORDER BY create_time, id LIMIT $2)",
            )
            .bind(tenant.as_str())
            .bind(evict)
            .execute(&mut *conn)
            .await?
            .rows_affected() as i64;
            sqlx::query(
                "INSERT INTO session_evictions AS e (tenant, sessions) VALUES ($1, $2) \
                 ON CONFLICT (tenant) DO UPDATE SET sessions = e.sessions + EXCLUDED.sessions",
            )
            .bind(tenant.as_str())
            .bind(evicted)
            .execute(&mut *conn)
            .await?;
            tracing::info!(
                tenant = tenant.as_str(),
                evicted,
                "session limit reached, evicted the oldest sessions"
            );
            crate::metrics::global().evicted(crate::metrics::Evicted::Sessions, evicted as u64);
        }
    }
    let sql = format!(
        "INSERT INTO sessions (tenant, id, app, user_id, metadata, create_time, update_time) \
         VALUES ($1, $2, $3, $4, $5::jsonb, $6, $6) ON CONFLICT (tenant, id) DO NOTHING \
         RETURNING {SESSION_COLUMNS}"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(tenant.as_str())
        .bind(session.id.as_str())
        .bind(session.app.as_str())
        .bind(session.user.as_str())
        .bind(session.metadata)
        .bind(session.now)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(session_row).transpose()
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
                let Some((app, user)) = append.owner.complete() else {
                    return Ok(Some(Appended::NoSession));
                };
                drop(conn);
                let new = NewSession {
                    id: append.session_id,
                    app,
                    user,
                    metadata: "{}",
                    now: append.now,
                    max_sessions: append.max_sessions,
                };
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

        let ids: Vec<&str> = append.episodes.iter().map(|e| e.id.as_str()).collect();
        let rows = sqlx::query(episodes_by_id_sql())
            .bind(tenant.as_str())
            .bind(&ids)
            .fetch_all(&mut conn)
            .await?;
        let mut stored: HashMap<String, (Episode, Vec<u8>)> = HashMap::new();
        for row in &rows {
            let episode = episode_row(row)?;
            stored.insert(episode.id.clone(), (episode, row.try_get(13)?));
        }
        let mut results: Vec<Option<(Episode, bool)>> = Vec::with_capacity(append.episodes.len());
        let mut fresh = Vec::new();
        for new in append.episodes {
            match stored.remove(new.id.as_str()) {
                Some((episode, fingerprint)) if fingerprint[..] == new.fingerprint[..] => {
                    results.push(Some((episode, true)));
                }
                Some(_) => return Ok(Some(Appended::Conflict(new.id.as_str().to_owned()))),
                None => {
                    results.push(None);
                    fresh.push(new);
                }
            }
        }
        if fresh.is_empty() {
            return collect_results(results).map(|done| Some(Appended::Stored(done)));
        }

        let n = fresh.len() as i64;
        let column = |f: fn(&crate::sessions::NewEpisode) -> String| -> Vec<String> {
            fresh.iter().map(|e| f(e)).collect()
        };
        let inserted = sqlx::query(APPEND_SQL)
            .bind(tenant.as_str())
            .bind(&session.id)
            .bind(n)
            .bind(append.now)
            .bind(&session.app)
            .bind(&session.user)
            .bind(column(|e| e.id.as_str().to_owned()))
            .bind(
                fresh
                    .iter()
                    .map(|e| {
                        e.agent
                            .as_ref()
                            .map_or(session.app.clone(), |a| a.as_str().to_owned())
                    })
                    .collect::<Vec<_>>(),
            )
            .bind(column(|e| e.kind.as_str().to_owned()))
            .bind(column(|e| e.content_json.clone()))
            .bind(column(|e| e.metadata_json.clone()))
            .bind(column(|e| e.source_node.clone()))
            .bind(
                fresh
                    .iter()
                    .map(|e| e.timestamp.unwrap_or(append.now))
                    .collect::<Vec<DateTime<Utc>>>(),
            )
            .bind(
                fresh
                    .iter()
                    .map(|e| e.fingerprint.to_vec())
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&mut conn)
            .await;
        let inserted = match inserted {
            Ok(rows) => rows,
            // Another append took one of the ids first: rerun, and replay it.
            Err(err) if is_unique_violation(&err) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        // Nothing: the session ended, went or changed hands since it was
        // read; the rerun reads it again and says which.
        let Some(first) = inserted.first() else {
            return Ok(None);
        };
        let (last_seq, present): (i64, i64) = (first.try_get(2)?, first.try_get(3)?);
        let base = last_seq - n;
        let mut cursors = HashMap::with_capacity(inserted.len());
        for row in &inserted {
            cursors.insert(row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?);
        }
        let mut seq = base;
        for (slot, new) in results.iter_mut().zip(append.episodes) {
            if slot.is_some() {
                continue;
            }
            seq += 1;
            let cursor = *cursors
                .get(&seq)
                .ok_or_else(|| Error::internal("an inserted episode was not returned"))?;
            *slot = Some((new.stored(&session, seq, cursor, append.now), false));
        }

        if append.max_events > 0 && present > append.max_events {
            // Its own statement after the append: a reader may glimpse the
            // log over its limit for that long, never under it.
            let evicted: i64 = sqlx::query_scalar(
                "WITH gone AS (DELETE FROM episodes \
                   WHERE tenant = $1 AND session_id = $2 AND seq <= $3 RETURNING 1), \
                 counted AS (SELECT count(*) AS n FROM gone) \
                 UPDATE sessions SET episode_count = episode_count - counted.n, \
                   episodes_evicted = episodes_evicted + counted.n \
                 FROM counted WHERE tenant = $1 AND id = $2 RETURNING counted.n",
            )
            .bind(tenant.as_str())
            .bind(&session.id)
            .bind(last_seq - append.max_events)
            .fetch_optional(&mut conn)
            .await?
            .unwrap_or(0);
            crate::metrics::global().evicted(crate::metrics::Evicted::Episodes, evicted as u64);
        }
        collect_results(results).map(|done| Some(Appended::Stored(done)))
    }
}

fn collect_results(results: Vec<Option<(Episode, bool)>>) -> Result<Vec<(Episode, bool)>> {
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| Error::internal("an appended episode has no result")))
        .collect()
}

impl SessionStore for PgStore {
    async fn create_session(
        &self,
        tenant: &Tenant,
        session: &NewSession<'_>,
    ) -> Result<(Session, bool)> {
        for _ in 0..APPEND_ATTEMPTS {
            let mut tx = self.scoped(tenant).await?;
            if let Some(existing) = session_in(&mut tx, tenant, session.id.as_str()).await? {
                return Ok((existing, false));
            }
            if let Some(created) = insert_session_in(&mut tx, tenant, session).await? {
                tx.commit().await?;
                return Ok((created, true));
            }
            // Taken between the read and the insert: read it again.
        }
        Err(Error::internal("session creation kept racing"))
    }

    async fn get_session(&self, tenant: &Tenant, id: &Id) -> Result<Option<Session>> {
        let mut conn = self.session(tenant).await?;
        session_in(&mut conn, tenant, id.as_str()).await
    }

    async fn list_sessions(
        &self,
        tenant: &Tenant,
        filter: &SessionFilter,
        before: Option<(DateTime<Utc>, &str)>,
        limit: i64,
    ) -> Result<Vec<Session>> {
        let mut conn = self.session(tenant).await?;
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 \
             AND ($2::text IS NULL OR app = $2) AND ($3::text IS NULL OR user_id = $3) \
             AND ($4::timestamptz IS NULL OR (create_time, id) < ($4, $5)) \
             ORDER BY create_time DESC, id DESC LIMIT $6"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant.as_str())
            .bind(filter.app.as_ref().map(|a| a.as_str()))
            .bind(filter.user.as_ref().map(|u| u.as_str()))
            .bind(before.map(|(time, _)| time))
            .bind(before.map_or("", |(_, id)| id))
            .bind(limit)
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(session_row).collect()
    }

    async fn delete_session(&self, tenant: &Tenant, id: &Id, owner: &Owner) -> Result<Option<i64>> {
        let mut conn = self.session(tenant).await?;
        // The episodes go with it (ON DELETE CASCADE), in this statement.
        let deleted = sqlx::query_scalar(
            "DELETE FROM sessions WHERE tenant = $1 AND id = $2 \
             AND ($3::text IS NULL OR app = $3) AND ($4::text IS NULL OR user_id = $4) \
             RETURNING episode_count",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .bind(owner.app.as_ref().map(|a| a.as_str()))
        .bind(owner.user.as_ref().map(|u| u.as_str()))
        .fetch_optional(&mut conn)
        .await?;
        Ok(deleted)
    }

    async fn end_session(
        &self,
        tenant: &Tenant,
        id: &Id,
        owner: &Owner,
        now: DateTime<Utc>,
        delete_episodes: bool,
    ) -> Result<Option<(Session, i64)>> {
        let mut tx = self.scoped(tenant).await?;
        let sql = format!(
            "UPDATE sessions SET end_time = coalesce(end_time, $5), \
             episode_count = CASE WHEN $6 THEN 0 ELSE episode_count END \
             WHERE tenant = $1 AND id = $2 \
             AND ($3::text IS NULL OR app = $3) AND ($4::text IS NULL OR user_id = $4) \
             RETURNING {SESSION_COLUMNS}"
        );
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant.as_str())
            .bind(id.as_str())
            .bind(owner.app.as_ref().map(|a| a.as_str()))
            .bind(owner.user.as_ref().map(|u| u.as_str()))
            .bind(now)
            .bind(delete_episodes)
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(None);
        };
        let session = session_row(&row)?;
        // The goal, tasks and cache end with the session; facts persist.
        for table in ["working_tasks", "working_cache", "working_memory"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE tenant = $1 AND session_id = $2"
            )))
            .bind(tenant.as_str())
            .bind(id.as_str())
            .execute(&mut tx)
            .await?;
        }
        let deleted = if delete_episodes {
            sqlx::query("DELETE FROM episodes WHERE tenant = $1 AND session_id = $2")
                .bind(tenant.as_str())
                .bind(id.as_str())
                .execute(&mut tx)
                .await?
                .rows_affected() as i64
        } else {
            0
        };
        tx.commit().await?;
        Ok(Some((session, deleted)))
    }

    async fn cleanup_sessions(
        &self,
        tenant: &Tenant,
        before: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<i64> {
        let mut conn = self.session(tenant).await?;
        if dry_run {
            return Ok(sqlx::query_scalar(
                "SELECT count(*) FROM sessions WHERE tenant = $1 AND update_time < $2",
            )
            .bind(tenant.as_str())
            .bind(before)
            .fetch_one(&mut conn)
            .await?);
        }
        let done = sqlx::query("DELETE FROM sessions WHERE tenant = $1 AND update_time < $2")
            .bind(tenant.as_str())
            .bind(before)
            .execute(&mut conn)
            .await?;
        Ok(done.rows_affected() as i64)
    }

    async fn session_stats(&self, tenant: &Tenant) -> Result<SessionStats> {
        let mut conn = self.session(tenant).await?;
        let row = sqlx::query(
            "SELECT count(*), coalesce(sum(episode_count), 0)::bigint, \
             coalesce(sum(episodes_evicted), 0)::bigint, \
             coalesce((SELECT sessions FROM session_evictions WHERE tenant = $1), 0) \
             FROM sessions WHERE tenant = $1",
        )
        .bind(tenant.as_str())
        .fetch_one(&mut conn)
        .await?;
        Ok(SessionStats {
            total_sessions: row.try_get(0)?,
            total_episodes: row.try_get(1)?,
            episodes_evicted: row.try_get(2)?,
            sessions_evicted: row.try_get(3)?,
        })
    }

    async fn append(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Appended> {
        for _ in 0..APPEND_ATTEMPTS {
            if let Some(done) = self.try_append(tenant, append).await? {
                return Ok(done);
            }
        }
        Err(Error::internal(
            "append kept racing with appends of the same ids",
        ))
    }

    async fn list_episodes(
        &self,
        tenant: &Tenant,
        query: &EpisodeQuery<'_>,
    ) -> Result<Vec<Episode>> {
        let mut conn = self.session(tenant).await?;
        let sql = format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = $1 AND session_id = $2 \
             AND seq > $3 AND (cardinality($4::text[]) = 0 OR type = ANY($4)) \
             ORDER BY seq LIMIT $5"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant.as_str())
            .bind(query.session_id.as_str())
            .bind(query.after_seq)
            .bind(types_vec(query.types))
            .bind(query.limit)
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(episode_row).collect()
    }

    async fn recent(&self, tenant: &Tenant, query: &RecentQuery) -> Result<Vec<Episode>> {
        let mut conn = self.session(tenant).await?;
        let sql = recent_sql(query.session_id.is_some(), query.agent.is_some());
        let rows = sqlx::query(sql)
            .bind(tenant.as_str())
            .bind(query.user.as_str())
            .bind(query.session_id.as_ref().map_or("", |s| s.as_str()))
            .bind(query.agent.as_ref().map_or("", |a| a.as_str()))
            .bind(types_vec(&query.types))
            .bind(query.limit)
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(episode_row).collect()
    }

    async fn latest_episodes(&self, tenant: &Tenant, limit: i64) -> Result<Vec<Episode>> {
        let mut conn = self.session(tenant).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = $1 ORDER BY cursor DESC LIMIT $2"
        )))
        .bind(tenant.as_str())
        .bind(limit)
        .fetch_all(&mut conn)
        .await?;
        rows.iter().map(episode_row).collect()
    }

    async fn episodes_after(
        &self,
        tenant: &Tenant,
        filter: &TailFilter,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<Episode>> {
        let mut conn = self.session(tenant).await?;
        let sql = format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = $1 \
             AND cursor > $2 AND cursor <= $3 \
             AND ($4::text IS NULL OR session_id = $4) AND ($5::text IS NULL OR user_id = $5) \
             AND ($6::text IS NULL OR app = $6) \
             AND (cardinality($7::text[]) = 0 OR type = ANY($7)) \
             ORDER BY cursor LIMIT $8"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant.as_str())
            .bind(after)
            .bind(up_to)
            .bind(filter.session_id.as_ref().map(|s| s.as_str()))
            .bind(filter.user.as_ref().map(|u| u.as_str()))
            .bind(filter.app.as_ref().map(|a| a.as_str()))
            .bind(types_vec(&filter.types))
            .bind(limit)
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(episode_row).collect()
    }
}
