//! The database goes away under a running server (a proxy between the server
//! and Postgres drops every connection and refuses new ones): health turns
//! NOT_SERVING, calls fail fast with UNAVAILABLE, and both recover when the
//! database is back, with no restart.

use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::proto::{GetRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::helpers::{
    Backend, Proxy, TestDb, TestServer, metric, pg_socket_addr, pg_url_via, reason,
};

fn set(value: i64) -> SetRequest {
    SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "outage".to_owned(),
        key: "k".to_owned(),
        value: Some(json_to_proto(&json!(value))),
        ..SetRequest::default()
    }
}

/// Reads the health Watch stream until it reports `want`.
pub async fn wait_for(
    updates: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    want: ServingStatus,
) {
    let wait = async {
        while let Some(update) = updates.message().await.expect("health update") {
            if update.status == want as i32 {
                return;
            }
        }
        panic!("health stream ended before {want:?}");
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .unwrap_or_else(|_| panic!("health never became {want:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_calls_follow_the_database() {
    // Migrate directly, then point the server at the proxy.
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = Proxy::start(pg_socket_addr(&db.url)).await;
    let via_proxy = pg_url_via(&db.url, proxy.addr);
    let server = TestServer::start(db, |s| {
        s.database_url = Some(via_proxy.clone());
        s.health_check_interval_ms = Some(100);
        s.db_acquire_timeout_ms = Some(1000);
    })
    .await;
    let mut health = HealthClient::new(server.channel.clone());
    let mut memory = server.memory();
    memory.set(set(1)).await.expect("write while up");

    let overall = health
        .check(HealthCheckRequest::default())
        .await
        .expect("check")
        .into_inner();
    assert_eq!(overall.status, ServingStatus::Serving as i32);
    let reachable = "engram_database_reachable";
    assert_eq!(metric(server.http_addr(), reachable).await, Some(1.0));
    let mut updates = health
        .watch(HealthCheckRequest {
            service: "engram.v1.MemoryService".to_owned(),
        })
        .await
        .expect("watch")
        .into_inner();
    wait_for(&mut updates, ServingStatus::Serving).await;

    proxy.cut();
    wait_for(&mut updates, ServingStatus::NotServing).await;
    assert_not_ready_but_alive(&mut health, server.http_addr()).await;
    assert_eq!(
        metric(server.http_addr(), reachable).await,
        Some(0.0),
        "what an alert watches"
    );

    // Calls fail, quickly and with the reason, instead of hanging.
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), memory.set(set(2)))
        .await
        .expect("a call during the outage returns")
        .expect_err("write during the outage");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "DATABASE_UNAVAILABLE")
    );
    assert!(!err.message().contains("SELECT") && !err.message().contains("127.0.0.1"));
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        memory.get(GetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "outage".to_owned(),
            key: "k".to_owned(),
            version: 0,
            as_of: None,
        }),
    )
    .await
    .expect("a call during the outage returns")
    .expect_err("read during the outage");
    assert_eq!(err.code(), Code::Unavailable);
    assert!(started.elapsed() < Duration::from_secs(10));

    proxy.restore().await;
    wait_for(&mut updates, ServingStatus::Serving).await;
    assert_eq!(http_status(server.http_addr(), "/readyz").await, 200);
    assert_eq!(metric(server.http_addr(), reachable).await, Some(1.0));
    let entry = memory
        .set(set(3))
        .await
        .expect("write after recovery")
        .into_inner();
    assert_eq!(
        entry.entry.expect("entry").version,
        2,
        "the failed write left nothing behind"
    );
    drop(updates);
    server.stop().await;
}

/// What probes see of a server that must not be sent calls but must not
/// be restarted either: health NOT_SERVING, `/readyz` 503, `/healthz` 200,
/// and the liveness service SERVING.
pub async fn assert_not_ready_but_alive(
    health: &mut HealthClient<tonic::transport::Channel>,
    http: std::net::SocketAddr,
) {
    let overall = health
        .check(HealthCheckRequest::default())
        .await
        .expect("check")
        .into_inner();
    assert_eq!(overall.status, ServingStatus::NotServing as i32);
    assert_eq!(http_status(http, "/readyz").await, 503);
    assert_eq!(http_status(http, "/healthz").await, 200);
    let alive = health
        .check(HealthCheckRequest {
            service: engram::server::LIVENESS.to_owned(),
        })
        .await
        .expect("check liveness")
        .into_inner();
    assert_eq!(
        alive.status,
        ServingStatus::Serving as i32,
        "a liveness probe does not restart the pod"
    );
}

/// A minimal HTTP/1.1 GET, returning the status code.
pub async fn http_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect http");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status line")
}

fn get_k() -> GetRequest {
    GetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "outage".to_owned(),
        key: "k".to_owned(),
        version: 0,
        as_of: None,
    }
}

/// After a failover the database's address may still lead to the old
/// primary, now a read-only standby (here: the database made read-only
/// and every connection to it ended, as a demotion's restart ends them).
/// Writes there answer `UNAVAILABLE` (retry), not `INTERNAL`, reads go
/// on, and once the address leads to a writable server again the very
/// next write succeeds: the pool reopens its connections instead of
/// keeping the read-only ones until their lifetime ends (30 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_after_a_failover_to_a_read_only_server_retry_then_resume() {
    let server = TestServer::spawn(Backend::Postgres).await;
    let mut memory = server.memory();
    memory.set(set(1)).await.expect("write before");

    let mut owner = server.db_connection("the owner").await;
    let demote = [
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', \
         current_database()); END $$",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    ];
    for statement in demote {
        sqlx::query(statement)
            .execute(&mut owner)
            .await
            .expect("demote");
    }
    // The ended connections fail a call or two while the pool notices;
    // then it reads through new, read-only sessions.
    let mut read = None;
    for _ in 0..10 {
        match memory.get(get_k()).await {
            Ok(reply) => {
                read = Some(reply.into_inner());
                break;
            }
            Err(err) => assert_eq!(err.code(), Code::Unavailable, "{err:?}"),
        }
    }
    let read = read.expect("reads go on against a read-only server");
    assert_eq!(read.entry.expect("entry").version, 1);
    let err = memory.set(set(2)).await.expect_err("a read-only server");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "DATABASE_UNAVAILABLE"),
        "{err:?}"
    );

    sqlx::query(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only', \
         current_database()); END $$",
    )
    .execute(&mut owner)
    .await
    .expect("promote");
    let written = memory
        .set(set(3))
        .await
        .expect("the first write once the server is writable")
        .into_inner();
    assert_eq!(written.entry.expect("entry").version, 2);
    server.stop().await;
}
