//! The database's storage fills up under a running server. Writes are
//! refused with `RESOURCE_EXHAUSTED`, `DATABASE_FULL` (not `INTERNAL`, as
//! they were), reads go on, every acknowledged write stays, and once
//! there is room again the next write succeeds at the next version, with
//! no restart.
//!
//! On SQLite the disk really fills: the file lives on a small filesystem
//! of its own (`ENGRAM_TEST_FULL_DIR`, which `scripts/test` mounts), and
//! the test fills the rest of it with a ballast file, then removes it.
//! Before the fix a full disk at `COMMIT` left the writer's connection
//! counting a transaction SQLite had already rolled back, and every later
//! write failed until the server restarted. Only this test may use that
//! filesystem. On Postgres a table that cannot grow raises `disk_full`
//! (`53100`); a real one needs a tablespace on the database server's own
//! disk, so the test raises that error from a trigger instead. (By hand,
//! on 2026-11-30, a database in a tablespace on a 24 MiB tmpfs answered
//! the same: `DATABASE_FULL` once it filled, reads on, and the next write
//! stored once the filesystem grew.)

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use engram::api::convert::{json_from_proto, json_to_proto};
use engram::proto::{GetRequest, ScopeType, SetRequest};
use serde_json::{Value, json};
use tonic::Code;

use crate::auth::append;
use crate::helpers::{Backend, TestDb, TestServer, history_entries, reason};

/// Concurrent writers, each on a key of its own, so that the server
/// commits their sets in groups.
const WRITERS: usize = 8;

/// The small filesystem the SQLite case fills.
fn full_dir() -> PathBuf {
    std::env::var_os("ENGRAM_TEST_FULL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "ENGRAM_TEST_FULL_DIR is not set: run the tests with scripts/test, which mounts \
                 a small filesystem for this test, or mount one yourself \
                 (mount -t tmpfs -o size=16m tmpfs DIR) and point the variable at it"
            )
        })
}

/// Fills the filesystem of `dir` with a file until it refuses more. The
/// file goes when it is dropped, a failed test's too.
fn fill(dir: &Path) -> tempfile::NamedTempFile {
    let mut ballast = tempfile::Builder::new()
        .prefix("ballast")
        .tempfile_in(dir)
        .expect("create the ballast");
    let chunk = vec![0u8; 64 * 1024];
    loop {
        let file = ballast.as_file_mut();
        match file.write_all(&chunk).and_then(|()| file.sync_all()) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::StorageFull => return ballast,
            Err(err) => panic!("filling {}: {err}", dir.display()),
        }
    }
}

fn set(key: &str, value: &Value) -> SetRequest {
    SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "full".to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(value)),
        ..SetRequest::default()
    }
}

fn assert_full(status: &tonic::Status, what: &str) {
    assert_eq!(
        (status.code(), reason(status).as_str()),
        (Code::ResourceExhausted, "DATABASE_FULL"),
        "{what}: {status:?}"
    );
}

/// The acknowledged writes: each key's values, in version order.
type Acknowledged = BTreeMap<String, Vec<Value>>;

/// Rounds of concurrent sets until the database refuses one; returns what
/// was acknowledged before. Every refusal is `DATABASE_FULL`.
async fn write_until_full(server: &TestServer, acknowledged: &mut Acknowledged) {
    for round in 0..10_000 {
        let calls = (0..WRITERS).map(|writer| {
            let key = format!("k{writer}");
            let value = json!(format!("{round:05}{}", "x".repeat(8_000)));
            let mut memory = server.memory();
            async move {
                let answer = memory.set(set(&key, &value)).await;
                (key, value, answer)
            }
        });
        let mut refused = false;
        for (key, value, answer) in futures::future::join_all(calls).await {
            match answer {
                Ok(reply) => {
                    let versions = acknowledged.entry(key.clone()).or_default();
                    versions.push(value);
                    let version = reply.into_inner().entry.expect("entry").version;
                    assert_eq!(version, versions.len() as i64, "{key}'s versions are dense");
                }
                Err(status) => {
                    assert_full(&status, &key);
                    refused = true;
                }
            }
        }
        if refused {
            return;
        }
    }
    panic!("the database never filled");
}

/// Every acknowledged value is stored, in order, and nothing else.
async fn assert_kept(server: &TestServer, acknowledged: &Acknowledged) {
    let mut memory = server.memory();
    for (key, values) in acknowledged {
        let mut stored: Vec<Value> =
            history_entries(&mut memory, ScopeType::Namespace, "full", key)
                .await
                .into_iter()
                .map(|entry| json_from_proto(entry.value.expect("value")).expect("JSON"))
                .collect();
        stored.reverse();
        assert!(
            stored == *values,
            "{key}: {} versions stored, {} acknowledged",
            stored.len(),
            values.len()
        );
    }
}

async fn get(server: &TestServer, key: &str) -> Value {
    let entry = server
        .memory()
        .get(GetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "full".to_owned(),
            key: key.to_owned(),
            ..GetRequest::default()
        })
        .await
        .expect("get")
        .into_inner()
        .entry
        .expect("entry");
    json_from_proto(entry.value.expect("value")).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_writes_on_a_full_disk_and_writes_again_once_there_is_room() {
    let dir = full_dir();
    let server = TestServer::start(TestDb::sqlite_in(&dir), |_| {}).await;
    let mut acknowledged = Acknowledged::new();
    server
        .episodes()
        .append_episode(append("before"))
        .await
        .expect("append before the disk fills");

    let ballast = fill(&dir);
    write_until_full(&server, &mut acknowledged).await;

    // Reads go on while the disk is full.
    assert_kept(&server, &acknowledged).await;
    // An append may still find room in the write-ahead log; if not, it is
    // refused the same way.
    if let Err(status) = server.episodes().append_episode(append("full")).await {
        assert_full(&status, "an append");
    }

    drop(ballast);
    let value = json!("room again");
    let reply = server
        .memory()
        .set(set("k0", &value))
        .await
        .expect("a write once there is room")
        .into_inner();
    acknowledged.entry("k0".to_owned()).or_default().push(value);
    assert_eq!(
        reply.entry.expect("entry").version,
        acknowledged["k0"].len() as i64,
        "the next version, nothing taken by the refused writes"
    );
    server
        .episodes()
        .append_episode(append("after"))
        .await
        .expect("append once there is room");
    assert_kept(&server, &acknowledged).await;
    assert_eq!(get(&server, "k0").await, json!("room again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_answers_a_table_that_cannot_grow_as_a_full_database() {
    let server = TestServer::spawn(Backend::Postgres).await;
    let mut acknowledged = Acknowledged::new();
    let value = json!("before");
    server
        .memory()
        .set(set("k0", &value))
        .await
        .expect("a write before");
    acknowledged.insert("k0".to_owned(), vec![value]);

    let mut owner = server.db_connection("the owner").await;
    for statement in [
        "CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         RAISE EXCEPTION 'could not extend file: No space left on device' \
         USING ERRCODE = 'disk_full'; END $$",
        "CREATE TRIGGER full_disk BEFORE INSERT ON memory_versions \
         FOR EACH ROW EXECUTE FUNCTION full_disk()",
        "CREATE TRIGGER full_disk BEFORE INSERT ON episodes \
         FOR EACH ROW EXECUTE FUNCTION full_disk()",
    ] {
        sqlx::query(statement)
            .execute(&mut owner)
            .await
            .expect("make the tables refuse to grow");
    }
    // Alone and in groups, every write is refused alike.
    write_until_full(&server, &mut acknowledged).await;
    let calls = (0..WRITERS).map(|writer| {
        let mut memory = server.memory();
        async move { memory.set(set(&format!("k{writer}"), &json!(1))).await }
    });
    for answer in futures::future::join_all(calls).await {
        assert_full(&answer.expect_err("refused"), "a grouped set");
    }
    let status = server
        .episodes()
        .append_episode(append("full"))
        .await
        .expect_err("an append is refused");
    assert_full(&status, "an append");
    assert_kept(&server, &acknowledged).await;

    sqlx::query("DROP FUNCTION full_disk() CASCADE")
        .execute(&mut owner)
        .await
        .expect("room again");
    let reply = server
        .memory()
        .set(set("k0", &json!("room again")))
        .await
        .expect("a write once there is room")
        .into_inner();
    assert_eq!(reply.entry.expect("entry").version, 2);
    server
        .episodes()
        .append_episode(append("after"))
        .await
        .expect("append once there is room");
}
