//! Compact through the OpenAI-compatible summarizer, against a local fake
//! endpoint that records and checks every request: the prompt, the model,
//! the key, retries on 429/5xx, no retry on 4xx, and nothing written when
//! the summarizer gives up.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{CompactRequest, GetCompactionLogRequest, GetRequest, ScopeType, SetRequest};
use serde_json::{Value, json};
use tonic::Code;

use crate::helpers::{Backend, TestServer, reason};
use crate::on_both_stores;

/// One scripted answer: status, JSON body, Retry-After seconds.
type Answer = (u16, Value, Option<u64>);

#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Vec<(String, HeaderMap, Value)>>>,
    script: Arc<Mutex<VecDeque<Answer>>>,
}

async fn answer(
    State(fake): State<Fake>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.seen
        .lock()
        .expect("seen")
        .push((uri.path().to_owned(), headers, json));
    let (status, body, retry_after) = {
        let mut script = fake.script.lock().expect("script");
        if script.len() > 1 {
            script.pop_front()
        } else {
            script.front().cloned()
        }
    }
    .unwrap_or((500, json!({}), None));
    let mut out = HeaderMap::new();
    if let Some(seconds) = retry_after {
        out.insert("retry-after", seconds.to_string().parse().expect("header"));
    }
    (
        StatusCode::from_u16(status).expect("status"),
        out,
        body.to_string(),
    )
}

async fn start_fake(script: Vec<Answer>) -> (Fake, SocketAddr) {
    let fake = Fake {
        script: Arc::new(Mutex::new(script.into())),
        ..Fake::default()
    };
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (fake, addr)
}

async fn server_with(backend: Backend, addr: SocketAddr, retries: u32) -> TestServer {
    let server = TestServer::spawn_with(backend, |s| {
        s.summarizer_url = Some(format!("http://{addr}/v1"));
        s.summarizer_model = Some("default-model".to_owned());
        s.summarizer_api_key = Some("sk-test-secret".to_owned());
        s.summarizer_retries = Some(retries);
        s.summarizer_timeout_ms = Some(5000);
    })
    .await;
    server
        .memory()
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "ops".to_owned(),
            key: "notes".to_owned(),
            value: Some(json_to_proto(&json!(
                "The deploy failed. We rotated the deploy key."
            ))),
            ..SetRequest::default()
        })
        .await
        .expect("seed");
    server
}

fn compact() -> CompactRequest {
    CompactRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "ops".to_owned(),
        key: "notes".to_owned(),
        target_key: "notes/summary".to_owned(),
        instruction: "decisions only".to_owned(),
        ..CompactRequest::default()
    }
}

async fn nothing_written(server: &TestServer) {
    let err = server
        .memory()
        .get(GetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "ops".to_owned(),
            key: "notes/summary".to_owned(),
            version: 0,
            as_of: None,
        })
        .await
        .expect_err("no summary");
    assert_eq!(reason(&err), "KEY_NOT_FOUND");
    let log = MemoryAdminServiceClient::new(server.channel.clone())
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "ops".to_owned(),
            ..GetCompactionLogRequest::default()
        })
        .await
        .expect("log")
        .into_inner();
    assert!(log.records.is_empty());
}

async fn compact_through_a_chat_completions_endpoint(backend: Backend) {
    let done = json!({
        "model": "fake-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "  Rotated the deploy key.  "}}],
    });
    let (fake, addr) = start_fake(vec![
        (429, json!({"error": {"message": "slow down"}}), Some(0)),
        (502, json!({}), None),
        (200, done, None),
    ])
    .await;
    let server = server_with(backend, addr, 3).await;
    let result = MemoryAdminServiceClient::new(server.channel.clone())
        .compact(compact())
        .await
        .expect("compact after two retries")
        .into_inner();
    let entry = result.entry.expect("entry");
    assert_eq!((entry.key.as_str(), entry.version), ("notes/summary", 1));
    assert_eq!(
        entry.value.and_then(|v| v.kind),
        Some(prost_types::value::Kind::StringValue(
            "Rotated the deploy key.".to_owned()
        ))
    );
    assert_eq!(result.record.expect("record").model, "fake-1");

    let seen = fake.seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 3, "one call and two retries");
    for (path, headers, body) in &seen {
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(
            headers.get("authorization").and_then(|v| v.to_str().ok()),
            Some("Bearer sk-test-secret")
        );
        assert_eq!(body["model"], json!("default-model"));
        assert_eq!(body["max_tokens"], json!(512));
        assert_eq!(body["temperature"], json!(0));
        assert_eq!(body["messages"][0]["role"], json!("system"));
        assert_eq!(body["messages"][1]["role"], json!("user"));
        let prompt = body["messages"][1]["content"].as_str().expect("prompt");
        assert!(
            prompt.starts_with("Instruction: decisions only"),
            "{prompt}"
        );
        assert!(
            prompt.contains("### notes (version 1)\nThe deploy failed. We rotated the deploy key."),
            "{prompt}"
        );
    }

    // A model named in the request wins over the default.
    MemoryAdminServiceClient::new(server.channel.clone())
        .compact(CompactRequest {
            model: "bigger-model".to_owned(),
            max_tokens: 64,
            ..compact()
        })
        .await
        .expect("compact");
    let last = fake
        .seen
        .lock()
        .expect("seen")
        .last()
        .cloned()
        .expect("a request");
    assert_eq!(
        (last.2["model"].clone(), last.2["max_tokens"].clone()),
        (json!("bigger-model"), json!(64))
    );
}

async fn summarizer_failures_write_nothing(backend: Backend) {
    // Server errors are retried, then reported as UNAVAILABLE.
    let (fake, addr) = start_fake(vec![(
        503,
        json!({"error": {"message": "overloaded"}}),
        None,
    )])
    .await;
    let server = server_with(backend, addr, 1).await;
    let err = MemoryAdminServiceClient::new(server.channel.clone())
        .compact(compact())
        .await
        .expect_err("the summarizer is down");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "SUMMARIZER_UNAVAILABLE")
    );
    assert!(
        err.message().contains("HTTP 503: overloaded"),
        "{}",
        err.message()
    );
    assert!(!err.message().contains("sk-test-secret"));
    assert_eq!(
        fake.seen.lock().expect("seen").len(),
        2,
        "one call, one retry"
    );
    nothing_written(&server).await;

    // A client error is not retried.
    let (fake, addr) = start_fake(vec![(
        401,
        json!({"error": {"message": "invalid api key"}}),
        None,
    )])
    .await;
    let server = server_with(backend, addr, 3).await;
    let err = MemoryAdminServiceClient::new(server.channel.clone())
        .compact(compact())
        .await
        .expect_err("bad key");
    assert_eq!(reason(&err), "SUMMARIZER_UNAVAILABLE");
    assert!(
        err.message().contains("HTTP 401: invalid api key"),
        "{}",
        err.message()
    );
    assert_eq!(fake.seen.lock().expect("seen").len(), 1);
    nothing_written(&server).await;
}

on_both_stores!(
    compact_through_a_chat_completions_endpoint,
    summarizer_failures_write_nothing
);
