//! Working memory: the goal, tasks with dense ids and a limit, the content
//! cache within its limits, and counts of facts.

use chrono::{DateTime, Utc};
use engram::consolidation::ports::FactTx;
use engram::consolidation::{FactKind, FactPayload, Provenance};
use engram::context::Tenant;
use engram::ports::Store;
use engram::working::ports::{CachePut, NewTask};
use engram::working::{TaskChange, TaskStatus};
use serde_json::json;

use super::fixtures::{Log, now};
use crate::helpers::TestDb;

/// A task without a request id.
fn new_task<'a>(
    session_id: &'a str,
    subject: &'a str,
    now: DateTime<Utc>,
    max_tasks: i64,
) -> NewTask<'a> {
    NewTask {
        session_id,
        subject,
        description: "",
        now,
        max_tasks,
        request: None,
    }
}

/// Working memory belongs to a session: these exist first.
async fn sessions<S: Store>(store: &S, tenant: &Tenant, ids: &[&str]) {
    let log = Log {
        store,
        tenant: tenant.clone(),
    };
    for id in ids {
        log.create(id, "app", "alice", 0).await;
    }
}

/// A goal is one per session, replaced by the next; none reads as empty.
async fn a_goal_per_session<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    sessions(&store, &tenant, &["s1", "s2"]).await;
    assert_eq!(store.goal(&tenant, "s1").await.expect("goal"), "");
    store
        .set_goal(&tenant, "s1", "ship it", now())
        .await
        .expect("set");
    store
        .set_goal(&tenant, "s1", "ship it well", now())
        .await
        .expect("set");
    assert_eq!(
        store.goal(&tenant, "s1").await.expect("goal"),
        "ship it well"
    );
    assert_eq!(store.goal(&tenant, "s2").await.expect("goal"), "");
    assert_eq!(
        store.goal(&Tenant::new("t2"), "s1").await.expect("goal"),
        ""
    );
}

/// Task ids are t1, t2 … per session; at the limit nothing is written;
/// updates change only what they name.
async fn tasks_are_numbered_and_limited<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    sessions(&store, &tenant, &["s1", "s2"]).await;
    for n in 1..=3 {
        let task = store
            .create_task(&tenant, &new_task("s1", &format!("task {n}"), now(), 3))
            .await
            .expect("create")
            .expect("under the limit");
        assert_eq!(
            (task.id.as_str(), task.status),
            (format!("t{n}").as_str(), TaskStatus::Pending)
        );
    }
    assert_eq!(
        store
            .create_task(&tenant, &new_task("s1", "one more", now(), 3))
            .await
            .expect("create"),
        None
    );
    let other = store
        .create_task(&tenant, &new_task("s2", "elsewhere", now(), 3))
        .await
        .expect("create")
        .expect("task");
    assert_eq!(other.id, "t1");
    let change = TaskChange {
        status: Some(TaskStatus::Completed),
        subject: None,
        description: Some("done".to_owned()),
    };
    let updated = store
        .update_task(&tenant, "s1", 2, &change, now())
        .await
        .expect("update")
        .expect("t2");
    assert_eq!(
        (
            updated.subject.as_str(),
            updated.description.as_str(),
            updated.status
        ),
        ("task 2", "done", TaskStatus::Completed)
    );
    assert_eq!(
        store
            .update_task(&tenant, "s1", 9, &change, now())
            .await
            .expect("update"),
        None
    );
    let listed: Vec<(String, TaskStatus)> = store
        .list_tasks(&tenant, "s1", 0, 100)
        .await
        .expect("list")
        .into_iter()
        .map(|t| (t.id, t.status))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("t1".to_owned(), TaskStatus::Pending),
            ("t2".to_owned(), TaskStatus::Completed),
            ("t3".to_owned(), TaskStatus::Pending)
        ]
    );
    // After a task, at most a limit.
    let page: Vec<String> = store
        .list_tasks(&tenant, "s1", 1, 1)
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(page, ["t2"]);
}

/// Racing creators of one session's tasks get distinct, dense ids.
async fn racing_task_creators_get_dense_ids<S: Store>(store: S, _db: &TestDb) {
    sessions(&store, &Tenant::new("t1"), &["s1"]).await;
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .create_task(
                        &Tenant::new("t1"),
                        &new_task("s1", &format!("task {n}"), now(), 0),
                    )
                    .await
                    .expect("create")
                    .expect("no limit")
                    .id
            })
        })
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("creator"));
    }
    ids.sort_by_key(|id| id[1..].parse::<i64>().expect("number"));
    assert_eq!(ids, (1..=8).map(|n| format!("t{n}")).collect::<Vec<_>>());
}

/// The cache keeps the newest entries within both limits, evicting the
/// least recently cached first, and rewriting a path refreshes it.
async fn the_cache_evicts_the_least_recent<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    sessions(&store, &tenant, &["s1", "s2"]).await;
    let put = |path: &'static str, content: &'static str| CachePut {
        session_id: "s1",
        path,
        content,
        now: now(),
        max_files: 3,
        max_bytes: 10,
    };
    for (path, content) in [("a", "aaa"), ("b", "bbb"), ("c", "ccc")] {
        let (_, evicted) = store
            .cache_content(&tenant, &put(path, content))
            .await
            .expect("cache");
        assert!(evicted.is_empty());
    }
    // Refresh a, then d needs room: b is the least recently cached.
    store
        .cache_content(&tenant, &put("a", "aaa"))
        .await
        .expect("cache");
    let (file, evicted) = store
        .cache_content(&tenant, &put("d", "d"))
        .await
        .expect("cache");
    assert_eq!((file.path.as_str(), file.bytes), ("d", 1));
    assert_eq!(evicted, vec!["b"]);
    // Over the byte limit: the oldest go until it fits.
    let (_, evicted) = store
        .cache_content(&tenant, &put("e", "eeeeeeee"))
        .await
        .expect("cache");
    assert_eq!(evicted, vec!["c", "a"]);
    let listed: Vec<(String, i64)> = store
        .list_cache(&tenant, "s1")
        .await
        .expect("list")
        .into_iter()
        .map(|f| (f.path, f.bytes))
        .collect();
    assert_eq!(listed, vec![("d".to_owned(), 1), ("e".to_owned(), 8)]);
    // A newer entry that does not fit takes every older one with it: d,
    // small enough to fit beside f, is older than e and goes first.
    let (_, evicted) = store
        .cache_content(&tenant, &put("f", "fff"))
        .await
        .expect("cache");
    assert_eq!(evicted, vec!["d", "e"]);
    assert!(
        store
            .list_cache(&tenant, "s2")
            .await
            .expect("list")
            .is_empty()
    );
}

/// Counts of an owner's live facts, by kind.
async fn facts_are_counted_by_owner_and_kind<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let mut tx = store.begin(&tenant).await.expect("begin");
    for (n, kind) in [FactKind::Semantic, FactKind::Semantic, FactKind::Procedural]
        .into_iter()
        .enumerate()
    {
        let payload = FactPayload {
            app: "app".to_owned(),
            user: "alice".to_owned(),
            kind,
            subject: format!("s{n}"),
            predicate: "p".to_owned(),
            object: "o".to_owned(),
            content: json!("c"),
            channels: Vec::new(),
        };
        let provenance = Provenance {
            source_episode_ids: Vec::new(),
            promotion_ts: now(),
            rule_id: "remember".to_owned(),
            confidence: 1.0,
        };
        tx.insert_fact(&tenant, &format!("f{n}"), &payload, &provenance, now())
            .await
            .expect("insert");
    }
    tx.write_version(
        &tenant,
        "f1",
        None,
        &Provenance {
            source_episode_ids: Vec::new(),
            promotion_ts: now(),
            rule_id: "delete".to_owned(),
            confidence: 1.0,
        },
        now(),
    )
    .await
    .expect("delete");
    tx.commit().await.expect("commit");
    let mut tx = store.begin(&tenant).await.expect("begin");
    for (user, kind, count) in [
        ("alice", FactKind::Semantic, 1),
        ("alice", FactKind::Procedural, 1),
        ("bob", FactKind::Semantic, 0),
    ] {
        assert_eq!(
            tx.count_owned_facts(&tenant, ("app", user), kind)
                .await
                .expect("count"),
            count,
            "{user} {kind:?}"
        );
    }
}

/// Working memory is a session's activity too: `CleanupSessions` leaves a
/// session whose goal, tasks or cache were written since its cutoff, and
/// takes one whose working memory is as old as the rest of it.
async fn working_memory_keeps_a_session_from_cleanup<S: Store>(store: S, _db: &TestDb) {
    use engram::sessions::Id;
    let tenant = Tenant::new("t1");
    let ids = ["bare", "cached", "goal", "stale", "task"];
    sessions(&store, &tenant, &ids).await;
    let (then, cutoff) = (now(), now() + chrono::Duration::hours(1));
    let since = cutoff + chrono::Duration::seconds(1);
    store
        .set_goal(&tenant, "stale", "old news", then)
        .await
        .expect("set");
    store
        .set_goal(&tenant, "goal", "ship it", since)
        .await
        .expect("set");
    let task = store
        .create_task(&tenant, &new_task("task", "a task", then, 0))
        .await
        .expect("create")
        .expect("no limit");
    let started = TaskChange {
        status: Some(TaskStatus::InProgress),
        ..TaskChange::default()
    };
    let number = task.id.trim_start_matches('t').parse().expect("number");
    store
        .update_task(&tenant, "task", number, &started, since)
        .await
        .expect("update")
        .expect("the task");
    let put = CachePut {
        session_id: "cached",
        path: "notes.md",
        content: "hello",
        now: since,
        max_files: 0,
        max_bytes: 0,
    };
    store.cache_content(&tenant, &put).await.expect("cache");

    assert_eq!(
        store
            .cleanup_sessions(&tenant, cutoff, true)
            .await
            .expect("dry run"),
        2
    );
    assert_eq!(
        store
            .cleanup_sessions(&tenant, cutoff, false)
            .await
            .expect("cleanup"),
        2
    );
    for id in ids {
        let kept = store
            .get_session(&tenant, &Id::parse("id", id).expect("id"))
            .await
            .expect("get")
            .is_some();
        assert_eq!(kept, !matches!(id, "bare" | "stale"), "{id}");
    }
}

store_suite!(
    working_memory_keeps_a_session_from_cleanup,
    a_goal_per_session,
    tasks_are_numbered_and_limited,
    racing_task_creators_get_dense_ids,
    the_cache_evicts_the_least_recent,
    facts_are_counted_by_owner_and_kind,
);
