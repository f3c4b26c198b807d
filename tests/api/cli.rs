//! `engram memory|sessions|episodes ...` against a real server: JSON output parsed and
//! checked, exit codes, and one-line errors with the reason.

use serde_json::{Value, json};

use crate::helpers::{Backend, TestServer};

struct Cli {
    server: String,
    /// The command group: memory, sessions, episodes.
    group: &'static str,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Cli {
    fn run(&self, args: &[&str]) -> Run {
        self.run_as("json", args)
    }

    /// Runs the command with `--output` `output`.
    fn run_as(&self, output: &str, args: &[&str]) -> Run {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .arg(self.group)
            .args(["--server", &self.server, "--output", output])
            .args(args)
            .env_remove("ENGRAM_SCOPE")
            .env_remove("ENGRAM_SCOPE_TYPE")
            .output()
            .expect("run engram memory");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs the command with `input` on its standard input; it must
    /// succeed, and its JSON output is parsed.
    fn json_from_stdin(&self, args: &[&str], input: &str) -> Value {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .arg(self.group)
            .args(["--server", &self.server, "--output", "json"])
            .args(args)
            .env_remove("ENGRAM_SCOPE")
            .env_remove("ENGRAM_SCOPE_TYPE")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run engram");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("write stdin");
        drop(stdin);
        let out = child.wait_with_output().expect("wait for engram");
        assert!(
            out.status.success(),
            "engram {} {args:?} failed: {}",
            self.group,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|err| panic!("{err}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// Runs a command that must succeed and parses its JSON output.
    fn json(&self, args: &[&str]) -> Value {
        let run = self.run(args);
        assert_eq!(
            run.code, 0,
            "engram {} {args:?} failed: {}",
            self.group, run.stderr
        );
        serde_json::from_str(&run.stdout).unwrap_or_else(|err| panic!("{err}: {}", run.stdout))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_commands_against_a_server() {
    // Retention is applied by hand here, not by the server's scheduler.
    let server =
        TestServer::spawn_with(Backend::Sqlite, |s| s.retention_interval_secs = Some(0)).await;
    let cli = Cli {
        server: format!(
            "http://{}",
            server.server.as_ref().expect("running").grpc_addr
        ),
        group: "memory",
    };
    let scope = ["--scope", "prefs", "--scope-type", "namespace"];
    let with = |args: &[&'static str]| [args, &scope[..]].concat();

    // set parses JSON when it can, else stores a string.
    let first = cli.json(&with(&["set", "user/theme", r#"{"mode": "dark", "n": 2}"#]));
    assert_eq!(
        (first["version"].as_i64(), &first["value"]),
        (Some(1), &json!({"mode": "dark", "n": 2}))
    );
    let second = cli.json(&with(&["set", "user/theme", "just words"]));
    assert_eq!(second["value"], json!("just words"));
    cli.json(&with(&["set", "user/lang", "42"]));
    assert_eq!(cli.json(&with(&["get", "user/lang"]))["value"], json!(42));
    assert_eq!(
        cli.json(&with(&["get", "user/theme", "--version", "1"]))["value"]["mode"],
        json!("dark")
    );

    // `--json` is `--output json`, and the two together are a usage error.
    let plain = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(["memory", "--server", &cli.server])
            .args(args)
            .args(scope)
            .output()
            .expect("run engram memory")
    };
    let out = plain(&["get", "user/lang", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).expect("json"),
        cli.json(&with(&["get", "user/lang"]))
    );
    let both = plain(&["get", "user/lang", "--json", "--output", "text"]);
    assert_eq!(both.status.code(), Some(2));

    // Connection flags before the subcommand, as kubectl and grpcurl take
    // them, reach the same server.
    let first = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args([
            "--server",
            &cli.server,
            "--json",
            "memory",
            "get",
            "user/lang",
        ])
        .args(scope)
        .env("ENGRAM_SERVER", "http://127.0.0.1:9")
        .output()
        .expect("run engram");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&first.stdout).expect("json")["value"],
        json!(42)
    );

    let listed = cli.json(&with(&["list", "--prefix", "user/"]));
    let keys: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert_eq!(keys, vec!["user/lang", "user/theme"]);

    // A lost compare-and-set exits with the conflict code and the reason.
    let conflict = cli.run(&with(&[
        "set",
        "user/theme",
        "x",
        "--expected-version",
        "1",
    ]));
    assert_eq!(conflict.code, 4);
    assert!(
        conflict.stderr.contains("VERSION_MISMATCH"),
        "{}",
        conflict.stderr
    );
    assert_eq!(
        conflict.stderr.lines().count(),
        1,
        "one line: {}",
        conflict.stderr
    );

    let tombstone = cli.json(&with(&["delete", "user/lang", "--request-id", "d1"]));
    assert_eq!(
        (
            tombstone["deleted"].as_bool(),
            tombstone["version"].as_i64()
        ),
        (Some(true), Some(2))
    );
    // A retried delete answers with the first tombstone; without the id
    // there is nothing left to delete.
    let retried = cli.json(&with(&["delete", "user/lang", "--request-id", "d1"]));
    assert_eq!(retried, tombstone);
    assert_eq!(cli.run(&with(&["delete", "user/lang"])).code, 3);
    let missing = cli.run(&with(&["get", "user/lang"]));
    assert_eq!(missing.code, 3);
    assert!(missing.stderr.contains("KEY_DELETED"), "{}", missing.stderr);
    let invalid = cli.run(&with(&["set", "bad:key", "1"]));
    assert_eq!(invalid.code, 2);
    assert!(
        invalid.stderr.contains("INVALID_IDENTIFIER"),
        "{}",
        invalid.stderr
    );

    // History streams JSON Lines, oldest first.
    let history = cli.run(&with(&["history", "user/theme"]));
    assert_eq!(history.code, 0, "{}", history.stderr);
    let versions: Vec<i64> = history
        .stdout
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).expect("json line")["version"]
                .as_i64()
                .expect("version")
        })
        .collect();
    assert_eq!(versions, vec![1, 2]);

    // Maintenance: compact, dry-run purge, purge, the log.
    let compacted = cli.json(&with(&[
        "compact",
        "user/theme",
        "--history",
        "--target",
        "user/summary",
    ]));
    assert_eq!(compacted["entry"]["key"], json!("user/summary"));
    assert_eq!(compacted["record"]["source_versions"], json!([1, 2]));
    let dry = cli.json(&with(&["purge", "user/theme", "--keep", "1", "--dry-run"]));
    assert_eq!(
        (dry["versions_deleted"].as_i64(), dry["dry_run"].as_bool()),
        (Some(1), Some(true))
    );
    assert!(dry["record"].is_null());
    let said = cli.run_as(
        "text",
        &with(&["purge", "user/theme", "--keep", "1", "--dry-run"]),
    );
    assert_eq!(said.stdout, "would delete 1 version of 1 key\n");
    let purged = cli.json(&with(&["purge-scope", "--keep", "1", "--include-deleted"]));
    assert_eq!(
        purged["versions_deleted"].as_i64(),
        Some(2),
        "theme v1 and lang v1"
    );
    let text = cli.run_as("text", &with(&["log"]));
    assert!(
        text.stdout
            .lines()
            .next()
            .unwrap_or_default()
            .ends_with("purge    2 versions of 2 keys (keep 1)"),
        "{}",
        text.stdout
    );
    let log = cli.json(&with(&["log"]));
    let operations: Vec<&str> = log
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["operation"].as_str())
        .collect();
    assert_eq!(operations, vec!["purge", "compact"]);

    let scopes = cli.json(&["scopes"]);
    assert_eq!(
        scopes,
        json!([{"scope_type": "namespace", "scope": "prefs", "entry_count": 2, "purged_count": 0}])
    );
    let text = cli.run_as("text", &["scopes"]);
    assert_eq!(text.stdout, "namespace  prefs  (2 entries)\n");
    let reindex = cli.json(&["reindex"]);
    assert_eq!(
        (reindex["applied"].as_bool(), reindex["tags_added"].as_i64()),
        (Some(false), Some(0))
    );

    // rollback writes an old value as a new version, with an audit key.
    cli.json(&with(&["set", "notes", "draft"]));
    cli.json(&with(&["set", "notes", "final"]));
    let rolled = cli.json(&with(&["rollback", "notes", "--to-version", "1"]));
    assert_eq!(
        (
            rolled["entry"]["version"].as_i64(),
            &rolled["entry"]["value"]
        ),
        (Some(3), &json!("draft"))
    );
    assert!(
        rolled["audit_key"]
            .as_str()
            .is_some_and(|key| key.starts_with("_compaction/")),
        "{rolled}"
    );

    // watch replays from a revision (JSON Lines) and stops at --limit.
    let watched = cli.run(&with(&["watch", "--from-revision", "0", "--limit", "3"]));
    assert_eq!(watched.code, 0, "{}", watched.stderr);
    let changes: Vec<Value> = watched
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let shape: Vec<(&str, &str, i64)> = changes
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap_or(""),
                c["key"].as_str().unwrap_or(""),
                c["version"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            ("set", "user/theme", 1),
            ("set", "user/theme", 2),
            ("set", "user/lang", 1)
        ]
    );
    let last = changes[2]["revision"].as_i64().expect("revision");
    assert!(
        watched.stderr.contains(&format!("--from-revision {last}")),
        "{}",
        watched.stderr
    );

    // --as-of reads memory as it was; what was purged since says so.
    let at_first = changes[0]["revision"]
        .as_i64()
        .expect("revision")
        .to_string();
    let at_third = last.to_string();
    let mut args = vec!["get", "user/theme", "--as-of", &at_first];
    args.extend_from_slice(&scope);
    let purged_since = cli.run(&args);
    assert_eq!(purged_since.code, 3, "{}", purged_since.stderr);
    assert!(
        purged_since.stderr.contains("VERSION_PURGED"),
        "{}",
        purged_since.stderr
    );
    let mut args = vec!["list", "--as-of", &at_third];
    args.extend_from_slice(&scope);
    let then = cli.json(&args);
    assert_eq!(
        then[0],
        json!({"key": "user/lang", "purged": true}),
        "{then}"
    );
    assert_eq!(
        (&then[1]["key"], &then[1]["version"], &then[1]["value"]),
        (&json!("user/theme"), &json!(2), &json!("just words")),
        "{then}"
    );
    // A duration reads that long ago: nothing an hour ago, the current
    // version now (0s).
    let mut args = vec!["get", "user/theme", "--as-of", "1h"];
    args.extend_from_slice(&scope);
    let hour_ago = cli.run(&args);
    assert_eq!(hour_ago.code, 3, "{}", hour_ago.stderr);
    assert!(
        hour_ago
            .stderr
            .contains("key \"user/theme\" did not exist at time "),
        "{}",
        hour_ago.stderr
    );
    let mut args = vec!["get", "user/theme", "--as-of", "0s"];
    args.extend_from_slice(&scope);
    let now = cli.run(&args);
    assert_eq!(now.code, 0, "{}", now.stderr);
    for (point, says) in [
        (
            "yesterday",
            "\"yesterday\" is not a revision (42), an RFC 3339 time \
             (2026-11-23T12:00:00Z) or a duration ago (30m, 2h, 7d)\n",
        ),
        (
            "2026-13-01T00:00:00Z",
            "or a duration ago (30m, 2h, 7d): input is out of range\n",
        ),
        ("5w", "unknown unit \"w\""),
    ] {
        let mut args = vec!["get", "user/theme", "--as-of", point];
        args.extend_from_slice(&scope);
        let refused = cli.run(&args);
        assert_eq!(refused.code, 2, "{point}: {}", refused.stderr);
        assert!(refused.stderr.contains(says), "{}", refused.stderr);
    }

    // fork copies the live entries into a new scope.
    let forked = cli.json(&with(&["fork", "--to-scope", "prefs-copy"]));
    assert_eq!(forked["keys_copied"].as_i64(), Some(3), "{forked}");
    let copy = cli.json(&["list", "--scope", "prefs-copy"]);
    let copied: Vec<(&str, i64)> = copy
        .as_array()
        .expect("array")
        .iter()
        .map(|e| {
            (
                e["key"].as_str().unwrap_or(""),
                e["version"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        copied,
        vec![("notes", 1), ("user/summary", 1), ("user/theme", 1)]
    );

    // retention: preview, declare, read back, apply.
    let preview = cli.json(&with(&["retention", "--keep", "1", "--dry-run"]));
    assert_eq!(
        (&preview["retention"], &preview["dry_run"]),
        (&Value::Null, &json!(true))
    );
    let declared = cli.json(&with(&["retention", "--keep", "1", "--max-age", "30d"]));
    assert_eq!(
        (
            &declared["retention"]["keep_versions"],
            &declared["retention"]["max_age_seconds"]
        ),
        (&json!(1), &json!(2_592_000))
    );
    let read = cli.json(&with(&["retention-get"]));
    assert_eq!(read["keep_versions"], json!(1));
    let applied = cli.json(&with(&["retention-apply"]));
    assert_eq!(
        applied["record"]["operation"],
        json!("retention"),
        "{applied}"
    );
    let bad = cli.run(&with(&["retention", "--max-age", "1w"]));
    assert_eq!(bad.code, 2, "{}", bad.stderr);

    // `-` reads the value from standard input, JSON or text, without the
    // trailing newlines a file or `echo` ends with.
    let piped = ["set", "piped", "-", "--scope", "notes"];
    let got = cli.json_from_stdin(&piped, "{\"n\": [1, 2]}\n");
    assert_eq!(got["value"], json!({"n": [1, 2]}));
    let got = cli.json_from_stdin(&piped, "two\nlines\n\n");
    assert_eq!(got["value"], json!("two\nlines"));

    // JSON with a typo is kept as the string it is, and stderr says so.
    let typo = cli.run(&["set", "typo", r#"{"mode": dark}"#, "--scope", "notes"]);
    assert_eq!(typo.code, 0, "{}", typo.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&typo.stdout).expect("json")["value"],
        json!(r#"{"mode": dark}"#)
    );
    assert!(typo.stderr.contains("not valid JSON"), "{}", typo.stderr);
    // Output to a pipe whose reader has gone (`| head` took its lines)
    // ends the command quietly, as it ends grep; it panicked with a
    // backtrace. The reader is closed before the command starts, so every
    // write it makes fails.
    for args in [
        &["list", "--output", "text"][..],
        &["list", "--output", "json"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(["memory", "--server", &cli.server])
            .args(args)
            .args(scope)
            .stdout(writer)
            .output()
            .expect("run engram memory list");
        assert_eq!(
            (out.status.code(), String::from_utf8_lossy(&out.stderr)),
            (Some(0), "".into()),
            "{args:?}"
        );
    }

    // Usage errors and an unreachable server have their own exit codes.
    let usage = cli.run(&with(&["compact"]));
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    let down = Cli {
        server: "http://127.0.0.1:1".to_owned(),
        group: "memory",
    }
    .run(&["scopes"]);
    assert_eq!(down.code, 5, "{}", down.stderr);
    assert!(
        down.stderr.contains("Connection refused"),
        "the cause, not only tonic's \"transport error\": {}",
        down.stderr
    );
    // An address without its scheme is bad input, said as such; it was
    // reported as an unreachable server.
    let bare = Cli {
        server: cli.server.trim_start_matches("http://").to_owned(),
        group: "memory",
    }
    .run(&["scopes"]);
    assert_eq!(bare.code, 2, "{}", bare.stderr);
    assert!(
        bare.stderr
            .contains(&format!("needs its scheme: {}", cli.server)),
        "{}",
        bare.stderr
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_and_fact_commands_against_a_server() {
    let server =
        TestServer::spawn_with(Backend::Sqlite, |s| s.scheduler_interval_ms = Some(0)).await;
    let address = format!("http://{}", server.grpc_addr());
    let cli = |group| Cli {
        server: address.clone(),
        group,
    };
    let (rules, facts, episodes) = (cli("rules"), cli("facts"), cli("episodes"));
    for (id, metadata) in [
        (
            "e1",
            r#"{"subject": "alice", "predicate": "prefers", "object": "dark mode"}"#,
        ),
        (
            "e2",
            r#"{"subject": "alice", "predicate": "prefers", "object": "light mode"}"#,
        ),
        ("e3", r#"{"intent": "noop"}"#),
    ] {
        episodes.json(&[
            "append",
            "s1",
            "note",
            "--id",
            id,
            "--app",
            "app",
            "--user",
            "alice",
            "--metadata",
            metadata,
        ]);
    }
    let bad = rules.run(&[
        "create",
        "r1",
        "--filter",
        "type = ",
        "--every-n-episodes",
        "1",
    ]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("INVALID_FILTER"), "{}", bad.stderr);
    let created = rules.json(&[
        "create",
        "r1",
        "--filter",
        "type = observation",
        "--every-n-episodes",
        "10",
        "--emits",
        "semantic",
        "--disabled",
    ]);
    assert_eq!(
        (&created["every_n_episodes"], &created["enabled"]),
        (&json!(10), &json!(false))
    );
    let dry = rules.json(&["run", "r1", "--dry-run"]);
    let kinds: Vec<&str> = dry["deltas"]
        .as_array()
        .expect("deltas")
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["add", "update", "noop"]);
    assert_eq!(dry["deltas"][1]["replaces"], json!(["e1"]));
    assert_eq!(
        dry["deltas"][1]["provenance"]["source_episode_ids"],
        json!(["e2"])
    );
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["rules", "--server", &address, "run", "r1", "--dry-run"])
        .output()
        .expect("run engram rules");
    let table = String::from_utf8_lossy(&text.stdout);
    assert!(table.starts_with("DELTA"), "{table}");
    assert!(table.contains("update  e2"), "{table}");
    let run = rules.json(&["run", "r1"]);
    assert_eq!(
        (&run["facts_added"], &run["facts_updated"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(rules.json(&["get", "r1"])["episodes_promoted"], json!(3));

    let listed = facts.json(&["list", "--user", "alice"]);
    let fact = &listed["facts"][0];
    assert_eq!(fact["current"]["object"], json!("light mode"));
    let text = facts.run_as("text", &["list", "--user", "alice"]);
    assert!(text.stdout.ends_with(" <- e2]\n"), "{}", text.stdout);
    let id = fact["id"].as_str().expect("fact id").to_owned();
    let got = facts.json(&["get", &id]);
    assert_eq!(got["versions"].as_array().map(Vec::len), Some(2));
    assert_eq!(got["versions"][0]["source_episode_ids"], json!(["e1"]));
    let deleted = facts.run_as("text", &["delete", &id]);
    assert!(
        deleted
            .stdout
            .ends_with("v3 (deleted)  alice prefers  [delete]\n"),
        "{}",
        deleted.stdout
    );
    assert_eq!(facts.json(&["list"])["facts"], json!([]));
    let gone = facts.run(&["delete", &id]);
    assert_eq!(gone.code, 3);
    assert_eq!(
        rules.json(&["list"])["rules"].as_array().map(Vec::len),
        Some(1)
    );
    rules.json(&["delete", "r1"]);
    assert_eq!(rules.run(&["get", "r1"]).code, 3);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_command_against_a_server() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let at = format!(
        "http://{}",
        server.server.as_ref().expect("running").grpc_addr
    );
    let episodes = Cli {
        server: at.clone(),
        group: "episodes",
    };
    for (session, user, text) in [
        ("s1", "alice", "the deployment setup uses helm"),
        ("s2", "bob", "bob has a deployment too"),
        (
            "0193f1b2-7c4e-7a10-9d2f-3b5e8c1a4d60",
            "carol",
            "carol pinned the helm chart",
        ),
    ] {
        episodes.json(&[
            "append",
            session,
            "--app",
            "app",
            "--user",
            user,
            "--type",
            "user_message",
            text,
        ]);
    }
    let memory = Cli {
        server: at.clone(),
        group: "memory",
    };
    memory.json(&[
        "set",
        "deploy",
        "\"deployment notes\"",
        "--scope",
        "ops",
        "--scope-type",
        "namespace",
    ]);
    let search = Cli {
        server: at,
        group: "search",
    };

    let all = search.json(&["deployment setup"]);
    let hits = all["hits"].as_array().expect("hits");
    assert_eq!(hits.len(), 3, "{all}");
    assert_eq!(hits[0]["source"], "episodes");
    assert_eq!(hits[0]["item"]["episode"]["user"], "alice");
    assert!(hits[0]["snippet"].as_str().expect("snippet").contains("**"));

    let narrowed = search.json(&[
        "deployment",
        "--source",
        "episodes",
        "--user",
        "bob",
        "--limit",
        "5",
    ]);
    let hits = narrowed["hits"].as_array().expect("hits");
    assert_eq!(hits.len(), 1, "{narrowed}");
    assert_eq!(hits[0]["item"]["episode"]["session_id"], "s2");

    let memory_hits = search.json(&["deployment", "--source", "memory"]);
    assert_eq!(
        memory_hits["hits"][0]["item"]["entry"]["key"], "deploy",
        "{memory_hits}"
    );
    let prefixed = search.json(&["deployment", "--source", "memory", "--scope-prefix", "op"]);
    assert_eq!(
        prefixed["hits"][0]["item"]["entry"]["key"], "deploy",
        "{prefixed}"
    );
    let elsewhere = search.json(&["deployment", "--source", "memory", "--scope-prefix", "nope"]);
    assert_eq!(elsewhere["hits"], json!([]), "{elsewhere}");

    // For people: a table of the hits, the matched words marked; when
    // nothing matched, a line on stderr and no table.
    let table = search.run_as("text", &["helm", "--user", "alice"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", table.stdout);
    assert!(lines[0].contains("SCORE") && lines[0].contains("SNIPPET"));
    assert!(
        lines[1].contains("episodes") && lines[1].contains("s1#1"),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("**helm**"), "{}", lines[1]);
    // Columns as wide as their widest cell: an item longer than any
    // fixed width (a UUID session's) leaves every snippet in line.
    let table = search.run_as("text", &["helm"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", table.stdout);
    let column = |line: &str, text: &str| line.find(text).map(|at| line[..at].chars().count());
    let snippets = column(lines[0], "SNIPPET");
    for line in &lines[1..] {
        let snippet = column(line, "carol pinned").or_else(|| column(line, "the deployment"));
        assert_eq!(snippet, snippets, "{}", table.stdout);
    }
    let none = search.run_as("text", &["helm", "--user", "bob"]);
    assert_eq!(none.code, 0, "{}", none.stderr);
    assert_eq!(none.stdout, "");
    assert_eq!(none.stderr.trim(), "no hits");

    let refused = search.run(&["-only"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("INVALID_QUERY"),
        "{}",
        refused.stderr
    );
    let semantic = search.run(&["x", "--mode", "semantic"]);
    assert_eq!(semantic.code, 2);
    assert!(
        semantic.stderr.contains("EMBEDDER_NOT_CONFIGURED"),
        "{}",
        semantic.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_commands_move_a_tenant() {
    let source = TestServer::spawn(Backend::Sqlite).await;
    let target = TestServer::spawn(Backend::Sqlite).await;
    let memory = Cli {
        server: format!("http://{}", source.grpc_addr()),
        group: "memory",
    };
    memory.json(&["set", "k", r#"{"v": 1}"#, "--scope", "team"]);
    memory.json(&["set", "k", r#"{"v": 2}"#, "--scope", "team"]);
    let episodes = Cli {
        server: memory.server.clone(),
        group: "episodes",
    };
    episodes.json(&["append", "s1", "hello", "--app", "bot", "--user", "u1"]);

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("tenant.jsonl");
    let export = |server: &str, file: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(["export", "--server", server, "--file"])
            .arg(file)
            .output()
            .expect("run engram export");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = export(&memory.server, &file);
    assert!(
        said.contains("exported 4 records (episode 1, memory_version 2, session 1)"),
        "{said}"
    );

    // Import from standard input, twice: the second changes nothing.
    let target_server = format!("http://{}", target.grpc_addr());
    let import = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args([
                "import",
                "--server",
                &target_server,
                "--output",
                "json",
                "-",
            ])
            .stdin(std::fs::File::open(&file).expect("open the export"))
            .output()
            .expect("run engram import");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("json")
    };
    let first = import();
    assert_eq!(
        (
            &first["imported"]["memory_version"],
            &first["imported"]["episode"]
        ),
        (&json!(2), &json!(1))
    );
    let second = import();
    assert_eq!(second["imported"], json!({}));
    assert_eq!(second["unchanged"]["memory_version"], json!(2));

    let copy = dir.path().join("copy.jsonl");
    export(&target_server, &copy);
    let body = |path: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .expect("read")
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(body(&copy), body(&file));

    // A file that is not an export: exit code 2 (invalid argument), the
    // line named.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "not json\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["import", "--server", &target_server])
        .arg(&bad)
        .output()
        .expect("run engram import");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("IMPORT_MALFORMED") && stderr.contains("line 1"),
        "{stderr}"
    );
}

/// `recall-eval --help` ends with the data set's format, and its two
/// example lines are the JSON the tool reads.
#[test]
fn recall_eval_help_gives_the_data_format() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["recall-eval", "--help"])
        .output()
        .expect("run engram recall-eval --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let question = help
        .lines()
        .find(|line| line.contains("\"question\""))
        .expect("a question line");
    let question: Value = serde_json::from_str(question.trim()).expect("JSON");
    assert_eq!(question["answers"], json!(["t1"]), "{help}");
    assert!(help.contains("\"turns\": ["), "{help}");
}

/// Every command, argument and flag says in its `--help` what it is for:
/// the commands are walked as a user would, from `engram --help` down.
#[test]
fn every_argument_is_documented_in_help() {
    fn help(path: &[String]) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(path)
            .arg("--help")
            .output()
            .expect("run engram --help");
        assert!(out.status.success(), "engram {path:?} --help failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The entries of a section (`Commands:`, `Arguments:`, `Options:`),
    /// each with its description, whether on its line or the next ones.
    fn entries(text: &str, section: &str) -> Vec<(String, String)> {
        let mut found: Vec<(String, String)> = Vec::new();
        let mut inside = false;
        for line in text.lines() {
            if !line.starts_with(' ') {
                inside = line == section;
                continue;
            }
            if !inside {
                continue;
            }
            if line.starts_with("          ") {
                // A long description under its entry; `[default: …]` and
                // `[possible values: …]` there describe nothing either.
                if let Some((_, described)) = found.last_mut()
                    && !line.trim_start().starts_with('[')
                {
                    described.push_str(line.trim());
                }
                continue;
            }
            let entry = line.trim_start();
            let (name, described) = entry.split_once("  ").unwrap_or((entry, ""));
            // `[default: …]` and `[possible values: …]` describe nothing.
            let described = if described.trim_start().starts_with('[') {
                ""
            } else {
                described.trim()
            };
            found.push((name.to_owned(), described.to_owned()));
        }
        found
    }

    let mut undocumented = Vec::new();
    let mut pending = vec![Vec::<String>::new()];
    let mut walked = 0;
    while let Some(path) = pending.pop() {
        let text = help(&path);
        walked += 1;
        for (name, described) in entries(&text, "Commands:") {
            if described.is_empty() {
                undocumented.push(format!("engram {} {name}", path.join(" ")));
            }
            if name != "help" {
                let mut below = path.clone();
                below.push(name);
                pending.push(below);
            }
        }
        for section in ["Arguments:", "Options:"] {
            for (name, described) in entries(&text, section) {
                if described.is_empty() {
                    undocumented.push(format!("engram {} {name}", path.join(" ")));
                }
            }
        }
    }
    assert!(walked > 60, "only {walked} commands were walked");
    assert!(
        undocumented.is_empty(),
        "arguments without a description:\n{}",
        undocumented.join("\n")
    );
}
