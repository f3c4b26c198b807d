//! `MemoryService.Watch`: every change exactly once, in order, across
//! reconnects and replicas; slow consumers and shutdown end the stream with
//! the revision to resume after.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::memory::ports::MemoryStore;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{
    ChangeKind, CompactRequest, DeleteRequest, PurgeRequest, ScopeType, SetRequest, WatchRequest,
    WatchResponse,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, TestServer, connect, error_metadata, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

fn set(scope: &str, key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

fn watch(scope: &str, prefix: &str, from_revision: Option<i64>) -> WatchRequest {
    WatchRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key_prefix: prefix.to_owned(),
        from_revision,
    }
}

async fn next(
    stream: &mut tonic::Streaming<WatchResponse>,
) -> Result<WatchResponse, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("a change arrives")
        .and_then(|item| item.ok_or_else(|| tonic::Status::internal("stream ended")))
}

/// Reads until the change of `key` at `version` (the end marker).
async fn read_until(
    client: &mut MemoryServiceClient<Channel>,
    mut stream: tonic::Streaming<WatchResponse>,
    request: WatchRequest,
    key: &str,
    version: i64,
    reconnect_after: Option<usize>,
) -> Vec<WatchResponse> {
    let mut seen = Vec::new();
    loop {
        let change = next(&mut stream).await.expect("change");
        let done = change.key == key && change.version == version;
        seen.push(change);
        if done {
            return seen;
        }
        if reconnect_after == Some(seen.len()) {
            // Drop the stream and resume after the last revision seen.
            let last = seen.last().map(|c| c.revision);
            stream = client
                .watch(WatchRequest {
                    from_revision: last,
                    ..request.clone()
                })
                .await
                .expect("resume")
                .into_inner();
        }
    }
}

fn check_exactly_once_in_order(seen: &[WatchResponse]) {
    let revisions: Vec<i64> = seen.iter().map(|c| c.revision).collect();
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "revisions strictly increase"
    );
    let mut per_key: HashMap<&str, i64> = HashMap::new();
    for change in seen {
        if change.kind == ChangeKind::Purge as i32 {
            continue;
        }
        let last = per_key
            .insert(change.key.as_str(), change.version)
            .unwrap_or(0);
        assert_eq!(
            change.version,
            last + 1,
            "{} versions in order, none missing",
            change.key
        );
    }
}

async fn every_change_once_in_order(backend: Backend) {
    const WRITERS: usize = 8;
    const EACH: usize = 1250;
    let server = TestServer::spawn_with(backend, |s| {
        s.db_max_connections = Some(16);
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    let mut memory = server.memory();
    memory
        .set(set("feed", "before", json!(0)))
        .await
        .expect("seed");

    // Three watchers from now (the seed is not theirs), each on its own
    // connection as separate processes would be, all open before any write:
    // one reads to the end, one drops its stream mid-way and resumes from
    // the last revision it saw, one watches a key prefix.
    let watcher = || async { MemoryServiceClient::new(connect(server.grpc_addr()).await) };
    let mut first_client = watcher().await;
    let first = first_client
        .watch(watch("feed", "", None))
        .await
        .expect("watch")
        .into_inner();
    let mut second_client = watcher().await;
    let second = second_client
        .watch(watch("feed", "", None))
        .await
        .expect("watch")
        .into_inner();
    let mut third_client = watcher().await;
    let mut third = third_client
        .watch(watch("feed", "w3/", None))
        .await
        .expect("watch")
        .into_inner();
    let reconnecting = tokio::spawn(async move {
        read_until(
            &mut second_client,
            second,
            watch("feed", "", None),
            "w0/k0",
            126,
            Some(3000),
        )
        .await
    });
    let prefixed = tokio::spawn(async move {
        let mut seen = Vec::new();
        while seen.len() < EACH {
            seen.push(next(&mut third).await.expect("change"));
        }
        seen
    });
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = server.memory();
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                let key = format!("w{writer}/k{}", i % 10);
                client.set(set("feed", &key, json!(i))).await.expect("set");
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    // Every other kind of change, then an end marker.
    memory
        .delete(DeleteRequest {
            scope_type: NS,
            scope: "feed".to_owned(),
            key: "w1/k1".to_owned(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    admin
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "feed".to_owned(),
            key: "w2/k2".to_owned(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge");
    admin
        .compact(CompactRequest {
            scope_type: NS,
            scope: "feed".to_owned(),
            key: "w4/k4".to_owned(),
            ..CompactRequest::default()
        })
        .await
        .expect("compact");
    memory
        .set(set("feed", "w0/k0", json!("end")))
        .await
        .expect("end marker");

    let seen = read_until(
        &mut first_client,
        first,
        watch("feed", "", None),
        "w0/k0",
        126,
        None,
    )
    .await;
    check_exactly_once_in_order(&seen);
    let sets = seen
        .iter()
        .filter(|c| c.kind == ChangeKind::Set as i32 && !c.key.starts_with("_compaction/"))
        .count();
    assert_eq!(
        sets,
        WRITERS * EACH + 1,
        "every write once (plus the end marker)"
    );
    let kinds: HashSet<i32> = seen.iter().map(|c| c.kind).collect();
    assert_eq!(kinds.len(), 4, "set, delete, purge and compact all appear");
    let purge = seen
        .iter()
        .find(|c| c.kind == ChangeKind::Purge as i32)
        .expect("purge change");
    assert_eq!(
        (purge.key.as_str(), purge.versions_deleted, purge.version),
        ("w2/k2", 124, 124)
    );
    let compaction = seen
        .iter()
        .find(|c| c.kind == ChangeKind::Compact as i32)
        .expect("compact change");
    assert_eq!(
        (compaction.key.as_str(), compaction.version),
        ("w4/k4", 126)
    );
    assert!(
        compaction.value.is_some(),
        "the summary travels with the change"
    );
    assert!(
        !seen.iter().any(|c| c.key == "before"),
        "a watch from now starts after the current state"
    );

    let resumed = reconnecting.await.expect("reconnecting watcher");
    check_exactly_once_in_order(&resumed);
    assert_eq!(
        resumed.iter().map(|c| c.revision).collect::<Vec<_>>(),
        seen.iter().map(|c| c.revision).collect::<Vec<_>>(),
        "the reconnecting watcher saw exactly the same changes"
    );
    let prefixed = prefixed.await.expect("prefix watcher");
    assert!(prefixed.iter().all(|c| c.key.starts_with("w3/")));
    check_exactly_once_in_order(&prefixed);
}

/// Writes `n` changes of 16 KiB to seven keys of `scope`, each value
/// `{"i": its index, "pad": …}`.
async fn write_big(memory: &mut MemoryServiceClient<Channel>, scope: &str, n: i64) {
    let big = "x".repeat(16 * 1024);
    for i in 0..n {
        memory
            .set(set(
                scope,
                &format!("k{}", i % 7),
                json!({"i": i, "pad": big}),
            ))
            .await
            .expect("set");
    }
}

async fn slow_consumers_and_shutdown_say_where_to_resume(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.watch_stall_timeout_ms = Some(100);
        s.watch_buffer = Some(4);
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    let mut memory = server.memory();
    // The stalled reader has its own connection: a stream nobody reads
    // fills its connection's HTTP/2 window, and would slow everything else
    // sharing that connection (a client-side fact, not a server one).
    let mut stalled_client = MemoryServiceClient::new(connect(server.grpc_addr()).await);
    let mut stalled = stalled_client
        .watch(watch("slow", "", None))
        .await
        .expect("watch")
        .into_inner();
    // 16 KiB changes: a few MB in all, far beyond the tiny buffer plus the
    // HTTP/2 buffers (about 1 MB), so the producer must block and stall.
    const WRITES: i64 = 300;
    write_big(&mut memory, "slow", WRITES).await;
    // Only now read: what was buffered, then the verdict.
    let (mut received, resume) = cut_off(&mut stalled, WRITES).await;
    assert_eq!(
        Some(&resume),
        received.last(),
        "resume after the last change received"
    );
    // Resuming there delivers the rest, exactly once.
    let mut rest = memory
        .watch(watch("slow", "", Some(resume)))
        .await
        .expect("resume")
        .into_inner();
    while (received.len() as i64) < WRITES {
        received.push(next(&mut rest).await.expect("change").revision);
    }
    assert!(received.windows(2).all(|w| w[0] < w[1]));
    // Shutdown ends an open watch with UNAVAILABLE and the resume point.
    let status = {
        let stop = async {
            let server = server;
            server.stop().await;
        };
        let (_, status) = tokio::join!(stop, async {
            loop {
                match tokio::time::timeout(Duration::from_secs(30), rest.message()).await {
                    Err(_) => panic!("the watch did not end on shutdown"),
                    Ok(Ok(Some(_))) => continue,
                    Ok(Ok(None)) => panic!("ended without a status"),
                    Ok(Err(status)) => break status,
                }
            }
        });
        status
    };
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::Unavailable, "SHUTTING_DOWN")
    );
    assert_eq!(
        error_metadata(&status, "resume_revision"),
        received.last().map(|r| r.to_string())
    );
}

/// Prunes every change written so far, as the server's pruning would once
/// they aged past the retention.
async fn prune_everything(server: &TestServer, backend: Backend) -> u64 {
    let before = chrono::Utc::now() + chrono::Duration::seconds(1);
    match backend {
        Backend::Sqlite => server.db.sqlite_store().await.prune_changes(before).await,
        Backend::Postgres => server.db.pg_store().await.prune_changes(before).await,
    }
    .expect("prune")
}

/// A stream still reading changes that pruning then deletes is ended with
/// REVISION_PRUNED: it is never handed what came after them as if nothing
/// went missing.
async fn a_stream_behind_pruning_is_ended_not_skipped(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.watch_buffer = Some(4);
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    let mut memory = server.memory();
    // More changes than one page of the feed (500), 16 KiB each: the
    // stream's buffers and HTTP/2 windows hold a few MB, so the producer is
    // still handing out its first page when the pruning comes.
    const WRITES: i64 = 520;
    write_big(&mut memory, "behind", WRITES).await;
    let mut reader = MemoryServiceClient::new(connect(server.grpc_addr()).await);
    let mut stream = reader
        .watch(watch("behind", "", Some(0)))
        .await
        .expect("watch")
        .into_inner();
    let mut seen = vec![index_of(
        &next(&mut stream).await.expect("the first change"),
    )];
    assert_eq!(prune_everything(&server, backend).await, WRITES as u64);
    // Written after the pruning: a stream that skipped the pruned changes
    // would hand this one on.
    memory
        .set(set("behind", "after", json!({"i": WRITES})))
        .await
        .expect("set");
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.message()).await {
            Err(_) => panic!("the stream neither went on nor ended after {seen:?}"),
            Ok(Ok(Some(change))) => {
                let i = index_of(&change);
                let expected = seen.len() as i64;
                assert_eq!(
                    i,
                    expected,
                    "the stream skipped from {} to {i}",
                    expected - 1
                );
                seen.push(i);
            }
            Ok(Ok(None)) => panic!("the stream ended without a status"),
            Ok(Err(status)) => break status,
        }
    };
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::OutOfRange, "REVISION_PRUNED"),
        "{status:?}"
    );
}

/// The `i` a change of [`a_stream_behind_pruning_is_ended_not_skipped`] wrote.
fn index_of(change: &WatchResponse) -> i64 {
    let value = change.value.clone().expect("a value");
    let value = engram::api::convert::json_from_proto(value).expect("json");
    value["i"].as_i64().expect("an index")
}

async fn pruned_revisions_are_out_of_range(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    for i in 0..3 {
        memory.set(set("old", "k", json!(i))).await.expect("set");
    }
    let pruned = prune_everything(&server, backend).await;
    assert_eq!(pruned, 3);
    let latest = memory
        .set(set("old", "k", json!("new")))
        .await
        .expect("set");
    assert_eq!(latest.into_inner().entry.expect("entry").version, 4);
    let err = memory
        .watch(watch("old", "", Some(1)))
        .await
        .expect_err("pruned");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::OutOfRange, "REVISION_PRUNED")
    );
    // From the last pruned revision is still fine: nothing after it is gone.
    let mut stream = memory
        .watch(watch("old", "", Some(3)))
        .await
        .expect("watch")
        .into_inner();
    assert_eq!(next(&mut stream).await.expect("change").version, 4);
    let err = memory
        .watch(watch("old", "", Some(-1)))
        .await
        .expect_err("negative");
    assert_eq!(err.code(), Code::InvalidArgument);
}

/// An import's changes carry the file's times. Imported from a month ago
/// behind a change made now, they are pruned with the changes before them
/// when those expire, not before: the server's prune once took them at
/// once with everything before them, and a watcher from then on heard
/// REVISION_PRUNED though what it had missed was still there.
async fn an_old_import_does_not_prune_the_feed_before_it(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    memory
        .set(set("imported", "before", json!("now")))
        .await
        .expect("set");
    let month_ago = (chrono::Utc::now() - chrono::Duration::days(30))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let lines = [
        crate::transfer::header(2),
        json!({"kind": "memory_version", "scope_type": "namespace", "scope": "imported",
               "key": "old", "version": 1, "value": "a month old", "deleted": false,
               "create_time": month_ago})
        .to_string(),
    ];
    crate::transfer::import(&server.channel, &lines)
        .await
        .expect("import");
    // What the server's prune does with the default retention of 7 days.
    let week_ago = chrono::Utc::now() - chrono::Duration::days(7);
    let pruned = match backend {
        Backend::Sqlite => server.db.sqlite_store().await.prune_changes(week_ago).await,
        Backend::Postgres => server.db.pg_store().await.prune_changes(week_ago).await,
    }
    .expect("prune");
    assert_eq!(pruned, 0, "the import's change is behind one that is kept");
    let mut stream = memory
        .watch(watch("imported", "", Some(0)))
        .await
        .expect("the feed from its start is all there")
        .into_inner();
    let before = next(&mut stream).await.expect("a change");
    let old = next(&mut stream).await.expect("a change");
    assert_eq!((before.key.as_str(), old.key.as_str()), ("before", "old"));
    assert!(before.revision < old.revision);
    let old_time = old.create_time.expect("a time");
    assert_eq!(
        chrono::DateTime::from_timestamp(old_time.seconds, 0)
            .expect("a time")
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        month_ago,
        "an imported change keeps the time its version was written"
    );
}

/// A change carries the value of the version it wrote and of no other: a
/// key purged whole and written again numbers its versions from 1 anew, and
/// a watcher replaying the feed sees the first version 1 without a value
/// (it is gone), not with the value of the new version 1.
async fn a_replayed_set_carries_its_own_value_or_none(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    memory
        .set(set("again", "k", json!("old")))
        .await
        .expect("set");
    memory
        .set(set("again", "k", json!("older")))
        .await
        .expect("set");
    admin
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "again".to_owned(),
            key: "k".to_owned(),
            keep: None,
            dry_run: false,
        })
        .await
        .expect("purge");
    let rewritten = memory
        .set(set("again", "k", json!("new")))
        .await
        .expect("set")
        .into_inner();
    assert_eq!(rewritten.entry.expect("entry").version, 1, "numbered anew");

    let mut stream = memory
        .watch(watch("again", "k", Some(0)))
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let change = next(&mut stream).await.expect("change");
        let value = change
            .value
            .map(|v| engram::api::convert::json_from_proto(v).expect("json"));
        seen.push((change.kind, change.version, value));
    }
    let (written, purged) = (ChangeKind::Set as i32, ChangeKind::Purge as i32);
    assert_eq!(
        seen,
        vec![
            (written, 1, None),
            (written, 2, None),
            (purged, 2, None),
            (written, 1, Some(json!("new"))),
        ]
    );
}

/// A stream buffers a couple of megabytes of changes, not `watch_buffer`
/// of them whatever their size: with the default buffer of 256, a reader
/// that leaves 100 changes of 64 KiB unread is cut off (and resumes where
/// it was), rather than the server holding them all for it.
async fn a_stream_buffers_megabytes_not_items(backend: Backend) {
    const WRITES: i64 = 100;
    let server = TestServer::spawn_with(backend, |s| {
        s.watch_stall_timeout_ms = Some(100);
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    let mut memory = server.memory();
    let mut stalled_client = MemoryServiceClient::new(connect(server.grpc_addr()).await);
    let mut stalled = stalled_client
        .watch(watch("large", "", None))
        .await
        .expect("watch")
        .into_inner();
    let big = "x".repeat(64 * 1024);
    for i in 0..WRITES {
        memory
            .set(set(
                "large",
                &format!("k{}", i % 7),
                json!({"i": i, "pad": big}),
            ))
            .await
            .expect("set");
    }
    let (received, resume) = cut_off(&mut stalled, WRITES).await;
    assert_eq!(Some(&resume), received.last());
}

/// Reads a stalled watch of `writes` changes to its verdict: the
/// revisions received, and where it says to resume. Asserts it was cut
/// off as too slow, before the end.
async fn cut_off(stalled: &mut tonic::Streaming<WatchResponse>, writes: i64) -> (Vec<i64>, i64) {
    let mut received = Vec::new();
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(30), stalled.message()).await {
            Err(_) => panic!(
                "no verdict after {} changes: the server buffered them all, never cutting off",
                received.len()
            ),
            Ok(Ok(Some(change))) => received.push(change.revision),
            Ok(Ok(None)) => panic!("the stream ended without a status"),
            Ok(Err(status)) => break status,
        }
    };
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::ResourceExhausted, "CONSUMER_TOO_SLOW")
    );
    assert!((received.len() as i64) < writes, "cut off before the end");
    let resume: i64 = error_metadata(&status, "resume_revision")
        .expect("resume_revision")
        .parse()
        .expect("number");
    (received, resume)
}

on_both_stores!(
    every_change_once_in_order,
    a_stream_buffers_megabytes_not_items,
    a_stream_behind_pruning_is_ended_not_skipped,
    slow_consumers_and_shutdown_say_where_to_resume,
    pruned_revisions_are_out_of_range,
    an_old_import_does_not_prune_the_feed_before_it,
    a_replayed_set_carries_its_own_value_or_none,
);

/// Two server processes on one Postgres: a write through one reaches a
/// watcher on the other (LISTEN/NOTIFY wakes it, the table is the truth).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_cross_replicas() {
    let one = TestServer::spawn(Backend::Postgres).await;
    let two = crate::helpers::ChildServer::spawn(
        &["--migrate", "off"],
        &[("ENGRAM_DATABASE_URL", &one.db.url)],
        None,
    )
    .await;
    let mut on_two = MemoryServiceClient::new(connect(two.grpc_addr).await);
    let mut stream = on_two
        .watch(watch("shared", "", None))
        .await
        .expect("watch")
        .into_inner();
    for i in 1..=20 {
        one.memory()
            .set(set("shared", "k", json!(i)))
            .await
            .expect("set on one");
        let change = next(&mut stream).await.expect("seen on two");
        assert_eq!((change.key.as_str(), change.version), ("k", i));
    }
    // And the other way round: a write through the second process.
    let mut on_one = one
        .memory()
        .watch(watch("shared", "", None))
        .await
        .expect("watch")
        .into_inner();
    on_two
        .set(set("shared", "k", json!("from two")))
        .await
        .expect("set on two");
    let change = next(&mut on_one).await.expect("seen on one");
    assert_eq!(change.version, 21);
    drop(stream);
    assert!(two.terminate().await.success());
}

/// The value of `engram_feed_wait_seconds` for `feed` in a scrape of the
/// server at `addr`.
async fn feed_wait(addr: std::net::SocketAddr, feed: &str) -> f64 {
    let name = format!("engram_feed_wait_seconds{{feed=\"{feed}\"}}");
    crate::helpers::metric(addr, &name)
        .await
        .unwrap_or_else(|| panic!("no {name}"))
}

/// Scrapes until `feed`'s wait satisfies `done`, for at most 30 seconds.
async fn feed_wait_until(
    addr: std::net::SocketAddr,
    feed: &str,
    done: impl Fn(f64) -> bool,
) -> f64 {
    let name = format!("engram_feed_wait_seconds{{feed=\"{feed}\"}}");
    crate::helpers::metric_until(addr, &name, done).await
}

/// On Postgres, a transaction left open in Engram's database holds every
/// Watch back until it ends (see the README's watch guarantees). The
/// operator sees it: `engram_feed_wait_seconds` grows while the feed
/// waits, and once it has waited `--feed-wait-warn-ms` the log names the
/// backend that holds it (its process id and application), so that it
/// can be found and ended. Once the transaction ends the change is
/// delivered and the gauge is back at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_transaction_holding_the_feed_back_is_named() {
    use sqlx::{Connection, Executor};

    let db = crate::helpers::TestDb::new(Backend::Postgres).await;
    let server = crate::helpers::ChildServer::spawn(
        &[],
        &[
            ("ENGRAM_DATABASE_URL", &db.url),
            ("ENGRAM_FEED_WAIT_WARN_MS", "200"),
        ],
        None,
    )
    .await;
    let http = server.http_addr();
    assert_eq!(feed_wait(http, "changes").await, 0.0, "nothing waits yet");

    let mut open = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    open.execute("SET application_name = 'nightly-report'")
        .await
        .expect("name the session");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut open)
        .await
        .expect("pid");
    open.execute("BEGIN").await.expect("begin");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut open)
        .await
        .expect("take an id");

    let mut client = MemoryServiceClient::new(connect(server.grpc_addr).await);
    client
        .set(set("held", "k", json!("written")))
        .await
        .expect("a write is not held back");
    let mut watcher = client.clone();
    let watched = tokio::spawn(async move {
        let mut stream = watcher
            .watch(watch("held", "", Some(0)))
            .await?
            .into_inner();
        next(&mut stream).await
    });

    let waited = feed_wait_until(http, "changes", |s| s > 0.0).await;
    assert!(!watched.is_finished(), "delivered past an open transaction");
    let warned = server
        .logged(|event| {
            event["feed"] == "changes"
                && event["blockers"]
                    .as_str()
                    .is_some_and(|b| b.contains(&format!("backend {pid} ")))
        })
        .await;
    assert_eq!(warned["level"], "WARN", "{warned}");
    let blockers = warned["blockers"].as_str().unwrap_or_default();
    assert!(
        blockers.contains("application 'nightly-report'"),
        "{blockers}"
    );
    assert!(blockers.contains("idle in transaction"), "{blockers}");
    assert!(
        warned["waited_s"].as_f64().is_some_and(|s| s >= 0.2),
        "{warned}"
    );
    assert!(
        feed_wait(http, "changes").await >= waited,
        "the wait keeps growing while the transaction is open"
    );

    open.execute("COMMIT").await.expect("commit");
    let change = tokio::time::timeout(Duration::from_secs(30), watched)
        .await
        .expect("delivered once the transaction ended")
        .expect("task")
        .expect("change");
    assert_eq!((change.key.as_str(), change.version), ("k", 1));
    feed_wait_until(http, "changes", |s| s == 0.0).await;

    // A prepared transaction holds the episodes' feed back the same way,
    // and is named by its global id. (`scripts/test` starts its Postgres
    // with prepared transactions allowed; a server without them cannot
    // hold one.)
    let allowed: String = sqlx::query_scalar("SHOW max_prepared_transactions")
        .fetch_one(&mut open)
        .await
        .expect("show");
    if allowed == "0" {
        eprintln!("the prepared transaction's case skipped: max_prepared_transactions is 0");
        assert!(server.terminate().await.success());
        return;
    }
    open.execute("BEGIN").await.expect("begin");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut open)
        .await
        .expect("take an id");
    open.execute("PREPARE TRANSACTION 'nightly-1'")
        .await
        .expect("prepare");
    let mut episodes = engram::proto::episode_service_client::EpisodeServiceClient::new(
        connect(server.grpc_addr).await,
    );
    episodes
        .append_episode(engram::proto::AppendEpisodeRequest {
            session_id: "s".into(),
            app: "a".into(),
            user: "u".into(),
            episode: Some(engram::proto::NewEpisode {
                r#type: "observation".into(),
                content: Some(json_to_proto(&json!("seen"))),
                ..Default::default()
            }),
            require_session: false,
        })
        .await
        .expect("an append is not held back");
    let mut tailer = episodes.clone();
    let tailed = tokio::spawn(async move {
        let mut stream = tailer
            .tail_episodes(engram::proto::TailEpisodesRequest {
                cursor: Some(0),
                ..Default::default()
            })
            .await?
            .into_inner();
        tokio::time::timeout(Duration::from_secs(60), stream.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no episode"))?
            .map(|item| item.and_then(|i| i.episode))
    });
    feed_wait_until(http, "episodes", |s| s > 0.0).await;
    assert!(
        !tailed.is_finished(),
        "delivered past a prepared transaction"
    );
    let warned = server
        .logged(|event| {
            event["feed"] == "episodes"
                && event["blockers"].as_str().is_some_and(|b| {
                    b.contains("prepared transaction 'nightly-1' (owner 'postgres'")
                })
        })
        .await;
    assert_eq!(warned["level"], "WARN", "{warned}");
    open.execute("ROLLBACK PREPARED 'nightly-1'")
        .await
        .expect("roll back");
    let episode = tailed
        .await
        .expect("task")
        .expect("tail")
        .expect("an episode");
    assert_eq!(episode.session_id, "s");
    feed_wait_until(http, "episodes", |s| s == 0.0).await;
    assert!(server.terminate().await.success());
}
