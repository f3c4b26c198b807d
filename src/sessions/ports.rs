//! What sessions and episodes need from persistence: the port `store/`
//! implements for each backend, and the types it speaks. The store reports
//! what it found (an existing session, a session that refused an append, an
//! episode id stored with other content); this module's service decides
//! what that means for the caller.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::types::{
    Episode, EpisodeType, Id, Name, NewEpisode, Owner, RecentQuery, Session, SessionFilter,
    SessionStats, TailFilter,
};
use crate::context::Tenant;
use crate::error::Result;
use crate::memory::ports::RequestStamp;

/// A session to create.
#[derive(Debug, Clone)]
pub struct NewSession<'a> {
    pub id: &'a Id,
    pub app: &'a Name,
    pub user: &'a Name,
    /// A JSON object, encoded.
    pub metadata: &'a str,
    pub now: DateTime<Utc>,
    /// The tenant's session limit (0: none); see [`NewSession::to_evict`].
    pub max_sessions: i64,
    /// The request's idempotency key and fingerprint, kept with the
    /// session it creates.
    pub request: Option<RequestStamp<'a>>,
}

/// What [`SessionStore::create_session`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Creation {
    /// Stored the new session.
    Created(Session),
    /// Found a session under the id, created by another request.
    Found(Session),
    /// Found the session an earlier request with the same `request_id`
    /// and fingerprint created. (One with another fingerprint is
    /// `REQUEST_ID_REUSED`.)
    Repeated(Session),
}

impl NewSession<'_> {
    /// How many sessions to evict, oldest first, before this one is stored
    /// when the tenant holds `count`: at the limit, the oldest 10% (at
    /// least one, and enough to get back under a lowered limit).
    pub fn to_evict(&self, count: i64) -> i64 {
        let max = self.max_sessions;
        if max <= 0 || count < max {
            0
        } else {
            (count - max + 1).max(max / 10).max(1)
        }
    }
}

/// Episodes to append to one session, atomically.
#[derive(Debug, Clone)]
pub struct Append<'a> {
    pub session_id: &'a Id,
    /// Checked against the session; when complete, creates a missing one
    /// (unless `create` is off).
    pub owner: &'a Owner,
    /// Whether a missing session is created (from a complete owner); off,
    /// a missing session is [`Appended::NoSession`].
    pub create: bool,
    pub episodes: &'a [NewEpisode],
    pub now: DateTime<Utc>,
    pub max_sessions: i64,
    /// Per-session limit (0: none): past it the oldest episodes go.
    pub max_events: i64,
}

/// What became of an append. Only `Stored` wrote anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Appended {
    /// Each episode as stored, flagged `true` when its id was stored
    /// before with the same fingerprint (a replay, nothing written for it).
    Stored(Vec<(Episode, bool)>),
    /// No such session, and the owner was not complete enough to create it.
    NoSession,
    /// The session is not the owner's, or has ended.
    Refused(Session),
    /// This episode id is stored with a different fingerprint.
    Conflict(String),
}

/// A page of one session's log.
#[derive(Debug, Clone)]
pub struct EpisodeQuery<'a> {
    pub session_id: &'a Id,
    pub types: &'a [EpisodeType],
    pub after_seq: i64,
    pub limit: i64,
}

impl NewEpisode {
    /// The episode an append stored, built from the request and the
    /// positions the store gave it (so the answer needs no read back).
    pub fn stored(&self, session: &Session, seq: i64, cursor: i64, now: DateTime<Utc>) -> Episode {
        Episode {
            id: self.id.as_str().to_owned(),
            session_id: session.id.clone(),
            seq,
            cursor,
            app: session.app.clone(),
            user: session.user.clone(),
            agent: self
                .agent
                .as_ref()
                .map_or_else(|| session.app.clone(), |a| a.as_str().to_owned()),
            kind: self.kind.as_str().to_owned(),
            content: self.content.clone(),
            metadata: self.metadata.clone(),
            source_node: self.source_node.clone(),
            timestamp: self.timestamp.unwrap_or(now),
            create_time: now,
        }
    }
}

/// The persistence of sessions and episodes. Every method is scoped to one
/// tenant.
pub trait SessionStore: Clone + Send + Sync + 'static {
    /// Stores a new session unless its request id created one already or
    /// its id is taken (see [`Creation`]).
    fn create_session(
        &self,
        tenant: &Tenant,
        session: &NewSession<'_>,
    ) -> impl Future<Output = Result<Creation>> + Send;

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
    /// clears its working memory, optionally deletes its episodes; `None`
    /// when no such session matched.
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

    /// Appends episodes atomically: ids already stored with the same
    /// fingerprint come back as they are (flag `true`), other ids get the
    /// next `seq` values and cursors. The session is created when missing
    /// and the owner is complete; the owner must admit it and it must be
    /// open.
    fn append(
        &self,
        tenant: &Tenant,
        append: &Append<'_>,
    ) -> impl Future<Output = Result<Appended>> + Send;

    /// A page of a session's log in `seq` order.
    fn list_episodes(
        &self,
        tenant: &Tenant,
        query: &EpisodeQuery<'_>,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;

    /// One episode by its id, in any session.
    fn get_episode(
        &self,
        tenant: &Tenant,
        id: &Id,
    ) -> impl Future<Output = Result<Option<Episode>>> + Send;

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

#[cfg(test)]
mod tests {
    use super::NewSession;
    use crate::sessions::{Id, Name};

    #[test]
    fn eviction_takes_the_oldest_tenth_at_the_limit() {
        let (id, app, user) = (
            Id::generate(),
            Name::parse("app", "a").expect("name"),
            Name::parse("user", "u").expect("name"),
        );
        let at = |max_sessions| NewSession {
            id: &id,
            app: &app,
            user: &user,
            metadata: "{}",
            now: chrono::Utc::now(),
            max_sessions,
            request: None,
        };
        assert_eq!(at(0).to_evict(5), 0);
        assert_eq!(at(100).to_evict(99), 0);
        assert_eq!(at(100).to_evict(100), 10);
        assert_eq!(at(5).to_evict(5), 1);
        // Over the limit (it was lowered): back under it in one go.
        assert_eq!(at(100).to_evict(150), 51);
    }
}
