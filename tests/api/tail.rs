//! `EpisodeService.TailEpisodes`: every episode exactly once, in cursor
//! order, across reconnects and server processes; filters; shutdown says
//! where to resume.

use std::collections::HashSet;
use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::{
    AppendEpisodeRequest, Episode, NewEpisode, TailEpisodesRequest, TailEpisodesResponse,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, TestServer, connect, error_metadata, reason};
use crate::on_both_stores;

fn append(app: &str, user: &str, session: &str, kind: &str, id: &str) -> AppendEpisodeRequest {
    AppendEpisodeRequest {
        session_id: session.to_owned(),
        app: app.to_owned(),
        user: user.to_owned(),
        episode: Some(NewEpisode {
            id: id.to_owned(),
            r#type: kind.to_owned(),
            content: Some(json_to_proto(&json!({ "id": id }))),
            ..NewEpisode::default()
        }),
        require_session: false,
    }
}

fn tail_all(cursor: Option<i64>) -> TailEpisodesRequest {
    TailEpisodesRequest {
        cursor,
        ..TailEpisodesRequest::default()
    }
}

async fn next(
    stream: &mut tonic::Streaming<TailEpisodesResponse>,
) -> Result<Episode, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an episode arrives")
        .and_then(|item| {
            item.and_then(|r| r.episode)
                .ok_or_else(|| tonic::Status::internal("stream ended"))
        })
}

/// Reads `count` episodes, reconnecting from the last cursor seen after
/// each of `reconnect_at` episodes.
async fn read(
    client: &mut EpisodeServiceClient<Channel>,
    request: TailEpisodesRequest,
    count: usize,
    reconnect_at: &[usize],
) -> Vec<Episode> {
    let mut stream = client
        .tail_episodes(request.clone())
        .await
        .expect("tail")
        .into_inner();
    let mut seen: Vec<Episode> = Vec::with_capacity(count);
    while seen.len() < count {
        seen.push(next(&mut stream).await.expect("episode"));
        if reconnect_at.contains(&seen.len()) {
            let last = seen.last().map(|e| e.cursor);
            stream = client
                .tail_episodes(TailEpisodesRequest {
                    cursor: last,
                    ..request.clone()
                })
                .await
                .expect("resume")
                .into_inner();
        }
    }
    seen
}

fn check_exactly_once_in_order(seen: &[Episode], expected: &HashSet<String>) {
    assert!(
        seen.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "cursors strictly increase"
    );
    let ids: HashSet<String> = seen.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids.len(), seen.len(), "no duplicate");
    assert_eq!(&ids, expected, "no gap");
}

async fn every_episode_once_in_cursor_order(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    const WRITERS: usize = 8;
    const EACH: usize = 1250;
    // Tails on their own connections, started before the first append:
    // one from cursor 0, one that reconnects twice from its last cursor.
    let mut follower = EpisodeServiceClient::new(connect(server.grpc_addr()).await);
    let mut reconnecting = EpisodeServiceClient::new(connect(server.grpc_addr()).await);
    let total = WRITERS * EACH;
    let followed =
        tokio::spawn(async move { read(&mut follower, tail_all(Some(0)), total, &[]).await });
    let resumed = tokio::spawn(async move {
        read(
            &mut reconnecting,
            tail_all(Some(0)),
            total,
            &[total / 3, 2 * total / 3],
        )
        .await
    });

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = EpisodeServiceClient::new(connect(server.grpc_addr()).await);
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                // Two sessions per writer, so the log interleaves sessions.
                let session = format!("w{w}-s{}", i % 2);
                client
                    .append_episode(append(
                        "app",
                        "u",
                        &session,
                        "observation",
                        &format!("w{w}-{i}"),
                    ))
                    .await
                    .expect("append");
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let expected: HashSet<String> = (0..WRITERS)
        .flat_map(|w| (0..EACH).map(move |i| format!("w{w}-{i}")))
        .collect();
    let followed = followed.await.expect("follower");
    check_exactly_once_in_order(&followed, &expected);
    let resumed = resumed.await.expect("reconnecting tail");
    check_exactly_once_in_order(&resumed, &expected);
    // Per session, the tail shows seq 1, 2, 3, ... in order.
    let mut last_seq = std::collections::HashMap::new();
    for episode in &followed {
        let seen = last_seq
            .insert(episode.session_id.clone(), episode.seq)
            .unwrap_or(0);
        assert_eq!(episode.seq, seen + 1, "{} in seq order", episode.session_id);
    }
}

async fn filters_start_now_and_shutdown(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    episodes
        .append_episode(append("a1", "alice", "s1", "user_message", "before"))
        .await
        .expect("append");
    // Without a cursor the tail starts now: "before" is not replayed.
    let mut client = EpisodeServiceClient::new(connect(server.grpc_addr()).await);
    let mut now = client
        .tail_episodes(tail_all(None))
        .await
        .expect("tail")
        .into_inner();
    let mut by_session = client
        .tail_episodes(TailEpisodesRequest {
            session_id: "s2".into(),
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();
    let mut by_user_and_type = client
        .tail_episodes(TailEpisodesRequest {
            user: "bob".into(),
            types: vec!["tool_call".into()],
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();
    let mut by_app = client
        .tail_episodes(TailEpisodesRequest {
            app: "a1".into(),
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();
    for (app, user, session, kind, id) in [
        ("a1", "alice", "s1", "agent_response", "e1"),
        ("a2", "bob", "s2", "user_message", "e2"),
        ("a2", "bob", "s2", "tool_call", "e3"),
        ("a2", "bob", "s3", "tool_call", "e4"),
        ("a1", "alice", "s1", "user_message", "e5"),
    ] {
        episodes
            .append_episode(append(app, user, session, kind, id))
            .await
            .expect("append");
    }
    let ids = async |stream: &mut tonic::Streaming<TailEpisodesResponse>, n: usize| {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(next(stream).await.expect("episode").id);
        }
        out
    };
    assert_eq!(ids(&mut now, 5).await, ["e1", "e2", "e3", "e4", "e5"]);
    assert_eq!(ids(&mut by_session, 2).await, ["e2", "e3"]);
    assert_eq!(ids(&mut by_user_and_type, 2).await, ["e3", "e4"]);
    assert_eq!(ids(&mut by_app, 3).await, ["before", "e1", "e5"]);

    let err = client
        .tail_episodes(TailEpisodesRequest {
            types: vec!["Nope".into()],
            ..TailEpisodesRequest::default()
        })
        .await
        .expect_err("bad type");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client
        .tail_episodes(tail_all(Some(-1)))
        .await
        .expect_err("negative cursor");
    assert_eq!(err.code(), Code::InvalidArgument);

    // Shutdown ends every tail with UNAVAILABLE and the cursor to resume
    // after: the last episode the client received.
    let last_cursor = {
        let mut fresh = client
            .tail_episodes(tail_all(Some(0)))
            .await
            .expect("tail")
            .into_inner();
        let mut last = 0;
        for _ in 0..6 {
            last = next(&mut fresh).await.expect("episode").cursor;
        }
        (fresh, last)
    };
    let (mut fresh, last) = last_cursor;
    server.stop().await;
    let err = next(&mut fresh).await.expect_err("ended by shutdown");
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(reason(&err), "SHUTTING_DOWN");
    assert_eq!(
        error_metadata(&err, "resume_cursor"),
        Some(last.to_string())
    );
}

/// A tail of one session (or user) catching up over a long stretch of
/// other sessions' episodes (past the 2,000 cursors where the server plans
/// the read for its values) gets exactly that session's episodes, in
/// cursor order, then the live ones.
async fn a_narrow_tail_catches_up_over_a_long_stretch(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    let mut wanted = Vec::new();
    for batch in 0..30 {
        let mut new: Vec<NewEpisode> = (0..100)
            .map(|n| NewEpisode {
                id: format!("other-{batch}-{n}"),
                r#type: "observation".into(),
                content: Some(json_to_proto(&json!(n))),
                ..NewEpisode::default()
            })
            .collect();
        // Every tenth batch, the watched session's episode among them.
        if batch % 10 == 0 {
            let id = format!("mine-{batch}");
            episodes
                .append_episode(append("a1", "carol", "watched", "observation", &id))
                .await
                .expect("append mine");
            wanted.push(id);
        }
        episodes
            .append_episodes(engram::proto::AppendEpisodesRequest {
                session_id: format!("busy-{}", batch % 3),
                app: "a1".into(),
                user: "dave".into(),
                episodes: std::mem::take(&mut new),
                ..engram::proto::AppendEpisodesRequest::default()
            })
            .await
            .expect("append others");
    }
    let mut client = EpisodeServiceClient::new(connect(server.grpc_addr()).await);
    let by_session = TailEpisodesRequest {
        session_id: "watched".into(),
        cursor: Some(0),
        ..TailEpisodesRequest::default()
    };
    let by_user = TailEpisodesRequest {
        user: "carol".into(),
        cursor: Some(0),
        ..TailEpisodesRequest::default()
    };
    for (request, live_in) in [(by_session, "watched"), (by_user, "elsewhere")] {
        let mut stream = client
            .tail_episodes(request.clone())
            .await
            .expect("tail")
            .into_inner();
        let mut seen = Vec::new();
        while seen.len() < wanted.len() {
            seen.push(next(&mut stream).await.expect("episode"));
        }
        let ids: Vec<&str> = seen.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, wanted, "{request:?}");
        assert!(seen.windows(2).all(|w| w[0].cursor < w[1].cursor));
        // Then the live ones (the user's in another of their sessions).
        let live = format!("live-{live_in}");
        episodes
            .append_episode(append("a1", "carol", live_in, "observation", &live))
            .await
            .expect("append live");
        assert_eq!(next(&mut stream).await.expect("live").id, live);
        wanted.push(live);
    }
}

on_both_stores!(
    every_episode_once_in_cursor_order,
    filters_start_now_and_shutdown,
    a_narrow_tail_catches_up_over_a_long_stretch
);

/// Two server processes on one Postgres: appends through one reach a tail
/// on the other (NOTIFY wakes it, the table is the truth), in cursor order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tails_cross_replicas() {
    let one = TestServer::spawn(Backend::Postgres).await;
    let two = crate::helpers::ChildServer::spawn(
        &["--migrate", "off"],
        &[("ENGRAM_DATABASE_URL", &one.db.url)],
        None,
    )
    .await;
    let mut on_two = EpisodeServiceClient::new(connect(two.grpc_addr).await);
    let mut stream = on_two
        .tail_episodes(tail_all(None))
        .await
        .expect("tail")
        .into_inner();
    let mut cursor = 0;
    for i in 0..20 {
        let id = format!("x{i}");
        one.episodes()
            .append_episode(append("app", "u", "shared", "observation", &id))
            .await
            .expect("append on one");
        let seen = next(&mut stream).await.expect("seen on two");
        assert_eq!(seen.id, id);
        assert!(seen.cursor > cursor);
        cursor = seen.cursor;
    }
    // And the other way round, with concurrent writers on both.
    let mut on_one = one
        .episodes()
        .tail_episodes(tail_all(Some(cursor)))
        .await
        .expect("tail")
        .into_inner();
    let mut writers = Vec::new();
    for (w, addr) in [(0, one.grpc_addr()), (1, two.grpc_addr)] {
        writers.push(tokio::spawn(async move {
            let mut client = EpisodeServiceClient::new(connect(addr).await);
            for i in 0..100 {
                client
                    .append_episode(append(
                        "app",
                        "u",
                        &format!("p{w}"),
                        "observation",
                        &format!("p{w}-{i}"),
                    ))
                    .await
                    .expect("append");
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen.push(next(&mut on_one).await.expect("episode"));
    }
    let expected: HashSet<String> = (0..2)
        .flat_map(|w| (0..100).map(move |i| format!("p{w}-{i}")))
        .collect();
    check_exactly_once_in_order(&seen, &expected);
    drop(stream);
    assert!(two.terminate().await.success());
}
