//! The vocabulary of sessions and episodes. Names and ids are parsed once at
//! the edge; what the stores hand back is taken as valid.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::error::{Error, Reason, Result};

pub const MAX_NAME_LEN: usize = 256;
pub const MAX_ID_LEN: usize = 128;
pub const MAX_TYPE_LEN: usize = 64;
/// The type of an episode appended without one.
pub const DEFAULT_TYPE: &str = "observation";

/// Names and ids are matched as whole columns, never with `LIKE`, so any
/// printable text is safe; whitespace and control characters are refused
/// because they only ever arrive by mistake.
fn check_text(field: &str, text: &str, max_len: usize) -> Result<()> {
    let invalid = |why: String| Error::invalid(Reason::InvalidIdentifier, field, why);
    if text.is_empty() {
        return Err(invalid("must not be empty".to_owned()));
    }
    if text.len() > max_len {
        return Err(invalid(format!(
            "must be at most {max_len} bytes, got {}",
            text.len()
        )));
    }
    if let Some(bad) = text.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(format!(
            "must not contain whitespace or control characters, found {bad:?}"
        )));
    }
    Ok(())
}

macro_rules! text_type {
    ($(#[$doc:meta])* $name:ident, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn parse(field: &str, text: impl Into<String>) -> Result<Self> {
                let text = text.into();
                check_text(field, &text, $max)?;
                Ok($name(text))
            }

            /// Empty text is `None`; anything else must parse.
            pub fn parse_optional(field: &str, text: String) -> Result<Option<Self>> {
                if text.is_empty() {
                    Ok(None)
                } else {
                    Self::parse(field, text).map(Some)
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

text_type!(
    /// An app, user or agent name: 1 to 256 bytes, no whitespace.
    Name,
    MAX_NAME_LEN
);

text_type!(
    /// A session or episode id: 1 to 128 bytes, no whitespace.
    Id,
    MAX_ID_LEN
);

impl Id {
    /// A fresh, time-ordered id.
    pub fn generate() -> Self {
        Id(uuid::Uuid::now_v7().to_string())
    }
}

/// An episode type: lowercase `[a-z][a-z0-9_]*`, at most 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EpisodeType(String);

impl EpisodeType {
    pub fn parse(field: &str, text: impl Into<String>) -> Result<Self> {
        let text = text.into();
        let valid = text.len() <= MAX_TYPE_LEN
            && text.starts_with(|c: char| c.is_ascii_lowercase())
            && text
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if valid {
            Ok(EpisodeType(text))
        } else {
            Err(Error::invalid(
                Reason::InvalidIdentifier,
                field,
                format!(
                    "must be a lowercase name of [a-z0-9_] starting with a letter, at most \
                     {MAX_TYPE_LEN} characters, got {text:?}"
                ),
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The app and user a request claims for a session. Each one given must
/// match the stored session; a session is only created when both are given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub app: Option<Name>,
    pub user: Option<Name>,
}

impl Owner {
    /// True when every part given matches the session's owner.
    pub fn admits(&self, session: &Session) -> bool {
        self.app.as_ref().is_none_or(|a| a.as_str() == session.app)
            && self
                .user
                .as_ref()
                .is_none_or(|u| u.as_str() == session.user)
    }

    /// Both parts, when both are given: enough to create a session.
    pub fn complete(&self) -> Option<(&Name, &Name)> {
        Some((self.app.as_ref()?, self.user.as_ref()?))
    }
}

/// Where an append goes: the session, the owner the request claims, and
/// whether a missing session is created (from a complete owner) or the
/// append is refused as NOT_FOUND.
#[derive(Debug, Clone, Copy)]
pub struct AppendTo<'a> {
    pub session_id: &'a Id,
    pub owner: &'a Owner,
    pub create: bool,
}

pub fn owner_mismatch(id: &str) -> Error {
    // Says nothing about who owns the session: that would be the leak.
    Error::FailedPrecondition {
        reason: Reason::SessionOwnerMismatch,
        message: format!("session {id:?} belongs to another app or user"),
    }
}

pub fn session_not_found(id: &str) -> Error {
    Error::NotFound {
        reason: Reason::SessionNotFound,
        message: format!("session {id:?} does not exist"),
        metadata: vec![("session_id", id.to_owned())],
    }
}

pub fn episode_not_found(id: &str) -> Error {
    Error::NotFound {
        reason: Reason::EpisodeNotFound,
        message: format!("episode {id:?} does not exist"),
        metadata: vec![("id", id.to_owned())],
    }
}

/// A write that lost every attempt to a session deleted or made again by
/// others while it ran (a forget, a delete, the session limit); nothing
/// was written, and a retry may well pass.
pub fn session_changed(id: &str) -> Error {
    Error::Conflict {
        reason: Reason::SessionChanged,
        message: format!(
            "session {id:?} was deleted or made again while this call ran, on every try; \
             nothing was written"
        ),
    }
}

pub fn session_ended(id: &str) -> Error {
    Error::FailedPrecondition {
        reason: Reason::SessionEnded,
        message: format!("session {id:?} has ended; start a new session"),
    }
}

/// A stored session.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub id: String,
    pub app: String,
    pub user: String,
    pub metadata: Map<String, Value>,
    pub create_time: DateTime<Utc>,
    pub update_time: DateTime<Utc>,
    pub end_time: Option<DateTime<Utc>>,
    pub episode_count: i64,
    pub last_seq: i64,
    pub episodes_evicted: i64,
}

impl crate::paging::Weigh for Session {
    fn weight(&self) -> usize {
        self.id.len()
            + self.app.len()
            + self.user.len()
            + crate::paging::object_weight(&self.metadata)
            + 80
    }
}

/// A stored episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    pub id: String,
    pub session_id: String,
    pub seq: i64,
    pub cursor: i64,
    pub app: String,
    pub user: String,
    pub agent: String,
    pub kind: String,
    pub content: Value,
    pub metadata: Map<String, Value>,
    pub source_node: String,
    pub timestamp: DateTime<Utc>,
    pub create_time: DateTime<Utc>,
}

impl crate::paging::Weigh for Episode {
    fn weight(&self) -> usize {
        [
            &self.id,
            &self.session_id,
            &self.app,
            &self.user,
            &self.agent,
            &self.kind,
            &self.source_node,
        ]
        .iter()
        .map(|text| text.len())
        .sum::<usize>()
            + crate::paging::json_weight(&self.content)
            + crate::paging::object_weight(&self.metadata)
            + 64
    }
}

/// An episode to append, validated, with the fingerprint that tells a
/// retry (same id, same request) from a clash (same id, other content).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEpisode {
    pub id: Id,
    /// The server generated `id` (the caller gave none), so no stored
    /// episode holds it.
    pub id_generated: bool,
    /// `None`: the session's app.
    pub agent: Option<Name>,
    pub kind: EpisodeType,
    pub content: Value,
    /// `content` as JSON text, encoded once.
    pub content_json: String,
    pub metadata: Map<String, Value>,
    pub metadata_json: String,
    pub source_node: String,
    /// `None`: the append time.
    pub timestamp: Option<DateTime<Utc>>,
    pub fingerprint: [u8; 32],
}

/// The fields of an episode as the caller gave them.
#[derive(Debug, Clone)]
pub struct EpisodeInput {
    pub id: Option<Id>,
    pub agent: Option<Name>,
    pub kind: Option<EpisodeType>,
    pub content: Value,
    pub metadata: Map<String, Value>,
    pub source_node: String,
    pub timestamp: Option<DateTime<Utc>>,
}

impl NewEpisode {
    /// Validates the honoured metadata keys and the size limit, and computes
    /// the fingerprint. `field` prefixes error field paths (`episode`,
    /// `episodes[3]`).
    pub fn new(
        field: &str,
        session_id: &Id,
        input: EpisodeInput,
        max_bytes: usize,
    ) -> Result<Self> {
        check_metadata(field, &input.metadata)?;
        if input.source_node.len() > MAX_NAME_LEN || input.source_node.chars().any(char::is_control)
        {
            return Err(Error::invalid(
                Reason::InvalidIdentifier,
                format!("{field}.source_node"),
                format!("must be at most {MAX_NAME_LEN} bytes without control characters"),
            ));
        }
        let content_json = input.content.to_string();
        let metadata_json = Value::Object(input.metadata.clone()).to_string();
        let size = content_json.len() + metadata_json.len();
        if size > max_bytes {
            return Err(Error::invalid(
                Reason::ValueTooLarge,
                format!("{field}.content"),
                format!(
                    "content and metadata are {size} bytes as JSON, over the limit of {max_bytes} bytes"
                ),
            ));
        }
        let kind = input
            .kind
            .unwrap_or_else(|| EpisodeType(DEFAULT_TYPE.to_owned()));
        let id_generated = input.id.is_none();
        let id = input.id.unwrap_or_else(Id::generate);
        let mut hasher = Sha256::new();
        for part in [
            session_id.as_str(),
            id.as_str(),
            input.agent.as_ref().map_or("", Name::as_str),
            kind.as_str(),
            &content_json,
            &metadata_json,
            &input.source_node,
        ] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        hasher.update(
            input
                .timestamp
                .map_or(i64::MIN, |t| t.timestamp_micros())
                .to_le_bytes(),
        );
        Ok(NewEpisode {
            id,
            id_generated,
            agent: input.agent,
            kind,
            content: input.content,
            content_json,
            metadata: input.metadata,
            metadata_json,
            source_node: input.source_node,
            timestamp: input.timestamp,
            fingerprint: hasher.finalize().into(),
        })
    }
}

/// The honoured metadata keys must have the shapes consolidation reads.
fn check_metadata(field: &str, metadata: &Map<String, Value>) -> Result<()> {
    let invalid = |key: &str, why: &str| {
        Error::invalid(
            Reason::InvalidValue,
            format!("{field}.metadata.{key}"),
            why.to_owned(),
        )
    };
    if let Some(intent) = metadata.get("intent") {
        match intent.as_str() {
            Some("add" | "update" | "delete" | "noop") => {}
            _ => {
                return Err(invalid(
                    "intent",
                    "must be one of add, update, delete, noop",
                ));
            }
        }
    }
    if let Some(replaces) = metadata.get("replaces") {
        let ok = match replaces {
            Value::String(_) => true,
            Value::Array(items) => items.iter().all(Value::is_string),
            _ => false,
        };
        if !ok {
            return Err(invalid(
                "replaces",
                "must be an episode id or a list of episode ids",
            ));
        }
    }
    for key in ["subject", "predicate", "object"] {
        match metadata.get(key) {
            None => {}
            Some(Value::String(part)) => {
                // A rule promotes these into a fact's triple as they are.
                crate::consolidation::check_triple_part(&format!("{field}.metadata.{key}"), part)?
            }
            Some(_) => return Err(invalid(key, "must be a string")),
        }
    }
    Ok(())
}

/// Which sessions a listing returns.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    pub app: Option<Name>,
    pub user: Option<Name>,
}

/// The tenant's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionStats {
    pub total_sessions: i64,
    pub total_episodes: i64,
    pub sessions_evicted: i64,
    pub episodes_evicted: i64,
}

impl SessionStats {
    pub fn avg_episodes_per_session(&self) -> f64 {
        if self.total_sessions == 0 {
            0.0
        } else {
            self.total_episodes as f64 / self.total_sessions as f64
        }
    }
}

/// A widening read: the user always, the session and agent when given.
#[derive(Debug, Clone)]
pub struct RecentQuery {
    pub user: Name,
    pub session_id: Option<Id>,
    pub agent: Option<Name>,
    pub types: Vec<EpisodeType>,
    pub limit: i64,
}

/// What a tail follows: any combination of session, user and app, and
/// optionally only some types.
#[derive(Debug, Clone, Default)]
pub struct TailFilter {
    pub session_id: Option<Id>,
    pub user: Option<Name>,
    pub app: Option<Name>,
    pub types: Vec<EpisodeType>,
}

/// Limits from configuration; 0 means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionLimits {
    pub max_sessions: i64,
    pub max_events_per_session: i64,
    /// The most bytes of JSON (content plus metadata) an episode may hold.
    pub max_episode_bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_refuse_whitespace_and_empty() {
        assert!(Name::parse("user", "alice@example.com").is_ok());
        assert!(Name::parse("user", "").is_err());
        assert!(Name::parse("user", "a b").is_err());
        assert!(Name::parse("user", "a\u{0}").is_err());
        assert!(Id::parse("session_id", "x".repeat(MAX_ID_LEN + 1)).is_err());
    }

    #[test]
    fn types_are_lowercase_names() {
        assert!(EpisodeType::parse("type", "user_message").is_ok());
        assert!(EpisodeType::parse("type", "step2").is_ok());
        for bad in ["", "User", "2step", "tool-call", "a b"] {
            assert!(EpisodeType::parse("type", bad).is_err(), "{bad}");
        }
    }

    fn input(content: Value) -> EpisodeInput {
        EpisodeInput {
            id: Some(Id::parse("id", "e1").unwrap_or_else(|_| Id::generate())),
            agent: None,
            kind: None,
            content,
            metadata: Map::new(),
            source_node: String::new(),
            timestamp: None,
        }
    }

    #[test]
    fn fingerprints_tell_retries_from_clashes() {
        let session = Id::generate();
        let first = NewEpisode::new("episode", &session, input("hi".into()), 1000);
        let again = NewEpisode::new("episode", &session, input("hi".into()), 1000);
        let other = NewEpisode::new("episode", &session, input("bye".into()), 1000);
        let (Ok(first), Ok(again), Ok(other)) = (first, again, other) else {
            panic!("valid episodes refused");
        };
        assert_eq!(first.fingerprint, again.fingerprint);
        assert_ne!(first.fingerprint, other.fingerprint);
        assert_eq!(first.kind.as_str(), DEFAULT_TYPE);
    }

    #[test]
    fn honoured_metadata_keys_are_checked() {
        let session = Id::generate();
        let with = |key: &str, value: Value| {
            let mut episode = input(Value::Null);
            episode.metadata.insert(key.to_owned(), value);
            NewEpisode::new("episode", &session, episode, 1000).map(|_| ())
        };
        assert!(with("intent", "update".into()).is_ok());
        assert!(with("intent", "merge".into()).is_err());
        assert!(with("replaces", serde_json::json!(["a", "b"])).is_ok());
        assert!(with("replaces", serde_json::json!([1])).is_err());
        assert!(with("subject", serde_json::json!({"x": 1})).is_err());
        assert!(with("anything", serde_json::json!({"x": 1})).is_ok());
    }
}
