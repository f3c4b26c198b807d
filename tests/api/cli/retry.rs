//! The CLI rides out an outage as the clients do: a write with its
//! `--request-id` is tried again after UNAVAILABLE and lands once; an
//! unkeyed write fails at once (exit 5), since its first try may have been
//! stored; `--retries 0` turns retries off. The outage: the test holds the
//! SQLite file's write lock, so the server's writes wait 300 ms and answer
//! UNAVAILABLE (`DATABASE_UNAVAILABLE`, a `RetryInfo` of one second); the
//! test ends it once the server's metrics show the first refusal. The
//! server is a process of its own, so no other test's refusals count.
//!
//! `memory history` reads on after its stream breaks, from the version
//! after the last one it printed.

use engram::api::convert::json_to_proto;
use engram::proto;
use engram::proto::memory_service_client::MemoryServiceClient;
use serde_json::json;
use sqlx::{Connection, Executor};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use crate::helpers::{ChildServer, metric_until};

const SET_REFUSED: &str = r#"grpc_server_handled_total{grpc_service="engram.v1.MemoryService",grpc_method="Set",grpc_type="unary",grpc_code="Unavailable"}"#;

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn memory(server: &ChildServer, args: &[&str]) -> Ran {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .arg("memory")
        .args(["--server", &format!("http://{}", server.grpc_addr)])
        .args(["--output", "json"])
        .args(args)
        .args(["--scope", "retries", "--scope-type", "namespace"])
        .env_remove("ENGRAM_RETRIES")
        .output()
        .await
        .expect("run engram memory");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Holds the file's write lock until dropped (or rolled back).
async fn lock_writes(url: &str) -> sqlx::SqliteConnection {
    let mut lock = sqlx::SqliteConnection::connect(url).await.expect("connect");
    lock.execute("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    lock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_write_rides_out_an_outage_and_an_unkeyed_one_does_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("engram.db").display());
    let server = ChildServer::spawn(
        &[],
        &[
            ("ENGRAM_DATABASE_URL", &url),
            ("ENGRAM_DB_ACQUIRE_TIMEOUT_MS", "300"),
        ],
        None,
    )
    .await;
    let http = server.http_addr();

    // A write with its request id waits the outage out and lands once.
    let mut lock = lock_writes(&url).await;
    let keyed = {
        let server = &server;
        async move { memory(server, &["set", "plan", "a", "--request-id", "plan-1"]).await }
    };
    let ending = async {
        metric_until(http, SET_REFUSED, |n| n >= 1.0).await;
        lock.execute("ROLLBACK").await.expect("release the lock");
    };
    let (landed, ()) = tokio::join!(keyed, ending);
    assert_eq!(landed.code, Some(0), "{}", landed.stderr);
    let entry: serde_json::Value = serde_json::from_str(&landed.stdout).expect("json");
    assert_eq!(entry["version"], 1, "{entry}");
    assert!(
        landed.stderr.contains(
            "engram: Set failed (UNAVAILABLE DATABASE_UNAVAILABLE); trying again in 1.0 s (1 of 3)"
        ),
        "{}",
        landed.stderr
    );

    // An unkeyed write is refused at once; so is a keyed one with retries
    // off. Neither is stored.
    let _lock = lock_writes(&url).await;
    let unkeyed = memory(&server, &["set", "plan", "b"]).await;
    assert_eq!(
        unkeyed.code,
        Some(5),
        "exit 5, unavailable: {}",
        unkeyed.stderr
    );
    assert!(
        !unkeyed.stderr.contains("trying again"),
        "{}",
        unkeyed.stderr
    );
    let off = memory(
        &server,
        &[
            "set",
            "plan",
            "c",
            "--request-id",
            "plan-2",
            "--retries",
            "0",
        ],
    )
    .await;
    assert_eq!(off.code, Some(5), "{}", off.stderr);
    assert!(!off.stderr.contains("trying again"), "{}", off.stderr);
    drop(_lock);

    let history = memory(&server, &["history", "plan"]).await;
    assert_eq!(history.code, Some(0), "{}", history.stderr);
    assert_eq!(history.stdout.lines().count(), 1, "{}", history.stdout);
    // The same request again is answered from the first write.
    let again = memory(&server, &["set", "plan", "a", "--request-id", "plan-1"]).await;
    let entry: serde_json::Value = serde_json::from_str(&again.stdout).expect("json");
    assert_eq!(entry["version"], 1, "{entry}");
}

/// A history of 10 versions of about 900 KB each: more than HTTP/2's flow
/// control lets a server send ahead of a reader (the CLI's window is
/// 2 MB), and the CLI reads no further while its stdout is not read. (The
/// padding is punctuation, which the search index has no words in, so the
/// writes are quick.) The test reads the first line, kills the server,
/// starts another on the same address and reads on: the stream broke, and
/// the CLI asked again from the version after the last one it printed, so
/// each version is printed once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_reads_on_after_its_stream_breaks() {
    const VERSIONS: i64 = 10;
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("engram.db").display());
    let mut first = ChildServer::spawn(&[], &[("ENGRAM_DATABASE_URL", &url)], None).await;
    let addr = first.grpc_addr;
    let mut writer = MemoryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let padding = ".".repeat(900_000);
    for i in 1..=VERSIONS {
        writer
            .set(proto::SetRequest {
                scope_type: proto::ScopeType::Namespace as i32,
                scope: "retries".into(),
                key: "big".into(),
                value: Some(json_to_proto(&json!({"i": i, "padding": padding}))),
                ..Default::default()
            })
            .await
            .expect("set");
    }
    drop(writer);

    let mut history = tokio::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args([
            "memory",
            "--server",
            &format!("http://{addr}"),
            "--output",
            "json",
        ])
        .args([
            "history",
            "big",
            "--scope",
            "retries",
            "--scope-type",
            "namespace",
        ])
        .env_remove("ENGRAM_RETRIES")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run engram memory history");
    let mut stdout = tokio::io::BufReader::new(history.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).await.expect("the first line");
    let mut versions = vec![serde_json::from_str::<serde_json::Value>(&line).expect("json")];

    first.child.kill().await.expect("kill the server");
    let _second = ChildServer::spawn(
        &[],
        &[
            ("ENGRAM_DATABASE_URL", &url),
            ("ENGRAM_GRPC_ADDR", &addr.to_string()),
        ],
        None,
    )
    .await;
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await.expect("the rest");
    let mut stderr = String::new();
    history
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("stderr");
    let status = history.wait().await.expect("exit");
    assert!(status.success(), "{status}: {stderr}");
    for line in rest.lines() {
        versions.push(serde_json::from_str(line).expect("json"));
    }
    let read: Vec<i64> = versions
        .iter()
        .map(|entry| entry["version"].as_i64().expect("version"))
        .collect();
    assert_eq!(read, (1..=VERSIONS).collect::<Vec<_>>(), "{stderr}");
    assert!(
        versions
            .iter()
            .all(|entry| entry["value"]["i"].as_f64() == entry["version"].as_f64()),
        "each version holds its own value"
    );
    assert!(
        stderr.contains("engram: History failed (the connection broke: "),
        "the stream broke and was asked again: {stderr}"
    );
}
