//! The two algorithms every backend shares, written once over the
//! transaction primitives of `ports.rs`: applying deltas, and running a
//! rule (read the episodes after its watermark, classify the matching
//! ones, apply, move the watermark, all in the caller's transaction).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::classify::{FactKey, classify, fact_key, owner};
use super::ports::{Dedup, FactTx, Locked, RuleTx, RunRequest};
use super::types::FactKind;
use super::types::{Applied, Delta, RunOutcome};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::search::embedder::similarity;
use crate::sessions::Episode;

/// Applies deltas in order. An update whose targets are all unknown adds a
/// new fact (what it replaced was never promoted); a delete of unknown
/// targets changes nothing. The owners of the facts written are held
/// first (see [`FactTx::hold_owners`]): applied in delta order, two
/// batches touching the same facts in other orders deadlocked.
pub(super) async fn apply<T: FactTx>(
    tx: &mut T,
    tenant: &Tenant,
    deltas: &[Delta],
    now: DateTime<Utc>,
) -> Result<Applied> {
    let owners: Vec<(&str, &str)> = deltas.iter().filter_map(Delta::owner).collect();
    tx.hold_owners(tenant, &owners).await?;
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
/// run, rolls back). `Locked::Busy` and `Locked::Missing` come back as they
/// are, with nothing read.
pub(super) async fn run<T: RuleTx>(
    tx: &mut T,
    tenant: &Tenant,
    run: &RunRequest<'_>,
) -> Result<std::result::Result<RunOutcome, Locked>> {
    let rule = match tx.lock_rule(tenant, run.rule_id, run.lock).await? {
        Locked::Rule(rule) => rule,
        other => return Ok(Err(other)),
    };
    let filter = super::filter::parse_stored(&rule.filter).map_err(|err| {
        Error::internal(format!("stored filter of {} is invalid: {err}", rule.id))
    })?;
    let up_to = run.up_to.max(rule.watermark);
    let episodes = tx
        .episodes(tenant, rule.watermark, up_to, run.limit)
        .await?;
    // More wait when the limit or the bytes a run reads were reached.
    let more = crate::paging::more(&episodes, run.limit);
    let watermark = match episodes.last() {
        Some(last) if more => last.cursor,
        _ => up_to,
    };
    let scanned = episodes.len() as i64;
    let mut matched: Vec<Episode> = episodes
        .into_iter()
        .filter(|episode| filter.matches(episode))
        .collect();
    if !run.dry_run {
        // The owners of the facts the run will read and write, held before
        // they are read (see `FactTx::hold_owners`): read first, runs of two
        // rules over the same episodes each found no fact for a subject and
        // both added one, where one after the other updates it.
        let owners: Vec<(String, String)> = matched
            .iter()
            .map(|episode| owner(&rule, episode))
            .collect();
        let owners: Vec<(&str, &str)> = owners
            .iter()
            .map(|(app, user)| (app.as_str(), user.as_str()))
            .collect();
        tx.hold_owners(tenant, &owners).await?;
        // A forget holds the same owners before it deletes: what it took
        // since the read above is not promoted (its facts would outlive it).
        let ids: Vec<String> = matched.iter().map(|episode| episode.id.clone()).collect();
        let stored = tx.still_stored(tenant, &ids).await?;
        matched.retain(|episode| stored.contains(&episode.id));
    }
    let mut keys: Vec<FactKey> = matched
        .iter()
        .filter_map(|episode| fact_key(&rule, episode))
        .collect();
    keys.sort();
    keys.dedup();
    let live = tx.live_facts(tenant, &keys).await?;
    let mut deltas = classify(&rule, &matched, &live, run.now);
    if let Some(dedup) = run.dedup {
        deltas = merge_near_duplicates(tx, tenant, deltas, dedup).await?;
    }
    let applied = if run.dry_run {
        Applied::default()
    } else {
        let applied = apply(tx, tenant, &deltas, run.now).await?;
        tx.advance(tenant, &rule.id, watermark, matched.len() as i64, run.now)
            .await?;
        applied
    };
    Ok(Ok(RunOutcome {
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

/// Turns each Add whose text is within the threshold of a live fact of the
/// same owner and kind into an Update of the most similar one (only facts
/// whose vectors are stored, of the configured model, count).
async fn merge_near_duplicates<T: FactTx>(
    tx: &mut T,
    tenant: &Tenant,
    deltas: Vec<Delta>,
    dedup: &Dedup,
) -> Result<Vec<Delta>> {
    // The stored vectors (fact id, vector) of each owner and kind met.
    type Owner = (String, String, FactKind);
    let mut candidates: HashMap<Owner, Vec<(String, Vec<u8>)>> = HashMap::new();
    let mut merged = Vec::with_capacity(deltas.len());
    for delta in deltas {
        let Delta::Add {
            payload,
            provenance,
        } = delta
        else {
            merged.push(delta);
            continue;
        };
        let Some(vector) = dedup.vectors.get(&payload.text()) else {
            merged.push(Delta::Add {
                payload,
                provenance,
            });
            continue;
        };
        let owner = (payload.app.clone(), payload.user.clone(), payload.kind);
        if !candidates.contains_key(&owner) {
            let found = tx
                .fact_vectors(tenant, (&owner.0, &owner.1), owner.2, &dedup.model)
                .await?;
            candidates.insert(owner.clone(), found);
        }
        let nearest = candidates
            .get(&owner)
            .into_iter()
            .flatten()
            .filter_map(|(id, stored)| similarity(vector, stored).map(|s| (s, id)))
            .filter(|(s, _)| *s >= dedup.threshold)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        merged.push(match nearest {
            Some((_, id)) => Delta::Update {
                payload,
                replaces: vec![id.clone()],
                provenance,
            },
            None => Delta::Add {
                payload,
                provenance,
            },
        });
    }
    Ok(merged)
}
