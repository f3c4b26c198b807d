//! The storage interface of sessions and episodes, shared by both backends.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::context::Tenant;
use crate::error::{Error, Reason, Result};
use crate::sessions::{
    Episode, EpisodeType, Id, Name, NewEpisode, Owner, RecentQuery, Session, SessionFilter,
    SessionStats, TailFilter,
};

/// A session to create.
#[derive(Debug, Clone)]
pub struct NewSession<'a> {
    pub id: &'a Id,
    pub app: &'a Name,
    pub user: &'a Name,
    /// A JSON object, encoded.
    pub metadata: &'a str,
    pub now: DateTime<Utc>,
    /// The tenant's session limit (0: none). Reaching it evicts the oldest
    /// 10% (at least one) before the new session is stored.
    pub max_sessions: i64,
}

/// What to do when the id is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// `ALREADY_EXISTS`.
    Create,
    /// Return the existing session if its owner matches.
    GetOrCreate,
}

/// Episodes to append to one session, atomically.
#[derive(Debug, Clone)]
pub struct Append<'a> {
    pub session_id: &'a Id,
    /// Checked against the session; when complete, creates a missing one.
    pub owner: &'a Owner,
    pub episodes: &'a [NewEpisode],
    pub now: DateTime<Utc>,
    pub max_sessions: i64,
    /// Per-session limit (0: none): past it the oldest episodes go.
    pub max_events: i64,
}

/// A page of one session's log.
#[derive(Debug, Clone)]
pub struct EpisodeQuery<'a> {
    pub session_id: &'a Id,
    pub types: &'a [EpisodeType],
    pub after_seq: i64,
    pub limit: i64,
}

/// The storage of sessions and episodes. Every method is scoped to one
/// tenant.
pub trait SessionStore: Clone + Send + Sync + 'static {
    /// Creates a session, or (with `GetOrCreate`) returns the existing one
    /// when its owner matches. The flag says whether it was created.
    fn create_session(
        &self,
        tenant: &Tenant,
        session: &NewSession<'_>,
        mode: CreateMode,
    ) -> impl Future<Output = Result<(Session, bool)>> + Send;

    fn get_session(
        &self,
        tenant: &Tenant,
        id: &Id,
    ) -> impl Future<Output = Result<Option<Session>>> + Send;

    /// Sessions newest first (by creation, then id), before `before`.
    fn list_sessions(
        &self,
        tenant: &Tenant,
        filter: &SessionFilter,
        before: Option<(DateTime<Utc>, &str)>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Session>>> + Send;

    /// Deletes a session owned as `owner` says, with its episodes; returns
    /// how many episodes went, or `None` when no such session matched.
    fn delete_session(
        &self,
        tenant: &Tenant,
        id: &Id,
        owner: &Owner,
    ) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Ends a session owned as `owner` says (keeping the first end time),
    /// optionally deleting its episodes; `None` when no such session matched.
    fn end_session(
        &self,
        tenant: &Tenant,
        id: &Id,
        owner: &Owner,
        now: DateTime<Utc>,
        delete_episodes: bool,
    ) -> impl Future<Output = Result<Option<(Session, i64)>>> + Send;

    /// Deletes (or on a dry run counts) the sessions idle since before `before`.
    fn cleanup_sessions(
        &self,
        tenant: &Tenant,
        before: DateTime<Utc>,
        dry_run: bool,
    ) -> impl Future<Output = Result<i64>> + Send;

    fn session_stats(&self, tenant: &Tenant) -> impl Future<Output = Result<SessionStats>> + Send;

    /// Appends episodes in one transaction: ids already stored with the same
    /// fingerprint come back as they are (flag `true`), other ids get the
    /// next `seq` values and cursors. The session is created when missing
    /// and the owner is complete.
    fn append(
        &self,
        tenant: &Tenant,
        append: &Append<'_>,
    ) -> impl Future<Output = Result<Vec<(Episode, bool)>>> + Send;

    /// A page of a session's log in `seq` order.
    fn list_episodes(
        &self,
        tenant: &Tenant,
        query: &EpisodeQuery<'_>,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;

    /// A user's newest episodes, newest first.
    fn recent(
        &self,
        tenant: &Tenant,
        query: &RecentQuery,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;

    /// The tenant's newest episodes by cursor, newest first.
    fn latest_episodes(
        &self,
        tenant: &Tenant,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;

    /// Episodes with `after < cursor <= up_to` that pass the filter, in
    /// cursor order.
    fn episodes_after(
        &self,
        tenant: &Tenant,
        filter: &TailFilter,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;
}

/// Resolves an existing session for a create call: a plain create is
/// refused, a get-or-create returns it when the owner matches.
pub(super) fn existing_session(
    existing: Session,
    session: &NewSession<'_>,
    mode: CreateMode,
) -> Result<(Session, bool)> {
    match mode {
        CreateMode::Create => Err(Error::AlreadyExists {
            reason: Reason::SessionExists,
            message: format!("session {:?} already exists", existing.id),
        }),
        CreateMode::GetOrCreate
            if existing.app == session.app.as_str() && existing.user == session.user.as_str() =>
        {
            Ok((existing, false))
        }
        CreateMode::GetOrCreate => Err(crate::sessions::owner_mismatch(&existing.id)),
    }
}

/// How many sessions to evict when a tenant holding `count` of them is at
/// its limit: the oldest 10%, at least one.
pub(super) fn sessions_to_evict(count: i64, max_sessions: i64) -> i64 {
    if max_sessions <= 0 || count < max_sessions {
        0
    } else {
        (count - max_sessions + 1).max(max_sessions / 10).max(1)
    }
}

/// Checks an episode id found already stored against the one appended.
pub(super) fn check_episode_replay(
    stored: Episode,
    stored_fingerprint: &[u8],
    new: &NewEpisode,
) -> Result<(Episode, bool)> {
    if stored_fingerprint == new.fingerprint {
        Ok((stored, true))
    } else {
        Err(Error::AlreadyExists {
            reason: Reason::EpisodeExists,
            message: format!(
                "episode {:?} already exists with different content; use a new id for a new episode",
                new.id.as_str()
            ),
        })
    }
}

/// Checks the session an append goes to: its owner, and that it is open.
pub(super) fn check_append_target(session: &Session, owner: &Owner) -> Result<()> {
    if !owner.admits(session) {
        return Err(crate::sessions::owner_mismatch(&session.id));
    }
    if session.end_time.is_some() {
        return Err(crate::sessions::session_ended(&session.id));
    }
    Ok(())
}

/// A JSON object read back from the store.
pub(super) fn json_object(text: String) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(&text).map_err(Error::internal)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err(Error::internal("stored metadata is not a JSON object")),
    }
}

/// The types filter as JSON text (SQLite) — an empty list matches all.
pub(super) fn types_json(types: &[EpisodeType]) -> String {
    serde_json::Value::Array(
        types
            .iter()
            .map(|t| serde_json::Value::String(t.as_str().to_owned()))
            .collect(),
    )
    .to_string()
}

pub(super) fn types_vec(types: &[EpisodeType]) -> Vec<String> {
    types.iter().map(|t| t.as_str().to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::sessions_to_evict;

    #[test]
    fn eviction_takes_the_oldest_tenth_at_the_limit() {
        assert_eq!(sessions_to_evict(5, 0), 0);
        assert_eq!(sessions_to_evict(99, 100), 0);
        assert_eq!(sessions_to_evict(100, 100), 10);
        assert_eq!(sessions_to_evict(5, 5), 1);
        // Over the limit (it was lowered): back under it in one go.
        assert_eq!(sessions_to_evict(150, 100), 51);
    }
}
