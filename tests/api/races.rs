//! Concurrency claims, raced: dense versions under many writers, exactly
//! one winner among compare-and-set writers, one write for racing retries.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use engram::api::convert::json_to_proto;
use engram::proto::session_service_client::SessionServiceClient;
use engram::proto::{
    AppendEpisodeRequest, CleanupSessionsRequest, CreateSessionRequest, DeleteRequest,
    DeleteSessionRequest, GetStatsRequest, HistoryRequest, ListEpisodesRequest, ListRequest,
    ListSessionsRequest, NewEpisode, ScopeType, SearchRequest, SetRequest,
};
use serde_json::json;
use tonic::Code;

use crate::helpers::{
    Backend, ChildServer, LOCK_WAITS, TestServer, connect, holding, reason, release, until_reads,
};
use crate::on_both_stores;

const WRITERS: usize = 32;
const WRITES_EACH: usize = 10;

fn set(key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "race".to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

async fn dense_versions_under_32_writers(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let mut client = server.memory();
        tasks.push(tokio::spawn(async move {
            let mut versions = Vec::new();
            for i in 0..WRITES_EACH {
                let response = client
                    .set(set("hot", json!({"writer": writer, "i": i})))
                    .await
                    .expect("set");
                versions.push(response.into_inner().entry.expect("entry").version);
            }
            versions
        }));
    }
    let mut versions = Vec::new();
    for task in tasks {
        versions.extend(task.await.expect("writer task"));
    }
    let total = (WRITERS * WRITES_EACH) as i64;
    let unique: BTreeSet<i64> = versions.iter().copied().collect();
    assert_eq!(versions.len() as i64, total);
    assert_eq!(
        unique,
        (1..=total).collect::<BTreeSet<_>>(),
        "versions 1..N, each exactly once"
    );

    // The stored history agrees: N versions, numbered 1..N in order.
    let mut stream = server
        .memory()
        .history(HistoryRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "race".to_owned(),
            key: "hot".to_owned(),
            from_version: 0,
        })
        .await
        .expect("history")
        .into_inner();
    let mut stored = Vec::new();
    while let Some(item) = stream.message().await.expect("item") {
        stored.push(item.entry.expect("entry").version);
    }
    assert_eq!(stored, (1..=total).collect::<Vec<_>>());
}

async fn one_winner_among_16_cas_writers(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    server
        .memory()
        .set(set("cas", json!("start")))
        .await
        .expect("seed");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for writer in 0..16 {
        let mut client = server.memory();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client
                .set(SetRequest {
                    expected_version: Some(1),
                    ..set("cas", json!(writer))
                })
                .await
        }));
    }
    let mut wins = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(response) => {
                wins += 1;
                assert_eq!(response.into_inner().entry.expect("entry").version, 2);
            }
            Err(status) => {
                assert_eq!(
                    (status.code(), reason(&status).as_str()),
                    (Code::Aborted, "VERSION_MISMATCH")
                );
            }
        }
    }
    assert_eq!(wins, 1, "exactly one compare-and-set wins");
}

async fn racing_retries_write_once(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut client = server.memory();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let request = SetRequest {
                request_id: "same-request".to_owned(),
                ..set("retried", json!("payload"))
            };
            client
                .set(request)
                .await
                .expect("set")
                .into_inner()
                .entry
                .expect("entry")
                .version
        }));
    }
    for task in tasks {
        assert_eq!(
            task.await.expect("task"),
            1,
            "every retry sees the first write"
        );
    }
}

/// Writers race sets and deletes over a few shared keys (on Postgres, a
/// group's sets share a statement and its search triggers): afterwards a
/// search finds exactly the live keys, each at its current version.
async fn search_follows_racing_writes(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let mut tasks = Vec::new();
    for writer in 0..16usize {
        let mut client = server.memory();
        tasks.push(tokio::spawn(async move {
            for i in 0..12usize {
                let key = format!("shared{}", (writer + i) % 6);
                if (writer + i) % 5 == 0 {
                    let deleted = client
                        .delete(DeleteRequest {
                            scope_type: ScopeType::Namespace as i32,
                            scope: "race".to_owned(),
                            key,
                            ..DeleteRequest::default()
                        })
                        .await;
                    // Another writer may have deleted it first, or not
                    // yet written it.
                    if let Err(status) = deleted {
                        let why = reason(&status);
                        assert!(why == "KEY_DELETED" || why == "KEY_NOT_FOUND", "{status}");
                    }
                } else {
                    client
                        .set(set(&key, json!(format!("marker from {writer} at {i}"))))
                        .await
                        .expect("set");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let live: BTreeSet<String> = server
        .memory()
        .list(ListRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "race".to_owned(),
            page_size: 100,
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .entries
        .iter()
        .map(|e| format!("memory:race/{}@{}", e.key, e.version))
        .collect();
    let hits = crate::search::search(
        &server,
        SearchRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "race".to_owned(),
            limit: 100,
            ..crate::search::memory_query("marker")
        },
    )
    .await;
    let found: BTreeSet<String> = hits.iter().map(crate::search::name).collect();
    assert_eq!(found, live);
}

/// Appends that each create a session race at the tenant's session limit:
/// a new session and its first episode commit together, so no creator
/// evicts a session before its episode is written, every append succeeds,
/// and each session was stored once (the limit's eviction counts add up).
async fn appends_creating_sessions_race_at_the_session_limit(backend: Backend) {
    const CREATORS: usize = 16;
    const EACH: usize = 20;
    let server = TestServer::spawn_with(backend, |s| {
        s.max_sessions = Some(5);
        s.db_max_connections = Some(16);
    })
    .await;
    let mut tasks = Vec::new();
    for creator in 0..CREATORS {
        let mut episodes = server.episodes();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                episodes
                    .append_episode(AppendEpisodeRequest {
                        session_id: format!("c{creator}-{i}"),
                        app: "app".into(),
                        user: "alice".into(),
                        episode: Some(NewEpisode {
                            r#type: "user_message".into(),
                            content: Some(json_to_proto(&json!(i))),
                            ..NewEpisode::default()
                        }),
                        ..AppendEpisodeRequest::default()
                    })
                    .await
                    .expect("append");
            }
        }));
    }
    for task in tasks {
        task.await.expect("creator");
    }
    let stats = server
        .sessions()
        .get_stats(GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(
        (
            stats.total_sessions,
            stats.sessions_evicted,
            stats.total_episodes
        ),
        (5, (CREATORS * EACH) as i64 - 5, 5)
    );
}

/// Cleanups of idle sessions race appends to those sessions (an append
/// makes its session again once a cleanup took it). Each cleanup locks
/// its sessions in the order a group of appends does: no call fails but
/// an append whose session went on each of its tries (`SESSION_CHANGED`),
/// and what stays adds up, each session's seqs rising.
async fn cleanups_race_appends_to_the_sessions_they_delete(backend: Backend) {
    const APPENDERS: usize = 12;
    const EACH: usize = 100;
    const SESSIONS: usize = 6;
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let appending = Arc::new(AtomicUsize::new(APPENDERS));
    let mut cleaners = Vec::new();
    for _ in 0..2 {
        let mut sessions = server.sessions();
        let appending = appending.clone();
        cleaners.push(tokio::spawn(async move {
            let mut cleanups = 0;
            while appending.load(Ordering::SeqCst) > 0 {
                sessions
                    .cleanup_sessions(CleanupSessionsRequest {
                        max_age: Some(prost_types::Duration {
                            seconds: 0,
                            nanos: 1_000_000,
                        }),
                        dry_run: false,
                    })
                    .await
                    .expect("cleanup");
                cleanups += 1;
            }
            cleanups
        }));
    }
    let mut appenders = Vec::new();
    for appender in 0..APPENDERS {
        let mut episodes = server.episodes();
        let appending = appending.clone();
        appenders.push(tokio::spawn(async move {
            for i in 0..EACH {
                let outcome = episodes
                    .append_episode(AppendEpisodeRequest {
                        session_id: format!("idle-{}", (appender + i) % SESSIONS),
                        app: "app".into(),
                        user: "alice".into(),
                        episode: Some(NewEpisode {
                            r#type: "user_message".into(),
                            content: Some(json_to_proto(&json!(i))),
                            ..NewEpisode::default()
                        }),
                        ..AppendEpisodeRequest::default()
                    })
                    .await;
                if let Err(err) = outcome {
                    assert_eq!(
                        (err.code(), reason(&err)),
                        (Code::Aborted, "SESSION_CHANGED".to_owned()),
                        "{err:?}"
                    );
                }
            }
            appending.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    for task in appenders {
        task.await.expect("appender");
    }
    for task in cleaners {
        assert!(task.await.expect("cleaner") > 0);
    }
    let mut stored = 0;
    for session in 0..SESSIONS {
        let listed = server
            .episodes()
            .list_episodes(ListEpisodesRequest {
                session_id: format!("idle-{session}"),
                page_size: 1000,
                ..ListEpisodesRequest::default()
            })
            .await;
        let Ok(listed) = listed else { continue };
        let seqs: Vec<i64> = listed.into_inner().episodes.iter().map(|e| e.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        stored += seqs.len() as i64;
    }
    let stats = server
        .sessions()
        .get_stats(GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.total_episodes, stored);
}

/// An eviction that deletes several sessions locks them in id order
/// first, as a group of appends does. Deleted oldest first, an eviction
/// held the older session `z` while it waited for `a`, which a group of
/// appends held while it waited for `z`: a deadlock, and one of the two
/// calls failed. Here the test's own transaction is that group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_takes_its_sessions_in_id_order() {
    let server = TestServer::spawn(Backend::Postgres).await;
    let create = |id: &str| CreateSessionRequest {
        session_id: id.to_owned(),
        app: "app".into(),
        user: "alice".into(),
        metadata: None,
        request_id: String::new(),
    };
    for id in ["z", "a", "m"] {
        server
            .sessions()
            .create_session(create(id))
            .await
            .expect("create");
    }
    // A replica with a limit of two sessions evicts the two oldest, `z`
    // and `a`, to make a third.
    let limited = ChildServer::spawn(
        &["--migrate", "off"],
        &[
            ("ENGRAM_DATABASE_URL", &server.db.url),
            ("ENGRAM_MAX_SESSIONS", "2"),
        ],
        None,
    )
    .await;
    let mut db = server.db_connection("the test").await;
    let mut group = holding(
        &server.db.url,
        "SELECT 1 FROM sessions WHERE id = 'a' FOR UPDATE",
    )
    .await;
    let mut sessions = SessionServiceClient::new(connect(limited.grpc_addr).await);
    let creating = tokio::spawn(async move { sessions.create_session(create("new")).await });
    until_reads(&mut db, LOCK_WAITS, 1, "the eviction waits for a").await;
    sqlx::query("SELECT 1 FROM sessions WHERE id = 'z' FOR UPDATE NOWAIT")
        .execute(&mut group)
        .await
        .expect("the eviction holds z no longer while it waits for a");
    release(group, "ROLLBACK").await;
    creating
        .await
        .expect("creator")
        .expect("the eviction goes on");
    let mut left: Vec<String> = server
        .sessions()
        .list_sessions(ListSessionsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    left.sort();
    assert_eq!(left, ["m", "new"]);
    assert!(limited.terminate().await.success());
}

/// A `DeleteSession` that finds its session deleted by another call, and
/// made again by its owner before the delete asks why it matched nothing,
/// answers that there was no session then (`SESSION_NOT_FOUND`), not that
/// it belongs to someone else: the call named no owner. Here the test's
/// own transaction deletes the session and makes it again while the call
/// waits for the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_again_under_a_delete_is_not_anothers() {
    let server = TestServer::spawn(Backend::Postgres).await;
    server
        .sessions()
        .create_session(CreateSessionRequest {
            session_id: "s".into(),
            app: "app".into(),
            user: "alice".into(),
            metadata: None,
            request_id: String::new(),
        })
        .await
        .expect("create");
    let mut db = server.db_connection("the test").await;
    let mut again = holding(
        &server.db.url,
        "CREATE TEMP TABLE made ON COMMIT DROP AS SELECT * FROM sessions WHERE id = 's'",
    )
    .await;
    sqlx::query("DELETE FROM sessions WHERE id = 's'")
        .execute(&mut again)
        .await
        .expect("delete the session");
    let mut sessions = server.sessions();
    let deleting = tokio::spawn(async move {
        sessions
            .delete_session(DeleteSessionRequest {
                session_id: "s".into(),
                ..DeleteSessionRequest::default()
            })
            .await
    });
    until_reads(&mut db, LOCK_WAITS, 1, "the delete waits for the row").await;
    sqlx::query("INSERT INTO sessions SELECT * FROM made")
        .execute(&mut again)
        .await
        .expect("make the session again");
    release(again, "COMMIT").await;
    let err = deleting
        .await
        .expect("deleter")
        .expect_err("no session when the delete looked");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::NotFound, "SESSION_NOT_FOUND".into())
    );
    server
        .sessions()
        .get_session(engram::proto::GetSessionRequest {
            session_id: "s".into(),
            ..engram::proto::GetSessionRequest::default()
        })
        .await
        .expect("the session made again stays");
}

on_both_stores!(
    appends_creating_sessions_race_at_the_session_limit,
    cleanups_race_appends_to_the_sessions_they_delete,
    dense_versions_under_32_writers,
    one_winner_among_16_cas_writers,
    racing_retries_write_once,
    search_follows_racing_writes,
);
