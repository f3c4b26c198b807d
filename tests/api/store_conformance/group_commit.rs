//! Group commit on both stores: writes that wait while a commit is in
//! flight share the next transaction, and each keeps the outcome it would
//! have had alone; a write the database refuses fails only its own call.
//!
//! The cases run on a single-threaded runtime so the batch is known: every
//! write joins the queue in one poll, before the flusher task first runs,
//! so they all land in one batch.

use std::pin::pin;

use chrono::Utc;
use engram::context::Tenant;
use engram::memory::ports::{Head, Mutation, RequestStamp, Write, Written};
use engram::memory::{ChangeKind, Provenance, ScopeType, Value};
use engram::ports::Store;
use serde_json::json;

use super::{key, scope, value};
use crate::helpers::{Backend, TestDb};

/// One write of the batch.
struct Planned {
    key: &'static str,
    value: Option<Value>,
    expected: Option<i64>,
    request: Option<&'static str>,
}

fn set(key: &'static str, n: i64) -> Planned {
    Planned {
        key,
        value: Some(value(json!(n))),
        expected: None,
        request: None,
    }
}

impl Planned {
    fn expecting(mut self, version: i64) -> Self {
        self.expected = Some(version);
        self
    }

    fn with_request(mut self, id: &'static str) -> Self {
        self.request = Some(id);
        self
    }
}

/// Runs every planned write at once (one batch) and returns the outcomes
/// in the same order.
async fn all_at_once<S: Store>(
    store: &S,
    tenant: &Tenant,
    planned: &[Planned],
) -> Vec<engram::error::Result<Written>> {
    let batch = scope(ScopeType::Namespace, "batch");
    let keys: Vec<_> = planned.iter().map(|p| key(p.key)).collect();
    let provenance = Provenance::default();
    let writes: Vec<Write<'_>> = planned
        .iter()
        .zip(&keys)
        .map(|(p, key)| Write {
            scope: &batch,
            key,
            mutation: p.value.as_ref().map_or(Mutation::Delete, Mutation::Set),
            expected_version: p.expected,
            request: p.request.map(|id| RequestStamp {
                id,
                fingerprint: [7; 32],
            }),
            provenance: &provenance,
            now: Utc::now(),
            change: if p.value.is_some() {
                ChangeKind::Set
            } else {
                ChangeKind::Delete
            },
        })
        .collect();
    let mut all = pin!(futures::future::join_all(
        writes.iter().map(|write| store.write(tenant, write))
    ));
    // One poll queues them all; the flusher has not run yet.
    assert!(futures::poll!(all.as_mut()).is_pending());
    all.await
}

fn stored(outcome: &engram::error::Result<Written>) -> Option<i64> {
    match outcome {
        Ok(Written::Stored(entry)) => Some(entry.version),
        _ => None,
    }
}

fn refused(outcome: &engram::error::Result<Written>) -> Option<Option<i64>> {
    match outcome {
        Ok(Written::Refused(head)) => Some(head.map(|Head { version, .. }| version)),
        _ => None,
    }
}

fn replayed(outcome: &engram::error::Result<Written>) -> Option<i64> {
    match outcome {
        Ok(Written::Replayed { version, .. }) => Some(*version),
        _ => None,
    }
}

async fn a_batch_keeps_each_outcome<S: Store>(store: S, db: &TestDb) {
    let tenant = Tenant::new("g");
    // Before the batch: "cas" at version 1, request r-old used on "old".
    let before = all_at_once(
        &store,
        &tenant,
        &[set("cas", 0), set("old", 0).with_request("r-old")],
    )
    .await;
    assert_eq!(
        before.iter().map(stored).collect::<Vec<_>>(),
        [Some(1), Some(1)]
    );

    let outcomes = all_at_once(
        &store,
        &tenant,
        &[
            set("a", 1),
            set("cas", 1).expecting(5),
            set("a", 2),
            set("b", 1).with_request("r-new"),
            set("b", 1).with_request("r-new"),
            Planned {
                value: None,
                ..set("tomb", 0)
            },
            set("a", 3).expecting(0),
            set("cas", 2).expecting(1),
            set("old", 9).with_request("r-old"),
        ],
    )
    .await;
    assert_eq!(stored(&outcomes[0]), Some(1), "a plain set");
    assert_eq!(
        refused(&outcomes[1]),
        Some(Some(1)),
        "a lost compare-and-set"
    );
    assert_eq!(
        stored(&outcomes[2]),
        Some(2),
        "the same key again, next version"
    );
    assert_eq!(stored(&outcomes[3]), Some(1), "a request id's first use");
    assert_eq!(
        replayed(&outcomes[4]),
        Some(1),
        "its retry in the same batch"
    );
    assert_eq!(refused(&outcomes[5]), Some(None), "a delete of nothing");
    assert_eq!(
        refused(&outcomes[6]),
        Some(Some(2)),
        "set-if-absent of a live key"
    );
    assert_eq!(
        stored(&outcomes[7]),
        Some(2),
        "a compare-and-set that holds"
    );
    assert_eq!(replayed(&outcomes[8]), Some(1), "a request id used before");

    let batch = scope(ScopeType::Namespace, "batch");
    let history = store
        .history(&tenant, &batch, &key("a"), 1, 10)
        .await
        .expect("history");
    assert_eq!(
        history
            .iter()
            .map(|e| (e.version, e.value.as_ref().map(|v| v.json().clone())))
            .collect::<Vec<_>>(),
        [(1, Some(json!(1))), (2, Some(json!(2)))],
        "dense versions, nothing of the refused writes"
    );
    if db.backend == Backend::Postgres {
        // One transaction wrote the batch: its rows share one xmin.
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
            .await
            .expect("connect");
        let transactions: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT xmin::text) FROM memory_versions \
             WHERE tenant = 'g' AND key IN ('a', 'b', 'cas') AND create_time > now() - interval '1 hour' \
             AND NOT (key = 'cas' AND version = 1)",
        )
        .fetch_one(&mut conn)
        .await
        .expect("count");
        assert_eq!(transactions, 1, "the batch committed as one transaction");
    }
}

/// A write the database itself refuses (a trigger stands in for any
/// statement error) fails alone: the batch is rolled back and its writes
/// run one by one, so the others are stored once each.
async fn a_failing_write_fails_alone<S: Store>(store: S, db: &TestDb) {
    match db.backend {
        Backend::Postgres => {
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
                .await
                .expect("connect");
            sqlx::raw_sql(
                "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF NEW.key = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF; RETURN NEW; END $$; \
                 CREATE TRIGGER poison BEFORE INSERT ON memory_versions \
                 FOR EACH ROW EXECUTE FUNCTION poison()",
            )
            .execute(&mut conn)
            .await
            .expect("trigger");
        }
        Backend::Sqlite => {
            let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db.url)
                .await
                .expect("connect");
            sqlx::raw_sql(
                "CREATE TRIGGER poison BEFORE INSERT ON memory_versions \
                 WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END",
            )
            .execute(&mut conn)
            .await
            .expect("trigger");
        }
    }
    let tenant = Tenant::new("g");
    let outcomes = all_at_once(
        &store,
        &tenant,
        &[
            set("a", 1),
            set("poison", 1),
            set("a", 2).with_request("r1"),
            set("b", 1).expecting(3),
            set("a", 3).with_request("r1"),
        ],
    )
    .await;
    assert_eq!(stored(&outcomes[0]), Some(1));
    assert!(
        outcomes[1].is_err(),
        "the refused write fails: {:?}",
        outcomes[1].as_ref().ok()
    );
    assert_eq!(stored(&outcomes[2]), Some(2), "stored once, not twice");
    assert_eq!(refused(&outcomes[3]), Some(None));
    assert_eq!(replayed(&outcomes[4]), Some(2));
    let history = store
        .history(
            &tenant,
            &scope(ScopeType::Namespace, "batch"),
            &key("a"),
            1,
            10,
        )
        .await
        .expect("history");
    assert_eq!(history.len(), 2, "each write once: {history:?}");
    let poisoned = store
        .get(
            &tenant,
            &scope(ScopeType::Namespace, "batch"),
            &key("poison"),
            None,
        )
        .await
        .expect("get");
    assert!(poisoned.is_none());
}

macro_rules! single_threaded_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            use engram::ports::Database;
            $(
                #[tokio::test(flavor = "current_thread")]
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
                #[tokio::test(flavor = "current_thread")]
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

single_threaded_suite!(a_batch_keeps_each_outcome, a_failing_write_fails_alone);
