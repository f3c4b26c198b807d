//! `engram memory ...`: keys, history, the change feed, forks and time travel, and
//! maintenance, with their JSON output, exit codes and errors.

use serde_json::{Value, json};

use super::Cli;
use crate::helpers::{Backend, TestServer};

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
