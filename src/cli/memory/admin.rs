//! `engram memory` commands that call `MemoryAdminService`: purges,
//! compaction, retention policies, the audit log and reindexing.

use serde_json::json;

use super::ScopeArgs;
use super::show::{entry_json, record_json, retention_json, scope_type_name};
use crate::cli::sessions::parse_age;
use crate::cli::{
    CliError, CliResult, Connection, Output, Progress, all_pages, plural, print_json, time,
    value_json,
};
use crate::proto;
use crate::proto::memory_admin_service_client::MemoryAdminServiceClient;

#[derive(Debug, clap::Subcommand)]
pub(super) enum AdminCommand {
    /// Hard-delete all but the newest --keep versions of a key (all without --keep)
    Purge {
        /// The key, e.g. preferences/editor
        key: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// How many of the newest versions to keep, tombstones included
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
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
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
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
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
        max_tokens: i32,
    },
    /// Declare how much history a scope keeps, applied by the server every
    /// --retention-interval (--dry-run previews; no rule removes the policy)
    Retention {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Keep the newest N versions of each key
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        keep: Option<i64>,
        /// Drop versions older than this (90s, 30m, 24h, 7d), except each key's newest
        #[arg(long, value_parser = parse_age)]
        max_age: Option<std::time::Duration>,
        /// Drop deleted keys entirely once their tombstone is this old
        #[arg(long, value_parser = parse_age)]
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
    /// Backfill flow tags on execution-scoped versions (a dry run unless --apply)
    Reindex {
        /// Write the missing tags (without it, only report them)
        #[arg(long)]
        apply: bool,
    },
}

pub(super) async fn run(channel: Connection, output: Output, command: AdminCommand) -> CliResult {
    let mut admin = MemoryAdminServiceClient::new(channel);
    match command {
        AdminCommand::Purge {
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
        AdminCommand::PurgeScope {
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
        AdminCommand::Compact {
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
        AdminCommand::Retention {
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
        AdminCommand::RetentionGet { scope } => {
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
        AdminCommand::RetentionApply { scope, dry_run } => {
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
        AdminCommand::Log { scope } => {
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
        AdminCommand::Reindex { apply } => {
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
