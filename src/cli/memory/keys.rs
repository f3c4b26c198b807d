//! `engram memory` commands that call `MemoryService`: scopes, listing,
//! reading, writing and forking keys, their history and the change feed.

use serde_json::json;
use tonic::Status;

use super::show::{entry_json, scope_type_name};
use super::{ScopeArgs, ScopeTypeArg, point};
use crate::api::convert::json_to_proto;
use crate::cli::follow::Follow;
use crate::cli::retry::Resumes;
use crate::cli::{
    CliResult, Connection, Output, all_pages, given_or_stdin, parse_value, plural, print_json,
    time, value_json,
};
use crate::proto;
use crate::proto::memory_service_client::MemoryServiceClient;

#[derive(Debug, clap::Subcommand)]
pub(super) enum KeyCommand {
    /// List scopes with their live entry counts
    Scopes {
        /// Only scopes of this type
        #[arg(long, value_enum)]
        scope_type: Option<ScopeTypeArg>,
        /// Only execution scopes of this flow (by name)
        #[arg(long)]
        flow: Option<String>,
        /// Count what was live then: a revision (from `memory watch`), an RFC 3339 time
        /// or a duration ago (30m, 2h, 7d)
        #[arg(long, value_parser = point)]
        as_of: Option<proto::AsOf>,
    },
    /// List the live entries of a scope, in key order (every page)
    List {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only keys starting with this prefix
        #[arg(long, default_value = "", hide_default_value = true)]
        prefix: String,
        /// Include the reserved _compaction/ audit keys
        #[arg(long)]
        include_reserved: bool,
        /// List what was live then: a revision (from `memory watch`), an RFC 3339 time or
        /// a duration ago (30m, 2h, 7d); keys whose value then was purged since are listed
        /// as purged
        #[arg(long, value_parser = point)]
        as_of: Option<proto::AsOf>,
    },
    /// Print a key's current value (or the value at --version or --as-of)
    Get {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Read this version instead of the newest
        #[arg(long, conflicts_with = "as_of", value_parser = clap::value_parser!(i64).range(1..))]
        version: Option<i64>,
        /// Read the value the key had then: a revision, an RFC 3339 time or a duration
        /// ago (30m, 2h, 7d)
        #[arg(long, value_parser = point)]
        as_of: Option<proto::AsOf>,
    },
    /// Copy a scope's live entries (now, or at --as-of) into a new, empty scope,
    /// e.g. to replay a run against the memory it saw
    Fork {
        #[command(flatten)]
        scope: ScopeArgs,
        /// The new scope
        #[arg(long)]
        to_scope: String,
        /// The new scope's type (default: the source's)
        #[arg(long, value_enum)]
        to_scope_type: Option<ScopeTypeArg>,
        /// Copy the state at this point: a revision, an RFC 3339 time or a duration ago
        /// (30m, 2h, 7d)
        #[arg(long, value_parser = point)]
        as_of: Option<proto::AsOf>,
    },
    /// Write a new version; VALUE is parsed as JSON when it can be, else stored as a string
    Set {
        /// The key, e.g. preferences/editor
        key: String,
        /// The value: JSON (`{"theme": "dark"}`, `42`), or else the text as a string; `-` reads it from standard input
        value: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only write if the newest version is this one (0: the key has no live value)
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        expected_version: Option<i64>,
        /// Makes retrying this command safe
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Tombstone a key
    Delete {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only delete if the newest version is this one
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        expected_version: Option<i64>,
        /// Makes retrying this command safe
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Write a new version holding an older version's value (restores a
    /// deleted key too); recorded in the scope's audit log
    Rollback {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// The version whose value to restore
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        to_version: i64,
    },
    /// Print every version of a key, oldest first, tombstones included; a
    /// stream that breaks is read on from the version after the last one
    /// printed (see --retries)
    History {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Start at this version
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
        from_version: i64,
    },
    /// Follow a scope's changes until Ctrl-C (or --limit changes); prints
    /// the revision to resume from when it stops, and reconnects from the
    /// last revision printed when the stream breaks (a server restart, a
    /// dropped connection)
    Watch {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only keys starting with this prefix
        #[arg(long, default_value = "", hide_default_value = true)]
        prefix: String,
        /// Resume after this revision instead of starting now
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        from_revision: Option<i64>,
        /// Stop after this many changes
        #[arg(long)]
        limit: Option<usize>,
        /// Stop when the stream breaks instead of reconnecting
        #[arg(long)]
        no_reconnect: bool,
    },
}

pub(super) async fn run(channel: Connection, output: Output, command: KeyCommand) -> CliResult {
    let retries = channel.retries();
    let mut memory = MemoryServiceClient::new(channel);
    match command {
        KeyCommand::Scopes {
            scope_type,
            flow,
            as_of: point,
        } => {
            let all = all_pages(|page_token| {
                let mut memory = memory.clone();
                let request = proto::ListScopesRequest {
                    scope_type: scope_type.map_or(0, |t| t.to_proto() as i32),
                    page_size: 1000,
                    page_token,
                    flow_name: flow.clone().unwrap_or_default(),
                    as_of: point,
                    ..Default::default()
                };
                async move {
                    let page = memory.list_scopes(request).await?.into_inner();
                    Ok((page.scopes, page.next_page_token))
                }
            })
            .await?;
            match output {
                Output::Json => print_json(&json!(
                    all.iter()
                        .map(|s| json!({
                            "scope_type": scope_type_name(s.scope_type),
                            "scope": s.scope,
                            "entry_count": s.entry_count,
                            "purged_count": s.purged_count,
                        }))
                        .collect::<Vec<_>>()
                )),
                Output::Text => {
                    for s in &all {
                        let purged = match s.purged_count {
                            0 => String::new(),
                            n => format!(", {n} purged since"),
                        };
                        outln!(
                            "{:<10} {}  ({}{purged})",
                            scope_type_name(s.scope_type),
                            s.scope,
                            plural(s.entry_count, "entry", "entries")
                        );
                    }
                }
            }
        }
        KeyCommand::List {
            scope,
            prefix,
            include_reserved,
            as_of: point,
        } => {
            let (scope_type, scope) = scope.proto();
            // Entries and purged keys, merged back into key order.
            let rows = all_pages(|page_token| {
                let mut memory = memory.clone();
                let request = proto::ListRequest {
                    scope_type,
                    scope: scope.clone(),
                    key_prefix: prefix.clone(),
                    page_size: 1000,
                    page_token,
                    include_reserved,
                    as_of: point,
                };
                async move {
                    let page = memory.list(request).await?.into_inner();
                    let mut rows: Vec<Result<proto::MemoryEntry, String>> =
                        page.entries.into_iter().map(Ok).collect();
                    rows.extend(page.purged_keys.into_iter().map(Err));
                    rows.sort_by(|a, b| row_key(a).cmp(row_key(b)));
                    Ok((rows, page.next_page_token))
                }
            })
            .await?;
            match output {
                Output::Json => print_json(&json!(
                    rows.iter()
                        .map(|row| match row {
                            Ok(entry) => entry_json(entry),
                            Err(key) => json!({ "key": key, "purged": true }),
                        })
                        .collect::<Vec<_>>()
                )),
                Output::Text => rows.iter().for_each(|row| match row {
                    Ok(entry) => outln!("{}", entry_line(entry)),
                    Err(key) => outln!("{key}  (purged since)"),
                }),
            }
        }
        KeyCommand::Fork {
            scope,
            to_scope,
            to_scope_type,
            as_of: point,
        } => {
            let (scope_type, scope) = scope.proto();
            let done = memory
                .fork_scope(proto::ForkScopeRequest {
                    source_scope_type: scope_type,
                    source_scope: scope,
                    target_scope_type: to_scope_type.map_or(scope_type, |t| t.to_proto() as i32),
                    target_scope: to_scope.clone(),
                    as_of: point,
                })
                .await?
                .into_inner();
            match output {
                Output::Json => print_json(&json!({
                    "keys_copied": done.keys_copied,
                    "revision": done.revision,
                    "audit_key": done.audit_key,
                })),
                Output::Text => outln!(
                    "copied {} into {to_scope} (source read at revision {})",
                    plural(done.keys_copied, "key", "keys"),
                    done.revision
                ),
            }
        }
        KeyCommand::Get {
            key,
            scope,
            version,
            as_of: point,
        } => {
            let (scope_type, scope) = scope.proto();
            let entry = memory
                .get(proto::GetRequest {
                    scope_type,
                    scope,
                    key,
                    version: version.unwrap_or(0),
                    as_of: point,
                })
                .await?
                .into_inner()
                .entry
                .unwrap_or_default();
            match output {
                Output::Json => print_json(&entry_json(&entry)),
                Output::Text => outln!(
                    "{}",
                    serde_json::to_string_pretty(&value_json(entry.value)).unwrap_or_default()
                ),
            }
        }
        KeyCommand::Set {
            key,
            value,
            scope,
            expected_version,
            request_id,
        } => {
            let (scope_type, scope) = scope.proto();
            let entry = memory
                .set(proto::SetRequest {
                    scope_type,
                    scope,
                    key,
                    value: Some(json_to_proto(&parse_value(&given_or_stdin(value, false)?))),
                    expected_version,
                    request_id: request_id.unwrap_or_default(),
                })
                .await?
                .into_inner()
                .entry
                .unwrap_or_default();
            match output {
                Output::Json => print_json(&entry_json(&entry)),
                Output::Text => outln!("{} v{}", entry.key, entry.version),
            }
        }
        KeyCommand::Delete {
            key,
            scope,
            expected_version,
            request_id,
        } => {
            let (scope_type, scope) = scope.proto();
            let entry = memory
                .delete(proto::DeleteRequest {
                    scope_type,
                    scope,
                    key,
                    expected_version,
                    request_id: request_id.unwrap_or_default(),
                })
                .await?
                .into_inner()
                .entry
                .unwrap_or_default();
            match output {
                Output::Json => print_json(&entry_json(&entry)),
                Output::Text => outln!("{} deleted (tombstone v{})", entry.key, entry.version),
            }
        }
        KeyCommand::Rollback {
            key,
            scope,
            to_version,
        } => {
            let (scope_type, scope) = scope.proto();
            let done = memory
                .rollback(proto::RollbackRequest {
                    scope_type,
                    scope,
                    key,
                    to_version,
                })
                .await?
                .into_inner();
            let entry = done.entry.unwrap_or_default();
            match output {
                Output::Json => print_json(&json!({
                    "entry": entry_json(&entry),
                    "audit_key": done.audit_key,
                })),
                Output::Text => outln!(
                    "{} v{} = v{to_version} (audit record {})",
                    entry.key,
                    entry.version,
                    done.audit_key
                ),
            }
        }
        KeyCommand::History {
            key,
            scope,
            from_version,
        } => {
            let (scope_type, scope) = scope.proto();
            let mut request = proto::HistoryRequest {
                scope_type,
                scope,
                key,
                from_version,
            };
            // Streamed as it arrives: JSON Lines in json mode, so a long
            // history never has to fit in memory. A broken stream is asked
            // again from the version after the last one printed.
            let mut resumes = Resumes::new(retries);
            loop {
                let read = async {
                    let mut stream = memory.history(request.clone()).await?.into_inner();
                    while let Some(item) = stream.message().await? {
                        let entry = item.entry.unwrap_or_default();
                        request.from_version = entry.version + 1;
                        resumes.progressed();
                        match output {
                            Output::Json => outln!("{}", entry_json(&entry)),
                            Output::Text => outln!("{}", entry_line(&entry)),
                        }
                    }
                    Ok::<_, Status>(())
                };
                match read.await {
                    Ok(()) => break,
                    Err(status) if resumes.again("History", &status).await => {}
                    Err(status) => return Err(status.into()),
                }
            }
        }
        KeyCommand::Watch {
            scope,
            prefix,
            from_revision,
            limit,
            no_reconnect,
        } => {
            let (scope_type, scope) = scope.proto();
            let follow = Follow {
                flag: "--from-revision",
                resume_key: "resume_revision",
                reconnect: !no_reconnect,
                limit,
            };
            follow
                .run(
                    from_revision,
                    |from_revision| {
                        let mut memory = memory.clone();
                        let request = proto::WatchRequest {
                            scope_type,
                            scope: scope.clone(),
                            key_prefix: prefix.clone(),
                            from_revision,
                        };
                        async move { memory.watch(request).await }
                    },
                    |change: &proto::WatchResponse| Some(change.revision),
                    |change| match output {
                        Output::Json => outln!("{}", change_json(change)),
                        Output::Text => outln!("{}", change_line(change)),
                    },
                )
                .await?;
        }
    }
    Ok(())
}

fn entry_line(entry: &proto::MemoryEntry) -> String {
    let value = if entry.deleted {
        "(deleted)".to_owned()
    } else {
        value_json(entry.value.clone()).to_string()
    };
    let by = if entry.execution_id.is_empty() {
        String::new()
    } else {
        format!("  by {}", entry.execution_id)
    };
    format!(
        "{}  v{}  {}{by}  {value}",
        entry.key,
        entry.version,
        time(entry.create_time.as_ref())
    )
}

fn change_kind_name(kind: i32) -> &'static str {
    match proto::ChangeKind::try_from(kind) {
        Ok(proto::ChangeKind::Set) => "set",
        Ok(proto::ChangeKind::Delete) => "delete",
        Ok(proto::ChangeKind::Purge) => "purge",
        Ok(proto::ChangeKind::Compact) => "compact",
        _ => "unknown",
    }
}

fn change_json(change: &proto::WatchResponse) -> serde_json::Value {
    json!({
        "revision": change.revision,
        "kind": change_kind_name(change.kind),
        "key": change.key,
        "version": change.version,
        "value": value_json(change.value.clone()),
        "versions_deleted": change.versions_deleted,
        "create_time": time(change.create_time.as_ref()),
    })
}

fn change_line(change: &proto::WatchResponse) -> String {
    let detail = match proto::ChangeKind::try_from(change.kind) {
        Ok(proto::ChangeKind::Purge) => format!(
            "{} purged",
            plural(change.versions_deleted, "version", "versions")
        ),
        Ok(proto::ChangeKind::Delete) => "(deleted)".to_owned(),
        _ => value_json(change.value.clone()).to_string(),
    };
    format!(
        "#{}  {:<7}  {}  v{}  {detail}",
        change.revision,
        change_kind_name(change.kind),
        change.key,
        change.version
    )
}

/// The key of a `List` row: an entry, or a key purged since.
fn row_key(row: &Result<proto::MemoryEntry, String>) -> &str {
    match row {
        Ok(entry) => &entry.key,
        Err(key) => key,
    }
}
