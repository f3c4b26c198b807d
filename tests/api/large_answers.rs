//! Answers too big for one gRPC message (4 MiB unless configured): a page
//! of large values ends early with a token for the rest (`List`,
//! `ListEpisodes`, the versions of `GetFact`), and an answer without pages
//! (`Recent`, `Search`, `BuildContext`, working memory's snapshot and
//! block) holds the best that fit. Nothing is refused for being large in
//! sum.

use engram::api::convert::json_to_proto;
use engram::proto::memory_delta::Delta;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    AddDelta, AppendEpisodeRequest, ApplyDeltasRequest, BuildContextRequest, CreateRuleRequest,
    FactKind, FactPayload, GetFactRequest, GetSnapshotRequest, HistoryRequest, ListEpisodesRequest,
    ListRequest, MemoryDelta, RecentRequest, RenderMemoryBlockRequest, RunRuleRequest, ScopeType,
    SearchMode, SearchRequest, SearchSource, SetRequest, UpdateDelta,
};
use serde_json::json;

use crate::consolidation::{episode, provenance, rule};
use crate::helpers::{Backend, TestServer};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;
/// 100 items of 64 KiB: 6.4 MiB in all, over the default message limit.
const ITEMS: usize = 100;

/// About 64 KiB of words, with `needle` first.
fn big_text(i: usize) -> String {
    let mut text = format!("needle {i} ");
    while text.len() < 64 * 1024 {
        text.push_str("lorem ipsum dolor sit amet ");
    }
    text
}

async fn large_answers_end_early_and_page_on(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    let mut episodes = server.episodes();
    for i in 0..ITEMS {
        memory
            .set(SetRequest {
                scope_type: NS,
                scope: "big".into(),
                key: format!("k{i:03}"),
                value: Some(json_to_proto(&json!(big_text(i)))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
        let mut new = episode(&format!("e{i:03}"), "user_message", json!({}));
        new.content = Some(json_to_proto(&json!(big_text(i))));
        episodes
            .append_episode(AppendEpisodeRequest {
                session_id: "s".into(),
                app: "bot".into(),
                user: "alice".into(),
                episode: Some(new),
                require_session: false,
            })
            .await
            .expect("append");
    }

    // Pages of 100 asked for: fewer come, and the tokens reach every key
    // once, in order.
    let (mut keys, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = memory
            .list(ListRequest {
                scope_type: NS,
                scope: "big".into(),
                page_size: ITEMS as i32,
                page_token: token,
                ..ListRequest::default()
            })
            .await
            .expect("a page of large values")
            .into_inner();
        pages += 1;
        keys.extend(page.entries.into_iter().map(|e| e.key));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let all: Vec<String> = (0..ITEMS).map(|i| format!("k{i:03}")).collect();
    assert_eq!(keys, all);
    assert!(pages > 1, "100 large values came in one page");

    let (mut seqs, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = episodes
            .list_episodes(ListEpisodesRequest {
                session_id: "s".into(),
                page_size: ITEMS as i32,
                page_token: token,
                ..ListEpisodesRequest::default()
            })
            .await
            .expect("a page of large episodes")
            .into_inner();
        pages += 1;
        seqs.extend(page.episodes.into_iter().map(|e| e.seq));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seqs, (1..=ITEMS as i64).collect::<Vec<_>>());
    assert!(pages > 1, "100 large episodes came in one page");

    // A history of large versions streams whole, batch after batch.
    for _ in 1..40 {
        memory
            .set(SetRequest {
                scope_type: NS,
                scope: "big".into(),
                key: "k000".into(),
                value: Some(json_to_proto(&json!(big_text(0)))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
    }
    let mut history = memory
        .history(HistoryRequest {
            scope_type: NS,
            scope: "big".into(),
            key: "k000".into(),
            ..HistoryRequest::default()
        })
        .await
        .expect("history")
        .into_inner();
    let mut versions = Vec::new();
    while let Some(item) = history.message().await.expect("a version") {
        versions.extend(item.entry.map(|e| e.version));
    }
    assert_eq!(versions, (1..=40).collect::<Vec<_>>());

    // No pages: the newest that fit, newest first.
    let newest = episodes
        .recent(RecentRequest {
            user: "alice".into(),
            session_id: "s".into(),
            limit: ITEMS as i32,
            ..RecentRequest::default()
        })
        .await
        .expect("recent")
        .into_inner()
        .episodes;
    let seqs: Vec<i64> = newest.iter().map(|e| e.seq).collect();
    assert!(!seqs.is_empty() && seqs.len() < ITEMS, "{seqs:?}");
    let top = ITEMS as i64;
    assert_eq!(
        seqs,
        (top - seqs.len() as i64 + 1..=top)
            .rev()
            .collect::<Vec<_>>()
    );

    let context = episodes
        .build_context(BuildContextRequest {
            session_id: "s".into(),
            max_events: ITEMS as i32,
        })
        .await
        .expect("build context")
        .into_inner();
    let used = context.events_used as usize;
    assert!(used > 0 && used < ITEMS, "{used} messages");
    let last = format!("needle {}", ITEMS - 1);
    assert!(
        context.context.contains(&last),
        "the newest message is in it"
    );

    // The best hits that fit.
    let hits = SearchServiceClient::new(server.channel.clone())
        .search(SearchRequest {
            query: "needle".into(),
            sources: vec![SearchSource::Memory as i32, SearchSource::Episodes as i32],
            mode: SearchMode::Lexical as i32,
            limit: ITEMS as i32,
            ..SearchRequest::default()
        })
        .await
        .expect("search")
        .into_inner()
        .hits;
    assert!(
        !hits.is_empty() && hits.len() < ITEMS,
        "{} hits",
        hits.len()
    );
    assert!(hits.windows(2).all(|pair| pair[0].score >= pair[1].score));
}

/// A fact's versions of 64 KiB come in pages by bytes, and the CLI
/// follows them to every version.
async fn large_fact_versions_come_in_pages(backend: Backend) {
    const VERSIONS: i64 = 40;
    let server = TestServer::spawn(backend).await;
    let mut facts = server.consolidation();
    let payload = |n: i64| FactPayload {
        app: "app".into(),
        user: "alice".into(),
        kind: FactKind::Semantic as i32,
        subject: "alice".into(),
        predicate: "wrote".into(),
        object: format!("draft {n}"),
        content: Some(json_to_proto(&json!(big_text(n as usize)))),
        channels: vec![],
    };
    let added = facts
        .apply_deltas(ApplyDeltasRequest {
            deltas: vec![MemoryDelta {
                delta: Some(Delta::Add(AddDelta {
                    fact_payload: Some(payload(1)),
                    provenance: Some(provenance(&["e1"])),
                })),
            }],
        })
        .await
        .expect("add")
        .into_inner();
    let id = added.fact_ids[0].clone();
    let updates = (2..=VERSIONS)
        .map(|n| MemoryDelta {
            delta: Some(Delta::Update(UpdateDelta {
                fact_payload: Some(payload(n)),
                replaces: vec![id.clone()],
                provenance: Some(provenance(&["e1"])),
            })),
        })
        .collect();
    facts
        .apply_deltas(ApplyDeltasRequest { deltas: updates })
        .await
        .expect("updates");

    let (mut versions, mut pages, mut page_token) = (Vec::new(), 0, String::new());
    loop {
        let page = facts
            .get_fact(GetFactRequest {
                fact_id: id.clone(),
                page_size: 0,
                page_token,
            })
            .await
            .expect("a page of large versions")
            .into_inner();
        let newest = page.fact.and_then(|f| f.current).map(|v| v.version);
        assert_eq!(
            newest,
            Some(VERSIONS),
            "the fact at its newest on each page"
        );
        pages += 1;
        versions.extend(page.versions.iter().map(|v| v.version));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(versions, (1..=VERSIONS).collect::<Vec<_>>());
    assert!(pages > 1, "40 versions of 64 KiB came in one page");

    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args([
            "facts",
            "--server",
            &format!("http://{}", server.grpc_addr()),
        ])
        .args(["--output", "json", "get", &id])
        .output()
        .expect("run engram facts get");
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&cli.stdout).expect("json");
    let numbers: Vec<i64> = printed["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|v| v["version"].as_i64())
        .collect();
    assert_eq!(numbers, (1..=VERSIONS).collect::<Vec<_>>());
}

/// About 512 KiB of words, `label` first.
fn half_mib(label: &str) -> String {
    let mut text = format!("{label} ");
    while text.len() < 512 * 1024 {
        text.push_str("lorem ipsum dolor sit amet ");
    }
    text
}

/// Twelve facts, four procedures and four episodes of 512 KiB (10 MiB):
/// the snapshot and the MEMORY block hold what fits one answer, the
/// sections in order (facts, procedures, recent), each the newest it can.
async fn working_memory_of_large_items_fits_one_answer(backend: Backend) {
    const FACTS: usize = 12;
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    for (n, text) in (0..4)
        .map(|n| half_mib(&format!("event {n}")))
        .chain(["hello".to_owned()])
        .enumerate()
    {
        let mut new = episode(&format!("w{n}"), "user_message", json!({}));
        new.content = Some(json_to_proto(&json!(text)));
        episodes
            .append_episode(AppendEpisodeRequest {
                session_id: "w".into(),
                app: "app".into(),
                user: "alice".into(),
                episode: Some(new),
                require_session: false,
            })
            .await
            .expect("append");
    }
    let fact = |(n, kind): (usize, FactKind)| {
        let user = match kind {
            FactKind::Procedural => "",
            _ => "alice",
        };
        MemoryDelta {
            delta: Some(Delta::Add(AddDelta {
                fact_payload: Some(FactPayload {
                    app: "app".into(),
                    user: user.into(),
                    kind: kind as i32,
                    subject: format!("s{n}"),
                    predicate: "is".into(),
                    object: "long".into(),
                    content: Some(json_to_proto(&json!(half_mib(&format!("fact {n:02}"))))),
                    channels: vec![],
                }),
                provenance: Some(provenance(&["w0"])),
            })),
        }
    };
    let mut facts = server.consolidation();
    let kinds = (1..=FACTS)
        .map(|n| (n, FactKind::Semantic))
        .chain((FACTS + 1..=FACTS + 4).map(|n| (n, FactKind::Procedural)))
        .collect::<Vec<_>>();
    for four in kinds.chunks(4) {
        facts
            .apply_deltas(ApplyDeltasRequest {
                deltas: four.iter().copied().map(fact).collect(),
            })
            .await
            .expect("four facts of 512 KiB");
    }

    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    let snapshot = working
        .get_snapshot(GetSnapshotRequest {
            session_id: "w".into(),
            app: "app".into(),
            user: "alice".into(),
            ..GetSnapshotRequest::default()
        })
        .await
        .expect("a snapshot of 10 MiB of items")
        .into_inner();
    let kept = snapshot.facts.len();
    assert!(kept > 0 && kept < FACTS, "{kept} facts");
    let subjects: Vec<String> = snapshot
        .facts
        .iter()
        .filter_map(|f| Some(f.current.as_ref()?.subject.clone()))
        .collect();
    let newest: Vec<String> = (FACTS - kept + 1..=FACTS)
        .map(|n| format!("s{n}"))
        .collect();
    assert_eq!(subjects, newest, "the newest facts, oldest first");
    assert!(
        snapshot.procedures.len() < 4,
        "{}",
        snapshot.procedures.len()
    );
    let recent: Vec<i64> = snapshot.recent.iter().map(|e| e.seq).collect();
    assert_eq!(recent, [5], "the newest episode, small, still fits");

    let block = working
        .render_memory_block(RenderMemoryBlockRequest {
            session_id: "w".into(),
            app: "app".into(),
            user: "alice".into(),
            ..RenderMemoryBlockRequest::default()
        })
        .await
        .expect("a block of 10 MiB of items")
        .into_inner()
        .memory_block;
    assert!(
        block.contains(&format!("## Facts ({kept})")),
        "{}",
        &block[..200]
    );
    assert!(block.contains(&format!("fact {FACTS:02}")));
    assert!(!block.contains("fact 01 "));
    assert!(block.contains("- user_message: hello"));
}

/// A rule over ten episodes of 512 KiB (5 MiB) runs in steps: each run
/// reads a few megabytes of episodes and says more wait, a dry run's
/// deltas fit one answer, and the runs promote every episode once.
async fn a_rule_over_large_episodes_runs_in_steps(backend: Backend) {
    const EPISODES: usize = 10;
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    for n in 0..EPISODES {
        let mut new = episode(&format!("r{n}"), "observation", json!({}));
        new.content = Some(json_to_proto(&json!(half_mib(&format!("event {n}")))));
        episodes
            .append_episode(AppendEpisodeRequest {
                session_id: "r".into(),
                app: "app".into(),
                user: "alice".into(),
                episode: Some(new),
                require_session: false,
            })
            .await
            .expect("append");
    }
    let mut rules = server.consolidation();
    rules
        .create_rule(CreateRuleRequest {
            rule: Some(rule("all", "", false)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create");
    let run = |dry_run: bool| {
        let mut rules = rules.clone();
        async move {
            rules
                .run_rule(RunRuleRequest {
                    rule_id: "all".into(),
                    dry_run,
                    max_episodes: 0,
                })
                .await
                .expect("a run over large episodes")
                .into_inner()
        }
    };
    let dry = run(true).await;
    let read = dry.deltas.len();
    assert!(
        read > 0 && read < EPISODES && dry.more,
        "{read} deltas, more: {}",
        dry.more
    );

    let (mut added, mut runs) = (0, 0);
    loop {
        let done = run(false).await;
        added += done.facts_added;
        runs += 1;
        if !done.more {
            break;
        }
        assert!(runs < EPISODES, "the runs do not end");
    }
    assert_eq!(added, EPISODES as i64, "every episode promoted once");
    assert!(runs > 1, "one run read 5 MiB of episodes");
    assert!(run(true).await.deltas.is_empty());
}

/// A session's tasks of 120 KiB each come in pages: 40 of them (4.8 MB)
/// would pass a message, and asked for without a size they end at about
/// 2 MiB, with a token for the rest.
async fn tasks_come_in_pages(backend: Backend) {
    use engram::proto::{CreateTaskRequest, ListTasksRequest};
    const TASKS: usize = 40;
    let server = TestServer::spawn(backend).await;
    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    for n in 1..=TASKS {
        working
            .create_task(CreateTaskRequest {
                session_id: "w".into(),
                app: "app".into(),
                user: "alice".into(),
                subject: format!("task {n} {}", "s".repeat(60 * 1024)),
                description: "d".repeat(60 * 1024),
                request_id: String::new(),
            })
            .await
            .expect("a task of 120 KiB");
    }
    let list = |page_size: i32, page_token: String| ListTasksRequest {
        session_id: "w".into(),
        page_size,
        page_token,
        ..ListTasksRequest::default()
    };
    let (mut ids, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = working
            .list_tasks(list(0, token))
            .await
            .expect("a page of tasks")
            .into_inner();
        pages += 1;
        assert!(!page.tasks.is_empty());
        ids.extend(page.tasks.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let every: Vec<String> = (1..=TASKS).map(|n| format!("t{n}")).collect();
    assert_eq!(ids, every, "every task once, in creation order");
    assert!(pages >= 3, "40 tasks of 120 KiB in {pages} pages");

    let five = working
        .list_tasks(list(5, String::new()))
        .await
        .expect("five")
        .into_inner();
    assert_eq!(five.tasks.len(), 5);
    let err = working
        .list_tasks(ListTasksRequest {
            session_id: "other".into(),
            app: "app".into(),
            user: "alice".into(),
            page_token: five.next_page_token,
            ..ListTasksRequest::default()
        })
        .await
        .expect_err("another session's token");
    assert_eq!(
        (err.code(), crate::helpers::reason(&err)),
        (tonic::Code::InvalidArgument, "INVALID_PAGE_TOKEN".into())
    );
    let err = working
        .list_tasks(list(-1, String::new()))
        .await
        .expect_err("a negative size");
    assert_eq!(crate::helpers::bad_fields(&err), ["page_size"]);
}

/// A batch of large episodes is appended whole and answered within a
/// message: past about 2 MiB the stored episodes come back without their
/// content and metadata, which the request holds.
async fn large_batches_are_answered_within_a_message(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    let big = |n: usize| {
        let mut new = episode(&format!("b{n}"), "tool_output", json!({"n": n}));
        new.content = Some(json_to_proto(&json!(half_mib(&format!("output {n}")))));
        new
    };
    let appended = episodes
        .append_episodes(crate::consolidation::batch(
            "big",
            "alice",
            (0..12).map(big).collect(),
        ))
        .await
        .expect("12 episodes of 512 KiB, appended and answered")
        .into_inner()
        .episodes;
    assert_eq!(
        appended
            .iter()
            .map(|e| (e.id.as_str(), e.seq))
            .collect::<Vec<_>>(),
        (0..12)
            .map(|n| (format!("b{n}"), n as i64 + 1))
            .collect::<Vec<_>>()
            .iter()
            .map(|(id, seq)| (id.as_str(), *seq))
            .collect::<Vec<_>>()
    );
    assert!(
        appended
            .iter()
            .all(|e| e.content.is_none() && e.metadata.is_none())
    );
    assert!(
        appended
            .iter()
            .all(|e| e.cursor > 0 && e.timestamp.is_some())
    );
    // The same batch again is a replay, answered the same way.
    let again = episodes
        .append_episodes(crate::consolidation::batch(
            "big",
            "alice",
            (0..12).map(big).collect(),
        ))
        .await
        .expect("a replay")
        .into_inner()
        .episodes;
    assert_eq!(again.len(), 12);
    // A small batch is answered whole.
    let small = episodes
        .append_episodes(crate::consolidation::batch(
            "big",
            "alice",
            vec![episode("s0", "user_message", json!({}))],
        ))
        .await
        .expect("small")
        .into_inner()
        .episodes;
    assert!(small[0].content.is_some());
}

on_both_stores!(
    large_batches_are_answered_within_a_message,
    tasks_come_in_pages,
    a_rule_over_large_episodes_runs_in_steps,
    large_answers_end_early_and_page_on,
    large_fact_versions_come_in_pages,
    working_memory_of_large_items_fits_one_answer
);
