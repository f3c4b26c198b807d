//! Appends: idempotent and atomic, dense `seq` under concurrent appenders,
//! and the limits that evict the oldest episodes.

use std::collections::HashSet;

use engram::api::convert::json_to_proto;
use engram::proto::{
    AppendEpisodeRequest, AppendEpisodesRequest, DeleteSessionRequest, GetEpisodeRequest,
    GetSessionRequest, GetStatsRequest, ListSessionsRequest, NewEpisode,
};
use serde_json::json;
use tonic::Code;

use super::{all_episodes, append, append_as, create, new_episode};
use crate::helpers::{Backend, TestServer, bad_fields, reason};
use crate::on_both_stores;

async fn appends_are_idempotent_and_atomic(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();

    // No session and no owner: nothing to create it from.
    let err = episodes
        .append_episode(append("s1", new_episode("e1", "user_message", json!("hi"))))
        .await
        .expect_err("unknown session");
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(reason(&err), "SESSION_NOT_FOUND");

    // With the owner, the first append creates the session (one RPC).
    let first = episodes
        .append_episode(append_as(
            "rag",
            "alice",
            "s1",
            new_episode("e1", "user_message", json!("hi")),
        ))
        .await
        .expect("append creates the session")
        .into_inner();
    assert!(!first.replayed);
    let e1 = first.episode.expect("episode");
    assert_eq!(
        (e1.seq, e1.agent.as_str(), e1.user.as_str()),
        (1, "rag", "alice")
    );
    assert!(e1.cursor > 0);

    // Found by id alone, in whichever session it is.
    let got = episodes
        .get_episode(GetEpisodeRequest { id: "e1".into() })
        .await
        .expect("get episode")
        .into_inner()
        .episode
        .expect("episode");
    assert_eq!(
        (got.session_id.as_str(), got.seq, got.cursor),
        ("s1", 1, e1.cursor)
    );
    let missing = episodes
        .get_episode(GetEpisodeRequest { id: "e9".into() })
        .await
        .expect_err("no such episode");
    assert_eq!(
        (missing.code(), reason(&missing)),
        (Code::NotFound, "EPISODE_NOT_FOUND".to_owned())
    );
    let blank = episodes
        .get_episode(GetEpisodeRequest::default())
        .await
        .expect_err("no id");
    assert_eq!(blank.code(), Code::InvalidArgument);
    assert!(bad_fields(&blank).contains(&"id".to_owned()), "{blank:?}");

    let again = episodes
        .append_episode(append("s1", new_episode("e1", "user_message", json!("hi"))))
        .await
        .expect("a retry")
        .into_inner();
    assert!(again.replayed, "the retry wrote nothing");
    assert_eq!(
        again.episode.as_ref().map(|e| (e.seq, e.cursor)),
        Some((1, e1.cursor))
    );

    let clash = episodes
        .append_episode(append(
            "s1",
            new_episode("e1", "user_message", json!("bye")),
        ))
        .await
        .expect_err("same id, other content");
    assert_eq!(clash.code(), Code::AlreadyExists);
    assert_eq!(reason(&clash), "EPISODE_EXISTS");

    // A batch is all or nothing: the clash in the middle stops all three.
    let batch = |ids: [&str; 3]| AppendEpisodesRequest {
        session_id: "s1".into(),
        episodes: ids
            .iter()
            .map(|id| new_episode(id, "observation", json!(id)))
            .collect(),
        ..AppendEpisodesRequest::default()
    };
    let mut bad = batch(["e2", "e1", "e3"]);
    bad.episodes[1] = new_episode("e1", "user_message", json!("other"));
    let err = episodes.append_episodes(bad).await.expect_err("clash");
    assert_eq!(reason(&err), "EPISODE_EXISTS");
    assert_eq!(
        all_episodes(&mut episodes, "s1").await.len(),
        1,
        "nothing appended"
    );

    let dup = episodes
        .append_episodes(batch(["e2", "e2", "e3"]))
        .await
        .expect_err("duplicate ids");
    assert_eq!(bad_fields(&dup), vec!["episodes[1].id".to_owned()]);

    let ok = episodes
        .append_episodes(batch(["e2", "e3", "e4"]))
        .await
        .expect("batch")
        .into_inner();
    let seqs: Vec<i64> = ok.episodes.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [2, 3, 4]);
    // Retrying the batch (with e1 mixed in) appends nothing new.
    let mut retry = batch(["e2", "e3", "e4"]);
    retry
        .episodes
        .push(new_episode("e1", "user_message", json!("hi")));
    let replayed = episodes
        .append_episodes(retry)
        .await
        .expect("retry")
        .into_inner();
    let seqs: Vec<i64> = replayed.episodes.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [2, 3, 4, 1]);
    let stored = all_episodes(&mut episodes, "s1").await;
    assert_eq!(stored.len(), 4);
    assert_eq!(stored[3].r#type, "observation");

    // Validation names the field.
    for (episode, field) in [
        (new_episode("x", "User", json!(1)), "episode.type"),
        (
            NewEpisode {
                content: None,
                ..new_episode("x", "note", json!(1))
            },
            "episode.content",
        ),
        (
            NewEpisode {
                metadata: Some(prost_types::Struct {
                    fields: [("intent".to_owned(), json_to_proto(&json!("merge")))].into(),
                }),
                ..new_episode("x", "note", json!(1))
            },
            "episode.metadata.intent",
        ),
        (new_episode("has space", "note", json!(1)), "episode.id"),
    ] {
        let err = episodes
            .append_episode(append("s1", episode))
            .await
            .expect_err("invalid");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(bad_fields(&err), vec![field.to_owned()]);
    }
}

async fn dense_seq_under_concurrent_appenders(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    server
        .sessions()
        .create_session(create("app", "u", "busy"))
        .await
        .expect("create");
    const WRITERS: usize = 16;
    const EACH: usize = 20;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.episodes();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                client
                    .append_episode(append(
                        "busy",
                        new_episode(&format!("w{w}-{i}"), "observation", json!(i)),
                    ))
                    .await
                    .expect("append");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    let stored = all_episodes(&mut server.episodes(), "busy").await;
    let seqs: Vec<i64> = stored.iter().map(|e| e.seq).collect();
    let expected: Vec<i64> = (1..=(WRITERS * EACH) as i64).collect();
    assert_eq!(seqs, expected, "1..n with no gap and no repeat");
    assert!(
        stored.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "cursors follow seq within a session"
    );
    let ids: HashSet<&str> = stored.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), WRITERS * EACH);
}

/// Appends racing on a few sessions at their episode limit, so that most
/// evict: whether a batch commits alone or in a group, none fails, and
/// each session keeps exactly its newest episodes with dense seqs.
async fn racing_appends_evict_at_the_limit(backend: Backend) {
    const SESSIONS: usize = 3;
    const WRITERS: usize = 12;
    const EACH: usize = 30;
    const LIMIT: usize = 7;
    let server = TestServer::spawn_with(backend, |s| {
        s.max_events_per_session = Some(LIMIT as u64);
        s.db_max_connections = Some(16);
    })
    .await;
    for at in 0..SESSIONS {
        server
            .sessions()
            .create_session(create("app", "u", &format!("hot{at}")))
            .await
            .expect("create");
    }
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.episodes();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..EACH {
                let session = format!("hot{}", (w + i) % SESSIONS);
                let episode = new_episode(&format!("w{w}-{i}"), "observation", json!(i));
                let stored = client
                    .append_episode(append(&session, episode))
                    .await
                    .expect("append")
                    .into_inner()
                    .episode
                    .expect("episode");
                seqs.push((session, stored.seq));
            }
            seqs
        }));
    }
    let mut written: Vec<(String, i64)> = Vec::new();
    for task in tasks {
        written.extend(task.await.expect("writer"));
    }
    for at in 0..SESSIONS {
        let session = format!("hot{at}");
        let mut seqs: Vec<i64> = written
            .iter()
            .filter(|(s, _)| *s == session)
            .map(|(_, seq)| *seq)
            .collect();
        seqs.sort_unstable();
        let total = seqs.len() as i64;
        assert_eq!(seqs, (1..=total).collect::<Vec<_>>(), "{session}: dense");
        let kept: Vec<i64> = all_episodes(&mut server.episodes(), &session)
            .await
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(
            kept,
            ((total - LIMIT as i64 + 1)..=total).collect::<Vec<_>>(),
            "{session}: the newest {LIMIT}"
        );
    }
}

async fn limits_evict_the_oldest(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.max_sessions = Some(5);
        s.max_events_per_session = Some(3);
    })
    .await;
    let mut sessions = server.sessions();
    let mut episodes = server.episodes();
    for i in 0..5 {
        sessions
            .create_session(create("app", "u", &format!("s{i}")))
            .await
            .expect("create");
    }
    // The sixth evicts the oldest 10% (at least one).
    sessions
        .create_session(create("app", "u", "s5"))
        .await
        .expect("create over the limit");
    let listed = sessions
        .list_sessions(ListSessionsRequest::default())
        .await
        .expect("list")
        .into_inner();
    let ids: Vec<&str> = listed.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["s5", "s4", "s3", "s2", "s1"]);
    // An append that creates a session counts too.
    episodes
        .append_episode(append_as("app", "u", "s6", new_episode("", "", json!(0))))
        .await
        .expect("append creating a session");
    let err = sessions
        .get_session(GetSessionRequest {
            session_id: "s1".into(),
            ..GetSessionRequest::default()
        })
        .await
        .expect_err("evicted");
    assert_eq!(reason(&err), "SESSION_NOT_FOUND");

    for i in 1..=5 {
        episodes
            .append_episode(append("s5", new_episode("", "observation", json!(i))))
            .await
            .expect("append");
    }
    let kept = all_episodes(&mut episodes, "s5").await;
    assert_eq!(kept.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4, 5]);
    let session = sessions
        .get_session(GetSessionRequest {
            session_id: "s5".into(),
            ..GetSessionRequest::default()
        })
        .await
        .expect("get")
        .into_inner()
        .session
        .expect("session");
    assert_eq!(
        (
            session.episode_count,
            session.last_seq,
            session.episodes_evicted
        ),
        (3, 5, 2)
    );
    // A batch bigger than the limit keeps its newest.
    let batch = AppendEpisodesRequest {
        session_id: "s5".into(),
        episodes: (0..4).map(|i| new_episode("", "", json!(i))).collect(),
        ..AppendEpisodesRequest::default()
    };
    episodes.append_episodes(batch).await.expect("batch");
    let kept = all_episodes(&mut episodes, "s5").await;
    assert_eq!(kept.iter().map(|e| e.seq).collect::<Vec<_>>(), [7, 8, 9]);

    let stats = sessions
        .get_stats(GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.total_sessions, 5);
    assert_eq!(stats.total_episodes, 4, "three in s5, one in s6");
    assert_eq!(stats.sessions_evicted, 2);
    assert_eq!(stats.episodes_evicted, 6);
    assert!((stats.avg_episodes_per_session - 0.8).abs() < 1e-9);
}

/// An append with `require_session` goes only to a session that exists:
/// with the owner given it creates none, so a session deleted while its
/// agent still runs is not brought back by the agent's next event (as an
/// append without the flag does, by design).
async fn an_append_may_require_its_session(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    let requiring = |session: &str, id: &str| AppendEpisodeRequest {
        require_session: true,
        ..append_as(
            "rag",
            "alice",
            session,
            new_episode(id, "user_message", json!(id)),
        )
    };
    let not_found = |err: tonic::Status| {
        assert_eq!(
            (err.code(), reason(&err)),
            (Code::NotFound, "SESSION_NOT_FOUND".to_owned()),
            "{err:?}"
        );
    };
    not_found(
        episodes
            .append_episode(requiring("s1", "e1"))
            .await
            .expect_err("no session"),
    );
    not_found(
        episodes
            .append_episodes(AppendEpisodesRequest {
                session_id: "s1".into(),
                app: "rag".into(),
                user: "alice".into(),
                episodes: vec![new_episode("e1", "user_message", json!(1))],
                require_session: true,
            })
            .await
            .expect_err("no session for a batch either"),
    );
    let mut sessions = server.sessions();
    let get = GetSessionRequest {
        session_id: "s1".into(),
        ..GetSessionRequest::default()
    };
    not_found(
        sessions
            .get_session(get.clone())
            .await
            .expect_err("none created"),
    );

    sessions
        .create_session(create("rag", "alice", "s1"))
        .await
        .expect("create");
    let stored = episodes
        .append_episode(requiring("s1", "e1"))
        .await
        .expect("the session exists")
        .into_inner();
    assert_eq!(stored.episode.map(|e| e.seq), Some(1));
    let err = episodes
        .append_episode(AppendEpisodeRequest {
            user: "mallory".into(),
            ..requiring("s1", "e2")
        })
        .await
        .expect_err("another user");
    assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");

    sessions
        .delete_session(DeleteSessionRequest {
            session_id: "s1".into(),
            ..DeleteSessionRequest::default()
        })
        .await
        .expect("delete");
    not_found(
        episodes
            .append_episode(requiring("s1", "e3"))
            .await
            .expect_err("deleted"),
    );
    not_found(sessions.get_session(get).await.expect_err("still deleted"));
}

on_both_stores!(
    an_append_may_require_its_session,
    appends_are_idempotent_and_atomic,
    dense_seq_under_concurrent_appenders,
    limits_evict_the_oldest,
    racing_appends_evict_at_the_limit,
);
