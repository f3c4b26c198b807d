//! A database written before time travel, migrated: each version takes the
//! revision that wrote it from the change feed where the feed still has
//! it, the rest count as older than any revision a client can name, and
//! the feed remembers how far it had been pruned. Both stores, with the
//! old schema filled by hand as the old server would have.

use engram::ports::Database;
use engram::proto::{AsOf, GetRequest, ScopeType, WatchRequest, as_of};
use tonic::Code;

use crate::helpers::{Backend, TestDb, TestServer, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

/// k at versions 1 and 2 (revisions 2 and 3), j at version 1 (revision 1,
/// since pruned from the feed).
fn old_rows(backend: Backend) -> String {
    // Written now: older changes would be pruned at start, as they should.
    let micros = chrono::Utc::now().timestamp_micros().to_string();
    let (now, f, json) = match backend {
        Backend::Sqlite => (micros.as_str(), "0", ""),
        Backend::Postgres => ("now()", "false", "::jsonb"),
    };
    format!(
        "INSERT INTO memory_heads (tenant, scope_type, scope, key, version, deleted, update_time) \
         VALUES ('default', 1, 'old', 'k', 2, {f}, {now}), ('default', 1, 'old', 'j', 1, {f}, {now}); \
         INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, create_time) \
         VALUES ('default', 1, 'old', 'k', 1, '\"k1\"'{json}, {f}, {now}), \
                ('default', 1, 'old', 'k', 2, '\"k2\"'{json}, {f}, {now}), \
                ('default', 1, 'old', 'j', 1, '\"j1\"'{json}, {f}, {now}); \
         INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, create_time) \
         VALUES ('default', 1, 'old', 'j', 1, 1, {now}); \
         INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, create_time) \
         VALUES ('default', 1, 'old', 'k', 1, 1, {now}); \
         INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, create_time) \
         VALUES ('default', 1, 'old', 'k', 1, 2, {now}); \
         DELETE FROM memory_changes WHERE key = 'j';"
    )
}

fn at(key: &str, revision: i64) -> GetRequest {
    GetRequest {
        scope_type: NS,
        scope: "old".into(),
        key: key.into(),
        version: 0,
        as_of: Some(AsOf {
            point: Some(as_of::Point::Revision(revision)),
        }),
    }
}

async fn versions_take_their_revisions_from_the_feed(backend: Backend) {
    let db = TestDb::new(backend).await;
    // The schema the previous release left, and rows as it wrote them.
    let (before_time_travel, sql) = (
        match backend {
            Backend::Sqlite => 8,
            Backend::Postgres => 10,
        },
        old_rows(backend),
    );
    match backend {
        Backend::Sqlite => db
            .sqlite_store()
            .await
            .migrate_through(Some(before_time_travel))
            .await
            .expect("old schema"),
        Backend::Postgres => db
            .pg_store()
            .await
            .migrate_through(Some(before_time_travel))
            .await
            .expect("old schema"),
    }
    db.execute(sql).await;

    // The server migrates the rest at start.
    let server = TestServer::start(db, |_| {}).await;
    let mut memory = server.memory();
    let value = |entry: Option<engram::proto::MemoryEntry>| {
        let entry = entry.expect("entry");
        (
            entry.version,
            entry
                .value
                .and_then(|v| v.kind)
                .map(|k| format!("{k:?}"))
                .unwrap_or_default(),
        )
    };
    let k_then = memory.get(at("k", 2)).await.expect("k at 2").into_inner();
    assert_eq!(value(k_then.entry).0, 1);
    let k_later = memory.get(at("k", 3)).await.expect("k at 3").into_inner();
    assert_eq!(value(k_later.entry).0, 2);
    let err = memory
        .get(at("k", 1))
        .await
        .expect_err("k had no version yet");
    assert_eq!(reason(&err), "KEY_NOT_FOUND");
    // j's change was pruned: its version counts as older than any revision.
    let j = memory.get(at("j", 1)).await.expect("j at 1").into_inner();
    assert_eq!(value(j.entry).0, 1);

    // The feed knows it was pruned through revision 1.
    let err = memory
        .watch(WatchRequest {
            scope_type: NS,
            scope: "old".into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect_err("revision 1 is gone");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::OutOfRange, "REVISION_PRUNED".into())
    );
    memory
        .watch(WatchRequest {
            scope_type: NS,
            scope: "old".into(),
            from_revision: Some(1),
            ..WatchRequest::default()
        })
        .await
        .expect("from revision 1 is complete");

    // The keys are searchable at their current versions (on Postgres,
    // migration 0016 indexed them).
    for (text, want) in [
        ("k2", vec!["memory:old/k@2"]),
        ("j1", vec!["memory:old/j@1"]),
        ("k1", vec![]),
    ] {
        let hits = crate::search::search(&server, crate::search::memory_query(text)).await;
        assert_eq!(crate::search::names(&hits), want, "{text}");
    }
}

on_both_stores!(versions_take_their_revisions_from_the_feed);
