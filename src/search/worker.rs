//! The embedding worker and the backfill.
//!
//! Every replica with an embedder runs a [`Worker`]. It claims a batch of
//! the outbox (the writing transactions fill it), reads each item if it is
//! still live at that version, embeds the texts in one call and stores the
//! vectors on the items that still read as those texts (a purged key or a
//! deleted session written again is a new item at the old place: its own
//! entry embeds it), removing the entries in the same transaction. A claim is a
//! lease: entries another replica holds are skipped, so one replica embeds
//! each item; a replica that dies mid-batch leaves its entries to be
//! claimed again when the lease ends. A failed call gives the batch back
//! with a backoff that grows with its attempts, so an outage loses nothing
//! and a recovered endpoint drains what waited.
//!
//! [`reembed`] fills in what the outbox never held: items written before an
//! embedder was configured, or embedded by another model.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::Source;
use super::embedder::{Embedder, encode};
use super::ports::{Embedded, EmbeddingStore, ItemRef, Pending, Vector};
use crate::context::Tenant;
use crate::error::{Error, Result};

/// How long an idle worker waits before it looks at the outbox again.
const IDLE: Duration = Duration::from_millis(200);

/// How often the worker counts the outbox for
/// `engram_embedding_pending_items`.
const COUNT_EVERY: Duration = Duration::from_secs(2);

/// The first retry of a failed batch; doubled per attempt up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

#[derive(Clone)]
pub struct Worker<S> {
    store: S,
    embedder: Arc<dyn Embedder>,
    batch: usize,
    /// How long a claim holds: past it, the entries are another worker's.
    lease: Duration,
    /// This worker's name on its claims.
    claim: String,
}

impl<S: EmbeddingStore> Worker<S> {
    /// `lease` must outlast one embedder call with all its retries.
    pub fn new(store: S, embedder: Arc<dyn Embedder>, batch: usize, lease: Duration) -> Self {
        Worker {
            store,
            embedder,
            batch: batch.max(1),
            lease,
            claim: claim_name(),
        }
    }

    /// Drains the outbox until shutdown. The server has recorded the
    /// model before it serves (so every write it acknowledges is queued).
    pub async fn run(self, shutdown: CancellationToken) {
        let mut counted: Option<std::time::Instant> = None;
        loop {
            if counted.is_none_or(|at| at.elapsed() >= COUNT_EVERY) {
                counted = Some(std::time::Instant::now());
                match self.store.pending_count().await {
                    Ok(n) => crate::metrics::global().embedding_pending(n),
                    Err(err) => tracing::warn!(error = ?err, "cannot count the embedding outbox"),
                }
            }
            let wait = match self.drain_once().await {
                Ok(n) if n == self.batch => Duration::ZERO,
                Ok(_) => IDLE,
                Err(err) => {
                    tracing::warn!(error = ?err, "embedding the outbox failed, retrying");
                    IDLE * 10
                }
            };
            if pause(&shutdown, wait).await {
                return;
            }
        }
    }

    /// Claims and embeds one batch; returns how many entries it claimed.
    pub async fn drain_once(&self) -> Result<usize> {
        let now = Utc::now();
        let lease_until = now + self.lease;
        let pending = self
            .store
            .claim_pending(&self.claim, now, lease_until, self.batch)
            .await?;
        if pending.is_empty() {
            return Ok(0);
        }
        let inputs = self.live_inputs(&pending).await?;
        // Which entries are still live; their texts move to the embedder.
        let texts: Vec<String> = inputs.iter().flatten().cloned().collect();
        let vectors = if texts.is_empty() {
            Vec::new()
        } else {
            match self.embedder.embed(&texts).await {
                Ok(vectors) => vectors,
                Err(err) => {
                    let attempts = pending.iter().map(|p| p.attempts).min().unwrap_or(1);
                    let due = Utc::now() + backoff(attempts);
                    crate::metrics::global().embedder_failed();
                    tracing::warn!(
                        error = %crate::error::report(&err),
                        items = pending.len(),
                        attempts,
                        %due,
                        "the embedder failed; the batch waits for its next attempt"
                    );
                    self.store
                        .release_pending(&self.claim, &pending, due)
                        .await?;
                    return Ok(pending.len());
                }
            }
        };
        let mut vectors = vectors.into_iter();
        let done: Vec<Embedded> = pending
            .iter()
            .zip(inputs)
            .map(|(entry, input)| Embedded {
                tenant: entry.tenant.clone(),
                item: entry.item.clone(),
                vector: input.and_then(|input| {
                    vectors.next().map(|v| Vector {
                        input,
                        encoded: encode(&v),
                    })
                }),
                outbox: Some(entry.id),
            })
            .collect();
        let stored = self
            .store
            .store_vectors(Some(&self.claim), self.embedder.model(), &done)
            .await?;
        crate::metrics::global().embedded(stored.vectors);
        if !stored.busy.is_empty() {
            // Most often a purge or a forget is deleting them: the next
            // attempt finds them gone, or stores their vectors.
            let busy: Vec<Pending> = stored.busy.iter().map(|&at| pending[at].clone()).collect();
            self.store
                .release_pending(&self.claim, &busy, Utc::now() + FIRST_BACKOFF)
                .await?;
        }
        Ok(pending.len())
    }

    /// What each entry's item is embedded as, if still live at its
    /// version, in order.
    async fn live_inputs(&self, pending: &[Pending]) -> Result<Vec<Option<String>>> {
        let mut by_tenant: BTreeMap<&Tenant, Vec<usize>> = BTreeMap::new();
        for (at, entry) in pending.iter().enumerate() {
            by_tenant.entry(&entry.tenant).or_default().push(at);
        }
        let mut inputs = vec![None; pending.len()];
        for (tenant, positions) in by_tenant {
            let refs: Vec<ItemRef> = positions
                .iter()
                .map(|&at| pending[at].item.clone())
                .collect();
            let found = self.store.inputs(tenant, &refs).await?;
            for (at, input) in positions.into_iter().zip(found) {
                inputs[at] = input;
            }
        }
        Ok(inputs)
    }
}

/// Waits `wait` unless shut down first; true when shut down.
async fn pause(shutdown: &CancellationToken, wait: Duration) -> bool {
    if wait.is_zero() {
        return shutdown.is_cancelled();
    }
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

/// The wait before attempt `attempts + 1` of a batch.
fn backoff(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.saturating_sub(1))
        .unwrap_or(0)
        .min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

/// A name no other worker has: the process and a random id (container
/// replicas often share a process id).
fn claim_name() -> String {
    format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple())
}

/// Where a backfill stands, for its progress output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub source: Source,
    pub done: u64,
    /// Counted when the source's backfill started.
    pub total: u64,
}

/// What a backfill did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backfilled {
    /// Items whose vectors it stored.
    pub embedded: u64,
    /// Items other writers kept holding (most often deleting them): a
    /// later run embeds those still live.
    pub busy: u64,
}

/// How often a backfill tries again to store on items another writer
/// holds, after waits of [`BUSY_WAIT`] doubling.
const BUSY_TRIES: u32 = 5;
const BUSY_WAIT: Duration = Duration::from_millis(50);

/// Embeds every live item with no vector of the embedder's model and not
/// waiting in the outbox, source by source, `batch` items per call;
/// `progress` hears after each batch.
pub async fn reembed<S: EmbeddingStore>(
    store: &S,
    embedder: &dyn Embedder,
    batch: usize,
    mut progress: impl FnMut(Progress),
) -> Result<Backfilled> {
    let model = embedder.model();
    store.set_embedder(model).await?;
    let batch = batch.max(1);
    let mut backfilled = Backfilled::default();
    for source in Source::ALL {
        let total = u64::try_from(store.count_unembedded(source, model).await?).unwrap_or(0);
        let mut done = 0;
        progress(Progress {
            source,
            done,
            total,
        });
        let mut after: Option<(Tenant, ItemRef)> = None;
        loop {
            let page = store
                .unembedded(source, model, after.as_ref(), batch)
                .await?;
            let Some((tenant, item, _)) = page.last() else {
                break;
            };
            after = Some((tenant.clone(), item.clone()));
            let (items, texts): (Vec<_>, Vec<_>) = page
                .into_iter()
                .map(|(tenant, item, text)| ((tenant, item), text))
                .unzip();
            let vectors = embedder
                .embed(&texts)
                .await
                .map_err(|err| Error::Unavailable {
                    source: format!("the embedder failed: {err}").into(),
                })?;
            let stored: Vec<Embedded> = items
                .into_iter()
                .zip(texts.into_iter().zip(vectors))
                .map(|((tenant, item), (input, vector))| Embedded {
                    tenant,
                    item,
                    vector: Some(Vector {
                        input,
                        encoded: encode(&vector),
                    }),
                    outbox: None,
                })
                .collect();
            done += stored.len() as u64;
            let (vectors, busy) = store_waiting_out(store, model, stored).await?;
            backfilled.embedded += vectors;
            backfilled.busy += busy;
            progress(Progress {
                source,
                done,
                total: total.max(done),
            });
        }
    }
    Ok(backfilled)
}

/// Stores a backfill's vectors, trying again a few times on items another
/// writer holds; returns how many it stored and how many stayed held.
async fn store_waiting_out<S: EmbeddingStore>(
    store: &S,
    model: &str,
    mut vectors: Vec<Embedded>,
) -> Result<(u64, u64)> {
    let mut stored = 0;
    let mut wait = BUSY_WAIT;
    let mut tries = 1;
    loop {
        let report = store.store_vectors(None, model, &vectors).await?;
        stored += report.vectors as u64;
        if report.busy.is_empty() || tries == BUSY_TRIES {
            return Ok((stored, report.busy.len() as u64));
        }
        vectors = report.busy.iter().map(|&at| vectors[at].clone()).collect();
        tokio::time::sleep(wait).await;
        wait *= 2;
        tries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn claims_are_named_apart() {
        assert_ne!(claim_name(), claim_name());
    }
}
