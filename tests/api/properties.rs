//! Property tests for the parsers and codecs that face the network: the
//! rule filter language, cron expressions, page tokens, identifiers, JSON
//! to protobuf values, redaction and export lines. No input panics, round
//! trips hold, and errors name where the input went wrong.

use chrono::{TimeZone, Utc};
use engram::api::convert::{json_from_proto, json_to_proto};
use engram::consolidation::cron::Schedule;
use engram::consolidation::filter;
use engram::error::{Error, Reason};
use engram::memory::{Key, KeyPrefix, ScopeName};
use engram::paging::{decode_token, encode_token};
use engram::redact::{REDACTED, Redactor};
use engram::sessions::{Episode, EpisodeType, Id, Name};
use proptest::prelude::*;
use serde_json::{Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text made of the filter language's own pieces, so generated inputs get
/// past the first token.
fn filter_text() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "type",
        "agent",
        "user",
        "app",
        "content",
        "metadata.subject",
        "metadata.a.b",
        "=",
        "!=",
        ":",
        ":*",
        "AND",
        "OR",
        "NOT",
        "(",
        ")",
        "\"quoted text\"",
        "\"open",
        "observation",
        "dark",
        "*",
        "42",
        "-1.5",
        "true",
        " ",
        "  ",
        "\\",
        "é",
        "\u{0}",
    ]);
    prop::collection::vec(pieces, 0..24).prop_map(|parts| parts.join(" "))
}

fn episode() -> Episode {
    Episode {
        id: "e1".into(),
        session_id: "s1".into(),
        seq: 1,
        cursor: 1,
        app: "bot".into(),
        user: "alice".into(),
        agent: "planner".into(),
        kind: "observation".into(),
        content: json!({"text": "prefers dark mode", "n": 42}),
        metadata: json!({"subject": "alice", "a": {"b": true}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        source_node: String::new(),
        timestamp: Utc::now(),
        create_time: Utc::now(),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn filters_parse_or_say_where_they_went_wrong(
        text in prop_oneof![filter_text(), any::<String>()]
    ) {
        match filter::parse(&text) {
            Ok(expr) => {
                // Evaluating a parsed filter never panics either.
                let _ = expr.matches(&episode());
            }
            Err(err) => {
                prop_assert!(err.position <= text.len(), "{err} in {text:?}");
                prop_assert!(!err.message.is_empty());
            }
        }
    }

    #[test]
    fn cron_expressions_parse_or_explain(
        fields in prop::collection::vec(
            prop_oneof![
                Just("*".to_owned()),
                Just("*/5".to_owned()),
                Just("1-5".to_owned()),
                Just("MON-FRI".to_owned()),
                Just("JAN".to_owned()),
                Just("@daily".to_owned()),
                (0u32..100).prop_map(|n| n.to_string()),
                "[0-9,/*-]{1,6}",
            ],
            0..7,
        ),
        noise in any::<String>(),
    ) {
        let minute = Utc.with_ymd_and_hms(2026, 11, 23, 9, 30, 0).single().expect("time");
        for text in [fields.join(" "), noise] {
            match Schedule::parse(&text) {
                Ok(schedule) => {
                    let _ = schedule.matches(minute);
                    let _ = schedule.is_due(None, minute);
                    let _ = schedule.is_due(Some(minute), minute + chrono::Duration::days(400));
                }
                Err(why) => prop_assert!(!why.is_empty()),
            }
        }
    }

    #[test]
    fn page_tokens_round_trip_and_refuse_anything_else(
        query in any::<String>(),
        other in any::<String>(),
        cursor in (any::<i64>(), any::<String>()),
        junk in any::<String>(),
    ) {
        let token = encode_token(&query, &cursor);
        let back: Option<(i64, String)> = decode_token(&query, &token).expect("decodes");
        prop_assert_eq!(back, Some(cursor));
        if other != query {
            let err = decode_token::<(i64, String)>(&other, &token).expect_err("another query");
            prop_assert!(is_bad_token(&err));
        }
        if let Err(err) = decode_token::<(i64, String)>(&query, &junk) {
            prop_assert!(is_bad_token(&err));
        }
    }

    #[test]
    fn identifiers_keep_what_they_accept_and_name_the_field(text in any::<String>()) {
        check_identifier(ScopeName::parse("scope", text.clone()).map(|v| v.as_str().to_owned()), &text, "scope")?;
        check_identifier(Key::parse("key", text.clone()).map(|v| v.as_str().to_owned()), &text, "key")?;
        check_identifier(KeyPrefix::parse("key_prefix", text.clone()).map(|v| v.as_str().to_owned()), &text, "key_prefix")?;
        check_identifier(Name::parse("user", text.clone()).map(|v| v.as_str().to_owned()), &text, "user")?;
        check_identifier(Id::parse("session_id", text.clone()).map(|v| v.as_str().to_owned()), &text, "session_id")?;
        check_identifier(EpisodeType::parse("type", text.clone()).map(|v| v.as_str().to_owned()), &text, "type")?;
    }

    #[test]
    fn json_survives_protobuf(value in json_value()) {
        let back = json_from_proto(json_to_proto(&value)).expect("converts back");
        prop_assert!(same_json(&back, &value), "{value} came back as {back}");
    }

    #[test]
    fn any_protobuf_value_converts_or_is_refused(number in any::<f64>(), text in any::<String>()) {
        let value = prost_types::Value {
            kind: Some(prost_types::value::Kind::ListValue(prost_types::ListValue {
                values: vec![
                    prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(number)) },
                    prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(text)) },
                    prost_types::Value { kind: None },
                ],
            })),
        };
        let err = json_from_proto(value).expect_err("a value with no kind is refused");
        prop_assert_eq!(err.reason(), Reason::InvalidValue);
    }

    #[test]
    fn redaction_is_total_idempotent_and_removes_secrets(
        text in any::<String>(),
        prefix in "[a-z_]{0,6}",
        secret in "[A-Za-z0-9]{12,24}",
    ) {
        let redactor = Redactor::new(&[]);
        let once = redactor.text(&text);
        prop_assert_eq!(redactor.text(&once), once.clone());
        let planted = format!("note {prefix}password={secret} end");
        let out = redactor.text(&planted);
        prop_assert!(!out.contains(&secret), "{planted:?} became {out:?}");
        prop_assert!(out.contains(REDACTED));
        prop_assert_eq!(redactor.text(&out), out.clone(), "redacted twice");
        let json = json!({"api_token": secret.clone(), "text": text});
        let out = redactor.json(&json);
        prop_assert!(!out.to_string().contains(&secret));
        prop_assert_eq!(redactor.json(&out), out);
    }

    #[test]
    fn export_lines_parse_or_name_line_and_field(
        text in prop_oneof![
            any::<String>(),
            Just(r#"{"kind":"memory_version","scope_type":"namespace"}"#.to_owned()),
            "\\{\"kind\":\"(session|episode|fact|rule|header|execution)\"[ -~]{0,40}\\}",
        ],
        line in 1i64..100_000,
    ) {
        if let Err(err) = engram::data::parse_line(line, &text) {
            match err {
                Error::InvalidArgument { reason, field, .. } => {
                    prop_assert_eq!(reason, Reason::ImportMalformed);
                    let at = format!("line {line}");
                    prop_assert!(field == at || field.starts_with(&format!("{at}.")), "{field}");
                }
                other => prop_assert!(false, "{other:?}"),
            }
        }
    }

    #[test]
    fn memory_version_records_round_trip(
        scope in "[a-z][a-z0-9_./-]{0,20}",
        key in "[a-z][a-z0-9_./-]{0,20}",
        version in 1i64..1_000_000,
        value in json_value(),
        deleted in any::<bool>(),
    ) {
        let value = if deleted { Value::Null } else { value };
        let record = json!({
            "kind": "memory_version", "scope_type": "flow", "scope": scope, "key": key,
            "version": version, "value": value, "deleted": deleted,
            "create_time": "2026-11-23T10:00:00.123456Z",
        });
        let parsed = engram::data::parse_line(1, &record.to_string()).expect("a valid record");
        let again = serde_json::to_value(&parsed).expect("encodes");
        let reparsed = engram::data::parse_line(1, &again.to_string()).expect("still valid");
        prop_assert_eq!(parsed, reparsed);
        prop_assert!(same_json(&again["value"], &value));
    }
}

fn is_bad_token(err: &Error) -> bool {
    matches!(err, Error::InvalidArgument { reason: Reason::InvalidPageToken, field, .. } if field == "page_token")
}

fn check_identifier(
    parsed: engram::error::Result<String>,
    text: &str,
    field: &str,
) -> Result<(), TestCaseError> {
    match parsed {
        Ok(kept) => prop_assert_eq!(kept, text),
        Err(Error::InvalidArgument { field: named, .. }) => prop_assert_eq!(named, field),
        Err(other) => prop_assert!(false, "{other:?}"),
    }
    Ok(())
}

/// JSON values: integers an f64 holds exactly, finite floats, strings,
/// and nested arrays and objects.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53)..(1i64 << 53)).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Equal as JSON, numbers compared by value (an integral float comes back
/// as an integer).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
