//! The search service: checks a request, asks the store (and the embedder), fuses the lists.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::embedder::{Embedder, similarity};
use super::ports::{EmbeddingStore, ItemRef, SearchStore};
use super::turns::Turns;
use super::{Filters, Hit, Item, Mode, Query, Source, spelling};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::sessions::ports::{EpisodeQuery, SessionStore};
use crate::sessions::{Episode, Id};

/// Hits returned when a request names no limit.
pub const DEFAULT_LIMIT: usize = 10;

/// The most hits one request may ask for.
pub const MAX_LIMIT: usize = 100;

/// The most following episodes a request may ask for per episode hit.
pub const MAX_FOLLOWING: i32 = 3;

/// Reciprocal rank fusion's constant: a hit at rank r (from 1) of a list
/// adds 1 / (RRF_K + r) to its hybrid score.
const RRF_K: f64 = 60.0;

/// A following episode's score, relative to the hit it follows.
const FOLLOWING_WEIGHT: f64 = 0.85;

/// The longest snippet of a following episode, in characters.
const PLAIN_SNIPPET_CHARS: usize = 240;

/// How many semantic hits are read by one call of the store: the default
/// limit in one call, more in steps that stop where the answer is full.
const ITEMS_AT_ONCE: usize = DEFAULT_LIMIT;

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
    /// Episodes that follow each episode hit to add (0 to [`MAX_FOLLOWING`]).
    pub following_episodes: i32,
}

#[derive(Clone)]
pub struct Search<S> {
    store: S,
    embedder: Option<Arc<dyn Embedder>>,
    turns: Turns,
}

impl<S: SearchStore + EmbeddingStore + SessionStore> Search<S> {
    /// Without an embedder, only lexical search; searches run in `turns`.
    pub fn new(store: S, embedder: Option<Arc<dyn Embedder>>, turns: Turns) -> Self {
        Search {
            store,
            embedder,
            turns,
        }
    }

    /// The turns its searches run in.
    pub fn turns(&self) -> &Turns {
        &self.turns
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
                    format!("must be from 1 to {MAX_LIMIT} (0 means {DEFAULT_LIMIT}), got {n}"),
                ));
            }
        };
        let mode = request.mode.unwrap_or(if self.embedder.is_some() {
            Mode::Hybrid
        } else {
            Mode::Lexical
        });
        let embedder = match (mode, &self.embedder) {
            (Mode::Lexical, _) => None,
            (_, Some(embedder)) => Some(embedder.as_ref()),
            (Mode::Semantic | Mode::Hybrid, None) => {
                return Err(Error::FailedPrecondition {
                    reason: Reason::EmbedderNotConfigured,
                    message: "semantic and hybrid search need an embeddings endpoint: start the \
                              server with --embedder-url (ENGRAM_EMBEDDER_URL)"
                        .to_owned(),
                });
            }
        };
        if !(0..=MAX_FOLLOWING).contains(&request.following_episodes) {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "following_episodes",
                format!(
                    "must be from 0 to {MAX_FOLLOWING}, got {}",
                    request.following_episodes
                ),
            ));
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
                "must be after start_time",
            ));
        }
        let sources: Vec<Source> = if request.sources.is_empty() {
            Source::ALL.to_vec()
        } else {
            request.sources.into_iter().collect()
        };
        let query = &request.query;
        let _turn = self.turns.take().await?;
        let mut hits = match (mode, embedder) {
            (Mode::Semantic, Some(embedder)) => {
                self.semantic(ctx, embedder, &sources, query, filters, limit)
                    .await?
            }
            (Mode::Hybrid, Some(embedder)) => {
                let lexical = self.lexical(ctx, &sources, query, filters, limit).await?;
                match self
                    .semantic(ctx, embedder, &sources, query, filters, limit)
                    .await
                {
                    Ok(semantic) => fuse(lexical, semantic),
                    // The default mode keeps answering, by words, while the
                    // embedder is away; an explicit semantic search fails.
                    Err(err @ Error::DependencyUnavailable { .. }) => {
                        tracing::warn!(error = %crate::error::report(&err), "hybrid search fell back to lexical");
                        lexical
                    }
                    Err(err) => return Err(err),
                }
            }
            _ => self.lexical(ctx, &sources, query, filters, limit).await?,
        };
        hits.truncate(limit);
        if request.following_episodes > 0 {
            hits = self
                .with_following(ctx, hits, filters, request.following_episodes, limit)
                .await?;
        }
        // The best that fit one answer: big items make them fewer.
        hits.truncate(crate::paging::fitting(&hits));
        Ok(hits)
    }

    /// The best lexical hits, best first.
    async fn lexical(
        &self,
        ctx: &CallerContext,
        sources: &[Source],
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        self.store
            .search(&ctx.tenant, sources, query, filters, limit)
            .await
    }

    /// The items whose vectors are nearest the query's, best first, scored
    /// by cosine similarity: every vector the filters allow (up to
    /// `MAX_VECTORS` per source) compared here.
    async fn semantic(
        &self,
        ctx: &CallerContext,
        embedder: &dyn Embedder,
        sources: &[Source],
        query: &Query,
        filters: &Filters,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let vector = embedder
            .embed(std::slice::from_ref(&query.meaning))
            .await
            .map_err(|err| Error::DependencyUnavailable {
                reason: Reason::EmbedderUnavailable,
                message: format!("the embedder failed: {err}"),
            })?
            .pop()
            .ok_or_else(|| Error::internal("the embedder returned no vector"))?;
        let candidates = self
            .store
            .vectors(&ctx.tenant, sources, embedder.model(), filters)
            .await?;
        let mut scored: Vec<(f32, ItemRef)> = candidates
            .into_iter()
            .filter_map(|(item, stored)| similarity(&vector, &stored).map(|s| (s, item)))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        // Room for hits an excluded word drops.
        scored.truncate(if query.excluded.is_empty() {
            limit
        } else {
            limit * 2
        });
        // Read a few at a time, best first, and only as far as the answer
        // carries: a hundred hits of a megabyte are not all held at once.
        let mut hits = crate::paging::Weighed::default();
        'read: for chunk in scored.chunks(ITEMS_AT_ONCE) {
            let refs: Vec<ItemRef> = chunk.iter().map(|(_, item)| item.clone()).collect();
            let items = self.store.items(&ctx.tenant, &refs).await?;
            for ((score, _), item) in chunk.iter().zip(items) {
                let Some(item) = item.filter(|item| !query.excludes(&item.text())) else {
                    continue;
                };
                hits.push(Hit {
                    score: f64::from(*score),
                    snippet: plain_snippet(&item.visible_text()),
                    item,
                });
                if hits.full || hits.items.len() == limit {
                    break 'read;
                }
            }
        }
        Ok(hits.items)
    }

    /// The hits with the episodes after each episode hit in its session
    /// that the filters allow and the hits do not hold yet, each scored
    /// below the hit, best first: the best `limit` that fit one answer.
    /// The answer is cut after each hit's episodes are added, so what is
    /// held stays about one answer (a hit cut then would be cut at the
    /// end too: more hits only push it further down).
    async fn with_following(
        &self,
        ctx: &CallerContext,
        mut hits: Vec<Hit>,
        filters: &Filters,
        n: i32,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let anchors: Vec<(String, i64, f64)> = hits
            .iter()
            .filter_map(|hit| match &hit.item {
                Item::Episode(e) => Some((e.session_id.clone(), e.seq, hit.score)),
                _ => None,
            })
            .collect();
        let mut seen: std::collections::HashSet<String> = hits
            .iter()
            .filter_map(|hit| match &hit.item {
                Item::Episode(e) => Some(e.id.clone()),
                _ => None,
            })
            .collect();
        for (session, seq, mut score) in anchors {
            let session = Id::parse("session_id", session)?;
            let next = self
                .store
                .list_episodes(
                    &ctx.tenant,
                    &EpisodeQuery {
                        session_id: &session,
                        types: &filters.types,
                        after_seq: seq,
                        limit: i64::from(n),
                    },
                )
                .await?;
            for episode in next {
                score *= FOLLOWING_WEIGHT;
                if !allowed(&episode, filters) || !seen.insert(episode.id.clone()) {
                    continue;
                }
                let item = Item::Episode(episode);
                hits.push(Hit {
                    score,
                    snippet: plain_snippet(&item.visible_text()),
                    item,
                });
            }
            hits.sort_by(|a, b| b.score.total_cmp(&a.score));
            hits.truncate(limit);
            hits.truncate(crate::paging::fitting(&hits));
        }
        Ok(hits)
    }
}

/// Whether an episode passes the filters its session did not settle.
fn allowed(episode: &Episode, filters: &Filters) -> bool {
    filters
        .agent
        .as_ref()
        .is_none_or(|agent| agent.as_str() == episode.agent)
        && filters.start.is_none_or(|start| episode.timestamp >= start)
        && filters.end.is_none_or(|end| episode.timestamp < end)
}

/// The start of an item's text as a reader sees it
/// ([`Item::visible_text`]), composed as every snippet is
/// ([`spelling::composed`]), for a hit no word of the query marked.
fn plain_snippet(text: &str) -> String {
    let text = spelling::composed(text);
    let text = text.trim();
    match text.char_indices().nth(PLAIN_SNIPPET_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Merges a lexical and a semantic list by reciprocal rank fusion: each
/// item scores the sum of 1 / (`RRF_K` + its rank) over the lists holding
/// it, and keeps the lexical snippet (its matched words marked) when it
/// has one.
fn fuse(lexical: Vec<Hit>, semantic: Vec<Hit>) -> Vec<Hit> {
    let mut fused: Vec<Hit> = Vec::with_capacity(lexical.len() + semantic.len());
    let mut at: HashMap<ItemRef, usize> = HashMap::new();
    for list in [lexical, semantic] {
        for (rank, hit) in list.into_iter().enumerate() {
            let score = 1.0 / (RRF_K + rank as f64 + 1.0);
            match at.entry(hit.item.reference()) {
                Entry::Occupied(i) => fused[*i.get()].score += score,
                Entry::Vacant(slot) => {
                    slot.insert(fused.len());
                    fused.push(Hit { score, ..hit });
                }
            }
        }
    }
    fused.sort_by(|a, b| b.score.total_cmp(&a.score));
    fused
}
