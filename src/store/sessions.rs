//! Helpers both backends use to read and write sessions and episodes.

use crate::error::{Error, Result};
use crate::sessions::EpisodeType;

/// A JSON object read back from the store.
pub(super) fn json_object(text: String) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(&text).map_err(Error::internal)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err(Error::internal("stored metadata is not a JSON object")),
    }
}

/// The types filter as JSON text (SQLite) — an empty list matches all.
pub(super) fn types_json(types: &[EpisodeType]) -> String {
    serde_json::Value::Array(
        types
            .iter()
            .map(|t| serde_json::Value::String(t.as_str().to_owned()))
            .collect(),
    )
    .to_string()
}

pub(super) fn types_vec(types: &[EpisodeType]) -> Vec<String> {
    types.iter().map(|t| t.as_str().to_owned()).collect()
}
