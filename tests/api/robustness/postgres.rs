//! A Postgres cluster of the scenario's own, which it may restart with
//! `pg_ctl restart -m immediate` (a crash of the database) without
//! disturbing the other tests' shared one. Commits are synchronous: an
//! immediate restart must not lose an acknowledged commit (`fsync` is off,
//! which only matters when the machine, not the process, goes down).

use std::path::PathBuf;

use tokio::process::Command;

pub struct OwnPostgres {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    pub url: String,
}

/// The newest installed server's binaries (`PG_BINDIR` when the test
/// command set it).
fn bindir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BINDIR") {
        return dir.into();
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's binaries under /usr/lib/postgresql (apt-get install postgresql)")
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop().expect("a PostgreSQL server installed")
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.starts_with(b"0\n"))
}

impl OwnPostgres {
    /// A command run as the cluster's owner: Postgres refuses root.
    fn command(&self, tool: &str) -> Command {
        let program = self.bindir.join(tool);
        if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    async fn run(&self, tool: &str, args: &[&str]) {
        let out = self
            .command(tool)
            .args(args)
            .output()
            .await
            .unwrap_or_else(|err| panic!("run {tool}: {err}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    pub async fn start() -> OwnPostgres {
        let dir = tempfile::tempdir().expect("temp dir");
        if is_root() {
            let owned = std::process::Command::new("chown")
                .arg("postgres:")
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(owned.success());
        }
        let port = super::free_port();
        let cluster = OwnPostgres {
            dir,
            bindir: bindir(),
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        let data = cluster.data();
        cluster
            .run(
                "initdb",
                &["-D", &data, "-U", "postgres", "-A", "trust", "--no-sync"],
            )
            .await;
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c synchronous_commit=on -c max_connections=200",
            cluster.dir.path().display()
        );
        let log = cluster
            .dir
            .path()
            .join("postgres.log")
            .display()
            .to_string();
        cluster
            .run(
                "pg_ctl",
                &[
                    "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
                ],
            )
            .await;
        cluster
    }

    /// Crashes the database and starts it again with the same options.
    pub async fn restart_immediately(&self) {
        // The log file keeps the new postmaster off pg_ctl's output pipes,
        // which would otherwise never close.
        let log = self.dir.path().join("postgres.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-m",
                "immediate",
                "-w",
                "-t",
                "60",
                "restart",
            ],
        )
        .await;
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let mut stop = if is_root() {
            let mut command = std::process::Command::new("runuser");
            command
                .args(["-u", "postgres", "--"])
                .arg(self.bindir.join("pg_ctl"));
            command
        } else {
            std::process::Command::new(self.bindir.join("pg_ctl"))
        };
        let _ = stop
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
    }
}
