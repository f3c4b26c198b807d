//! The workloads, each driven by `--clients` tasks on their own
//! connections for `--warmup` then `--duration`.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::service::interceptor::InterceptedService;

use crate::cli::{Authorized, Bearer};

use super::server::Spawned;
use super::{BenchArgs, Figures, Latency, cpu};
use crate::api::convert::json_to_proto;
use crate::proto;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::memory_service_client::MemoryServiceClient;
use crate::proto::search_service_client::SearchServiceClient;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Set a 200-byte JSON value on one of 10k keys of one scope
    Set,
    /// Get the newest version of one of the 10k keys
    Get,
    /// Get version 1 of one of the 10k keys
    GetVersion,
    /// List the first page of 50 keys under one of ten prefixes of 1,000 keys
    List,
    /// Stream every version of a key with --history-versions versions
    History,
    /// Append a 1 KB episode
    Append,
    /// The 20 newest episodes of a user, over --recent-episodes episodes
    Recent,
    /// Search a user's episodes for three words, over the same episodes
    /// as recent (lexical, 10 hits)
    Search,
    /// A gRPC health check: no database, no domain code; the ceiling of
    /// one round trip through the transport on this machine
    Ping,
    /// Append-to-delivery latency of a tail on a second connection (and,
    /// on Postgres with a started server, on a second server process)
    Tail,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Set => "set",
            Workload::Get => "get",
            Workload::GetVersion => "get-version",
            Workload::List => "list",
            Workload::History => "history",
            Workload::Append => "append",
            Workload::Recent => "recent",
            Workload::Search => "search",
            Workload::Ping => "ping",
            Workload::Tail => "tail",
        }
    }
}

pub const SCOPE: &str = "bench";
pub const KEYS: u64 = 10_000;
const HISTORY_SCOPE: &str = "bench-history";
pub const RECENT_APP: &str = "bench";
/// The app of the sessions `append` writes to.
pub const APPEND_APP: &str = "bench-append";
/// The app of the sessions `tail` writes to.
pub const TAIL_APP: &str = "bench-tail";
pub const RECENT_USERS: u64 = 100;
pub const RECENT_SESSIONS: i64 = 1000;

/// The session a client of a run appends to for `app`: the run's token in
/// it tells this run's sessions from other runs' (see `cleanup`).
pub fn session_id(app: &str, run: &str, client: usize) -> String {
    format!("{}{client}", session_prefix(app, run))
}

/// What the ids of a run's sessions of `app` begin with.
pub fn session_prefix(app: &str, run: &str) -> String {
    format!("{app}-{run}-")
}

/// The user a run's `tail` appends as and follows.
pub fn tail_user(run: &str) -> String {
    format!("{TAIL_APP}-{run}")
}

/// A tiny deterministic generator per client (xorshift).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The bench's text is words `w100` … `w50000`: the content words of a
/// Zipf-distributed vocabulary, whose first 100 ranks (the stop words the
/// index drops) are left out. A rank is drawn log-uniformly, which is
/// Zipf's law with exponent 1: `w100` is 500 times as common as `w50000`.
pub const FIRST_RANK: u64 = 100;
pub const VOCABULARY: u64 = 50_000;

/// A word of the bench's text.
pub fn word(rng: &mut Rng) -> String {
    let u = rng.below(1_000_003) as f64 / 1_000_003.0;
    let spread = (VOCABULARY / FIRST_RANK) as f64;
    format!("w{}", (FIRST_RANK as f64 * spread.powf(u)) as u64)
}

/// About `bytes` of words: what appends store and searches look through.
pub fn text(rng: &mut Rng, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 8);
    while out.len() < bytes {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&word(rng));
    }
    out
}

pub fn key(n: u64) -> String {
    format!("k{n:05}")
}

pub fn set_value(n: u64) -> serde_json::Value {
    serde_json::json!({ "n": n, "pad": "x".repeat(170) })
}

/// Where the server is, and the bearer token to call it with.
#[derive(Clone)]
pub struct Target {
    pub address: String,
    pub bearer: Bearer,
}

pub(super) async fn channel(target: &Target) -> anyhow::Result<Authorized> {
    let address = &target.address;
    let channel = tonic::transport::Endpoint::from_shared(address.to_owned())?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("cannot connect to {address}"))?;
    Ok(InterceptedService::new(channel, target.bearer.clone()))
}

fn ns(scope: &str, key: String) -> (i32, String, String) {
    (proto::ScopeType::Namespace as i32, scope.to_owned(), key)
}

/// What one workload's clients did after the warm-up.
struct Measured {
    ops: u64,
    /// Items moved, where an op moves many (history: versions).
    items: u64,
    /// Each op's latency in microseconds.
    samples: Vec<u64>,
    /// The CPU the bench, the server and Postgres used meanwhile.
    cpu: Option<(cpu::Snapshot, cpu::Snapshot)>,
}

/// Runs one op per client in a loop; an op returns how many items it
/// moved. Latencies and CPU count only after the warm-up.
async fn measure<F, Fut>(args: &BenchArgs, make: F) -> anyhow::Result<Measured>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<Box<dyn FnMut() -> OpFuture + Send>>>,
{
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let server = args.server_pid;
    let reading = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        let before = cpu::Snapshot::take(server)?;
        tokio::time::sleep_until(end.into()).await;
        Some((before, cpu::Snapshot::take(server)?))
    });
    let mut tasks = Vec::new();
    for client in 0..args.clients {
        let mut op = make(client).await?;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let (mut ops, mut items, mut samples) = (0u64, 0u64, Vec::new());
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                let moved = op().await?;
                if began >= measure_from {
                    ops += 1;
                    items += moved;
                    samples.push(began.elapsed().as_micros() as u64);
                }
            }
            Ok::<_, anyhow::Error>((ops, items, samples))
        }));
    }
    let (mut ops, mut items, mut samples) = (0, 0, Vec::new());
    for task in tasks {
        let (o, i, s) = task.await??;
        ops += o;
        items += i;
        samples.extend(s);
    }
    Ok(Measured {
        ops,
        items,
        samples,
        cpu: reading.await.ok().flatten(),
    })
}

pub type OpFuture = std::pin::Pin<Box<dyn Future<Output = anyhow::Result<u64>> + Send>>;

fn figures(workload: Workload, args: &BenchArgs, measured: Measured) -> Figures {
    let Measured {
        ops,
        items,
        mut samples,
        cpu,
    } = measured;
    let seconds = args.duration.as_secs_f64();
    Figures {
        workload: workload.name().to_owned(),
        ops,
        ops_per_sec: ops as f64 / seconds,
        latency_ms: Latency::of(&mut samples),
        items_per_sec: (items != ops).then(|| items as f64 / seconds),
        cpu_per_op: cpu.and_then(|(before, after)| after.per_op_since(&before, ops)),
        server_peak_rss_mib: None,
        raw_ops_per_sec: None,
        raw_latency_avg_ms: None,
        ratio: None,
        note: None,
    }
}

/// Makes sure the 10k keys exist (written over gRPC, in parallel).
async fn ensure_keys(target: &Target, args: &BenchArgs) -> anyhow::Result<()> {
    let mut memory = MemoryServiceClient::new(channel(target).await?);
    let (scope_type, scope, last) = ns(SCOPE, key(KEYS - 1));
    let exists = memory
        .get(proto::GetRequest {
            scope_type,
            scope: scope.clone(),
            key: last,
            version: 0,
            as_of: None,
        })
        .await
        .is_ok();
    if exists {
        return Ok(());
    }
    eprintln!("engram bench: writing {KEYS} keys …");
    let writers = args.clients.max(1) as u64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let mut memory = MemoryServiceClient::new(channel(target).await?);
        let scope = scope.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = w;
            while n < KEYS {
                memory
                    .set(proto::SetRequest {
                        scope_type,
                        scope: scope.clone(),
                        key: key(n),
                        value: Some(json_to_proto(&set_value(n))),
                        ..proto::SetRequest::default()
                    })
                    .await?;
                n += writers;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn ensure_history(target: &Target, versions: i64) -> anyhow::Result<()> {
    let mut memory = MemoryServiceClient::new(channel(target).await?);
    let (scope_type, scope, key) = ns(HISTORY_SCOPE, "history".to_owned());
    let current = memory
        .get(proto::GetRequest {
            scope_type,
            scope: scope.clone(),
            key: key.clone(),
            version: 0,
            as_of: None,
        })
        .await
        .map_or(0, |r| r.into_inner().entry.map_or(0, |e| e.version));
    if current < versions {
        eprintln!(
            "engram bench: writing {} versions of one key …",
            versions - current
        );
    }
    for n in current..versions {
        memory
            .set(proto::SetRequest {
                scope_type,
                scope: scope.clone(),
                key: key.clone(),
                value: Some(json_to_proto(&set_value(n as u64))),
                ..proto::SetRequest::default()
            })
            .await?;
    }
    Ok(())
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

pub async fn run(
    workload: Workload,
    args: &BenchArgs,
    target: &Target,
    started: Option<&Spawned>,
) -> anyhow::Result<Figures> {
    match workload {
        Workload::Set | Workload::Get | Workload::GetVersion | Workload::List => {
            ensure_keys(target, args).await?;
            let measured = measure(args, |client| async move {
                let memory = MemoryServiceClient::new(channel(target).await?);
                let mut rng = Rng::new(client as u64 + 1);
                let op = move || -> OpFuture {
                    let mut memory = memory.clone();
                    let n = rng.below(KEYS);
                    Box::pin(async move {
                        let (scope_type, scope, key) = ns(SCOPE, key(n));
                        match workload {
                            Workload::Set => {
                                memory
                                    .set(proto::SetRequest {
                                        scope_type,
                                        scope,
                                        key,
                                        value: Some(json_to_proto(&set_value(n))),
                                        ..proto::SetRequest::default()
                                    })
                                    .await?;
                            }
                            Workload::List => {
                                memory
                                    .list(proto::ListRequest {
                                        scope_type,
                                        scope,
                                        // One of ten prefixes of a
                                        // thousand keys each (k00…k09).
                                        key_prefix: format!("k0{}", n % 10),
                                        page_size: 50,
                                        ..proto::ListRequest::default()
                                    })
                                    .await?;
                            }
                            _ => {
                                memory
                                    .get(proto::GetRequest {
                                        scope_type,
                                        scope,
                                        key,
                                        version: i64::from(workload == Workload::GetVersion),
                                        as_of: None,
                                    })
                                    .await?;
                            }
                        }
                        Ok(1)
                    })
                };
                Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
            })
            .await?;
            Ok(figures(workload, args, measured))
        }
        Workload::History => {
            ensure_history(target, args.history_versions).await?;
            let measured = measure(args, |_| async move {
                let memory = MemoryServiceClient::new(channel(target).await?);
                let op = move || -> OpFuture {
                    let mut memory = memory.clone();
                    Box::pin(async move {
                        let (scope_type, scope, key) = ns(HISTORY_SCOPE, "history".to_owned());
                        let mut stream = memory
                            .history(proto::HistoryRequest {
                                scope_type,
                                scope,
                                key,
                                from_version: 0,
                            })
                            .await?
                            .into_inner();
                        let mut n = 0;
                        while stream.message().await?.is_some() {
                            n += 1;
                        }
                        Ok(n)
                    })
                };
                Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
            })
            .await?;
            let mut result = figures(workload, args, measured);
            result.note = Some(format!(
                "one op streams all {} versions of the key",
                args.history_versions
            ));
            Ok(result)
        }
        Workload::Append => {
            let measured = measure(args, |client| async move {
                let episodes = EpisodeServiceClient::new(channel(target).await?);
                // Built once: each op sends the same episode.
                let request = append_request(
                    &session_id(APPEND_APP, &args.run, client),
                    client,
                    &text(&mut Rng::new(client as u64 + 11), 1024),
                );
                let op = move || -> OpFuture {
                    let mut episodes = episodes.clone();
                    let request = request.clone();
                    Box::pin(async move {
                        episodes.append_episode(request).await?;
                        Ok(1)
                    })
                };
                Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
            })
            .await?;
            Ok(figures(workload, args, measured))
        }
        Workload::Search => {
            let loaded = loaded(args, target, "search").await?;
            let measured = measure(args, |client| async move {
                let search = SearchServiceClient::new(channel(target).await?);
                let mut rng = Rng::new(client as u64 + 13);
                let op = move || -> OpFuture {
                    let mut search = search.clone();
                    let user = format!("bench-u{}", rng.below(RECENT_USERS));
                    let query = format!("{} {} {}", word(&mut rng), word(&mut rng), word(&mut rng));
                    Box::pin(async move {
                        let hits = search
                            .search(proto::SearchRequest {
                                query,
                                sources: vec![proto::SearchSource::Episodes as i32],
                                user,
                                limit: 10,
                                ..proto::SearchRequest::default()
                            })
                            .await?
                            .into_inner()
                            .hits
                            .len();
                        Ok(hits as u64)
                    })
                };
                Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
            })
            .await?;
            let mut result = figures(workload, args, measured);
            result.items_per_sec = None;
            result.note = Some(format!(
                "three words in one user's episodes, {}",
                loaded.described()
            ));
            Ok(result)
        }
        Workload::Recent => {
            let loaded = loaded(args, target, "recent").await?;
            let measured = measure(args, |client| async move {
                let episodes = EpisodeServiceClient::new(channel(target).await?);
                let mut rng = Rng::new(client as u64 + 7);
                let op = move || -> OpFuture {
                    let mut episodes = episodes.clone();
                    let user = format!("bench-u{}", rng.below(RECENT_USERS));
                    Box::pin(async move {
                        let found = episodes
                            .recent(proto::RecentRequest {
                                user,
                                limit: 20,
                                ..proto::RecentRequest::default()
                            })
                            .await?
                            .into_inner()
                            .episodes
                            .len();
                        anyhow::ensure!(found == 20, "recent found {found} episodes, not 20");
                        Ok(1)
                    })
                };
                Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
            })
            .await?;
            let mut result = figures(workload, args, measured);
            result.note = Some(loaded.described());
            Ok(result)
        }
        Workload::Ping => {
            let measured = measure(args, |_| async move {
                let health =
                    tonic_health::pb::health_client::HealthClient::new(channel(target).await?);
                let op = move || -> OpFuture {
                    let mut health = health.clone();
                    Box::pin(async move {
                        health
                            .check(tonic_health::pb::HealthCheckRequest::default())
                            .await?;
                        Ok(1)
                    })
                };
                Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
            })
            .await?;
            let mut result = figures(workload, args, measured);
            result.note = Some("the transport's ceiling: a health check per op".to_owned());
            Ok(result)
        }
        Workload::Tail => tail(args, target, started).await,
    }
}

/// The loaded episodes `recent` and `search` read, loaded into the
/// database unless they are there, and seen by the server driven: a given
/// server on another database than --database-url would measure reads of
/// nothing.
async fn loaded(
    args: &BenchArgs,
    target: &Target,
    workload: &str,
) -> anyhow::Result<super::baseline::Recent> {
    let loaded = super::baseline::ensure_recent(args.database(), args.recent_episodes)
        .await
        .with_context(|| format!("cannot load the episodes for {workload}"))?;
    let sessions =
        crate::proto::session_service_client::SessionServiceClient::new(channel(target).await?)
            .list_sessions(proto::ListSessionsRequest {
                app: RECENT_APP.to_owned(),
                page_size: 1,
                ..proto::ListSessionsRequest::default()
            })
            .await
            .context("cannot list the loaded sessions through the server")?
            .into_inner()
            .sessions;
    if sessions.is_empty() {
        anyhow::bail!(
            "the server at {} does not see the episodes loaded into {} for {workload} \
             (in the default tenant): give --database-url as the server's database",
            target.address,
            crate::config::DatabaseUrl::new(args.database().to_owned()),
        );
    }
    Ok(loaded)
}

fn append_request(session: &str, client: usize, content: &str) -> proto::AppendEpisodeRequest {
    proto::AppendEpisodeRequest {
        session_id: session.to_owned(),
        app: APPEND_APP.to_owned(),
        user: format!("bench-append-u{client}"),
        episode: Some(proto::NewEpisode {
            r#type: "observation".to_owned(),
            content: Some(json_to_proto(&serde_json::Value::String(
                content.to_owned(),
            ))),
            ..proto::NewEpisode::default()
        }),
        require_session: false,
    }
}

/// Appenders write `{"t": micros}`; a tail on another connection (or
/// server) records now - t for each episode it receives.
async fn tail(
    args: &BenchArgs,
    target: &Target,
    started: Option<&Spawned>,
) -> anyhow::Result<Figures> {
    let second = match started {
        Some(_) if args.database().starts_with("postgres") => {
            Some(Spawned::start(args.database()).await?)
        }
        _ => None,
    };
    let tail_target = second.as_ref().map_or(target.clone(), |s| Target {
        address: format!("http://{}", s.grpc_addr),
        bearer: target.bearer.clone(),
    });
    let mut tailer = EpisodeServiceClient::new(channel(&tail_target).await?);
    // The run's own user, so that another run appending to the app at the
    // same time adds nothing to this one's samples.
    let user = tail_user(&args.run);
    let mut stream = tailer
        .tail_episodes(proto::TailEpisodesRequest {
            app: TAIL_APP.to_owned(),
            user: user.clone(),
            ..proto::TailEpisodesRequest::default()
        })
        .await?
        .into_inner();
    let measure_from = Instant::now() + Duration::from_millis(50) + args.warmup;
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let collected = samples.clone();
    let receiver = tokio::spawn(async move {
        while let Ok(Some(response)) = stream.message().await {
            let sent = response
                .episode
                .and_then(|e| e.content)
                .and_then(|c| match c.kind {
                    Some(prost_types::value::Kind::NumberValue(t)) => Some(t as i64),
                    _ => None,
                });
            if let Some(sent) = sent
                && Instant::now() >= measure_from
                && let Ok(mut samples) = collected.lock()
            {
                samples.push((now_micros() - sent).max(0) as u64);
            }
        }
    });
    // Each client appends on its own schedule, spread evenly over the
    // period, so the total is --tail-rate.
    let period = (args.tail_rate > 0)
        .then(|| Duration::from_secs_f64(args.clients as f64 / args.tail_rate as f64));
    let user = &user;
    let appended = measure(args, |client| async move {
        let episodes = EpisodeServiceClient::new(channel(target).await?);
        let mut next = tokio::time::Instant::now()
            + period.map_or(Duration::ZERO, |p| {
                p.mul_f64(client as f64 / args.clients.max(1) as f64)
            });
        let session = session_id(TAIL_APP, &args.run, client);
        let user = user.clone();
        let op = move || -> OpFuture {
            let mut episodes = episodes.clone();
            let session = session.clone();
            let user = user.clone();
            let at = next;
            if let Some(period) = period {
                next += period;
            }
            Box::pin(async move {
                tokio::time::sleep_until(at).await;
                episodes
                    .append_episode(proto::AppendEpisodeRequest {
                        session_id: session,
                        app: TAIL_APP.to_owned(),
                        user,
                        episode: Some(proto::NewEpisode {
                            content: Some(json_to_proto(&serde_json::Value::from(now_micros()))),
                            ..proto::NewEpisode::default()
                        }),
                        require_session: false,
                    })
                    .await?;
                Ok(1)
            })
        };
        Ok(Box::new(op) as Box<dyn FnMut() -> OpFuture + Send>)
    })
    .await?;
    // Let the last deliveries arrive, then end the tail.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(tailer);
    if let Some(second) = second {
        second.stop().await;
    }
    receiver.abort();
    // The latencies are the deliveries', not the appends'.
    let delivered = Measured {
        items: appended.ops,
        samples: samples.lock().map(|s| s.clone()).unwrap_or_default(),
        ..appended
    };
    let mut result = figures(Workload::Tail, args, delivered);
    let across = if started.is_some() && args.database().starts_with("postgres") {
        "a second server process"
    } else {
        "a second connection"
    };
    let pace = match args.tail_rate {
        0 => "appends as fast as the clients can".to_owned(),
        rate => format!("appends paced at {rate}/s"),
    };
    result.note = Some(format!("latency is append-to-delivery on {across}, {pace}"));
    Ok(result)
}
