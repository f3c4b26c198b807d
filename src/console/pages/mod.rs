//! The console's pages: each reads what it shows through the gRPC clients
//! (see the module doc of `console`) and renders it with `maud`. Every
//! link carries what it shows in its query string, so a URL can be shared.
//!
//! One file per area: `memory`, `sessions` (with the live tail),
//! `facts` (rules and facts), `search` and `export`; what they share
//! (links, pages of a list, value previews) is here.

use maud::{Markup, html};
use serde::Deserialize;

use crate::proto;

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
        or_page!($console.visitor(&$headers))
    };
}

mod export;
mod facts;
mod memory;
mod search;
mod sessions;

pub use export::export;
pub use facts::{fact, facts, rules};
pub use memory::{key, log, scope, scopes};
pub use search::search;
pub use sessions::{episode, session, sessions, tail};

/// A page about one thing named by its id.
#[derive(Deserialize)]
pub struct IdQuery {
    id: String,
}

/// A list narrowed to an app and a user, a page at a time (sessions,
/// facts).
#[derive(Deserialize, Default)]
pub struct AppUserQuery {
    #[serde(default)]
    app: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    page: String,
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

/// The scope type a page's `type` parameter names, as its number on the
/// wire. Empty leaves it unspecified for the server to judge; any other
/// name is refused here, since sent as unspecified it would be refused (or
/// read) as if no type had been given.
pub(super) fn scope_type(name: &str) -> Result<i32, Box<axum::response::Response>> {
    if name.is_empty() {
        return Ok(proto::ScopeType::Unspecified as i32);
    }
    SCOPE_TYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t as i32)
        .ok_or_else(|| {
            let names: Vec<&str> = SCOPE_TYPES.iter().map(|(n, _)| *n).collect();
            Box::new(super::refused(crate::api::error::to_status(
                crate::error::Error::invalid(
                    crate::error::Reason::InvalidArgument,
                    "type",
                    format!("unknown scope type {name:?}: one of {}", names.join(", ")),
                ),
            )))
        })
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
}
