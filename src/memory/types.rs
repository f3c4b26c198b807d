//! The vocabulary of scoped memory. Each type can only hold a valid value: it
//! is parsed once at the edge, and the domain and stores take it as given.

use std::fmt;

use chrono::{DateTime, Utc};

use crate::error::{Error, Reason, Result};

/// Keys under this prefix hold the maintenance audit trail.
pub const RESERVED_PREFIX: &str = "_compaction/";

pub const MAX_SCOPE_LEN: usize = 256;
pub const MAX_KEY_LEN: usize = 512;

/// What kind of bucket a scope is. The discriminants are stored in the
/// database and match the proto enum numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScopeType {
    Namespace = 1,
    Flow = 2,
    Execution = 3,
}

impl ScopeType {
    pub fn from_i32(n: i32) -> Option<Self> {
        match n {
            1 => Some(ScopeType::Namespace),
            2 => Some(ScopeType::Flow),
            3 => Some(ScopeType::Execution),
            _ => None,
        }
    }

    pub fn as_i16(self) -> i16 {
        self as i16
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ScopeType::Namespace => "namespace",
            ScopeType::Flow => "flow",
            ScopeType::Execution => "execution",
        }
    }
}

/// `true` for the characters identifiers may hold: `[A-Za-z0-9._/-]`.
fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')
}

fn check_identifier(field: &str, text: &str, max_len: usize, allow_empty: bool) -> Result<()> {
    if text.is_empty() && !allow_empty {
        return Err(Error::invalid(
            Reason::InvalidIdentifier,
            field,
            "must not be empty",
        ));
    }
    // Characters first: a length in bytes of text that is not ASCII would
    // not be its length in characters.
    if let Some(bad) = text.chars().find(|c| !is_identifier_char(*c)) {
        return Err(Error::invalid(
            Reason::InvalidIdentifier,
            field,
            format!(
                "may only contain ASCII letters and digits, '.', '_', '/' and '-', found {bad:?}"
            ),
        ));
    }
    if text.len() > max_len {
        return Err(Error::invalid(
            Reason::InvalidIdentifier,
            field,
            format!("must be at most {max_len} characters, got {}", text.len()),
        ));
    }
    Ok(())
}

/// A scope name (also used for execution, flow ids and flow names, which
/// name scopes): 1..256 characters of `[A-Za-z0-9._/-]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScopeName(String);

impl ScopeName {
    pub fn parse(field: &str, text: impl Into<String>) -> Result<Self> {
        let text = text.into();
        check_identifier(field, &text, MAX_SCOPE_LEN, false)?;
        Ok(ScopeName(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScopeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key: 1..512 characters of `[A-Za-z0-9._/-]`. Reserved keys can be
/// parsed (to read the audit trail) but not written by users.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);

impl Key {
    pub fn parse(field: &str, text: impl Into<String>) -> Result<Self> {
        let text = text.into();
        check_identifier(field, &text, MAX_KEY_LEN, false)?;
        Ok(Key(text))
    }

    /// A key read back from the store, which only holds valid keys.
    pub(crate) fn from_store(text: String) -> Self {
        Key(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_reserved(&self) -> bool {
        self.0.starts_with(RESERVED_PREFIX)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key prefix for listing; may be empty (every key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    pub fn parse(field: &str, text: impl Into<String>) -> Result<Self> {
        let text = text.into();
        check_identifier(field, &text, MAX_KEY_LEN, true)?;
        Ok(KeyPrefix(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The half-open key range `[low, high)` holding exactly the keys that
    /// start with this prefix. Key characters are ASCII below 0x7f, so in
    /// byte order every such key sorts below `prefix + "\x7f"`; stores can then
    /// use a plain btree range instead of `LIKE`.
    pub fn range(&self) -> (String, String) {
        (self.0.clone(), format!("{}\u{7f}", self.0))
    }
}

/// The full address of a scope.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scope {
    pub scope_type: ScopeType,
    pub name: ScopeName,
}

/// Whether any string or object key in `json` holds a NUL character, which
/// Postgres's `jsonb` cannot store.
pub fn holds_nul(json: &serde_json::Value) -> bool {
    match json {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(fields) => {
            fields.iter().any(|(k, v)| k.contains('\0') || holds_nul(v))
        }
        _ => false,
    }
}

/// A JSON value checked against the size limit, kept with its serialised
/// form so it is encoded once.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    json: serde_json::Value,
    encoded: String,
}

impl Value {
    pub fn new(json: serde_json::Value, max_bytes: usize) -> Result<Self> {
        let encoded = serde_json::to_string(&json).map_err(|err| {
            Error::invalid(
                Reason::InvalidValue,
                "value",
                format!("not valid JSON: {err}"),
            )
        })?;
        if holds_nul(&json) {
            return Err(Error::invalid(
                Reason::InvalidValue,
                "value",
                crate::error::NUL_REFUSED,
            ));
        }
        if encoded.len() > max_bytes {
            return Err(Error::invalid(
                Reason::ValueTooLarge,
                "value",
                format!(
                    "is {} bytes as JSON, over the limit of {max_bytes} bytes",
                    encoded.len()
                ),
            ));
        }
        Ok(Value { json, encoded })
    }

    /// A value read back from the store.
    pub(crate) fn from_store(encoded: String) -> Result<Self> {
        let json = serde_json::from_str(&encoded).map_err(Error::internal)?;
        Ok(Value { json, encoded })
    }

    pub fn json(&self) -> &serde_json::Value {
        &self.json
    }

    pub fn encoded(&self) -> &str {
        &self.encoded
    }
}

/// Who wrote a version, and the flow discovery tags of execution-scoped writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Empty when written from outside a run.
    pub execution_id: String,
    pub flow_id: String,
    pub flow_name: String,
}

/// One version of a key.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub scope: Scope,
    pub key: Key,
    pub version: i64,
    /// `None` on a tombstone.
    pub value: Option<Value>,
    pub deleted: bool,
    pub provenance: Provenance,
    pub create_time: DateTime<Utc>,
}

impl crate::paging::Weigh for Entry {
    fn weight(&self) -> usize {
        let value = self
            .value
            .as_ref()
            .map_or(0, |value| crate::paging::json_weight(value.json()));
        self.scope.name.as_str().len()
            + self.key.as_str().len()
            + self.provenance.execution_id.len()
            + self.provenance.flow_id.len()
            + self.provenance.flow_name.len()
            + value
            + 48
    }
}

/// A scope and how many of its keys have a live value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSummary {
    pub scope: Scope,
    pub entry_count: i64,
    /// Read at a point: the keys whose value then was purged since.
    pub purged_count: i64,
}

impl crate::paging::Weigh for ScopeSummary {
    fn weight(&self) -> usize {
        self.scope.name.as_str().len() + 32
    }
}

/// A point in the past to read memory at (`as_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsOf {
    /// What had been written by this time.
    Time(DateTime<Utc>),
    /// What had been written once the change feed reached this revision.
    Revision(i64),
}

impl fmt::Display for AsOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsOf::Time(time) => write!(f, "time {}", time.to_rfc3339()),
            AsOf::Revision(revision) => write!(f, "revision {revision}"),
        }
    }
}

/// What a change in the feed did to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Set = 1,
    Delete = 2,
    Purge = 3,
    Compact = 4,
}

impl ChangeKind {
    pub fn as_i16(self) -> i16 {
        self as i16
    }

    pub fn from_i16(n: i16) -> Option<Self> {
        match n {
            1 => Some(ChangeKind::Set),
            2 => Some(ChangeKind::Delete),
            3 => Some(ChangeKind::Purge),
            4 => Some(ChangeKind::Compact),
            _ => None,
        }
    }
}

/// One entry of a scope's change feed.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Global, increasing in commit order of what a watcher is shown.
    pub revision: i64,
    pub kind: ChangeKind,
    pub key: Key,
    /// The version written, or for a purge the newest version deleted.
    pub version: i64,
    /// For a purge, how many versions went.
    pub versions_deleted: i64,
    /// The value written, while that version still exists.
    pub value: Option<Value>,
    pub create_time: DateTime<Utc>,
}

impl crate::paging::Weigh for Change {
    fn weight(&self) -> usize {
        let value = self
            .value
            .as_ref()
            .map_or(0, |value| crate::paging::json_weight(value.json()));
        self.key.as_str().len() + value + 48
    }
}

/// A page of a scope's change feed, with how far the feed had been pruned
/// as the same statement saw it: a page read after `after` is whole only
/// while `after` is not older than that.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangePage {
    pub changes: Vec<Change>,
    pub pruned_through: Option<i64>,
}
