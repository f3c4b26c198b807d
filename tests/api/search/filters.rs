//! Every filter narrows its sources, and tenants never see each other's
//! hits.

use std::collections::BTreeSet;

use engram::auth::hash_token;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{FactKind, RecordProcedureRequest, SearchRequest};
use serde_json::json;
use tonic::Code;

use super::{EPISODES, FACTS, MEMORY, NS, append, episode, names, query, remember, search, set};
use crate::helpers::{Backend, Metadata, TestServer};
use crate::on_both_stores;

/// Each filter narrows its own source and leaves the others alone.
async fn filters_narrow_each_source(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    memory
        .set(set(
            "ops",
            "runbook/db",
            json!("restart the widget database"),
        ))
        .await
        .expect("set");
    memory
        .set(set("ops", "notes/db", json!("widget database notes")))
        .await
        .expect("set");
    memory
        .set(set(
            "other",
            "runbook/db",
            json!("widget database elsewhere"),
        ))
        .await
        .expect("set");
    let mut episodes = server.episodes();
    episodes
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode("a1", "user_message", "", json!("widget question")),
                episode("a2", "tool_call", "tools", json!({"args": "widget lookup"})),
            ],
        ))
        .await
        .expect("append");
    episodes
        .append_episodes(append(
            "s2",
            "bob",
            vec![episode("b1", "user_message", "", json!("widget from bob"))],
        ))
        .await
        .expect("append");
    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    working
        .remember(remember("s1", "alice", "alice", "alice builds widgets"))
        .await
        .expect("remember");
    working
        .remember(remember("s2", "bob", "bob", "bob sells widgets"))
        .await
        .expect("remember");
    working
        .record_procedure(RecordProcedureRequest {
            app: "app".to_owned(),
            content: "package widgets in boxes".to_owned(),
            subject: "packing".to_owned(),
            predicate: "how".to_owned(),
            request_id: String::new(),
        })
        .await
        .expect("procedure");

    let found = |request: SearchRequest| {
        let server = &server;
        async move {
            names(&search(server, request).await)
                .into_iter()
                .collect::<BTreeSet<_>>()
        }
    };
    let set_of = |items: &[&str]| {
        items
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>()
    };
    let widget = || SearchRequest {
        limit: 100,
        ..query("widget")
    };

    assert_eq!(
        found(SearchRequest {
            sources: vec![MEMORY],
            scope_type: NS,
            scope: "ops".to_owned(),
            key_prefix: "runbook/".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["memory:ops/runbook/db@1"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![MEMORY],
            scope_type: NS,
            ..widget()
        })
        .await
        .len(),
        3
    );
    // A scope prefix: every scope whose name starts with it, any type.
    assert_eq!(
        found(SearchRequest {
            sources: vec![MEMORY],
            scope_prefix: "oth".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["memory:other/runbook/db@1"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![MEMORY],
            scope_prefix: "op".to_owned(),
            key_prefix: "notes/".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["memory:ops/notes/db@1"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![EPISODES],
            user: "alice".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["episode:a1", "episode:a2"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![EPISODES],
            session_id: "s2".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["episode:b1"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![EPISODES],
            agent: "tools".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["episode:a2"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![EPISODES],
            types: vec!["user_message".to_owned()],
            app: "app".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["episode:a1", "episode:b1"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![FACTS],
            user: "bob".to_owned(),
            ..widget()
        })
        .await,
        set_of(&["fact:bob"])
    );
    assert_eq!(
        found(SearchRequest {
            sources: vec![FACTS],
            kind: FactKind::Procedural as i32,
            ..widget()
        })
        .await,
        set_of(&["fact:packing"])
    );
    // A user filter narrows facts and episodes, not memory.
    let alice = found(SearchRequest {
        user: "alice".to_owned(),
        ..widget()
    })
    .await;
    assert_eq!(alice.len(), 3 + 2 + 1, "{alice:?}");

    // The time range: nothing is from the future, everything from the past.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let at = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
    assert!(
        found(SearchRequest {
            start_time: Some(at(now + 3600)),
            ..widget()
        })
        .await
        .is_empty()
    );
    assert_eq!(
        found(SearchRequest {
            start_time: Some(at(now - 3600)),
            end_time: Some(at(now + 3600)),
            ..widget()
        })
        .await
        .len(),
        3 + 3 + 3
    );
}

/// Two tenants writing the same words under the same names see only their
/// own hits.
async fn tenants_never_see_each_other(backend: Backend) {
    let tokens = format!(
        "{} acme\n{} globex",
        hash_token("acme-t"),
        hash_token("globex-t")
    );
    let server = TestServer::spawn_with(backend, |s| s.tokens = Some(tokens)).await;
    let bearer = |token: &str| Metadata::new(&[("authorization", &format!("Bearer {token}"))]);
    for (token, word) in [("acme-t", "acme"), ("globex-t", "globex")] {
        let mut memory =
            engram::proto::memory_service_client::MemoryServiceClient::with_interceptor(
                server.channel.clone(),
                bearer(token),
            );
        memory
            .set(set("shared", "k", json!(format!("secret plans of {word}"))))
            .await
            .expect("set");
        let mut episodes =
            engram::proto::episode_service_client::EpisodeServiceClient::with_interceptor(
                server.channel.clone(),
                bearer(token),
            );
        episodes
            .append_episodes(append(
                "s1",
                "alice",
                vec![episode(
                    "e1",
                    "user_message",
                    "",
                    json!(format!("secret plans of {word}")),
                )],
            ))
            .await
            .expect("append");
    }
    for (token, word) in [("acme-t", "acme"), ("globex-t", "globex")] {
        let mut client =
            SearchServiceClient::with_interceptor(server.channel.clone(), bearer(token));
        let hits = client
            .search(SearchRequest {
                user: "alice".to_owned(),
                ..query("secret plans")
            })
            .await
            .expect("search")
            .into_inner()
            .hits;
        assert_eq!(hits.len(), 2, "{hits:?}");
        for hit in &hits {
            assert!(hit.snippet.contains(word), "{word} sees {:?}", hit.snippet);
        }
    }
    let refused = SearchServiceClient::new(server.channel.clone())
        .search(query("secret"))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated);
}

on_both_stores!(filters_narrow_each_source, tenants_never_see_each_other,);
