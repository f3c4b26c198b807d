//! Sessions: ids and owners, listing and paging, ending, deleting (with
//! their episodes), cleanup of idle ones, and stats.

use engram::api::convert::json_to_proto;
use engram::proto::{
    CleanupSessionsRequest, CreateSessionRequest, DeleteSessionRequest, EndSessionRequest,
    GetOrCreateSessionRequest, GetSessionRequest, GetStatsRequest, ListSessionsRequest,
    RecentRequest,
};
use serde_json::json;
use tonic::Code;

use super::{all_episodes, append, append_as, create, list, new_episode};
use crate::helpers::{Backend, TestServer, bad_fields, http_get_json, reason};
use crate::on_both_stores;

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
            request_id: String::new(),
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
            request_id: String::new(),
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
                request_id: String::new(),
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

/// A creation repeated with its request id (a retry after a reply that
/// was lost) is answered with the session the first one created, as
/// created: no second session, no ALREADY_EXISTS, no `created` false.
async fn creation_is_safe_to_repeat(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut sessions = server.sessions();
    let create = |user: &str, id: &str, request: &str| CreateSessionRequest {
        request_id: request.to_owned(),
        ..super::create("bot", user, id)
    };
    let get_or_create = |user: &str, id: &str, request: &str| GetOrCreateSessionRequest {
        app: "bot".into(),
        user: user.into(),
        session_id: id.into(),
        metadata: None,
        request_id: request.into(),
    };

    // Without an id: the repeat finds the session the first try made.
    let first = sessions
        .create_session(create("ann", "", "r-1"))
        .await
        .expect("create")
        .into_inner()
        .session
        .expect("session");
    let again = sessions
        .create_session(create("ann", "", "r-1"))
        .await
        .expect("the repeat")
        .into_inner()
        .session
        .expect("session");
    assert_eq!(again, first);
    let repeated = sessions
        .get_or_create_session(get_or_create("ann", "", "r-1"))
        .await
        .expect("the repeat as GetOrCreate")
        .into_inner();
    assert!(repeated.created, "the first try created it");
    assert_eq!(repeated.session.as_ref(), Some(&first));
    // Naming the id the first try was given is another request: the
    // first named none.
    let named = sessions
        .get_or_create_session(get_or_create("ann", &first.id, "r-1"))
        .await
        .expect_err("another request naming the id");
    assert_eq!(reason(&named), "REQUEST_ID_REUSED");

    // With an id: the repeat is not ALREADY_EXISTS, and GetOrCreate's
    // repeat says created; other requests for the id still find it made.
    sessions
        .create_session(create("ann", "chat-7", "r-2"))
        .await
        .expect("create chat-7");
    sessions
        .create_session(create("ann", "chat-7", "r-2"))
        .await
        .expect("the repeat of chat-7");
    let taken = sessions
        .create_session(create("ann", "chat-7", "r-3"))
        .await
        .expect_err("another request for a taken id");
    assert_eq!(
        (taken.code(), reason(&taken).as_str()),
        (Code::AlreadyExists, "SESSION_EXISTS")
    );
    for (request, created) in [("r-2", true), ("", false), ("r-4", false)] {
        let found = sessions
            .get_or_create_session(get_or_create("ann", "chat-7", request))
            .await
            .expect("get or create chat-7")
            .into_inner();
        assert_eq!(found.created, created, "request id {request:?}");
        assert_eq!(found.session.map(|s| s.id).as_deref(), Some("chat-7"));
    }
    let listed = sessions
        .list_sessions(ListSessionsRequest {
            user: "ann".into(),
            ..ListSessionsRequest::default()
        })
        .await
        .expect("list")
        .into_inner();
    let mut ids: Vec<String> = listed.sessions.into_iter().map(|s| s.id).collect();
    ids.sort();
    let mut wanted = vec!["chat-7".to_owned(), first.id.clone()];
    wanted.sort();
    assert_eq!(ids, wanted, "no session was made twice");

    // An id reused for another request is refused, whichever call.
    let with_metadata = CreateSessionRequest {
        metadata: Some(prost_types::Struct {
            fields: [("channel".to_owned(), json_to_proto(&json!("web")))].into(),
        }),
        ..create("ann", "chat-7", "r-2")
    };
    for request in [
        create("bob", "", "r-1"),
        create("ann", "chat-8", "r-2"),
        create("ann", "", "r-2"),
        with_metadata,
    ] {
        let err = sessions
            .create_session(request.clone())
            .await
            .expect_err("reused");
        assert_eq!(err.code(), Code::InvalidArgument, "{request:?}");
        assert_eq!(reason(&err), "REQUEST_ID_REUSED");
        assert_eq!(bad_fields(&err), vec!["request_id".to_owned()]);
    }
    let err = sessions
        .get_or_create_session(get_or_create("bob", "chat-7", "r-2"))
        .await
        .expect_err("reused by GetOrCreate");
    assert_eq!(reason(&err), "REQUEST_ID_REUSED");

    // Bad ids are refused before anything is looked up.
    for bad in ["has space", &"r".repeat(129), "tab\there"] {
        let err = sessions
            .create_session(create("ann", "", bad))
            .await
            .expect_err("bad request id");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(reason(&err), "INVALID_REQUEST_ID");
        assert_eq!(bad_fields(&err), vec!["request_id".to_owned()]);
    }

    // The id lives with the session: once it is deleted, a repeat makes
    // it again.
    server
        .sessions()
        .delete_session(DeleteSessionRequest {
            session_id: "chat-7".into(),
            ..DeleteSessionRequest::default()
        })
        .await
        .expect("delete");
    let remade = sessions
        .get_or_create_session(get_or_create("ann", "chat-7", "r-2"))
        .await
        .expect("made again")
        .into_inner();
    assert!(remade.created);
}

/// Many tries of one creation at once (a client's retry racing its
/// first try, or a duplicated message): one session, and every answer is
/// that session, as created.
async fn racing_repeats_create_one_session(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    for id in ["", "raced"] {
        let request = GetOrCreateSessionRequest {
            app: "bot".into(),
            user: format!("racer-{id}"),
            session_id: id.into(),
            metadata: None,
            request_id: format!("race-{id}"),
        };
        let tries = (0..16).map(|_| {
            let mut sessions = server.sessions();
            let request = request.clone();
            tokio::spawn(async move { sessions.get_or_create_session(request).await })
        });
        let answers: Vec<_> = futures::future::join_all(tries)
            .await
            .into_iter()
            .map(|joined| joined.expect("joined").expect("answered").into_inner())
            .collect();
        let first = answers[0].session.clone().expect("session");
        for answer in &answers {
            assert!(answer.created, "{answer:?}");
            assert_eq!(answer.session.as_ref(), Some(&first));
        }
        let listed = server
            .sessions()
            .list_sessions(ListSessionsRequest {
                user: request.user.clone(),
                ..ListSessionsRequest::default()
            })
            .await
            .expect("list")
            .into_inner();
        assert_eq!(listed.sessions.len(), 1, "one session for {id:?}");
    }
}

on_both_stores!(
    creation_is_safe_to_repeat,
    racing_repeats_create_one_session,
    ids_and_owners,
    listing_and_paging,
    end_delete_cleanup_and_stats,
);
