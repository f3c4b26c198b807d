//! The append on SQLite: on the single writer connection in a `BEGIN
//! IMMEDIATE` transaction, so it sees the session row as no one else can
//! change it, and cursors (the episodes' rowid) commit in order: the
//! newest committed cursor is the horizon.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use sqlx::SqliteConnection;

use super::SqliteStore;
use crate::context::Tenant;
use crate::error::Result;
use crate::ports::Feed;
use crate::sessions::ports::{Append, Appended};
use crate::sessions::{Episode, NewEpisode, RecentQuery, Session};
use crate::store::group::shared_steps;
use crate::store::sessions::{
    AppendEpisodes, OwnedAppend, RecentEpisodes, episode_ids, filled, insert_session_in,
    missing_session, recent_alone, session_columns, session_in, session_row, sort_out,
    stored_episodes,
};
use crate::store::sql::{Cols, Run, Sql, params};
use crate::store::to_micros;

static INSERT_EPISODE: Sql = Sql::new(
    "INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, \
     content, metadata, source_node, timestamp, create_time, fingerprint) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING cursor",
);

static EVICT_EPISODES: Sql =
    Sql::new("DELETE FROM episodes WHERE tenant = $1 AND session_id = $2 AND seq <= $3");

static COUNT_APPENDED: Sql = Sql::new(
    "UPDATE sessions SET last_seq = $3, episode_count = episode_count + $4 - $5, \
     episodes_evicted = episodes_evicted + $5, update_time = $6 \
     WHERE tenant = $1 AND id = $2",
);

/// An append to a live session of its owner that holds none of its ids
/// yet, without reading first: bumps the session's counters by the
/// episodes' count and returns it as updated, or nothing when any of that
/// does not hold (then [`append_in`] reads and says which). Parameters:
/// $1 tenant, $2 session, $3 count, $4 now, $5 app or NULL, $6 user or
/// NULL, $7 the ids.
static BUMP: Sql = Sql::new(concat!(
    "UPDATE sessions SET last_seq = last_seq + $3, episode_count = episode_count + $3, \
     update_time = $4 WHERE tenant = $1 AND id = $2 AND ($5 IS NULL OR app = $5) \
     AND ($6 IS NULL OR user_id = $6) AND end_time IS NULL \
     AND NOT EXISTS (SELECT 1 FROM episodes WHERE tenant = $1 AND id = ANY($7)) \
     RETURNING ",
    session_columns!()
));

/// [`BUMP`] for the appends of a group to distinct sessions, together.
/// Parameters: $1 tenant, $2 a JSON array of rows `[session, count, app or
/// null, user or null, [ids], time]`. Returns each session bumped, as
/// updated. The sessions are found by key from the rows' ids; the rest of
/// each row is matched per session.
static BUMP_MANY: Sql = Sql::new(concat!(
    "UPDATE sessions SET (last_seq, episode_count, update_time) = \
       (SELECT last_seq + (w.value ->> 1), episode_count + (w.value ->> 1), w.value ->> 5 \
        FROM json_each($2) w WHERE w.value ->> 0 = sessions.id) \
     WHERE tenant = $1 AND id IN (SELECT w.value ->> 0 FROM json_each($2) w) \
     AND end_time IS NULL AND EXISTS (SELECT 1 FROM json_each($2) w \
       WHERE w.value ->> 0 = sessions.id \
       AND (w.value ->> 2 IS NULL OR w.value ->> 2 = sessions.app) \
       AND (w.value ->> 3 IS NULL OR w.value ->> 3 = sessions.user_id) \
       AND NOT EXISTS (SELECT 1 FROM episodes e WHERE e.tenant = $1 \
         AND e.id IN (SELECT value FROM json_each(w.value -> 4)))) \
     RETURNING ",
    session_columns!()
));

/// The episodes of bumped appends, together. Parameters: $1 tenant, $2 a
/// JSON array of rows `[session, seq, id, app, user, agent, type, content,
/// metadata, source_node, timestamp, create_time, fingerprint in hex]`.
static INSERT_MANY: Sql = Sql::new(
    "INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, \
     content, metadata, source_node, timestamp, create_time, fingerprint) \
     SELECT $1, w.value ->> 0, w.value ->> 1, w.value ->> 2, w.value ->> 3, w.value ->> 4, \
       w.value ->> 5, w.value ->> 6, w.value ->> 7, w.value ->> 8, w.value ->> 9, \
       w.value ->> 10, w.value ->> 11, unhex(w.value ->> 12) \
     FROM json_each($2) w ORDER BY w.key \
     RETURNING session_id, seq, cursor",
);

impl AppendEpisodes for SqliteStore {
    async fn append_episodes(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Appended> {
        let owned = OwnedAppend::of(append);
        match &self.appends {
            Some(group) => group.submit(tenant, owned).await,
            None => self
                .append_group(tenant, vec![owned])
                .await
                .pop()
                .unwrap_or_else(|| {
                    Err(crate::error::Error::internal(
                        "an append without an outcome",
                    ))
                }),
        }
    }
}

/// Each on its own: a read on SQLite is a call into the library on a
/// reader connection, with no round trip to share.
impl RecentEpisodes for SqliteStore {
    async fn recent_episodes(&self, tenant: &Tenant, query: &RecentQuery) -> Result<Vec<Episode>> {
        recent_alone(self, tenant, query).await
    }
}

impl SqliteStore {
    /// Appends in one transaction on the single writer (see
    /// [`SqliteStore::run_group`]); one that is refused leaves nothing
    /// behind, not even the session it created (see [`append_in`]).
    pub(super) async fn append_group(
        &self,
        tenant: &Tenant,
        jobs: Vec<OwnedAppend>,
    ) -> Vec<Result<Appended>> {
        // By session (a session's appends in the order they came), so
        // appends to distinct sessions next to each other share a step.
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        let session = |at: usize| jobs[at].append().session_id.as_str();
        order.sort_by(|&a, &b| session(a).cmp(session(b)));
        let steps = shared_steps(order, |_| true, session);
        self.run_group(tenant, Feed::Episodes, jobs, steps, |tx, tenant, step| {
            async move {
                let appends: Vec<Append<'_>> = step.iter().map(|job| job.append()).collect();
                // One append alone keeps its own statements: the shared
                // ones' lookups in JSON cost one append about a tenth more
                // (one client: 1,102 against 992 appends/s).
                if let [append] = &appends[..] {
                    let blind = append_blind(tx, tenant, append).await?;
                    return Ok(vec![match blind {
                        Some(appended) => appended,
                        None => append_in(tx, tenant, append).await?,
                    }]);
                }
                append_many(tx, tenant, &appends).await
            }
            .boxed()
        })
        .await
    }
}

static SAVEPOINT: Sql = Sql::new("SAVEPOINT append");
static ROLLBACK_TO: Sql = Sql::new("ROLLBACK TO append");
static RELEASE: Sql = Sql::new("RELEASE append");

/// An append in the writer's open transaction without reading first
/// ([`BUMP`], then the episodes): two statements where reading first took
/// four, each a hop to the connection's thread. `None` when the session
/// is not a live one of the owner's holding none of the ids, with nothing
/// written: [`append_in`] then reads and answers.
async fn append_blind(
    tx: &mut SqliteConnection,
    tenant: &Tenant,
    append: &Append<'_>,
) -> Result<Option<(Appended, i64)>> {
    if append.episodes.is_empty() {
        return Ok(None);
    }
    let added = i64::try_from(append.episodes.len()).unwrap_or(i64::MAX);
    let ids = episode_ids(append.episodes);
    let bumped = tx
        .first(
            &BUMP,
            params![
                tenant.as_str(),
                append.session_id.as_str(),
                added,
                append.now,
                append.owner.app.as_ref().map(|a| a.as_str()),
                append.owner.user.as_ref().map(|u| u.as_str()),
                &ids[..],
            ],
            session_row,
        )
        .await?;
    let Some(session) = bumped else {
        return Ok(None);
    };
    let first = session.last_seq - added + 1;
    let mut done = Vec::with_capacity(append.episodes.len());
    let mut newest_cursor = 0;
    for (seq, new) in (first..).zip(append.episodes) {
        newest_cursor = insert_episode_in(tx, tenant, &session, seq, new, append.now).await?;
        done.push((new.stored(&session, seq, newest_cursor, append.now), false));
    }
    // The counters are bumped: only an eviction is left to count.
    let (last, present) = (session.last_seq, session.episode_count);
    count_in(tx, tenant, &session.id, last, present, 0, append).await?;
    Ok(Some((Appended::Stored(done), newest_cursor)))
}

/// Appends to distinct sessions in the writer's open transaction: tried
/// blind together ([`BUMP_MANY`], then [`INSERT_MANY`]: two statements for
/// the step, where each append alone takes two), then each one that the
/// blind write did not take read and answered on its own ([`append_in`]).
async fn append_many(
    tx: &mut SqliteConnection,
    tenant: &Tenant,
    appends: &[Append<'_>],
) -> Result<Vec<(Appended, i64)>> {
    let count = |append: &Append<'_>| i64::try_from(append.episodes.len()).unwrap_or(i64::MAX);
    let rows: Vec<serde_json::Value> = appends
        .iter()
        .filter(|append| !append.episodes.is_empty())
        .map(|append| {
            serde_json::json!([
                append.session_id.as_str(),
                count(append),
                append.owner.app.as_ref().map(|a| a.as_str()),
                append.owner.user.as_ref().map(|u| u.as_str()),
                episode_ids(append.episodes),
                to_micros(append.now),
            ])
        })
        .collect();
    let bumped = tx
        .all(
            &BUMP_MANY,
            params![
                tenant.as_str(),
                serde_json::Value::from(rows).to_string().as_str()
            ],
            session_row,
        )
        .await?;
    let sessions: Vec<Option<Session>> = appends
        .iter()
        .map(|append| {
            bumped
                .iter()
                .find(|session| session.id == append.session_id.as_str())
                .cloned()
        })
        .collect();
    let mut rows = Vec::new();
    for (append, session) in appends.iter().zip(&sessions) {
        let Some(session) = session else { continue };
        let first = session.last_seq - count(append) + 1;
        for (seq, new) in (first..).zip(append.episodes) {
            let agent = new
                .agent
                .as_ref()
                .map_or(session.app.as_str(), |a| a.as_str());
            let fingerprint: String = new.fingerprint.iter().map(|b| format!("{b:02x}")).collect();
            rows.push(serde_json::json!([
                session.id,
                seq,
                new.id.as_str(),
                session.app,
                session.user,
                agent,
                new.kind.as_str(),
                new.content_json,
                new.metadata_json,
                new.source_node,
                to_micros(new.timestamp.unwrap_or(append.now)),
                to_micros(append.now),
                fingerprint,
            ]));
        }
    }
    // Nothing bumped (new sessions, refusals, replays): no insert to run.
    let cursors: HashMap<(String, i64), i64> = if rows.is_empty() {
        HashMap::new()
    } else {
        tx.all(
            &INSERT_MANY,
            params![
                tenant.as_str(),
                serde_json::Value::from(rows).to_string().as_str()
            ],
            |row| Ok(((row.text(0)?, row.int(1)?), row.int(2)?)),
        )
        .await?
        .into_iter()
        .collect()
    };
    let mut done = Vec::with_capacity(appends.len());
    for (append, session) in appends.iter().zip(sessions) {
        let Some(session) = session else {
            done.push(append_in(tx, tenant, append).await?);
            continue;
        };
        let first = session.last_seq - count(append) + 1;
        let mut stored = Vec::with_capacity(append.episodes.len());
        let mut newest_cursor = 0;
        for (seq, new) in (first..).zip(append.episodes) {
            newest_cursor = *cursors
                .get(&(session.id.clone(), seq))
                .ok_or_else(|| crate::error::Error::internal("an episode's cursor is missing"))?;
            stored.push((new.stored(&session, seq, newest_cursor, append.now), false));
        }
        let (last, present) = (session.last_seq, session.episode_count);
        count_in(tx, tenant, &session.id, last, present, 0, append).await?;
        done.push((Appended::Stored(stored), newest_cursor));
    }
    Ok(done)
}

/// One append in the writer's open transaction, and the newest cursor it
/// took (0: none). An append to a stored session refuses before it writes
/// anything; one that creates its session does so in a savepoint, rolled
/// back when the append is refused after all (a clashing episode id).
/// Each statement is a hop to the connection's thread, so the savepoint
/// is taken only there.
async fn append_in(
    tx: &mut SqliteConnection,
    tenant: &Tenant,
    append: &Append<'_>,
) -> Result<(Appended, i64)> {
    if let Some(session) = session_in(tx, tenant, append.session_id.as_str()).await? {
        return append_to(tx, tenant, append, session).await;
    }
    let Some(new) = missing_session(append) else {
        return Ok((Appended::NoSession, 0));
    };
    tx.exec(&SAVEPOINT, params![]).await?;
    // The id was free a moment ago in this same transaction.
    let session = insert_session_in(tx, tenant, &new)
        .await?
        .ok_or_else(|| crate::error::Error::internal("a free session id was taken"))?;
    let outcome = append_to(tx, tenant, append, session).await?;
    if !matches!(outcome.0, Appended::Stored(_)) {
        tx.exec(&ROLLBACK_TO, params![]).await?;
    }
    tx.exec(&RELEASE, params![]).await?;
    Ok(outcome)
}

/// The rest of [`append_in`], to a session that exists: refused before
/// anything is written, or stored.
async fn append_to(
    tx: &mut SqliteConnection,
    tenant: &Tenant,
    append: &Append<'_>,
    session: Session,
) -> Result<(Appended, i64)> {
    if !append.owner.admits(&session) || session.end_time.is_some() {
        return Ok((Appended::Refused(session), 0));
    }

    let stored = stored_episodes(tx, tenant, &episode_ids(append.episodes)).await?;
    let (mut slots, _) = match sort_out(append.episodes, stored) {
        Ok(sorted) => sorted,
        Err(id) => return Ok((Appended::Conflict(id), 0)),
    };
    let mut seq = session.last_seq;
    let mut newest_cursor = 0;
    for (slot, new) in slots.iter_mut().zip(append.episodes) {
        if slot.is_some() {
            continue;
        }
        seq += 1;
        newest_cursor = insert_episode_in(tx, tenant, &session, seq, new, append.now).await?;
        *slot = Some((new.stored(&session, seq, newest_cursor, append.now), false));
    }
    let added = seq - session.last_seq;
    if added > 0 {
        let present = session.episode_count + added;
        count_in(tx, tenant, &session.id, seq, present, added, append).await?;
    }
    Ok((Appended::Stored(filled(slots)?), newest_cursor))
}

/// Inserts one episode of the session at `seq`: its cursor.
async fn insert_episode_in(
    tx: &mut SqliteConnection,
    tenant: &Tenant,
    session: &Session,
    seq: i64,
    new: &NewEpisode,
    now: DateTime<Utc>,
) -> Result<i64> {
    let agent = new
        .agent
        .as_ref()
        .map_or(session.app.as_str(), |a| a.as_str());
    tx.row(
        &INSERT_EPISODE,
        params![
            tenant.as_str(),
            &session.id,
            seq,
            new.id.as_str(),
            &session.app,
            &session.user,
            agent,
            new.kind.as_str(),
            &new.content_json,
            &new.metadata_json,
            &new.source_node,
            new.timestamp.unwrap_or(now),
            now,
            &new.fingerprint[..],
        ],
    )
    .await?
    .ok_or_else(|| crate::error::Error::internal("an episode's cursor is missing"))?
    .int(0)
}

/// Counts `added` episodes on the session, whose newest seq is now `seq`
/// and which holds `present` episodes with them, after evicting the
/// oldest past the append's limit. Nothing to count and nothing to evict
/// writes nothing.
async fn count_in(
    tx: &mut SqliteConnection,
    tenant: &Tenant,
    session: &str,
    seq: i64,
    present: i64,
    added: i64,
    append: &Append<'_>,
) -> Result<()> {
    let evicted = if append.max_events > 0 && present > append.max_events {
        tx.exec(
            &EVICT_EPISODES,
            params![tenant.as_str(), session, seq - append.max_events],
        )
        .await? as i64
    } else {
        0
    };
    if added > 0 || evicted > 0 {
        tx.exec(
            &COUNT_APPENDED,
            params![tenant.as_str(), session, seq, added, evicted, append.now],
        )
        .await?;
    }
    crate::metrics::global().evicted(crate::metrics::Evicted::Episodes, evicted as u64);
    Ok(())
}
