//! What search needs from persistence: each source's best live items for a
//! parsed query. How a store matches and ranks is its own (each keeps a
//! lexical index in the writing transaction); what it must keep is that
//! only live items are found, only in the caller's tenant, best first,
//! with scores comparable across the sources of one store.

use std::future::Future;

use super::{Filters, Hit, Query, Source};
use crate::context::Tenant;
use crate::error::Result;

pub trait SearchStore: Clone + Send + Sync + 'static {
    /// For each of `sources`, its best `limit` live items matching `query`
    /// and the filters that apply to it. One call for every source, so a
    /// store prepares the query and holds a connection once.
    fn search(
        &self,
        tenant: &Tenant,
        sources: &[Source],
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Hit>>> + Send;
}
