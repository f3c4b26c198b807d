//! What search needs from persistence: each source's best live items for a
//! parsed query. How a store matches and ranks is its own (each keeps a
//! lexical index in the writing transaction); what it must keep is that
//! only live items are found, only in the caller's tenant, best first,
//! with scores comparable across the sources of one store.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::{Filters, Hit, Item, Query, Source};
use crate::context::Tenant;
use crate::error::Result;

pub trait SearchStore: Clone + Send + Sync + 'static {
    /// The best `limit` live items of `sources` matching `query` and the
    /// filters that apply to each, best first, scored on one scale: each
    /// word weighed among the items of every source searched. One call
    /// for every source, so a store prepares the query and holds a
    /// connection once, and reads whole only the hits it returns.
    fn search(
        &self,
        tenant: &Tenant,
        sources: &[Source],
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Hit>>> + Send;

    /// Merges what recent writes added to the search indexes but left
    /// aside (Postgres's GIN pending lists, which every search reads whole)
    /// into the indexes; returns how many pages were merged. On SQLite, the
    /// FTS5 segments each write transaction adds (a search reads every
    /// segment), merged likewise.
    fn merge_search_pending(&self) -> impl Future<Output = Result<u64>> + Send;

    /// A count that grows with every write to the searchable tables (on
    /// Postgres every replica's, as the database counts them: a busy
    /// connection reports within a second, an idle one within about ten;
    /// on SQLite the store's own): the
    /// server merges the pending lists only once it stops growing, so a
    /// write burst's merges stay with the writes that fill a list, in the
    /// large batches that cost least.
    fn search_writes(&self) -> impl Future<Output = Result<i64>> + Send;
}

/// An item waiting in the embedding outbox: which item, at which version
/// (an episode's `seq`), and the claim's attempt count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The outbox row.
    pub id: i64,
    pub tenant: Tenant,
    pub item: ItemRef,
    /// How many times it was claimed, this claim included.
    pub attempts: i32,
}

/// An item by its identity, as the outbox and the nearest-vector search
/// name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ItemRef {
    Memory {
        scope_type: i16,
        scope: String,
        key: String,
        version: i64,
    },
    Fact {
        id: String,
        version: i64,
    },
    Episode {
        session_id: String,
        seq: i64,
    },
}

/// A vector computed for an item (`None`: the item is gone), and the
/// outbox entry it came from, if any.
#[derive(Debug, Clone)]
pub struct Embedded {
    pub tenant: Tenant,
    pub item: ItemRef,
    pub vector: Option<Vector>,
    pub outbox: Option<i64>,
}

/// What [`EmbeddingStore::store_vectors`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// How many vectors it stored.
    pub vectors: usize,
    /// Where in its `done` the items are that another transaction held
    /// (most often about to delete them): nothing was stored on them or
    /// removed from the outbox, for the caller to try again.
    pub busy: Vec<usize>,
}

/// An encoded vector and the input it was computed from: stored only on an
/// item that still reads as that input, since a reference names a place
/// that a purge and a new write (or a deleted session made again) can
/// fill with another text while the embedder call is in flight.
#[derive(Debug, Clone)]
pub struct Vector {
    pub input: String,
    pub encoded: Vec<u8>,
}

/// What the embedding worker and semantic search need from persistence.
/// The outbox is filled by the writing transaction itself (each backend's
/// triggers, once an embedder has been recorded with
/// [`set_embedder`](Self::set_embedder)); vectors live on the item's row,
/// so they go when it goes.
pub trait EmbeddingStore: Clone + Send + Sync + 'static {
    /// Records the embedder's model: from now on every write queues its
    /// item, on every replica.
    fn set_embedder(&self, model: &str) -> impl Future<Output = Result<()>> + Send;

    /// Claims up to `limit` due outbox items, every tenant's, as `claim`
    /// until `lease_until` (past it another worker may take them).
    fn claim_pending(
        &self,
        claim: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Pending>>> + Send;

    /// Stores each vector on its item if that is still the live version
    /// and still reads as the vector's input (its row held meanwhile), and
    /// clears the vectors of the item's older versions; removes the
    /// outbox entries named, for as long as `claim` holds them. An entry
    /// with no vector (its item is gone) is only removed.
    ///
    /// It never waits for a row another transaction holds (Postgres): an
    /// item held is left as it is, its entry still claimed, and reported
    /// busy; an older version or an entry held is left to its holder. A
    /// background writer that waited while holding the rows of a batch
    /// would deadlock with a purge or a forget taking the same rows in
    /// another order, and Postgres might fail the client's call.
    fn store_vectors(
        &self,
        claim: Option<&str>,
        model: &str,
        done: &[Embedded],
    ) -> impl Future<Output = Result<Stored>> + Send;

    /// Gives claimed entries back, due again at `due`.
    fn release_pending(
        &self,
        claim: &str,
        pending: &[Pending],
        due: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Live items of one source, every tenant's, with no vector of `model`
    /// and not in the outbox, in a stable order after `after` (a previous
    /// page's last): what `engram reembed` backfills. Each comes as what
    /// it is embedded as ([`input`]), read a row at a time, so a page of
    /// megabyte values never holds them all.
    ///
    /// [`input`]: super::embedder::input
    fn unembedded(
        &self,
        source: Source,
        model: &str,
        after: Option<&(Tenant, ItemRef)>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Tenant, ItemRef, String)>>> + Send;

    /// How many live items have no vector of `model`, per source.
    fn count_unembedded(
        &self,
        source: Source,
        model: &str,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// How many entries the outbox holds.
    fn pending_count(&self) -> impl Future<Output = Result<i64>> + Send;

    /// For each of `sources`, the live items the filters allow that have a
    /// vector of `model`, at most [`MAX_VECTORS`] of each (the newest), as
    /// their identities and vectors: the candidates a semantic search
    /// ranks.
    fn vectors(
        &self,
        tenant: &Tenant,
        sources: &[Source],
        model: &str,
        filters: &Filters,
    ) -> impl Future<Output = Result<Vec<(ItemRef, Vec<u8>)>>> + Send;

    /// The live items named, in that order (`None`: gone since).
    fn items(
        &self,
        tenant: &Tenant,
        refs: &[ItemRef],
    ) -> impl Future<Output = Result<Vec<Option<Item>>>> + Send;

    /// What the live items named are embedded as ([`input`]), in that
    /// order (`None`: gone since): an embedding worker's batch, each item
    /// read and clipped before the next is read.
    ///
    /// [`input`]: super::embedder::input
    fn inputs(
        &self,
        tenant: &Tenant,
        refs: &[ItemRef],
    ) -> impl Future<Output = Result<Vec<Option<String>>>> + Send;
}

/// The most vectors a semantic search compares per source: the bound on a
/// query whose filters allow more (the newest are compared). Measured on a
/// 2-core machine with 768-dimension vectors (README, Benchmarks), 5,000
/// cost about 35 ms, the latency target's edge; 20,000 cost 145 ms.
pub const MAX_VECTORS: usize = 5_000;
