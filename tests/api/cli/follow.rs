//! `engram episodes tail` and `engram memory watch` across server restarts,
//! as a person following a deployment's memory sees them: a graceful
//! shutdown (SIGTERM) and a crash (SIGKILL) of the server, which comes back
//! on the same address; the command reconnects from the last position it
//! printed, so every item is printed once, in order. With
//! `--no-reconnect` it stops at the break and says where to resume.
//! Synchronised by reading what the command prints, never by sleeping.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{AppendEpisodeRequest, NewEpisode, ScopeType, SetRequest};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::helpers::{ChildServer, connect};

/// A server on the SQLite file in `dir`, at `addr` (a free port when
/// `None`).
async fn serve(dir: &Path, addr: Option<SocketAddr>) -> ChildServer {
    let addr = addr.map(|a| a.to_string());
    let env: Vec<(&str, &str)> = addr
        .iter()
        .map(|a| ("ENGRAM_GRPC_ADDR", a.as_str()))
        .collect();
    ChildServer::spawn(&["--database-url", "sqlite://e.db"], &env, Some(dir)).await
}

/// A following command, its output read line by line as it comes.
struct Following {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Following {
    fn start(addr: SocketAddr, args: &[&str]) -> Following {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(&args[..1])
            .args(["--server", &format!("http://{addr}"), "--output", "json"])
            .args(&args[1..])
            .env_remove("ENGRAM_SCOPE")
            .env_remove("ENGRAM_SCOPE_TYPE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run engram");
        let stdout = child.stdout.take().expect("stdout");
        Following {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next line printed, as JSON.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("a line within a minute")
            .expect("read stdout")
            .expect("a line before the command ended");
        serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line}"))
    }

    /// Waits for the command to end: its exit code and its stderr.
    async fn end(mut self) -> (i32, String) {
        assert_eq!(
            self.lines.next_line().await.expect("read stdout"),
            None,
            "nothing printed past the limit"
        );
        let out = tokio::time::timeout(Duration::from_secs(60), self.child.wait_with_output())
            .await
            .expect("the command ends")
            .expect("wait for engram");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

async fn append(addr: SocketAddr, text: &str) {
    let mut client = EpisodeServiceClient::new(connect(addr).await);
    client
        .append_episode(AppendEpisodeRequest {
            session_id: "s1".to_owned(),
            app: "app".to_owned(),
            user: "alice".to_owned(),
            episode: Some(NewEpisode {
                r#type: "observation".to_owned(),
                content: Some(json_to_proto(&json!(text))),
                ..NewEpisode::default()
            }),
            require_session: false,
        })
        .await
        .expect("append");
}

async fn set(addr: SocketAddr, key: &str) {
    let mut client = MemoryServiceClient::new(connect(addr).await);
    client
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "prefs".to_owned(),
            key: key.to_owned(),
            value: Some(json_to_proto(&json!(key))),
            ..SetRequest::default()
        })
        .await
        .expect("set");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_reconnects_across_a_shutdown_and_a_crash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = serve(dir.path(), None).await;
    let addr = first.grpc_addr;
    let mut tail = Following::start(addr, &["episodes", "tail", "--cursor", "0", "--limit", "6"]);
    let mut printed = Vec::new();
    for text in ["one", "two"] {
        append(addr, text).await;
        printed.push(tail.next().await);
    }
    // A rolling upgrade: the server ends its streams and exits.
    assert!(first.terminate().await.success());
    let second = serve(dir.path(), Some(addr)).await;
    for text in ["three", "four"] {
        append(addr, text).await;
        printed.push(tail.next().await);
    }
    // A crash: the connection breaks under the stream.
    second.kill().await;
    let third = serve(dir.path(), Some(addr)).await;
    for text in ["five", "six"] {
        append(addr, text).await;
        printed.push(tail.next().await);
    }
    let (code, stderr) = tail.end().await;
    assert_eq!(code, 0, "{stderr}");
    let contents: Vec<&str> = printed
        .iter()
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert_eq!(contents, ["one", "two", "three", "four", "five", "six"]);
    let cursors: Vec<i64> = printed
        .iter()
        .filter_map(|e| e["cursor"].as_i64())
        .collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "{cursors:?}");
    assert!(
        stderr.contains(&format!("reconnecting from --cursor {}", cursors[1])),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("reconnecting from --cursor {}", cursors[3])),
        "{stderr}"
    );
    assert_eq!(stderr.matches("engram: reconnected").count(), 2, "{stderr}");
    assert!(
        stderr.contains(&format!("resume with --cursor {}", cursors[5])),
        "{stderr}"
    );

    // Told not to, it stops at the break, exits as unavailable, and says
    // where to resume.
    let mut once = Following::start(
        addr,
        &[
            "episodes",
            "tail",
            "--cursor",
            &cursors[4].to_string(),
            "--no-reconnect",
        ],
    );
    assert_eq!(once.next().await["content"], "six");
    assert!(third.terminate().await.success());
    let (code, stderr) = once.end().await;
    assert_eq!(code, 5, "{stderr}");
    assert!(
        stderr.contains(&format!("resume with --cursor {}", cursors[5])),
        "{stderr}"
    );
    assert!(!stderr.contains("reconnecting"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reconnects_across_a_crash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = serve(dir.path(), None).await;
    let addr = first.grpc_addr;
    let mut watch = Following::start(
        addr,
        &[
            "memory",
            "watch",
            "--scope",
            "prefs",
            "--scope-type",
            "namespace",
            "--from-revision",
            "0",
            "--limit",
            "3",
        ],
    );
    set(addr, "a").await;
    let mut printed = vec![watch.next().await];
    first.kill().await;
    let second = serve(dir.path(), Some(addr)).await;
    for key in ["b", "c"] {
        set(addr, key).await;
        printed.push(watch.next().await);
    }
    let (code, stderr) = watch.end().await;
    assert_eq!(code, 0, "{stderr}");
    let keys: Vec<&str> = printed.iter().filter_map(|c| c["key"].as_str()).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    let revisions: Vec<i64> = printed
        .iter()
        .filter_map(|c| c["revision"].as_i64())
        .collect();
    assert!(
        stderr.contains(&format!(
            "reconnecting from --from-revision {}",
            revisions[0]
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("resume with --from-revision {}", revisions[2])),
        "{stderr}"
    );
    assert!(second.terminate().await.success());
}
