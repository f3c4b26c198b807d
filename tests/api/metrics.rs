//! `/metrics` scraped with a real HTTP client before and after traffic: the
//! call counters by method and code, the latency histogram, live streams,
//! the pool, evictions, scheduler runs and the process's CPU all move.
//!
//! The registry is per process and other tests run beside this one, so
//! counters are checked to have grown by at least what this test did.

use std::time::{Duration, Instant};

use engram::api::convert::json_to_proto;
use engram::proto::consolidation_rule::Cadence;
use engram::proto::{
    AppendEpisodeRequest, ConsolidationRule, CreateRuleRequest, GetRequest, NewEpisode, ScopeType,
    SetRequest, WatchRequest,
};
use serde_json::json;

use crate::helpers::{Backend, TestServer, http_get};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

/// The samples of a scrape, by their full name with labels.
async fn scrape(server: &TestServer) -> Vec<(String, f64)> {
    let (status, content_type, body) = http_get(server.http_addr(), "/metrics", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        content_type.as_deref(),
        Some("text/plain; version=0.0.4"),
        "the Prometheus text format"
    );
    let text = String::from_utf8(body).expect("utf-8");
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').expect("name value");
            (name.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

fn sample(samples: &[(String, f64)], name: &str) -> f64 {
    samples
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0.0, |(_, v)| *v)
}

const SET_OK: &str = r#"engram_rpc_total{method="/engram.v1.MemoryService/Set",code="OK"}"#;
const GET_MISSING: &str =
    r#"engram_rpc_total{method="/engram.v1.MemoryService/Get",code="NOT_FOUND"}"#;
const SET_LATENCY: &str =
    r#"engram_rpc_duration_seconds_count{method="/engram.v1.MemoryService/Set"}"#;
const WATCHES: &str = r#"engram_live_streams{method="/engram.v1.MemoryService/Watch"}"#;
const GRPC_SET_STARTED: &str = r#"grpc_server_started_total{grpc_service="engram.v1.MemoryService",grpc_method="Set",grpc_type="unary"}"#;
const GRPC_SET_OK: &str = r#"grpc_server_handled_total{grpc_service="engram.v1.MemoryService",grpc_method="Set",grpc_type="unary",grpc_code="OK"}"#;
const GRPC_GET_MISSING: &str = r#"grpc_server_handled_total{grpc_service="engram.v1.MemoryService",grpc_method="Get",grpc_type="unary",grpc_code="NotFound"}"#;
const GRPC_SET_SECONDS: &str = r#"grpc_server_handling_seconds_count{grpc_service="engram.v1.MemoryService",grpc_method="Set",grpc_type="unary"}"#;
const GRPC_WATCH_STARTED: &str = r#"grpc_server_started_total{grpc_service="engram.v1.MemoryService",grpc_method="Watch",grpc_type="server_stream"}"#;
const EPISODES_EVICTED: &str = r#"engram_evictions_total{kind="episode"}"#;
const SCHEDULER_RAN: &str = r#"engram_scheduler_runs_total{outcome="ran"}"#;

async fn counters_move_with_traffic(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| {
        s.max_events_per_session = Some(2);
        s.scheduler_interval_ms = Some(50);
    })
    .await;
    let before = scrape(&server).await;
    assert!(
        sample(&before, r#"engram_db_pool_max_connections"#) >= 1.0,
        "the pool is described"
    );
    // The process, as every Prometheus client's process collector names it.
    let build = format!(
        "engram_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&before, &build), 1.0);
    assert!(sample(&before, "process_resident_memory_bytes") > 1e6);
    assert!(sample(&before, "process_open_fds") >= 3.0);
    assert!(sample(&before, "process_max_fds") >= sample(&before, "process_open_fds"));
    let started = sample(&before, "process_start_time_seconds");
    let now = chrono::Utc::now().timestamp() as f64;
    assert!(started > now - 3600.0 && started <= now + 1.0, "{started}");

    let mut memory = server.memory();
    for i in 0..5 {
        memory
            .set(SetRequest {
                scope_type: NS,
                scope: "m".into(),
                key: format!("k{i}"),
                value: Some(json_to_proto(&json!(i))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
    }
    memory
        .get(GetRequest {
            scope_type: NS,
            scope: "m".into(),
            key: "missing".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect_err("not found");
    let watch = memory
        .watch(WatchRequest {
            scope_type: NS,
            scope: "m".into(),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    server
        .consolidation()
        .create_rule(CreateRuleRequest {
            rule: Some(ConsolidationRule {
                id: "all".into(),
                cadence: Some(Cadence::EveryNEpisodes(1)),
                then_emits: vec!["semantic".into()],
                confidence: 0.8,
                enabled: true,
                ..ConsolidationRule::default()
            }),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("rule");
    let mut episodes = server.episodes();
    for i in 0..4 {
        episodes
            .append_episode(AppendEpisodeRequest {
                session_id: "s".into(),
                app: "a".into(),
                user: "u".into(),
                episode: Some(NewEpisode {
                    id: format!("e{i}"),
                    r#type: "observation".into(),
                    content: Some(json_to_proto(&json!(i))),
                    ..NewEpisode::default()
                }),
                require_session: false,
            })
            .await
            .expect("append");
    }

    let after = scrape(&server).await;
    let grew = |name: &str| sample(&after, name) - sample(&before, name);
    assert!(
        grew("process_cpu_seconds_total") > 0.0,
        "the calls took CPU"
    );
    assert!(grew(SET_OK) >= 5.0, "Set OK grew by {}", grew(SET_OK));
    assert!(
        grew(SET_LATENCY) >= 5.0,
        "Set latency count grew by {}",
        grew(SET_LATENCY)
    );
    assert!(grew(GET_MISSING) >= 1.0);
    // The same calls under the names gRPC dashboards read.
    assert!(
        grew(GRPC_SET_STARTED) >= 5.0,
        "Set started grew by {}",
        grew(GRPC_SET_STARTED)
    );
    assert!(grew(GRPC_SET_OK) >= 5.0);
    assert!(grew(GRPC_SET_SECONDS) >= 5.0);
    assert!(grew(GRPC_GET_MISSING) >= 1.0);
    assert!(grew(GRPC_WATCH_STARTED) >= 1.0, "the watch started");
    assert!(sample(&after, WATCHES) >= 1.0, "the open watch is live");
    assert!(grew(EPISODES_EVICTED) >= 2.0, "4 appends over a limit of 2");
    // Every write goes through group commit, alone when nothing else waits.
    for (kind, calls) in [("write", 5.0), ("append", 4.0)] {
        let grouped = format!("engram_grouped_calls_total{{kind=\"{kind}\"}}");
        let groups = format!("engram_groups_total{{kind=\"{kind}\"}}");
        assert!(grew(&grouped) >= calls, "{kind}: {}", grew(&grouped));
        assert!(grew(&groups) >= 1.0, "{kind} groups: {}", grew(&groups));
    }

    // The scheduler runs the rule in the background: poll until it has.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = scrape(&server).await;
        if sample(&now, SCHEDULER_RAN) > sample(&before, SCHEDULER_RAN) {
            break;
        }
        assert!(Instant::now() < deadline, "the scheduler never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(watch);
}

on_both_stores!(counters_move_with_traffic);
