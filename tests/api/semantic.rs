//! Semantic and hybrid search through a real server on both stores, with a
//! local fake `/embeddings` endpoint that the test runs: deterministic
//! vectors (words of one meaning share a dimension, so "automobile" finds
//! "car"), scripted failures and an outage switch, and a count of how many
//! times each text was embedded. Covers the outbox drained by the worker,
//! retries on 429/5xx, an outage then recovery with nothing lost, two
//! replicas never embedding an item twice, and `engram reembed`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::{DeleteRequest, SearchHit, SearchMode, SearchRequest, SearchSource};
use serde_json::{Value, json};
use tonic::Code;

use crate::helpers::{Backend, ChildServer, TestServer, connect, reason, until_reads};
use crate::on_both_stores;
use crate::search::{NS, append, episode, name, names, search, set};

const DIMENSIONS: usize = 256;

#[derive(Clone, Default)]
pub(crate) struct Fake {
    /// Successful embeddings per text.
    embedded: Arc<Mutex<HashMap<String, usize>>>,
    /// Statuses to answer with, one per call, before answering normally.
    failures: Arc<Mutex<VecDeque<u16>>>,
    /// While set, every call fails with 503.
    down: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
    failed_calls: Arc<AtomicUsize>,
    models: Arc<Mutex<Vec<String>>>,
    /// A call with an input holding this word waits for `release`, once it
    /// has told `arrived`.
    pub(crate) gate: Arc<Mutex<Option<String>>>,
    pub(crate) arrived: Arc<tokio::sync::Notify>,
    pub(crate) release: Arc<tokio::sync::Notify>,
}

impl Fake {
    pub(crate) fn count(&self, text: &str) -> usize {
        self.embedded
            .lock()
            .expect("embedded")
            .iter()
            .filter(|(t, _)| t.contains(text))
            .map(|(_, n)| *n)
            .sum()
    }
}

/// Words of one meaning map to one concept.
fn concept(word: &str) -> &str {
    match word {
        "car" | "automobile" | "vehicle" | "sedan" => "car",
        "deploy" | "deployment" | "rollout" | "release" | "shipped" => "deploy",
        "holiday" | "vacation" | "trip" => "holiday",
        "food" | "lunch" | "pasta" | "sushi" | "meal" => "food",
        other => other,
    }
}

fn vector(text: &str) -> Vec<f32> {
    let mut v = vec![0.0_f32; DIMENSIONS];
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
    {
        // FNV-1a: the same dimension for the same concept, every run.
        let hash = concept(word)
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        v[(hash % DIMENSIONS as u64) as usize] += 1.0;
    }
    v
}

async fn embeddings(State(fake): State<Fake>, Json(body): Json<Value>) -> (StatusCode, String) {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    let gated = fake.gate.lock().expect("gate").clone().is_some_and(|word| {
        body["input"].as_array().is_some_and(|a| {
            a.iter()
                .any(|v| v.as_str().is_some_and(|t| t.contains(&word)))
        })
    });
    if gated {
        fake.arrived.notify_one();
        fake.release.notified().await;
    }
    let scripted = fake.failures.lock().expect("failures").pop_front();
    let status = match scripted {
        Some(status) => Some(status),
        None if fake.down.load(Ordering::SeqCst) => Some(503),
        None => None,
    };
    if let Some(status) = status {
        fake.failed_calls.fetch_add(1, Ordering::SeqCst);
        let body = json!({"error": {"message": "scripted failure"}});
        return (
            StatusCode::from_u16(status).expect("status"),
            body.to_string(),
        );
    }
    let inputs: Vec<String> = body["input"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    fake.models
        .lock()
        .expect("models")
        .push(body["model"].as_str().unwrap_or("").to_owned());
    let mut data = Vec::new();
    {
        let mut embedded = fake.embedded.lock().expect("embedded");
        for (index, input) in inputs.iter().enumerate() {
            *embedded.entry(input.clone()).or_insert(0) += 1;
            data.push(json!({"index": index, "embedding": vector(input)}));
        }
    }
    (StatusCode::OK, json!({"data": data}).to_string())
}

pub(crate) async fn start_fake() -> (Fake, SocketAddr) {
    let fake = Fake::default();
    let app = axum::Router::new()
        .route("/v1/embeddings", axum::routing::post(embeddings))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (fake, addr)
}

pub(crate) async fn server_with(backend: Backend, addr: SocketAddr) -> TestServer {
    TestServer::spawn_with(backend, |s| {
        s.embedder_url = Some(format!("http://{addr}/v1"));
        s.embedder_model = Some("fake-1".to_owned());
        s.embedder_retries = Some(1);
        s.embedder_timeout_ms = Some(5000);
        s.embedder_batch = Some(8);
    })
    .await
}

pub(crate) fn request(text: &str, mode: SearchMode) -> SearchRequest {
    SearchRequest {
        query: text.to_owned(),
        mode: mode as i32,
        ..SearchRequest::default()
    }
}

/// Searches until `done` holds for the hit names (the worker embeds in the
/// background), for at most 30 seconds; returns the hits.
pub(crate) async fn eventually(
    server: &TestServer,
    request: SearchRequest,
    done: impl Fn(&[String]) -> bool,
) -> Vec<SearchHit> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let hits = search(server, request.clone()).await;
        if done(&names(&hits)) {
            return hits;
        }
        assert!(
            Instant::now() < deadline,
            "never found for {:?}: {:?}",
            request.query,
            names(&hits)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many entries wait in the embedding outbox.
pub(crate) const OUTBOX: &str = "SELECT count(*) FROM embedding_outbox";

pub(crate) fn has(name: &str) -> impl Fn(&[String]) -> bool + '_ {
    move |names| names.iter().any(|n| n == name)
}

/// Semantic search finds by meaning where no word matches, hybrid (the
/// default with an embedder) fuses both lists, filters and exclusions
/// apply, and a deleted key or a replaced version is gone at once.
async fn semantic_and_hybrid_search(backend: Backend) {
    let (fake, addr) = start_fake().await;
    let server = server_with(backend, addr).await;
    let mut memory = server.memory();
    memory
        .set(set("notes", "car", json!("I parked the car in the garage")))
        .await
        .expect("set");
    memory
        .set(set(
            "notes",
            "lunch",
            json!({"text": "we had pasta at noon"}),
        ))
        .await
        .expect("set");
    let mut episodes = server.episodes();
    episodes
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode(
                    "e1",
                    "user_message",
                    "",
                    json!("the rollout reached staging"),
                ),
                episode("e2", "user_message", "", json!("my vacation starts friday")),
            ],
        ))
        .await
        .expect("append");
    episodes
        .append_episodes(append(
            "s2",
            "bob",
            vec![episode(
                "e3",
                "user_message",
                "",
                json!("bob booked a holiday in spain"),
            )],
        ))
        .await
        .expect("append");

    let hits = eventually(
        &server,
        request("automobile", SearchMode::Semantic),
        has("memory:notes/car@1"),
    )
    .await;
    assert_eq!(name(&hits[0]), "memory:notes/car@1", "best first");
    assert_eq!(hits[0].source, SearchSource::Memory as i32);
    assert!(
        hits[0].score > 0.3,
        "cosine of the match: {}",
        hits[0].score
    );
    assert!(
        hits[0].snippet.contains("parked the car"),
        "{}",
        hits[0].snippet
    );
    assert!(
        search(&server, request("automobile", SearchMode::Lexical))
            .await
            .is_empty(),
        "no word of the query is in the item"
    );
    // The default mode with an embedder is hybrid: meaning and words.
    let hits = search(
        &server,
        request("automobile garage", SearchMode::Unspecified),
    )
    .await;
    assert_eq!(name(&hits[0]), "memory:notes/car@1");
    assert!(
        hits[0].snippet.contains("**garage**"),
        "the lexical snippet is kept: {}",
        hits[0].snippet
    );

    // Episodes' filters: the same meaning, narrowed to a user.
    eventually(&server, request("trip", SearchMode::Semantic), |n| {
        has("episode:e2")(n) && has("episode:e3")(n)
    })
    .await;
    let only = |user: &str| SearchRequest {
        sources: vec![SearchSource::Episodes as i32],
        user: user.to_owned(),
        ..request("trip", SearchMode::Semantic)
    };
    let alice = names(&search(&server, only("alice")).await);
    assert_eq!(
        alice.first().map(String::as_str),
        Some("episode:e2"),
        "{alice:?}"
    );
    assert!(!alice.contains(&"episode:e3".to_owned()), "{alice:?}");
    let bob = names(&search(&server, only("bob")).await);
    assert_eq!(
        bob.first().map(String::as_str),
        Some("episode:e3"),
        "{bob:?}"
    );
    // An excluded word drops a hit the vectors would rank.
    let excluded = names(&search(&server, request("trip -spain", SearchMode::Semantic)).await);
    assert!(excluded.contains(&"episode:e2".to_owned()), "{excluded:?}");
    assert!(!excluded.contains(&"episode:e3".to_owned()), "{excluded:?}");

    // A deleted key is gone from the call that deleted it on.
    memory
        .delete(DeleteRequest {
            scope_type: NS,
            scope: "notes".to_owned(),
            key: "car".to_owned(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    let after = names(&search(&server, request("automobile", SearchMode::Semantic)).await);
    assert!(
        !after.iter().any(|n| n.starts_with("memory:notes/car")),
        "{after:?}"
    );
    // A new version replaces the old one's vector.
    memory
        .set(set("notes", "lunch", json!({"text": "sushi tonight"})))
        .await
        .expect("set");
    let hits = eventually(
        &server,
        request("meal", SearchMode::Semantic),
        has("memory:notes/lunch@2"),
    )
    .await;
    assert!(
        !names(&hits).contains(&"memory:notes/lunch@1".to_owned()),
        "only the current version is found"
    );
    assert_eq!(fake.count("we had pasta at noon"), 1, "each version once");
    assert_eq!(fake.count("sushi tonight"), 1);
    assert!(
        fake.models
            .lock()
            .expect("models")
            .iter()
            .all(|m| m == "fake-1")
    );
}

/// 429 and 5xx are retried; an outage fails explicit semantic searches
/// with EMBEDDER_UNAVAILABLE while hybrid and lexical keep answering, and
/// what was written meanwhile is embedded, once each, when the endpoint
/// comes back.
async fn retries_and_an_outage_lose_nothing(backend: Backend) {
    let (fake, addr) = start_fake().await;
    let server = server_with(backend, addr).await;
    fake.failures.lock().expect("failures").extend([429, 503]);
    let mut episodes = server.episodes();
    episodes
        .append_episodes(append(
            "s1",
            "alice",
            vec![episode(
                "r1",
                "user_message",
                "",
                json!("the deployment finished"),
            )],
        ))
        .await
        .expect("append");
    // The worker meets the scripted failures first (no search embeds a
    // query before the item is in).
    let deadline = Instant::now() + Duration::from_secs(30);
    while fake.count("the deployment finished") == 0 {
        assert!(Instant::now() < deadline, "never embedded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        fake.failed_calls.load(Ordering::SeqCst),
        2,
        "429 then 503, then the answer"
    );
    eventually(
        &server,
        request("release", SearchMode::Semantic),
        has("episode:r1"),
    )
    .await;
    assert_eq!(fake.count("the deployment finished"), 1);

    fake.down.store(true, Ordering::SeqCst);
    let failed_before = fake.failed_calls.load(Ordering::SeqCst);
    let written: Vec<String> = (0..5)
        .map(|i| format!("outage note {i} about a sedan"))
        .collect();
    episodes
        .append_episodes(append(
            "s2",
            "alice",
            written
                .iter()
                .enumerate()
                .map(|(i, text)| episode(&format!("o{i}"), "user_message", "", json!(text)))
                .collect(),
        ))
        .await
        .expect("appends do not wait for the embedder");
    // The worker has tried (and failed) since the appends.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fake.failed_calls.load(Ordering::SeqCst) < failed_before + 2 {
        assert!(Instant::now() < deadline, "the worker never tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = SearchServiceClient::new(server.channel.clone())
        .search(request("vehicle", SearchMode::Semantic))
        .await
        .expect_err("the embedder is down");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(reason(&err), "EMBEDDER_UNAVAILABLE");
    let lexical = names(&search(&server, request("outage sedan", SearchMode::Unspecified)).await);
    assert_eq!(lexical.len(), 5, "hybrid falls back to words: {lexical:?}");

    fake.down.store(false, Ordering::SeqCst);
    eventually(&server, request("vehicle", SearchMode::Semantic), |n| {
        (0..5).all(|i| n.contains(&format!("episode:o{i}")))
    })
    .await;
    for text in &written {
        assert_eq!(fake.count(text), 1, "{text} embedded once");
    }
}

/// What waits in the outbox is a metric, `engram_embedding_pending_items`:
/// it grows while the embedder is down and drains to 0 once it is back.
/// (A server process of its own, since the metrics are per process.)
async fn the_outbox_backlog_is_a_metric(backend: Backend) {
    use crate::helpers::{TestDb, metric, metric_until};

    let (fake, addr) = start_fake().await;
    fake.down.store(true, Ordering::SeqCst);
    let db = TestDb::new(backend).await;
    let url = format!("http://{addr}/v1");
    let server = ChildServer::spawn(
        &[],
        &[
            ("ENGRAM_DATABASE_URL", &db.url),
            ("ENGRAM_EMBEDDER_URL", &url),
            ("ENGRAM_EMBEDDER_MODEL", "fake-1"),
            ("ENGRAM_EMBEDDER_RETRIES", "0"),
        ],
        None,
    )
    .await;
    let http = server.http_addr();
    const PENDING: &str = "engram_embedding_pending_items";
    metric_until(http, PENDING, |n| n == 0.0).await;
    let texts: Vec<String> = (0..6).map(|i| format!("backlog note {i}")).collect();
    let mut episodes = engram::proto::episode_service_client::EpisodeServiceClient::new(
        connect(server.grpc_addr).await,
    );
    episodes
        .append_episodes(append(
            "s1",
            "alice",
            texts
                .iter()
                .enumerate()
                .map(|(i, text)| episode(&format!("b{i}"), "user_message", "", json!(text)))
                .collect(),
        ))
        .await
        .expect("append");
    metric_until(http, PENDING, |n| n == 6.0).await;
    metric_until(http, "engram_embedder_failures_total", |n| n >= 1.0).await;
    assert_eq!(
        metric(http, PENDING).await,
        Some(6.0),
        "nothing was embedded"
    );

    fake.down.store(false, Ordering::SeqCst);
    metric_until(http, PENDING, |n| n == 0.0).await;
    for text in &texts {
        assert_eq!(fake.count(text), 1, "{text} embedded once");
    }
    assert!(server.terminate().await.success());
}

/// Two replicas on one Postgres share the outbox: every item is embedded
/// by exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_embed_each_item_once() {
    let (fake, addr) = start_fake().await;
    let one = server_with(Backend::Postgres, addr).await;
    let url = format!("http://{addr}/v1");
    let two = ChildServer::spawn(
        &["--migrate", "off"],
        &[
            ("ENGRAM_DATABASE_URL", &one.db.url),
            ("ENGRAM_EMBEDDER_URL", &url),
            ("ENGRAM_EMBEDDER_MODEL", "fake-1"),
            ("ENGRAM_EMBEDDER_BATCH", "4"),
        ],
        None,
    )
    .await;
    let mut clients = [
        one.episodes(),
        engram::proto::episode_service_client::EpisodeServiceClient::new(
            connect(two.grpc_addr).await,
        ),
    ];
    let mut texts = Vec::new();
    for round in 0..20 {
        let batch: Vec<_> = (0..10)
            .map(|i| {
                let text = format!("replica note {round} {i} on the car");
                texts.push(text.clone());
                episode(&format!("p{round}-{i}"), "user_message", "", json!(text))
            })
            .collect();
        clients[round % 2]
            .append_episodes(append(&format!("s{round}"), "alice", batch))
            .await
            .expect("append");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !texts.iter().all(|t| fake.count(t) > 0) {
        assert!(Instant::now() < deadline, "not everything was embedded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let twice: Vec<_> = texts.iter().filter(|t| fake.count(t) != 1).collect();
    assert!(twice.is_empty(), "embedded more than once: {twice:?}");
    let found = search(
        &one,
        SearchRequest {
            limit: 100,
            sources: vec![SearchSource::Episodes as i32],
            ..request("vehicle", SearchMode::Semantic)
        },
    )
    .await;
    assert_eq!(
        found.len(),
        100,
        "vectors stored by either replica are found"
    );
    assert!(two.terminate().await.success());
}

/// A deleted session made again holds a new episode at the old episode's
/// place (session, seq 1). When one replica's embedder call for the old
/// text is still in flight as the other replica embeds the new one, the
/// late vector is not stored over the new episode's: its text is no longer
/// the one embedded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_vector_skips_an_item_written_again_in_its_place() {
    let (fake, addr) = start_fake().await;
    let url = format!("http://{addr}/v1");
    let one = TestServer::spawn_with(Backend::Postgres, |s| {
        s.embedder_url = Some(url.clone());
        s.embedder_model = Some("fake-1".to_owned());
        s.embedder_retries = Some(1);
        s.embedder_timeout_ms = Some(60_000);
        s.embedder_batch = Some(8);
    })
    .await;
    let two = ChildServer::spawn(
        &["--migrate", "off"],
        &[
            ("ENGRAM_DATABASE_URL", &one.db.url),
            ("ENGRAM_EMBEDDER_URL", &url),
            ("ENGRAM_EMBEDDER_MODEL", "fake-1"),
            ("ENGRAM_EMBEDDER_TIMEOUT_MS", "60000"),
        ],
        None,
    )
    .await;
    *fake.gate.lock().expect("gate") = Some("marmalade".to_owned());
    let mut episodes = one.episodes();
    let old = "marmalade holiday trip to the beach";
    episodes
        .append_episodes(append(
            "reborn",
            "alice",
            vec![episode("old", "user_message", "", json!(old))],
        ))
        .await
        .expect("append the old episode");
    // Whichever replica took the old episode now waits in its call.
    tokio::time::timeout(Duration::from_secs(30), fake.arrived.notified())
        .await
        .expect("the old episode reaches the embedder");
    one.sessions()
        .delete_session(engram::proto::DeleteSessionRequest {
            session_id: "reborn".to_owned(),
            ..Default::default()
        })
        .await
        .expect("delete the session");
    episodes
        .append_episodes(append(
            "reborn",
            "alice",
            vec![episode(
                "new",
                "user_message",
                "",
                json!("pasta lunch with the team"),
            )],
        ))
        .await
        .expect("append the new episode at seq 1");
    let semantic = |text: &str| SearchRequest {
        sources: vec![SearchSource::Episodes as i32],
        ..request(text, SearchMode::Semantic)
    };
    // The other replica embeds the new episode meanwhile.
    eventually(&one, semantic("meal"), has("episode:new")).await;
    fake.release.notify_one();
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&one.db.url)
        .await
        .expect("connect");
    until_reads(&mut db, OUTBOX, 0, "the late call finishes").await;
    let score = |hits: Vec<SearchHit>| {
        assert_eq!(names(&hits), ["episode:new"]);
        hits[0].score
    };
    let by_its_meaning = score(search(&one, semantic("meal")).await);
    let by_the_old_meaning = score(search(&one, semantic("vacation")).await);
    assert!(
        by_its_meaning > by_the_old_meaning,
        "the new episode carries the old text's vector: {by_its_meaning} for its meaning, \
         {by_the_old_meaning} for the old one's"
    );
    assert_eq!(fake.count(old), 1, "the old text was embedded once");
    assert!(two.terminate().await.success());
}

/// `engram reembed` embeds what was written before an embedder was
/// configured, with progress, then again everything after a model change.
async fn reembed_backfills(backend: Backend) {
    let (fake, addr) = start_fake().await;
    let mut server = TestServer::spawn(backend).await;
    server
        .memory()
        .set(set("notes", "car", json!("the sedan is blue")))
        .await
        .expect("set");
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            (0..30)
                .map(|i| {
                    episode(
                        &format!("b{i}"),
                        "user_message",
                        "",
                        json!(format!("backfill {i} car")),
                    )
                })
                .collect(),
        ))
        .await
        .expect("append");
    let url = format!("http://{addr}/v1");
    let db_url = server.db.url.clone();
    let reembed = |model: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .arg("reembed")
            .env("ENGRAM_DATABASE_URL", &db_url)
            .env("ENGRAM_EMBEDDER_URL", &url)
            .env("ENGRAM_EMBEDDER_MODEL", model)
            .env("ENGRAM_EMBEDDER_BATCH", "7")
            .output()
            .expect("run engram reembed");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let progress = reembed("fake-1");
    assert!(progress.contains("episodes"), "{progress}");
    assert!(progress.contains("30 of 30"), "{progress}");
    assert!(progress.contains("31 items embedded"), "{progress}");
    assert_eq!(fake.count("the sedan is blue"), 1);
    assert_eq!(
        reembed("fake-1").lines().last(),
        Some("engram reembed: 0 items embedded")
    );

    // A server with the embedder finds what reembed stored (beside the
    // first on Postgres; in its place on SQLite, one server per file).
    if matches!(backend, Backend::Sqlite) {
        server.stop_serving().await;
    }
    let replica = ChildServer::spawn(
        &["--migrate", "off"],
        &[
            ("ENGRAM_DATABASE_URL", &db_url),
            ("ENGRAM_EMBEDDER_URL", &url),
            ("ENGRAM_EMBEDDER_MODEL", "fake-1"),
        ],
        None,
    )
    .await;
    let hits = SearchServiceClient::new(connect(replica.grpc_addr).await)
        .search(SearchRequest {
            limit: 50,
            ..request("automobile", SearchMode::Semantic)
        })
        .await
        .expect("search")
        .into_inner()
        .hits;
    assert_eq!(hits.len(), 31, "{:?}", names(&hits));
    assert!(replica.terminate().await.success());

    // Another model: everything again.
    let progress = reembed("fake-2");
    assert!(progress.contains("31 items embedded"), "{progress}");
    assert_eq!(fake.count("the sedan is blue"), 2);
}

/// With a similarity threshold, a rule's Add near a live fact of the same
/// owner becomes an Update of it; a dissimilar one is still added.
async fn consolidation_merges_near_duplicate_facts(backend: Backend) {
    use crate::consolidation::{all_facts, batch, episode as observed, rule};
    use engram::proto::consolidation_service_client::ConsolidationServiceClient;
    use engram::proto::{CreateRuleRequest, RunRuleRequest};

    let (fake, addr) = start_fake().await;
    let server = TestServer::spawn_with(backend, |s| {
        s.embedder_url = Some(format!("http://{addr}/v1"));
        s.embedder_model = Some("fake-1".to_owned());
        s.consolidation_dedup_similarity = Some(0.8);
        s.scheduler_interval_ms = Some(0);
    })
    .await;
    let mut rules = ConsolidationServiceClient::new(server.channel.clone());
    rules
        .create_rule(CreateRuleRequest {
            rule: Some(rule("all", "", false)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create rule");
    let run = |mut rules: ConsolidationServiceClient<_>| async move {
        rules
            .run_rule(RunRuleRequest {
                rule_id: "all".to_owned(),
                ..RunRuleRequest::default()
            })
            .await
            .expect("run")
            .into_inner()
    };
    let mut episodes = server.episodes();
    let said = |id: &str, subject: &str, predicate: &str, content: &str| {
        let mut e = observed(
            id,
            "observation",
            json!({"subject": subject, "predicate": predicate}),
        );
        e.content = Some(engram::api::convert::json_to_proto(&json!(content)));
        e
    };
    episodes
        .append_episodes(batch(
            "s1",
            "alice",
            vec![said("d1", "car", "drives", "alice drives a sedan")],
        ))
        .await
        .expect("append");
    assert_eq!(run(rules.clone()).await.facts_added, 1);
    // The fact's vector is stored by the worker.
    eventually(
        &server,
        SearchRequest {
            sources: vec![SearchSource::Facts as i32],
            ..request("automobile", SearchMode::Semantic)
        },
        |n| n.iter().any(|n| n == "fact:car"),
    )
    .await;

    episodes
        .append_episodes(batch(
            "s1",
            "alice",
            vec![
                said("d2", "vehicle", "owns", "alice drives a sedan car"),
                said("d3", "food", "likes", "alice likes pasta"),
            ],
        ))
        .await
        .expect("append");
    let outcome = run(rules.clone()).await;
    assert_eq!(
        (outcome.facts_added, outcome.facts_updated),
        (1, 1),
        "the near duplicate merged, the other added: {outcome:?}"
    );
    let facts = all_facts(&mut rules).await;
    assert_eq!(facts.len(), 2, "{facts:?}");
    let merged = facts
        .iter()
        .find(|f| f.current.as_ref().is_some_and(|v| v.subject == "vehicle"))
        .expect("the merged fact");
    assert_eq!(merged.current.as_ref().map(|v| v.version), Some(2));
    assert!(fake.count("alice drives a sedan car") >= 1);
}

/// With an embedder, the MEMORY block's facts for a query are found by
/// meaning too: "automobile" brings the fact about a sedan first.
async fn the_memory_block_by_meaning(backend: Backend) {
    use crate::search::remember;
    use engram::proto::RenderMemoryBlockRequest;
    use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;

    let (_fake, addr) = start_fake().await;
    let server = server_with(backend, addr).await;
    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    for (subject, content) in [
        ("car", "alice drives a sedan"),
        ("food", "alice likes pasta"),
        ("city", "alice lives in Lisbon"),
    ] {
        working
            .remember(remember("s1", "alice", subject, content))
            .await
            .expect("remember");
    }
    eventually(
        &server,
        SearchRequest {
            sources: vec![SearchSource::Facts as i32],
            ..request("automobile", SearchMode::Semantic)
        },
        |n| n.iter().any(|n| n == "fact:car"),
    )
    .await;
    let block = working
        .render_memory_block(RenderMemoryBlockRequest {
            session_id: "s1".to_owned(),
            app: "app".to_owned(),
            user: "alice".to_owned(),
            max_facts: 1,
            max_events: 0,
            query: "automobile".to_owned(),
        })
        .await
        .expect("render")
        .into_inner()
        .memory_block;
    let facts = block.split("## Facts").nth(1).unwrap_or_default();
    assert!(facts.contains("sedan"), "{block}");
    assert!(!facts.contains("Lisbon"), "only the relevant fact: {block}");
}

on_both_stores!(
    the_memory_block_by_meaning,
    consolidation_merges_near_duplicate_facts,
    semantic_and_hybrid_search,
    retries_and_an_outage_lose_nothing,
    the_outbox_backlog_is_a_metric,
    reembed_backfills,
);
