//! `--max-connection-age-secs`: once a client's connection is older, the
//! server asks it to reconnect (HTTP/2 GOAWAY), so that calls spread over
//! replicas started since. Calls go on over a new connection, and a live
//! stream keeps its old one until it ends.

use engram::api::convert::json_to_proto;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{ScopeType, SetRequest, WatchRequest};
use serde_json::json;

use crate::helpers::{Backend, Connections, Proxy, TestServer, connect};

fn set(value: &str) -> SetRequest {
    SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "aged".to_owned(),
        key: "k".to_owned(),
        value: Some(json_to_proto(&json!(value))),
        ..SetRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_connection_is_replaced_and_a_live_stream_keeps_its_own() {
    let server =
        TestServer::spawn_with(Backend::Sqlite, |s| s.max_connection_age_secs = Some(1)).await;
    // Every connection of the test's clients goes through the proxy, which
    // counts them.
    let proxy = Proxy::start(server.grpc_addr()).await;
    let mut calls = MemoryServiceClient::new(connect(proxy.addr).await);
    calls.set(set("a")).await.expect("first write");
    let mut watcher = MemoryServiceClient::new(connect(proxy.addr).await);
    let mut changes = watcher
        .watch(WatchRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "aged".to_owned(),
            key_prefix: String::new(),
            from_revision: None,
        })
        .await
        .expect("watch")
        .into_inner();
    assert_eq!(
        proxy.connections(),
        Connections {
            accepted: 2,
            ended: 0
        }
    );

    // The calls' connection, idle, is closed once it is a second old; the
    // watch's stays open while its stream lasts.
    proxy.until_connections(|c| c.ended >= 1).await;
    let written = calls
        .set(set("b"))
        .await
        .expect("a write after the server ended the connection")
        .into_inner();
    assert_eq!(written.entry.expect("entry").version, 2);
    let change = changes
        .message()
        .await
        .expect("the watch goes on")
        .expect("a change");
    assert_eq!(change.version, 2);
    assert_eq!(
        proxy.connections(),
        Connections {
            accepted: 3,
            ended: 1
        },
        "one new connection for the calls, the watch's kept"
    );
}
