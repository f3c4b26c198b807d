//! The console's pages: each reads what it shows through the gRPC clients
//! (see the module doc of `console`) and renders it with `maud`. Every
//! link carries what it shows in its query string, so a URL can be shared.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use maud::{Markup, html};
use serde::Deserialize;

use super::actions::{csrf_field, csrf_token};
use super::{Console, page, refused};
use crate::cli::memory::scope_type_name;
use crate::cli::{time, value_json};
use crate::proto;
use crate::proto::consolidation_service_client::ConsolidationServiceClient;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::memory_admin_service_client::MemoryAdminServiceClient;
use crate::proto::memory_service_client::MemoryServiceClient;
use crate::proto::search_service_client::SearchServiceClient;
use crate::proto::session_service_client::SessionServiceClient;
use crate::proto::working_memory_service_client::WorkingMemoryServiceClient;

/// Rows per page of a list.
const PAGE: i32 = 50;

/// Versions a key's page reads at most.
const MAX_VERSIONS: usize = 1000;

/// Characters of a value shown in a table cell.
const PREVIEW: usize = 120;

/// Unwraps a call or answers with the refusal page.
macro_rules! call {
    ($call:expr) => {
        match $call.await {
            Ok(response) => response.into_inner(),
            Err(status) => return refused(status),
        }
    };
}

/// The visitor or the page to send them to.
macro_rules! visitor {
    ($console:expr, $headers:expr) => {
        match $console.visitor(&$headers) {
            Ok(visitor) => visitor,
            Err(page) => return *page,
        }
    };
}

/// A link: the path and its query, encoded.
pub(super) fn link(path: &str, query: &[(&str, &str)]) -> String {
    let mut url = form_urlencoded::Serializer::new(String::new());
    for (name, value) in query {
        if !value.is_empty() {
            url.append_pair(name, value);
        }
    }
    let query = url.finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

const SCOPE_TYPES: [(&str, proto::ScopeType); 3] = [
    ("namespace", proto::ScopeType::Namespace),
    ("flow", proto::ScopeType::Flow),
    ("execution", proto::ScopeType::Execution),
];

pub(super) fn scope_type(name: &str) -> proto::ScopeType {
    SCOPE_TYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(proto::ScopeType::Unspecified, |(_, t)| *t)
}

/// A value as compact JSON, cut to a preview.
fn preview(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= PREVIEW {
        return text;
    }
    let cut: String = text.chars().take(PREVIEW).collect();
    format!("{cut}…")
}

fn next_link(path: &str, query: &[(&str, &str)], token: &str) -> Markup {
    let mut query = query.to_vec();
    query.push(("page", token));
    html! {
        @if !token.is_empty() {
            p { a rel="next" href=(link(path, &query)) { "Next page →" } }
        }
    }
}

#[derive(Deserialize, Default)]
pub struct ScopesQuery {
    #[serde(default)]
    r#type: String,
    #[serde(default)]
    page: String,
}

/// Every scope with its live key count, by type.
pub async fn scopes(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<ScopesQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let mut client = MemoryServiceClient::new(conn);
    let mut sections = Vec::new();
    for (name, kind) in SCOPE_TYPES {
        if !query.r#type.is_empty() && query.r#type != name {
            continue;
        }
        let token = if query.r#type == name {
            query.page.clone()
        } else {
            String::new()
        };
        let listed = call!(client.list_scopes(proto::ListScopesRequest {
            scope_type: kind as i32,
            page_size: PAGE,
            page_token: token,
            ..Default::default()
        }));
        sections.push((name, listed));
    }
    page(
        "Scopes",
        html! {
            h1 { "Scopes" }
            @for (name, listed) in &sections {
                section {
                    h2 { (name) }
                    @if listed.scopes.is_empty() {
                        p.empty { "No " (name) " scopes." }
                    } @else {
                        table {
                            thead { tr { th { "Scope" } th.num { "Live keys" } th.num { "Purged keys" } } }
                            tbody {
                                @for scope in &listed.scopes {
                                    tr {
                                        td { a href=(link("/ui/scope", &[("type", name), ("scope", &scope.scope)])) { (scope.scope) } }
                                        td.num { (scope.entry_count) }
                                        td.num { (scope.purged_count) }
                                    }
                                }
                            }
                        }
                    }
                    (next_link("/ui", &[("type", name)], &listed.next_page_token))
                }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct ScopeQuery {
    r#type: String,
    scope: String,
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    page: String,
}

/// A scope's live keys, filtered by prefix, a page at a time.
pub async fn scope(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<ScopeQuery>,
) -> Response {
    let super::Visitor { conn, admin } = visitor!(console, headers);
    let csrf = csrf_token(&console, &headers);
    let listed = call!(MemoryServiceClient::new(conn).list(proto::ListRequest {
        scope_type: scope_type(&query.r#type) as i32,
        scope: query.scope.clone(),
        key_prefix: query.prefix.clone(),
        page_size: PAGE,
        page_token: query.page.clone(),
        ..Default::default()
    }));
    let here = [
        ("type", query.r#type.as_str()),
        ("scope", query.scope.as_str()),
    ];
    page(
        &query.scope,
        html! {
            p.crumbs { a href="/ui" { "Scopes" } " / " (query.r#type) }
            h1 { (query.scope) }
            p {
                a href=(link("/ui/log", &here)) { "Audit log (compactions, purges, forks)" }
                " · "
                a href=(link("/ui/export", &here)) download { "Export (JSON Lines)" }
            }
            form method="get" action="/ui/scope" {
                input type="hidden" name="type" value=(query.r#type);
                input type="hidden" name="scope" value=(query.scope);
                label for="prefix" { "Key prefix" }
                input id="prefix" name="prefix" value=(query.prefix);
                button type="submit" { "Filter" }
            }
            @if listed.entries.is_empty() {
                p.empty { "No live keys." }
            } @else {
                table {
                    thead { tr { th { "Key" } th.num { "Version" } th { "Written" } th { "Execution" } th { "Value" } } }
                    tbody {
                        @for entry in &listed.entries {
                            tr {
                                td { a href=(link("/ui/key", &[here[0], here[1], ("key", &entry.key)])) { (entry.key) } }
                                td.num { (entry.version) }
                                td { (time(entry.create_time.as_ref())) }
                                td { (entry.execution_id) }
                                td { code { (preview(&value_json(entry.value.clone()))) } }
                            }
                        }
                    }
                }
            }
            (next_link("/ui/scope", &[here[0], here[1], ("prefix", &query.prefix)], &listed.next_page_token))
            @if admin {
                h2 { "Purge old versions" }
                form.admin method="post" action="/ui/scope/purge" {
                    input type="hidden" name="type" value=(query.r#type);
                    input type="hidden" name="scope" value=(query.scope);
                    (csrf_field(&csrf))
                    label for="keep" { "Keep the newest" }
                    input id="keep" name="keep" type="number" min="1" value="1" required;
                    label for="include_deleted" { "versions; also purge deleted keys" }
                    input id="include_deleted" name="include_deleted" type="checkbox";
                    button type="submit" { "Preview the purge" }
                }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct KeyQuery {
    r#type: String,
    scope: String,
    key: String,
    /// The older version of the diff.
    a: Option<i64>,
    /// The newer version of the diff.
    b: Option<i64>,
}

/// A key's history, tombstones marked, with a diff between two versions.
pub async fn key(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<KeyQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let mut stream = call!(
        MemoryServiceClient::new(conn).history(proto::HistoryRequest {
            scope_type: scope_type(&query.r#type) as i32,
            scope: query.scope.clone(),
            key: query.key.clone(),
            from_version: 0,
        })
    );
    let mut versions = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(item) => versions.extend(item.entry),
            Err(status) => return refused(status),
        }
        if versions.len() == MAX_VERSIONS {
            break;
        }
    }
    let newest = versions.last().map_or(0, |e| e.version);
    let b = query.b.unwrap_or(newest);
    let a = query.a.unwrap_or_else(|| {
        versions
            .iter()
            .rev()
            .map(|e| e.version)
            .find(|v| *v < b)
            .unwrap_or(b)
    });
    let text_of = |version: i64| {
        versions
            .iter()
            .find(|e| e.version == version)
            .map(|e| {
                if e.deleted {
                    "(tombstone)\n".to_owned()
                } else {
                    let value = value_json(e.value.clone());
                    format!(
                        "{}\n",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    )
                }
            })
            .unwrap_or_default()
    };
    let (old, new) = (text_of(a), text_of(b));
    let diff = similar::TextDiff::from_lines(&old, &new);
    let here = [
        ("type", query.r#type.as_str()),
        ("scope", query.scope.as_str()),
        ("key", query.key.as_str()),
    ];
    page(
        &query.key,
        html! {
            p.crumbs {
                a href="/ui" { "Scopes" } " / "
                a href=(link("/ui/scope", &here[..2])) { (query.scope) }
            }
            h1 { (query.key) }
            h2 { "Diff" }
            form method="get" action="/ui/key" {
                @for (name, value) in &here { input type="hidden" name=(name) value=(value); }
                label for="a" { "From version" }
                select id="a" name="a" {
                    @for e in &versions { option value=(e.version) selected[e.version == a] { (e.version) } }
                }
                label for="b" { "to version" }
                select id="b" name="b" {
                    @for e in &versions { option value=(e.version) selected[e.version == b] { (e.version) } }
                }
                button type="submit" { "Compare" }
            }
            pre.diff aria-label=(format!("Changes from version {a} to version {b}")) {
                @for change in diff.iter_all_changes() {
                    @match change.tag() {
                        similar::ChangeTag::Delete => del { "- " (change.value()) },
                        similar::ChangeTag::Insert => ins { "+ " (change.value()) },
                        similar::ChangeTag::Equal => span { "  " (change.value()) },
                    }
                }
            }
            h2 { "History" }
            table {
                thead { tr { th.num { "Version" } th { "Written" } th { "Execution" } th { "Flow" } th { "Value" } } }
                tbody {
                    @for e in versions.iter().rev() {
                        tr.tombstone[e.deleted] {
                            td.num { (e.version) }
                            td { (time(e.create_time.as_ref())) }
                            td { (e.execution_id) }
                            td { (e.flow_name) @if !e.flow_id.is_empty() { " (" (e.flow_id) ")" } }
                            td {
                                @if e.deleted { span.marker { "tombstone" } }
                                @else { code { (preview(&value_json(e.value.clone()))) } }
                            }
                        }
                    }
                }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct LogQuery {
    r#type: String,
    scope: String,
    #[serde(default)]
    page: String,
}

/// A scope's maintenance audit trail.
pub async fn log(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<LogQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let logged = call!(MemoryAdminServiceClient::new(conn).get_compaction_log(
        proto::GetCompactionLogRequest {
            scope_type: scope_type(&query.r#type) as i32,
            scope: query.scope.clone(),
            page_size: PAGE,
            page_token: query.page.clone(),
        }
    ));
    let here = [
        ("type", query.r#type.as_str()),
        ("scope", query.scope.as_str()),
    ];
    page(
        "Audit log",
        html! {
            p.crumbs { a href="/ui" { "Scopes" } " / " a href=(link("/ui/scope", &here)) { (query.scope) } }
            h1 { "Audit log of " (query.scope) }
            @if logged.records.is_empty() {
                p.empty { "Nothing has been compacted, purged, forked or retained here." }
            } @else {
                table {
                    thead { tr { th { "When" } th { "Operation" } th { "Target" } th.num { "Keys" } th.num { "Versions deleted" } th { "Details" } } }
                    tbody {
                        @for r in &logged.records {
                            tr {
                                td { (time(r.create_time.as_ref())) }
                                td { (r.operation) }
                                td { (r.target_key) @if r.target_version > 0 { " v" (r.target_version) } }
                                td.num { (r.keys_affected) }
                                td.num { (r.versions_deleted) }
                                td {
                                    @if !r.source_scope.is_empty() {
                                        "from " (scope_type_name(r.source_scope_type)) " " (r.source_scope)
                                        @if r.as_of_revision > 0 { " at revision " (r.as_of_revision) }
                                    }
                                    @if !r.source_keys.is_empty() { "sources: " (r.source_keys.join(", ")) }
                                }
                            }
                        }
                    }
                }
            }
            (next_link("/ui/log", &here, &logged.next_page_token))
        },
    )
}

#[derive(Deserialize, Default)]
pub struct SessionsQuery {
    #[serde(default)]
    app: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    page: String,
}

/// Sessions, newest first, filtered by app and user.
pub async fn sessions(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<SessionsQuery>,
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
fn episode_href(e: &proto::Episode) -> String {
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
    Query(query): Query<SessionQuery>,
) -> Response {
    let super::Visitor { conn, admin } = visitor!(console, headers);
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
    Query(query): Query<TailQuery>,
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

#[derive(Deserialize, Default)]
pub struct RulesQuery {
    #[serde(default)]
    page: String,
}

#[derive(Deserialize, Default)]
pub struct ExportQuery {
    #[serde(default)]
    r#type: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    session: String,
}

/// A scope or a session as the `Export` RPC writes it, as a JSON Lines
/// download (what `engram export` would save).
pub async fn export(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<ExportQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let named = if query.session.is_empty() {
        &query.scope
    } else {
        &query.session
    };
    let stream = call!(
        crate::proto::data_service_client::DataServiceClient::new(conn).export(
            proto::ExportRequest {
                scope_type: if query.scope.is_empty() {
                    0
                } else {
                    scope_type(&query.r#type) as i32
                },
                scope: query.scope.clone(),
                session_id: query.session.clone(),
                ..Default::default()
            }
        )
    );
    let body = stream.map(|chunk| {
        chunk.map(|chunk| {
            let mut text = chunk.lines.join("\n");
            text.push('\n');
            text
        })
    });
    let file: String = named
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    (
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/x-ndjson".to_owned(),
            ),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file}.jsonl\""),
            ),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// Rules with their cadence, watermark and last run.
pub async fn rules(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<RulesQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let listed = call!(
        ConsolidationServiceClient::new(conn).list_rules(proto::ListRulesRequest {
            page_size: PAGE,
            page_token: query.page,
        })
    );
    page(
        "Rules",
        html! {
            h1 { "Consolidation rules" }
            @if listed.rules.is_empty() {
                p.empty { "No rules." }
            } @else {
                table {
                    thead { tr { th { "Rule" } th { "Filter" } th { "Cadence" } th { "Enabled" } th.num { "Watermark" } th.num { "Promoted" } th { "Last run" } } }
                    tbody {
                        @for r in &listed.rules {
                            tr {
                                td { (r.id) }
                                td { code { (r.filter) } }
                                td {
                                    @match &r.cadence {
                                        Some(proto::consolidation_rule::Cadence::EveryNEpisodes(n)) => { "every " (n) " episodes" },
                                        Some(proto::consolidation_rule::Cadence::Cron(cron)) => { "cron " code { (cron) } },
                                        None => {},
                                    }
                                }
                                td { @if r.enabled { "yes" } @else { "no" } }
                                td.num { (r.watermark) }
                                td.num { (r.episodes_promoted) }
                                td { (time(r.last_run_time.as_ref())) }
                            }
                        }
                    }
                }
            }
            (next_link("/ui/rules", &[], &listed.next_page_token))
        },
    )
}

#[derive(Deserialize, Default)]
pub struct FactsQuery {
    #[serde(default)]
    app: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    page: String,
}

/// An app's facts (a user's, or the app-wide ones).
pub async fn facts(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<FactsQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let form = html! {
        form method="get" action="/ui/facts" {
            label for="app" { "App" } input id="app" name="app" value=(query.app) required;
            label for="user" { "User" } input id="user" name="user" value=(query.user);
            button type="submit" { "Show" }
        }
    };
    if query.app.is_empty() {
        return page(
            "Facts",
            html! { h1 { "Facts" } (form) p { "Facts belong to an app: name one." } },
        );
    }
    let listed = call!(
        ConsolidationServiceClient::new(conn).list_facts(proto::ListFactsRequest {
            app: query.app.clone(),
            user: query.user.clone(),
            page_size: PAGE,
            page_token: query.page.clone(),
            ..Default::default()
        })
    );
    page(
        "Facts",
        html! {
            h1 { "Facts" }
            (form)
            @if listed.facts.is_empty() {
                p.empty { "No facts." }
            } @else {
                table {
                    thead { tr { th { "Fact" } th { "User" } th { "Statement" } th.num { "Version" } } }
                    tbody {
                        @for f in &listed.facts {
                            @let current = f.current.clone().unwrap_or_default();
                            tr {
                                td { a href=(link("/ui/fact", &[("id", &f.id)])) { (f.id) } }
                                td { (f.user) }
                                td { (statement(&current)) }
                                td.num { (current.version) }
                            }
                        }
                    }
                }
            }
            (next_link("/ui/facts", &[("app", &query.app), ("user", &query.user)], &listed.next_page_token))
        },
    )
}

/// A page about one thing named by its id.
#[derive(Deserialize)]
pub struct IdQuery {
    id: String,
}

/// A fact's versions with their lineage.
pub async fn fact(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<IdQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let got = call!(
        ConsolidationServiceClient::new(conn).get_fact(proto::GetFactRequest {
            fact_id: query.id.clone(),
        })
    );
    let fact = got.fact.unwrap_or_default();
    page(
        &fact.id,
        html! {
            p.crumbs { a href=(link("/ui/facts", &[("app", &fact.app), ("user", &fact.user)])) { "Facts of " (fact.app) } }
            h1 { "Fact " (fact.id) }
            table {
                thead { tr { th.num { "Version" } th { "Written" } th { "Statement" } th { "Source" } th { "From episodes" } } }
                tbody {
                    @for v in got.versions.iter().rev() {
                        @let lineage = v.lineage.clone().unwrap_or_default();
                        tr.tombstone[v.deleted] {
                            td.num { (v.version) }
                            td { (time(v.create_time.as_ref())) }
                            td {
                                @if v.deleted { span.marker { "deleted" } }
                                @else { (statement(v)) }
                            }
                            td { (lineage.source) }
                            td {
                                @for (n, id) in lineage.source_episode_ids.iter().enumerate() {
                                    @if n > 0 { ", " }
                                    a href=(link("/ui/episode", &[("id", id)])) { (id) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// One episode, whole: where a fact's lineage leads.
pub async fn episode(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<IdQuery>,
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

#[derive(Deserialize, Default)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
}

/// Search across memory, facts and episodes.
pub async fn search(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<SearchQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    if query.q.trim().is_empty() {
        return page(
            "Search",
            html! { h1 { "Search" } p { "Type words in the search box." } },
        );
    }
    let found = call!(SearchServiceClient::new(conn).search(proto::SearchRequest {
        query: query.q.clone(),
        limit: 50,
        ..Default::default()
    }));
    page(
        "Search",
        html! {
            h1 { "Search: " (query.q) }
            @if found.hits.is_empty() {
                p.empty { "Nothing matches." }
            } @else {
                ol.hits {
                    @for hit in &found.hits {
                        li {
                            (hit_link(hit))
                            p.snippet { (marked(&hit.snippet)) }
                        }
                    }
                }
            }
        },
    )
}

/// What a fact version says: subject, predicate and object when it has
/// them, and its content.
fn statement(version: &proto::FactVersion) -> Markup {
    let content = value_json(version.content.clone());
    html! {
        @if !version.subject.is_empty() {
            (version.subject) " " (version.predicate) " " (version.object) " "
        }
        @match &content {
            serde_json::Value::String(text) => (text),
            serde_json::Value::Null => {},
            other => code { (preview(other)) },
        }
    }
}

fn hit_link(hit: &proto::SearchHit) -> Markup {
    use proto::search_hit::Item;
    match &hit.item {
        Some(Item::Entry(e)) => html! {
            "memory " a href=(link("/ui/key", &[("type", scope_type_name(e.scope_type)), ("scope", &e.scope), ("key", &e.key)])) { (e.scope) " / " (e.key) }
        },
        Some(Item::Fact(f)) => {
            html! { "fact " a href=(link("/ui/fact", &[("id", &f.id)])) { (f.id) } }
        }
        Some(Item::Episode(e)) => html! {
            "episode " a href=(episode_href(e)) { (e.session_id) " #" (e.seq) }
        },
        None => html! {},
    }
}

/// A snippet with its matched words (`**like this**`) marked.
fn marked(snippet: &str) -> Markup {
    html! {
        @for (n, part) in snippet.split("**").enumerate() {
            @if n % 2 == 1 { mark { (part) } } @else { (part) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_encode_what_they_carry() {
        assert_eq!(
            link(
                "/ui/key",
                &[("scope", "team"), ("key", "a/b c&d"), ("a", "")]
            ),
            "/ui/key?scope=team&key=a%2Fb+c%26d"
        );
        assert_eq!(link("/ui", &[]), "/ui");
    }

    #[test]
    fn snippets_mark_their_words_and_escape_the_rest() {
        assert_eq!(
            marked("a **dark** <b>mode</b>").into_string(),
            "a <mark>dark</mark> &lt;b&gt;mode&lt;/b&gt;"
        );
    }
}
