//! `/mcp` on the HTTP port: the MCP server over streamable HTTP.
//!
//! Stateless: every POST stands on its own and no MCP session is kept in
//! memory, so any replica behind a Service can answer any request. The
//! bearer token is checked first, and a request without a valid one is
//! refused with 401 before MCP reads it (when tokens are configured). The
//! tools then call the server's own gRPC services in process with that same
//! token, so the tenant and the roles are the token's and every call passes
//! the gRPC edge (and its metrics) like any other.
//!
//! The `Host` header is checked against a list (DNS-rebinding protection
//! for a server on a developer's machine): by default only loopback names
//! when authentication is off, any host when tokens are required (a
//! browser tricked into calling cannot present a token it does not have).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::{Conn, Engram, connection};
use crate::auth::{self, Authenticator};

/// The path MCP is served at.
pub const PATH: &str = "/mcp";

/// Up to how much of a refused request's body is read before the 401, so
/// the connection stays usable: a response sent while the body is still
/// arriving makes hyper close the connection after it, and a client that
/// reuses the connection meanwhile gets a broken read instead of an answer.
/// A bigger body, or one still arriving after [`REFUSED_BODY_WAIT`], is not
/// read; the refusal then says `Connection: close`.
const REFUSED_BODY_LIMIT: usize = 64 * 1024;

/// How long a refused request's body may take to arrive: a client without
/// a token does not hold a task and a connection by sending slowly.
const REFUSED_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

struct Mcp {
    /// The server's gRPC services behind its edge, without a token.
    grpc: Conn,
    auth: Authenticator,
    config: StreamableHttpServerConfig,
}

/// The `/mcp` route. `allowed_hosts` overrides the default `Host` check
/// (see the module doc); `shutdown` ends open responses.
pub fn router(
    grpc: Conn,
    auth: Authenticator,
    allowed_hosts: Option<Vec<String>>,
    shutdown: CancellationToken,
) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_cancellation_token(shutdown);
    config = match allowed_hosts {
        Some(hosts) => config.with_allowed_hosts(hosts),
        None if auth.is_on() => config.disable_allowed_hosts(),
        None => config,
    };
    let state = Arc::new(Mcp { grpc, auth, config });
    axum::Router::new()
        .route(PATH, axum::routing::any(serve))
        .with_state(state)
}

async fn serve(State(mcp): State<Arc<Mcp>>, request: Request) -> Response {
    let header = request.headers().get(auth::AUTHORIZATION).cloned();
    let principal = match mcp.auth.authenticate(header.as_ref().map(|v| v.as_bytes())) {
        Ok(principal) => principal,
        Err(refusal) => return refuse(request, refusal).await,
    };
    let engram = Engram::new(connection(mcp.grpc.clone(), header), principal.admin);
    let service = StreamableHttpService::new(
        move || Ok(engram.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp.config.clone(),
    );
    service.handle(request).await.into_response()
}

/// The 401 (or 403) for `request`, after reading its body (see
/// [`REFUSED_BODY_LIMIT`]).
async fn refuse(request: Request, refusal: auth::Refusal) -> Response {
    let body = axum::body::to_bytes(request.into_body(), REFUSED_BODY_LIMIT);
    let drained = matches!(
        tokio::time::timeout(REFUSED_BODY_WAIT, body).await,
        Ok(Ok(_))
    );
    let mut response = crate::api::http::refused(refusal);
    if !drained {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}
