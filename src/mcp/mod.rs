//! MCP: Engram's memory as tools for assistants and agent runtimes.
//!
//! One handler ([`Engram`]) serves both transports. `engram mcp` speaks it
//! over stdio and reaches an Engram server over gRPC; `engram serve` mounts
//! it at `/mcp` on the HTTP port (streamable HTTP, see [`route`]) and calls
//! its own gRPC services in process. Either way every tool is a gRPC call
//! made with the caller's bearer token, so the gRPC edge authenticates it,
//! picks the tenant, checks the role, validates the fields and counts it in
//! the metrics, exactly as for any other client: nothing of that is written
//! again here. The protocol itself is the official SDK's (`rmcp`).
//!
//! Tools answer with structured JSON (the same shapes as the CLI's
//! `--output json`); a refused call comes back as a tool result with
//! `isError` and the status code, reason and message, never as a broken
//! session. Lists are paged (`page_size` at most [`MAX_PAGE`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, JsonObject, ListResourceTemplatesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tonic::body::Body;
use tonic::codegen::http::{self, HeaderValue};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceExt};

use crate::api::convert::{json_from_proto, json_to_proto};
use crate::proto;
use crate::proto::memory_admin_service_client::MemoryAdminServiceClient;
use crate::proto::memory_service_client::MemoryServiceClient;
use crate::proto::working_memory_service_client::WorkingMemoryServiceClient;

mod args;
pub mod route;
mod tools;

/// The most items one tool call returns; lists are paged past it.
pub const MAX_PAGE: u32 = 100;

/// What the tools call: a gRPC service, remote (a channel) or in process
/// (the server's own routes behind its edge), with the caller's token
/// already on every request. Its error is a [`Status`] rather than a boxed
/// error: a boxed error type makes the tools' futures fail rustc's `Send`
/// check (a higher-ranked lifetime in `From<Box<dyn Error>>`).
pub type Conn = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Status>;

/// A connection that sends `authorization` (when given) on every call.
pub fn connection<S, B>(service: S, authorization: Option<HeaderValue>) -> Conn
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneSyncService::new(
        service
            .map_request(move |mut request: http::Request<Body>| {
                if let Some(value) = &authorization {
                    request
                        .headers_mut()
                        .insert(crate::auth::AUTHORIZATION, value.clone());
                }
                request
            })
            .map_response(|response: http::Response<B>| response.map(Body::new))
            .map_err(|err: S::Error| Status::from_error(err.into())),
    )
}

/// Whether the connection's token may use the admin tools: asks for one
/// record of an audit log, which only admin tokens may read.
pub async fn probe_admin(conn: &Conn) -> Result<bool, Status> {
    let probe = MemoryAdminServiceClient::new(conn.clone())
        .get_compaction_log(proto::GetCompactionLogRequest {
            scope_type: proto::ScopeType::Namespace as i32,
            scope: "engram-mcp-probe".into(),
            page_size: 1,
            page_token: String::new(),
        })
        .await;
    match probe {
        Ok(_) => Ok(true),
        Err(status) if status.code() == Code::PermissionDenied => Ok(false),
        Err(status) => Err(status),
    }
}

/// Tools only admin tokens see and may call.
const ADMIN_TOOLS: [&str; 9] = [
    "forget_user",
    "data_import",
    "memory_retention",
    "memory_retention_apply",
    "memory_purge",
    "memory_purge_scope",
    "memory_compact",
    "memory_compaction_log",
    "memory_reindex",
];

const INSTRUCTIONS: &str = "\
Engram is durable memory for agents. Memory is versioned key-value data in \
scopes: name one with scope_type (namespace, flow or execution) and scope on \
every memory tool. Every write makes a new version; delete leaves a \
tombstone; memory_history shows every version and memory_rollback restores \
an old one. memory_get, memory_list and memory_scopes take as_of (a revision, \
an RFC 3339 time, or a duration ago such as \"2h\") to read memory as it \
was, and memory_fork copies a scope's state into a new scope; data_export \
shows a scope, session or user as the records `engram export` writes. \
Pass expected_version to memory_set or memory_delete to write only if \
nobody wrote since you read. \
Sessions hold an event log (episode_append, episodes_recent, episodes_list, \
episode_get, session_context). search finds memory entries, facts and episodes by what \
they say. A session's working memory is kept with TaskCreate, TaskUpdate, \
memory.set_goal and Remember, and memory_render gives its MEMORY block for \
a prompt. Lists are paged: pass next_page_token back as page_token. A \
refused call returns isError with a status code and a reason.";

/// The MCP server: the tools, resources and instructions over one
/// connection.
#[derive(Clone)]
pub struct Engram {
    conn: Conn,
    admin: bool,
    tools: ToolRouter<Engram>,
}

impl Engram {
    /// A server whose calls go over `conn`; `admin` shows the admin tools.
    pub fn new(conn: Conn, admin: bool) -> Self {
        Engram {
            conn,
            admin,
            tools: Self::tool_router(),
        }
    }

    fn memory(&self) -> MemoryServiceClient<Conn> {
        MemoryServiceClient::new(self.conn.clone())
    }

    fn admin_client(&self) -> MemoryAdminServiceClient<Conn> {
        MemoryAdminServiceClient::new(self.conn.clone())
    }

    fn data(&self) -> crate::proto::data_service_client::DataServiceClient<Conn> {
        crate::proto::data_service_client::DataServiceClient::new(self.conn.clone())
    }

    fn working(&self) -> WorkingMemoryServiceClient<Conn> {
        WorkingMemoryServiceClient::new(self.conn.clone())
    }

    /// The working-memory actions as the server defines them for LLMs,
    /// each with the session it acts on added to its arguments.
    async fn working_tools(&self) -> Result<Vec<Tool>, Status> {
        let definitions = self
            .working()
            .list_tools(proto::ListToolsRequest {})
            .await?
            .into_inner()
            .tools;
        Ok(definitions.into_iter().map(working_tool).collect())
    }

    /// Runs one of the routed tools. One that met UNAVAILABLE (a database
    /// failover, say) is run again, up to [`RETRIES`] times, when that is
    /// harmless: a read-only tool, a write that sets state to what it carries
    /// (a retention policy, the reindex), or a write that carries its
    /// idempotency key (`request_id`; an append's `id`), which
    /// [`keyed_for_its_tries`] gives `memory_set`, `memory_delete` and
    /// `episode_append` when the model did not. Other writes answer the error
    /// at once, since the first try may have been stored. Any tool is run
    /// again after a failure whose reason says nothing was written
    /// ([`crate::error::Reason::NOTHING_WRITTEN`]). The clients' rule (`engram_client`, the Go
    /// client's `Idempotent`), here so that an assistant's call rides out
    /// the failover as a program's does.
    async fn call_routed(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let request = keyed_for_its_tries(request);
        let retryable = self.harmless_to_repeat(&request);
        retrying(&request.name, retryable, &context, || {
            let call = ToolCallContext::new(self, request.clone(), context.clone());
            self.tools.call(call)
        })
        .await
    }

    /// Whether running `request` twice has the effect of running it once
    /// (a routed tool's; the working-memory actions are keyed instead).
    fn harmless_to_repeat(&self, request: &CallToolRequestParams) -> bool {
        let read_only = self
            .tools
            .get(&request.name)
            .and_then(|tool| tool.annotations.as_ref()?.read_only_hint);
        if read_only == Some(true) {
            return true;
        }
        let keyed = |field: &str| {
            request
                .arguments
                .as_ref()
                .and_then(|arguments| arguments.get(field)?.as_str())
                .is_some_and(|key| !key.is_empty())
        };
        match request.name.as_ref() {
            "memory_set" | "memory_delete" => keyed("request_id"),
            "episode_append" => keyed("id"),
            // The tools that set state to what they carry, so that a repeat
            // leaves it as the first left it. (The working-memory actions
            // are all keyed: see `call_tool`.)
            "memory_retention" | "memory_reindex" => true,
            _ => false,
        }
    }

    /// Runs a working-memory action through `CallTool`, keyed by
    /// `request_id`.
    async fn call_working(
        &self,
        name: String,
        arguments: Option<JsonObject>,
        request_id: &str,
    ) -> CallToolResult {
        let mut arguments = arguments.unwrap_or_default();
        let mut take = |field: &str| match arguments.remove(field) {
            Some(Value::String(text)) => Ok(text),
            None | Some(Value::Null) => Ok(String::new()),
            Some(_) => Err(Failed::argument(format!("{field} must be a string"))),
        };
        let target = (|| Ok::<_, Failed>((take("session_id")?, take("app")?, take("user")?)))();
        let (session_id, app, user) = match target {
            Ok(target) => target,
            Err(failed) => return failed.0,
        };
        if session_id.is_empty() {
            return Failed::argument("session_id is required").0;
        }
        let arguments = json_to_proto(&Value::Object(arguments));
        let called = self
            .working()
            .call_tool(proto::CallToolRequest {
                session_id,
                app,
                user,
                name,
                arguments: Some(arguments),
                request_id: request_id.to_owned(),
            })
            .await;
        match called {
            Ok(response) => {
                let response = response.into_inner();
                let result = response.result.map(json_from_struct).unwrap_or(Value::Null);
                let mut reply = CallToolResult::structured(result);
                reply.is_error = Some(response.is_error);
                reply
            }
            Err(status) => Failed::from(status).0,
        }
    }
}

/// A write whose call takes an idempotency key, given one made for this
/// tool call when the model gave none: a `request_id` for `memory_set`
/// and `memory_delete`, an episode `id` for `episode_append`. Its tries
/// then write once, so it is run again after UNAVAILABLE like a write the
/// model keyed; two calls of the tool stay two writes, as the model meant.
fn keyed_for_its_tries(mut request: CallToolRequestParams) -> CallToolRequestParams {
    let (field, key) = match request.name.as_ref() {
        "memory_set" | "memory_delete" => ("request_id", format!("mcp-{}", uuid::Uuid::now_v7())),
        "episode_append" => ("id", uuid::Uuid::now_v7().to_string()),
        _ => return request,
    };
    let arguments = request.arguments.get_or_insert_with(JsonObject::new);
    let given = match arguments.get(field) {
        None | Some(Value::Null) => false,
        Some(Value::String(key)) => !key.is_empty(),
        // Not a string: the tool refuses it as it would have.
        Some(_) => true,
    };
    if !given {
        arguments.insert(field.to_owned(), Value::String(key));
    }
    request
}

/// A working-memory action as an MCP tool: the server's schema with
/// `session_id` (required), `app` and `user` added.
fn working_tool(definition: proto::ToolDefinition) -> Tool {
    let mut schema = match definition.parameters.map(json_from_struct) {
        Some(Value::Object(schema)) => schema,
        _ => JsonObject::new(),
    };
    schema.insert("type".into(), json!("object"));
    let properties = schema
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut with_session = serde_json::Map::new();
    with_session.insert(
        "session_id".into(),
        json!({"type": "string", "description": "The session whose working memory this acts on"}),
    );
    with_session.insert(
        "app".into(),
        json!({"type": "string", "description": "The session's app, when it has one"}),
    );
    with_session.insert(
        "user".into(),
        json!({"type": "string", "description": "The session's user, when it has one"}),
    );
    with_session.extend(properties);
    schema.insert("properties".into(), Value::Object(with_session));
    let mut required = match schema.remove("required") {
        Some(Value::Array(required)) => required,
        _ => Vec::new(),
    };
    required.insert(0, json!("session_id"));
    schema.insert("required".into(), Value::Array(required));
    Tool::new(definition.name, definition.description, Arc::new(schema))
}

fn json_from_struct(object: prost_types::Struct) -> Value {
    json_from_proto(prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(object)),
    })
    .unwrap_or(Value::Null)
}

/// A tool call that did not succeed: the result the client sees, with
/// `isError` set.
pub struct Failed(CallToolResult);

impl Failed {
    /// Bad arguments caught before any call.
    fn argument(message: impl Into<String>) -> Self {
        Failed::of("INVALID_ARGUMENT", "INVALID_ARGUMENT", &message.into())
    }

    fn of(code: &str, reason: &str, message: &str) -> Self {
        let error = json!({"error": {"code": code, "reason": reason, "message": message}});
        let mut result = CallToolResult::structured_error(error);
        result.content = vec![ContentBlock::text(format!("{code} ({reason}): {message}"))];
        Failed(result)
    }
}

impl From<Status> for Failed {
    fn from(status: Status) -> Self {
        let code = crate::api::edge::code_name(status.code());
        let reason = status
            .get_details_error_info()
            .map(|info| info.reason)
            .unwrap_or_else(|| code.to_owned());
        let mut failed = Failed::of(code, &reason, status.message());
        // How long the server asks a retry to wait (its RetryInfo).
        let delay = status
            .get_details_retry_info()
            .and_then(|info| info.retry_delay);
        if let (Some(delay), Some(Value::Object(content))) =
            (delay, &mut failed.0.structured_content)
            && let Some(Value::Object(error)) = content.get_mut("error")
        {
            error.insert("retry_delay_ms".into(), json!(delay.as_millis()));
        }
        failed
    }
}

/// How many times a tool call is tried again, when it is (see
/// [`Engram::call_routed`]).
const RETRIES: u32 = 3;

/// The wait before a retry the server gave no delay for: the first, and
/// the most; each doubles the last.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Runs a tool call (`run`, once per try) and runs it again while
/// [`retry_wait`] says to, up to [`RETRIES`] times, unless the call is
/// cancelled meanwhile; see [`Engram::call_routed`].
async fn retrying<F, Fut>(
    name: &str,
    harmless: bool,
    context: &RequestContext<RoleServer>,
    mut run: F,
) -> Result<CallToolResponse, ErrorData>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<CallToolResponse, ErrorData>>,
{
    let mut backoff = RETRY_BACKOFF.0;
    let mut tried = 0;
    loop {
        let reply = run().await?;
        tried += 1;
        let Some(delay) = retry_wait(&reply, harmless, &mut backoff).filter(|_| tried <= RETRIES)
        else {
            return Ok(reply);
        };
        tracing::info!(tool = %name, ?delay, tried, "retrying a failed tool call");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = context.ct.cancelled() => return Ok(reply),
        }
    }
}

/// The wait before running a tool again after `result`: after UNAVAILABLE
/// when running it again is `harmless`, or after a failure that wrote
/// nothing, its `retry_delay_ms`, or `backoff` (then doubled); `None` for
/// any other result.
fn retry_wait(
    result: &CallToolResponse,
    harmless: bool,
    backoff: &mut Duration,
) -> Option<Duration> {
    let CallToolResponse::Complete(result) = result else {
        return None;
    };
    let error = result.structured_content.as_ref()?.get("error")?;
    let nothing_written = error
        .get("reason")
        .and_then(Value::as_str)
        .is_some_and(crate::error::Reason::wrote_nothing);
    let unavailable = harmless && error.get("code").and_then(Value::as_str) == Some("UNAVAILABLE");
    if result.is_error != Some(true) || !(nothing_written || unavailable) {
        return None;
    }
    if let Some(ms) = error.get("retry_delay_ms").and_then(Value::as_u64) {
        return Some(Duration::from_millis(ms));
    }
    let delay = *backoff;
    *backoff = (*backoff * 2).min(RETRY_BACKOFF.1);
    Some(delay)
}

impl IntoCallToolResult for Failed {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        Ok(self.0.into())
    }
}

/// What a tool returns: structured JSON, or the failure.
type Reply = Result<CallToolResult, Failed>;

fn ok(value: Value) -> Reply {
    Ok(CallToolResult::structured(value))
}

/// A protocol-level error for a failed gRPC call outside a tool (listing,
/// resources), where no tool result can carry it.
fn protocol_error(status: Status) -> ErrorData {
    let failed = Failed::from(status);
    let message = failed
        .0
        .content
        .first()
        .and_then(|block| block.as_text())
        .map(|text| text.text.clone())
        .unwrap_or_default();
    ErrorData::internal_error(message, failed.0.structured_content)
}

/// A resource: a key's current value, or a session's MEMORY block.
enum Resource {
    Value {
        scope_type: proto::ScopeType,
        scope: String,
        key: String,
    },
    MemoryBlock {
        session_id: String,
    },
}

const VALUE_TEMPLATE: &str = "engram://memory/{scope_type}/{scope}/{key}";
const MEMORY_BLOCK_TEMPLATE: &str = "engram://sessions/{session_id}/memory-block";

impl Resource {
    /// Parses a resource URI; segments are percent-decoded, and a key may
    /// hold `/`.
    fn parse(uri: &str) -> Option<Resource> {
        let decode = |segment: &str| {
            percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .ok()
                .map(Cow::into_owned)
        };
        if let Some(rest) = uri.strip_prefix("engram://memory/") {
            let mut parts = rest.splitn(3, '/');
            let scope_type = match parts.next()? {
                "namespace" => proto::ScopeType::Namespace,
                "flow" => proto::ScopeType::Flow,
                "execution" => proto::ScopeType::Execution,
                _ => return None,
            };
            let scope = decode(parts.next()?)?;
            let key = decode(parts.next()?)?;
            return Some(Resource::Value {
                scope_type,
                scope,
                key,
            });
        }
        let session = uri
            .strip_prefix("engram://sessions/")?
            .strip_suffix("/memory-block")?;
        Some(Resource::MemoryBlock {
            session_id: decode(session)?,
        })
    }
}

impl ServerHandler for Engram {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("engram", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools: Vec<Tool> = self
            .tools
            .list_all()
            .into_iter()
            .filter(|tool| self.admin || !ADMIN_TOOLS.contains(&tool.name.as_ref()))
            .collect();
        tools.extend(self.working_tools().await.map_err(protocol_error)?);
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if ADMIN_TOOLS.contains(&request.name.as_ref()) && !self.admin {
            let refusal = crate::auth::Refusal::Forbidden(crate::auth::Role::Admin);
            let refused = Failed::of("PERMISSION_DENIED", refusal.reason(), refusal.message());
            return Ok(refused.0.into());
        }
        if self.tools.has_route(&request.name) {
            return self.call_routed(request, context).await;
        }
        let name = request.name.into_owned();
        // Any other name goes to the server's working-memory tools, which
        // would first ask for a session: a name that is none of them is
        // an unknown tool, as MCP says (-32602), not a missing session_id.
        let working = self.working_tools().await.map_err(protocol_error)?;
        if !working.iter().any(|tool| tool.name == name) {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool \"{}\"",
                    crate::working::tools::shown_name(&name)
                ),
                None,
            ));
        }
        // One key for every try of this call: TaskCreate and Remember
        // then create one task or fact however many tries it takes, and
        // TaskUpdate and memory.set_goal set what they carry, so each
        // action is run again after UNAVAILABLE.
        let request_id = format!("mcp-{}", uuid::Uuid::now_v7());
        retrying(&name, true, &context, || async {
            Ok(self
                .call_working(name.clone(), request.arguments.clone(), &request_id)
                .await
                .into())
        })
        .await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(VALUE_TEMPLATE, "memory-value")
                .with_title("A memory key's current value")
                .with_description(
                    "The newest live version of a key as JSON (scope and key percent-encoded)",
                )
                .with_mime_type("application/json"),
            ResourceTemplate::new(MEMORY_BLOCK_TEMPLATE, "memory-block")
                .with_title("A session's MEMORY block")
                .with_description(
                    "The session's goal, todos, facts and recent activity, rendered for a prompt",
                )
                .with_mime_type("text/markdown"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let not_found = |status: Status| match status.code() {
            Code::NotFound => ErrorData::resource_not_found(status.message().to_owned(), None),
            Code::InvalidArgument => ErrorData::invalid_params(status.message().to_owned(), None),
            _ => protocol_error(status),
        };
        let contents = match Resource::parse(&uri) {
            Some(Resource::Value {
                scope_type,
                scope,
                key,
            }) => {
                let entry = self
                    .memory()
                    .get(proto::GetRequest {
                        scope_type: scope_type as i32,
                        scope,
                        key,
                        version: 0,
                        as_of: None,
                    })
                    .await
                    .map_err(not_found)?
                    .into_inner()
                    .entry;
                let value = crate::cli::value_json(entry.and_then(|entry| entry.value));
                let mut contents = ResourceContents::text(value.to_string(), uri);
                if let ResourceContents::TextResourceContents { mime_type, .. } = &mut contents {
                    *mime_type = Some("application/json".into());
                }
                contents
            }
            Some(Resource::MemoryBlock { session_id }) => {
                let rendered = self
                    .working()
                    .render_memory_block(proto::RenderMemoryBlockRequest {
                        session_id,
                        ..Default::default()
                    })
                    .await
                    .map_err(not_found)?
                    .into_inner();
                let mut contents = ResourceContents::text(rendered.memory_block, uri);
                if let ResourceContents::TextResourceContents { mime_type, .. } = &mut contents {
                    *mime_type = Some("text/markdown".into());
                }
                contents
            }
            None => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "unknown resource {uri:?}: expected {VALUE_TEMPLATE} or {MEMORY_BLOCK_TEMPLATE}"
                    ),
                    None,
                ));
            }
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_that_take_a_key_are_given_one_for_their_tries() {
        let key_of = |name: &'static str, arguments: Value| {
            let Value::Object(arguments) = arguments else {
                panic!("an object");
            };
            let request = CallToolRequestParams::new(name).with_arguments(arguments);
            keyed_for_its_tries(request).arguments.unwrap_or_default()
        };
        let made = key_of("memory_set", json!({"key": "k"}));
        assert!(
            made["request_id"]
                .as_str()
                .is_some_and(|k| k.starts_with("mcp-"))
        );
        let made = key_of("memory_delete", json!({"key": "k", "request_id": ""}));
        assert!(
            made["request_id"]
                .as_str()
                .is_some_and(|k| k.starts_with("mcp-"))
        );
        let kept = key_of("memory_set", json!({"key": "k", "request_id": "r-1"}));
        assert_eq!(kept["request_id"], "r-1");
        let made = key_of("episode_append", json!({"content": "x", "id": null}));
        assert!(made["id"].as_str().is_some_and(|id| id.len() == 36));
        // A wrong type is the tool's to refuse; an unkeyable write is left.
        assert_eq!(
            key_of("memory_set", json!({"request_id": 7}))["request_id"],
            7
        );
        assert!(
            key_of("memory_rollback", json!({"key": "k"}))
                .get("request_id")
                .is_none()
        );
    }

    #[test]
    fn resource_uris_parse_with_slashes_and_escapes() {
        match Resource::parse("engram://memory/flow/my%20flow/user/prefs") {
            Some(Resource::Value {
                scope_type,
                scope,
                key,
            }) => {
                assert_eq!(scope_type, proto::ScopeType::Flow);
                assert_eq!(scope, "my flow");
                assert_eq!(key, "user/prefs");
            }
            _ => panic!("not a value resource"),
        }
        match Resource::parse("engram://sessions/s-1/memory-block") {
            Some(Resource::MemoryBlock { session_id }) => assert_eq!(session_id, "s-1"),
            _ => panic!("not a memory block"),
        }
        assert!(Resource::parse("engram://memory/team/a/b").is_none());
        assert!(Resource::parse("engram://memory/flow/only-scope").is_none());
        assert!(Resource::parse("https://example.com").is_none());
    }

    #[test]
    fn working_tools_take_the_session() {
        let tool = working_tool(proto::ToolDefinition {
            name: "TaskCreate".into(),
            aliases: vec![],
            description: "Create a task".into(),
            parameters: None,
        });
        let schema = Value::Object((*tool.input_schema).clone());
        assert_eq!(schema["required"], json!(["session_id"]));
        assert_eq!(schema["properties"]["session_id"]["type"], "string");
    }
}
