//! The server bench starts itself: this very binary, `engram serve`, as a
//! child process, so its memory can be read from /proc.

use std::net::SocketAddr;
use std::process::Stdio;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub struct Spawned {
    child: Child,
    pub grpc_addr: SocketAddr,
}

impl Spawned {
    /// Starts `engram serve` on the database and waits until it listens.
    pub async fn start(database_url: &str) -> anyhow::Result<Spawned> {
        let exe = std::env::current_exe().context("cannot find the engram binary")?;
        let mut child = Command::new(exe)
            .args([
                "serve",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ])
            .env("ENGRAM_DATABASE_URL", database_url)
            .env("ENGRAM_LOG_FORMAT", "json")
            .env("ENGRAM_SCHEDULER_INTERVAL_MS", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot run engram serve")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        while let Some(line) = lines.next_line().await? {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(addr) = event.get("grpc_addr").and_then(|a| a.as_str()) {
                let grpc_addr = addr.parse()?;
                // Keep reading so the server never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return Ok(Spawned { child, grpc_addr });
            }
            if event.get("level").and_then(|l| l.as_str()) == Some("ERROR") {
                anyhow::bail!("{line}");
            }
        }
        anyhow::bail!("engram serve exited before listening")
    }

    /// The server to drive: `given` when there is one, else one started
    /// on `database_url` (returned too, to be stopped).
    pub async fn or_given(
        given: Option<&str>,
        database_url: &str,
    ) -> Result<(Option<Spawned>, String), crate::cli::CliError> {
        match given {
            Some(server) => Ok((None, server.to_owned())),
            None => {
                let spawned = Spawned::start(database_url).await.map_err(|err| {
                    crate::cli::CliError::usage(format!("cannot start engram: {err:#}"))
                })?;
                let address = format!("http://{}", spawned.grpc_addr);
                Ok((Some(spawned), address))
            }
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    fn status_kib(&self, field: &str) -> Option<u64> {
        let pid = self.child.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// VmRSS (now) or VmHWM (peak since the last reset), in MiB.
    pub fn rss_mib(&self, field: &str) -> f64 {
        self.status_kib(field).unwrap_or(0) as f64 / 1024.0
    }

    /// Resets the peak (VmHWM) so the next reading covers one workload.
    pub fn reset_peak(&self) {
        if let Some(pid) = self.child.id() {
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
    }

    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = self.child.wait().await;
    }
}
