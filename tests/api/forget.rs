//! `DataService.ForgetUser` on both stores: a dry run counts, the real run
//! deletes the user's sessions, episodes, working memory, facts (owned, or
//! app-wide and derived only from their episodes) and their runs'
//! execution scopes, so that no RPC, search, tail or watch replay shows
//! them; another user, the same user in another app, and the same user
//! name in another tenant are untouched; the audit skeleton holds counts
//! and no name.

use engram::api::convert::json_to_proto;
use engram::auth::hash_token;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::data_service_client::DataServiceClient;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::search_hit::Item;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::session_service_client::SessionServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    AppendEpisodeRequest, CacheContentRequest, ChangeKind, CreateRuleRequest, CreateTaskRequest,
    ExportRequest, FactKind, ForgetUserRequest, ForgetUserResponse, GetCompactionLogRequest,
    GetRequest, GetRetentionRequest, GetSessionRequest, ListFactsRequest, RecordProcedureRequest,
    RememberRequest, RetentionPolicy, RunRuleRequest, ScopeType, SearchRequest, SetGoalRequest,
    SetRequest, SetRetentionRequest, TailEpisodesRequest, WatchRequest,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::consolidation::{episode, rule};
use crate::helpers::{Backend, Metadata, TestServer, holding, reason, release};
use crate::on_both_stores;

const ACME_ADMIN: &str = "acme-admin-token";
const ACME: &str = "acme-user-token";
const GLOBEX_ADMIN: &str = "globex-admin-token";
const EXECUTION: i32 = ScopeType::Execution as i32;

type Authed = InterceptedService<Channel, Metadata>;

/// The clients of one token.
struct As {
    channel: Channel,
    token: &'static str,
}

impl As {
    fn bearer(&self) -> Metadata {
        Metadata::new(&[("authorization", &format!("Bearer {}", self.token))])
    }
    fn data(&self) -> DataServiceClient<Authed> {
        DataServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn memory(&self) -> MemoryServiceClient<Authed> {
        MemoryServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn sessions(&self) -> SessionServiceClient<Authed> {
        SessionServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn episodes(&self) -> EpisodeServiceClient<Authed> {
        EpisodeServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn working(&self) -> WorkingMemoryServiceClient<Authed> {
        WorkingMemoryServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn rules(&self) -> ConsolidationServiceClient<Authed> {
        ConsolidationServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn search(&self) -> SearchServiceClient<Authed> {
        SearchServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }
    fn admin(&self) -> MemoryAdminServiceClient<Authed> {
        MemoryAdminServiceClient::with_interceptor(self.channel.clone(), self.bearer())
    }

    async fn append(&self, app: &str, user: &str, session: &str, id: &str, text: &str) {
        let mut new = episode(id, "observation", json!({"learn": true, "subject": id}));
        new.content = Some(json_to_proto(&json!(text)));
        self.episodes()
            .append_episode(AppendEpisodeRequest {
                session_id: session.into(),
                app: app.into(),
                user: user.into(),
                episode: Some(new),
                require_session: false,
            })
            .await
            .expect("append");
    }

    async fn set_run(&self, run: &str, key: &str) {
        self.memory()
            .set(SetRequest {
                scope_type: EXECUTION,
                scope: run.into(),
                key: key.into(),
                value: Some(json_to_proto(&json!(format!("{run} remembers zanzibar")))),
                ..SetRequest::default()
            })
            .await
            .expect("set in a run");
    }

    async fn forget(&self, dry_run: bool) -> ForgetUserResponse {
        self.data()
            .forget_user(ForgetUserRequest {
                app: "bot".into(),
                user: "alice".into(),
                execution_ids: vec!["run-9".into()],
                dry_run,
            })
            .await
            .expect("forget")
            .into_inner()
    }

    async fn session_exists(&self, id: &str) -> bool {
        match self
            .sessions()
            .get_session(GetSessionRequest {
                session_id: id.into(),
                ..GetSessionRequest::default()
            })
            .await
        {
            Ok(_) => true,
            Err(err) if err.code() == Code::NotFound => false,
            Err(err) => panic!("get session: {err}"),
        }
    }

    async fn hits(&self, query: &str) -> Vec<Item> {
        self.search()
            .search(SearchRequest {
                query: query.into(),
                limit: 100,
                ..SearchRequest::default()
            })
            .await
            .expect("search")
            .into_inner()
            .hits
            .into_iter()
            .filter_map(|hit| hit.item)
            .collect()
    }
}

async fn forgets_a_user_and_nobody_else(backend: Backend) {
    let tokens = format!(
        "{} acme admin\n{} acme\n{} globex admin",
        hash_token(ACME_ADMIN),
        hash_token(ACME),
        hash_token(GLOBEX_ADMIN)
    );
    let server = TestServer::spawn_with(backend, |s| s.tokens = Some(tokens)).await;
    let acme = As {
        channel: server.channel.clone(),
        token: ACME_ADMIN,
    };
    let globex = As {
        channel: server.channel.clone(),
        token: GLOBEX_ADMIN,
    };

    // Alice in app bot: two sessions, working memory, facts, two runs.
    acme.append("bot", "alice", "s1", "a1", "alice likes zanzibar")
        .await;
    acme.append("bot", "alice", "s2", "a2", "alice lives in zanzibar")
        .await;
    let mut working = acme.working();
    working
        .set_goal(SetGoalRequest {
            session_id: "s1".into(),
            goal: "plan zanzibar".into(),
            ..SetGoalRequest::default()
        })
        .await
        .expect("goal");
    working
        .create_task(CreateTaskRequest {
            session_id: "s1".into(),
            subject: "book zanzibar".into(),
            ..CreateTaskRequest::default()
        })
        .await
        .expect("task");
    working
        .cache_content(CacheContentRequest {
            session_id: "s1".into(),
            path: "notes.md".into(),
            content: "zanzibar notes".into(),
            ..CacheContentRequest::default()
        })
        .await
        .expect("cache");
    working
        .remember(RememberRequest {
            session_id: "s1".into(),
            content: "alice prefers zanzibar".into(),
            ..RememberRequest::default()
        })
        .await
        .expect("remember");
    acme.set_run("s1", "plan").await;
    acme.set_run("run-9", "plan").await;
    acme.set_run("run-other", "plan").await;
    for run in ["run-9", "run-other"] {
        acme.admin()
            .set_retention(SetRetentionRequest {
                scope_type: EXECUTION,
                scope: run.into(),
                policy: Some(RetentionPolicy {
                    keep_versions: Some(5),
                    ..RetentionPolicy::default()
                }),
                dry_run: false,
            })
            .await
            .expect("a run's retention");
    }

    // Others: bob in bot, alice in another app, alice in another tenant.
    acme.append("bot", "bob", "s3", "b1", "bob likes zanzibar")
        .await;
    acme.append("other", "alice", "s4", "o1", "other alice zanzibar")
        .await;
    globex
        .append("bot", "alice", "g1", "g1", "globex alice zanzibar")
        .await;

    // App-wide facts: one learned only from alice's episode, one from
    // bob's, one recorded by hand.
    let mut rules = acme.rules();
    let mut procedural = rule("learn", "metadata.learn:*", true);
    procedural.kind = FactKind::Procedural as i32;
    procedural.then_emits = vec!["procedures".into()];
    rules
        .create_rule(CreateRuleRequest {
            rule: Some(procedural),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("rule");
    rules
        .run_rule(RunRuleRequest {
            rule_id: "learn".into(),
            dry_run: false,
            max_episodes: 0,
        })
        .await
        .expect("run");
    working
        .record_procedure(RecordProcedureRequest {
            app: "bot".into(),
            content: "always greet in zanzibar style".into(),
            ..RecordProcedureRequest::default()
        })
        .await
        .expect("procedure");
    let app_facts = |rules: &mut ConsolidationServiceClient<Authed>| {
        let mut rules = rules.clone();
        async move {
            rules
                .list_facts(ListFactsRequest {
                    app: "bot".into(),
                    kind: FactKind::Procedural as i32,
                    page_size: 100,
                    ..ListFactsRequest::default()
                })
                .await
                .expect("facts")
                .into_inner()
                .facts
                .len()
        }
    };
    // a1, a2 (alice), b1 (bob) and the hand-written one.
    assert_eq!(app_facts(&mut rules).await, 4);

    // Only admins may forget.
    let user = As {
        channel: server.channel.clone(),
        token: ACME,
    };
    let err = user
        .data()
        .forget_user(ForgetUserRequest {
            app: "bot".into(),
            user: "alice".into(),
            ..ForgetUserRequest::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::PermissionDenied, "ADMIN_REQUIRED".into())
    );

    // A dry run counts and deletes nothing.
    let dry = acme.forget(true).await;
    let counts = |r: &ForgetUserResponse| {
        (
            r.sessions,
            r.episodes,
            r.facts,
            r.working_items,
            r.execution_scopes,
            r.memory_versions,
        )
    };
    // Facts: the remembered one and the two learned from a1 and a2.
    assert_eq!(counts(&dry), (2, 2, 3, 3, 2, 2));
    assert!(dry.dry_run && dry.audit_key.is_empty());
    assert!(acme.session_exists("s1").await);

    let done = acme.forget(false).await;
    assert_eq!(counts(&done), counts(&dry));
    assert!(!done.dry_run && !done.audit_key.is_empty());

    // Nothing of alice@bot is readable any more.
    assert!(!acme.session_exists("s1").await);
    assert!(!acme.session_exists("s2").await);
    let facts = acme
        .rules()
        .list_facts(ListFactsRequest {
            app: "bot".into(),
            user: "alice".into(),
            page_size: 100,
            ..ListFactsRequest::default()
        })
        .await
        .expect("facts")
        .into_inner()
        .facts;
    assert!(facts.is_empty(), "{facts:?}");
    assert_eq!(app_facts(&mut rules).await, 2, "bob's and the hand-written");
    // Nor in an export of the tenant, where bob's content still is.
    let mut export = acme
        .data()
        .export(ExportRequest::default())
        .await
        .expect("export")
        .into_inner();
    let mut lines = Vec::new();
    while let Some(chunk) = export.next().await {
        lines.extend(chunk.expect("chunk").lines);
    }
    let file = lines.join("\n");
    assert!(
        file.contains("bob likes zanzibar"),
        "bob's episode is exported"
    );
    for gone in [
        "alice likes zanzibar",
        "alice lives in zanzibar",
        "plan zanzibar",
        "run-9",
    ] {
        assert!(!file.contains(gone), "{gone:?} is still exported");
    }
    for run in ["s1", "run-9"] {
        let err = acme
            .memory()
            .get(GetRequest {
                scope_type: EXECUTION,
                scope: run.into(),
                key: "plan".into(),
                ..GetRequest::default()
            })
            .await
            .expect_err("run forgotten");
        assert_eq!(reason(&err), "KEY_NOT_FOUND", "{run}");
    }
    // Search finds bob, the other app's alice and run-other, never her.
    let found = acme.hits("zanzibar").await;
    let hers = |item: &Item| match item {
        Item::Episode(e) => e.app == "bot" && e.user == "alice",
        Item::Fact(f) => {
            f.user == "alice"
                || f.current
                    .as_ref()
                    .and_then(|v| v.lineage.as_ref())
                    .is_some_and(|l| l.source_episode_ids.iter().any(|id| id.starts_with('a')))
        }
        Item::Entry(e) => e.scope == "s1" || e.scope == "run-9",
    };
    assert!(!found.iter().any(hers), "{found:?}");
    let theirs = |item: &Item| match item {
        Item::Episode(e) => e.id.clone(),
        Item::Fact(_) => "fact".into(),
        Item::Entry(e) => e.scope.clone(),
    };
    let names: Vec<String> = found.iter().map(theirs).collect();
    for expected in ["b1", "o1", "run-other"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }

    // A replay of the tail and of the run's change feed starts after her.
    acme.append("bot", "alice", "s9", "a9", "a new start").await;
    let mut tail = acme
        .episodes()
        .tail_episodes(TailEpisodesRequest {
            app: "bot".into(),
            user: "alice".into(),
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();
    let first = tail.next().await.expect("an episode").expect("ok");
    assert_eq!(first.episode.expect("episode").id, "a9");
    acme.set_run("run-9", "after").await;
    let mut watch = acme
        .memory()
        .watch(WatchRequest {
            scope_type: EXECUTION,
            scope: "run-9".into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let change = watch.next().await.expect("a change").expect("ok");
    assert_eq!(
        (change.key.as_str(), change.kind),
        ("after", ChangeKind::Set as i32)
    );

    // The others are untouched.
    assert!(acme.session_exists("s3").await);
    assert!(acme.session_exists("s4").await);
    assert!(globex.session_exists("g1").await);
    assert_eq!(globex.hits("zanzibar").await.len(), 1);
    let kept = acme
        .memory()
        .get(GetRequest {
            scope_type: EXECUTION,
            scope: "run-other".into(),
            key: "plan".into(),
            ..GetRequest::default()
        })
        .await;
    assert!(kept.is_ok());
    // A run's retention policy goes with it.
    for (run, kept) in [("run-9", false), ("run-other", true)] {
        let policy = acme
            .admin()
            .get_retention(GetRetentionRequest {
                scope_type: EXECUTION,
                scope: run.into(),
            })
            .await;
        match policy {
            Ok(_) => assert!(kept, "{run}'s policy outlived the forget"),
            Err(err) => assert_eq!(
                (kept, reason(&err)),
                (false, "RETENTION_NOT_FOUND".into()),
                "{run}"
            ),
        }
    }

    // The skeleton: who (hashed), when, counts; no name.
    let log = acme
        .admin()
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "engram.forgotten".into(),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .expect("log")
        .into_inner()
        .records;
    assert_eq!(log.len(), 1);
    let record = &log[0];
    let digest: String = Sha256::digest(b"alice")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(record.operation, "forget");
    assert_eq!(record.subject, format!("bot/sha256:{digest}"));
    assert_eq!(record.audit_key, done.audit_key);
    assert_eq!(record.counts.get("episodes"), Some(&2));
    assert_eq!(record.counts.get("sessions"), Some(&2));
    let text = format!("{record:?}");
    assert!(!text.contains("alice"), "{text}");
}

/// A user forgotten while they are still writing (episodes, working
/// memory, memory in their runs): every forget succeeds (on Postgres it
/// used to deadlock with the writes), no write fails with
/// anything but a refusal a client can act on, and once the writes stop, a
/// last forget leaves nothing of theirs.
async fn a_forget_racing_the_users_writes(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let server = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(16)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..6usize {
        let (mut episodes, stop) = (server.episodes(), stop.clone());
        let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
        let mut memory = server.memory();
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let session = format!("s{}", (writer + i) % 3);
                let outcome = match i % 4 {
                    3 => memory
                        .set(SetRequest {
                            scope_type: EXECUTION,
                            scope: session,
                            key: format!("k{}", i % 2),
                            value: Some(json_to_proto(&json!(i))),
                            ..SetRequest::default()
                        })
                        .await
                        .map(|_| ()),
                    0 => episodes
                        .append_episode(AppendEpisodeRequest {
                            session_id: session,
                            app: "bot".into(),
                            user: "alice".into(),
                            episode: Some(episode(
                                &format!("w{writer}-{i}"),
                                "observation",
                                json!(i),
                            )),
                            require_session: false,
                        })
                        .await
                        .map(|_| ()),
                    1 => working
                        .create_task(CreateTaskRequest {
                            session_id: session,
                            app: "bot".into(),
                            user: "alice".into(),
                            subject: format!("task {i}"),
                            ..CreateTaskRequest::default()
                        })
                        .await
                        .map(|_| ()),
                    _ => working
                        .set_goal(SetGoalRequest {
                            session_id: session,
                            app: "bot".into(),
                            user: "alice".into(),
                            goal: format!("goal {i}"),
                        })
                        .await
                        .map(|_| ()),
                };
                if let Err(err) = outcome {
                    let refused = matches!(err.code(), Code::NotFound | Code::FailedPrecondition)
                        || reason(&err) == "SESSION_CHANGED";
                    assert!(refused, "{err:?}");
                }
            }
        }));
    }
    let mut data = DataServiceClient::new(server.channel.clone());
    let forget = ForgetUserRequest {
        app: "bot".into(),
        user: "alice".into(),
        ..ForgetUserRequest::default()
    };
    for _ in 0..12 {
        data.forget_user(forget.clone()).await.expect("forget");
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer");
    }
    data.forget_user(forget.clone()).await.expect("forget");
    let left = data
        .forget_user(ForgetUserRequest {
            dry_run: true,
            ..forget
        })
        .await
        .expect("dry run")
        .into_inner();
    assert_eq!(
        (
            left.sessions,
            left.episodes,
            left.working_items,
            left.memory_versions
        ),
        (0, 0, 0, 0)
    );
}

/// Runs of two rules race a forget of the user whose episodes they
/// promote. Whichever goes first, no fact of the user is left: a run that
/// read the episodes before the forget deleted them and wrote after it
/// (on Postgres, most rounds) made facts of a forgotten user's words.
async fn rule_runs_racing_a_forget_leave_no_fact(backend: Backend) {
    const ROUNDS: usize = 15;
    let server = TestServer::spawn(backend).await;
    let mut rules = ConsolidationServiceClient::new(server.channel.clone());
    for id in ["r1", "r2"] {
        rules
            .create_rule(CreateRuleRequest {
                rule: Some(rule(id, "metadata.learn = true", false)),
                ..CreateRuleRequest::default()
            })
            .await
            .expect("create rule");
    }
    for round in 0..ROUNDS {
        let user = format!("u{round}");
        server
            .episodes()
            .append_episodes(crate::consolidation::batch(
                &format!("s{round}"),
                &user,
                (0..5)
                    .map(|i| {
                        let about = json!({"learn": true, "subject": "x", "predicate": "likes"});
                        episode(&format!("e{round}-{i}"), "note", about)
                    })
                    .collect(),
            ))
            .await
            .expect("append");
        let runs = crate::consolidation_races::spawn_runs(&rules, &["r1", "r2"]);
        DataServiceClient::new(server.channel.clone())
            .forget_user(ForgetUserRequest {
                app: "app".into(),
                user: user.clone(),
                ..ForgetUserRequest::default()
            })
            .await
            .expect("forget");
        for run in runs {
            run.await.expect("run task").expect("run");
        }
        let left = rules
            .list_facts(ListFactsRequest {
                app: "app".into(),
                user: user.clone(),
                ..ListFactsRequest::default()
            })
            .await
            .expect("list facts")
            .into_inner()
            .facts;
        assert!(left.is_empty(), "round {round}: {left:?}");
    }
}

/// A set of a key in the user's run, made while a forget runs, leaves the
/// key whole: all of it or none of it goes. On Postgres the forget deleted
/// the key's versions, then its purge record, then its head. A purge
/// holding the record stopped it between the two (a deadlock: the purge
/// then waited for the versions), and a set committing meanwhile left its
/// version without a head, on which the key's later sets failed
/// (`INTERNAL`, a duplicate version). Here the test holds the record, a
/// set runs meanwhile, and three sets follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_racing_a_forget_leaves_its_key_whole() {
    let server = crate::purge_races::run_of_alice().await;
    let mut memory = server.memory();
    let set = |value: &str| SetRequest {
        scope_type: EXECUTION,
        scope: "s1".into(),
        key: "k".into(),
        value: Some(json_to_proto(&json!(value))),
        ..SetRequest::default()
    };
    for value in ["one", "two"] {
        memory.set(set(value)).await.expect("set");
    }
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(engram::proto::PurgeRequest {
            scope_type: EXECUTION,
            scope: "s1".into(),
            key: "k".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge version 1");
    let mut db = server.db_connection("the test").await;
    let holder = holding(
        &server.db.url,
        "SELECT 1 FROM memory_purges WHERE key = 'k' FOR UPDATE",
    )
    .await;
    let mut data = DataServiceClient::new(server.channel.clone());
    let forgetting = tokio::spawn(async move {
        data.forget_user(ForgetUserRequest {
            app: "bot".into(),
            user: "alice".into(),
            ..ForgetUserRequest::default()
        })
        .await
    });
    // The forget waits for the record, or (leaving a record another call
    // holds) is done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut db)
        .await
        .expect("read the waits");
        if waiting > 0 || forgetting.is_finished() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the forget never got there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A set while the forget waits (for a purge, say) goes through: the
    // forget holds the key's head, not its versions alone.
    let during = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        memory.set(set("during")),
    )
    .await;
    release(holder, "ROLLBACK").await;
    during
        .expect("the set waited for the forget, which held the key's versions while it waited")
        .expect("the set during the forget");
    forgetting.await.expect("forget task").expect("forget");
    for value in ["after 1", "after 2", "after 3"] {
        memory
            .set(set(value))
            .await
            .expect("a set of the key after the forget");
    }
    let mut history = memory
        .history(engram::proto::HistoryRequest {
            scope_type: EXECUTION,
            scope: "s1".into(),
            key: "k".into(),
            from_version: 0,
        })
        .await
        .expect("history")
        .into_inner();
    let mut values = Vec::new();
    while let Some(version) = history.next().await {
        let entry = version.expect("a version").entry.expect("entry");
        values.push(entry.value);
    }
    // Whichever of the forget and the set went first, the key's newest
    // versions are the three sets after the forget.
    assert_eq!(
        values[values.len().saturating_sub(3)..],
        ["after 1", "after 2", "after 3"].map(|v| Some(json_to_proto(&json!(v)))),
        "{values:?}"
    );
}

on_both_stores!(
    forgets_a_user_and_nobody_else,
    a_forget_racing_the_users_writes,
    rule_runs_racing_a_forget_leave_no_fact
);
