//! The search service: checks a request, asks each source, merges by score.

use std::collections::BTreeSet;

use super::ports::SearchStore;
use super::{Filters, Hit, Mode, Query, Source};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};

/// Hits returned when a request names no limit.
pub const DEFAULT_LIMIT: usize = 10;

/// The most hits one request may ask for.
pub const MAX_LIMIT: usize = 100;

/// A search as the edge parsed it.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub query: Query,
    /// Empty: every source.
    pub sources: BTreeSet<Source>,
    /// `None`: the server's default (lexical, until an embedder is
    /// configured).
    pub mode: Option<Mode>,
    /// 0: the default.
    pub limit: i32,
    pub filters: Filters,
}

#[derive(Clone)]
pub struct Search<S> {
    store: S,
}

impl<S: SearchStore> Search<S> {
    pub fn new(store: S) -> Self {
        Search { store }
    }

    /// The best hits across the requested sources, best first.
    pub async fn search(&self, ctx: &CallerContext, request: SearchRequest) -> Result<Vec<Hit>> {
        let limit = match request.limit {
            0 => DEFAULT_LIMIT,
            n if n > 0 && n as usize <= MAX_LIMIT => n as usize,
            n => {
                return Err(Error::invalid(
                    Reason::InvalidArgument,
                    "limit",
                    format!("limit must be from 1 to {MAX_LIMIT} (0: {DEFAULT_LIMIT}), got {n}"),
                ));
            }
        };
        match request.mode.unwrap_or(Mode::Lexical) {
            Mode::Lexical => {}
            Mode::Semantic | Mode::Hybrid => {
                return Err(Error::FailedPrecondition {
                    reason: Reason::EmbedderNotConfigured,
                    message: "semantic and hybrid search need an embeddings endpoint: start the \
                              server with --embedder-url (ENGRAM_EMBEDDER_URL)"
                        .to_owned(),
                });
            }
        }
        let filters = &request.filters;
        if filters.scope.is_some() && filters.scope_type.is_none() {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "scope",
                "a scope needs its scope_type",
            ));
        }
        if let (Some(start), Some(end)) = (filters.start, filters.end)
            && start >= end
        {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "end_time",
                "end_time must be after start_time",
            ));
        }
        let sources: Vec<Source> = if request.sources.is_empty() {
            Source::ALL.to_vec()
        } else {
            request.sources.into_iter().collect()
        };
        let mut hits = Vec::new();
        for source in sources {
            hits.extend(
                self.store
                    .search(&ctx.tenant, source, &request.query, filters, limit)
                    .await?,
            );
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(limit);
        Ok(hits)
    }
}
