//! `MemoryService` through a real server and the generated client, on both
//! stores: what a user would check (values, versions, ordering, error codes
//! and reasons).

use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{
    DeleteRequest, GetCompactionLogRequest, GetRequest, HistoryRequest, ListRequest,
    ListScopesRequest, MemoryEntry, PurgeRequest, RollbackRequest, ScopeType, SetRequest,
};
use serde_json::json;
use tonic::Code;

use crate::helpers::{Backend, TestServer, bad_fields, error_metadata, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

fn set(scope: &str, key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

fn get(scope: &str, key: &str, version: i64) -> GetRequest {
    GetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        version,
        as_of: None,
    }
}

fn delete(scope: &str, key: &str) -> DeleteRequest {
    DeleteRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        ..DeleteRequest::default()
    }
}

fn history(scope: &str, key: &str, from_version: i64) -> HistoryRequest {
    HistoryRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        from_version,
    }
}

fn list(scope: &str, prefix: &str, page_size: i32, page_token: &str) -> ListRequest {
    ListRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key_prefix: prefix.to_owned(),
        page_size,
        page_token: page_token.to_owned(),
        include_reserved: false,
        as_of: None,
    }
}

fn json_of(entry: &MemoryEntry) -> serde_json::Value {
    let value = entry.value.clone().expect("entry has a value");
    engram::api::convert::json_from_proto(value).expect("valid json")
}

async fn values_round_trip(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let values = [
        json!("plain text"),
        json!(""),
        json!("ünïcödé ✓ 🧠"),
        json!(42),
        json!(-7),
        json!(2.5),
        json!(1e-9),
        // Every digit of a double survives storage (a Unix time with
        // sub-microseconds, as agents' frameworks write them).
        json!(1795459001.6882215_f64),
        json!(0.1_f64 + 0.2_f64),
        json!(9007199254740991_i64),
        json!(true),
        json!(false),
        json!(null),
        json!([]),
        json!({}),
        json!([1, "two", null, [3.5], {"four": 4}]),
        json!({"nested": {"deep": {"list": [true, false]}}, "n": 0}),
    ];
    for (i, value) in values.iter().enumerate() {
        let key = format!("values/{i}");
        let written = client
            .set(set("rt", &key, value.clone()))
            .await
            .expect("set")
            .into_inner();
        let written = written.entry.expect("entry");
        assert_eq!(written.version, 1);
        assert_eq!(&json_of(&written), value, "set echoes {value}");
        let read = client
            .get(get("rt", &key, 0))
            .await
            .expect("get")
            .into_inner();
        let read = read.entry.expect("entry");
        assert_eq!(&json_of(&read), value, "get returns {value}");
        assert_eq!(read.create_time, written.create_time);
        assert_eq!(
            (read.scope.as_str(), read.key.as_str()),
            ("rt", key.as_str())
        );
        assert!(!read.deleted);
    }
}

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

async fn pagination_to_the_end(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let mut expected: Vec<String> = (0..25).map(|i| format!("item/{i:02}")).collect();
    for key in expected.iter().rev() {
        client
            .set(set("pages", key, json!(key)))
            .await
            .expect("set");
    }
    client
        .set(set("pages", "other", json!(1)))
        .await
        .expect("set");

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = client
            .list(list("pages", "item/", 7, &token))
            .await
            .expect("list")
            .into_inner();
        pages += 1;
        assert!(page.entries.len() <= 7);
        seen.extend(page.entries.iter().map(|e| e.key.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    expected.sort();
    assert_eq!(seen, expected, "every key once, in key order");
    assert_eq!(pages, 4);

    // A page that ends exactly at the last key has no next token.
    let exact = client
        .list(list("pages", "item/", 25, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(
        (exact.entries.len(), exact.next_page_token.as_str()),
        (25, "")
    );
    // page_size 0 is the default (100); above the maximum is lowered.
    let all = client
        .list(list("pages", "", 0, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(all.entries.len(), 26);
    let capped = client
        .list(list("pages", "", 5000, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(capped.entries.len(), 26);

    let first = client
        .list(list("pages", "item/", 7, ""))
        .await
        .expect("list")
        .into_inner();
    let err = client
        .list(list("pages", "other", 7, &first.next_page_token))
        .await
        .expect_err("token of another query");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );
    assert_eq!(bad_fields(&err), vec!["page_token"]);
    let err = client
        .list(list("pages", "item/", 7, "not-a-token"))
        .await
        .expect_err("bad token");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );
    let err = client
        .list(list("pages", "item/", -1, ""))
        .await
        .expect_err("negative size");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_SIZE")
    );
    assert_eq!(bad_fields(&err), vec!["page_size"]);
}

async fn prefix_collisions(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for key in ["a/b", "a/bc", "a/b/c", "ab", "a_b", "a%b"] {
        if key.contains('%') {
            continue; // not a valid key; checked with the invalid identifiers
        }
        client.set(set("p", key, json!(key))).await.expect("set");
    }
    let reader = client.clone();
    let keys = |prefix: &'static str| {
        let mut client = reader.clone();
        async move {
            let page = client
                .list(list("p", prefix, 0, ""))
                .await
                .expect("list")
                .into_inner();
            page.entries.into_iter().map(|e| e.key).collect::<Vec<_>>()
        }
    };
    assert_eq!(keys("a/b").await, vec!["a/b", "a/b/c", "a/bc"]);
    assert_eq!(keys("a/b/").await, vec!["a/b/c"]);
    assert_eq!(keys("a/bc").await, vec!["a/bc"]);
    // `_` is a literal character, not a wildcard.
    assert_eq!(keys("a_").await, vec!["a_b"]);
    assert_eq!(keys("a").await, vec!["a/b", "a/b/c", "a/bc", "a_b", "ab"]);
    // Scopes are prefix-safe too: `p` never sees `p2`.
    client.set(set("p2", "a/b", json!(1))).await.expect("set");
    assert_eq!(keys("a/b").await, vec!["a/b", "a/b/c", "a/bc"]);
}

async fn invalid_identifiers_and_values(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.max_value_bytes = Some(1024)).await;
    let mut client = server.memory();
    let long_key = "k".repeat(513);
    let long_scope = "s".repeat(257);
    for (scope, key, field) in [
        ("ns", "bad:key", "key"),
        ("ns", "with space", "key"),
        ("ns", "", "key"),
        ("ns", "ünicode", "key"),
        ("ns", "a%b", "key"),
        ("ns", long_key.as_str(), "key"),
        ("bad:scope", "k", "scope"),
        (long_scope.as_str(), "k", "scope"),
    ] {
        let err = client
            .set(set(scope, key, json!(1)))
            .await
            .expect_err("invalid");
        assert_eq!(err.code(), Code::InvalidArgument, "{scope:?}/{key:?}");
        assert_eq!(reason(&err), "INVALID_IDENTIFIER", "{scope:?}/{key:?}");
        assert_eq!(bad_fields(&err), vec![field], "{scope:?}/{key:?}");
        let err = client.get(get(scope, key, 0)).await.expect_err("invalid");
        assert_eq!(bad_fields(&err), vec![field]);
    }
    // A letter outside ASCII is named as what is refused, even in a key
    // whose bytes are past the limit.
    for key in ["ünicode".to_owned(), "ключ".repeat(200)] {
        let err = client
            .set(set("ns", &key, json!(1)))
            .await
            .expect_err("invalid");
        assert!(
            err.message().contains(
                "may only contain ASCII letters and digits, '.', '_', '/' and '-', found "
            ),
            "{}",
            err.message()
        );
    }
    // The longest valid identifiers are fine.
    client
        .set(set(&"s".repeat(256), &"k".repeat(512), json!(1)))
        .await
        .expect("max lengths");

    let err = client
        .list(list("ns", "bad prefix", 0, ""))
        .await
        .expect_err("invalid prefix");
    assert_eq!(bad_fields(&err), vec!["key_prefix"]);
    let err = client
        .set(SetRequest {
            scope_type: ScopeType::Unspecified as i32,
            ..set("ns", "k", json!(1))
        })
        .await
        .expect_err("scope without type");
    assert_eq!(
        (err.code(), bad_fields(&err)),
        (Code::InvalidArgument, vec!["scope_type".to_owned()])
    );
    let err = client
        .set(SetRequest {
            scope_type: 42,
            ..set("ns", "k", json!(1))
        })
        .await
        .expect_err("unknown type");
    assert_eq!(bad_fields(&err), vec!["scope_type"]);
    let err = client
        .get(get("ns", "k", -1))
        .await
        .expect_err("negative version");
    assert_eq!(
        (reason(&err).as_str(), bad_fields(&err)),
        ("INVALID_VERSION", vec!["version".to_owned()])
    );
    let err = client
        .history(history("ns", "k", -3))
        .await
        .expect_err("negative version");
    assert_eq!(bad_fields(&err), vec!["from_version"]);

    // Values: required, finite, and within the limit (1024 bytes of JSON here).
    let err = client
        .set(SetRequest {
            value: None,
            ..set("ns", "k", json!(1))
        })
        .await
        .expect_err("missing value");
    assert_eq!(
        (reason(&err).as_str(), bad_fields(&err)),
        ("INVALID_VALUE", vec!["value".to_owned()])
    );
    let err = client
        .set(SetRequest {
            value: Some(prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
            }),
            ..set("ns", "k", json!(1))
        })
        .await
        .expect_err("NaN");
    assert_eq!(reason(&err), "INVALID_VALUE");
    // A NUL has no place in Postgres's jsonb: refused on both stores alike,
    // in a string and in an object's key.
    for nul in [json!({"note": "a\u{0}b"}), json!({"a\u{0}b": 1})] {
        let err = client
            .set(set("ns", "k", nul))
            .await
            .expect_err("a NUL character");
        assert_eq!(
            (err.code(), reason(&err).as_str(), bad_fields(&err)),
            (
                tonic::Code::InvalidArgument,
                "INVALID_VALUE",
                vec!["value".to_owned()]
            )
        );
    }
    let at_limit = "x".repeat(1022); // plus two quotes = 1024 bytes
    client
        .set(set("ns", "big", json!(at_limit)))
        .await
        .expect("value at the limit");
    let over = "x".repeat(1023);
    let err = client
        .set(set("ns", "big", json!(over)))
        .await
        .expect_err("over the limit");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "VALUE_TOO_LARGE")
    );
    assert_eq!(bad_fields(&err), vec!["value"]);

    let err = client
        .set(SetRequest {
            request_id: "has space".to_owned(),
            ..set("ns", "k", json!(1))
        })
        .await
        .expect_err("bad request id");
    assert_eq!(
        (reason(&err).as_str(), bad_fields(&err)),
        ("INVALID_REQUEST_ID", vec!["request_id".to_owned()])
    );
    let err = client
        .set(SetRequest {
            expected_version: Some(-1),
            ..set("ns", "k", json!(1))
        })
        .await
        .expect_err("negative expected version");
    assert_eq!(bad_fields(&err), vec!["expected_version"]);
}

async fn default_value_limit_is_one_mebibyte(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let fits = "x".repeat((1 << 20) - 2);
    client
        .set(set("ns", "big", json!(fits)))
        .await
        .expect("1 MiB of JSON fits");
    // Over the limit is INVALID_ARGUMENT with the reason, not a transport error.
    let over = "x".repeat(1 << 20);
    let err = client
        .set(set("ns", "big", json!(over)))
        .await
        .expect_err("too large");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "VALUE_TOO_LARGE")
    );
}

async fn reserved_prefix(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let err = client
        .set(set("ns", "_compaction/x", json!(1)))
        .await
        .expect_err("reserved");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "RESERVED_KEY")
    );
    assert_eq!(bad_fields(&err), vec!["key"]);
    let err = client
        .delete(delete("ns", "_compaction/x"))
        .await
        .expect_err("reserved");
    assert_eq!(reason(&err), "RESERVED_KEY");
    // Near misses are ordinary keys.
    client
        .set(set("ns", "_compaction", json!(1)))
        .await
        .expect("not under the prefix");
    client
        .set(set("ns", "compaction/x", json!(1)))
        .await
        .expect("not the prefix");

    // An audit record written by the server (here: straight into the store)
    // is hidden from List unless asked for, and readable with Get.
    write_audit_record(&server, "ns").await;
    let listed = client
        .list(list("ns", "", 0, ""))
        .await
        .expect("list")
        .into_inner();
    let keys: Vec<_> = listed.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, vec!["_compaction", "compaction/x"]);
    let with_reserved = client
        .list(ListRequest {
            include_reserved: true,
            ..list("ns", "", 0, "")
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(with_reserved.entries.len(), 3);
    let audit = client
        .get(get("ns", "_compaction/0001", 0))
        .await
        .expect("get audit")
        .into_inner();
    assert_eq!(
        json_of(&audit.entry.expect("entry")),
        json!({"operation": "purge"})
    );
}

async fn write_audit_record(server: &TestServer, scope: &str) {
    use engram::context::Tenant;
    use engram::memory::ports::{MemoryStore, Mutation, Write};
    use engram::memory::{Key, Provenance, Scope, ScopeName, ScopeType as Type, Value};
    let scope = Scope {
        scope_type: Type::Namespace,
        name: ScopeName::parse("scope", scope).expect("scope"),
    };
    let key = Key::parse("key", "_compaction/0001").expect("key");
    let value = Value::new(json!({"operation": "purge"}), 1 << 20).expect("value");
    let write = Write {
        scope: &scope,
        key: &key,
        mutation: Mutation::Set(&value),
        expected_version: None,
        request: None,
        provenance: &Provenance::default(),
        now: chrono::Utc::now(),
        change: engram::memory::ChangeKind::Set,
    };
    match server.db.backend {
        Backend::Sqlite => {
            server
                .db
                .sqlite_store()
                .await
                .write(&Tenant::default(), &write)
                .await
        }
        Backend::Postgres => {
            server
                .db
                .pg_store()
                .await
                .write(&Tenant::default(), &write)
                .await
        }
    }
    .expect("write audit record");
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

async fn default_scope_and_provenance(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let no_scope = |key: &str| SetRequest {
        scope_type: ScopeType::Unspecified as i32,
        scope: String::new(),
        ..set("", key, json!("v"))
    };
    let err = server
        .memory()
        .set(no_scope("k"))
        .await
        .expect_err("no scope, no flow");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "SCOPE_NOT_CONFIGURED")
    );

    let mut in_flow = server.memory_as(&[
        ("engram-execution-id", "exec-1"),
        ("engram-flow-id", "flow-9"),
        ("engram-flow-name", "research_agent"),
    ]);
    let entry = in_flow
        .set(no_scope("notes"))
        .await
        .expect("default scope")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        (entry.scope_type, entry.scope.as_str()),
        (ScopeType::Flow as i32, "research_agent")
    );
    assert_eq!(entry.execution_id, "exec-1");
    assert_eq!(
        (entry.flow_id.as_str(), entry.flow_name.as_str()),
        ("", ""),
        "tags only on execution scopes"
    );
    let read = server
        .memory()
        .get(GetRequest {
            scope_type: ScopeType::Flow as i32,
            scope: "research_agent".to_owned(),
            key: "notes".to_owned(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("explicit read")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(read.execution_id, "exec-1");

    // EXECUTION with no scope is the caller's own execution, tagged with its flow.
    let own = in_flow
        .set(SetRequest {
            scope_type: ScopeType::Execution as i32,
            scope: String::new(),
            ..set("", "step", json!(1))
        })
        .await
        .expect("own execution")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        (
            own.scope.as_str(),
            own.flow_id.as_str(),
            own.flow_name.as_str()
        ),
        ("exec-1", "flow-9", "research_agent")
    );
    // Another execution's scope: provenance yes, flow tags no (its flow is not known here).
    let other = in_flow
        .set(SetRequest {
            scope_type: ScopeType::Execution as i32,
            scope: "exec-2".to_owned(),
            ..set("", "step", json!(1))
        })
        .await
        .expect("other execution")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        (other.execution_id.as_str(), other.flow_name.as_str()),
        ("exec-1", "")
    );
    // A detached write has no execution.
    let detached = server
        .memory()
        .set(set("ns", "seed", json!(1)))
        .await
        .expect("detached");
    assert_eq!(detached.into_inner().entry.expect("e").execution_id, "");

    // Reads default the same way.
    let listed = in_flow
        .list(ListRequest {
            scope_type: ScopeType::Unspecified as i32,
            ..list("", "", 0, "")
        })
        .await
        .expect("list the flow scope")
        .into_inner();
    assert_eq!(
        listed
            .entries
            .iter()
            .map(|e| e.key.as_str())
            .collect::<Vec<_>>(),
        vec!["notes"]
    );
    // A namespace needs a name.
    let err = in_flow
        .set(SetRequest {
            scope: String::new(),
            ..set("", "k", json!(1))
        })
        .await
        .expect_err("namespace without a name");
    assert_eq!(reason(&err), "SCOPE_NOT_CONFIGURED");
    // Malformed caller context is refused, naming the metadata key.
    let mut bad = server.memory_as(&[("engram-execution-id", "not valid!")]);
    let err = bad
        .set(set("ns", "k", json!(1)))
        .await
        .expect_err("bad metadata");
    assert_eq!(
        (err.code(), bad_fields(&err)),
        (
            Code::InvalidArgument,
            vec!["engram-execution-id".to_owned()]
        )
    );
}

async fn scopes_listing(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for (scope_type, scope, keys) in [
        (ScopeType::Namespace, "customers", 3),
        (ScopeType::Flow, "research_agent", 2),
        (ScopeType::Execution, "exec-1", 1),
        (ScopeType::Namespace, "archive", 1),
    ] {
        for i in 0..keys {
            client
                .set(SetRequest {
                    scope_type: scope_type as i32,
                    ..set(scope, &format!("k{i}"), json!(i))
                })
                .await
                .expect("set");
        }
    }
    client
        .delete(delete("archive", "k0"))
        .await
        .expect("delete");
    let all = client
        .list_scopes(ListScopesRequest::default())
        .await
        .expect("scopes")
        .into_inner();
    let shape: Vec<(i32, &str, i64)> = all
        .scopes
        .iter()
        .map(|s| (s.scope_type, s.scope.as_str(), s.entry_count))
        .collect();
    assert_eq!(
        shape,
        vec![
            (NS, "archive", 0),
            (NS, "customers", 3),
            (ScopeType::Flow as i32, "research_agent", 2),
            (ScopeType::Execution as i32, "exec-1", 1),
        ]
    );
    let namespaces = client
        .list_scopes(ListScopesRequest {
            scope_type: NS,
            ..ListScopesRequest::default()
        })
        .await
        .expect("namespaces")
        .into_inner();
    assert_eq!(namespaces.scopes.len(), 2);

    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_scopes(ListScopesRequest {
                page_size: 3,
                page_token: token.clone(),
                ..ListScopesRequest::default()
            })
            .await
            .expect("page")
            .into_inner();
        names.extend(page.scopes.into_iter().map(|s| s.scope));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(
        names,
        vec!["archive", "customers", "research_agent", "exec-1"]
    );
    let first = client
        .list_scopes(ListScopesRequest {
            page_size: 1,
            ..ListScopesRequest::default()
        })
        .await
        .expect("page")
        .into_inner();
    let err = client
        .list_scopes(ListScopesRequest {
            scope_type: NS,
            page_size: 1,
            page_token: first.next_page_token,
            ..ListScopesRequest::default()
        })
        .await
        .expect_err("token of another filter");
    assert_eq!(reason(&err), "INVALID_PAGE_TOKEN");
}

on_both_stores!(
    values_round_trip,
    versions_and_tombstones,
    pagination_to_the_end,
    prefix_collisions,
    invalid_identifiers_and_values,
    default_value_limit_is_one_mebibyte,
    reserved_prefix,
    compare_and_set,
    idempotent_replays,
    checkpoint_refusal,
    default_scope_and_provenance,
    scopes_listing,
    rollback,
);

pub(crate) fn rollback_to(scope: &str, key: &str, to_version: i64) -> RollbackRequest {
    RollbackRequest {
        scope_type: NS,
        scope: scope.into(),
        key: key.into(),
        to_version,
    }
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
