//! Consolidation: the rules, the facts and a fact's versions and lineage.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::{AppUserQuery, PAGE, link, next_link, preview};
use crate::cli::{plural, time, value_json};
use crate::console::{Console, Params, page, refused};
use crate::proto;
use crate::proto::consolidation_service_client::ConsolidationServiceClient;

#[derive(Deserialize, Default)]
pub struct RulesQuery {
    #[serde(default)]
    page: String,
}

/// Rules with their cadence, watermark and last run.
pub async fn rules(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<RulesQuery>,
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
                                        Some(proto::consolidation_rule::Cadence::EveryNEpisodes(n)) => { "every " (plural(*n, "episode", "episodes")) },
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

/// An app's facts (a user's, or the app-wide ones).
pub async fn facts(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<AppUserQuery>,
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

/// A fact and a page of its versions.
#[derive(Deserialize)]
pub struct FactQuery {
    id: String,
    #[serde(default)]
    page: String,
}

/// A fact's versions with their lineage, oldest first, a page at a time.
pub async fn fact(
    State(console): State<Console>,
    headers: HeaderMap,
    Params(query): Params<FactQuery>,
) -> Response {
    let conn = visitor!(console, headers).conn;
    let got = call!(
        ConsolidationServiceClient::new(conn).get_fact(proto::GetFactRequest {
            fact_id: query.id.clone(),
            page_size: PAGE,
            page_token: query.page.clone(),
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
                    @for v in &got.versions {
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
            (next_link("/ui/fact", &[("id", &fact.id)], &got.next_page_token))
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
