//! Sessions and episodes on SQLite. Writes run on the single writer
//! connection in `BEGIN IMMEDIATE` transactions, so an append sees the
//! session row as no one else can change it, and cursors (the episodes'
//! rowid) commit in order: the newest committed cursor is the horizon.

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::ports::Feed;
use crate::sessions::ports::{Append, Appended, EpisodeQuery, NewSession, SessionStore};
use crate::sessions::{
    Episode, Id, Owner, RecentQuery, Session, SessionFilter, SessionStats, TailFilter,
};
use crate::store::sessions::{json_object, types_json};
use crate::store::{from_micros, to_micros};

const SESSION_COLUMNS: &str = "id, app, user_id, metadata, create_time, update_time, \
                               end_time, episode_count, last_seq, episodes_evicted";

pub(super) const EPISODE_COLUMNS: &str = "id, session_id, seq, cursor, app, user_id, agent, type, \
                               content, metadata, source_node, timestamp, create_time";

/// The types filter: `?N` is a JSON array; an empty one matches every type.
macro_rules! types_match {
    ($n:literal) => {
        concat!(
            "(json_array_length(?",
            $n,
            ") = 0 OR type IN (SELECT value FROM json_each(?",
            $n,
            ")))"
        )
    };
}

fn session_row(row: &SqliteRow) -> Result<Session> {
    Ok(Session {
        id: row.try_get(0)?,
        app: row.try_get(1)?,
        user: row.try_get(2)?,
        metadata: json_object(row.try_get(3)?)?,
        create_time: from_micros(row.try_get(4)?)?,
        update_time: from_micros(row.try_get(5)?)?,
        end_time: row
            .try_get::<Option<i64>, _>(6)?
            .map(from_micros)
            .transpose()?,
        episode_count: row.try_get(7)?,
        last_seq: row.try_get(8)?,
        episodes_evicted: row.try_get(9)?,
    })
}

pub(super) fn episode_row(row: &SqliteRow) -> Result<Episode> {
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
        timestamp: from_micros(row.try_get(11)?)?,
        create_time: from_micros(row.try_get(12)?)?,
    })
}

async fn session_in(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    id: &str,
) -> Result<Option<Session>> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ?1 AND id = ?2"
    )))
    .bind(tenant.as_str())
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(session_row).transpose()
}

/// Inserts a session (the id must be free: the caller read it inside the
/// same write transaction), evicting the tenant's oldest first when it is at
/// its limit.
async fn insert_session_in(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    session: &NewSession<'_>,
) -> Result<Session> {
    if session.max_sessions > 0 {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE tenant = ?1")
            .bind(tenant.as_str())
            .fetch_one(&mut *conn)
            .await?;
        let evict = session.to_evict(count);
        if evict > 0 {
            let evicted = sqlx::query(
                "DELETE FROM sessions WHERE tenant = ?1 AND id IN \
                 (SELECT id FROM sessions WHERE tenant = ?1 ORDER BY create_time, id LIMIT ?2)",
            )
            .bind(tenant.as_str())
            .bind(evict)
            .execute(&mut *conn)
            .await?
            .rows_affected() as i64;
            sqlx::query(
                "INSERT INTO session_evictions (tenant, sessions) VALUES (?1, ?2) \
                 ON CONFLICT (tenant) DO UPDATE SET sessions = sessions + excluded.sessions",
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
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO sessions (tenant, id, app, user_id, metadata, create_time, update_time) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) RETURNING {SESSION_COLUMNS}"
    )))
    .bind(tenant.as_str())
    .bind(session.id.as_str())
    .bind(session.app.as_str())
    .bind(session.user.as_str())
    .bind(session.metadata)
    .bind(to_micros(session.now))
    .fetch_one(&mut *conn)
    .await?;
    session_row(&row)
}

impl SessionStore for SqliteStore {
    async fn create_session(
        &self,
        tenant: &Tenant,
        session: &NewSession<'_>,
    ) -> Result<(Session, bool)> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(existing) = session_in(&mut tx, tenant, session.id.as_str()).await? {
            return Ok((existing, false));
        }
        let created = insert_session_in(&mut tx, tenant, session).await?;
        tx.commit().await?;
        Ok((created, true))
    }

    async fn get_session(&self, tenant: &Tenant, id: &Id) -> Result<Option<Session>> {
        let mut conn = self.reader.acquire().await?;
        session_in(&mut conn, tenant, id.as_str()).await
    }

    async fn list_sessions(
        &self,
        tenant: &Tenant,
        filter: &SessionFilter,
        before: Option<(DateTime<Utc>, &str)>,
        limit: i64,
    ) -> Result<Vec<Session>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ?1 \
             AND (?2 IS NULL OR app = ?2) AND (?3 IS NULL OR user_id = ?3) \
             AND (?4 IS NULL OR (create_time, id) < (?4, ?5)) \
             ORDER BY create_time DESC, id DESC LIMIT ?6"
        )))
        .bind(tenant.as_str())
        .bind(filter.app.as_ref().map(|a| a.as_str()))
        .bind(filter.user.as_ref().map(|u| u.as_str()))
        .bind(before.map(|(time, _)| to_micros(time)))
        .bind(before.map_or("", |(_, id)| id))
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(session_row).collect()
    }

    async fn delete_session(&self, tenant: &Tenant, id: &Id, owner: &Owner) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "DELETE FROM sessions WHERE tenant = ?1 AND id = ?2 \
             AND (?3 IS NULL OR app = ?3) AND (?4 IS NULL OR user_id = ?4) \
             RETURNING episode_count",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .bind(owner.app.as_ref().map(|a| a.as_str()))
        .bind(owner.user.as_ref().map(|u| u.as_str()))
        .fetch_optional(&self.writer)
        .await?)
    }

    async fn end_session(
        &self,
        tenant: &Tenant,
        id: &Id,
        owner: &Owner,
        now: DateTime<Utc>,
        delete_episodes: bool,
    ) -> Result<Option<(Session, i64)>> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE sessions SET end_time = coalesce(end_time, ?5), \
             episode_count = CASE WHEN ?6 THEN 0 ELSE episode_count END \
             WHERE tenant = ?1 AND id = ?2 \
             AND (?3 IS NULL OR app = ?3) AND (?4 IS NULL OR user_id = ?4) \
             RETURNING {SESSION_COLUMNS}"
        )))
        .bind(tenant.as_str())
        .bind(id.as_str())
        .bind(owner.app.as_ref().map(|a| a.as_str()))
        .bind(owner.user.as_ref().map(|u| u.as_str()))
        .bind(to_micros(now))
        .bind(delete_episodes)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(None);
        };
        let session = session_row(&row)?;
        // The goal, tasks and cache end with the session; facts persist.
        for table in ["working_tasks", "working_cache", "working_memory"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE tenant = ?1 AND session_id = ?2"
            )))
            .bind(tenant.as_str())
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        }
        let deleted = if delete_episodes {
            sqlx::query("DELETE FROM episodes WHERE tenant = ?1 AND session_id = ?2")
                .bind(tenant.as_str())
                .bind(id.as_str())
                .execute(&mut *tx)
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
        if dry_run {
            return Ok(sqlx::query_scalar(
                "SELECT count(*) FROM sessions WHERE tenant = ?1 AND update_time < ?2",
            )
            .bind(tenant.as_str())
            .bind(to_micros(before))
            .fetch_one(&self.reader)
            .await?);
        }
        let done = sqlx::query("DELETE FROM sessions WHERE tenant = ?1 AND update_time < ?2")
            .bind(tenant.as_str())
            .bind(to_micros(before))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() as i64)
    }

    async fn session_stats(&self, tenant: &Tenant) -> Result<SessionStats> {
        let row = sqlx::query(
            "SELECT count(*), coalesce(sum(episode_count), 0), coalesce(sum(episodes_evicted), 0), \
             coalesce((SELECT sessions FROM session_evictions WHERE tenant = ?1), 0) \
             FROM sessions WHERE tenant = ?1",
        )
        .bind(tenant.as_str())
        .fetch_one(&self.reader)
        .await?;
        Ok(SessionStats {
            total_sessions: row.try_get(0)?,
            total_episodes: row.try_get(1)?,
            episodes_evicted: row.try_get(2)?,
            sessions_evicted: row.try_get(3)?,
        })
    }

    async fn append(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Appended> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let session = match session_in(&mut tx, tenant, append.session_id.as_str()).await? {
            Some(session) => session,
            None => {
                let Some((app, user)) = append.owner.complete() else {
                    return Ok(Appended::NoSession);
                };
                let new = NewSession {
                    id: append.session_id,
                    app,
                    user,
                    metadata: "{}",
                    now: append.now,
                    max_sessions: append.max_sessions,
                };
                insert_session_in(&mut tx, tenant, &new).await?
            }
        };
        if !append.owner.admits(&session) || session.end_time.is_some() {
            return Ok(Appended::Refused(session));
        }

        let mut results = Vec::with_capacity(append.episodes.len());
        let mut seq = session.last_seq;
        let mut newest_cursor = 0;
        for new in append.episodes {
            let stored = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EPISODE_COLUMNS}, fingerprint FROM episodes WHERE tenant = ?1 AND id = ?2"
            )))
            .bind(tenant.as_str())
            .bind(new.id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = stored {
                let fingerprint: Vec<u8> = row.try_get(13)?;
                if fingerprint[..] != new.fingerprint[..] {
                    return Ok(Appended::Conflict(new.id.as_str().to_owned()));
                }
                results.push((episode_row(&row)?, true));
                continue;
            }
            seq += 1;
            let cursor: i64 = sqlx::query_scalar(
                "INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, \
                 content, metadata, source_node, timestamp, create_time, fingerprint) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
                 RETURNING cursor",
            )
            .bind(tenant.as_str())
            .bind(&session.id)
            .bind(seq)
            .bind(new.id.as_str())
            .bind(&session.app)
            .bind(&session.user)
            .bind(
                new.agent
                    .as_ref()
                    .map_or(session.app.as_str(), |a| a.as_str()),
            )
            .bind(new.kind.as_str())
            .bind(&new.content_json)
            .bind(&new.metadata_json)
            .bind(&new.source_node)
            .bind(to_micros(new.timestamp.unwrap_or(append.now)))
            .bind(to_micros(append.now))
            .bind(&new.fingerprint[..])
            .fetch_one(&mut *tx)
            .await?;
            newest_cursor = cursor;
            results.push((new.stored(&session, seq, cursor, append.now), false));
        }

        let added = seq - session.last_seq;
        if added > 0 {
            let present = session.episode_count + added;
            let evicted = if append.max_events > 0 && present > append.max_events {
                sqlx::query(
                    "DELETE FROM episodes WHERE tenant = ?1 AND session_id = ?2 AND seq <= ?3",
                )
                .bind(tenant.as_str())
                .bind(&session.id)
                .bind(seq - append.max_events)
                .execute(&mut *tx)
                .await?
                .rows_affected() as i64
            } else {
                0
            };
            sqlx::query(
                "UPDATE sessions SET last_seq = ?3, episode_count = episode_count + ?4 - ?5, \
                 episodes_evicted = episodes_evicted + ?5, update_time = ?6 \
                 WHERE tenant = ?1 AND id = ?2",
            )
            .bind(tenant.as_str())
            .bind(&session.id)
            .bind(seq)
            .bind(added)
            .bind(evicted)
            .bind(to_micros(append.now))
            .execute(&mut *tx)
            .await?;
            crate::metrics::global().evicted(crate::metrics::Evicted::Episodes, evicted as u64);
        }
        tx.commit().await?;
        self.advance(Feed::Episodes, newest_cursor);
        Ok(Appended::Stored(results))
    }

    async fn list_episodes(
        &self,
        tenant: &Tenant,
        query: &EpisodeQuery<'_>,
    ) -> Result<Vec<Episode>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = ?1 AND session_id = ?2 \
             AND seq > ?3 AND {} ORDER BY seq LIMIT ?5",
            types_match!("4")
        )))
        .bind(tenant.as_str())
        .bind(query.session_id.as_str())
        .bind(query.after_seq)
        .bind(types_json(query.types))
        .bind(query.limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(episode_row).collect()
    }

    async fn recent(&self, tenant: &Tenant, query: &RecentQuery) -> Result<Vec<Episode>> {
        let level = match (&query.session_id, &query.agent) {
            (Some(_), Some(_)) => "session_id = ?3 AND user_id = ?2 AND agent = ?4",
            (Some(_), None) => "session_id = ?3 AND user_id = ?2",
            (None, Some(_)) => "user_id = ?2 AND agent = ?4",
            (None, None) => "user_id = ?2",
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = ?1 AND {level} AND {} \
             ORDER BY timestamp DESC, cursor DESC LIMIT ?6",
            types_match!("5")
        )))
        .bind(tenant.as_str())
        .bind(query.user.as_str())
        .bind(query.session_id.as_ref().map_or("", |s| s.as_str()))
        .bind(query.agent.as_ref().map_or("", |a| a.as_str()))
        .bind(types_json(&query.types))
        .bind(query.limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(episode_row).collect()
    }

    async fn latest_episodes(&self, tenant: &Tenant, limit: i64) -> Result<Vec<Episode>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = ?1 ORDER BY cursor DESC LIMIT ?2"
        )))
        .bind(tenant.as_str())
        .bind(limit)
        .fetch_all(&self.reader)
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
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = ?1 \
             AND cursor > ?2 AND cursor <= ?3 \
             AND (?4 IS NULL OR session_id = ?4) AND (?5 IS NULL OR user_id = ?5) \
             AND (?6 IS NULL OR app = ?6) AND {} \
             ORDER BY cursor LIMIT ?8",
            types_match!("7")
        )))
        .bind(tenant.as_str())
        .bind(after)
        .bind(up_to)
        .bind(filter.session_id.as_ref().map(|s| s.as_str()))
        .bind(filter.user.as_ref().map(|u| u.as_str()))
        .bind(filter.app.as_ref().map(|a| a.as_str()))
        .bind(types_json(&filter.types))
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(episode_row).collect()
    }
}
