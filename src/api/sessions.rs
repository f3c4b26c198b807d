//! The `SessionService` adapter: turns requests into domain types, calls
//! `Sessions`, and turns the results back into messages.

use tonic::{Request, Response, Status};

use super::context::caller_context;
use super::convert::{duration_from_proto, object_from_proto, request_id, session_to_proto};
use super::error::to_status;
use crate::error::{Error, Reason, Result};
use crate::ports::Store;
use crate::proto;
use crate::proto::session_service_server::SessionService;
use crate::sessions::CreateMode;
use crate::sessions::{CreateRequest, Id, Name, Owner, SessionFilter, Sessions};

pub struct SessionApi<S> {
    sessions: Sessions<S>,
}

impl<S: Store> SessionApi<S> {
    pub fn new(sessions: Sessions<S>) -> Self {
        SessionApi { sessions }
    }
}

/// The optional `app` and `user` next to a session id.
pub fn owner(app: String, user: String) -> Result<Owner> {
    Ok(Owner {
        app: Name::parse_optional("app", app)?,
        user: Name::parse_optional("user", user)?,
    })
}

pub fn session_id(id: String) -> Result<Id> {
    Id::parse("session_id", id)
}

/// A session id with the owner the request claims for it.
fn target(id: String, app: String, user: String) -> Result<(Id, Owner)> {
    Ok((session_id(id)?, owner(app, user)?))
}

fn create_request(
    app: String,
    user: String,
    id: String,
    metadata: Option<prost_types::Struct>,
    request: String,
) -> Result<CreateRequest> {
    Ok(CreateRequest {
        app: Name::parse("app", app)?,
        user: Name::parse("user", user)?,
        id: Id::parse_optional("session_id", id)?,
        metadata: object_from_proto("metadata", metadata)?,
        request_id: request_id(request)?,
    })
}

#[tonic::async_trait]
impl<S: Store> SessionService for SessionApi<S> {
    async fn create_session(
        &self,
        request: Request<proto::CreateSessionRequest>,
    ) -> Result<Response<proto::CreateSessionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let create = create_request(
            req.app,
            req.user,
            req.session_id,
            req.metadata,
            req.request_id,
        )
        .map_err(to_status)?;
        let (session, _) = self
            .sessions
            .create(&ctx, create, CreateMode::Create)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::CreateSessionResponse {
            session: Some(session_to_proto(session)),
        }))
    }

    async fn get_or_create_session(
        &self,
        request: Request<proto::GetOrCreateSessionRequest>,
    ) -> Result<Response<proto::GetOrCreateSessionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let create = create_request(
            req.app,
            req.user,
            req.session_id,
            req.metadata,
            req.request_id,
        )
        .map_err(to_status)?;
        let (session, created) = self
            .sessions
            .create(&ctx, create, CreateMode::GetOrCreate)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetOrCreateSessionResponse {
            session: Some(session_to_proto(session)),
            created,
        }))
    }

    async fn get_session(
        &self,
        request: Request<proto::GetSessionRequest>,
    ) -> Result<Response<proto::GetSessionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let (id, owner) = target(req.session_id, req.app, req.user).map_err(to_status)?;
        let session = self
            .sessions
            .get(&ctx, &id, &owner)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetSessionResponse {
            session: Some(session_to_proto(session)),
        }))
    }

    async fn list_sessions(
        &self,
        request: Request<proto::ListSessionsRequest>,
    ) -> Result<Response<proto::ListSessionsResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let filter = owner(req.app, req.user)
            .map(|owner| SessionFilter {
                app: owner.app,
                user: owner.user,
            })
            .map_err(to_status)?;
        let page = self
            .sessions
            .list(&ctx, &filter, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ListSessionsResponse {
            sessions: page.items.into_iter().map(session_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn delete_session(
        &self,
        request: Request<proto::DeleteSessionRequest>,
    ) -> Result<Response<proto::DeleteSessionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let (id, owner) = target(req.session_id, req.app, req.user).map_err(to_status)?;
        let episodes_deleted = self
            .sessions
            .delete(&ctx, &id, &owner)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::DeleteSessionResponse {
            episodes_deleted,
        }))
    }

    async fn end_session(
        &self,
        request: Request<proto::EndSessionRequest>,
    ) -> Result<Response<proto::EndSessionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let (id, owner) = target(req.session_id, req.app, req.user).map_err(to_status)?;
        let (session, episodes_deleted) = self
            .sessions
            .end(&ctx, &id, &owner, req.delete_episodes)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::EndSessionResponse {
            session: Some(session_to_proto(session)),
            episodes_deleted,
        }))
    }

    async fn cleanup_sessions(
        &self,
        request: Request<proto::CleanupSessionsRequest>,
    ) -> Result<Response<proto::CleanupSessionsResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let max_age = req
            .max_age
            .ok_or_else(|| Error::invalid(Reason::InvalidArgument, "max_age", "is required"))
            .and_then(|d| duration_from_proto("max_age", &d))
            .map_err(to_status)?;
        let sessions_deleted = self
            .sessions
            .cleanup(&ctx, max_age, req.dry_run)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::CleanupSessionsResponse {
            sessions_deleted,
        }))
    }

    async fn get_stats(
        &self,
        request: Request<proto::GetStatsRequest>,
    ) -> Result<Response<proto::GetStatsResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let stats = self.sessions.stats(&ctx).await.map_err(to_status)?;
        Ok(Response::new(proto::GetStatsResponse {
            total_sessions: stats.total_sessions,
            total_episodes: stats.total_episodes,
            avg_episodes_per_session: stats.avg_episodes_per_session(),
            sessions_evicted: stats.sessions_evicted,
            episodes_evicted: stats.episodes_evicted,
        }))
    }
}
