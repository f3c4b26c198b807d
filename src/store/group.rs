//! Group commit: concurrent writes of one tenant share a transaction, so
//! they share its commit (one WAL flush on Postgres, one fsync on SQLite)
//! instead of paying one each.
//!
//! There is no timer. The first write of a tenant starts a flusher task
//! that takes whatever is queued (up to the batch bound) and commits it;
//! writes arriving while that commit is in flight queue up and form the
//! next batch. At one client a batch is a single write, which the backends
//! run on their plain path, so an idle server answers as fast as before.
//! A group may let a tenant have more than one batch in flight (Postgres's
//! appends have two): a write then starts another flusher while fewer than
//! that many run, and each takes what is queued when it is free.
//!
//! The flusher is a task of its own, not the caller that started it, so a
//! caller that gives up (a cancelled call) does not strand the writes queued
//! behind it. Each write keeps its own outcome: the backends run a batch's
//! writes one after another in the transaction (on Postgres, plain sets of
//! distinct keys share a statement) and report each one, and
//! when a statement fails (not a refusal, an error) they roll the batch back
//! and run its writes one by one, so the error reaches only its own call.
//!
//! Reads use the same queue where one statement can answer many: on
//! Postgres, concurrent `Get`s of a tenant are read by one statement, and
//! so are concurrent `Recent`s of one level.
//!
//! Written by hand: this is a queue, a map and a task, not a dependency.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::metrics::Grouped;

/// Commits a batch of jobs of one tenant, one result per job, in order.
pub(super) type Flush<J, R> =
    Arc<dyn Fn(Tenant, Vec<J>) -> BoxFuture<'static, Vec<Result<R>>> + Send + Sync>;

struct Waiting<J, R> {
    job: J,
    done: oneshot::Sender<Result<R>>,
}

/// A tenant's jobs waiting for a batch, and how many flushers serve them.
struct Lane<J, R> {
    queue: Vec<Waiting<J, R>>,
    flushers: usize,
}

/// A tenant is in the map while a flusher of its runs.
type Queues<J, R> = Arc<Mutex<HashMap<Tenant, Lane<J, R>>>>;

pub(super) struct Group<J, R> {
    queues: Queues<J, R>,
    max: usize,
    flushers: usize,
    flush: Flush<J, R>,
    kind: Grouped,
}

impl<J, R> std::fmt::Debug for Group<J, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("max", &self.max).finish()
    }
}

impl<J, R> Clone for Group<J, R> {
    fn clone(&self) -> Self {
        Group {
            queues: self.queues.clone(),
            max: self.max,
            flushers: self.flushers,
            flush: self.flush.clone(),
            kind: self.kind,
        }
    }
}

impl<J: Send + 'static, R: Send + 'static> Group<J, R> {
    /// Batches of at most `max` jobs (at least one), with up to
    /// `flushers` batches of a tenant in flight at once (at least one).
    pub(super) fn new(kind: Grouped, max: usize, flushers: usize, flush: Flush<J, R>) -> Self {
        Group {
            queues: Arc::default(),
            max: max.max(1),
            flushers: flushers.max(1),
            flush,
            kind,
        }
    }

    /// Batches of at most `max` jobs, up to `flushers` at once, each
    /// flushed by `flush` on a clone of `store` as it is now, before this
    /// group is part of it: the flusher writes on the plain path.
    pub(super) fn on<S, F, Fut>(
        kind: Grouped,
        store: &S,
        max: usize,
        flushers: usize,
        flush: F,
    ) -> Self
    where
        S: Clone + Send + Sync + 'static,
        F: Fn(S, Tenant, Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<R>>> + Send + 'static,
    {
        let store = store.clone();
        Group::new(
            kind,
            max,
            flushers,
            Arc::new(move |tenant, jobs| flush(store.clone(), tenant, jobs).boxed()),
        )
    }

    /// Jobs waiting for the commit in flight to finish (not those in it).
    pub(super) fn queued(&self) -> usize {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues.values().map(|lane| lane.queue.len()).sum()
    }

    /// Queues a job and waits for its outcome.
    pub(super) async fn submit(&self, tenant: &Tenant, job: J) -> Result<R> {
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = queues.entry(tenant.clone()).or_insert_with(|| Lane {
                queue: Vec::new(),
                flushers: 0,
            });
            lane.queue.push(Waiting { job, done });
            let start = lane.flushers < self.flushers;
            if start {
                lane.flushers += 1;
            }
            start
        };
        if start {
            tokio::spawn(drain(self.clone(), tenant.clone()));
        }
        outcome
            .await
            .map_err(|_| Error::internal("a group commit ended without an outcome"))?
    }
}

/// A group's steps (one transaction's statements; see the backends'
/// `run_group`) in lock order: runs of
/// jobs that can share a statement (`shares`) and lock distinct rows
/// (`row`: equal rows are next to each other in lock order) make one step
/// each, every other job is a step of its own.
pub(super) fn shared_steps<K: PartialEq>(
    order: Vec<usize>,
    shares: impl Fn(usize) -> bool,
    row: impl Fn(usize) -> K,
) -> Vec<Vec<usize>> {
    let mut steps: Vec<Vec<usize>> = Vec::new();
    for at in order {
        let joins = steps.last().is_some_and(|step| {
            step.last()
                .is_some_and(|&before| shares(before) && shares(at) && row(before) != row(at))
        });
        match steps.last_mut() {
            Some(step) if joins => step.push(at),
            _ => steps.push(vec![at]),
        }
    }
    steps
}

/// The outcomes of a group whose commit failed: unknown (it may have
/// committed), so every call hears so, and none is retried here. A full
/// database is the exception: it refused the commit, so nothing was
/// written, and every call hears that as it is.
pub(super) fn commit_failed<T>(err: &Error, n: usize) -> Vec<Result<T>> {
    (0..n)
        .map(|_| {
            if let Error::ResourceExhausted {
                reason: crate::error::Reason::DatabaseFull,
                message,
                limit,
                value,
            } = err
            {
                return Err(Error::ResourceExhausted {
                    reason: crate::error::Reason::DatabaseFull,
                    message: message.clone(),
                    limit,
                    value: *value,
                });
            }
            let source = format!(
                "the commit of a group of writes failed: {}",
                crate::error::report(err)
            )
            .into();
            Err(match err {
                Error::Unavailable { .. } => Error::Unavailable { source },
                _ => Error::Internal { source },
            })
        })
        .collect()
}

/// Counts a flusher out of its tenant's lane however it stops, and takes
/// the lane out of the map with the last one: a flusher that panicked must
/// not leave the tenant's writes queued for a flusher that will never come
/// (dropping them tells their callers).
struct Leaving<J, R> {
    queues: Queues<J, R>,
    tenant: Tenant,
    /// Set when the flusher counted itself out.
    left: bool,
}

impl<J, R> Drop for Leaving<J, R> {
    fn drop(&mut self) {
        if !self.left {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            leave(&mut queues, &self.tenant);
        }
    }
}

/// Counts one flusher out of the tenant's lane; the last one removes it.
fn leave<J, R>(queues: &mut HashMap<Tenant, Lane<J, R>>, tenant: &Tenant) {
    if let Some(lane) = queues.get_mut(tenant) {
        lane.flushers = lane.flushers.saturating_sub(1);
        if lane.flushers == 0 {
            queues.remove(tenant);
        }
    }
}

/// Commits the tenant's queue batch by batch until it is empty.
async fn drain<J: Send + 'static, R: Send + 'static>(group: Group<J, R>, tenant: Tenant) {
    let mut leaving = Leaving {
        queues: group.queues.clone(),
        tenant: tenant.clone(),
        left: false,
    };
    loop {
        let batch: Vec<Waiting<J, R>> = {
            let mut queues = group.queues.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(lane) = queues.get_mut(&tenant) else {
                leaving.left = true;
                return;
            };
            if lane.queue.is_empty() {
                // Counted out under the same lock a submitter takes, so a
                // write queued from now on starts a new flusher if needed.
                leave(&mut queues, &tenant);
                leaving.left = true;
                return;
            }
            let n = lane.queue.len().min(group.max);
            lane.queue.drain(..n).collect()
        };
        let (jobs, dones): (Vec<J>, Vec<_>) = batch.into_iter().map(|w| (w.job, w.done)).unzip();
        crate::metrics::global().group(group.kind, jobs.len());
        let outcomes = (group.flush)(tenant.clone(), jobs).await;
        let mut outcomes = outcomes.into_iter();
        for done in dones {
            let outcome = outcomes.next().unwrap_or_else(|| {
                Err(Error::internal("a group commit returned too few outcomes"))
            });
            // A caller that gave up no longer listens.
            let _ = done.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Jobs that arrive while a batch commits form the next batch, each
    /// gets its own outcome, and a job that fails fails alone.
    #[tokio::test]
    async fn waiting_jobs_form_the_next_batch_and_keep_their_outcomes() {
        let (release, gate) = tokio::sync::watch::channel(false);
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let flushes = Arc::new(AtomicUsize::new(0));
        let flush: Flush<i64, i64> = {
            let (sizes, flushes) = (sizes.clone(), flushes.clone());
            Arc::new(move |_tenant, jobs: Vec<i64>| {
                let (sizes, flushes, mut gate) = (sizes.clone(), flushes.clone(), gate.clone());
                async move {
                    // The first batch holds until every other job queued.
                    if flushes.fetch_add(1, Ordering::SeqCst) == 0 {
                        let _ = gate.wait_for(|open| *open).await;
                    }
                    sizes.lock().expect("sizes").push(jobs.len());
                    jobs.into_iter()
                        .map(|n| {
                            if n < 0 {
                                Err(Error::internal("negative"))
                            } else {
                                Ok(n * 10)
                            }
                        })
                        .collect()
                }
                .boxed()
            })
        };
        let group = Group::new(Grouped::Write, 3, 1, flush);
        let tenant = Tenant::new("t");
        let first = tokio::spawn({
            let (group, tenant) = (group.clone(), tenant.clone());
            async move { group.submit(&tenant, 1).await }
        });
        // Wait until the first batch is in flight.
        while flushes.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = [2, -3, 4, 5]
            .into_iter()
            .map(|n| {
                let (group, tenant) = (group.clone(), tenant.clone());
                tokio::spawn(async move { group.submit(&tenant, n).await })
            })
            .collect();
        while group
            .queues
            .lock()
            .expect("queues")
            .get(&tenant)
            .map_or(0, |lane| lane.queue.len())
            < 4
        {
            tokio::task::yield_now().await;
        }
        release.send_replace(true);
        assert_eq!(first.await.expect("join").expect("first"), 10);
        let mut outcomes = Vec::new();
        for job in rest {
            outcomes.push(job.await.expect("join").map_err(|e| e.to_string()));
        }
        assert_eq!(outcomes[0], Ok(20));
        assert!(outcomes[1].is_err(), "the failing job fails");
        assert_eq!((outcomes[2].clone(), outcomes[3].clone()), (Ok(40), Ok(50)));
        // One alone, then the four that waited in batches of at most three.
        assert_eq!(*sizes.lock().expect("sizes"), vec![1, 3, 1]);
        assert!(
            group.queues.lock().expect("queues").is_empty(),
            "the flusher left"
        );
    }

    /// Runs of jobs that share a statement and lock distinct rows make one
    /// step; a row seen again, or a job that cannot share, starts anew.
    #[test]
    fn steps_split_on_a_repeated_row_and_on_jobs_that_cannot_share() {
        // (row, shares), already in lock order.
        let jobs = [
            ("a", true),
            ("b", true),
            ("b", true),
            ("c", true),
            ("c", false),
            ("d", true),
            ("e", true),
            ("f", false),
        ];
        let steps = shared_steps((0..jobs.len()).collect(), |at| jobs[at].1, |at| jobs[at].0);
        assert_eq!(
            steps,
            vec![vec![0, 1], vec![2, 3], vec![4], vec![5, 6], vec![7]]
        );
        // The order given is kept, whatever the indexes.
        let steps = shared_steps(vec![2, 0, 1], |_| true, |at| ["x", "y", "w"][at]);
        assert_eq!(steps, vec![vec![2, 0, 1]]);
        assert!(shared_steps(Vec::new(), |_| true, |at: usize| at).is_empty());
    }
}
