//! `engram working ...`: a session's working memory from a shell.

use serde_json::json;

use super::consolidation::{fact_json, fact_line};
use super::sessions::{RequestIdArg, episode_json, episode_line};
use super::{
    CliError, CliResult, ClientArgs, Output, connect, given_or_stdin, parse_value, plural,
    print_json, time, value_json,
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
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Change a task: its status, subject or description (what is not
    /// given stays)
    TaskUpdate {
        /// The task's id (t1, t2, ...)
        task_id: String,
        /// Its new status
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// A new subject
        #[arg(long)]
        subject: Option<String>,
        /// A new description ("" clears it)
        #[arg(long)]
        description: Option<String>,
    },
    /// List the session's tasks (every page)
    Tasks,
    /// Remember a fact for the session's app and user (secrets are redacted)
    Remember {
        /// The fact, in a sentence (`-`: from standard input)
        content: String,
        #[command(flatten)]
        triple: Triple,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Record a procedure for an app (--app)
    Procedure {
        /// The procedure: how to do something, in the app's words (`-`: from standard input)
        content: String,
        /// What it is about
        #[arg(long, default_value = "", hide_default_value = true)]
        subject: String,
        /// The relation
        #[arg(long, default_value = "", hide_default_value = true)]
        predicate: String,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Cache content (a file's text) under a path
    Cache {
        /// The path the content is known by, e.g. src/main.rs
        path: String,
        /// The content to keep (`-`: standard input, as it is, e.g. `< src/main.rs`)
        content: String,
    },
    /// Print what the MEMORY block is made of: goal, tasks, facts,
    /// procedures, recent episodes and the cache's paths
    Snapshot {
        /// How many facts (and procedures) at most (0: 20; at most 1000)
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
        max_facts: i32,
        /// How many recent episodes at most (0: 10; at most 1000)
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
        max_events: i32,
    },
    /// Print the MEMORY block and the memory instructions
    Render {
        /// How many facts (and procedures) at most (0: 20; at most 1000)
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
        max_facts: i32,
        /// How many recent episodes at most (0: 10; at most 1000)
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
        max_events: i32,
        /// Show the facts most relevant to this text first (else the newest)
        #[arg(long, default_value = "", hide_default_value = true)]
        query: String,
    },
    /// List the LLM-callable tools with their JSON schemas
    Tools,
    /// Run a tool call as an LLM would emit it: NAME and JSON ARGUMENTS
    /// (--request-id: the tool call's own id, e.g. call_..., is a good one)
    Call {
        /// The tool's name, as `tools` lists it
        name: String,
        /// The call's arguments as a JSON object
        arguments: String,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
}

/// A fact's subject, predicate and object, which `remember` may name.
#[derive(Debug, clap::Args)]
struct Triple {
    /// What the fact is about, e.g. alice
    #[arg(long, default_value = "", hide_default_value = true)]
    subject: String,
    /// The relation, e.g. prefers
    #[arg(long, default_value = "", hide_default_value = true)]
    predicate: String,
    /// The value of the relation, e.g. "dark mode"
    #[arg(long, default_value = "", hide_default_value = true)]
    object: String,
}

fn task_line(task: &serde_json::Value) -> String {
    format!(
        "[{}] {}: {}",
        task["status"].as_str().unwrap_or(""),
        task["id"].as_str().unwrap_or(""),
        task["subject"].as_str().unwrap_or("")
    )
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

/// A snapshot as JSON, and as text: one section per part, each line as
/// `tasks`, `facts list` and `episodes list` print theirs.
fn snapshot_output(snapshot: &proto::GetSnapshotResponse) -> (serde_json::Value, String) {
    let tasks: Vec<_> = snapshot.tasks.iter().map(task_json).collect();
    let cache: Vec<_> = snapshot
        .cache
        .iter()
        .map(|c| json!({"path": c.path, "bytes": c.bytes, "update_time": time(c.update_time.as_ref())}))
        .collect();
    let value = json!({
        "goal": snapshot.goal,
        "tasks": tasks,
        "facts": snapshot.facts.iter().map(fact_json).collect::<Vec<_>>(),
        "procedures": snapshot.procedures.iter().map(fact_json).collect::<Vec<_>>(),
        "recent": snapshot.recent.iter().map(episode_json).collect::<Vec<_>>(),
        "cache": cache,
    });
    let mut text = format!("goal: {}", snapshot.goal);
    let sections: [(&str, Vec<String>); 5] = [
        ("tasks", tasks.iter().map(task_line).collect()),
        ("facts", snapshot.facts.iter().map(fact_line).collect()),
        (
            "procedures",
            snapshot.procedures.iter().map(fact_line).collect(),
        ),
        ("recent", snapshot.recent.iter().map(episode_line).collect()),
        (
            "cache",
            snapshot
                .cache
                .iter()
                .map(|c| format!("{} ({})", c.path, plural(c.bytes, "byte", "bytes")))
                .collect(),
        ),
    ];
    for (name, lines) in sections {
        text.push_str(&format!("\n{name} ({}):", lines.len()));
        for line in lines {
            text.push_str("\n  ");
            text.push_str(&line);
        }
    }
    (value, text)
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
            Output::Text => outln!("{text}"),
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
                request_id,
            } => {
                let task = working
                    .create_task(proto::CreateTaskRequest {
                        session_id,
                        app,
                        user,
                        subject,
                        description,
                        request_id: request_id.or_random(),
                    })
                    .await?
                    .into_inner()
                    .task
                    .unwrap_or_default();
                print(task_json(&task), format!("{}: {}", task.id, task.subject));
            }
            Command::TaskUpdate {
                task_id,
                status,
                subject,
                description,
            } => {
                if status.is_none() && subject.is_none() && description.is_none() {
                    return Err(CliError::usage("give --status, --subject or --description"));
                }
                let task = working
                    .update_task(proto::UpdateTaskRequest {
                        session_id,
                        app,
                        user,
                        task_id,
                        status: status.map_or(0, StatusArg::to_proto),
                        subject,
                        description,
                    })
                    .await?
                    .into_inner()
                    .task
                    .unwrap_or_default();
                let value = task_json(&task);
                let text = task_line(&value);
                print(value, text);
            }
            Command::Tasks => {
                // Every page.
                let (mut tasks, mut page_token) = (Vec::new(), String::new());
                loop {
                    let page = working
                        .list_tasks(proto::ListTasksRequest {
                            session_id: session_id.clone(),
                            app: app.clone(),
                            user: user.clone(),
                            page_size: 0,
                            page_token,
                        })
                        .await?
                        .into_inner();
                    tasks.extend(page.tasks);
                    if page.next_page_token.is_empty() {
                        break;
                    }
                    page_token = page.next_page_token;
                }
                let values: Vec<_> = tasks.iter().map(task_json).collect();
                let text = values.iter().map(task_line).collect::<Vec<_>>().join("\n");
                print(json!({ "tasks": values }), text);
            }
            Command::Remember {
                content,
                triple,
                request_id,
            } => {
                let fact = working
                    .remember(proto::RememberRequest {
                        session_id,
                        app,
                        user,
                        content: given_or_stdin(content, false)?,
                        subject: triple.subject,
                        predicate: triple.predicate,
                        object: triple.object,
                        request_id: request_id.or_random(),
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
            Command::Procedure {
                content,
                subject,
                predicate,
                request_id,
            } => {
                let fact = working
                    .record_procedure(proto::RecordProcedureRequest {
                        app,
                        content: given_or_stdin(content, false)?,
                        subject,
                        predicate,
                        request_id: request_id.or_random(),
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
                        content: given_or_stdin(content, true)?,
                    })
                    .await?
                    .into_inner();
                let file = done.file.unwrap_or_default();
                print(
                    json!({ "path": file.path, "bytes": file.bytes, "evicted": done.evicted }),
                    match done.evicted.as_slice() {
                        [] => format!(
                            "cached {} ({})",
                            file.path,
                            plural(file.bytes, "byte", "bytes")
                        ),
                        evicted => format!(
                            "cached {} ({}); evicted to make room: {}",
                            file.path,
                            plural(file.bytes, "byte", "bytes"),
                            evicted.join(", ")
                        ),
                    },
                );
            }
            Command::Snapshot {
                max_facts,
                max_events,
            } => {
                let snapshot = working
                    .get_snapshot(proto::GetSnapshotRequest {
                        session_id,
                        app,
                        user,
                        max_facts,
                        max_events,
                    })
                    .await?
                    .into_inner();
                let (value, text) = snapshot_output(&snapshot);
                print(value, text);
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
                    .map(|t| match t.aliases.as_slice() {
                        [] => format!("{}: {}", t.name, t.description),
                        aliases => format!(
                            "{} (also {}): {}",
                            t.name,
                            aliases.join(", "),
                            t.description
                        ),
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                print(json!({ "tools": values }), text);
            }
            Command::Call {
                name,
                arguments,
                request_id,
            } => {
                let done = working
                    .call_tool(proto::CallToolRequest {
                        session_id,
                        app,
                        user,
                        name,
                        arguments: Some(json_to_proto(&parse_value(&arguments))),
                        request_id: request_id.or_random(),
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
