//! Logs and traces. Logs go to stderr as text or JSON lines. When
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans are also exported by OTLP
//! over gRPC (the standard `OTEL_*` variables configure the exporter and
//! `OTEL_SERVICE_NAME` the service, `engram` by default), and each RPC's
//! span continues the caller's trace from its W3C `traceparent` metadata.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::codegen::http;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// Whether spans are exported (set once by [`init`]).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Flushes exported spans when dropped (at the end of `main`).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown_with_timeout(Duration::from_secs(5))
        {
            eprintln!("engram: exporting the last spans failed: {err}");
        }
    }
}

/// Installs the global subscriber: the log filter from `ENGRAM_LOG` (or
/// `RUST_LOG`), the log format, and the OTLP exporter when configured.
/// Must run inside the Tokio runtime (the exporter's channel lives there).
pub fn init(format: LogFormat) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_env("ENGRAM_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
    let provider = if endpoint.is_empty() {
        None
    } else {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|err| anyhow::anyhow!("cannot set up the OTLP exporter: {err}"))?;
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "engram".to_owned());
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(service)
                        .build(),
                )
                .build(),
        )
    };
    let traces = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("engram"))
            .boxed()
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|err| anyhow::anyhow!("cannot install the log subscriber: {err}"))?;
    if !endpoint.is_empty() {
        EXPORTING.store(true, Ordering::Relaxed);
        tracing::info!(%endpoint, "exporting traces by OTLP");
    }
    Ok(Telemetry { provider })
}

/// The span of one RPC, a child of the caller's span when the request
/// carries W3C trace context (`traceparent`, `tracestate`). The exported
/// span is named after the method (`otel.name`); logs name it once, as
/// `method`, and without an exporter the span holds nothing else.
pub fn rpc_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
    if !EXPORTING.load(Ordering::Relaxed) {
        return tracing::info_span!("rpc", method = %path);
    }
    let span = tracing::info_span!("rpc", otel.name = %path, rpc.system = "grpc", method = %path);
    if request.headers().contains_key("traceparent") {
        let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
        // Fails only when no OpenTelemetry layer is installed: nothing to do.
        let _ = span.set_parent(parent);
    }
    span
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
