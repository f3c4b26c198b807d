//! A client of OpenAI-compatible HTTP APIs (OpenAI, vLLM, Ollama, TEI,
//! LiteLLM, ...), shared by the summarizer (`/chat/completions`) and the
//! embedder (`/embeddings`). One HTTP/1.1 connection per call (calls are
//! batched and rare next to the requests they serve; no pool to keep
//! healthy), a timeout per attempt, and retries with exponential backoff on
//! 429, 5xx and connection errors, honouring `Retry-After`. The API key is
//! sent only as a bearer token and never appears in errors or logs.
//!
//! Written on hyper rather than an SDK: each use is one POST of JSON, and
//! the SDKs bring reqwest and a second TLS stack.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Body = http_body_util::Full<hyper::body::Bytes>;

/// The most of a response body read (a batch of embeddings is a few MB).
const MAX_RESPONSE_BYTES: usize = 32 << 20;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Where and how to call an endpoint.
#[derive(Clone)]
pub struct HttpConfig {
    /// The API base, e.g. `https://api.openai.com/v1`; the operation's path
    /// (`/chat/completions`, `/embeddings`) is appended unless the URL
    /// already ends with it.
    pub url: String,
    pub api_key: Option<String>,
    /// Per attempt.
    pub timeout: Duration,
    /// Retries after the first attempt, on 429, 5xx and connection errors.
    pub retries: u32,
}

impl fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConfig")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

/// Refuses a URL no endpoint could have, so that the configuration is
/// refused at start rather than at the first call (`what` as for
/// [`Client::new`]).
pub fn check_url(url: &str, what: &str) -> Result<(), String> {
    Endpoint::parse(url, "", what).map(|_| ())
}

struct Endpoint {
    https: bool,
    host: String,
    port: u16,
    authority: String,
    path: String,
}

impl Endpoint {
    /// `what` names the endpoint in errors ("summarizer", "embedder").
    fn parse(url: &str, operation: &str, what: &str) -> Result<Self, String> {
        let not_http = || format!("the {what} URL must be http:// or https://, got {url:?}");
        if !url.contains("://") {
            return Err(not_http());
        }
        let uri: hyper::Uri = url
            .parse()
            .map_err(|err| format!("invalid {what} URL {url:?}: {err}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(not_http()),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("the {what} URL has no host: {url:?}"))?;
        let base = uri.path().trim_end_matches('/');
        let path = if base.ends_with(operation) {
            base.to_owned()
        } else {
            format!("{base}{operation}")
        };
        Ok(Endpoint {
            https,
            host: authority
                .host()
                .trim_matches(|c| c == '[' || c == ']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            authority: authority.as_str().to_owned(),
            path,
        })
    }
}

/// A client of one operation of one endpoint.
pub struct Client {
    config: HttpConfig,
    endpoint: Endpoint,
    tls: tokio_rustls::TlsConnector,
    what: &'static str,
}

/// What one attempt came back with.
enum Attempt {
    Done(serde_json::Value),
    /// Worth retrying, after the server's `Retry-After` if it gave one.
    Retry(String, Option<Duration>),
    Fail(String),
}

impl Client {
    /// A client POSTing to `operation` (e.g. `/embeddings`) under the
    /// configured URL; `what` names it in errors and logs.
    pub fn new(config: HttpConfig, operation: &str, what: &'static str) -> Result<Self, String> {
        let endpoint = Endpoint::parse(&config.url, operation, what)?;
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("cannot set up TLS: {err}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Client {
            config,
            endpoint,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            what,
        })
    }

    /// POSTs `body` and returns the JSON answer, retrying as configured.
    pub async fn post(&self, body: &serde_json::Value) -> Result<serde_json::Value, String> {
        let body = serde_json::to_vec(body).map_err(|err| err.to_string())?;
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0;
        loop {
            match self.attempt(body.clone()).await {
                Attempt::Done(answer) => return Ok(answer),
                Attempt::Fail(why) => return Err(why),
                Attempt::Retry(why, retry_after) => {
                    if attempt >= self.config.retries {
                        return Err(format!("{why} (after {} attempts)", attempt + 1));
                    }
                    let wait = retry_after.unwrap_or(backoff).min(MAX_BACKOFF);
                    tracing::warn!(
                        endpoint = self.what,
                        attempt,
                        error = %why,
                        ?wait,
                        "call failed, retrying"
                    );
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    attempt += 1;
                }
            }
        }
    }

    async fn attempt(&self, body: Vec<u8>) -> Attempt {
        let endpoint = &self.endpoint;
        let mut request = Request::post(endpoint.path.as_str())
            .header(HOST, endpoint.authority.as_str())
            .header(CONTENT_TYPE, "application/json");
        if let Some(key) = &self.config.api_key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = match request.body(Body::from(body)) {
            Ok(request) => request,
            Err(err) => return Attempt::Fail(format!("cannot build the request: {err}")),
        };
        let sent = tokio::time::timeout(self.config.timeout, async {
            let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
                .await
                .map_err(|err| format!("cannot connect to {}: {err}", endpoint.authority))?;
            if endpoint.https {
                let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
                    .map_err(|err| format!("invalid host name: {err}"))?;
                let tls = self
                    .tls
                    .connect(name, tcp)
                    .await
                    .map_err(|err| format!("TLS with {} failed: {err}", endpoint.authority))?;
                send(TokioIo::new(tls), request).await
            } else {
                send(TokioIo::new(tcp), request).await
            }
        })
        .await;
        let (status, retry_after, bytes) = match sent {
            Err(_) => {
                return Attempt::Retry(format!("no answer within {:?}", self.config.timeout), None);
            }
            Ok(Err(err)) => return Attempt::Retry(err, None),
            Ok(Ok(answer)) => answer,
        };
        if status == 429 || status >= 500 {
            return Attempt::Retry(
                format!("HTTP {status}{}", error_message(&bytes)),
                retry_after,
            );
        }
        if !(200..300).contains(&status) {
            return Attempt::Fail(format!("HTTP {status}{}", error_message(&bytes)));
        }
        match serde_json::from_slice(&bytes) {
            Ok(answer) => Attempt::Done(answer),
            Err(err) => Attempt::Fail(format!("the answer is not JSON: {err}")),
        }
    }
}

/// The `error.message` of an OpenAI-style error body, if there is one.
fn error_message(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|body| body["error"]["message"].as_str().map(|m| format!(": {m}")))
        .unwrap_or_default()
}

async fn send<I>(io: I, request: Request<Body>) -> Result<(u16, Option<Duration>, Vec<u8>), String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|err| format!("HTTP handshake failed: {err}"))?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|err| format!("the request failed: {err}"))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let limited = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|err| format!("cannot read the answer: {err}"))?
        .to_bytes()
        .to_vec();
    Ok((status, retry_after, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_operation_path_once() {
        let e =
            Endpoint::parse("https://api.example.com/v1", "/chat/completions", "x").expect("valid");
        assert_eq!(
            (e.https, e.host.as_str(), e.port, e.path.as_str()),
            (true, "api.example.com", 443, "/v1/chat/completions")
        );
        let e = Endpoint::parse("http://127.0.0.1:8000/v1/embeddings/", "/embeddings", "x")
            .expect("valid");
        assert_eq!(
            (e.https, e.port, e.path.as_str()),
            (false, 8000, "/v1/embeddings")
        );
        assert!(Endpoint::parse("ftp://x/v1", "/embeddings", "x").is_err());
        assert!(Endpoint::parse("not a url", "/embeddings", "x").is_err());
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let config = HttpConfig {
            url: "http://x".to_owned(),
            api_key: Some("sk-secret".to_owned()),
            timeout: Duration::from_secs(1),
            retries: 0,
        };
        assert!(!format!("{config:?}").contains("sk-secret"));
    }
}
