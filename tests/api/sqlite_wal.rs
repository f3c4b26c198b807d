//! The embedded store's write-ahead log goes back to its limit after a
//! large transaction. SQLite reuses the log's file rather than truncate
//! it, so one large write used to hold its size on disk for as long as
//! the server ran.

use engram::api::convert::json_to_proto;
use engram::proto::{ScopeType, SetRequest};
use engram::store::WAL_LIMIT_BYTES;
use serde_json::json;

use crate::helpers::{Backend, TestServer};

/// A value past the log's limit, in one write.
const LARGE: usize = 24 * 1024 * 1024;

fn set(key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "wal".to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_shrinks_back_after_a_large_write() {
    let server = TestServer::spawn_with(Backend::Sqlite, |s| {
        s.max_value_bytes = Some(LARGE + 1024);
    })
    .await;
    let file = server
        .db
        .url
        .strip_prefix("sqlite://")
        .expect("a sqlite URL")
        .to_owned();
    let wal = std::path::PathBuf::from(format!("{file}-wal"));
    let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());

    // The answer carries the value back.
    let mut memory = server.memory().max_decoding_message_size(2 * LARGE);
    memory
        .set(set("large", json!("x".repeat(LARGE))))
        .await
        .expect("a large write");
    let grown = size();
    assert!(grown > WAL_LIMIT_BYTES, "the log grew to {grown} bytes");

    // Once a checkpoint has taken the large write in, the next write
    // starts the log over, cut back to the limit.
    let mut writes = 0;
    while size() > WAL_LIMIT_BYTES {
        writes += 1;
        assert!(
            writes <= 50,
            "the log still holds {} bytes after {writes} small writes",
            size()
        );
        memory
            .set(set("small", json!(writes)))
            .await
            .expect("a small write");
    }
}
