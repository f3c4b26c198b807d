//! Versions: dense numbers and tombstones, compare-and-set, idempotent
//! replays, the checkpoint refusal, and rollback.

use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{
    DeleteRequest, GetCompactionLogRequest, ListScopesRequest, PurgeRequest, SetRequest,
};
use serde_json::json;
use tonic::Code;

use super::{NS, delete, get, history, json_of, list, rollback_to, set};
use crate::helpers::{Backend, TestServer, bad_fields, error_metadata, reason};
use crate::on_both_stores;

async fn versions_and_tombstones(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for (i, status) in ["draft", "review", "approved"].iter().enumerate() {
        let entry = client
            .set(set("docs", "status", json!(status)))
            .await
            .expect("set");
        assert_eq!(
            entry.into_inner().entry.expect("entry").version,
            i as i64 + 1
        );
    }
    let tombstone = client
        .delete(delete("docs", "status"))
        .await
        .expect("delete")
        .into_inner();
    let tombstone = tombstone.entry.expect("entry");
    assert_eq!(
        (
            tombstone.version,
            tombstone.deleted,
            tombstone.value.is_none()
        ),
        (4, true, true)
    );

    let err = client
        .get(get("docs", "status", 0))
        .await
        .expect_err("deleted");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "KEY_DELETED")
    );
    let listed = client
        .list(list("docs", "", 0, ""))
        .await
        .expect("list")
        .into_inner();
    assert!(listed.entries.is_empty(), "list hides tombstoned keys");

    let mut stream = client
        .history(history("docs", "status", 0))
        .await
        .expect("history")
        .into_inner();
    let mut seen = Vec::new();
    while let Some(item) = stream.message().await.expect("stream item") {
        let entry = item.entry.expect("entry");
        seen.push((entry.version, entry.deleted));
    }
    assert_eq!(seen, vec![(1, false), (2, false), (3, false), (4, true)]);

    // Point-in-time reads.
    let v2 = client
        .get(get("docs", "status", 2))
        .await
        .expect("v2")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(json_of(&v2), json!("review"));
    let err = client
        .get(get("docs", "status", 4))
        .await
        .expect_err("tombstone version");
    assert_eq!(reason(&err), "KEY_DELETED");
    let err = client
        .get(get("docs", "status", 5))
        .await
        .expect_err("no such version");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "VERSION_NOT_FOUND")
    );
    let err = client
        .get(get("docs", "nothing", 0))
        .await
        .expect_err("no such key");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "KEY_NOT_FOUND")
    );
    assert_eq!(error_metadata(&err, "key").as_deref(), Some("nothing"));
    let err = client
        .delete(delete("docs", "status"))
        .await
        .expect_err("already deleted");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "KEY_DELETED")
    );
    let err = client
        .delete(delete("docs", "nothing"))
        .await
        .expect_err("never written");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "KEY_NOT_FOUND")
    );

    // History from a version, and of a missing key.
    let mut stream = client
        .history(history("docs", "status", 3))
        .await
        .expect("history")
        .into_inner();
    let mut from_three = Vec::new();
    while let Some(item) = stream.message().await.expect("stream item") {
        from_three.push(item.entry.expect("entry").version);
    }
    assert_eq!(from_three, vec![3, 4]);
    let err = client
        .history(history("docs", "nothing", 0))
        .await
        .expect_err("missing key");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "KEY_NOT_FOUND")
    );

    // Writing after a delete resumes the numbering.
    let revived = client
        .set(set("docs", "status", json!("reopened")))
        .await
        .expect("set");
    assert_eq!(revived.into_inner().entry.expect("entry").version, 5);
}

async fn compare_and_set(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let cas = |expected: i64, value: i64| SetRequest {
        expected_version: Some(expected),
        ..set("ns", "counter", json!(value))
    };
    assert_eq!(
        client
            .set(cas(0, 1))
            .await
            .expect("create")
            .into_inner()
            .entry
            .expect("e")
            .version,
        1
    );
    let err = client.set(cas(0, 1)).await.expect_err("exists");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Aborted, "VERSION_MISMATCH")
    );
    assert_eq!(
        error_metadata(&err, "current_version").as_deref(),
        Some("1")
    );
    assert_eq!(
        error_metadata(&err, "expected_version").as_deref(),
        Some("0")
    );
    assert_eq!(
        client
            .set(cas(1, 2))
            .await
            .expect("cas")
            .into_inner()
            .entry
            .expect("e")
            .version,
        2
    );
    let err = client.set(cas(1, 3)).await.expect_err("stale");
    assert_eq!(
        error_metadata(&err, "current_version").as_deref(),
        Some("2")
    );
    let err = client
        .delete(DeleteRequest {
            expected_version: Some(1),
            ..delete("ns", "counter")
        })
        .await
        .expect_err("stale delete");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Aborted, "VERSION_MISMATCH")
    );
    client
        .delete(DeleteRequest {
            expected_version: Some(2),
            ..delete("ns", "counter")
        })
        .await
        .expect("delete at the current version");
    // Deleted means "no live value": expected 0 creates it again.
    assert_eq!(
        client
            .set(cas(0, 9))
            .await
            .expect("recreate")
            .into_inner()
            .entry
            .expect("e")
            .version,
        4
    );
    let current = client
        .get(get("ns", "counter", 0))
        .await
        .expect("get")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(json_of(&current), json!(9));
}

async fn idempotent_replays(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let request = SetRequest {
        request_id: "0b9f6c1e-retry".to_owned(),
        expected_version: Some(0),
        ..set("ns", "once", json!({"n": 1}))
    };
    let first = client
        .set(request.clone())
        .await
        .expect("first")
        .into_inner()
        .entry
        .expect("e");
    let replay = client
        .set(request.clone())
        .await
        .expect("replay")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        replay, first,
        "a replay returns the first result, value and time included"
    );
    let mut stream = client
        .history(history("ns", "once", 0))
        .await
        .expect("history")
        .into_inner();
    let mut versions = 0;
    while stream.message().await.expect("item").is_some() {
        versions += 1;
    }
    assert_eq!(versions, 1, "a replay writes nothing");

    let err = client
        .set(SetRequest {
            value: Some(json_to_proto(&json!({"n": 2}))),
            ..request.clone()
        })
        .await
        .expect_err("same id, other request");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "REQUEST_ID_REUSED")
    );
    assert_eq!(bad_fields(&err), vec!["request_id"]);

    let delete_once = DeleteRequest {
        request_id: "delete-once".to_owned(),
        ..delete("ns", "once")
    };
    let tombstone = client
        .delete(delete_once.clone())
        .await
        .expect("delete")
        .into_inner()
        .entry
        .expect("e");
    let again = client
        .delete(delete_once)
        .await
        .expect("replayed delete")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!((again.version, again.deleted), (tombstone.version, true));

    // The version a request wrote, purged since: its retry says so (the
    // write did happen) and writes nothing.
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "ns".into(),
            key: "once".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge");
    let err = client.set(request).await.expect_err("its version is gone");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "VERSION_PURGED")
    );
    assert_eq!(
        err.message(),
        "request_id \"0b9f6c1e-retry\" already wrote version 1 of key \"once\", \
         which has been purged since; nothing was written"
    );
    let head = client
        .history(history("ns", "once", 0))
        .await
        .expect("history")
        .into_inner()
        .message()
        .await
        .expect("item")
        .and_then(|item| item.entry)
        .expect("the tombstone");
    assert_eq!((head.version, head.deleted), (2, true));
}

async fn checkpoint_refusal(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    server
        .memory()
        .set(set("ns", "k", json!(1)))
        .await
        .expect("outside a checkpoint");
    let mut client = server.memory_as(&[
        ("engram-flow-name", "research_agent"),
        ("engram-checkpoint-id", "cp-7"),
    ]);
    let check = |err: tonic::Status| {
        assert_eq!(
            (err.code(), reason(&err).as_str()),
            (Code::FailedPrecondition, "MEMORY_IN_CHECKPOINT")
        );
    };
    check(client.set(set("ns", "k", json!(2))).await.expect_err("set"));
    check(client.get(get("ns", "k", 0)).await.expect_err("get"));
    check(client.list(list("ns", "", 0, "")).await.expect_err("list"));
    check(
        client
            .history(history("ns", "k", 0))
            .await
            .expect_err("history"),
    );
    check(client.delete(delete("ns", "k")).await.expect_err("delete"));
    check(
        client
            .list_scopes(ListScopesRequest::default())
            .await
            .expect_err("scopes"),
    );
    let value = server
        .memory()
        .get(get("ns", "k", 0))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(value.entry.expect("e").version, 1, "nothing was written");
}

async fn rollback(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for value in ["first", "second", "third"] {
        client.set(set("rb", "k", json!(value))).await.expect("set");
    }
    let done = client
        .rollback(rollback_to("rb", "k", 1))
        .await
        .expect("rollback")
        .into_inner();
    let entry = done.entry.expect("entry");
    assert_eq!((entry.version, json_of(&entry)), (4, json!("first")));
    assert!(
        done.audit_key.starts_with("_compaction/"),
        "{}",
        done.audit_key
    );
    let read = client
        .get(get("rb", "k", 0))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(json_of(&read.entry.expect("entry")), json!("first"));

    // The audit trail says what was restored, and into which version.
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    let log = admin
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: NS,
            scope: "rb".into(),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .expect("log")
        .into_inner()
        .records;
    assert_eq!(log.len(), 1);
    let record = &log[0];
    assert_eq!(record.operation, "rollback");
    assert_eq!(record.source_keys, ["k"]);
    assert_eq!(record.source_versions, [1]);
    assert_eq!(
        (record.target_key.as_str(), record.target_version),
        ("k", 4)
    );
    assert_eq!(record.audit_key, done.audit_key);

    // A deleted key comes back.
    client.delete(delete("rb", "k")).await.expect("delete");
    let restored = client
        .rollback(rollback_to("rb", "k", 2))
        .await
        .expect("rollback a deleted key")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!((restored.version, json_of(&restored)), (6, json!("second")));

    // What cannot be rolled back, and why.
    for (to_version, code, why) in [
        (6, Code::InvalidArgument, "INVALID_VERSION"),
        (9, Code::InvalidArgument, "INVALID_VERSION"),
        (0, Code::InvalidArgument, "INVALID_VERSION"),
        (5, Code::InvalidArgument, "ROLLBACK_TO_TOMBSTONE"),
    ] {
        let status = client
            .rollback(rollback_to("rb", "k", to_version))
            .await
            .expect_err("refused");
        assert_eq!(
            (status.code(), reason(&status)),
            (code, why.to_owned()),
            "to {to_version}"
        );
    }
    let missing = client
        .rollback(rollback_to("rb", "nope", 1))
        .await
        .expect_err("no such key");
    assert_eq!(
        (missing.code(), reason(&missing)),
        (Code::NotFound, "KEY_NOT_FOUND".to_owned())
    );
    let reserved = client
        .rollback(rollback_to("rb", "_compaction/x", 1))
        .await
        .expect_err("reserved");
    assert_eq!(reason(&reserved), "RESERVED_KEY");

    // A purged version is gone: NOT_FOUND, nothing written.
    admin
        .purge(PurgeRequest {
            scope_type: NS,
            scope: "rb".into(),
            key: "k".into(),
            keep: Some(1),
            dry_run: false,
        })
        .await
        .expect("purge");
    let purged = client
        .rollback(rollback_to("rb", "k", 1))
        .await
        .expect_err("purged");
    assert_eq!(
        (purged.code(), reason(&purged)),
        (Code::NotFound, "VERSION_NOT_FOUND".to_owned())
    );
    let head = client
        .get(get("rb", "k", 0))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(head.entry.expect("entry").version, 6);
}

on_both_stores!(
    versions_and_tombstones,
    compare_and_set,
    idempotent_replays,
    checkpoint_refusal,
    rollback,
);
