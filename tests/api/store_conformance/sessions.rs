//! Sessions and episodes: creation, appends (dense `seq`, replays,
//! refusals, evictions), the widening reads and the tail's filters.

use engram::ports::Store;
use engram::sessions::ports::{Append, Appended, EpisodeQuery};
use engram::sessions::{Episode, EpisodeType, Id, NewEpisode, Owner, SessionFilter, TailFilter};
use serde_json::json;

use super::fixtures::{self, id, log, name, now, owner};
use crate::helpers::TestDb;

/// An episode with an id (so a retry replays it), of a type.
fn episode(
    session: &Id,
    episode_id: &str,
    kind: &str,
    agent: Option<&str>,
    content: serde_json::Value,
) -> NewEpisode {
    fixtures::episode(session, Some(episode_id), Some(kind), agent, content)
}

/// Creating an existing id reports the stored session, not a new one.
async fn creating_a_taken_id_returns_the_stored_session<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    let (first, created) = l.create("s1", "app", "alice", 0).await;
    assert!(created);
    assert_eq!(first.metadata.get("k"), Some(&json!("v")));
    let (again, created) = l.create("s1", "other-app", "bob", 0).await;
    assert!(!created);
    assert_eq!((again.app.as_str(), again.user.as_str()), ("app", "alice"));
    let (other_tenant, created) = log(&store, "t2").create("s1", "x", "y", 0).await;
    assert!(created, "ids are per tenant");
    assert_eq!(other_tenant.app, "x");
}

/// Appends number episodes 1, 2, 3 … per session, cursors grow across
/// sessions, and the session counts them.
async fn appends_number_episodes_densely<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    l.create("s2", "app", "alice", 0).await;
    let s1 = id("s1");
    let first = l
        .append(
            "s1",
            &[
                episode(&s1, "e1", "user_message", None, json!("hi")),
                episode(&s1, "e2", "agent_response", Some("bot"), json!("hello")),
            ],
        )
        .await;
    let s2 = id("s2");
    let other = l
        .append("s2", &[episode(&s2, "e3", "user_message", None, json!(1))])
        .await;
    let third = l
        .append(
            "s1",
            &[episode(&s1, "e4", "observation", None, json!({"x": 1}))],
        )
        .await;
    let seqs: Vec<i64> = first.iter().chain(&third).map(|(e, _)| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(other[0].0.seq, 1);
    let cursors: Vec<i64> = [&first[0], &first[1], &other[0], &third[0]]
        .iter()
        .map(|(e, _)| e.cursor)
        .collect();
    assert!(cursors.windows(2).all(|p| p[0] < p[1]), "{cursors:?}");
    assert_eq!(first[0].0.agent, "app", "the agent defaults to the app");
    assert_eq!(first[1].0.agent, "bot");
    let session = store
        .get_session(&l.tenant, &s1)
        .await
        .expect("get")
        .expect("session");
    assert_eq!((session.episode_count, session.last_seq), (3, 3));
    let listed = store
        .list_episodes(
            &l.tenant,
            &EpisodeQuery {
                session_id: &s1,
                types: &[],
                after_seq: 0,
                limit: 10,
            },
        )
        .await
        .expect("list");
    assert_eq!(
        listed.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        vec!["e1", "e2", "e4"]
    );
    assert_eq!(listed[2].content, json!({"x": 1}));
    let by_id = store
        .get_episode(&l.tenant, &id("e4"))
        .await
        .expect("get episode")
        .expect("stored");
    assert_eq!(
        (by_id.session_id.as_str(), by_id.seq, &by_id.content),
        ("s1", 3, &json!({"x": 1}))
    );
    let elsewhere = store
        .get_episode(&engram::context::Tenant::new("t2"), &id("e4"))
        .await
        .expect("get episode");
    assert!(elsewhere.is_none(), "another tenant does not see it");
}

/// An id appended again with the same content comes back as stored (a
/// replay, nothing written); with other content it is a conflict and the
/// whole append writes nothing.
async fn appends_replay_ids_and_refuse_reused_ones<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let first = l
        .append(
            "s1",
            &[episode(&s1, "e1", "user_message", None, json!("hi"))],
        )
        .await;
    let replay = l
        .append(
            "s1",
            &[
                episode(&s1, "e1", "user_message", None, json!("hi")),
                episode(&s1, "e2", "user_message", None, json!("next")),
            ],
        )
        .await;
    assert_eq!(replay[0], (first[0].0.clone(), true));
    assert_eq!((replay[1].0.seq, replay[1].1), (2, false));
    let conflict = l
        .append_as(
            "s1",
            &owner("app", "alice"),
            &[
                episode(&s1, "e3", "user_message", None, json!(3)),
                episode(&s1, "e1", "user_message", None, json!("changed")),
            ],
            0,
        )
        .await;
    assert_eq!(conflict, Appended::Conflict("e1".to_owned()));
    let session = store
        .get_session(&l.tenant, &s1)
        .await
        .expect("get")
        .expect("session");
    assert_eq!(session.last_seq, 2, "the refused append wrote nothing");

    // An append that creates its session and then finds one of its ids
    // stored with other content leaves no session behind.
    let s7 = id("s7");
    let clash = l
        .append_as(
            "s7",
            &owner("app", "alice"),
            &[episode(&s7, "e1", "user_message", None, json!("other"))],
            0,
        )
        .await;
    assert_eq!(clash, Appended::Conflict("e1".to_owned()));
    assert!(
        store
            .get_session(&l.tenant, &s7)
            .await
            .expect("get")
            .is_none(),
        "the session it created was rolled back"
    );
}

/// An append is refused for another owner and for an ended session, finds
/// no session without a complete owner, and creates one with it.
async fn appends_respect_owner_and_end<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let e = [episode(&s1, "e1", "user_message", None, json!(1))];
    match l.append_as("s1", &owner("app", "mallory"), &e, 0).await {
        Appended::Refused(session) => assert_eq!(session.user, "alice"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let partial = Owner {
        app: Some(name("app", "app")),
        user: None,
    };
    let s9 = id("s9");
    let e9 = [episode(&s9, "e9", "user_message", None, json!(1))];
    assert_eq!(
        l.append_as("s9", &partial, &e9, 0).await,
        Appended::NoSession
    );
    // One that may not create a session finds none, with a complete owner
    // too, and leaves none behind.
    let alice = owner("app", "alice");
    let existing_only = |episodes| Append {
        session_id: &s9,
        owner: &alice,
        episodes,
        now: now(),
        max_sessions: 0,
        max_events: 0,
        create: false,
    };
    assert_eq!(
        store
            .append(&l.tenant, &existing_only(&e9))
            .await
            .expect("append"),
        Appended::NoSession
    );
    assert!(
        store
            .get_session(&l.tenant, &s9)
            .await
            .expect("get")
            .is_none()
    );
    let created = l.append("s9", &e9).await;
    assert_eq!(created[0].0.seq, 1);
    let e10 = [episode(&s9, "e10", "user_message", None, json!(2))];
    match store
        .append(&l.tenant, &existing_only(&e10))
        .await
        .expect("append")
    {
        Appended::Stored(done) => assert_eq!(done[0].0.seq, 2),
        other => panic!("an existing session takes it, got {other:?}"),
    }
    let made = store
        .get_session(&l.tenant, &s9)
        .await
        .expect("get")
        .expect("created");
    assert_eq!((made.app.as_str(), made.user.as_str()), ("app", "alice"));

    let ended = store
        .end_session(&l.tenant, &s1, &Owner::default(), now(), false)
        .await
        .expect("end")
        .expect("ended");
    assert!(ended.0.end_time.is_some());
    match l.append_as("s1", &owner("app", "alice"), &e, 0).await {
        Appended::Refused(session) => assert!(session.end_time.is_some()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Past the per-session limit the oldest episodes go, and are counted.
async fn the_event_limit_evicts_the_oldest<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    for n in 0..5 {
        let e = [episode(
            &s1,
            &format!("e{n}"),
            "user_message",
            None,
            json!(n),
        )];
        match l.append_as("s1", &owner("app", "alice"), &e, 3).await {
            Appended::Stored(_) => {}
            other => panic!("{other:?}"),
        }
    }
    let kept = store
        .list_episodes(
            &l.tenant,
            &EpisodeQuery {
                session_id: &s1,
                types: &[],
                after_seq: 0,
                limit: 10,
            },
        )
        .await
        .expect("list");
    assert_eq!(
        kept.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    let evicted = store.get_episode(&l.tenant, &id("e0")).await;
    assert!(
        matches!(evicted, Ok(None)),
        "an evicted episode is gone: {evicted:?}"
    );
    let stats = store.session_stats(&l.tenant).await.expect("stats");
    assert_eq!((stats.total_episodes, stats.episodes_evicted), (3, 2));
}

/// At the session limit the oldest tenth (at least one) goes first.
async fn the_session_limit_evicts_the_oldest<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    for n in 0..3 {
        l.create(&format!("s{n}"), "app", "alice", 3).await;
    }
    let (_, created) = l.create("s3", "app", "alice", 3).await;
    assert!(created);
    assert!(
        store
            .get_session(&l.tenant, &id("s0"))
            .await
            .expect("get")
            .is_none()
    );
    let stats = store.session_stats(&l.tenant).await.expect("stats");
    assert_eq!((stats.total_sessions, stats.sessions_evicted), (3, 1));
}

/// Concurrent appends to one session: every `seq` once, 1..=n.
async fn racing_appends_keep_seq_dense<S: Store>(store: S, _db: &TestDb) {
    log(&store, "t1").create("s1", "app", "alice", 0).await;
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let l = log(&store, "t1");
                let s1 = id("s1");
                let mut seqs = Vec::new();
                for i in 0..5 {
                    let e = [episode(
                        &s1,
                        &format!("e{n}-{i}"),
                        "user_message",
                        None,
                        json!(i),
                    )];
                    seqs.extend(l.append("s1", &e).await.into_iter().map(|(e, _)| e.seq));
                }
                seqs
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for task in tasks {
        seqs.extend(task.await.expect("appender"));
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<i64>>());
}

/// Ending a session keeps its first end time and optionally its episodes;
/// deleting one checks the owner and takes the episodes with it.
async fn end_and_delete_check_the_owner<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append("s1", &[episode(&s1, "e1", "user_message", None, json!(1))])
        .await;
    assert!(
        store
            .end_session(&l.tenant, &s1, &owner("app", "bob"), now(), false)
            .await
            .expect("end")
            .is_none()
    );
    let (ended, deleted) = store
        .end_session(&l.tenant, &s1, &owner("app", "alice"), now(), true)
        .await
        .expect("end")
        .expect("ended");
    assert_eq!(deleted, 1);
    let first_end = ended.end_time;
    let (again, _) = store
        .end_session(&l.tenant, &s1, &Owner::default(), now(), false)
        .await
        .expect("end")
        .expect("ended");
    assert_eq!(again.end_time, first_end, "the first end time stays");
    assert_eq!(
        store
            .delete_session(&l.tenant, &s1, &owner("other", "alice"))
            .await
            .expect("delete"),
        None
    );
    l.create("s2", "app", "alice", 0).await;
    let s2 = id("s2");
    l.append(
        "s2",
        &[
            episode(&s2, "e2", "user_message", None, json!(1)),
            episode(&s2, "e3", "user_message", None, json!(2)),
        ],
    )
    .await;
    assert_eq!(
        store
            .delete_session(&l.tenant, &s2, &Owner::default())
            .await
            .expect("delete"),
        Some(2)
    );
    assert!(
        store
            .latest_episodes(&l.tenant, 10)
            .await
            .expect("latest")
            .is_empty()
    );
}

/// `Recent` widens from user to session to agent, matching each as a
/// column: `alice` never matches `aliceX`.
async fn recent_widens_by_columns<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    l.create("s2", "app", "alice", 0).await;
    l.create("sx", "app", "aliceX", 0).await;
    let (s1, s2, sx) = (id("s1"), id("s2"), id("sx"));
    l.append(
        "s1",
        &[
            episode(&s1, "a1", "user_message", None, json!(1)),
            episode(&s1, "a2", "tool_call", Some("tools"), json!(2)),
        ],
    )
    .await;
    l.append("s2", &[episode(&s2, "b1", "user_message", None, json!(3))])
        .await;
    match l
        .append_as(
            "sx",
            &owner("app", "aliceX"),
            &[episode(&sx, "x1", "user_message", None, json!(4))],
            0,
        )
        .await
    {
        Appended::Stored(_) => {}
        other => panic!("{other:?}"),
    }
    let recent = |session: Option<&str>, agent: Option<&str>, types: Vec<EpisodeType>| {
        fixtures::recent("alice", session, agent, types, 10)
    };
    let ids = |episodes: Vec<Episode>| episodes.into_iter().map(|e| e.id).collect::<Vec<_>>();
    let all = store
        .recent(&l.tenant, &recent(None, None, vec![]))
        .await
        .expect("recent");
    assert_eq!(ids(all), vec!["b1", "a2", "a1"], "newest first, no aliceX");
    let session = store
        .recent(&l.tenant, &recent(Some("s1"), None, vec![]))
        .await
        .expect("recent");
    assert_eq!(ids(session), vec!["a2", "a1"]);
    let agent = store
        .recent(&l.tenant, &recent(Some("s1"), Some("tools"), vec![]))
        .await
        .expect("recent");
    assert_eq!(ids(agent), vec!["a2"]);
    let typed = store
        .recent(
            &l.tenant,
            &recent(
                None,
                None,
                vec![EpisodeType::parse("type", "user_message").expect("type")],
            ),
        )
        .await
        .expect("recent");
    assert_eq!(ids(typed), vec!["b1", "a1"]);
}

/// A session's log pages by `seq` and filters by type.
async fn episode_lists_page_and_filter<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let kinds = ["user_message", "tool_call", "user_message", "error"];
    let episodes: Vec<NewEpisode> = kinds
        .iter()
        .enumerate()
        .map(|(n, kind)| episode(&s1, &format!("e{n}"), kind, None, json!(n)))
        .collect();
    l.append("s1", &episodes).await;
    let page = |after_seq, types: &[EpisodeType]| {
        let (store, tenant, types, s1) = (&store, l.tenant.clone(), types.to_vec(), s1.clone());
        async move {
            store
                .list_episodes(
                    &tenant,
                    &EpisodeQuery {
                        session_id: &s1,
                        types: &types,
                        after_seq,
                        limit: 2,
                    },
                )
                .await
                .expect("list")
                .into_iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(page(0, &[]).await, vec![1, 2]);
    assert_eq!(page(2, &[]).await, vec![3, 4]);
    let messages = [EpisodeType::parse("type", "user_message").expect("type")];
    assert_eq!(page(0, &messages).await, vec![1, 3]);
    assert_eq!(page(1, &messages).await, vec![3]);
}

/// The tail's read: after a cursor, up to a bound, by session, user, app
/// and type.
async fn tail_reads_filter_by_every_level<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    l.create("s2", "other", "bob", 0).await;
    let (s1, s2) = (id("s1"), id("s2"));
    let a = l
        .append(
            "s1",
            &[
                episode(&s1, "a1", "user_message", None, json!(1)),
                episode(&s1, "a2", "error", None, json!(2)),
            ],
        )
        .await;
    match l
        .append_as(
            "s2",
            &owner("other", "bob"),
            &[episode(&s2, "b1", "user_message", None, json!(3))],
            0,
        )
        .await
    {
        Appended::Stored(_) => {}
        other => panic!("{other:?}"),
    }
    let up_to = i64::MAX;
    let tail = |filter: TailFilter, after: i64| {
        let (store, tenant) = (&store, l.tenant.clone());
        async move {
            store
                .episodes_after(&tenant, &filter, after, up_to, 10)
                .await
                .expect("tail")
                .into_iter()
                .map(|e| e.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(tail(TailFilter::default(), 0).await, vec!["a1", "a2", "b1"]);
    assert_eq!(
        tail(TailFilter::default(), a[0].0.cursor).await,
        vec!["a2", "b1"]
    );
    let by_session = TailFilter {
        session_id: Some(s2.clone()),
        ..TailFilter::default()
    };
    assert_eq!(tail(by_session, 0).await, vec!["b1"]);
    let by_user = TailFilter {
        user: Some(name("user", "alice")),
        ..TailFilter::default()
    };
    assert_eq!(tail(by_user, 0).await, vec!["a1", "a2"]);
    let by_app = TailFilter {
        app: Some(name("app", "other")),
        ..TailFilter::default()
    };
    assert_eq!(tail(by_app, 0).await, vec!["b1"]);
    let errors = TailFilter {
        types: vec![EpisodeType::parse("type", "error").expect("type")],
        ..TailFilter::default()
    };
    assert_eq!(tail(errors, 0).await, vec!["a2"]);
    let bounded = store
        .episodes_after(&l.tenant, &TailFilter::default(), 0, a[1].0.cursor, 10)
        .await
        .expect("tail");
    assert_eq!(bounded.len(), 2, "nothing past up_to");
}

/// Sessions list newest first, page by (creation, id), filter by owner.
async fn session_lists_page_and_filter<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    for (n, user) in ["alice", "bob", "alice"].iter().enumerate() {
        l.create(&format!("s{n}"), "app", user, 0).await;
    }
    let all = store
        .list_sessions(&l.tenant, &SessionFilter::default(), None, 10)
        .await
        .expect("list");
    assert_eq!(all.len(), 3);
    assert!(
        all.windows(2)
            .all(|p| (p[0].create_time, &p[0].id) > (p[1].create_time, &p[1].id))
    );
    let first = store
        .list_sessions(&l.tenant, &SessionFilter::default(), None, 2)
        .await
        .expect("list");
    let last = &first[1];
    let rest = store
        .list_sessions(
            &l.tenant,
            &SessionFilter::default(),
            Some((last.create_time, last.id.as_str())),
            2,
        )
        .await
        .expect("list");
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id, all[2].id);
    let alice = SessionFilter {
        app: None,
        user: Some(name("user", "alice")),
    };
    let listed = store
        .list_sessions(&l.tenant, &alice, None, 10)
        .await
        .expect("list");
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|s| s.user == "alice"));

    // Each filter reads its own index: by user (and app), by app alone,
    // and pages within them. Ids rise with creation, so newest first is
    // the ids' reverse order, even where two share a creation time.
    let (s3, _) = l.create("s3", "other", "alice", 0).await;
    l.create("s4", "other", "carol", 0).await;
    let list = |filter: SessionFilter, before: Option<&engram::sessions::Session>| {
        let (store, tenant) = (&store, &l.tenant);
        let before = before.map(|s| (s.create_time, s.id.clone()));
        async move {
            store
                .list_sessions(
                    tenant,
                    &filter,
                    before.as_ref().map(|(time, id)| (*time, id.as_str())),
                    2,
                )
                .await
                .expect("list")
                .into_iter()
                .map(|s| s.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(alice.clone(), None).await, ["s3", "s2"]);
    assert_eq!(list(alice.clone(), Some(&s3)).await, ["s2", "s0"]);
    let alice_in_app = SessionFilter {
        app: Some(name("app", "app")),
        user: Some(name("user", "alice")),
    };
    assert_eq!(list(alice_in_app, None).await, ["s2", "s0"]);
    let other_app = SessionFilter {
        app: Some(name("app", "other")),
        user: None,
    };
    assert_eq!(list(other_app.clone(), None).await, ["s4", "s3"]);
    assert!(list(other_app, Some(&s3)).await.is_empty());
}

store_suite!(
    creating_a_taken_id_returns_the_stored_session,
    appends_number_episodes_densely,
    appends_replay_ids_and_refuse_reused_ones,
    appends_respect_owner_and_end,
    the_event_limit_evicts_the_oldest,
    the_session_limit_evicts_the_oldest,
    racing_appends_keep_seq_dense,
    end_and_delete_check_the_owner,
    recent_widens_by_columns,
    episode_lists_page_and_filter,
    tail_reads_filter_by_every_level,
    session_lists_page_and_filter,
);
