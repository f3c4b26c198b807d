//! `engram backup`: a copy of the embedded store taken while its server
//! goes on writing is a working database that holds every write
//! acknowledged before the copy began, with dense versions, and search
//! works on it. It writes over nothing, and sends Postgres to its own
//! tools.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use engram::api::convert::{json_from_proto, json_to_proto};
use engram::proto::{GetRequest, ScopeType, SetRequest};
use serde_json::json;

use crate::helpers::{Backend, TestDb, TestServer, history_entries};
use crate::search::{memory_query, search};

fn set(key: &str, value: i64) -> SetRequest {
    SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "backed".to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&json!(value))),
        ..SetRequest::default()
    }
}

/// `engram backup` of `url` to `to`: whether it succeeded, and its stderr.
async fn backup(url: &str, to: &Path) -> (bool, String) {
    let out = run_backup(url, to).await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn run_backup(url: &str, to: &Path) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["backup", "--database-url", url, "--to"])
        .arg(to)
        .env_remove("ENGRAM_DATABASE_URL")
        .env_remove("ENGRAM_CONFIG")
        .output()
        .await
        .expect("run engram backup")
}

/// Each key's newest acknowledged version.
type Versions = BTreeMap<String, i64>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_writes_go_on_holds_every_write_acknowledged_before_it() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let mut memory = server.memory();
    memory
        .set(SetRequest {
            value: Some(json_to_proto(&json!("the deployment runs on helm"))),
            ..set("notes", 0)
        })
        .await
        .expect("a searchable write");

    // Four writers go on through the backup, each over five keys.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let mut memory = server.memory();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut acknowledged = Versions::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) || n < 20 {
                    let key = format!("w{writer}-{}", n % 5);
                    let reply = memory.set(set(&key, n)).await.expect("a write");
                    let version = reply.into_inner().entry.expect("entry").version;
                    acknowledged.insert(key, version);
                    n += 1;
                }
                acknowledged
            })
        })
        .collect();
    // Every writer's first writes are in before the backup starts.
    let mut before = Versions::new();
    for writer in 0..4 {
        let key = format!("w{writer}-0");
        let mut version = 0;
        while version == 0 {
            version = memory
                .get(GetRequest {
                    scope_type: ScopeType::Namespace as i32,
                    scope: "backed".to_owned(),
                    key: key.clone(),
                    ..GetRequest::default()
                })
                .await
                .map_or(0, |reply| reply.into_inner().entry.expect("entry").version);
        }
        before.insert(key, version);
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("copy.db");
    let (ok, stderr) = backup(&server.db.url, &copy).await;
    assert!(ok, "{stderr}");
    assert!(stderr.contains("checked"), "{stderr}");
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer");
    }

    let restored = TestServer::start(TestDb::sqlite_file(&copy), |_| {}).await;
    let mut memory = restored.memory();
    for (key, version) in &before {
        let mut versions = Vec::new();
        for entry in history_entries(&mut memory, ScopeType::Namespace, "backed", key).await {
            let value = json_from_proto(entry.value.expect("value")).expect("JSON");
            assert!(value.is_i64(), "{key}: {value}");
            versions.push(entry.version);
        }
        versions.sort_unstable();
        let dense: Vec<i64> = (1..=versions.len() as i64).collect();
        assert_eq!(versions, dense, "{key}'s versions in the copy are dense");
        assert!(
            versions.len() as i64 >= *version,
            "{key}: version {version} was acknowledged before the backup, the copy has {}",
            versions.len()
        );
    }
    let hits = search(&restored, memory_query("deployment")).await;
    assert_eq!(hits.len(), 1, "the copy's search index works: {hits:?}");
    memory
        .set(set("after", 1))
        .await
        .expect("the copy takes writes");

    // To standard output, the way out of a container with no shell.
    let out = run_backup(&server.db.url, Path::new("-")).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let streamed = dir.path().join("streamed.db");
    std::fs::write(&streamed, &out.stdout).expect("keep the streamed copy");
    let restored = TestServer::start(TestDb::sqlite_file(&streamed), |_| {}).await;
    let hits = search(&restored, memory_query("deployment")).await;
    assert_eq!(hits.len(), 1, "the streamed copy works: {hits:?}");

    // Nothing is written over, and Postgres is not this tool's.
    let (ok, stderr) = backup(&server.db.url, &copy).await;
    assert!(!ok && stderr.contains("already exists"), "{stderr}");
    let (ok, stderr) = backup(
        "postgres://engram@127.0.0.1:1/engram",
        &dir.path().join("pg.db"),
    )
    .await;
    assert!(!ok && stderr.contains("pg_dump"), "{stderr}");
    assert!(!dir.path().join("pg.db").exists());
}
