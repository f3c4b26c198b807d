//! The settled horizon of each feed: every position at or below it is
//! final. A writer that took a position but has not committed is waited
//! for (Postgres) or holds a position above the horizon (SQLite, whose one
//! writer commits positions in order): never skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engram::ports::{Database, Feed, Feeds, Store};
use engram::store::PgStore;
use serde_json::json;
use sqlx::{Connection, Executor};

use super::{Writer, writer};
use crate::helpers::{Backend, TestDb};

/// A settle of the change feed started now, checked to be still waiting
/// 300 ms later (`why` says what it must not have passed).
async fn held_back<S: Store>(
    store: &S,
    why: &str,
) -> tokio::task::JoinHandle<engram::error::Result<i64>> {
    let mut settle = tokio::spawn({
        let store = store.clone();
        async move { store.settled(Feed::Changes).await }
    });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut settle).await;
    assert!(early.is_err(), "{why}: {early:?}");
    settle
}

/// The keys and versions of the changes to `w`'s scope up to `settled`.
async fn changed<S: Store>(store: &S, w: &Writer<'_, S>, settled: i64) -> Vec<(String, i64)> {
    let changes = store
        .changes(&w.tenant, &w.scope, &Default::default(), 0, settled, 10)
        .await
        .expect("changes")
        .changes;
    changes
        .iter()
        .map(|c| (c.key.as_str().to_owned(), c.version))
        .collect()
}

/// The horizons cover every committed write, and the shared horizon
/// follows them.
async fn horizons_cover_committed_writes<S: Store>(store: S, _db: &TestDb) {
    let mut horizon = store.horizon(Feed::Changes).await.expect("horizon");
    let w = writer(&store, "t1");
    w.set("k", json!(1)).await;
    let settled = store.settled(Feed::Changes).await.expect("settled");
    let changes = store
        .changes(&w.tenant, &w.scope, &Default::default(), 0, settled, 10)
        .await
        .expect("changes")
        .changes;
    assert_eq!(
        changes.len(),
        1,
        "the write is at or below the settled horizon"
    );
    // The shared horizon reaches it too (woken by the write).
    tokio::time::timeout(Duration::from_secs(10), horizon.wait_for(|h| *h >= settled))
        .await
        .expect("the shared horizon moves within the poll interval")
        .expect("horizon open");
    let episodes = store.settled(Feed::Episodes).await.expect("settled");
    assert!(episodes >= 0);
}

/// A transaction that took a revision and has not committed: the settled
/// horizon never passes it while it is open, and covers it once it commits.
/// On Postgres a later write commits first, so the newest committed
/// revision is above the open one: a settle must wait for it rather than
/// hand out the newer revision and skip the older.
async fn a_late_committer_is_waited_for<S: Store>(store: S, db: &TestDb) {
    let w = writer(&store, "t1");
    w.set("before", json!(1)).await;
    let insert = "INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, \
                  create_time) VALUES ('t1', 1, 'ns', 'late', 1, 1, 0) RETURNING revision";
    match db.backend {
        Backend::Postgres => {
            let mut late = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            late.execute("BEGIN").await.expect("begin");
            let revision: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(insert.replace(", 0)", ", now())")))
                    .fetch_one(&mut late)
                    .await
                    .expect("insert");
            w.set("after", json!(3)).await;
            // Open, it holds the horizon back: the settle is still waiting.
            let settle =
                held_back(&store, "settled returned while a lower revision was open").await;
            late.execute("COMMIT").await.expect("commit");
            let settled = settle.await.expect("task").expect("settled");
            assert!(settled >= revision, "settled {settled} skipped {revision}");
        }
        Backend::Sqlite => {
            let mut late = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            late.execute("BEGIN IMMEDIATE").await.expect("begin");
            let revision: i64 = sqlx::query_scalar(insert)
                .fetch_one(&mut late)
                .await
                .expect("insert");
            let settled = store.settled(Feed::Changes).await.expect("settled");
            assert!(
                settled < revision,
                "settled {settled} covers uncommitted {revision}"
            );
            late.execute("COMMIT").await.expect("commit");
            let settled = store.settled(Feed::Changes).await.expect("settled");
            assert!(settled >= revision);
        }
    }
    let changes = store
        .changes(
            &w.tenant,
            &w.scope,
            &Default::default(),
            0,
            store.settled(Feed::Changes).await.expect("settled"),
            10,
        )
        .await
        .expect("changes")
        .changes;
    let keys: Vec<&str> = changes.iter().map(|c| c.key.as_str()).collect();
    match db.backend {
        Backend::Postgres => assert_eq!(keys, vec!["before", "late", "after"]),
        Backend::Sqlite => assert_eq!(keys, vec!["before", "late"]),
    }
}

store_suite!(
    horizons_cover_committed_writes,
    a_late_committer_is_waited_for
);

/// On Postgres, what a horizon reads as a feed's newest position is never
/// ahead of what its sequence has handed out, even while `nextval` is busy
/// WAL-logging values ahead. (Selecting `last_value` from the sequence
/// relation ran ahead at those moments; the horizon then passed positions
/// writers took after its fence, and a watcher skipped a change.) Raced
/// inside the database: at a round trip per read the moment comes too
/// rarely to meet. The truth is the sequence read under its lock after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_horizons_never_read_ahead_of_the_sequence() {
    const READS: u32 = 600_000;
    let db = TestDb::new(Backend::Postgres).await;
    db.pg_store().await.migrate().await.expect("migrate");
    for (feed, sequence) in [
        (Feed::Changes, "memory_changes_revision_seq"),
        (Feed::Episodes, "episodes_cursor_seq"),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let mut takers = Vec::new();
        for _ in 0..2 {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            let stop = stop.clone();
            let take = format!("SELECT max(nextval('{sequence}')) FROM generate_series(1, 200)");
            takers.push(tokio::spawn(async move {
                let mut taken = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    conn.execute(sqlx::AssertSqlSafe(take.clone()))
                        .await
                        .expect("nextval");
                    taken += 1;
                }
                taken
            }));
        }
        let race = format!(
            "DO $$ DECLARE read bigint; truth bigint; ahead int := 0; most bigint := 0; \
             BEGIN FOR i IN 1..{READS} LOOP \
               SELECT {read} INTO read; \
               truth := coalesce(pg_sequence_last_value('{sequence}'), 0); \
               IF read > truth THEN ahead := ahead + 1; most := greatest(most, read - truth); \
               END IF; \
             END LOOP; \
             IF ahead > 0 THEN RAISE EXCEPTION 'read ahead % times, by up to %', ahead, most; \
             END IF; END $$",
            read = PgStore::newest_position_sql(feed),
        );
        let mut reader = sqlx::PgConnection::connect(&db.url).await.expect("connect");
        let raced = reader.execute(sqlx::AssertSqlSafe(race)).await;
        stop.store(true, Ordering::Relaxed);
        for taker in takers {
            let taken = taker.await.expect("taker");
            assert!(taken > 0, "{sequence}: the writers ran during the reads");
        }
        if let Err(err) = raced {
            panic!("{sequence}: {err}");
        }
    }
}

/// On Postgres, a transaction left open in another database of the same
/// cluster holds no feed back. Transaction ids are cluster-wide, so the
/// snapshot's xmin stays below it, but only this database's transactions
/// can hold a position: the settle looks the running ids up and finds it
/// elsewhere. (It used to wait for xmin alone: a batch job on a shared
/// cluster stalled every watch and tail for as long as it ran.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_feeds_do_not_wait_for_other_databases() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.pg_store().await;
    store.migrate().await.expect("migrate");
    let elsewhere = TestDb::new(Backend::Postgres).await;
    let mut open = sqlx::PgConnection::connect(&elsewhere.url)
        .await
        .expect("connect");
    open.execute("BEGIN").await.expect("begin");
    let held: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut open)
        .await
        .expect("take an id");

    let w = writer(&store, "t1");
    let written = w.set("k", json!(1)).await;
    let waited = || format!("the settle waited for transaction {held} of another database");
    let within = Duration::from_secs(20);
    // The shared horizon's first value is a settle too.
    let mut horizon = tokio::time::timeout(within, store.horizon(Feed::Changes))
        .await
        .unwrap_or_else(|_| panic!("{}", waited()))
        .expect("horizon");
    let settled = tokio::time::timeout(within, store.settled(Feed::Changes))
        .await
        .unwrap_or_else(|_| panic!("{}", waited()))
        .expect("settled");
    assert_eq!(
        changed(&store, &w, settled).await,
        [("k".to_owned(), written.version)]
    );
    tokio::time::timeout(within, horizon.wait_for(|h| *h >= settled))
        .await
        .expect("the shared horizon moves past the write")
        .expect("horizon open");
    let episodes = tokio::time::timeout(within, store.settled(Feed::Episodes))
        .await
        .unwrap_or_else(|_| panic!("{}", waited()));
    assert!(episodes.is_ok());

    // A transaction of this database with an id still holds it back.
    let mut here = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    here.execute("BEGIN").await.expect("begin");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut here)
        .await
        .expect("take an id");
    w.set("k", json!(2)).await;
    let settle = held_back(&store, "settled past an open transaction of this database").await;
    here.execute("COMMIT").await.expect("commit");
    settle.await.expect("task").expect("settled");
    open.execute("COMMIT").await.expect("commit");
}

/// On Postgres, where the cluster refuses `pg_stat_activity` to the
/// server's role (some hardened set-ups revoke it from PUBLIC), a settle
/// behind a long transaction of another database falls back to waiting
/// for it, as every settle did before it could look the running ids up,
/// and returns once it ends: held back, never failed. (It used to fail
/// with "permission denied" once xmin stayed put: an as-of read answered
/// INTERNAL, and the horizon task logged and retried.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_settles_wait_on_xmin_where_activity_is_refused() {
    use crate::helpers::{APP_ROLE, as_user, create_app_role};

    let db = TestDb::new(Backend::Postgres).await;
    let owner = db.pg_store().await;
    owner.migrate().await.expect("migrate");
    let mut admin = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    create_app_role(&mut admin).await;
    owner.grant_to(APP_ROLE).await.expect("grant");
    // The catalog's views are per database: this revokes it here only.
    admin
        .execute("REVOKE SELECT ON pg_catalog.pg_stat_activity FROM PUBLIC")
        .await
        .expect("revoke");
    let store = PgStore::connect(
        &as_user(&db.url, APP_ROLE),
        &engram::config::Config::defaults().store,
    )
    .await
    .expect("connect as the app role");

    let elsewhere = TestDb::new(Backend::Postgres).await;
    let mut open = sqlx::PgConnection::connect(&elsewhere.url)
        .await
        .expect("connect");
    open.execute("BEGIN").await.expect("begin");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut open)
        .await
        .expect("take an id");

    let w = writer(&store, "t1");
    let written = w.set("k", json!(1)).await;
    let settle = held_back(&store, "the settle failed or passed a running transaction").await;
    open.execute("COMMIT").await.expect("commit");
    let settled = settle.await.expect("task").expect("settled");
    assert_eq!(
        changed(&store, &w, settled).await,
        [("k".to_owned(), written.version)]
    );
    // Later settles, and the shared horizon, keep working.
    w.set("k", json!(2)).await;
    let again = store.settled(Feed::Changes).await.expect("settled");
    assert!(again > settled);
    let mut horizon = store.horizon(Feed::Changes).await.expect("horizon");
    tokio::time::timeout(Duration::from_secs(20), horizon.wait_for(|h| *h >= again))
        .await
        .expect("the shared horizon moves past the write")
        .expect("horizon open");
}
