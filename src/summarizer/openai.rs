//! A summarizer that asks any OpenAI-compatible chat-completions endpoint
//! (OpenAI, vLLM, Ollama, LiteLLM, ...). One HTTP/1.1 connection per call
//! (compactions are rare; no pool to keep healthy), a timeout per attempt,
//! and retries with exponential backoff on 429 and 5xx, honouring
//! `Retry-After`. The API key is sent only as a bearer token and never
//! appears in errors or logs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes_body::{Body, collect};
use futures::future::BoxFuture;
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpStream;

use super::{Summarizer, SummarizerError, Summary, SummaryRequest};

/// The most of a response body read (a summary is a few KB).
const MAX_RESPONSE_BYTES: usize = 4 << 20;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

const SYSTEM_PROMPT: &str = "You compact the memory of an AI agent. Summarise the entries you are given \
into one concise note that keeps the facts, decisions and open questions and drops chatter. \
Reply with the note only.";

/// Settings of the HTTP summarizer.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The API base, e.g. `https://api.openai.com/v1`; `/chat/completions` is
    /// appended unless the URL already ends with it.
    pub url: String,
    /// The model asked when a request names none.
    pub model: String,
    pub api_key: Option<String>,
    /// Per attempt.
    pub timeout: Duration,
    /// Retries after the first attempt, on 429, 5xx and connection errors.
    pub retries: u32,
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

struct Endpoint {
    https: bool,
    host: String,
    port: u16,
    authority: String,
    path: String,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Self, String> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|err| format!("invalid summarizer URL {url:?}: {err}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(format!(
                    "the summarizer URL must be http:// or https://, got {url:?}"
                ));
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("the summarizer URL has no host: {url:?}"))?;
        let base = uri.path().trim_end_matches('/');
        let path = if base.ends_with("/chat/completions") {
            base.to_owned()
        } else {
            format!("{base}/chat/completions")
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

pub struct OpenAi {
    config: OpenAiConfig,
    endpoint: Endpoint,
    tls: tokio_rustls::TlsConnector,
}

/// What one attempt came back with.
enum Attempt {
    Done(Summary),
    /// Worth retrying, after the server's `Retry-After` if it gave one.
    Retry(String, Option<Duration>),
    Fail(String),
}

impl OpenAi {
    pub fn new(config: OpenAiConfig) -> Result<Self, String> {
        let endpoint = Endpoint::parse(&config.url)?;
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("cannot set up TLS: {err}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(OpenAi {
            config,
            endpoint,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
        })
    }

    fn body(&self, request: &SummaryRequest) -> Vec<u8> {
        let mut prompt = String::new();
        if !request.instruction.is_empty() {
            prompt.push_str(&format!("Instruction: {}\n\n", request.instruction));
        }
        for source in &request.sources {
            prompt.push_str(&format!(
                "### {} (version {})\n{}\n\n",
                source.key, source.version, source.text
            ));
        }
        let model = if request.model.is_empty() {
            &self.config.model
        } else {
            &request.model
        };
        let body = json!({
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt.trim_end()},
            ],
            "max_tokens": request.max_tokens,
            "temperature": 0,
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }

    async fn attempt(&self, body: Vec<u8>, model: &str) -> Attempt {
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
        let answer: serde_json::Value = match serde_json::from_slice(&bytes) {
            Ok(answer) => answer,
            Err(err) => return Attempt::Fail(format!("the answer is not JSON: {err}")),
        };
        match answer["choices"][0]["message"]["content"].as_str() {
            Some(text) => Attempt::Done(Summary {
                text: text.trim().to_owned(),
                model: answer["model"].as_str().unwrap_or(model).to_owned(),
            }),
            None => Attempt::Fail("the answer has no choices[0].message.content".to_owned()),
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
    let bytes = collect(response.into_body(), MAX_RESPONSE_BYTES).await?;
    Ok((status, retry_after, bytes))
}

impl Summarizer for OpenAi {
    fn summarize(
        &self,
        request: SummaryRequest,
    ) -> BoxFuture<'_, Result<Summary, SummarizerError>> {
        Box::pin(async move {
            let body = self.body(&request);
            let model = if request.model.is_empty() {
                self.config.model.clone()
            } else {
                request.model.clone()
            };
            let mut backoff = FIRST_BACKOFF;
            let mut attempt = 0;
            loop {
                match self.attempt(body.clone(), &model).await {
                    Attempt::Done(summary) => return Ok(summary),
                    Attempt::Fail(why) => return Err(SummarizerError(why)),
                    Attempt::Retry(why, retry_after) => {
                        if attempt >= self.config.retries {
                            return Err(SummarizerError(format!(
                                "{why} (after {} attempts)",
                                attempt + 1
                            )));
                        }
                        let wait = retry_after.unwrap_or(backoff).min(MAX_BACKOFF);
                        tracing::warn!(attempt, error = %why, ?wait, "summarizer call failed, retrying");
                        tokio::time::sleep(wait).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        attempt += 1;
                    }
                }
            }
        })
    }
}

/// Request and response bodies.
mod bytes_body {
    use http_body_util::BodyExt;

    pub type Body = http_body_util::Full<hyper::body::Bytes>;

    /// Reads a whole body, refusing one larger than `limit`.
    pub async fn collect(body: hyper::body::Incoming, limit: usize) -> Result<Vec<u8>, String> {
        let limited = http_body_util::Limited::new(body, limit);
        let collected = limited
            .collect()
            .await
            .map_err(|err| format!("cannot read the answer: {err}"))?;
        Ok(collected.to_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_chat_completions_path_once() {
        let e = Endpoint::parse("https://api.example.com/v1").expect("valid");
        assert_eq!(
            (e.https, e.host.as_str(), e.port, e.path.as_str()),
            (true, "api.example.com", 443, "/v1/chat/completions")
        );
        let e = Endpoint::parse("http://127.0.0.1:8000/v1/chat/completions/").expect("valid");
        assert_eq!(
            (e.https, e.port, e.path.as_str()),
            (false, 8000, "/v1/chat/completions")
        );
        assert!(Endpoint::parse("ftp://x/v1").is_err());
        assert!(Endpoint::parse("not a url").is_err());
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let config = OpenAiConfig {
            url: "http://x".to_owned(),
            model: "m".to_owned(),
            api_key: Some("sk-secret".to_owned()),
            timeout: Duration::from_secs(1),
            retries: 0,
        };
        assert!(!format!("{config:?}").contains("sk-secret"));
    }
}
