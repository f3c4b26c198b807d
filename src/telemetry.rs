//! Logs and traces. Logs go to stderr as text or JSON lines. When
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans are also exported by OTLP
//! over gRPC (the standard `OTEL_*` variables configure the exporter and
//! `OTEL_SERVICE_NAME` the service, `engram` by default), and each RPC's
//! span continues the caller's trace from its W3C `traceparent` metadata.
//! Logs leave out the fields only the exporter reads (see `fields`).

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

/// Whether text logs may colour: stderr is a terminal and `NO_COLOR` is
/// unset (<https://no-color.org>).
fn colours() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber: the log filter from `ENGRAM_LOG` (or
/// `RUST_LOG`), the log format, and the OTLP exporter when configured.
/// Must run inside the Tokio runtime (the exporter's channel lives there).
pub fn init(format: LogFormat) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_env("ENGRAM_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let logs = match format {
        // Colours only for a terminal: a file or a pipe (`kubectl logs`,
        // `> serve.log`) would hold the escape codes as text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .fmt_fields(fields::TextFields)
            .with_ansi(colours())
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .fmt_fields(fields::JsonFields)
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
        tracing::info!(%endpoint, "exporting traces by OTLP");
    }
    Ok(Telemetry { provider })
}

/// The span of one RPC, a child of the caller's span when the request
/// carries W3C trace context (`traceparent`, `tracestate`). The exported
/// span is named after the method (`otel.name`); logs name it once, as
/// `method`, and leave out what only the exporter reads ([`fields`]).
pub fn rpc_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
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

/// The fields of spans and events as logs print them: all but those only
/// the exporter reads (`otel.name`, `rpc.system`, and the like), so a log
/// line has the same shape with an exporter as without one.
///
/// Written here: `tracing-subscriber` formats every field a span holds and
/// has no filter of fields, only of spans and events. These wrap its own
/// text and JSON visitors and skip the exporter's fields.
mod fields {
    use std::collections::BTreeMap;
    use std::fmt;

    use tracing::field::{Field, Visit};
    use tracing_subscriber::field::{MakeVisitor, RecordFields, VisitFmt, VisitOutput};
    use tracing_subscriber::fmt::FormatFields;
    use tracing_subscriber::fmt::FormattedFields;
    use tracing_subscriber::fmt::format::{DefaultVisitor, JsonVisitor, Writer};

    /// Whether a field is the exporter's alone.
    fn exporters(field: &Field) -> bool {
        let name = field.name();
        name.starts_with("otel.") || name.starts_with("rpc.")
    }

    /// A visitor that passes every field but the exporter's to `V`.
    pub struct LogsOnly<V>(V);

    /// Each of `Visit`'s methods, passing the field on unless it is the
    /// exporter's.
    macro_rules! pass_on {
        ($($method:ident: $value:ty),* $(,)?) => {
            $(
                fn $method(&mut self, field: &Field, value: $value) {
                    if !exporters(field) {
                        self.0.$method(field, value);
                    }
                }
            )*
        };
    }

    impl<V: Visit> Visit for LogsOnly<V> {
        pass_on! {
            record_debug: &dyn fmt::Debug,
            record_str: &str,
            record_i64: i64,
            record_u64: u64,
            record_i128: i128,
            record_u128: u128,
            record_bool: bool,
            record_f64: f64,
            record_error: &(dyn std::error::Error + 'static),
        }
    }

    impl<V: VisitOutput<fmt::Result>> VisitOutput<fmt::Result> for LogsOnly<V> {
        fn finish(self) -> fmt::Result {
            self.0.finish()
        }
    }

    impl<V: VisitFmt> VisitFmt for LogsOnly<V> {
        fn writer(&mut self) -> &mut dyn fmt::Write {
            self.0.writer()
        }
    }

    /// The text format's fields (`name=value`, space-separated).
    pub struct TextFields;

    impl<'a> MakeVisitor<Writer<'a>> for TextFields {
        type Visitor = LogsOnly<DefaultVisitor<'a>>;

        fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
            LogsOnly(DefaultVisitor::new(target, true))
        }
    }

    /// The JSON format's fields: one object per span.
    pub struct JsonFields;

    impl<'a> FormatFields<'a> for JsonFields {
        fn format_fields<R: RecordFields>(&self, mut writer: Writer<'_>, fields: R) -> fmt::Result {
            let mut visitor = LogsOnly(JsonVisitor::new(&mut writer));
            fields.record(&mut visitor);
            visitor.finish()
        }

        /// Fields recorded on a span later join its object.
        fn add_fields(
            &self,
            current: &'a mut FormattedFields<Self>,
            fields: &tracing::span::Record<'_>,
        ) -> fmt::Result {
            let mut added = String::new();
            self.format_fields(Writer::new(&mut added), fields)?;
            if current.fields.is_empty() {
                current.fields = added;
                return Ok(());
            }
            let mut object: BTreeMap<String, serde_json::Value> =
                serde_json::from_str(&current.fields).map_err(|_| fmt::Error)?;
            let added: BTreeMap<String, serde_json::Value> =
                serde_json::from_str(&added).map_err(|_| fmt::Error)?;
            object.extend(added);
            current.fields = serde_json::to_string(&object).map_err(|_| fmt::Error)?;
            Ok(())
        }
    }

    #[cfg(test)]
    mod tests {
        use std::io;
        use std::sync::{Arc, Mutex};

        use super::*;

        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);

        impl io::Write for Captured {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.0.lock().expect("buffer").extend_from_slice(bytes);
                Ok(bytes.len())
            }

            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }

        impl Captured {
            fn text(&self) -> String {
                String::from_utf8_lossy(&self.0.lock().expect("buffer")).into_owned()
            }
        }

        /// An event in a span that holds the exporter's fields, logged.
        fn logged_in_rpc_span(subscriber: impl tracing::Subscriber + Send + Sync) {
            tracing::subscriber::with_default(subscriber, || {
                let span = tracing::info_span!(
                    "rpc",
                    otel.name = "/engram.v1.MemoryService/Get",
                    rpc.system = "grpc",
                    method = "/engram.v1.MemoryService/Get"
                );
                let _entered = span.enter();
                tracing::info!(rows = 1, "read");
            });
        }

        #[test]
        fn text_logs_leave_the_exporters_fields_out() {
            let out = Captured::default();
            let writer = out.clone();
            logged_in_rpc_span(
                tracing_subscriber::fmt()
                    .fmt_fields(TextFields)
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .finish(),
            );
            let line = out.text();
            assert!(
                line.contains("rpc{method=\"/engram.v1.MemoryService/Get\"}: ")
                    || line.contains("rpc{method=/engram.v1.MemoryService/Get}: "),
                "{line}"
            );
            assert!(line.contains("read rows=1"), "{line}");
            assert!(!line.contains("otel") && !line.contains("grpc\""), "{line}");
        }

        #[test]
        fn json_logs_leave_the_exporters_fields_out() {
            let out = Captured::default();
            let writer = out.clone();
            logged_in_rpc_span(
                tracing_subscriber::fmt()
                    .json()
                    .flatten_event(true)
                    .fmt_fields(JsonFields)
                    .with_writer(move || writer.clone())
                    .finish(),
            );
            let line: serde_json::Value =
                serde_json::from_str(out.text().trim()).expect("a JSON line");
            assert_eq!(
                line["span"],
                serde_json::json!({"name": "rpc", "method": "/engram.v1.MemoryService/Get"})
            );
            assert_eq!(
                (line["message"].as_str(), line["rows"].as_i64()),
                (Some("read"), Some(1))
            );
        }

        /// A field recorded on a span later joins its JSON object.
        #[test]
        fn json_fields_recorded_later_join_the_spans_object() {
            let out = Captured::default();
            let writer = out.clone();
            let subscriber = tracing_subscriber::fmt()
                .json()
                .fmt_fields(JsonFields)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                let span = tracing::info_span!(
                    "rpc",
                    method = "/m",
                    otel.name = tracing::field::Empty,
                    code = tracing::field::Empty
                );
                span.record("otel.name", "/m");
                span.record("code", 5);
                let _entered = span.enter();
                tracing::info!("done");
            });
            let line: serde_json::Value =
                serde_json::from_str(out.text().trim()).expect("a JSON line");
            assert_eq!(
                line["span"],
                serde_json::json!({"name": "rpc", "method": "/m", "code": 5})
            );
        }
    }
}
