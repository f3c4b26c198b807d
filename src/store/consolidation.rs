//! The storage of rules and facts, and the two algorithms both backends
//! share: applying deltas, and running a rule (read the episodes after its
//! watermark, classify the matching ones, apply, move the watermark, all in
//! one transaction). Each backend supplies the primitives ([`FactTx`],
//! [`RuleTx`]) on its own connection type.

use std::collections::HashMap;
use std::future::Future;

use chrono::{DateTime, Utc};

use crate::consolidation::{
    Applied, Delta, Fact, FactKey, FactKind, FactPayload, FactVersion, Provenance, Rule,
    RunOutcome, classify, fact_key,
};
pub(super) use crate::consolidation::{rule_exists, rule_not_found};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::sessions::Episode;

/// Which facts a listing returns.
#[derive(Debug, Clone, Default)]
pub struct FactFilter {
    pub app: Option<String>,
    pub user: Option<String>,
    pub kind: Option<FactKind>,
    /// Newest first (`after` then means "before").
    pub newest_first: bool,
}

/// How a run waits for another run of the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLock {
    /// Wait for it to finish (a `RunRule` call).
    Wait,
    /// Give up at once (the scheduler: someone else is on it).
    Try,
}

#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    pub rule_id: &'a str,
    /// The settled episode horizon: the run reads no cursor beyond it.
    pub up_to: i64,
    /// The most episodes one run reads.
    pub limit: i64,
    pub dry_run: bool,
    pub now: DateTime<Utc>,
    pub lock: RunLock,
}

pub trait ConsolidationStore: Clone + Send + Sync + 'static {
    /// Stores a new rule; a taken id is `ALREADY_EXISTS`.
    fn create_rule(&self, tenant: &Tenant, rule: &Rule) -> impl Future<Output = Result<()>> + Send;

    fn get_rule(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> impl Future<Output = Result<Option<Rule>>> + Send;

    /// Rules in id order, after `after`.
    fn list_rules(
        &self,
        tenant: &Tenant,
        after: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Rule>>> + Send;

    /// Deletes a rule (its facts stay); false when there was none.
    fn delete_rule(&self, tenant: &Tenant, id: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Every enabled rule of every tenant, for the scheduler.
    fn enabled_rules(&self) -> impl Future<Output = Result<Vec<(Tenant, Rule)>>> + Send;

    /// How many episodes (at most `at_most`) wait after a cursor.
    fn pending_episodes(
        &self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        at_most: i64,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// One run of a rule in one transaction; `None` when the lock is `Try`
    /// and another run holds the rule.
    fn run_rule(
        &self,
        tenant: &Tenant,
        run: &RunRequest<'_>,
    ) -> impl Future<Output = Result<Option<RunOutcome>>> + Send;

    /// Applies deltas in one transaction.
    fn apply_deltas(
        &self,
        tenant: &Tenant,
        deltas: &[Delta],
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Applied>> + Send;

    /// Live facts in id order (creation order), after `after`.
    fn list_facts(
        &self,
        tenant: &Tenant,
        filter: &FactFilter,
        after: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Fact>>> + Send;

    /// A fact (live or tombstoned) with every version, oldest first.
    fn get_fact(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> impl Future<Output = Result<Option<(Fact, Vec<FactVersion>)>>> + Send;

    /// Tombstones a live fact; `None` when there is no live fact by that id.
    fn delete_fact(
        &self,
        tenant: &Tenant,
        id: &str,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<Fact>>> + Send;
}

/// The fact primitives a backend runs inside one transaction.
pub(super) trait FactTx {
    /// Live facts of an owner named by `ids`: fact ids, or ids of episodes
    /// a version of the fact came from. Distinct, in the order named.
    async fn resolve(
        &mut self,
        tenant: &Tenant,
        app: &str,
        user: &str,
        ids: &[String],
    ) -> Result<Vec<String>>;

    /// The ids of the live facts with these keys.
    async fn live_facts(
        &mut self,
        tenant: &Tenant,
        keys: &[FactKey],
    ) -> Result<HashMap<FactKey, String>>;

    async fn insert_fact(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: &FactPayload,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// A new version of a fact: the payload, or a tombstone (`None`).
    async fn write_version(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: Option<&FactPayload>,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()>;
}

/// The rule primitives a backend runs inside the transaction of a run.
pub(super) trait RuleTx: FactTx {
    /// Locks the rule against other runs and reads it; `None` for `Try`
    /// when it is taken. `NOT_FOUND` when there is no such rule.
    async fn lock_rule(&mut self, tenant: &Tenant, id: &str, lock: RunLock)
    -> Result<Option<Rule>>;

    /// Episodes with `after < cursor <= up_to`, in cursor order.
    async fn episodes(
        &mut self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<Episode>>;

    async fn advance(
        &mut self,
        tenant: &Tenant,
        id: &str,
        watermark: i64,
        promoted: i64,
        now: DateTime<Utc>,
    ) -> Result<()>;
}

/// A fact version to store: the payload (`None`: a tombstone) and the key
/// it is filed under.
pub(super) struct NewVersion<'a> {
    pub version: i64,
    pub payload: Option<&'a FactPayload>,
    pub subject: &'a str,
    pub predicate: &'a str,
}

/// Applies deltas in order. An update whose targets are all unknown adds a
/// new fact (what it replaced was never promoted); a delete of unknown
/// targets changes nothing.
pub(super) async fn apply_in<T: FactTx>(
    tx: &mut T,
    tenant: &Tenant,
    deltas: &[Delta],
    now: DateTime<Utc>,
) -> Result<Applied> {
    let mut applied = Applied::default();
    for delta in deltas {
        match delta {
            Delta::Add {
                payload,
                provenance,
            } => {
                let id = uuid::Uuid::now_v7().to_string();
                tx.insert_fact(tenant, &id, payload, provenance, now)
                    .await?;
                applied.facts_added += 1;
                applied.fact_ids.push(id);
            }
            Delta::Update {
                payload,
                replaces,
                provenance,
            } => {
                let targets = tx
                    .resolve(tenant, &payload.app, &payload.user, replaces)
                    .await?;
                match targets.split_first() {
                    None => {
                        let id = uuid::Uuid::now_v7().to_string();
                        tx.insert_fact(tenant, &id, payload, provenance, now)
                            .await?;
                        applied.facts_added += 1;
                        applied.fact_ids.push(id);
                    }
                    Some((first, rest)) => {
                        tx.write_version(tenant, first, Some(payload), provenance, now)
                            .await?;
                        applied.facts_updated += 1;
                        applied.fact_ids.push(first.clone());
                        // Several replaced facts merge into the first.
                        for other in rest {
                            tx.write_version(tenant, other, None, provenance, now)
                                .await?;
                            applied.facts_deleted += 1;
                            applied.fact_ids.push(other.clone());
                        }
                    }
                }
            }
            Delta::Delete {
                app,
                user,
                replaces,
                provenance,
            } => {
                for id in tx.resolve(tenant, app, user, replaces).await? {
                    tx.write_version(tenant, &id, None, provenance, now).await?;
                    applied.facts_deleted += 1;
                    applied.fact_ids.push(id);
                }
            }
            Delta::Noop { .. } => {}
        }
    }
    Ok(applied)
}

/// One run of a rule inside a transaction the caller commits (or, on a dry
/// run, rolls back).
pub(super) async fn run_in<T: RuleTx>(
    tx: &mut T,
    tenant: &Tenant,
    run: &RunRequest<'_>,
) -> Result<Option<RunOutcome>> {
    let Some(rule) = tx.lock_rule(tenant, run.rule_id, run.lock).await? else {
        return Ok(None);
    };
    let filter = crate::consolidation::filter::parse(&rule.filter).map_err(|err| {
        Error::internal(format!("stored filter of {} is invalid: {err}", rule.id))
    })?;
    let up_to = run.up_to.max(rule.watermark);
    let episodes = tx
        .episodes(tenant, rule.watermark, up_to, run.limit)
        .await?;
    let more = episodes.len() as i64 >= run.limit;
    let watermark = match episodes.last() {
        Some(last) if more => last.cursor,
        _ => up_to,
    };
    let scanned = episodes.len() as i64;
    let matched: Vec<Episode> = episodes
        .into_iter()
        .filter(|episode| filter.matches(episode))
        .collect();
    let mut keys: Vec<FactKey> = matched
        .iter()
        .filter_map(|episode| fact_key(&rule, episode))
        .collect();
    keys.sort();
    keys.dedup();
    let live = tx.live_facts(tenant, &keys).await?;
    let deltas = classify(&rule, &matched, &live, run.now);
    let applied = if run.dry_run {
        Applied::default()
    } else {
        let applied = apply_in(tx, tenant, &deltas, run.now).await?;
        tx.advance(tenant, &rule.id, watermark, matched.len() as i64, run.now)
            .await?;
        applied
    };
    Ok(Some(RunOutcome {
        deltas,
        episodes_scanned: scanned,
        episodes_matched: matched.len() as i64,
        watermark: if run.dry_run {
            rule.watermark
        } else {
            watermark
        },
        more,
        applied,
    }))
}

/// Decodes a JSON array of strings read back from the store.
pub(super) fn string_list(text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text).map_err(Error::internal)
}

pub(super) fn string_list_json(items: &[String]) -> String {
    serde_json::Value::from(items.to_vec()).to_string()
}

pub(super) fn fact_kind(n: i16) -> Result<FactKind> {
    FactKind::from_i16(n).ok_or_else(|| Error::internal(format!("unknown fact kind {n}")))
}
