//! The `SearchService` adapter.

use std::collections::BTreeSet;

use tonic::{Request, Response, Status};

use super::consolidation::{fact_to_proto, kind_from_proto};
use super::context::caller_context;
use super::convert::{entry_to_proto, episode_to_proto, optional_timestamp, scope_type_from_proto};
use super::episodes::types;
use super::error::to_status;
use crate::error::{Error, Reason, Result};
use crate::memory::{KeyPrefix, ScopeName};
use crate::ports::Store;
use crate::proto;
use crate::proto::search_service_server::SearchService;
use crate::search::{Filters, Hit, Item, Mode, Query, Search, SearchRequest, Source};
use crate::sessions::{Id, Name};

pub struct SearchApi<S> {
    search: Search<S>,
}

impl<S: Store> SearchApi<S> {
    pub fn new(search: Search<S>) -> Self {
        SearchApi { search }
    }
}

fn source_from_proto(field: &str, n: i32) -> Result<Source> {
    match proto::SearchSource::try_from(n) {
        Ok(proto::SearchSource::Memory) => Ok(Source::Memory),
        Ok(proto::SearchSource::Facts) => Ok(Source::Facts),
        Ok(proto::SearchSource::Episodes) => Ok(Source::Episodes),
        Ok(proto::SearchSource::Unspecified) | Err(_) => Err(Error::invalid(
            Reason::InvalidArgument,
            field,
            format!("unknown search source {n}: use SEARCH_SOURCE_MEMORY, _FACTS or _EPISODES"),
        )),
    }
}

fn source_to_proto(source: Source) -> i32 {
    match source {
        Source::Memory => proto::SearchSource::Memory as i32,
        Source::Facts => proto::SearchSource::Facts as i32,
        Source::Episodes => proto::SearchSource::Episodes as i32,
    }
}

fn mode_from_proto(n: i32) -> Result<Option<Mode>> {
    match proto::SearchMode::try_from(n) {
        Ok(proto::SearchMode::Unspecified) => Ok(None),
        Ok(proto::SearchMode::Lexical) => Ok(Some(Mode::Lexical)),
        Ok(proto::SearchMode::Semantic) => Ok(Some(Mode::Semantic)),
        Ok(proto::SearchMode::Hybrid) => Ok(Some(Mode::Hybrid)),
        Err(_) => Err(Error::invalid(
            Reason::InvalidArgument,
            "mode",
            format!("unknown search mode {n}"),
        )),
    }
}

/// A text field that is empty when unset, parsed when set.
fn optional<T>(
    field: &str,
    text: String,
    parse: impl Fn(&str, String) -> Result<T>,
) -> Result<Option<T>> {
    (!text.is_empty()).then(|| parse(field, text)).transpose()
}

fn request_from_proto(req: proto::SearchRequest) -> Result<SearchRequest> {
    let sources = req
        .sources
        .iter()
        .enumerate()
        .map(|(i, n)| source_from_proto(&format!("sources[{i}]"), *n))
        .collect::<Result<BTreeSet<_>>>()?;
    Ok(SearchRequest {
        query: Query::parse("query", &req.query)?,
        sources,
        mode: mode_from_proto(req.mode)?,
        limit: req.limit,
        filters: Filters {
            scope_type: scope_type_from_proto("scope_type", req.scope_type)?,
            scope: optional("scope", req.scope, ScopeName::parse)?,
            scope_prefix: optional("scope_prefix", req.scope_prefix, KeyPrefix::parse)?,
            key_prefix: optional("key_prefix", req.key_prefix, KeyPrefix::parse)?,
            app: optional("app", req.app, Name::parse)?,
            user: optional("user", req.user, Name::parse)?,
            session_id: optional("session_id", req.session_id, Id::parse)?,
            agent: optional("agent", req.agent, Name::parse)?,
            types: types("types", req.types)?,
            kind: kind_from_proto("kind", req.kind)?,
            start: optional_timestamp("start_time", req.start_time)?,
            end: optional_timestamp("end_time", req.end_time)?,
        },
        following_episodes: req.following_episodes,
    })
}

fn hit_to_proto(hit: Hit) -> proto::SearchHit {
    let source = source_to_proto(hit.source());
    let item = match hit.item {
        Item::Entry(entry) => proto::search_hit::Item::Entry(entry_to_proto(entry)),
        Item::Fact(fact) => proto::search_hit::Item::Fact(fact_to_proto(fact)),
        Item::Episode(episode) => proto::search_hit::Item::Episode(episode_to_proto(episode)),
    };
    proto::SearchHit {
        score: hit.score,
        source,
        snippet: hit.snippet,
        item: Some(item),
    }
}

#[tonic::async_trait]
impl<S: Store> SearchService for SearchApi<S> {
    async fn search(
        &self,
        request: Request<proto::SearchRequest>,
    ) -> Result<Response<proto::SearchResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let parsed = request_from_proto(request.into_inner()).map_err(to_status)?;
        let hits = self.search.search(&ctx, parsed).await.map_err(to_status)?;
        Ok(Response::new(proto::SearchResponse {
            hits: hits.into_iter().map(hit_to_proto).collect(),
        }))
    }
}
