//! Rules and facts: the rule records, the run's primitives (lock, episodes
//! after a watermark, advance), fact versions with lineage, and
//! transactions that commit or roll back as one.

use engram::consolidation::ports::{FactFilter, FactTx, Locked, RuleCreation, RuleTx, RunLock};
use engram::consolidation::{Cadence, FactKind, FactPayload, Provenance, Rule};
use engram::context::Tenant;
use engram::memory::ports::RequestStamp;
use engram::ports::Store;
use engram::sessions::NewEpisode;
use serde_json::json;

use super::fixtures::{self, Log, now};
use crate::helpers::{Backend, TestDb};

fn rule(id: &str) -> Rule {
    Rule {
        id: id.to_owned(),
        filter: "type == \"user_message\"".to_owned(),
        cadence: Cadence::EveryNEpisodes(10),
        then_emits: vec!["facts".to_owned()],
        kind: FactKind::Semantic,
        confidence: 0.5,
        enabled: true,
        watermark: 0,
        episodes_promoted: 0,
        create_time: now(),
        last_run_time: None,
    }
}

pub(super) fn payload(subject: &str, object: &str) -> FactPayload {
    FactPayload {
        app: "app".to_owned(),
        user: "alice".to_owned(),
        kind: FactKind::Semantic,
        subject: subject.to_owned(),
        predicate: "likes".to_owned(),
        object: object.to_owned(),
        content: json!({"text": format!("{subject} likes {object}")}),
        channels: vec!["facts".to_owned()],
    }
}

pub(super) fn provenance(episodes: &[&str]) -> Provenance {
    Provenance {
        source_episode_ids: episodes.iter().map(|e| (*e).to_owned()).collect(),
        promotion_ts: now(),
        rule_id: "r1".to_owned(),
        confidence: 0.9,
    }
}

/// Stores a fact in its own transaction and returns its id.
pub(super) async fn insert<S: Store>(
    store: &S,
    tenant: &Tenant,
    payload: &FactPayload,
    from: &[&str],
) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let mut tx = store.begin(tenant).await.expect("begin");
    tx.insert_fact(tenant, &id, payload, &provenance(from), now())
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    id
}

/// A rule created with a request id: its repeat (same id, same
/// fingerprint) finds the rule as it is now, and writes nothing; the
/// request id under another fingerprint (another rule) is refused; another
/// request, keyed or not, finds the id taken; a deleted rule is created
/// again.
async fn keyed_rules_are_repeated_once<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let stamp = |id, byte| RequestStamp {
        id,
        fingerprint: [byte; 32],
    };
    let first = rule("r1");
    let created = store
        .create_rule(&tenant, &first, Some(stamp("req-1", 1)))
        .await
        .expect("create");
    assert_eq!(created, RuleCreation::Created);
    let mut later = rule("r1");
    later.create_time = now() + chrono::Duration::seconds(5);
    match store
        .create_rule(&tenant, &later, Some(stamp("req-1", 1)))
        .await
        .expect("repeat")
    {
        RuleCreation::Repeated(found) => assert_eq!(found, first),
        other => panic!("a repeat answered {other:?}"),
    }
    let err = store
        .create_rule(&tenant, &first, Some(stamp("req-1", 2)))
        .await
        .expect_err("another fingerprint");
    assert!(err.to_string().contains("req-1"), "{err}");
    for request in [Some(stamp("req-2", 1)), None] {
        let taken = store
            .create_rule(&tenant, &first, request)
            .await
            .expect("taken");
        assert_eq!(taken, RuleCreation::Taken, "{request:?}");
    }
    // A rule made unkeyed is taken for any request id.
    store
        .create_rule(&tenant, &rule("r2"), None)
        .await
        .expect("unkeyed");
    let taken = store
        .create_rule(&tenant, &rule("r2"), Some(stamp("req-3", 1)))
        .await
        .expect("taken");
    assert_eq!(taken, RuleCreation::Taken);
    // The request id names one rule in its tenant: another rule under it
    // (the service's fingerprint covers the rule's id) is refused.
    store
        .create_rule(&tenant, &rule("r9"), Some(stamp("req-1", 9)))
        .await
        .expect_err("another rule under req-1");
    assert_eq!(
        store.get_rule(&tenant, "r9").await.expect("get"),
        None,
        "nothing written"
    );
    // Request ids are the tenant's own.
    let elsewhere = store
        .create_rule(&Tenant::new("t2"), &first, Some(stamp("req-1", 2)))
        .await
        .expect("another tenant");
    assert_eq!(elsewhere, RuleCreation::Created);
    assert!(store.delete_rule(&tenant, "r1").await.expect("delete"));
    let again = store
        .create_rule(&tenant, &first, Some(stamp("req-1", 1)))
        .await
        .expect("after the delete");
    assert_eq!(again, RuleCreation::Created);
}

/// Rules are stored once per id and tenant, read, listed in id order and
/// deleted; the scheduler sees every tenant's enabled ones.
async fn rules_are_stored_listed_and_deleted<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let create = |tenant: &str, rule: Rule| {
        let (store, tenant) = (&store, Tenant::new(tenant));
        async move {
            store
                .create_rule(&tenant, &rule, None)
                .await
                .expect("create")
        }
    };
    assert_eq!(create("t1", rule("r2")).await, RuleCreation::Created);
    assert_eq!(create("t1", rule("r1")).await, RuleCreation::Created);
    assert_eq!(create("t1", rule("r1")).await, RuleCreation::Taken);
    let mut off = rule("r3");
    off.enabled = false;
    off.cadence = Cadence::Cron("0 * * * *".to_owned());
    assert_eq!(create("t1", off.clone()).await, RuleCreation::Created);
    assert_eq!(create("t2", rule("r1")).await, RuleCreation::Created);

    let read = store
        .get_rule(&tenant, "r3")
        .await
        .expect("get")
        .expect("r3");
    assert_eq!(read, off);
    let listed: Vec<String> = store
        .list_rules(&tenant, None, 10)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, vec!["r1", "r2", "r3"]);
    let after: Vec<String> = store
        .list_rules(&tenant, Some("r1"), 1)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(after, vec!["r2"]);
    let enabled: Vec<(String, String)> = store
        .enabled_rules()
        .await
        .expect("enabled")
        .into_iter()
        .map(|(t, r)| (t.as_str().to_owned(), r.id))
        .collect();
    assert_eq!(
        enabled,
        vec![
            ("t1".to_owned(), "r1".to_owned()),
            ("t1".to_owned(), "r2".to_owned()),
            ("t2".to_owned(), "r1".to_owned())
        ]
    );
    assert!(store.delete_rule(&tenant, "r2").await.expect("delete"));
    assert!(
        !store
            .delete_rule(&tenant, "r2")
            .await
            .expect("delete again")
    );
    assert_eq!(store.get_rule(&tenant, "r2").await.expect("get"), None);
}

async fn append_episodes<S: Store>(store: &S, tenant: &Tenant, n: usize) -> Vec<i64> {
    let log = Log {
        store,
        tenant: tenant.clone(),
    };
    log.create("s1", "app", "alice", 0).await;
    let session = fixtures::id("s1");
    let episodes: Vec<NewEpisode> = (0..n)
        .map(|i| fixtures::episode(&session, None, None, None, json!(i)))
        .collect();
    let appended = log.append("s1", &episodes).await;
    appended.into_iter().map(|(e, _)| e.cursor).collect()
}

/// A run locks its rule, reads the episodes after the watermark up to a
/// bound, and moves the watermark in the same transaction; a rolled-back
/// run moves nothing.
async fn a_run_moves_the_watermark_once<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    store
        .create_rule(&tenant, &rule("r1"), None)
        .await
        .expect("create");
    let cursors = append_episodes(&store, &tenant, 5).await;

    let mut tx = store.begin(&tenant).await.expect("begin");
    assert_eq!(
        tx.lock_rule(&tenant, "nope", RunLock::Wait)
            .await
            .expect("lock"),
        Locked::Missing
    );
    let Locked::Rule(locked) = tx
        .lock_rule(&tenant, "r1", RunLock::Wait)
        .await
        .expect("lock")
    else {
        panic!("expected the rule");
    };
    assert_eq!(locked.watermark, 0);
    let read = tx
        .episodes(&tenant, 0, cursors[2], 10)
        .await
        .expect("episodes");
    assert_eq!(
        read.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        cursors[..3]
    );
    let limited = tx
        .episodes(&tenant, 0, i64::MAX, 2)
        .await
        .expect("episodes");
    assert_eq!(limited.len(), 2);
    tx.advance(&tenant, "r1", cursors[2], 3, now())
        .await
        .expect("advance");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        store
            .get_rule(&tenant, "r1")
            .await
            .expect("get")
            .expect("r1")
            .watermark,
        0
    );

    let mut tx = store.begin(&tenant).await.expect("begin");
    let Locked::Rule(_) = tx
        .lock_rule(&tenant, "r1", RunLock::Wait)
        .await
        .expect("lock")
    else {
        panic!("expected the rule");
    };
    tx.advance(&tenant, "r1", cursors[2], 3, now())
        .await
        .expect("advance");
    tx.commit().await.expect("commit");
    let after = store
        .get_rule(&tenant, "r1")
        .await
        .expect("get")
        .expect("r1");
    assert_eq!((after.watermark, after.episodes_promoted), (cursors[2], 3));
    assert!(after.last_run_time.is_some());
    assert_eq!(
        store
            .pending_episodes(&tenant, after.watermark, i64::MAX, 10)
            .await
            .expect("pending"),
        2
    );
    assert_eq!(
        store
            .pending_episodes(&tenant, after.watermark, i64::MAX, 1)
            .await
            .expect("pending"),
        1
    );
    // Another tenant's episodes are not this tenant's to run.
    let other = Tenant::new("t2");
    let mut tx = store.begin(&other).await.expect("begin");
    assert!(
        tx.episodes(&other, 0, i64::MAX, 10)
            .await
            .expect("episodes")
            .is_empty()
    );
    tx.rollback().await.expect("rollback");
}

/// On Postgres a second run of the same rule either waits or (the
/// scheduler's try-lock) gives up: exactly one run at a time. SQLite's one
/// writer makes the second transaction wait to begin at all.
async fn one_run_of_a_rule_at_a_time<S: Store>(store: S, db: &TestDb) {
    let tenant = Tenant::new("t1");
    store
        .create_rule(&tenant, &rule("r1"), None)
        .await
        .expect("create");
    if db.backend == Backend::Sqlite {
        return;
    }
    let mut first = store.begin(&tenant).await.expect("begin");
    assert!(matches!(
        first
            .lock_rule(&tenant, "r1", RunLock::Try)
            .await
            .expect("lock"),
        Locked::Rule(_)
    ));
    let mut second = store.begin(&tenant).await.expect("begin");
    assert_eq!(
        second
            .lock_rule(&tenant, "r1", RunLock::Try)
            .await
            .expect("lock"),
        Locked::Busy
    );
    second.rollback().await.expect("rollback");
    first.commit().await.expect("commit");
    let mut third = store.begin(&tenant).await.expect("begin");
    assert!(matches!(
        third
            .lock_rule(&tenant, "r1", RunLock::Try)
            .await
            .expect("lock"),
        Locked::Rule(_)
    ));
    third.rollback().await.expect("rollback");
}

/// Facts are versioned: an update supersedes, a delete tombstones, every
/// version keeps its lineage, and a fact is found by its id or by an
/// episode it came from.
async fn facts_keep_versions_and_lineage<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let id = insert(&store, &tenant, &payload("alice", "tea"), &["ep-1"]).await;
    let mut tx = store.begin(&tenant).await.expect("begin");
    assert_eq!(
        tx.resolve(&tenant, "app", "alice", &["ep-1".to_owned()])
            .await
            .expect("resolve"),
        vec![id.clone()]
    );
    assert_eq!(
        tx.resolve(&tenant, "app", "alice", &[id.clone(), "unknown".to_owned()])
            .await
            .expect("resolve"),
        vec![id.clone()]
    );
    assert!(
        tx.resolve(&tenant, "app", "bob", std::slice::from_ref(&id))
            .await
            .expect("resolve")
            .is_empty()
    );
    tx.write_version(
        &tenant,
        &id,
        Some(&payload("alice", "coffee")),
        &provenance(&["ep-2"]),
        now(),
    )
    .await
    .expect("update");
    assert!(tx.lock_live_fact(&tenant, &id).await.expect("lock"));
    tx.write_version(&tenant, &id, None, &provenance(&[]), now())
        .await
        .expect("delete");
    assert!(!tx.lock_live_fact(&tenant, &id).await.expect("lock"));
    let fact = tx
        .fact(&tenant, &id)
        .await
        .expect("fact")
        .expect("the fact");
    assert!(fact.current.deleted);
    tx.commit().await.expect("commit");

    let (fact, versions) = store
        .get_fact(&tenant, &id, 0, 1000)
        .await
        .expect("get")
        .expect("fact");
    assert_eq!(fact.current.version, 3);
    let shape: Vec<(i64, bool, &str)> = versions
        .iter()
        .map(|v| (v.version, v.deleted, v.object.as_str()))
        .collect();
    assert_eq!(
        shape,
        vec![(1, false, "tea"), (2, false, "coffee"), (3, true, "")]
    );
    assert_eq!(versions[0].source_episode_ids, vec!["ep-1"]);
    assert_eq!(versions[1].source_episode_ids, vec!["ep-2"]);
    assert_eq!(versions[1].content, json!({"text": "alice likes coffee"}));
    assert_eq!(versions[0].source, "r1");
    assert_eq!(
        store
            .get_fact(&Tenant::new("t2"), &id, 0, 1000)
            .await
            .expect("get"),
        None
    );
    // A page of versions: the fact at its newest version on each.
    let page = |after, limit| {
        let (store, tenant, id) = (&store, &tenant, &id);
        async move {
            let (fact, versions) = store
                .get_fact(tenant, id, after, limit)
                .await
                .expect("get")
                .expect("fact");
            let numbers: Vec<i64> = versions.iter().map(|v| v.version).collect();
            (fact.current.version, numbers)
        }
    };
    assert_eq!(page(1, 1).await, (3, vec![2]));
    assert_eq!(page(1, 5).await, (3, vec![2, 3]));
    assert_eq!(page(3, 5).await, (3, vec![]));
    assert_eq!(page(0, 0).await, (3, vec![]));
}

/// The newest live fact of each (app, user, subject, predicate) key.
async fn live_facts_are_the_newest_per_key<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let _older = insert(&store, &tenant, &payload("alice", "tea"), &[]).await;
    let newer = insert(&store, &tenant, &payload("alice", "coffee"), &[]).await;
    let bob = insert(&store, &tenant, &payload("bob", "water"), &[]).await;
    let mut tx = store.begin(&tenant).await.expect("begin");
    let key = |subject: &str| {
        (
            "app".to_owned(),
            "alice".to_owned(),
            subject.to_owned(),
            "likes".to_owned(),
        )
    };
    let live = tx
        .live_facts(&tenant, &[key("alice"), key("bob"), key("carol")])
        .await
        .expect("live");
    assert_eq!(live.len(), 2);
    assert_eq!(live.get(&key("alice")), Some(&newer));
    assert_eq!(live.get(&key("bob")), Some(&bob));
    assert!(tx.live_facts(&tenant, &[]).await.expect("live").is_empty());
    tx.rollback().await.expect("rollback");
}

/// Live facts list in id order (or newest first), by owner and kind.
async fn fact_lists_filter_and_page<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let a = insert(&store, &tenant, &payload("a", "1"), &[]).await;
    let b = insert(&store, &tenant, &payload("b", "2"), &[]).await;
    let mut procedural = payload("deploys", "blue-green");
    procedural.kind = FactKind::Procedural;
    procedural.user = String::new();
    let c = insert(&store, &tenant, &procedural, &[]).await;
    let ids = |facts: Vec<engram::consolidation::Fact>| {
        facts.into_iter().map(|f| f.id).collect::<Vec<_>>()
    };
    let all = store
        .list_facts(&tenant, &FactFilter::default(), None, 10)
        .await
        .expect("list");
    assert_eq!(ids(all), vec![a.clone(), b.clone(), c.clone()]);
    let newest = FactFilter {
        newest_first: true,
        ..FactFilter::default()
    };
    assert_eq!(
        ids(store
            .list_facts(&tenant, &newest, None, 2)
            .await
            .expect("list")),
        vec![c.clone(), b.clone()]
    );
    assert_eq!(
        ids(store
            .list_facts(&tenant, &newest, Some(&b), 2)
            .await
            .expect("list")),
        vec![a.clone()]
    );
    let semantic = FactFilter {
        kind: Some(FactKind::Semantic),
        user: Some("alice".to_owned()),
        ..FactFilter::default()
    };
    assert_eq!(
        ids(store
            .list_facts(&tenant, &semantic, None, 10)
            .await
            .expect("list")),
        vec![a.clone(), b.clone()]
    );
    let app_wide = FactFilter {
        user: Some(String::new()),
        ..FactFilter::default()
    };
    assert_eq!(
        ids(store
            .list_facts(&tenant, &app_wide, Some(&a), 10)
            .await
            .expect("list")),
        vec![c]
    );

    // By app and user together (read from `facts_owner_id`), among other
    // owners' facts, in both orders and across pages.
    let other = Tenant::new("t2");
    let mut owned = Vec::new();
    for n in 0..5 {
        owned.push(insert(&store, &other, &payload(&format!("s{n}"), "x"), &[]).await);
        let mut bob = payload(&format!("b{n}"), "y");
        bob.user = "bob".to_owned();
        insert(&store, &other, &bob, &[]).await;
        let mut elsewhere = payload(&format!("e{n}"), "z");
        elsewhere.app = "other".to_owned();
        insert(&store, &other, &elsewhere, &[]).await;
    }
    let alice = || FactFilter {
        app: Some("app".to_owned()),
        user: Some("alice".to_owned()),
        ..FactFilter::default()
    };
    let list = |filter: FactFilter, after: Option<String>, limit: i64| {
        let (store, other) = (&store, &other);
        async move {
            ids(store
                .list_facts(other, &filter, after.as_deref(), limit)
                .await
                .expect("list"))
        }
    };
    assert_eq!(list(alice(), None, 3).await, owned[..3]);
    assert_eq!(list(alice(), Some(owned[2].clone()), 3).await, owned[3..]);
    let newest = || FactFilter {
        newest_first: true,
        ..alice()
    };
    assert_eq!(
        list(newest(), None, 2).await,
        [owned[4].clone(), owned[3].clone()]
    );
    assert_eq!(
        list(newest(), Some(owned[3].clone()), 10).await,
        [owned[2].clone(), owned[1].clone(), owned[0].clone()]
    );
    let semantic = FactFilter {
        kind: Some(FactKind::Semantic),
        ..alice()
    };
    assert_eq!(list(semantic, None, 10).await, owned);
    let procedural = FactFilter {
        kind: Some(FactKind::Procedural),
        ..alice()
    };
    assert!(list(procedural, None, 10).await.is_empty());
}

/// Nothing of a rolled-back transaction remains.
async fn a_rolled_back_apply_leaves_nothing<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let id = uuid::Uuid::now_v7().to_string();
    let mut tx = store.begin(&tenant).await.expect("begin");
    tx.insert_fact(
        &tenant,
        &id,
        &payload("alice", "tea"),
        &provenance(&["ep-1"]),
        now(),
    )
    .await
    .expect("insert");
    assert!(
        tx.fact(&tenant, &id).await.expect("fact").is_some(),
        "visible inside"
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(
        store.get_fact(&tenant, &id, 0, 1000).await.expect("get"),
        None
    );
    let mut tx = store.begin(&tenant).await.expect("begin");
    assert!(
        tx.resolve(&tenant, "app", "alice", &["ep-1".to_owned()])
            .await
            .expect("resolve")
            .is_empty()
    );
    // Dropped without a commit: rolled back too.
    tx.insert_fact(
        &tenant,
        &id,
        &payload("alice", "tea"),
        &provenance(&[]),
        now(),
    )
    .await
    .expect("insert");
    drop(tx);
    assert_eq!(
        store.get_fact(&tenant, &id, 0, 1000).await.expect("get"),
        None
    );
}

store_suite!(
    rules_are_stored_listed_and_deleted,
    keyed_rules_are_repeated_once,
    a_run_moves_the_watermark_once,
    one_run_of_a_rule_at_a_time,
    facts_keep_versions_and_lineage,
    live_facts_are_the_newest_per_key,
    fact_lists_filter_and_page,
    a_rolled_back_apply_leaves_nothing,
);
