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
use engram::sessions::{Episode, EpisodeType};
use serde_json::json;

use super::fixtures::{episode, id, log, owner, recent as query};
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
    // One poll queues them all; the flusher has not run yet (it is a task
    // of this single thread's runtime).
    assert_eq!(
        tokio::runtime::Handle::current().runtime_flavor(),
        tokio::runtime::RuntimeFlavor::CurrentThread
    );
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

/// Plain sets of distinct keys next to each other in lock order share
/// statements (one on Postgres, three on SQLite); a key set twice, or a
/// conditional write between them, splits the run. Every write still gets its own dense
/// version, its value at that version, and its own change in the feed.
async fn plain_sets_share_a_statement<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("g");
    let before = all_at_once(&store, &tenant, &[set("m2", 0), set("m2", 0)]).await;
    assert_eq!(
        before.iter().map(stored).collect::<Vec<_>>(),
        [Some(1), Some(2)]
    );
    let outcomes = all_at_once(
        &store,
        &tenant,
        &[
            set("m3", 31),
            set("m1", 11),
            set("m2", 21),
            set("m3", 32).expecting(1),
            set("m2", 22),
            set("m4", 41),
            set("m5", 51).expecting(0),
            set("m6", 61),
        ],
    )
    .await;
    assert_eq!(
        outcomes.iter().map(stored).collect::<Vec<_>>(),
        [
            Some(1),
            Some(1),
            Some(3),
            Some(2),
            Some(4),
            Some(1),
            Some(1),
            Some(1)
        ],
        "each write its own version, a key's writes in the batch's order"
    );
    let batch = scope(ScopeType::Namespace, "batch");
    for (name, expected) in [
        ("m1", vec![(1, 11)]),
        ("m2", vec![(1, 0), (2, 0), (3, 21), (4, 22)]),
        ("m3", vec![(1, 31), (2, 32)]),
        ("m4", vec![(1, 41)]),
        ("m6", vec![(1, 61)]),
    ] {
        let history = store
            .history(&tenant, &batch, &key(name), 1, 10)
            .await
            .expect("history");
        assert_eq!(
            history
                .iter()
                .map(|e| (e.version, e.value.as_ref().map(|v| v.json().clone())))
                .collect::<Vec<_>>(),
            expected
                .iter()
                .map(|(v, n)| (*v, Some(json!(n))))
                .collect::<Vec<_>>(),
            "{name}: each value at its version"
        );
    }
    let changes = store
        .changes(&tenant, &batch, &Default::default(), 0, i64::MAX, 100)
        .await
        .expect("changes")
        .changes;
    let mut seen: Vec<(String, i64)> = changes
        .iter()
        .map(|c| (c.key.as_str().to_owned(), c.version))
        .collect();
    assert!(
        changes.windows(2).all(|w| w[0].revision < w[1].revision),
        "revisions increase"
    );
    seen.sort();
    assert_eq!(
        seen,
        [
            ("m1", 1),
            ("m2", 1),
            ("m2", 2),
            ("m2", 3),
            ("m2", 4),
            ("m3", 1),
            ("m3", 2),
            ("m4", 1),
            ("m5", 1),
            ("m6", 1)
        ]
        .map(|(k, v)| (k.to_owned(), v)),
        "one change per stored write"
    );
}

/// A write the database itself refuses (a trigger stands in for any
/// statement error) fails alone: the batch is rolled back and its writes
/// run one by one, so the others are stored once each.
async fn a_failing_write_fails_alone<S: Store>(store: S, db: &TestDb) {
    let poison = match db.backend {
        Backend::Postgres => {
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.key = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER poison BEFORE INSERT ON memory_versions \
             FOR EACH ROW EXECUTE FUNCTION poison()"
        }
        Backend::Sqlite => {
            "CREATE TRIGGER poison BEFORE INSERT ON memory_versions \
             WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
        }
    };
    db.execute(poison.to_owned()).await;
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

/// One append per session, of that session's episodes, by one owner,
/// with no limits.
fn appends_of<'a>(
    sessions: &'a [engram::sessions::Id],
    episodes: &'a [[engram::sessions::NewEpisode; 1]],
    owner: &'a engram::sessions::Owner,
) -> Vec<engram::sessions::ports::Append<'a>> {
    sessions
        .iter()
        .zip(episodes)
        .map(|(session_id, episodes)| engram::sessions::ports::Append {
            session_id,
            owner,
            episodes,
            now: super::fixtures::now(),
            max_sessions: 0,
            max_events: 0,
            create: true,
        })
        .collect()
}

/// Appends of a group, each with its own outcome: stored, a replay, an
/// owner mismatch, an ended session, no session, a clashing id, and one
/// past the per-session limit that evicts. On Postgres an append first
/// queues a blind write (see `store/postgres/sessions.rs`), and the group
/// is formed behind commits held up by row locks (two: appends have two
/// groups in flight there); those the blind write
/// cannot take read and write again. On SQLite the whole append is in the
/// group, and one poll queues them all; there too the appends to distinct
/// sessions are written blind together, and those that cannot be read and
/// answer on their own.
async fn appends_in_a_group_keep_each_outcome<S: Store>(store: S, db: &TestDb) {
    use engram::sessions::ports::{Append, Appended};
    use engram::sessions::{NewEpisode, Owner};

    use super::fixtures::{episode, id, log, now, owner};

    let l = log(&store, "g");
    for (session, user) in [
        ("gate", "alice"),
        ("gate2", "alice"),
        ("s1", "alice"),
        ("ended", "alice"),
        ("s2", "bob"),
        ("limit", "alice"),
    ] {
        l.create(session, "app", user, 0).await;
    }
    let on = |session: &str, episode_id: &str, content: serde_json::Value| {
        episode(
            &id(session),
            Some(episode_id),
            Some("observation"),
            None,
            content,
        )
    };
    l.append("s1", &[on("s1", "e1", json!("one"))]).await;
    l.append_as(
        "s2",
        &owner("app", "bob"),
        &[on("s2", "dup", json!("x"))],
        0,
    )
    .await;
    l.append(
        "limit",
        &[on("limit", "l1", json!(1)), on("limit", "l2", json!(2))],
    )
    .await;
    store
        .end_session(&l.tenant, &id("ended"), &Owner::default(), now(), false)
        .await
        .expect("end")
        .expect("ended");

    let alice = owner("app", "alice");
    let planned: Vec<(&str, Owner, Vec<NewEpisode>, i64)> = vec![
        ("s1", alice.clone(), vec![on("s1", "e2", json!("two"))], 0),
        (
            "s1",
            owner("app", "bob"),
            vec![on("s1", "x1", json!("bob's"))],
            0,
        ),
        (
            "ended",
            alice.clone(),
            vec![on("ended", "x2", json!("late"))],
            0,
        ),
        (
            "s-new",
            owner("app", "carol"),
            vec![on("s-new", "c1", json!("hi"))],
            0,
        ),
        (
            "s-none",
            Owner::default(),
            vec![on("s-none", "x3", json!("lost"))],
            0,
        ),
        (
            "s2",
            owner("app", "bob"),
            vec![on("s2", "dup", json!("y"))],
            0,
        ),
        ("s1", alice.clone(), vec![on("s1", "e1", json!("one"))], 0),
        ("limit", alice.clone(), vec![on("limit", "l3", json!(3))], 2),
        ("s1", alice.clone(), vec![on("s1", "e3", json!("three"))], 0),
    ];
    let ids: Vec<_> = planned.iter().map(|(session, ..)| id(session)).collect();
    let appends: Vec<Append<'_>> = planned
        .iter()
        .zip(&ids)
        .map(|((_, owner, episodes, max_events), session_id)| Append {
            session_id,
            owner,
            episodes,
            now: now(),
            max_sessions: 0,
            max_events: *max_events,
            create: true,
        })
        .collect();
    let tenant = l.tenant.clone();
    let outcomes = match db.backend {
        Backend::Sqlite => {
            let mut all = pin!(futures::future::join_all(
                appends.iter().map(|append| store.append(&tenant, append))
            ));
            assert!(futures::poll!(all.as_mut()).is_pending());
            all.await
        }
        Backend::Postgres => {
            // Hold the gate sessions' rows, so each gate's append commits
            // only when told to and the others queue behind them (appends
            // have two groups in flight on Postgres: one gate each).
            let mut holder = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
                .await
                .expect("connect");
            sqlx::raw_sql("BEGIN; SELECT 1 FROM sessions WHERE id IN ('gate', 'gate2') FOR UPDATE")
                .execute(&mut holder)
                .await
                .expect("lock the gates");
            let gates = [
                [on("gate", "g1", json!("gate"))],
                [on("gate2", "g2", json!("gate"))],
            ];
            let gate_ids = [id("gate"), id("gate2")];
            let gate_appends = appends_of(&gate_ids, &gates, &alice);
            let mut watcher = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
                .await
                .expect("connect");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            // One gate after the other (together they would share a group),
            // until both gates' commits wait on the locks.
            let mut first_gate = pin!(store.append(&tenant, &gate_appends[0]));
            let mut second_gate = pin!(store.append(&tenant, &gate_appends[1]));
            for waiters in [1, 2] {
                loop {
                    assert!(futures::poll!(first_gate.as_mut()).is_pending());
                    if waiters == 2 {
                        assert!(futures::poll!(second_gate.as_mut()).is_pending());
                    }
                    let waiting: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    )
                    .fetch_one(&mut watcher)
                    .await
                    .expect("activity");
                    if waiting >= waiters {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the gates never waited"
                    );
                }
            }
            let mut gate_done = pin!(futures::future::join(first_gate, second_gate));
            let mut all = pin!(futures::future::join_all(
                appends.iter().map(|append| store.append(&tenant, append))
            ));
            // Every append queues its blind write first (no reads): all
            // nine. Those the blind write cannot take (a new session,
            // someone else's, an ended one, a retried id) read and write
            // again after the group.
            while store.pool_status().queued_writes < 9 {
                assert!(futures::poll!(all.as_mut()).is_pending());
                assert!(futures::poll!(gate_done.as_mut()).is_pending());
                assert!(
                    std::time::Instant::now() < deadline,
                    "the appends never queued"
                );
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            sqlx::raw_sql("COMMIT")
                .execute(&mut holder)
                .await
                .expect("release");
            let (outcomes, gated) = tokio::join!(all, gate_done);
            for gate in [gated.0, gated.1] {
                assert!(matches!(gate, Ok(Appended::Stored(_))), "{gate:?}");
            }
            outcomes
        }
    };
    let seqs = |n: usize| -> Vec<(i64, bool)> {
        match &outcomes[n] {
            Ok(Appended::Stored(done)) => done
                .iter()
                .map(|(e, replayed)| (e.seq, *replayed))
                .collect(),
            other => panic!("append {n}: {other:?}"),
        }
    };
    assert!(
        matches!(&outcomes[1], Ok(Appended::Refused(s)) if s.user == "alice"),
        "{:?}",
        outcomes[1]
    );
    assert!(
        matches!(&outcomes[2], Ok(Appended::Refused(s)) if s.end_time.is_some()),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(seqs(3), vec![(1, false)], "the session is created");
    assert!(
        matches!(&outcomes[4], Ok(Appended::NoSession)),
        "{:?}",
        outcomes[4]
    );
    assert!(
        matches!(&outcomes[5], Ok(Appended::Conflict(clash)) if clash == "dup"),
        "{:?}",
        outcomes[5]
    );
    assert_eq!(seqs(6), vec![(1, true)], "a replay");
    assert_eq!(seqs(7), vec![(3, false)]);
    // Two appends to s1 in one group take 2 and 3, in the order they
    // joined it (on Postgres, whichever finished its reads first).
    let mut s1_seqs = [seqs(0), seqs(8)].concat();
    s1_seqs.sort();
    assert_eq!(s1_seqs, vec![(2, false), (3, false)]);

    let s1 = store
        .get_session(&tenant, &id("s1"))
        .await
        .expect("get")
        .expect("s1");
    assert_eq!((s1.last_seq, s1.episode_count), (3, 3), "dense, each once");
    let limit = store
        .get_session(&tenant, &id("limit"))
        .await
        .expect("get")
        .expect("limit");
    assert_eq!(
        (limit.episode_count, limit.episodes_evicted),
        (2, 1),
        "the limit evicted the oldest"
    );
    // Each episode stored where its own append put it (the appends to
    // distinct sessions shared statements: one on Postgres, two on SQLite).
    for (episode_id, session, seq, content) in [
        ("e2", "s1", None, json!("two")),
        ("e3", "s1", None, json!("three")),
        ("l3", "limit", Some(3), json!(3)),
        ("c1", "s-new", Some(1), json!("hi")),
    ] {
        let stored = store
            .get_episode(&tenant, &id(episode_id))
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("{episode_id} stored"));
        assert_eq!(
            (
                stored.session_id.as_str(),
                stored.content,
                stored.agent.as_str()
            ),
            (session, content, "app"),
            "{episode_id}"
        );
        if let Some(seq) = seq {
            assert_eq!(stored.seq, seq, "{episode_id}");
        }
    }
    // Retried alone, appends the group stored are replays: their
    // fingerprints were stored as given.
    for at in [3, 7] {
        let retry = store.append(&tenant, &appends[at]).await.expect("retry");
        assert!(
            matches!(&retry, Appended::Stored(done) if done.iter().all(|(_, replayed)| *replayed)),
            "append {at} again: {retry:?}"
        );
    }
    assert!(
        store
            .get_episode(&tenant, &id("x1"))
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .get_episode(&tenant, &id("x2"))
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .get_session(&tenant, &id("s-none"))
            .await
            .expect("get")
            .is_none()
    );
    if db.backend == Backend::Postgres {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
            .await
            .expect("connect");
        let transactions: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT xmin::text) FROM episodes WHERE tenant = 'g' \
             AND id IN ('e2', 'e3', 'l3')",
        )
        .fetch_one(&mut conn)
        .await
        .expect("count");
        assert_eq!(
            transactions, 1,
            "the three blind writes committed as one transaction"
        );
    }
}

/// Two appends of one group to distinct sessions with the same new
/// episode id: one is stored, the other refused as a clash, and its
/// session is untouched. On SQLite they share the blind statements, whose
/// insert then fails, so each runs alone.
async fn appends_clashing_across_sessions<S: Store>(store: S, _db: &TestDb) {
    use engram::sessions::NewEpisode;
    use engram::sessions::ports::Appended;

    use super::fixtures::{episode, id, log, owner};

    let l = log(&store, "g");
    l.create("a", "app", "alice", 0).await;
    l.create("b", "app", "alice", 0).await;
    let alice = owner("app", "alice");
    let sessions = [id("a"), id("b")];
    let contents = [json!("in a"), json!("in b")];
    let episodes: Vec<[NewEpisode; 1]> = sessions
        .iter()
        .zip(&contents)
        .map(|(session, content)| {
            [episode(
                session,
                Some("same"),
                Some("observation"),
                None,
                content.clone(),
            )]
        })
        .collect();
    let appends = appends_of(&sessions, &episodes, &alice);
    let outcomes =
        futures::future::join_all(appends.iter().map(|append| store.append(&l.tenant, append)))
            .await;
    let stored: Vec<usize> = (0..2)
        .filter(|&at| matches!(outcomes[at], Ok(Appended::Stored(_))))
        .collect();
    assert_eq!(stored.len(), 1, "{outcomes:?}");
    let (kept, refused) = (stored[0], 1 - stored[0]);
    assert!(
        matches!(&outcomes[refused], Ok(Appended::Conflict(clash)) if clash == "same"),
        "{outcomes:?}"
    );
    let untouched = store
        .get_session(&l.tenant, &sessions[refused])
        .await
        .expect("get")
        .expect("session");
    assert_eq!(
        (untouched.last_seq, untouched.episode_count),
        (0, 0),
        "the refused append wrote nothing"
    );
    let episode = store
        .get_episode(&l.tenant, &id("same"))
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(
        (episode.session_id.as_str(), episode.seq, episode.content),
        (sessions[kept].as_str(), 1, contents[kept].clone())
    );
}

/// Gets that arrive together are read together (one statement on
/// Postgres), and each finds its own key: a live one, one read twice, a
/// tombstone, one never written, one of another scope.
async fn gets_in_a_group_each_find_their_key<S: Store>(store: S, _db: &TestDb) {
    let tenant = Tenant::new("g");
    let outcomes = all_at_once(
        &store,
        &tenant,
        &[
            set("a", 1),
            set("b", 1),
            set("b", 2),
            set("gone", 1),
            Planned {
                value: None,
                ..set("gone", 0)
            },
        ],
    )
    .await;
    assert!(outcomes.iter().all(|o| stored(o).is_some()), "{outcomes:?}");
    let (batch, other) = (
        scope(ScopeType::Namespace, "batch"),
        scope(ScopeType::Namespace, "other"),
    );
    let asked = [
        (&batch, key("a")),
        (&batch, key("b")),
        (&batch, key("a")),
        (&batch, key("gone")),
        (&batch, key("never")),
        (&other, key("a")),
    ];
    let mut all = pin!(futures::future::join_all(
        asked
            .iter()
            .map(|(scope, key)| store.get(&tenant, scope, key, None))
    ));
    assert!(futures::poll!(all.as_mut()).is_pending());
    let found: Vec<Option<(i64, bool, Option<serde_json::Value>)>> = all
        .await
        .into_iter()
        .map(|got| {
            got.expect("get")
                .map(|e| (e.version, e.deleted, e.value.map(|v| v.json().clone())))
        })
        .collect();
    assert_eq!(
        found,
        [
            Some((1, false, Some(json!(1)))),
            Some((2, false, Some(json!(2)))),
            Some((1, false, Some(json!(1)))),
            Some((2, true, None)),
            None,
            None,
        ]
    );
}

/// `Recent` reads that arrive together are read together on Postgres (one
/// statement per level of those asked more than once), and each gets what
/// it gets alone: by user, limit, types, session, agent, another user's,
/// a user with nothing.
async fn recents_in_a_group_each_get_their_episodes<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "r");
    l.create("s1", "app", "alice", 0).await;
    l.create("s2", "app", "alice", 0).await;
    l.create("s3", "app", "bob", 0).await;
    let (s1, s2, s3) = (id("s1"), id("s2"), id("s3"));
    l.append(
        "s1",
        &[
            episode(&s1, Some("a1"), Some("user_message"), None, json!(1)),
            episode(&s1, Some("a2"), Some("tool_call"), Some("tools"), json!(2)),
            episode(
                &s1,
                Some("a3"),
                Some("agent_response"),
                Some("bot"),
                json!(3),
            ),
        ],
    )
    .await;
    l.append(
        "s2",
        &[episode(
            &s2,
            Some("b1"),
            Some("user_message"),
            None,
            json!(4),
        )],
    )
    .await;
    let bob = [episode(
        &s3,
        Some("c1"),
        Some("user_message"),
        None,
        json!(5),
    )];
    l.append_as("s3", &owner("app", "bob"), &bob, 0).await;

    let types = |names: &[&str]| {
        names
            .iter()
            .map(|n| EpisodeType::parse("type", *n).expect("type"))
            .collect::<Vec<_>>()
    };
    let asked = [
        query("alice", None, None, vec![], 10),
        query("alice", None, None, vec![], 2),
        query("alice", None, None, types(&["user_message"]), 10),
        query("alice", Some("s1"), None, vec![], 10),
        query("alice", Some("s1"), Some("tools"), vec![], 10),
        query("alice", Some("s1"), Some("bot"), vec![], 10),
        query(
            "alice",
            Some("s2"),
            None,
            types(&["tool_call", "user_message"]),
            10,
        ),
        query("bob", None, None, vec![], 10),
        query("carol", None, None, vec![], 10),
        query("alice", None, Some("bot"), vec![], 10),
    ];
    let ids = |episodes: Vec<Episode>| episodes.into_iter().map(|e| e.id).collect::<Vec<_>>();
    let mut all = pin!(futures::future::join_all(
        asked.iter().map(|q| store.recent(&l.tenant, q))
    ));
    assert!(futures::poll!(all.as_mut()).is_pending());
    let together: Vec<Vec<String>> = all
        .await
        .into_iter()
        .map(|found| ids(found.expect("recent")))
        .collect();
    let expected: [&[&str]; 10] = [
        &["b1", "a3", "a2", "a1"],
        &["b1", "a3"],
        &["b1", "a1"],
        &["a3", "a2", "a1"],
        &["a2"],
        &["a3"],
        &["b1"],
        &["c1"],
        &[],
        &["a3"],
    ];
    assert_eq!(together, expected);
    for (q, expected) in asked.iter().zip(expected) {
        let alone = ids(store.recent(&l.tenant, q).await.expect("recent"));
        assert_eq!(alone, expected, "{q:?} alone");
    }
}

store_suite!(
    single_threaded;
    a_batch_keeps_each_outcome,
    a_failing_write_fails_alone,
    plain_sets_share_a_statement,
    appends_in_a_group_keep_each_outcome,
    appends_clashing_across_sessions,
    gets_in_a_group_each_find_their_key,
    recents_in_a_group_each_get_their_episodes,
);
