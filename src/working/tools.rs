//! The four LLM-callable actions: their JSON-schema definitions, and a
//! dispatcher that takes a tool call exactly as an LLM emits it.

use serde_json::{Map, Value, json};

use super::service::WorkingMemory;
use super::types::{TaskChange, TaskStatus};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::ports::Store;
use crate::sessions::Session;

/// One tool: the name the LLM calls, other accepted names, a description
/// and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    pub parameters: Value,
}

pub fn definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "TaskCreate",
            aliases: &["memory.task_create"],
            description: "Create a task in your todo list. Returns the new task's taskId.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "subject": {"type": "string", "description": "Brief task title, e.g. \"Fix authentication bug\"."},
                    "description": {"type": "string", "description": "What needs to be done.", "default": ""},
                },
                "required": ["subject"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: "TaskUpdate",
            aliases: &["memory.task_update"],
            description: "Update a task's status.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "taskId": {"type": "string", "description": "The id TaskCreate returned, e.g. \"t1\"."},
                    "status": {"type": "string", "enum": TaskStatus::NAMES},
                },
                "required": ["taskId", "status"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: "memory.set_goal",
            aliases: &[],
            description: "Set or replace the session goal. It is shown at the top of your MEMORY in every later turn.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "goal": {"type": "string", "description": "The session goal in plain language."},
                },
                "required": ["goal"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: "Remember",
            aliases: &["memory.remember"],
            description: "Store a fact that survives context compaction and later sessions with this user. Secrets are redacted.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "content": {"type": "string", "description": "The fact to remember, in plain text."},
                },
                "required": ["content"],
                "additionalProperties": false,
            }),
        },
    ]
}

/// A mistake in a tool call, told to the LLM in its own words.
struct ToolError(String);

impl From<Error> for ToolError {
    fn from(err: Error) -> Self {
        ToolError(err.to_string())
    }
}

/// The arguments as an object: LLM APIs deliver them as an object or as a
/// string holding one.
fn arguments(raw: Value) -> Result<Map<String, Value>, ToolError> {
    let value = match raw {
        Value::String(text) if text.trim().is_empty() => Value::Object(Map::new()),
        Value::String(text) => serde_json::from_str(&text)
            .map_err(|err| ToolError(format!("arguments are not valid JSON: {err}")))?,
        Value::Null => Value::Object(Map::new()),
        other => other,
    };
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ToolError(format!(
            "arguments must be a JSON object, got {other}"
        ))),
    }
}

fn string_arg(
    args: &Map<String, Value>,
    name: &str,
    required: bool,
) -> Result<Option<String>, ToolError> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(ToolError(format!("missing required argument \"{name}\""))),
        Some(other) => Err(ToolError(format!(
            "argument \"{name}\" must be a string, got {other}"
        ))),
    }
}

fn refuse_unknown(args: &Map<String, Value>, known: &[&str]) -> Result<(), ToolError> {
    match args.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(ToolError(format!(
            "unknown argument \"{key}\"; expected {}",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// A tool name as an error quotes it back (to a model, often): its first
/// 64 characters, `…` after them when there were more.
pub(crate) fn shown_name(name: &str) -> String {
    let mut shown: String = name.chars().take(64).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    shown
}

/// Runs a tool call. Errors the LLM made (unknown tool, bad arguments,
/// unknown task, a limit) come back as `{"error": ...}` with `true`; errors
/// of the service itself (the database) and of the caller that forwarded
/// the call (its `request_id` reused) are `Err`. `request_id` keys the
/// creating actions (TaskCreate, Remember), so that forwarding a call
/// twice creates one task or fact; the others set what they carry.
pub async fn call<S: Store>(
    working: &WorkingMemory<S>,
    ctx: &CallerContext,
    session: &Session,
    name: &str,
    raw: Value,
    request_id: Option<&str>,
) -> Result<(Value, bool)> {
    match dispatch(working, ctx, session, name, raw, request_id).await {
        Ok(result) => Ok((result, false)),
        Err(Outcome::Tool(ToolError(message))) => Ok((json!({ "error": message }), true)),
        Err(Outcome::Service(err)) => Err(err),
    }
}

enum Outcome {
    Tool(ToolError),
    Service(Error),
}

impl From<ToolError> for Outcome {
    fn from(err: ToolError) -> Self {
        Outcome::Tool(err)
    }
}

impl From<Error> for Outcome {
    fn from(err: Error) -> Self {
        match err {
            // The forwarding program's mistake, not the model's.
            Error::InvalidArgument {
                reason: Reason::RequestIdReused,
                ..
            } => Outcome::Service(err),
            Error::InvalidArgument { .. }
            | Error::NotFound { .. }
            | Error::ResourceExhausted { .. } => Outcome::Tool(err.into()),
            other => Outcome::Service(other),
        }
    }
}

async fn dispatch<S: Store>(
    working: &WorkingMemory<S>,
    ctx: &CallerContext,
    session: &Session,
    name: &str,
    raw: Value,
    request_id: Option<&str>,
) -> Result<Value, Outcome> {
    let tool = definitions()
        .into_iter()
        .find(|tool| tool.name == name || tool.aliases.contains(&name))
        .ok_or_else(|| {
            let names: Vec<&str> = definitions().iter().map(|t| t.name).collect();
            ToolError(format!(
                "unknown tool \"{}\"; the tools are {}",
                shown_name(name),
                names.join(", ")
            ))
        })?;
    let args = arguments(raw)?;
    match tool.name {
        "TaskCreate" => {
            refuse_unknown(&args, &["subject", "description"])?;
            let subject = string_arg(&args, "subject", true)?.unwrap_or_default();
            let description = string_arg(&args, "description", false)?.unwrap_or_default();
            let task = working
                .create_task(ctx, session, &subject, &description, request_id)
                .await?;
            Ok(json!({"taskId": task.id, "subject": task.subject, "status": task.status.name()}))
        }
        "TaskUpdate" => {
            refuse_unknown(&args, &["taskId", "status"])?;
            let id = string_arg(&args, "taskId", true)?.unwrap_or_default();
            let status = string_arg(&args, "status", true)?.unwrap_or_default();
            let change = TaskChange {
                status: Some(TaskStatus::parse("status", &status)?),
                ..TaskChange::default()
            };
            let task = working.update_task(ctx, session, &id, change).await?;
            Ok(json!({"taskId": task.id, "subject": task.subject, "status": task.status.name()}))
        }
        "memory.set_goal" => {
            refuse_unknown(&args, &["goal"])?;
            let goal = string_arg(&args, "goal", true)?.unwrap_or_default();
            let goal = working.set_goal(ctx, session, &goal).await?;
            Ok(json!({ "goal": goal }))
        }
        _ => {
            refuse_unknown(&args, &["content"])?;
            let content = string_arg(&args, "content", true)?.unwrap_or_default();
            let fact = working
                .remember(ctx, session, &content, Default::default(), request_id)
                .await?;
            Ok(json!({"factId": fact.id, "remembered": fact.current.content}))
        }
    }
}
