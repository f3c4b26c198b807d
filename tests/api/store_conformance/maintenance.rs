//! Memory beyond plain reads and writes: dense versions under racing
//! writers, purge, compaction and its fence, the change feed and its
//! pruning, the execution registry and reindexing.

use chrono::Utc;
use engram::context::Tenant;
use engram::memory::audit::{AuditRecord, Operation};
use engram::memory::ports::{Compacted, Fence, Mutation, Purge, ScopeFilter, Write, Written};
use engram::memory::{ChangeKind, KeyPrefix, Provenance, ScopeType};
use engram::ports::{Feed, Store};
use serde_json::json;

use super::{key, scope, value, writer};
use crate::helpers::TestDb;

/// Sixteen writers race on one key: versions 1..=160, each once.
async fn racing_writers_get_dense_versions<S: Store>(store: S, _db: &TestDb) {
    let tasks: Vec<_> = (0..16)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let w = writer(&store, "t1");
                let mut versions = Vec::new();
                for i in 0..10 {
                    versions.push(w.set("hot", json!({"writer": n, "i": i})).await.version);
                }
                versions
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("writer"));
    }
    all.sort_unstable();
    assert_eq!(all, (1..=160).collect::<Vec<i64>>());
    let w = writer(&store, "t1");
    let history = store
        .history(&w.tenant, &w.scope, &key("hot"), 1, 1000)
        .await
        .expect("history");
    assert_eq!(history.len(), 160);
    assert!(history.windows(2).all(|p| p[1].version == p[0].version + 1));
}

fn purge_record<'a>(purge: &Purge<'a>) -> AuditRecord {
    AuditRecord::new(Operation::Purge, purge.scope, Utc::now())
}

/// A purge keeps the newest `keep` versions, records what it did in the
/// audit trail and the change feed; a dry run only counts.
async fn purge_keeps_the_newest_and_audits<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    for i in 0..5 {
        w.set("k", json!(i)).await;
    }
    let k = key("k");
    let purge = Purge::keeping(&w.scope, Some(&k), Some(2), false, true);
    let dry = store
        .purge(&w.tenant, &purge, purge_record(&purge))
        .await
        .expect("dry run");
    assert_eq!((dry.versions_deleted, dry.keys_affected), (3, 1));
    assert!(dry.record.is_none(), "a dry run writes no record");
    assert_eq!(
        store
            .history(&w.tenant, &w.scope, &k, 1, 10)
            .await
            .expect("history")
            .len(),
        5
    );

    let purge = Purge {
        dry_run: false,
        ..purge
    };
    let done = store
        .purge(&w.tenant, &purge, purge_record(&purge))
        .await
        .expect("purge");
    assert_eq!((done.versions_deleted, done.keys_affected), (3, 1));
    let record = done.record.expect("a record");
    assert_eq!(record.source_keys, vec!["k".to_owned()]);
    assert_eq!((record.versions_deleted, record.keep), (3, Some(2)));
    let left: Vec<i64> = store
        .history(&w.tenant, &w.scope, &k, 1, 10)
        .await
        .expect("history")
        .iter()
        .map(|e| e.version)
        .collect();
    assert_eq!(left, vec![4, 5]);
    // The audit key holds the record; the feed says what was purged.
    let audit = store
        .get(&w.tenant, &w.scope, &record.key(), None)
        .await
        .expect("get")
        .expect("the audit record");
    assert_eq!(
        AuditRecord::from_entry(&audit.key, audit.value.as_ref().expect("value"))
            .expect("record")
            .versions_deleted,
        3
    );
    let changes = store
        .changes(&w.tenant, &w.scope, &KeyPrefix::default(), 0, i64::MAX, 100)
        .await
        .expect("changes")
        .changes;
    let purged = changes
        .iter()
        .find(|c| c.kind == ChangeKind::Purge)
        .expect("a purge change");
    assert_eq!(
        (purged.key.as_str(), purged.version, purged.versions_deleted),
        ("k", 3, 3)
    );

    // Nothing to delete: no record.
    let again = store
        .purge(&w.tenant, &purge, purge_record(&purge))
        .await
        .expect("purge again");
    assert_eq!((again.versions_deleted, again.record), (0, None));
}

/// Purging every version removes the key: it reads as absent and starts
/// again at version 1. The keys beside it, before and after it in key
/// order, keep every version.
async fn purge_all_versions_removes_the_key<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    for neighbour in ["a", "k", "k2", "z"] {
        w.set(neighbour, json!(1)).await;
        w.set(neighbour, json!(2)).await;
    }
    let k = key("k");
    let purge = Purge::keeping(&w.scope, Some(&k), None, false, false);
    let done = store
        .purge(&w.tenant, &purge, purge_record(&purge))
        .await
        .expect("purge");
    assert_eq!(done.versions_deleted, 2);
    assert_eq!(
        store.head(&w.tenant, &w.scope, &k).await.expect("head"),
        None
    );
    assert_eq!(
        store.get(&w.tenant, &w.scope, &k, None).await.expect("get"),
        None
    );
    assert_eq!(w.set("k", json!(3)).await.version, 1);
    for neighbour in ["a", "k2", "z"] {
        let versions = store
            .history(&w.tenant, &w.scope, &key(neighbour), 1, 10)
            .await
            .expect("history");
        assert_eq!(versions.len(), 2, "{neighbour} keeps its versions");
    }
}

/// A scope purge reaches live keys, tombstoned ones only when asked, and
/// never the audit trail.
async fn purge_scope_spares_tombstones_and_the_audit_trail<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    for name in ["a", "b", "dead", "_compaction/old"] {
        w.set(name, json!(1)).await;
        w.set(name, json!(2)).await;
    }
    w.stored("dead", Mutation::Delete, None, None).await;
    let purge = Purge::keeping(&w.scope, None, Some(1), false, false);
    let done = store
        .purge(&w.tenant, &purge, purge_record(&purge))
        .await
        .expect("purge");
    assert_eq!((done.keys_affected, done.versions_deleted), (2, 2));
    let audit_history = store
        .history(&w.tenant, &w.scope, &key("_compaction/old"), 1, 10)
        .await
        .expect("history");
    assert_eq!(audit_history.len(), 2, "the audit trail is never purged");
    let purge = Purge {
        include_deleted: true,
        ..purge
    };
    let done = store
        .purge(&w.tenant, &purge, purge_record(&purge))
        .await
        .expect("purge");
    assert_eq!((done.keys_affected, done.versions_deleted), (1, 2));
}

fn summary_write<'a>(
    w: &'a super::Writer<'a, impl Store>,
    target: &'a engram::memory::Key,
    value: &'a engram::memory::Value,
    provenance: &'a Provenance,
) -> Write<'a> {
    Write {
        scope: &w.scope,
        key: target,
        mutation: Mutation::Set(value),
        expected_version: None,
        request: None,
        provenance,
        now: Utc::now(),
        change: ChangeKind::Compact,
    }
}

/// A compaction writes the summary and its record together while every
/// source still has the version it was read at, and nothing otherwise.
async fn compaction_is_fenced_by_its_sources<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    w.set("a", json!("alpha")).await;
    let b = w.set("b", json!("beta")).await;
    let (ka, kb, target) = (key("a"), key("b"), key("summary"));
    let summary = value(json!("alpha and beta"));
    let provenance = Provenance::default();
    let fences = [
        Fence {
            key: &ka,
            version: 1,
        },
        Fence {
            key: &kb,
            version: b.version,
        },
    ];
    let record = AuditRecord::new(Operation::Compact, &w.scope, Utc::now());
    let written = store
        .compact(
            &w.tenant,
            &fences,
            &summary_write(&w, &target, &summary, &provenance),
            record.clone(),
        )
        .await
        .expect("compact");
    let Compacted::Written(written) = written else {
        panic!("expected the summary to be written, got {written:?}");
    };
    let (entry, record) = *written;
    assert_eq!((entry.key.as_str(), entry.version), ("summary", 1));
    assert_eq!(record.target_version, 1);
    let changes = store
        .changes(&w.tenant, &w.scope, &KeyPrefix::default(), 0, i64::MAX, 100)
        .await
        .expect("changes")
        .changes;
    assert!(
        changes
            .iter()
            .any(|c| c.kind == ChangeKind::Compact && c.key.as_str() == "summary")
    );

    // A source moves: nothing is written.
    w.set("b", json!("beta 2")).await;
    let moved = store
        .compact(
            &w.tenant,
            &fences,
            &summary_write(&w, &target, &summary, &provenance),
            AuditRecord::new(Operation::Compact, &w.scope, Utc::now()),
        )
        .await
        .expect("compact");
    assert_eq!(
        moved,
        Compacted::SourceChanged {
            key: kb.clone(),
            read: b.version,
            now: Some(b.version + 1),
        }
    );
    assert_eq!(
        store
            .head(&w.tenant, &w.scope, &target)
            .await
            .expect("head")
            .map(|h| h.version),
        Some(1)
    );
}

/// The feed lists a scope's changes in revision order with their kinds,
/// bounded by `after` and `up_to`, filtered by prefix; pruning forgets the
/// old ones and moves the oldest revision.
async fn changes_in_order_bounded_and_pruned<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    w.set("p/a", json!(1)).await;
    w.set("q/b", json!(2)).await;
    w.stored("p/a", Mutation::Delete, None, None).await;
    let other = writer(&store, "t2");
    other.set("p/a", json!("other tenant")).await;
    let horizon = store.settled(Feed::Changes).await.expect("settled");
    let all = store
        .changes(&w.tenant, &w.scope, &KeyPrefix::default(), 0, horizon, 100)
        .await
        .expect("changes")
        .changes;
    let shape: Vec<(ChangeKind, &str, i64)> = all
        .iter()
        .map(|c| (c.kind, c.key.as_str(), c.version))
        .collect();
    assert_eq!(
        shape,
        vec![
            (ChangeKind::Set, "p/a", 1),
            (ChangeKind::Set, "q/b", 1),
            (ChangeKind::Delete, "p/a", 2)
        ]
    );
    assert!(all.windows(2).all(|p| p[0].revision < p[1].revision));
    assert_eq!(
        all[0].value.as_ref().map(|v| v.json().clone()),
        Some(json!(1))
    );
    assert!(all[2].value.is_none(), "a delete carries no value");
    let prefix = KeyPrefix::parse("key_prefix", "p/").expect("prefix");
    let p_only = store
        .changes(&w.tenant, &w.scope, &prefix, 0, horizon, 100)
        .await
        .expect("changes")
        .changes;
    assert_eq!(p_only.len(), 2);
    let after_first = store
        .changes(
            &w.tenant,
            &w.scope,
            &KeyPrefix::default(),
            all[0].revision,
            all[1].revision,
            100,
        )
        .await
        .expect("changes")
        .changes;
    assert_eq!(after_first.len(), 1);
    assert_eq!(after_first[0].revision, all[1].revision);

    assert_eq!(store.pruned_through().await.expect("pruned"), None);
    let pruned = store
        .prune_changes(Utc::now() + chrono::Duration::seconds(1))
        .await
        .expect("prune");
    assert_eq!(pruned, 4, "both tenants' changes go");
    let newest = all.iter().map(|c| c.revision).max();
    assert!(
        store.pruned_through().await.expect("pruned") >= newest,
        "the watermark covers what went"
    );
    // A page read after the pruned changes is empty, and says why.
    let behind = store
        .changes(&w.tenant, &w.scope, &KeyPrefix::default(), 0, horizon, 100)
        .await
        .expect("changes");
    assert!(behind.changes.is_empty());
    assert!(behind.pruned_through >= newest, "{behind:?}");
    assert_eq!(
        store
            .prune_changes(Utc::now() + chrono::Duration::seconds(1))
            .await
            .expect("prune again"),
        0
    );
}

/// The feed is pruned as a prefix: a change that expired behind one that
/// is kept stays, as does the watermark, however the times are ordered (an
/// import's changes carry the file's times). Pruning past the kept change
/// would refuse a watcher behind it though nothing it missed is gone.
async fn the_feed_is_pruned_as_a_prefix<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    let now = Utc::now();
    let month_ago = now - chrono::Duration::days(30);
    let week_ago = now - chrono::Duration::days(7);
    let mut revisions = Vec::new();
    for (name, at) in [
        ("a", month_ago),
        ("b", month_ago),
        ("c", now),
        ("d", month_ago),
    ] {
        let v = value(json!(name));
        w.write_at(name, Mutation::Set(&v), None, None, at).await;
        let horizon = store.settled(Feed::Changes).await.expect("settled");
        let feed = store
            .changes(&w.tenant, &w.scope, &KeyPrefix::default(), 0, horizon, 100)
            .await
            .expect("changes");
        revisions.push(feed.changes.last().expect("the change").revision);
    }
    let [_, b, c, d] = revisions[..] else {
        panic!("four changes: {revisions:?}")
    };
    assert_eq!(
        store.prune_changes(week_ago).await.expect("prune"),
        2,
        "a and b expired with nothing kept before them"
    );
    assert_eq!(store.pruned_through().await.expect("pruned"), Some(b));
    let horizon = store.settled(Feed::Changes).await.expect("settled");
    let kept = store
        .changes(&w.tenant, &w.scope, &KeyPrefix::default(), b, horizon, 100)
        .await
        .expect("changes");
    assert_eq!(
        kept.changes.iter().map(|c| c.revision).collect::<Vec<_>>(),
        vec![c, d],
        "d expired, but c before it is kept"
    );
    assert_eq!(kept.pruned_through, Some(b));
    assert_eq!(store.prune_changes(week_ago).await.expect("prune"), 0);
    assert_eq!(
        store
            .prune_changes(now + chrono::Duration::seconds(1))
            .await
            .expect("prune"),
        2
    );
    assert_eq!(store.pruned_through().await.expect("pruned"), Some(d));
}

/// The first flow seen for an execution wins; blanks are filled later.
async fn executions_keep_their_first_flow<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    let now = Utc::now();
    store
        .register_execution(&tenant, "exec-1", "flow-1", "", now)
        .await
        .expect("register");
    store
        .register_execution(&tenant, "exec-1", "flow-2", "nightly", now)
        .await
        .expect("register");
    assert_eq!(
        store.execution_flow(&tenant, "exec-1").await.expect("flow"),
        Some(("flow-1".to_owned(), "nightly".to_owned()))
    );
    assert_eq!(
        store
            .execution_flow(&Tenant::new("t2"), "exec-1")
            .await
            .expect("flow"),
        None
    );
}

/// Reindex counts untagged execution versions, tags the ones whose flow is
/// known (only when applying), names the unknown ones, and is idempotent.
async fn reindex_backfills_known_flows<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    for execution in ["exec-known", "exec-unknown"] {
        let w = super::Writer {
            store: &store,
            tenant: tenant.clone(),
            scope: scope(ScopeType::Execution, execution),
        };
        // The writer's provenance carries no flow tags.
        w.set("k", json!(1)).await;
        w.set("k", json!(2)).await;
    }
    store
        .register_execution(&tenant, "exec-known", "flow-1", "nightly", Utc::now())
        .await
        .expect("register");
    let dry = store.reindex(&tenant, false).await.expect("dry run");
    assert_eq!((dry.versions_scanned, dry.tags_added), (4, 2));
    assert_eq!(dry.unknown, vec![("exec-unknown".to_owned(), 2)]);
    let applied = store.reindex(&tenant, true).await.expect("apply");
    assert_eq!(applied.tags_added, 2);
    let again = store.reindex(&tenant, true).await.expect("again");
    assert_eq!((again.versions_scanned, again.tags_added), (2, 0));
    let flows = store
        .list_scopes(
            &tenant,
            ScopeFilter {
                flow_name: Some("nightly"),
                ..ScopeFilter::default()
            },
            None,
            10,
        )
        .await
        .expect("scopes");
    assert_eq!(
        flows
            .iter()
            .map(|s| s.scope.name.as_str())
            .collect::<Vec<_>>(),
        vec!["exec-known"]
    );
    let entry = store
        .get(
            &tenant,
            &scope(ScopeType::Execution, "exec-known"),
            &key("k"),
            Some(1),
        )
        .await
        .expect("get")
        .expect("version 1");
    assert_eq!(entry.provenance.flow_id, "flow-1");
}

/// An unconditional write never comes back refused, and a tombstone of a
/// key that never lived is refused with no head.
async fn unconditional_writes_always_land<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    let one = value(json!(1));
    for expected in 1..=3 {
        match w.write("k", Mutation::Set(&one), None, None).await {
            Written::Stored(entry) => assert_eq!(entry.version, expected),
            other => panic!("expected a write, got {other:?}"),
        }
    }
    assert_eq!(
        w.write("never", Mutation::Delete, None, None).await,
        Written::Refused(None)
    );
}

/// Lines staged by imports that never finished are pruned by age across
/// tenants; a newer import's lines stay.
async fn unfinished_imports_are_pruned<S: Store>(store: S, _db: &TestDb) {
    let day_ago = Utc::now() - chrono::Duration::days(1);
    let line = |n: i64| (n, format!("{{\"line\":{n}}}"));
    for (tenant, import) in [("t1", "old-a"), ("t2", "old-b")] {
        store
            .stage_import(&Tenant::new(tenant), import, &[line(1), line(2)], day_ago)
            .await
            .expect("stage");
    }
    store
        .stage_import(&Tenant::new("t1"), "new", &[line(1)], Utc::now())
        .await
        .expect("stage");

    let hour_ago = Utc::now() - chrono::Duration::hours(1);
    assert_eq!(store.prune_imports(hour_ago).await.expect("prune"), 4);
    assert_eq!(store.prune_imports(hour_ago).await.expect("prune"), 0);
    // The newer import's line was kept until it too is old enough.
    let later = Utc::now() + chrono::Duration::seconds(1);
    assert_eq!(store.prune_imports(later).await.expect("prune"), 1);
}

/// A table that has doubled since its planner statistics were taken is
/// analyzed (its statistics then count its rows), and is left alone until
/// it doubles again; tables that did not grow are never analyzed. On
/// SQLite a table is analyzed once it has 1,000 rows and no statistics,
/// then each time it has grown tenfold.
async fn tables_that_doubled_are_analyzed<S: Store>(store: S, db: &TestDb) {
    use crate::helpers::Backend;

    if db.backend == Backend::Sqlite {
        return tables_that_grew_are_analyzed_on_sqlite(store, db).await;
    }
    // Autovacuum off for the table, so that only the call analyzes it.
    db.execute(
        "ALTER TABLE sessions SET (autovacuum_enabled = false); \
         INSERT INTO sessions (tenant, id, app, user_id, metadata, create_time, update_time) \
         SELECT 't1', 's' || n, 'app', 'u', '{}', now(), now() FROM generate_series(1, 2000) n"
            .to_owned(),
    )
    .await;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect");
    let statistics = async |conn: &mut sqlx::PgConnection| -> (i64, f32) {
        sqlx::query_as(
            "SELECT s.n_live_tup, c.reltuples FROM pg_stat_user_tables s \
             JOIN pg_class c ON c.oid = s.relid WHERE s.relname = 'sessions'",
        )
        .fetch_one(conn)
        .await
        .expect("statistics")
    };
    // The inserting connection reports its rows as it closes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while statistics(&mut conn).await.0 < 2000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the inserts were never counted"
        );
    }
    assert_eq!(
        statistics(&mut conn).await.1,
        -1.0,
        "never analyzed before the call"
    );
    assert_eq!(store.analyze_grown().await.expect("analyze"), 1);
    assert_eq!(statistics(&mut conn).await.1, 2000.0);
    assert_eq!(
        store.analyze_grown().await.expect("analyze"),
        0,
        "nothing doubled since"
    );
}

async fn tables_that_grew_are_analyzed_on_sqlite<S: Store>(store: S, db: &TestDb) {
    let sessions_through = |from: u32, to: u32| {
        format!(
            "WITH RECURSIVE n(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM n WHERE i < {to}) \
             INSERT INTO sessions (tenant, id, app, user_id, create_time, update_time) \
             SELECT 't1', 's' || i, 'app', 'u', 0, 0 FROM n"
        )
    };
    let statistics = async || -> Option<String> {
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url)
            .await
            .expect("connect");
        sqlx::query_scalar(
            "SELECT stat FROM sqlite_stat1 WHERE tbl = 'sessions' AND idx = 'sessions_create'",
        )
        .fetch_optional(&mut conn)
        .await
        .unwrap_or(None)
    };
    assert_eq!(
        store.analyze_grown().await.expect("analyze"),
        0,
        "every table is nearly empty"
    );
    db.execute(sessions_through(1, 999)).await;
    assert_eq!(store.analyze_grown().await.expect("analyze"), 0, "999 rows");
    assert_eq!(statistics().await, None);

    db.execute(sessions_through(1000, 2000)).await;
    assert_eq!(store.analyze_grown().await.expect("analyze"), 1);
    let stat = statistics().await.expect("the sessions' statistics");
    assert!(stat.starts_with("2000 "), "{stat}");
    assert_eq!(
        store.analyze_grown().await.expect("analyze"),
        0,
        "nothing grew since"
    );

    // SQLite sizes a table up from its pages, so the tenfold is rough:
    // 19,000 sessions (ninefold) passed for tenfold once sessions had one
    // more column (0025), as its rows became a little wider.
    db.execute(sessions_through(2001, 10_000)).await;
    assert_eq!(
        store.analyze_grown().await.expect("analyze"),
        0,
        "grown fivefold"
    );
    db.execute(sessions_through(10_001, 25_000)).await;
    assert_eq!(
        store.analyze_grown().await.expect("analyze"),
        1,
        "grown past tenfold"
    );
}

store_suite!(
    tables_that_doubled_are_analyzed,
    unfinished_imports_are_pruned,
    racing_writers_get_dense_versions,
    purge_keeps_the_newest_and_audits,
    purge_all_versions_removes_the_key,
    purge_scope_spares_tombstones_and_the_audit_trail,
    compaction_is_fenced_by_its_sources,
    changes_in_order_bounded_and_pruned,
    the_feed_is_pruned_as_a_prefix,
    executions_keep_their_first_flow,
    reindex_backfills_known_flows,
    unconditional_writes_always_land,
);
