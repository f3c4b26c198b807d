//! Where a workload's CPU went, from Linux's `/proc`: the bench client
//! itself, the server it started, every local Postgres process, and the
//! machine's idle time, read as the measurement starts and as it ends.
//! On two shared cores that split says what a change can gain (a `get`
//! that costs the server 84 µs against `ping`'s 54) better than ops/s
//! alone, which move with the machine's neighbours.
//!
//! Elsewhere than Linux (no `/proc`) there is no reading and the bench
//! prints none. Postgres's figure counts every process named `postgres`
//! on this machine, so it is the database's only when the database is
//! local and nothing else uses it; a backend that exits during the
//! measurement takes its time with it.

use serde::Serialize;

/// Clock ticks per second in `/proc` (`USER_HZ`, 100 on every Linux
/// architecture that exports it to user space).
const TICKS_PER_SEC: f64 = 100.0;

/// CPU time used so far, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    bench: u64,
    server: Option<u64>,
    postgres: u64,
    /// Every CPU's ticks, and the idle ones among them.
    total: u64,
    idle: u64,
}

/// A workload's CPU per op, in microseconds, and the machine's idle share.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PerOp {
    pub bench_us: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_us: Option<f64>,
    pub postgres_us: f64,
    pub idle_pct: f64,
}

impl Snapshot {
    /// Now, with the server's process when its pid is known; `None`
    /// without `/proc`.
    pub fn take(server: Option<u32>) -> Option<Snapshot> {
        let bench = process_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        let server = server.and_then(|pid| {
            process_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
        });
        let mut postgres = 0;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let path = entry.path();
            let is_postgres = std::fs::read_to_string(path.join("comm"))
                .is_ok_and(|comm| comm.trim_end() == "postgres");
            if is_postgres
                && let Some(ticks) = std::fs::read_to_string(path.join("stat"))
                    .ok()
                    .and_then(|stat| process_ticks(&stat))
            {
                postgres += ticks;
            }
        }
        let (total, idle) = machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)?;
        Some(Snapshot {
            bench,
            server,
            postgres,
            total,
            idle,
        })
    }

    /// What was used between `earlier` and this snapshot, per op.
    pub fn per_op_since(&self, earlier: &Snapshot, ops: u64) -> Option<PerOp> {
        if ops == 0 {
            return None;
        }
        // To a tenth: a tick is 10 ms, so finer would be noise.
        let tenth = |x: f64| (x * 10.0).round() / 10.0;
        let us = |ticks: u64| tenth(ticks as f64 / TICKS_PER_SEC * 1e6 / ops as f64);
        let total = self.total.checked_sub(earlier.total).filter(|&t| t > 0)?;
        Some(PerOp {
            bench_us: us(self.bench.saturating_sub(earlier.bench)),
            server_us: self
                .server
                .zip(earlier.server)
                .map(|(now, then)| us(now.saturating_sub(then))),
            postgres_us: us(self.postgres.saturating_sub(earlier.postgres)),
            idle_pct: tenth(self.idle.saturating_sub(earlier.idle) as f64 * 100.0 / total as f64),
        })
    }
}

/// A process's user and system ticks from its `stat` line: fields 14 and
/// 15, counted after the command name, which may hold spaces and parens.
fn process_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Every CPU's ticks and the idle ones (idle and I/O wait), from the
/// first line of `/proc/stat`.
fn machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((total, idle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_past_a_name_with_spaces() {
        let stat = "4242 (engram (serve) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 37 0 0 20 0 9 0 123 456 789";
        assert_eq!(process_ticks(stat), Some(187));
        assert_eq!(process_ticks("4242 (cut short) S 1"), None);
        let machine = "cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 50 2 25 400 10 0 1 1 0 0\n";
        assert_eq!(machine_ticks(machine), Some((981, 820)));
    }

    #[test]
    fn use_per_op_is_the_difference_over_the_ops() {
        let before = Snapshot {
            bench: 10,
            server: Some(20),
            postgres: 30,
            total: 1000,
            idle: 100,
        };
        let after = Snapshot {
            bench: 15,
            server: Some(28),
            postgres: 34,
            total: 1200,
            idle: 150,
        };
        // 5 ticks = 50 ms over 1,000 ops: 50 µs an op.
        let per_op = after.per_op_since(&before, 1000).expect("a reading");
        assert_eq!(
            per_op,
            PerOp {
                bench_us: 50.0,
                server_us: Some(80.0),
                postgres_us: 40.0,
                idle_pct: 25.0,
            }
        );
        assert_eq!(after.per_op_since(&before, 0), None);
        if cfg!(target_os = "linux") {
            assert!(Snapshot::take(None).is_some(), "/proc is readable");
        }
    }
}
