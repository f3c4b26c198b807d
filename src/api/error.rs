//! Domain errors become gRPC statuses here, in one `match` without a
//! catch-all, so a new error variant forces a decision. Every status carries
//! `google.rpc.ErrorInfo` with a stable reason; invalid fields add a
//! `BadRequest` violation. Internal detail goes to the log, never the client.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::Error;

/// `ErrorInfo.domain` of every error Engram returns.
pub const ERROR_DOMAIN: &str = "engram";

/// The most bytes of a field path, and of a description or message, a
/// status carries. Both travel in HTTP/2 headers (`grpc-message`,
/// percent-encoded, up to three times as long, and the details, in
/// base64), and some quote what the client sent: unbounded, a long
/// quoted value took the headers past what clients accept (16 KiB by
/// default), and the client saw a protocol error instead of the reason.
const MOST_FIELD_BYTES: usize = 256;
const MOST_MESSAGE_BYTES: usize = 1024;

/// `text` cut to at most `most` bytes, at a character's boundary, with
/// `…` where it was cut.
fn cut(text: &mut String, most: usize) {
    if text.len() <= most {
        return;
    }
    let mut end = most.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// `err` with what a status quotes cut to its bounds.
fn bounded(mut err: Error) -> Error {
    match &mut err {
        Error::InvalidArgument {
            field, description, ..
        } => {
            cut(field, MOST_FIELD_BYTES);
            cut(description, MOST_MESSAGE_BYTES);
        }
        Error::NotFound {
            message, metadata, ..
        } => {
            cut(message, MOST_MESSAGE_BYTES);
            for (_, value) in metadata {
                cut(value, MOST_FIELD_BYTES);
            }
        }
        Error::FailedPrecondition { message, .. }
        | Error::ResourceExhausted { message, .. }
        | Error::AlreadyExists { message, .. }
        | Error::OutOfRange { message, .. }
        | Error::Conflict { message, .. }
        | Error::DependencyUnavailable { message, .. } => cut(message, MOST_MESSAGE_BYTES),
        Error::VersionMismatch { .. } | Error::Unavailable { .. } | Error::Internal { .. } => {}
    }
    err
}

pub fn to_status(err: Error) -> Status {
    let reason = err.reason().as_str();
    match bounded(err) {
        Error::InvalidArgument {
            field, description, ..
        } => {
            let mut details = ErrorDetails::with_error_info(
                reason,
                ERROR_DOMAIN,
                [("field".to_owned(), field.clone())],
            );
            details.add_bad_request_violation(field.clone(), description.clone());
            Status::with_error_details(
                Code::InvalidArgument,
                {
                    let mut message = format!("{field}: {description}");
                    cut(&mut message, MOST_MESSAGE_BYTES);
                    message
                },
                details,
            )
        }
        Error::NotFound {
            message, metadata, ..
        } => {
            let metadata: std::collections::HashMap<String, String> = metadata
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
            Status::with_error_details(Code::NotFound, message, details)
        }
        Error::VersionMismatch { expected, current } => {
            let details = ErrorDetails::with_error_info(
                reason,
                ERROR_DOMAIN,
                [
                    ("expected_version".to_owned(), expected.to_string()),
                    ("current_version".to_owned(), current.to_string()),
                ],
            );
            let message = if current == 0 {
                format!("expected version {expected}, but the key has no live value")
            } else {
                format!("expected version {expected}, but the current version is {current}")
            };
            Status::with_error_details(Code::Aborted, message, details)
        }
        Error::FailedPrecondition { message, .. } => {
            let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            Status::with_error_details(Code::FailedPrecondition, message, details)
        }
        Error::ResourceExhausted {
            message,
            limit,
            value,
            ..
        } => {
            // A full database names no setting of Engram's.
            let metadata: std::collections::HashMap<String, String> = match limit {
                "" => Default::default(),
                limit => [
                    ("limit".to_owned(), limit.to_owned()),
                    ("value".to_owned(), value.to_string()),
                ]
                .into(),
            };
            let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
            Status::with_error_details(Code::ResourceExhausted, message, details)
        }
        Error::AlreadyExists { message, .. } => {
            let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            Status::with_error_details(Code::AlreadyExists, message, details)
        }
        Error::OutOfRange { message, .. } => {
            let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            Status::with_error_details(Code::OutOfRange, message, details)
        }
        Error::Conflict { message, .. } => {
            let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            Status::with_error_details(Code::Aborted, message, details)
        }
        Error::DependencyUnavailable { message, .. } => {
            tracing::warn!(%message, "dependency unavailable");
            let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            details.set_retry_info(Some(std::time::Duration::from_secs(1)));
            Status::with_error_details(Code::Unavailable, message, details)
        }
        Error::Unavailable { source } => {
            tracing::warn!(error = %crate::error::report(&*source), "database unavailable");
            let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, []);
            details.set_retry_info(Some(std::time::Duration::from_secs(1)));
            Status::with_error_details(
                Code::Unavailable,
                "database unavailable, retry later",
                details,
            )
        }
        Error::Internal { source } => {
            let correlation_id = uuid::Uuid::new_v4().to_string();
            tracing::error!(%correlation_id, error = %crate::error::report(&*source), "internal error");
            let details = ErrorDetails::with_error_info(
                reason,
                ERROR_DOMAIN,
                [("correlation_id".to_owned(), correlation_id.clone())],
            );
            Status::with_error_details(
                Code::Internal,
                format!("internal error (correlation id {correlation_id})"),
                details,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let mut short = "short".to_owned();
        cut(&mut short, 10);
        assert_eq!(short, "short");
        // `工` is three bytes: 10 bytes hold two of them and the `…`.
        let mut cut_text = "工".repeat(10);
        cut(&mut cut_text, 10);
        assert_eq!(cut_text, "工工…");
        assert!(cut_text.len() <= 10);
    }
}
