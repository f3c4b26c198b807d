//! Traces exported by OTLP to a collector run by the test: an RPC that
//! carries W3C `traceparent` metadata arrives as a span of the caller's
//! trace, child of the caller's span, named after the method, from the
//! service named by `OTEL_SERVICE_NAME`; logs meanwhile keep their shape.

use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{GetRequest, ScopeType, SetRequest};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use serde_json::json;
use tokio::sync::mpsc;

use crate::helpers::{ChildServer, Metadata, connect, statement_spans};

struct Collector(mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_spans_continue_the_callers_trace() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let collector_addr = listener.local_addr().expect("addr");
    let (sender, mut exported) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(sender)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("e.db").display());
    let endpoint = format!("http://{collector_addr}");
    let server = ChildServer::spawn(
        &[],
        &[
            ("ENGRAM_DATABASE_URL", &url),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "engram-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            // sqlx's statements logged, each inside its RPC's span.
            ("ENGRAM_LOG", "info,sqlx=debug"),
        ],
        None,
    )
    .await;

    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let mut memory = MemoryServiceClient::with_interceptor(
        connect(server.grpc_addr).await,
        Metadata::new(&[("traceparent", &traceparent)]),
    );
    memory
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "traced".into(),
            key: "k".into(),
            value: Some(json_to_proto(&json!(1))),
            ..SetRequest::default()
        })
        .await
        .expect("set");
    memory
        .get(GetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "traced".into(),
            key: "k".into(),
            ..GetRequest::default()
        })
        .await
        .expect("get");

    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(request) = exported.recv().await {
            for resource in request.resource_spans {
                let service = resource
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| kv.value.as_ref())
                    .map(|v| format!("{v:?}"));
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        if span.trace_id == hex(TRACE_ID) {
                            return (service, span);
                        }
                    }
                }
            }
        }
        panic!("the collector stopped");
    })
    .await
    .expect("the RPC's span reaches the collector");
    let (service, span) = found;
    assert_eq!(span.name, "/engram.v1.MemoryService/Set");
    assert_eq!(
        span.parent_span_id,
        hex(PARENT_ID),
        "child of the caller's span"
    );
    assert!(
        service.is_some_and(|s| s.contains("engram-under-test")),
        "service.name from OTEL_SERVICE_NAME"
    );
    let lines = server.stderr.clone();
    assert!(server.terminate().await.success());
    // Logs look as they do without an exporter: the span names the
    // method once, and the exporter's fields stay out of them.
    let lines = lines.lock().expect("lines").join("\n");
    assert!(
        statement_spans(&lines)
            .contains(&json!({"name": "rpc", "method": "/engram.v1.MemoryService/Get"})),
        "a statement in the Get's span: {lines}"
    );
}
