//! `engram search`: sources, filters, modes, output, and its refusals.

use serde_json::json;

use super::Cli;
use crate::helpers::{Backend, TestServer};

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
