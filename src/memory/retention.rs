//! Retention declared per scope: how much history a scope keeps, applied by
//! the server on an interval (and on demand) as a purge with the policy's
//! rules, audited as operation "retention".
//!
//! One replica runs each scope's policy at a time: every replica's
//! scheduler looks for due policies, and takes one by moving its next run
//! forward with a compare-and-set; the loser skips it. A run is a purge,
//! so it is one transaction with its audit record, and a crash mid-run
//! leaves nothing half done (the next run, an interval later, does it).

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::admin::MemoryAdmin;
use super::audit::{AuditRecord, Operation};
use super::ports::{MemoryStore, Purge, PurgeOutcome, Retention, RetentionPolicy};
use super::service::{now_micros, refuse_in_checkpoint};
use super::types::Scope;
use crate::context::{CallerContext, Tenant};
use crate::error::{Error, Reason, Result};
use crate::ticks::Ticks;

/// How many due policies one look takes.
const DUE_BATCH: i64 = 100;

/// How often the scheduler looks for due policies, at most.
const LOOK_EVERY: Duration = Duration::from_secs(60);

/// The longest age a policy may name.
const MAX_AGE: chrono::Duration = chrono::Duration::days(36_500);

/// Refuses a policy whose rules make no sense.
pub fn validate(policy: &RetentionPolicy) -> Result<()> {
    if let Some(keep) = policy.keep_versions
        && keep < 1
    {
        return Err(Error::invalid(
            Reason::InvalidArgument,
            "policy.keep_versions",
            format!("must be at least 1 (the newest version always stays), got {keep}"),
        ));
    }
    for (field, duration) in [
        ("policy.max_age", policy.max_age),
        ("policy.tombstone_grace", policy.tombstone_grace),
    ] {
        if duration.is_some_and(|d| d <= chrono::Duration::zero() || d > MAX_AGE) {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                field,
                "must be positive and at most 100 years",
            ));
        }
    }
    Ok(())
}

/// Applies a policy to its scope now.
pub async fn apply<S: MemoryStore>(
    store: &S,
    tenant: &Tenant,
    retention: &Retention,
    dry_run: bool,
) -> Result<PurgeOutcome> {
    let now = now_micros();
    let policy = retention.policy;
    let purge = Purge {
        scope: &retention.scope,
        key: None,
        keep: policy.keep_versions,
        include_deleted: true,
        older_than: policy.max_age.and_then(|age| now.checked_sub_signed(age)),
        tombstones_before: policy
            .tombstone_grace
            .and_then(|grace| now.checked_sub_signed(grace)),
        dry_run,
    };
    // The purge completes the record, `keep` included.
    let record = AuditRecord::new(Operation::Retention, &retention.scope, now);
    let outcome = store.purge(tenant, &purge, record).await?;
    if !dry_run {
        store
            .retention_ran(tenant, &retention.scope, now, outcome.versions_deleted)
            .await?;
    }
    Ok(outcome)
}

fn retention_not_found(scope: &Scope) -> Error {
    Error::NotFound {
        reason: Reason::RetentionNotFound,
        message: format!(
            "{} scope {:?} has no retention policy",
            scope.scope_type.as_str(),
            scope.name.as_str()
        ),
        metadata: vec![("scope", scope.name.as_str().to_owned())],
    }
}

impl<S: MemoryStore> MemoryAdmin<S> {
    /// Declares (or, with every rule unset, removes) a scope's policy; it
    /// is first due at once.
    pub async fn set_retention(
        &self,
        ctx: &CallerContext,
        scope: &Scope,
        policy: RetentionPolicy,
    ) -> Result<Option<Retention>> {
        refuse_in_checkpoint(ctx)?;
        validate(&policy)?;
        let policy = (!policy.is_empty()).then_some(policy);
        self.store()
            .set_retention(&ctx.tenant, scope, policy, now_micros())
            .await
    }

    /// What a policy would delete if it ran now; stores nothing.
    pub async fn preview_retention(
        &self,
        ctx: &CallerContext,
        scope: &Scope,
        policy: RetentionPolicy,
    ) -> Result<PurgeOutcome> {
        refuse_in_checkpoint(ctx)?;
        validate(&policy)?;
        if policy.is_empty() {
            return Ok(PurgeOutcome {
                versions_deleted: 0,
                keys_affected: 0,
                record: None,
            });
        }
        let retention = Retention {
            scope: scope.clone(),
            policy,
            next_run_time: now_micros(),
            last_run_time: None,
            last_versions_deleted: 0,
        };
        apply(self.store(), &ctx.tenant, &retention, true).await
    }

    pub async fn get_retention(&self, ctx: &CallerContext, scope: &Scope) -> Result<Retention> {
        refuse_in_checkpoint(ctx)?;
        self.store()
            .retention(&ctx.tenant, scope)
            .await?
            .ok_or_else(|| retention_not_found(scope))
    }

    pub async fn apply_retention(
        &self,
        ctx: &CallerContext,
        scope: &Scope,
        dry_run: bool,
    ) -> Result<PurgeOutcome> {
        let retention = self.get_retention(ctx, scope).await?;
        apply(self.store(), &ctx.tenant, &retention, dry_run).await
    }
}

/// Applies due policies every look until shutdown; each scope's policy
/// runs once per `interval`.
pub async fn run<S: MemoryStore>(store: S, interval: Duration, shutdown: CancellationToken) {
    let mut ticks = Ticks::new(interval.min(LOOK_EVERY), shutdown.clone());
    while ticks.next().await {
        if let Err(err) = pass(&store, interval, &shutdown).await {
            tracing::warn!(error = %crate::error::report(&err), "retention failed, retrying next tick");
        }
    }
}

async fn pass<S: MemoryStore>(
    store: &S,
    interval: Duration,
    shutdown: &CancellationToken,
) -> Result<()> {
    let now = Utc::now();
    let next = now + chrono::Duration::from_std(interval).unwrap_or(chrono::Duration::hours(1));
    for (tenant, retention) in store.due_retentions(now, DUE_BATCH).await? {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let claimed = store
            .claim_retention(&tenant, &retention.scope, retention.next_run_time, next)
            .await?;
        if !claimed {
            continue; // another replica took it
        }
        match apply(store, &tenant, &retention, false).await {
            Ok(outcome) => tracing::info!(
                tenant = tenant.as_str(),
                scope = retention.scope.name.as_str(),
                versions_deleted = outcome.versions_deleted,
                keys_affected = outcome.keys_affected,
                "retention applied"
            ),
            Err(err) => tracing::warn!(
                tenant = tenant.as_str(),
                scope = retention.scope.name.as_str(),
                error = %crate::error::report(&err),
                "retention failed; it runs again next interval"
            ),
        }
    }
    Ok(())
}
