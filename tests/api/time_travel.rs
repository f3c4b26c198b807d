//! Memory as it was, on both stores: `Get`, `List` and `ListScopes` at a
//! revision or a time (`as_of`), purged versions reported as purged, and
//! `ForkScope`, including a fork taken while writers race, checked
//! against a replay of the change feed.

use std::collections::BTreeMap;

use engram::api::convert::{json_from_proto, json_to_proto};
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{
    AsOf, ChangeKind, DeleteRequest, ForkScopeRequest, GetCompactionLogRequest, GetRequest,
    HistoryRequest, ListRequest, ListScopesRequest, MemoryEntry, PurgeRequest, PurgeScopeRequest,
    ScopeType, SetRequest, WatchRequest, WatchResponse, as_of,
};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{
    Backend, LOCK_WAITS, TestServer, bad_fields, holding, reason, release, until_reads,
};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

fn at_revision(revision: i64) -> Option<AsOf> {
    Some(AsOf {
        point: Some(as_of::Point::Revision(revision)),
    })
}

fn at_time(time: prost_types::Timestamp) -> Option<AsOf> {
    Some(AsOf {
        point: Some(as_of::Point::Time(time)),
    })
}

async fn set(client: &mut MemoryServiceClient<Channel>, scope: &str, key: &str, value: Value) {
    client
        .set(SetRequest {
            scope_type: NS,
            scope: scope.into(),
            key: key.into(),
            value: Some(json_to_proto(&value)),
            ..SetRequest::default()
        })
        .await
        .expect("set");
}

async fn delete(client: &mut MemoryServiceClient<Channel>, scope: &str, key: &str) {
    client
        .delete(DeleteRequest {
            scope_type: NS,
            scope: scope.into(),
            key: key.into(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
}

fn get_at(scope: &str, key: &str, as_of: Option<AsOf>) -> GetRequest {
    GetRequest {
        scope_type: NS,
        scope: scope.into(),
        key: key.into(),
        version: 0,
        as_of,
    }
}

fn list_at(scope: &str, as_of: Option<AsOf>) -> ListRequest {
    ListRequest {
        scope_type: NS,
        scope: scope.into(),
        page_size: 100,
        as_of,
        ..ListRequest::default()
    }
}

fn value_of(entry: &MemoryEntry) -> Value {
    json_from_proto(entry.value.clone().expect("a value")).expect("json")
}

/// `(key, version, value)` of each entry, and the purged keys.
async fn listed(
    client: &mut MemoryServiceClient<Channel>,
    request: ListRequest,
) -> (Vec<(String, i64, Value)>, Vec<String>) {
    let page = client.list(request).await.expect("list").into_inner();
    let entries = page
        .entries
        .iter()
        .map(|e| (e.key.clone(), e.version, value_of(e)))
        .collect();
    (entries, page.purged_keys)
}

/// The first `n` changes of a scope, from the beginning of the feed.
async fn changes(channel: Channel, scope: &str, n: usize) -> Vec<WatchResponse> {
    let mut stream = MemoryServiceClient::new(channel)
        .watch(WatchRequest {
            scope_type: NS,
            scope: scope.into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Vec::with_capacity(n);
    while seen.len() < n {
        seen.push(stream.next().await.expect("a change").expect("ok"));
    }
    seen
}

fn tuple(key: &str, version: i64, value: Value) -> (String, i64, Value) {
    (key.to_owned(), version, value)
}

async fn reads_at_a_point(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    set(&mut client, "tt", "a", json!("a1")).await;
    set(&mut client, "tt", "b", json!("b1")).await;
    set(&mut client, "tt", "a", json!("a2")).await;
    delete(&mut client, "tt", "b").await;
    set(&mut client, "tt", "c", json!("c1")).await;
    let feed = changes(server.channel.clone(), "tt", 5).await;
    let r: Vec<i64> = feed.iter().map(|c| c.revision).collect();

    // Get at each revision answers what was current then.
    let got = client
        .get(get_at("tt", "a", at_revision(r[0])))
        .await
        .expect("a at r0")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!((got.version, value_of(&got)), (1, json!("a1")));
    let got = client
        .get(get_at("tt", "a", at_revision(r[2])))
        .await
        .expect("a at r2")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!((got.version, value_of(&got)), (2, json!("a2")));
    for (key, at, why) in [
        ("b", r[3], "KEY_DELETED"),
        ("c", r[3], "KEY_NOT_FOUND"),
        ("a", 0, "KEY_NOT_FOUND"),
    ] {
        let err = client
            .get(get_at("tt", key, at_revision(at)))
            .await
            .expect_err("nothing live then");
        assert_eq!((err.code(), reason(&err)), (Code::NotFound, why.into()));
        if why == "KEY_NOT_FOUND" {
            assert_eq!(
                err.message(),
                format!("key \"{key}\" did not exist at revision {at}")
            );
        }
    }

    // List at each revision.
    let (entries, purged) = listed(&mut client, list_at("tt", at_revision(r[1]))).await;
    assert_eq!(
        entries,
        [tuple("a", 1, json!("a1")), tuple("b", 1, json!("b1"))]
    );
    assert!(purged.is_empty());
    let (entries, _) = listed(&mut client, list_at("tt", at_revision(r[3]))).await;
    assert_eq!(entries, [tuple("a", 2, json!("a2"))]);
    let (entries, _) = listed(&mut client, list_at("tt", at_revision(r[4]))).await;
    assert_eq!(
        entries,
        [tuple("a", 2, json!("a2")), tuple("c", 1, json!("c1"))]
    );

    // A time names what had been written by then.
    let time = feed[1].create_time.expect("a change time");
    let (entries, _) = listed(&mut client, list_at("tt", at_time(time))).await;
    assert_eq!(
        entries,
        [tuple("a", 1, json!("a1")), tuple("b", 1, json!("b1"))]
    );

    // Paging at a point walks the same state, and its token is bound to it.
    let mut request = list_at("tt", at_revision(r[1]));
    request.page_size = 1;
    let first = client
        .list(request.clone())
        .await
        .expect("page")
        .into_inner();
    assert_eq!(first.entries[0].key, "a");
    request.page_token = first.next_page_token.clone();
    let second = client
        .list(request.clone())
        .await
        .expect("page")
        .into_inner();
    assert_eq!(second.entries[0].key, "b");
    request.as_of = at_revision(r[2]);
    let err = client.list(request).await.expect_err("another point");
    assert_eq!(reason(&err), "INVALID_PAGE_TOKEN");

    // ListScopes at a point: only what existed then.
    set(&mut client, "later", "x", json!(1)).await;
    let scopes = client
        .list_scopes(ListScopesRequest {
            as_of: at_revision(r[0]),
            ..ListScopesRequest::default()
        })
        .await
        .expect("scopes")
        .into_inner()
        .scopes;
    let named: Vec<(&str, i64, i64)> = scopes
        .iter()
        .map(|s| (s.scope.as_str(), s.entry_count, s.purged_count))
        .collect();
    assert_eq!(named, [("tt", 1, 0)]);

    // Purged since: reported, not skipped.
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    admin
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "tt".into(),
            key: "a".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge a down to v2");
    admin
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "tt".into(),
            key: "c".into(),
            keep: None,
            dry_run: false,
        })
        .await
        .expect("purge c entirely");
    let err = client
        .get(get_at("tt", "a", at_revision(r[0])))
        .await
        .expect_err("purged");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::NotFound, "VERSION_PURGED".into())
    );
    let still = client
        .get(get_at("tt", "a", at_revision(r[2])))
        .await
        .expect("v2 is kept")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(still.version, 2);
    let (entries, purged) = listed(&mut client, list_at("tt", at_revision(r[1]))).await;
    assert_eq!(entries, [tuple("b", 1, json!("b1"))]);
    assert_eq!(purged, ["a"]);
    let (entries, purged) = listed(&mut client, list_at("tt", at_revision(r[4]))).await;
    assert_eq!(entries, [tuple("a", 2, json!("a2"))]);
    assert_eq!(purged, ["c"]);
    let scopes = client
        .list_scopes(ListScopesRequest {
            as_of: at_revision(r[4]),
            ..ListScopesRequest::default()
        })
        .await
        .expect("scopes")
        .into_inner()
        .scopes;
    assert_eq!((scopes[0].entry_count, scopes[0].purged_count), (1, 1));

    // What is refused, and why.
    let settled = feed.last().map_or(0, |c| c.revision) + 1_000_000;
    let err = client
        .get(get_at("tt", "a", at_revision(settled)))
        .await
        .expect_err("not reached");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::OutOfRange, "REVISION_NOT_REACHED".into())
    );
    let mut both = get_at("tt", "a", at_revision(r[0]));
    both.version = 1;
    let err = client.get(both).await.expect_err("version and as_of");
    assert_eq!(bad_fields(&err), ["as_of"]);
    for (as_of, field) in [
        (Some(AsOf { point: None }), "as_of"),
        (at_revision(-1), "as_of.revision"),
        (
            at_time(prost_types::Timestamp {
                seconds: 253_402_300_800,
                nanos: 0,
            }),
            "as_of.time",
        ),
    ] {
        let err = client
            .list(list_at("tt", as_of))
            .await
            .expect_err("bad as_of");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(bad_fields(&err), [field]);
    }
}

pub(crate) fn fork(source: &str, target: &str, as_of: Option<AsOf>) -> ForkScopeRequest {
    ForkScopeRequest {
        source_scope_type: NS,
        source_scope: source.into(),
        target_scope_type: NS,
        target_scope: target.into(),
        as_of,
    }
}

async fn forks(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    set(&mut client, "src", "plan", json!({"step": 1})).await;
    set(&mut client, "src", "notes", json!("n1")).await;
    set(&mut client, "src", "gone", json!("g")).await;
    delete(&mut client, "src", "gone").await;
    set(&mut client, "src", "plan", json!({"step": 2})).await;
    let feed = changes(server.channel.clone(), "src", 5).await;

    // Now: the live keys, each as version 1 with its value.
    let done = client
        .fork_scope(fork("src", "copy", None))
        .await
        .expect("fork now")
        .into_inner();
    assert_eq!(done.keys_copied, 2);
    assert_eq!(done.revision, feed[4].revision);
    let (entries, _) = listed(&mut client, list_at("copy", None)).await;
    assert_eq!(
        entries,
        [
            tuple("notes", 1, json!("n1")),
            tuple("plan", 1, json!({"step": 2}))
        ]
    );

    // At a revision: the state then.
    let done = client
        .fork_scope(fork("src", "replay", at_revision(feed[2].revision)))
        .await
        .expect("fork at r2")
        .into_inner();
    assert_eq!(done.keys_copied, 3);
    let (entries, _) = listed(&mut client, list_at("replay", None)).await;
    assert_eq!(
        entries,
        [
            tuple("gone", 1, json!("g")),
            tuple("notes", 1, json!("n1")),
            tuple("plan", 1, json!({"step": 1}))
        ]
    );

    // Recorded in the target's audit trail, and in its change feed.
    let log = MemoryAdminServiceClient::new(server.channel.clone())
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: NS,
            scope: "replay".into(),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .expect("log")
        .into_inner()
        .records;
    assert_eq!(log.len(), 1);
    let record = &log[0];
    assert_eq!(
        (
            record.operation.as_str(),
            record.source_scope.as_str(),
            record.source_scope_type,
            record.as_of_revision,
            record.keys_affected,
            record.audit_key.as_str(),
        ),
        (
            "fork",
            "src",
            NS,
            feed[2].revision,
            3,
            done.audit_key.as_str()
        )
    );
    let copied = changes(server.channel.clone(), "replay", 3).await;
    assert!(copied.iter().all(|c| c.kind == ChangeKind::Set as i32));

    // Refusals write nothing.
    let err = client
        .fork_scope(fork("src", "copy", None))
        .await
        .expect_err("target has keys");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::FailedPrecondition, "SCOPE_NOT_EMPTY".into())
    );
    let err = client
        .fork_scope(fork("src", "src", None))
        .await
        .expect_err("onto itself");
    assert_eq!(bad_fields(&err), ["target_scope"]);
    let err = client
        .fork_scope(ForkScopeRequest {
            target_scope_type: 0,
            ..fork("src", "x", None)
        })
        .await
        .expect_err("no target type");
    assert_eq!(bad_fields(&err), ["target_scope_type"]);
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "src".into(),
            key: "plan".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge plan v1");
    let err = client
        .fork_scope(fork("src", "late", at_revision(feed[2].revision)))
        .await
        .expect_err("plan v1 purged");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::FailedPrecondition, "VERSION_PURGED".into())
    );
    assert!(err.message().contains("\"plan\""), "{}", err.message());
    let (entries, _) = listed(&mut client, list_at("late", None)).await;
    assert!(entries.is_empty());
}

/// Applies the feed's changes up to `revision` to a key -> value map.
fn replay(feed: &[WatchResponse], revision: i64) -> BTreeMap<String, Value> {
    let mut state = BTreeMap::new();
    for change in feed.iter().filter(|c| c.revision <= revision) {
        match ChangeKind::try_from(change.kind) {
            Ok(ChangeKind::Set | ChangeKind::Compact) => {
                let value = json_from_proto(change.value.clone().expect("value")).expect("json");
                state.insert(change.key.clone(), value);
            }
            Ok(ChangeKind::Delete) => {
                state.remove(&change.key);
            }
            other => panic!("unexpected change {other:?}"),
        }
    }
    state
}

/// A fork taken at a revision in the middle of racing writers holds exactly
/// what replaying the change feed up to that revision gives.
async fn fork_under_concurrent_writes(backend: Backend) {
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    let server = TestServer::spawn(backend).await;
    let total = WRITERS * WRITES;
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = server.memory();
        writers.push(tokio::spawn(async move {
            let mut written = 0;
            for n in 0..WRITES {
                let key = format!("k{}", (writer * 7 + n) % 10);
                if n % 5 == 4 {
                    // The key may be deleted already: NOT_FOUND, no change.
                    let deleted = client
                        .delete(DeleteRequest {
                            scope_type: NS,
                            scope: "race".into(),
                            key,
                            ..DeleteRequest::default()
                        })
                        .await;
                    match deleted {
                        Ok(_) => written += 1,
                        Err(err) => assert_eq!(err.code(), Code::NotFound),
                    }
                } else {
                    set(&mut client, "race", &key, json!({"w": writer, "n": n})).await;
                    written += 1;
                }
            }
            written
        }));
    }
    // Fork while the writers run, at a revision a watcher has seen.
    let mut midway = MemoryServiceClient::new(server.channel.clone())
        .watch(WatchRequest {
            scope_type: NS,
            scope: "race".into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let mut revision = 0;
    for _ in 0..total / 3 {
        revision = midway.next().await.expect("change").expect("ok").revision;
    }
    drop(midway);
    let mut client = server.memory();
    let done = client
        .fork_scope(fork("race", "race-fork", at_revision(revision)))
        .await
        .expect("fork mid-race")
        .into_inner();
    let mut written = 0;
    for writer in writers {
        written += writer.await.expect("writer");
    }
    let feed = changes(server.channel.clone(), "race", written).await;
    let expected = replay(&feed, revision);
    let mut request = list_at("race-fork", None);
    request.page_size = 1000;
    let (entries, _) = listed(&mut client, request).await;
    let forked: BTreeMap<String, Value> = entries.into_iter().map(|(k, _, v)| (k, v)).collect();
    assert_eq!(forked, expected, "fork at revision {revision}");
    assert_eq!(done.keys_copied, expected.len() as i64);
    // And a List of the source at that revision agrees.
    let (entries, _) = listed(&mut client, list_at("race", at_revision(revision))).await;
    let listed_then: BTreeMap<String, Value> =
        entries.into_iter().map(|(k, _, v)| (k, v)).collect();
    assert_eq!(listed_then, expected);
}

/// Writes into a fork's target while the fork copies: the fork either
/// copies into an empty scope, finds it written (SCOPE_NOT_EMPTY), or is
/// refused as raced (SOURCE_CHANGED) with nothing written; every write
/// lands, and each key of the target has dense versions from 1.
async fn writes_into_a_forks_target_while_it_copies(backend: Backend) {
    const ROUNDS: usize = 40;
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let mut client = server.memory();
    for k in 0..20 {
        set(&mut client, "src", &format!("k{k}"), json!(k)).await;
    }
    for round in 0..ROUNDS {
        let target = format!("t{round}");
        let mut setters = Vec::new();
        for setter in 0..2usize {
            let (mut client, target) = (server.memory(), target.clone());
            setters.push(tokio::spawn(async move {
                // Start a little later each round, so that some writes land
                // while the fork runs.
                for _ in 0..(round % 8) * 4 {
                    tokio::task::yield_now().await;
                }
                for j in 0..5 {
                    let key = format!("k{}", (setter * 7 + j) % 20);
                    set(&mut client, &target, &key, json!("mine")).await;
                }
            }));
        }
        let forked = client.fork_scope(fork("src", &target, None)).await;
        for setter in setters {
            setter.await.expect("setter");
        }
        if let Err(err) = forked {
            assert!(
                matches!(
                    (err.code(), reason(&err).as_str()),
                    (Code::FailedPrecondition, "SCOPE_NOT_EMPTY")
                        | (Code::Aborted, "SOURCE_CHANGED")
                ),
                "{err:?}"
            );
        }
        let mut request = list_at(&target, None);
        request.page_size = 1000;
        let (entries, _) = listed(&mut client, request).await;
        for (key, version, _) in entries {
            let history: Vec<i64> = client
                .history(HistoryRequest {
                    scope_type: NS,
                    scope: target.clone(),
                    key: key.clone(),
                    ..HistoryRequest::default()
                })
                .await
                .expect("history")
                .into_inner()
                .map(|page| page.expect("page").entry.expect("entry").version)
                .collect()
                .await;
            assert_eq!(history, (1..=version).collect::<Vec<_>>(), "{target}/{key}");
        }
    }
}

/// Purges of a fork's source while it copies. A fork at a past point
/// reads the source in several statements, on Postgres each at its own
/// snapshot. It either copies every key as it was at the point or is
/// refused with nothing written: the values at the point purged
/// (`VERSION_PURGED`), or raced (`SOURCE_CHANGED`). It used to look for
/// purged values before copying, and a purge committed in between made it
/// succeed with the keys the purge had left: some, or none.
async fn purges_of_a_forks_source_while_it_copies(backend: Backend) {
    const ROUNDS: usize = 100;
    const KEYS: usize = 4;
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    for round in 0..ROUNDS {
        let source = format!("p{round}");
        for key in &keys {
            set(&mut client, &source, key, json!("then")).await;
        }
        let point = client
            .get(get_at(&source, &keys[KEYS - 1], None))
            .await
            .expect("get")
            .into_inner()
            .entry
            .and_then(|entry| entry.create_time)
            .expect("the time of the values");
        for key in &keys {
            set(&mut client, &source, key, json!("now")).await;
        }
        let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
        let purged = source.clone();
        let purging = tokio::spawn(async move {
            // Later each round, so that some purges commit while a fork
            // reads.
            for _ in 0..(round % 8) * 4 {
                tokio::task::yield_now().await;
            }
            admin
                .purge_scope(PurgeScopeRequest {
                    scope_type: NS,
                    scope: purged,
                    keep: Some(1),
                    include_deleted: false,
                    dry_run: false,
                })
                .await
                .expect("purge");
        });
        let forks: Vec<_> = (0..2)
            .map(|f| {
                let target = format!("t{round}-{f}");
                let request = fork(&source, &target, at_time(point));
                let mut client = server.memory();
                (
                    target,
                    tokio::spawn(async move { client.fork_scope(request).await }),
                )
            })
            .collect();
        purging.await.expect("purger");
        for (target, forking) in forks {
            let forked = forking.await.expect("fork task");
            let (copied, _) = listed(&mut client, list_at(&target, None)).await;
            match forked {
                Ok(done) => {
                    let then: Vec<_> = keys.iter().map(|k| tuple(k, 1, json!("then"))).collect();
                    assert_eq!(copied, then, "{target}: the source at the point, whole");
                    assert_eq!(done.into_inner().keys_copied, KEYS as i64);
                }
                Err(err) => {
                    assert!(
                        matches!(
                            (err.code(), reason(&err).as_str()),
                            (Code::FailedPrecondition, "VERSION_PURGED")
                                | (Code::Aborted, "SOURCE_CHANGED")
                        ),
                        "{err:?}"
                    );
                    assert_eq!(copied, [], "{target}: nothing copied");
                }
            }
        }
    }
}

/// Pages at a point over runs of keys that were not live then (deleted
/// before it, or made after it), longer than a page: each statement looks
/// at a page's worth of keys, and the pages skip the runs, full but the
/// last, in key order.
async fn pages_at_a_point_pass_runs_of_keys_not_live_then(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for k in 0..30 {
        set(&mut client, "runs", &format!("k{k:02}"), json!(k)).await;
    }
    for k in 5..25 {
        delete(&mut client, "runs", &format!("k{k:02}")).await;
    }
    let point = changes(server.channel.clone(), "runs", 50).await[49].revision;
    // After the point: a deleted key made again, and a run of new keys.
    set(&mut client, "runs", "k10", json!("again")).await;
    for k in 0..12 {
        set(&mut client, "runs", &format!("k25-{k:02}"), json!(k)).await;
    }
    let mut request = list_at("runs", at_revision(point));
    request.page_size = 3;
    let mut pages = Vec::new();
    loop {
        let page = client
            .list(request.clone())
            .await
            .expect("list")
            .into_inner();
        pages.push(
            page.entries
                .iter()
                .map(|e| e.key.clone())
                .collect::<Vec<_>>(),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    assert_eq!(
        pages,
        [
            vec!["k00", "k01", "k02"],
            vec!["k03", "k04", "k25"],
            vec!["k26", "k27", "k28"],
            vec!["k29"],
        ]
    );
}

/// `ListScopes` at a point pages over runs of scopes that held nothing
/// then (made after it), longer than a page, and lists a scope whose only
/// key was a tombstone then (0 entries) and one whose value then was
/// purged since.
async fn scope_pages_at_a_point_pass_runs_of_scopes_not_live_then(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for scope in ["a0", "a1", "a2", "a3", "c0", "c1", "c2"] {
        set(&mut client, scope, "k", json!(scope)).await;
    }
    delete(&mut client, "a2", "k").await;
    // The point: a mark written after everything above returned.
    set(&mut client, "m", "mark", json!(true)).await;
    let point = changes(server.channel.clone(), "m", 1).await[0].revision;
    for b in 0..10 {
        set(&mut client, &format!("b{b}"), "k", json!(b)).await;
    }
    set(&mut client, "c1", "k", json!("later")).await;
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "c1".into(),
            key: "k".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge c1's value at the point");
    let mut request = ListScopesRequest {
        as_of: at_revision(point),
        page_size: 3,
        ..ListScopesRequest::default()
    };
    let mut pages = Vec::new();
    loop {
        let page = client
            .list_scopes(request.clone())
            .await
            .expect("scopes")
            .into_inner();
        pages.push(
            page.scopes
                .iter()
                .map(|s| (s.scope.clone(), s.entry_count, s.purged_count))
                .collect::<Vec<_>>(),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    let row = |scope: &str, entries: i64, purged: i64| (scope.to_owned(), entries, purged);
    assert_eq!(
        pages,
        [
            vec![row("a0", 1, 0), row("a1", 1, 0), row("a2", 0, 0)],
            vec![row("a3", 1, 0), row("c0", 1, 0), row("c1", 0, 1)],
            vec![row("c2", 1, 0), row("m", 1, 0)],
        ]
    );
}

on_both_stores!(
    scope_pages_at_a_point_pass_runs_of_scopes_not_live_then,
    pages_at_a_point_pass_runs_of_keys_not_live_then,
    reads_at_a_point,
    forks,
    fork_under_concurrent_writes,
    writes_into_a_forks_target_while_it_copies,
    purges_of_a_forks_source_while_it_copies
);

/// A fork of a large scope creates its target's keys while another
/// transaction creates two of them, in key order, as a group of sets does.
/// On Postgres the fork's statement read a large source by a hash join, in
/// the order its versions were written, and created the target's keys in
/// that order: each waited for a key the other had created, and Postgres
/// failed one of them (the fork's refusal then `TRANSACTION_CONFLICT`).
/// The fork now creates them in key order too, and the two wait in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_creates_its_keys_in_the_order_sets_do() {
    const KEYS: usize = 2000;
    const WRITERS: usize = 16;
    let server = TestServer::spawn(Backend::Postgres).await;
    // The source's keys written from the last to the first, so that their
    // versions lie in the table in the opposite of key order.
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = server.memory();
        writers.push(tokio::spawn(async move {
            for k in (0..KEYS).rev().filter(|k| k % WRITERS == writer) {
                set(&mut client, "src", &format!("k{k:04}"), json!(k)).await;
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let mut db = server.db_connection("the test").await;
    sqlx::query("ANALYZE memory_heads, memory_versions")
        .execute(&mut db)
        .await
        .expect("analyze");

    // At the source's last revision: a fork at none waits first for the
    // transactions running to end, the writer below among them.
    let revision: i64 = sqlx::query_scalar("SELECT max(revision) FROM memory_changes")
        .fetch_one(&mut db)
        .await
        .expect("the last revision");
    // The fork waits to create the target's keys; a writer then waits to
    // create its k0500 (a table lock holds both, and takes no transaction
    // id, which the fork would wait for first).
    let table = holding(&server.db.url, "LOCK TABLE memory_heads IN EXCLUSIVE MODE").await;
    let mut client = server.memory();
    let forking = tokio::spawn(async move {
        client
            .fork_scope(fork("src", "t", at_revision(revision)))
            .await
    });
    until_reads(&mut db, LOCK_WAITS, 1, "the fork waits for the table").await;
    let url = server.db.url.clone();
    let writing = tokio::spawn(async move {
        holding(
            &url,
            "INSERT INTO memory_heads VALUES ('default', 1, 't', 'k0500', 1, false, now()) \
             ON CONFLICT DO NOTHING",
        )
        .await
    });
    until_reads(&mut db, LOCK_WAITS, 2, "the writer waits for the table").await;
    // The writer's one row goes in before the fork's statement has joined
    // the source: the fork then waits for the writer at k0500.
    release(table, "COMMIT").await;
    let mut writer = writing.await.expect("writer");
    until_reads(&mut db, LOCK_WAITS, 1, "the fork waits for the writer").await;
    // The writer's next key, after k0500: the fork, creating keys in key
    // order, has not reached it.
    sqlx::query(
        "INSERT INTO memory_heads VALUES ('default', 1, 't', 'k1500', 1, false, now()) \
         ON CONFLICT DO NOTHING",
    )
    .execute(&mut writer)
    .await
    .expect("the writer's second key, without a deadlock");
    release(writer, "ROLLBACK").await;
    let forked = forking.await.expect("fork task").expect("fork");
    assert_eq!(forked.into_inner().keys_copied, KEYS as i64);
    let mut request = list_at("t", None);
    request.page_size = 1000;
    let (entries, _) = listed(&mut server.memory(), request).await;
    assert_eq!(entries.len(), 1000, "a first page of the copy");
}
