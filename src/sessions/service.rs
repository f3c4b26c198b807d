//! The rules between a request and the store for sessions and episodes.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::conversation::{AGENT_RESPONSE, USER_MESSAGE, render_conversation};
use super::ports::{Append, Appended, Creation, EpisodeQuery, NewSession, SessionStore};
use super::types::{
    AppendTo, Episode, EpisodeInput, EpisodeType, Id, Name, NewEpisode, Owner, RecentQuery,
    Session, SessionFilter, SessionLimits, SessionStats, TailFilter, episode_not_found,
    owner_mismatch, session_ended, session_not_found,
};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result, TIME_RANGE};
use crate::memory::now_micros;
use crate::memory::ports::RequestStamp;
use crate::paging::{self, ListPage};
use crate::ports::{Feed, Feeds};

/// The most episodes one `AppendEpisodes` call may carry.
pub const MAX_BATCH: usize = 1000;
/// `Recent` and `BuildContext` without a limit.
pub const DEFAULT_RECENT: i64 = 20;
pub const MAX_RECENT: i64 = 1000;
/// How many episodes a tail reads from the store at a time.
pub const TAIL_BATCH: i64 = 500;

/// What to do when a session's id is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// `ALREADY_EXISTS`.
    Create,
    /// Return the existing session if its owner matches.
    GetOrCreate,
}

/// A session to create.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub app: Name,
    pub user: Name,
    /// `None`: a UUIDv7.
    pub id: Option<Id>,
    pub metadata: Map<String, Value>,
    /// The idempotency key: a repeat of the request is answered with the
    /// session the first one created.
    pub request_id: Option<String>,
}

impl CreateRequest {
    /// What the request asks for: its owner, the id it names (if any) and
    /// its `metadata`, encoded as received (a map, so in key order).
    fn fingerprint(&self, metadata: &str) -> [u8; 32] {
        crate::error::fingerprint(&[
            self.app.as_str(),
            self.user.as_str(),
            self.id.as_ref().map_or("", Id::as_str),
            metadata,
        ])
    }
}

/// Where a tail starts: its filter, the cursor after which episodes are
/// sent, and the settled horizon to follow.
#[derive(Debug)]
pub struct TailStart {
    pub filter: TailFilter,
    pub after: i64,
    pub horizon: tokio::sync::watch::Receiver<i64>,
}

/// Sessions and episodes over a store.
#[derive(Debug, Clone)]
pub struct Sessions<S> {
    store: S,
    limits: SessionLimits,
    /// Redacts episode content and metadata before storage, when set.
    redactor: Option<crate::redact::Redactor>,
}

impl<S: SessionStore + Feeds> Sessions<S> {
    pub fn new(store: S, limits: SessionLimits) -> Self {
        Sessions {
            store,
            limits,
            redactor: None,
        }
    }

    /// Redacts secrets in appended episodes (content and metadata).
    pub fn redacting(mut self, redactor: Option<crate::redact::Redactor>) -> Self {
        self.redactor = redactor;
        self
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    pub async fn create(
        &self,
        ctx: &CallerContext,
        mut request: CreateRequest,
        mode: CreateMode,
    ) -> Result<(Session, bool)> {
        let id = request.id.clone().unwrap_or_else(Id::generate);
        let metadata = Value::Object(std::mem::take(&mut request.metadata)).to_string();
        if metadata.len() > self.limits.max_episode_bytes {
            return Err(Error::invalid(
                Reason::ValueTooLarge,
                "metadata",
                format!(
                    "is {} bytes as JSON, over the limit of {} bytes",
                    metadata.len(),
                    self.limits.max_episode_bytes
                ),
            ));
        }
        let session = NewSession {
            id: &id,
            app: &request.app,
            user: &request.user,
            metadata: &metadata,
            now: now_micros(),
            max_sessions: self.limits.max_sessions,
            request: request.request_id.as_deref().map(|id| RequestStamp {
                id,
                fingerprint: request.fingerprint(&metadata),
            }),
        };
        let session = match self.store.create_session(&ctx.tenant, &session).await? {
            Creation::Created(session) | Creation::Repeated(session) => {
                return Ok((session, true));
            }
            Creation::Found(session) => session,
        };
        match mode {
            CreateMode::Create => Err(Error::AlreadyExists {
                reason: Reason::SessionExists,
                message: format!("session {:?} already exists", session.id),
            }),
            CreateMode::GetOrCreate
                if session.app == request.app.as_str() && session.user == request.user.as_str() =>
            {
                Ok((session, false))
            }
            CreateMode::GetOrCreate => Err(owner_mismatch(&session.id)),
        }
    }

    /// A session, as long as the owner given (if any) matches.
    pub async fn get(&self, ctx: &CallerContext, id: &Id, owner: &Owner) -> Result<Session> {
        let session = self
            .store
            .get_session(&ctx.tenant, id)
            .await?
            .ok_or_else(|| session_not_found(id.as_str()))?;
        if owner.admits(&session) {
            Ok(session)
        } else {
            Err(owner_mismatch(id.as_str()))
        }
    }

    /// Tells "no such session" from "not yours" after a conditional write
    /// matched nothing. A session the owner admits was made again after the
    /// write looked (a delete and a create raced it): there was none then.
    async fn missing(&self, ctx: &CallerContext, id: &Id, owner: &Owner) -> Error {
        match self.store.get_session(&ctx.tenant, id).await {
            Ok(Some(session)) if !owner.admits(&session) => owner_mismatch(id.as_str()),
            Ok(_) => session_not_found(id.as_str()),
            Err(err) => err,
        }
    }

    pub async fn list(
        &self,
        ctx: &CallerContext,
        filter: &SessionFilter,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Session>> {
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&[
            "sessions",
            filter.app.as_ref().map_or("", Name::as_str),
            filter.user.as_ref().map_or("", Name::as_str),
        ]);
        let before: Option<(i64, String)> = paging::decode_token(&query, page_token)?;
        let before = match before {
            Some((micros, id)) => Some((
                DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(|| {
                    Error::invalid(
                        Reason::InvalidPageToken,
                        "page_token",
                        "is not a token this server issued",
                    )
                })?,
                id,
            )),
            None => None,
        };
        let mut items = self
            .store
            .list_sessions(
                &ctx.tenant,
                filter,
                before.as_ref().map(|(time, id)| (*time, id.as_str())),
                limit + 1,
            )
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, (last.create_time.timestamp_micros(), &last.id))
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    /// Deletes a session with its episodes; returns how many episodes went.
    pub async fn delete(&self, ctx: &CallerContext, id: &Id, owner: &Owner) -> Result<i64> {
        match self.store.delete_session(&ctx.tenant, id, owner).await? {
            Some(episodes) => Ok(episodes),
            None => Err(self.missing(ctx, id, owner).await),
        }
    }

    pub async fn end(
        &self,
        ctx: &CallerContext,
        id: &Id,
        owner: &Owner,
        delete_episodes: bool,
    ) -> Result<(Session, i64)> {
        match self
            .store
            .end_session(&ctx.tenant, id, owner, now_micros(), delete_episodes)
            .await?
        {
            Some(ended) => Ok(ended),
            None => Err(self.missing(ctx, id, owner).await),
        }
    }

    pub async fn cleanup(
        &self,
        ctx: &CallerContext,
        max_age: Duration,
        dry_run: bool,
    ) -> Result<i64> {
        if max_age.is_zero() {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "max_age",
                "must be positive",
            ));
        }
        let max_age = chrono::Duration::from_std(max_age)
            .map_err(|_| Error::invalid(Reason::InvalidArgument, "max_age", "is too large"))?;
        // An age of up to 10,000 years reaches before the year 1, which no
        // kept time precedes ([`TIME_RANGE`]) and Postgres cannot compare
        // with (its first is 4713 BC): nothing is that old.
        let earliest = DateTime::<Utc>::from_timestamp(*TIME_RANGE.start(), 0)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let before = now_micros()
            .checked_sub_signed(max_age)
            .map_or(earliest, |before| before.max(earliest));
        self.store
            .cleanup_sessions(&ctx.tenant, before, dry_run)
            .await
    }

    pub async fn stats(&self, ctx: &CallerContext) -> Result<SessionStats> {
        self.store.session_stats(&ctx.tenant).await
    }

    /// Appends episodes to a session atomically. `field` names the request
    /// field holding them, for error paths (`episode`, `episodes`).
    pub async fn append(
        &self,
        ctx: &CallerContext,
        to: AppendTo<'_>,
        inputs: Vec<EpisodeInput>,
        field: &str,
        batch: bool,
    ) -> Result<Vec<(Episode, bool)>> {
        if inputs.is_empty() {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                field,
                "must hold at least one episode",
            ));
        }
        if inputs.len() > MAX_BATCH {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                field,
                format!(
                    "holds {} episodes, over the limit of {MAX_BATCH}",
                    inputs.len()
                ),
            ));
        }
        let AppendTo {
            session_id,
            owner,
            create,
        } = to;
        let mut seen = HashSet::new();
        let mut episodes = Vec::with_capacity(inputs.len());
        for (i, mut input) in inputs.into_iter().enumerate() {
            if let Some(redactor) = &self.redactor {
                input.content = redactor.json(&input.content);
                let metadata = std::mem::take(&mut input.metadata);
                if let Value::Object(metadata) = redactor.json(&Value::Object(metadata)) {
                    input.metadata = metadata;
                }
            }
            let path = if batch {
                format!("{field}[{i}]")
            } else {
                field.to_owned()
            };
            if let Some(id) = &input.id
                && !seen.insert(id.as_str().to_owned())
            {
                return Err(Error::invalid(
                    Reason::InvalidArgument,
                    format!("{path}.id"),
                    format!("{:?} appears twice in one batch", id.as_str()),
                ));
            }
            episodes.push(NewEpisode::new(
                &path,
                session_id,
                input,
                self.limits.max_episode_bytes,
            )?);
        }
        let append = Append {
            session_id,
            owner,
            create,
            episodes: &episodes,
            now: now_micros(),
            max_sessions: self.limits.max_sessions,
            max_events: self.limits.max_events_per_session,
        };
        match self.store.append(&ctx.tenant, &append).await? {
            Appended::Stored(episodes) => Ok(episodes),
            Appended::NoSession => Err(session_not_found(session_id.as_str())),
            Appended::Refused(session) if !owner.admits(&session) => {
                Err(owner_mismatch(&session.id))
            }
            Appended::Refused(session) => Err(session_ended(&session.id)),
            Appended::Conflict(id) => Err(Error::AlreadyExists {
                reason: Reason::EpisodeExists,
                message: format!(
                    "episode {id:?} already exists with different content; use a new id for a new episode"
                ),
            }),
        }
    }

    /// One episode by id, wherever it is in the caller's tenant.
    pub async fn get_episode(&self, ctx: &CallerContext, id: &Id) -> Result<Episode> {
        self.store
            .get_episode(&ctx.tenant, id)
            .await?
            .ok_or_else(|| episode_not_found(id.as_str()))
    }

    pub async fn list_episodes(
        &self,
        ctx: &CallerContext,
        session_id: &Id,
        types: &[EpisodeType],
        after_seq: i64,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Episode>> {
        if after_seq < 0 {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "after_seq",
                format!("must not be negative, got {after_seq}"),
            ));
        }
        let limit = paging::page_size(page_size)?;
        let type_list = types.iter().map(EpisodeType::as_str).collect::<Vec<_>>();
        let query = paging::query_digest(&[
            "episodes",
            session_id.as_str(),
            &type_list.join(","),
            &after_seq.to_string(),
        ]);
        let after: Option<i64> = paging::decode_token(&query, page_token)?;
        let mut items = self
            .store
            .list_episodes(
                &ctx.tenant,
                &EpisodeQuery {
                    session_id,
                    types,
                    after_seq: after.unwrap_or(after_seq),
                    limit: limit + 1,
                },
            )
            .await?;
        if items.is_empty() && after.is_none() {
            // An empty first page: say so if the session does not exist.
            self.get(ctx, session_id, &Owner::default()).await?;
        }
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, last.seq)
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    pub async fn recent(
        &self,
        ctx: &CallerContext,
        user: Name,
        session_id: Option<Id>,
        agent: Option<Name>,
        types: Vec<EpisodeType>,
        limit: i32,
    ) -> Result<Vec<Episode>> {
        let query = RecentQuery {
            user,
            session_id,
            agent,
            types,
            limit: paging::bounded("limit", limit, DEFAULT_RECENT, MAX_RECENT)?,
        };
        let mut newest = self.store.recent(&ctx.tenant, &query).await?;
        // The newest that fit one answer: big episodes make it fewer.
        newest.truncate(paging::fitting(&newest));
        Ok(newest)
    }

    /// The newest user and agent messages of a session as conversation
    /// text, oldest first.
    pub async fn build_context(
        &self,
        ctx: &CallerContext,
        session_id: Id,
        max_events: i32,
    ) -> Result<(String, i32)> {
        let limit = paging::bounded("max_events", max_events, DEFAULT_RECENT, MAX_RECENT)?;
        let session = self.get(ctx, &session_id, &Owner::default()).await?;
        let types = vec![
            EpisodeType::parse("types", USER_MESSAGE)?,
            EpisodeType::parse("types", AGENT_RESPONSE)?,
        ];
        let mut newest_first = self.newest_of(ctx, &session, types, limit).await?;
        // The newest messages that fit one answer.
        newest_first.truncate(paging::fitting(&newest_first));
        Ok(render_conversation(newest_first.iter().rev()))
    }

    /// The newest episodes of a session already read, newest first.
    pub async fn newest_of(
        &self,
        ctx: &CallerContext,
        session: &Session,
        types: Vec<EpisodeType>,
        limit: i64,
    ) -> Result<Vec<Episode>> {
        let query = RecentQuery {
            user: Name::parse("user", session.user.as_str())?,
            session_id: Some(Id::parse("session_id", session.id.as_str())?),
            agent: None,
            types,
            limit,
        };
        self.store.recent(&ctx.tenant, &query).await
    }

    /// The newest `limit` events, oldest first: of one session (with its app,
    /// for the `agent` field of the HTTP endpoint) or of the whole tenant.
    pub async fn latest_events(
        &self,
        ctx: &CallerContext,
        session_id: Option<Id>,
        limit: i64,
    ) -> Result<(Option<String>, Vec<Episode>)> {
        let (app, mut episodes) = match session_id {
            Some(id) => {
                let session = self.get(ctx, &id, &Owner::default()).await?;
                let episodes = self.newest_of(ctx, &session, Vec::new(), limit).await?;
                (Some(session.app), episodes)
            }
            None => (None, self.store.latest_episodes(&ctx.tenant, limit).await?),
        };
        episodes.reverse();
        Ok((app, episodes))
    }

    /// Opens a tail: after the given cursor, or at the current horizon.
    pub async fn tail(&self, filter: TailFilter, cursor: Option<i64>) -> Result<TailStart> {
        let horizon = self.store.horizon(Feed::Episodes).await?;
        let after = match cursor {
            Some(cursor) if cursor < 0 => {
                return Err(Error::invalid(
                    Reason::InvalidArgument,
                    "cursor",
                    format!("must not be negative, got {cursor}"),
                ));
            }
            Some(cursor) => cursor,
            None => *horizon.borrow(),
        };
        Ok(TailStart {
            filter,
            after,
            horizon,
        })
    }

    /// Episodes of a tail after `after`, up to the settled `up_to`.
    pub async fn tail_page(
        &self,
        ctx: &CallerContext,
        filter: &TailFilter,
        after: i64,
        up_to: i64,
    ) -> Result<Vec<Episode>> {
        self.store
            .episodes_after(&ctx.tenant, filter, after, up_to, TAIL_BATCH)
            .await
    }
}
