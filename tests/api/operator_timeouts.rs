//! Postgres's timeouts, which an operator may set for Engram's role or
//! database and Engram itself never sets. Past one, Postgres gives up on a
//! statement or a session, and the caller used to hear `INTERNAL` with a
//! correlation id, as for a bug. Now:
//!
//! - an export's client that reads slowly, past
//!   `idle_in_transaction_session_timeout`, hears what a slow `Watch`
//!   consumer hears, with the setting named (an export reads every page
//!   through one snapshot transaction, which waits between pages for its
//!   client to take what was read), and the server's pool goes on
//!   without the lost connection;
//! - a call whose statement runs or waits past `statement_timeout` (or
//!   `lock_timeout`) hears `UNAVAILABLE`, `DATABASE_TIMEOUT`, with
//!   nothing written.

use engram::api::convert::json_to_proto;
use engram::proto::data_service_client::DataServiceClient;
use engram::proto::{ExportRequest, GetRequest, ScopeType, SetRequest};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::helpers::{
    Backend, TestDb, TestServer, error_metadata, holding, reason, release, until_reads,
};
use crate::transfer::{export, records};

/// Sessions of the test database idle inside a transaction.
const IDLE_IN_TRANSACTION: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE datname = current_database() AND state = 'idle in transaction'";

/// Those of them idle for most of the timeout: not a pause between two
/// pages, but an export waiting on its client.
const IDLE_LONG: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE datname = current_database() AND state = 'idle in transaction' \
     AND state_change < now() - interval '1 second'";

/// Versions of the exported key: 20 MB of pages of 500 (about 0.5 MB
/// each, so each page's statement is read whole and the snapshot waits
/// idle, not inside a statement), far more than the stream's buffers hold.
const VERSIONS: i64 = 20_000;

/// A migrated Postgres test database, its owner's connection, and
/// `setting` set on the database for every session opened from now on
/// (the server's among them).
async fn database_with(setting: &'static str) -> (TestDb, sqlx::PgConnection) {
    use engram::ports::Database;
    let db = TestDb::new(Backend::Postgres).await;
    db.pg_store().await.migrate().await.expect("migrate");
    let mut owner = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect as the owner");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET {setting}', current_database()); END $$"
    )))
    .execute(&mut owner)
    .await
    .unwrap_or_else(|err| panic!("set {setting}: {err}"));
    (db, owner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_export_client_hears_the_database_gave_up_on_it() {
    let (db, mut owner) = database_with("idle_in_transaction_session_timeout = 2000").await;
    {
        sqlx::query(
            "INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, create_time) \
             SELECT 'default', 1, 'big', 'k', i, to_jsonb(repeat('x', 1000) || i), false, now() \
             FROM generate_series(1::bigint, $1::bigint) AS i",
        )
        .bind(VERSIONS)
        .execute(&mut owner)
        .await
        .expect("load versions");
        sqlx::query("INSERT INTO memory_heads VALUES ('default', 1, 'big', 'k', $1, false, now())")
            .bind(VERSIONS)
            .execute(&mut owner)
            .await
            .expect("load the head");
    }
    let server = TestServer::start(db, |_| {}).await;
    let mut memory = server.memory();

    let mut db = server.db_connection("the test").await;
    let mut stream = DataServiceClient::new(server.channel.clone())
        .export(ExportRequest::default())
        .await
        .expect("export")
        .into_inner();
    let first = stream.next().await.expect("a chunk").expect("the header");
    assert_eq!(first.lines.len(), 1, "the header comes alone");
    // The client takes nothing more: the export's snapshot waits on it,
    // idle, until Postgres ends its session.
    until_reads(&mut db, IDLE_LONG, 1, "the export waits on its client").await;
    until_reads(
        &mut db,
        IDLE_IN_TRANSACTION,
        0,
        "Postgres ends the export's session",
    )
    .await;
    let mut lines = 0;
    let status = loop {
        match stream.next().await {
            Some(Ok(chunk)) => lines += chunk.lines.len(),
            Some(Err(status)) => break status,
            None => {
                panic!("the export ended whole after {lines} lines, though its session was ended")
            }
        }
    };
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::ResourceExhausted, "CONSUMER_TOO_SLOW"),
        "{status:?}"
    );
    assert!(
        status
            .message()
            .contains("idle_in_transaction_session_timeout"),
        "{}",
        status.message()
    );
    assert_eq!(
        error_metadata(&status, "limit").as_deref(),
        Some("idle_in_transaction_session_timeout")
    );
    assert_eq!(error_metadata(&status, "value").as_deref(), Some("2000"));

    // The server goes on without the lost connection: an export small
    // enough to be read at once comes whole.
    memory
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "small".into(),
            key: "k".into(),
            value: Some(json_to_proto(&json!("v"))),
            ..SetRequest::default()
        })
        .await
        .expect("set");
    let small = records(
        &export(
            &server.channel,
            ExportRequest {
                scope_type: ScopeType::Namespace as i32,
                scope: "small".into(),
                ..ExportRequest::default()
            },
        )
        .await,
    );
    let keys: Vec<_> = small.iter().map(|r| (&r["kind"], &r["key"])).collect();
    assert_eq!(keys, [(&json!("memory_version"), &json!("k"))]);
}

/// A `Set` waits for the head a racing transaction holds, past the
/// database's `statement_timeout`: Postgres cancels it, and the caller
/// hears so, with the key as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_past_the_databases_timeout_is_unavailable_with_nothing_written() {
    let (db, owner) = database_with("statement_timeout = 1000").await;
    drop(owner);
    let server = TestServer::start(db, |_| {}).await;
    let mut memory = server.memory();
    let set = |value: &str| SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "s".into(),
        key: "k".into(),
        value: Some(json_to_proto(&json!(value))),
        ..SetRequest::default()
    };
    memory.set(set("first")).await.expect("set");
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'k' FOR UPDATE",
    )
    .await;
    let err = memory
        .set(set("second"))
        .await
        .expect_err("canceled while it waits");
    release(holder, "ROLLBACK").await;
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "DATABASE_TIMEOUT"),
        "{err:?}"
    );
    assert!(
        err.message().contains("statement_timeout"),
        "{}",
        err.message()
    );
    let entry = memory
        .get(GetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "s".into(),
            key: "k".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("get")
        .into_inner()
        .entry
        .expect("an entry");
    assert_eq!(
        (entry.version, entry.value),
        (1, Some(json_to_proto(&json!("first"))))
    );
}
