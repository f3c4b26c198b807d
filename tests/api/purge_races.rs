//! Purges against the writers that share their rows, on Postgres (SQLite
//! has one writer, so nothing interleaves there). Each test's own
//! transaction holds, at a chosen moment, what a racing call would hold,
//! and checks what the purge holds or decides meanwhile, and what the
//! racing call can still do.

use engram::api::convert::json_to_proto;
use engram::proto::data_service_client::DataServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{
    AsOf, ForgetUserRequest, GetRequest, MemoryEntry, PurgeRequest, PurgeScopeRequest, ScopeType,
    SetRequest, as_of,
};
use serde_json::json;
use sqlx::PgConnection;
use tonic::Code;
use tonic::Response;

use crate::helpers::{Backend, LOCK_WAITS, TestServer, holding, reason, release, until_reads};

const NS: i32 = ScopeType::Namespace as i32;

/// The test's namespace, and its run: the session `s1` of user `alice` in
/// app `bot` ([`run_of_alice`]).
type Scope = (i32, &'static str);
const NAMESPACE: Scope = (NS, "p");
const RUN: Scope = (ScopeType::Execution as i32, "s1");

async fn set_in(
    server: &TestServer,
    (scope_type, scope): Scope,
    key: &str,
    value: &str,
) -> MemoryEntry {
    server
        .memory()
        .set(SetRequest {
            scope_type,
            scope: scope.into(),
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

async fn set(server: &TestServer, key: &str, value: &str) -> MemoryEntry {
    set_in(server, NAMESPACE, key, value).await
}

/// `Purge` of one key, keeping `keep` versions.
async fn purge_key(
    mut admin: MemoryAdminServiceClient<tonic::transport::Channel>,
    (scope_type, scope): Scope,
    key: &'static str,
    keep: i64,
) -> Result<Response<engram::proto::PurgeResponse>, tonic::Status> {
    admin
        .purge(PurgeRequest {
            scope_type,
            scope: scope.into(),
            key: key.into(),
            keep: Some(keep),
            dry_run: false,
        })
        .await
}

/// What a call spawned as a task answered.
async fn done<T>(
    task: tokio::task::JoinHandle<Result<Response<T>, tonic::Status>>,
    what: &str,
) -> T {
    match task.await {
        Ok(Ok(answer)) => answer.into_inner(),
        Ok(Err(status)) => panic!("{what}: {status}"),
        Err(err) => panic!("{what}: the task failed: {err}"),
    }
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

/// Why a read of `entry`'s key at the time `entry` was written finds
/// nothing.
async fn missing_at(
    server: &TestServer,
    (scope_type, scope): Scope,
    entry: &MemoryEntry,
) -> (Code, String) {
    let err = server
        .memory()
        .get(GetRequest {
            scope_type,
            scope: scope.into(),
            ..get(&entry.key, at_time_of(entry))
        })
        .await
        .expect_err("nothing at that time");
    (err.code(), reason(&err))
}

fn at_time_of(entry: &MemoryEntry) -> Option<AsOf> {
    Some(AsOf {
        point: Some(as_of::Point::Time(entry.create_time.expect("a time"))),
    })
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
    let mut db = server.db_connection("the test").await;
    let mut forget = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'k' FOR UPDATE",
    )
    .await;
    let admin = MemoryAdminServiceClient::new(server.channel.clone());
    let purging = tokio::spawn(purge_key(admin, NAMESPACE, "k", 0));
    until_reads(&mut db, LOCK_WAITS, 1, "the purge waits for the head").await;
    sqlx::query("SELECT 1 FROM memory_versions WHERE key = 'k' FOR UPDATE NOWAIT")
        .execute(&mut forget)
        .await
        .expect("the purge holds no version while it waits for the head");
    release(forget, "ROLLBACK").await;
    let purged = done(purging, "the purge goes on").await;
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
    let admin = MemoryAdminServiceClient::new(server.channel.clone());
    purge_key(admin.clone(), NAMESPACE, "j", 1)
        .await
        .expect("purge j once");
    set(&server, "j", "j3").await;
    let first = set(&server, "k", "k1").await;
    let mut db = server.db_connection("the test").await;
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
    let purged = done(purging, "the purge goes on").await;
    assert_eq!((purged.versions_deleted, purged.keys_affected), (1, 1));
    let then = server
        .memory()
        .get(get("k", at_time_of(&first)))
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
    assert_eq!(
        missing_at(&server, NAMESPACE, &first).await,
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
    let mut db = server.db_connection("the test").await;
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
    let purged = done(purging, "the purge goes on").await;
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

/// A Postgres server with the session `s1` of user `alice` in app `bot`,
/// whose run scope the tests write.
pub(crate) async fn run_of_alice() -> TestServer {
    let server = TestServer::spawn(Backend::Postgres).await;
    server
        .sessions()
        .create_session(engram::proto::CreateSessionRequest {
            session_id: "s1".into(),
            app: "bot".into(),
            user: "alice".into(),
            metadata: None,
            request_id: String::new(),
        })
        .await
        .expect("create the run's session");
    server
}

/// `ForgetUser` of `alice`, in a task.
fn forget_alice(
    server: &TestServer,
) -> tokio::task::JoinHandle<Result<Response<engram::proto::ForgetUserResponse>, tonic::Status>> {
    let mut data = DataServiceClient::new(server.channel.clone());
    tokio::spawn(async move {
        data.forget_user(ForgetUserRequest {
            app: "bot".into(),
            user: "alice".into(),
            ..ForgetUserRequest::default()
        })
        .await
    })
}

/// What the database still holds of the run: its purge records and its
/// keys' changes.
async fn left_of_the_run(db: &mut PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM memory_purges WHERE scope = 's1'), \
         (SELECT count(*) FROM memory_changes WHERE scope = 's1')",
    )
    .fetch_one(db)
    .await
    .expect("count what is left")
}

/// `ForgetUser` deletes a user's runs' keys with their purge records, but
/// leaves a record another call holds (or has not committed) to that call
/// rather than wait for it. A purge records a key, then waits for its head:
/// when a forget took the head meanwhile, the purge found the key gone,
/// deleted nothing, and its record (the key's name and times) outlived the
/// forget. A read at a past point then said the forgotten key's versions
/// had been purged, and `ListScopes` at that point showed the run. Now the
/// purge drops such a record. Here the forget waits, holding the run's
/// heads, for a version of another key that the test's own transaction
/// holds, while the purge records `k`; `purged_before` gives `k` a record
/// from an earlier purge, which the purge then holds.
async fn a_purge_under_a_forget_leaves_no_record(purged_before: bool) {
    let server = run_of_alice().await;
    let first = set_in(&server, RUN, "k", "one").await;
    set_in(&server, RUN, "k", "two").await;
    set_in(&server, RUN, "other", "x").await;
    let admin = MemoryAdminServiceClient::new(server.channel.clone());
    if purged_before {
        purge_key(admin.clone(), RUN, "k", 1)
            .await
            .expect("purge version 1");
    }
    let mut db = server.db_connection("the test").await;
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_versions WHERE key = 'other' FOR UPDATE",
    )
    .await;
    let forgetting = forget_alice(&server);
    until_reads(&mut db, LOCK_WAITS, 1, "the forget waits for `other`").await;
    let purging = tokio::spawn(purge_key(admin, RUN, "k", 0));
    until_reads(&mut db, LOCK_WAITS, 2, "the purge waits for k's head").await;
    release(holder, "ROLLBACK").await;
    let forgot = done(forgetting, "the forget goes on").await;
    // `k`'s two versions and `other`'s, or `k`'s second, `other`'s and
    // the earlier purge's audit record.
    assert_eq!(forgot.memory_versions, 3);
    let purged = done(purging, "the purge goes on").await;
    assert_eq!((purged.versions_deleted, purged.keys_affected), (0, 0));
    assert_eq!(left_of_the_run(&mut db).await, (0, 0));
    assert_eq!(
        missing_at(&server, RUN, &first).await,
        (Code::NotFound, "KEY_NOT_FOUND".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_under_a_forget_leaves_no_new_record() {
    a_purge_under_a_forget_leaves_no_record(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_under_a_forget_leaves_no_record_it_held() {
    a_purge_under_a_forget_leaves_no_record(true).await;
}

/// A purge that finds a recorded key emptied by another purge (its head
/// gone, the other's change there) keeps the record, and holds that change
/// until it commits. A forget used to skip both, the record because the
/// purge held it, and left it behind. Now it waits for the changes, and
/// then deletes the record. Here the test's own transaction is that purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_waits_for_a_purge_keeping_a_record() {
    let server = run_of_alice().await;
    let first = set_in(&server, RUN, "k", "one").await;
    set_in(&server, RUN, "k", "two").await;
    let admin = MemoryAdminServiceClient::new(server.channel.clone());
    purge_key(admin, RUN, "k", 0).await.expect("empty k");
    let mut db = server.db_connection("the test").await;
    let purge = holding(
        &server.db.url,
        "SELECT 1 FROM memory_purges p JOIN memory_changes c USING (tenant, scope_type, scope, key) \
         WHERE p.key = 'k' FOR UPDATE OF p FOR KEY SHARE OF c",
    )
    .await;
    let forgetting = forget_alice(&server);
    until_reads(&mut db, LOCK_WAITS, 1, "the forget waits for k's changes").await;
    release(purge, "COMMIT").await;
    done(forgetting, "the forget goes on").await;
    assert_eq!(left_of_the_run(&mut db).await, (0, 0));
    assert_eq!(
        missing_at(&server, RUN, &first).await,
        (Code::NotFound, "KEY_NOT_FOUND".into())
    );
}

/// A forget locks the heads of the user's runs, and deletes those keys. A
/// purge that held the heads first (against deletion) commits its audit
/// record, a new key of the run, while the forget waits: that key was not
/// in the snapshot the forget's lock read, and outlived the forget. Now
/// the forget takes the run's heads again once the rest is deleted. Here
/// the purge waits, holding the heads, for an old version of `other` that
/// the test's own transaction holds, and the forget waits for the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_takes_the_audit_of_a_purge_it_waited_for() {
    let server = run_of_alice().await;
    for value in ["one", "two"] {
        set_in(&server, RUN, "k", value).await;
        set_in(&server, RUN, "other", value).await;
    }
    let mut db = server.db_connection("the test").await;
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_versions WHERE key = 'other' AND version = 1 FOR UPDATE",
    )
    .await;
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    let purging = tokio::spawn(async move {
        admin
            .purge_scope(PurgeScopeRequest {
                scope_type: RUN.0,
                scope: "s1".into(),
                keep: Some(1),
                include_deleted: false,
                dry_run: false,
            })
            .await
    });
    until_reads(&mut db, LOCK_WAITS, 1, "the purge waits for `other`").await;
    let forgetting = forget_alice(&server);
    until_reads(&mut db, LOCK_WAITS, 2, "the forget waits for the purge").await;
    release(holder, "ROLLBACK").await;
    let purged = done(purging, "the purge goes on").await;
    assert_eq!((purged.versions_deleted, purged.keys_affected), (2, 2));
    let forgot = done(forgetting, "the forget goes on").await;
    // The two keys' last versions and the purge's audit record.
    assert_eq!(forgot.memory_versions, 3);
    let listed = server
        .memory()
        .list(engram::proto::ListRequest {
            scope_type: RUN.0,
            scope: "s1".into(),
            ..engram::proto::ListRequest::default()
        })
        .await
        .expect("list the run")
        .into_inner();
    assert_eq!(listed.entries, []);
    let heads: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_heads WHERE scope = 's1'")
        .fetch_one(&mut db)
        .await
        .expect("count the run's heads");
    assert_eq!(heads, 0, "the audit record's key is left");
    assert_eq!(left_of_the_run(&mut db).await, (0, 0));
}

/// The other way a purge of a run finds a recorded key gone: another purge
/// emptied it between the two statements, and the record is theirs
/// together. It stays: a read at a past point says the versions were
/// purged. Here the test's transaction holds the key's head, so the first
/// purge waits after recording, and the second waits for the first's
/// record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_after_another_emptied_its_key_keeps_the_record() {
    let server = run_of_alice().await;
    let first = set_in(&server, RUN, "k", "one").await;
    set_in(&server, RUN, "k", "two").await;
    let mut db = server.db_connection("the test").await;
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'k' FOR UPDATE",
    )
    .await;
    let admin = MemoryAdminServiceClient::new(server.channel.clone());
    let one = tokio::spawn(purge_key(admin.clone(), RUN, "k", 0));
    until_reads(&mut db, LOCK_WAITS, 1, "the first purge waits for the head").await;
    let two = tokio::spawn(purge_key(admin, RUN, "k", 0));
    until_reads(&mut db, LOCK_WAITS, 2, "the second waits for the record").await;
    release(holder, "ROLLBACK").await;
    let mut deleted = Vec::new();
    for purge in [one, two] {
        let purged = done(purge, "the purge goes on").await;
        deleted.push(purged.versions_deleted);
    }
    assert_eq!(deleted, [2, 0]);
    assert_eq!(
        missing_at(&server, RUN, &first).await,
        (Code::NotFound, "VERSION_PURGED".into())
    );
}
