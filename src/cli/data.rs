//! `engram forget-user`, `engram export` and `engram import`: a tenant's
//! data as a whole.

use std::collections::HashMap;
use std::io::Write;

use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio_stream::StreamExt;

use super::memory::ScopeTypeArg;
use super::{CliError, CliResult, ClientArgs, Output, Progress, connect, plural, print_json};
use crate::proto;
use crate::proto::data_service_client::DataServiceClient;

/// Bytes of lines sent per import message, well under gRPC's 4 MiB.
const IMPORT_BATCH_BYTES: usize = 1 << 20;

/// Write the caller's tenant, or part of it, as JSON Lines to standard
/// output (or --file): memory versions with tombstones and audit
/// records, sessions, episodes, working memory, facts, rules
#[derive(Debug, clap::Args)]
pub struct ExportCommand {
    #[command(flatten)]
    client: ClientArgs,

    /// Export one memory scope (with --scope-type)
    #[arg(long, conflicts_with_all = ["session", "user"])]
    scope: Option<String>,

    /// The type of --scope
    #[arg(long, value_enum, default_value_t = ScopeTypeArg::Namespace)]
    scope_type: ScopeTypeArg,

    /// Export one session: it, its episodes and working memory, and the
    /// execution scope named by its id
    #[arg(long, conflicts_with = "user")]
    session: Option<String>,

    /// Export one user of --app: their sessions as --session does, and the
    /// facts they own
    #[arg(long, requires = "app")]
    user: Option<String>,

    /// The app of --user
    #[arg(long, requires = "user")]
    app: Option<String>,

    /// Write to this file instead of standard output: to FILE.partial
    /// until the export is whole, then moved over FILE, so a failed export
    /// leaves FILE as it was
    #[arg(long)]
    file: Option<std::path::PathBuf>,
}

impl ExportCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let request = proto::ExportRequest {
            scope_type: if self.scope.is_some() {
                self.scope_type.to_proto() as i32
            } else {
                0
            },
            scope: self.scope.unwrap_or_default(),
            session_id: self.session.unwrap_or_default(),
            app: self.app.unwrap_or_default(),
            user: self.user.unwrap_or_default(),
        };
        let partial = self.file.as_deref().map(Partial::create).transpose()?;
        let mut out: Box<dyn Write + '_> = match &partial {
            Some(partial) => Box::new(std::io::BufWriter::new(&partial.file)),
            None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
        };
        let mut stream = DataServiceClient::new(channel)
            .export(request)
            .await?
            .into_inner();
        let progress = Progress::start("exporting");
        let mut counts: HashMap<String, i64> = HashMap::new();
        let mut total = 0;
        while let Some(chunk) = stream.next().await {
            for line in chunk?.lines {
                if let Some(kind) = kind_of(&line) {
                    *counts.entry(kind).or_default() += 1;
                }
                writeln!(out, "{line}").map_err(write_failed)?;
                total += 1;
            }
            progress.update(&format!("exported {total} lines"));
        }
        out.flush().map_err(write_failed)?;
        drop(out);
        if let Some(partial) = partial {
            partial.finish()?;
        }
        progress.finish();
        counts.remove("header");
        counts.remove("end");
        eprintln!("exported {}", summary(&counts));
        Ok(())
    }
}

/// The file an export is written to until it is whole: `NAME.partial`
/// beside `--file`, moved over it once the end line is written and
/// removed if the export fails, so that a failed export leaves the file
/// that was there as it was (a nightly backup's last good copy) rather
/// than a truncated one.
struct Partial {
    file: std::fs::File,
    path: std::path::PathBuf,
    target: std::path::PathBuf,
    done: bool,
}

impl Partial {
    fn create(target: &std::path::Path) -> Result<Partial, CliError> {
        let mut name = target.file_name().unwrap_or_default().to_owned();
        name.push(".partial");
        let path = target.with_file_name(name);
        let file = std::fs::File::create(&path)
            .map_err(|err| CliError::usage(format!("cannot create {}: {err}", path.display())))?;
        Ok(Partial {
            file,
            path,
            target: target.to_owned(),
            done: false,
        })
    }

    /// Makes the file durable, then puts it in place.
    fn finish(mut self) -> CliResult {
        self.file.sync_all().map_err(write_failed)?;
        std::fs::rename(&self.path, &self.target).map_err(|err| CliError {
            message: format!(
                "cannot move {} to {}: {err}",
                self.path.display(),
                self.target.display()
            ),
            code: super::exit::FAILURE,
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A write of the export that failed: to a pipe whose reader has gone
/// (`| head`), the command ends quietly, as every command's output does
/// ([`super::stdout_line`]); any other failure (a full disk) is one.
fn write_failed(err: std::io::Error) -> CliError {
    super::end_if_reader_gone(&err);
    CliError {
        message: format!("cannot write the export: {err}"),
        code: super::exit::FAILURE,
    }
}

/// The `kind` of a line, for the progress counts.
fn kind_of(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Kind {
        kind: String,
    }
    serde_json::from_str::<Kind>(line).ok().map(|k| k.kind)
}

/// `15 records (episode 12, session 3)`, the kinds in a stable order;
/// `nothing` when empty.
fn summary<'a>(counts: impl IntoIterator<Item = (&'a String, &'a i64)>) -> String {
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    if counts.is_empty() {
        return "nothing".to_owned();
    }
    let total: i64 = counts.iter().map(|(_, n)| **n).sum();
    let kinds: Vec<String> = counts
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    format!(
        "{} ({})",
        plural(total, "record", "records"),
        kinds.join(", ")
    )
}

/// Restore an export into the caller's tenant (admin token): all of it or,
/// on a malformed line or a conflict, none of it. Records already stored
/// and identical are left alone, so importing twice changes nothing
#[derive(Debug, clap::Args)]
pub struct ImportCommand {
    #[command(flatten)]
    client: ClientArgs,

    /// The export file; `-` reads standard input
    file: String,

    /// Import nothing and call no server: read the file as an import
    /// would (every line's JSON and fields, the header first, the end
    /// line and its count) and print its records by kind; exit 0 when an
    /// import could read it whole, 1 naming the first bad line. Whether
    /// its records agree with a store's is only known by importing
    #[arg(long)]
    check: bool,
}

impl ImportCommand {
    pub async fn run(self) -> CliResult {
        if self.check {
            return self.check_file();
        }
        let channel = connect(&self.client).await?;
        let input: Box<dyn tokio::io::AsyncRead + Unpin + Send> = if self.file == "-" {
            Box::new(tokio::io::stdin())
        } else {
            Box::new(
                tokio::fs::File::open(&self.file)
                    .await
                    .map_err(|err| CliError::usage(format!("cannot open {}: {err}", self.file)))?,
            )
        };
        let (batches, requests) = tokio::sync::mpsc::channel(4);
        let (failed, failure) = tokio::sync::oneshot::channel();
        let file = self.file.clone();
        let reader = tokio::spawn(async move {
            if let Err(err) = send_lines(input, &batches).await {
                let _ = failed.send(format!("cannot read {file}: {err}"));
                // Keeps the stream open: ending it would import what was
                // sent so far; the call is cancelled instead.
                std::future::pending::<()>().await;
            }
        });
        let mut client = DataServiceClient::new(channel);
        let call = client.import(tokio_stream::wrappers::ReceiverStream::new(requests));
        let progress = Progress::start("importing");
        let done = tokio::select! {
            done = call => done,
            Ok(why) = failure => {
                reader.abort();
                progress.finish();
                return Err(CliError::usage(why));
            }
        };
        reader.abort();
        progress.finish();
        let done = done?.into_inner();
        match self.client.output() {
            Output::Json => print_json(&json!({
                "imported": done.imported,
                "unchanged": done.unchanged,
                "lines": done.lines,
            })),
            Output::Text => {
                outln!("imported {}", summary(&done.imported));
                outln!("unchanged {}", summary(&done.unchanged));
                outln!("{} read", plural(done.lines, "line", "lines"));
            }
        }
        Ok(())
    }
}

impl ImportCommand {
    /// `--check`: the file read as an import reads it, offline.
    fn check_file(&self) -> CliResult {
        let input: Box<dyn std::io::BufRead> = if self.file == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            let file = std::fs::File::open(&self.file)
                .map_err(|err| CliError::usage(format!("cannot open {}: {err}", self.file)))?;
            Box::new(std::io::BufReader::new(file))
        };
        let bad = |err: crate::error::Error| CliError {
            message: format!("{}: {err}", self.file),
            code: super::exit::FAILURE,
        };
        let mut file = crate::data::Lines::default();
        let mut counts: HashMap<String, i64> = HashMap::new();
        for line in std::io::BufRead::lines(input) {
            let line =
                line.map_err(|err| CliError::usage(format!("cannot read {}: {err}", self.file)))?;
            if let Some((_, record)) = file.read(&line).map_err(bad)? {
                *counts.entry(record.kind().to_owned()).or_default() += 1;
            }
        }
        let read = file.finish().map_err(bad)?;
        counts.remove("header");
        match self.client.output() {
            Output::Json => print_json(&json!({
                "lines": read.lines,
                "version": read.version,
                "records": counts,
            })),
            Output::Text => outln!(
                "{}: whole, format version {}, {}: {}",
                self.file,
                read.version,
                plural(read.lines, "line", "lines"),
                summary(&counts)
            ),
        }
        Ok(())
    }
}

/// Sends the input's lines in batches of about [`IMPORT_BATCH_BYTES`].
async fn send_lines(
    input: impl tokio::io::AsyncRead + Unpin,
    batches: &tokio::sync::mpsc::Sender<proto::ImportRequest>,
) -> std::io::Result<()> {
    let mut lines = tokio::io::BufReader::new(input).lines();
    let mut batch = Vec::new();
    let mut bytes = 0;
    while let Some(line) = lines.next_line().await? {
        bytes += line.len();
        batch.push(line);
        if bytes >= IMPORT_BATCH_BYTES {
            let lines = std::mem::take(&mut batch);
            bytes = 0;
            if batches.send(proto::ImportRequest { lines }).await.is_err() {
                return Ok(());
            }
        }
    }
    if !batch.is_empty() {
        let _ = batches.send(proto::ImportRequest { lines: batch }).await;
    }
    Ok(())
}

/// Delete everything about one user of one app (admin token)
#[derive(Debug, clap::Args)]
pub struct ForgetUserCommand {
    #[command(flatten)]
    client: ClientArgs,

    /// The app the user belongs to
    #[arg(long)]
    app: String,

    /// The user to forget
    #[arg(long)]
    user: String,

    /// A further execution id known to be one of the user's runs (repeatable;
    /// execution scopes named by the user's session ids go anyway)
    #[arg(long = "execution-id")]
    execution_ids: Vec<String>,

    /// Print what would be deleted; delete nothing
    #[arg(long)]
    dry_run: bool,
}

impl ForgetUserCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let done = DataServiceClient::new(channel)
            .forget_user(proto::ForgetUserRequest {
                app: self.app,
                user: self.user,
                execution_ids: self.execution_ids,
                dry_run: self.dry_run,
            })
            .await?
            .into_inner();
        match self.client.output() {
            Output::Json => print_json(&forgotten_json(&done)),
            Output::Text => {
                let verb = if done.dry_run {
                    "would delete"
                } else {
                    "deleted"
                };
                outln!(
                    "{verb} {}, {}, {}, {}, {} ({})",
                    plural(done.sessions, "session", "sessions"),
                    plural(done.episodes, "episode", "episodes"),
                    plural(done.facts, "fact", "facts"),
                    plural(
                        done.working_items,
                        "working-memory item",
                        "working-memory items"
                    ),
                    plural(done.execution_scopes, "execution scope", "execution scopes"),
                    plural(done.memory_versions, "version", "versions")
                );
                if !done.audit_key.is_empty() {
                    outln!(
                        "audit record: {} in namespace engram.forgotten",
                        done.audit_key
                    );
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn forgotten_json(done: &proto::ForgetUserResponse) -> serde_json::Value {
    json!({
        "sessions": done.sessions,
        "episodes": done.episodes,
        "facts": done.facts,
        "working_items": done.working_items,
        "execution_scopes": done.execution_scopes,
        "memory_versions": done.memory_versions,
        "dry_run": done.dry_run,
        "audit_key": done.audit_key,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::summary;

    #[test]
    fn summaries_count_records_by_kind() {
        let counts = BTreeMap::from([("session".to_owned(), 3), ("episode".to_owned(), 12)]);
        assert_eq!(summary(&counts), "15 records (episode 12, session 3)");
        let one = BTreeMap::from([("fact".to_owned(), 1)]);
        assert_eq!(summary(&one), "1 record (fact 1)");
        assert_eq!(summary(&BTreeMap::new()), "nothing");
    }
}
