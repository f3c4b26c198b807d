//! `engram bench`: drives a server over gRPC with N concurrent clients and
//! prints ops/s and latency percentiles per workload, beside a baseline of
//! the same SQL run straight against the same database (pgbench on
//! Postgres, the store called in-process on SQLite), so the ratio a reader
//! sees was measured in one run on one machine.
//!
//! Without `--server` it starts `engram serve` itself (this binary) on
//! `--database-url`, which also lets it report the server's memory: idle,
//! and the peak under each workload.

mod baseline;
mod cleanup;
mod cpu;
mod plain;
pub mod recall;
mod server;
mod workloads;

use std::time::Duration;

use serde::Serialize;

use crate::cli::{CliError, CliResult, Output, print_json};

pub use workloads::Workload;

/// Arguments of `engram bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A running server to drive (http://host:port); without it bench
    /// starts `engram serve` on --database-url and measures its memory too
    #[arg(long)]
    pub server: Option<String>,

    /// The bearer token for a --server that requires one
    #[arg(long, env = "ENGRAM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// The database the started server (and the baseline) use
    /// [default: sqlite://engram-bench.db]. With --server, the server's own
    /// database: `recent` and `search` load their episodes into it and
    /// --baseline runs its statements on it, so those need it given
    #[arg(long, env = "ENGRAM_DATABASE_URL")]
    pub database_url: Option<String>,

    /// Concurrent clients, each on its own connection
    #[arg(long, default_value_t = 16)]
    pub clients: usize,

    /// How long each workload is measured (e.g. 10s, 500ms)
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,

    /// How long each workload runs before measuring starts
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,

    /// Workloads to run, comma-separated, in this order [default:
    /// ping,set,get,get-version,list,history,recent,search,append,tail;
    /// with --server and no --database-url, all but recent and search].
    /// By default `recent` and `search` run before `append` and `tail`, so
    /// that they measure the loaded episodes alone
    #[arg(long, value_enum, value_delimiter = ',')]
    pub workloads: Option<Vec<Workload>>,

    /// Also run the raw-SQL baseline and print engram/raw ratios
    #[arg(long)]
    pub baseline: bool,

    /// Keep the sessions and episodes the run appended (append, tail and
    /// the baseline's); by default a run that appends deletes them when it
    /// ends (earlier runs' too, unless written to while it ran: another
    /// bench's), so that the next run measures the same store
    #[arg(long)]
    pub keep_appended: bool,

    /// Episodes loaded for `recent` (once per database)
    #[arg(long, default_value_t = 1_000_000)]
    pub recent_episodes: i64,

    /// Appends per second (all clients together) while `tail` measures
    /// delivery; 0 appends as fast as the clients can, which measures
    /// queueing under saturation more than delivery
    #[arg(long, default_value_t = 500)]
    pub tail_rate: u64,

    /// Versions of the key `history` streams
    #[arg(long, default_value_t = 10_000)]
    pub history_versions: i64,

    /// text for people, json for keeping figures over time
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// The started server's process, whose CPU each workload reports.
    #[arg(skip)]
    pub server_pid: Option<u32>,

    /// This run's token, in the ids of the sessions it appends to.
    #[arg(skip)]
    pub run: String,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |i| text.split_at(i));
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 10s or 500ms"))?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("unknown unit {unit:?}; use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|err| err.to_string())
}

/// Latency figures in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    /// From samples in microseconds (sorted here).
    pub fn of(samples: &mut [u64]) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[index.min(samples.len() - 1)] as f64 / 1000.0
        };
        Latency {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// The figures of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub workload: String,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub latency_ms: Latency,
    /// Items per second where an op moves many (history: versions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items_per_sec: Option<f64>,
    /// The server's peak RSS during the workload, when bench started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_peak_rss_mib: Option<f64>,
    /// CPU per op (the server's when bench started it), on Linux.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_per_op: Option<cpu::PerOp>,
    /// The same SQL straight on the database.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_ops_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_latency_avg_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    machine: String,
    database: String,
    clients: usize,
    duration_secs: f64,
    server_idle_rss_mib: Option<f64>,
    results: Vec<Figures>,
    /// The episodes the bench's workloads had appended (this run's and
    /// earlier runs') that the run deleted; `None` when it deleted none
    /// (`--keep-appended`, or no workload that appends ran).
    removed_episodes: Option<u64>,
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(String::new(), |kib| {
            format!(", {:.0} GiB", kib as f64 / 1048576.0)
        });
    format!(
        "{} {}, {cpus} cores{memory}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

fn print_text(report: &Report) {
    outln!(
        "engram bench: {} clients, {:.0}s per workload, {} on {} ({})",
        report.clients,
        report.duration_secs,
        report.database,
        report.machine,
        report.date
    );
    if let Some(idle) = report.server_idle_rss_mib {
        outln!("server idle RSS: {idle:.1} MiB");
    }
    outln!(
        "{:<12} {:>10} {:>8} {:>8} {:>8} {:>8} {:>12} {:>10} {:>9}",
        "workload",
        "ops/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "raw ops/s",
        "engram/raw",
        "peak MiB"
    );
    for r in &report.results {
        let opt = |v: Option<f64>, precision: usize| {
            v.map_or("-".to_owned(), |v| format!("{v:.precision$}"))
        };
        outln!(
            "{:<12} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>12} {:>10} {:>9}",
            r.workload,
            r.ops_per_sec,
            r.latency_ms.p50,
            r.latency_ms.p90,
            r.latency_ms.p99,
            r.latency_ms.max,
            opt(r.raw_ops_per_sec, 0),
            opt(r.ratio, 2),
            opt(r.server_peak_rss_mib, 1),
        );
        if let Some(items) = r.items_per_sec {
            outln!("{:<12} {items:>10.0} items/s", "");
        }
        if let Some(cpu) = &r.cpu_per_op {
            let server = cpu
                .server_us
                .map_or(String::new(), |us| format!(", server {us:.0}"));
            let postgres = if cpu.postgres_us >= 0.5 {
                format!(", postgres {:.0}", cpu.postgres_us)
            } else {
                String::new()
            };
            outln!(
                "{:<12} CPU µs per op: bench {:.0}{server}{postgres}; machine {:.0}% idle",
                "",
                cpu.bench_us,
                cpu.idle_pct
            );
        }
        if let Some(note) = &r.note {
            outln!("{:<12} {note}", "");
        }
    }
}

/// What bench runs when no --workloads are given.
const DEFAULT_WORKLOADS: [Workload; 10] = [
    Workload::Ping,
    Workload::Set,
    Workload::Get,
    Workload::GetVersion,
    Workload::List,
    Workload::History,
    Workload::Recent,
    Workload::Search,
    Workload::Append,
    Workload::Tail,
];

/// The database bench starts its server on when none is given.
const DEFAULT_DATABASE: &str = "sqlite://engram-bench.db";

impl BenchArgs {
    /// The database the started server and the baseline use, and where
    /// `recent` and `search` load their episodes.
    pub fn database(&self) -> &str {
        self.database_url.as_deref().unwrap_or(DEFAULT_DATABASE)
    }

    /// The workloads to run: those asked for, or the defaults. A given
    /// server reads a database of its own, and what bench writes straight
    /// to a database must go to that one, never to the default file beside
    /// the bench, where the server would not see it: with --server and no
    /// --database-url the defaults leave out `recent` and `search` (saying
    /// so), and asking for them, or for --baseline, is refused.
    fn workloads(&self) -> CliResult<Vec<Workload>> {
        let direct = |w: &Workload| matches!(w, Workload::Recent | Workload::Search);
        let blind = self.server.is_some() && self.database_url.is_none();
        if !blind {
            return Ok(self
                .workloads
                .clone()
                .unwrap_or_else(|| DEFAULT_WORKLOADS.to_vec()));
        }
        let asked = self.workloads.as_deref().unwrap_or_default();
        let refused: Vec<&str> = asked
            .iter()
            .filter(|w| direct(w))
            .map(|w| w.name())
            .chain(self.baseline.then_some("--baseline"))
            .collect();
        if !refused.is_empty() {
            return Err(CliError::usage(format!(
                "--server with {} needs --database-url: the server's own database, \
                 which they read and write directly",
                refused.join(", ")
            )));
        }
        if self.workloads.is_some() {
            return Ok(asked.to_vec());
        }
        eprintln!(
            "engram bench: leaving out recent and search, which load their episodes \
             straight into the server's database: give --database-url to run them"
        );
        Ok(DEFAULT_WORKLOADS
            .into_iter()
            .filter(|w| !direct(w))
            .collect())
    }

    pub async fn run(mut self) -> CliResult {
        if self.clients == 0 {
            return Err(CliError::usage("--clients must be at least 1"));
        }
        if self.duration.is_zero() {
            return Err(CliError::usage(
                "--duration must be more than 0: it is the time each workload is measured",
            ));
        }
        let workloads = self.workloads()?;
        let (started, address) =
            server::Spawned::or_given(self.server.as_deref(), self.database()).await?;
        self.server_pid = started.as_ref().and_then(server::Spawned::pid);
        let target = workloads::Target {
            address,
            bearer: crate::cli::Bearer::new(self.token.as_deref())?,
        };
        let idle = started.as_ref().map(|s| s.rss_mib("VmRSS"));
        self.run = run_token();
        // A run that appends deletes what it appended when it ends.
        let cleans = !self.keep_appended
            && workloads
                .iter()
                .any(|w| matches!(w, Workload::Append | Workload::Tail));
        let earlier = if cleans {
            cleanup::earlier(&target, self.baseline_database(started.is_some())).await
        } else {
            cleanup::Earlier::default()
        };
        let mut results = Vec::new();
        let mut failed = None;
        for workload in &workloads {
            eprintln!("engram bench: {} …", workload.name());
            if let Some(spawned) = &started {
                spawned.reset_peak();
            }
            let mut figures =
                match workloads::run(*workload, &self, &target, started.as_ref()).await {
                    Ok(figures) => figures,
                    Err(err) => {
                        failed = Some(CliError {
                            message: format!("{} failed: {err:#}", workload.name()),
                            code: crate::cli::exit::FAILURE,
                        });
                        break;
                    }
                };
            if let Some(spawned) = &started {
                figures.server_peak_rss_mib = Some(spawned.rss_mib("VmHWM"));
            }
            if self.baseline {
                match baseline::run(*workload, &self).await {
                    Ok(Some((ops, latency))) => {
                        figures.raw_ops_per_sec = Some(ops);
                        figures.raw_latency_avg_ms = latency;
                        figures.ratio = Some(figures.ops_per_sec / ops);
                    }
                    Ok(None) => {}
                    Err(err) => figures.note = Some(format!("baseline failed: {err:#}")),
                }
            }
            results.push(figures);
        }
        // Also after a failed workload: what it appended goes too.
        let removed = if cleans {
            self.remove_appended(&target, started.is_some(), &earlier)
                .await
                .map(Some)
        } else {
            Ok(None)
        };
        if let Some(spawned) = started {
            spawned.stop().await;
        }
        if let Some(failed) = failed {
            // The workload's error is the one to report.
            if let Err(err) = removed {
                eprintln!("engram bench: {}", err.message);
            }
            return Err(failed);
        }
        let removed = removed?;
        let report = Report {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            machine: machine(),
            database: match (&self.server, &self.database_url) {
                (Some(server), None) => format!("the server at {server}"),
                _ => crate::config::DatabaseUrl::new(self.database().to_owned()).to_string(),
            },
            clients: self.clients,
            duration_secs: self.duration.as_secs_f64(),
            server_idle_rss_mib: idle,
            results,
            removed_episodes: removed,
        };
        match self.output {
            Output::Json => print_json(&serde_json::to_value(&report).unwrap_or_default()),
            Output::Text => print_text(&report),
        }
        Ok(())
    }

    /// The database whose baseline sessions the cleanup deletes: only one
    /// surely the server's (the bench started the server on it, or the
    /// baseline runs on it).
    fn baseline_database(&self, started: bool) -> Option<&str> {
        (started || self.baseline).then_some(self.database())
    }

    /// Deletes what the run appended, and earlier runs' sessions idle
    /// since it began ([`cleanup`]).
    async fn remove_appended(
        &self,
        target: &workloads::Target,
        started: bool,
        earlier: &cleanup::Earlier,
    ) -> CliResult<u64> {
        eprintln!("engram bench: deleting the episodes the run appended …");
        let database = self.baseline_database(started);
        let removed = cleanup::remove_written(target, database, &self.run, earlier)
            .await
            .map_err(|err| CliError {
                message: format!(
                    "cannot delete the episodes the run appended (--keep-appended keeps them): {err:#}"
                ),
                code: crate::cli::exit::FAILURE,
            })?;
        eprintln!("engram bench: deleted {removed} appended episodes");
        Ok(removed)
    }
}

/// A token that tells a run's sessions from other runs' (see [`cleanup`]):
/// the clock's nanoseconds and the process id, eight hex digits.
fn run_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:08x}",
        (nanos ^ (u64::from(std::process::id()) << 20)) & 0xffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_durations() {
        let mut samples: Vec<u64> = (1..=100).map(|n| n * 1000).collect();
        let latency = Latency::of(&mut samples);
        assert_eq!((latency.p50, latency.p99, latency.max), (51.0, 99.0, 100.0));
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("2").ok(), Some(Duration::from_secs(2)));
        assert!(parse_duration("2h").is_err());
    }

    fn parsed(args: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let args = ["bench"].iter().chain(args);
        <Command as clap::Parser>::try_parse_from(args)
            .expect("valid arguments")
            .bench
    }

    /// Given a server and no database, the defaults leave out the
    /// workloads that write straight to the database, and asking for them
    /// (or the baseline) is refused; with a database, all run.
    #[test]
    fn a_given_server_without_its_database_runs_what_needs_none() {
        let server = ["--server", "http://127.0.0.1:1"];
        let database = ["--database-url", "sqlite://elsewhere.db"];
        let names = |args: &BenchArgs| -> Vec<&str> {
            let chosen = args.workloads().expect("workloads");
            chosen.iter().map(|w| w.name()).collect()
        };
        let all = DEFAULT_WORKLOADS.map(|w| w.name());
        assert_eq!(names(&parsed(&[&server[..], &database[..]].concat())), all);
        assert_eq!(names(&parsed(&database)), all);
        assert_eq!(
            names(&parsed(
                &[&server[..], &["--workloads", "get,append"]].concat()
            )),
            ["get", "append"]
        );
        // Unless the environment names a database, which is then the
        // server's.
        let blind = parsed(&server);
        if blind.database_url.is_some() {
            assert_eq!(names(&blind), all);
            return;
        }
        assert_eq!(
            names(&blind),
            [
                "ping",
                "set",
                "get",
                "get-version",
                "list",
                "history",
                "append",
                "tail"
            ]
        );
        for (asked, refused) in [
            (
                &["--workloads", "get,search"][..],
                "--server with search needs",
            ),
            (&["--baseline"][..], "--server with --baseline needs"),
        ] {
            let err = parsed(&[&server[..], asked].concat())
                .workloads()
                .expect_err("refused");
            assert_eq!(err.code, crate::cli::exit::USAGE);
            assert!(err.message.starts_with(refused), "{}", err.message);
        }
    }
}
