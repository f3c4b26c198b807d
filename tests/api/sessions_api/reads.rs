//! Reading episodes: type filters, paging and the context text, and reads
//! widened beyond one session.

use engram::proto::{
    AppendEpisodesRequest, BuildContextRequest, ListEpisodesRequest, RecentRequest,
};
use serde_json::json;

use super::{append_as, content_text, create, list, new_episode};
use crate::helpers::{Backend, TestServer, bad_fields, http_get_json, reason};
use crate::on_both_stores;

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
        require_session: false,
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
    // Percent-encoded text is decoded; bytes that are not UTF-8 are refused
    // by name, not read as some other id.
    let (status, body) = http_get_json(
        server.http_addr(),
        "/memory/events?session_id=%63hat&limit=1",
    )
    .await;
    assert_eq!((status, &body["total"]), (200, &json!(1)));
    let (status, body) =
        http_get_json(server.http_addr(), "/memory/events?session_id=%ff%fe").await;
    assert_eq!(status, 400);
    assert_eq!(body["reason"], json!("INVALID_ARGUMENT"));
    assert_eq!(
        body["error"],
        json!("session_id: must be UTF-8 once percent-decoded")
    );
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

on_both_stores!(type_filters_paging_and_context, widening_reads,);
