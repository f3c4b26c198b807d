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
    /// The best `limit` live items of `source` matching `query` and the
    /// filters that apply to it, best first.
    fn search(
        &self,
        tenant: &Tenant,
        source: Source,
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Hit>>> + Send;
}
