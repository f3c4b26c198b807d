//! The console's two admin actions: purging a scope's old versions (a dry
//! run first, then a confirmation) and deleting a session. They appear only
//! for admin tokens (the API refuses others anyway) and are posted forms
//! that must carry the visitor's anti-forgery token and, when the browser
//! sends one, an `Origin` of this host: a page elsewhere can neither read
//! the token nor pass the check. The token is a hash of the visitor's
//! bearer token (so any replica accepts it), or of a secret of this
//! process when the server runs without tokens.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::{Console, Posted, cookie_token, page, refused};
use crate::cli::plural;
use crate::proto;
use crate::proto::memory_admin_service_client::MemoryAdminServiceClient;
use crate::proto::session_service_client::SessionServiceClient;

/// The anti-forgery token of the visitor sending `headers`.
pub(super) fn csrf_token(console: &Console, headers: &HeaderMap) -> String {
    let secret = match cookie_token(headers) {
        Some(token) if console.auth.is_on() => token,
        _ => console.secret.clone(),
    };
    crate::auth::hash_token(&format!("engram-console-csrf:{secret}"))
}

/// The connection an action posted by this visitor runs on, or the page
/// that refuses it: no visitor, or a post that is not from this console.
fn poster(
    console: &Console,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<super::Conn, Box<Response>> {
    let conn = console.visitor(headers)?.conn;
    match forged(console, headers, csrf) {
        Some(refusal) => Err(Box::new(refusal)),
        None => Ok(conn),
    }
}

/// Refuses a post that is not from this console: a wrong or missing
/// anti-forgery token, or another site's `Origin`.
fn forged(console: &Console, headers: &HeaderMap, csrf: &str) -> Option<Response> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok());
    let foreign_origin = match (origin, host) {
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, rest)| rest) != Some(host),
        (Some(_), None) => true,
        (None, _) => false,
    };
    if foreign_origin || csrf != csrf_token(console, headers) {
        let body = page(
            "Refused",
            html! {
                h1 { "Refused" }
                p.error role="alert" { "This form did not come from this console (its anti-forgery token or origin does not match). Reload the page and try again." }
            },
        );
        return Some((StatusCode::FORBIDDEN, body).into_response());
    }
    None
}

/// The hidden field every action form carries.
pub(super) fn csrf_field(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

#[derive(Deserialize)]
pub struct PurgeForm {
    r#type: String,
    scope: String,
    keep: i64,
    #[serde(default)]
    include_deleted: Option<String>,
    /// Absent for the preview; "yes" once confirmed.
    #[serde(default)]
    confirm: Option<String>,
    csrf: String,
}

/// Purges a scope: previews what a purge would delete, then, confirmed,
/// deletes it.
pub async fn purge(
    State(console): State<Console>,
    headers: HeaderMap,
    Posted(form): Posted<PurgeForm>,
) -> Response {
    let conn = or_page!(poster(&console, &headers, &form.csrf));
    let confirmed = form.confirm.as_deref() == Some("yes");
    let include_deleted = form.include_deleted.is_some();
    let done = match MemoryAdminServiceClient::new(conn)
        .purge_scope(proto::PurgeScopeRequest {
            scope_type: or_page!(super::pages::scope_type(&form.r#type)),
            scope: form.scope.clone(),
            keep: Some(form.keep),
            include_deleted,
            dry_run: !confirmed,
        })
        .await
    {
        Ok(done) => done.into_inner(),
        Err(status) => return refused(status),
    };
    let back = super::pages::link(
        "/ui/scope",
        &[("type", &form.r#type), ("scope", &form.scope)],
    );
    let keep = form.keep.to_string();
    page(
        if confirmed { "Purged" } else { "Purge preview" },
        html! {
            p.crumbs { a href=(back) { (form.scope) } }
            @if confirmed {
                h1 { "Purged" }
                p role="status" { "Deleted " (plural(done.versions_deleted, "version", "versions")) " of " (plural(done.keys_affected, "key", "keys")) ". The audit log records it." }
            } @else {
                h1 { "Purge preview" }
                p role="status" {
                    "Keeping the newest " (plural(form.keep, "version", "versions")) " of each key would delete "
                    strong { (plural(done.versions_deleted, "version", "versions")) } " of " (plural(done.keys_affected, "key", "keys"))
                    @if include_deleted { ", and the keys deleted that long" } "."
                }
                @if done.versions_deleted > 0 {
                    form method="post" action="/ui/scope/purge" {
                        input type="hidden" name="type" value=(form.r#type);
                        input type="hidden" name="scope" value=(form.scope);
                        input type="hidden" name="keep" value=(keep);
                        @if include_deleted { input type="hidden" name="include_deleted" value="on"; }
                        input type="hidden" name="confirm" value="yes";
                        (csrf_field(&form.csrf))
                        button.danger type="submit" { "Delete them" }
                    }
                }
                p { a href=(back) { "Cancel" } }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct DeleteSessionForm {
    id: String,
    csrf: String,
}

/// Deletes a session with its episodes.
pub async fn delete_session(
    State(console): State<Console>,
    headers: HeaderMap,
    Posted(form): Posted<DeleteSessionForm>,
) -> Response {
    let conn = or_page!(poster(&console, &headers, &form.csrf));
    match SessionServiceClient::new(conn)
        .delete_session(proto::DeleteSessionRequest {
            session_id: form.id,
            ..Default::default()
        })
        .await
    {
        Ok(_) => Redirect::to("/ui/sessions").into_response(),
        Err(status) => refused(status),
    }
}
