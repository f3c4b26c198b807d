//! Search follows writes: removals take effect in the call that made them,
//! writes are found as soon as they return (also under a burst of
//! concurrent writers, and while others rewrite the same keys), and memory
//! hits follow every kind of write.

use std::collections::BTreeSet;

use engram::api::convert::json_to_proto;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_delta::Delta;
use engram::proto::search_hit::Item;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    ApplyDeltasRequest, DeleteFactRequest, DeleteRequest, DeleteSessionRequest, FactKind,
    FactPayload, MemoryDelta, PurgeRequest, SearchRequest, UpdateDelta,
};
use serde_json::json;

use super::{
    EPISODES, FACTS, NS, append, episode, memory_query, names, query, remember, search, set,
};
use crate::helpers::{Backend, TestServer};
use crate::on_both_stores;

/// What a call removes is not found once the call returned: a deleted key,
/// an older version, a purged key, an evicted episode, a deleted fact, a
/// deleted session's episodes.
async fn removals_take_effect_at_once(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.max_events_per_session = Some(2)).await;
    let mut memory = server.memory();
    memory
        .set(set("ns", "k", json!("alpha version")))
        .await
        .expect("set");
    assert_eq!(
        names(&search(&server, memory_query("alpha")).await),
        vec!["memory:ns/k@1"]
    );
    memory
        .set(set("ns", "k", json!("beta version")))
        .await
        .expect("set");
    assert!(
        search(&server, memory_query("alpha")).await.is_empty(),
        "an old version"
    );
    assert_eq!(
        names(&search(&server, memory_query("beta")).await),
        vec!["memory:ns/k@2"]
    );
    memory
        .delete(DeleteRequest {
            scope_type: NS,
            scope: "ns".to_owned(),
            key: "k".to_owned(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    assert!(
        search(&server, memory_query("beta")).await.is_empty(),
        "a deleted key"
    );
    memory
        .set(set("ns", "k", json!("gamma version")))
        .await
        .expect("set");
    assert_eq!(
        names(&search(&server, memory_query("gamma")).await),
        vec!["memory:ns/k@4"]
    );
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "ns".to_owned(),
            key: "k".to_owned(),
            keep: None,
            dry_run: false,
        })
        .await
        .expect("purge");
    assert!(
        search(&server, memory_query("gamma")).await.is_empty(),
        "a purged key"
    );

    let mut episodes = server.episodes();
    episodes
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode("e1", "user_message", "", json!("first turtle")),
                episode("e2", "user_message", "", json!("second turtle")),
                episode("e3", "user_message", "", json!("third turtle")),
            ],
        ))
        .await
        .expect("append");
    let turtles = SearchRequest {
        sources: vec![EPISODES],
        ..query("turtle")
    };
    assert_eq!(
        names(&search(&server, turtles.clone()).await)
            .into_iter()
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["episode:e2".to_owned(), "episode:e3".to_owned()]),
        "the evicted episode is gone"
    );
    server
        .sessions()
        .delete_session(DeleteSessionRequest {
            session_id: "s1".to_owned(),
            ..DeleteSessionRequest::default()
        })
        .await
        .expect("delete session");
    assert!(
        search(&server, turtles).await.is_empty(),
        "a deleted session"
    );

    let fact = WorkingMemoryServiceClient::new(server.channel.clone())
        .remember(remember("s2", "bob", "bob", "bob keeps a llama"))
        .await
        .expect("remember")
        .into_inner()
        .fact
        .expect("fact");
    let llama = SearchRequest {
        sources: vec![FACTS],
        ..query("llama")
    };
    assert_eq!(
        names(&search(&server, llama.clone()).await),
        vec!["fact:bob"]
    );
    // A new version of the fact: found by its new words only.
    let mut consolidation = ConsolidationServiceClient::new(server.channel.clone());
    consolidation
        .apply_deltas(bobs_fact_update(&fact.id, "bob keeps a yak"))
        .await
        .expect("update the fact");
    assert!(
        search(&server, llama.clone()).await.is_empty(),
        "an older version"
    );
    let yak = SearchRequest {
        sources: vec![FACTS],
        ..query("yak")
    };
    let hits = search(&server, yak.clone()).await;
    assert_eq!(names(&hits), vec!["fact:bob"]);
    match hits[0].item.as_ref() {
        Some(Item::Fact(found)) => assert_eq!(
            (found.id.as_str(), found.current.as_ref().map(|v| v.version)),
            (fact.id.as_str(), Some(2))
        ),
        other => panic!("not a fact: {other:?}"),
    }
    consolidation
        .delete_fact(DeleteFactRequest { fact_id: fact.id })
        .await
        .expect("delete fact");
    assert!(search(&server, yak).await.is_empty(), "a deleted fact");
}

/// A new version of bob's fact `id`, saying `content`.
fn bobs_fact_update(id: &str, content: &str) -> ApplyDeltasRequest {
    ApplyDeltasRequest {
        deltas: vec![MemoryDelta {
            delta: Some(Delta::Update(UpdateDelta {
                fact_payload: Some(FactPayload {
                    app: "app".to_owned(),
                    user: "bob".to_owned(),
                    kind: FactKind::Semantic as i32,
                    subject: "bob".to_owned(),
                    predicate: "uses".to_owned(),
                    object: String::new(),
                    content: Some(json_to_proto(&json!(content))),
                    channels: vec![],
                }),
                replaces: vec![id.to_owned()],
                provenance: Some(crate::consolidation::provenance(&["e0"])),
            })),
        }],
    }
}

/// Writers append while searchers search: every append is found by the
/// search that follows its return, and no search fails.
async fn writes_are_found_during_a_burst(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let writers = (0..6).map(|w| {
        let server = &server;
        async move {
            let mut episodes = server.episodes();
            for i in 0..15 {
                let word = format!("marker{w}x{i}");
                episodes
                    .append_episodes(append(
                        &format!("s{w}"),
                        "alice",
                        vec![episode(
                            &format!("w{w}-{i}"),
                            "user_message",
                            "",
                            json!(format!("burst note {word}")),
                        )],
                    ))
                    .await
                    .expect("append");
                let hits = search(server, query(&word)).await;
                assert_eq!(names(&hits), vec![format!("episode:w{w}-{i}")], "{word}");
            }
        }
    });
    let readers = (0..2).map(|_| {
        let server = &server;
        async move {
            for _ in 0..30 {
                search(server, query("burst note")).await;
            }
        }
    });
    futures::future::join(
        futures::future::join_all(writers),
        futures::future::join_all(readers),
    )
    .await;
    let all = search(
        &server,
        SearchRequest {
            limit: 100,
            ..query("burst")
        },
    )
    .await;
    assert_eq!(all.len(), 90);
}

/// Writers rewrite the same two keys and the same fact, each searching for
/// what it has just written: the key is found every time, at the version
/// its writer was told or a later one, and so is the fact. A search reads
/// its matches, then its hits whole; on Postgres those are two statements,
/// and a key given a new version between them had been dropped from the
/// hits although live (about one search in sixteen with five writers).
async fn live_items_are_found_while_others_rewrite_them(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let fact = WorkingMemoryServiceClient::new(server.channel.clone())
        .remember(remember("s1", "bob", "bob", "bob keeps a yak"))
        .await
        .expect("remember")
        .into_inner()
        .fact
        .expect("fact");
    let writers = (0..6).map(|w| {
        let (server, fact_id) = (&server, fact.id.clone());
        async move {
            let mut memory = server.memory();
            let mut consolidation = ConsolidationServiceClient::new(server.channel.clone());
            for i in 0..20 {
                let key = format!("race{}", i % 2);
                let written = memory
                    .set(set("race", &key, json!(format!("race note {w} {i}"))))
                    .await
                    .expect("set")
                    .into_inner()
                    .entry
                    .expect("entry")
                    .version;
                let found: Vec<i64> = search(server, memory_query(&key))
                    .await
                    .iter()
                    .filter_map(|hit| match hit.item.as_ref() {
                        Some(Item::Entry(entry)) if entry.key == key => Some(entry.version),
                        _ => None,
                    })
                    .collect();
                assert!(
                    matches!(found[..], [version] if version >= written),
                    "writer {w}: {key} v{written} written, a search then found {found:?}"
                );
                consolidation
                    .apply_deltas(bobs_fact_update(
                        &fact_id,
                        &format!("bob keeps a yak {w} {i}"),
                    ))
                    .await
                    .expect("update the fact");
                let yak = SearchRequest {
                    sources: vec![FACTS],
                    ..query("yak")
                };
                assert_eq!(
                    names(&search(server, yak).await),
                    vec!["fact:bob"],
                    "writer {w}, update {i}"
                );
            }
        }
    });
    futures::future::join_all(writers).await;
}

/// A memory key is found at its current version whatever wrote it:
/// concurrent sets (one statement on Postgres), updates, a tombstone and a
/// set after it, a rollback, a purge of older versions, a fork.
async fn memory_hits_follow_every_kind_of_write(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let in_scope = |text: &str, scope: &str| SearchRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        limit: 100,
        ..memory_query(text)
    };
    let found = |text: &'static str, scope: &'static str| {
        let server = &server;
        async move {
            let mut hits = names(&search(server, in_scope(text, scope)).await);
            hits.sort();
            hits
        }
    };
    futures::future::join_all((0..12).map(|i| {
        let mut memory = server.memory();
        async move {
            memory
                .set(set(
                    "mem",
                    &format!("k{i:02}"),
                    json!(format!("alpha note {i}")),
                ))
                .await
                .expect("set")
        }
    }))
    .await;
    let all: Vec<String> = (0..12).map(|i| format!("memory:mem/k{i:02}@1")).collect();
    assert_eq!(found("alpha", "mem").await, all);

    let mut memory = server.memory();
    for value in ["beta", "gamma", "alpha again"] {
        memory
            .set(set("mem", "k00", json!(value)))
            .await
            .expect("set");
    }
    assert!(found("beta", "mem").await.is_empty(), "an older version");
    assert!(found("gamma", "mem").await.is_empty(), "an older version");
    memory
        .delete(DeleteRequest {
            scope_type: NS,
            scope: "mem".to_owned(),
            key: "k01".to_owned(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    memory
        .set(set("mem", "k01", json!("alpha revived")))
        .await
        .expect("set after the tombstone");
    memory
        .set(set("mem", "k02", json!("delta")))
        .await
        .expect("set");
    let rolled = memory
        .rollback(crate::memory_api::rollback_to("mem", "k02", 1))
        .await
        .expect("rollback")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(rolled.version, 3);
    assert!(found("delta", "mem").await.is_empty(), "rolled back");
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(crate::memory_admin::purge("mem", "k00", Some(1), false))
        .await
        .expect("purge the older versions");
    let mut now = all.clone();
    now[0] = "memory:mem/k00@4".to_owned();
    now[1] = "memory:mem/k01@3".to_owned();
    now[2] = "memory:mem/k02@3".to_owned();
    assert_eq!(found("alpha", "mem").await, now);

    memory
        .fork_scope(crate::time_travel::fork("mem", "copy", None))
        .await
        .expect("fork");
    let copied = found("alpha", "copy").await;
    assert_eq!(copied.len(), 12, "{copied:?}");
    assert!(
        copied.iter().all(|n| n.starts_with("memory:copy/k")),
        "{copied:?}"
    );
    assert_eq!(found("alpha", "mem").await, now, "the source is unchanged");
}

on_both_stores!(
    removals_take_effect_at_once,
    writes_are_found_during_a_burst,
    live_items_are_found_while_others_rewrite_them,
    memory_hits_follow_every_kind_of_write,
);
