//! Sessions: the list, a session's episodes with its live tail, one
//! episode whole.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use maud::{Markup, html};
use serde::Deserialize;

use super::{AppUserQuery, IdQuery, PAGE, link, next_link, preview};
use crate::cli::{time, value_json};
use crate::console::actions::{csrf_field, csrf_token};
use crate::console::{Console, Params, page, refused};
use crate::proto;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::session_service_client::SessionServiceClient;
use crate::proto::working_memory_service_client::WorkingMemoryServiceClient;

/// Sessions, newest first, filtered by app and user.
pub async fn sessions(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<AppUserQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let listed = call!(
        SessionServiceClient::new(conn).list_sessions(proto::ListSessionsRequest {
            app: query.app.clone(),
            user: query.user.clone(),
            page_size: PAGE,
            page_token: query.page.clone(),
        })
    );
    page(
        "Sessions",
        html! {
            h1 { "Sessions" }
            form method="get" action="/ui/sessions" {
                label for="app" { "App" } input id="app" name="app" value=(query.app);
                label for="user" { "User" } input id="user" name="user" value=(query.user);
                button type="submit" { "Filter" }
            }
            @if listed.sessions.is_empty() {
                p.empty { "No sessions." }
            } @else {
                table {
                    thead { tr { th { "Session" } th { "App" } th { "User" } th { "Created" } th { "Last activity" } th.num { "Episodes" } th { "Ended" } } }
                    tbody {
                        @for s in &listed.sessions {
                            tr {
                                td { a href=(link("/ui/session", &[("id", &s.id)])) { (s.id) } }
                                td { (s.app) } td { (s.user) }
                                td { (time(s.create_time.as_ref())) }
                                td { (time(s.update_time.as_ref())) }
                                td.num { (s.episode_count) }
                                td { (time(s.end_time.as_ref())) }
                            }
                        }
                    }
                }
            }
            (next_link("/ui/sessions", &[("app", &query.app), ("user", &query.user)], &listed.next_page_token))
        },
    )
}

#[derive(Deserialize)]
pub struct SessionQuery {
    id: String,
    /// Start the log after this seq (how an episode's link lands on it).
    #[serde(default)]
    after: i64,
    #[serde(default)]
    page: String,
}

/// Where an episode is shown in its session's log: the page that starts
/// with it, scrolled to its row.
pub(super) fn episode_href(e: &proto::Episode) -> String {
    let after = (e.seq - 1).max(0).to_string();
    format!(
        "{}#episode-{}",
        link("/ui/session", &[("id", &e.session_id), ("after", &after)]),
        e.id
    )
}

fn episode_row(e: &proto::Episode) -> Markup {
    html! {
        tr id=(format!("episode-{}", e.id)) {
            td.num { (e.seq) }
            td { (time(e.timestamp.as_ref())) }
            td { (e.r#type) }
            td { (e.agent) }
            td { code { (preview(&value_json(e.content.clone()))) } }
        }
    }
}

/// A session: its episodes (with a live tail), its working memory.
pub async fn session(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<SessionQuery>,
) -> Response {
    let crate::console::Visitor { conn, admin } = visitor!(console, headers);
    let csrf = csrf_token(&console, &headers);
    let session = call!(SessionServiceClient::new(conn.clone()).get_session(
        proto::GetSessionRequest {
            session_id: query.id.clone(),
            ..Default::default()
        }
    ))
    .session
    .unwrap_or_default();
    let listed = call!(EpisodeServiceClient::new(conn.clone()).list_episodes(
        proto::ListEpisodesRequest {
            session_id: query.id.clone(),
            after_seq: query.after,
            page_size: 100,
            page_token: query.page.clone(),
            ..Default::default()
        }
    ));
    let block = call!(WorkingMemoryServiceClient::new(conn).render_memory_block(
        proto::RenderMemoryBlockRequest {
            session_id: query.id.clone(),
            ..Default::default()
        }
    ));
    let last_cursor = listed.episodes.last().map_or(0, |e| e.cursor);
    let last_page = listed.next_page_token.is_empty();
    page(
        &session.id,
        html! {
            p.crumbs { a href="/ui/sessions" { "Sessions" } }
            h1 { "Session " (session.id) }
            dl {
                dt { "App" } dd { (session.app) }
                dt { "User" } dd { (session.user) }
                dt { "Created" } dd { (time(session.create_time.as_ref())) }
                dt { "Episodes" } dd { span id="episode-count" { (session.episode_count) } span id="episodes-evicted" { (evicted_note(session.episodes_evicted)) } }
                @if session.end_time.is_some() { dt { "Ended" } dd { (time(session.end_time.as_ref())) } }
            }
            h2 { "Episodes" }
            table {
                thead { tr { th.num { "Seq" } th { "Time" } th { "Type" } th { "Agent" } th { "Content" } } }
                // The tail script appends here once the last page is shown.
                tbody id="episodes" data-session=(session.id) data-cursor=(last_cursor) data-live=(last_page) {
                    @for e in &listed.episodes { (episode_row(e)) }
                }
            }
            @if last_page {
                p.live id="live" role="status" aria-live="polite" { "New episodes appear here as they are appended (needs JavaScript)." }
                script src="/ui/static/tail.js" defer {}
            }
            (next_link("/ui/session", &[("id", &query.id), ("after", &query.after.to_string())], &listed.next_page_token))
            p { a href=(link("/ui/export", &[("session", &session.id)])) download { "Export this session (JSON Lines)" } }
            h2 { "Working memory" }
            pre.block { (block.memory_block) }
            @if admin {
                h2 { "Delete" }
                form.admin method="post" action="/ui/session/delete" {
                    input type="hidden" name="id" value=(session.id);
                    (csrf_field(&csrf))
                    button.danger type="submit" { "Delete this session and its episodes" }
                }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct TailQuery {
    id: String,
    #[serde(default)]
    cursor: i64,
}

/// New episodes of a session as server-sent events, each with its cursor as
/// the event id, so a reconnecting browser resumes where it was
/// (`Last-Event-ID`). Fed by `TailEpisodes`, so by the same settled
/// horizon. Between them come `count` events with the session's episode
/// count as the server has it: one as the tail opens (an episode appended
/// between the page's reading of the session and of its episodes is
/// counted then), then at most one per [`COUNT_EVERY`] while episodes
/// arrive, so evictions by the per-session limit show as they happen.
pub async fn tail(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<TailQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(query.cursor);
    let stream = call!(EpisodeServiceClient::new(conn.clone()).tail_episodes(
        proto::TailEpisodesRequest {
            session_id: query.id.clone(),
            cursor: Some(resume),
            ..Default::default()
        }
    ));
    let counts = SessionServiceClient::new(conn);
    Sse::new(events(stream, counts, query.id))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// How often a live tail refreshes the session's episode count at most.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// Where a tail's event stream stands.
struct Tailing {
    episodes: tonic::Streaming<proto::TailEpisodesResponse>,
    counts: SessionServiceClient<crate::mcp::Conn>,
    session_id: String,
    tick: tokio::time::Interval,
    /// Episodes arrived (or the tail opened) since the last count.
    stale: bool,
}

fn events(
    episodes: tonic::Streaming<proto::TailEpisodesResponse>,
    counts: SessionServiceClient<crate::mcp::Conn>,
    session_id: String,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut tick = tokio::time::interval(COUNT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = Tailing {
        episodes,
        counts,
        session_id,
        tick,
        stale: true,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            tokio::select! {
                item = state.episodes.next() => {
                    // The stream's end or error ends the events; the
                    // browser reconnects from the last id it saw.
                    let episode = item?.ok()?.episode;
                    if let Some(episode) = episode {
                        state.stale = true;
                        let event = Event::default()
                            .id(episode.cursor.to_string())
                            .event("episode")
                            .data(episode_row(&episode).into_string());
                        return Some((Ok(event), state));
                    }
                }
                _ = state.tick.tick(), if state.stale => {
                    state.stale = false;
                    let request = proto::GetSessionRequest {
                        session_id: state.session_id.clone(),
                        ..Default::default()
                    };
                    // A refused read leaves the count as it was.
                    let Ok(response) = state.counts.get_session(request).await else {
                        continue;
                    };
                    let session = response.into_inner().session.unwrap_or_default();
                    let count = serde_json::json!({
                        "count": session.episode_count,
                        "evicted": evicted_note(session.episodes_evicted).into_string(),
                    });
                    return Some((Ok(Event::default().event("count").data(count.to_string())), state));
                }
            }
        }
    })
}

/// What follows a session's episode count when some were evicted.
fn evicted_note(evicted: i64) -> Markup {
    html! { @if evicted > 0 { " (" (evicted) " evicted)" } }
}

/// One episode, whole: where a fact's lineage leads.
pub async fn episode(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<IdQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let got = call!(
        EpisodeServiceClient::new(conn).get_episode(proto::GetEpisodeRequest {
            id: query.id.clone(),
        })
    );
    let e = got.episode.unwrap_or_default();
    let pretty = |value: Option<prost_types::Value>| {
        serde_json::to_string_pretty(&value_json(value)).unwrap_or_default()
    };
    let metadata = e.metadata.clone().map(|m| prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(m)),
    });
    page(
        &e.id,
        html! {
            p.crumbs { a href=(link("/ui/session", &[("id", &e.session_id)])) { "Session " (e.session_id) } }
            h1 { "Episode " (e.id) }
            dl {
                dt { "Session" } dd { a href=(episode_href(&e)) { (e.session_id) " #" (e.seq) } }
                dt { "User" } dd { (e.user) " of " (e.app) }
                dt { "Agent" } dd { (e.agent) }
                dt { "Type" } dd { (e.r#type) }
                dt { "Time" } dd { (time(e.timestamp.as_ref())) }
                dt { "Cursor" } dd { (e.cursor) }
            }
            h2 { "Content" }
            pre.block { (pretty(e.content.clone())) }
            @if metadata.is_some() {
                h2 { "Metadata" }
                pre.block { (pretty(metadata)) }
            }
        },
    )
}
