//! The web console at `/ui` on the HTTP port: scopes and their keys, a
//! key's history with a diff between any two versions, the audit log,
//! sessions with their episodes (and a live tail), working memory, rules,
//! facts with their lineage, and search.
//!
//! Pages are rendered on the server with `maud` (compile-time templates:
//! nothing to ship beside the binary) and work without JavaScript; the
//! one script, `tail.js`, follows a session's new episodes by server-sent
//! events. Like MCP, every page is made of gRPC calls to the server's own
//! services in process, with the visitor's token, so the tenant, the roles,
//! the validation and the metrics are the API's own. When tokens are
//! configured the console asks for one and keeps it in an `HttpOnly`,
//! `SameSite=Strict` cookie scoped to `/ui`. Every response carries a
//! content security policy that allows only this origin's script and style.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};
use serde::de::DeserializeOwned;
use tonic::Status;

use crate::auth::Authenticator;
use crate::mcp::{Conn, connection};

/// The value, or the page that says why there is none (a refusal or a
/// redirect, boxed).
macro_rules! or_page {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(page) => return *page,
        }
    };
}

mod actions;
mod pages;

/// Where the console is served.
pub const PATH: &str = "/ui";

/// The cookie that holds the visitor's token.
const COOKIE: &str = "engram_token";

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLE: &str = include_str!("console.css");
const TAIL_SCRIPT: &str = include_str!("tail.js");

/// What every page handler gets: the server's gRPC services behind its
/// edge, and the authenticator for the login form.
#[derive(Clone)]
pub struct Console {
    grpc: Conn,
    auth: Authenticator,
    /// This process's secret for anti-forgery tokens when the server runs
    /// without tokens (see `actions`).
    secret: String,
}

pub fn router(grpc: Conn, auth: Authenticator) -> axum::Router {
    let console = Console {
        grpc,
        auth,
        secret: uuid::Uuid::new_v4().to_string(),
    };
    axum::Router::new()
        .route(PATH, get(pages::scopes))
        .route("/ui/", get(pages::scopes))
        .route("/ui/scope", get(pages::scope))
        .route("/ui/scope/purge", post(actions::purge))
        .route("/ui/key", get(pages::key))
        .route("/ui/log", get(pages::log))
        .route("/ui/export", get(pages::export))
        .route("/ui/sessions", get(pages::sessions))
        .route("/ui/session", get(pages::session))
        .route("/ui/session/tail", get(pages::tail))
        .route("/ui/session/delete", post(actions::delete_session))
        .route("/ui/rules", get(pages::rules))
        .route("/ui/facts", get(pages::facts))
        .route("/ui/fact", get(pages::fact))
        .route("/ui/episode", get(pages::episode))
        .route("/ui/search", get(pages::search))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/static/console.css", get(style))
        .route("/ui/static/tail.js", get(script))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            signed_in,
        ))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(console)
}

tokio::task_local! {
    /// Whether the visitor of the page being rendered holds a token (see
    /// [`signed_in`]).
    static SIGNED_IN: bool;
}

/// Renders the request's pages knowing whether their visitor is signed in,
/// so that the layout offers "Sign out" only to one who is: on a server
/// without tokens there is nothing to sign out of. A task-local rather
/// than a parameter of every page, since the layout is its only reader and
/// refusals and the sign-in page render pages too.
async fn signed_in(
    axum::extract::State(console): axum::extract::State<Console>,
    request: Request,
    next: Next,
) -> Response {
    let signed_in = console.auth.is_on() && cookie_token(request.headers()).is_some();
    SIGNED_IN.scope(signed_in, next.run(request)).await
}

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        TAIL_SCRIPT,
    )
        .into_response()
}

/// The visitor's token from the cookie, if any.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, token)| token.to_owned())
        .filter(|token| !token.is_empty())
}

/// Whether the request names this machine: `localhost`, `127.0.0.1` or
/// `[::1]`, with any port.
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

/// Who is looking: their connection to the services (with their token)
/// and whether their token is an admin's.
pub(crate) struct Visitor {
    pub conn: Conn,
    pub admin: bool,
}

impl Console {
    /// The visitor, from their cookie when tokens are on; a redirect to the
    /// login page when they have no valid token.
    pub(crate) fn visitor(&self, headers: &HeaderMap) -> Result<Visitor, Box<Response>> {
        let to_login = || Box::new(Redirect::to("/ui/login").into_response());
        let bearer = if self.auth.is_on() {
            let token = cookie_token(headers).ok_or_else(to_login)?;
            Some(HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| to_login())?)
        } else {
            // Without tokens anyone who reaches the port may look, so only
            // a browser on this machine may: a page elsewhere that points
            // a name of its own at this address (DNS rebinding) is refused.
            if !loopback_host(headers) {
                let body = page(
                    "Refused",
                    html! {
                        h1 { "Not from this host" }
                        p.error role="alert" {
                            "Without tokens the console answers only on localhost. Configure "
                            code { "--tokens" } " to use it from elsewhere."
                        }
                    },
                );
                return Err(Box::new((StatusCode::FORBIDDEN, body).into_response()));
            }
            None
        };
        let principal = self
            .auth
            .authenticate(bearer.as_ref().map(HeaderValue::as_bytes))
            .map_err(|_| to_login())?;
        Ok(Visitor {
            conn: connection(self.grpc.clone(), bearer),
            admin: principal.admin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(value).expect("header"));
        headers
    }

    #[test]
    fn only_this_machine_may_use_an_open_console() {
        for ok in [
            "localhost:9090",
            "127.0.0.1:9090",
            "[::1]:9090",
            "localhost",
        ] {
            assert!(loopback_host(&host(ok)), "{ok}");
        }
        for refused in [
            "evil.example:9090",
            "127.0.0.1.evil.example",
            "10.0.0.5:9090",
        ] {
            assert!(!loopback_host(&host(refused)), "{refused}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }

    #[test]
    fn the_token_comes_from_its_cookie() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; engram_token=eg_abc; other=1"),
        );
        assert_eq!(cookie_token(&headers).as_deref(), Some("eg_abc"));
        assert_eq!(cookie_token(&HeaderMap::new()), None);
    }
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// The sign-in page, with `error` above the form when a token was refused.
fn login_page(error: Option<&str>) -> Response {
    page(
        "Sign in",
        html! {
            h1 { "Sign in" }
            @match error {
                Some(error) => p.error role="alert" { (error) },
                None => p { "This server requires a bearer token. The console keeps it in a cookie only this site can read." },
            }
            form id="login" method="post" action="/ui/login" {
                label for="token" { "Token" }
                input id="token" name="token" type="password" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// The sign-in page; a server without tokens has none, and sends the
/// visitor on to the console.
async fn login_form(axum::extract::State(console): axum::extract::State<Console>) -> Response {
    if !console.auth.is_on() {
        return Redirect::to(PATH).into_response();
    }
    login_page(None)
}

async fn login(
    axum::extract::State(console): axum::extract::State<Console>,
    Posted(form): Posted<LoginForm>,
) -> Response {
    let token = form.token.trim();
    let header = format!("Bearer {token}");
    if console.auth.authenticate(Some(header.as_bytes())).is_err() || token.contains(';') {
        let body = login_page(Some("That token is not valid on this server."));
        return (StatusCode::UNAUTHORIZED, body).into_response();
    }
    let cookie = format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response()
}

async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response()
}

/// A whole page: the layout around `content`.
pub(crate) fn page(title: &str, content: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Engram" }
                link rel="stylesheet" href="/ui/static/console.css";
            }
            body {
                header {
                    nav aria-label="Main" {
                        a.brand href="/ui" { "Engram" }
                        a href="/ui" { "Scopes" }
                        a href="/ui/sessions" { "Sessions" }
                        a href="/ui/rules" { "Rules" }
                        a href="/ui/facts" { "Facts" }
                        form.search method="get" action="/ui/search" role="search" {
                            label.hidden for="q" { "Search" }
                            input id="q" name="q" type="search" placeholder="Search memory, facts, episodes";
                        }
                        @if SIGNED_IN.try_with(|signed_in| *signed_in).unwrap_or(false) {
                            form method="post" action="/ui/logout" {
                                button.link type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (content) }
            }
        }
    };
    Html(markup.into_string()).into_response()
}

/// A page's query string read as `T`. One that does not read (a field
/// missing, a number that is not one) is answered as a refused call is,
/// with the console's page, `INVALID_ARGUMENT` and what was wrong, instead
/// of axum's plain-text rejection.
pub(crate) struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Params(value)),
            Err(rejection) => Err(malformed(rejection.status(), rejection.body_text())),
        }
    }
}

/// A posted form read as `T`, refused as [`Params`] is.
pub(crate) struct Posted<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Posted<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        match axum::Form::<T>::from_request(request, state).await {
            Ok(axum::Form(value)) => Ok(Posted(value)),
            Err(rejection) => Err(malformed(rejection.status(), rejection.body_text())),
        }
    }
}

/// The page for a request the console cannot read: its status (400, or
/// 415 for a form of another type) with the reason a refused call shows.
fn malformed(status: StatusCode, text: String) -> Response {
    let body = page(
        "Refused",
        html! {
            h1 { "The request was malformed" }
            p.error role="alert" {
                code { "InvalidArgument" } " " code { "INVALID_ARGUMENT" } ": " (text)
            }
        },
    );
    (status, body).into_response()
}

/// A page for a refused call: the status, the reason and the message, as
/// the API gives them (never a stack or SQL; the API hides those).
pub(crate) fn refused(status: Status) -> Response {
    use tonic_types::StatusExt;
    let reason = status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default();
    let code = match status.code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
        tonic::Code::Unauthenticated => return Redirect::to("/ui/login").into_response(),
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = page(
        "Refused",
        html! {
            h1 { "The server refused" }
            p.error role="alert" {
                code { (format!("{:?}", status.code())) }
                @if !reason.is_empty() { " " code { (reason) } }
                ": " (status.message())
            }
        },
    );
    (code, body).into_response()
}
