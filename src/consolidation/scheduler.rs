//! The scheduler: runs every enabled rule on its cadence, inside the server.
//!
//! Each replica runs one. A run takes its rule with a try-lock, so when
//! several replicas find a rule due at once exactly one runs it and the
//! others move on; the watermark, read and moved inside the run's
//! transaction, makes a crash mid-run harmless (nothing of the run lands,
//! and the next run starts where the last committed one stopped).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cron::Schedule;
use super::{Cadence, Consolidation, Rule};
use crate::context::{CallerContext, Tenant};
use crate::error::Result;
use crate::memory::now_micros;
use crate::metrics::RunOutcome;
use crate::ports::Store;
use crate::ticks::Ticks;

/// Runs due rules every `interval` until shutdown.
pub async fn run<S: Store>(
    consolidation: Consolidation<S>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = Ticks::new(interval, shutdown.clone());
    while ticks.next().await {
        if let Err(err) = pass(&consolidation, &shutdown).await {
            tracing::warn!(error = %crate::error::report(&err), "scheduled consolidation failed, retrying next tick");
        }
    }
}

async fn due<S: Store>(
    consolidation: &Consolidation<S>,
    tenant: &Tenant,
    rule: &Rule,
) -> Result<bool> {
    match &rule.cadence {
        Cadence::EveryNEpisodes(n) => consolidation.has_pending(tenant, rule, *n).await,
        Cadence::Cron(text) => Ok(Schedule::parse(text)
            .map(|schedule| schedule.is_due(rule.last_run_time, now_micros()))
            .unwrap_or(false)),
    }
}

/// One look at every enabled rule: run the due ones until they catch up.
async fn pass<S: Store>(
    consolidation: &Consolidation<S>,
    shutdown: &CancellationToken,
) -> Result<()> {
    for (tenant, rule) in consolidation.enabled_rules().await? {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        if !due(consolidation, &tenant, &rule).await? {
            continue;
        }
        let ctx = CallerContext {
            tenant: tenant.clone(),
            ..CallerContext::default()
        };
        loop {
            let registry = crate::metrics::global();
            let outcome = match consolidation.try_run(&ctx, &rule.id).await {
                Ok(Some(outcome)) => {
                    registry.scheduler_run(RunOutcome::Ran);
                    outcome
                }
                Ok(None) => {
                    registry.scheduler_run(RunOutcome::Busy);
                    break; // another replica is running it
                }
                Err(err) => {
                    registry.scheduler_run(RunOutcome::Failed);
                    return Err(err);
                }
            };
            if outcome.episodes_matched > 0 {
                tracing::info!(
                    tenant = tenant.as_str(),
                    rule = rule.id.as_str(),
                    scanned = outcome.episodes_scanned,
                    matched = outcome.episodes_matched,
                    added = outcome.applied.facts_added,
                    updated = outcome.applied.facts_updated,
                    deleted = outcome.applied.facts_deleted,
                    watermark = outcome.watermark,
                    "consolidation rule ran"
                );
            }
            if !outcome.more || shutdown.is_cancelled() {
                break;
            }
        }
    }
    Ok(())
}
