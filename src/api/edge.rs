//! The gRPC edge every call passes before reaching a service: it
//! authenticates the bearer token (putting the [`Principal`](crate::auth::Principal) into the
//! request's extensions, where [`caller_context`](super::context) finds
//! it), checks the role the method needs, and counts the call, its status
//! code and latency, and the streams open, into the metrics registry.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::body::Body;
use tonic::codegen::Bytes;
use tonic::codegen::http::{HeaderMap, Request, Response};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::auth::{self, Authenticator, Refusal};
use crate::metrics;

use super::error::ERROR_DOMAIN;

/// Server streams that stay open while a client follows: counted as live
/// streams, and kept out of the latency histograms.
const LIVE_STREAMS: [&str; 3] = [
    "/engram.v1.MemoryService/Watch",
    "/engram.v1.EpisodeService/TailEpisodes",
    "/grpc.health.v1.Health/Watch",
];

#[derive(Clone, Debug)]
pub struct EdgeLayer {
    auth: Authenticator,
}

impl EdgeLayer {
    pub fn new(auth: Authenticator) -> Self {
        // Each live stream's gauge is exported from the start, at 0, so a
        // dashboard or an alert reads "none open" rather than nothing.
        metrics::global().expect_streams(&LIVE_STREAMS);
        EdgeLayer { auth }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            auth: self.auth.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Edge<S> {
    inner: S,
    auth: Authenticator,
}

/// The status a refused call gets, with `ErrorInfo.reason` saying why.
pub fn refusal_status(refusal: Refusal) -> Status {
    let code = match refusal {
        Refusal::Missing | Refusal::Invalid => Code::Unauthenticated,
        Refusal::Forbidden(_) => Code::PermissionDenied,
    };
    let details = ErrorDetails::with_error_info(refusal.reason(), ERROR_DOMAIN, []);
    Status::with_error_details(code, refusal.message(), details)
}

impl<S, B> tower::Service<Request<B>> for Edge<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Observed>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let started = Instant::now();
        let method = request.uri().path().to_owned();
        if !auth::is_public(&method) {
            let header = request
                .headers()
                .get(auth::AUTHORIZATION)
                .map(|value| value.as_bytes());
            match self.auth.authorize(header, auth::role_for(&method)) {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(refusal) => {
                    let response = refusal_status(refusal).into_http::<Body>();
                    return Box::pin(std::future::ready(Ok(Observed::wrap(
                        response, method, started,
                    ))));
                }
            }
        }
        // The clone is ready only if it is the one polled: swap it in.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(request).await?;
            Ok(Observed::wrap(response, method, started))
        })
    }
}

/// A response body that reports the call to the metrics once it ends: with
/// the status code from the trailers (or the headers, for an error without
/// a body), or `CANCELLED` when the client went away first.
pub struct Observed {
    inner: Body,
    call: Option<Call>,
}

struct Call {
    method: String,
    started: Instant,
    live: bool,
    code: Option<&'static str>,
}

impl Observed {
    fn wrap(response: Response<Body>, method: String, started: Instant) -> Response<Observed> {
        let live = LIVE_STREAMS.contains(&method.as_str());
        let code = grpc_status(response.headers());
        // Methods nobody serves come from the client: keep them out of the
        // label set, which must stay bounded.
        let method = if code == Some("UNIMPLEMENTED") {
            "unknown".to_owned()
        } else {
            method
        };
        metrics::global().call_started(&method);
        if live {
            metrics::global().stream_delta(&method, 1);
        }
        response.map(|inner| Observed {
            inner,
            call: Some(Call {
                method,
                started,
                live,
                code,
            }),
        })
    }

    fn finish(&mut self, fallback: &'static str) {
        let Some(call) = self.call.take() else {
            return;
        };
        let registry = metrics::global();
        let code = call.code.unwrap_or(fallback);
        registry.call_finished(&call.method, code, call.started.elapsed());
        if call.live {
            registry.stream_delta(&call.method, -1);
        }
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        self.finish("CANCELLED");
    }
}

impl http_body::Body for Observed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = grpc_status(trailers);
                    if let Some(call) = &mut self.call {
                        call.code = code.or(call.code);
                    }
                    self.finish("UNKNOWN");
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish("UNKNOWN"),
            Poll::Ready(None) => self.finish("UNKNOWN"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The `grpc-status` of headers or trailers, by name.
fn grpc_status(headers: &HeaderMap) -> Option<&'static str> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    let code = Code::from_i32(value.parse().ok()?);
    Some(code_name(code))
}

pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
