//! The JSON shapes of memory entries, audit records and retention
//! policies, as every command that prints them prints them.

use serde_json::json;

use crate::cli::{time, value_json};
use crate::proto;

pub(crate) fn scope_type_name(n: i32) -> &'static str {
    match proto::ScopeType::try_from(n) {
        Ok(proto::ScopeType::Namespace) => "namespace",
        Ok(proto::ScopeType::Flow) => "flow",
        Ok(proto::ScopeType::Execution) => "execution",
        _ => "unspecified",
    }
}

pub fn entry_json(entry: &proto::MemoryEntry) -> serde_json::Value {
    json!({
        "scope_type": scope_type_name(entry.scope_type),
        "scope": entry.scope,
        "key": entry.key,
        "version": entry.version,
        "value": if entry.deleted { serde_json::Value::Null } else { value_json(entry.value.clone()) },
        "deleted": entry.deleted,
        "execution_id": entry.execution_id,
        "flow_id": entry.flow_id,
        "flow_name": entry.flow_name,
        "create_time": time(entry.create_time.as_ref()),
    })
}

pub(crate) fn record_json(record: &proto::CompactionRecord) -> serde_json::Value {
    json!({
        "operation": record.operation,
        "scope_type": scope_type_name(record.scope_type),
        "scope": record.scope,
        "timestamp": time(record.create_time.as_ref()),
        "source_keys": record.source_keys,
        "source_versions": record.source_versions,
        "target_key": record.target_key,
        "target_version": record.target_version,
        "instruction": record.instruction,
        "model": record.model,
        "source_mode": match proto::SourceMode::try_from(record.source_mode) {
            Ok(proto::SourceMode::Current) => "current",
            Ok(proto::SourceMode::History) => "history",
            _ => "",
        },
        "keys_affected": record.keys_affected,
        "versions_deleted": record.versions_deleted,
        "keep": record.keep,
        "audit_key": record.audit_key,
        "source_scope_type": scope_type_name(record.source_scope_type),
        "source_scope": record.source_scope,
        "as_of_revision": record.as_of_revision,
        "as_of_time": record.as_of_time.as_ref().map(|t| time(Some(t))),
        "subject": record.subject,
        "counts": record.counts,
    })
}

pub(crate) fn retention_json(retention: &proto::Retention) -> serde_json::Value {
    let policy = retention.policy.unwrap_or_default();
    let seconds = |d: &Option<prost_types::Duration>| d.as_ref().map(|d| d.seconds);
    json!({
        "scope_type": scope_type_name(retention.scope_type),
        "scope": retention.scope,
        "keep_versions": policy.keep_versions,
        "max_age_seconds": seconds(&policy.max_age),
        "tombstone_grace_seconds": seconds(&policy.tombstone_grace),
        "next_run_time": time(retention.next_run_time.as_ref()),
        "last_run_time": retention.last_run_time.as_ref().map(|t| time(Some(t))),
        "last_versions_deleted": retention.last_versions_deleted,
    })
}
