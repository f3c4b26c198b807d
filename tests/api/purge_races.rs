//! Purges against the writers that share their rows, on Postgres (SQLite
//! has one writer, so nothing interleaves there). Each test's own
//! transaction holds, at a chosen moment, what a racing call would hold,
//! and checks what the purge holds or decides meanwhile, and what the
//! racing call can still do.

use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{
    AsOf, GetRequest, MemoryEntry, PurgeRequest, PurgeScopeRequest, ScopeType, SetRequest, as_of,
};
use serde_json::json;
use sqlx::{Connection, PgConnection};
use tonic::Code;
use tonic::Response;

use crate::helpers::{Backend, LOCK_WAITS, TestServer, holding, reason, release, until_reads};

const NS: i32 = ScopeType::Namespace as i32;

async fn set(server: &TestServer, key: &str, value: &str) -> MemoryEntry {
    server
        .memory()
        .set(SetRequest {
            scope_type: NS,
            scope: "p".into(),
            key: key.into(),
            value: Some(json_to_proto(&json!(value))),
            ..SetRequest::default()
        })
        .await
        .expect("set")
        .into_inner()
        .entry
        .expect("an entry")
}

async fn connect(server: &TestServer) -> PgConnection {
    PgConnection::connect(&server.db.url)
        .await
        .expect("connect")
}

/// `PurgeScope` of the test's scope keeping one version of each key.
async fn purge_keeping_one(
    mut admin: MemoryAdminServiceClient<tonic::transport::Channel>,
) -> Result<Response<engram::proto::PurgeScopeResponse>, tonic::Status> {
    admin
        .purge_scope(PurgeScopeRequest {
            scope_type: NS,
            scope: "p".into(),
            keep: Some(1),
            include_deleted: false,
            dry_run: false,
        })
        .await
}

fn get(key: &str, as_of: Option<AsOf>) -> GetRequest {
    GetRequest {
        scope_type: NS,
        scope: "p".into(),
        key: key.into(),
        version: 0,
        as_of,
    }
}

/// `ForgetUser`, like a group of sets, locks a key's head before its
/// versions. A purge that empties a key used to delete the versions first
/// and then wait for the head: with a forget holding the head and waiting
/// for the versions, Postgres failed one of the two. Here the test's own
/// transaction is that forget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_takes_a_keys_head_before_its_versions() {
    let server = TestServer::spawn(Backend::Postgres).await;
    for value in ["one", "two"] {
        set(&server, "k", value).await;
    }
    let mut db = connect(&server).await;
    let mut forget = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'k' FOR UPDATE",
    )
    .await;
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    let purging = tokio::spawn(async move {
        admin
            .purge(PurgeRequest {
                scope_type: NS,
                scope: "p".into(),
                key: "k".into(),
                keep: Some(0),
                dry_run: false,
            })
            .await
    });
    until_reads(&mut db, LOCK_WAITS, 1, "the purge waits for the head").await;
    sqlx::query("SELECT 1 FROM memory_versions WHERE key = 'k' FOR UPDATE NOWAIT")
        .execute(&mut forget)
        .await
        .expect("the purge holds no version while it waits for the head");
    release(forget, "ROLLBACK").await;
    let purged = purging
        .await
        .expect("purger")
        .expect("the purge goes on")
        .into_inner();
    assert_eq!((purged.versions_deleted, purged.keys_affected), (2, 1));
    let err = server
        .memory()
        .get(get("k", None))
        .await
        .expect_err("the key is gone");
    assert_eq!(err.code(), Code::NotFound);
}

/// A purge records what each key loses (for reads at a past point) and
/// then deletes it, in two statements. A key whose first victim appeared
/// between the two (a set committed, and `keep` no longer held its oldest
/// version) used to lose that version with no record: a read at its time
/// then said the key did not exist. Now the purge deletes only from the
/// keys it recorded; that version is the next purge's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_deletes_only_what_it_recorded() {
    let server = TestServer::spawn(Backend::Postgres).await;
    // `j` has been purged once, so it has a record to hold; it has a
    // victim again.
    for value in ["j1", "j2"] {
        set(&server, "j", value).await;
    }
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    admin
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "p".into(),
            key: "j".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge j once");
    set(&server, "j", "j3").await;
    let first = set(&server, "k", "k1").await;
    let mut db = connect(&server).await;
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_purges WHERE key = 'j' FOR UPDATE",
    )
    .await;
    let purging = tokio::spawn(purge_keeping_one(admin));
    until_reads(&mut db, LOCK_WAITS, 1, "the purge waits to record j").await;
    // `k` gains its first victim after the purge looked.
    set(&server, "k", "k2").await;
    release(holder, "ROLLBACK").await;
    let purged = purging
        .await
        .expect("purger")
        .expect("the purge goes on")
        .into_inner();
    assert_eq!((purged.versions_deleted, purged.keys_affected), (1, 1));
    let at_first = Some(AsOf {
        point: Some(as_of::Point::Time(first.create_time.expect("a time"))),
    });
    let then = server
        .memory()
        .get(get("k", at_first))
        .await
        .expect("k's first version is there at its time")
        .into_inner()
        .entry
        .expect("an entry");
    assert_eq!(then.version, 1);
    // The next purge takes it, and says so at that time.
    purge_keeping_one(MemoryAdminServiceClient::new(server.channel.clone()))
        .await
        .expect("purge again");
    let err = server
        .memory()
        .get(get("k", at_first))
        .await
        .expect_err("purged");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::NotFound, "VERSION_PURGED".into())
    );
}

/// A purge holds the heads of its keys only against deleting them (as a
/// forget would): a set of one of its keys goes on while the purge waits.
/// Here the purge waits for an old version of another key, which the
/// test's own transaction holds as the embedding worker might.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_goes_on_while_a_purge_of_its_key_waits() {
    let server = TestServer::spawn(Backend::Postgres).await;
    for value in ["one", "two"] {
        set(&server, "j", value).await;
        set(&server, "k", value).await;
    }
    let mut db = connect(&server).await;
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_versions WHERE key = 'j' AND version = 1 FOR UPDATE",
    )
    .await;
    let admin = MemoryAdminServiceClient::new(server.channel.clone());
    let purging = tokio::spawn(purge_keeping_one(admin));
    until_reads(&mut db, LOCK_WAITS, 1, "the purge waits for j's version").await;
    let during = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        set(&server, "k", "three"),
    )
    .await
    .expect("the set does not wait for the purge");
    assert_eq!(during.version, 3);
    release(holder, "ROLLBACK").await;
    let purged = purging
        .await
        .expect("purger")
        .expect("the purge goes on")
        .into_inner();
    assert_eq!((purged.versions_deleted, purged.keys_affected), (2, 2));
    let current = server
        .memory()
        .get(get("k", None))
        .await
        .expect("k")
        .into_inner()
        .entry
        .expect("an entry");
    assert_eq!(current.version, 3);
}
