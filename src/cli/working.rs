//! `engram working ...`: a session's working memory from a shell.

use serde_json::json;

use super::{
    CliError, CliResult, ClientArgs, Output, connect, parse_value, print_json, time, value_json,
};
use crate::api::convert::json_to_proto;
use crate::proto;
use crate::proto::working_memory_service_client::WorkingMemoryServiceClient;

#[derive(Debug, clap::Args)]
pub struct WorkingCommand {
    #[command(flatten)]
    client: ClientArgs,

    /// The session (its app and user are checked when given, and create a
    /// missing session when both are)
    #[arg(long, global = true, default_value = "", hide_default_value = true)]
    session: String,

    /// The session's app
    #[arg(long, global = true, default_value = "", hide_default_value = true)]
    app: String,

    /// The session's user
    #[arg(long, global = true, default_value = "", hide_default_value = true)]
    user: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StatusArg {
    Pending,
    InProgress,
    Completed,
    Blocked,
}

impl StatusArg {
    fn to_proto(self) -> i32 {
        match self {
            StatusArg::Pending => proto::TaskStatus::Pending as i32,
            StatusArg::InProgress => proto::TaskStatus::InProgress as i32,
            StatusArg::Completed => proto::TaskStatus::Completed as i32,
            StatusArg::Blocked => proto::TaskStatus::Blocked as i32,
        }
    }
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Set (or with "" clear) the session's goal
    Goal {
        /// What the session is trying to achieve ("" clears it)
        goal: String,
    },
    /// Add a task; prints its id (t1, t2, ...)
    TaskCreate {
        /// The task in a few words
        subject: String,
        /// More about the task
        #[arg(long, default_value = "", hide_default_value = true)]
        description: String,
    },
    /// Change a task's status
    TaskUpdate {
        /// The task's id (t1, t2, ...)
        task_id: String,
        /// Its new status
        #[arg(long, value_enum)]
        status: StatusArg,
    },
    /// List the session's tasks
    Tasks,
    /// Remember a fact for the session's app and user (secrets are redacted)
    Remember {
        /// The fact, in a sentence
        content: String,
    },
    /// Record a procedure for an app (--app)
    Procedure {
        /// The procedure: how to do something, in the app's words
        content: String,
    },
    /// Cache content (a file's text) under a path
    Cache {
        /// The path the content is known by, e.g. src/main.rs
        path: String,
        /// The content to keep
        content: String,
    },
    /// Print the MEMORY block and the memory instructions
    Render {
        /// How many facts (and procedures) at most (0: 20; at most 1000)
        #[arg(long, default_value_t = 0)]
        max_facts: i32,
        /// How many recent episodes at most (0: 10; at most 1000)
        #[arg(long, default_value_t = 0)]
        max_events: i32,
        /// Show the facts most relevant to this text first (else the newest)
        #[arg(long, default_value = "", hide_default_value = true)]
        query: String,
    },
    /// List the LLM-callable tools with their JSON schemas
    Tools,
    /// Run a tool call as an LLM would emit it: NAME and JSON ARGUMENTS
    Call {
        /// The tool's name, as `tools` lists it
        name: String,
        /// The call's arguments as a JSON object
        arguments: String,
    },
}

fn task_json(task: &proto::Task) -> serde_json::Value {
    let status = proto::TaskStatus::try_from(task.status)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("TASK_STATUS_")
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    json!({
        "id": task.id,
        "subject": task.subject,
        "description": task.description,
        "status": status,
        "update_time": time(task.update_time.as_ref()),
    })
}

fn struct_json(object: Option<prost_types::Struct>) -> serde_json::Value {
    value_json(object.map(|s| prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(s)),
    }))
}

impl WorkingCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        let mut working = WorkingMemoryServiceClient::new(channel);
        let (session_id, app, user) = (self.session, self.app, self.user);
        let needs_session = !matches!(self.command, Command::Procedure { .. } | Command::Tools);
        if needs_session && session_id.is_empty() {
            return Err(CliError::usage("--session is required"));
        }
        let print = |value: serde_json::Value, text: String| match output {
            Output::Json => print_json(&value),
            Output::Text => println!("{text}"),
        };
        match self.command {
            Command::Goal { goal } => {
                let stored = working
                    .set_goal(proto::SetGoalRequest {
                        session_id,
                        app,
                        user,
                        goal,
                    })
                    .await?
                    .into_inner()
                    .goal;
                print(json!({ "goal": stored }), format!("goal: {stored}"));
            }
            Command::TaskCreate {
                subject,
                description,
            } => {
                let task = working
                    .create_task(proto::CreateTaskRequest {
                        session_id,
                        app,
                        user,
                        subject,
                        description,
                    })
                    .await?
                    .into_inner()
                    .task
                    .unwrap_or_default();
                print(task_json(&task), format!("{}: {}", task.id, task.subject));
            }
            Command::TaskUpdate { task_id, status } => {
                let task = working
                    .update_task(proto::UpdateTaskRequest {
                        session_id,
                        app,
                        user,
                        task_id,
                        status: status.to_proto(),
                        ..proto::UpdateTaskRequest::default()
                    })
                    .await?
                    .into_inner()
                    .task
                    .unwrap_or_default();
                let value = task_json(&task);
                let text = format!(
                    "[{}] {}: {}",
                    value["status"].as_str().unwrap_or(""),
                    task.id,
                    task.subject
                );
                print(value, text);
            }
            Command::Tasks => {
                let tasks = working
                    .list_tasks(proto::ListTasksRequest {
                        session_id,
                        app,
                        user,
                    })
                    .await?
                    .into_inner()
                    .tasks;
                let values: Vec<_> = tasks.iter().map(task_json).collect();
                let text = values
                    .iter()
                    .map(|t| {
                        format!(
                            "[{}] {}: {}",
                            t["status"].as_str().unwrap_or(""),
                            t["id"].as_str().unwrap_or(""),
                            t["subject"].as_str().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                print(json!({ "tasks": values }), text);
            }
            Command::Remember { content } => {
                let fact = working
                    .remember(proto::RememberRequest {
                        session_id,
                        app,
                        user,
                        content,
                        ..proto::RememberRequest::default()
                    })
                    .await?
                    .into_inner()
                    .fact
                    .unwrap_or_default();
                let remembered = value_json(fact.current.and_then(|v| v.content));
                print(
                    json!({ "fact_id": fact.id, "content": remembered }),
                    format!("{}: {remembered}", fact.id),
                );
            }
            Command::Procedure { content } => {
                let fact = working
                    .record_procedure(proto::RecordProcedureRequest {
                        app,
                        content,
                        ..proto::RecordProcedureRequest::default()
                    })
                    .await?
                    .into_inner()
                    .fact
                    .unwrap_or_default();
                let recorded = value_json(fact.current.and_then(|v| v.content));
                print(
                    json!({ "fact_id": fact.id, "content": recorded }),
                    format!("{}: {recorded}", fact.id),
                );
            }
            Command::Cache { path, content } => {
                let done = working
                    .cache_content(proto::CacheContentRequest {
                        session_id,
                        app,
                        user,
                        path,
                        content,
                    })
                    .await?
                    .into_inner();
                let file = done.file.unwrap_or_default();
                print(
                    json!({ "path": file.path, "bytes": file.bytes, "evicted": done.evicted }),
                    format!(
                        "cached {} ({} bytes); evicted: {:?}",
                        file.path, file.bytes, done.evicted
                    ),
                );
            }
            Command::Render {
                max_facts,
                max_events,
                query,
            } => {
                let rendered = working
                    .render_memory_block(proto::RenderMemoryBlockRequest {
                        session_id,
                        app,
                        user,
                        max_facts,
                        max_events,
                        query,
                    })
                    .await?
                    .into_inner();
                print(
                    json!({ "memory_block": rendered.memory_block, "instructions": rendered.instructions }),
                    format!("{}\n\n{}", rendered.memory_block, rendered.instructions),
                );
            }
            Command::Tools => {
                let tools = working
                    .list_tools(proto::ListToolsRequest {})
                    .await?
                    .into_inner()
                    .tools;
                let values: Vec<_> = tools
                    .iter()
                    .map(|t| {
                        json!({
                            "name": t.name,
                            "aliases": t.aliases,
                            "description": t.description,
                            "parameters": struct_json(t.parameters.clone()),
                        })
                    })
                    .collect();
                let text = tools
                    .iter()
                    .map(|t| format!("{} {:?}: {}", t.name, t.aliases, t.description))
                    .collect::<Vec<_>>()
                    .join("\n");
                print(json!({ "tools": values }), text);
            }
            Command::Call { name, arguments } => {
                let done = working
                    .call_tool(proto::CallToolRequest {
                        session_id,
                        app,
                        user,
                        name,
                        arguments: Some(json_to_proto(&parse_value(&arguments))),
                    })
                    .await?
                    .into_inner();
                let result = struct_json(done.result);
                print(
                    json!({ "result": result, "is_error": done.is_error }),
                    result.to_string(),
                );
            }
        }
        Ok(())
    }
}
