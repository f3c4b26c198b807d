//! The ports the domain needs from persistence, in one place: each domain
//! module declares its own (`memory::ports`, `sessions::ports`,
//! `consolidation::ports`, `working::ports`); here are the ordered feeds
//! they share and [`Store`], everything together, which `store/`
//! implements once per backend. Dependencies run one way: `store/`
//! implements these, the domain and the gRPC edge use them, and neither
//! knows which backend is behind them.

use std::future::Future;

use crate::error::Result;
use crate::metrics::PoolStatus;

pub use crate::consolidation::ports::ConsolidationStore;
pub use crate::data::DataStore;
pub use crate::memory::ports::MemoryStore;
pub use crate::search::ports::{EmbeddingStore, SearchStore};
pub use crate::sessions::ports::SessionStore;
pub use crate::working::ports::WorkingStore;

/// The ordered feeds readers follow: each position is final once it is at
/// or below the feed's settled horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Memory changes, by revision (`MemoryService.Watch`).
    Changes = 0,
    /// Episodes, by cursor (`EpisodeService.TailEpisodes`).
    Episodes = 1,
}

impl Feed {
    /// Both feeds, in order.
    pub const ALL: [Feed; 2] = [Feed::Changes, Feed::Episodes];

    /// The feed's name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Feed::Changes => "changes",
            Feed::Episodes => "episodes",
        }
    }
}

/// Where the feeds stand.
pub trait Feeds: Clone + Send + Sync + 'static {
    /// The settled horizon of a feed: every position at or below it is
    /// final (committed or never to appear), so readers may read up to it
    /// without missing a late commit. Updated as writes commit.
    fn horizon(
        &self,
        feed: Feed,
    ) -> impl Future<Output = Result<tokio::sync::watch::Receiver<i64>>> + Send;

    /// A horizon covering every write committed before the call: waits
    /// until nothing at or below the feed's newest position can still
    /// appear, then returns that position. For reads that must see the
    /// caller's own writes (a `RunRule` right after an append), where the
    /// shared [`horizon`](Self::horizon) may still be catching up.
    fn settled(&self, feed: Feed) -> impl Future<Output = Result<i64>> + Send;
}

/// The database itself: its schema, its health, its connections.
pub trait Database: Clone + Send + Sync + 'static {
    /// Applies the pending migrations.
    fn migrate(&self) -> impl Future<Output = Result<()>> + Send {
        self.migrate_through(None)
    }

    /// Applies the pending migrations up to and including `version` (all
    /// with `None`): for tests that load data into an older schema and
    /// check what a migration makes of it.
    fn migrate_through(&self, version: Option<i64>) -> impl Future<Output = Result<()>> + Send;

    /// What the database holds of this binary's migrations: applied,
    /// pending, or newer ones (`--migrate=off`, `engram migrate --check`).
    fn migrations(&self) -> impl Future<Output = Result<crate::store::Migrations>> + Send;

    /// A cheap round trip to the database, for health checks.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// Refreshes the planner's statistics of the tables that have grown
    /// since they were taken, so that plans made while a table was nearly
    /// empty (which read it whole) are made again; returns how many tables
    /// were analyzed. Postgres: doubled (migration 0019); SQLite: of 1,000
    /// rows or more, and without statistics or grown tenfold.
    fn analyze_grown(&self) -> impl Future<Output = Result<u64>> + Send;

    /// The connection pool now, for the metrics.
    fn pool_status(&self) -> PoolStatus;

    /// Refuses new work, waits for the calls holding connections to finish,
    /// then closes every connection: the last step of a graceful shutdown.
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// Everything the domain needs from one backend.
pub trait Store:
    MemoryStore
    + DataStore
    + SessionStore
    + ConsolidationStore
    + WorkingStore
    + SearchStore
    + EmbeddingStore
    + Feeds
    + Database
{
}

impl<S> Store for S where
    S: MemoryStore
        + DataStore
        + SessionStore
        + ConsolidationStore
        + WorkingStore
        + SearchStore
        + EmbeddingStore
        + Feeds
        + Database
{
}
