//! The `engram` binary: the server and its maintenance commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use engram::config::{Config, ConfigArgs};

#[derive(Debug, Parser)]
#[command(
    name = "engram",
    version,
    about = "Durable memory for AI agents, served over gRPC",
    after_help = "Client flags (--server, --token, --ca-cert, --client-cert, --client-key, \
                  --retries, --output, --json) may also come before the command group: \
                  engram --server http://engram:50051 memory get KEY --scope S"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (gRPC and HTTP) until SIGTERM or Ctrl-C
    Serve(ConfigArgs),
    /// Apply pending database migrations and exit
    Migrate(MigrateArgs),
    /// Embed the live memory entries, facts and episodes that have no vector
    /// of the configured embedder's model (written before it was configured,
    /// or under another model), with progress on stderr. Needs the database
    /// and the embedder settings the server has; servers may keep running
    Reembed(ConfigArgs),
    /// Copy the embedded SQLite store (--database-url) to a new file (--to;
    /// `-` for standard output), consistent and checked, while a server may
    /// keep serving it
    Backup(BackupArgs),
    /// Scoped memory on a running server: scopes, list, get, set, delete,
    /// history, rollback, fork, purge, purge-scope, compact, retention, retention-get,
    /// retention-apply, log, reindex, watch. Exit codes: 0 ok,
    /// 1 failure, 2 bad input, 3 not found, 4 conflict, 5 unavailable,
    /// 6 denied (token)
    Memory(engram::cli::memory::MemoryCommand),
    /// Sessions on a running server: create, get, list, delete, end,
    /// cleanup, stats. Exit codes as for `memory`
    Sessions(engram::cli::sessions::SessionsCommand),
    /// Session event logs on a running server: append, list, recent,
    /// context, tail. Exit codes as for `memory`
    Episodes(engram::cli::sessions::EpisodesCommand),
    /// Consolidation rules on a running server: create, list, get, delete,
    /// run (--dry-run prints the deltas). Exit codes as for `memory`
    Rules(engram::cli::consolidation::RulesCommand),
    /// Facts on a running server: list, get (with versions and lineage),
    /// delete. Exit codes as for `memory`
    Facts(engram::cli::consolidation::FactsCommand),
    /// A session's working memory on a running server: goal, task-create,
    /// task-update, tasks, remember, procedure, cache, snapshot, render,
    /// tools, call.
    /// Exit codes as for `memory`
    Working(engram::cli::working::WorkingCommand),
    /// Find memory entries, facts and episodes by what they say, best
    /// first. Exit codes as for `memory`
    Search(engram::cli::search::SearchCommand),
    /// Drive a server with concurrent clients and print ops/s and latency
    /// per workload, beside the same SQL run straight on the database
    /// (--baseline). Starts `engram serve` itself unless --server is given
    Bench(engram::bench::BenchArgs),
    /// Measure how well search finds the answers of a labeled data set
    /// (JSON Lines of conversations and questions): prints recall@1/5/10
    /// and MRR. Starts `engram serve` itself unless --server is given
    RecallEval(engram::bench::recall::RecallArgs),
    /// An MCP server over stdio for an assistant to spawn, reaching the
    /// Engram server at --server with --token (memory, sessions, working
    /// memory and search as tools)
    Mcp(engram::cli::mcp::McpCommand),
    /// Delete everything about one user of one app: sessions, episodes,
    /// working memory, facts, their runs' execution scopes (admin token;
    /// --dry-run counts first). Exit codes as for `memory`
    ForgetUser(engram::cli::data::ForgetUserCommand),
    /// Write the tenant, a scope (--scope), a session (--session) or a
    /// user (--app, --user) as JSON Lines to standard output or --file,
    /// with progress on stderr. Exit codes as for `memory`
    Export(engram::cli::data::ExportCommand),
    /// Restore an export (a file, or `-` for standard input) into the
    /// token's tenant, all or nothing (admin token). Exit codes as for
    /// `memory`
    Import(engram::cli::data::ImportCommand),
    /// Bearer tokens for the tokens file: new (a random token and its
    /// line), hash (the line's hash of a token on stdin)
    Token(engram::cli::token::TokenCommand),
    /// Ask the server on this machine whether it is ready (its HTTP port's
    /// /readyz; --live: /healthz): exit 0 if so, 1 if not, for a
    /// container's HEALTHCHECK
    Health(engram::cli::health::HealthCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_from(engram::cli::client_flags_after_subcommand(
        std::env::args_os(),
    ));
    let result = match cli.command {
        Command::Serve(args) => serve(args).await.map(|()| ExitCode::SUCCESS),
        Command::Migrate(args) => migrate(args).await,
        Command::Reembed(args) => reembed(args).await.map(|()| ExitCode::SUCCESS),
        Command::Backup(args) => backup(args).await.map(|()| ExitCode::SUCCESS),
        Command::Memory(command) => return client_exit(command.run().await),
        Command::Sessions(command) => return client_exit(command.run().await),
        Command::Episodes(command) => return client_exit(command.run().await),
        Command::Rules(command) => return client_exit(command.run().await),
        Command::Facts(command) => return client_exit(command.run().await),
        Command::Search(command) => return client_exit(command.run().await),
        Command::Bench(args) => return client_exit(args.run().await),
        Command::RecallEval(args) => return client_exit(args.run().await),
        Command::Working(command) => return client_exit(command.run().await),
        Command::Mcp(command) => return client_exit(command.run().await),
        Command::ForgetUser(command) => return client_exit(command.run().await),
        Command::Export(command) => return client_exit(command.run().await),
        Command::Import(command) => return client_exit(command.run().await),
        Command::Token(command) => return client_exit(command.run()),
        Command::Health(command) => return client_exit(command.run().await),
    };
    match result {
        Ok(code) => code,
        // Once logging is set up the error is a log line (JSON for a
        // collector when so configured); before that (a bad setting, say)
        // there is no log, so it is a plain line on stderr. Never both.
        Err(err) => {
            if tracing::dispatcher::has_been_set() {
                tracing::error!("{err:#}");
            } else {
                eprintln!("engram: {err:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn client_exit(result: engram::cli::CliResult) -> ExitCode {
    result.map_or_else(|err| err.report(), |()| ExitCode::SUCCESS)
}

async fn serve(args: ConfigArgs) -> anyhow::Result<()> {
    let config = Config::load(args)?;
    let _telemetry = engram::telemetry::init(config.log_format)?;
    let mut signal = ShutdownSignal::install()?;
    let delay = config.shutdown_delay;
    let server = engram::server::start(config).await?;
    signal.recv().await;
    if !delay.is_zero() {
        // Kubernetes takes a pod out of its Service's endpoints while it
        // signals it; until every node and client has seen that, calls
        // still arrive, and a closed listener would refuse them.
        tracing::info!(
            ?delay,
            "draining: not ready, still serving until the delay ends or a second signal"
        );
        server.drain();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = signal.recv() => {}
        }
    }
    tracing::info!("shutting down");
    server.shutdown();
    server.wait().await
}

#[derive(Debug, clap::Args)]
struct MigrateArgs {
    #[command(flatten)]
    config: ConfigArgs,

    /// Then grant this Postgres role what `engram serve` needs (use of the
    /// tables and sequences, not ownership), so the server can run as a
    /// role that row-level security binds
    #[arg(long, value_name = "ROLE", conflicts_with = "check")]
    grant_to: Option<String>,

    /// Apply nothing: print which migrations the database has and which
    /// are pending, and exit 0 when none is (or a later release's are
    /// applied too), 2 when some are, 1 on an error (a deploy pipeline's
    /// gate: does this upgrade migrate?)
    #[arg(long)]
    check: bool,

    /// With --check: the report as text for people, or as one JSON
    /// document for scripts
    #[arg(long, value_enum, default_value_t = engram::cli::Output::Text, requires = "check")]
    output: engram::cli::Output,

    /// The same as --output json
    #[arg(long, conflicts_with = "output", requires = "check")]
    json: bool,
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let json = args.json || args.output == engram::cli::Output::Json;
    let config = Config::load(args.config)?;
    let _telemetry = engram::telemetry::init(config.log_format)?;
    if args.check {
        let migrations = engram::server::migrations(&config).await?;
        match json {
            true => engram::cli::print_json(&migrations_json(&config, &migrations)),
            false => print!("{}", describe_migrations(&config, &migrations)),
        }
        return Ok(match migrations.pending.is_empty() {
            true => ExitCode::SUCCESS,
            false => ExitCode::from(2),
        });
    }
    engram::server::migrate(&config, args.grant_to.as_deref()).await?;
    tracing::info!(database = %config.database_url, grant_to = ?args.grant_to, "migrations applied");
    Ok(ExitCode::SUCCESS)
}

/// `engram migrate --check --json`'s report: what the text says, by
/// field (`ahead` and `newest_applied` null when they do not apply).
fn migrations_json(config: &Config, migrations: &engram::store::Migrations) -> serde_json::Value {
    let pending: Vec<serde_json::Value> = migrations
        .pending
        .iter()
        .map(|(version, description)| {
            serde_json::json!({"version": version, "description": description})
        })
        .collect();
    serde_json::json!({
        "database": config.database_url.to_string(),
        "applied": migrations.applied.len(),
        "newest_applied": migrations.applied.last(),
        "newest_known": migrations.newest_known,
        "ahead": migrations.ahead(),
        "pending": pending,
    })
}

/// `engram migrate --check`'s report.
fn describe_migrations(config: &Config, migrations: &engram::store::Migrations) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "database: {}
",
        config.database_url
    );
    let _ = match migrations.applied.last() {
        None => writeln!(out, "applied: none"),
        Some(newest) => writeln!(
            out,
            "applied: {} migrations, the newest {newest:04}",
            migrations.applied.len()
        ),
    };
    if let Some(newest) = migrations.ahead() {
        let _ = writeln!(
            out,
            "ahead: a later release migrated it (to {newest:04}; this one knows up to {:04}), \
             and this one serves it as it is",
            migrations.newest_known
        );
    }
    let _ = match migrations.pending.len() {
        0 => writeln!(out, "pending: none, the schema is current"),
        n => writeln!(
            out,
            "pending: {n} (`engram migrate` applies them; see the README on how long they take)"
        ),
    };
    for (version, description) in &migrations.pending {
        let _ = writeln!(out, "  {version:04} {description}");
    }
    out
}

#[derive(Debug, clap::Args)]
struct BackupArgs {
    #[command(flatten)]
    config: ConfigArgs,

    /// The new file to write the copy to (it must not exist), or `-` for
    /// standard output (made in the temporary directory first); start a
    /// server on the copy with --database-url sqlite://FILE to restore
    #[arg(long, value_name = "FILE")]
    to: std::path::PathBuf,
}

async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let config = Config::load(args.config)?;
    let started = std::time::Instant::now();
    let to_stdout = args.to.as_os_str() == "-";
    anyhow::ensure!(
        !(to_stdout && std::io::stdout().is_terminal()),
        "refusing to write a database to a terminal: redirect standard output to a file"
    );
    // `-` streams a copy made beside the other temporary files: the way
    // out of a container whose image has no shell, cat or tar
    // (`kubectl exec … -- engram backup --to - > engram.db`).
    let path = match to_stdout {
        true => std::env::temp_dir().join(format!("engram-backup-{}.db", uuid::Uuid::new_v4())),
        false => args.to.clone(),
    };
    let copied = engram::server::backup(&config, &path).await;
    let copied = match (copied, to_stdout) {
        (Ok(copied), true) => {
            let streamed = std::fs::File::open(&path).and_then(|mut file| {
                let mut out = std::io::stdout().lock();
                std::io::copy(&mut file, &mut out)?;
                out.flush()
            });
            let _ = std::fs::remove_file(&path);
            streamed
                .map(|()| copied)
                .map_err(|err| anyhow::anyhow!("cannot write the copy to standard output: {err}"))
        }
        (copied, _) => copied,
    }?;
    eprintln!(
        "engram backup: {} copied to {} ({:.1} MiB in {:.1} s, checked)",
        config.database_url,
        match to_stdout {
            true => "standard output".to_owned(),
            false => args.to.display().to_string(),
        },
        copied.bytes as f64 / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn reembed(args: ConfigArgs) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let config = Config::load(args)?;
    let _telemetry = engram::telemetry::init(config.log_format)?;
    let terminal = std::io::stderr().is_terminal();
    let mut shown = None;
    let backfilled = engram::server::reembed(&config, |p| {
        let percent = (p.done * 100).checked_div(p.total).unwrap_or(100);
        let line = format!(
            "engram reembed: {:<8} {:>9} of {:<9} {:>3}%",
            format!("{:?}", p.source).to_lowercase(),
            p.done,
            p.total,
            percent
        );
        if terminal {
            eprint!("\r{line}");
            if p.done == p.total {
                eprintln!();
            }
        } else if shown != Some((p.source, percent / 10)) || p.done == p.total {
            // One line per tenth when stderr is a log, not a terminal.
            shown = Some((p.source, percent / 10));
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
    })
    .await?;
    if backfilled.busy > 0 {
        eprintln!(
            "engram reembed: {} items were held by other writers throughout (most often \
             deleting them); run reembed again to embed those still live",
            backfilled.busy
        );
    }
    eprintln!("engram reembed: {} items embedded", backfilled.embedded);
    Ok(())
}

/// Listens for SIGTERM (how Kubernetes stops a pod) and Ctrl-C. The
/// handlers are installed when this is created, before the server starts,
/// so a signal that arrives early is not lost to the default action.
struct ShutdownSignal {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    fn install() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(ShutdownSignal {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(ShutdownSignal {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => {},
            _ = self.interrupt.recv() => {},
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every command (subcommands too, depth first) with its name and its
    /// help (`-h`, which shows defaults as `--help` does).
    fn all(command: &mut clap::Command, out: &mut Vec<(String, String)>) {
        out.push((
            command.get_name().to_owned(),
            command.render_help().to_string(),
        ));
        for sub in command.get_subcommands_mut() {
            all(sub, out);
        }
    }

    /// Each flag of a short help with the heading it is listed under.
    fn headed(help: &str) -> Vec<(&str, &str)> {
        let mut heading = "";
        let mut flags = Vec::new();
        for line in help.lines() {
            if !line.starts_with(' ') && line.ends_with(':') {
                heading = line.trim_end_matches(':');
            } else if let Some(flag) = line.trim_start().strip_prefix("--") {
                let name = flag.split([' ', '<', '=']).next().unwrap_or_default();
                flags.push((heading, name));
            }
        }
        flags
    }

    /// clap's own checks of the whole tree (names, conflicts, defaults),
    /// and help a person can read: no empty default shown as `""`, and
    /// nothing but the shared flags under their headings.
    #[test]
    fn every_command_is_well_formed_and_its_help_reads_cleanly() {
        const CONNECTION: [&str; 6] = [
            "server",
            "token",
            "ca-cert",
            "client-cert",
            "client-key",
            "retries",
        ];
        const OUTPUT: [&str; 2] = ["output", "json"];
        Cli::command().debug_assert();
        let mut helps = Vec::new();
        all(&mut Cli::command(), &mut helps);
        assert!(helps.len() > 60, "only {} commands", helps.len());
        let mut connected = 0;
        for (name, help) in helps {
            assert!(!help.contains("[default: \"\"]"), "{name}:\n{help}");
            for (heading, flag) in headed(&help) {
                let shared: &[&str] = match heading {
                    "Connection" => &CONNECTION,
                    "Output" => &OUTPUT,
                    _ => continue,
                };
                assert!(
                    shared.contains(&flag),
                    "{name}: --{flag} under {heading:?}:\n{help}"
                );
                connected += usize::from(heading == "Connection");
            }
        }
        assert!(connected > 100, "{connected} connection flags seen");
    }
}
