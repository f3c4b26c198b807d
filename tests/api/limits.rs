//! The server's call limits: a message over `max_message_bytes` is refused
//! before it reaches a service, and a call running past
//! `request_timeout_ms` (here a compaction whose summarizer never answers)
//! ends with CANCELLED instead of holding its connection forever, with
//! nothing written.

use std::time::{Duration, Instant};

use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{CompactRequest, GetRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use crate::helpers::{Backend, TestServer};

const NS: i32 = ScopeType::Namespace as i32;

fn set(key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: "limits".into(),
        key: key.into(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused() {
    let server = TestServer::spawn_with(Backend::Sqlite, |s| {
        s.max_message_bytes = Some(4096);
    })
    .await;
    let mut memory = server.memory();
    memory
        .set(set("small", json!("x".repeat(1000))))
        .await
        .expect("under the limit");
    let err = memory
        .set(set("big", json!("x".repeat(10_000))))
        .await
        .expect_err("over the limit");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("4096"), "{}", err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_request_timeout_are_cancelled() {
    // A summarizer that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let server = TestServer::spawn_with(Backend::Sqlite, |s| {
        s.summarizer_url = Some(format!("http://{addr}/v1"));
        s.summarizer_model = Some("m".to_owned());
        s.summarizer_timeout_ms = Some(60_000);
        // Long enough for an ordinary call on a loaded CI machine, far
        // below the summarizer's 60 s.
        s.request_timeout_ms = Some(2_000);
    })
    .await;
    let mut memory = server.memory();
    memory
        .set(set("notes", json!("The deploy failed.")))
        .await
        .expect("seed");
    let started = Instant::now();
    let err = MemoryAdminServiceClient::new(server.channel.clone())
        .compact(CompactRequest {
            scope_type: NS,
            scope: "limits".into(),
            key: "notes".into(),
            target_key: "notes/summary".into(),
            ..CompactRequest::default()
        })
        .await
        .expect_err("the summarizer never answers");
    assert_eq!(err.code(), Code::Cancelled, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "ended by the server's timeout, not the summarizer's"
    );
    let err = memory
        .get(GetRequest {
            scope_type: NS,
            scope: "limits".into(),
            key: "notes/summary".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect_err("nothing written");
    assert_eq!(err.code(), Code::NotFound);
    // The connection is still good for the next call.
    memory
        .set(set("after", json!(1)))
        .await
        .expect("the connection lives on");
}
