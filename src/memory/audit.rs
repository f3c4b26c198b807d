//! The maintenance audit trail: one record per purge, compaction,
//! rollback, fork or forgotten user, stored
//! as a memory entry under the reserved `_compaction/` prefix of the scope
//! it concerns, so it lives and dies with the scope's data but survives
//! `PurgeScope`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::types::{Key, RESERVED_PREFIX, Scope, ScopeName, ScopeType, Value};
use crate::error::{Error, Result};

/// A purge record lists at most this many keys; `keys_affected` has the
/// full count.
pub const MAX_RECORDED_KEYS: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Compact,
    Purge,
    /// A scope's retention policy applied (`SetRetention`, `ApplyRetention`).
    Retention,
    /// A key set back to an older version's value (`MemoryService.Rollback`).
    Rollback,
    /// A scope's state copied into this one (`MemoryService.ForkScope`).
    Fork,
    /// A user's data deleted (`DataService.ForgetUser`): the skeleton.
    Forget,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceMode {
    #[default]
    Current,
    History,
}

/// One audit record, as stored (JSON) and as returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub operation: Operation,
    pub scope_type: String,
    pub scope: String,
    pub timestamp: DateTime<Utc>,
    #[serde(default)]
    pub source_keys: Vec<String>,
    #[serde(default)]
    pub source_versions: Vec<i64>,
    #[serde(default)]
    pub target_key: String,
    #[serde(default)]
    pub target_version: i64,
    #[serde(default)]
    pub instruction: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub source_mode: Option<SourceMode>,
    #[serde(default)]
    pub keys_affected: i64,
    #[serde(default)]
    pub versions_deleted: i64,
    #[serde(default)]
    pub keep: Option<i64>,
    /// The scope a fork copied from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_scope_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_scope: String,
    /// The revision a fork read its source at.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub as_of_revision: i64,
    /// The time a fork was asked to read its source at, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of_time: Option<DateTime<Utc>>,
    /// Who was forgotten, without their name (`app/sha256:HEX`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
    /// What a forget deleted, by kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, i64>,
    /// The reserved key the record is stored under (not part of the value).
    #[serde(skip)]
    pub audit_key: String,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl AuditRecord {
    /// A blank record of an operation on a scope, keyed by its time so the
    /// trail sorts oldest to newest.
    pub fn new(operation: Operation, scope: &Scope, now: DateTime<Utc>) -> Self {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        AuditRecord {
            operation,
            scope_type: scope.scope_type.as_str().to_owned(),
            scope: scope.name.as_str().to_owned(),
            timestamp: now,
            source_keys: Vec::new(),
            source_versions: Vec::new(),
            target_key: String::new(),
            target_version: 0,
            instruction: String::new(),
            model: String::new(),
            source_mode: None,
            keys_affected: 0,
            versions_deleted: 0,
            keep: None,
            source_scope_type: String::new(),
            source_scope: String::new(),
            as_of_revision: 0,
            as_of_time: None,
            subject: String::new(),
            counts: BTreeMap::new(),
            audit_key: format!(
                "{RESERVED_PREFIX}{:016}-{}",
                now.timestamp_micros().max(0),
                &unique[..8]
            ),
        }
    }

    pub fn key(&self) -> Key {
        Key::from_store(self.audit_key.clone())
    }

    pub fn to_value(&self) -> Result<Value> {
        let json = serde_json::to_value(self).map_err(Error::internal)?;
        // Records are small by construction (bounded key lists); no limit.
        Value::new(json, usize::MAX)
    }

    pub fn from_entry(key: &Key, value: &Value) -> Result<Self> {
        let mut record: AuditRecord = serde_json::from_value(value.json().clone())
            .map_err(|err| Error::internal(format!("malformed audit record {key}: {err}")))?;
        record.audit_key = key.as_str().to_owned();
        Ok(record)
    }

    pub fn scope_type(&self) -> Option<ScopeType> {
        scope_type_named(&self.scope_type)
    }

    /// The scope the record concerns (and is stored in).
    pub fn scope_of(&self) -> Option<Scope> {
        Some(Scope {
            scope_type: self.scope_type()?,
            name: ScopeName::parse("scope", self.scope.clone()).ok()?,
        })
    }

    /// The type of the scope a fork copied from.
    pub fn source_scope_type(&self) -> Option<ScopeType> {
        scope_type_named(&self.source_scope_type)
    }
}

fn scope_type_named(name: &str) -> Option<ScopeType> {
    match name {
        "namespace" => Some(ScopeType::Namespace),
        "flow" => Some(ScopeType::Flow),
        "execution" => Some(ScopeType::Execution),
        _ => None,
    }
}
