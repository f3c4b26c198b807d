//! The one error type of the domain and the stores. It knows nothing of gRPC:
//! `api::error` maps each variant to a status code in a single `match`.

use std::fmt;

/// A stable, machine-readable reason, sent to clients as `ErrorInfo.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    InvalidArgument,
    InvalidIdentifier,
    InvalidValue,
    ReservedKey,
    ValueTooLarge,
    ScopeNotConfigured,
    InvalidPageToken,
    InvalidPageSize,
    InvalidVersion,
    InvalidRequestId,
    RequestIdReused,
    KeyNotFound,
    KeyDeleted,
    VersionNotFound,
    RollbackToTombstone,
    VersionMismatch,
    MemoryInCheckpoint,
    SourceChanged,
    TransactionConflict,
    SummarizerUnavailable,
    RevisionPruned,
    RevisionNotReached,
    VersionPurged,
    ScopeNotEmpty,
    RetentionNotFound,
    ConsumerTooSlow,
    ShuttingDown,
    SessionNotFound,
    SessionExists,
    SessionOwnerMismatch,
    SessionEnded,
    SessionChanged,
    EpisodeExists,
    EpisodeNotFound,
    InvalidFilter,
    InvalidQuery,
    EmbedderNotConfigured,
    EmbedderUnavailable,
    InvalidCadence,
    RuleNotFound,
    RuleExists,
    FactNotFound,
    MissingProvenance,
    TaskNotFound,
    LimitExceeded,
    ImportMalformed,
    ImportConflict,
    SourcesTooLarge,
    DatabaseUnavailable,
    DatabaseTimeout,
    DatabaseFull,
    Internal,
}

impl Reason {
    /// The reasons a call fails with only when nothing of it was written
    /// (its transaction was rolled back), so that a caller may send any
    /// call again after them, keyed or not: a deadlock Postgres broke, a
    /// session made again under an append, a statement the database gave
    /// up on. The retries of MCP's tools and the CLI's calls read this, as
    /// the clients' lists do.
    pub const NOTHING_WRITTEN: [Reason; 3] = [
        Reason::TransactionConflict,
        Reason::SessionChanged,
        Reason::DatabaseTimeout,
    ];

    /// Whether `reason` (a status's `ErrorInfo` reason) is one of
    /// [`Reason::NOTHING_WRITTEN`].
    pub fn wrote_nothing(reason: &str) -> bool {
        Reason::NOTHING_WRITTEN.iter().any(|r| r.as_str() == reason)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidArgument => "INVALID_ARGUMENT",
            Reason::InvalidIdentifier => "INVALID_IDENTIFIER",
            Reason::InvalidValue => "INVALID_VALUE",
            Reason::ReservedKey => "RESERVED_KEY",
            Reason::RollbackToTombstone => "ROLLBACK_TO_TOMBSTONE",
            Reason::ValueTooLarge => "VALUE_TOO_LARGE",
            Reason::ScopeNotConfigured => "SCOPE_NOT_CONFIGURED",
            Reason::InvalidPageToken => "INVALID_PAGE_TOKEN",
            Reason::InvalidPageSize => "INVALID_PAGE_SIZE",
            Reason::InvalidVersion => "INVALID_VERSION",
            Reason::InvalidRequestId => "INVALID_REQUEST_ID",
            Reason::RequestIdReused => "REQUEST_ID_REUSED",
            Reason::KeyNotFound => "KEY_NOT_FOUND",
            Reason::KeyDeleted => "KEY_DELETED",
            Reason::VersionNotFound => "VERSION_NOT_FOUND",
            Reason::VersionMismatch => "VERSION_MISMATCH",
            Reason::MemoryInCheckpoint => "MEMORY_IN_CHECKPOINT",
            Reason::SourceChanged => "SOURCE_CHANGED",
            Reason::TransactionConflict => "TRANSACTION_CONFLICT",
            Reason::SessionChanged => "SESSION_CHANGED",
            Reason::SummarizerUnavailable => "SUMMARIZER_UNAVAILABLE",
            Reason::RevisionPruned => "REVISION_PRUNED",
            Reason::RevisionNotReached => "REVISION_NOT_REACHED",
            Reason::VersionPurged => "VERSION_PURGED",
            Reason::ScopeNotEmpty => "SCOPE_NOT_EMPTY",
            Reason::RetentionNotFound => "RETENTION_NOT_FOUND",
            Reason::ConsumerTooSlow => "CONSUMER_TOO_SLOW",
            Reason::ShuttingDown => "SHUTTING_DOWN",
            Reason::SessionNotFound => "SESSION_NOT_FOUND",
            Reason::SessionExists => "SESSION_EXISTS",
            Reason::SessionOwnerMismatch => "SESSION_OWNER_MISMATCH",
            Reason::SessionEnded => "SESSION_ENDED",
            Reason::EpisodeExists => "EPISODE_EXISTS",
            Reason::EpisodeNotFound => "EPISODE_NOT_FOUND",
            Reason::InvalidFilter => "INVALID_FILTER",
            Reason::InvalidQuery => "INVALID_QUERY",
            Reason::EmbedderNotConfigured => "EMBEDDER_NOT_CONFIGURED",
            Reason::EmbedderUnavailable => "EMBEDDER_UNAVAILABLE",
            Reason::InvalidCadence => "INVALID_CADENCE",
            Reason::RuleNotFound => "RULE_NOT_FOUND",
            Reason::RuleExists => "RULE_EXISTS",
            Reason::FactNotFound => "FACT_NOT_FOUND",
            Reason::MissingProvenance => "MISSING_PROVENANCE",
            Reason::TaskNotFound => "TASK_NOT_FOUND",
            Reason::LimitExceeded => "LIMIT_EXCEEDED",
            Reason::ImportMalformed => "IMPORT_MALFORMED",
            Reason::ImportConflict => "IMPORT_CONFLICT",
            Reason::SourcesTooLarge => "SOURCES_TOO_LARGE",
            Reason::DatabaseUnavailable => "DATABASE_UNAVAILABLE",
            Reason::DatabaseTimeout => "DATABASE_TIMEOUT",
            Reason::DatabaseFull => "DATABASE_FULL",
            Reason::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A boxed source error kept for the log, never shown to a client.
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is malformed; `field` names it the way the client
    /// spelled it (a proto field path or a metadata key).
    #[error("{field}: {description}")]
    InvalidArgument {
        reason: Reason,
        field: String,
        description: String,
    },
    /// The thing asked for does not exist (or no longer has a live value).
    #[error("{message}")]
    NotFound {
        reason: Reason,
        message: String,
        metadata: Vec<(&'static str, String)>,
    },
    /// A compare-and-set lost: the key's newest version is not the expected one.
    #[error("expected version {expected}, but the current version is {current}")]
    VersionMismatch { expected: i64, current: i64 },
    /// The call is not allowed in the caller's current state.
    #[error("{message}")]
    FailedPrecondition { reason: Reason, message: String },
    /// A configured limit would be exceeded; `limit` names the setting.
    #[error("{message}")]
    ResourceExhausted {
        reason: Reason,
        message: String,
        limit: &'static str,
        value: i64,
    },
    /// The thing to create exists already (and differs from the request).
    #[error("{message}")]
    AlreadyExists { reason: Reason, message: String },
    /// A position (revision) outside what is kept.
    #[error("{message}")]
    OutOfRange { reason: Reason, message: String },
    /// Another writer got there first; re-read and retry.
    #[error("{message}")]
    Conflict { reason: Reason, message: String },
    /// A service Engram depends on failed (the summarizer, the embedder),
    /// or the database gave up on the call's statement (its timeouts);
    /// the call changed nothing and may be retried.
    #[error("{message}")]
    DependencyUnavailable { reason: Reason, message: String },
    /// The database cannot be reached; the call may be retried.
    #[error("database unavailable")]
    Unavailable {
        #[source]
        source: Source,
    },
    /// Anything else: a bug or an unexpected database answer.
    #[error("internal error")]
    Internal {
        #[source]
        source: Source,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and every source under it, `: `-separated, for the log (an
/// `Internal` error alone says only "internal error") and the CLI (tonic
/// says only "transport error"). Not anyhow's `{:#}`: sqlx's and hyper's
/// errors repeat their cause's words, which it then prints twice ("tcp
/// connect error: tcp connect error: Connection refused"), so a cause
/// whose words end the text so far is left out.
pub fn report(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Refuses a text field of more than `most` bytes (`VALUE_TOO_LARGE`).
pub fn refuse_over(field: &str, value: &str, most: usize) -> Result<()> {
    if value.len() > most {
        return Err(Error::invalid(
            Reason::ValueTooLarge,
            field,
            format!("must be at most {most} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// What a field holding the NUL character is told, wherever it is
/// refused: Postgres's text and `jsonb` cannot hold it (SQLite's can, so
/// both stores refuse it alike).
pub const NUL_REFUSED: &str = "contains the NUL character (U+0000), which cannot be stored";

/// The longest idempotency key (`request_id`) a request may carry.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Refuses a request id that is not 1 to [`MAX_REQUEST_ID_LEN`] printable
/// ASCII characters (`INVALID_REQUEST_ID`, naming `field`): a request's,
/// or one an import file carries.
pub fn check_request_id(field: &str, id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_LEN || !id.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Error::invalid(
            Reason::InvalidRequestId,
            field,
            format!("must be 1 to {MAX_REQUEST_ID_LEN} printable ASCII characters without spaces"),
        ));
    }
    Ok(())
}

/// A request id used before for a different request (its fingerprint, what
/// that request asked for, differs): `INVALID_ARGUMENT`, reason
/// `REQUEST_ID_REUSED`.
pub fn request_id_reused(id: &str) -> Error {
    Error::invalid(
        Reason::RequestIdReused,
        "request_id",
        format!("{id:?} was already used for a different request; use a new id for a new request"),
    )
}

/// The SHA-256 of `parts`, each ended by a NUL: what a request asked for,
/// kept with its request id so that the id reused for another request is
/// told from a repeat.
pub fn fingerprint(parts: &[&str]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.finalize().into()
}

/// Refuses a text field holding the NUL character ([`NUL_REFUSED`]).
pub fn refuse_nul(field: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::invalid(Reason::InvalidArgument, field, NUL_REFUSED));
    }
    Ok(())
}

/// The first and last second of `google.protobuf.Timestamp`'s range,
/// 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z: every time Engram keeps
/// lies in it. A time outside could be stored, but not sent back as
/// protobuf defines a timestamp (its JSON mapping, Go's `CheckValid` and
/// Python's `datetime` all refuse one), so one such episode would break
/// every listing that holds it.
pub const TIME_RANGE: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

/// What a time outside [`TIME_RANGE`] is told, wherever it is refused.
pub const TIME_RANGE_REFUSED: &str = "must lie between the years 1 and 9999 (UTC)";

/// Refuses a time outside [`TIME_RANGE`] ([`TIME_RANGE_REFUSED`]).
pub fn refuse_time_out_of_range(field: &str, time: chrono::DateTime<chrono::Utc>) -> Result<()> {
    if !TIME_RANGE.contains(&time.timestamp()) {
        return Err(Error::invalid(
            Reason::InvalidArgument,
            field,
            format!("{TIME_RANGE_REFUSED}, got {time}"),
        ));
    }
    Ok(())
}

impl Error {
    pub fn invalid(
        reason: Reason,
        field: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        Error::InvalidArgument {
            reason,
            field: field.into(),
            description: description.into(),
        }
    }

    pub fn internal(source: impl Into<Source>) -> Self {
        Error::Internal {
            source: source.into(),
        }
    }

    /// The stable reason a client sees for this error.
    pub fn reason(&self) -> Reason {
        match self {
            Error::InvalidArgument { reason, .. }
            | Error::NotFound { reason, .. }
            | Error::FailedPrecondition { reason, .. }
            | Error::Conflict { reason, .. }
            | Error::AlreadyExists { reason, .. }
            | Error::ResourceExhausted { reason, .. }
            | Error::OutOfRange { reason, .. }
            | Error::DependencyUnavailable { reason, .. } => *reason,
            Error::VersionMismatch { .. } => Reason::VersionMismatch,
            Error::Unavailable { .. } => Reason::DatabaseUnavailable,
            Error::Internal { .. } => Reason::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, report};

    #[test]
    fn a_report_names_every_source_under_the_error() {
        let io = std::io::Error::other("database or disk is full");
        let err = Error::internal(io);
        assert_eq!(err.to_string(), "internal error");
        assert_eq!(report(&err), "internal error: database or disk is full");
        let wrapped = Error::internal(Wrapper(std::io::Error::other("locked")));
        assert_eq!(report(&wrapped), "internal error: locked");
    }

    /// An error that shows its source's text as its own, as sqlx's
    /// database error does.
    #[derive(Debug)]
    struct Wrapper(std::io::Error);

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
