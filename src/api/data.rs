//! The `DataService` adapter.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::context::caller_context;
use super::convert::scope_type_from_proto;
use super::error::to_status;
use crate::data::{Data, DataStore, Forgetting, Selection};
use crate::error::{Error, Reason, Result};
use crate::memory::{Scope, ScopeName};
use crate::proto;
use crate::proto::data_service_server::DataService;
use crate::sessions::{Id, Name};

type ExportStream = Pin<Box<dyn Stream<Item = Result<proto::ExportResponse, Status>> + Send>>;

pub struct DataApi<S> {
    data: Data<S>,
}

impl<S: DataStore> DataApi<S> {
    pub fn new(data: Data<S>) -> Self {
        DataApi { data }
    }
}

fn forgetting(req: proto::ForgetUserRequest) -> Result<Forgetting> {
    let execution_ids = req
        .execution_ids
        .into_iter()
        .enumerate()
        .map(|(n, id)| {
            ScopeName::parse(&format!("execution_ids[{n}]"), id).map(|id| id.as_str().to_owned())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Forgetting {
        app: Name::parse("app", req.app)?,
        user: Name::parse("user", req.user)?,
        execution_ids,
        dry_run: req.dry_run,
    })
}

/// The one selection a request may make; none is the whole tenant.
fn selection(req: proto::ExportRequest) -> Result<Selection> {
    let scope_type = scope_type_from_proto("scope_type", req.scope_type)?;
    let chosen = [
        scope_type.is_some() || !req.scope.is_empty(),
        !req.session_id.is_empty(),
        !req.app.is_empty() || !req.user.is_empty(),
    ];
    if chosen.iter().filter(|c| **c).count() > 1 {
        return Err(Error::invalid(
            Reason::InvalidArgument,
            "scope",
            "choose at most one of a scope, a session_id, or an app and user",
        ));
    }
    if chosen[0] {
        let scope_type = scope_type.ok_or_else(|| {
            Error::invalid(
                Reason::InvalidArgument,
                "scope_type",
                "is required with scope",
            )
        })?;
        return Ok(Selection::Scope(Scope {
            scope_type,
            name: ScopeName::parse("scope", req.scope)?,
        }));
    }
    if chosen[1] {
        return Ok(Selection::Session(Id::parse("session_id", req.session_id)?));
    }
    if chosen[2] {
        return Ok(Selection::User {
            app: Name::parse("app", req.app)?,
            user: Name::parse("user", req.user)?,
        });
    }
    Ok(Selection::Tenant)
}

#[tonic::async_trait]
impl<S: DataStore> DataService for DataApi<S> {
    type ExportStream = ExportStream;

    async fn export(
        &self,
        request: Request<proto::ExportRequest>,
    ) -> Result<Response<Self::ExportStream>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let selection = selection(request.into_inner()).map_err(to_status)?;
        let stream = self
            .data
            .export(&ctx, selection, chrono::Utc::now())
            .map(|lines| {
                lines
                    .map(|lines| proto::ExportResponse { lines })
                    .map_err(to_status)
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn import(
        &self,
        request: Request<Streaming<proto::ImportRequest>>,
    ) -> Result<Response<proto::ImportResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let lines = request.into_inner().map(|message| {
            message.map(|m| m.lines).map_err(|status| {
                Error::invalid(
                    Reason::ImportMalformed,
                    "lines",
                    format!("the stream broke before its end: {}", status.message()),
                )
            })
        });
        let counts = self
            .data
            .import(&ctx, lines, chrono::Utc::now())
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ImportResponse {
            imported: counts.imported.into_iter().collect(),
            unchanged: counts.unchanged.into_iter().collect(),
            lines: counts.lines,
        }))
    }

    async fn forget_user(
        &self,
        request: Request<proto::ForgetUserRequest>,
    ) -> Result<Response<proto::ForgetUserResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let forget = forgetting(request.into_inner()).map_err(to_status)?;
        let dry_run = forget.dry_run;
        let (counts, audit_key) = self
            .data
            .forget_user(&ctx, forget)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ForgetUserResponse {
            sessions: counts.sessions,
            episodes: counts.episodes,
            facts: counts.facts,
            working_items: counts.working_items,
            execution_scopes: counts.execution_scopes,
            memory_versions: counts.memory_versions,
            dry_run,
            audit_key: audit_key.unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn an_export_chooses_one_thing() {
        let two = selection(proto::ExportRequest {
            session_id: "s1".into(),
            app: "bot".into(),
            user: "alice".into(),
            ..Default::default()
        });
        assert!(matches!(two, Err(Error::InvalidArgument { field, .. }) if field == "scope"));
        let no_type = selection(proto::ExportRequest {
            scope: "team".into(),
            ..Default::default()
        });
        assert!(
            matches!(no_type, Err(Error::InvalidArgument { field, .. }) if field == "scope_type")
        );
        let half_user = selection(proto::ExportRequest {
            app: "bot".into(),
            ..Default::default()
        });
        assert!(matches!(half_user, Err(Error::InvalidArgument { field, .. }) if field == "user"));
        assert_eq!(
            selection(proto::ExportRequest::default()).expect("tenant"),
            Selection::Tenant
        );
    }

    #[test]
    fn every_field_is_checked() {
        let bad = forgetting(proto::ForgetUserRequest {
            app: "bot".into(),
            user: String::new(),
            ..Default::default()
        });
        assert!(matches!(bad, Err(Error::InvalidArgument { field, .. }) if field == "user"));
        let bad = forgetting(proto::ForgetUserRequest {
            app: "bot".into(),
            user: "alice".into(),
            execution_ids: vec!["run-1".into(), "no spaces".into()],
            dry_run: true,
        });
        assert!(
            matches!(bad, Err(Error::InvalidArgument { field, .. }) if field == "execution_ids[1]")
        );
    }
}
