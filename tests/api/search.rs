//! `SearchService` through a real server on both stores: what is found
//! (live items of every source, with marked snippets), ranking, every
//! filter, tenant isolation, removals that take effect in the call that
//! made them, writes found as soon as they return (also under a burst of
//! concurrent writers), and refusals with their fields and reasons. How
//! the server reads text itself is in `search_vectors`.

use std::collections::BTreeSet;

use engram::api::convert::json_to_proto;
use engram::auth::hash_token;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_delta::Delta;
use engram::proto::search_hit::Item;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    AppendEpisodesRequest, ApplyDeltasRequest, DeleteFactRequest, DeleteRequest,
    DeleteSessionRequest, FactKind, FactPayload, MemoryDelta, NewEpisode, PurgeRequest,
    RecordProcedureRequest, RememberRequest, ScopeType, SearchHit, SearchMode, SearchRequest,
    SearchSource, SetRequest, UpdateDelta,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, Metadata, TestServer, bad_fields, reason};
use crate::on_both_stores;

pub(crate) const NS: i32 = ScopeType::Namespace as i32;
const MEMORY: i32 = SearchSource::Memory as i32;
const FACTS: i32 = SearchSource::Facts as i32;
pub(crate) const EPISODES: i32 = SearchSource::Episodes as i32;

fn search_client(server: &TestServer) -> SearchServiceClient<Channel> {
    SearchServiceClient::new(server.channel.clone())
}

pub(crate) fn query(text: &str) -> SearchRequest {
    SearchRequest {
        query: text.to_owned(),
        ..SearchRequest::default()
    }
}

pub(crate) async fn search(server: &TestServer, request: SearchRequest) -> Vec<SearchHit> {
    search_client(server)
        .search(request)
        .await
        .expect("search")
        .into_inner()
        .hits
}

/// What a hit names: `memory:scope/key@version`, `fact:subject`,
/// `episode:id`.
pub(crate) fn name(hit: &SearchHit) -> String {
    match hit.item.as_ref().expect("item") {
        Item::Entry(e) => format!("memory:{}/{}@{}", e.scope, e.key, e.version),
        Item::Fact(f) => format!(
            "fact:{}",
            f.current.as_ref().map(|v| v.subject.as_str()).unwrap_or("")
        ),
        Item::Episode(e) => format!("episode:{}", e.id),
    }
}

/// A search of memory only.
pub(crate) fn memory_query(text: &str) -> SearchRequest {
    SearchRequest {
        sources: vec![MEMORY],
        ..query(text)
    }
}

pub(crate) fn names(hits: &[SearchHit]) -> Vec<String> {
    hits.iter().map(name).collect()
}

pub(crate) fn set(scope: &str, key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

pub(crate) fn episode(id: &str, kind: &str, agent: &str, content: serde_json::Value) -> NewEpisode {
    NewEpisode {
        id: id.to_owned(),
        agent: agent.to_owned(),
        r#type: kind.to_owned(),
        content: Some(json_to_proto(&content)),
        ..NewEpisode::default()
    }
}

pub(crate) fn append(
    session: &str,
    user: &str,
    episodes: Vec<NewEpisode>,
) -> AppendEpisodesRequest {
    AppendEpisodesRequest {
        session_id: session.to_owned(),
        app: "app".to_owned(),
        user: user.to_owned(),
        episodes,
    }
}

pub(crate) fn remember(session: &str, user: &str, subject: &str, content: &str) -> RememberRequest {
    RememberRequest {
        session_id: session.to_owned(),
        app: "app".to_owned(),
        user: user.to_owned(),
        content: content.to_owned(),
        subject: subject.to_owned(),
        predicate: "uses".to_owned(),
        object: String::new(),
    }
}

/// Every source is searched by default; each hit carries its item at its
/// current state and a snippet with the matched words marked.
async fn finds_live_items_of_every_source(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    server
        .memory()
        .set(set(
            "ops",
            "deploy/notes",
            json!({"text": "We deploy with blue green rollouts", "tags": ["kubernetes"]}),
        ))
        .await
        .expect("set");
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![episode(
                "e1",
                "user_message",
                "",
                json!("my kubernetes cluster runs the staging deployment"),
            )],
        ))
        .await
        .expect("append");
    WorkingMemoryServiceClient::new(server.channel.clone())
        .remember(remember(
            "s1",
            "alice",
            "alice",
            "alice prefers kubernetes over nomad",
        ))
        .await
        .expect("remember");

    let hits = search(&server, query("kubernetes")).await;
    let found: BTreeSet<String> = names(&hits).into_iter().collect();
    assert_eq!(
        found,
        BTreeSet::from([
            "memory:ops/deploy/notes@1".to_owned(),
            "fact:alice".to_owned(),
            "episode:e1".to_owned(),
        ]),
        "{hits:?}"
    );
    for hit in &hits {
        assert!(hit.score > 0.0, "{hit:?}");
        assert!(
            hit.snippet.to_lowercase().contains("**kubernetes**"),
            "the matched word is marked: {:?}",
            hit.snippet
        );
    }
    let sources: Vec<i32> = hits.iter().map(|h| h.source).collect();
    assert!(sources.contains(&MEMORY) && sources.contains(&FACTS) && sources.contains(&EPISODES));
    assert!(
        hits.windows(2).all(|w| w[0].score >= w[1].score),
        "best first"
    );

    // Words are stemmed: plurals and verb forms find each other.
    let stemmed = search(&server, query("clusters running")).await;
    assert_eq!(names(&stemmed), vec!["episode:e1"]);
    let rollout = search(&server, query("rollout")).await;
    assert_eq!(names(&rollout), vec!["memory:ops/deploy/notes@1"]);
    // Keys and identifiers are found by their parts.
    let by_key = search(&server, query("notes")).await;
    assert_eq!(names(&by_key), vec!["memory:ops/deploy/notes@1"]);
}

/// BM25 with a bonus for neighbouring words: the exact phrase beats the
/// same words scattered, a rare word beats a common one; quotes require
/// the phrase, a minus excludes.
async fn ranking_and_query_syntax(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = vec![
        episode(
            "scattered",
            "user_message",
            "",
            json!("the setup of the office was slow, and the deployment came much later"),
        ),
        episode(
            "phrase",
            "user_message",
            "",
            json!("the deployment setup of the office was slow and came much later"),
        ),
        episode("rare", "user_message", "", json!("the zanzibar office")),
    ];
    for i in 0..20 {
        episodes.push(episode(
            &format!("filler{i}"),
            "user_message",
            "",
            json!(format!("the office number {i} is open")),
        ));
    }
    server
        .episodes()
        .append_episodes(append("s1", "alice", episodes))
        .await
        .expect("append");

    let hits = search(&server, query("deployment setup")).await;
    assert_eq!(
        names(&hits)[..2],
        ["episode:phrase", "episode:scattered"],
        "{hits:?}"
    );
    let rare = search(&server, query("office zanzibar")).await;
    assert_eq!(names(&rare)[0], "episode:rare", "{rare:?}");

    let quoted = search(&server, query("\"deployment setup\"")).await;
    assert_eq!(names(&quoted), vec!["episode:phrase"]);
    let excluded = search(
        &server,
        query("deployment -zanzibar -phrase -\"deployment setup\""),
    )
    .await;
    assert_eq!(names(&excluded), vec!["episode:scattered"]);
    let limited = search(
        &server,
        SearchRequest {
            limit: 3,
            ..query("office")
        },
    )
    .await;
    assert_eq!(limited.len(), 3);
    assert!(
        search(&server, query("nothing-like-this-anywhere"))
            .await
            .is_empty()
    );
}

/// Chinese, Japanese and Korean through the API: a word of the text is
/// found inside a run written without spaces, the run itself first, with
/// its characters marked in the snippet, and a quoted run needs them in a
/// row.
async fn cjk_words_are_found_inside_runs(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let said = [
        ("dark", "我喜欢深色模式，晚上看代码不累。"),
        ("scattered", "深夜里，颜色和模式都变了。"),
        ("japanese", "明日の会議でデプロイの手順を決めます"),
        ("korean", "배포 설정은 쿠버네티스로 합니다"),
    ];
    let episodes = said
        .iter()
        .map(|(id, text)| episode(id, "user_message", "", json!(text)))
        .collect();
    server
        .episodes()
        .append_episodes(append("s1", "alice", episodes))
        .await
        .expect("append");

    let hits = search(&server, query("深色模式")).await;
    assert_eq!(
        names(&hits),
        ["episode:dark", "episode:scattered"],
        "{hits:?}"
    );
    assert_eq!(hits[0].snippet, "我喜欢**深色模式**，晚上看代码不累。");
    let quoted = search(&server, query("\"深色\"")).await;
    assert_eq!(names(&quoted), ["episode:dark"]);
    let japanese = search(&server, query("デプロイ 手順")).await;
    assert_eq!(names(&japanese), ["episode:japanese"]);
    assert_eq!(
        japanese[0].snippet,
        "明日の会議で**デプロイ**の**手順**を決めます"
    );
    let korean = search(&server, query("쿠버네티스")).await;
    assert_eq!(names(&korean), ["episode:korean"]);
}

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
        .apply_deltas(ApplyDeltasRequest {
            deltas: vec![MemoryDelta {
                delta: Some(Delta::Update(UpdateDelta {
                    fact_payload: Some(FactPayload {
                        app: "app".to_owned(),
                        user: "bob".to_owned(),
                        kind: FactKind::Semantic as i32,
                        subject: "bob".to_owned(),
                        predicate: "uses".to_owned(),
                        object: String::new(),
                        content: Some(json_to_proto(&json!("bob keeps a yak"))),
                        channels: vec![],
                    }),
                    replaces: vec![fact.id.clone()],
                    provenance: Some(crate::consolidation::provenance(&["e0"])),
                })),
            }],
        })
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

/// `following_episodes` adds the turns after each episode hit, scored
/// below it and within the episode filters.
async fn following_episodes_bring_the_answer(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode(
                    "q",
                    "user_message",
                    "",
                    json!("what did you eat for dinner?"),
                ),
                episode("a", "agent_response", "bot", json!("pasta with pesto")),
                episode("later", "user_message", "", json!("thanks")),
            ],
        ))
        .await
        .expect("append");
    let dinner = || SearchRequest {
        sources: vec![EPISODES],
        ..query("dinner")
    };
    assert_eq!(names(&search(&server, dinner()).await), vec!["episode:q"]);
    let hits = search(
        &server,
        SearchRequest {
            following_episodes: 1,
            ..dinner()
        },
    )
    .await;
    assert_eq!(names(&hits), vec!["episode:q", "episode:a"]);
    assert!(hits[1].score < hits[0].score);
    assert_eq!(hits[1].snippet, "pasta with pesto");
    let two = search(
        &server,
        SearchRequest {
            following_episodes: 2,
            ..dinner()
        },
    )
    .await;
    assert_eq!(names(&two), vec!["episode:q", "episode:a", "episode:later"]);
    let typed = search(
        &server,
        SearchRequest {
            following_episodes: 2,
            types: vec!["user_message".to_owned()],
            ..dinner()
        },
    )
    .await;
    assert_eq!(names(&typed), vec!["episode:q", "episode:later"]);
    let status = search_client(&server)
        .search(SearchRequest {
            following_episodes: 4,
            ..dinner()
        })
        .await
        .expect_err("too many");
    assert_eq!(bad_fields(&status), vec!["following_episodes".to_owned()]);
}

/// Bad input is refused with the field and a reason.
async fn bad_requests_name_the_field(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = search_client(&server);
    let cases = [
        (query(""), Code::InvalidArgument, "INVALID_QUERY", "query"),
        (
            query(&"word ".repeat(1000)),
            Code::InvalidArgument,
            "INVALID_QUERY",
            "query",
        ),
        (
            query("-only"),
            Code::InvalidArgument,
            "INVALID_QUERY",
            "query",
        ),
        (
            SearchRequest {
                sources: vec![MEMORY, 99],
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "sources[1]",
        ),
        (
            SearchRequest {
                limit: 101,
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "limit",
        ),
        (
            SearchRequest {
                scope_prefix: "no spaces".to_owned(),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_IDENTIFIER",
            "scope_prefix",
        ),
        (
            SearchRequest {
                limit: -1,
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "limit",
        ),
        (
            SearchRequest {
                following_episodes: -1,
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "following_episodes",
        ),
        (
            SearchRequest {
                scope: "ops".to_owned(),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "scope",
        ),
        (
            SearchRequest {
                user: "not a name!".to_owned(),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_IDENTIFIER",
            "user",
        ),
        (
            SearchRequest {
                types: vec!["Bad Type".to_owned()],
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_IDENTIFIER",
            "types[0]",
        ),
        (
            SearchRequest {
                start_time: Some(prost_types::Timestamp {
                    seconds: 20,
                    nanos: 0,
                }),
                end_time: Some(prost_types::Timestamp {
                    seconds: 10,
                    nanos: 0,
                }),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "end_time",
        ),
    ];
    for (request, code, why, field) in cases {
        let status = client.search(request.clone()).await.expect_err(field);
        assert_eq!(status.code(), code, "{field}: {status:?}");
        assert_eq!(reason(&status), why, "{field}: {status:?}");
        assert_eq!(bad_fields(&status), vec![field.to_owned()], "{status:?}");
        // The field is named once, before what is wrong with it.
        let said = status.message();
        let rest = said.strip_prefix(&format!("{field}: ")).unwrap_or(said);
        assert!(!rest.starts_with(field), "{said}");
    }
    let status = client
        .search(SearchRequest {
            limit: 101,
            ..query("x")
        })
        .await
        .expect_err("limit");
    assert_eq!(
        status.message(),
        "limit: must be from 1 to 100 (0 means 10), got 101"
    );
    for mode in [SearchMode::Semantic, SearchMode::Hybrid] {
        let status = client
            .search(SearchRequest {
                mode: mode as i32,
                ..query("x")
            })
            .await
            .expect_err("no embedder");
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(reason(&status), "EMBEDDER_NOT_CONFIGURED");
        assert!(status.message().contains("--embedder-url"), "{status:?}");
    }
    // Stop words alone find nothing, and are not an error.
    let lexical = client
        .search(SearchRequest {
            mode: SearchMode::Lexical as i32,
            ..query("x")
        })
        .await
        .expect("lexical is built in");
    assert!(lexical.into_inner().hits.is_empty());
}

on_both_stores!(
    finds_live_items_of_every_source,
    ranking_and_query_syntax,
    cjk_words_are_found_inside_runs,
    filters_narrow_each_source,
    tenants_never_see_each_other,
    removals_take_effect_at_once,
    writes_are_found_during_a_burst,
    memory_hits_follow_every_kind_of_write,
    following_episodes_bring_the_answer,
    bad_requests_name_the_field,
);

/// Fails listing the first of `differ` (what Rust and Postgres made
/// differently) unless it is empty.
pub(crate) fn assert_none_differ(differ: &[String]) {
    assert!(
        differ.is_empty(),
        "{} differ: {:#?}",
        differ.len(),
        &differ[..differ.len().min(20)]
    );
}
