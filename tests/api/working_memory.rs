//! `WorkingMemoryService`: the rendered MEMORY block in full, the tools as
//! an LLM calls them, redaction, isolation, EndSession and limits.

use engram::api::convert::json_to_proto;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    AppendEpisodesRequest, CacheContentRequest, CallToolRequest, CleanupSessionsRequest,
    CreateTaskRequest, DeleteSessionRequest, EndSessionRequest, GetSnapshotRequest,
    ListFactsRequest, ListTasksRequest, ListToolsRequest, NewEpisode, RecordProcedureRequest,
    RememberRequest, RenderMemoryBlockRequest, SetGoalRequest, TaskStatus, UpdateTaskRequest,
};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{
    Backend, LOCK_WAITS, TestServer, error_metadata, holding, reason, release, until_reads,
};
use crate::on_both_stores;

type Client = WorkingMemoryServiceClient<Channel>;

fn working(server: &TestServer) -> Client {
    WorkingMemoryServiceClient::new(server.channel.clone())
}

/// `(session_id, app, user)` as every request carries them.
#[derive(Clone, Copy)]
struct At<'a>(&'a str, &'a str, &'a str);

impl At<'_> {
    fn parts(self) -> (String, String, String) {
        (self.0.to_owned(), self.1.to_owned(), self.2.to_owned())
    }
}

async fn set_goal(client: &mut Client, at: At<'_>, goal: &str) -> String {
    let (session_id, app, user) = at.parts();
    client
        .set_goal(SetGoalRequest {
            session_id,
            app,
            user,
            goal: goal.to_owned(),
        })
        .await
        .expect("set goal")
        .into_inner()
        .goal
}

async fn create_task(client: &mut Client, at: At<'_>, subject: &str) -> String {
    let (session_id, app, user) = at.parts();
    client
        .create_task(CreateTaskRequest {
            session_id,
            app,
            user,
            subject: subject.to_owned(),
            description: String::new(),
            request_id: String::new(),
        })
        .await
        .expect("create task")
        .into_inner()
        .task
        .expect("task")
        .id
}

async fn set_status(client: &mut Client, at: At<'_>, task: &str, status: TaskStatus) {
    let (session_id, app, user) = at.parts();
    client
        .update_task(UpdateTaskRequest {
            session_id,
            app,
            user,
            task_id: task.to_owned(),
            status: status as i32,
            ..UpdateTaskRequest::default()
        })
        .await
        .expect("update task");
}

async fn remember(client: &mut Client, at: At<'_>, content: &str) -> String {
    let (session_id, app, user) = at.parts();
    let fact = client
        .remember(RememberRequest {
            session_id,
            app,
            user,
            content: content.to_owned(),
            ..RememberRequest::default()
        })
        .await
        .expect("remember")
        .into_inner()
        .fact
        .expect("fact");
    match fact.current.and_then(|v| v.content).and_then(|c| c.kind) {
        Some(prost_types::value::Kind::StringValue(text)) => text,
        other => panic!("a text fact, got {other:?}"),
    }
}

async fn render(client: &mut Client, at: At<'_>, max_facts: i32, max_events: i32) -> String {
    let (session_id, app, user) = at.parts();
    client
        .render_memory_block(RenderMemoryBlockRequest {
            session_id,
            app,
            user,
            max_facts,
            max_events,
            query: String::new(),
        })
        .await
        .expect("render")
        .into_inner()
        .memory_block
}

async fn call(client: &mut Client, at: At<'_>, name: &str, arguments: Value) -> (Value, bool) {
    let (session_id, app, user) = at.parts();
    let response = client
        .call_tool(CallToolRequest {
            session_id,
            app,
            user,
            name: name.to_owned(),
            arguments: Some(json_to_proto(&arguments)),
            ..CallToolRequest::default()
        })
        .await
        .expect("call tool")
        .into_inner();
    let result = engram::api::convert::json_from_proto(prost_types::Value {
        kind: response.result.map(prost_types::value::Kind::StructValue),
    })
    .expect("a JSON result");
    (result, response.is_error)
}

fn episode(kind: &str, content: Value) -> NewEpisode {
    NewEpisode {
        r#type: kind.to_owned(),
        content: Some(json_to_proto(&content)),
        ..NewEpisode::default()
    }
}

async fn the_rendered_block(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = working(&server);
    let at = At("s1", "coder", "alice");
    set_goal(
        &mut client,
        at,
        "Fix the authentication bug in src/auth/validate.ts",
    )
    .await;
    let t1 = create_task(&mut client, at, "Trace the failing path").await;
    let t2 = create_task(&mut client, at, "Add unit test").await;
    let t3 = create_task(&mut client, at, "Open PR").await;
    assert_eq!((t1.as_str(), t2.as_str(), t3.as_str()), ("t1", "t2", "t3"));
    set_status(&mut client, at, &t1, TaskStatus::InProgress).await;
    set_status(&mut client, at, &t3, TaskStatus::Completed).await;
    remember(&mut client, at, "Test command: pytest tests/ -v").await;
    remember(
        &mut client,
        at,
        "Project uses FastAPI + SQLAlchemy + Alembic",
    )
    .await;
    client
        .record_procedure(RecordProcedureRequest {
            app: "coder".into(),
            content: "Run the linter before opening a PR".into(),
            ..RecordProcedureRequest::default()
        })
        .await
        .expect("procedure");
    server
        .episodes()
        .append_episodes(AppendEpisodesRequest {
            session_id: "s1".into(),
            episodes: vec![
                episode("user_message", json!("Please fix the login bug")),
                episode("agent_response", json!("Looking at   src/auth\nnow")),
                episode(
                    "tool_call",
                    json!({"tool": "grep", "arguments": {"pattern": "validate"}}),
                ),
            ],
            ..AppendEpisodesRequest::default()
        })
        .await
        .expect("append");

    let block = render(&mut client, at, 0, 0).await;
    assert_eq!(
        block,
        "# MEMORY
## Goal
Fix the authentication bug in src/auth/validate.ts
## Todos (3)
- [in_progress] t1: Trace the failing path
- [pending] t2: Add unit test
- [completed] t3: Open PR
## Facts (2)
- Test command: pytest tests/ -v
- Project uses FastAPI + SQLAlchemy + Alembic
## Procedures (1)
- Run the linter before opening a PR
## Recent activity
- user_message: Please fix the login bug
- agent_response: Looking at src/auth now
- tool_call: {\"arguments\":{\"pattern\":\"validate\"},\"tool\":\"grep\"}"
    );
    assert_eq!(render(&mut client, at, 0, 0).await, block, "deterministic");
    let response = client
        .render_memory_block(RenderMemoryBlockRequest {
            session_id: "s1".into(),
            ..RenderMemoryBlockRequest::default()
        })
        .await
        .expect("render")
        .into_inner();
    assert!(response.instructions.starts_with("# MEMORY INSTRUCTIONS\n"));
    assert!(response.instructions.contains("TaskCreate"));

    // Limits keep the newest facts and events.
    assert_eq!(
        render(&mut client, at, 1, 1).await,
        "# MEMORY
## Goal
Fix the authentication bug in src/auth/validate.ts
## Todos (3)
- [in_progress] t1: Trace the failing path
- [pending] t2: Add unit test
- [completed] t3: Open PR
## Facts (1)
- Project uses FastAPI + SQLAlchemy + Alembic
## Procedures (1)
- Run the linter before opening a PR
## Recent activity
- tool_call: {\"arguments\":{\"pattern\":\"validate\"},\"tool\":\"grep\"}"
    );
    // Another user of the app sees its procedures, none of alice's state.
    assert_eq!(
        render(&mut client, At("fresh", "coder", "bob"), 0, 0).await,
        "# MEMORY\n## Procedures (1)\n- Run the linter before opening a PR"
    );
    // The empty session (created by this call) of another app.
    assert_eq!(
        render(&mut client, At("fresh2", "other-app", "bob"), 0, 0).await,
        "# MEMORY\n(empty: no goal, tasks, facts or activity yet)"
    );
    let err = client
        .render_memory_block(RenderMemoryBlockRequest {
            session_id: "s1".into(),
            max_facts: -1,
            ..RenderMemoryBlockRequest::default()
        })
        .await
        .expect_err("negative limit");
    assert_eq!(err.code(), Code::InvalidArgument);
}

async fn tools_as_an_llm_calls_them(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = working(&server);
    let tools = client
        .list_tools(ListToolsRequest {})
        .await
        .expect("tools")
        .into_inner()
        .tools;
    let names: Vec<(&str, Vec<String>)> = tools
        .iter()
        .map(|t| (t.name.as_str(), t.aliases.clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("TaskCreate", vec!["memory.task_create".to_owned()]),
            ("TaskUpdate", vec!["memory.task_update".to_owned()]),
            ("memory.set_goal", vec![]),
            ("Remember", vec!["memory.remember".to_owned()]),
        ]
    );
    let schema = engram::api::convert::json_from_proto(prost_types::Value {
        kind: tools[1]
            .parameters
            .clone()
            .map(prost_types::value::Kind::StructValue),
    })
    .expect("schema");
    assert_eq!(schema["required"], json!(["taskId", "status"]));
    assert_eq!(
        schema["properties"]["status"]["enum"],
        json!(["pending", "in_progress", "completed", "blocked"])
    );

    let at = At("s1", "agent", "alice");
    let (created, error) = call(
        &mut client,
        at,
        "TaskCreate",
        json!({"subject": "Refactor src/auth/validate.ts", "description": "Split it"}),
    )
    .await;
    assert!(!error);
    assert_eq!(
        created,
        json!({"taskId": "t1", "subject": "Refactor src/auth/validate.ts", "status": "pending"})
    );
    // Arguments as chat-completions APIs deliver them: a JSON string.
    let (second, _) = call(
        &mut client,
        at,
        "memory.task_create",
        json!("{\"subject\": \"Write tests\"}"),
    )
    .await;
    assert_eq!(second["taskId"], json!("t2"));
    let (updated, error) = call(
        &mut client,
        at,
        "TaskUpdate",
        json!({"taskId": "t1", "status": "in_progress"}),
    )
    .await;
    assert!(!error);
    assert_eq!(updated["status"], json!("in_progress"));
    let (goal, _) = call(
        &mut client,
        at,
        "memory.set_goal",
        json!({"goal": "Fix the auth bug"}),
    )
    .await;
    assert_eq!(goal, json!({"goal": "Fix the auth bug"}));
    let (fact, _) = call(
        &mut client,
        at,
        "Remember",
        json!({"content": "Test command: pytest tests/ -v"}),
    )
    .await;
    assert_eq!(fact["remembered"], json!("Test command: pytest tests/ -v"));
    assert!(fact["factId"].as_str().is_some_and(|id| !id.is_empty()));

    // Mistakes come back as readable errors, not RPC failures.
    for (name, arguments, expected) in [
        (
            "TaskUpdate",
            json!({"taskId": "t9", "status": "completed"}),
            "\"t9\" does not exist",
        ),
        (
            "TaskUpdate",
            json!({"taskId": "t1", "status": "done"}),
            "not one of pending",
        ),
        (
            "TaskUpdate",
            json!({"status": "completed"}),
            "missing required argument \"taskId\"",
        ),
        ("TaskCreate", json!({"subject": 7}), "must be a string"),
        (
            "TaskCreate",
            json!({"title": "x"}),
            "unknown argument \"title\"",
        ),
        ("TaskCreate", json!("{not json"), "not valid JSON"),
        ("TaskCreate", json!([1, 2]), "must be a JSON object"),
        (
            "memory.set_goal",
            json!({}),
            "missing required argument \"goal\"",
        ),
        ("Remember", json!({"content": "  "}), "must not be empty"),
        ("Forget", json!({}), "unknown tool \"Forget\""),
    ] {
        let (result, error) = call(&mut client, at, name, arguments.clone()).await;
        assert!(error, "{name} {arguments} should fail");
        let message = result["error"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{name} {arguments}: {message}");
    }
    let tasks = client
        .list_tasks(ListTasksRequest {
            session_id: "s1".into(),
            ..ListTasksRequest::default()
        })
        .await
        .expect("tasks")
        .into_inner()
        .tasks;
    let states: Vec<(String, i32)> = tasks.iter().map(|t| (t.id.clone(), t.status)).collect();
    assert_eq!(
        states,
        [
            ("t1".to_owned(), TaskStatus::InProgress as i32),
            ("t2".to_owned(), TaskStatus::Pending as i32)
        ]
    );
    // An owner mismatch is the runtime's error, not the LLM's.
    let err = client
        .call_tool(CallToolRequest {
            session_id: "s1".into(),
            user: "mallory".into(),
            name: "TaskCreate".into(),
            arguments: Some(json_to_proto(&json!({"subject": "x"}))),
            ..CallToolRequest::default()
        })
        .await
        .expect_err("not the owner");
    assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");
}

async fn secrets_are_redacted(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.sensitive_patterns = Some("slack_webhook".into());
    })
    .await;
    let mut client = working(&server);
    let at = At("s1", "agent", "alice");
    for (input, stored) in [
        (
            "db password=hunter2 for staging",
            "db password=[REDACTED] for staging",
        ),
        (
            "config {\"api_key\": \"abc123\", \"region\": \"eu\"}",
            "config {\"api_key\": \"[REDACTED]\", \"region\": \"eu\"}",
        ),
        (
            "send Authorization: Bearer abcDEF123456789",
            "send Authorization: Bearer [REDACTED]",
        ),
        (
            "jwt is eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl ok",
            "jwt is [REDACTED] ok",
        ),
        ("aws AKIAIOSFODNN7EXAMPLE", "aws [REDACTED]"),
        (
            "slack_webhook=https://hooks.example/x",
            "slack_webhook=[REDACTED]",
        ),
        (
            "Rotate the token every 30 days",
            "Rotate the token every 30 days",
        ),
    ] {
        assert_eq!(remember(&mut client, at, input).await, stored, "{input}");
    }
    assert_eq!(
        set_goal(&mut client, at, "deploy with token=xyz").await,
        "deploy with token=[REDACTED]"
    );
    // Episodes are stored as given unless asked.
    let appended = server
        .episodes()
        .append_episodes(AppendEpisodesRequest {
            session_id: "s1".into(),
            episodes: vec![episode("observation", json!({"password": "hunter2"}))],
            ..AppendEpisodesRequest::default()
        })
        .await
        .expect("append")
        .into_inner();
    let content = appended.episodes[0].content.clone().expect("content");
    assert_eq!(
        engram::api::convert::json_from_proto(content).expect("json"),
        json!({"password": "hunter2"})
    );

    let redacting = TestServer::spawn_with(backend, |s| s.redact_episodes = Some(true)).await;
    let appended = redacting
        .episodes()
        .append_episodes(AppendEpisodesRequest {
            session_id: "s1".into(),
            app: "agent".into(),
            user: "alice".into(),
            episodes: vec![episode(
                "observation",
                json!({"password": "hunter2", "note": "token=abc and more"}),
            )],
            require_session: false,
        })
        .await
        .expect("append")
        .into_inner();
    let content = appended.episodes[0].content.clone().expect("content");
    assert_eq!(
        engram::api::convert::json_from_proto(content).expect("json"),
        json!({"password": "[REDACTED]", "note": "token=[REDACTED] and more"})
    );

    let off = TestServer::spawn_with(backend, |s| s.redact_secrets = Some(false)).await;
    let mut plain = working(&off);
    assert_eq!(
        remember(&mut plain, at, "password=hunter2").await,
        "password=hunter2"
    );
}

async fn isolation_and_end_session(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = working(&server);
    let alice1 = At("abc", "agent", "alice");
    let alice2 = At("abc2", "agent", "alice");
    let bob = At("abc-x", "agent", "bob");
    set_goal(&mut client, alice1, "alice's first goal").await;
    create_task(&mut client, alice1, "alice task").await;
    set_goal(&mut client, bob, "bob's goal").await;
    create_task(&mut client, bob, "bob task").await;
    remember(&mut client, alice1, "alice likes tea").await;
    remember(&mut client, bob, "bob likes coffee").await;
    for (at, path) in [(alice1, "a.txt"), (bob, "b.txt")] {
        let (session_id, app, user) = at.parts();
        client
            .cache_content(CacheContentRequest {
                session_id,
                app,
                user,
                path: path.into(),
                content: "x".into(),
            })
            .await
            .expect("cache");
    }
    let snapshot = |at: At<'_>| {
        let (session_id, app, user) = at.parts();
        GetSnapshotRequest {
            session_id,
            app,
            user,
            ..GetSnapshotRequest::default()
        }
    };
    let text = |facts: &[engram::proto::Fact]| -> Vec<String> {
        facts
            .iter()
            .filter_map(|f| f.current.as_ref()?.content.as_ref()?.kind.clone())
            .map(|k| match k {
                prost_types::value::Kind::StringValue(s) => s,
                other => format!("{other:?}"),
            })
            .collect()
    };
    let a1 = client
        .get_snapshot(snapshot(alice1))
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(a1.goal, "alice's first goal");
    assert_eq!(a1.tasks.len(), 1);
    assert_eq!(text(&a1.facts), ["alice likes tea"]);
    assert_eq!(
        a1.cache.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
        ["a.txt"]
    );
    // Another session of the same user: the user's facts, nothing else.
    let a2 = client
        .get_snapshot(snapshot(alice2))
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(
        (a2.goal.as_str(), a2.tasks.len(), a2.cache.len()),
        ("", 0, 0)
    );
    assert_eq!(text(&a2.facts), ["alice likes tea"]);
    // Bob, whose session id shares alice's prefix, sees only his own.
    let b = client
        .get_snapshot(snapshot(bob))
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(b.goal, "bob's goal");
    assert_eq!(text(&b.facts), ["bob likes coffee"]);
    assert_eq!(
        b.cache.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
        ["b.txt"]
    );
    let err = client
        .get_snapshot(snapshot(At("abc", "agent", "bob")))
        .await
        .expect_err("bob naming alice's session");
    assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");

    // EndSession clears goal, tasks and cache; episodes stay unless asked;
    // facts persist into the next session.
    server
        .episodes()
        .append_episodes(AppendEpisodesRequest {
            session_id: "abc".into(),
            episodes: vec![episode("user_message", json!("hi"))],
            ..AppendEpisodesRequest::default()
        })
        .await
        .expect("append");
    server
        .sessions()
        .end_session(EndSessionRequest {
            session_id: "abc".into(),
            ..EndSessionRequest::default()
        })
        .await
        .expect("end");
    let ended = client
        .get_snapshot(snapshot(alice1))
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(
        (ended.goal.as_str(), ended.tasks.len(), ended.cache.len()),
        ("", 0, 0)
    );
    assert_eq!(ended.recent.len(), 1, "episodes kept");
    assert_eq!(text(&ended.facts), ["alice likes tea"]);
    let err = client
        .set_goal(SetGoalRequest {
            session_id: "abc".into(),
            goal: "again".into(),
            ..SetGoalRequest::default()
        })
        .await
        .expect_err("ended");
    assert_eq!(reason(&err), "SESSION_ENDED");
    let next = client
        .get_snapshot(snapshot(At("next", "agent", "alice")))
        .await
        .expect("a new session")
        .into_inner();
    assert_eq!(text(&next.facts), ["alice likes tea"]);
    let b = client
        .get_snapshot(snapshot(bob))
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(
        b.goal, "bob's goal",
        "ending alice's session left bob's alone"
    );
}

async fn limits_are_enforced(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.max_tasks_per_session = Some(2);
        s.max_facts_per_user = Some(1);
        s.max_cached_files = Some(2);
        s.max_cache_bytes = Some(10);
    })
    .await;
    let mut client = working(&server);
    let at = At("s", "agent", "u");
    create_task(&mut client, at, "one").await;
    create_task(&mut client, at, "two").await;
    let err = client
        .create_task(CreateTaskRequest {
            session_id: "s".into(),
            subject: "three".into(),
            ..CreateTaskRequest::default()
        })
        .await
        .expect_err("over the task limit");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(reason(&err), "LIMIT_EXCEEDED");
    assert_eq!(
        error_metadata(&err, "limit").as_deref(),
        Some("max_tasks_per_session")
    );
    assert_eq!(error_metadata(&err, "value").as_deref(), Some("2"));
    let (result, error) = call(&mut client, at, "TaskCreate", json!({"subject": "three"})).await;
    assert!(error);
    assert!(
        result["error"]
            .as_str()
            .unwrap_or_default()
            .contains("max_tasks_per_session")
    );

    remember(&mut client, at, "first").await;
    let err = client
        .remember(RememberRequest {
            session_id: "s".into(),
            content: "second".into(),
            ..RememberRequest::default()
        })
        .await
        .expect_err("over the fact limit");
    assert_eq!(
        error_metadata(&err, "limit").as_deref(),
        Some("max_facts_per_user")
    );

    let mut cache = async |path: &str, content: &str| {
        client
            .cache_content(CacheContentRequest {
                session_id: "s".into(),
                path: path.into(),
                content: content.into(),
                ..CacheContentRequest::default()
            })
            .await
            .map(|r| r.into_inner().evicted)
    };
    assert!(cache("a", "1234").await.expect("a").is_empty());
    assert!(cache("b", "1234").await.expect("b").is_empty());
    assert_eq!(
        cache("c", "1234").await.expect("c"),
        ["a"],
        "two files at most"
    );
    assert_eq!(
        cache("d", "12345678").await.expect("d"),
        ["b", "c"],
        "ten bytes at most"
    );
    let err = cache("big", "12345678901")
        .await
        .expect_err("one entry over the byte limit");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("max_cache_bytes"),
        "{}",
        err.message()
    );
    let listed = client
        .get_snapshot(GetSnapshotRequest {
            session_id: "s".into(),
            ..GetSnapshotRequest::default()
        })
        .await
        .expect("snapshot")
        .into_inner()
        .cache;
    assert_eq!(
        listed
            .iter()
            .map(|c| (c.path.as_str(), c.bytes))
            .collect::<Vec<_>>(),
        [("d", 8)]
    );
}

/// With a query the Facts section leads with the facts that bear on it,
/// then fills up with the newest; a bad query is refused.
async fn the_block_for_a_query(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = working(&server);
    let at = At("s1", "app", "alice");
    for fact in [
        "alice is allergic to peanuts",
        "alice deploys with helm charts",
        "alice prefers dark mode",
        "alice lives in Lisbon",
    ] {
        remember(&mut client, at, fact).await;
    }
    let rendered = |query: &str, max_facts: i32| {
        let mut client = client.clone();
        let query = query.to_owned();
        async move {
            client
                .render_memory_block(RenderMemoryBlockRequest {
                    session_id: "s1".to_owned(),
                    app: "app".to_owned(),
                    user: "alice".to_owned(),
                    max_facts,
                    max_events: 0,
                    query,
                })
                .await
                .map(|r| r.into_inner().memory_block)
        }
    };
    let facts = |block: &str| -> Vec<String> {
        block
            .split("## Facts")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("- "))
            .map(str::to_owned)
            .collect()
    };
    let newest = facts(&rendered("", 2).await.expect("render"));
    assert_eq!(newest.len(), 2);
    assert!(newest.iter().all(|l| !l.contains("peanuts")), "{newest:?}");

    let block = rendered("what should the deployment use? helm?", 2)
        .await
        .expect("render");
    let first = facts(&block);
    assert_eq!(first.len(), 2, "{block}");
    assert!(first[0].contains("helm charts"), "{block}");
    let peanuts = facts(&rendered("peanuts", 4).await.expect("render"));
    assert!(peanuts[0].contains("peanuts"), "{peanuts:?}");
    assert_eq!(peanuts.len(), 4, "the others follow");

    let status = rendered("-only", 2).await.expect_err("bad query");
    assert_eq!(reason(&status), "INVALID_QUERY");
}

/// Remembers racing for the last places under the fact limit: exactly the
/// limit's worth are stored, and every other caller hears the limit.
async fn racing_remembers_stop_at_the_fact_limit(backend: Backend) {
    const LIMIT: usize = 6;
    const CALLERS: usize = 12;
    const EACH: usize = 4;
    let server = TestServer::spawn_with(backend, |s| {
        s.max_facts_per_user = Some(LIMIT as u64);
        s.db_max_connections = Some(16);
    })
    .await;
    let at = At("race", "agent", "u");
    // The session first, so the racers only remember.
    set_goal(&mut working(&server), at, "race").await;
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let mut client = working(&server);
        tasks.push(tokio::spawn(async move {
            let mut codes = Vec::new();
            for i in 0..EACH {
                let outcome = client
                    .remember(RememberRequest {
                        session_id: "race".into(),
                        content: format!("fact {caller}.{i}"),
                        subject: format!("s{caller}.{i}"),
                        predicate: "p".into(),
                        object: "o".into(),
                        ..RememberRequest::default()
                    })
                    .await;
                codes.push(outcome.map(|_| ()).map_err(|err| err.code()));
            }
            codes
        }));
    }
    let mut stored = 0;
    for task in tasks {
        for outcome in task.await.expect("caller") {
            match outcome {
                Ok(()) => stored += 1,
                Err(code) => assert_eq!(code, Code::ResourceExhausted),
            }
        }
    }
    assert_eq!(stored, LIMIT, "the limit's worth stored");
    let facts = ConsolidationServiceClient::new(server.channel.clone())
        .list_facts(ListFactsRequest {
            app: "agent".into(),
            user: "u".into(),
            page_size: 100,
            ..ListFactsRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .facts;
    assert_eq!(facts.len(), LIMIT);
}

/// Goals, tasks and cached files written while the session ends or is
/// deleted: each write lands before the end (and is cleared with the
/// rest) or is refused after it, never left on an ended session, and a
/// racing delete never fails.
async fn working_writes_race_the_session_end(backend: Backend) {
    const ROUNDS: usize = 12;
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let mut sessions = server.sessions();
    for round in 0..ROUNDS {
        let id = format!("r{round}");
        set_goal(&mut working(&server), At(&id, "agent", "u"), "start").await;
        let mut writers = Vec::new();
        for kind in 0..3 {
            let (mut client, id) = (working(&server), id.clone());
            writers.push(tokio::spawn(async move {
                for i in 0..20 {
                    let outcome = match kind {
                        0 => client
                            .set_goal(SetGoalRequest {
                                session_id: id.clone(),
                                goal: format!("goal {i}"),
                                ..SetGoalRequest::default()
                            })
                            .await
                            .map(|_| ()),
                        1 => client
                            .create_task(CreateTaskRequest {
                                session_id: id.clone(),
                                subject: format!("task {i}"),
                                ..CreateTaskRequest::default()
                            })
                            .await
                            .map(|_| ()),
                        _ => client
                            .cache_content(CacheContentRequest {
                                session_id: id.clone(),
                                path: format!("f{i}"),
                                content: "x".into(),
                                ..CacheContentRequest::default()
                            })
                            .await
                            .map(|_| ()),
                    };
                    if let Err(err) = outcome {
                        assert!(
                            matches!(err.code(), Code::FailedPrecondition | Code::NotFound),
                            "{err:?}"
                        );
                    }
                }
            }));
        }
        let deleted = round % 2 == 0;
        if deleted {
            sessions
                .delete_session(DeleteSessionRequest {
                    session_id: id.clone(),
                    ..DeleteSessionRequest::default()
                })
                .await
                .expect("delete");
        } else {
            sessions
                .end_session(EndSessionRequest {
                    session_id: id.clone(),
                    ..EndSessionRequest::default()
                })
                .await
                .expect("end");
        }
        for writer in writers {
            writer.await.expect("writer");
        }
        if deleted {
            // The id is free, and nothing of the old session comes back.
            set_goal(&mut working(&server), At(&id, "agent", "u"), "").await;
        }
        let snapshot = working(&server)
            .get_snapshot(GetSnapshotRequest {
                session_id: id.clone(),
                ..GetSnapshotRequest::default()
            })
            .await
            .expect("snapshot")
            .into_inner();
        assert_eq!(
            (
                snapshot.goal.as_str(),
                snapshot.tasks.len(),
                snapshot.cache.len()
            ),
            ("", 0, 0),
            "{id} (deleted: {deleted})"
        );
    }
}

/// A task changed while `CleanupSessions` takes its idle session: the
/// change holds the session open as the other working-memory writes do,
/// so the cleanup waits for it and then finds the session active. Without
/// that, the cleanup found the session idle while the change waited for
/// the task's row, then deleted the task the change had just answered for.
/// Here the test's own transaction holds the task's row until both wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_changed_under_a_cleanup_keeps_its_session() {
    let server = TestServer::spawn(Backend::Postgres).await;
    let at = At("idle", "agent", "u");
    let task = create_task(&mut working(&server), at, "before").await;
    // The session and its working memory an hour old: idle for a cleanup
    // of what is older than a minute.
    let mut db = server.db_connection("the test").await;
    for aged in [
        "UPDATE sessions SET create_time = create_time - interval '1 hour', \
         update_time = update_time - interval '1 hour'",
        "UPDATE working_memory SET update_time = update_time - interval '1 hour'",
        "UPDATE working_tasks SET update_time = update_time - interval '1 hour'",
    ] {
        sqlx::query(aged)
            .execute(&mut db)
            .await
            .expect("age the session");
    }
    let row = holding(&server.db.url, "SELECT 1 FROM working_tasks FOR UPDATE").await;
    let mut client = working(&server);
    let (session_id, app, user) = at.parts();
    let request = UpdateTaskRequest {
        session_id,
        app,
        user,
        task_id: task.clone(),
        subject: Some("after".into()),
        ..UpdateTaskRequest::default()
    };
    let changing = tokio::spawn(async move { client.update_task(request).await });
    until_reads(&mut db, LOCK_WAITS, 1, "the change waits for the task").await;
    let mut sessions = server.sessions();
    let cleaning = tokio::spawn(async move {
        sessions
            .cleanup_sessions(CleanupSessionsRequest {
                max_age: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                dry_run: false,
            })
            .await
    });
    until_reads(&mut db, LOCK_WAITS, 2, "the cleanup waits too").await;
    release(row, "ROLLBACK").await;
    let changed = changing
        .await
        .expect("changer")
        .expect("the change")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(changed.subject, "after");
    let cleaned = cleaning.await.expect("cleaner").expect("the cleanup");
    assert_eq!(cleaned.into_inner().sessions_deleted, 0);
    let snapshot = working(&server)
        .get_snapshot(GetSnapshotRequest {
            session_id: "idle".into(),
            app: "agent".into(),
            user: "u".into(),
            ..GetSnapshotRequest::default()
        })
        .await
        .expect("snapshot")
        .into_inner();
    let subjects: Vec<_> = snapshot.tasks.iter().map(|t| t.subject.as_str()).collect();
    assert_eq!(subjects, ["after"]);
}

/// A task, a remembered fact or a procedure created again with its
/// request id (a retry after a reply that was lost) is answered with what
/// the first call made, adds nothing, and takes no room under a limit.
async fn creations_are_safe_to_repeat(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.max_tasks_per_session = Some(2);
        s.max_facts_per_user = Some(1);
    })
    .await;
    let mut client = working(&server);
    let task = |session: &str, subject: &str, request: &str| CreateTaskRequest {
        session_id: session.into(),
        app: "agent".into(),
        user: "u".into(),
        subject: subject.into(),
        request_id: request.into(),
        ..CreateTaskRequest::default()
    };
    let created = |reply: tonic::Response<engram::proto::CreateTaskResponse>| {
        reply.into_inner().task.expect("task")
    };

    let first = created(
        client
            .create_task(task("s", "read the logs", "k1"))
            .await
            .expect("create"),
    );
    let again = created(
        client
            .create_task(task("s", "read the logs", "k1"))
            .await
            .expect("repeat"),
    );
    assert_eq!((first.id.as_str(), &again), ("t1", &first));
    // The repeat took no id: the next task is t2, and the session is full.
    let second = created(
        client
            .create_task(task("s", "fix it", ""))
            .await
            .expect("second"),
    );
    assert_eq!(second.id, "t2");
    let repeated_at_the_limit = created(
        client
            .create_task(task("s", "read the logs", "k1"))
            .await
            .expect("at the limit"),
    );
    assert_eq!(repeated_at_the_limit.id, "t1");
    let full = client
        .create_task(task("s", "one more", "k2"))
        .await
        .expect_err("a new task past the limit");
    assert_eq!(full.code(), Code::ResourceExhausted);
    // Request ids are the session's: another session's k1 is its own.
    let elsewhere = created(
        client
            .create_task(task("s2", "read the logs", "k1"))
            .await
            .expect("s2"),
    );
    assert_eq!(elsewhere.id, "t1");
    let tasks = client
        .list_tasks(ListTasksRequest {
            session_id: "s".into(),
            ..ListTasksRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(
        tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["t1", "t2"]
    );

    // Remember: the repeat is the first fact, even at the fact limit.
    let fact = |content: &str, request: &str| RememberRequest {
        session_id: "s".into(),
        content: content.into(),
        request_id: request.into(),
        ..RememberRequest::default()
    };
    let stored = client
        .remember(fact("prefers tea", "f1"))
        .await
        .expect("remember");
    let stored = stored.into_inner().fact.expect("fact");
    let repeat = client
        .remember(fact("prefers tea", "f1"))
        .await
        .expect("repeat");
    assert_eq!(
        repeat.into_inner().fact.map(|f| f.id),
        Some(stored.id.clone())
    );
    let full = client
        .remember(fact("prefers coffee", "f2"))
        .await
        .expect_err("a new fact past the limit");
    assert_eq!(full.code(), Code::ResourceExhausted);
    let procedure = |request: &str| RecordProcedureRequest {
        app: "agent".into(),
        content: "deploy with argo".into(),
        request_id: request.into(),
        ..RecordProcedureRequest::default()
    };
    let recorded = client
        .record_procedure(procedure("p1"))
        .await
        .expect("record");
    let recorded = recorded.into_inner().fact.expect("fact").id;
    let again = client
        .record_procedure(procedure("p1"))
        .await
        .expect("repeat");
    assert_eq!(again.into_inner().fact.map(|f| f.id), Some(recorded));
    let facts = ConsolidationServiceClient::new(server.channel.clone())
        .list_facts(ListFactsRequest {
            app: "agent".into(),
            page_size: 100,
            ..ListFactsRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .facts;
    assert_eq!(facts.len(), 2, "one fact and one procedure: {facts:?}");

    // The id reused for another request is refused, whatever it is now.
    for (request, what) in [
        (task("s", "another task", "k1"), "another subject"),
        (
            CreateTaskRequest {
                description: "more".into(),
                ..task("s", "read the logs", "k1")
            },
            "another description",
        ),
    ] {
        let err = client.create_task(request).await.expect_err(what);
        assert_eq!(reason(&err), "REQUEST_ID_REUSED", "{what}");
    }
    let err = client
        .remember(fact("prefers coffee", "f1"))
        .await
        .expect_err("another fact under f1");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "REQUEST_ID_REUSED")
    );

    // A bad id is refused before anything is written.
    let err = client
        .create_task(task("s3", "x", "has space"))
        .await
        .expect_err("bad request id");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_REQUEST_ID")
    );
    let err = client
        .remember(fact("x", &"r".repeat(129)))
        .await
        .expect_err("too long");
    assert_eq!(reason(&err), "INVALID_REQUEST_ID");
}

/// An LLM tool call forwarded again under its id (the runtime's retry, a
/// replayed step) is answered with what the first one made: one task, one
/// fact. The id reused for other arguments is the forwarding program's
/// mistake, a status, not a result for the model.
async fn tool_calls_are_keyed_by_their_id(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = working(&server);
    let at = At("tools-keyed", "agent", "u");
    let (session_id, app, user) = at.parts();
    let forward = |name: &str, arguments: Value, request_id: &str| CallToolRequest {
        session_id: session_id.clone(),
        app: app.clone(),
        user: user.clone(),
        name: name.into(),
        arguments: Some(json_to_proto(&arguments)),
        request_id: request_id.into(),
    };
    let result = |reply: tonic::Response<engram::proto::CallToolResponse>| {
        let reply = reply.into_inner();
        assert!(!reply.is_error, "{reply:?}");
        engram::api::convert::json_from_proto(prost_types::Value {
            kind: reply.result.map(prost_types::value::Kind::StructValue),
        })
        .expect("a JSON result")
    };

    let create = json!({"subject": "Trace the failing path"});
    let mut made = Vec::new();
    for _ in 0..2 {
        let reply = client
            .call_tool(forward("TaskCreate", create.clone(), "call_7f3a"))
            .await
            .expect("TaskCreate");
        made.push(result(reply));
    }
    assert_eq!(made[0], made[1]);
    assert_eq!(made[0]["taskId"], "t1");
    // The alias is the same tool, and the same call.
    let alias = client
        .call_tool(forward("memory.task_create", create.clone(), "call_7f3a"))
        .await
        .expect("alias");
    assert_eq!(result(alias), made[0]);
    let (next, _) = call(&mut client, at, "TaskCreate", json!({"subject": "Fix it"})).await;
    assert_eq!(next["taskId"], "t2");

    let remember = json!({"content": "deploys go through argo"});
    let first = client
        .call_tool(forward("Remember", remember.clone(), "toolu_01"))
        .await
        .expect("Remember");
    let first = result(first);
    let again = client
        .call_tool(forward("Remember", remember, "toolu_01"))
        .await
        .expect("Remember again");
    assert_eq!(result(again), first);
    let snapshot = client
        .get_snapshot(GetSnapshotRequest {
            session_id: "tools-keyed".into(),
            app: "agent".into(),
            user: "u".into(),
            ..GetSnapshotRequest::default()
        })
        .await
        .expect("snapshot")
        .into_inner();
    assert_eq!(
        (snapshot.tasks.len(), snapshot.facts.len()),
        (2, 1),
        "{snapshot:?}"
    );

    // Another call under a used id, or a bad id: a status with its reason.
    let err = client
        .call_tool(forward(
            "TaskCreate",
            json!({"subject": "Something else"}),
            "call_7f3a",
        ))
        .await
        .expect_err("the id reused");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "REQUEST_ID_REUSED")
    );
    let err = client
        .call_tool(forward("TaskCreate", create, "call 1"))
        .await
        .expect_err("a bad id");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_REQUEST_ID")
    );
    // The setters need no key, and take one without complaint.
    let moved = client
        .call_tool(forward(
            "TaskUpdate",
            json!({"taskId": "t1", "status": "completed"}),
            "call_8",
        ))
        .await
        .expect("TaskUpdate");
    assert_eq!(result(moved)["status"], "completed");
}

/// Many tries of one creation at once (a retry racing its first try): one
/// task and one fact, and every answer is that one.
async fn racing_repeats_create_once(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let at = At("raced", "agent", "u");
    set_goal(&mut working(&server), at, "race").await;
    let tries = (0..12).map(|_| {
        let mut client = working(&server);
        tokio::spawn(async move {
            let task = client
                .create_task(CreateTaskRequest {
                    session_id: "raced".into(),
                    subject: "once".into(),
                    request_id: "task-1".into(),
                    ..CreateTaskRequest::default()
                })
                .await
                .expect("create")
                .into_inner()
                .task
                .expect("task")
                .id;
            let fact = client
                .remember(RememberRequest {
                    session_id: "raced".into(),
                    content: "once".into(),
                    request_id: "fact-1".into(),
                    ..RememberRequest::default()
                })
                .await
                .expect("remember")
                .into_inner()
                .fact
                .expect("fact")
                .id;
            (task, fact)
        })
    });
    let answers: Vec<(String, String)> = futures::future::join_all(tries)
        .await
        .into_iter()
        .map(|joined| joined.expect("joined"))
        .collect();
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert_eq!(answers[0].0, "t1");
    let facts = ConsolidationServiceClient::new(server.channel.clone())
        .list_facts(ListFactsRequest {
            app: "agent".into(),
            user: "u".into(),
            ..ListFactsRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .facts;
    assert_eq!(facts.len(), 1);
}

on_both_stores!(
    creations_are_safe_to_repeat,
    tool_calls_are_keyed_by_their_id,
    racing_repeats_create_once,
    working_writes_race_the_session_end,
    racing_remembers_stop_at_the_fact_limit,
    the_block_for_a_query,
    the_rendered_block,
    tools_as_an_llm_calls_them,
    secrets_are_redacted,
    isolation_and_end_session,
    limits_are_enforced,
);
