//! What scoped memory needs from persistence: the port `store/` implements
//! for each backend, and the types it speaks. The store answers in outcomes
//! (a refused write, a replayed request, a moved fence); the rules that turn
//! them into errors live in this module's service, not in the store.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::audit::{AuditRecord, MAX_RECORDED_KEYS};
use super::types::{
    ChangeKind, ChangePage, Entry, Key, KeyPrefix, Provenance, Scope, ScopeSummary,
};
use super::types::{ScopeType, Value};
use crate::context::Tenant;
use crate::error::Result;

/// What a write does to a key.
#[derive(Debug, Clone, Copy)]
pub enum Mutation<'a> {
    Set(&'a Value),
    Delete,
}

impl Mutation<'_> {
    /// The encoded JSON to store; `None` for a tombstone.
    pub fn value(&self) -> Option<&str> {
        match self {
            Mutation::Set(value) => Some(value.encoded()),
            Mutation::Delete => None,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(self, Mutation::Delete)
    }
}

/// Marks a write as idempotent: a repeat with the same id and fingerprint
/// returns the first result.
#[derive(Debug, Clone, Copy)]
pub struct RequestStamp<'a> {
    pub id: &'a str,
    pub fingerprint: [u8; 32],
}

/// One write of a key: a new version, or a tombstone.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    pub scope: &'a Scope,
    pub key: &'a Key,
    pub mutation: Mutation<'a>,
    /// Compare-and-set: the newest version must be this one; 0 means the key
    /// must have no live value.
    pub expected_version: Option<i64>,
    pub request: Option<RequestStamp<'a>>,
    pub provenance: &'a Provenance,
    pub now: DateTime<Utc>,
    /// How the change feed reports this write.
    pub change: ChangeKind,
}

impl<'a> Write<'a> {
    /// The unconditional write that stores an audit record.
    pub fn audit(
        scope: &'a Scope,
        key: &'a Key,
        value: &'a Value,
        provenance: &'a Provenance,
        now: DateTime<Utc>,
    ) -> Self {
        Write {
            scope,
            key,
            mutation: Mutation::Set(value),
            expected_version: None,
            request: None,
            provenance,
            now,
            change: ChangeKind::Set,
        }
    }

    /// The entry this write creates once the store has assigned `version`.
    pub fn entry(&self, version: i64) -> Entry {
        Entry {
            scope: self.scope.clone(),
            key: self.key.clone(),
            version,
            value: match self.mutation {
                Mutation::Set(value) => Some(value.clone()),
                Mutation::Delete => None,
            },
            deleted: self.mutation.is_delete(),
            provenance: self.provenance.clone(),
            create_time: self.now,
        }
    }
}

/// What became of a write.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// A new version (or tombstone) was stored.
    Stored(Entry),
    /// Its condition refused it (a compare-and-set that lost, a delete of a
    /// key with no live value): nothing was written. The key's head then.
    Refused(Option<Head>),
    /// Its request id was used before: nothing was written. The first
    /// request's fingerprint, and the version it wrote (`None` if that
    /// version has been purged since).
    Replayed {
        fingerprint: Vec<u8>,
        version: i64,
        entry: Option<Entry>,
    },
}

/// The newest version of a key and whether it is a tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub version: i64,
    pub deleted: bool,
}

#[derive(Debug, Clone)]
pub struct ListQuery<'a> {
    pub scope: &'a Scope,
    pub prefix: &'a KeyPrefix,
    /// Only keys after this one (the last key of the previous page).
    pub after: Option<&'a str>,
    pub limit: i64,
    pub include_reserved: bool,
    /// Newest key first (the audit trail); `after` then means "before".
    pub descending: bool,
}

/// Which scopes `list_scopes` returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScopeFilter<'a> {
    pub scope_type: Option<ScopeType>,
    /// Only execution scopes holding a version tagged with this flow id.
    pub flow_id: Option<&'a str>,
    /// Only execution scopes holding a version tagged with this flow name.
    pub flow_name: Option<&'a str>,
    /// Count what was live at this point instead of now.
    pub at: Option<Point>,
}

/// A point in the past as the store reads it: the versions written at or
/// before both bounds (the one a caller did not ask for is unbounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// A revision of the change feed.
    pub revision: i64,
    pub time: DateTime<Utc>,
}

/// A key as it was at a [`Point`].
#[derive(Debug, Clone, PartialEq)]
pub enum Past {
    /// The version current then (a tombstone when the key was deleted).
    Entry(Entry),
    /// The version current then has been purged since.
    Purged(Key),
}

impl crate::paging::Weigh for Past {
    fn weight(&self) -> usize {
        match self {
            Past::Entry(entry) => entry.weight(),
            Past::Purged(key) => key.as_str().len() + 16,
        }
    }
}

/// A copy of a scope's state at a point into a scope with no keys.
#[derive(Debug, Clone, Copy)]
pub struct Fork<'a> {
    pub source: &'a Scope,
    pub target: &'a Scope,
    pub at: Point,
    pub now: DateTime<Utc>,
}

/// What became of a fork.
#[derive(Debug, Clone, PartialEq)]
pub enum Forked {
    /// The live keys were copied as version 1 of the target's keys, and the
    /// audit record (with `keys_affected`) written in the target.
    Copied(Box<AuditRecord>),
    /// The target scope has keys: nothing was written.
    TargetNotEmpty,
    /// These keys (the first few) had values at the point that were purged
    /// since: nothing was written.
    Purged(Vec<String>),
    /// The source lost versions while being copied: nothing was written.
    SourceChanged,
}

/// A purge of one key, or of every key of a scope.
#[derive(Debug, Clone)]
pub struct Purge<'a> {
    pub scope: &'a Scope,
    /// One key, or every key of the scope (audit keys never).
    pub key: Option<&'a Key>,
    /// Delete all but this many newest versions of each key (0: every
    /// version); `None` turns this rule off. The rules add up: a version
    /// goes when any of them takes it.
    pub keep: Option<i64>,
    /// For `keep`: also keys whose newest version is a tombstone.
    pub include_deleted: bool,
    /// Delete versions written before this time, except each key's newest.
    pub older_than: Option<DateTime<Utc>>,
    /// Delete every version of keys whose newest version is a tombstone
    /// written before this time.
    pub tombstones_before: Option<DateTime<Utc>>,
    pub dry_run: bool,
}

impl<'a> Purge<'a> {
    /// `Purge`/`PurgeScope` as the admin API asks: keep the newest `keep`
    /// (all versions go without it).
    pub fn keeping(
        scope: &'a Scope,
        key: Option<&'a Key>,
        keep: Option<i64>,
        include_deleted: bool,
        dry_run: bool,
    ) -> Self {
        Purge {
            scope,
            key,
            keep: Some(keep.unwrap_or(0)),
            include_deleted,
            older_than: None,
            tombstones_before: None,
            dry_run,
        }
    }
}

/// What a purge deleted from one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purged {
    pub key: String,
    pub versions: i64,
    /// The newest version deleted.
    pub newest: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PurgeOutcome {
    pub versions_deleted: i64,
    pub keys_affected: i64,
    /// The audit record written, when anything was deleted for real.
    pub record: Option<AuditRecord>,
}

impl PurgeOutcome {
    /// Completes the purge's audit record from what it deleted per key; the
    /// record is kept only when something was deleted for real.
    pub fn new(purge: &Purge<'_>, deleted: &[Purged], mut record: AuditRecord) -> Self {
        let versions_deleted = deleted.iter().map(|p| p.versions).sum();
        let keys_affected = deleted.len() as i64;
        let wrote = !purge.dry_run && versions_deleted > 0;
        record.versions_deleted = versions_deleted;
        record.keys_affected = keys_affected;
        record.keep = purge.keep.filter(|&keep| keep > 0);
        record.source_keys = deleted
            .iter()
            .take(MAX_RECORDED_KEYS)
            .map(|p| p.key.clone())
            .collect();
        PurgeOutcome {
            versions_deleted,
            keys_affected,
            record: wrote.then_some(record),
        }
    }
}

/// A source of a compaction and the head version it had when it was read;
/// the summary is only written if every source still has that version.
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    pub key: &'a Key,
    pub version: i64,
}

/// What became of a compaction's write.
#[derive(Debug, Clone, PartialEq)]
pub enum Compacted {
    /// The summary and its audit record (with the target version).
    Written(Box<(Entry, AuditRecord)>),
    /// A source moved since it was read (`now`: its head version, `None`
    /// when it is gone): nothing was written.
    SourceChanged {
        key: Key,
        read: i64,
        now: Option<i64>,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReindexOutcome {
    pub versions_scanned: i64,
    pub tags_added: i64,
    /// Execution scopes whose flow is unknown, with their untagged versions.
    pub unknown: Vec<(String, i64)>,
}

/// How much history a scope keeps (`SetRetention`); each rule is off when
/// `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    pub keep_versions: Option<i64>,
    pub max_age: Option<chrono::Duration>,
    pub tombstone_grace: Option<chrono::Duration>,
}

impl RetentionPolicy {
    pub fn is_empty(&self) -> bool {
        *self == RetentionPolicy::default()
    }
}

/// A scope's retention policy with its schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Retention {
    pub scope: Scope,
    pub policy: RetentionPolicy,
    pub next_run_time: DateTime<Utc>,
    pub last_run_time: Option<DateTime<Utc>>,
    pub last_versions_deleted: i64,
}

/// The persistence of scoped memory. Every method is scoped to one tenant,
/// and every write is one short transaction.
pub trait MemoryStore: Clone + Send + Sync + 'static {
    /// Writes a new version of a key (or a tombstone). Versions are dense
    /// under concurrent writers.
    fn write(
        &self,
        tenant: &Tenant,
        write: &Write<'_>,
    ) -> impl Future<Output = Result<Written>> + Send;

    /// The newest version of a key, or a given one; tombstones included.
    fn get(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        version: Option<i64>,
    ) -> impl Future<Output = Result<Option<Entry>>> + Send;

    /// The newest version number of a key, if it has any version.
    fn head(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Head>>> + Send;

    /// Live entries of a scope in key order.
    fn list(
        &self,
        tenant: &Tenant,
        query: &ListQuery<'_>,
    ) -> impl Future<Output = Result<Vec<Entry>>> + Send;

    /// A key as it was at a point: the newest version written by then
    /// (tombstones included), or the fact that it was purged since.
    fn get_at(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        at: Point,
    ) -> impl Future<Output = Result<Option<Past>>> + Send;

    /// The keys of a scope that were live at a point, in key order (only
    /// ascending), with the keys whose value then was purged since.
    fn list_at(
        &self,
        tenant: &Tenant,
        query: &ListQuery<'_>,
        at: Point,
    ) -> impl Future<Output = Result<Vec<Past>>> + Send;

    /// Copies a scope's live keys at a point into an empty scope, with the
    /// audit record, in one transaction.
    fn fork(
        &self,
        tenant: &Tenant,
        fork: &Fork<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<Forked>> + Send;

    /// Up to `limit` versions of a key from `from_version` on, oldest first,
    /// only as far as a page carries (see [`crate::paging::filled`]).
    fn history(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        key: &Key,
        from_version: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Entry>>> + Send;

    /// Scopes ordered by type then name, after the given one.
    fn list_scopes(
        &self,
        tenant: &Tenant,
        filter: ScopeFilter<'_>,
        after: Option<&Scope>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ScopeSummary>>> + Send;

    /// Hard-deletes old versions (see [`Purge`]) and, unless it is a dry run
    /// or nothing was deleted, writes `record` (completed with the counts,
    /// see [`PurgeOutcome::new`]) in the same transaction.
    fn purge(
        &self,
        tenant: &Tenant,
        purge: &Purge<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<PurgeOutcome>> + Send;

    /// Writes a compaction summary and its audit record in one transaction,
    /// only if every fenced source still has the version it was read at.
    fn compact(
        &self,
        tenant: &Tenant,
        fences: &[Fence<'_>],
        write: &Write<'_>,
        record: AuditRecord,
    ) -> impl Future<Output = Result<Compacted>> + Send;

    /// Declares (`Some`) or removes (`None`) a scope's retention policy,
    /// first due at `next_run_time`.
    fn set_retention(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        policy: Option<RetentionPolicy>,
        next_run_time: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<Retention>>> + Send;

    /// A scope's retention policy.
    fn retention(
        &self,
        tenant: &Tenant,
        scope: &Scope,
    ) -> impl Future<Output = Result<Option<Retention>>> + Send;

    /// Every tenant's policies due by `now` (the server's own work).
    fn due_retentions(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<(Tenant, Retention)>>> + Send;

    /// Takes a due run: moves the policy's next run from `seen` to `next`,
    /// only if no other replica moved it first.
    fn claim_retention(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        seen: DateTime<Utc>,
        next: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Records a run of a scope's policy.
    fn retention_ran(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        at: DateTime<Utc>,
        versions_deleted: i64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Records which flow an execution belongs to (first one wins; blanks
    /// are filled in later).
    fn register_execution(
        &self,
        tenant: &Tenant,
        execution_id: &str,
        flow_id: &str,
        flow_name: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The `(flow_id, flow_name)` of a known execution.
    fn execution_flow(
        &self,
        tenant: &Tenant,
        execution_id: &str,
    ) -> impl Future<Output = Result<Option<(String, String)>>> + Send;

    /// Backfills missing flow tags of execution-scoped versions from the
    /// registry (or only counts them when `apply` is false).
    fn reindex(
        &self,
        tenant: &Tenant,
        apply: bool,
    ) -> impl Future<Output = Result<ReindexOutcome>> + Send;

    /// Changes of a scope with `after < revision <= up_to`, oldest first,
    /// and the prune mark read in the same statement (pruning moves the
    /// mark before it deletes, so a page that misses pruned rows sees it).
    fn changes(
        &self,
        tenant: &Tenant,
        scope: &Scope,
        prefix: &KeyPrefix,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> impl Future<Output = Result<ChangePage>> + Send;

    /// The newest revision the feed has been pruned through by age (older
    /// changes are gone), if it ever was.
    fn pruned_through(&self) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Forgets changes written before `before` that no kept change
    /// precedes (the feed loses a prefix, whatever order its times are
    /// in); returns how many.
    fn prune_changes(&self, before: DateTime<Utc>) -> impl Future<Output = Result<u64>> + Send;

    /// Forgets idempotency records written before `before`; returns how many.
    fn prune_request_ids(&self, before: DateTime<Utc>) -> impl Future<Output = Result<u64>> + Send;
}
