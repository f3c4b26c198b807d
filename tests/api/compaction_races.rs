//! Compactions against the writers that share their heads, on Postgres
//! (SQLite has one writer, so nothing interleaves there). A compaction of
//! several keys holds their heads until the summary commits, so that no
//! write slips in between reading the sources and writing the summary. It
//! took them in the order of the request and `FOR UPDATE`: a compaction of
//! `[b, a]` held `b` and waited for `a`, while a purge, a forget or a group
//! of sets, all of which take heads in key order, held `a` and waited for
//! `b`. Postgres failed one of the two with a deadlock, which its caller
//! saw as `INTERNAL` (a script racing compactions, retention runs and
//! purges against forgets saw 3 to 4 in 100 rounds). Each test's own
//! transaction holds a head as one of those callers would.
//!
//! A head that does not exist yet cannot be taken in order, so a
//! compaction into a new key can still deadlock with a group of sets that
//! creates that key; the last test shows what its caller hears then.

use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{CompactRequest, CompactResponse, GetRequest, ScopeType, SetRequest};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::helpers::{Backend, LOCK_WAITS, TestServer, holding, reason, release, until_reads};
use tonic::Code;

const NS: i32 = ScopeType::Namespace as i32;

/// A server whose namespace `c` holds the keys `a` and `b`.
async fn two_keys() -> TestServer {
    let server = TestServer::spawn(Backend::Postgres).await;
    for key in ["a", "b"] {
        server
            .memory()
            .set(SetRequest {
                scope_type: NS,
                scope: "c".into(),
                key: key.into(),
                value: Some(json_to_proto(&json!(format!("the value of {key}")))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
    }
    server
}

/// `Compact` of `b` and `a`, in that order, into `summary`, in a task.
fn compact_b_and_a(server: &TestServer) -> JoinHandle<Result<CompactResponse, tonic::Status>> {
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    tokio::spawn(async move {
        admin
            .compact(CompactRequest {
                scope_type: NS,
                scope: "c".into(),
                keys: vec!["b".into(), "a".into()],
                target_key: "summary".into(),
                ..CompactRequest::default()
            })
            .await
            .map(tonic::Response::into_inner)
    })
}

/// What the compaction's task answered: the summary, version 1, made of
/// `b` and `a`.
fn compacted(answer: Result<Result<CompactResponse, tonic::Status>, tokio::task::JoinError>) {
    let answer = answer
        .expect("the compaction's task")
        .expect("the compaction");
    let entry = answer.entry.expect("the summary");
    assert_eq!((entry.key.as_str(), entry.version), ("summary", 1));
    let record = answer.record.expect("the audit record");
    assert_eq!(record.source_keys, ["b", "a"]);
}

/// A purge holds the heads of the keys it recorded against deletion only
/// (`FOR KEY SHARE`), in key order: here it holds `a` and is about to take
/// `b`. The compaction, which holds its heads against writes only, goes
/// on without waiting for it, and the purge then takes `b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_does_not_wait_for_a_purge_of_its_keys() {
    let server = two_keys().await;
    let mut db = server.db_connection("the test").await;
    let mut purge = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'a' FOR KEY SHARE",
    )
    .await;
    let mut compacting = compact_b_and_a(&server);
    let finished = tokio::select! {
        answer = &mut compacting => Some(answer),
        () = until_reads(&mut db, LOCK_WAITS, 1, "the compaction waits") => None,
    };
    let Some(answer) = finished else {
        panic!("the compaction waits for the head the purge holds against deletion");
    };
    sqlx::query("SELECT 1 FROM memory_heads WHERE key = 'b' FOR KEY SHARE NOWAIT")
        .execute(&mut purge)
        .await
        .expect("the purge takes b");
    release(purge, "COMMIT").await;
    compacted(answer);
}

/// A forget (or a group of sets) takes heads in key order: here it holds
/// `a`. The compaction waits for `a` holding nothing, so the forget takes
/// `b` as well; the compaction then goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_takes_its_heads_in_key_order() {
    let server = two_keys().await;
    let mut db = server.db_connection("the test").await;
    let mut forget = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'a' FOR UPDATE",
    )
    .await;
    let compacting = compact_b_and_a(&server);
    until_reads(&mut db, LOCK_WAITS, 1, "the compaction waits for a").await;
    sqlx::query("SELECT 1 FROM memory_heads WHERE key = 'b' FOR UPDATE NOWAIT")
        .execute(&mut forget)
        .await
        .expect("the compaction holds no head while it waits for a");
    release(forget, "ROLLBACK").await;
    compacted(compacting.await);
    let summary = server
        .memory()
        .get(GetRequest {
            scope_type: NS,
            scope: "c".into(),
            key: "summary".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("the summary is stored")
        .into_inner()
        .entry
        .expect("an entry");
    assert_eq!(summary.version, 1);
}

/// A group of sets has created `t` and waits for `b`, which a compaction
/// of `b` into `t` holds while it waits to create `t`. Postgres breaks the
/// deadlock by failing one of the two: here the compaction, since the
/// test's transaction looks for the deadlock long after it. Its caller
/// hears `ABORTED`, `TRANSACTION_CONFLICT` (retry), not `INTERNAL`, and
/// nothing of it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_failed_by_a_deadlock_is_aborted_with_nothing_written() {
    let server = two_keys().await;
    let mut db = server.db_connection("the test").await;
    let mut sets = holding(
        &server.db.url,
        "INSERT INTO memory_heads (tenant, scope_type, scope, key, version, deleted, update_time) \
         VALUES ('default', 1, 'c', 't', 1, false, now())",
    )
    .await;
    sqlx::query("SET deadlock_timeout = '60s'")
        .execute(&mut sets)
        .await
        .expect("set the holder's deadlock_timeout");
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    let compacting = tokio::spawn(async move {
        admin
            .compact(CompactRequest {
                scope_type: NS,
                scope: "c".into(),
                key: "b".into(),
                target_key: "t".into(),
                ..CompactRequest::default()
            })
            .await
    });
    until_reads(&mut db, LOCK_WAITS, 1, "the compaction waits to create t").await;
    sqlx::query("SELECT 1 FROM memory_heads WHERE key = 'b' FOR NO KEY UPDATE")
        .execute(&mut sets)
        .await
        .expect("the sets take b once the compaction is failed");
    release(sets, "ROLLBACK").await;
    let err = compacting
        .await
        .expect("the compaction's task")
        .expect_err("the compaction is failed");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Aborted, "TRANSACTION_CONFLICT"),
        "{err:?}"
    );
    assert!(err.message().contains("retry"), "{}", err.message());
    let mut memory = server.memory();
    let absent = memory
        .get(GetRequest {
            scope_type: NS,
            scope: "c".into(),
            key: "t".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect_err("no summary");
    assert_eq!(absent.code(), Code::NotFound);
    let source = memory
        .get(GetRequest {
            scope_type: NS,
            scope: "c".into(),
            key: "b".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("get b")
        .into_inner()
        .entry
        .expect("b");
    assert_eq!(source.version, 1);
}
