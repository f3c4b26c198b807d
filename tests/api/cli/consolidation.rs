//! `engram rules ...` and `engram facts ...`.

use serde_json::json;

use super::Cli;
use crate::helpers::{Backend, TestServer};

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
    // A setup script's create, run again with its request id, answers with
    // the rule; without one, the id is taken.
    let keyed = [
        "create",
        "r2",
        "--cron",
        "@daily",
        "--disabled",
        "--request-id",
        "setup-r2",
    ];
    assert_eq!(rules.json(&keyed)["id"], json!("r2"));
    assert_eq!(rules.json(&keyed)["cron"], json!("@daily"));
    let taken = rules.run(&["create", "r2", "--cron", "@daily", "--disabled"]);
    assert_eq!(taken.code, 4, "a taken id is a conflict: {}", taken.stderr);
    assert!(taken.stderr.contains("RULE_EXISTS"), "{}", taken.stderr);
    rules.json(&["delete", "r2"]);
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

    // Deltas in the shape `rules run --json` prints, applied from a file
    // (here the dry run's own output, its add and update promoting e3's
    // and e2's again) and from standard input.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("deltas.json");
    std::fs::write(&file, dry.to_string()).expect("write the deltas");
    let applied = facts.json(&["apply", file.to_str().expect("a path")]);
    // The add makes a fact of e1, which the update then supersedes.
    assert_eq!(
        (&applied["facts_added"], &applied["facts_updated"]),
        (&json!(1), &json!(1)),
        "{applied}"
    );
    let ids = applied["fact_ids"].as_array().expect("ids").clone();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1], "one fact, added then updated");
    let delete = json!([{
        "kind": "delete", "app": "app", "user": "alice", "replaces": ids,
        "provenance": {"source_episode_ids": ["e3"], "rule_id": "cleanup", "confidence": 1.0,
                       "promotion_ts": "2026-12-01T08:00:00Z"},
    }]);
    let deleted = facts.json_from_stdin(&["apply", "-"], &delete.to_string());
    assert_eq!(deleted["facts_deleted"], json!(1));
    assert_eq!(facts.json(&["list"])["facts"], json!([]));
    let malformed = facts.run(&[
        "apply",
        file.with_extension("none").to_str().expect("a path"),
    ]);
    assert_eq!(malformed.code, 2, "{}", malformed.stderr);
    let wrong = facts.run_with_stdin(&["apply", "-"], r#"[{"kind": "add"}]"#);
    assert_eq!(wrong.code, 2);
    assert!(
        wrong
            .stderr
            .contains("delta 0: missing field `fact_payload`"),
        "{}",
        wrong.stderr
    );
    assert_eq!(
        rules.json(&["list"])["rules"].as_array().map(Vec::len),
        Some(1)
    );
    rules.json(&["delete", "r1"]);
    assert_eq!(rules.run(&["get", "r1"]).code, 3);
}
