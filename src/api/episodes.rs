//! The `EpisodeService` adapter, and `TailEpisodes` as a feed of episodes
//! by cursor.

use tonic::{Request, Response, Status};

use super::context::caller_context;
use super::convert::{episode_to_proto, json_at, object_from_proto, optional_timestamp};
use super::error::to_status;
use super::feed::{self, Feed, FeedOptions, FeedStream};
use super::sessions::{owner, session_id};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::paging;
use crate::ports::Store;
use crate::proto;
use crate::proto::episode_service_server::EpisodeService;
use crate::sessions::{
    AppendTo, Episode, EpisodeInput, EpisodeType, Id, Name, Sessions, TAIL_BATCH, TailFilter,
};

pub struct EpisodeApi<S> {
    sessions: Sessions<S>,
    /// How tails are bounded and ended.
    feed: FeedOptions,
}

impl<S: Store> EpisodeApi<S> {
    pub fn new(sessions: Sessions<S>, feed: FeedOptions) -> Self {
        EpisodeApi { sessions, feed }
    }
}

/// The episodes a tail follows.
pub struct Tail<S> {
    sessions: Sessions<S>,
    ctx: CallerContext,
    filter: TailFilter,
}

impl<S: Store> Feed for Tail<S> {
    type Item = Episode;
    type Message = proto::TailEpisodesResponse;
    const POSITION: &'static str = "cursor";
    const BATCH: i64 = TAIL_BATCH;

    fn position(episode: &Episode) -> i64 {
        episode.cursor
    }

    async fn page(&self, after: i64, up_to: i64) -> Result<Vec<Episode>> {
        self.sessions
            .tail_page(&self.ctx, &self.filter, after, up_to)
            .await
    }

    fn message(episode: Episode) -> proto::TailEpisodesResponse {
        proto::TailEpisodesResponse {
            episode: Some(episode_to_proto(episode)),
        }
    }
}

pub fn types(field: &str, types: Vec<String>) -> Result<Vec<EpisodeType>> {
    types
        .into_iter()
        .enumerate()
        .map(|(i, t)| EpisodeType::parse(&format!("{field}[{i}]"), t))
        .collect()
}

fn episode_input(field: &str, episode: proto::NewEpisode) -> Result<EpisodeInput> {
    let content = episode.content.ok_or_else(|| {
        Error::invalid(
            Reason::InvalidValue,
            format!("{field}.content"),
            "is required (any JSON, null included)",
        )
    })?;
    Ok(EpisodeInput {
        id: Id::parse_optional(&format!("{field}.id"), episode.id)?,
        agent: Name::parse_optional(&format!("{field}.agent"), episode.agent)?,
        kind: if episode.r#type.is_empty() {
            None
        } else {
            Some(EpisodeType::parse(
                &format!("{field}.type"),
                episode.r#type,
            )?)
        },
        content: json_at(&format!("{field}.content"), content)?,
        metadata: object_from_proto(&format!("{field}.metadata"), episode.metadata)?,
        source_node: episode.source_node,
        timestamp: optional_timestamp(&format!("{field}.timestamp"), episode.timestamp)?,
    })
}

#[tonic::async_trait]
impl<S: Store> EpisodeService for EpisodeApi<S> {
    async fn append_episode(
        &self,
        request: Request<proto::AppendEpisodeRequest>,
    ) -> Result<Response<proto::AppendEpisodeResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            let episode = req
                .episode
                .ok_or_else(|| Error::invalid(Reason::InvalidArgument, "episode", "is required"))?;
            Ok::<_, Error>((
                session_id(req.session_id)?,
                owner(req.app, req.user)?,
                episode_input("episode", episode)?,
            ))
        })();
        let (id, owner, input) = parsed.map_err(to_status)?;
        let to = AppendTo {
            session_id: &id,
            owner: &owner,
            create: !req.require_session,
        };
        let mut appended = self
            .sessions
            .append(&ctx, to, vec![input], "episode", false)
            .await
            .map_err(to_status)?;
        let (episode, replayed) = appended
            .pop()
            .ok_or_else(|| to_status(Error::internal("an append returned no episode")))?;
        Ok(Response::new(proto::AppendEpisodeResponse {
            episode: Some(episode_to_proto(episode)),
            replayed,
        }))
    }

    async fn append_episodes(
        &self,
        request: Request<proto::AppendEpisodesRequest>,
    ) -> Result<Response<proto::AppendEpisodesResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            let inputs = req
                .episodes
                .into_iter()
                .enumerate()
                .map(|(i, e)| episode_input(&format!("episodes[{i}]"), e))
                .collect::<Result<Vec<_>>>()?;
            Ok::<_, Error>((
                session_id(req.session_id)?,
                owner(req.app, req.user)?,
                inputs,
            ))
        })();
        let (id, owner, inputs) = parsed.map_err(to_status)?;
        let to = AppendTo {
            session_id: &id,
            owner: &owner,
            create: !req.require_session,
        };
        let appended = self
            .sessions
            .append(&ctx, to, inputs, "episodes", true)
            .await
            .map_err(to_status)?;
        // The answer must fit one message however large the batch (its
        // limit is several messages'): past a page's bytes the episodes
        // come back without what the request already holds.
        let whole = appended
            .iter()
            .map(|(episode, _)| paging::Weigh::weight(episode))
            .sum::<usize>()
            <= paging::PAGE_BYTES;
        Ok(Response::new(proto::AppendEpisodesResponse {
            episodes: appended
                .into_iter()
                .map(|(episode, _)| {
                    let mut episode = episode_to_proto(episode);
                    if !whole {
                        episode.content = None;
                        episode.metadata = None;
                    }
                    episode
                })
                .collect(),
        }))
    }

    async fn list_episodes(
        &self,
        request: Request<proto::ListEpisodesRequest>,
    ) -> Result<Response<proto::ListEpisodesResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let (id, types) = session_id(req.session_id)
            .and_then(|id| Ok((id, types("types", req.types)?)))
            .map_err(to_status)?;
        let page = self
            .sessions
            .list_episodes(
                &ctx,
                &id,
                &types,
                req.after_seq,
                req.page_size,
                &req.page_token,
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ListEpisodesResponse {
            episodes: page.items.into_iter().map(episode_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn get_episode(
        &self,
        request: Request<proto::GetEpisodeRequest>,
    ) -> Result<Response<proto::GetEpisodeResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let id = Id::parse("id", request.into_inner().id).map_err(to_status)?;
        let episode = self
            .sessions
            .get_episode(&ctx, &id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetEpisodeResponse {
            episode: Some(episode_to_proto(episode)),
        }))
    }

    async fn recent(
        &self,
        request: Request<proto::RecentRequest>,
    ) -> Result<Response<proto::RecentResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>((
                Name::parse("user", req.user)?,
                Id::parse_optional("session_id", req.session_id)?,
                Name::parse_optional("agent", req.agent)?,
                types("types", req.types)?,
            ))
        })();
        let (user, session, agent, types) = parsed.map_err(to_status)?;
        let episodes = self
            .sessions
            .recent(&ctx, user, session, agent, types, req.limit)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::RecentResponse {
            episodes: episodes.into_iter().map(episode_to_proto).collect(),
        }))
    }

    type TailEpisodesStream = FeedStream<Tail<S>>;

    async fn tail_episodes(
        &self,
        request: Request<proto::TailEpisodesRequest>,
    ) -> Result<Response<Self::TailEpisodesStream>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>(TailFilter {
                session_id: Id::parse_optional("session_id", req.session_id)?,
                user: Name::parse_optional("user", req.user)?,
                app: Name::parse_optional("app", req.app)?,
                types: types("types", req.types)?,
            })
        })();
        let filter = parsed.map_err(to_status)?;
        let start = self
            .sessions
            .tail(filter, req.cursor)
            .await
            .map_err(to_status)?;
        let tail = Tail {
            sessions: self.sessions.clone(),
            ctx,
            filter: start.filter,
        };
        Ok(Response::new(feed::spawn(
            tail,
            start.after,
            start.horizon,
            self.feed.clone(),
        )))
    }

    async fn build_context(
        &self,
        request: Request<proto::BuildContextRequest>,
    ) -> Result<Response<proto::BuildContextResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let id = session_id(req.session_id).map_err(to_status)?;
        let (context, events_used) = self
            .sessions
            .build_context(&ctx, id, req.max_events)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::BuildContextResponse {
            context,
            events_used,
        }))
    }
}
