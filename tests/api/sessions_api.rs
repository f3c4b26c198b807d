//! `SessionService` and `EpisodeService` over gRPC, on both stores: ids and
//! owners, idempotent appends, dense seq under concurrent appenders,
//! widening reads, type filters, the context text, limits and eviction,
//! cleanup, stats, cascade delete, and the HTTP endpoints.

use std::collections::HashSet;

use engram::api::convert::json_to_proto;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::{
    AppendEpisodeRequest, AppendEpisodesRequest, BuildContextRequest, CleanupSessionsRequest,
    CreateSessionRequest, DeleteSessionRequest, EndSessionRequest, Episode, GetEpisodeRequest,
    GetOrCreateSessionRequest, GetSessionRequest, GetStatsRequest, ListEpisodesRequest,
    ListSessionsRequest, NewEpisode, RecentRequest,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, TestServer, bad_fields, http_get_json, reason};
use crate::on_both_stores;

fn create(app: &str, user: &str, id: &str) -> CreateSessionRequest {
    CreateSessionRequest {
        app: app.to_owned(),
        user: user.to_owned(),
        session_id: id.to_owned(),
        metadata: None,
    }
}

fn new_episode(id: &str, kind: &str, content: serde_json::Value) -> NewEpisode {
    NewEpisode {
        id: id.to_owned(),
        r#type: kind.to_owned(),
        content: Some(json_to_proto(&content)),
        ..NewEpisode::default()
    }
}

fn append(session: &str, episode: NewEpisode) -> AppendEpisodeRequest {
    AppendEpisodeRequest {
        session_id: session.to_owned(),
        episode: Some(episode),
        ..AppendEpisodeRequest::default()
    }
}

/// An append that creates the session when it is missing.
fn append_as(app: &str, user: &str, session: &str, episode: NewEpisode) -> AppendEpisodeRequest {
    AppendEpisodeRequest {
        session_id: session.to_owned(),
        app: app.to_owned(),
        user: user.to_owned(),
        episode: Some(episode),
    }
}

fn list(session: &str) -> ListEpisodesRequest {
    ListEpisodesRequest {
        session_id: session.to_owned(),
        ..ListEpisodesRequest::default()
    }
}

async fn all_episodes(client: &mut EpisodeServiceClient<Channel>, session: &str) -> Vec<Episode> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_episodes(ListEpisodesRequest {
                page_token: token,
                page_size: 1000,
                ..list(session)
            })
            .await
            .expect("list episodes")
            .into_inner();
        out.extend(page.episodes);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

fn content_text(episode: &Episode) -> String {
    match episode.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(prost_types::value::Kind::StringValue(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}

async fn ids_and_owners(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut sessions = server.sessions();

    let given = sessions
        .create_session(create("agent", "user123", "custom-id"))
        .await
        .expect("create with an id")
        .into_inner()
        .session
        .expect("session");
    assert_eq!(
        (given.id.as_str(), given.app.as_str(), given.user.as_str()),
        ("custom-id", "agent", "user123")
    );
    assert_eq!((given.episode_count, given.last_seq), (0, 0));
    assert!(given.end_time.is_none());

    let made = sessions
        .create_session(create("agent", "user123", ""))
        .await
        .expect("create without an id")
        .into_inner()
        .session
        .expect("session");
    let uuid = uuid::Uuid::parse_str(&made.id).expect("a UUID");
    assert_eq!(uuid.get_version_num(), 7, "server ids are UUIDv7");

    let taken = sessions
        .create_session(create("agent", "user123", "custom-id"))
        .await
        .expect_err("taken id");
    assert_eq!(taken.code(), Code::AlreadyExists);
    assert_eq!(reason(&taken), "SESSION_EXISTS");

    // GetOrCreate: the owner's id comes back, a new id is created.
    let same = sessions
        .get_or_create_session(GetOrCreateSessionRequest {
            app: "agent".into(),
            user: "user123".into(),
            session_id: "custom-id".into(),
            metadata: None,
        })
        .await
        .expect("get existing")
        .into_inner();
    assert!(!same.created);
    assert_eq!(same.session.map(|s| s.create_time), Some(given.create_time));
    let fresh = sessions
        .get_or_create_session(GetOrCreateSessionRequest {
            app: "agent".into(),
            user: "user123".into(),
            session_id: "provided-id".into(),
            metadata: Some(prost_types::Struct {
                fields: [("channel".to_owned(), json_to_proto(&json!("web")))].into(),
            }),
        })
        .await
        .expect("create missing")
        .into_inner();
    assert!(fresh.created);
    let fresh = fresh.session.expect("session");
    assert_eq!(fresh.metadata.map(|m| m.fields.len()), Some(1));

    // Another owner never resolves the id, and learns nothing of the owner.
    for (app, user) in [("agent", "mallory"), ("other-agent", "user123")] {
        let err = sessions
            .get_or_create_session(GetOrCreateSessionRequest {
                app: app.into(),
                user: user.into(),
                session_id: "custom-id".into(),
                metadata: None,
            })
            .await
            .expect_err("owner mismatch");
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");
        assert!(
            !err.message().contains("user123") && !err.message().contains("agent"),
            "the error does not name the owner: {}",
            err.message()
        );
        let err = sessions
            .get_session(GetSessionRequest {
                session_id: "custom-id".into(),
                app: app.into(),
                user: user.into(),
            })
            .await
            .expect_err("owner mismatch on get");
        assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");
        let err = server
            .episodes()
            .append_episode(append_as(
                app,
                user,
                "custom-id",
                new_episode("", "", json!("x")),
            ))
            .await
            .expect_err("owner mismatch on append");
        assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");
    }

    let got = sessions
        .get_session(GetSessionRequest {
            session_id: "custom-id".into(),
            ..GetSessionRequest::default()
        })
        .await
        .expect("get without an owner")
        .into_inner()
        .session
        .expect("session");
    assert_eq!(got.user, "user123");
    let missing = sessions
        .get_session(GetSessionRequest {
            session_id: "nope".into(),
            ..GetSessionRequest::default()
        })
        .await
        .expect_err("unknown");
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(reason(&missing), "SESSION_NOT_FOUND");

    for (request, field) in [
        (create("", "u", ""), "app"),
        (create("a", "has space", ""), "user"),
        (create("a", "u", &"x".repeat(129)), "session_id"),
    ] {
        let err = sessions.create_session(request).await.expect_err("invalid");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(bad_fields(&err), vec![field.to_owned()]);
    }
}

async fn listing_and_paging(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut sessions = server.sessions();
    for (i, (app, user)) in [
        ("a1", "alice"),
        ("a1", "bob"),
        ("a2", "alice"),
        ("a1", "alice"),
        ("a2", "bob"),
    ]
    .into_iter()
    .enumerate()
    {
        sessions
            .create_session(create(app, user, &format!("s{i}")))
            .await
            .expect("create");
    }
    let ids = |page: &engram::proto::ListSessionsResponse| {
        page.sessions
            .iter()
            .map(|s| s.id.clone())
            .collect::<Vec<_>>()
    };
    let all = sessions
        .list_sessions(ListSessionsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(ids(&all), ["s4", "s3", "s2", "s1", "s0"], "newest first");
    let by_app = sessions
        .list_sessions(ListSessionsRequest {
            app: "a1".into(),
            ..ListSessionsRequest::default()
        })
        .await
        .expect("by app")
        .into_inner();
    assert_eq!(ids(&by_app), ["s3", "s1", "s0"]);
    let by_both = sessions
        .list_sessions(ListSessionsRequest {
            app: "a1".into(),
            user: "alice".into(),
            ..ListSessionsRequest::default()
        })
        .await
        .expect("by app and user")
        .into_inner();
    assert_eq!(ids(&by_both), ["s3", "s0"]);

    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = sessions
            .list_sessions(ListSessionsRequest {
                page_size: 2,
                page_token: token,
                ..ListSessionsRequest::default()
            })
            .await
            .expect("page")
            .into_inner();
        assert!(page.sessions.len() <= 2);
        seen.extend(ids(&page));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ids(&all));
    let bad = sessions
        .list_sessions(ListSessionsRequest {
            page_token: "garbage".into(),
            ..ListSessionsRequest::default()
        })
        .await
        .expect_err("bad token");
    assert_eq!(reason(&bad), "INVALID_PAGE_TOKEN");

    // The KAOS-style endpoint lists the same ids.
    let (status, body) = http_get_json(server.http_addr(), "/memory/sessions").await;
    assert_eq!(status, 200);
    assert_eq!(body["sessions"], json!(["s4", "s3", "s2", "s1", "s0"]));
    assert_eq!(body["total"], json!(5));
    assert_eq!(body["agent"], json!("engram"));
    let (_, body) = http_get_json(server.http_addr(), "/memory/sessions?app=a2&limit=1").await;
    assert_eq!(body, json!({"agent": "a2", "sessions": ["s4"], "total": 1}));
    let (_, body) = http_get_json(server.http_addr(), "/memory/sessions?limit=5000").await;
    assert_eq!(
        body["total"],
        json!(5),
        "a limit above the most reads the most"
    );
    for bad in ["x", "0", "-1"] {
        let path = format!("/memory/sessions?limit={bad}");
        let (status, body) = http_get_json(server.http_addr(), &path).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(body["reason"], json!("INVALID_ARGUMENT"));
        assert_eq!(
            body["error"],
            json!(format!(
                "limit: must be a positive integer (one above 1000 reads 1000), got \"{bad}\""
            ))
        );
    }
}

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

async fn type_filters_paging_and_context(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    let script = [
        ("user_message", json!("Hello!")),
        ("agent_response", json!("Hi there!")),
        ("tool_call", json!({"tool": "calc", "arguments": {"x": 2}})),
        ("tool_result", json!({"tool": "calc", "result": 4})),
        ("user_message", json!("How are you?")),
        ("agent_response", json!({"text": "Fine."})),
    ];
    let batch = AppendEpisodesRequest {
        session_id: "chat".into(),
        app: "agent".into(),
        user: "u1".into(),
        episodes: script
            .iter()
            .map(|(kind, content)| new_episode("", kind, content.clone()))
            .collect(),
    };
    episodes.append_episodes(batch).await.expect("append");

    let messages = episodes
        .list_episodes(ListEpisodesRequest {
            types: vec!["user_message".into(), "agent_response".into()],
            ..list("chat")
        })
        .await
        .expect("filtered")
        .into_inner();
    let seqs: Vec<i64> = messages.episodes.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 5, 6]);
    let after = episodes
        .list_episodes(ListEpisodesRequest {
            after_seq: 4,
            ..list("chat")
        })
        .await
        .expect("after")
        .into_inner();
    assert_eq!(
        after.episodes.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [5, 6]
    );
    let page = episodes
        .list_episodes(ListEpisodesRequest {
            page_size: 4,
            ..list("chat")
        })
        .await
        .expect("page")
        .into_inner();
    assert_eq!(page.episodes.len(), 4);
    let rest = episodes
        .list_episodes(ListEpisodesRequest {
            page_size: 4,
            page_token: page.next_page_token,
            ..list("chat")
        })
        .await
        .expect("next page")
        .into_inner();
    assert_eq!(
        rest.episodes.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [5, 6]
    );
    assert!(rest.next_page_token.is_empty());
    let err = episodes
        .list_episodes(ListEpisodesRequest {
            types: vec!["Bad-Type".into()],
            ..list("chat")
        })
        .await
        .expect_err("bad type");
    assert_eq!(bad_fields(&err), vec!["types[0]".to_owned()]);
    let err = episodes
        .list_episodes(list("nope"))
        .await
        .expect_err("unknown session");
    assert_eq!(reason(&err), "SESSION_NOT_FOUND");

    let context = episodes
        .build_context(BuildContextRequest {
            session_id: "chat".into(),
            max_events: 0,
        })
        .await
        .expect("context")
        .into_inner();
    assert_eq!(
        context.context,
        "User: Hello!\nAssistant: Hi there!\nUser: How are you?\nAssistant: {\"text\":\"Fine.\"}"
    );
    assert_eq!(context.events_used, 4);
    let last_two = episodes
        .build_context(BuildContextRequest {
            session_id: "chat".into(),
            max_events: 2,
        })
        .await
        .expect("context")
        .into_inner();
    assert_eq!(
        last_two.context,
        "User: How are you?\nAssistant: {\"text\":\"Fine.\"}"
    );
    let empty = server
        .sessions()
        .create_session(create("agent", "u1", "quiet"))
        .await
        .expect("create");
    assert!(empty.into_inner().session.is_some());
    let none = episodes
        .build_context(BuildContextRequest {
            session_id: "quiet".into(),
            max_events: 5,
        })
        .await
        .expect("empty context")
        .into_inner();
    assert_eq!((none.context.as_str(), none.events_used), ("", 0));

    // The KAOS-style events endpoint: newest `limit`, oldest first.
    let (status, body) =
        http_get_json(server.http_addr(), "/memory/events?session_id=chat&limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(body["agent"], json!("agent"));
    assert_eq!(body["total"], json!(2));
    assert_eq!(body["events"][0]["event_type"], json!("user_message"));
    assert_eq!(body["events"][0]["content"], json!("How are you?"));
    assert_eq!(body["events"][1]["content"], json!({"text": "Fine."}));
    assert!(
        body["events"][0]["event_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    assert!(body["events"][0]["timestamp"].as_str().is_some());
    let (_, all) = http_get_json(server.http_addr(), "/memory/events").await;
    assert_eq!(all["total"], json!(6));
    assert_eq!(all["agent"], json!("engram"));
    let (status, body) = http_get_json(server.http_addr(), "/memory/events?session_id=nope").await;
    assert_eq!(status, 404);
    assert_eq!(body["reason"], json!("SESSION_NOT_FOUND"));
    let (status, _) = http_get_json(server.http_addr(), "/memory/events?limit=0").await;
    assert_eq!(status, 400);
    let (status, body) = http_get_json(server.http_addr(), "/memory/events?limit=5000").await;
    assert_eq!(status, 200, "over the maximum is lowered");
    assert_eq!(body["total"], json!(6));
}

async fn widening_reads(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    // (user, session, agent, text); timestamps increase down the list.
    let rows = [
        ("alice", "S1", "rag", "a-s1-rag-1"),
        ("alice", "S1", "planner", "a-s1-planner-1"),
        ("alice", "S2", "rag", "a-s2-rag-1"),
        ("aliceX", "SX", "rag", "x-sx-rag-1"),
        ("alice", "S1", "rag", "a-s1-rag-2"),
        ("aliceX", "S1X", "rag", "x-s1x-rag-1"),
    ];
    let base = 1_700_000_000;
    for (i, (user, session, agent, text)) in rows.iter().enumerate() {
        let mut episode = new_episode("", "observation", json!(text));
        episode.agent = (*agent).to_owned();
        episode.timestamp = Some(prost_types::Timestamp {
            seconds: base + i as i64,
            nanos: 0,
        });
        episodes
            .append_episode(append_as("app", user, session, episode))
            .await
            .expect("append");
    }
    let recent = |user: &str, session: &str, agent: &str, limit: i32| RecentRequest {
        user: user.into(),
        session_id: session.into(),
        agent: agent.into(),
        limit,
        types: Vec::new(),
    };
    let mut read = async |request: RecentRequest| -> Vec<String> {
        episodes
            .recent(request)
            .await
            .expect("recent")
            .into_inner()
            .episodes
            .iter()
            .map(content_text)
            .collect()
    };
    assert_eq!(
        read(recent("alice", "S1", "rag", 10)).await,
        ["a-s1-rag-2", "a-s1-rag-1"]
    );
    assert_eq!(
        read(recent("alice", "S1", "", 10)).await,
        ["a-s1-rag-2", "a-s1-planner-1", "a-s1-rag-1"]
    );
    assert_eq!(
        read(recent("alice", "", "", 10)).await,
        ["a-s1-rag-2", "a-s2-rag-1", "a-s1-planner-1", "a-s1-rag-1"],
        "alice never matches aliceX"
    );
    assert_eq!(
        read(recent("alice", "", "rag", 10)).await,
        ["a-s1-rag-2", "a-s2-rag-1", "a-s1-rag-1"]
    );
    assert_eq!(
        read(recent("alice", "", "", 2)).await,
        ["a-s1-rag-2", "a-s2-rag-1"]
    );
    assert_eq!(
        read(recent("aliceX", "", "", 10)).await,
        ["x-s1x-rag-1", "x-sx-rag-1"]
    );
    // A session of another user is empty, not a leak.
    assert!(read(recent("alice", "SX", "", 10)).await.is_empty());
    assert!(read(recent("ali", "", "", 10)).await.is_empty());
    let err = episodes
        .recent(recent("", "", "", 1))
        .await
        .expect_err("user required");
    assert_eq!(bad_fields(&err), vec!["user".to_owned()]);
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

async fn end_delete_cleanup_and_stats(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut sessions = server.sessions();
    let mut episodes = server.episodes();
    let empty = sessions
        .get_stats(GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(
        (
            empty.total_sessions,
            empty.total_episodes,
            empty.avg_episodes_per_session
        ),
        (0, 0, 0.0)
    );
    for (session, n) in [("keep", 3), ("gone", 2), ("ended", 1)] {
        for i in 0..n {
            episodes
                .append_episode(append_as(
                    "app",
                    "u",
                    session,
                    new_episode("", "", json!(i)),
                ))
                .await
                .expect("append");
        }
    }
    let stats = sessions
        .get_stats(GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!((stats.total_sessions, stats.total_episodes), (3, 6));
    assert!((stats.avg_episodes_per_session - 2.0).abs() < 1e-9);

    // Delete cascades to the episodes.
    let deleted = sessions
        .delete_session(DeleteSessionRequest {
            session_id: "gone".into(),
            ..DeleteSessionRequest::default()
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(deleted.episodes_deleted, 2);
    let err = episodes
        .list_episodes(list("gone"))
        .await
        .expect_err("gone");
    assert_eq!(reason(&err), "SESSION_NOT_FOUND");
    let recent = episodes
        .recent(RecentRequest {
            user: "u".into(),
            session_id: "gone".into(),
            ..RecentRequest::default()
        })
        .await
        .expect("recent")
        .into_inner();
    assert!(
        recent.episodes.is_empty(),
        "no episode outlives its session"
    );
    let err = sessions
        .delete_session(DeleteSessionRequest {
            session_id: "keep".into(),
            user: "someone-else".into(),
            ..DeleteSessionRequest::default()
        })
        .await
        .expect_err("not the owner");
    assert_eq!(reason(&err), "SESSION_OWNER_MISMATCH");
    let err = sessions
        .delete_session(DeleteSessionRequest {
            session_id: "gone".into(),
            ..DeleteSessionRequest::default()
        })
        .await
        .expect_err("twice");
    assert_eq!(reason(&err), "SESSION_NOT_FOUND");

    // End: appends refused afterwards; episodes kept unless asked.
    let ended = sessions
        .end_session(EndSessionRequest {
            session_id: "ended".into(),
            ..EndSessionRequest::default()
        })
        .await
        .expect("end")
        .into_inner();
    let end_time = ended.session.and_then(|s| s.end_time).expect("end time");
    assert_eq!(ended.episodes_deleted, 0);
    let err = episodes
        .append_episode(append("ended", new_episode("", "", json!("late"))))
        .await
        .expect_err("ended");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "SESSION_ENDED");
    let again = sessions
        .end_session(EndSessionRequest {
            session_id: "ended".into(),
            delete_episodes: true,
            ..EndSessionRequest::default()
        })
        .await
        .expect("end again, deleting episodes")
        .into_inner();
    assert_eq!(again.episodes_deleted, 1);
    let session = again.session.expect("session");
    assert_eq!(session.end_time, Some(end_time), "the first end time stays");
    assert_eq!(session.episode_count, 0);
    assert!(all_episodes(&mut episodes, "ended").await.is_empty());

    // Cleanup: nothing is an hour old; a dry run deletes nothing.
    let hour = prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    };
    let none = sessions
        .cleanup_sessions(CleanupSessionsRequest {
            max_age: Some(hour),
            dry_run: false,
        })
        .await
        .expect("cleanup")
        .into_inner();
    assert_eq!(none.sessions_deleted, 0);
    for bad in [
        None,
        Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        }),
        Some(prost_types::Duration::default()),
    ] {
        let err = sessions
            .cleanup_sessions(CleanupSessionsRequest {
                max_age: bad,
                dry_run: true,
            })
            .await
            .expect_err("bad max_age");
        assert_eq!(bad_fields(&err), vec!["max_age".to_owned()]);
    }
}

on_both_stores!(
    ids_and_owners,
    listing_and_paging,
    appends_are_idempotent_and_atomic,
    dense_seq_under_concurrent_appenders,
    type_filters_paging_and_context,
    widening_reads,
    limits_evict_the_oldest,
    end_delete_cleanup_and_stats,
);
