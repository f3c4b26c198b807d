//! The rules of scoped memory that sit between a request and the store:
//! refusing calls made inside a checkpoint, resolving the default scope,
//! stamping provenance, the value size limit, idempotency fingerprints and
//! pagination.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use futures::{Stream, TryStreamExt};

use super::audit::{AuditRecord, Operation};
use super::ports::{
    Compacted, Fence, Head, ListQuery, MemoryStore, Mutation, RequestStamp, ScopeFilter, Write,
    Written,
};
use super::types::{
    AsOf, Change, ChangeKind, Entry, Key, KeyPrefix, Provenance, Scope, ScopeName, ScopeSummary,
    ScopeType, Value,
};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::paging::{self, ListPage};
use crate::ports::{Feed, Feeds};

/// How many versions `History` reads from the store at a time: enough to
/// amortise the round trip, few enough that memory stays flat.
const HISTORY_BATCH: i64 = 500;

#[derive(Debug, Clone, Copy)]
pub struct MemoryLimits {
    /// The largest value accepted, in bytes of serialised JSON.
    pub max_value_bytes: usize,
}

/// What a request said about its scope; the caller context fills the gaps.
#[derive(Debug, Clone, Default)]
pub struct ScopeSelector {
    pub scope_type: Option<ScopeType>,
    pub scope: Option<ScopeName>,
}

impl ScopeSelector {
    pub fn explicit(scope: Scope) -> Self {
        ScopeSelector {
            scope_type: Some(scope.scope_type),
            scope: Some(scope.name),
        }
    }

    /// The scope a call addresses. With no scope named, a flow caller gets its
    /// `FLOW` scope (and an execution asking for `EXECUTION` gets its own).
    pub(super) fn resolve(self, ctx: &CallerContext) -> Result<Scope> {
        match (self.scope_type, self.scope) {
            (Some(scope_type), Some(name)) => Ok(Scope { scope_type, name }),
            (None, Some(_)) => Err(Error::invalid(
                Reason::InvalidArgument,
                "scope_type",
                "must be set when scope is given",
            )),
            (None | Some(ScopeType::Flow), None) => match &ctx.flow_name {
                Some(flow) => Ok(Scope {
                    scope_type: ScopeType::Flow,
                    name: flow.clone(),
                }),
                None => Err(scope_not_configured()),
            },
            (Some(ScopeType::Execution), None) => match &ctx.execution_id {
                Some(execution) => Ok(Scope {
                    scope_type: ScopeType::Execution,
                    name: execution.clone(),
                }),
                None => Err(scope_not_configured()),
            },
            (Some(ScopeType::Namespace), None) => Err(scope_not_configured()),
        }
    }
}

fn scope_not_configured() -> Error {
    Error::invalid(
        Reason::ScopeNotConfigured,
        "scope",
        "no scope given and no flow in the caller context (set scope and scope_type, \
         or the engram-flow-name metadata)",
    )
}

/// A write as the client asked for it.
#[derive(Debug, Clone)]
pub struct WriteRequest {
    pub selector: ScopeSelector,
    pub key: Key,
    pub expected_version: Option<i64>,
    pub request_id: Option<String>,
}

/// Where a `History` stream is: the key and the next version to read.
#[derive(Debug, Clone)]
pub struct HistoryCursor {
    pub scope: Scope,
    pub key: Key,
    pub next_version: i64,
}

/// How often an unconditional delete that lost a race to a set is retried.
const DELETE_RETRIES: usize = 5;

/// How many execution -> flow mappings a server keeps in memory.
const KNOWN_EXECUTIONS: usize = 100_000;

/// What this process knows of the execution registry: `(tenant, execution)`
/// to `(flow_id, flow_name)`. An execution never changes flow, so entries
/// never go stale; the map is only emptied when it grows too big.
type ExecutionCache = Arc<Mutex<HashMap<(String, String), (String, String)>>>;

/// Where a watch starts: the scope, the key prefix, the revision after
/// which changes are sent, and the settled horizon to follow.
#[derive(Debug)]
pub struct WatchStart {
    pub scope: Scope,
    pub prefix: KeyPrefix,
    pub after: i64,
    pub horizon: tokio::sync::watch::Receiver<i64>,
}

/// How many changes a watch reads from the store at a time.
pub const WATCH_BATCH: i64 = 500;

/// Scoped memory over a store.
#[derive(Debug, Clone)]
pub struct Memory<S> {
    store: S,
    limits: MemoryLimits,
    executions: ExecutionCache,
}

impl<S: MemoryStore + Feeds> Memory<S> {
    pub fn new(store: S, limits: MemoryLimits) -> Self {
        Memory {
            store,
            limits,
            executions: ExecutionCache::default(),
        }
    }

    pub fn limits(&self) -> MemoryLimits {
        self.limits
    }

    fn cached_flow(&self, ctx: &CallerContext, execution: &str) -> Option<(String, String)> {
        let key = (ctx.tenant.as_str().to_owned(), execution.to_owned());
        self.executions.lock().ok()?.get(&key).cloned()
    }

    fn cache_flow(&self, ctx: &CallerContext, execution: &str, flow: (String, String)) {
        if let Ok(mut cache) = self.executions.lock() {
            if cache.len() >= KNOWN_EXECUTIONS {
                cache.clear();
            }
            cache.insert((ctx.tenant.as_str().to_owned(), execution.to_owned()), flow);
        }
    }

    /// Learns execution -> flow from an in-flow caller (once per process
    /// per execution), so later detached writes into that execution and
    /// `Reindex` can be tagged with its flow.
    async fn learn_execution(&self, ctx: &CallerContext) -> Result<()> {
        let Some(execution) = &ctx.execution_id else {
            return Ok(());
        };
        if ctx.flow_id.is_none() && ctx.flow_name.is_none() {
            return Ok(());
        }
        let flow = (
            ctx.flow_id
                .as_ref()
                .map(|f| f.as_str().to_owned())
                .unwrap_or_default(),
            ctx.flow_name
                .as_ref()
                .map(|f| f.as_str().to_owned())
                .unwrap_or_default(),
        );
        if self.cached_flow(ctx, execution.as_str()).as_ref() == Some(&flow) {
            return Ok(());
        }
        self.store
            .register_execution(
                &ctx.tenant,
                execution.as_str(),
                &flow.0,
                &flow.1,
                Utc::now(),
            )
            .await?;
        self.cache_flow(ctx, execution.as_str(), flow);
        Ok(())
    }

    /// Who writes, and for execution scopes the flow discovery tags: from
    /// the caller context when an execution writes its own scope, else from
    /// the registry when the execution is known there.
    async fn provenance(&self, ctx: &CallerContext, scope: &Scope) -> Result<Provenance> {
        self.learn_execution(ctx).await?;
        let mut provenance = own_provenance(ctx, scope);
        if scope.scope_type == ScopeType::Execution
            && provenance.flow_id.is_empty()
            && provenance.flow_name.is_empty()
        {
            let execution = scope.name.as_str();
            let flow = match self.cached_flow(ctx, execution) {
                Some(flow) => Some(flow),
                None => {
                    let flow = self.store.execution_flow(&ctx.tenant, execution).await?;
                    if let Some(flow) = &flow {
                        self.cache_flow(ctx, execution, flow.clone());
                    }
                    flow
                }
            };
            if let Some((flow_id, flow_name)) = flow {
                provenance.flow_id = flow_id;
                provenance.flow_name = flow_name;
            }
        }
        Ok(provenance)
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub async fn set(
        &self,
        ctx: &CallerContext,
        request: WriteRequest,
        value: serde_json::Value,
    ) -> Result<Entry> {
        refuse_in_checkpoint(ctx)?;
        let value = Value::new(value, self.limits.max_value_bytes)?;
        self.write(ctx, request, Mutation::Set(&value)).await
    }

    pub async fn delete(&self, ctx: &CallerContext, request: WriteRequest) -> Result<Entry> {
        refuse_in_checkpoint(ctx)?;
        self.write(ctx, request, Mutation::Delete).await
    }

    async fn write(
        &self,
        ctx: &CallerContext,
        request: WriteRequest,
        mutation: Mutation<'_>,
    ) -> Result<Entry> {
        let scope = request.selector.resolve(ctx)?;
        refuse_reserved(&request.key)?;
        let provenance = self.provenance(ctx, &scope).await?;
        let fingerprint = request
            .request_id
            .as_ref()
            .map(|_| fingerprint(&scope, &request.key, &mutation, request.expected_version));
        let write = Write {
            scope: &scope,
            key: &request.key,
            mutation,
            expected_version: request.expected_version,
            request: request
                .request_id
                .as_deref()
                .zip(fingerprint)
                .map(|(id, fingerprint)| RequestStamp { id, fingerprint }),
            provenance: &provenance,
            now: now_micros(),
            change: match mutation {
                Mutation::Set(_) => ChangeKind::Set,
                Mutation::Delete => ChangeKind::Delete,
            },
        };
        // An unconditional delete is refused only when the key has no live
        // value; on Postgres a set may revive the key between the refusal
        // and the read of its head, and then the delete is simply retried
        // (it comes after that set). Each retry needs a racing writer to
        // win again, so a few always settle it.
        let mut written = self.store.write(&ctx.tenant, &write).await?;
        for _ in 0..DELETE_RETRIES {
            match &written {
                Written::Refused(Some(head))
                    if !head.deleted && write.expected_version.is_none() =>
                {
                    written = self.store.write(&ctx.tenant, &write).await?;
                }
                _ => break,
            }
        }
        match written {
            Written::Stored(entry) => Ok(entry),
            Written::Refused(head) => Err(write_refused(&write, head)),
            Written::Replayed {
                fingerprint,
                version,
                entry,
            } => {
                if write
                    .request
                    .map(|stamp| stamp.fingerprint[..] == fingerprint[..])
                    != Some(true)
                {
                    return Err(crate::error::request_id_reused(
                        write.request.map_or("", |stamp| stamp.id),
                    ));
                }
                // The version it wrote may have been purged since: the
                // write happened, but its result cannot be returned.
                entry.ok_or_else(|| {
                    let id = write.request.map_or("", |stamp| stamp.id);
                    replayed_version_purged(&request.key, version, id)
                })
            }
        }
    }

    /// Writes a new version of `key` holding the value of `to_version`,
    /// fenced on the key's newest version (a write in between aborts it)
    /// and recorded in the scope's audit trail in the same transaction.
    pub async fn rollback(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        key: &Key,
        to_version: i64,
    ) -> Result<(Entry, AuditRecord)> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        refuse_reserved(key)?;
        if to_version < 1 {
            return Err(Error::invalid(
                Reason::InvalidVersion,
                "to_version",
                format!("must be a version (1 or more), got {to_version}"),
            ));
        }
        let head = self
            .store
            .head(&ctx.tenant, &scope, key)
            .await?
            .ok_or_else(|| key_not_found_error(key))?;
        if to_version >= head.version {
            return Err(Error::invalid(
                Reason::InvalidVersion,
                "to_version",
                format!(
                    "must be older than the newest version {}, got {to_version}",
                    head.version
                ),
            ));
        }
        let old = self
            .store
            .get(&ctx.tenant, &scope, key, Some(to_version))
            .await?
            .ok_or_else(|| version_not_found(key, to_version))?;
        let Some(value) = old.value else {
            return Err(Error::invalid(
                Reason::RollbackToTombstone,
                "to_version",
                format!("version {to_version} is a tombstone; use Delete to delete the key"),
            ));
        };
        let provenance = self.provenance(ctx, &scope).await?;
        let now = now_micros();
        let mut record = AuditRecord::new(Operation::Rollback, &scope, now);
        record.source_keys = vec![key.as_str().to_owned()];
        record.source_versions = vec![to_version];
        record.target_key = key.as_str().to_owned();
        let write = Write {
            scope: &scope,
            key,
            mutation: Mutation::Set(&value),
            expected_version: None,
            request: None,
            provenance: &provenance,
            now,
            change: ChangeKind::Set,
        };
        let fence = Fence {
            key,
            version: head.version,
        };
        match self
            .store
            .compact(&ctx.tenant, &[fence], &write, record)
            .await?
        {
            Compacted::Written(written) => Ok(*written),
            Compacted::SourceChanged { now, .. } => Err(Error::Conflict {
                reason: Reason::SourceChanged,
                message: format!(
                    "{:?} was written while it was being rolled back (read at version {}, now {}); nothing was written",
                    key.as_str(),
                    head.version,
                    now.map_or_else(|| "purged".to_owned(), |n| n.to_string()),
                ),
            }),
        }
    }

    pub async fn get(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        key: &Key,
        version: Option<i64>,
    ) -> Result<Entry> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        read_entry(&self.store, &ctx.tenant, &scope, key, version).await
    }

    pub async fn list(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        prefix: &KeyPrefix,
        include_reserved: bool,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Entry>> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&[
            "list",
            scope.scope_type.as_str(),
            scope.name.as_str(),
            prefix.as_str(),
            if include_reserved { "reserved" } else { "" },
        ]);
        let after: Option<String> = paging::decode_token(&query, page_token)?;
        let mut items = self
            .store
            .list(
                &ctx.tenant,
                &ListQuery {
                    scope: &scope,
                    prefix,
                    after: after.as_deref(),
                    limit: limit + 1,
                    include_reserved,
                    descending: false,
                },
            )
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, last.key.as_str())
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    /// Checks that the key exists and returns where its history starts.
    pub async fn history(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        key: Key,
        from_version: i64,
    ) -> Result<HistoryCursor> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        if self.store.head(&ctx.tenant, &scope, &key).await?.is_none() {
            return Err(key_not_found_error(&key));
        }
        Ok(HistoryCursor {
            scope,
            key,
            next_version: from_version.max(1),
        })
    }

    /// Streams a key's versions from the cursor on, oldest first, reading
    /// the store a batch at a time so memory stays flat however long the
    /// history is. The stream only reads ahead as fast as it is consumed.
    pub fn history_stream(
        &self,
        ctx: &CallerContext,
        cursor: HistoryCursor,
    ) -> impl Stream<Item = Result<Entry>> + Send + 'static {
        let store = self.store.clone();
        let tenant = ctx.tenant.clone();
        futures::stream::try_unfold(Some(cursor), move |cursor| {
            let store = store.clone();
            let tenant = tenant.clone();
            async move {
                let Some(mut cursor) = cursor else {
                    return Ok::<_, Error>(None);
                };
                let batch = store
                    .history(
                        &tenant,
                        &cursor.scope,
                        &cursor.key,
                        cursor.next_version,
                        HISTORY_BATCH,
                    )
                    .await?;
                // A batch ends at HISTORY_BATCH versions or at about 2 MiB
                // of them, whichever comes first.
                let more = paging::more(&batch, HISTORY_BATCH);
                let Some(last) = batch.last() else {
                    return Ok(None);
                };
                cursor.next_version = last.version + 1;
                let next = more.then_some(cursor);
                Ok(Some((
                    futures::stream::iter(batch.into_iter().map(Ok)),
                    next,
                )))
            }
        })
        .try_flatten()
    }

    /// Opens a change feed: checks the scope and the revision to resume
    /// from (it must still be retained), or starts at the current horizon.
    pub async fn watch(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        prefix: KeyPrefix,
        from_revision: Option<i64>,
    ) -> Result<WatchStart> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        let horizon = self.store.horizon(Feed::Changes).await?;
        let after = match from_revision {
            None => *horizon.borrow(),
            Some(revision) => {
                if let Some(pruned) = self.store.pruned_through().await?
                    && revision < pruned
                {
                    return Err(revision_pruned(revision, pruned));
                }
                revision
            }
        };
        Ok(WatchStart {
            scope,
            prefix,
            after,
            horizon,
        })
    }

    /// Changes of a watched scope after `after`, up to the settled `up_to`.
    pub async fn changes(
        &self,
        ctx: &CallerContext,
        start: &WatchStart,
        after: i64,
        up_to: i64,
    ) -> Result<Vec<Change>> {
        let page = self
            .store
            .changes(
                &ctx.tenant,
                &start.scope,
                &start.prefix,
                after,
                up_to,
                WATCH_BATCH,
            )
            .await?;
        // A stream that fell behind the feed's retention while it ran (or
        // that resumed just as pruning began) may have lost changes: say
        // so rather than skip them.
        match page.pruned_through {
            Some(pruned) if after < pruned => Err(revision_pruned(after, pruned)),
            _ => Ok(page.changes),
        }
    }

    pub async fn list_scopes(
        &self,
        ctx: &CallerContext,
        mut filter: ScopeFilter<'_>,
        as_of: Option<AsOf>,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<ScopeSummary>> {
        refuse_in_checkpoint(ctx)?;
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&[
            "scopes",
            filter.scope_type.map_or("", ScopeType::as_str),
            filter.flow_id.unwrap_or(""),
            filter.flow_name.unwrap_or(""),
            &as_of.map(|at| at.to_string()).unwrap_or_default(),
        ]);
        filter.at = match as_of {
            Some(as_of) => Some(self.point(as_of).await?),
            None => None,
        };
        let after: Option<(i16, String)> = paging::decode_token(&query, page_token)?;
        let after = after
            .map(|(scope_type, name)| {
                let scope_type = ScopeType::from_i32(scope_type.into());
                let name = ScopeName::parse("page_token", name).ok();
                scope_type
                    .zip(name)
                    .map(|(scope_type, name)| Scope { scope_type, name })
            })
            .map(|scope| {
                scope.ok_or_else(|| {
                    Error::invalid(
                        Reason::InvalidPageToken,
                        "page_token",
                        "is not a token this server issued",
                    )
                })
            })
            .transpose()?;
        let mut items = self
            .store
            .list_scopes(&ctx.tenant, filter, after.as_ref(), limit + 1)
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(
                &query,
                (last.scope.scope_type.as_i16(), last.scope.name.as_str()),
            )
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }
}

/// A key's newest version (or a given one) as `Get` answers it: a
/// tombstone is `NOT_FOUND` (`KEY_DELETED`), and a missing version says
/// whether the key exists at all.
pub(crate) async fn read_entry<S: MemoryStore>(
    store: &S,
    tenant: &crate::context::Tenant,
    scope: &Scope,
    key: &Key,
    version: Option<i64>,
) -> Result<Entry> {
    match store.get(tenant, scope, key, version).await? {
        Some(entry) if entry.deleted => Err(key_deleted(key, entry.version)),
        Some(entry) => Ok(entry),
        None => match version {
            Some(version) if store.head(tenant, scope, key).await?.is_some() => {
                Err(version_not_found(key, version))
            }
            _ => Err(key_not_found_error(key)),
        },
    }
}

/// Writes never name the audit trail's keys directly.
fn refuse_reserved(key: &Key) -> Result<()> {
    if key.is_reserved() {
        return Err(Error::invalid(
            Reason::ReservedKey,
            "key",
            format!(
                "keys under {:?} are reserved for the audit trail",
                super::RESERVED_PREFIX
            ),
        ));
    }
    Ok(())
}

pub(crate) fn key_not_found_error(key: &Key) -> Error {
    Error::NotFound {
        reason: Reason::KeyNotFound,
        message: format!("key {:?} not found", key.as_str()),
        metadata: vec![("key", key.as_str().to_owned())],
    }
}

/// `NOT_FOUND` about one version of a key.
fn version_error(reason: Reason, key: &Key, version: i64, what: &str) -> Error {
    Error::NotFound {
        reason,
        message: format!("key {:?} {what} {version}", key.as_str()),
        metadata: vec![
            ("key", key.as_str().to_owned()),
            ("version", version.to_string()),
        ],
    }
}

pub(crate) fn key_deleted(key: &Key, version: i64) -> Error {
    version_error(Reason::KeyDeleted, key, version, "was deleted at version")
}

pub(super) fn version_not_found(key: &Key, version: i64) -> Error {
    version_error(Reason::VersionNotFound, key, version, "has no version")
}

/// A retry whose first request wrote `version`, purged since.
fn replayed_version_purged(key: &Key, version: i64, request_id: &str) -> Error {
    Error::NotFound {
        reason: Reason::VersionPurged,
        message: format!(
            "request_id {request_id:?} already wrote version {version} of key {:?}, \
             which has been purged since; nothing was written",
            key.as_str()
        ),
        metadata: vec![
            ("key", key.as_str().to_owned()),
            ("version", version.to_string()),
        ],
    }
}

/// Why a conditional write changed nothing, told from the key's head.
fn write_refused(write: &Write<'_>, head: Option<Head>) -> Error {
    let live = head.filter(|head| !head.deleted);
    match (write.mutation, write.expected_version) {
        (Mutation::Delete, _) if live.is_none() => match head {
            Some(head) => key_deleted(write.key, head.version),
            None => key_not_found_error(write.key),
        },
        (_, Some(expected)) => Error::VersionMismatch {
            expected,
            current: live.map_or(0, |head| head.version),
        },
        // A delete that kept losing races to sets (see `write`).
        (Mutation::Delete, None) => Error::Conflict {
            reason: Reason::SourceChanged,
            message: format!(
                "{:?} kept being written while it was being deleted; nothing was deleted, retry",
                write.key.as_str()
            ),
        },
        // An unconditional set always writes; reaching here means the head
        // changed under us in a way the statement did not expect.
        (Mutation::Set(_), None) => {
            Error::internal("conditional write refused without a condition")
        }
    }
}

/// Memory inside a checkpoint is refused: a cached or replayed checkpoint
/// skips its body, so a read would go stale and a write would be lost.
pub(crate) fn refuse_in_checkpoint(ctx: &CallerContext) -> Result<()> {
    match &ctx.checkpoint_id {
        Some(checkpoint) => Err(Error::FailedPrecondition {
            reason: Reason::MemoryInCheckpoint,
            message: format!(
                "memory calls are not allowed inside a checkpoint ({checkpoint}): a cached or \
                 replayed checkpoint would skip them; read or write memory in the flow body and \
                 pass the values in"
            ),
        }),
        None => Ok(()),
    }
}

/// The execution that writes, and the flow discovery tags when an execution
/// writes into its own execution scope (for any other execution scope they
/// come from the registry).
fn own_provenance(ctx: &CallerContext, scope: &Scope) -> Provenance {
    let execution_id = ctx
        .execution_id
        .as_ref()
        .map(ScopeName::as_str)
        .unwrap_or_default();
    let own_execution =
        scope.scope_type == ScopeType::Execution && scope.name.as_str() == execution_id;
    let tag = |name: &Option<ScopeName>| match name {
        Some(name) if own_execution => name.as_str().to_owned(),
        _ => String::new(),
    };
    Provenance {
        execution_id: execution_id.to_owned(),
        flow_id: tag(&ctx.flow_id),
        flow_name: tag(&ctx.flow_name),
    }
}

/// What a request asked for, so a reused `request_id` can be told apart from
/// a retry of the same request.
fn fingerprint(
    scope: &Scope,
    key: &Key,
    mutation: &Mutation<'_>,
    expected: Option<i64>,
) -> [u8; 32] {
    let (op, value) = match mutation {
        Mutation::Set(value) => ("set", value.encoded()),
        Mutation::Delete => ("delete", ""),
    };
    let expected = expected.map_or_else(|| "-".to_owned(), |v| v.to_string());
    crate::error::fingerprint(&[
        op,
        scope.scope_type.as_str(),
        scope.name.as_str(),
        key.as_str(),
        &expected,
        value,
    ])
}

/// The current time at the precision the stores keep (microseconds), so a
/// write's response says exactly what a later read will.
pub(crate) fn now_micros() -> chrono::DateTime<Utc> {
    let now = Utc::now();
    chrono::DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

/// A watch after `revision` cannot be served whole: changes up to `pruned`
/// are gone.
fn revision_pruned(revision: i64, pruned: i64) -> Error {
    let oldest = pruned + 1;
    Error::OutOfRange {
        reason: Reason::RevisionPruned,
        message: format!(
            "revision {revision} is older than the retained change feed (oldest {oldest}); \
             re-read the scope with List, then watch from now"
        ),
    }
}
