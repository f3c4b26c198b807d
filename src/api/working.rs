//! The `WorkingMemoryService` adapter.

use tonic::{Request, Response, Status};

use super::consolidation::fact_to_proto;
use super::context::caller_context;
use super::convert::{
    episode_to_proto, json_at, json_to_proto, object_to_proto, request_id, timestamp,
};
use super::error::to_status;
use super::sessions::{owner, session_id};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::ports::Store;
use crate::proto;
use crate::proto::working_memory_service_server::WorkingMemoryService;
use crate::search::Query;
use crate::sessions::{Name, Session};
use crate::working::{CachedFile, Task, TaskChange, TaskStatus, WorkingMemory, render, tools};

pub struct WorkingMemoryApi<S> {
    working: WorkingMemory<S>,
}

impl<S: Store> WorkingMemoryApi<S> {
    pub fn new(working: WorkingMemory<S>) -> Self {
        WorkingMemoryApi { working }
    }

    /// The session named by a request's `session_id`, `app` and `user`.
    async fn session(
        &self,
        ctx: &CallerContext,
        (id, app, user): (String, String, String),
        open: bool,
    ) -> Result<Session> {
        let id = session_id(id)?;
        let owner = owner(app, user)?;
        self.working.session(ctx, &id, &owner, open).await
    }

    /// The snapshot GetSnapshot returns and RenderMemoryBlock renders.
    async fn snapshot(
        &self,
        ctx: &CallerContext,
        at: (String, String, String),
        (max_facts, max_events): (i32, i32),
        query: &str,
    ) -> Result<crate::working::Snapshot> {
        let query = (!query.is_empty())
            .then(|| Query::parse("query", query))
            .transpose()?;
        let session = self.session(ctx, at, false).await?;
        self.working
            .snapshot(ctx, &session, max_facts, max_events, query.as_ref())
            .await
    }
}

fn status_to_proto(status: TaskStatus) -> i32 {
    match status {
        TaskStatus::Pending => proto::TaskStatus::Pending as i32,
        TaskStatus::InProgress => proto::TaskStatus::InProgress as i32,
        TaskStatus::Completed => proto::TaskStatus::Completed as i32,
        TaskStatus::Blocked => proto::TaskStatus::Blocked as i32,
    }
}

fn status_from_proto(n: i32) -> Result<Option<TaskStatus>> {
    match proto::TaskStatus::try_from(n) {
        Ok(proto::TaskStatus::Unspecified) => Ok(None),
        Ok(proto::TaskStatus::Pending) => Ok(Some(TaskStatus::Pending)),
        Ok(proto::TaskStatus::InProgress) => Ok(Some(TaskStatus::InProgress)),
        Ok(proto::TaskStatus::Completed) => Ok(Some(TaskStatus::Completed)),
        Ok(proto::TaskStatus::Blocked) => Ok(Some(TaskStatus::Blocked)),
        Err(_) => Err(Error::invalid(
            Reason::InvalidArgument,
            "status",
            format!("unknown task status {n}"),
        )),
    }
}

fn task_to_proto(task: Task) -> proto::Task {
    proto::Task {
        id: task.id,
        subject: task.subject,
        description: task.description,
        status: status_to_proto(task.status),
        create_time: Some(timestamp(task.create_time)),
        update_time: Some(timestamp(task.update_time)),
    }
}

fn file_to_proto(file: CachedFile) -> proto::CachedFile {
    proto::CachedFile {
        path: file.path,
        content: file.content,
        bytes: file.bytes,
        update_time: Some(timestamp(file.update_time)),
    }
}

#[tonic::async_trait]
impl<S: Store> WorkingMemoryService for WorkingMemoryApi<S> {
    async fn set_goal(
        &self,
        request: Request<proto::SetGoalRequest>,
    ) -> Result<Response<proto::SetGoalResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), true)
            .await
            .map_err(to_status)?;
        let goal = self
            .working
            .set_goal(&ctx, &session, &req.goal)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::SetGoalResponse { goal }))
    }

    async fn create_task(
        &self,
        request: Request<proto::CreateTaskRequest>,
    ) -> Result<Response<proto::CreateTaskResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let request_id = request_id(req.request_id).map_err(to_status)?;
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), true)
            .await
            .map_err(to_status)?;
        let task = self
            .working
            .create_task(
                &ctx,
                &session,
                &req.subject,
                &req.description,
                request_id.as_deref(),
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::CreateTaskResponse {
            task: Some(task_to_proto(task)),
        }))
    }

    async fn update_task(
        &self,
        request: Request<proto::UpdateTaskRequest>,
    ) -> Result<Response<proto::UpdateTaskResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let change = status_from_proto(req.status)
            .map(|status| TaskChange {
                status,
                subject: req.subject,
                description: req.description,
            })
            .map_err(to_status)?;
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), true)
            .await
            .map_err(to_status)?;
        let task = self
            .working
            .update_task(&ctx, &session, &req.task_id, change)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::UpdateTaskResponse {
            task: Some(task_to_proto(task)),
        }))
    }

    async fn list_tasks(
        &self,
        request: Request<proto::ListTasksRequest>,
    ) -> Result<Response<proto::ListTasksResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), false)
            .await
            .map_err(to_status)?;
        let page = self
            .working
            .list_tasks(&ctx, &session, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ListTasksResponse {
            tasks: page.items.into_iter().map(task_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn remember(
        &self,
        request: Request<proto::RememberRequest>,
    ) -> Result<Response<proto::RememberResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let request_id = request_id(req.request_id).map_err(to_status)?;
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), false)
            .await
            .map_err(to_status)?;
        let fact = self
            .working
            .remember(
                &ctx,
                &session,
                &req.content,
                (req.subject, req.predicate, req.object),
                request_id.as_deref(),
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::RememberResponse {
            fact: Some(fact_to_proto(fact)),
        }))
    }

    async fn record_procedure(
        &self,
        request: Request<proto::RecordProcedureRequest>,
    ) -> Result<Response<proto::RecordProcedureResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let app = Name::parse("app", req.app).map_err(to_status)?;
        let request_id = request_id(req.request_id).map_err(to_status)?;
        let fact = self
            .working
            .record_procedure(
                &ctx,
                &app,
                &req.content,
                (req.subject, req.predicate),
                request_id.as_deref(),
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::RecordProcedureResponse {
            fact: Some(fact_to_proto(fact)),
        }))
    }

    async fn cache_content(
        &self,
        request: Request<proto::CacheContentRequest>,
    ) -> Result<Response<proto::CacheContentResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), true)
            .await
            .map_err(to_status)?;
        let (file, evicted) = self
            .working
            .cache_content(&ctx, &session, &req.path, &req.content)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::CacheContentResponse {
            file: Some(file_to_proto(file)),
            evicted,
        }))
    }

    async fn get_snapshot(
        &self,
        request: Request<proto::GetSnapshotRequest>,
    ) -> Result<Response<proto::GetSnapshotResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let snapshot = self
            .snapshot(
                &ctx,
                (req.session_id, req.app, req.user),
                (req.max_facts, req.max_events),
                "",
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetSnapshotResponse {
            goal: snapshot.goal,
            tasks: snapshot.tasks.into_iter().map(task_to_proto).collect(),
            facts: snapshot.facts.into_iter().map(fact_to_proto).collect(),
            procedures: snapshot.procedures.into_iter().map(fact_to_proto).collect(),
            recent: snapshot.recent.into_iter().map(episode_to_proto).collect(),
            cache: snapshot.cache.into_iter().map(file_to_proto).collect(),
        }))
    }

    async fn render_memory_block(
        &self,
        request: Request<proto::RenderMemoryBlockRequest>,
    ) -> Result<Response<proto::RenderMemoryBlockResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let snapshot = self
            .snapshot(
                &ctx,
                (req.session_id, req.app, req.user),
                (req.max_facts, req.max_events),
                &req.query,
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::RenderMemoryBlockResponse {
            memory_block: render::memory_block(&snapshot),
            instructions: render::INSTRUCTIONS.to_owned(),
        }))
    }

    async fn list_tools(
        &self,
        _request: Request<proto::ListToolsRequest>,
    ) -> Result<Response<proto::ListToolsResponse>, Status> {
        let tools = tools::definitions()
            .into_iter()
            .map(|tool| proto::ToolDefinition {
                name: tool.name.to_owned(),
                aliases: tool.aliases.iter().map(|a| (*a).to_owned()).collect(),
                description: tool.description.to_owned(),
                parameters: tool.parameters.as_object().map(object_to_proto),
            })
            .collect();
        Ok(Response::new(proto::ListToolsResponse { tools }))
    }

    async fn call_tool(
        &self,
        request: Request<proto::CallToolRequest>,
    ) -> Result<Response<proto::CallToolResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let request_id = request_id(req.request_id).map_err(to_status)?;
        let arguments = match req.arguments {
            Some(value) => json_at("arguments", value).map_err(to_status)?,
            None => serde_json::Value::Null,
        };
        let session = self
            .session(&ctx, (req.session_id, req.app, req.user), true)
            .await
            .map_err(to_status)?;
        let (result, is_error) = tools::call(
            &self.working,
            &ctx,
            &session,
            &req.name,
            arguments,
            request_id.as_deref(),
        )
        .await
        .map_err(to_status)?;
        let result = match json_to_proto(&result).kind {
            Some(prost_types::value::Kind::StructValue(object)) => Some(object),
            _ => None,
        };
        Ok(Response::new(proto::CallToolResponse { result, is_error }))
    }
}
