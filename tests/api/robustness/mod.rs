//! The robustness harness: clients run random operations over a small key
//! space against real `engram serve` processes while faults are injected;
//! every call is recorded with its start, end and outcome, and the checker
//! validates the whole history against what the server holds once the
//! faults are over (see `check/` for the guarantees it checks).
//!
//! Faults, each scenario on its own and mixed: `kill -9` of a server and a
//! restart on the same port (both stores); the connection between server
//! and Postgres cut, or stalled, by a TCP proxy in this process; Postgres
//! rolling writing transactions back at random, as it does to break a
//! deadlock; two replicas on one Postgres with one killed; clients
//! cancelling calls after a few milliseconds; a watch consumer that reads
//! slowly.
//!
//! The short profile (the test command) runs each scenario for a few
//! seconds; `ENGRAM_ROBUSTNESS=long` runs each for a minute with more
//! clients. Run with `--nocapture` to see the report.

mod check;
mod history;
mod postgres;
mod stalled;
mod workload;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{CreateRuleRequest, GetRuleRequest, RunRuleRequest, ScopeType, SetRequest};
use tokio::sync::Mutex;

use self::check::{Final, check};
use self::history::{Outcome, Recorder};
use self::workload::{Client, KEYS, RULE, Rng, SCOPE, SENTINEL, channel};
use crate::consolidation::rule;
use crate::helpers::{
    Backend, ChildServer, Proxy, TestDb, execute_on_postgres, pg_socket_addr, pg_url_via,
};

/// How long and how hard a scenario runs.
struct Profile {
    seconds: u64,
    clients: usize,
}

fn profile() -> Profile {
    match std::env::var("ENGRAM_ROBUSTNESS").as_deref() {
        Ok("long") => Profile {
            seconds: 60,
            clients: 8,
        },
        _ => Profile {
            seconds: 6,
            clients: 5,
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `kill -9` of a server, then a restart on the same port.
    Kill,
    /// The server's connections to Postgres cut, restored after a moment.
    Cut,
    /// The server's connections to Postgres stalled (no bytes move), then
    /// resumed.
    Stall,
    /// Postgres itself crashed and restarted (`pg_ctl restart -m
    /// immediate`), on a cluster of the scenario's own.
    Restart,
    /// Postgres rolling writing transactions back at random for a moment
    /// ([`ROLLBACKS`]).
    Rollback,
}

/// Makes Postgres roll back a share of the transactions that write memory,
/// episodes, facts or tasks, as it does to break a deadlock (`40P01`) or after a
/// serialization failure (`40001`): a trigger on the tables those writes
/// insert into raises one of the two for a row with the probability
/// `injected_rollbacks.share` holds (0 while the fault is off). A group of
/// writes sharing a transaction is failed whole, and the server runs its
/// writes again one by one, where each may be failed again.
const ROLLBACKS: &str = "\
    CREATE TABLE injected_rollbacks (share float8 NOT NULL); \
    INSERT INTO injected_rollbacks VALUES (0); \
    GRANT SELECT ON injected_rollbacks TO PUBLIC; \
    CREATE FUNCTION injected_rollback() RETURNS trigger LANGUAGE plpgsql AS $$ \
    BEGIN \
      IF random() < (SELECT share FROM injected_rollbacks) THEN \
        RAISE EXCEPTION 'injected' \
          USING ERRCODE = CASE WHEN random() < 0.5 THEN '40P01' ELSE '40001' END; \
      END IF; \
      RETURN NEW; \
    END $$; \
    CREATE TRIGGER injected_rollback BEFORE INSERT ON memory_versions \
      FOR EACH ROW EXECUTE FUNCTION injected_rollback(); \
    CREATE TRIGGER injected_rollback BEFORE INSERT ON episodes \
      FOR EACH ROW EXECUTE FUNCTION injected_rollback(); \
    CREATE TRIGGER injected_rollback BEFORE INSERT ON fact_versions \
      FOR EACH ROW EXECUTE FUNCTION injected_rollback(); \
    CREATE TRIGGER injected_rollback BEFORE INSERT ON working_tasks \
      FOR EACH ROW EXECUTE FUNCTION injected_rollback();";

/// Runs `sql` on the database at `url`, straight (not through a proxy).
async fn execute(url: &str, sql: &'static str) {
    execute_on_postgres(url, sqlx::AssertSqlSafe(sql.to_owned())).await;
}

struct Scenario {
    backend: Backend,
    faults: &'static [Fault],
    replicas: usize,
    /// Percent of client calls cancelled after a few milliseconds.
    cancel_percent: u64,
}

/// A free port on the loopback interface, for a server that must come back
/// on the same address after a restart (or a Postgres the test starts).
///
/// The port is taken from below the kernel's ephemeral range: a port the
/// kernel handed out for `bind(0)` would be free again between this check
/// and the server's bind, and after a `kill -9`, so another test's
/// listener or outgoing connection could take it in between. Ports below
/// the range are only ever taken by name; within this process a counter
/// hands each out once, and the process id spreads concurrent test
/// binaries apart.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000, ephemeral_low.max(10_001));
    let span = high - low;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = low + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).expect("a port number");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range {ephemeral_low}");
}

/// The servers of a scenario, each restartable on its own port.
struct Servers {
    url: String,
    addrs: Vec<SocketAddr>,
    running: Mutex<Vec<Option<ChildServer>>>,
}

impl Servers {
    async fn spawn(addr: SocketAddr, url: &str) -> ChildServer {
        ChildServer::spawn(
            &["--grpc-addr", &addr.to_string()],
            &[
                ("ENGRAM_DATABASE_URL", url),
                ("ENGRAM_SHUTDOWN_GRACE_SECS", "1"),
            ],
            None,
        )
        .await
    }

    async fn start(url: String, replicas: usize) -> Servers {
        let addrs: Vec<SocketAddr> = (0..replicas)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let mut running = Vec::new();
        for addr in &addrs {
            running.push(Some(Self::spawn(*addr, &url).await));
        }
        Servers {
            url,
            addrs,
            running: Mutex::new(running),
        }
    }

    /// Kills server `n` outright and starts it again on its port.
    async fn kill_and_restart(&self, n: usize) {
        let mut running = self.running.lock().await;
        if let Some(server) = running[n].take() {
            server.kill().await;
        }
        running[n] = Some(Self::spawn(self.addrs[n], &self.url).await);
    }
}

/// Retries a call until it succeeds (the server may be restarting).
async fn retry<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = None;
    for _ in 0..300 {
        match call().await {
            Ok(value) => return value,
            Err(status) => {
                last = Some(status);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("{what} kept failing for 30 s after the faults ended; the last error: {last:?}");
}

async fn run(name: &str, scenario: Scenario) {
    let profile = profile();
    let own = if scenario.faults.contains(&Fault::Restart) {
        Some(postgres::OwnPostgres::start().await)
    } else {
        None
    };
    let db = TestDb::new(scenario.backend).await;
    let db_url = match &own {
        Some(own) => own.url.clone(),
        None => db.url.clone(),
    };
    let needs_proxy = scenario
        .faults
        .iter()
        .any(|f| matches!(f, Fault::Cut | Fault::Stall));
    let proxy = if needs_proxy {
        Some(Proxy::start(pg_socket_addr(&db_url)).await)
    } else {
        None
    };
    let url = match &proxy {
        Some(proxy) => pg_url_via(&db_url, proxy.addr),
        None => db_url.clone(),
    };
    let servers = Arc::new(Servers::start(url, scenario.replicas).await);
    if scenario.faults.contains(&Fault::Rollback) {
        // After the servers' migrations made the tables.
        execute(&db_url, ROLLBACKS).await;
    }
    let first = channel(servers.addrs[0]);
    let mut promote = rule(RULE, "metadata.learn:*", true);
    promote.then_emits = vec!["robust".into()];
    ConsolidationServiceClient::new(first.clone())
        .create_rule(CreateRuleRequest {
            rule: Some(promote),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("create the rule");

    let recorder = Arc::new(Recorder::new());
    let deadline = recorder.now() + profile.seconds * 1_000_000_000;

    // Consumers on every replica, one of them slow.
    let revisions = Arc::new(AtomicI64::new(0));
    let mut watchers = Vec::new();
    let mut tailers = Vec::new();
    for (n, addr) in servers.addrs.iter().enumerate() {
        watchers.push(tokio::spawn(workload::watch_publishing(
            *addr,
            None,
            revisions.clone(),
        )));
        tailers.push(tokio::spawn(workload::tail(*addr)));
        if n == 0 {
            watchers.push(tokio::spawn(workload::watch(
                *addr,
                Some(Duration::from_millis(1)),
            )));
        }
    }
    let clients: Vec<_> = (0..profile.clients)
        .map(|id| {
            let client = Client {
                id,
                channel: channel(servers.addrs[id % servers.addrs.len()]),
                recorder: recorder.clone(),
                cancel_percent: scenario.cancel_percent,
                revisions: revisions.clone(),
            };
            tokio::spawn(client.run(deadline))
        })
        .collect();

    // The faults, until the clients' deadline.
    let mut injected: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut rng = Rng::new(deadline);
    while !scenario.faults.is_empty() && recorder.now() < deadline {
        tokio::time::sleep(Duration::from_millis(400 + rng.below(600))).await;
        if recorder.now() >= deadline {
            break;
        }
        let fault = scenario.faults[rng.below(scenario.faults.len() as u64) as usize];
        match fault {
            Fault::Kill => {
                let n = rng.below(servers.addrs.len() as u64) as usize;
                servers.kill_and_restart(n).await;
                *injected.entry("kill -9 and restart").or_default() += 1;
            }
            Fault::Restart => {
                own.as_ref()
                    .expect("an own cluster")
                    .restart_immediately()
                    .await;
                *injected
                    .entry("postgres restarted (immediate)")
                    .or_default() += 1;
            }
            Fault::Rollback => {
                execute(&db_url, "UPDATE injected_rollbacks SET share = 0.3").await;
                tokio::time::sleep(Duration::from_millis(300 + rng.below(500))).await;
                execute(&db_url, "UPDATE injected_rollbacks SET share = 0").await;
                *injected
                    .entry("transactions rolled back at random")
                    .or_default() += 1;
            }
            Fault::Cut | Fault::Stall => {
                let proxy = proxy.as_ref().expect("a proxy");
                let pause = Duration::from_millis(200 + rng.below(400));
                if fault == Fault::Cut {
                    proxy.cut();
                    tokio::time::sleep(pause).await;
                    proxy.restore().await;
                    *injected.entry("database connection cut").or_default() += 1;
                } else {
                    proxy.stall();
                    tokio::time::sleep(pause).await;
                    proxy.resume();
                    *injected.entry("database connection stalled").or_default() += 1;
                }
            }
        }
    }
    println!("{name}: clients finishing");
    let mut calls = 0;
    for client in clients {
        calls += client.await.expect("client");
    }

    println!("{name}: writing the sentinels");
    // Quiet now: the sentinels tell the consumers they have caught up.
    let memory = MemoryServiceClient::new(first.clone());
    retry("the sentinel write", || {
        let mut memory = memory.clone();
        async move {
            memory
                .set(SetRequest {
                    scope_type: ScopeType::Namespace as i32,
                    scope: SCOPE.into(),
                    key: SENTINEL.into(),
                    value: Some(engram::api::convert::json_to_proto(&serde_json::json!(0))),
                    ..SetRequest::default()
                })
                .await
        }
    })
    .await;
    retry("the sentinel append", || {
        workload::append(&first, "s0", SENTINEL, 0)
    })
    .await;
    println!("{name}: waiting for the consumers");
    let caught_up = Duration::from_secs(120);
    let mut watched = Vec::new();
    let mut reconnects = 0;
    for watcher in watchers {
        let (seen, again) = tokio::time::timeout(caught_up, watcher)
            .await
            .expect("a watch consumer catches up")
            .expect("watcher");
        watched.push(seen);
        reconnects += again;
    }
    let mut tailed = Vec::new();
    for tailer in tailers {
        let (seen, again) = tokio::time::timeout(caught_up, tailer)
            .await
            .expect("a tail consumer catches up")
            .expect("tailer");
        tailed.push(seen);
        reconnects += again;
    }
    println!("{name}: the rule catches up");
    let rules = ConsolidationServiceClient::new(first.clone());
    loop {
        let run = retry("the rule's catch-up run", || {
            let mut rules = rules.clone();
            async move {
                rules
                    .run_rule(RunRuleRequest {
                        rule_id: RULE.into(),
                        dry_run: false,
                        max_episodes: 1000,
                    })
                    .await
            }
        })
        .await
        .into_inner();
        if !run.more && run.episodes_scanned == 0 {
            break;
        }
    }
    let promoted = retry("reading the rule", || {
        let mut rules = rules.clone();
        async move {
            rules
                .get_rule(GetRuleRequest {
                    rule_id: RULE.into(),
                })
                .await
        }
    })
    .await
    .into_inner()
    .rule
    .map_or(0, |r| r.episodes_promoted);
    println!("{name}: reading the final state");
    let mut histories = BTreeMap::new();
    for key in KEYS {
        let versions = retry("reading a history", || workload::history(&first, key)).await;
        if !versions.is_empty() {
            histories.insert(key.to_owned(), versions);
        }
    }
    let mut searched = BTreeMap::new();
    for key in KEYS {
        let hit = retry("searching a key", || workload::search(&first, key)).await;
        searched.insert(key.to_owned(), hit);
    }
    let mut imports = BTreeMap::new();
    for op in recorder.ops() {
        if let history::Call::Import { id } = op.call {
            let held = retry("reading an import", || workload::imported(&first, &id)).await;
            imports.insert(id, held);
        }
    }
    let mut tasks = BTreeMap::new();
    for session in workload::SESSIONS {
        let held = retry("listing tasks", || workload::tasks(&first, session)).await;
        tasks.insert(session.to_owned(), held);
    }
    let (feed, _) = workload::watch(servers.addrs[0], None).await;
    let (episodes, _) = workload::tail(servers.addrs[0]).await;
    let end = Final {
        histories,
        feed,
        episodes,
        watched,
        tailed,
        promoted,
        searched,
        imports,
        tasks,
    };

    let ops = recorder.ops();
    let anomalies = check(&ops, &end);
    report(name, &ops, calls, &injected, reconnects, &end, &anomalies);
    let mut running = servers.running.lock().await;
    for server in running.iter_mut().filter_map(Option::take) {
        server.kill().await;
    }
    assert!(
        anomalies.is_empty(),
        "{name}: {} anomalies (see above)",
        anomalies.len()
    );
}

/// Prints what ran, what was injected and what the checker found.
fn report(
    name: &str,
    ops: &[history::Op],
    calls: usize,
    injected: &BTreeMap<&'static str, usize>,
    reconnects: usize,
    end: &Final,
    anomalies: &[check::Anomaly],
) {
    let mut by_call: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for op in ops {
        let slot = match op.outcome {
            Outcome::Refused { .. } => 1,
            Outcome::Unknown { .. } => 2,
            _ => 0,
        };
        by_call.entry(op.call.name()).or_default()[slot] += 1;
    }
    let retried = ops.len() - calls;
    println!(
        "robustness {name}: {} calls ({retried} of them retries of an idempotent write), \
         faults {injected:?}, consumer reconnects {reconnects}, final feed {} changes, \
         {} episodes, {} anomalies",
        ops.len(),
        end.feed.len(),
        end.episodes.len(),
        anomalies.len()
    );
    for (call, [ok, refused, unknown]) in by_call {
        println!("    {call:>14}: {ok} ok, {refused} refused, {unknown} unknown");
    }
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    for op in ops {
        let reason = match &op.outcome {
            Outcome::Refused { code, reason } => format!("refused {code:?} {reason}"),
            Outcome::Unknown { code, transport } => match transport {
                true => format!("unknown {code:?} (the connection broke)"),
                false => format!("unknown {code:?}"),
            },
            _ => continue,
        };
        *why.entry(reason).or_default() += 1;
    }
    println!("    outcomes: {why:?}");
    let whole = end
        .imports
        .values()
        .filter(|&&held| held == (workload::IMPORT_KEYS.len(), workload::IMPORT_VERSIONS))
        .count();
    println!(
        "    imports: {whole} landed whole, {} not at all",
        end.imports.len() - whole
    );
    for anomaly in anomalies {
        println!("{anomaly}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_server_killed() {
    let scenario = Scenario {
        backend: Backend::Sqlite,
        faults: &[Fault::Kill],
        replicas: 1,
        cancel_percent: 0,
    };
    run("sqlite, kill -9", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_clients_cancelling() {
    let scenario = Scenario {
        backend: Backend::Sqlite,
        faults: &[],
        replicas: 1,
        cancel_percent: 15,
    };
    run("sqlite, cancelled calls", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_server_killed() {
    let scenario = Scenario {
        backend: Backend::Postgres,
        faults: &[Fault::Kill],
        replicas: 1,
        cancel_percent: 0,
    };
    run("postgres, kill -9", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_cut_and_stalled() {
    let scenario = Scenario {
        backend: Backend::Postgres,
        faults: &[Fault::Cut, Fault::Stall],
        replicas: 1,
        cancel_percent: 0,
    };
    run("postgres, connection cut and stalled", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load() {
    let scenario = Scenario {
        backend: Backend::Postgres,
        faults: &[Fault::Restart],
        replicas: 1,
        cancel_percent: 0,
    };
    run("postgres, pg_ctl restart -m immediate", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transactions_rolled_back() {
    let scenario = Scenario {
        backend: Backend::Postgres,
        faults: &[Fault::Rollback],
        replicas: 1,
        cancel_percent: 0,
    };
    run("postgres, transactions rolled back", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_replicas_one_killed() {
    let scenario = Scenario {
        backend: Backend::Postgres,
        faults: &[Fault::Kill],
        replicas: 2,
        cancel_percent: 0,
    };
    run("postgres, two replicas, kill -9", scenario).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_everything_at_once() {
    let scenario = Scenario {
        backend: Backend::Postgres,
        faults: &[
            Fault::Kill,
            Fault::Cut,
            Fault::Stall,
            Fault::Restart,
            Fault::Rollback,
        ],
        replicas: 2,
        cancel_percent: 10,
    };
    run("postgres, mixed", scenario).await;
}
