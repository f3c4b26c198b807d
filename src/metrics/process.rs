//! The process's own metrics under the names every Prometheus client
//! library's process collector exports (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, ...), which
//! dashboards and alerts on memory growth, CPU and file descriptors read,
//! and `engram_build_info`, the version each replica runs (a rollout's
//! progress).
//!
//! Read from `/proc` at each scrape, on Linux only (elsewhere only the
//! build info is exported): five small files, which is why this is written
//! here rather than taken from a crate (the `prometheus` crate's collector
//! brings that crate's registry and `procfs` with it).

use std::fmt::Write;

use super::header;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: the kernel's
/// `USER_HZ`, 100 on every architecture Linux runs on (what Prometheus's
/// own `procfs` assumes too).
const USER_HZ: f64 = 100.0;

/// What `/proc` says of this process, as far as it could be read.
#[derive(Debug, Default, PartialEq)]
struct Process {
    cpu_seconds: Option<f64>,
    start_time_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
}

/// Appends the process metrics and the build info to `out`.
pub(super) fn render(out: &mut String) {
    header(
        out,
        "engram_build_info",
        "gauge",
        "1, labelled with the version of Engram this replica runs.",
    );
    let _ = writeln!(
        out,
        "engram_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let process = read();
    let gauges: [(&str, &str, &str, Option<f64>); 6] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            process.cpu_seconds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            process.start_time_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            process.resident_bytes.map(|n| n as f64),
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            process.virtual_bytes.map(|n| n as f64),
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            process.open_fds.map(|n| n as f64),
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            process.max_fds.map(|n| n as f64),
        ),
    ];
    for (name, kind, help, value) in gauges {
        if let Some(value) = value {
            header(out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
    }
}

#[cfg(target_os = "linux")]
fn read() -> Process {
    let file = |path: &str| std::fs::read_to_string(path).ok();
    let mut process = Process::default();
    if let (Some(stat), Some(system)) = (file("/proc/self/stat"), file("/proc/stat")) {
        (process.cpu_seconds, process.start_time_seconds) = times(&stat, &system);
    }
    if let Some(status) = file("/proc/self/status") {
        process.resident_bytes = status_kib(&status, "VmRSS:").map(|kib| kib * 1024);
        process.virtual_bytes = status_kib(&status, "VmSize:").map(|kib| kib * 1024);
    }
    process.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as u64);
    process.max_fds = file("/proc/self/limits").and_then(|limits| max_open_files(&limits));
    process
}

#[cfg(not(target_os = "linux"))]
fn read() -> Process {
    Process::default()
}

/// CPU seconds used and the start time (Unix seconds), from
/// `/proc/self/stat` and the boot time in `/proc/stat`.
fn times(stat: &str, system: &str) -> (Option<f64>, Option<f64>) {
    // The command name (field 2) is in parentheses and may hold spaces:
    // the fields counted from 3 follow its last `)`.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return (None, None);
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
    let cpu = match (field(14), field(15)) {
        (Some(user), Some(system)) => Some((user + system) / USER_HZ),
        _ => None,
    };
    let boot = system
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|t| t.trim().parse::<f64>().ok());
    let start = match (boot, field(22)) {
        (Some(boot), Some(ticks)) => Some(boot + ticks / USER_HZ),
        _ => None,
    };
    (cpu, start)
}

/// A `kB` line of `/proc/self/status` (`VmRSS:   2232 kB`).
fn status_kib(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft limit of `Max open files` in `/proc/self/limits`; none when
/// unlimited.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_proc_files() {
        // A command name with spaces and a parenthesis, as the kernel allows.
        let stat = "25409 (my (odd) cmd) R 25407 25407 21475 0 -1 4194304 101 0 0 0 \
                    250 75 0 0 20 0 1 0 4865362 6053888 393 18446744073709551615";
        let system = "cpu  1 2 3\nbtime 1796037656\nprocesses 9\n";
        assert_eq!(
            times(stat, system),
            (Some(3.25), Some(1_796_037_656.0 + 48_653.62))
        );
        assert_eq!(times("garbled", system), (None, None));
        let status = "Name:\tcat\nVmSize:\t    6744 kB\nVmRSS:\t    2232 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(2232));
        assert_eq!(status_kib(status, "VmSize:"), Some(6744));
        assert_eq!(status_kib(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            20000                524288               files\n";
        assert_eq!(max_open_files(limits), Some(20_000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(max_open_files(unlimited), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let process = read();
        assert!(process.cpu_seconds.is_some_and(|s| s >= 0.0));
        assert!(process.resident_bytes.is_some_and(|b| b > 1 << 20));
        assert!(process.virtual_bytes >= process.resident_bytes);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let started = process.start_time_seconds.unwrap_or_default();
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} {now}"
        );
        assert!(process.open_fds.is_some_and(|n| n >= 3));
        assert!(process.max_fds >= process.open_fds);
    }
}
