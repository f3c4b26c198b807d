//! `SessionService` and `EpisodeService` over gRPC, on both stores: ids and
//! owners, idempotent appends, dense seq under concurrent appenders,
//! widening reads, type filters, the context text, limits and eviction,
//! cleanup, stats, cascade delete, and the HTTP endpoints.
//!
//! Here: the request builders and readers the cases share; a file per
//! concern below.

mod appends;
mod reads;
mod sessions;

use engram::api::convert::json_to_proto;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::{
    AppendEpisodeRequest, CreateSessionRequest, Episode, ListEpisodesRequest, NewEpisode,
};
use tonic::transport::Channel;

fn create(app: &str, user: &str, id: &str) -> CreateSessionRequest {
    CreateSessionRequest {
        app: app.to_owned(),
        user: user.to_owned(),
        session_id: id.to_owned(),
        metadata: None,
        request_id: String::new(),
    }
}

fn new_episode(id: &str, kind: &str, content: serde_json::Value) -> NewEpisode {
    NewEpisode {
        id: id.to_owned(),
        r#type: kind.to_owned(),
        content: Some(json_to_proto(&content)),
        ..NewEpisode::default()
    }
}

fn append(session: &str, episode: NewEpisode) -> AppendEpisodeRequest {
    AppendEpisodeRequest {
        session_id: session.to_owned(),
        episode: Some(episode),
        ..AppendEpisodeRequest::default()
    }
}

/// An append that creates the session when it is missing.
fn append_as(app: &str, user: &str, session: &str, episode: NewEpisode) -> AppendEpisodeRequest {
    AppendEpisodeRequest {
        session_id: session.to_owned(),
        app: app.to_owned(),
        user: user.to_owned(),
        episode: Some(episode),
        require_session: false,
    }
}

fn list(session: &str) -> ListEpisodesRequest {
    ListEpisodesRequest {
        session_id: session.to_owned(),
        ..ListEpisodesRequest::default()
    }
}

async fn all_episodes(client: &mut EpisodeServiceClient<Channel>, session: &str) -> Vec<Episode> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_episodes(ListEpisodesRequest {
                page_token: token,
                page_size: 1000,
                ..list(session)
            })
            .await
            .expect("list episodes")
            .into_inner();
        out.extend(page.episodes);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

fn content_text(episode: &Episode) -> String {
    match episode.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(prost_types::value::Kind::StringValue(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}
