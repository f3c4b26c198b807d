//! `engram memory ...`: scoped memory and its maintenance from a shell.

use serde_json::json;

use super::follow::Follow;
use super::{
    CliError, CliResult, ClientArgs, Output, Progress, all_pages, connect, given_or_stdin,
    parse_value, plural, print_json, time, value_json,
};
use crate::api::convert::json_to_proto;
use crate::proto;
use crate::proto::memory_admin_service_client::MemoryAdminServiceClient;
use crate::proto::memory_service_client::MemoryServiceClient;

#[derive(Debug, clap::Args)]
pub struct MemoryCommand {
    #[command(flatten)]
    client: ClientArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ScopeTypeArg {
    Namespace,
    Flow,
    Execution,
}

impl ScopeTypeArg {
    pub(crate) fn to_proto(self) -> proto::ScopeType {
        match self {
            ScopeTypeArg::Namespace => proto::ScopeType::Namespace,
            ScopeTypeArg::Flow => proto::ScopeType::Flow,
            ScopeTypeArg::Execution => proto::ScopeType::Execution,
        }
    }
}

/// The typed scope a command works in.
#[derive(Debug, Clone, clap::Args)]
pub struct ScopeArgs {
    /// The scope, e.g. customer_profiles
    #[arg(long, env = "ENGRAM_SCOPE")]
    scope: String,

    /// The scope type
    #[arg(long, value_enum, env = "ENGRAM_SCOPE_TYPE", default_value_t = ScopeTypeArg::Namespace)]
    scope_type: ScopeTypeArg,
}

impl ScopeArgs {
    fn proto(&self) -> (i32, String) {
        (self.scope_type.to_proto() as i32, self.scope.clone())
    }
}

/// A point in the past: a revision of the change feed (as `memory watch`
/// prints them), an RFC 3339 time, or a duration ago (`90s`, `30m`, `2h`,
/// `7d`; a bare number is a revision), which becomes the time that long
/// before now.
pub(crate) fn as_of(flag: &str, text: Option<&str>) -> CliResult<Option<proto::AsOf>> {
    use proto::as_of::Point;
    let Some(text) = text else {
        return Ok(None);
    };
    if let Ok(revision) = text.parse::<i64>() {
        return Ok(Some(proto::AsOf {
            point: Some(Point::Revision(revision)),
        }));
    }
    let ago = text.starts_with(|c: char| c.is_ascii_digit())
        && text.ends_with(|c: char| c.is_ascii_alphabetic())
        && !text.contains(['-', ':']);
    let time = if ago {
        let age = super::sessions::parse_age(text)
            .map_err(|err| CliError::usage(format!("{flag}: {err}")))?;
        let then = chrono::TimeDelta::from_std(age)
            .ok()
            .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
            .ok_or_else(|| CliError::usage(format!("{flag}: {text} ago is before any time")))?;
        crate::api::convert::timestamp(then)
    } else {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| crate::api::convert::timestamp(t.to_utc()))
            .map_err(|err| {
                // Why the time was refused, only for what looks like one.
                let why = if text.starts_with(|c: char| c.is_ascii_digit()) {
                    format!(": {err}")
                } else {
                    String::new()
                };
                CliError::usage(format!(
                    "{flag}: {text:?} is not a revision (42), an RFC 3339 time \
                     (2026-11-23T12:00:00Z) or a duration ago (30m, 2h, 7d){why}"
                ))
            })?
    };
    Ok(Some(proto::AsOf {
        point: Some(Point::Time(time)),
    }))
}

#[derive(Debug, clap::Subcommand)]
enum Command {
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
        #[arg(long)]
        as_of: Option<String>,
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
        #[arg(long)]
        as_of: Option<String>,
    },
    /// Print a key's current value (or the value at --version or --as-of)
    Get {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Read this version instead of the newest
        #[arg(long, conflicts_with = "as_of")]
        version: Option<i64>,
        /// Read the value the key had then: a revision, an RFC 3339 time or a duration
        /// ago (30m, 2h, 7d)
        #[arg(long)]
        as_of: Option<String>,
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
        #[arg(long)]
        as_of: Option<String>,
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
        #[arg(long)]
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
        #[arg(long)]
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
        #[arg(long)]
        to_version: i64,
    },
    /// Print every version of a key, oldest first, tombstones included
    History {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Start at this version
        #[arg(long, default_value_t = 0)]
        from_version: i64,
    },
    /// Hard-delete all but the newest --keep versions of a key (all without --keep)
    Purge {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// How many of the newest versions to keep, tombstones included
        #[arg(long)]
        keep: Option<i64>,
        /// Report what would be deleted, delete nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Purge every key of a scope (audit records are never touched)
    PurgeScope {
        #[command(flatten)]
        scope: ScopeArgs,
        /// How many of each key's newest versions to keep, tombstones included
        #[arg(long)]
        keep: Option<i64>,
        /// Also purge keys whose newest version is a tombstone
        #[arg(long)]
        include_deleted: bool,
        /// Report what would be deleted, delete nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Summarise entries into a new version of a target key
    Compact {
        /// The key to summarise (or use --keys)
        key: Option<String>,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Several keys, comma-separated, summarised into --target
        #[arg(long, value_delimiter = ',')]
        keys: Vec<String>,
        /// Where the summary goes (defaults to KEY)
        #[arg(long)]
        target: Option<String>,
        /// Summarise the key's whole non-deleted history instead of its current value
        #[arg(long)]
        history: bool,
        /// An extra instruction for the summarizer, e.g. "keep only decisions"
        #[arg(long, default_value = "", hide_default_value = true)]
        instruction: String,
        /// The model to ask (default: the server's)
        #[arg(long, default_value = "", hide_default_value = true)]
        model: String,
        /// The most tokens the summary may take (0: the server's default)
        #[arg(long, default_value_t = 0)]
        max_tokens: i32,
    },
    /// Declare how much history a scope keeps, applied by the server every
    /// --retention-interval (--dry-run previews; no rule removes the policy)
    Retention {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Keep the newest N versions of each key
        #[arg(long)]
        keep: Option<i64>,
        /// Drop versions older than this (90s, 30m, 24h, 7d), except each key's newest
        #[arg(long, value_parser = super::sessions::parse_age)]
        max_age: Option<std::time::Duration>,
        /// Drop deleted keys entirely once their tombstone is this old
        #[arg(long, value_parser = super::sessions::parse_age)]
        tombstone_grace: Option<std::time::Duration>,
        /// Print what the policy would delete now; store nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a scope's retention policy and its last run
    RetentionGet {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Apply a scope's retention policy now
    RetentionApply {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Report what would be deleted, delete nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the maintenance audit trail of a scope, newest first
    Log {
        #[command(flatten)]
        scope: ScopeArgs,
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
        #[arg(long)]
        from_revision: Option<i64>,
        /// Stop after this many changes
        #[arg(long)]
        limit: Option<usize>,
        /// Stop when the stream breaks instead of reconnecting
        #[arg(long)]
        no_reconnect: bool,
    },
    /// Backfill flow tags on execution-scoped versions (a dry run unless --apply)
    Reindex {
        /// Write the missing tags (without it, only report them)
        #[arg(long)]
        apply: bool,
    },
}

pub(crate) fn scope_type_name(n: i32) -> &'static str {
    match proto::ScopeType::try_from(n) {
        Ok(proto::ScopeType::Namespace) => "namespace",
        Ok(proto::ScopeType::Flow) => "flow",
        Ok(proto::ScopeType::Execution) => "execution",
        _ => "unspecified",
    }
}

pub fn entry_json(entry: &proto::MemoryEntry) -> serde_json::Value {
    json!({
        "scope_type": scope_type_name(entry.scope_type),
        "scope": entry.scope,
        "key": entry.key,
        "version": entry.version,
        "value": if entry.deleted { serde_json::Value::Null } else { value_json(entry.value.clone()) },
        "deleted": entry.deleted,
        "execution_id": entry.execution_id,
        "flow_id": entry.flow_id,
        "flow_name": entry.flow_name,
        "create_time": time(entry.create_time.as_ref()),
    })
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

pub(crate) fn record_json(record: &proto::CompactionRecord) -> serde_json::Value {
    json!({
        "operation": record.operation,
        "scope_type": scope_type_name(record.scope_type),
        "scope": record.scope,
        "timestamp": time(record.create_time.as_ref()),
        "source_keys": record.source_keys,
        "source_versions": record.source_versions,
        "target_key": record.target_key,
        "target_version": record.target_version,
        "instruction": record.instruction,
        "model": record.model,
        "source_mode": match proto::SourceMode::try_from(record.source_mode) {
            Ok(proto::SourceMode::Current) => "current",
            Ok(proto::SourceMode::History) => "history",
            _ => "",
        },
        "keys_affected": record.keys_affected,
        "versions_deleted": record.versions_deleted,
        "keep": record.keep,
        "audit_key": record.audit_key,
        "source_scope_type": scope_type_name(record.source_scope_type),
        "source_scope": record.source_scope,
        "as_of_revision": record.as_of_revision,
        "as_of_time": record.as_of_time.as_ref().map(|t| time(Some(t))),
        "subject": record.subject,
        "counts": record.counts,
    })
}

fn record_line(record: &proto::CompactionRecord) -> String {
    let when = time(record.create_time.as_ref());
    match record.operation.as_str() {
        "rollback" => format!(
            "{when}  rollback {} v{} -> v{}",
            record.target_key,
            record.source_versions.first().copied().unwrap_or_default(),
            record.target_version
        ),
        "forget" => format!(
            "{when}  forget   {}  {}",
            record.subject,
            record
                .counts
                .iter()
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_iter()
                .map(|(kind, n)| format!("{kind}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        "fork" => format!(
            "{when}  fork     {} from {} {} at revision {}",
            plural(record.keys_affected, "key", "keys"),
            scope_type_name(record.source_scope_type),
            record.source_scope,
            record.as_of_revision
        ),
        "compact" => format!(
            "{when}  compact  {} -> {} v{}  ({})",
            record.source_keys.join(","),
            record.target_key,
            record.target_version,
            record.model
        ),
        "retention" => format!(
            "{when}  retention {} of {} (keep {})",
            plural(record.versions_deleted, "version", "versions"),
            plural(record.keys_affected, "key", "keys"),
            record
                .keep
                .map_or_else(|| "any".to_owned(), |k| k.to_string())
        ),
        _ => format!(
            "{when}  purge    {} of {} (keep {})",
            plural(record.versions_deleted, "version", "versions"),
            plural(record.keys_affected, "key", "keys"),
            record
                .keep
                .map_or_else(|| "none".to_owned(), |k| k.to_string())
        ),
    }
}

/// The key of a `List` row: an entry, or a key purged since.
fn row_key(row: &Result<proto::MemoryEntry, String>) -> &str {
    match row {
        Ok(entry) => &entry.key,
        Err(key) => key,
    }
}

fn proto_duration(
    flag: &str,
    d: Option<std::time::Duration>,
) -> CliResult<Option<prost_types::Duration>> {
    d.map(|d| {
        prost_types::Duration::try_from(d)
            .map_err(|_| CliError::usage(format!("{flag} is too large")))
    })
    .transpose()
}

pub(crate) fn retention_json(retention: &proto::Retention) -> serde_json::Value {
    let policy = retention.policy.unwrap_or_default();
    let seconds = |d: &Option<prost_types::Duration>| d.as_ref().map(|d| d.seconds);
    json!({
        "scope_type": scope_type_name(retention.scope_type),
        "scope": retention.scope,
        "keep_versions": policy.keep_versions,
        "max_age_seconds": seconds(&policy.max_age),
        "tombstone_grace_seconds": seconds(&policy.tombstone_grace),
        "next_run_time": time(retention.next_run_time.as_ref()),
        "last_run_time": retention.last_run_time.as_ref().map(|t| time(Some(t))),
        "last_versions_deleted": retention.last_versions_deleted,
    })
}

fn purge_report(
    output: Output,
    versions_deleted: i64,
    keys_affected: i64,
    dry_run: bool,
    record: Option<&proto::CompactionRecord>,
) {
    match output {
        Output::Json => print_json(&json!({
            "versions_deleted": versions_deleted,
            "keys_affected": keys_affected,
            "dry_run": dry_run,
            "record": record.map(record_json),
        })),
        Output::Text => {
            let verb = if dry_run { "would delete" } else { "deleted" };
            outln!(
                "{verb} {} of {}",
                plural(versions_deleted, "version", "versions"),
                plural(keys_affected, "key", "keys")
            );
        }
    }
}

impl MemoryCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        run(channel, output, self.command).await
    }
}

async fn run(channel: super::Connection, output: Output, command: Command) -> CliResult {
    let mut memory = MemoryServiceClient::new(channel.clone());
    let mut admin = MemoryAdminServiceClient::new(channel);
    match command {
        Command::Scopes {
            scope_type,
            flow,
            as_of: point,
        } => {
            let point = as_of("--as-of", point.as_deref())?;
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
        Command::List {
            scope,
            prefix,
            include_reserved,
            as_of: point,
        } => {
            let point = as_of("--as-of", point.as_deref())?;
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
        Command::Fork {
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
                    as_of: as_of("--as-of", point.as_deref())?,
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
        Command::Get {
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
                    as_of: as_of("--as-of", point.as_deref())?,
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
        Command::Set {
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
        Command::Delete {
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
        Command::Rollback {
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
        Command::History {
            key,
            scope,
            from_version,
        } => {
            let (scope_type, scope) = scope.proto();
            let mut stream = memory
                .history(proto::HistoryRequest {
                    scope_type,
                    scope,
                    key,
                    from_version,
                })
                .await?
                .into_inner();
            // Streamed as it arrives: JSON Lines in json mode, so a long
            // history never has to fit in memory.
            while let Some(item) = stream.message().await? {
                let entry = item.entry.unwrap_or_default();
                match output {
                    Output::Json => outln!("{}", entry_json(&entry)),
                    Output::Text => outln!("{}", entry_line(&entry)),
                }
            }
        }
        Command::Purge {
            key,
            scope,
            keep,
            dry_run,
        } => {
            let (scope_type, scope) = scope.proto();
            let progress = Progress::start("purging");
            let done = admin
                .purge(proto::PurgeRequest {
                    scope_type,
                    scope,
                    key,
                    keep,
                    dry_run,
                })
                .await?
                .into_inner();
            progress.finish();
            purge_report(
                output,
                done.versions_deleted,
                done.keys_affected,
                dry_run,
                done.record.as_ref(),
            );
        }
        Command::PurgeScope {
            scope,
            keep,
            include_deleted,
            dry_run,
        } => {
            let (scope_type, scope) = scope.proto();
            let progress = Progress::start("purging the scope");
            let done = admin
                .purge_scope(proto::PurgeScopeRequest {
                    scope_type,
                    scope,
                    keep,
                    include_deleted,
                    dry_run,
                })
                .await?
                .into_inner();
            progress.finish();
            purge_report(
                output,
                done.versions_deleted,
                done.keys_affected,
                dry_run,
                done.record.as_ref(),
            );
        }
        Command::Compact {
            key,
            scope,
            keys,
            target,
            history,
            instruction,
            model,
            max_tokens,
        } => {
            if key.is_some() != keys.is_empty() {
                return Err(CliError::usage("give either KEY or --keys"));
            }
            let (scope_type, scope) = scope.proto();
            let progress = Progress::start("summarising");
            let done = admin
                .compact(proto::CompactRequest {
                    scope_type,
                    scope,
                    key: key.unwrap_or_default(),
                    keys,
                    source_mode: if history {
                        proto::SourceMode::History
                    } else {
                        proto::SourceMode::Current
                    } as i32,
                    target_key: target.unwrap_or_default(),
                    instruction,
                    model,
                    max_tokens,
                })
                .await?
                .into_inner();
            progress.finish();
            let entry = done.entry.unwrap_or_default();
            match output {
                Output::Json => print_json(&json!({
                    "entry": entry_json(&entry),
                    "sources": done.sources.iter().map(entry_json).collect::<Vec<_>>(),
                    "record": done.record.as_ref().map(record_json),
                })),
                Output::Text => {
                    outln!(
                        "{} v{} ← {}",
                        entry.key,
                        entry.version,
                        plural(done.sources.len(), "source", "sources")
                    );
                    outln!("{}", value_json(entry.value).as_str().unwrap_or_default());
                }
            }
        }
        Command::Retention {
            scope,
            keep,
            max_age,
            tombstone_grace,
            dry_run,
        } => {
            let (scope_type, scope) = scope.proto();
            let done = admin
                .set_retention(proto::SetRetentionRequest {
                    scope_type,
                    scope,
                    policy: Some(proto::RetentionPolicy {
                        keep_versions: keep,
                        max_age: proto_duration("--max-age", max_age)?,
                        tombstone_grace: proto_duration("--tombstone-grace", tombstone_grace)?,
                    }),
                    dry_run,
                })
                .await?
                .into_inner();
            match (output, done.retention.as_ref()) {
                (Output::Json, retention) => print_json(&json!({
                    "retention": retention.map(retention_json),
                    "dry_run": dry_run,
                    "versions_to_delete": done.versions_to_delete,
                    "keys_to_affect": done.keys_to_affect,
                })),
                (Output::Text, _) if dry_run => outln!(
                    "would delete {} of {} now",
                    plural(done.versions_to_delete, "version", "versions"),
                    plural(done.keys_to_affect, "key", "keys")
                ),
                (Output::Text, Some(_)) => {
                    outln!("retention declared; it runs at once, then every interval")
                }
                (Output::Text, None) => outln!("retention removed"),
            }
        }
        Command::RetentionGet { scope } => {
            let (scope_type, scope) = scope.proto();
            let retention = admin
                .get_retention(proto::GetRetentionRequest { scope_type, scope })
                .await?
                .into_inner()
                .retention
                .unwrap_or_default();
            match output {
                Output::Json => print_json(&retention_json(&retention)),
                Output::Text => outln!(
                    "{}",
                    serde_json::to_string_pretty(&retention_json(&retention)).unwrap_or_default()
                ),
            }
        }
        Command::RetentionApply { scope, dry_run } => {
            let (scope_type, scope) = scope.proto();
            let done = admin
                .apply_retention(proto::ApplyRetentionRequest {
                    scope_type,
                    scope,
                    dry_run,
                })
                .await?
                .into_inner();
            purge_report(
                output,
                done.versions_deleted,
                done.keys_affected,
                dry_run,
                done.record.as_ref(),
            );
        }
        Command::Log { scope } => {
            let (scope_type, scope) = scope.proto();
            let records = all_pages(|page_token| {
                let mut admin = admin.clone();
                let request = proto::GetCompactionLogRequest {
                    scope_type,
                    scope: scope.clone(),
                    page_size: 1000,
                    page_token,
                };
                async move {
                    let page = admin.get_compaction_log(request).await?.into_inner();
                    Ok((page.records, page.next_page_token))
                }
            })
            .await?;
            match output {
                Output::Json => {
                    print_json(&json!(records.iter().map(record_json).collect::<Vec<_>>()))
                }
                Output::Text => records.iter().for_each(|r| outln!("{}", record_line(r))),
            }
        }
        Command::Watch {
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
        Command::Reindex { apply } => {
            let progress = Progress::start("reindexing");
            let done = admin
                .reindex(proto::ReindexRequest { apply })
                .await?
                .into_inner();
            progress.finish();
            match output {
                Output::Json => print_json(&json!({
                    "versions_scanned": done.versions_scanned,
                    "tags_added": done.tags_added,
                    "issues": done.issues,
                    "applied": done.applied,
                })),
                Output::Text => {
                    let verb = if done.applied {
                        "added"
                    } else {
                        "would add (dry run; --apply to write)"
                    };
                    outln!(
                        "scanned {} untagged versions; {verb} {} flow tags",
                        done.versions_scanned,
                        done.tags_added
                    );
                    done.issues
                        .iter()
                        .for_each(|issue| outln!("issue: {issue}"));
                }
            }
        }
    }
    Ok(())
}
