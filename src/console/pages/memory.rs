//! Memory: the scopes, a scope's keys, a key's versions, the compaction
//! log.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use futures::StreamExt;
use maud::html;
use serde::Deserialize;

use super::{MAX_VERSIONS, PAGE, SCOPE_TYPES, link, next_link, preview, scope_type};
use crate::cli::memory::scope_type_name;
use crate::cli::{time, value_json};
use crate::console::actions::{csrf_field, csrf_token};
use crate::console::{Console, Params, page, refused};
use crate::proto;
use crate::proto::memory_admin_service_client::MemoryAdminServiceClient;
use crate::proto::memory_service_client::MemoryServiceClient;

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
    Params(query): Params<ScopesQuery>,
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
    Params(query): Params<ScopeQuery>,
) -> Response {
    let crate::console::Visitor { conn, admin } = visitor!(console, headers);
    let csrf = csrf_token(&console, &headers);
    let listed = call!(MemoryServiceClient::new(conn).list(proto::ListRequest {
        scope_type: or_page!(scope_type(&query.r#type)),
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
    Params(query): Params<KeyQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let scope_type = or_page!(scope_type(&query.r#type));
    let mut client = MemoryServiceClient::new(conn);
    // The newest MAX_VERSIONS versions (and about HISTORY_BYTES of them):
    // from the newest version back, so a long history shows its end.
    let newest = match newest_version(&mut client, scope_type, &query.scope, &query.key).await {
        Ok(newest) => newest,
        Err(status) => return refused(status),
    };
    let mut stream = call!(client.history(proto::HistoryRequest {
        scope_type,
        scope: query.scope.clone(),
        key: query.key.clone(),
        from_version: (newest - MAX_VERSIONS as i64 + 1).max(1),
    }));
    let (mut versions, mut bytes) = (std::collections::VecDeque::new(), 0);
    while let Some(item) = stream.next().await {
        match item {
            Ok(proto::HistoryResponse { entry: Some(entry) }) => {
                bytes += prost::Message::encoded_len(&entry);
                versions.push_back(entry);
            }
            Ok(_) => {}
            Err(status) => return refused(status),
        }
        while bytes > HISTORY_BYTES && versions.len() > 2 {
            if let Some(oldest) = versions.pop_front() {
                bytes -= prost::Message::encoded_len(&oldest);
            }
        }
        if versions.back().is_some_and(|e| e.version >= newest) {
            break;
        }
    }
    let versions = Vec::from(versions);
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
    // A version chosen outside the versions shown (through the URL) is
    // read by itself.
    let (old, new) = match (
        version_text(&mut client, &versions, scope_type, &query, a).await,
        version_text(&mut client, &versions, scope_type, &query, b).await,
    ) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(status), _) | (_, Err(status)) => return refused(status),
    };
    let choices: Vec<i64> = {
        let mut choices: Vec<i64> = versions.iter().map(|e| e.version).collect();
        choices.extend([a, b]);
        choices.sort_unstable();
        choices.dedup();
        choices
    };
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
                    @for v in &choices { option value=(v) selected[*v == a] { (v) } }
                }
                label for="b" { "to version" }
                select id="b" name="b" {
                    @for v in &choices { option value=(v) selected[*v == b] { (v) } }
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

/// The bytes of versions the key page holds, about: the newest kept.
const HISTORY_BYTES: usize = 4 * crate::paging::PAGE_BYTES;

/// A key's newest version, a tombstone's too (from the `KEY_DELETED`
/// answer's metadata); 0 when the key has none.
/// What the diff shows of a version: its value, pretty, or a word on a
/// tombstone or a version not kept. One of `versions` is taken from them;
/// another is read by itself.
async fn version_text(
    client: &mut MemoryServiceClient<crate::mcp::Conn>,
    versions: &[proto::MemoryEntry],
    scope_type: i32,
    query: &KeyQuery,
    version: i64,
) -> Result<String, tonic::Status> {
    use tonic_types::StatusExt;
    let shown = |entry: &proto::MemoryEntry| {
        if entry.deleted {
            "(tombstone)\n".to_owned()
        } else {
            let value = value_json(entry.value.clone());
            format!(
                "{}\n",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            )
        }
    };
    if let Some(entry) = versions.iter().find(|e| e.version == version) {
        return Ok(shown(entry));
    }
    if version < 1 {
        return Ok(String::new());
    }
    let got = client
        .get(proto::GetRequest {
            scope_type,
            scope: query.scope.clone(),
            key: query.key.clone(),
            version,
            ..Default::default()
        })
        .await;
    match got {
        Ok(response) => Ok(response
            .into_inner()
            .entry
            .as_ref()
            .map(shown)
            .unwrap_or_default()),
        Err(status) if status.code() == tonic::Code::NotFound => {
            let reason = status.get_details_error_info().map(|info| info.reason);
            Ok(match reason.as_deref() {
                Some("KEY_DELETED") => "(tombstone)\n".to_owned(),
                Some("VERSION_PURGED") => format!("(version {version} was purged)\n"),
                _ => format!("(there is no version {version})\n"),
            })
        }
        Err(status) => Err(status),
    }
}

async fn newest_version(
    client: &mut MemoryServiceClient<crate::mcp::Conn>,
    scope_type: i32,
    scope: &str,
    key: &str,
) -> Result<i64, tonic::Status> {
    use tonic_types::StatusExt;
    let got = client
        .get(proto::GetRequest {
            scope_type,
            scope: scope.to_owned(),
            key: key.to_owned(),
            ..Default::default()
        })
        .await;
    match got {
        Ok(response) => Ok(response.into_inner().entry.map_or(0, |e| e.version)),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(status
            .get_details_error_info()
            .and_then(|info| info.metadata.get("version")?.parse().ok())
            .unwrap_or(0)),
        Err(status) => Err(status),
    }
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
    Params(query): Params<LogQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let logged = call!(MemoryAdminServiceClient::new(conn).get_compaction_log(
        proto::GetCompactionLogRequest {
            scope_type: or_page!(scope_type(&query.r#type)),
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
