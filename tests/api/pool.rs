//! The Postgres store's own connection pool, through a real server: a
//! connection goes back as it was left (no ping), remembers which tenant its
//! session is set to, rolls back a transaction left open, and does not hand
//! out a connection the database has closed more than once.

use engram::auth::hash_token;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{ListRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use crate::auth::{Authed, get, memory, set};
use crate::helpers::{APP_ROLE, Backend, TestServer, reason};

const NS: i32 = ScopeType::Namespace as i32;
const ACME: &str = "acme-pool-token";
const GLOBEX: &str = "globex-pool-token";

async fn value(client: &mut MemoryServiceClient<Authed>, key: &str) -> serde_json::Value {
    let entry = client
        .get(get(key))
        .await
        .unwrap_or_else(|err| panic!("get {key}: {err}"))
        .into_inner()
        .entry
        .expect("entry");
    engram::api::convert::json_from_proto(entry.value.expect("value")).expect("json")
}

/// With one connection, every call of both tenants goes through the same
/// session, alternating: each sees only its own rows, and a transaction a
/// refused write left open is rolled back before the next call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_take_turns_on_one_connection() {
    let tokens = format!("{} acme\n{} globex", hash_token(ACME), hash_token(GLOBEX));
    let server = TestServer::spawn_with(Backend::Postgres, |s| {
        s.tokens = Some(tokens);
        s.db_max_connections = Some(1);
    })
    .await;
    let mut acme = memory(&server, Some(ACME));
    let mut globex = memory(&server, Some(GLOBEX));

    for round in 0..5 {
        acme.set(set("k", json!({"acme": round})))
            .await
            .expect("acme set");
        globex
            .set(set("k", json!({"globex": round})))
            .await
            .expect("globex set");
        assert_eq!(value(&mut acme, "k").await, json!({"acme": round}));
        assert_eq!(value(&mut globex, "k").await, json!({"globex": round}));
    }
    acme.set(set("only-acme", json!(1))).await.expect("set");
    let listed: Vec<String> = globex
        .list(ListRequest {
            scope_type: NS,
            scope: "shared".into(),
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .entries
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    assert_eq!(listed, vec!["k"]);

    // An idempotent write whose condition fails runs in a transaction that
    // has already recorded the request id when the write is refused. The
    // transaction is dropped, not committed: were it not rolled back, the
    // retry below with a new value would be refused as a reused id, and
    // with one connection the next call would wait on its open transaction.
    let conditional = |value: serde_json::Value| SetRequest {
        expected_version: Some(99),
        request_id: "pool-refused-once".into(),
        ..set("k", value)
    };
    let refused = acme
        .set(conditional(json!("first")))
        .await
        .expect_err("condition fails");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    assert_eq!(reason(&refused), "VERSION_MISMATCH");
    assert_eq!(value(&mut globex, "k").await, json!({"globex": 4}));
    let again = acme
        .set(conditional(json!("second")))
        .await
        .expect_err("condition still fails");
    assert_eq!(reason(&again), "VERSION_MISMATCH");
    let applied = acme
        .set(SetRequest {
            expected_version: Some(5),
            request_id: "pool-refused-once".into(),
            ..set("k", json!("third"))
        })
        .await
        .expect("the id was never recorded")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(applied.version, 6);
    assert_eq!(value(&mut acme, "k").await, json!("third"));
    assert_eq!(value(&mut globex, "k").await, json!({"globex": 4}));
    server.stop().await;
}

/// The database closes every connection the server holds (a restart, a
/// failover, an administrator): at most one call fails, UNAVAILABLE, and
/// the rest find fresh connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_connections_fail_at_most_one_call() {
    let server = TestServer::spawn_with(Backend::Postgres, |s| {
        s.db_max_connections = Some(4);
    })
    .await;
    let mut memory = server.memory();
    // Open several connections: concurrent calls each need one.
    let writes: Vec<_> = (0..8)
        .map(|n| {
            let mut client = memory.clone();
            tokio::spawn(async move { client.set(set(&format!("k{n}"), json!(n))).await })
        })
        .collect();
    for write in writes {
        write.await.expect("task").expect("set");
    }

    let mut owner = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect as the owner");
    let killed: i64 = sqlx::query_scalar(
        "WITH server AS MATERIALIZED (SELECT pid FROM pg_stat_activity \
         WHERE usename = $1 AND datname = current_database()) \
         SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM server",
    )
    .bind(APP_ROLE)
    .fetch_one(&mut owner)
    .await
    .expect("terminate the server's connections");
    assert!(killed >= 1, "the server held no connection");

    let mut failures = Vec::new();
    for n in 0..8 {
        match memory.get(get(&format!("k{n}"))).await {
            Ok(found) => {
                let entry = found.into_inner().entry.expect("entry");
                assert_eq!(entry.key, format!("k{n}"));
            }
            Err(status) => failures.push((status.code(), reason(&status))),
        }
    }
    assert!(
        failures.len() <= 1,
        "more than one call failed: {failures:?}"
    );
    for (code, reason) in &failures {
        assert_eq!(*code, Code::Unavailable);
        assert_eq!(reason, "DATABASE_UNAVAILABLE");
    }
    server.stop().await;
}
