//! An export of the tenant, a scope, a session or a user, as a download.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;

use super::scope_type;
use crate::console::{Console, Params, refused};
use crate::proto;

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
    Params(query): Params<ExportQuery>,
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
                    or_page!(scope_type(&query.r#type))
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
