//! Prometheus metrics: one process-wide registry, written to by the gRPC
//! edge (calls, latency, live streams), the stores (evictions) and the
//! scheduler, and rendered in the text exposition format on `/metrics`.
//! Calls are reported twice: under the names the gRPC ecosystem's
//! dashboards read (`grpc_server_started_total`, `grpc_server_handled_total`,
//! `grpc_server_handling_seconds`, labelled `grpc_service`, `grpc_method`,
//! `grpc_type`, `grpc_code`, as go-grpc-prometheus and tonic's middleware
//! crates name them) and as Engram's own `engram_rpc_*`.
//!
//! The process's own (CPU, memory, file descriptors) and the build's
//! version come from [`process`].
//!
//! A handful of counters does not need a metrics framework: label sets are
//! bounded (methods come from the protos, codes from gRPC), so a map under
//! a mutex held for a few nanoseconds per call is enough.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::ports::Feed;

mod process;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (bound, count) in BUCKETS.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    /// The buckets, sum and count of the histogram `name` with `labels`.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, count) in BUCKETS.iter().zip(self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {count}\n\
             {name}_sum{{{labels}}} {sum}\n\
             {name}_count{{{labels}}} {count}",
            count = self.count,
            sum = self.sum,
        );
    }
}

/// What kind of calls a group holds (see `store::group`).
#[derive(Debug, Clone, Copy)]
pub enum Grouped {
    Write = 0,
    Append = 1,
    Get = 2,
    Recent = 3,
}

impl Grouped {
    const ALL: [Grouped; 4] = [
        Grouped::Write,
        Grouped::Append,
        Grouped::Get,
        Grouped::Recent,
    ];

    fn label(self) -> &'static str {
        match self {
            Grouped::Write => "write",
            Grouped::Append => "append",
            Grouped::Get => "get",
            Grouped::Recent => "recent",
        }
    }
}

/// What one scheduler look at a rule came to.
#[derive(Debug, Clone, Copy)]
pub enum RunOutcome {
    /// The rule ran (and maybe promoted nothing).
    Ran,
    /// Another replica held the rule.
    Busy,
    Failed,
}

impl RunOutcome {
    fn label(self) -> &'static str {
        match self {
            RunOutcome::Ran => "ran",
            RunOutcome::Busy => "busy",
            RunOutcome::Failed => "failed",
        }
    }
}

/// What a limit evicted.
#[derive(Debug, Clone, Copy)]
pub enum Evicted {
    Sessions,
    Episodes,
}

/// The connection pool of a store at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolStatus {
    pub open: u32,
    pub idle: u32,
    pub max: u32,
    /// Writes queued for the next group commit (see `store::group`).
    pub queued_writes: u32,
}

/// The server streams among the methods served; every other one is unary
/// (the reflection service's one bidirectional stream aside).
/// The `grpc_type` of every method the server serves (Engram's, health,
/// reflection), read from their protos' descriptors, so a streaming RPC
/// added later is labelled by what it is.
static METHOD_TYPES: LazyLock<HashMap<String, &'static str>> = LazyLock::new(|| {
    use prost::Message;
    let sets = [
        crate::proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ];
    let mut types = HashMap::new();
    for set in sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(set) else {
            continue;
        };
        for file in set.file {
            for service in &file.service {
                for method in &service.method {
                    let kind = match (method.client_streaming(), method.server_streaming()) {
                        (false, false) => "unary",
                        (false, true) => "server_stream",
                        (true, false) => "client_stream",
                        (true, true) => "bidi_stream",
                    };
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    types.insert(path, kind);
                }
            }
        }
    }
    types
});

/// `grpc_type` of a method path; `unary` for one the server does not have.
fn grpc_type(method: &str) -> &'static str {
    method_type(method).unwrap_or("unary")
}

/// The type of the method at `method` (`/engram.v1.MemoryService/Watch`):
/// `unary`, `server_stream`, `client_stream` or `bidi_stream`, from the
/// protos' descriptors; `None` for a method no service has.
pub(crate) fn method_type(method: &str) -> Option<&'static str> {
    METHOD_TYPES.get(method).copied()
}

/// The `grpc_service`, `grpc_method` and `grpc_type` labels of a method
/// path (`/engram.v1.MemoryService/Set`).
fn grpc_labels(method: &str) -> String {
    let (service, name) = method
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("unknown", "unknown"));
    format!(
        "grpc_service=\"{service}\",grpc_method=\"{name}\",grpc_type=\"{}\"",
        grpc_type(method)
    )
}

/// A status code (as [`crate::api::edge::code_name`] spells it, and
/// `engram_rpc_total` shows it) as go-grpc-prometheus labels it: Go's
/// `codes.Code` names (`OK`, `NotFound`, `Unavailable`, `Canceled`), which
/// the dashboards and alert rules written for `grpc_server_handled_total`
/// match on.
fn go_code_name(code: &str) -> &str {
    match code {
        "CANCELLED" => "Canceled",
        "UNKNOWN" => "Unknown",
        "INVALID_ARGUMENT" => "InvalidArgument",
        "DEADLINE_EXCEEDED" => "DeadlineExceeded",
        "NOT_FOUND" => "NotFound",
        "ALREADY_EXISTS" => "AlreadyExists",
        "PERMISSION_DENIED" => "PermissionDenied",
        "RESOURCE_EXHAUSTED" => "ResourceExhausted",
        "FAILED_PRECONDITION" => "FailedPrecondition",
        "ABORTED" => "Aborted",
        "OUT_OF_RANGE" => "OutOfRange",
        "UNIMPLEMENTED" => "Unimplemented",
        "INTERNAL" => "Internal",
        "UNAVAILABLE" => "Unavailable",
        "DATA_LOSS" => "DataLoss",
        "UNAUTHENTICATED" => "Unauthenticated",
        other => other,
    }
}

/// One method's calls as the gRPC ecosystem counts them.
#[derive(Default)]
struct GrpcMethod {
    started: u64,
    handled: BTreeMap<&'static str, u64>,
    handling: Histogram,
}

pub struct Registry {
    /// Calls by method: started, handled by code, handling time.
    grpc: Mutex<BTreeMap<String, GrpcMethod>>,
    /// Calls by method, then by status code.
    calls: Mutex<BTreeMap<String, BTreeMap<&'static str, u64>>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    streams: Mutex<BTreeMap<String, i64>>,
    evicted_sessions: AtomicU64,
    evicted_episodes: AtomicU64,
    scheduler: Mutex<BTreeMap<&'static str, u64>>,
    embedded: AtomicU64,
    embedder_failures: AtomicU64,
    /// The outbox's entries as the embedding worker last counted them;
    /// negative while no worker has (no embedder configured).
    embedding_pending: AtomicI64,
    /// Groups run and calls in them, by [`Grouped`].
    groups: [AtomicU64; 4],
    grouped: [AtomicU64; 4],
    /// The waits of each feed's horizon for transactions to end, by
    /// [`Feed`]: an id and when the wait began ([`FeedWait`]).
    feed_waits: Mutex<[Vec<(u64, Instant)>; 2]>,
    next_feed_wait: AtomicU64,
}

/// A wait of a feed's horizon for transactions to end (see
/// `store::postgres::feeds`), in `engram_feed_wait_seconds` for as long as
/// it lives.
pub struct FeedWait<'a> {
    registry: &'a Registry,
    feed: Feed,
    id: u64,
}

impl Drop for FeedWait<'_> {
    fn drop(&mut self) {
        lock(&self.registry.feed_waits)[self.feed as usize].retain(|(id, _)| *id != self.id);
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            grpc: Mutex::default(),
            calls: Mutex::default(),
            latency: Mutex::default(),
            streams: Mutex::default(),
            evicted_sessions: AtomicU64::default(),
            evicted_episodes: AtomicU64::default(),
            scheduler: Mutex::default(),
            embedded: AtomicU64::default(),
            embedder_failures: AtomicU64::default(),
            embedding_pending: AtomicI64::new(-1),
            groups: Default::default(),
            grouped: Default::default(),
            feed_waits: Mutex::default(),
            next_feed_wait: AtomicU64::default(),
        }
    }
}

/// A poisoned lock only means a panic elsewhere mid-update of a counter;
/// the numbers are still worth serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Updates the value of `method` in a map keyed by method, made on first
/// use: the method is copied then, not on every call.
fn update<V: Default>(map: &mut BTreeMap<String, V>, method: &str, f: impl FnOnce(&mut V)) {
    match map.get_mut(method) {
        Some(value) => f(value),
        None => f(map.entry(method.to_owned()).or_default()),
    }
}

/// What the server being scraped reads at the scrape, beside the
/// process's counters.
#[derive(Debug, Clone, Copy)]
pub struct ServerGauges {
    /// The store's connection pool.
    pub pool: PoolStatus,
    /// Searches waiting for a turn (`search::turns`).
    pub waiting_searches: usize,
    /// Whether the last health check reached the database.
    pub database_reachable: bool,
}

static GLOBAL: LazyLock<Registry> = LazyLock::new(Registry::default);

/// The registry of this process.
pub fn global() -> &'static Registry {
    &GLOBAL
}

impl Registry {
    /// A call arrived (and the method is one the server has).
    pub fn call_started(&self, method: &str) {
        update(&mut lock(&self.grpc), method, |calls| calls.started += 1);
    }

    /// A finished call after `elapsed`. Engram's own latency histogram
    /// leaves streams out (their length says nothing about the server);
    /// `grpc_server_handling_seconds` has every call, as dashboards expect.
    pub fn call_finished(&self, method: &str, code: &'static str, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        update(&mut lock(&self.grpc), method, |calls| {
            *calls.handled.entry(code).or_insert(0) += 1;
            calls.handling.observe(seconds);
        });
        update(&mut lock(&self.calls), method, |codes| {
            *codes.entry(code).or_insert(0) += 1;
        });
        if grpc_type(method) == "unary" {
            update(&mut lock(&self.latency), method, |histogram| {
                histogram.observe(seconds);
            });
        }
    }

    /// Exports the open streams of each of `methods`, at 0 until one opens.
    pub fn expect_streams(&self, methods: &[&str]) {
        let mut streams = lock(&self.streams);
        for method in methods {
            update(&mut streams, method, |_| {});
        }
    }

    /// A server stream opened (`+1`) or closed (`-1`).
    pub fn stream_delta(&self, method: &str, delta: i64) {
        update(&mut lock(&self.streams), method, |open| *open += delta);
    }

    pub fn evicted(&self, what: Evicted, n: u64) {
        let counter = match what {
            Evicted::Sessions => &self.evicted_sessions,
            Evicted::Episodes => &self.evicted_episodes,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A group of `calls` calls run together (see `store::group`).
    pub fn group(&self, kind: Grouped, calls: usize) {
        self.groups[kind as usize].fetch_add(1, Ordering::Relaxed);
        self.grouped[kind as usize].fetch_add(calls as u64, Ordering::Relaxed);
    }

    /// A wait of `feed`'s horizon for transactions to end, begun at
    /// `since`, lasting until the returned guard is dropped.
    pub fn feed_waiting(&self, feed: Feed, since: Instant) -> FeedWait<'_> {
        let id = self.next_feed_wait.fetch_add(1, Ordering::Relaxed);
        lock(&self.feed_waits)[feed as usize].push((id, since));
        FeedWait {
            registry: self,
            feed,
            id,
        }
    }

    /// Items the embedding worker stored vectors for.
    pub fn embedded(&self, n: usize) {
        self.embedded.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The embedding outbox holds `n` entries (all tenants), as counted.
    pub fn embedding_pending(&self, n: i64) {
        self.embedding_pending.store(n.max(0), Ordering::Relaxed);
    }

    /// A batch the embedder failed (it waits for its next attempt).
    pub fn embedder_failed(&self) {
        self.embedder_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn scheduler_run(&self, outcome: RunOutcome) {
        *lock(&self.scheduler).entry(outcome.label()).or_insert(0) += 1;
    }

    /// The text exposition format (version 0.0.4): this process's counters
    /// and the serving server's gauges as they are now.
    pub fn render(&self, server: &ServerGauges) -> String {
        let pool = server.pool;
        let mut out = String::with_capacity(4096);
        self.render_grpc(&mut out);
        header(
            &mut out,
            "engram_rpc_total",
            "counter",
            "gRPC calls finished, by method and status code.",
        );
        for (method, codes) in lock(&self.calls).iter() {
            for (code, n) in codes {
                let _ = writeln!(
                    out,
                    "engram_rpc_total{{method=\"{method}\",code=\"{code}\"}} {n}"
                );
            }
        }
        header(
            &mut out,
            "engram_rpc_duration_seconds",
            "histogram",
            "Latency of unary gRPC calls, by method.",
        );
        for (method, histogram) in lock(&self.latency).iter() {
            let labels = format!("method=\"{method}\"");
            histogram.render(&mut out, "engram_rpc_duration_seconds", &labels);
        }
        header(
            &mut out,
            "engram_live_streams",
            "gauge",
            "Server streams open now (Watch, TailEpisodes), by method.",
        );
        for (method, n) in lock(&self.streams).iter() {
            let _ = writeln!(out, "engram_live_streams{{method=\"{method}\"}} {n}");
        }
        header(
            &mut out,
            "engram_database_reachable",
            "gauge",
            "1 while the health check reaches the database, 0 while it does not (readiness fails).",
        );
        let _ = writeln!(
            out,
            "engram_database_reachable {}",
            u8::from(server.database_reachable)
        );
        header(
            &mut out,
            "engram_db_pool_connections",
            "gauge",
            "Database connections of this replica, by state.",
        );
        let _ = writeln!(
            out,
            "engram_db_pool_connections{{state=\"idle\"}} {}\n\
             engram_db_pool_connections{{state=\"in_use\"}} {}",
            pool.idle,
            pool.open.saturating_sub(pool.idle)
        );
        header(
            &mut out,
            "engram_db_pool_max_connections",
            "gauge",
            "The most connections the pool opens.",
        );
        let _ = writeln!(out, "engram_db_pool_max_connections {}", pool.max);
        header(
            &mut out,
            "engram_group_queued_calls",
            "gauge",
            "Calls waiting for the group in flight to finish, to run together in the next.",
        );
        let _ = writeln!(out, "engram_group_queued_calls {}", pool.queued_writes);
        header(
            &mut out,
            "engram_search_waiting_calls",
            "gauge",
            "Searches waiting for their turn (--search-concurrency at once).",
        );
        let _ = writeln!(
            out,
            "engram_search_waiting_calls {}",
            server.waiting_searches
        );
        self.render_feed_waits(&mut out);
        header(
            &mut out,
            "engram_evictions_total",
            "counter",
            "Sessions and episodes evicted by the configured limits.",
        );
        let _ = writeln!(
            out,
            "engram_evictions_total{{kind=\"session\"}} {}\n\
             engram_evictions_total{{kind=\"episode\"}} {}",
            self.evicted_sessions.load(Ordering::Relaxed),
            self.evicted_episodes.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "engram_groups_total",
            "counter",
            "Groups of concurrent calls run as one transaction (write, append) or one \
             statement (get); engram_grouped_calls_total over this is the mean group.",
        );
        for kind in Grouped::ALL {
            let _ = writeln!(
                out,
                "engram_groups_total{{kind=\"{}\"}} {}",
                kind.label(),
                self.groups[kind as usize].load(Ordering::Relaxed)
            );
        }
        header(
            &mut out,
            "engram_grouped_calls_total",
            "counter",
            "Calls run in groups, by kind.",
        );
        for kind in Grouped::ALL {
            let _ = writeln!(
                out,
                "engram_grouped_calls_total{{kind=\"{}\"}} {}",
                kind.label(),
                self.grouped[kind as usize].load(Ordering::Relaxed)
            );
        }
        header(
            &mut out,
            "engram_scheduler_runs_total",
            "counter",
            "Scheduled consolidation runs, by outcome (ran, busy: another replica had it, failed).",
        );
        header(
            &mut out,
            "engram_embedded_items_total",
            "counter",
            "Items this replica's embedding worker stored vectors for.",
        );
        let _ = writeln!(
            out,
            "engram_embedded_items_total {}",
            self.embedded.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "engram_embedder_failures_total",
            "counter",
            "Batches the embedder failed after its retries (they wait and are tried again).",
        );
        let _ = writeln!(
            out,
            "engram_embedder_failures_total {}",
            self.embedder_failures.load(Ordering::Relaxed)
        );
        let pending = self.embedding_pending.load(Ordering::Relaxed);
        if pending >= 0 {
            header(
                &mut out,
                "engram_embedding_pending_items",
                "gauge",
                "Items written and not embedded yet (the outbox, every tenant), as this \
                 replica's embedding worker last counted them (every 2 s).",
            );
            let _ = writeln!(out, "engram_embedding_pending_items {pending}");
        }
        let scheduler = lock(&self.scheduler);
        for outcome in [RunOutcome::Ran, RunOutcome::Busy, RunOutcome::Failed] {
            let n = scheduler.get(outcome.label()).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "engram_scheduler_runs_total{{outcome=\"{}\"}} {n}",
                outcome.label()
            );
        }
        process::render(&mut out);
        out
    }
}

impl Registry {
    /// How long each feed's oldest wait has lasted so far.
    fn render_feed_waits(&self, out: &mut String) {
        header(
            out,
            "engram_feed_wait_seconds",
            "gauge",
            "How long this replica's oldest wait for a feed's horizon has lasted, by feed \
             (changes: Watch, episodes: TailEpisodes): what was written since is not delivered \
             yet; 0 when none waits. One that keeps growing is a transaction left open in \
             Engram's database, which the log names.",
        );
        let waits = lock(&self.feed_waits);
        let now = Instant::now();
        for feed in Feed::ALL {
            let oldest = waits[feed as usize]
                .iter()
                .map(|(_, since)| now.saturating_duration_since(*since))
                .max()
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "engram_feed_wait_seconds{{feed=\"{}\"}} {:.3}",
                feed.name(),
                oldest.as_secs_f64()
            );
        }
    }

    /// The calls under the gRPC ecosystem's names.
    fn render_grpc(&self, out: &mut String) {
        let grpc = lock(&self.grpc);
        let labelled: Vec<(String, &GrpcMethod)> = grpc
            .iter()
            .map(|(method, calls)| (grpc_labels(method), calls))
            .collect();
        header(
            out,
            "grpc_server_started_total",
            "counter",
            "gRPC calls the server started, by service, method and type.",
        );
        for (labels, calls) in &labelled {
            let _ = writeln!(
                out,
                "grpc_server_started_total{{{labels}}} {}",
                calls.started
            );
        }
        header(
            out,
            "grpc_server_handled_total",
            "counter",
            "gRPC calls the server finished, by service, method, type and status code.",
        );
        for (labels, calls) in &labelled {
            for (code, n) in &calls.handled {
                let code = go_code_name(code);
                let _ = writeln!(
                    out,
                    "grpc_server_handled_total{{{labels},grpc_code=\"{code}\"}} {n}"
                );
            }
        }
        header(
            out,
            "grpc_server_handling_seconds",
            "histogram",
            "Time from a gRPC call's arrival to its end, by service, method and type.",
        );
        for (labels, calls) in &labelled {
            calls
                .handling
                .render(out, "grpc_server_handling_seconds", labels);
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let registry = Registry::default();
        for _ in 0..3 {
            registry.call_started("/m/A");
        }
        registry.call_finished("/m/A", "OK", Duration::from_millis(3));
        registry.call_finished("/m/A", "OK", Duration::from_secs(20));
        registry.call_finished("/m/A", "NOT_FOUND", Duration::from_micros(100));
        registry.call_started("/engram.v1.MemoryService/Watch");
        registry.call_finished(
            "/engram.v1.MemoryService/Watch",
            "CANCELLED",
            Duration::from_secs(30),
        );
        registry.stream_delta("/m/S", 1);
        registry.expect_streams(&["/m/S", "/m/T"]);
        registry.evicted(Evicted::Episodes, 4);
        registry.scheduler_run(RunOutcome::Busy);
        registry.group(Grouped::Append, 5);
        let idle = ServerGauges {
            pool: PoolStatus::default(),
            waiting_searches: 0,
            database_reachable: true,
        };
        assert!(
            registry
                .render(&idle)
                .contains("\nengram_database_reachable 1\n")
        );
        assert!(
            !registry
                .render(&idle)
                .contains("engram_embedding_pending_items"),
            "no embedder, no outbox to count"
        );
        registry.embedding_pending(7);
        let long_ago = Instant::now() - Duration::from_secs(90);
        let _older = registry.feed_waiting(Feed::Episodes, long_ago);
        let newer = registry.feed_waiting(Feed::Episodes, Instant::now());
        drop(registry.feed_waiting(Feed::Changes, long_ago));
        drop(newer);
        let text = registry.render(&ServerGauges {
            pool: PoolStatus {
                open: 5,
                idle: 2,
                max: 10,
                queued_writes: 3,
            },
            waiting_searches: 2,
            database_reachable: false,
        });
        for line in [
            "engram_group_queued_calls 3",
            "engram_database_reachable 0",
            "engram_search_waiting_calls 2",
            "engram_embedding_pending_items 7",
            "engram_feed_wait_seconds{feed=\"changes\"} 0.000",
            "engram_groups_total{kind=\"append\"} 1",
            "engram_grouped_calls_total{kind=\"append\"} 5",
            "engram_rpc_total{method=\"/m/A\",code=\"OK\"} 2",
            "engram_rpc_total{method=\"/m/A\",code=\"NOT_FOUND\"} 1",
            "engram_rpc_duration_seconds_bucket{method=\"/m/A\",le=\"0.0005\"} 1",
            "engram_rpc_duration_seconds_bucket{method=\"/m/A\",le=\"0.005\"} 2",
            "engram_rpc_duration_seconds_bucket{method=\"/m/A\",le=\"10\"} 2",
            "engram_rpc_duration_seconds_bucket{method=\"/m/A\",le=\"+Inf\"} 3",
            "engram_rpc_duration_seconds_count{method=\"/m/A\"} 3",
            "engram_live_streams{method=\"/m/S\"} 1",
            "engram_live_streams{method=\"/m/T\"} 0",
            "engram_db_pool_connections{state=\"in_use\"} 3",
            "engram_db_pool_max_connections 10",
            "engram_evictions_total{kind=\"episode\"} 4",
            "engram_scheduler_runs_total{outcome=\"busy\"} 1",
            "grpc_server_started_total{grpc_service=\"m\",grpc_method=\"A\",grpc_type=\"unary\"} 3",
            "grpc_server_handled_total{grpc_service=\"m\",grpc_method=\"A\",grpc_type=\"unary\",grpc_code=\"OK\"} 2",
            "grpc_server_handling_seconds_bucket{grpc_service=\"m\",grpc_method=\"A\",grpc_type=\"unary\",le=\"0.005\"} 2",
            "grpc_server_handling_seconds_count{grpc_service=\"m\",grpc_method=\"A\",grpc_type=\"unary\"} 3",
            "grpc_server_handled_total{grpc_service=\"engram.v1.MemoryService\",grpc_method=\"Watch\",grpc_type=\"server_stream\",grpc_code=\"Canceled\"} 1",
            "grpc_server_handling_seconds_count{grpc_service=\"engram.v1.MemoryService\",grpc_method=\"Watch\",grpc_type=\"server_stream\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        // The oldest wait still on: its seconds as they are at the scrape.
        let episodes = text
            .lines()
            .find_map(|l| l.strip_prefix("engram_feed_wait_seconds{feed=\"episodes\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("the episodes' wait");
        assert!((90.0..100.0).contains(&episodes), "{episodes}");
        // Engram's own latency histogram has unary calls only.
        assert!(!text.contains(
            "engram_rpc_duration_seconds_count{method=\"/engram.v1.MemoryService/Watch\"}"
        ));
    }

    #[test]
    fn every_method_is_typed_from_its_descriptor() {
        for (method, kind) in [
            ("/engram.v1.MemoryService/Set", "unary"),
            ("/engram.v1.MemoryService/History", "server_stream"),
            ("/engram.v1.MemoryService/Watch", "server_stream"),
            ("/engram.v1.EpisodeService/TailEpisodes", "server_stream"),
            ("/engram.v1.DataService/Export", "server_stream"),
            ("/engram.v1.DataService/Import", "client_stream"),
            ("/grpc.health.v1.Health/Check", "unary"),
            ("/grpc.health.v1.Health/Watch", "server_stream"),
            (
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                "bidi_stream",
            ),
            (
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                "bidi_stream",
            ),
        ] {
            assert_eq!(grpc_type(method), kind, "{method}");
        }
    }
}
