//! The search service: checks a request, asks each source, merges by score.

use std::collections::BTreeSet;

use super::ports::SearchStore;
use super::{Filters, Hit, Item, Mode, Query, Source};
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

/// A following episode's score, relative to the hit it follows.
const FOLLOWING_WEIGHT: f64 = 0.85;

/// The longest snippet of a following episode, in characters.
const PLAIN_SNIPPET_CHARS: usize = 240;

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
}

impl<S: SearchStore + SessionStore> Search<S> {
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
        if !(0..=MAX_FOLLOWING).contains(&request.following_episodes) {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "following_episodes",
                format!(
                    "following_episodes must be from 0 to {MAX_FOLLOWING}, got {}",
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
                "end_time must be after start_time",
            ));
        }
        let sources: Vec<Source> = if request.sources.is_empty() {
            Source::ALL.to_vec()
        } else {
            request.sources.into_iter().collect()
        };
        let mut hits = self
            .store
            .search(&ctx.tenant, &sources, &request.query, filters, limit)
            .await?;
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(limit);
        if request.following_episodes > 0 {
            let following = self
                .following(ctx, &hits, filters, request.following_episodes)
                .await?;
            hits.extend(following);
            hits.sort_by(|a, b| b.score.total_cmp(&a.score));
            hits.truncate(limit);
        }
        Ok(hits)
    }

    /// The episodes after each episode hit in its session that the filters
    /// allow and the hits do not hold yet, each scored below the hit.
    async fn following(
        &self,
        ctx: &CallerContext,
        hits: &[Hit],
        filters: &Filters,
        n: i32,
    ) -> Result<Vec<Hit>> {
        let mut seen: std::collections::HashSet<String> = hits
            .iter()
            .filter_map(|hit| match &hit.item {
                Item::Episode(e) => Some(e.id.clone()),
                _ => None,
            })
            .collect();
        let mut found = Vec::new();
        for hit in hits {
            let Item::Episode(episode) = &hit.item else {
                continue;
            };
            let session = Id::parse("session_id", episode.session_id.clone())?;
            let next = self
                .store
                .list_episodes(
                    &ctx.tenant,
                    &EpisodeQuery {
                        session_id: &session,
                        types: &filters.types,
                        after_seq: episode.seq,
                        limit: i64::from(n),
                    },
                )
                .await?;
            let mut score = hit.score;
            for episode in next {
                score *= FOLLOWING_WEIGHT;
                if !allowed(&episode, filters) || !seen.insert(episode.id.clone()) {
                    continue;
                }
                found.push(Hit {
                    score,
                    snippet: plain_snippet(&episode),
                    item: Item::Episode(episode),
                });
            }
        }
        Ok(found)
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

/// The start of an episode's text, for a hit no word of the query matched.
fn plain_snippet(episode: &Episode) -> String {
    let mut text = String::new();
    super::collect_text(&episode.content, &mut text);
    let text = text.trim();
    match text.char_indices().nth(PLAIN_SNIPPET_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
