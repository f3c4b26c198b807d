//! `ConsolidationService`: the classification table with lineage, the
//! filter language at the edge, provenance, facts as versioned records, and
//! exactly-once promotion under concurrent runs, two schedulers and a crash.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use engram::api::convert::json_to_proto;
use engram::proto::consolidation_rule::Cadence;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::memory_delta::Delta;
use engram::proto::{
    AddDelta, AppendEpisodesRequest, ApplyDeltasRequest, ConsolidationRule, CreateRuleRequest,
    DeleteFactRequest, DeleteRuleRequest, DeltaProvenance, Fact, FactKind, FactPayload,
    GetFactRequest, GetRuleRequest, ListFactsRequest, ListRulesRequest, MemoryDelta, NewEpisode,
    RunRuleRequest,
};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, ChildServer, TestServer, bad_fields, connect, reason};
use crate::on_both_stores;

pub(crate) fn rule(id: &str, filter: &str, enabled: bool) -> ConsolidationRule {
    ConsolidationRule {
        id: id.to_owned(),
        filter: filter.to_owned(),
        cadence: Some(Cadence::EveryNEpisodes(1)),
        then_emits: vec!["semantic".to_owned()],
        confidence: 0.8,
        enabled,
        ..ConsolidationRule::default()
    }
}

pub(crate) fn episode(id: &str, kind: &str, metadata: serde_json::Value) -> NewEpisode {
    NewEpisode {
        id: id.to_owned(),
        r#type: kind.to_owned(),
        content: Some(json_to_proto(&json!(format!("content of {id}")))),
        metadata: match json_to_proto(&metadata).kind {
            Some(prost_types::value::Kind::StructValue(s)) => Some(s),
            _ => None,
        },
        ..NewEpisode::default()
    }
}

pub(crate) fn batch(session: &str, user: &str, episodes: Vec<NewEpisode>) -> AppendEpisodesRequest {
    AppendEpisodesRequest {
        session_id: session.to_owned(),
        app: "app".to_owned(),
        user: user.to_owned(),
        episodes,
        require_session: false,
    }
}

pub(crate) fn provenance(episodes: &[&str]) -> DeltaProvenance {
    DeltaProvenance {
        source_episode_ids: episodes.iter().map(|e| (*e).to_owned()).collect(),
        promotion_ts: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        }),
        rule_id: "manual".to_owned(),
        confidence: 1.0,
    }
}

pub(crate) async fn all_facts(client: &mut ConsolidationServiceClient<Channel>) -> Vec<Fact> {
    let mut facts = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_facts(ListFactsRequest {
                page_size: 1000,
                page_token: token,
                ..ListFactsRequest::default()
            })
            .await
            .expect("list facts")
            .into_inner();
        facts.extend(page.facts);
        if page.next_page_token.is_empty() {
            return facts;
        }
        token = page.next_page_token;
    }
}

fn delta_kind(delta: &MemoryDelta) -> String {
    match &delta.delta {
        Some(Delta::Add(_)) => "add".to_owned(),
        Some(Delta::Update(u)) => format!("update {}", u.replaces.join(",")),
        Some(Delta::Delete(d)) => format!("delete {}", d.replaces.join(",")),
        Some(Delta::Noop(_)) => "noop".to_owned(),
        None => "none".to_owned(),
    }
}

fn delta_provenance(delta: &MemoryDelta) -> Option<&DeltaProvenance> {
    match delta.delta.as_ref()? {
        Delta::Add(d) => d.provenance.as_ref(),
        Delta::Update(d) => d.provenance.as_ref(),
        Delta::Delete(d) => d.provenance.as_ref(),
        Delta::Noop(d) => d.provenance.as_ref(),
    }
}

fn sources(fact: &Fact) -> Vec<String> {
    fact.current
        .as_ref()
        .and_then(|v| v.lineage.as_ref())
        .map(|l| l.source_episode_ids.clone())
        .unwrap_or_default()
}

async fn classification_with_lineage(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut rules = server.consolidation();
    // An existing live fact of alice: coffee / likes.
    let existing = rules
        .apply_deltas(ApplyDeltasRequest {
            deltas: vec![MemoryDelta {
                delta: Some(Delta::Add(AddDelta {
                    fact_payload: Some(FactPayload {
                        app: "app".into(),
                        user: "alice".into(),
                        kind: FactKind::Semantic as i32,
                        subject: "coffee".into(),
                        predicate: "likes".into(),
                        object: "yes".into(),
                        content: Some(json_to_proto(&json!("alice likes coffee"))),
                        channels: vec![],
                    }),
                    provenance: Some(provenance(&["seed"])),
                })),
            }],
        })
        .await
        .expect("seed a fact")
        .into_inner();
    let coffee = existing.fact_ids[0].clone();

    let sp = |s: &str| json!({"subject": s, "predicate": "likes", "object": "yes"});
    server
        .episodes()
        .append_episodes(batch(
            "s1",
            "alice",
            vec![
                episode("e1", "observation", json!({"intent": "noop"})),
                episode("e2", "observation", sp("tea")),
                episode("e3", "observation", sp("tea")),
                episode("e4", "observation", sp("coffee")),
                episode("e5", "observation", json!({})),
                episode("e6", "user_message", json!({})),
                episode("e7", "observation", json!({"intent": "delete", "replaces": "e5"})),
                episode("e8", "observation", json!({"intent": "update", "replaces": ["e2"], "subject": "tea", "predicate": "likes", "object": "no"})),
            ],
        ))
        .await
        .expect("append");
    rules
        .create_rule(CreateRuleRequest {
            rule: Some(rule("prefs", "type = observation", false)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create rule");

    let dry = rules
        .run_rule(RunRuleRequest {
            rule_id: "prefs".into(),
            dry_run: true,
            max_episodes: 0,
        })
        .await
        .expect("dry run")
        .into_inner();
    let kinds: Vec<String> = dry.deltas.iter().map(delta_kind).collect();
    assert_eq!(
        kinds,
        [
            "noop".to_owned(),
            "add".to_owned(),
            "update e2".to_owned(),
            format!("update {coffee}"),
            "add".to_owned(),
            "delete e5".to_owned(),
            "update e2".to_owned(),
        ]
    );
    let expected_sources = ["e1", "e2", "e3", "e4", "e5", "e7", "e8"];
    for (delta, source) in dry.deltas.iter().zip(expected_sources) {
        let provenance = delta_provenance(delta).expect("provenance");
        assert_eq!(provenance.source_episode_ids, [source]);
        assert_eq!(provenance.rule_id, "prefs");
        assert!((provenance.confidence - 0.8).abs() < 1e-9);
        assert!(provenance.promotion_ts.is_some());
    }
    assert_eq!((dry.episodes_scanned, dry.episodes_matched), (8, 7));
    assert_eq!(dry.watermark, 0, "a dry run keeps the watermark");
    assert_eq!(
        all_facts(&mut rules).await.len(),
        1,
        "a dry run writes nothing"
    );

    let run = rules
        .run_rule(RunRuleRequest {
            rule_id: "prefs".into(),
            dry_run: false,
            max_episodes: 0,
        })
        .await
        .expect("run")
        .into_inner();
    assert_eq!(run.deltas.len(), 7);
    // add tea (e2); e3 updates it; e4 updates coffee; add e5; e7 deletes
    // e5's fact; e8 updates tea again.
    assert_eq!(
        (run.facts_added, run.facts_updated, run.facts_deleted),
        (2, 3, 1)
    );
    assert!(!run.more);
    let facts = all_facts(&mut rules).await;
    let by_subject: HashMap<String, &Fact> = facts
        .iter()
        .map(|f| {
            (
                f.current
                    .as_ref()
                    .map(|v| v.subject.clone())
                    .unwrap_or_default(),
                f,
            )
        })
        .collect();
    assert_eq!(facts.len(), 2, "tea and coffee; e5's fact was deleted");
    let tea = by_subject.get("tea").expect("tea fact");
    let current = tea.current.as_ref().expect("current");
    assert_eq!((current.version, current.object.as_str()), (3, "no"));
    assert_eq!(sources(tea), ["e8"]);
    assert_eq!(
        current.lineage.as_ref().map(|l| l.source.as_str()),
        Some("prefs")
    );
    assert_eq!(current.channels, ["semantic"]);
    assert_eq!(tea.user, "alice");
    let coffee_fact = by_subject.get("coffee").expect("coffee fact");
    assert_eq!(
        coffee_fact.id, coffee,
        "the existing fact was updated, not duplicated"
    );
    assert_eq!(sources(coffee_fact), ["e4"]);

    // GetFact: every version with its lineage.
    let history = rules
        .get_fact(GetFactRequest {
            fact_id: tea.id.clone(),
            ..GetFactRequest::default()
        })
        .await
        .expect("get fact")
        .into_inner();
    let lineage: Vec<Vec<String>> = history
        .versions
        .iter()
        .map(|v| {
            v.lineage
                .as_ref()
                .map(|l| l.source_episode_ids.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(lineage, [["e2"], ["e3"], ["e8"]]);
    assert!(history.next_page_token.is_empty());

    // A page at a time: the same versions, the fact at its newest on each.
    let (mut paged, mut page_token) = (Vec::new(), String::new());
    loop {
        let page = rules
            .get_fact(GetFactRequest {
                fact_id: tea.id.clone(),
                page_size: 2,
                page_token,
            })
            .await
            .expect("a page of versions")
            .into_inner();
        assert_eq!(page.fact, history.fact);
        paged.push(page.versions.iter().map(|v| v.version).collect::<Vec<_>>());
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(paged, [vec![1, 2], vec![3]]);
    let refused = |page_size: i32, page_token: &str| {
        let mut rules = rules.clone();
        let request = GetFactRequest {
            fact_id: tea.id.clone(),
            page_size,
            page_token: page_token.to_owned(),
        };
        async move { rules.get_fact(request).await.expect_err("refused") }
    };
    let err = refused(-1, "").await;
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_SIZE")
    );
    let err = refused(0, "not-a-token").await;
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );

    // Nothing is promoted twice: a second run sees nothing new.
    let again = rules
        .run_rule(RunRuleRequest {
            rule_id: "prefs".into(),
            dry_run: false,
            max_episodes: 0,
        })
        .await
        .expect("second run")
        .into_inner();
    assert!(again.deltas.is_empty());
    assert_eq!(again.watermark, run.watermark);
    let stored = rules
        .get_rule(GetRuleRequest {
            rule_id: "prefs".into(),
        })
        .await
        .expect("get rule")
        .into_inner()
        .rule
        .expect("rule");
    assert_eq!(stored.watermark, run.watermark);
    assert_eq!(stored.episodes_promoted, 7);
    assert!(stored.last_run_time.is_some());

    // DeleteFact tombstones; the history stays.
    let deleted = rules
        .delete_fact(DeleteFactRequest {
            fact_id: tea.id.clone(),
        })
        .await
        .expect("delete fact")
        .into_inner()
        .fact
        .expect("fact");
    assert_eq!(
        deleted.current.map(|v| (v.version, v.deleted)),
        Some((4, true))
    );
    assert_eq!(all_facts(&mut rules).await.len(), 1);
    let err = rules
        .delete_fact(DeleteFactRequest {
            fact_id: tea.id.clone(),
        })
        .await
        .expect_err("already deleted");
    assert_eq!(reason(&err), "FACT_NOT_FOUND");
    let err = rules
        .get_fact(GetFactRequest {
            fact_id: "nope".into(),
            ..GetFactRequest::default()
        })
        .await
        .expect_err("unknown fact");
    assert_eq!(err.code(), Code::NotFound);

    // A delta without provenance is refused, and the batch with it.
    let good = MemoryDelta {
        delta: Some(Delta::Add(AddDelta {
            fact_payload: Some(FactPayload {
                app: "app".into(),
                user: "bob".into(),
                content: Some(json_to_proto(&json!("x"))),
                ..FactPayload::default()
            }),
            provenance: Some(provenance(&["x1"])),
        })),
    };
    for (broken, field) in [
        (None, "deltas[1].add.provenance"),
        (
            Some(DeltaProvenance {
                source_episode_ids: vec![],
                ..provenance(&[])
            }),
            "deltas[1].add.provenance.source_episode_ids",
        ),
        (
            Some(DeltaProvenance {
                rule_id: String::new(),
                ..provenance(&["x2"])
            }),
            "deltas[1].add.provenance.rule_id",
        ),
        (
            Some(DeltaProvenance {
                promotion_ts: None,
                ..provenance(&["x2"])
            }),
            "deltas[1].add.provenance.promotion_ts",
        ),
        (
            Some(DeltaProvenance {
                confidence: 0.0,
                ..provenance(&["x2"])
            }),
            "deltas[1].add.provenance.confidence",
        ),
    ] {
        let mut bad = good.clone();
        if let Some(Delta::Add(add)) = bad.delta.as_mut() {
            add.provenance = broken;
        }
        let err = rules
            .apply_deltas(ApplyDeltasRequest {
                deltas: vec![good.clone(), bad],
            })
            .await
            .expect_err("no provenance");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(reason(&err), "MISSING_PROVENANCE");
        assert_eq!(bad_fields(&err), vec![field.to_owned()]);
    }
    assert_eq!(all_facts(&mut rules).await.len(), 1, "nothing applied");
}

async fn rules_and_filters_at_the_edge(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut rules = server.consolidation();
    let create = |r: ConsolidationRule| CreateRuleRequest {
        rule: Some(r),
        ..CreateRuleRequest::default()
    };

    let err = rules
        .create_rule(create(rule("bad", "type = ", false)))
        .await
        .expect_err("bad filter");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(reason(&err), "INVALID_FILTER");
    assert_eq!(bad_fields(&err), vec!["rule.filter".to_owned()]);
    assert!(err.message().contains("position 7"), "{}", err.message());
    let err = rules
        .create_rule(create(rule("bad", "colour = red", false)))
        .await
        .expect_err("unknown field");
    assert!(err.message().contains("unknown field"), "{}", err.message());

    for (cadence, field) in [
        (None, "rule.cadence"),
        (Some(Cadence::EveryNEpisodes(0)), "rule.every_n_episodes"),
        (Some(Cadence::Cron("61 * * * *".into())), "rule.cron"),
    ] {
        let err = rules
            .create_rule(create(ConsolidationRule {
                cadence,
                ..rule("bad", "", false)
            }))
            .await
            .expect_err("bad cadence");
        assert_eq!(reason(&err), "INVALID_CADENCE");
        assert_eq!(bad_fields(&err), vec![field.to_owned()]);
        if field == "rule.cron" {
            assert!(
                err.message().contains("the minute field \"61\": "),
                "{}",
                err.message()
            );
        }
    }

    // ListFacts names its owner the way the sessions' calls do.
    for (app, user, field) in [("bad app", "", "app"), ("app", "al\tice", "user")] {
        let err = rules
            .list_facts(ListFactsRequest {
                app: app.to_owned(),
                user: user.to_owned(),
                ..ListFactsRequest::default()
            })
            .await
            .expect_err("not a name");
        assert_eq!(reason(&err), "INVALID_IDENTIFIER");
        assert_eq!(bad_fields(&err), vec![field.to_owned()]);
    }

    for confidence in [1.5, -0.25, f64::NAN] {
        let err = rules
            .create_rule(create(ConsolidationRule {
                confidence,
                ..rule("bad", "", false)
            }))
            .await
            .expect_err("confidence out of range");
        assert_eq!(reason(&err), "INVALID_ARGUMENT");
        assert_eq!(bad_fields(&err), vec!["rule.confidence".to_owned()]);
        assert!(
            err.message()
                .ends_with(&format!("must be above 0 and at most 1, got {confidence}")),
            "{}",
            err.message()
        );
    }

    // An injection attempt is a string like any other: it matches nothing.
    let injected = rules
        .create_rule(create(rule(
            "injected",
            "content = \"'; DROP TABLE episodes; --\" OR metadata.x = \"1' OR '1'='1\"",
            false,
        )))
        .await
        .expect("a harmless filter")
        .into_inner()
        .rule
        .expect("rule");
    assert_eq!(injected.watermark, 0);
    let scored = rules
        .create_rule(create(ConsolidationRule {
            cadence: Some(Cadence::Cron("*/5 * * * *".into())),
            ..rule(
                "scored",
                "metadata.score >= 5 AND NOT metadata.tags:skip",
                false,
            )
        }))
        .await
        .expect("metadata filter")
        .into_inner()
        .rule
        .expect("rule");
    assert_eq!(scored.cadence, Some(Cadence::Cron("*/5 * * * *".into())));
    let err = rules
        .create_rule(create(rule("scored", "", false)))
        .await
        .expect_err("taken");
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(reason(&err), "RULE_EXISTS");

    server
        .episodes()
        .append_episodes(batch(
            "s",
            "u",
            vec![
                episode("low", "observation", json!({"score": 2})),
                episode("high", "observation", json!({"score": 9})),
                episode(
                    "skipped",
                    "observation",
                    json!({"score": 9, "tags": ["skip"]}),
                ),
                episode("text", "observation", json!({"score": "9"})),
            ],
        ))
        .await
        .expect("append");
    let none = rules
        .run_rule(RunRuleRequest {
            rule_id: "injected".into(),
            dry_run: true,
            max_episodes: 0,
        })
        .await
        .expect("run")
        .into_inner();
    assert_eq!((none.episodes_scanned, none.episodes_matched), (4, 0));
    let run = rules
        .run_rule(RunRuleRequest {
            rule_id: "scored".into(),
            dry_run: false,
            max_episodes: 0,
        })
        .await
        .expect("run")
        .into_inner();
    let matched: Vec<String> = run
        .deltas
        .iter()
        .filter_map(delta_provenance)
        .map(|p| p.source_episode_ids.join(","))
        .collect();
    assert_eq!(matched, ["high"]);

    let listed = rules
        .list_rules(ListRulesRequest {
            page_size: 1,
            page_token: String::new(),
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.rules.len(), 1);
    assert_eq!(listed.rules[0].id, "injected");
    let rest = rules
        .list_rules(ListRulesRequest {
            page_size: 10,
            page_token: listed.next_page_token,
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(
        rest.rules.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["scored"]
    );
    rules
        .delete_rule(DeleteRuleRequest {
            rule_id: "scored".into(),
        })
        .await
        .expect("delete");
    let err = rules
        .get_rule(GetRuleRequest {
            rule_id: "scored".into(),
        })
        .await
        .expect_err("deleted");
    assert_eq!(reason(&err), "RULE_NOT_FOUND");
    assert_eq!(all_facts(&mut rules).await.len(), 1, "its facts stay");
    let err = rules
        .run_rule(RunRuleRequest {
            rule_id: "scored".into(),
            ..RunRuleRequest::default()
        })
        .await
        .expect_err("deleted rule");
    assert_eq!(err.code(), Code::NotFound);
}

/// Appends `n` plain episodes (no subject/predicate: each makes one fact)
/// across a few sessions and returns their ids.
async fn append_plain(server_addr: std::net::SocketAddr, prefix: &str, n: usize) -> Vec<String> {
    let mut client = engram::proto::episode_service_client::EpisodeServiceClient::new(
        connect(server_addr).await,
    );
    let mut ids = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(50) {
        let episodes: Vec<NewEpisode> = (chunk * 50..((chunk + 1) * 50).min(n))
            .map(|i| {
                let id = format!("{prefix}-{i}");
                ids.push(id.clone());
                episode(&id, "observation", json!({}))
            })
            .collect();
        client
            .append_episodes(batch(&format!("{prefix}-s{}", chunk % 4), "u", episodes))
            .await
            .expect("append");
    }
    ids
}

/// Every expected episode made exactly one live fact.
fn check_promoted_once(facts: &[Fact], expected: &HashSet<String>) {
    let mut seen = HashMap::new();
    for fact in facts {
        for source in sources(fact) {
            *seen.entry(source).or_insert(0) += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "promoted twice: {twice:?}");
    let missing: Vec<_> = expected
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "never promoted: {missing:?}");
    assert_eq!(facts.len(), expected.len());
}

async fn concurrent_runs_promote_once(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.scheduler_interval_ms = Some(0);
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    server
        .consolidation()
        .create_rule(CreateRuleRequest {
            rule: Some(rule("all", "", false)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create");
    let addr = server.grpc_addr();
    let appending = tokio::spawn(async move { append_plain(addr, "c", 400).await });
    let mut runners = Vec::new();
    for _ in 0..8 {
        let mut client = ConsolidationServiceClient::new(connect(addr).await);
        runners.push(tokio::spawn(async move {
            let mut promoted = 0;
            for _ in 0..30 {
                let run = client
                    .run_rule(RunRuleRequest {
                        rule_id: "all".into(),
                        dry_run: false,
                        max_episodes: 25,
                    })
                    .await
                    .expect("run")
                    .into_inner();
                promoted += run.facts_added;
            }
            promoted
        }));
    }
    let ids = appending.await.expect("appender");
    let mut promoted = 0;
    for runner in runners {
        promoted += runner.await.expect("runner");
    }
    // Catch up on whatever arrived after the runners stopped.
    let mut rules = server.consolidation();
    loop {
        let run = rules
            .run_rule(RunRuleRequest {
                rule_id: "all".into(),
                dry_run: false,
                max_episodes: 1000,
            })
            .await
            .expect("run")
            .into_inner();
        promoted += run.facts_added;
        if !run.more {
            break;
        }
    }
    assert_eq!(
        promoted, 400,
        "the runs together added one fact per episode"
    );
    check_promoted_once(&all_facts(&mut rules).await, &ids.into_iter().collect());
}

/// A run started after an append returned sees that episode, however far
/// the server's shared horizon lags behind (CI once caught the last batch
/// of a catch-up run missing).
async fn a_run_sees_the_appends_before_it(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.scheduler_interval_ms = Some(0)).await;
    let mut rules = server.consolidation();
    rules
        .create_rule(CreateRuleRequest {
            rule: Some(rule("all", "", false)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create");
    for round in 0..20 {
        append_plain(server.grpc_addr(), &format!("r{round}"), 1).await;
        let run = rules
            .run_rule(RunRuleRequest {
                rule_id: "all".into(),
                dry_run: false,
                max_episodes: 10,
            })
            .await
            .expect("run")
            .into_inner();
        assert_eq!(run.facts_added, 1, "round {round}: the run saw the append");
    }
}

/// A rule created again with its request id (a retry after a reply that
/// was lost, a deploy script run twice) is answered with the rule the
/// first call made, as it is now; racing repeats store it once; another
/// rule under the id is refused, and a repeat without the id is
/// `RULE_EXISTS` as before.
async fn rule_creation_is_safe_to_repeat(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut rules = server.consolidation();
    let keyed = |r: ConsolidationRule, request_id: &str| CreateRuleRequest {
        rule: Some(r),
        request_id: request_id.into(),
    };
    let racing = (0..12).map(|_| {
        let mut rules = server.consolidation();
        tokio::spawn(async move {
            rules
                .create_rule(keyed(
                    rule("triage", "type = observation", true),
                    "deploy-7",
                ))
                .await
                .map(|reply| reply.into_inner().rule)
        })
    });
    let answers: Vec<_> = futures::future::join_all(racing)
        .await
        .into_iter()
        .map(|joined| joined.expect("joined").expect("every try succeeds"))
        .collect();
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    let first = answers[0].clone().expect("the rule");
    assert_eq!(
        (first.id.as_str(), first.filter.as_str(), first.enabled),
        ("triage", "type = observation", true)
    );

    // As it is now: a run moved its watermark since.
    server
        .episodes()
        .append_episodes(AppendEpisodesRequest {
            session_id: "s".into(),
            app: "app".into(),
            user: "u".into(),
            episodes: vec![episode("e1", "observation", json!({}))],
            ..AppendEpisodesRequest::default()
        })
        .await
        .expect("append");
    rules
        .run_rule(RunRuleRequest {
            rule_id: "triage".into(),
            ..RunRuleRequest::default()
        })
        .await
        .expect("run");
    let now = rules
        .get_rule(GetRuleRequest {
            rule_id: "triage".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .rule;
    let repeated = rules
        .create_rule(keyed(
            rule("triage", "type = observation", true),
            "deploy-7",
        ))
        .await
        .expect("repeat")
        .into_inner()
        .rule;
    assert_eq!(repeated, now);
    assert!(repeated.is_some_and(|r| r.watermark > 0));

    // Another rule (or another definition) under the id is refused.
    for (other, what) in [
        (rule("other", "type = observation", true), "another id"),
        (rule("triage", "type = error", true), "another filter"),
        (rule("triage", "type = observation", false), "disabled"),
    ] {
        let err = rules
            .create_rule(keyed(other, "deploy-7"))
            .await
            .expect_err(what);
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (Code::InvalidArgument, "REQUEST_ID_REUSED"),
            "{what}"
        );
    }
    // The id taken by another request, or by none: RULE_EXISTS.
    for request_id in ["deploy-8", ""] {
        let err = rules
            .create_rule(keyed(
                rule("triage", "type = observation", true),
                request_id,
            ))
            .await
            .expect_err("taken");
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (Code::AlreadyExists, "RULE_EXISTS"),
            "{request_id:?}"
        );
    }
    let err = rules
        .create_rule(keyed(rule("x", "", true), "has space"))
        .await
        .expect_err("a bad id");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_REQUEST_ID")
    );
    let listed = rules
        .list_rules(ListRulesRequest::default())
        .await
        .expect("list")
        .into_inner()
        .rules;
    assert_eq!(listed.len(), 1, "{listed:?}");
}

on_both_stores!(
    rule_creation_is_safe_to_repeat,
    classification_with_lineage,
    rules_and_filters_at_the_edge,
    concurrent_runs_promote_once,
    a_run_sees_the_appends_before_it,
);

/// Polls a rule until its watermark reaches `cursor` (the scheduler works
/// in the background), for at most a minute.
async fn wait_for_watermark(client: &mut ConsolidationServiceClient<Channel>, cursor: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rule = client
            .get_rule(GetRuleRequest {
                rule_id: "all".into(),
            })
            .await
            .expect("get rule")
            .into_inner()
            .rule
            .expect("rule");
        if rule.watermark >= cursor {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the scheduler never caught up: {rule:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn newest_cursor(server: &TestServer) -> i64 {
    let (_, body) =
        crate::helpers::http_get_json(server.http_addr(), "/memory/events?limit=1").await;
    body["events"][0]["cursor"].as_i64().expect("a cursor")
}

/// Two server processes with the scheduler on one Postgres: each episode
/// is promoted once, whichever replica runs the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_promote_once() {
    let one = TestServer::spawn_with(Backend::Postgres, |s| {
        s.scheduler_interval_ms = Some(10);
    })
    .await;
    let two = ChildServer::spawn(
        &["--migrate", "off"],
        &[
            ("ENGRAM_DATABASE_URL", &one.db.url),
            ("ENGRAM_SCHEDULER_INTERVAL_MS", "10"),
        ],
        None,
    )
    .await;
    one.consolidation()
        .create_rule(CreateRuleRequest {
            rule: Some(rule("all", "", true)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create");
    let (a, b) = tokio::join!(
        append_plain(one.grpc_addr(), "one", 300),
        append_plain(two.grpc_addr, "two", 300)
    );
    let newest = newest_cursor(&one).await;
    let mut rules = one.consolidation();
    wait_for_watermark(&mut rules, newest).await;
    let expected: HashSet<String> = a.into_iter().chain(b).collect();
    check_promoted_once(&all_facts(&mut rules).await, &expected);
    let logs = two.stderr.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(two.terminate().await.success());
    // Not a requirement, but worth knowing the second replica took part.
    eprintln!(
        "the child scheduler ran the rule: {}",
        logs.contains("consolidation rule ran")
    );
}

/// A scheduler killed mid-run and started again: nothing promoted twice,
/// nothing skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_run_loses_and_repeats_nothing() {
    let main = TestServer::spawn_with(Backend::Postgres, |s| {
        s.scheduler_interval_ms = Some(0);
    })
    .await;
    let envs = [
        ("ENGRAM_DATABASE_URL", main.db.url.as_str()),
        ("ENGRAM_SCHEDULER_INTERVAL_MS", "5"),
    ];
    main.consolidation()
        .create_rule(CreateRuleRequest {
            rule: Some(rule("all", "", true)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create");
    let scheduler = ChildServer::spawn(&["--migrate", "off"], &envs, None).await;
    let addr = main.grpc_addr();
    let appending = tokio::spawn(async move { append_plain(addr, "k", 3000).await });
    // Kill it once it has promoted something, while appends still flow.
    let mut rules = main.consolidation();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rule = rules
            .get_rule(GetRuleRequest {
                rule_id: "all".into(),
            })
            .await
            .expect("get")
            .into_inner()
            .rule
            .expect("rule");
        if rule.episodes_promoted > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the scheduler never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    scheduler.kill().await;
    let ids = appending.await.expect("appender");
    let restarted = ChildServer::spawn(&["--migrate", "off"], &envs, None).await;
    let newest = newest_cursor(&main).await;
    wait_for_watermark(&mut rules, newest).await;
    check_promoted_once(&all_facts(&mut rules).await, &ids.into_iter().collect());
    assert!(restarted.terminate().await.success());
}
