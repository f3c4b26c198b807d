//! Sessions and episodes on both backends, one statement text each. Only
//! the append differs (see each backend's `sessions.rs`): Postgres writes
//! it in one statement whose cursors come from an identity, SQLite on its
//! single writer whose rowids commit in order.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::sql::{
    Backend, Cols, Dialect, Param, Run, SENT_WHOLE_BYTES, Sql, Transaction, page_by_bytes, params,
    select,
};
use crate::context::Tenant;
use crate::error::{Error, Result, request_id_reused};
use crate::paging::Weighed;
use crate::sessions::ports::{Append, Appended, Creation, EpisodeQuery, NewSession, SessionStore};
use crate::sessions::{
    Episode, EpisodeType, Id, NewEpisode, Owner, RecentQuery, Session, SessionFilter, SessionStats,
    TailFilter, session_changed,
};

/// The columns [`episode_row`] reads, in order, for `concat!`.
macro_rules! episode_columns {
    () => {
        "id, session_id, seq, cursor, app, user_id, agent, type, content::text, \
         metadata::text, source_node, timestamp, create_time"
    };
}
pub(super) use episode_columns;

/// The columns [`session_row`] reads, in order, for `concat!`.
macro_rules! session_columns {
    () => {
        "id, app, user_id, metadata::text, create_time, update_time, end_time, \
         episode_count, last_seq, episodes_evicted"
    };
}
pub(super) use session_columns;

/// How many columns [`session_columns`] names.
const SESSION_COLUMNS: usize = 10;

/// Reads one session. Parameters: $1 tenant, $2 id.
pub(super) static SESSION: Sql = select!(
    session_columns!(),
    " FROM sessions WHERE tenant = $1 AND id = $2"
);

/// Finds the stored episodes among an append's ids, with the fingerprints
/// a replay is checked against. Parameters: $1 tenant, $2 ids.
pub(super) static EPISODES_BY_ID: Sql = select!(
    episode_columns!(),
    ", fingerprint FROM episodes WHERE tenant = $1 AND id = ANY($2::text[])"
);

/// One episode by id. Parameters: $1 tenant, $2 id.
static EPISODE: Sql = select!(
    episode_columns!(),
    " FROM episodes WHERE tenant = $1 AND id = $2"
);

/// How many bytes of stored content and metadata a `Recent` statement
/// sends in all, about: twice a page's. A `Recent` answer has no pages and
/// ends at a page's bytes ([`crate::paging`]), so the rows past that were
/// read by the server only to be dropped, and Postgres sent every one of
/// them (a `BuildContext` of a thousand episodes of 100 KB: 100 MB). Twice,
/// so that the statement ends after paging does unless the episodes are
/// stored at more than twice what paging weighs them (SQLite's text of
/// long numbers comes closest, under twice); the answer then holds fewer,
/// still about a page's bytes.
pub(super) const RECENT_BYTES: i64 = 2 * crate::paging::PAGE_BYTES as i64;

/// The most stored bytes an episode of a `Recent` read of `limit` comes
/// with whole from its first statement ([`RECENT`]): all `limit` of that
/// size stay within [`RECENT_BYTES`].
pub(super) fn recent_row_bytes(limit: i64) -> i64 {
    RECENT_BYTES / limit.max(1)
}

/// The stored size of an episode's content and metadata, for `concat!`;
/// `pg_column_size` reads it off the stored form without detoasting.
macro_rules! stored_size {
    () => {
        "(pg_column_size(content) + pg_column_size(metadata))"
    };
}
pub(super) use stored_size;

/// The columns of [`episode_row`], an episode larger than `$bytes` without
/// its content and metadata, then whether it was (column 13).
macro_rules! recent_columns {
    ($bytes:literal) => {
        concat!(
            "id, session_id, seq, cursor, app, user_id, agent, type, CASE WHEN ",
            stored_size!(),
            " > ",
            $bytes,
            " THEN NULL ELSE content::text END, CASE WHEN ",
            stored_size!(),
            " > ",
            $bytes,
            " THEN NULL ELSE metadata::text END, source_node, timestamp, create_time, ",
            stored_size!(),
            " > ",
            $bytes
        )
    };
}
pub(super) use recent_columns;

/// The newest episodes from `$from` (which ends in `ORDER BY timestamp
/// DESC, cursor DESC LIMIT`), those after [`RECENT_BYTES`] of stored
/// content and metadata (parameter `$bytes`) left out, by a running sum:
/// the second statement of a `Recent` read whose first came to an episode
/// too large to send whole ([`RECENT`]). The sum costs Postgres about a
/// microsecond a row: as the first statement, it took the bench's `recent`
/// (20 small episodes a read) from 50–61 to 71–79 µs of Postgres CPU a
/// read and 7–15% fewer reads a second, so it is kept to the reads that
/// need it.
macro_rules! recent_by_bytes {
    ($bytes:literal, $from:expr) => {
        concat!(
            "SELECT ",
            episode_columns!(),
            ", false FROM (SELECT id, session_id, seq, cursor, app, user_id, agent, type, \
             content, metadata, source_node, timestamp, create_time, coalesce(sum(",
            stored_size!(),
            ") OVER (ORDER BY timestamp DESC, cursor DESC \
             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before ",
            $from,
            ") page WHERE before <= ",
            $bytes,
            " ORDER BY timestamp DESC, cursor DESC"
        )
    };
}

/// The conditions of a `Recent` read's level ($1 tenant, $2 user, $3
/// session, $4 agent, $5 types, $6 limit), for `concat!`.
macro_rules! recent_from {
    ($level:literal) => {
        concat!(
            "FROM episodes WHERE tenant = $1 AND ",
            $level,
            " AND (cardinality($5::text[]) = 0 OR type = ANY($5::text[])) \
             ORDER BY timestamp DESC, cursor DESC LIMIT $6"
        )
    };
}

/// The widening read: one statement per level, each matching its own index
/// exactly. Parameters: $1 tenant, $2 user, $3 session, $4 agent, $5
/// types, $6 limit, $7 [`recent_row_bytes`]. (`engram bench` runs the same
/// text through pgbench.) An episode larger than $7 comes without its
/// content and metadata; the read then asks [`RECENT_WHOLE`] instead.
macro_rules! recent {
    ($level:literal) => {
        Sql::new(concat!(
            "SELECT ",
            recent_columns!("$7"),
            " ",
            recent_from!($level)
        ))
    };
}

static RECENT: [Sql; 4] = [
    recent!("user_id = $2"),
    recent!("user_id = $2 AND agent = $4"),
    recent!("session_id = $3 AND user_id = $2"),
    recent!("session_id = $3 AND user_id = $2 AND agent = $4"),
];

/// [`RECENT`] sending up to [`RECENT_BYTES`] in all ($7), whatever the
/// size of each episode: the same columns, none of them left out.
macro_rules! recent_whole {
    ($level:literal) => {
        Sql::new(recent_by_bytes!("$7", recent_from!($level)))
    };
}

static RECENT_WHOLE: [Sql; 4] = [
    recent_whole!("user_id = $2"),
    recent_whole!("user_id = $2 AND agent = $4"),
    recent_whole!("session_id = $3 AND user_id = $2"),
    recent_whole!("session_id = $3 AND user_id = $2 AND agent = $4"),
];

/// The level of a `Recent` read, which picks its statement: 0 user, 1 user
/// and agent, 2 session, 3 session and agent.
pub(super) fn recent_level(session: bool, agent: bool) -> usize {
    usize::from(session) * 2 + usize::from(agent)
}

/// The `Recent` statement of a level (session given, agent given).
pub(super) fn recent_sql(session: bool, agent: bool) -> &'static Sql {
    &RECENT[recent_level(session, agent)]
}

/// No row when the id is taken. Parameters: $1 tenant, $2 id, $3 app, $4
/// user, $5 metadata, $6 now.
static INSERT_SESSION: Sql = Sql::new(concat!(
    "INSERT INTO sessions (tenant, id, app, user_id, metadata, create_time, update_time) \
     VALUES ($1, $2, $3, $4, $5::jsonb, $6, $6) ON CONFLICT (tenant, id) DO NOTHING \
     RETURNING ",
    session_columns!()
));

/// [`INSERT_SESSION`] keeping the request id that creates the session
/// ($7) and its fingerprint ($8): no row either when a concurrent repeat
/// of the request stored it.
/// (Apart, so that writes without one name no column a schema before
/// migration 0035 / 0025 lacks.)
static INSERT_KEYED_SESSION: Sql = Sql::new(concat!(
    "INSERT INTO sessions \
     (tenant, id, app, user_id, metadata, create_time, update_time, create_request_id, \
     create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5::jsonb, $6, $6, $7, $8) ON CONFLICT DO NOTHING \
     RETURNING ",
    session_columns!()
));

/// The session a keyed creation finds: the one its request id created if
/// any (`repeated` 1, with the fingerprint kept), else the one stored
/// under its id. One statement,
/// so one snapshot: a concurrent repeat's session, committed meanwhile, is
/// never taken for another request's. Parameters: $1 tenant, $2 request
/// id, $3 id.
static SESSION_OF_REQUEST: Sql = select!(
    session_columns!(),
    ", (CASE WHEN create_request_id = $2 THEN 1 ELSE 0 END)::bigint AS repeated, \
     create_fingerprint FROM sessions \
     WHERE tenant = $1 AND (create_request_id = $2 OR id = $3) \
     ORDER BY repeated DESC LIMIT 1"
);

static LOCK_SESSION_CREATORS: Sql =
    Sql::new("SELECT pg_advisory_xact_lock(hashtextextended('engram.sessions/' || $1, 0))");

static COUNT_SESSIONS: Sql = Sql::new("SELECT count(*) FROM sessions WHERE tenant = $1");

macro_rules! oldest_sessions {
    () => {
        "(SELECT id FROM sessions WHERE tenant = $1 ORDER BY create_time, id LIMIT $2)"
    };
}

static EVICT_SESSIONS: Sql = Sql::new(concat!(
    "DELETE FROM sessions WHERE tenant = $1 AND id IN ",
    oldest_sessions!()
));

/// The same on Postgres, the sessions' rows locked first in id order, as a
/// group of appends takes them: deleted in age order, an eviction and a
/// group each held a session the other waited for (a deadlock, and one of
/// them failed).
static EVICT_SESSIONS_PG: Sql = Sql::new(concat!(
    "WITH held AS (SELECT id FROM sessions WHERE tenant = $1 AND id IN ",
    oldest_sessions!(),
    " ORDER BY id FOR UPDATE) \
     DELETE FROM sessions s USING held WHERE s.tenant = $1 AND s.id = held.id"
));

static COUNT_EVICTED_SESSIONS: Sql = Sql::new(
    "INSERT INTO session_evictions AS e (tenant, sessions) VALUES ($1, $2) \
     ON CONFLICT (tenant) DO UPDATE SET sessions = e.sessions + EXCLUDED.sessions",
);

/// A page of sessions, newest first: $1 tenant, $2 app and $3 user (either
/// NULL: any), $4 and $5 the last session of the page before (the first
/// page: [`NO_SESSION_BEFORE`]), $6 limit. `$owner` names the filter the
/// page is read by, so that each form has an index in the page's order:
/// written `($3 IS NULL OR user_id = $3)` alone, SQLite read no index for
/// it and walked the tenant's sessions newest first for one user's, 45–165
/// ms a page among 200,000 sessions (Postgres plans those calls for their
/// values, but could keep a generic plan that walks the same way). The
/// page's bound is always given, for the same reason: as `$4 IS NULL OR`,
/// a page deep in a user's sessions read every newer one again.
macro_rules! list_sessions {
    ($owner:literal) => {
        Sql::new(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE tenant = $1 AND ",
            $owner,
            " AND (create_time, id) < ($4, $5) ORDER BY create_time DESC, id DESC LIMIT $6"
        ))
    };
}

/// By user, and app if given: `sessions_user`.
static LIST_SESSIONS_BY_USER: Sql =
    list_sessions!("user_id = $3 AND ($2::text IS NULL OR app = $2)");

/// By app alone ($3 NULL): `sessions_app`.
static LIST_SESSIONS_BY_APP: Sql =
    list_sessions!("app = $2 AND ($3::text IS NULL OR user_id = $3)");

/// Every session ($2 and $3 NULL): `sessions_create`.
static LIST_SESSIONS: Sql =
    list_sessions!("($2::text IS NULL OR app = $2) AND ($3::text IS NULL OR user_id = $3)");

/// The bound of a first page of sessions: every session comes before it
/// (chrono's latest time, which both stores hold).
const NO_SESSION_BEFORE: (DateTime<Utc>, &str) = (DateTime::<Utc>::MAX_UTC, "");

static DELETE_SESSION: Sql = Sql::new(
    "DELETE FROM sessions WHERE tenant = $1 AND id = $2 \
     AND ($3::text IS NULL OR app = $3) AND ($4::text IS NULL OR user_id = $4) \
     RETURNING episode_count",
);

/// Before a session ends, its row is locked for update, so that a
/// working-memory write holding it ([`super::working`]) finishes first and
/// what it wrote is cleared with the rest, and later ones see the end.
static LOCK_SESSION_TO_END: Sql =
    Sql::new("SELECT 1 FROM sessions WHERE tenant = $1 AND id = $2 FOR UPDATE");

static END_SESSION: Sql = Sql::new(concat!(
    "UPDATE sessions SET end_time = coalesce(end_time, $5), \
     episode_count = CASE WHEN $6 THEN 0 ELSE episode_count END \
     WHERE tenant = $1 AND id = $2 \
     AND ($3::text IS NULL OR app = $3) AND ($4::text IS NULL OR user_id = $4) \
     RETURNING ",
    session_columns!()
));

/// What ends with a session: its goal, tasks and cache (facts persist).
static END_WORKING_MEMORY: [Sql; 3] = [
    Sql::new("DELETE FROM working_tasks WHERE tenant = $1 AND session_id = $2"),
    Sql::new("DELETE FROM working_cache WHERE tenant = $1 AND session_id = $2"),
    Sql::new("DELETE FROM working_memory WHERE tenant = $1 AND session_id = $2"),
];

static DELETE_EPISODES: Sql =
    Sql::new("DELETE FROM episodes WHERE tenant = $1 AND session_id = $2");

/// The sessions idle since before $2, for `concat!`. A session's last
/// activity is the later of its own (creation, appends: `update_time`)
/// and its working memory's (a goal, a task created or changed, a file
/// cached). It is not before its creation, so they are among those created
/// before $2, which `sessions_create` finds (there is no index on the last
/// activity, so that appends update the session row in place: migration
/// 0018). A session whose append another replica stamped a little before
/// its creation (clocks apart) waits for a later cleanup.
macro_rules! idle {
    () => {
        "sessions.tenant = $1 AND sessions.create_time < $2 AND sessions.update_time < $2 \
         AND NOT EXISTS (SELECT 1 FROM working_memory w WHERE w.tenant = $1 \
           AND w.session_id = sessions.id AND w.update_time >= $2) \
         AND NOT EXISTS (SELECT 1 FROM working_tasks t WHERE t.tenant = $1 \
           AND t.session_id = sessions.id AND t.update_time >= $2)"
    };
}

static COUNT_IDLE: Sql = Sql::new(concat!("SELECT count(*) FROM sessions WHERE ", idle!()));

static DELETE_IDLE: Sql = Sql::new(concat!("DELETE FROM sessions WHERE ", idle!()));

/// The same on Postgres in two statements. First the idle sessions' rows
/// are locked in id order, as a group of appends and a forget take them:
/// deleted in the order a scan met them, a cleanup and a group each held
/// a session the other waited for (a deadlock, and one of them failed).
/// Then those still idle go ($3 the locked ids), read at the second
/// statement's own snapshot: a session appended to, or its working memory
/// written, while the first waited for its lock is not idle then.
static LOCK_IDLE_PG: Sql = Sql::new(concat!(
    "SELECT id FROM sessions WHERE ",
    idle!(),
    " ORDER BY id FOR UPDATE OF sessions"
));

static DELETE_IDLE_PG: Sql = Sql::new(concat!(
    "DELETE FROM sessions WHERE id = ANY($3::text[]) AND ",
    idle!()
));

static STATS: Sql = Sql::new(
    "SELECT count(*), coalesce(sum(episode_count), 0)::bigint, \
     coalesce(sum(episodes_evicted), 0)::bigint, \
     coalesce((SELECT sessions FROM session_evictions WHERE tenant = $1), 0) \
     FROM sessions WHERE tenant = $1",
);

/// Episodes in `$order` from `$from` (which ends in `ORDER BY $order
/// LIMIT`), sent in full up to [`SENT_WHOLE_BYTES`] of stored content and
/// metadata (parameter `$bytes`): the columns of [`episode_row`], then
/// whether the row came past that, without either ([`sent_whole_row`]).
macro_rules! sent_whole {
    ($order:literal, $bytes:literal, $from:expr) => {
        sent_whole!(new; $order, $bytes, $from)
    };
    ($new:ident; $order:literal, $bytes:literal, $from:expr) => {
        page_by_bytes!(
            $new;
            "id, session_id, seq, cursor, app, user_id, agent, type, \
             CASE WHEN past THEN NULL ELSE content::text END, \
             CASE WHEN past THEN NULL ELSE metadata::text END, source_node, timestamp, \
             create_time",
            "id, session_id, seq, cursor, app, user_id, agent, type, content, metadata, \
             source_node, timestamp, create_time",
            stored_size!(),
            $order,
            $bytes,
            $from
        )
    };
}

/// $1 tenant, $2 session, $3 the seq to read after, $4 types (none: any),
/// $5 limit, $6 [`SENT_WHOLE_BYTES`].
static LIST_EPISODES: Sql = sent_whole!(
    "seq",
    "$6",
    "FROM episodes WHERE tenant = $1 AND session_id = $2 AND seq > $3 \
     AND (cardinality($4::text[]) = 0 OR type = ANY($4::text[])) ORDER BY seq LIMIT $5"
);

static LATEST: Sql = select!(
    episode_columns!(),
    " FROM episodes WHERE tenant = $1 ORDER BY cursor DESC LIMIT $2"
);

/// $1 tenant, $2 the cursor to read after, $3 the settled horizon, $4
/// session, $5 user, $6 app (each null: any), $7 types (none: any), $8
/// limit, $9 [`SENT_WHOLE_BYTES`].
macro_rules! episodes_after {
    () => {
        "FROM episodes WHERE tenant = $1 AND cursor > $2 AND cursor <= $3 \
         AND ($4::text IS NULL OR session_id = $4) AND ($5::text IS NULL OR user_id = $5) \
         AND ($6::text IS NULL OR app = $6) \
         AND (cardinality($7::text[]) = 0 OR type = ANY($7::text[])) \
         ORDER BY cursor LIMIT $8"
    };
}

/// A tail's episodes over a short stretch of cursors (a live pass): the
/// kept plan walks the stretch in cursor order and filters it.
static EPISODES_AFTER: Sql = sent_whole!("cursor", "$9", episodes_after!());

/// The same over a long stretch for a tail of one session or user (one
/// catching up), planned for its values: the kept plan cannot know a
/// filter is set, so it walked every episode of the tenant in the stretch
/// (37 ms a page for one session's 200 episodes among 200,000, against
/// 0.5 ms reading the session's by its index; docs/benchmarks.md).
static EPISODES_AFTER_PLANNED: Sql =
    sent_whole!(planned_each_call; "cursor", "$9", episodes_after!());

/// How many cursors a stretch spans before a tail of one session or user
/// reads it with [`EPISODES_AFTER_PLANNED`]: past this, planning (about
/// 0.1 to 0.5 ms) costs less than walking the stretch.
const PLANNED_PAST: i64 = 2_000;

/// How often a session is created again when a concurrent creator took
/// its id between the read and the insert (the next read then sees it).
const CREATE_ATTEMPTS: usize = 3;

/// A JSON object read back from the store.
fn json_object(text: String) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(&text).map_err(Error::internal)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err(Error::internal("stored metadata is not a JSON object")),
    }
}

/// The types filter as a list parameter; an empty list matches every type.
pub(super) fn type_names(types: &[EpisodeType]) -> Vec<String> {
    types.iter().map(|t| t.as_str().to_owned()).collect()
}

/// An episode as both backends read it (columns as [`episode_columns`]).
pub(super) fn episode_row(row: &impl Cols) -> Result<Episode> {
    Ok(Episode {
        id: row.text(0)?,
        session_id: row.text(1)?,
        seq: row.int(2)?,
        cursor: row.int(3)?,
        app: row.text(4)?,
        user: row.text(5)?,
        agent: row.text(6)?,
        kind: row.text(7)?,
        content: serde_json::from_str(&row.text(8)?).map_err(Error::internal)?,
        metadata: json_object(row.text(9)?)?,
        source_node: row.text(10)?,
        timestamp: row.time(11)?,
        create_time: row.time(12)?,
    })
}

/// A row of a statement that cuts by bytes itself ([`sent_whole`]): the
/// episode, or `None` once the statement sent it without its content.
fn sent_whole_row(row: &impl Cols) -> Result<Option<Episode>> {
    if row.boolean(13)? {
        return Ok(None);
    }
    episode_row(row).map(Some)
}

/// A session as both backends read it (columns as `session_columns!`).
pub(super) fn session_row(row: &impl Cols) -> Result<Session> {
    Ok(Session {
        id: row.text(0)?,
        app: row.text(1)?,
        user: row.text(2)?,
        metadata: json_object(row.text(3)?)?,
        create_time: row.time(4)?,
        update_time: row.time(5)?,
        end_time: row.opt_time(6)?,
        episode_count: row.int(7)?,
        last_seq: row.int(8)?,
        episodes_evicted: row.int(9)?,
    })
}

pub(super) async fn session_in(
    conn: &mut impl Run,
    tenant: &Tenant,
    id: &str,
) -> Result<Option<Session>> {
    conn.first(&SESSION, params![tenant.as_str(), id], session_row)
        .await
}

/// The stored episodes among `ids`, each with its fingerprint.
pub(super) async fn stored_episodes(
    conn: &mut impl Run,
    tenant: &Tenant,
    ids: &[String],
) -> Result<Vec<(Episode, Vec<u8>)>> {
    conn.all(&EPISODES_BY_ID, params![tenant.as_str(), ids], |row| {
        Ok((episode_row(row)?, row.bytes(13)?))
    })
    .await
}

/// Inserts a session inside the caller's transaction, evicting the
/// tenant's oldest first when it is at its limit. `None` when the id was
/// taken meanwhile.
pub(super) async fn insert_session_in<T: Run>(
    tx: &mut T,
    tenant: &Tenant,
    session: &NewSession<'_>,
) -> Result<Option<Session>> {
    if T::DIALECT == Dialect::Postgres {
        // Not while the user is being forgotten (see `store::forget`).
        tx.exec(
            &super::forget::HOLD_USER,
            params![tenant.as_str(), session.app.as_str(), session.user.as_str()],
        )
        .await?;
    }
    if session.max_sessions > 0 {
        if T::DIALECT == Dialect::Postgres {
            // One creator per tenant at a time while a limit is set, so the
            // count is exact and two creators never both evict. (SQLite's
            // single writer already is one at a time.)
            tx.exec(&LOCK_SESSION_CREATORS, params![tenant.as_str()])
                .await?;
        }
        let count = tx.count(&COUNT_SESSIONS, params![tenant.as_str()]).await?;
        let evict = session.to_evict(count);
        if evict > 0 {
            let evict_sessions = match T::DIALECT {
                Dialect::Postgres => &EVICT_SESSIONS_PG,
                Dialect::Sqlite => &EVICT_SESSIONS,
            };
            let evicted = tx
                .exec(evict_sessions, params![tenant.as_str(), evict])
                .await? as i64;
            tx.exec(&COUNT_EVICTED_SESSIONS, params![tenant.as_str(), evicted])
                .await?;
            tracing::info!(
                tenant = tenant.as_str(),
                evicted,
                "session limit reached, evicted the oldest sessions"
            );
            crate::metrics::global().evicted(crate::metrics::Evicted::Sessions, evicted as u64);
        }
    }
    let row: &[Param<'_>] = params![
        tenant.as_str(),
        session.id.as_str(),
        session.app.as_str(),
        session.user.as_str(),
        session.metadata,
        session.now,
    ];
    match &session.request {
        None => tx.first(&INSERT_SESSION, row, session_row).await,
        Some(request) => {
            let keyed = &[row, params![request.id, &request.fingerprint[..]]].concat();
            tx.first(&INSERT_KEYED_SESSION, keyed, session_row).await
        }
    }
}

/// An append's episodes sorted out against those already stored under
/// their ids: a slot per episode (filled for a replay, empty for a new
/// one) and the new ones; `Err` names an id stored with other content.
pub(super) type Sorted<'a> = (Vec<Option<(Episode, bool)>>, Vec<&'a NewEpisode>);

pub(super) fn sort_out<'a>(
    episodes: &'a [NewEpisode],
    stored: Vec<(Episode, Vec<u8>)>,
) -> std::result::Result<Sorted<'a>, String> {
    let mut stored: std::collections::HashMap<String, (Episode, Vec<u8>)> = stored
        .into_iter()
        .map(|(episode, fingerprint)| (episode.id.clone(), (episode, fingerprint)))
        .collect();
    let mut slots = Vec::with_capacity(episodes.len());
    let mut fresh = Vec::new();
    for new in episodes {
        match stored.remove(new.id.as_str()) {
            Some((episode, fingerprint)) if fingerprint[..] == new.fingerprint[..] => {
                slots.push(Some((episode, true)));
            }
            Some(_) => return Err(new.id.as_str().to_owned()),
            None => {
                slots.push(None);
                fresh.push(new);
            }
        }
    }
    Ok((slots, fresh))
}

/// The ids of an append's episodes, as a list parameter.
pub(super) fn episode_ids(episodes: &[NewEpisode]) -> Vec<String> {
    episodes.iter().map(|e| e.id.as_str().to_owned()).collect()
}

/// Every slot of an append, filled.
pub(super) fn filled(slots: Vec<Option<(Episode, bool)>>) -> Result<Vec<(Episode, bool)>> {
    slots
        .into_iter()
        .map(|slot| slot.ok_or_else(|| Error::internal("an appended episode has no result")))
        .collect()
}

/// The session an append creates when its id is unknown; `None` when the
/// append may not create one, or its owner is not complete enough to.
pub(super) fn missing_session<'a>(append: &'a Append<'_>) -> Option<NewSession<'a>> {
    if !append.create {
        return None;
    }
    let (app, user) = append.owner.complete()?;
    Some(NewSession {
        id: append.session_id,
        app,
        user,
        metadata: "{}",
        now: append.now,
        max_sessions: append.max_sessions,
        request: None,
    })
}

/// The one write that differs between the backends.
/// An [`Append`] that owns what it names, so it can wait in a group
/// commit's queue (see `group.rs`).
pub(super) struct OwnedAppend {
    session_id: Id,
    owner: Owner,
    create: bool,
    episodes: Vec<NewEpisode>,
    now: DateTime<Utc>,
    max_sessions: i64,
    max_events: i64,
}

impl OwnedAppend {
    pub(super) fn of(append: &Append<'_>) -> Self {
        OwnedAppend {
            session_id: append.session_id.clone(),
            owner: append.owner.clone(),
            create: append.create,
            episodes: append.episodes.to_vec(),
            now: append.now,
            max_sessions: append.max_sessions,
            max_events: append.max_events,
        }
    }

    pub(super) fn append(&self) -> Append<'_> {
        Append {
            session_id: &self.session_id,
            owner: &self.owner,
            create: self.create,
            episodes: &self.episodes,
            now: self.now,
            max_sessions: self.max_sessions,
            max_events: self.max_events,
        }
    }
}

pub(super) trait AppendEpisodes {
    /// See [`SessionStore::append`].
    fn append_episodes(
        &self,
        tenant: &Tenant,
        append: &Append<'_>,
    ) -> impl Future<Output = Result<Appended>> + Send;
}

/// How a backend answers [`SessionStore::recent`]: Postgres reads
/// concurrent calls of a tenant together, SQLite each on its own
/// ([`recent_alone`]).
pub(super) trait RecentEpisodes {
    fn recent_episodes(
        &self,
        tenant: &Tenant,
        query: &RecentQuery,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;
}

/// The newest episodes of one [`RecentQuery`], by its own statement; by
/// [`RECENT_WHOLE`] when it came to an episode too large to send whole.
pub(super) async fn recent_alone<B: Backend>(
    store: &B,
    tenant: &Tenant,
    query: &RecentQuery,
) -> Result<Vec<Episode>> {
    match recent_read(store, tenant, query, false).await? {
        Some(found) => Ok(found),
        None => recent_whole(store, tenant, query).await,
    }
}

/// The episodes of a [`RecentQuery`] too large for its first statement,
/// by [`RECENT_WHOLE`].
pub(super) async fn recent_whole<B: Backend>(
    store: &B,
    tenant: &Tenant,
    query: &RecentQuery,
) -> Result<Vec<Episode>> {
    Ok(recent_read(store, tenant, query, true)
        .await?
        .unwrap_or_default())
}

/// A `Recent` read by [`RECENT`] or, `whole`, [`RECENT_WHOLE`]; none when
/// the first came to an episode too large to send whole.
async fn recent_read<B: Backend>(
    store: &B,
    tenant: &Tenant,
    query: &RecentQuery,
    whole: bool,
) -> Result<Option<Vec<Episode>>> {
    let level = recent_level(query.session_id.is_some(), query.agent.is_some());
    let (sql, bytes) = if whole {
        (&RECENT_WHOLE[level], RECENT_BYTES)
    } else {
        (&RECENT[level], recent_row_bytes(query.limit))
    };
    let types = type_names(&query.types);
    let mut conn = store.reader(tenant).await?;
    let mut read = Weighed::default();
    let params = params![
        tenant.as_str(),
        query.user.as_str(),
        query.session_id.as_ref().map_or("", |s| s.as_str()),
        query.agent.as_ref().map_or("", |a| a.as_str()),
        &types[..],
        query.limit,
        bytes,
    ];
    let cut = conn
        .weigh_into(sql, params, &mut read, sent_whole_row)
        .await?;
    Ok((!cut).then_some(read.items))
}

impl<B: Backend + AppendEpisodes + RecentEpisodes> SessionStore for B {
    async fn create_session(&self, tenant: &Tenant, session: &NewSession<'_>) -> Result<Creation> {
        for _ in 0..CREATE_ATTEMPTS {
            let mut tx = self.begin(tenant).await?;
            let stored = match &session.request {
                Some(request) => {
                    tx.first(
                        &SESSION_OF_REQUEST,
                        params![tenant.as_str(), request.id, session.id.as_str()],
                        |row| {
                            let repeated = row.int(SESSION_COLUMNS)? == 1;
                            let kept = match repeated {
                                true => row.bytes(SESSION_COLUMNS + 1)?,
                                false => Vec::new(),
                            };
                            Ok((session_row(row)?, repeated, kept))
                        },
                    )
                    .await?
                }
                None => session_in(&mut tx, tenant, session.id.as_str())
                    .await?
                    .map(|found| (found, false, Vec::new())),
            };
            match (stored, &session.request) {
                (Some((first, true, kept)), Some(request)) => {
                    return match kept[..] == request.fingerprint[..] {
                        true => Ok(Creation::Repeated(first)),
                        false => Err(request_id_reused(request.id)),
                    };
                }
                (Some((found, _, _)), _) => return Ok(Creation::Found(found)),
                (None, _) => {}
            }
            if let Some(created) = insert_session_in(&mut tx, tenant, session).await? {
                tx.commit().await?;
                return Ok(Creation::Created(created));
            }
            // Taken between the reads and the insert (the id, or the
            // request id by a concurrent repeat): read them again.
        }
        Err(session_changed(session.id.as_str()))
    }

    async fn get_session(&self, tenant: &Tenant, id: &Id) -> Result<Option<Session>> {
        let mut conn = self.reader(tenant).await?;
        session_in(&mut conn, tenant, id.as_str()).await
    }

    async fn list_sessions(
        &self,
        tenant: &Tenant,
        filter: &SessionFilter,
        before: Option<(DateTime<Utc>, &str)>,
        limit: i64,
    ) -> Result<Vec<Session>> {
        let sql = match (&filter.app, &filter.user) {
            (_, Some(_)) => &LIST_SESSIONS_BY_USER,
            (Some(_), None) => &LIST_SESSIONS_BY_APP,
            (None, None) => &LIST_SESSIONS,
        };
        let (time, id) = before.unwrap_or(NO_SESSION_BEFORE);
        let mut conn = self.reader(tenant).await?;
        conn.all_weighed(
            sql,
            params![
                tenant.as_str(),
                filter.app.as_ref().map(|a| a.as_str()),
                filter.user.as_ref().map(|u| u.as_str()),
                time,
                id,
                limit,
            ],
            session_row,
        )
        .await
    }

    async fn delete_session(&self, tenant: &Tenant, id: &Id, owner: &Owner) -> Result<Option<i64>> {
        // The episodes go with it (ON DELETE CASCADE), in this statement.
        let mut conn = self.writer(tenant).await?;
        let row = conn
            .row(
                &DELETE_SESSION,
                params![
                    tenant.as_str(),
                    id.as_str(),
                    owner.app.as_ref().map(|a| a.as_str()),
                    owner.user.as_ref().map(|u| u.as_str()),
                ],
            )
            .await?;
        row.map(|row| row.int(0)).transpose()
    }

    async fn end_session(
        &self,
        tenant: &Tenant,
        id: &Id,
        owner: &Owner,
        now: DateTime<Utc>,
        delete_episodes: bool,
    ) -> Result<Option<(Session, i64)>> {
        let mut tx = self.begin(tenant).await?;
        if <B::Tx as Run>::DIALECT == Dialect::Postgres {
            tx.exec(&LOCK_SESSION_TO_END, params![tenant.as_str(), id.as_str()])
                .await?;
        }
        let Some(row) = tx
            .row(
                &END_SESSION,
                params![
                    tenant.as_str(),
                    id.as_str(),
                    owner.app.as_ref().map(|a| a.as_str()),
                    owner.user.as_ref().map(|u| u.as_str()),
                    now,
                    delete_episodes,
                ],
            )
            .await?
        else {
            return Ok(None);
        };
        let session = session_row(&row)?;
        for sql in &END_WORKING_MEMORY {
            tx.exec(sql, params![tenant.as_str(), id.as_str()]).await?;
        }
        let deleted = if delete_episodes {
            tx.exec(&DELETE_EPISODES, params![tenant.as_str(), id.as_str()])
                .await? as i64
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
            let mut conn = self.reader(tenant).await?;
            return conn
                .count(&COUNT_IDLE, params![tenant.as_str(), before])
                .await;
        }
        if <B::Conn as Run>::DIALECT == Dialect::Sqlite {
            let mut conn = self.writer(tenant).await?;
            return Ok(conn
                .exec(&DELETE_IDLE, params![tenant.as_str(), before])
                .await? as i64);
        }
        let mut tx = self.begin(tenant).await?;
        let held = tx
            .all(&LOCK_IDLE_PG, params![tenant.as_str(), before], |row| {
                row.text(0)
            })
            .await?;
        let deleted = tx
            .exec(&DELETE_IDLE_PG, params![tenant.as_str(), before, &held[..]])
            .await?;
        tx.commit().await?;
        Ok(deleted as i64)
    }

    async fn session_stats(&self, tenant: &Tenant) -> Result<SessionStats> {
        let mut conn = self.reader(tenant).await?;
        let row = conn
            .row(&STATS, params![tenant.as_str()])
            .await?
            .ok_or_else(|| Error::internal("the session stats returned no row"))?;
        Ok(SessionStats {
            total_sessions: row.int(0)?,
            total_episodes: row.int(1)?,
            episodes_evicted: row.int(2)?,
            sessions_evicted: row.int(3)?,
        })
    }

    async fn append(&self, tenant: &Tenant, append: &Append<'_>) -> Result<Appended> {
        self.append_episodes(tenant, append).await
    }

    async fn list_episodes(
        &self,
        tenant: &Tenant,
        query: &EpisodeQuery<'_>,
    ) -> Result<Vec<Episode>> {
        let types = type_names(query.types);
        let mut conn = self.reader(tenant).await?;
        let mut read = Weighed::default();
        loop {
            let params = params![
                tenant.as_str(),
                query.session_id.as_str(),
                read.items
                    .last()
                    .map_or(query.after_seq, |e: &Episode| e.seq),
                &types[..],
                query.limit - read.items.len() as i64,
                SENT_WHOLE_BYTES,
            ];
            let cut = conn
                .weigh_into(&LIST_EPISODES, params, &mut read, sent_whole_row)
                .await?;
            if !cut || read.full {
                return Ok(read.items);
            }
        }
    }

    async fn get_episode(&self, tenant: &Tenant, id: &Id) -> Result<Option<Episode>> {
        let mut conn = self.reader(tenant).await?;
        conn.first(&EPISODE, params![tenant.as_str(), id.as_str()], episode_row)
            .await
    }

    async fn recent(&self, tenant: &Tenant, query: &RecentQuery) -> Result<Vec<Episode>> {
        self.recent_episodes(tenant, query).await
    }

    async fn latest_episodes(&self, tenant: &Tenant, limit: i64) -> Result<Vec<Episode>> {
        let mut conn = self.reader(tenant).await?;
        conn.all_weighed(&LATEST, params![tenant.as_str(), limit], episode_row)
            .await
    }

    async fn episodes_after(
        &self,
        tenant: &Tenant,
        filter: &TailFilter,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<Episode>> {
        let types = type_names(&filter.types);
        let mut conn = self.reader(tenant).await?;
        let mut read = Weighed::default();
        let narrowed = filter.session_id.is_some() || filter.user.is_some();
        loop {
            let from = read.items.last().map_or(after, |e: &Episode| e.cursor);
            let sql = match narrowed && up_to - from > PLANNED_PAST {
                true => &EPISODES_AFTER_PLANNED,
                false => &EPISODES_AFTER,
            };
            let params = params![
                tenant.as_str(),
                from,
                up_to,
                filter.session_id.as_ref().map(|s| s.as_str()),
                filter.user.as_ref().map(|u| u.as_str()),
                filter.app.as_ref().map(|a| a.as_str()),
                &types[..],
                limit - read.items.len() as i64,
                SENT_WHOLE_BYTES,
            ];
            let cut = conn
                .weigh_into(sql, params, &mut read, sent_whole_row)
                .await?;
            if !cut || read.full {
                return Ok(read.items);
            }
        }
    }
}
