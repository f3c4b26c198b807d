//! `SearchService` through a real server on both stores: what is found
//! (live items of every source, with marked snippets), ranking, every
//! filter, tenant isolation, removals that take effect in the call that
//! made them, writes found as soon as they return (also under a burst of
//! concurrent writers), and refusals with their fields and reasons. How
//! the server reads text itself is in `search_vectors`. Here: the helpers
//! the cases share (and other search tests use), a file per concern below.

mod filters;
mod found;
mod freshness;
mod refusals;

use engram::api::convert::json_to_proto;
use engram::proto::search_hit::Item;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::{
    AppendEpisodesRequest, NewEpisode, RememberRequest, ScopeType, SearchHit, SearchRequest,
    SearchSource, SetRequest,
};
use tonic::transport::Channel;

use crate::helpers::TestServer;

pub(crate) const NS: i32 = ScopeType::Namespace as i32;
const MEMORY: i32 = SearchSource::Memory as i32;
const FACTS: i32 = SearchSource::Facts as i32;
pub(crate) const EPISODES: i32 = SearchSource::Episodes as i32;

fn search_client(server: &TestServer) -> SearchServiceClient<Channel> {
    SearchServiceClient::new(server.channel.clone())
}

pub(crate) fn query(text: &str) -> SearchRequest {
    SearchRequest {
        query: text.to_owned(),
        ..SearchRequest::default()
    }
}

pub(crate) async fn search(server: &TestServer, request: SearchRequest) -> Vec<SearchHit> {
    search_client(server)
        .search(request)
        .await
        .expect("search")
        .into_inner()
        .hits
}

/// What a hit names: `memory:scope/key@version`, `fact:subject`,
/// `episode:id`.
pub(crate) fn name(hit: &SearchHit) -> String {
    match hit.item.as_ref().expect("item") {
        Item::Entry(e) => format!("memory:{}/{}@{}", e.scope, e.key, e.version),
        Item::Fact(f) => format!(
            "fact:{}",
            f.current.as_ref().map(|v| v.subject.as_str()).unwrap_or("")
        ),
        Item::Episode(e) => format!("episode:{}", e.id),
    }
}

/// A search of memory only.
pub(crate) fn memory_query(text: &str) -> SearchRequest {
    SearchRequest {
        sources: vec![MEMORY],
        ..query(text)
    }
}

pub(crate) fn names(hits: &[SearchHit]) -> Vec<String> {
    hits.iter().map(name).collect()
}

pub(crate) fn set(scope: &str, key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

pub(crate) fn episode(id: &str, kind: &str, agent: &str, content: serde_json::Value) -> NewEpisode {
    NewEpisode {
        id: id.to_owned(),
        agent: agent.to_owned(),
        r#type: kind.to_owned(),
        content: Some(json_to_proto(&content)),
        ..NewEpisode::default()
    }
}

pub(crate) fn append(
    session: &str,
    user: &str,
    episodes: Vec<NewEpisode>,
) -> AppendEpisodesRequest {
    AppendEpisodesRequest {
        session_id: session.to_owned(),
        app: "app".to_owned(),
        user: user.to_owned(),
        episodes,
        require_session: false,
    }
}

pub(crate) fn remember(session: &str, user: &str, subject: &str, content: &str) -> RememberRequest {
    RememberRequest {
        session_id: session.to_owned(),
        app: "app".to_owned(),
        user: user.to_owned(),
        content: content.to_owned(),
        subject: subject.to_owned(),
        predicate: "uses".to_owned(),
        object: String::new(),
        request_id: String::new(),
    }
}

/// Fails listing the first of `differ` (what Rust and Postgres made
/// differently) unless it is empty.
pub(crate) fn assert_none_differ(differ: &[String]) {
    assert!(
        differ.is_empty(),
        "{} differ: {:#?}",
        differ.len(),
        &differ[..differ.len().min(20)]
    );
}
