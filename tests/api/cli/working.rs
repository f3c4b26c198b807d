//! `engram working ...`: goals, tasks, the file cache, snapshots and tools.

use serde_json::json;

use super::Cli;
use crate::helpers::{Backend, TestServer};

/// A creation rerun with its request id (a job run again) answers with
/// what the first run made; without one, each run makes another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creations_rerun_with_their_request_id_make_nothing() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let cli = Cli {
        server: format!("http://{}", server.grpc_addr()),
        group: "working",
    };
    let at = ["--session", "job", "--app", "coder", "--user", "alice"];
    let with = |args: &[&'static str]| [args, &at[..]].concat();
    let keyed = with(&["task-create", "Trace it", "--request-id", "job-1-task"]);
    assert_eq!(cli.json(&keyed)["id"], json!("t1"));
    assert_eq!(cli.json(&keyed)["id"], json!("t1"));
    assert_eq!(
        cli.json(&with(&["task-create", "Trace it"]))["id"],
        json!("t2")
    );
    let fact = with(&["remember", "runs on Fridays", "--request-id", "job-1-fact"]);
    let first = cli.json(&fact);
    assert_eq!(cli.json(&fact)["fact_id"], first["fact_id"]);
    // A tool call forwarded again under its call id.
    let call = with(&[
        "call",
        "TaskCreate",
        r#"{"subject": "Write a test"}"#,
        "--request-id",
        "call_7f3a",
    ]);
    assert_eq!(cli.json(&call)["result"]["taskId"], json!("t3"));
    assert_eq!(cli.json(&call)["result"]["taskId"], json!("t3"));
    let snapshot = cli.json(&with(&["snapshot"]));
    assert_eq!(
        (
            snapshot["tasks"].as_array().map(Vec::len),
            snapshot["facts"].as_array().map(Vec::len)
        ),
        (Some(3), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_memory_commands_against_a_server() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let cli = Cli {
        server: format!("http://{}", server.grpc_addr()),
        group: "working",
    };
    let at = ["--session", "chat-1", "--app", "coder", "--user", "alice"];
    let with = |args: &[&'static str]| [args, &at[..]].concat();

    assert_eq!(
        cli.json(&with(&["goal", "Fix the auth bug"]))["goal"],
        json!("Fix the auth bug")
    );
    assert_eq!(
        cli.json(&with(&["task-create", "Trace it"]))["id"],
        json!("t1")
    );
    let updated = cli.json(&with(&["task-update", "t1", "--status", "in-progress"]));
    assert_eq!(updated["status"], json!("in_progress"));
    let renamed = cli.json(&with(&["task-update", "t1", "--subject", "Trace the bug"]));
    assert_eq!(
        (&renamed["subject"], &renamed["status"]),
        (&json!("Trace the bug"), &json!("in_progress"))
    );
    let nothing = cli.run(&with(&["task-update", "t1"]));
    assert_eq!(nothing.code, 2, "an update that changes nothing is refused");
    assert!(nothing.stderr.contains("--status"), "{}", nothing.stderr);
    cli.json(&with(&["task-update", "t1", "--subject", "Trace it"]));
    let remembered = cli.json(&with(&["remember", "deploy with token=abc123"]));
    assert_eq!(remembered["content"], json!("deploy with token=[REDACTED]"));
    let facts = Cli {
        server: cli.server.clone(),
        group: "facts",
    };
    let listed = facts.run_as("text", &["list"]);
    assert!(
        listed
            .stdout
            .ends_with("coder/alice  v1  \"deploy with token=[REDACTED]\"  [remember]\n"),
        "a fact from no episode names its source alone: {}",
        listed.stdout
    );
    cli.json(&["procedure", "Run the linter first", "--app", "coder"]);
    let cached = cli.json(&with(&["cache", "src/auth.rs", "fn validate() {}"]));
    assert_eq!(cached["bytes"], json!(16));
    let said = cli.run_as("text", &with(&["cache", "src/auth.rs", "fn validate() {}"]));
    assert_eq!(said.stdout, "cached src/auth.rs (16 bytes)\n");
    // A file longer than one command-line argument may be (128 KiB on
    // Linux) is piped in, kept as it is, its last newline too.
    let file = "fn f() {}\n".repeat(20_000);
    let other = ["--session", "chat-2", "--app", "coder", "--user", "alice"];
    let piped = cli.json_from_stdin(
        &[&["cache", "src/long.rs", "-"], &other[..]].concat(),
        &file,
    );
    assert_eq!(piped["bytes"], json!(200_000));
    let called = cli.json(&with(&[
        "call",
        "TaskCreate",
        r#"{"subject": "Write a test"}"#,
    ]));
    assert_eq!(
        (&called["result"]["taskId"], &called["is_error"]),
        (&json!("t2"), &json!(false))
    );
    let bad = cli.json(&with(&[
        "call",
        "TaskUpdate",
        r#"{"taskId": "t9", "status": "completed"}"#,
    ]));
    assert_eq!(bad["is_error"], json!(true));
    let tasks = cli.json(&with(&["tasks"]));
    assert_eq!(tasks["tasks"].as_array().map(Vec::len), Some(2));
    let rendered = cli.json(&with(&["render"]));
    assert_eq!(
        rendered["memory_block"],
        json!(
            "# MEMORY\n## Goal\nFix the auth bug\n## Todos (2)\n- [in_progress] t1: Trace it\n- [pending] t2: Write a test\n## Facts (1)\n- deploy with token=[REDACTED]\n## Procedures (1)\n- Run the linter first"
        )
    );
    cli.json(&with(&["remember", "the staging cluster runs on Fridays"]));
    let focused = cli.json(&with(&[
        "render",
        "--max-facts",
        "1",
        "--query",
        "staging cluster",
    ]));
    let block = focused["memory_block"].as_str().expect("block");
    assert!(
        block.contains("## Facts (1)\n- the staging cluster runs on Fridays"),
        "{block}"
    );
    let refused = cli.run(&with(&["render", "--query=-only"]));
    assert_eq!(refused.code, 2);
    assert!(
        refused.stderr.contains("INVALID_QUERY"),
        "{}",
        refused.stderr
    );
    let triple = cli.json(&with(&[
        "remember",
        "alice prefers tabs",
        "--subject",
        "alice",
        "--predicate",
        "prefers",
        "--object",
        "tabs",
    ]));
    let snapshot = cli.json(&with(&["snapshot", "--max-facts", "10"]));
    assert_eq!(snapshot["goal"], json!("Fix the auth bug"));
    assert_eq!(
        snapshot["tasks"][0]["subject"],
        json!("Trace it"),
        "{snapshot}"
    );
    let stated = snapshot["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .find(|f| f["id"] == triple["fact_id"])
        .expect("the fact with a triple");
    assert_eq!(
        (
            &stated["current"]["subject"],
            &stated["current"]["predicate"],
            &stated["current"]["object"]
        ),
        (&json!("alice"), &json!("prefers"), &json!("tabs"))
    );
    assert_eq!(snapshot["procedures"].as_array().map(Vec::len), Some(1));
    assert_eq!(snapshot["cache"][0]["path"], json!("src/auth.rs"));
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["working", "--server", &cli.server, "snapshot"])
        .args(at)
        .output()
        .expect("run engram working snapshot");
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(
        shown.starts_with("goal: Fix the auth bug\ntasks (2):\n  [in_progress] t1: Trace it"),
        "{shown}"
    );
    assert!(
        shown.contains("\ncache (1):\n  src/auth.rs (16 bytes)"),
        "{shown}"
    );
    let tools = cli.json(&["tools"]);
    assert_eq!(tools["tools"].as_array().map(Vec::len), Some(4));
    let listed = cli.run_as("text", &["tools"]);
    assert!(
        listed
            .stdout
            .starts_with("TaskCreate (also memory.task_create): "),
        "{}",
        listed.stdout
    );
    assert!(
        listed.stdout.contains("\nmemory.set_goal: "),
        "{}",
        listed.stdout
    );
    let missing = cli.run(&["tasks"]);
    assert_eq!(missing.code, 2, "--session is required");
    let other = cli.run(&["tasks", "--session", "chat-1", "--user", "mallory"]);
    assert_eq!(other.code, 2);
    assert!(
        other.stderr.contains("SESSION_OWNER_MISMATCH"),
        "{}",
        other.stderr
    );
}
