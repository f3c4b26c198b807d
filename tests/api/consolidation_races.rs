//! Writers of the same facts, raced: batches of deltas naming the same facts
//! in other orders, updates and deletes of one fact at once, and runs of
//! several rules over the same episodes. Every call
//! succeeds or is refused as it would be alone, and each fact's history is
//! one that some order of the calls would have written.

use engram::api::convert::json_to_proto;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::memory_delta::Delta;
use engram::proto::{
    AddDelta, ApplyDeltasRequest, CreateRuleRequest, DeleteDelta, DeleteFactRequest, FactKind,
    FactPayload, FactVersion, GetFactRequest, MemoryDelta, RunRuleRequest, RunRuleResponse,
    UpdateDelta,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::consolidation::{all_facts, batch, episode, provenance, rule};
use crate::helpers::{Backend, TestServer, reason};
use crate::on_both_stores;

/// Runs of the rules named, each started on its own task at once, to race.
pub(crate) fn spawn_runs(
    client: &ConsolidationServiceClient<Channel>,
    rules: &[&str],
) -> Vec<tokio::task::JoinHandle<Result<tonic::Response<RunRuleResponse>, tonic::Status>>> {
    rules
        .iter()
        .map(|id| {
            let mut client = client.clone();
            let rule_id = (*id).to_owned();
            tokio::spawn(async move {
                client
                    .run_rule(RunRuleRequest {
                        rule_id,
                        dry_run: false,
                        max_episodes: 0,
                    })
                    .await
            })
        })
        .collect()
}

fn payload(subject: &str, content: &str) -> FactPayload {
    FactPayload {
        app: "app".into(),
        user: "alice".into(),
        kind: FactKind::Semantic as i32,
        subject: subject.into(),
        predicate: "is".into(),
        object: String::new(),
        content: Some(json_to_proto(&json!(content))),
        channels: vec![],
    }
}

fn update(fact: &str, content: &str) -> MemoryDelta {
    MemoryDelta {
        delta: Some(Delta::Update(UpdateDelta {
            fact_payload: Some(payload("s", content)),
            replaces: vec![fact.to_owned()],
            provenance: Some(provenance(&["e"])),
        })),
    }
}

async fn add(client: &mut ConsolidationServiceClient<Channel>, subject: &str) -> String {
    client
        .apply_deltas(ApplyDeltasRequest {
            deltas: vec![MemoryDelta {
                delta: Some(Delta::Add(AddDelta {
                    fact_payload: Some(payload(subject, "first")),
                    provenance: Some(provenance(&["e"])),
                })),
            }],
        })
        .await
        .expect("add")
        .into_inner()
        .fact_ids
        .remove(0)
}

async fn versions(
    client: &mut ConsolidationServiceClient<Channel>,
    fact: &str,
) -> Vec<FactVersion> {
    client
        .get_fact(GetFactRequest {
            fact_id: fact.to_owned(),
            page_size: 1000,
            ..GetFactRequest::default()
        })
        .await
        .expect("get fact")
        .into_inner()
        .versions
}

/// Batches that each update the same four facts, every writer in its own
/// order: applied in delta order, two of them held a fact the other waited
/// for, and Postgres failed one. Each fact gets every update, its versions
/// dense.
async fn batches_update_the_same_facts_in_other_orders(backend: Backend) {
    const WRITERS: usize = 8;
    const EACH: usize = 20;
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let mut client = server.consolidation();
    let mut facts = Vec::new();
    for subject in ["a", "b", "c", "d"] {
        facts.push(add(&mut client, subject).await);
    }
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let mut client = server.consolidation();
        let mut facts = facts.clone();
        facts.rotate_left(writer % 4);
        if writer % 2 == 1 {
            facts.reverse();
        }
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let deltas = facts
                    .iter()
                    .map(|fact| update(fact, &format!("{writer}.{i}")))
                    .collect();
                let applied = client
                    .apply_deltas(ApplyDeltasRequest { deltas })
                    .await
                    .expect("apply")
                    .into_inner();
                assert_eq!(applied.facts_updated, 4);
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    for fact in &facts {
        let numbers: Vec<i64> = versions(&mut client, fact)
            .await
            .iter()
            .map(|v| v.version)
            .collect();
        assert_eq!(
            numbers,
            (1..=(1 + WRITERS * EACH) as i64).collect::<Vec<_>>()
        );
    }
}

/// An update, a delete delta and a `DeleteFact` of one fact at once: a
/// delete is the fact's last version, and written once. An update that
/// read the fact live before a delete committed wrote a version after
/// the tombstone (a fact deleted and live again, which no order of the
/// calls writes), and two deletes tombstoned it twice.
async fn updates_and_deletes_of_one_fact_race(backend: Backend) {
    const ROUNDS: usize = 40;
    let server = TestServer::spawn(backend).await;
    let mut client = server.consolidation();
    for round in 0..ROUNDS {
        let fact = add(&mut client, &format!("r{round}")).await;
        let mut updater = server.consolidation();
        let mut deleter = server.consolidation();
        let mut remover = server.consolidation();
        let updated = updater.apply_deltas(ApplyDeltasRequest {
            deltas: vec![update(&fact, "second")],
        });
        let deleted = deleter.apply_deltas(ApplyDeltasRequest {
            deltas: vec![MemoryDelta {
                delta: Some(Delta::Delete(DeleteDelta {
                    app: "app".into(),
                    user: "alice".into(),
                    replaces: vec![fact.clone()],
                    provenance: Some(provenance(&["e"])),
                })),
            }],
        });
        let removed = remover.delete_fact(DeleteFactRequest {
            fact_id: fact.clone(),
        });
        let (updated, deleted, removed) = tokio::join!(updated, deleted, removed);
        updated.expect("update");
        let deletes = deleted.expect("delete delta").into_inner().facts_deleted;
        let removes = match removed {
            Ok(_) => 1,
            Err(err) => {
                assert_eq!(
                    (err.code(), reason(&err)),
                    (Code::NotFound, "FACT_NOT_FOUND".to_owned())
                );
                0
            }
        };
        let history = versions(&mut client, &fact).await;
        let tombstones: Vec<usize> = history
            .iter()
            .enumerate()
            .filter(|(_, v)| v.deleted)
            .map(|(at, _)| at)
            .collect();
        assert_eq!(
            tombstones,
            [history.len() - 1],
            "round {round}: versions {:?}",
            history
                .iter()
                .map(|v| (v.version, v.deleted))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            deletes + removes,
            1,
            "round {round}: one delete tombstones it"
        );
    }
}

/// Three rules over the same episodes run at once, round after round: an
/// episode about a subject the owner has a live fact for updates it, so
/// each subject keeps one live fact, as when the runs go one at a time.
/// (Each run read the owner's facts before another's add committed, and
/// each added one.)
async fn runs_of_rules_over_one_subject_keep_one_fact(backend: Backend) {
    const ROUNDS: usize = 20;
    let server = TestServer::spawn(backend).await;
    let mut client = server.consolidation();
    for id in ["r1", "r2", "r3"] {
        client
            .create_rule(CreateRuleRequest {
                rule: Some(rule(id, "metadata.learn = true", false)),
                ..CreateRuleRequest::default()
            })
            .await
            .expect("create rule");
    }
    let mut episodes = server.episodes();
    for round in 0..ROUNDS {
        let about =
            json!({"learn": true, "subject": format!("s{}", round % 4), "predicate": "likes"});
        episodes
            .append_episodes(batch(
                "learning",
                "alice",
                vec![episode(&format!("e{round}"), "note", about)],
            ))
            .await
            .expect("append");
        let runs = spawn_runs(&server.consolidation(), &["r1", "r2", "r3"]);
        for run in runs {
            run.await.expect("run task").expect("run");
        }
    }
    let facts = all_facts(&mut client).await;
    let mut subjects: Vec<String> = facts
        .iter()
        .filter_map(|f| {
            f.current
                .as_ref()
                .map(|v| format!("{}/{}", v.subject, v.predicate))
        })
        .collect();
    subjects.sort();
    assert_eq!(subjects, ["s0/likes", "s1/likes", "s2/likes", "s3/likes"]);
}

/// A batch over the facts of 200 owners holds its owners through at most
/// 64 advisory locks (Postgres keeps them in a shared table that its
/// default settings size for 64 per connection, so a lock per owner would
/// run it out under a few such batches). Seen in `pg_locks` while the
/// batch waits for a fact the test holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_many_owners_takes_few_locks() {
    const OWNERS: usize = 200;
    let server = TestServer::spawn(Backend::Postgres).await;
    let mut client = server.consolidation();
    let adds = (0..OWNERS)
        .map(|n| MemoryDelta {
            delta: Some(Delta::Add(AddDelta {
                fact_payload: Some(FactPayload {
                    user: format!("u{n}"),
                    ..payload("s", "first")
                }),
                provenance: Some(provenance(&["e"])),
            })),
        })
        .collect();
    let facts = client
        .apply_deltas(ApplyDeltasRequest { deltas: adds })
        .await
        .expect("add")
        .into_inner()
        .fact_ids;
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    sqlx::raw_sql("BEGIN")
        .execute(&mut db)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM facts WHERE id = $1 FOR UPDATE")
        .bind(&facts[OWNERS - 1])
        .execute(&mut db)
        .await
        .expect("hold the last fact");
    let updates: Vec<MemoryDelta> = facts
        .iter()
        .enumerate()
        .map(|(n, fact)| MemoryDelta {
            delta: Some(Delta::Update(UpdateDelta {
                fact_payload: Some(FactPayload {
                    user: format!("u{n}"),
                    ..payload("s", "second")
                }),
                replaces: vec![fact.clone()],
                provenance: Some(provenance(&["e"])),
            })),
        })
        .collect();
    let mut writer = server.consolidation();
    let batch = tokio::spawn(async move {
        writer
            .apply_deltas(ApplyDeltasRequest { deltas: updates })
            .await
    });
    let mut watcher = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let held = loop {
        // The advisory locks of the backend of this database that waits.
        let held: Option<i64> = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM pg_locks a WHERE a.pid = w.pid \
               AND a.locktype = 'advisory' AND a.granted) \
             FROM pg_locks w JOIN pg_stat_activity s ON s.pid = w.pid \
             WHERE NOT w.granted AND s.datname = current_database() LIMIT 1",
        )
        .fetch_optional(&mut watcher)
        .await
        .expect("read pg_locks");
        if let Some(held) = held {
            break held;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the batch never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut db)
        .await
        .expect("rollback");
    let applied = batch
        .await
        .expect("batch task")
        .expect("apply")
        .into_inner();
    assert_eq!(applied.facts_updated, OWNERS as i64);
    assert!(
        (1..=64).contains(&held),
        "{held} advisory locks for {OWNERS} owners"
    );
}

on_both_stores!(
    batches_update_the_same_facts_in_other_orders,
    updates_and_deletes_of_one_fact_race,
    runs_of_rules_over_one_subject_keep_one_fact,
);
