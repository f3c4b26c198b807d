//! Deltas read back from JSON for `engram facts apply`: the shape `engram
//! rules run --json` prints them in (`kind`, `fact_payload`, `provenance`,
//! `replaces`, and `app` and `user` for a delete), so a dry run's deltas,
//! or deltas a script or an extraction pipeline wrote in that shape, can
//! be reviewed and then applied. The server checks each one as
//! `ApplyDeltas` does; here only the shape is read.

use chrono::DateTime;
use serde::Deserialize;

use super::CliError;
use super::consolidation::KindArg;
use crate::api::convert::{json_to_proto, timestamp};
use crate::proto;
use crate::proto::memory_delta::Delta;

/// One delta as `rules run --json` prints it.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Read {
    Add {
        fact_payload: Payload,
        provenance: Option<Provenance>,
    },
    Update {
        #[serde(default)]
        replaces: Vec<String>,
        fact_payload: Payload,
        provenance: Option<Provenance>,
    },
    Delete {
        app: String,
        #[serde(default)]
        user: String,
        #[serde(default)]
        replaces: Vec<String>,
        provenance: Option<Provenance>,
    },
    Noop {
        provenance: Option<Provenance>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    app: String,
    #[serde(default)]
    user: String,
    kind: KindArg,
    #[serde(default)]
    subject: String,
    #[serde(default)]
    predicate: String,
    #[serde(default)]
    object: String,
    #[serde(default)]
    content: serde_json::Value,
    #[serde(default)]
    channels: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Provenance {
    #[serde(default)]
    source_episode_ids: Vec<String>,
    /// RFC 3339. The server requires it, as every field of a delta's
    /// provenance; absent or empty, it says so.
    #[serde(default)]
    promotion_ts: Option<String>,
    #[serde(default)]
    rule_id: String,
    #[serde(default)]
    confidence: f64,
}

/// The deltas of a file's text, in order: `{"deltas": [...]}` (what
/// `rules run --json` prints, its other fields ignored) or the array
/// alone; a usage error naming what does not fit.
pub fn parse(text: &str) -> Result<Vec<proto::MemoryDelta>, CliError> {
    let file: serde_json::Value = serde_json::from_str(text)
        .map_err(|err| CliError::usage(format!("the deltas are not JSON: {err}")))?;
    let deltas = match file {
        serde_json::Value::Array(deltas) => deltas,
        serde_json::Value::Object(mut run) => match run.remove("deltas") {
            Some(serde_json::Value::Array(deltas)) => deltas,
            _ => {
                return Err(CliError::usage(
                    "expected an array of deltas, or an object holding one as \"deltas\"",
                ));
            }
        },
        _ => {
            return Err(CliError::usage(
                "expected an array of deltas, or an object holding one as \"deltas\"",
            ));
        }
    };
    deltas
        .into_iter()
        .enumerate()
        .map(|(n, delta)| {
            serde_json::from_value::<Read>(delta)
                .map_err(|err| err.to_string())
                .and_then(Read::into_proto)
                .map_err(|why| CliError::usage(format!("delta {n}: {why}")))
        })
        .collect()
}

impl Read {
    fn into_proto(self) -> Result<proto::MemoryDelta, String> {
        let delta = match self {
            Read::Add {
                fact_payload,
                provenance,
            } => Delta::Add(proto::AddDelta {
                fact_payload: Some(fact_payload.into_proto()),
                provenance: provenance.map(Provenance::into_proto).transpose()?,
            }),
            Read::Update {
                replaces,
                fact_payload,
                provenance,
            } => Delta::Update(proto::UpdateDelta {
                replaces,
                fact_payload: Some(fact_payload.into_proto()),
                provenance: provenance.map(Provenance::into_proto).transpose()?,
            }),
            Read::Delete {
                app,
                user,
                replaces,
                provenance,
            } => Delta::Delete(proto::DeleteDelta {
                app,
                user,
                replaces,
                provenance: provenance.map(Provenance::into_proto).transpose()?,
            }),
            Read::Noop { provenance } => Delta::Noop(proto::NoopDelta {
                provenance: provenance.map(Provenance::into_proto).transpose()?,
            }),
        };
        Ok(proto::MemoryDelta { delta: Some(delta) })
    }
}

impl Payload {
    fn into_proto(self) -> proto::FactPayload {
        proto::FactPayload {
            app: self.app,
            user: self.user,
            kind: self.kind.to_proto(),
            subject: self.subject,
            predicate: self.predicate,
            object: self.object,
            content: (!self.content.is_null()).then(|| json_to_proto(&self.content)),
            channels: self.channels,
        }
    }
}

impl Provenance {
    fn into_proto(self) -> Result<proto::DeltaProvenance, String> {
        let promotion_ts = match self.promotion_ts.as_deref() {
            None | Some("") => None,
            Some(text) => {
                let at = DateTime::parse_from_rfc3339(text)
                    .map_err(|err| format!("provenance.promotion_ts {text:?}: {err}"))?;
                Some(timestamp(at.to_utc()))
            }
        };
        Ok(proto::DeltaProvenance {
            source_episode_ids: self.source_episode_ids,
            promotion_ts,
            rule_id: self.rule_id,
            confidence: self.confidence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_runs_deltas_read_back() {
        let printed = r#"{"deltas": [
            {"kind": "add", "fact_payload": {"app": "bot", "user": "alice", "kind": "semantic",
             "subject": "alice", "predicate": "prefers", "object": "tea", "content": null,
             "channels": ["profile"]},
             "provenance": {"source_episode_ids": ["e1"], "promotion_ts": "2026-12-01T08:00:00.000001Z",
             "rule_id": "prefs", "confidence": 0.8}},
            {"kind": "delete", "app": "bot", "user": "alice", "replaces": ["f1"],
             "provenance": {"source_episode_ids": ["e2"], "promotion_ts": "", "rule_id": "", "confidence": 1.0}},
            {"kind": "noop", "provenance": null}
        ], "episodes_scanned": 3, "dry_run": true}"#;
        let deltas = parse(printed).expect("parses");
        assert_eq!(deltas.len(), 3);
        let Some(Delta::Add(add)) = &deltas[0].delta else {
            panic!("an add first: {deltas:?}");
        };
        let payload = add.fact_payload.as_ref().expect("payload");
        assert_eq!(
            (
                payload.object.as_str(),
                payload.kind,
                payload.content.is_none()
            ),
            ("tea", proto::FactKind::Semantic as i32, true)
        );
        let provenance = add.provenance.as_ref().expect("provenance");
        assert_eq!(
            provenance.promotion_ts,
            Some(prost_types::Timestamp {
                seconds: 1_796_112_000,
                nanos: 1_000
            })
        );
        assert!(matches!(&deltas[1].delta, Some(Delta::Delete(d)) if d.replaces == ["f1"]));
        // The array alone, too.
        assert_eq!(parse(r#"[{"kind": "noop"}]"#).expect("an array").len(), 1);
    }

    #[test]
    fn what_does_not_fit_is_named() {
        for (text, said) in [
            (r#"[{"kind": "merge"}]"#, "delta 0: unknown variant `merge`"),
            (
                r#"[{"kind": "noop"}, {"kind": "add"}]"#,
                "delta 1: missing field `fact_payload`",
            ),
            (r#"{"kind": "noop"}"#, "expected an array of deltas"),
            ("[", "not JSON"),
            (
                r#"[{"kind": "noop", "provenance": {"promotion_ts": "yesterday"}}]"#,
                "delta 0: provenance.promotion_ts",
            ),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.message.contains(said), "{text}: {}", err.message);
        }
    }
}
