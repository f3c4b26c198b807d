//! Values and keys: round trips of every JSON type, what is refused and why,
//! the value size limit, and the reserved `_compaction/` keys.

use engram::proto::{ListRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use super::{delete, get, history, json_of, list, set};
use crate::helpers::{Backend, TestServer, bad_fields, reason};
use crate::on_both_stores;

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

on_both_stores!(
    values_round_trip,
    invalid_identifiers_and_values,
    default_value_limit_is_one_mebibyte,
    reserved_prefix,
);
