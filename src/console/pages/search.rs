//! Search across memory, facts and episodes.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use clap::ValueEnum;
use maud::{Markup, html};
use serde::Deserialize;

use super::link;
use super::sessions::episode_href;
use crate::cli::memory::scope_type_name;
use crate::cli::search::SourceArg;
use crate::console::{Console, Params, page, refused};
use crate::proto;
use crate::proto::search_service_client::SearchServiceClient;

#[derive(Deserialize, Default)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
    /// `memory`, `facts` or `episodes`; empty for all three.
    #[serde(default)]
    source: String,
    #[serde(default)]
    app: String,
    #[serde(default)]
    user: String,
}

/// Search across memory, facts and episodes, narrowed to one source, an
/// app and a user when the form asks.
pub async fn search(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<SearchQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    if query.q.trim().is_empty() {
        return page(
            "Search",
            html! { h1 { "Search" } (form(&query)) p { "Type words in the search box." } },
        );
    }
    // An unknown source name is sent as unspecified, which the API
    // refuses with its own reason.
    let sources = match query.source.as_str() {
        "" => Vec::new(),
        name => vec![
            SourceArg::from_str(name, false)
                .map_or(proto::SearchSource::Unspecified as i32, SourceArg::to_proto),
        ],
    };
    let found = call!(SearchServiceClient::new(conn).search(proto::SearchRequest {
        query: query.q.clone(),
        sources,
        app: query.app.clone(),
        user: query.user.clone(),
        limit: 50,
        ..Default::default()
    }));
    page(
        "Search",
        html! {
            h1 { "Search: " (query.q) }
            (form(&query))
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

/// The search form, holding what was asked.
fn form(query: &SearchQuery) -> Markup {
    html! {
        form method="get" action="/ui/search" {
            label for="search-q" { "Words" } input id="search-q" name="q" type="search" value=(query.q);
            label for="search-source" { "In" }
            select id="search-source" name="source" {
                option value="" selected[query.source.is_empty()] { "everything" }
                @for name in source_names() {
                    option value=(name) selected[query.source == name] { (name) }
                }
            }
            // As in the API, app and user narrow facts and episodes;
            // memory has neither.
            label for="search-app" { "App (facts, episodes)" } input id="search-app" name="app" value=(query.app);
            label for="search-user" { "User (facts, episodes)" } input id="search-user" name="user" value=(query.user);
            button type="submit" { "Search" }
        }
    }
}

/// The sources' names, as the CLI's `--source` takes them.
fn source_names() -> impl Iterator<Item = String> {
    SourceArg::value_variants()
        .iter()
        .filter_map(|source| Some(source.to_possible_value()?.get_name().to_owned()))
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
    fn snippets_mark_their_words_and_escape_the_rest() {
        assert_eq!(
            marked("a **dark** <b>mode</b>").into_string(),
            "a <mark>dark</mark> &lt;b&gt;mode&lt;/b&gt;"
        );
    }
}
