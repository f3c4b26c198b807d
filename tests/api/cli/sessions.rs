//! `engram sessions ...` and `engram episodes ...`.

use serde_json::{Value, json};

use super::Cli;
use crate::helpers::{Backend, TestServer};

/// A creation rerun with its request id (a job run again) answers with
/// the session the first run made; without one, a new session each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_creation_rerun_with_its_request_id_makes_nothing() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let sessions = Cli {
        server: format!("http://{}", server.grpc_addr()),
        group: "sessions",
    };
    let keyed = [
        "create",
        "--app",
        "agent",
        "--user",
        "u2",
        "--request-id",
        "job-1",
    ];
    let first = sessions.json(&keyed);
    assert_eq!(sessions.json(&keyed)["id"], first["id"]);
    let other = sessions.json(&["create", "--app", "agent", "--user", "u2"]);
    assert_ne!(other["id"], first["id"]);
    let reused = sessions.run(&[
        "create",
        "--app",
        "agent",
        "--user",
        "u3",
        "--request-id",
        "job-1",
    ]);
    assert_eq!(reused.code, 2, "another request under the id is bad input");
    assert!(
        reused.stderr.contains("REQUEST_ID_REUSED"),
        "{}",
        reused.stderr
    );
    let stats = sessions.json(&["stats"]);
    assert_eq!(stats["total_sessions"], json!(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_episode_commands_against_a_server() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let address = format!("http://{}", server.grpc_addr());
    let sessions = Cli {
        server: address.clone(),
        group: "sessions",
    };
    let episodes = Cli {
        server: address,
        group: "episodes",
    };

    let created = sessions.json(&[
        "create",
        "--app",
        "agent",
        "--user",
        "u1",
        "--id",
        "chat",
        "--metadata",
        r#"{"k": 1}"#,
    ]);
    assert_eq!(
        (&created["id"], &created["user"], &created["metadata"]),
        (&json!("chat"), &json!("u1"), &json!({"k": 1}))
    );
    let taken = sessions.run(&["create", "--app", "agent", "--user", "u1", "--id", "chat"]);
    assert_eq!(taken.code, 4, "a taken id is a conflict");
    assert!(taken.stderr.contains("SESSION_EXISTS"), "{}", taken.stderr);
    let again = sessions.json(&[
        "create",
        "--app",
        "agent",
        "--user",
        "u1",
        "--id",
        "chat",
        "--if-missing",
    ]);
    assert_eq!(again["create_time"], created["create_time"]);

    let hello = episodes.json(&[
        "append",
        "chat",
        "Hello!",
        "--type",
        "user_message",
        "--id",
        "e1",
    ]);
    assert_eq!(
        (&hello["seq"], &hello["replayed"]),
        (&json!(1), &json!(false))
    );
    let retry = episodes.json(&[
        "append",
        "chat",
        "Hello!",
        "--type",
        "user_message",
        "--id",
        "e1",
    ]);
    assert_eq!(retry["replayed"], json!(true));
    episodes.json(&[
        "append",
        "chat",
        r#"{"tool": "calc"}"#,
        "--type",
        "tool_call",
    ]);
    episodes.json(&["append", "chat", "Hi there!", "--type", "agent_response"]);
    // A new session in one call, with its owner.
    episodes.json(&["append", "other", "x", "--app", "agent", "--user", "u2"]);

    let listed = episodes.json(&["list", "chat"]);
    let seqs: Vec<i64> = listed["episodes"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|e| e["seq"].as_i64())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    let tools = episodes.json(&["list", "chat", "--type", "tool_call"]);
    assert_eq!(tools["episodes"][0]["content"], json!({"tool": "calc"}));
    let got = episodes.json(&["get", "e1"]);
    assert_eq!(
        (&got["session_id"], &got["seq"], &got["content"]),
        (&json!("chat"), &json!(1), &json!("Hello!"))
    );
    let recent = episodes.json(&["recent", "--user", "u1", "--limit", "1"]);
    assert_eq!(recent["episodes"][0]["content"], json!("Hi there!"));
    let context = episodes.json(&["context", "chat"]);
    assert_eq!(
        context["context"],
        json!("User: Hello!\nAssistant: Hi there!")
    );
    let text = episodes.run_as("text", &["context", "chat"]);
    assert_eq!(text.stdout, "User: Hello!\nAssistant: Hi there!\n");
    // A session of other types only: nothing on stdout, and why.
    let none = episodes.run_as("text", &["context", "other"]);
    assert_eq!((none.code, none.stdout.as_str()), (0, ""));
    assert!(
        none.stderr
            .contains("no messages: a conversation is made of"),
        "{}",
        none.stderr
    );

    // Tail replays from a cursor and says where to resume.
    let tail = episodes.run(&["tail", "--cursor", "0", "--limit", "4"]);
    assert_eq!(tail.code, 0, "{}", tail.stderr);
    let lines: Vec<Value> = tail
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON episode per line"))
        .collect();
    assert_eq!(lines.len(), 4);
    let last = lines[3]["cursor"].as_i64().expect("cursor");
    assert!(
        tail.stderr
            .contains(&format!("resume with --cursor {last}")),
        "{}",
        tail.stderr
    );

    let stats = sessions.json(&["stats"]);
    assert_eq!(
        (&stats["total_sessions"], &stats["total_episodes"]),
        (&json!(2), &json!(4))
    );
    // `-` reads the content from standard input, without its trailing
    // newlines.
    let piped = episodes.json_from_stdin(&["append", "other", "-"], "$ make\nok\n");
    assert_eq!(piped["seq"], json!(2));
    let other = episodes.json(&["list", "other"]);
    assert_eq!(other["episodes"][1]["content"], json!("$ make\nok"));
    let text = sessions.run_as("text", &["stats"]);
    assert_eq!(
        text.stdout,
        "2 sessions, 5 episodes (2.5 per session); evicted: 0 sessions, 0 episodes\n"
    );
    let all = sessions.json(&["list", "--user", "u1"]);
    assert_eq!(all["sessions"].as_array().map(Vec::len), Some(1));
    let ended = sessions.json(&["end", "chat"]);
    assert!(ended["session"]["end_time"].is_string());
    let refused = episodes.run(&["append", "chat", "late"]);
    assert_eq!(refused.code, 2);
    assert!(
        refused.stderr.contains("SESSION_ENDED"),
        "{}",
        refused.stderr
    );
    let dry = sessions.json(&["cleanup", "--max-age", "1h", "--dry-run"]);
    assert_eq!(dry["sessions_deleted"], json!(0));
    let bad_age = sessions.run(&["cleanup", "--max-age", "1w"]);
    assert_eq!(bad_age.code, 2);
    let deleted = sessions.json(&["delete", "chat"]);
    assert_eq!(deleted["episodes_deleted"], json!(3));
    let gone = sessions.run(&["get", "chat"]);
    assert_eq!(gone.code, 3);
    assert!(gone.stderr.contains("SESSION_NOT_FOUND"), "{}", gone.stderr);

    // forget-user counts with --dry-run, then deletes.
    episodes.json(&[
        "append",
        "fg",
        "forget me",
        "--app",
        "agent",
        "--user",
        "u9",
    ]);
    let forget = Cli {
        server: sessions.server.clone(),
        group: "forget-user",
    };
    let dry = forget.json(&["--app", "agent", "--user", "u9", "--dry-run"]);
    assert_eq!(
        (&dry["sessions"], &dry["episodes"], &dry["dry_run"]),
        (&json!(1), &json!(1), &json!(true))
    );
    assert_eq!(sessions.run(&["get", "fg"]).code, 0);
    let done = forget.json(&["--app", "agent", "--user", "u9"]);
    assert_eq!(
        (&done["sessions"], &done["dry_run"]),
        (&json!(1), &json!(false))
    );
    assert_eq!(sessions.run(&["get", "fg"]).code, 3);
}

/// `episodes load` appends a file of JSON Lines in batches (1,200 lines:
/// three calls), and running it again adds nothing: every line has an id,
/// its own or one derived from the line, so the rerun is a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_loads_from_a_file_and_loads_again_as_a_replay() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let episodes = Cli {
        server: format!("http://{}", server.grpc_addr()),
        group: "episodes",
    };
    let mut lines = vec![
        json!({"id": "first", "type": "user_message", "content": "What is 2+2?",
               "metadata": {"intent": "noop"}})
        .to_string(),
    ];
    lines.extend((1..1200).map(|n| json!({"content": {"turn": n}, "agent": "coder"}).to_string()));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("log.jsonl");
    std::fs::write(&file, lines.join("\n")).expect("write the log");
    let path = file.to_str().expect("a path");
    let at = ["--app", "agent", "--user", "u1"];
    let load = |args: &[&str]| episodes.json(&[&["load", "chat-log"], args, &at[..]].concat());

    let loaded = load(&[path]);
    assert_eq!(
        (&loaded["added"], &loaded["replayed"]),
        (&json!(1200), &json!(0)),
        "{loaded}"
    );
    let again = load(&[path]);
    assert_eq!(
        (&again["added"], &again["replayed"]),
        (&json!(0), &json!(1200)),
        "{again}"
    );
    // One more line, from standard input: only it is added.
    let more = episodes.json_from_stdin(
        &[&["load", "chat-log", "-"], &at[..]].concat(),
        &json!({"content": "the end"}).to_string(),
    );
    assert_eq!((&more["added"], &more["replayed"]), (&json!(1), &json!(0)));
    let listed = episodes.json(&["list", "chat-log"]);
    let log = listed["episodes"].as_array().expect("episodes");
    assert_eq!(log.len(), 1201);
    assert_eq!(
        (&log[0]["id"], &log[0]["type"], &log[0]["seq"]),
        (&json!("first"), &json!("user_message"), &json!(1))
    );
    assert_eq!(log[1199]["content"], json!({"turn": 1199}));
    assert_eq!(log[1200]["content"], json!("the end"));

    // A line that does not fit is named, and nothing is sent.
    std::fs::write(&file, "{\"content\": 1}\n{\"contnet\": 2}\n").expect("write");
    let refused = episodes.run(&[&["load", "typo", path], &at[..]].concat());
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("line 2: unknown field `contnet`"),
        "{}",
        refused.stderr
    );
    assert_eq!(episodes.run(&["list", "typo"]).code, 3, "no session made");
}
