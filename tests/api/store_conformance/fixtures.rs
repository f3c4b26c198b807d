//! What the session, consolidation and working-memory cases set up the
//! same way: names, a clock at the stores' precision, sessions and
//! episodes.

use chrono::{DateTime, Utc};
use engram::context::Tenant;
use engram::ports::Store;
use engram::sessions::ports::{Append, Appended, Creation, NewSession};
use engram::sessions::{
    Episode, EpisodeInput, EpisodeType, Id, Name, NewEpisode, Owner, RecentQuery, Session,
};

pub(crate) fn name(field: &str, text: &str) -> Name {
    Name::parse(field, text).expect("name")
}

pub(crate) fn id(text: &str) -> Id {
    Id::parse("id", text).expect("id")
}

/// Now, at the microsecond precision both stores keep.
pub(crate) fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).expect("now")
}

pub(crate) fn owner(app: &str, user: &str) -> Owner {
    Owner {
        app: Some(name("app", app)),
        user: Some(name("user", user)),
    }
}

/// A `Recent` read of `user`, widened to a session and an agent when
/// given.
pub(crate) fn recent(
    user: &str,
    session: Option<&str>,
    agent: Option<&str>,
    types: Vec<EpisodeType>,
    limit: i64,
) -> RecentQuery {
    RecentQuery {
        user: name("user", user),
        session_id: session.map(id),
        agent: agent.map(|a| name("agent", a)),
        types,
        limit,
    }
}

/// An episode of `session`; with an id a retry replays it.
pub(crate) fn episode(
    session: &Id,
    episode_id: Option<&str>,
    kind: Option<&str>,
    agent: Option<&str>,
    content: serde_json::Value,
) -> NewEpisode {
    NewEpisode::new(
        "episode",
        session,
        EpisodeInput {
            id: episode_id.map(|e| Id::parse("episode.id", e).expect("episode id")),
            agent: agent.map(|a| name("agent", a)),
            kind: kind.map(|k| EpisodeType::parse("type", k).expect("type")),
            content,
            metadata: serde_json::Map::new(),
            source_node: String::new(),
            timestamp: None,
        },
        1 << 20,
    )
    .expect("episode")
}

/// A tenant's session log, as the session service drives it.
pub(crate) struct Log<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) tenant: Tenant,
}

pub(crate) fn log<'a, S>(store: &'a S, tenant: &str) -> Log<'a, S> {
    Log {
        store,
        tenant: Tenant::new(tenant),
    }
}

impl<S: Store> Log<'_, S> {
    /// Creates `session` of `app` and `user`; whether it was new.
    pub(crate) async fn create(
        &self,
        session: &str,
        app: &str,
        user: &str,
        max_sessions: i64,
    ) -> (Session, bool) {
        let (session_id, app, user) = (id(session), name("app", app), name("user", user));
        let creation = self
            .store
            .create_session(
                &self.tenant,
                &NewSession {
                    id: &session_id,
                    app: &app,
                    user: &user,
                    metadata: r#"{"k":"v"}"#,
                    now: now(),
                    max_sessions,
                    request: None,
                },
            )
            .await
            .expect("create");
        match creation {
            Creation::Created(session) => (session, true),
            Creation::Found(session) => (session, false),
            Creation::Repeated(session) => panic!("no request id, yet repeated: {session:?}"),
        }
    }

    pub(crate) async fn append_as(
        &self,
        session: &str,
        owner: &Owner,
        episodes: &[NewEpisode],
        max_events: i64,
    ) -> Appended {
        self.store
            .append(
                &self.tenant,
                &Append {
                    session_id: &id(session),
                    owner,
                    episodes,
                    now: now(),
                    max_sessions: 0,
                    max_events,
                    create: true,
                },
            )
            .await
            .expect("append")
    }

    /// Appends as the session's owner (app `app`, user `alice`).
    pub(crate) async fn append(
        &self,
        session: &str,
        episodes: &[NewEpisode],
    ) -> Vec<(Episode, bool)> {
        match self
            .append_as(session, &owner("app", "alice"), episodes, 0)
            .await
        {
            Appended::Stored(done) => done,
            other => panic!("expected the append to be stored, got {other:?}"),
        }
    }
}
