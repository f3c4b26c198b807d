//! Helpers both backends use to store rules and facts.

use crate::consolidation::{FactKind, FactPayload};
use crate::error::{Error, Result};

/// A fact version to store: the payload (`None`: a tombstone) and the key
/// it is filed under.
pub(super) struct NewVersion<'a> {
    pub version: i64,
    pub payload: Option<&'a FactPayload>,
    pub subject: &'a str,
    pub predicate: &'a str,
}

/// Decodes a JSON array of strings read back from the store.
pub(super) fn string_list(text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text).map_err(Error::internal)
}

pub(super) fn string_list_json(items: &[String]) -> String {
    serde_json::Value::from(items.to_vec()).to_string()
}

pub(super) fn fact_kind(n: i16) -> Result<FactKind> {
    FactKind::from_i16(n).ok_or_else(|| Error::internal(format!("unknown fact kind {n}")))
}
