//! The store interface, case by case, on every backend: what one store
//! does, the other must do too. Each case is a function of the store (and
//! its test database, for the cases that need a second connection); the
//! `store_suite!` macro runs every case on SQLite and on Postgres, in the
//! style of quickwit's metastore test suite. Memory cases are here, the
//! other areas in the modules below.

use chrono::{DateTime, Utc};
use engram::context::Tenant;
use engram::memory::ports::{Head, ListQuery, Mutation, RequestStamp, ScopeFilter, Write, Written};
use engram::memory::{
    ChangeKind, Entry, Key, KeyPrefix, Provenance, Scope, ScopeName, ScopeType, Value,
};
use engram::ports::Store;
use serde_json::json;

use crate::helpers::TestDb;

pub(crate) fn scope(scope_type: ScopeType, name: &str) -> Scope {
    Scope {
        scope_type,
        name: ScopeName::parse("scope", name).expect("valid scope"),
    }
}

pub(crate) fn key(name: &str) -> Key {
    Key::parse("key", name).expect("valid key")
}

pub(crate) fn value(json: serde_json::Value) -> Value {
    Value::new(json, 1 << 20).expect("valid value")
}

pub(crate) struct Writer<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) tenant: Tenant,
    pub(crate) scope: Scope,
}

impl<S: Store> Writer<'_, S> {
    pub(crate) async fn write(
        &self,
        key_name: &str,
        mutation: Mutation<'_>,
        expected_version: Option<i64>,
        request: Option<RequestStamp<'_>>,
    ) -> Written {
        self.write_at(key_name, mutation, expected_version, request, Utc::now())
            .await
    }

    /// [`Writer::write`] with the time the server would stamp it with.
    pub(crate) async fn write_at(
        &self,
        key_name: &str,
        mutation: Mutation<'_>,
        expected_version: Option<i64>,
        request: Option<RequestStamp<'_>>,
        now: DateTime<Utc>,
    ) -> Written {
        let key = key(key_name);
        let provenance = Provenance {
            execution_id: "exec-1".to_owned(),
            ..Provenance::default()
        };
        self.store
            .write(
                &self.tenant,
                &Write {
                    scope: &self.scope,
                    key: &key,
                    mutation,
                    expected_version,
                    request,
                    provenance: &provenance,
                    now,
                    change: match mutation {
                        Mutation::Set(_) => ChangeKind::Set,
                        Mutation::Delete => ChangeKind::Delete,
                    },
                },
            )
            .await
            .expect("write")
    }

    /// A write that must be stored.
    pub(crate) async fn stored(
        &self,
        key_name: &str,
        mutation: Mutation<'_>,
        expected_version: Option<i64>,
        request: Option<RequestStamp<'_>>,
    ) -> Entry {
        match self
            .write(key_name, mutation, expected_version, request)
            .await
        {
            Written::Stored(entry) => entry,
            other => panic!("expected {key_name} to be written, got {other:?}"),
        }
    }

    pub(crate) async fn set(&self, key_name: &str, json: serde_json::Value) -> Entry {
        let value = value(json);
        self.stored(key_name, Mutation::Set(&value), None, None)
            .await
    }
}

pub(crate) fn writer<'a, S>(store: &'a S, tenant: &str) -> Writer<'a, S> {
    Writer {
        store,
        tenant: Tenant::new(tenant),
        scope: scope(ScopeType::Namespace, "ns"),
    }
}

async fn versions_tombstones_and_point_in_time<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    assert_eq!(w.set("k", json!("one")).await.version, 1);
    let second = w.set("k", json!({"n": 2})).await;
    assert_eq!(second.version, 2);
    assert_eq!(second.provenance.execution_id, "exec-1");
    let tombstone = w.stored("k", Mutation::Delete, None, None).await;
    assert_eq!(
        (
            tombstone.version,
            tombstone.deleted,
            tombstone.value.is_none()
        ),
        (3, true, true)
    );

    let k = key("k");
    let get = |key: Key, version| {
        let (store, tenant, scope) = (&store, w.tenant.clone(), w.scope.clone());
        async move {
            store
                .get(&tenant, &scope, &key, version)
                .await
                .expect("get")
        }
    };
    // The store answers tombstones as they are; `Get` refusing them is the
    // domain's rule.
    let latest = get(k.clone(), None).await.expect("newest");
    assert_eq!((latest.version, latest.deleted), (3, true));
    let v2 = get(k.clone(), Some(2)).await.expect("version 2");
    assert_eq!(v2.value.map(|v| v.json().clone()), Some(json!({"n": 2})));
    let v3 = get(k.clone(), Some(3)).await.expect("version 3");
    assert_eq!((v3.version, v3.deleted, v3.value), (3, true, None));
    assert_eq!(get(k.clone(), Some(9)).await, None);
    assert_eq!(get(key("nope"), None).await, None);
    assert_eq!(
        store.head(&w.tenant, &w.scope, &k).await.expect("head"),
        Some(Head {
            version: 3,
            deleted: true
        })
    );

    let history = store
        .history(&w.tenant, &w.scope, &k, 1, 100)
        .await
        .expect("history");
    let shape: Vec<(i64, bool)> = history.iter().map(|e| (e.version, e.deleted)).collect();
    assert_eq!(shape, vec![(1, false), (2, false), (3, true)]);
    let tail = store
        .history(&w.tenant, &w.scope, &k, 2, 1)
        .await
        .expect("history");
    assert_eq!(tail.iter().map(|e| e.version).collect::<Vec<_>>(), vec![2]);

    // Deleting again finds nothing live; writing again resumes numbering.
    let again = w.write("k", Mutation::Delete, None, None).await;
    assert_eq!(
        again,
        Written::Refused(Some(Head {
            version: 3,
            deleted: true
        }))
    );
    assert_eq!(w.set("k", json!(null)).await.version, 4);
    let revived = get(k.clone(), None).await.expect("revived");
    assert_eq!(revived.value.map(|v| v.json().clone()), Some(json!(null)));
}

async fn tenants_never_see_each_other<S: Store>(store: S, _db: &TestDb) {
    let a = writer(&store, "tenant-a");
    let b = writer(&store, "tenant-b");
    a.set("shared/key", json!("a's")).await;
    a.set("shared/key", json!("a's again")).await;
    // The same address in another tenant is a different key with its own versions.
    assert_eq!(b.set("other", json!("b's")).await.version, 1);

    let k = key("shared/key");
    let read = store.get(&b.tenant, &b.scope, &k, None).await.expect("get");
    assert_eq!(read, None);
    let read = store
        .get(&b.tenant, &b.scope, &k, Some(1))
        .await
        .expect("get");
    assert_eq!(read, None);
    assert_eq!(
        store.head(&b.tenant, &b.scope, &k).await.expect("head"),
        None
    );
    assert!(
        store
            .history(&b.tenant, &b.scope, &k, 1, 10)
            .await
            .expect("history")
            .is_empty()
    );
    let prefix = KeyPrefix::default();
    let listed = store
        .list(
            &b.tenant,
            &ListQuery {
                scope: &b.scope,
                prefix: &prefix,
                after: None,
                limit: 10,
                include_reserved: true,
                descending: false,
            },
        )
        .await
        .expect("list");
    assert_eq!(
        listed.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        vec!["other"]
    );
    let scopes = store
        .list_scopes(&b.tenant, ScopeFilter::default(), None, 10)
        .await
        .expect("scopes");
    assert_eq!(scopes.len(), 1);
    assert_eq!(scopes[0].entry_count, 1);
    let stranger = store
        .list_scopes(&Tenant::new("tenant-c"), ScopeFilter::default(), None, 10)
        .await
        .expect("scopes");
    assert!(stranger.is_empty());
    // A deleted key in one tenant is untouched in the other.
    let gone = b.write("shared/key", Mutation::Delete, None, None).await;
    assert_eq!(gone, Written::Refused(None));
    let kept = store.get(&a.tenant, &a.scope, &k, None).await.expect("get");
    assert_eq!(kept.map(|e| (e.version, e.deleted)), Some((2, false)));
}

async fn list_ranges_and_reserved_keys<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    for name in ["a/b", "a/bc", "a/b/c", "ab", "a", "_compaction/1"] {
        w.set(name, json!(name)).await;
    }
    w.set("dead", json!(1)).await;
    w.stored("dead", Mutation::Delete, None, None).await;

    let list_in = |prefix: &str,
                   after: Option<&str>,
                   limit: i64,
                   include_reserved: bool,
                   descending: bool| {
        let prefix = KeyPrefix::parse("key_prefix", prefix).expect("prefix");
        let after = after.map(str::to_owned);
        let store = &store;
        let tenant = w.tenant.clone();
        let scope = w.scope.clone();
        async move {
            store
                .list(
                    &tenant,
                    &ListQuery {
                        scope: &scope,
                        prefix: &prefix,
                        after: after.as_deref(),
                        limit,
                        include_reserved,
                        descending,
                    },
                )
                .await
                .expect("list")
                .into_iter()
                .map(|e| e.key.as_str().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let list = |prefix, after, limit, include_reserved| {
        list_in(prefix, after, limit, include_reserved, false)
    };
    assert_eq!(
        list("", None, 100, false).await,
        vec!["a", "a/b", "a/b/c", "a/bc", "ab"]
    );
    assert_eq!(
        list("", None, 100, true).await,
        vec!["_compaction/1", "a", "a/b", "a/b/c", "a/bc", "ab"]
    );
    assert_eq!(
        list("a/b", None, 100, false).await,
        vec!["a/b", "a/b/c", "a/bc"]
    );
    assert_eq!(list("a/b/", None, 100, false).await, vec!["a/b/c"]);
    assert_eq!(
        list("a/b", Some("a/b"), 100, false).await,
        vec!["a/b/c", "a/bc"]
    );
    assert_eq!(list("", Some("a/b"), 2, false).await, vec!["a/b/c", "a/bc"]);
    assert!(list("zzz", None, 100, false).await.is_empty());
    // Newest-first listing (the audit trail) pages backwards.
    assert_eq!(
        list_in("a/b", None, 100, false, true).await,
        vec!["a/bc", "a/b/c", "a/b"]
    );
    assert_eq!(
        list_in("a/b", Some("a/bc"), 1, false, true).await,
        vec!["a/b/c"]
    );
    assert_eq!(
        list_in("_compaction/", None, 10, true, true).await,
        vec!["_compaction/1"]
    );
}

async fn conditional_writes<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    let one = value(json!(1));
    let set = |expected| w.write("k", Mutation::Set(&one), expected, None);
    let live = |version| {
        Written::Refused(Some(Head {
            version,
            deleted: false,
        }))
    };
    let version = |written: Written| match written {
        Written::Stored(entry) => entry.version,
        other => panic!("expected a write, got {other:?}"),
    };
    // Expected version 0: only when the key has no live value.
    assert_eq!(version(set(Some(0)).await), 1);
    assert_eq!(set(Some(0)).await, live(1));
    assert_eq!(version(set(Some(1)).await), 2);
    assert_eq!(set(Some(1)).await, live(2));
    assert_eq!(w.write("k", Mutation::Delete, Some(1), None).await, live(2));
    assert_eq!(
        version(w.write("k", Mutation::Delete, Some(2), None).await),
        3
    );
    // After a delete, "must not exist" holds again.
    assert_eq!(version(set(Some(0)).await), 4);
    // A positive expectation on a key that was never written fails.
    assert_eq!(
        w.write("fresh", Mutation::Set(&one), Some(3), None).await,
        Written::Refused(None)
    );
    assert_eq!(
        store
            .head(&w.tenant, &w.scope, &key("fresh"))
            .await
            .expect("head"),
        None
    );
}

async fn request_ids_replay_and_expire<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    let one = value(json!(1));
    let stamp = RequestStamp {
        id: "req-1",
        fingerprint: [7; 32],
    };
    let first = w
        .stored("k", Mutation::Set(&one), Some(0), Some(stamp))
        .await;
    // The retry of a compare-and-set that already won finds the first
    // request instead of a mismatch.
    match w
        .write("k", Mutation::Set(&one), Some(0), Some(stamp))
        .await
    {
        Written::Replayed {
            fingerprint,
            version,
            entry: Some(entry),
        } => {
            assert_eq!(fingerprint, vec![7; 32]);
            assert_eq!(version, first.version);
            assert_eq!((entry.version, entry.value), (first.version, first.value));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let history = store
        .history(&w.tenant, &w.scope, &key("k"), 1, 10)
        .await
        .expect("history");
    assert_eq!(history.len(), 1);

    let reused = RequestStamp {
        id: "req-1",
        fingerprint: [8; 32],
    };
    // Another request under a used id: the store reports the first one's
    // fingerprint (the domain refuses it) and writes nothing.
    match w.write("k", Mutation::Set(&one), None, Some(reused)).await {
        Written::Replayed { fingerprint, .. } => assert_eq!(fingerprint, vec![7; 32]),
        other => panic!("expected a replay, got {other:?}"),
    }

    // The same id in another tenant is another request.
    let other = writer(&store, "t2");
    assert_eq!(
        other
            .stored("k", Mutation::Set(&one), None, Some(stamp))
            .await
            .version,
        1
    );

    // A failed write records nothing, so its retry runs again.
    let failing = RequestStamp {
        id: "req-2",
        fingerprint: [9; 32],
    };
    assert!(matches!(
        w.write("k", Mutation::Set(&one), Some(5), Some(failing))
            .await,
        Written::Refused(_)
    ));
    w.stored("k", Mutation::Set(&one), Some(1), Some(failing))
        .await;

    let pruned = store
        .prune_request_ids(Utc::now() + chrono::Duration::seconds(1))
        .await
        .expect("prune");
    assert_eq!(pruned, 3);
    // Once forgotten, the id is free again.
    let again = w.stored("k", Mutation::Set(&one), None, Some(reused)).await;
    assert_eq!(again.version, 3);
}

async fn scopes_with_live_counts<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("t1");
    for (scope_type, name, keys) in [
        (ScopeType::Flow, "flow-b", 1),
        (ScopeType::Namespace, "ns-a", 3),
        (ScopeType::Flow, "flow-a", 2),
        (ScopeType::Execution, "exec-1", 1),
    ] {
        let w = Writer {
            store: &store,
            tenant: tenant.clone(),
            scope: scope(scope_type, name),
        };
        for i in 0..keys {
            w.set(&format!("k{i}"), json!(i)).await;
        }
        if name == "ns-a" {
            w.stored("k0", Mutation::Delete, None, None).await;
            w.set("_compaction/audit", json!("audit")).await;
        }
    }
    let all = store
        .list_scopes(&tenant, ScopeFilter::default(), None, 100)
        .await
        .expect("scopes");
    let shape: Vec<(ScopeType, &str, i64)> = all
        .iter()
        .map(|s| (s.scope.scope_type, s.scope.name.as_str(), s.entry_count))
        .collect();
    assert_eq!(
        shape,
        vec![
            (ScopeType::Namespace, "ns-a", 2),
            (ScopeType::Flow, "flow-a", 2),
            (ScopeType::Flow, "flow-b", 1),
            (ScopeType::Execution, "exec-1", 1),
        ]
    );
    let flows = store
        .list_scopes(
            &tenant,
            ScopeFilter {
                scope_type: Some(ScopeType::Flow),
                ..ScopeFilter::default()
            },
            None,
            100,
        )
        .await
        .expect("flows");
    assert_eq!(flows.len(), 2);
    let after = store
        .list_scopes(&tenant, ScopeFilter::default(), Some(&all[1].scope), 100)
        .await
        .expect("after");
    assert_eq!(
        after
            .iter()
            .map(|s| s.scope.name.as_str())
            .collect::<Vec<_>>(),
        vec!["flow-b", "exec-1"]
    );
}

/// Sessions idle past the cutoff go (with their episodes), an append counts
/// as activity, and nothing of one tenant is visible to another.
async fn sessions_cleanup_by_idle_time_and_tenants<S: Store>(store: S, _db: &TestDb) {
    use engram::ports::Feed;
    use engram::sessions::ports::{Append, Appended, Creation, NewSession};
    use engram::sessions::{
        EpisodeInput, Id, Name, NewEpisode, Owner, RecentQuery, SessionFilter, TailFilter,
    };

    let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).expect("now");
    let hours_ago = |h: i64| now - chrono::Duration::hours(h);
    let (app, user) = (
        Name::parse("app", "app").expect("app"),
        Name::parse("user", "u").expect("user"),
    );
    let (t1, t2) = (Tenant::new("t1"), Tenant::new("t2"));
    let create = async |tenant: &Tenant, id: &str, at| {
        let id = Id::parse("id", id).expect("id");
        let session = NewSession {
            id: &id,
            app: &app,
            user: &user,
            metadata: "{}",
            now: at,
            max_sessions: 0,
            request: None,
        };
        match store
            .create_session(tenant, &session)
            .await
            .expect("create")
        {
            Creation::Created(session) => session,
            other => panic!("not created: {other:?}"),
        }
    };
    let idle = create(&t1, "idle", hours_ago(2)).await;
    assert_eq!(idle.create_time, hours_ago(2));
    create(&t1, "active", hours_ago(2)).await;
    create(&t1, "new", now).await;
    create(&t2, "idle", hours_ago(3)).await;

    let active = Id::parse("id", "active").expect("id");
    let episode = NewEpisode::new(
        "episode",
        &active,
        EpisodeInput {
            id: None,
            agent: None,
            kind: None,
            content: json!("ping"),
            metadata: serde_json::Map::new(),
            source_node: String::new(),
            timestamp: None,
        },
        1 << 20,
    )
    .expect("episode");
    let owner = Owner::default();
    let appended = store
        .append(
            &t1,
            &Append {
                session_id: &active,
                owner: &owner,
                episodes: std::slice::from_ref(&episode),
                now,
                max_sessions: 0,
                max_events: 0,
                create: true,
            },
        )
        .await
        .expect("append");
    let Appended::Stored(appended) = appended else {
        panic!("expected the append to be stored, got {appended:?}");
    };
    assert_eq!(appended[0].0.seq, 1);
    assert_eq!(appended[0].0.timestamp, now);

    let cutoff = hours_ago(1);
    assert_eq!(
        store
            .cleanup_sessions(&t1, cutoff, true)
            .await
            .expect("dry run"),
        1
    );
    assert_eq!(
        store
            .cleanup_sessions(&t1, cutoff, false)
            .await
            .expect("cleanup"),
        1
    );
    let idle_id = Id::parse("id", "idle").expect("id");
    assert!(
        store
            .get_session(&t1, &idle_id)
            .await
            .expect("get")
            .is_none()
    );
    let survivor = store.get_session(&t2, &idle_id).await.expect("get");
    assert!(survivor.is_some(), "another tenant's session is untouched");
    let listed = store
        .list_sessions(&t1, &SessionFilter::default(), None, 10)
        .await
        .expect("list");
    let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["new", "active"]);

    // Tenant t2 sees none of t1's episodes, by any read.
    let recent = store
        .recent(
            &t2,
            &RecentQuery {
                user: user.clone(),
                session_id: None,
                agent: None,
                types: Vec::new(),
                limit: 10,
            },
        )
        .await
        .expect("recent");
    assert!(recent.is_empty());
    let horizon = *store
        .horizon(Feed::Episodes)
        .await
        .expect("horizon")
        .borrow();
    assert!(horizon >= appended[0].0.cursor);
    let tail = store
        .episodes_after(&t2, &TailFilter::default(), 0, horizon, 10)
        .await
        .expect("tail");
    assert!(tail.is_empty());
    assert!(
        store
            .latest_episodes(&t2, 10)
            .await
            .expect("latest")
            .is_empty()
    );
    let own = store
        .episodes_after(&t1, &TailFilter::default(), 0, horizon, 10)
        .await
        .expect("tail");
    assert_eq!(own.len(), 1);
    let stats = store.session_stats(&t2).await.expect("stats");
    assert_eq!((stats.total_sessions, stats.total_episodes), (1, 0));
}

/// Runs each case on SQLite and on Postgres, each with a fresh, migrated
/// database.
macro_rules! store_suite {
    // `single_threaded;` first runs the cases on a current-thread runtime,
    // where a case can tell which calls one poll queued together.
    (single_threaded; $($name:ident),* $(,)?) => {
        store_suite!(@each (flavor = "current_thread"); $($name),*);
    };
    ($($name:ident),* $(,)?) => {
        store_suite!(@each (flavor = "multi_thread", worker_threads = 2); $($name),*);
    };
    (@each $runtime:tt; $($name:ident),*) => {
        mod sqlite {
            use engram::ports::Database;
            $(
                #[tokio::test $runtime]
                async fn $name() {
                    let db = crate::helpers::TestDb::new(crate::helpers::Backend::Sqlite).await;
                    let store = db.sqlite_store().await;
                    store.migrate().await.expect("migrate");
                    super::$name(store, &db).await
                }
            )*
        }
        mod postgres {
            use engram::ports::Database;
            $(
                #[tokio::test $runtime]
                async fn $name() {
                    let db = crate::helpers::TestDb::new(crate::helpers::Backend::Postgres).await;
                    let store = db.pg_store().await;
                    store.migrate().await.expect("migrate");
                    super::$name(store, &db).await
                }
            )*
        }
    };
}

mod consolidation;
mod embeddings;
mod feeds;
mod fixtures;
mod group_commit;
mod large;
mod maintenance;
mod search;
mod sessions;
mod working;

store_suite!(
    versions_tombstones_and_point_in_time,
    tenants_never_see_each_other,
    list_ranges_and_reserved_keys,
    conditional_writes,
    request_ids_replay_and_expire,
    scopes_with_live_counts,
    sessions_cleanup_by_idle_time_and_tenants,
);
