//! The `DataService` adapter.

use tonic::{Request, Response, Status};

use super::context::caller_context;
use super::error::to_status;
use crate::data::{Data, DataStore, Forgetting};
use crate::error::Result;
use crate::memory::ScopeName;
use crate::proto;
use crate::proto::data_service_server::DataService;
use crate::sessions::Name;

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

#[tonic::async_trait]
impl<S: DataStore> DataService for DataApi<S> {
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
