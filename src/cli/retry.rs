//! Retries of the CLI's unary calls, under the clients' rule
//! (`engram_client`, the Go client's `Idempotent`, MCP's tools): after
//! UNAVAILABLE when repeating the call is harmless (a read; a write that
//! sets state to what it carries: a goal, a task's fields, a cached file, a
//! session's end, a retention policy, the reindex; a write that carries its
//! idempotency key: `--request-id` on `memory set` and `memory delete`,
//! and on `sessions create`, `working task-create`, `working remember` and
//! `working procedure` (which make one up when not given), an episode's
//! `--id`, a session id for get-or-create),
//! and after a failure whose reason says nothing was written
//! (`TRANSACTION_CONFLICT`, `SESSION_CHANGED`, `DATABASE_TIMEOUT`) whatever
//! the call; `--retries` times (3 by default), each waiting what the
//! server's `RetryInfo` asks or else a backoff from 0.1 to 2 s. So a
//! script's `engram memory get` rides out a database failover or a server
//! restart as a program using a client does.
//!
//! Written as a layer over the channel rather than around each command's
//! calls: a unary request's one message is read whole, decoded by its
//! method to tell whether repeating it is harmless, and sent again from the
//! same bytes; the answer's status is read from its trailers (or its
//! headers, for an answer with no message). Streams pass through
//! untouched: the commands that read one resume it from its position
//! themselves (`memory history` under this rule through [`Resumes`];
//! `watch` and `episodes tail` reconnect until told not to), and `Export`
//! and `Import` are not repeated, an export being one snapshot.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use prost::Message;
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower::Service;

use crate::proto;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The wait before a retry the server gave no delay for: the first, and
/// the most; each doubles the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// The unary methods whose calls only read: repeating one changes
/// nothing. (`History`, `Watch`, `TailEpisodes` and `Export` are streams;
/// see the module for what becomes of them.)
const READS: [&str; 21] = [
    "MemoryService/Get",
    "MemoryService/List",
    "MemoryService/ListScopes",
    "MemoryAdminService/GetCompactionLog",
    "MemoryAdminService/GetRetention",
    "SearchService/Search",
    "SessionService/GetSession",
    "SessionService/ListSessions",
    "SessionService/GetStats",
    "EpisodeService/ListEpisodes",
    "EpisodeService/GetEpisode",
    "EpisodeService/Recent",
    "EpisodeService/BuildContext",
    "ConsolidationService/GetRule",
    "ConsolidationService/ListRules",
    "ConsolidationService/GetFact",
    "ConsolidationService/ListFacts",
    "WorkingMemoryService/ListTasks",
    "WorkingMemoryService/GetSnapshot",
    "WorkingMemoryService/RenderMemoryBlock",
    "WorkingMemoryService/ListTools",
];

/// The unary methods that set state to what they carry, so that a repeat
/// leaves it as the first left it. (A repeat's reply describes the repeat:
/// a cached file evicts nothing more, an end deletes no more episodes.)
const SETTERS: [&str; 6] = [
    "WorkingMemoryService/SetGoal",
    "WorkingMemoryService/UpdateTask",
    "WorkingMemoryService/CacheContent",
    "SessionService/EndSession",
    "MemoryAdminService/SetRetention",
    "MemoryAdminService/Reindex",
];

/// The LLM tools (names and aliases) that set what they carry, so that
/// `CallTool` of one is harmless to repeat with no `request_id`.
const SETTING_TOOLS: [&str; 3] = ["TaskUpdate", "memory.task_update", "memory.set_goal"];

/// Whether sending the request of `method` (`/engram.v1.MemoryService/Set`)
/// whose message is `message` twice has the effect of sending it once.
pub fn harmless(method: &str, message: &[u8]) -> bool {
    let Some(method) = method.strip_prefix("/engram.v1.") else {
        return false;
    };
    if READS.contains(&method) || SETTERS.contains(&method) {
        return true;
    }
    match method {
        "MemoryService/Set" => {
            proto::SetRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "MemoryService/Delete" => {
            proto::DeleteRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "EpisodeService/AppendEpisode" => proto::AppendEpisodeRequest::decode(message)
            .is_ok_and(|r| r.episode.is_some_and(|e| !e.id.is_empty())),
        "EpisodeService/AppendEpisodes" => proto::AppendEpisodesRequest::decode(message)
            .is_ok_and(|r| !r.episodes.is_empty() && r.episodes.iter().all(|e| !e.id.is_empty())),
        "ConsolidationService/CreateRule" => {
            proto::CreateRuleRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "SessionService/CreateSession" => {
            proto::CreateSessionRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "WorkingMemoryService/CreateTask" => {
            proto::CreateTaskRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "WorkingMemoryService/Remember" => {
            proto::RememberRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "WorkingMemoryService/RecordProcedure" => {
            proto::RecordProcedureRequest::decode(message).is_ok_and(|r| !r.request_id.is_empty())
        }
        "WorkingMemoryService/CallTool" => proto::CallToolRequest::decode(message)
            .is_ok_and(|r| !r.request_id.is_empty() || SETTING_TOOLS.contains(&r.name.as_str())),
        "SessionService/GetOrCreateSession" => proto::GetOrCreateSessionRequest::decode(message)
            .is_ok_and(|r| !r.session_id.is_empty() || !r.request_id.is_empty()),
        _ => false,
    }
}

/// The wait before trying again after a call that ended `status`, when
/// it may be tried again; `backoff` is the next wait the server gave none
/// for (doubled when used).
fn wait_after(status: &Status, harmless: bool, backoff: &mut Duration) -> Option<Duration> {
    let nothing_written = status
        .get_details_error_info()
        .is_some_and(|info| crate::error::Reason::wrote_nothing(&info.reason));
    if !(nothing_written || harmless && status.code() == Code::Unavailable) {
        return None;
    }
    if let Some(delay) = status.get_details_retry_info().and_then(|r| r.retry_delay) {
        return Some(delay);
    }
    Some(grown(backoff))
}

/// Whether the connection broke under the call (the server went away
/// mid-stream): a status the client made of a transport error, UNKNOWN or
/// INTERNAL, which carries that error as its source, where a status the
/// server sent carries none.
pub fn broken(status: &Status) -> bool {
    matches!(status.code(), Code::Unknown | Code::Internal)
        && std::error::Error::source(status).is_some()
}

/// The wait `backoff` holds, doubling it for the next time.
fn grown(backoff: &mut Duration) -> Duration {
    let delay = *backoff;
    *backoff = (*backoff * 2).min(BACKOFF.1);
    delay
}

/// What failed, for the line saying a call is tried again: the status's
/// code and reason.
fn why(status: &Status) -> String {
    let reason = status
        .get_details_error_info()
        .map(|info| format!(" {}", info.reason))
        .unwrap_or_default();
    format!("{}{reason}", crate::api::edge::code_name(status.code()))
}

/// Says on stderr that a call is tried again, and why: a person or a
/// script's log would want to know why the command took longer.
fn announce(method: &str, failure: &str, delay: Duration, tried: u32, retries: u32) {
    eprintln!(
        "engram: {} failed ({failure}); trying again in {:.1} s ({tried} of {retries})",
        method.rsplit('/').next().unwrap_or_default(),
        delay.as_secs_f64()
    );
}

/// The tries of a stream that a command reads on after a break, from the
/// position after the last message it printed (`memory history`): asked
/// again under the layer's rule for a read, `--retries` breaks in a row.
pub struct Resumes {
    retries: u32,
    failed: u32,
    backoff: Duration,
}

impl Resumes {
    pub fn new(retries: u32) -> Self {
        Resumes {
            retries,
            failed: 0,
            backoff: BACKOFF.0,
        }
    }

    /// Whether to open the stream of `method` again after it ended with
    /// `status`; when so, the wait is said and waited first. A stream
    /// whose connection broke ([`broken`]) is read on as after
    /// UNAVAILABLE.
    pub async fn again(&mut self, method: &str, status: &Status) -> bool {
        self.failed += 1;
        if self.failed > self.retries {
            return false;
        }
        let (delay, failure) = if broken(status) {
            let failure = format!("the connection broke: {}", status.message());
            (grown(&mut self.backoff), failure)
        } else {
            match wait_after(status, true, &mut self.backoff) {
                Some(delay) => (delay, why(status)),
                None => return false,
            }
        };
        announce(method, &failure, delay, self.failed, self.retries);
        tokio::time::sleep(delay).await;
        true
    }

    /// The stream delivered: its next break counts as the first.
    pub fn progressed(&mut self) {
        self.failed = 0;
        self.backoff = BACKOFF.0;
    }
}

/// The layer: the CLI's channel with retries (see the module).
#[derive(Clone)]
pub struct Retrying<S> {
    inner: S,
    retries: u32,
}

impl<S> Retrying<S> {
    pub fn new(inner: S, retries: u32) -> Self {
        Retrying { inner, retries }
    }

    /// `--retries`: how many times a call is tried again.
    pub fn retries(&self) -> u32 {
        self.retries
    }
}

/// A unary answer read whole: its head, its message (if any) and its
/// trailers.
struct Answer {
    parts: http::response::Parts,
    data: Bytes,
    trailers: Option<http::HeaderMap>,
}

impl Answer {
    async fn read<B>(response: http::Response<B>) -> Result<Answer, BoxError>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.map_err(Into::into)?;
        let trailers = collected.trailers().cloned();
        Ok(Answer {
            parts,
            data: collected.to_bytes(),
            trailers,
        })
    }

    /// Its status: from the trailers, or the headers of an answer that
    /// has no message.
    fn status(&self) -> Option<Status> {
        self.trailers
            .as_ref()
            .and_then(Status::from_header_map)
            .or_else(|| Status::from_header_map(&self.parts.headers))
    }

    fn into_response(self) -> http::Response<Body> {
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::with_capacity(2);
        if !self.data.is_empty() {
            frames.push(Ok(Frame::data(self.data)));
        }
        if let Some(trailers) = self.trailers {
            frames.push(Ok(Frame::trailers(trailers)));
        }
        let body = StreamBody::new(futures::stream::iter(frames));
        http::Response::from_parts(self.parts, Body::new(body))
    }
}

impl<S, B> Service<http::Request<Body>> for Retrying<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().to_owned();
        if self.retries == 0 || crate::metrics::method_type(&method) != Some("unary") {
            let call = self.inner.call(request);
            return Box::pin(async move {
                call.await
                    .map(|response| response.map(Body::new))
                    .map_err(Into::into)
            });
        }
        // The service polled ready is this one; a clone takes its place.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let retries = self.retries;
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let sent = body.collect().await?.to_bytes();
            // After the five bytes of gRPC's framing (uncompressed).
            let harmless = harmless(&method, sent.get(5..).unwrap_or_default());
            let mut backoff = BACKOFF.0;
            let mut tried = 0;
            loop {
                let request =
                    http::Request::from_parts(parts.clone(), Body::new(Full::new(sent.clone())));
                let answered = if tried == 0 {
                    inner.call(request).await
                } else {
                    match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
                        Ok(()) => inner.call(request).await,
                        Err(err) => Err(err),
                    }
                };
                tried += 1;
                let (delay, outcome, failure) = match answered {
                    // Not answered (the connection was refused or broke):
                    // as UNAVAILABLE, whose write may or may not be stored.
                    Err(err) => {
                        let delay = harmless.then(|| grown(&mut backoff));
                        let failure = "the server was not reached".to_owned();
                        (delay, Err(err.into()), failure)
                    }
                    Ok(response) => {
                        let answer = Answer::read(response).await?;
                        let failed = answer.status().filter(|status| status.code() != Code::Ok);
                        let delay = failed
                            .as_ref()
                            .and_then(|status| wait_after(status, harmless, &mut backoff));
                        let failure = failed.as_ref().map(why).unwrap_or_default();
                        (delay, Ok(answer.into_response()), failure)
                    }
                };
                match delay {
                    Some(delay) if tried <= retries => {
                        announce(&method, &failure, delay, tried, retries);
                        tokio::time::sleep(delay).await;
                    }
                    _ => return outcome,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(message: &impl Message) -> Vec<u8> {
        message.encode_to_vec()
    }

    #[test]
    fn what_is_harmless_to_repeat() {
        let episode = |id: &str| proto::NewEpisode {
            id: id.into(),
            ..proto::NewEpisode::default()
        };
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("/engram.v1.MemoryService/Get", vec![], true),
            ("/engram.v1.SearchService/Search", vec![], true),
            (
                "/engram.v1.MemoryService/Set",
                encoded(&proto::SetRequest::default()),
                false,
            ),
            (
                "/engram.v1.MemoryService/Set",
                encoded(&proto::SetRequest {
                    request_id: "r".into(),
                    ..proto::SetRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.MemoryService/Delete",
                encoded(&proto::DeleteRequest {
                    request_id: "r".into(),
                    ..proto::DeleteRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.EpisodeService/AppendEpisode",
                encoded(&proto::AppendEpisodeRequest {
                    episode: Some(episode("")),
                    ..proto::AppendEpisodeRequest::default()
                }),
                false,
            ),
            (
                "/engram.v1.EpisodeService/AppendEpisode",
                encoded(&proto::AppendEpisodeRequest {
                    episode: Some(episode("e")),
                    ..proto::AppendEpisodeRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.EpisodeService/AppendEpisodes",
                encoded(&proto::AppendEpisodesRequest {
                    episodes: vec![episode("e"), episode("")],
                    ..proto::AppendEpisodesRequest::default()
                }),
                false,
            ),
            (
                "/engram.v1.EpisodeService/AppendEpisodes",
                encoded(&proto::AppendEpisodesRequest::default()),
                false,
            ),
            (
                "/engram.v1.SessionService/GetOrCreateSession",
                encoded(&proto::GetOrCreateSessionRequest {
                    session_id: "s".into(),
                    ..proto::GetOrCreateSessionRequest::default()
                }),
                true,
            ),
            ("/engram.v1.SessionService/CreateSession", vec![], false),
            ("/engram.v1.ConsolidationService/CreateRule", vec![], false),
            (
                "/engram.v1.ConsolidationService/CreateRule",
                encoded(&proto::CreateRuleRequest {
                    request_id: "r".into(),
                    ..proto::CreateRuleRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.SessionService/CreateSession",
                encoded(&proto::CreateSessionRequest {
                    request_id: "r".into(),
                    ..proto::CreateSessionRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.SessionService/GetOrCreateSession",
                encoded(&proto::GetOrCreateSessionRequest {
                    request_id: "r".into(),
                    ..proto::GetOrCreateSessionRequest::default()
                }),
                true,
            ),
            ("/engram.v1.WorkingMemoryService/SetGoal", vec![], true),
            ("/engram.v1.WorkingMemoryService/UpdateTask", vec![], true),
            ("/engram.v1.SessionService/EndSession", vec![], true),
            ("/engram.v1.WorkingMemoryService/CreateTask", vec![], false),
            (
                "/engram.v1.WorkingMemoryService/CreateTask",
                encoded(&proto::CreateTaskRequest {
                    request_id: "r".into(),
                    ..proto::CreateTaskRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.WorkingMemoryService/Remember",
                encoded(&proto::RememberRequest {
                    request_id: "r".into(),
                    ..proto::RememberRequest::default()
                }),
                true,
            ),
            ("/engram.v1.WorkingMemoryService/Remember", vec![], false),
            (
                "/engram.v1.WorkingMemoryService/CallTool",
                encoded(&proto::CallToolRequest {
                    name: "TaskCreate".into(),
                    ..proto::CallToolRequest::default()
                }),
                false,
            ),
            (
                "/engram.v1.WorkingMemoryService/CallTool",
                encoded(&proto::CallToolRequest {
                    name: "TaskCreate".into(),
                    request_id: "call_1".into(),
                    ..proto::CallToolRequest::default()
                }),
                true,
            ),
            (
                "/engram.v1.WorkingMemoryService/CallTool",
                encoded(&proto::CallToolRequest {
                    name: "memory.task_update".into(),
                    ..proto::CallToolRequest::default()
                }),
                true,
            ),
            ("/engram.v1.SessionService/DeleteSession", vec![], false),
            ("/engram.v1.MemoryService/Rollback", vec![], false),
            ("/engram.v1.MemoryService/Set", vec![0xff, 0xff], false),
            ("/grpc.health.v1.Health/Check", vec![], false),
        ];
        for (method, message, want) in cases {
            assert_eq!(harmless(method, &message), want, "{method} {message:?}");
        }
    }

    #[test]
    fn what_is_tried_again_and_after_how_long() {
        use std::collections::HashMap;
        use tonic_types::ErrorDetails;
        let failed = |code: Code, reason: &str, retry: Option<Duration>| {
            let mut details = ErrorDetails::with_error_info(reason, "engram", HashMap::new());
            if let Some(delay) = retry {
                details.set_retry_info(Some(delay));
            }
            Status::with_error_details(code, "failed", details)
        };
        let mut backoff = BACKOFF.0;
        let unavailable = failed(
            Code::Unavailable,
            "DATABASE_UNAVAILABLE",
            Some(Duration::from_secs(1)),
        );
        assert_eq!(
            wait_after(&unavailable, false, &mut backoff),
            None,
            "maybe stored"
        );
        assert_eq!(
            wait_after(&unavailable, true, &mut backoff),
            Some(Duration::from_secs(1)),
            "as the server asks"
        );
        // Nothing written: any call, after a growing backoff.
        let conflict = failed(Code::Aborted, "TRANSACTION_CONFLICT", None);
        let waits: Vec<_> = (0..7)
            .map(|_| wait_after(&conflict, false, &mut backoff))
            .collect();
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(
            waits,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );
        let timeout = failed(Code::Unavailable, "DATABASE_TIMEOUT", None);
        assert!(wait_after(&timeout, false, &mut backoff).is_some());
        for (code, reason) in [
            (Code::Aborted, "VERSION_MISMATCH"),
            (Code::NotFound, "KEY_NOT_FOUND"),
            (Code::Internal, "INTERNAL"),
        ] {
            let refused = failed(code, reason, None);
            assert_eq!(wait_after(&refused, true, &mut backoff), None, "{reason}");
        }
    }

    #[test]
    fn every_read_and_setter_is_a_method_of_the_protos() {
        for read in READS.iter().chain(&SETTERS) {
            let method = format!("/engram.v1.{read}");
            assert_eq!(
                crate::metrics::method_type(&method),
                Some("unary"),
                "{method}"
            );
        }
    }
}
