//! How many searches a replica runs at once (`--search-concurrency`); the
//! rest wait their turn, in order of arrival.
//!
//! A lexical search is the heaviest statement the database runs for a
//! call (about 1.5 ms of its CPU on the bench machine, mostly visiting each
//! match's row), and a semantic one the heaviest work of the server. More
//! of them at once than there are cores to run them only switches between
//! them: on the 2-core bench machine, 16 clients searching through 16
//! connections got 697–879 searches/s with p99 54–73 ms, and through 4
//! connections 875–942 with p99 26–29 ms. Turns give searches that bound
//! without shrinking the pool: a turn is taken for the whole search, and
//! other calls keep the pool's other connections (4 turns against 16:
//! 936–944 against 875–922 searches/s, p99 26–29 against 54–58 ms).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// The turns of one replica's searches; clones share them.
#[derive(Debug, Clone)]
pub struct Turns {
    permits: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
}

/// The default: twice the CPUs this process may use (its cgroup's quota
/// included), and at least two.
pub fn default_at_once() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .saturating_mul(2)
        .max(2)
}

impl Turns {
    /// `at_once` searches at a time (at least one).
    pub fn new(at_once: usize) -> Self {
        Turns {
            permits: Arc::new(Semaphore::new(at_once.max(1))),
            waiting: Arc::default(),
        }
    }

    /// Waits for a turn; it ends when the permit is dropped. A caller that
    /// gives up while waiting leaves the queue.
    pub async fn take(&self) -> Result<OwnedSemaphorePermit> {
        let _waiting = Waiting::count(&self.waiting);
        self.permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::internal("the search turns were closed"))
    }

    /// Searches waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// Counts a search as waiting until it has its turn or gives up.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search past the limit waits, counted, until a turn ends; one that
    /// gives up while waiting is no longer counted.
    #[tokio::test]
    async fn searches_past_the_limit_wait_their_turn() {
        let turns = Turns::new(1);
        let first = turns.take().await.expect("a free turn");
        let second = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take().await.map(drop) }
        });
        let gives_up = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take().await.map(drop) }
        });
        while turns.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        assert!(!second.is_finished() && !gives_up.is_finished());
        gives_up.abort();
        assert!(gives_up.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(turns.waiting(), 1);
        drop(first);
        second.await.expect("join").expect("the next turn");
        assert_eq!(turns.waiting(), 0);
        assert!(default_at_once() >= 2);
    }
}
