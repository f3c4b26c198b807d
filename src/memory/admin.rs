//! Memory maintenance: purge, compaction, the audit trail and reindexing.
//! Every operation that changes data writes its audit record in the same
//! transaction, so the trail has no gaps.

use std::sync::Arc;

use super::audit::{AuditRecord, Operation, SourceMode};
use super::ports::{
    Compacted, Fence, ListQuery, MemoryStore, Mutation, Purge, PurgeOutcome, ReindexOutcome, Write,
};
use super::service::{key_deleted, now_micros, read_entry, refuse_in_checkpoint};
use super::types::{ChangeKind, Entry, Key, KeyPrefix, Provenance, RESERVED_PREFIX, Scope, Value};
use super::{ListPage, MemoryLimits};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::paging;
use crate::summarizer::{Source, Summarizer, SummaryRequest};

/// The summary budget when the request names none.
pub const DEFAULT_MAX_TOKENS: u32 = 512;
/// The most keys one compaction may read.
pub const MAX_COMPACT_KEYS: usize = 100;
/// The most versions a HISTORY compaction reads; purge first beyond that.
pub const MAX_HISTORY_VERSIONS: usize = 10_000;
/// About the most a compaction reads of its sources, weighed as an answer
/// carries them: the summarizer is sent them in one request (more than a
/// model's context holds anyway) and `CompactResponse` carries them back
/// in one message.
pub const MAX_SOURCE_BYTES: usize = paging::PAGE_BYTES;

/// What a compaction reads.
#[derive(Debug, Clone)]
pub enum Sources {
    /// One key: its current value, or with `history` every non-deleted version.
    One { key: Key, history: bool },
    /// Several keys' current values.
    Many(Vec<Key>),
}

#[derive(Debug, Clone)]
pub struct CompactCommand {
    pub scope: Scope,
    pub sources: Sources,
    pub target_key: Option<Key>,
    pub instruction: String,
    pub model: String,
    pub max_tokens: u32,
}

#[derive(Debug, Clone)]
pub struct Compaction {
    pub entry: Entry,
    pub sources: Vec<Entry>,
    pub record: AuditRecord,
}

/// A compaction whose source moved while it was being summarised.
fn source_changed(key: &Key, read: i64, now: Option<i64>) -> Error {
    Error::Conflict {
        reason: Reason::SourceChanged,
        message: match now {
            Some(now) => format!(
                "{:?} changed while it was being summarised (read at version {read}, now {now}); nothing was written, compact again",
                key.as_str()
            ),
            None => format!(
                "{:?} was purged while it was being summarised; nothing was written",
                key.as_str()
            ),
        },
    }
}

/// An issue Reindex found, for humans.
pub fn describe_unknown(scope: &str, versions: i64) -> String {
    format!(
        "execution scope {scope}: {versions} versions without flow tags, and its execution's flow is unknown"
    )
}

pub struct MemoryAdmin<S> {
    store: S,
    limits: MemoryLimits,
    summarizer: Arc<dyn Summarizer>,
}

impl<S: MemoryStore> MemoryAdmin<S> {
    pub fn new(store: S, limits: MemoryLimits, summarizer: Arc<dyn Summarizer>) -> Self {
        MemoryAdmin {
            store,
            limits,
            summarizer,
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub async fn purge(
        &self,
        ctx: &CallerContext,
        scope: &Scope,
        key: &Key,
        keep: Option<i64>,
        dry_run: bool,
    ) -> Result<PurgeOutcome> {
        refuse_in_checkpoint(ctx)?;
        if key.is_reserved() {
            return Err(Error::invalid(
                Reason::ReservedKey,
                "key",
                "the audit trail under \"_compaction/\" cannot be purged",
            ));
        }
        let purge = Purge::keeping(scope, Some(key), keep, true, dry_run);
        let record = AuditRecord::new(Operation::Purge, scope, now_micros());
        self.store.purge(&ctx.tenant, &purge, record).await
    }

    pub async fn purge_scope(
        &self,
        ctx: &CallerContext,
        scope: &Scope,
        keep: Option<i64>,
        include_deleted: bool,
        dry_run: bool,
    ) -> Result<PurgeOutcome> {
        refuse_in_checkpoint(ctx)?;
        let purge = Purge::keeping(scope, None, keep, include_deleted, dry_run);
        let record = AuditRecord::new(Operation::Purge, scope, now_micros());
        self.store.purge(&ctx.tenant, &purge, record).await
    }

    /// Reads the sources, asks the summarizer (outside any transaction: it
    /// may be slow), then writes the summary and the audit record only if
    /// no source changed meanwhile.
    pub async fn compact(
        &self,
        ctx: &CallerContext,
        command: CompactCommand,
    ) -> Result<Compaction> {
        refuse_in_checkpoint(ctx)?;
        let scope = &command.scope;
        let (target, source_mode) = match &command.sources {
            Sources::One { key, history } => (
                command.target_key.clone().unwrap_or_else(|| key.clone()),
                if *history {
                    SourceMode::History
                } else {
                    SourceMode::Current
                },
            ),
            Sources::Many(_) => (
                command.target_key.clone().ok_or_else(|| {
                    Error::invalid(
                        Reason::InvalidArgument,
                        "target_key",
                        "is required when compacting several keys",
                    )
                })?,
                SourceMode::Current,
            ),
        };
        if target.is_reserved() {
            return Err(Error::invalid(
                Reason::ReservedKey,
                "target_key",
                format!("keys under {RESERVED_PREFIX:?} are reserved for the audit trail"),
            ));
        }

        let mut sources = Vec::new();
        let mut fences = Vec::new();
        // What the sources weigh so far; one alone is never refused (a
        // value is within the message limit by itself).
        let mut weight = 0;
        match &command.sources {
            Sources::One { key, history: true } => {
                let head = self
                    .store
                    .head(&ctx.tenant, scope, key)
                    .await?
                    .ok_or_else(|| super::key_not_found_error(key))?;
                // All the versions a compaction may take in one read,
                // which is one statement unless the stored values pass a
                // page's bytes (near the sources' own bound of about a
                // page): in reads of 500, a purge committed between two of
                // them left the sources with a gap.
                let limit = MAX_HISTORY_VERSIONS as i64 + 1;
                let mut next = 1;
                loop {
                    let batch = self
                        .store
                        .history(&ctx.tenant, scope, key, next, limit)
                        .await?;
                    let Some(last) = batch.last() else { break };
                    next = last.version + 1;
                    let full = batch.len() as i64 == limit;
                    for entry in batch {
                        if !entry.deleted && entry.version <= head.version {
                            weight = within_bounds(weight, &entry)?;
                            sources.push(entry);
                        }
                    }
                    if sources.len() > MAX_HISTORY_VERSIONS {
                        return Err(Error::FailedPrecondition {
                            reason: Reason::SourcesTooLarge,
                            message: format!(
                                "{key} has more than {MAX_HISTORY_VERSIONS} versions to summarise; purge old versions first"
                            ),
                        });
                    }
                    if !full || next > head.version {
                        break;
                    }
                }
                if sources.is_empty() {
                    return Err(key_deleted(key, head.version));
                }
                fences.push((key.clone(), head.version));
            }
            Sources::One {
                key,
                history: false,
            } => {
                let entry = read_entry(&self.store, &ctx.tenant, scope, key, None).await?;
                fences.push((key.clone(), entry.version));
                sources.push(entry);
            }
            Sources::Many(keys) => {
                for key in keys {
                    let entry = read_entry(&self.store, &ctx.tenant, scope, key, None).await?;
                    weight = within_bounds(weight, &entry)?;
                    fences.push((key.clone(), entry.version));
                    sources.push(entry);
                }
            }
        }

        let request = SummaryRequest {
            sources: sources
                .iter()
                .map(|entry| Source {
                    key: entry.key.as_str().to_owned(),
                    version: entry.version,
                    text: entry.value.as_ref().map(text_of).unwrap_or_default(),
                })
                .collect(),
            instruction: command.instruction.clone(),
            model: command.model.clone(),
            max_tokens: if command.max_tokens == 0 {
                DEFAULT_MAX_TOKENS
            } else {
                command.max_tokens
            },
        };
        let summary = self.summarizer.summarize(request).await.map_err(|err| {
            Error::DependencyUnavailable {
                reason: Reason::SummarizerUnavailable,
                message: format!("the summarizer failed, nothing was written: {err}"),
            }
        })?;

        let now = now_micros();
        let mut record = AuditRecord::new(Operation::Compact, scope, now);
        record.source_keys = match &command.sources {
            Sources::One { key, .. } => vec![key.as_str().to_owned()],
            Sources::Many(keys) => keys.iter().map(|k| k.as_str().to_owned()).collect(),
        };
        record.source_versions = sources.iter().map(|e| e.version).collect();
        record.target_key = target.as_str().to_owned();
        record.instruction = command.instruction;
        record.model = summary.model;
        record.source_mode = Some(source_mode);

        let value = Value::new(
            serde_json::Value::String(summary.text),
            self.limits.max_value_bytes,
        )?;
        let provenance = Provenance {
            execution_id: ctx
                .execution_id
                .as_ref()
                .map(|e| e.as_str().to_owned())
                .unwrap_or_default(),
            ..Provenance::default()
        };
        let write = Write {
            scope,
            key: &target,
            mutation: Mutation::Set(&value),
            expected_version: None,
            request: None,
            provenance: &provenance,
            now,
            change: ChangeKind::Compact,
        };
        let fences: Vec<Fence<'_>> = fences
            .iter()
            .map(|(key, version)| Fence {
                key,
                version: *version,
            })
            .collect();
        let (entry, record) = match self
            .store
            .compact(&ctx.tenant, &fences, &write, record)
            .await?
        {
            Compacted::Written(written) => *written,
            Compacted::SourceChanged { key, read, now } => {
                return Err(source_changed(&key, read, now));
            }
        };
        Ok(Compaction {
            entry,
            sources,
            record,
        })
    }

    /// The audit trail of a scope, newest first.
    pub async fn compaction_log(
        &self,
        ctx: &CallerContext,
        scope: &Scope,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<AuditRecord>> {
        refuse_in_checkpoint(ctx)?;
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&["log", scope.scope_type.as_str(), scope.name.as_str()]);
        let before: Option<String> = paging::decode_token(&query, page_token)?;
        let prefix = KeyPrefix::parse("key_prefix", RESERVED_PREFIX)?;
        let mut entries = self
            .store
            .list(
                &ctx.tenant,
                &ListQuery {
                    scope,
                    prefix: &prefix,
                    after: before.as_deref(),
                    limit: limit + 1,
                    include_reserved: true,
                    descending: true,
                },
            )
            .await?;
        let next_page_token = paging::next_token(&mut entries, limit, |last| {
            paging::encode_token(&query, last.key.as_str())
        });
        let items = entries
            .iter()
            .filter_map(|entry| {
                entry
                    .value
                    .as_ref()
                    .map(|value| AuditRecord::from_entry(&entry.key, value))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    pub async fn reindex(&self, ctx: &CallerContext, apply: bool) -> Result<ReindexOutcome> {
        refuse_in_checkpoint(ctx)?;
        self.store.reindex(&ctx.tenant, apply).await
    }
}

/// The sources' weight with `entry` added, or the refusal when that passes
/// [`MAX_SOURCE_BYTES`] (a first source alone never does).
fn within_bounds(weight: usize, entry: &Entry) -> Result<usize> {
    let total = weight + paging::Weigh::weight(entry);
    if weight > 0 && total > MAX_SOURCE_BYTES {
        return Err(Error::FailedPrecondition {
            reason: Reason::SourcesTooLarge,
            message: format!(
                "the sources hold more than {} MiB of values, more than one summary reads; \
                 compact fewer keys, or purge old versions first",
                MAX_SOURCE_BYTES >> 20
            ),
        });
    }
    Ok(total)
}

/// A source's text for the summarizer: a string as it is, any other value
/// as compact JSON with its keys in order. Not the text the store kept:
/// Postgres gives jsonb's (its own spacing and key order), so the same
/// value was summarised differently on the two stores.
fn text_of(value: &Value) -> String {
    match value.json() {
        serde_json::Value::String(text) => text.clone(),
        json => json.to_string(),
    }
}
