//! The JSON endpoints of the HTTP port, shaped like the KAOS memory
//! endpoints so its debugging UI and scripts work unchanged:
//!
//! - `GET /memory/events?session_id=&limit=`: the newest events (default
//!   100; a limit above 1000 reads 1000, as KAOS's scripts may ask for
//!   more), of one session or of the whole tenant, oldest first.
//! - `GET /memory/sessions?app=&user=&limit=`: session ids, newest first.
//!
//! Both take the same bearer token as gRPC, and answer 401 without one.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::auth::{self, Authenticator, Refusal};
use crate::context::CallerContext;
use crate::error::Error;
use crate::ports::Store;
use crate::sessions::{Episode, Id, Name, SessionFilter, Sessions};

pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 1000;

/// What the `agent` field says when no session narrows the answer.
const SERVER_AGENT: &str = "engram";

/// What the JSON endpoints share: the sessions, and who may read them
/// (the same bearer tokens as gRPC; the tenant comes from the token).
pub struct Endpoints<S> {
    pub sessions: Sessions<S>,
    pub auth: Authenticator,
}

impl<S: Store> Clone for Endpoints<S> {
    fn clone(&self) -> Self {
        Endpoints {
            sessions: self.sessions.clone(),
            auth: self.auth.clone(),
        }
    }
}

pub fn router<S: Store>(endpoints: Endpoints<S>) -> axum::Router {
    axum::Router::new()
        .route("/memory/events", get(events::<S>))
        .route("/memory/sessions", get(session_ids::<S>))
        .with_state(endpoints)
}

/// The caller of a request, from its bearer token.
fn caller(auth: &Authenticator, headers: &HeaderMap) -> Result<CallerContext, Refusal> {
    let header = headers.get(auth::AUTHORIZATION).map(|v| v.as_bytes());
    auth.authenticate(header).map(|principal| CallerContext {
        tenant: principal.tenant,
        ..CallerContext::default()
    })
}

/// A refused request: 401 (no or a wrong token) or 403, with the reason.
pub(crate) fn refused(refusal: Refusal) -> Response {
    let status = match refusal {
        Refusal::Missing | Refusal::Invalid => StatusCode::UNAUTHORIZED,
        Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
    };
    let body = json!({ "error": refusal.message(), "reason": refusal.reason() });
    (status, [("www-authenticate", "Bearer")], Json(body)).into_response()
}

/// An error as JSON with the status a REST client expects; internal detail
/// stays in the log.
fn error_response(err: Error) -> Response {
    let status = match &err {
        Error::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::Unavailable { .. } | Error::DependencyUnavailable { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Error::FailedPrecondition { .. }
        | Error::VersionMismatch { .. }
        | Error::Conflict { .. }
        | Error::AlreadyExists { .. } => StatusCode::CONFLICT,
        Error::OutOfRange { .. } => StatusCode::BAD_REQUEST,
        Error::ResourceExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
        Error::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let reason = err.reason().as_str();
    // to_status logs what must be logged and hides what must be hidden.
    let message = super::error::to_status(err).message().to_owned();
    (status, Json(json!({ "error": message, "reason": reason }))).into_response()
}

fn respond(answer: Result<serde_json::Value, Error>) -> Response {
    match answer {
        Ok(body) => Json(body).into_response(),
        Err(err) => error_response(err),
    }
}

fn limit(params: &HashMap<String, String>) -> Result<i64, Error> {
    match params.get("limit").filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT_LIMIT),
        Some(text) => match text.parse::<i64>() {
            Ok(n) if n > 0 => Ok(n.min(MAX_LIMIT)),
            _ => Err(Error::invalid(
                crate::error::Reason::InvalidArgument,
                "limit",
                format!(
                    "must be a positive integer (one above {MAX_LIMIT} reads {MAX_LIMIT}), got {text:?}"
                ),
            )),
        },
    }
}

fn param<T>(
    params: &HashMap<String, String>,
    name: &str,
    parse: fn(&str, String) -> Result<Option<T>, Error>,
) -> Result<Option<T>, Error> {
    parse(name, params.get(name).cloned().unwrap_or_default())
}

fn event_json(episode: Episode) -> serde_json::Value {
    json!({
        "event_id": episode.id,
        "timestamp": episode.timestamp.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "event_type": episode.kind,
        "content": episode.content,
        "metadata": episode.metadata,
        "session_id": episode.session_id,
        "agent": episode.agent,
        "seq": episode.seq,
        "cursor": episode.cursor,
    })
}

/// The query's parameters, percent-decoded; one that is not UTF-8 once
/// decoded is refused by name (a lossy decode would look up some other
/// text). A name given twice keeps its last value.
fn query_params(raw: Option<String>) -> Result<HashMap<String, String>, Error> {
    let mut params = HashMap::new();
    for pair in raw
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            let spaced = text.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced)
                .decode_utf8()
                .map(|text| text.into_owned())
        };
        let Ok(name) = decode(name) else {
            return Err(Error::invalid(
                crate::error::Reason::InvalidArgument,
                "query",
                "a parameter name is not UTF-8 once percent-decoded",
            ));
        };
        let Ok(value) = decode(value) else {
            return Err(Error::invalid(
                crate::error::Reason::InvalidArgument,
                &name,
                "must be UTF-8 once percent-decoded",
            ));
        };
        params.insert(name, value);
    }
    Ok(params)
}

async fn events<S: Store>(
    State(Endpoints { sessions, auth }): State<Endpoints<S>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let ctx = match caller(&auth, &headers) {
        Ok(ctx) => ctx,
        Err(refusal) => return refused(refusal),
    };
    let answer = async {
        let params = query_params(query)?;
        let limit = limit(&params)?;
        let session_id = param(&params, "session_id", Id::parse_optional)?;
        let (agent, events) = sessions.latest_events(&ctx, session_id, limit).await?;
        let events: Vec<_> = events.into_iter().map(event_json).collect();
        Ok::<_, Error>(json!({
            "agent": agent.unwrap_or_else(|| SERVER_AGENT.to_owned()),
            "total": events.len(),
            "events": events,
        }))
    };
    respond(answer.await)
}

async fn session_ids<S: Store>(
    State(Endpoints { sessions, auth }): State<Endpoints<S>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let ctx = match caller(&auth, &headers) {
        Ok(ctx) => ctx,
        Err(refusal) => return refused(refusal),
    };
    let answer = async {
        let params = query_params(query)?;
        let limit = limit(&params)?;
        let filter = SessionFilter {
            app: param(&params, "app", Name::parse_optional)?,
            user: param(&params, "user", Name::parse_optional)?,
        };
        let agent = filter
            .app
            .as_ref()
            .map_or(SERVER_AGENT, Name::as_str)
            .to_owned();
        let page = sessions.list(&ctx, &filter, limit as i32, "").await?;
        let ids: Vec<String> = page.items.into_iter().map(|s| s.id).collect();
        Ok::<_, Error>(json!({ "agent": agent, "total": ids.len(), "sessions": ids }))
    };
    respond(answer.await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_decode_strictly() {
        let params = |raw: &str| query_params(Some(raw.to_owned()));
        let decoded = params("session_id=a%2Fb+c&limit=2&limit=3&flag").expect("params");
        assert_eq!(decoded.get("session_id").map(String::as_str), Some("a/b c"));
        assert_eq!(decoded.get("limit").map(String::as_str), Some("3"));
        assert_eq!(decoded.get("flag").map(String::as_str), Some(""));
        assert!(query_params(None).expect("none").is_empty());
        let refused = params("session_id=%ff%fe").expect_err("not UTF-8");
        assert!(refused.to_string().contains("session_id"), "{refused}");
        assert!(params("%ff=1").is_err());
    }
}
