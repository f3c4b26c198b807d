//! A tenant's data as a whole: forgetting a user (`DataService.ForgetUser`)
//! and moving data between stores (`Export`, `Import`; see `transfer`).
//!
//! Forgetting crosses every part of the model (sessions, episodes,
//! working memory, facts, execution-scoped memory), so it lives here and
//! not in any one of them; the store does it in one transaction and leaves
//! the audit skeleton in the same one.

pub mod records;
mod transfer;

pub use transfer::{
    After, ExportPage, ImportCounts, Lines, Part, Read, STALE_AFTER as STALE_IMPORT_AFTER,
    Selection, parse_line,
};

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;

use crate::context::{CallerContext, Tenant};
use crate::error::{Error, Reason, Result};
use crate::memory::audit::{AuditRecord, Operation};
use crate::memory::{Scope, ScopeName, ScopeType, now_micros};
use crate::sessions::Name;

/// Further execution ids a request may name.
pub const MAX_EXECUTION_IDS: usize = 1000;

/// The namespace scope whose audit trail holds the skeletons.
pub const FORGOTTEN_SCOPE: &str = "engram.forgotten";

/// Whom to forget, and whether only to count.
#[derive(Debug, Clone)]
pub struct Forgetting {
    pub app: Name,
    pub user: Name,
    /// Execution ids known to be the user's runs, besides their session ids.
    pub execution_ids: Vec<String>,
    pub dry_run: bool,
}

/// What forgetting a user deletes (or, in a dry run, would delete).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForgetCounts {
    pub sessions: i64,
    pub episodes: i64,
    pub facts: i64,
    pub working_items: i64,
    pub execution_scopes: i64,
    pub memory_versions: i64,
}

impl ForgetCounts {
    fn by_kind(self) -> BTreeMap<String, i64> {
        [
            ("sessions", self.sessions),
            ("episodes", self.episodes),
            ("facts", self.facts),
            ("working_items", self.working_items),
            ("execution_scopes", self.execution_scopes),
            ("memory_versions", self.memory_versions),
        ]
        .into_iter()
        .map(|(kind, n)| (kind.to_owned(), n))
        .collect()
    }
}

/// What the data service needs from a store.
pub trait DataStore: Clone + Send + Sync + 'static {
    /// Counts and (unless a dry run) deletes the user's data and writes
    /// `record` in the same transaction.
    fn forget_user(
        &self,
        tenant: &Tenant,
        forget: &Forgetting,
        record: AuditRecord,
    ) -> impl Future<Output = Result<ForgetCounts>> + Send;

    /// What an export reads through: one snapshot of the tenant.
    type Snapshot: Send + 'static;

    /// Opens the snapshot an export reads every page from, so the file is
    /// one moment of the tenant (a session and its episodes, a key's
    /// versions, a fact and its versions agree) however long it takes.
    fn export_snapshot(
        &self,
        tenant: &Tenant,
    ) -> impl Future<Output = Result<Self::Snapshot>> + Send;

    /// One page of a part of an export, in the part's order, starting
    /// after `after`, of at most `rows` rows (the last page's
    /// [`ExportPage::next_rows`]; none at the part's start).
    fn export_page(
        &self,
        snapshot: &mut Self::Snapshot,
        tenant: &Tenant,
        selection: &Selection,
        part: Part,
        after: &After,
        rows: Option<i64>,
    ) -> impl Future<Output = Result<ExportPage>> + Send;

    /// Ends an export's snapshot once its last page is read.
    fn export_done(&self, snapshot: Self::Snapshot) -> impl Future<Output = Result<()>> + Send;

    /// Stages checked import lines (line number, canonical record JSON).
    fn stage_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
        lines: &[(i64, String)],
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Applies every staged line of an import in one transaction, in line
    /// order, and removes them.
    fn apply_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
    ) -> impl Future<Output = Result<ImportCounts>> + Send;

    /// Removes an import's staged lines, and any staged before
    /// `stale_before` (imports that never finished).
    fn discard_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
        stale_before: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Removes the staged lines of every tenant's imports that began before
    /// `before` and never finished (a dropped stream, a killed server), so
    /// the data they carry does not outlive them when no import follows;
    /// returns how many lines.
    fn prune_imports(&self, before: DateTime<Utc>) -> impl Future<Output = Result<u64>> + Send;
}

/// The data service over a store.
#[derive(Debug, Clone)]
pub struct Data<S> {
    store: S,
    /// The largest memory value or episode content an import may bring
    /// (`--max-value-bytes`, as for a Set or an append).
    max_value_bytes: usize,
    /// Exports reading at once: each holds a database connection for as
    /// long as its client takes to read it, so they take turns rather than
    /// take the pool from every other call.
    exports: Arc<Semaphore>,
}

impl<S: DataStore> Data<S> {
    pub fn new(store: S) -> Self {
        Data {
            store,
            max_value_bytes: usize::MAX,
            exports: Arc::new(Semaphore::new(1)),
        }
    }

    /// Refuses imported values larger than a write could store.
    pub fn limited(mut self, max_value_bytes: usize) -> Self {
        self.max_value_bytes = max_value_bytes;
        self
    }

    /// Lets `at_once` exports read at a time (at least one); the rest wait
    /// for a turn.
    pub fn exports_at_once(mut self, at_once: usize) -> Self {
        self.exports = Arc::new(Semaphore::new(at_once.max(1)));
        self
    }

    /// Forgets a user; returns the counts and, unless a dry run, the audit
    /// skeleton's key.
    pub async fn forget_user(
        &self,
        ctx: &CallerContext,
        forget: Forgetting,
    ) -> Result<(ForgetCounts, Option<String>)> {
        if forget.execution_ids.len() > MAX_EXECUTION_IDS {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "execution_ids",
                format!("at most {MAX_EXECUTION_IDS}"),
            ));
        }
        let scope = Scope {
            scope_type: ScopeType::Namespace,
            name: ScopeName::parse("scope", FORGOTTEN_SCOPE)?,
        };
        let mut record = AuditRecord::new(Operation::Forget, &scope, now_micros());
        record.subject = subject(&forget.app, &forget.user);
        let key = record.audit_key.clone();
        let counts = self.store.forget_user(&ctx.tenant, &forget, record).await?;
        Ok((counts, (!forget.dry_run).then_some(key)))
    }
}

/// `app/sha256:HEX`: who was forgotten, without their name.
fn subject(app: &Name, user: &Name) -> String {
    format!("{app}/sha256:{}", crate::auth::hash_token(user.as_str()))
}

/// Completes the skeleton with the counts.
pub fn complete(record: &mut AuditRecord, counts: ForgetCounts) {
    record.keys_affected = counts.execution_scopes;
    record.versions_deleted = counts.memory_versions;
    record.counts = counts.by_kind();
}
