//! Conversions between protobuf messages and domain types.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Timestamp};

use crate::error::{Error, Reason, Result, TIME_RANGE, TIME_RANGE_REFUSED};
use crate::memory::{Entry, ScopeType};
use crate::proto;
use crate::sessions::{Episode, Session};

/// Integers survive a round trip as integers (`42`, not `42.0`) as long as
/// an f64 holds them exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// Postgres stores JSON as `jsonb`, which has no NUL character.
const NUL: &str = crate::error::NUL_REFUSED;

/// A request's idempotency key (`request_id`): empty is none; otherwise 1
/// to 128 printable ASCII characters.
pub fn request_id(id: String) -> Result<Option<String>> {
    if id.is_empty() {
        return Ok(None);
    }
    crate::error::check_request_id("request_id", &id)?;
    Ok(Some(id))
}

/// A protobuf `Value` as JSON. NaN and infinities have no JSON form, a
/// `Value` with no kind set is not a value, and text holds no NUL.
pub fn json_from_proto(value: prost_types::Value) -> Result<serde_json::Value> {
    let invalid = |why: &str| Error::invalid(Reason::InvalidValue, "value", why.to_owned());
    Ok(
        match value
            .kind
            .ok_or_else(|| invalid("contains a Value with no kind set"))?
        {
            Kind::NullValue(_) => serde_json::Value::Null,
            Kind::BoolValue(b) => serde_json::Value::Bool(b),
            Kind::NumberValue(n) if !n.is_finite() => {
                return Err(invalid(
                    "numbers must be finite (JSON has no NaN or Infinity)",
                ));
            }
            Kind::NumberValue(n) if n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER => {
                serde_json::Value::from(n as i64)
            }
            Kind::NumberValue(n) => serde_json::Number::from_f64(n)
                .map(serde_json::Value::Number)
                .ok_or_else(|| invalid("numbers must be finite"))?,
            Kind::StringValue(s) if s.contains('\0') => return Err(invalid(NUL)),
            Kind::StringValue(s) => serde_json::Value::String(s),
            Kind::ListValue(list) => serde_json::Value::Array(
                list.values
                    .into_iter()
                    .map(json_from_proto)
                    .collect::<Result<_>>()?,
            ),
            Kind::StructValue(object) => serde_json::Value::Object(
                object
                    .fields
                    .into_iter()
                    .map(|(k, v)| match k.contains('\0') {
                        true => Err(invalid(NUL)),
                        false => Ok((k, json_from_proto(v)?)),
                    })
                    .collect::<Result<_>>()?,
            ),
        },
    )
}

pub fn json_to_proto(value: &serde_json::Value) -> prost_types::Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_to_proto).collect(),
        }),
        serde_json::Value::Object(fields) => Kind::StructValue(Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.clone(), json_to_proto(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

pub fn scope_type_to_proto(scope_type: ScopeType) -> proto::ScopeType {
    match scope_type {
        ScopeType::Namespace => proto::ScopeType::Namespace,
        ScopeType::Flow => proto::ScopeType::Flow,
        ScopeType::Execution => proto::ScopeType::Execution,
    }
}

/// `None` for `SCOPE_TYPE_UNSPECIFIED`; unknown numbers are refused.
pub fn scope_type_from_proto(field: &str, n: i32) -> Result<Option<ScopeType>> {
    if n == proto::ScopeType::Unspecified as i32 {
        return Ok(None);
    }
    ScopeType::from_i32(n).map(Some).ok_or_else(|| {
        Error::invalid(
            Reason::InvalidArgument,
            field,
            format!("unknown scope type {n}"),
        )
    })
}

pub fn timestamp(time: chrono::DateTime<chrono::Utc>) -> Timestamp {
    Timestamp {
        seconds: time.timestamp(),
        nanos: time.timestamp_subsec_nanos() as i32,
    }
}

pub fn entry_to_proto(entry: Entry) -> proto::MemoryEntry {
    proto::MemoryEntry {
        scope_type: scope_type_to_proto(entry.scope.scope_type) as i32,
        scope: entry.scope.name.as_str().to_owned(),
        key: entry.key.as_str().to_owned(),
        version: entry.version,
        value: entry.value.as_ref().map(|v| json_to_proto(v.json())),
        deleted: entry.deleted,
        execution_id: entry.provenance.execution_id,
        flow_id: entry.provenance.flow_id,
        flow_name: entry.provenance.flow_name,
        create_time: Some(timestamp(entry.create_time)),
    }
}

/// [`json_from_proto`] for a request field other than `value`: an error
/// names `field`.
pub fn json_at(field: &str, value: prost_types::Value) -> Result<serde_json::Value> {
    json_from_proto(value).map_err(|err| match err {
        Error::InvalidArgument {
            reason,
            description,
            ..
        } => Error::invalid(reason, field, description),
        other => other,
    })
}

/// A protobuf `Struct` as a JSON object; unset is the empty object.
pub fn object_from_proto(
    field: &str,
    value: Option<Struct>,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let Some(value) = value else {
        return Ok(serde_json::Map::new());
    };
    value
        .fields
        .into_iter()
        .map(|(k, v)| {
            if k.contains('\0') {
                return Err(Error::invalid(Reason::InvalidValue, field, NUL));
            }
            let json = json_at(&format!("{field}.{k}"), v)?;
            Ok((k, json))
        })
        .collect()
}

pub fn object_to_proto(object: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: object
            .iter()
            .map(|(k, v)| (k.clone(), json_to_proto(v)))
            .collect(),
    }
}

/// The longest duration protobuf defines (10,000 years), in seconds.
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// A `google.protobuf.Duration` from the network, checked as protobuf
/// defines it (nanos under a second and of the seconds' sign, at most
/// 10,000 years) and refused when negative. Converted here rather than by
/// prost-types' `TryFrom`, whose error path negates the seconds, which
/// overflows (a panic in a debug build) at `i64::MIN`.
pub fn duration_from_proto(field: &str, d: &prost_types::Duration) -> Result<std::time::Duration> {
    let invalid = |description| Error::invalid(Reason::InvalidArgument, field, description);
    if !(-MAX_DURATION_SECONDS..=MAX_DURATION_SECONDS).contains(&d.seconds)
        || d.nanos.unsigned_abs() >= 1_000_000_000
        || (d.seconds > 0 && d.nanos < 0)
        || (d.seconds < 0 && d.nanos > 0)
    {
        return Err(invalid(
            "is not a valid duration (at most 10,000 years, nanos under a second)",
        ));
    }
    match (u64::try_from(d.seconds), u32::try_from(d.nanos)) {
        (Ok(seconds), Ok(nanos)) => Ok(std::time::Duration::new(seconds, nanos)),
        _ => Err(invalid("must not be negative")),
    }
}

/// A `google.protobuf.Timestamp` from the network, checked as protobuf
/// defines it (nanos under a second, within [`TIME_RANGE`]) and truncated
/// to the microseconds the stores keep.
pub fn optional_timestamp(
    field: &str,
    time: Option<Timestamp>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
    let Some(time) = time else {
        return Ok(None);
    };
    if !TIME_RANGE.contains(&time.seconds) {
        return Err(Error::invalid(
            Reason::InvalidArgument,
            field,
            format!(
                "{TIME_RANGE_REFUSED}, got {} seconds from 1970",
                time.seconds
            ),
        ));
    }
    // Checked here: chrono would read nanos past a second as a leap second.
    let parsed = u32::try_from(time.nanos)
        .ok()
        .filter(|nanos| *nanos < 1_000_000_000)
        .and_then(|nanos| chrono::DateTime::from_timestamp(time.seconds, nanos))
        .ok_or_else(|| {
            Error::invalid(
                Reason::InvalidArgument,
                field,
                format!(
                    "is not a valid timestamp: nanos must be 0 to 999999999, got {}",
                    time.nanos
                ),
            )
        })?;
    // Stores keep microseconds; truncate so what is returned is what is kept.
    Ok(chrono::DateTime::from_timestamp_micros(
        parsed.timestamp_micros(),
    ))
}

pub fn session_to_proto(session: Session) -> proto::Session {
    proto::Session {
        id: session.id,
        app: session.app,
        user: session.user,
        metadata: Some(object_to_proto(&session.metadata)),
        create_time: Some(timestamp(session.create_time)),
        update_time: Some(timestamp(session.update_time)),
        end_time: session.end_time.map(timestamp),
        episode_count: session.episode_count,
        last_seq: session.last_seq,
        episodes_evicted: session.episodes_evicted,
    }
}

pub fn episode_to_proto(episode: Episode) -> proto::Episode {
    proto::Episode {
        id: episode.id,
        session_id: episode.session_id,
        seq: episode.seq,
        cursor: episode.cursor,
        app: episode.app,
        user: episode.user,
        agent: episode.agent,
        r#type: episode.kind,
        content: Some(json_to_proto(&episode.content)),
        metadata: Some(object_to_proto(&episode.metadata)),
        source_node: episode.source_node,
        timestamp: Some(timestamp(episode.timestamp)),
        create_time: Some(timestamp(episode.create_time)),
    }
}
