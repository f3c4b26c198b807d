//! Domain errors become gRPC statuses here, in one `match` without a
//! catch-all, so a new error variant forces a decision. Every status carries
//! `google.rpc.ErrorInfo` with a stable reason; invalid fields add a
//! `BadRequest` violation. Internal detail goes to the log, never the client.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::Error;

/// `ErrorInfo.domain` of every error Engram returns.
pub const ERROR_DOMAIN: &str = "engram";

pub fn to_status(err: Error) -> Status {
    let reason = err.reason().as_str();
    match err {
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
                format!("{field}: {description}"),
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
            let details = ErrorDetails::with_error_info(
                reason,
                ERROR_DOMAIN,
                [
                    ("limit".to_owned(), limit.to_owned()),
                    ("value".to_owned(), value.to_string()),
                ],
            );
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
            tracing::warn!(error = %source, "database unavailable");
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
            tracing::error!(%correlation_id, error = %source, "internal error");
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
